/*
 * Multi-amax: the largest |x| of each tensor of a batch, NaNs ignored (the
 * reference's etp__qref_amax), one launch for all of them.
 */
#include "qk_common.cuh"

namespace etp__qk {
namespace {

/* ---- the bandwidth kernels (default) --------------------------------------
 *
 * Bit for bit the host reference's results, with the memory system kept
 * busy:
 * - 16-byte loads (8 BF16 or 4 FP32 elements) wherever the input allows it
 *   (a 16-byte aligned base and rows of a multiple of 16 bytes), several in
 *   flight per thread; 8- and 16-byte stores of the packed outputs;
 * - a grid sized to the device (batch->sms, asked once per quantizer): each
 *   block runs a contiguous range of multi-amax units, or a strided
 *   sequence of cast tiles, loading the next tile into registers while it
 *   computes the current one;
 * - branch-free element conversions (etp__qf_*_rne_satfinite_fast, equal to
 *   the reference's for every FP32 input) and 16x16 block amaxes from the
 *   row segments' amaxes instead of one thread per block. */

constexpr uint32_t kAmaxUnit = 16384;   /* elements per multi-amax unit */
constexpr int kAmaxLoads = 4;           /* 16-byte loads in flight per thread */
constexpr int kAmaxBlocksPerSm = 8;     /* resident blocks per SM (launch bounds) */

/* Fold 16 bytes of input into acc: 8 BF16 (a BF16 is the high half of its
 * FP32) or 4 FP32. */
__device__ __forceinline__ uint32_t amax_vec(uint32_t acc, uint4 v, uint8_t dtype)
{
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (dtype == ETP__QB_BF16) {
            acc = amax_bits(acc, (w[i] << 16) & 0x7fffffffu);
            acc = amax_bits(acc, w[i] & 0x7fff0000u);
        } else {
            acc = amax_bits(acc, w[i] & 0x7fffffffu);
        }
    }
    return acc;
}

/* This thread's share of elements [begin, end) of t folded into acc. begin
 * is a multiple of kAmaxUnit, so 16-byte aligned when the base is. */
__device__ __forceinline__ uint32_t amax_range(const etp__qb_tensor_t &t, size_t begin, size_t end,
                                               uint32_t acc)
{
    const size_t es = t.dtype == ETP__QB_BF16 ? 2 : 4, per = 16 / es;
    if ((reinterpret_cast<uintptr_t>(t.x) & 15u) == 0) {
        const uint4 *v = reinterpret_cast<const uint4 *>(static_cast<const char *>(t.x) + begin * es);
        const size_t nv = (end - begin) / per;
        for (size_t j0 = threadIdx.x; j0 < nv; j0 += (size_t)kThreads * kAmaxLoads) {
            uint4 r[kAmaxLoads];
#pragma unroll
            for (int u = 0; u < kAmaxLoads; u++) { /* all loads first: in flight together */
                const size_t j = j0 + (size_t)u * kThreads;
                r[u] = j < nv ? __ldg(v + j) : make_uint4(0u, 0u, 0u, 0u); /* zeros: no effect */
            }
#pragma unroll
            for (int u = 0; u < kAmaxLoads; u++) acc = amax_vec(acc, r[u], t.dtype);
        }
        begin += nv * per; /* the tail, below */
    }
    for (size_t i = begin + threadIdx.x; i < end; i += kThreads)
        acc = amax_bits(acc, etp__qf_bits(load_elem(t.x, t.dtype, i)) & 0x7fffffffu);
    return acc;
}

/* The block's amax of tensor slot k over `units` of its units: reduced
 * over the block, then written (the block did all of the tensor's units) or
 * folded into the workspace, where the block completing the tensor's unit
 * count writes it and returns the slots to zero. Called by every thread. */
__device__ void amax_flush(const Params &p, uint32_t k, uint32_t acc, uint32_t units,
                           uint32_t *warp_max)
{
    const etp__qbatch_t &b = p.b;
    for (int off = 16; off > 0; off /= 2) {
        const uint32_t o = __shfl_xor_sync(0xffffffffu, acc, off);
        acc = o > acc ? o : acc;
    }
    __syncthreads(); /* the previous flush has read warp_max */
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int w = 1; w < kThreads / 32; w++) acc = warp_max[w] > acc ? warp_max[w] : acc;
    const uint32_t idx = b.first + k, tensor_units = p.tile_start[k + 1] - p.tile_start[k];
    if (units == tensor_units) { /* alone: no need to meet anyone */
        if (b.amax_row) b.amax_row[idx] = __uint_as_float(acc);
        if (b.amax_col) b.amax_col[idx] = __uint_as_float(acc);
        return;
    }
    unsigned int *ws_max = static_cast<unsigned int *>(b.workspace);
    unsigned int *ws_done = ws_max + ETP__QB_MAX;
    atomicMax(&ws_max[k], acc);
    __threadfence();
    const unsigned int done = atomicAdd(&ws_done[k], units);
    if (done + units == tensor_units) {
        __threadfence();
        const float r = __uint_as_float(atomicExch(&ws_max[k], 0u));
        atomicExch(&ws_done[k], 0u);
        if (b.amax_row) b.amax_row[idx] = r;
        if (b.amax_col) b.amax_col[idx] = r;
    }
}

/* Block i takes units [i * per_block, (i + 1) * per_block) of the
 * concatenation of all tensors' units (every tensor has at least one, an
 * empty one gets its 0 from it), keeping one running amax per thread and
 * flushing it when it crosses into the next tensor. */
__global__ void __launch_bounds__(kThreads, kAmaxBlocksPerSm) amax_kernel_v2(const __grid_constant__ Params p)
{
    const etp__qbatch_t &b = p.b;
    if (skipped(b)) return;
    __shared__ uint32_t warp_max[kThreads / 32];
    const uint32_t total = p.tile_start[b.n];
    uint32_t u = blockIdx.x * p.per_block;
    const uint32_t uend = u + p.per_block < total ? u + p.per_block : total;
    if (u >= uend) return;
    uint32_t local;
    uint32_t k = find_tensor(p, u, &local);
    uint32_t acc = 0, units = 0;
    for (; u < uend; u++) {
        if (u >= p.tile_start[k + 1]) { /* the next tensor (each has >= 1 unit) */
            amax_flush(p, k, acc, units, warp_max);
            k++;
            acc = 0;
            units = 0;
        }
        const etp__qb_tensor_t &t = b.t[k];
        const size_t count = (size_t)t.rows * t.cols;
        const size_t begin = (size_t)(u - p.tile_start[k]) * kAmaxUnit;
        const size_t end = begin + kAmaxUnit < count ? begin + kAmaxUnit : count;
        if (begin < end) acc = amax_range(t, begin, end, acc);
        units++;
    }
    amax_flush(p, k, acc, units, warp_max);
}

} // namespace

cudaError_t launch_amax(cudaStream_t s, const etp__qbatch_t *batch, Params &p)
{
    const uint64_t total = plan_units(batch, &p, [&](uint32_t k) -> uint64_t {
        const uint64_t count = (uint64_t)batch->t[k].rows * batch->t[k].cols;
        return count ? (count + kAmaxUnit - 1) / kAmaxUnit : 1; /* an empty tensor still gets its 0 */
    });
    if (total > 0x7fffffffu) return cudaErrorInvalidValue;
    if (total == 0) return cudaSuccess;
    /* as many blocks as the device holds at once, each a contiguous range
     * of units (sms = 0: one per unit) */
    uint64_t grid = total;
    if (batch->sms) {
        const uint64_t most = (uint64_t)batch->sms * kAmaxBlocksPerSm;
        p.per_block = (uint32_t)((total + most - 1) / most);
        grid = (total + p.per_block - 1) / p.per_block;
    }
    void *args[] = {&p};
    return cudaLaunchKernel((const void *)amax_kernel_v2, dim3((unsigned)grid), dim3(kThreads), args, 0, s);
}

} // namespace etp__qk
