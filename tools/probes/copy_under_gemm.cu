// How long does a gather's own-shard copy (device to device, same GPU)
// take next to the GEMMs it is meant to hide behind? A standalone probe,
// not part of the build: the chain loop's forward gathers wait for it
// (docs/PERF.md, thirteenth session). One GPU.
//
// A stream runs 8 BF16 GEMMs [8192 x 8192 x 4096] back to back; a second
// stream waits for the first GEMM, then copies 64 MiB 4 times in a row (a
// layer's own shard of an [8192, 8192] BF16 weight over 2 ranks). Printed:
// each copy alone, each copy beside the GEMMs (median of the 4), and the
// GEMMs' time alone and beside the copies. Copy variants: cudaMemcpyAsync,
// cudaMemcpyBatchAsync with the overlap-with-compute hint, a copy kernel.
//
//   nvcc -O2 -arch=sm_90 -o copy_under_gemm copy_under_gemm.cu -lcublas
//   ./copy_under_gemm
#include <cublas_v2.h>
#include <cuda_runtime.h>
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
#define BK(x)                                                                              \
    do {                                                                                   \
        cublasStatus_t s_ = (x);                                                           \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                 \
            printf("cuBLAS %s at %d: %d\n", #x, __LINE__, (int)s_);                        \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

__global__ void copy_kernel(uint4 *d, const uint4 *s, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        d[i] = s[i];
}

enum { V_MEMCPY, V_BATCH, V_KERNEL, V_N };
static const char *vname[V_N] = {"cudaMemcpyAsync", "cudaMemcpyBatchAsync+hint", "copy kernel"};

static void copy(int v, void *d, const void *s, size_t bytes, cudaStream_t st, int sms)
{
    if (v == V_MEMCPY) {
        CK(cudaMemcpyAsync(d, s, bytes, cudaMemcpyDeviceToDevice, st));
    } else if (v == V_BATCH) {
        cudaMemcpyAttributes a = {};
        a.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        a.flags = cudaMemcpyFlagPreferOverlapWithCompute;
        void *ds[1] = {d};
        const void *ss[1] = {s};
        size_t sz[1] = {bytes}, idx = 0;
        CK(cudaMemcpyBatchAsync(ds, ss, sz, 1, &a, &idx, 1, st));
    } else {
        copy_kernel<<<sms * 4, 512, 0, st>>>((uint4 *)d, (const uint4 *)s, bytes / 16);
        CK(cudaGetLastError());
    }
}

static float med(std::vector<float> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main()
{
    setvbuf(stdout, NULL, _IONBF, 0);
    const int d = 8192, M = 4096, G = 8, C = 4;
    const size_t bytes = (size_t)64 << 20;
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    void *W, *X, *Y, *src, *dst;
    CK(cudaMalloc(&W, (size_t)d * d * 2));
    CK(cudaMalloc(&X, (size_t)M * d * 2));
    CK(cudaMalloc(&Y, (size_t)M * d * 2));
    CK(cudaMalloc(&src, bytes * C));
    CK(cudaMalloc(&dst, bytes * C));
    CK(cudaMemset(W, 0x3c, (size_t)d * d * 2));
    CK(cudaMemset(X, 0x3c, (size_t)M * d * 2));
    CK(cudaMemset(src, 1, bytes * C));
    int lo, hi;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    cudaStream_t sg, sc;
    CK(cudaStreamCreateWithPriority(&sg, cudaStreamNonBlocking, lo));
    CK(cudaStreamCreateWithPriority(&sc, cudaStreamNonBlocking, hi));
    cublasHandle_t h;
    BK(cublasCreate(&h));
    BK(cublasSetStream(h, sg));
    float one = 1, zero = 0;
    cudaEvent_t g0, g1, first, ce[2 * C];
    CK(cudaEventCreate(&g0));
    CK(cudaEventCreate(&g1));
    CK(cudaEventCreate(&first));
    for (int i = 0; i < 2 * C; i++) CK(cudaEventCreate(&ce[i]));
    auto gemms = [&]() {
        CK(cudaEventRecord(g0, sg));
        for (int i = 0; i < G; i++) {
            BK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, d, M, d, &one, W, CUDA_R_16BF, d, X, CUDA_R_16BF, d,
                            &zero, Y, CUDA_R_16BF, d, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            if (i == 0) CK(cudaEventRecord(first, sg));
        }
        CK(cudaEventRecord(g1, sg));
    };
    auto copies = [&](int v) {
        for (int i = 0; i < C; i++) {
            CK(cudaEventRecord(ce[2 * i], sc));
            copy(v, (char *)dst + i * bytes, (const char *)src + i * bytes, bytes, sc, sms);
            CK(cudaEventRecord(ce[2 * i + 1], sc));
        }
    };
    auto copy_times = [&]() {
        std::vector<float> t;
        for (int i = 0; i < C; i++) {
            float ms;
            CK(cudaEventElapsedTime(&ms, ce[2 * i], ce[2 * i + 1]));
            t.push_back(1e3f * ms);
        }
        return med(t);
    };
    for (int w = 0; w < 3; w++) gemms();
    CK(cudaDeviceSynchronize());
    std::vector<float> ga;
    for (int r = 0; r < 5; r++) {
        gemms();
        CK(cudaDeviceSynchronize());
        float ms;
        CK(cudaEventElapsedTime(&ms, g0, g1));
        ga.push_back(1e3f * ms / G);
    }
    printf("GEMM alone: %.1f us each\n", med(ga));
    for (int v = 0; v < V_N; v++) {
        std::vector<float> alone, beside, gb;
        for (int r = 0; r < 5; r++) {
            copies(v);
            CK(cudaDeviceSynchronize());
            alone.push_back(copy_times());
            gemms();
            CK(cudaStreamWaitEvent(sc, first, 0));
            copies(v);
            CK(cudaDeviceSynchronize());
            beside.push_back(copy_times());
            float ms;
            CK(cudaEventElapsedTime(&ms, g0, g1));
            gb.push_back(1e3f * ms / G);
        }
        printf("%-28s 64 MiB alone %7.1f us (%6.0f GB/s), beside the GEMMs %7.1f us; GEMM beside the copies %.1f us\n",
               vname[v], med(alone), 2e-3 * bytes / med(alone), med(beside), med(gb));
    }
    return 0;
}
