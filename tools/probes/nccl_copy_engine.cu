// Which NCCL collectives run on the copy engines (no SMs)? A standalone
// probe, not part of the build: the evidence behind ETP_COPY_ENGINE
// (docs/DESIGN.md, docs/PERF.md). Each case runs alone and next to a kernel
// that fills every SM for ~2 ms; a collective on the copy engines adds
// nothing to it, one on SMs waits for it. Needs 2 GPUs; the last case hung
// with NCCL 2.28.3 (run under `timeout`).
//
//   nvcc -O2 -arch=sm_90 -o nccl_copy_engine nccl_copy_engine.cu -lnccl -lmpi \
//        -I<mpi include> -L<mpi lib>
//   timeout 100 mpirun -np 2 -x NCCL_NVLS_ENABLE=0 ./nccl_copy_engine
#include <mpi.h>
#include <nccl.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>
#include <algorithm>
#include <functional>
#define CK(x) do{cudaError_t e=(x); if(e!=cudaSuccess){printf("CUDA %s at %d: %s\n",#x,__LINE__,cudaGetErrorString(e)); MPI_Abort(MPI_COMM_WORLD,1);}}while(0)
#define NK(x) do{ncclResult_t e=(x); if(e!=ncclSuccess){printf("NCCL %s at %d: %s\n",#x,__LINE__,ncclGetErrorString(e)); MPI_Abort(MPI_COMM_WORLD,1);}}while(0)
__global__ void spin(float *p, int iters){ float x=threadIdx.x; for(int i=0;i<iters;i++) x = x*0.999f+0.5f; if(x==-1.f) p[0]=x; }
int r,n,sms; float *dummy; cudaStream_t s,s2; cudaEvent_t a,b;
float timeit(std::function<void(cudaStream_t)> op, int spinning){
  std::vector<float> t;
  for (int it=0; it<8; it++) {
    MPI_Barrier(MPI_COMM_WORLD); CK(cudaDeviceSynchronize());
    cudaEventRecord(a,s2);
    if (spinning) spin<<<sms*8, 256, 0, s2>>>(dummy, 200000);
    cudaEvent_t f; cudaEventCreateWithFlags(&f, cudaEventDisableTiming); cudaEventRecord(f,s2); 
    if (op) op(s);
    cudaEvent_t j; cudaEventCreateWithFlags(&j, cudaEventDisableTiming); cudaEventRecord(j,s); cudaStreamWaitEvent(s2,j,0);
    cudaEventRecord(b,s2); CK(cudaStreamSynchronize(s2)); float ms; cudaEventElapsedTime(&ms,a,b); if(it>=3) t.push_back(ms*1000);
  }
  std::sort(t.begin(),t.end()); return t[t.size()/2];
}
int main(int argc,char**argv){
  setvbuf(stdout,NULL,_IONBF,0); MPI_Init(&argc,&argv); MPI_Comm_rank(MPI_COMM_WORLD,&r); MPI_Comm_size(MPI_COMM_WORLD,&n);
  CK(cudaSetDevice(r));
  ncclUniqueId id; if(!r) ncclGetUniqueId(&id); MPI_Bcast(&id,sizeof id,MPI_BYTE,0,MPI_COMM_WORLD);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  ncclComm_t base; NK(ncclCommInitRankConfig(&base,n,id,r,&cfg));
  ncclConfig_t zc = NCCL_CONFIG_INITIALIZER; zc.CTAPolicy = NCCL_CTA_POLICY_ZERO;
  ncclComm_t zero; NK(ncclCommSplit(base, 0, r, &zero, &zc));
  CK(cudaStreamCreateWithFlags(&s,cudaStreamNonBlocking)); CK(cudaStreamCreateWithFlags(&s2,cudaStreamNonBlocking));
  cudaEventCreate(&a); cudaEventCreate(&b);
  int dev; cudaGetDevice(&dev); cudaDeviceGetAttribute(&sms,cudaDevAttrMultiProcessorCount,dev);
  CK(cudaMalloc(&dummy,4));
  size_t full = 256ull<<20, shard = full/n;
  void *plain_send, *plain_recv, *wsend, *wrecv, *wbig;
  CK(cudaMalloc(&plain_send, full)); CK(cudaMalloc(&plain_recv, full));
  NK(ncclMemAlloc(&wsend, full)); NK(ncclMemAlloc(&wrecv, full)); NK(ncclMemAlloc(&wbig, 2*full));
  ncclWindow_t w1,w2,w3; NK(ncclCommWindowRegister(zero, wsend, full, &w1, NCCL_WIN_COLL_SYMMETRIC)); NK(ncclCommWindowRegister(zero, wrecv, full, &w2, NCCL_WIN_COLL_SYMMETRIC));
  NK(ncclCommWindowRegister(zero, wbig, 2*full, &w3, NCCL_WIN_COLL_SYMMETRIC));
  CK(cudaMemset(plain_send, r+1, full)); CK(cudaMemset(wsend, r+1, full)); CK(cudaDeviceSynchronize());
  float spin_only = timeit(nullptr, 1);
  struct { const char *name; std::function<void(cudaStream_t)> op; } cases[] = {
    {"AG zero, send plain, recv window", [&](cudaStream_t st){ NK(ncclAllGather(plain_send, wrecv, shard, ncclUint8, zero, st)); }},
    {"AG zero, send window, recv window", [&](cudaStream_t st){ NK(ncclAllGather(wsend, wrecv, shard, ncclUint8, zero, st)); }},
    {"AG zero, in place in window", [&](cudaStream_t st){ NK(ncclAllGather((char*)wrecv + r*shard, wrecv, shard, ncclUint8, zero, st)); }},
    {"AG zero, subrange of big window", [&](cudaStream_t st){ NK(ncclAllGather(plain_send, (char*)wbig + (64<<20), shard, ncclUint8, zero, st)); }},
    {"AG zero, plain buffers", [&](cudaStream_t st){ NK(ncclAllGather(plain_send, plain_recv, shard, ncclUint8, zero, st)); }},
    {"AG base, plain buffers", [&](cudaStream_t st){ NK(ncclAllGather(plain_send, plain_recv, shard, ncclUint8, base, st)); }},
    {"RS bf16 zero, windows", [&](cudaStream_t st){ NK(ncclReduceScatter(wsend, wrecv, full/2/n, ncclBfloat16, ncclSum, zero, st)); }},
    {"RS bf16 base, plain", [&](cudaStream_t st){ NK(ncclReduceScatter(plain_send, plain_recv, full/2/n, ncclBfloat16, ncclSum, base, st)); }},
    {"A2A zero, windows", [&](cudaStream_t st){ NK(ncclAlltoAll(wsend, wrecv, full/n, ncclUint8, zero, st)); }},
    {"A2A zero, send plain recv window", [&](cudaStream_t st){ NK(ncclAlltoAll(plain_send, wrecv, full/n, ncclUint8, zero, st)); }},
    {"A2A base, plain", [&](cudaStream_t st){ NK(ncclAlltoAll(plain_send, plain_recv, full/n, ncclUint8, base, st)); }},
  };
  printf("rank %d init done\n", r); if(!r) printf("spin only: %.1f us\n", spin_only);
  for (auto &c : cases) {
    if(!r) printf("start %s\n", c.name);
    float alone = timeit(c.op, 0), with = timeit(c.op, 1);
    if(!r) printf("%-40s alone %7.1f us, with spin %7.1f us (spin %7.1f): %s\n", c.name, alone, with, spin_only, with < spin_only + 0.3f*alone ? "OVERLAPS (zero SM)" : "serialized");
  }
  // correctness of plain-send CE gather
  std::vector<unsigned char> h(full); NK(ncclAllGather(plain_send, wrecv, shard, ncclUint8, zero, s)); CK(cudaStreamSynchronize(s)); CK(cudaMemcpy(h.data(), wrecv, full, cudaMemcpyDeviceToHost));
  size_t bad=0; for(int q=0;q<n;q++) for(size_t i=0;i<shard;i+=4093) bad += h[q*shard+i]!=(unsigned char)(q+1);
  if(!r) printf("plain-send CE gather bad %zu\n", bad);
  MPI_Finalize(); return 0;
}
