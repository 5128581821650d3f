/* Host kernels: the reference the CUDA kernels are tested against, enqueued
 * on host streams like any other operation. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host_internal.h"

etp_status_t etp__host_launch(etp__be_t *be, etp__bstream_t *s, void (*fn)(void *args),
                              const void *args, size_t args_bytes)
{
    etp__hop_t *op = etp__hop_new(ETP__HOP_FN);
    void *copy = malloc(args_bytes ? args_bytes : 1);
    if (!op || !copy) {
        free(op);
        free(copy);
        return etp__err(ETP_ERR_OUT_OF_MEMORY, "host kernel launch: out of memory");
    }
    if (args_bytes) memcpy(copy, args, args_bytes);
    op->u.fn.fn = fn;
    op->u.fn.args = copy;
    op->u.fn.bytes = args_bytes;
    return etp__hsched_enqueue((etp__host_t *)be, s, op);
}

void etp__host_axpy_f32_ref(size_t n, float alpha, const float *x, float *y)
{
    /* fmaf, so the result is the one rounding the CUDA kernel's FFMA makes. */
    for (size_t i = 0; i < n; i++) y[i] = fmaf(alpha, x[i], y[i]);
}

typedef struct {
    size_t n;
    float alpha;
    const float *x;
    float *y;
} axpy_args_t;

static void axpy_run(void *p)
{
    axpy_args_t *a = p;
    etp__host_axpy_f32_ref(a->n, a->alpha, a->x, a->y);
}

static etp_status_t host_axpy(etp__be_t *be, etp__bstream_t *s, size_t n, float alpha,
                              const float *x, float *y)
{
    axpy_args_t a = {n, alpha, x, y};
    return etp__host_launch(be, s, axpy_run, &a, sizeof a);
}

const etp__kernels_t etp__host_kernels = {
    .axpy_f32 = host_axpy,
    .quant = &etp__host_quant_kernels,
    .ep = &etp__host_ep_kernels,
    .shard = &etp__host_shard_kernels,
    .gemm = &etp__host_gemm_kernels,
};
