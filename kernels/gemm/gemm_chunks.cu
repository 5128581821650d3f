/* The pointer arrays of a chunked PACKED matmul (gemm_chunks.h): a block
 * an expert, a thread a chunk. */
#include "gemm_chunks.h"

namespace
{

constexpr int kThreads = 128;

__global__ void chunk_ptrs(const etp__gemm_chunk_args_t p)
{
    const int e = blockIdx.x;
    const int64_t m = p.count[e], n = etp__gemm_chunks_of(m);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        const int64_t row = p.offset[e] + etp__gemm_chunk_start(m, j), i = p.first[e] + j;
        p.pa[i] = (void *)(p.a + e * p.a_expert);
        p.pb[i] = (void *)(p.b + row * p.b_row);
        p.pd[i] = (void *)(p.d + row * p.d_row);
    }
}

} // namespace

extern "C" cudaError_t etp__cuda_gemm_chunk_ptrs(cudaStream_t s, const etp__gemm_chunk_args_t *args)
{
    if (args->experts <= 0) return cudaSuccess;
    /* cudaLaunchKernel reports this launch's own status, not an error left
     * behind by an earlier, unrelated runtime call of this thread */
    void *kargs[] = {(void *)args};
    return cudaLaunchKernel((const void *)chunk_ptrs, dim3((unsigned)args->experts), dim3(kThreads),
                            kargs, 0, s);
}
