/* Host GEMMs of the gemm module: plain C, enqueued on a host stream like
 * any other operation (so shuffle mode orders them only by stream order
 * and event waits). Each output element is one FP32 sum over the inner
 * dimension in increasing order (fmaf per term, from 0), plus the old dW
 * for beta 1 (one addition), rounded once to the output dtype with
 * qf_codec.h's BF16 rounding. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels_gemm.h"
#include "host_internal.h"
#include "quant/formats/qf_codec.h"

typedef struct {
    etp__gemm_shape_t shape;
    etp__gemm_call_t call;
    /* PACKED: counts [experts] then offsets [experts + 1]; copied, since
     * the caller's arrays may change before the stream runs this */
    int32_t layout[];
} gemm_op_t;

static float bf(const uint16_t *p, int64_t i)
{
    return etp__qf_bf16_to_f32(p[i]);
}

static void store(void *out, etp_dtype_t dt, int64_t i, float v)
{
    if (dt == ETP_DTYPE_F32)
        ((float *)out)[i] = v;
    else
        ((uint16_t *)out)[i] = etp__qf_f32_to_bf16(v);
}

static float load(const void *out, etp_dtype_t dt, int64_t i)
{
    return dt == ETP_DTYPE_F32 ? ((const float *)out)[i] : bf(out, i);
}

/* One expert: m rows of the row side starting at row r0; weight block w
 * (element offset wo of the view). */
static void expert(const etp__gemm_shape_t *s, const etp__gemm_call_t *c, int64_t r0, int64_t m,
                   int64_t wo)
{
    const int64_t n = s->n, k = s->k, ld = s->w_ld;
    const uint16_t *a = c->a;
    const etp_dtype_t dt = s->out_dtype;
    switch (s->op) {
    case ETP_GEMM_FORWARD: /* Y[i, j] = sum_t X[i, t] W[j, t] */
        for (int64_t i = r0; i < r0 + m; i++)
            for (int64_t j = 0; j < n; j++) {
                float acc = 0.0f;
                for (int64_t t = 0; t < k; t++)
                    acc = fmaf(bf(a, i * k + t), bf(c->w, wo + j * ld + t), acc);
                store(c->out, dt, i * n + j, acc);
            }
        break;
    case ETP_GEMM_DGRAD: /* dX[i, t] = sum_j dY[i, j] W[j, t] */
        for (int64_t i = r0; i < r0 + m; i++)
            for (int64_t t = 0; t < k; t++) {
                float acc = 0.0f;
                for (int64_t j = 0; j < n; j++)
                    acc = fmaf(bf(a, i * n + j), bf(c->w, wo + j * ld + t), acc);
                store(c->out, dt, i * k + t, acc);
            }
        break;
    case ETP_GEMM_WGRAD: /* dW[j, t] = beta dW[j, t] + sum_i dY[i, j] X[i, t] */
        for (int64_t j = 0; j < n; j++)
            for (int64_t t = 0; t < k; t++) {
                float acc = 0.0f;
                for (int64_t i = r0; i < r0 + m; i++)
                    acc = fmaf(bf(a, i * n + j), bf(c->b, i * k + t), acc);
                const int64_t o = wo + j * ld + t;
                if (c->beta != 0.0f) acc = load(c->out, dt, o) + acc;
                store(c->out, dt, o, acc);
            }
        break;
    }
}

static void gemm_run(void *p)
{
    const gemm_op_t *g = p;
    const etp__gemm_shape_t *s = &g->shape;
    for (int64_t e = 0; e < s->experts; e++) {
        int64_t r0 = 0, m = s->rows;
        if (s->layout == ETP_GEMM_FIXED_SLOTS) r0 = e * s->rows;
        if (s->layout == ETP_GEMM_PACKED) {
            r0 = g->layout[s->experts + e];
            m = g->layout[e];
        }
        expert(s, &g->call, r0, m, e * s->w_stride);
    }
}

static etp_status_t host_gemm_plan_create(etp__be_t *be, const etp__gemm_shape_t *shape,
                                          void *workspace, size_t ws_bytes, void **bplan)
{
    *bplan = NULL; /* the shape is all the host needs */
    return ETP_SUCCESS;
}

static void host_gemm_plan_destroy(etp__be_t *be, void *bplan)
{
}

static etp_status_t host_gemm_run(etp__be_t *be, etp__bstream_t *s, const etp__gemm_shape_t *shape,
                                  void *bplan, const etp__gemm_call_t *call)
{
    const size_t nl = shape->layout == ETP_GEMM_PACKED ? (size_t)(2 * shape->experts + 1) : 0;
    const size_t bytes = sizeof(gemm_op_t) + nl * sizeof(int32_t);
    gemm_op_t *g = malloc(bytes);
    if (!g) return etp__err(ETP_ERR_OUT_OF_MEMORY, "gemm '%s': out of memory", shape->name);
    g->shape = *shape;
    g->shape.name = NULL; /* the plan's, which may be gone when this runs */
    g->call = *call;
    g->call.counts = g->call.offsets = NULL;
    if (nl) {
        memcpy(g->layout, call->counts, (size_t)shape->experts * sizeof(int32_t));
        memcpy(g->layout + shape->experts, call->offsets, (size_t)(shape->experts + 1) * sizeof(int32_t));
    }
    etp_status_t st = etp__host_launch(be, s, gemm_run, g, bytes);
    free(g);
    return st;
}

const etp__gemm_kernels_t etp__host_gemm_kernels = {
    .default_workspace_bytes = 0,
    .plan_create = host_gemm_plan_create,
    .plan_destroy = host_gemm_plan_destroy,
    .run = host_gemm_run,
};
