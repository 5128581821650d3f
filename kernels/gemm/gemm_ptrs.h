/*
 * The device arrays of operand pointers a grouped cuBLAS GEMM reads,
 * written by a kernel whose arguments carry the values: a CUDA graph that
 * captures the launch keeps the values in its kernel node, so a replay
 * writes what the captured call computed, whatever later calls did (a copy
 * from host memory would read that memory again at each replay).
 *
 * C-callable; the CUDA backend's gemm plans (src/backend/cuda/cuda_gemm.c)
 * use it.
 */
#ifndef ETP__KERNELS_GEMM_PTRS_H
#define ETP__KERNELS_GEMM_PTRS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Enqueue dst[i] = vals[i] for i < n on stream s: ceil(n / 480) launches
 * of one block each (480 values fill a launch's 4 KiB of arguments). vals
 * is host memory, read before the call returns. n may be 0 (nothing is
 * launched). Allocates nothing; returns the first failing launch's status. */
cudaError_t etp__cuda_store_u64(cudaStream_t s, uint64_t *dst, const uint64_t *vals, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* ETP__KERNELS_GEMM_PTRS_H */
