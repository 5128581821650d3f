// How fast can any kernel move an MXFP8 cast's bytes? A standalone probe,
// not part of the build: the bound behind issue 3's "fused >= 10x" for
// 64 x [1024, 512] BF16 (docs/PERF.md, fifteenth session). One GPU.
//
// The cast reads 64 MiB of BF16 and writes two 32 MiB FP8 copies (plus
// 2 MiB of scales, left out here). This probe times, under the same L2
// flush as etp-bench quant (a 256 MiB buffer written, or read, before each
// run), kernels with the same traffic and no arithmetic worth the name:
// each thread reads 16-byte words and writes one 8-byte word to each output
// per input word (the high byte of each BF16). Grid-stride loops, several
// grid sizes and loads in flight per thread. Also cudaMemcpyAsync of
// 64 MiB (128 MiB of traffic against the cast's 128 MiB). Medians of 30
// runs after 5 warm-up ones, CUDA events.
//
//   nvcc -O3 -arch=sm_90 -o cast_bound cast_bound.cu
//   ./cast_bound
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#define CK(x)                                                                              \
    do {                                                                                   \
        cudaError_t e_ = (x);                                                              \
        if (e_ != cudaSuccess) {                                                           \
            printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e_));           \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

__device__ __forceinline__ uint2 hi_bytes(uint4 v)
{
    // the high byte of each of the 8 BF16: stands in for the FP8 code
    return make_uint2(__byte_perm(v.x, v.y, 0x7531), __byte_perm(v.z, v.w, 0x7531));
}

// U words a thread in flight; n16 input words of 16 bytes
template <int U>
__global__ void __launch_bounds__(256) stream_cast(const uint4 *__restrict__ in, uint2 *__restrict__ r,
                                                   uint2 *__restrict__ c, size_t n16)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + (U - 1) * stride < n16; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = __ldcs(in + i + u * stride);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const uint2 h = hi_bytes(v[u]);
            __stcs(r + i + u * stride, h);
            __stcs(c + i + u * stride, make_uint2(h.y, h.x));
        }
    }
    for (; i < n16; i += stride) {
        const uint2 h = hi_bytes(in[i]);
        r[i] = h;
        c[i] = make_uint2(h.y, h.x);
    }
}

// Blocks that each own a contiguous chunk (no grid stride), like the
// cast's tiles: 32 KiB of input a block, 2048 blocks.
__global__ void __launch_bounds__(256) chunk_cast(const uint4 *__restrict__ in, uint2 *__restrict__ r,
                                                  uint2 *__restrict__ c)
{
    const size_t base = (size_t)blockIdx.x * 2048;
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; u++) v[u] = in[base + u * 256 + threadIdx.x];
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const uint2 h = hi_bytes(v[u]);
        r[base + u * 256 + threadIdx.x] = h;
        c[base + u * 256 + threadIdx.x] = make_uint2(h.y, h.x);
    }
}

__global__ void read_flush(const uint4 *__restrict__ p, size_t n16, unsigned *sink)
{
    unsigned acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += (size_t)gridDim.x * blockDim.x)
        acc ^= p[i].x ^ p[i].w;
    if (acc == 0x12345678u) *sink = acc;
}

int main()
{
    const size_t in_bytes = (size_t)64 << 20, out_bytes = in_bytes / 2, flush_bytes = (size_t)256 << 20;
    const size_t n16 = in_bytes / 16;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, %d SMs, L2 %d MiB\n", prop.name, sms, prop.l2CacheSize >> 20);
    uint4 *in, *flush;
    uint2 *r, *c;
    unsigned *sink;
    void *cp;
    CK(cudaMalloc(&in, in_bytes));
    CK(cudaMalloc(&r, out_bytes));
    CK(cudaMalloc(&c, out_bytes));
    CK(cudaMalloc(&cp, in_bytes));
    CK(cudaMalloc(&flush, flush_bytes));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(in, 0x3c, in_bytes));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int fm = 0; fm < 2; fm++) {
        auto time = [&](const char *name, auto &&op) {
            std::vector<float> t;
            for (int it = 0; it < 35; it++) {
                if (fm == 0)
                    CK(cudaMemsetAsync(flush, it & 0xff, flush_bytes, s));
                else
                    read_flush<<<4 * sms, 512, 0, s>>>(flush, flush_bytes / 16, sink);
                CK(cudaEventRecord(a, s));
                op();
                CK(cudaEventRecord(b, s));
                CK(cudaEventSynchronize(b));
                CK(cudaGetLastError());
                float ms = 0;
                CK(cudaEventElapsedTime(&ms, a, b));
                if (it >= 5) t.push_back(1e3f * ms);
            }
            std::sort(t.begin(), t.end());
            const double us = t[t.size() / 2];
            printf("%-5s flush  %-34s %7.1f us  %6.0f GB/s (128 MiB of traffic)\n", fm ? "read" : "write", name,
                   us, 2.0 * in_bytes / us / 1e3);
        };
        time("cudaMemcpyAsync 64 MiB", [&] { CK(cudaMemcpyAsync(cp, in, in_bytes, cudaMemcpyDeviceToDevice, s)); });
        time("chunks: 2048 blocks x 32 KiB", [&] { chunk_cast<<<(unsigned)(n16 / 2048), 256, 0, s>>>(in, r, c); });
        for (int mult : {1, 2, 4, 8}) {
            char nm[64];
            snprintf(nm, sizeof nm, "grid stride, %d x SMs, 1 in flight", mult);
            time(nm, [&] { stream_cast<1><<<mult * sms, 256, 0, s>>>(in, r, c, n16); });
            snprintf(nm, sizeof nm, "grid stride, %d x SMs, 4 in flight", mult);
            time(nm, [&] { stream_cast<4><<<mult * sms, 256, 0, s>>>(in, r, c, n16); });
        }
    }
    return 0;
}
