/*
 * The NVLink transport on a CUDA stream (kernels/ep/nvl.cu) and the two
 * uses of NCCL's device API it needs (kernels/ep/nvl_window.cu), C-callable;
 * the CUDA backend reaches them from src/backend/cuda/cuda_ep.c. The
 * kernels neither allocate nor synchronize the host: capturable.
 */
#ifndef ETP__NVL_KERNELS_H
#define ETP__NVL_KERNELS_H

#include <cuda_runtime_api.h>

#include "backend/ep_args.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest group the kernels take. */
int etp__cuda_nvl_max_ranks(void);
/* phase: ETP__EP_NVL_PHASE_* (ep_args.h) */
cudaError_t etp__cuda_nvl_t2e(cudaStream_t s, const etp__ep_t2e_args_t *a, int phase);
cudaError_t etp__cuda_nvl_e2t(cudaStream_t s, const etp__ep_e2t_args_t *a, int phase);
cudaError_t etp__cuda_nvl_prepare(cudaStream_t s, const etp__ep_xchg_args_t *a);

/* Whether this build has NCCL's device API (LSA pointers). */
int etp__cuda_nvl_built(void);
/* The ranks of comm's LSA team (those whose memory this rank's kernels can
 * store into: one NVLink domain), or -1 without the device API. comm is an
 * ncclComm_t. */
int etp__cuda_nvl_lsa_ranks(void *comm);
/* out[p] (device, p < ranks) = the address of window `win` (an
 * ncclWindow_t) on LSA rank p, at offset 0: one kernel on s. */
cudaError_t etp__cuda_nvl_peer_ptrs(void *win, int ranks, char **out, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif /* ETP__NVL_KERNELS_H */
