/*
 * etp-train's own small kernels: the element-wise and per-token steps of
 * its model (moe_math.h) over whole arrays, enqueued on an etp stream. On
 * the CUDA backend they are CUDA kernels on the stream's cudaStream_t
 * (moe_ops_cuda.cu); on the host backend, loops run in stream order through
 * etp_stream_launch_host (moe_ops_host.c), so the host backend's shuffle
 * mode and capture rules apply to them as to etp's own work.
 *
 * Pointers are device memory (host memory on the host backend), read and
 * written by the enqueued work. Nothing is allocated per call.
 *
 * Records: on the host backend every call stores its arguments in a record
 * that must live until the loop has run (at every replay, for a call
 * captured into a graph). The records are a fixed array, handed out in
 * call order; moe_ops_mark / moe_ops_rewind let a program reuse them: take
 * the mark at the start of a step, rewind to it at the start of the next
 * (after the previous step's work is done), and never rewind below the
 * records of a graph that may still be launched. Running out of records is
 * ETP_ERR_CAPACITY. The CUDA backend uses no records.
 *
 * A call with nothing to do (n or T 0, an empty fill) enqueues nothing and
 * takes no record, except moe_mse, which writes its loss of 0. A refused
 * call enqueues nothing and takes no record.
 *
 * Every function returns ETP_SUCCESS or an etp status with a message on
 * stderr naming the call (ETP_ERR_INVALID_ARGUMENT for NULLs or sizes out
 * of range, ETP_ERR_BACKEND for a CUDA launch error).
 */
#ifndef MOE_OPS_H
#define MOE_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "etp/etp.h"
#include "moe_math.h"

typedef struct moe_ops moe_ops_t;

/* For ctx's backend, with `records` host records (> 0 on the host backend;
 * ignored on CUDA). On CUDA, allocates moe_mse's scratch through
 * etp_mem_alloc (ETP_MEM_WORKSPACE, 2 KiB): not during a graph capture.
 * The handle keeps ctx, which must outlive it. */
etp_status_t moe_ops_create(etp_context_t *ctx, size_t records, moe_ops_t **ops);
/* Frees the scratch (waits for the context's work, like etp_mem_free) and
 * the records: no graph that captured calls of ops may be launched after.
 * NULL is a no-op. */
void moe_ops_destroy(moe_ops_t *ops);
/* The number of records in use (0 on CUDA). */
size_t moe_ops_mark(const moe_ops_t *ops);
/* Give back the records taken after `mark` (a value moe_ops_mark
 * returned); a mark past the records in use is ignored with a message. */
void moe_ops_rewind(moe_ops_t *ops, size_t mark);

/* A block of a random tensor (moe_normal of tensor `tensor`), as BF16:
 * dst [experts][rows][cols] gets, for i < valid_rows, element
 *   scale * moe_normal(seed, tensor, ((expert0 + e) * total_rows + row0 + i) * cols + j)
 * rounded to BF16, and zeros in rows i >= valid_rows (a shard's padding). */
typedef struct moe_fill {
    uint64_t seed, tensor;
    int64_t experts, rows, cols; /* dst */
    int64_t expert0, row0;       /* where dst starts in the whole tensor (row0 may pass
                                  * total_rows when valid_rows is 0: a shard of padding) */
    int64_t valid_rows;          /* 0 .. rows */
    int64_t total_rows;          /* rows per expert of the whole tensor */
    float scale;
} moe_fill_t;

etp_status_t moe_fill_normal(moe_ops_t *ops, etp_stream_t *s, uint16_t *dst, const moe_fill_t *f);

/* Router forward, per token t < T: moe_softmax_topk(logits[t, :E]) ->
 * probs [T, E] FP32, idx [T, k] int64, w [T, k] FP32. E <= 1024. */
etp_status_t moe_router_fwd(moe_ops_t *ops, etp_stream_t *s, const float *logits, int64_t T,
                            int E, int k, float *probs, int64_t *idx, float *w);

/* Router backward: dz [T, E] BF16 = moe_router_dlogit(probs[t], idx[t],
 * gw[t]) rounded to BF16. */
etp_status_t moe_router_bwd(moe_ops_t *ops, etp_stream_t *s, const float *probs,
                            const int64_t *idx, const float *gw, int64_t T, int E, int k,
                            uint16_t *dz);

/* s[i] = bf16(moe_silu(a[i])), n elements (BF16). */
etp_status_t moe_silu_fwd(moe_ops_t *ops, etp_stream_t *st, const uint16_t *a, uint16_t *s,
                          int64_t n);
/* ga[i] = bf16(moe_silu_grad(a[i], gs[i])). */
etp_status_t moe_silu_bwd(moe_ops_t *ops, etp_stream_t *st, const uint16_t *a,
                          const uint16_t *gs, uint16_t *ga, int64_t n);

/* out[i] = bf16((a[i] + b[i]) + c[i]) in FP32 (c may be NULL: a + b).
 * out may be a, b or c. */
etp_status_t moe_add(moe_ops_t *ops, etp_stream_t *st, const uint16_t *a, const uint16_t *b,
                     const uint16_t *c, uint16_t *out, int64_t n);

/* Loss of n elements: grad[i] = bf16(moe_mse_grad(y[i], target[i], scale))
 * and *loss = the sum of (y - target)^2 in FP64 (one double in device
 * memory), in an order fixed by n (two launches on CUDA, no atomics: a
 * replayed graph gives the same bits as an eager call). n may be 0
 * (loss 0). The loss term is moe_mse_term. On CUDA the calls of one
 * moe_ops_t share one scratch between the two launches: two moe_mse of the
 * same handle must not run concurrently (on unjoined streams). */
etp_status_t moe_mse(moe_ops_t *ops, etp_stream_t *st, const uint16_t *y, const uint16_t *target,
                     int64_t n, float scale, uint16_t *grad, double *loss);

/* out[i] = ((parts[0][i] + parts[1][i]) + ...) + parts[nparts-1][i] in FP32,
 * part p at parts + p * n: the replicas' gradients summed in a fixed order
 * (an all-reduce's order is the library's). out may be parts (part 0). */
etp_status_t moe_sum(moe_ops_t *ops, etp_stream_t *st, const float *parts, int nparts, int64_t n,
                     float *out);

/* Adam over n elements: master[i] = moe_adam_step(a, g[i], &m[i], &v[i],
 * master[i]) and w[i] = bf16(master[i]). `a` is copied. */
etp_status_t moe_adam(moe_ops_t *ops, etp_stream_t *st, const moe_adam_t *a, const float *g,
                      float *m, float *v, float *master, uint16_t *w, int64_t n);

#endif /* MOE_OPS_H */
