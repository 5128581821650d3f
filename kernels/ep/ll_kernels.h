/*
 * The low-latency dispatch kernel on a CUDA stream (kernels/ep/ll.cu),
 * C-callable; the CUDA backend reaches it from src/backend/cuda/cuda_ep.c.
 * It neither allocates nor synchronizes the host: capturable.
 */
#ifndef ETP__LL_KERNELS_H
#define ETP__LL_KERNELS_H

#include <cuda_runtime_api.h>

#include "backend/ep_args.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cudaErrorInvalidValue for a layer past the kernel's bounds (more than
 * 256 tokens, ETP__EP_LL_MAX_TOPK or ETP__EP_LL_MAX_RANKS), which the ep
 * module refuses before. */
cudaError_t etp__cuda_ll_dispatch(cudaStream_t s, const etp__ep_ll_args_t *a);

#ifdef __cplusplus
}
#endif

#endif /* ETP__LL_KERNELS_H */
