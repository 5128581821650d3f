/* C-callable launchers of the shard module's CUDA kernels. Each enqueues on
 * `s` and returns the launch status; n or the geometry may be empty. */
#ifndef ETP__SHARD_KERNELS_CU_H
#define ETP__SHARD_KERNELS_CU_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dst[e*stride + i] = fmaf(scale, x, dst[...]) for i < valid_elems, x the
 * FP32 sum in order r = 0 .. nsrc-1 of src[e*src_estride + r*src_rstride + i];
 * src_bf16 selects BF16 (else F32) source. */
cudaError_t etp__cuda_shard_accumulate(cudaStream_t s, float *dst, const void *src, int src_bf16,
                                       int64_t experts, int64_t valid_elems, int64_t stride,
                                       int nsrc, int64_t src_rstride, int64_t src_estride,
                                       float scale, int store);
/* dst[e*dst_stride + i*cols + c] = convert(src[e*src_stride + i*src_ld + c])
 * for i < valid_rows, 0 for valid_rows <= i < rows. Types: 0 = F32, 1 = BF16. */
cudaError_t etp__cuda_convert_rows(cudaStream_t s, void *dst, int dst_bf16, int64_t dst_stride,
                                   const void *src, int src_bf16, int64_t src_stride, int64_t src_ld,
                                   int64_t experts, int64_t rows, int64_t cols, int64_t valid_rows);
/* out[0] += sum of squares (FP64) of finite x, out[1] += count of NaN/Inf. */
cudaError_t etp__cuda_grad_stats(cudaStream_t s, const float *x, int64_t experts,
                                 int64_t valid_elems, int64_t stride, double *out);

#ifdef __cplusplus
}
#endif

#endif
