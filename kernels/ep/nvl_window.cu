/*
 * The NVLink transport's use of NCCL's device API (NCCL >= 2.28): the LSA
 * team of a communicator, and the addresses of a symmetric window on every
 * LSA peer (ncclGetLsaPointer), read once on the device when an EP group
 * makes its window; the transport's kernels then store through plain
 * pointers. Kept apart so that only this file needs nccl_device.h.
 */
#include <nccl.h>

#include "nvl_kernels.h"

#if defined(__has_include)
#if __has_include(<nccl_device.h>) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 3)
#define ETP__NVL_DEVICE_API 1
#endif
#endif

#ifdef ETP__NVL_DEVICE_API
#include <nccl_device.h>

namespace {
__global__ void peer_ptrs(ncclWindow_t win, int ranks, char **out)
{
    const int p = threadIdx.x;
    if (p < ranks) out[p] = static_cast<char *>(ncclGetLsaPointer(win, 0, p));
}
} // namespace

extern "C" int etp__cuda_nvl_built(void)
{
    return 1;
}

extern "C" int etp__cuda_nvl_lsa_ranks(void *comm)
{
    return ncclTeamLsa(static_cast<ncclComm_t>(comm)).nRanks;
}

extern "C" cudaError_t etp__cuda_nvl_peer_ptrs(void *win, int ranks, char **out, cudaStream_t s)
{
    peer_ptrs<<<1, ranks, 0, s>>>(static_cast<ncclWindow_t>(win), ranks, out);
    return cudaGetLastError();
}

#else

extern "C" int etp__cuda_nvl_built(void)
{
    return 0;
}

extern "C" int etp__cuda_nvl_lsa_ranks(void *comm)
{
    (void)comm;
    return -1;
}

extern "C" cudaError_t etp__cuda_nvl_peer_ptrs(void *win, int ranks, char **out, cudaStream_t s)
{
    (void)win, (void)ranks, (void)out, (void)s;
    return cudaErrorNotSupported;
}

#endif
