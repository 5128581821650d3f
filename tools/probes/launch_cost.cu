// What does the host spend on one launch? A standalone probe, not part of
// the build: behind docs/PERF.md's ": host" rows (eighteenth session), where
// the host took 5.7-8 us to enqueue one one-tensor etp_quant_cast_only.
// One GPU.
//
// Host wall time per call, averaged over blocks of 256 calls (the stream
// synchronized between blocks, outside the timing, so the launch queue never
// fills), the median of 40 blocks, for:
//   - cudaLaunchKernel of an empty kernel with 16 bytes of parameters, and
//     with a parameter block of the quant kernels' size (about 22 KiB);
//   - the same launches of a 1-block kernel that runs about 4 us, so that
//     the GPU is busy while the host enqueues (as in the bench);
//   - cudaFuncSetAttribute(MaxDynamicSharedMemorySize), which the MXFP8
//     whole-tile launcher calls before every launch;
//   - cudaSetDevice (etp's launchers call it before every launch) and
//     cudaGetDevice.
//
//   nvcc -O3 -arch=sm_90 -o launch_cost launch_cost.cu
//   ./launch_cost
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

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

struct Small {
    int64_t a, b;
};
struct Big {
    uint8_t bytes[22 * 1024];
};

__global__ void k_small(const __grid_constant__ Small p)
{
    if (p.a == 12345 && threadIdx.x == 1024) printf("never\n");
}
__global__ void k_big(const __grid_constant__ Big p)
{
    if (p.bytes[0] == 77 && threadIdx.x == 1024) printf("never\n");
}
/* about 4 us of one block's time, so the GPU stays busy while the host
 * enqueues */
__global__ void k_busy(const __grid_constant__ Big p, long long cycles)
{
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
    if (p.bytes[0] == 77 && threadIdx.x == 1024) printf("never\n");
}

static double now_us()
{
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return 1e6 * (double)t.tv_sec + 1e-3 * (double)t.tv_nsec;
}

template <class F>
static double per_call_us(cudaStream_t s, F f)
{
    const int block = 256, blocks = 40;
    std::vector<double> v;
    for (int b = -4; b < blocks; b++) {
        CK(cudaStreamSynchronize(s));
        const double t0 = now_us();
        for (int i = 0; i < block; i++) f();
        const double t1 = now_us();
        if (b >= 0) v.push_back((t1 - t0) / block);
    }
    CK(cudaStreamSynchronize(s));
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main()
{
    CK(cudaSetDevice(0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int clk_khz = 0;
    CK(cudaDeviceGetAttribute(&clk_khz, cudaDevAttrClockRate, 0));
    const long long cycles = (long long)clk_khz * 4 / 1000; /* about 4 us */
    static Big big; /* zero: the kernels print nothing */
    Small small = {0, 0};
    void *a_small[] = {&small};
    void *a_big[] = {&big};
    long long cyc = cycles;
    void *a_busy[] = {&big, &cyc};
    printf("sizeof(Big) = %zu bytes\n", sizeof(Big));
    printf("launch, 16 B of parameters, empty kernel:   %6.2f us\n",
           per_call_us(s, [&] { CK(cudaLaunchKernel((const void *)k_small, 1, 32, a_small, 0, s)); }));
    printf("launch, 22 KiB of parameters, empty kernel: %6.2f us\n",
           per_call_us(s, [&] { CK(cudaLaunchKernel((const void *)k_big, 1, 32, a_big, 0, s)); }));
    printf("launch, 22 KiB, a 4 us kernel (GPU busy):   %6.2f us\n",
           per_call_us(s, [&] { CK(cudaLaunchKernel((const void *)k_busy, 1, 32, a_busy, 0, s)); }));
    printf("cudaFuncSetAttribute (dynamic shared):      %6.2f us\n", per_call_us(s, [&] {
               CK(cudaFuncSetAttribute((const void *)k_big, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       64 * 1024));
           }));
    printf("cudaSetDevice(0):                           %6.2f us\n",
           per_call_us(s, [&] { CK(cudaSetDevice(0)); }));
    int d = -1;
    printf("cudaGetDevice:                              %6.2f us\n",
           per_call_us(s, [&] { CK(cudaGetDevice(&d)); }));
    printf("set attribute + launch 22 KiB (GPU busy):   %6.2f us\n", per_call_us(s, [&] {
               CK(cudaFuncSetAttribute((const void *)k_busy, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       64 * 1024));
               CK(cudaLaunchKernel((const void *)k_busy, 1, 32, a_busy, 64 * 1024, s));
           }));
    CK(cudaStreamDestroy(s));
    return 0;
}
