/* The shard module's elementwise kernels: main_grad accumulation, the wgrad
 * upcast, row conversions and gradient statistics. Memory-bound: grid-stride
 * loops over (expert, element), one element per thread per step. */
#include <cuda_bf16.h>
#include <math.h>

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

template <bool kBf16>
__global__ void accumulate_kernel(float *dst, const void *src, int64_t experts, int64_t valid,
                                  int64_t stride, float scale)
{
    int64_t total = experts * valid;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total;
         k += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = (k / valid) * stride + k % valid;
        float x = kBf16 ? bf16_to_float(static_cast<const uint16_t *>(src)[i])
                        : static_cast<const float *>(src)[i];
        dst[i] = fmaf(scale, x, dst[i]);
    }
}

__global__ void bf16_to_f32_kernel(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = bf16_to_float(src[i]);
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

extern "C" cudaError_t etp__cuda_shard_accumulate(cudaStream_t s, float *dst, const void *src,
                                                  int src_bf16, int64_t experts, int64_t valid,
                                                  int64_t stride, float scale)
{
    if (experts <= 0 || valid <= 0) return cudaSuccess;
    if (src_bf16)
        accumulate_kernel<true><<<blocks_for(experts * valid), kThreads, 0, s>>>(dst, src, experts,
                                                                                valid, stride, scale);
    else
        accumulate_kernel<false><<<blocks_for(experts * valid), kThreads, 0, s>>>(dst, src, experts,
                                                                                 valid, stride, scale);
    return cudaGetLastError();
}

extern "C" cudaError_t etp__cuda_bf16_to_f32(cudaStream_t s, float *dst, const uint16_t *src, size_t n)
{
    if (n == 0) return cudaSuccess;
    bf16_to_f32_kernel<<<blocks_for((int64_t)n), kThreads, 0, s>>>(dst, src, n);
    return cudaGetLastError();
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
