/* The gemm module's kernels: one table, implemented by each backend in
 * host/host_gemm.c (plain C, the reference) and cuda/cuda_gemm.c
 * (cuBLASLt). Owned by the gemm module (src/gemm), which checks every
 * argument before a backend sees it. */
#ifndef ETP__KERNELS_GEMM_H
#define ETP__KERNELS_GEMM_H

#include "backend.h"
#include "etp/gemm.h"

/* A plan's shape, checked and with its defaults resolved. */
typedef struct etp__gemm_shape {
    etp_gemm_op_t op;
    etp_gemm_layout_t layout;
    int64_t experts;
    int64_t rows;          /* DENSE: M; FIXED_SLOTS: S; PACKED: the row space */
    int64_t n, k;
    int64_t w_ld;          /* elements between rows of W / dW */
    int64_t w_stride;      /* elements between experts of W / dW */
    etp_dtype_t out_dtype; /* BF16 or F32 */
    const char *name;      /* the plan's, for messages */
} etp__gemm_shape_t;

/* One product over all of a plan's experts. Row-side pointers are the
 * starts of the row space; PACKED carries the host counts and offsets
 * (read during the call). */
typedef struct etp__gemm_call {
    const void *a;   /* FORWARD: X; DGRAD, WGRAD: dY */
    const void *b;   /* WGRAD: X; else NULL */
    const void *w;   /* FORWARD, DGRAD: W's data */
    void *out;       /* Y, dX, or dW's data */
    float beta;      /* WGRAD: 0 or 1 */
    const int32_t *counts, *offsets; /* PACKED only */
} etp__gemm_call_t;

struct etp__gemm_kernels {
    /* Workspace bytes a plan asks the context allocator for when the
     * config leaves it 0. */
    size_t default_workspace_bytes;
    /* Make the backend's part of a plan (*bplan, NULL allowed when it
     * needs none) for `shape`, with `workspace` of `ws_bytes` from the
     * context allocator (NULL when ws_bytes is 0). */
    etp_status_t (*plan_create)(etp__be_t *be, const etp__gemm_shape_t *shape, void *workspace,
                                size_t ws_bytes, void **bplan);
    void (*plan_destroy)(etp__be_t *be, void *bplan);
    /* Enqueue one product on s. Allocates nothing on the CUDA backend. */
    etp_status_t (*run)(etp__be_t *be, etp__bstream_t *s, const etp__gemm_shape_t *shape,
                        void *bplan, const etp__gemm_call_t *call);
};

#endif
