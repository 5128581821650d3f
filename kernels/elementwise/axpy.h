/*
 * y[i] = fmaf(alpha, x[i], y[i]) on a CUDA stream: the accumulation of a
 * reduce-scattered weight gradient into the FP32 main_grad shard.
 *
 * C-callable; the CUDA backend reaches it through its kernel table.
 */
#ifndef ETP__KERNELS_AXPY_H
#define ETP__KERNELS_AXPY_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Enqueue y[i] = fmaf(alpha, x[i], y[i]) for i < n on stream s. n may be 0
 * (nothing is launched) or larger than 2^32. x and y must not overlap.
 * Allocates nothing; returns the launch status. */
cudaError_t etp__cuda_axpy_f32(cudaStream_t s, size_t n, float alpha, const float *x, float *y);

#ifdef __cplusplus
}
#endif

#endif /* ETP__KERNELS_AXPY_H */
