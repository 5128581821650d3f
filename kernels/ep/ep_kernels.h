/*
 * The EP kernels on a CUDA stream (kernels/ep/ep.cu), C-callable; the CUDA
 * backend reaches them through its ep table (src/backend/cuda/cuda_ep.c).
 * Each implements the definition of its argument struct
 * (src/backend/ep_args.h) with the rules of src/ep/ep_rules.h, which the
 * host backend runs too, so results match bit for bit. None allocates or
 * synchronizes: all are capturable into a CUDA graph.
 */
#ifndef ETP__EP_KERNELS_H
#define ETP__EP_KERNELS_H

#include <cuda_runtime_api.h>

#include "backend/ep_args.h"

#ifdef __cplusplus
extern "C" {
#endif

cudaError_t etp__cuda_ep_route(cudaStream_t s, const etp__ep_route_args_t *a);
cudaError_t etp__cuda_ep_clip(cudaStream_t s, const etp__ep_clip_args_t *a);
cudaError_t etp__cuda_ep_layout(cudaStream_t s, const etp__ep_layout_args_t *a);
cudaError_t etp__cuda_ep_pack(cudaStream_t s, const etp__ep_pack_args_t *a);
cudaError_t etp__cuda_ep_expand(cudaStream_t s, const etp__ep_expand_args_t *a);
cudaError_t etp__cuda_ep_presum(cudaStream_t s, const etp__ep_presum_args_t *a);
cudaError_t etp__cuda_ep_reduce(cudaStream_t s, const etp__ep_reduce_args_t *a);
cudaError_t etp__cuda_ep_wgrad(cudaStream_t s, const etp__ep_wgrad_args_t *a);
cudaError_t etp__cuda_ep_wscatter(cudaStream_t s, const etp__ep_wscatter_args_t *a);

#ifdef __cplusplus
}
#endif

#endif /* ETP__EP_KERNELS_H */
