/*
 * The CUDA backend of moe_ops.h: one kernel a call (two for moe_mse), each
 * element or token computed by moe_math.h's functions, so the arithmetic
 * is the host loops'. Compiled with --fmad=false (no contraction the host
 * does not make). Grid-stride loops over 64-bit indices.
 */
#include <stdio.h>

#include <cuda_runtime.h>

#include "moe_ops_impl.h"

namespace {

const int kThreads = 256;
const int64_t kMaxBlocks = 4096;

int blocks_for(int64_t n)
{
    int64_t b = (n + kThreads - 1) / kThreads;
    return (int)(b < 1 ? 1 : b > kMaxBlocks ? kMaxBlocks : b);
}

etp_status_t launched(const char *call)
{
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return ETP_SUCCESS;
    fprintf(stderr, "%s: kernel launch failed: %s (%s)\n", call, cudaGetErrorName(e),
            cudaGetErrorString(e));
    return ETP_ERR_BACKEND;
}

__device__ inline int64_t first_index()
{
    return (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ inline int64_t grid_stride()
{
    return (int64_t)gridDim.x * blockDim.x;
}

__global__ void fill_kernel(uint16_t *dst, moe_fill_t f)
{
    int64_t per_expert = f.rows * f.cols, n = f.experts * per_expert;
    for (int64_t q = first_index(); q < n; q += grid_stride()) {
        int64_t e = q / per_expert, rem = q - e * per_expert;
        int64_t i = rem / f.cols, j = rem - i * f.cols;
        uint16_t out = 0;
        if (i < f.valid_rows) {
            uint64_t idx = (uint64_t)(((f.expert0 + e) * f.total_rows + f.row0 + i) * f.cols + j);
            out = moe_f32_to_bf16(f.scale * moe_normal(f.seed, f.tensor, idx));
        }
        dst[q] = out;
    }
}

/* One thread a token: moe_softmax_topk writes the probabilities straight
 * into the token's row, so no per-thread array of E values is needed. */
__global__ void router_fwd_kernel(const float *logits, int64_t T, int E, int k, float *probs,
                                  int64_t *idx, float *w)
{
    for (int64_t t = first_index(); t < T; t += grid_stride())
        moe_softmax_topk(logits + t * E, E, k, probs + t * E, idx + t * k, w + t * k);
}

/* One thread an element of dz; each recomputes its token's dot (k terms,
 * the same function and order as the host's once-per-token value). */
__global__ void router_bwd_kernel(const float *probs, const int64_t *idx, const float *gw,
                                  int64_t T, int E, int k, uint16_t *dz)
{
    int64_t n = T * E;
    for (int64_t q = first_index(); q < n; q += grid_stride()) {
        int64_t t = q / E;
        int i = (int)(q - t * E);
        const float *p = probs + t * E, *g = gw + t * k;
        const int64_t *ix = idx + t * k;
        float dot = moe_router_dot(p, ix, g, k);
        dz[q] = moe_f32_to_bf16(moe_router_dlogit(p, ix, g, k, dot, i));
    }
}

__global__ void silu_fwd_kernel(const uint16_t *a, uint16_t *s, int64_t n)
{
    for (int64_t i = first_index(); i < n; i += grid_stride())
        s[i] = moe_f32_to_bf16(moe_silu(moe_bf16_to_f32(a[i])));
}

__global__ void silu_bwd_kernel(const uint16_t *a, const uint16_t *gs, uint16_t *ga, int64_t n)
{
    for (int64_t i = first_index(); i < n; i += grid_stride())
        ga[i] = moe_f32_to_bf16(moe_silu_grad(moe_bf16_to_f32(a[i]), moe_bf16_to_f32(gs[i])));
}

__global__ void add_kernel(const uint16_t *a, const uint16_t *b, const uint16_t *c, uint16_t *out,
                           int64_t n)
{
    for (int64_t i = first_index(); i < n; i += grid_stride()) {
        float x = moe_bf16_to_f32(a[i]) + moe_bf16_to_f32(b[i]);
        if (c != NULL) x = x + moe_bf16_to_f32(c[i]);
        out[i] = moe_f32_to_bf16(x);
    }
}

__global__ void sum_kernel(const float *parts, int nparts, int64_t n, float *out)
{
    for (int64_t i = first_index(); i < n; i += grid_stride()) {
        float x = parts[i];
        for (int p = 1; p < nparts; p++) x = x + parts[p * n + i];
        out[i] = x;
    }
}

/* The loss's first pass, on exactly MOE_MSE_BLOCKS blocks of kThreads: each
 * thread sums its grid-stride elements in order, each block its threads
 * by a fixed tree into partials[block]. The order depends on n alone. */
__global__ void mse_kernel(const uint16_t *y, const uint16_t *target, int64_t n, float scale,
                           uint16_t *grad, double *partials)
{
    __shared__ double sums[kThreads];
    double acc = 0.0;
    for (int64_t i = first_index(); i < n; i += grid_stride()) {
        float yy = moe_bf16_to_f32(y[i]), tt = moe_bf16_to_f32(target[i]);
        acc += moe_mse_term(yy, tt);
        grad[i] = moe_f32_to_bf16(moe_mse_grad(yy, tt, scale));
    }
    sums[threadIdx.x] = acc;
    __syncthreads();
    for (int h = kThreads / 2; h > 0; h /= 2) {
        if ((int)threadIdx.x < h) sums[threadIdx.x] += sums[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) partials[blockIdx.x] = sums[0];
}

/* The second pass: the partials in block order. */
__global__ void mse_sum_kernel(const double *partials, double *loss)
{
    double s = 0.0;
    for (int b = 0; b < MOE_MSE_BLOCKS; b++) s += partials[b];
    *loss = s;
}

__global__ void adam_kernel(moe_adam_t a, const float *g, float *m, float *v, float *master,
                            uint16_t *w, int64_t n)
{
    for (int64_t i = first_index(); i < n; i += grid_stride()) {
        float nm = moe_adam_step(&a, g[i], &m[i], &v[i], master[i]);
        master[i] = nm;
        w[i] = moe_f32_to_bf16(nm);
    }
}

} // namespace

extern "C" {

etp_status_t moe__cuda_fill_normal(cudaStream_t s, uint16_t *dst, const moe_fill_t *f)
{
    fill_kernel<<<blocks_for(f->experts * f->rows * f->cols), kThreads, 0, s>>>(dst, *f);
    return launched("moe_fill_normal");
}

etp_status_t moe__cuda_router_fwd(cudaStream_t s, const float *logits, int64_t T, int E, int k,
                                  float *probs, int64_t *idx, float *w)
{
    router_fwd_kernel<<<blocks_for(T), kThreads, 0, s>>>(logits, T, E, k, probs, idx, w);
    return launched("moe_router_fwd");
}

etp_status_t moe__cuda_router_bwd(cudaStream_t s, const float *probs, const int64_t *idx,
                                  const float *gw, int64_t T, int E, int k, uint16_t *dz)
{
    router_bwd_kernel<<<blocks_for(T * E), kThreads, 0, s>>>(probs, idx, gw, T, E, k, dz);
    return launched("moe_router_bwd");
}

etp_status_t moe__cuda_silu_fwd(cudaStream_t s, const uint16_t *a, uint16_t *out, int64_t n)
{
    silu_fwd_kernel<<<blocks_for(n), kThreads, 0, s>>>(a, out, n);
    return launched("moe_silu_fwd");
}

etp_status_t moe__cuda_silu_bwd(cudaStream_t s, const uint16_t *a, const uint16_t *gs,
                                uint16_t *ga, int64_t n)
{
    silu_bwd_kernel<<<blocks_for(n), kThreads, 0, s>>>(a, gs, ga, n);
    return launched("moe_silu_bwd");
}

etp_status_t moe__cuda_add(cudaStream_t s, const uint16_t *a, const uint16_t *b,
                           const uint16_t *c, uint16_t *out, int64_t n)
{
    add_kernel<<<blocks_for(n), kThreads, 0, s>>>(a, b, c, out, n);
    return launched("moe_add");
}

etp_status_t moe__cuda_mse(cudaStream_t s, const uint16_t *y, const uint16_t *target, int64_t n,
                           float scale, uint16_t *grad, double *loss, double *partials)
{
    mse_kernel<<<MOE_MSE_BLOCKS, kThreads, 0, s>>>(y, target, n, scale, grad, partials);
    etp_status_t st = launched("moe_mse");
    if (st != ETP_SUCCESS) return st;
    mse_sum_kernel<<<1, 1, 0, s>>>(partials, loss);
    return launched("moe_mse");
}

etp_status_t moe__cuda_sum(cudaStream_t s, const float *parts, int nparts, int64_t n,
                           float *out)
{
    sum_kernel<<<blocks_for(n), kThreads, 0, s>>>(parts, nparts, n, out);
    return launched("moe_sum");
}

etp_status_t moe__cuda_adam(cudaStream_t s, const moe_adam_t *a, const float *g, float *m,
                            float *v, float *master, uint16_t *w, int64_t n)
{
    adam_kernel<<<blocks_for(n), kThreads, 0, s>>>(*a, g, m, v, master, w, n);
    return launched("moe_adam");
}

} // extern "C"
