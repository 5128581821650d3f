/* The shard module's elementwise kernels: main_grad accumulation, row
 * conversions and gradient statistics. Memory-bound: grid-stride
 * loops over (expert, element), one element per thread per step. */
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "shard_kernels.h"

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float bf16_to_float(uint16_t h)
{
    return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

/* RNE like the host reference (etp__f32_to_bf16), NaN kept quiet. */
__device__ __forceinline__ uint16_t float_to_bf16(float f)
{
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
}

int blocks_for(int64_t n)
{
    int64_t b = (n + kThreads - 1) / kThreads;
    return static_cast<int>(b > 4096 ? 4096 : (b < 1 ? 1 : b));
}

/* The FP32 sum of the ranks' chunks starts from +0 and adds in rank order,
 * like the host reference (a -0 chunk alone gives +0 there too). */
template <bool kBf16, bool kStore>
__global__ void accumulate_kernel(float *dst, const void *src, int64_t experts, int64_t valid,
                                  int64_t stride, int nsrc, int64_t rstride, int64_t estride,
                                  float scale)
{
    int64_t total = experts * valid;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total;
         k += (int64_t)gridDim.x * blockDim.x) {
        const int64_t e = k / valid, i = k % valid;
        float x = 0.0f;
        for (int r = 0; r < nsrc; r++) {
            const int64_t j = e * estride + r * rstride + i;
            x = __fadd_rn(x, kBf16 ? bf16_to_float(static_cast<const uint16_t *>(src)[j])
                                   : static_cast<const float *>(src)[j]);
        }
        float *d = dst + e * stride + i;
        *d = fmaf(scale, x, kStore ? 0.0f : *d);
    }
}

/* The same on 4 elements per thread (every offset a multiple of 4 and the
 * buffers aligned: checked by the launcher), the chunks' loads issued
 * together. */
template <bool kBf16, bool kStore>
__global__ void accumulate_vec4(float *dst, const void *src, int64_t experts, int64_t valid,
                                int64_t stride, int nsrc, int64_t rstride, int64_t estride,
                                float scale)
{
    const int64_t v4 = valid / 4, total = experts * v4;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total;
         k += (int64_t)gridDim.x * blockDim.x) {
        const int64_t e = k / v4, i = (k % v4) * 4;
        float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int r = 0; r < nsrc; r++) {
            const int64_t j = e * estride + r * rstride + i;
            float y[4];
            if (kBf16) {
                const uint2 v = *reinterpret_cast<const uint2 *>(static_cast<const uint16_t *>(src) + j);
                y[0] = __uint_as_float(v.x << 16);
                y[1] = __uint_as_float(v.x & 0xffff0000u);
                y[2] = __uint_as_float(v.y << 16);
                y[3] = __uint_as_float(v.y & 0xffff0000u);
            } else {
                const float4 v = *reinterpret_cast<const float4 *>(static_cast<const float *>(src) + j);
                y[0] = v.x;
                y[1] = v.y;
                y[2] = v.z;
                y[3] = v.w;
            }
#pragma unroll
            for (int q = 0; q < 4; q++) x[q] = __fadd_rn(x[q], y[q]);
        }
        float4 *d = reinterpret_cast<float4 *>(dst + e * stride + i);
        float4 o = kStore ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : *d;
        o.x = fmaf(scale, x[0], o.x);
        o.y = fmaf(scale, x[1], o.y);
        o.z = fmaf(scale, x[2], o.z);
        o.w = fmaf(scale, x[3], o.w);
        *d = o;
    }
}

__global__ void convert_rows_kernel(void *dst, int dst_bf16, int64_t dst_stride, const void *src,
                                    int src_bf16, int64_t src_stride, int64_t src_ld,
                                    int64_t experts, int64_t rows, int64_t cols, int64_t valid)
{
    int64_t per = rows * cols, total = experts * per;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total;
         k += (int64_t)gridDim.x * blockDim.x) {
        int64_t e = k / per, r = (k % per) / cols, c = k % cols;
        float v = 0.0f;
        if (r < valid) {
            int64_t si = e * src_stride + r * src_ld + c;
            v = src_bf16 ? bf16_to_float(static_cast<const uint16_t *>(src)[si])
                         : static_cast<const float *>(src)[si];
        }
        int64_t di = e * dst_stride + r * cols + c;
        if (dst_bf16)
            static_cast<uint16_t *>(dst)[di] = float_to_bf16(v);
        else
            static_cast<float *>(dst)[di] = v;
    }
}

__global__ void grad_stats_kernel(const float *x, int64_t experts, int64_t valid, int64_t stride,
                                  double *out)
{
    __shared__ double ssum[kThreads], sbad[kThreads];
    double sum = 0, bad = 0;
    int64_t total = experts * valid;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total;
         k += (int64_t)gridDim.x * blockDim.x) {
        float v = x[(k / valid) * stride + k % valid];
        if (isfinite(v))
            sum += (double)v * (double)v;
        else
            bad += 1;
    }
    ssum[threadIdx.x] = sum;
    sbad[threadIdx.x] = bad;
    __syncthreads();
    for (int w = kThreads / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) {
            ssum[threadIdx.x] += ssum[threadIdx.x + w];
            sbad[threadIdx.x] += sbad[threadIdx.x + w];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        atomicAdd(&out[0], ssum[0]);
        atomicAdd(&out[1], sbad[0]);
    }
}

}  // namespace

/* One instantiation per (source type, store) pair: the store variant never
 * loads main_grad. */
template <bool kBf16, bool kStore>
static cudaError_t accumulate_launch(cudaStream_t s, float *dst, const void *src, int64_t experts,
                                     int64_t valid, int64_t stride, int nsrc, int64_t rstride,
                                     int64_t estride, float scale, bool vec)
{
    if (vec)
        accumulate_vec4<kBf16, kStore><<<blocks_for(experts * valid / 4), kThreads, 0, s>>>(
            dst, src, experts, valid, stride, nsrc, rstride, estride, scale);
    else
        accumulate_kernel<kBf16, kStore><<<blocks_for(experts * valid), kThreads, 0, s>>>(
            dst, src, experts, valid, stride, nsrc, rstride, estride, scale);
    return cudaGetLastError();
}

extern "C" cudaError_t etp__cuda_shard_accumulate(cudaStream_t s, float *dst, const void *src,
                                                  int src_bf16, int64_t experts, int64_t valid,
                                                  int64_t stride, int nsrc, int64_t rstride,
                                                  int64_t estride, float scale, int store)
{
    if (experts <= 0 || valid <= 0) return cudaSuccess;
    const int64_t es = src_bf16 ? 2 : 4;
    const bool vec = ((valid | stride | rstride | estride) & 3) == 0 &&
                     (reinterpret_cast<uintptr_t>(dst) & 15u) == 0 &&
                     (reinterpret_cast<uintptr_t>(src) & (uintptr_t)(4 * es - 1)) == 0;
    if (src_bf16)
        return store ? accumulate_launch<true, true>(s, dst, src, experts, valid, stride, nsrc, rstride, estride, scale, vec)
                     : accumulate_launch<true, false>(s, dst, src, experts, valid, stride, nsrc, rstride, estride, scale, vec);
    return store ? accumulate_launch<false, true>(s, dst, src, experts, valid, stride, nsrc, rstride, estride, scale, vec)
                 : accumulate_launch<false, false>(s, dst, src, experts, valid, stride, nsrc, rstride, estride, scale, vec);
}

extern "C" cudaError_t etp__cuda_convert_rows(cudaStream_t s, void *dst, int dst_bf16,
                                              int64_t dst_stride, const void *src, int src_bf16,
                                              int64_t src_stride, int64_t src_ld, int64_t experts,
                                              int64_t rows, int64_t cols, int64_t valid_rows)
{
    if (experts <= 0 || rows <= 0 || cols <= 0) return cudaSuccess;
    convert_rows_kernel<<<blocks_for(experts * rows * cols), kThreads, 0, s>>>(
        dst, dst_bf16, dst_stride, src, src_bf16, src_stride, src_ld, experts, rows, cols, valid_rows);
    return cudaGetLastError();
}

extern "C" cudaError_t etp__cuda_grad_stats(cudaStream_t s, const float *x, int64_t experts,
                                            int64_t valid, int64_t stride, double *out)
{
    if (experts <= 0 || valid <= 0) return cudaSuccess;
    grad_stats_kernel<<<blocks_for(experts * valid), kThreads, 0, s>>>(x, experts, valid, stride, out);
    return cudaGetLastError();
}
