/*
 * Values stored to device memory by a kernel that takes them by value
 * (see gemm_ptrs.h for why not a copy).
 */
#include "gemm_ptrs.h"

namespace {

/* 480 x 8 bytes plus the destination and count stay under the 4 KiB of
 * kernel arguments every device and driver accepts. */
constexpr unsigned kChunk = 480;

struct Chunk {
    uint64_t v[kChunk];
};

__global__ void store_u64(uint64_t *__restrict__ dst, unsigned n, Chunk c)
{
    const unsigned i = threadIdx.x;
    if (i < n) dst[i] = c.v[i];
}

} // namespace

extern "C" cudaError_t etp__cuda_store_u64(cudaStream_t s, uint64_t *dst, const uint64_t *vals,
                                           size_t n)
{
    for (size_t done = 0; done < n; done += kChunk) {
        Chunk c;
        unsigned m = (unsigned)(n - done < kChunk ? n - done : kChunk);
        for (unsigned i = 0; i < m; i++) c.v[i] = vals[done + i];
        uint64_t *d = dst + done;
        void *args[] = {&d, &m, &c};
        /* cudaLaunchKernel reports this launch's own status */
        cudaError_t e = cudaLaunchKernel(store_u64, dim3(1), dim3(kChunk), args, 0, s);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}
