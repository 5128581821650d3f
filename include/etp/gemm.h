/*
 * etp/gemm.h - the GEMMs of a linear layer, dense or per expert over an EP
 * layout, on cuBLASLt (CUDA backend) or plain C (host backend).
 *
 * A linear layer with weight W [n, k] (row-major; per expert for grouped
 * GEMMs) and row-side activations of `rows` rows has three products:
 *
 *   ETP_GEMM_FORWARD  Y  [rows, n] = X  [rows, k] W^T
 *   ETP_GEMM_DGRAD    dX [rows, k] = dY [rows, n] W
 *   ETP_GEMM_WGRAD    dW [n, k]    = beta dW + dY^T X     (beta 0 or 1)
 *
 * Inputs are BF16, products accumulate in FP32, and the output (Y, dX or
 * dW) is BF16 or FP32, rounded once (beta 1: the FP32 sum plus the old dW,
 * then rounded). The order of the FP32 sums is the backend's: cuBLASLt's
 * tiles on CUDA; increasing inner index on the host backend. Row-side
 * matrices (X, Y, dY, dX) are row-major with contiguous rows (leading
 * dimension k or n); the weight side (W, dW) is an
 * etp_weight_view_t (etp/param.h): what etp_gather and etp_wgrad_buffer
 * give, or a view the caller fills in.
 *
 * Layouts (etp_gemm_layout_t): DENSE is one GEMM of `rows` rows. The grouped
 * layouts are the row spaces of etp/ep.h's layers, one weight per local
 * expert (view->experts == config.experts, expert_stride apart):
 * - FIXED_SLOTS: expert e owns rows [e*S, (e+1)*S), S = config.rows. Every
 *   slot of every expert is computed (a slot holding no token is a zero row
 *   after dispatch, so it gives zero Y / dX rows and adds nothing to dW),
 *   in one strided-batched call per product: no host count is needed, and
 *   the call may be captured into a graph.
 * - PACKED: expert e's rows are [offsets[e], offsets[e] + counts[e]), from
 *   host arrays: etp_ep_layout_host() of a layer on the EXACT transport.
 *   One GEMM per non-empty expert (on CUDA, several at once: the caller's
 *   stream forks to the plan's own streams, each with its own slice of
 *   the plan's workspace, and joins them back before the call's work
 *   ends, so stream order and graph capture hold as for one call; a call
 *   with one non-empty expert runs on the caller's stream alone). On
 *   CUDA, forward and dgrad take the experts of 128 rows or more together
 *   in one batched matmul over 128-row chunks of their blocks (a block's
 *   last chunk ends flush with it, so rows of a count that is not a
 *   multiple of 128 are computed twice, to the same values); smaller
 *   experts keep their own GEMMs. Rows outside every expert's block are
 *   not touched (Y, dX). An expert with no rows still gets its dW: zero
 *   with beta 0, left as it was with beta 1.
 *
 * A plan (etp_gemm_plan_t) is made once per shape and product: cuBLASLt's
 * descriptors and layouts, its workspace (from the context allocator,
 * owner ETP_MEM_WORKSPACE), and the algorithm cuBLASLt's heuristic picks
 * (PACKED: one per row-count bucket, the counts 1 to 4 and then each
 * quarter of an octave, (2^b, 1.25 x 2^b] and so on, each asked by the
 * etp_gemm_run that first meets a count of the bucket, for that count; a
 * shape with no algorithm at config.rows is refused here). etp_gemm_run
 * allocates nothing and never synchronizes the host.
 *
 * Streams: etp_gemm_run enqueues on the stream it is given (the host
 * backend runs its GEMMs there in stream order, shuffle mode included).
 * Pointers are device pointers (host memory on the host backend), read and
 * written by the enqueued work: keep them alive until the stream passes.
 *
 * Thread safety: a plan is used by one thread at a time, like its context.
 */
#ifndef ETP_GEMM_H
#define ETP_GEMM_H

#include "etp/context.h"
#include "etp/param.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct etp_gemm_plan etp_gemm_plan_t;

typedef enum etp_gemm_op {
    ETP_GEMM_FORWARD = 0, /* Y = X W^T */
    ETP_GEMM_DGRAD = 1,   /* dX = dY W */
    ETP_GEMM_WGRAD = 2    /* dW = beta dW + dY^T X */
} etp_gemm_op_t;

typedef enum etp_gemm_layout {
    ETP_GEMM_DENSE = 0,       /* one GEMM over `rows` rows, one weight */
    ETP_GEMM_FIXED_SLOTS = 1, /* expert e owns rows [e*S, (e+1)*S), S = rows */
    ETP_GEMM_PACKED = 2       /* expert e owns rows [offsets[e], offsets[e] + counts[e]) */
} etp_gemm_layout_t;

typedef struct etp_gemm_config {
    size_t size;             /* sizeof(etp_gemm_config_t) */
    const char *name;        /* copied; in messages; NULL: "gemm" */
    etp_gemm_op_t op;
    etp_gemm_layout_t layout;
    int64_t experts;         /* local experts (weights in the view); DENSE: 1 */
    /* DENSE: the rows M; FIXED_SLOTS: S, rows per expert; PACKED: the rows
     * of the row space (etp_ep_layer_rows), which every block must fit */
    int64_t rows;
    int64_t n, k;            /* each weight is [n, k] */
    int64_t weight_ld;       /* elements between weight rows (>= k); 0: k */
    int64_t weight_expert_stride; /* elements between experts' weights; 0: n * weight_ld */
    etp_dtype_t out_dtype;   /* Y, dX or dW: ETP_DTYPE_BF16 or ETP_DTYPE_F32 */
    size_t workspace_bytes;  /* cuBLASLt workspace; 0: 32 MiB on CUDA (the host needs none) */
} etp_gemm_config_t;

#define ETP_GEMM_CONFIG_INIT                                                              \
    {                                                                                     \
        sizeof(etp_gemm_config_t), NULL, ETP_GEMM_FORWARD, ETP_GEMM_DENSE, 1, 0, 0, 0, 0, \
            0, ETP_DTYPE_BF16, 0                                                          \
    }

/* Make a plan for one product of one shape. Local (no communication).
 * Allocates the workspace (ETP_MEM_WORKSPACE) and, on CUDA, a cuBLASLt
 * handle, descriptors, and the heuristic's algorithms (PACKED: also the
 * streams and events its experts' GEMMs run on, which share the workspace
 * in equal parts; forward and dgrad: the chunked matmul's pointer arrays,
 * 24 bytes a chunk, at most 1.5 MiB, at the workspace's end where it
 * leaves each stream 1 MiB or more, else no chunks). *plan is destroyed with etp_gemm_plan_destroy, before
 * the context.
 * Errors: ETP_ERR_INVALID_ARGUMENT (NULLs, a config of the wrong size, an
 * unknown op or layout, sizes <= 0 or past 2^31 rows, DENSE with experts
 * != 1, weight_ld < k, an expert stride smaller than n * weight_ld, an
 * out_dtype other than BF16/F32), ETP_ERR_UNSUPPORTED (cuBLASLt has no
 * algorithm for the shape), ETP_ERR_OUT_OF_MEMORY, ETP_ERR_BACKEND (a
 * cuBLASLt or CUDA error, named), ETP_ERR_ABORTED. On failure nothing is
 * left allocated and *plan is untouched. */
ETP_API etp_status_t etp_gemm_plan_create(etp_context_t *ctx, const etp_gemm_config_t *config,
                                          etp_gemm_plan_t **plan);

/* Destroy a plan; frees its workspace (which waits for the context's
 * enqueued work, like etp_mem_free). ETP_ERR_BUSY while graphs that
 * captured its calls live; ETP_ERR_INVALID_STATE while a graph capture is
 * in progress on the context (nothing is destroyed either way). NULL is a
 * no-op. */
ETP_API etp_status_t etp_gemm_plan_destroy(etp_gemm_plan_t *plan);

/* The operands of one etp_gemm_run. Each product takes its own and the
 * others must be NULL: FORWARD x, w, y; DGRAD dy, w, dx; WGRAD dy, x, dw. */
typedef struct etp_gemm_args {
    size_t size;                  /* sizeof(etp_gemm_args_t) */
    const void *x;                /* FORWARD, WGRAD: X [rows, k] BF16 */
    const void *dy;               /* DGRAD, WGRAD: dY [rows, n] BF16 */
    const etp_weight_view_t *w;   /* FORWARD, DGRAD: W, BF16, unquantized */
    void *y;                      /* FORWARD: Y [rows, n] of out_dtype */
    void *dx;                     /* DGRAD: dX [rows, k] of out_dtype */
    const etp_weight_view_t *dw;  /* WGRAD: dW of out_dtype, written through its data */
    float beta;                   /* WGRAD: 0 (dW =) or 1 (dW +=); others: 0 */
    /* PACKED: host arrays, read before etp_gemm_run returns: counts
     * [experts], offsets [experts + 1] (etp_ep_layout_host's). Others: NULL. */
    const int32_t *counts;
    const int32_t *offsets;
} etp_gemm_args_t;

#define ETP_GEMM_ARGS_INIT \
    {sizeof(etp_gemm_args_t), NULL, NULL, NULL, NULL, NULL, NULL, 0.0f, NULL, NULL}

/* Enqueue the plan's product on `stream` (see the top of this file). Rows
 * are config.rows (DENSE), experts * S (FIXED_SLOTS), or config.rows
 * (PACKED: the blocks the counts name). A view must match the plan: its
 * dtype (BF16 for w, out_dtype for dw), experts, rows n, cols k, ld and
 * expert stride (each as the config set it; expert_stride is not read for
 * one expert).
 * Errors: ETP_ERR_INVALID_ARGUMENT (NULLs, args of the wrong size, an
 * operand the product does not take, a view that differs from the plan,
 * which is named with both sizes, beta other than 0 or 1, PACKED without
 * counts and offsets, a count < 0, a block that overlaps the next or ends
 * past the rows, both naming the expert), ETP_ERR_INVALID_STATE (inside an
 * etp_batch_begin/end), ETP_ERR_BACKEND (cuBLASLt refused a call: the
 * message names the status, the expert and the sizes), ETP_ERR_ABORTED.
 * Work of earlier experts of a failing PACKED call may have been enqueued. */
ETP_API etp_status_t etp_gemm_run(etp_gemm_plan_t *plan, const etp_gemm_args_t *args,
                                  etp_stream_t *stream);

#ifdef __cplusplus
}
#endif

#endif /* ETP_GEMM_H */
