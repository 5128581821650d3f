/*
 * What moe_ops.c shares with its two implementations: the handle, and the
 * per-backend functions it calls once the arguments are checked (they
 * assume valid arguments and n, T > 0 except where noted).
 */
#ifndef MOE_OPS_IMPL_H
#define MOE_OPS_IMPL_H

#include "moe_ops.h"

#if ETP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* moe_mse's per-block partial sums on CUDA: a fixed count, so the order of
 * the sum depends on n alone, never on the device. */
#define MOE_MSE_BLOCKS 256

struct moe_host_rec;

struct moe_ops {
    etp_context_t *ctx;
    etp_backend_t backend;
    struct moe_host_rec *recs; /* host backend: `nrec` records, `used` handed out */
    size_t nrec, used;
    double *mse_partials;      /* CUDA: MOE_MSE_BLOCKS doubles (etp_mem_alloc) */
};

/* ---- host backend (moe_ops_host.c) ---- */
struct moe_host_rec *moe__host_records_alloc(size_t n);
void moe__host_records_free(struct moe_host_rec *recs);

etp_status_t moe__host_fill_normal(moe_ops_t *ops, etp_stream_t *s, uint16_t *dst,
                                   const moe_fill_t *f);
etp_status_t moe__host_router_fwd(moe_ops_t *ops, etp_stream_t *s, const float *logits, int64_t T,
                                  int E, int k, float *probs, int64_t *idx, float *w);
etp_status_t moe__host_router_bwd(moe_ops_t *ops, etp_stream_t *s, const float *probs,
                                  const int64_t *idx, const float *gw, int64_t T, int E, int k,
                                  uint16_t *dz);
etp_status_t moe__host_silu_fwd(moe_ops_t *ops, etp_stream_t *s, const uint16_t *a, uint16_t *out,
                                int64_t n);
etp_status_t moe__host_silu_bwd(moe_ops_t *ops, etp_stream_t *s, const uint16_t *a,
                                const uint16_t *gs, uint16_t *ga, int64_t n);
etp_status_t moe__host_add(moe_ops_t *ops, etp_stream_t *s, const uint16_t *a, const uint16_t *b,
                           const uint16_t *c, uint16_t *out, int64_t n);
/* n may be 0 (writes a loss of 0). */
etp_status_t moe__host_mse(moe_ops_t *ops, etp_stream_t *s, const uint16_t *y,
                           const uint16_t *target, int64_t n, float scale, uint16_t *grad,
                           double *loss);
etp_status_t moe__host_sum(moe_ops_t *ops, etp_stream_t *s, const float *parts, int nparts,
                           int64_t n, float *out);
etp_status_t moe__host_adam(moe_ops_t *ops, etp_stream_t *s, const moe_adam_t *a, const float *g,
                            float *m, float *v, float *master, uint16_t *w, int64_t n);

/* ---- CUDA backend (moe_ops_cuda.cu): ETP_ERR_BACKEND with a message on a
 * launch error ---- */
#if ETP_HAVE_CUDA
etp_status_t moe__cuda_fill_normal(cudaStream_t s, uint16_t *dst, const moe_fill_t *f);
etp_status_t moe__cuda_router_fwd(cudaStream_t s, const float *logits, int64_t T, int E, int k,
                                  float *probs, int64_t *idx, float *w);
etp_status_t moe__cuda_router_bwd(cudaStream_t s, const float *probs, const int64_t *idx,
                                  const float *gw, int64_t T, int E, int k, uint16_t *dz);
etp_status_t moe__cuda_silu_fwd(cudaStream_t s, const uint16_t *a, uint16_t *out, int64_t n);
etp_status_t moe__cuda_silu_bwd(cudaStream_t s, const uint16_t *a, const uint16_t *gs,
                                uint16_t *ga, int64_t n);
etp_status_t moe__cuda_add(cudaStream_t s, const uint16_t *a, const uint16_t *b,
                           const uint16_t *c, uint16_t *out, int64_t n);
/* n may be 0; partials: MOE_MSE_BLOCKS doubles of device memory. */
etp_status_t moe__cuda_mse(cudaStream_t s, const uint16_t *y, const uint16_t *target, int64_t n,
                           float scale, uint16_t *grad, double *loss, double *partials);
etp_status_t moe__cuda_sum(cudaStream_t s, const float *parts, int nparts, int64_t n,
                           float *out);
etp_status_t moe__cuda_adam(cudaStream_t s, const moe_adam_t *a, const float *g, float *m,
                            float *v, float *master, uint16_t *w, int64_t n);
#endif

#ifdef __cplusplus
}
#endif

#endif /* MOE_OPS_IMPL_H */
