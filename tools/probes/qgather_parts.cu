// Where does a quantized gather's time go? A standalone probe, not part of
// the build: the evidence behind the quantized-gather layout (docs/PERF.md,
// issue 4). It replays, with raw NCCL on a zero-CTA communicator and
// windows (the copy-engine path etp uses), the pieces of etp_gather for one
// weight of `--mib` MiB BF16 ([rows, 4096]) over 2 ranks: the local copy of
// the shard into its place in the slot, the in-place all-gather of the data,
// the scales' copy and all-gather, alone and together, and variants that
// would remove a piece. Medians over 15 iterations after 5.
//
//   nvcc -O2 -arch=sm_90 -o qgather_parts qgather_parts.cu -lnccl -lmpi \
//        -I<mpi include> -L<mpi lib>
//   mpirun -np 2 -x NCCL_NVLS_ENABLE=0 ./qgather_parts [mib]
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

__global__ void copy16(uint4 *d, const uint4 *s, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) d[i] = s[i];
}
static int sms;
static void kcopy(void *d, const void *s, size_t bytes, cudaStream_t st) {
  size_t n = bytes / 16; int blocks = (int)std::min<size_t>((n + 255) / 256, (size_t)sms * 8);
  copy16<<<blocks, 256, 0, st>>>((uint4 *)d, (const uint4 *)s, n); CK(cudaGetLastError());
}

static int r, n;
static cudaStream_t s, s2;
static cudaEvent_t a, b, fork_ev, join_ev;
static float timeit(std::function<void(cudaStream_t)> op) {
  std::vector<float> t;
  for (int it = 0; it < 20; it++) {
    MPI_Barrier(MPI_COMM_WORLD); CK(cudaDeviceSynchronize());
    CK(cudaEventRecord(a, s)); op(s); CK(cudaEventRecord(b, s)); CK(cudaStreamSynchronize(s));
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); if (it >= 5) t.push_back(ms * 1000);
  }
  std::sort(t.begin(), t.end()); float med = t[t.size() / 2], worst;
  MPI_Allreduce(&med, &worst, 1, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD); return worst;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0); MPI_Init(&argc, &argv); MPI_Comm_rank(MPI_COMM_WORLD, &r); MPI_Comm_size(MPI_COMM_WORLD, &n);
  CK(cudaSetDevice(r));
  size_t mib = argc > 1 ? strtoull(argv[1], 0, 10) : 256;
  ncclUniqueId id; if (!r) ncclGetUniqueId(&id); MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER; ncclComm_t base; NK(ncclCommInitRankConfig(&base, n, id, r, &cfg));
  ncclConfig_t zc = NCCL_CONFIG_INITIALIZER; zc.CTAPolicy = NCCL_CTA_POLICY_ZERO;
  ncclComm_t zero, zero2; NK(ncclCommSplit(base, 0, r, &zero, &zc)); NK(ncclCommSplit(base, 0, r, &zero2, &zc));
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  CK(cudaEventCreateWithFlags(&fork_ev, cudaEventDisableTiming)); CK(cudaEventCreateWithFlags(&join_ev, cudaEventDisableTiming));
  int dev; CK(cudaGetDevice(&dev)); CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const size_t full = mib << 20, shard = full / n;  // BF16 bytes
  // one slot window big enough for the BF16 gather; a second one for scales on the second comm
  void *slot, *slot2, *store; NK(ncclMemAlloc(&slot, full + (16 << 20))); NK(ncclMemAlloc(&slot2, 16 << 20)); NK(ncclMemAlloc(&store, shard + (16 << 20)));
  ncclWindow_t w1, w2, w3;
  NK(ncclCommWindowRegister(zero, slot, full + (16 << 20), &w1, NCCL_WIN_COLL_SYMMETRIC));
  NK(ncclCommWindowRegister(zero2, slot2, 16 << 20, &w2, NCCL_WIN_COLL_SYMMETRIC));
  NK(ncclCommWindowRegister(zero, store, shard + (16 << 20), &w3, NCCL_WIN_COLL_SYMMETRIC));
  CK(cudaMemset(store, r + 1, shard + (16 << 20))); CK(cudaDeviceSynchronize());
  char *S = (char *)slot, *Q = (char *)store;
  // shard bytes: BF16 `shard`; MXFP8 data shard/2 + scales shard/64; NVFP4 data shard/4 + scales shard/32
  struct fmt { const char *name; size_t data, scales; } fm[] = {
    {"bf16", shard, 0}, {"mxfp8", shard / 2, shard / 64}, {"nvfp4", shard / 4, shard / 32}};
  auto ag = [&](char *dst, size_t per, ncclComm_t c, cudaStream_t st) {
    NK(ncclAllGather(dst + r * per, dst, per, ncclUint8, c, st)); };
  if (!r) printf("weight %zu MiB BF16, %d ranks, %d SMs; times in us (slowest rank's median)\n", mib, n, sms);
  for (auto &f : fm) {
    size_t D = f.data, Sc = f.scales; char *dslot = S, *sslot = S + ((n * D + 4095) & ~(size_t)4095);
    float t_copy = timeit([&](cudaStream_t st) { kcopy(dslot + r * D, Q, D, st); });
    float t_ag = timeit([&](cudaStream_t st) { ag(dslot, D, zero, st); });
    float t_etp = timeit([&](cudaStream_t st) {  // etp today: copies, then one group
      kcopy(dslot + r * D, Q, D, st); if (Sc) kcopy(sslot + r * Sc, Q + D, Sc, st);
      NK(ncclGroupStart()); ag(dslot, D, zero, st); if (Sc) ag(sslot, Sc, zero, st); NK(ncclGroupEnd()); });
    if (!r) printf("%-6s data %6.1f MiB scales %5.2f MiB | copy %6.1f | AG data %6.1f | etp-like %6.1f",
                   f.name, D / 1048576.0, Sc / 1048576.0, t_copy, t_ag, t_etp);
    if (Sc) {
      float t_ags = timeit([&](cudaStream_t st) { ag(sslot, Sc, zero, st); });
      float t_grp = timeit([&](cudaStream_t st) { NK(ncclGroupStart()); ag(dslot, D, zero, st); ag(sslot, Sc, zero, st); NK(ncclGroupEnd()); });
      float t_seq = timeit([&](cudaStream_t st) { ag(dslot, D, zero, st); ag(sslot, Sc, zero, st); });
      float t_one = timeit([&](cudaStream_t st) { ag(dslot, D + Sc, zero, st); });  // data+scales as one collective
      float t_copy1 = timeit([&](cudaStream_t st) { kcopy(dslot + r * (D + Sc), Q, D + Sc, st); ag(dslot, D + Sc, zero, st); });
      // scales on a second comm and stream, forked: their sync overlaps the data
      float t_fork = timeit([&](cudaStream_t st) {
        kcopy(dslot + r * D, Q, D, st); kcopy((char *)slot2 + r * Sc, Q + D, Sc, st);
        CK(cudaEventRecord(fork_ev, st)); CK(cudaStreamWaitEvent(s2, fork_ev, 0));
        ag((char *)slot2, Sc, zero2, s2); ag(dslot, D, zero, st);
        CK(cudaEventRecord(join_ev, s2)); CK(cudaStreamWaitEvent(st, join_ev, 0)); });
      float t_nocopy = timeit([&](cudaStream_t st) {  // non-in-place from the store window (NCCL copies its own part)
        NK(ncclGroupStart()); NK(ncclAllGather(Q, dslot, D, ncclUint8, zero, st)); NK(ncclAllGather(Q + D, sslot, Sc, ncclUint8, zero, st)); NK(ncclGroupEnd()); });
      if (!r) printf(" | AG scales %5.1f | group(AG d, AG s) %6.1f | AG d; AG s %6.1f | one AG d+s %6.1f | copy+one AG %6.1f | scales forked %6.1f | from store %6.1f",
                     t_ags, t_grp, t_seq, t_one, t_copy1, t_fork, t_nocopy);
    }
    if (!r) printf("\n");
  }
  float t_small = timeit([&](cudaStream_t st) { ag(S, 65536, zero, st); });
  float t_k = timeit([&](cudaStream_t st) { kcopy(S, Q, 4096, st); });
  if (!r) printf("AG 64 KiB %5.1f us; a 4 KiB copy kernel %5.1f us\n", t_small, t_k);
  MPI_Finalize(); return 0;
}
