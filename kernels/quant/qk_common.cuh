/*
 * What the quantization kernels' translation units share (internal to
 * kernels/quant/): the kernel parameter block, the tensor search, the
 * no-op flag, the amax fold, and each operation's launcher, which the
 * dispatcher (quant_kernels.cu) calls.
 */
#ifndef ETP__KERNELS_QUANT_QK_COMMON_CUH
#define ETP__KERNELS_QUANT_QK_COMMON_CUH

#include <stdint.h>

#include <cuda_runtime_api.h>

#include "quant/formats/qf_batch.h"
#include "quant/formats/qf_codec.h"
#include "quant/formats/qf_layout.h"

namespace etp__qk {

constexpr int kThreads = 256;

struct Params {
    etp__qbatch_t b;
    uint32_t tile_start[ETP__QB_MAX + 1]; /* prefix sum of tiles (cast v3: runs; the expansion:
                                             its units) per tensor */
    uint32_t tiles_c[ETP__QB_MAX];        /* cast: tile columns per tensor (the expansion: its
                                             rowwise units) */
    uint32_t runs_c[ETP__QB_MAX];         /* cast v3: runs of kRun* tiles per tile row */
    uint32_t step_r[ETP__QB_MAX];         /* cast v3: a grid stride in tile rows and */
    uint32_t step_c[ETP__QB_MAX];         /* runs of each tensor (grid / runs_c, grid % runs_c) */
    uint32_t per_block;                   /* multi-amax: units per block */
    uint32_t run;                         /* cast v3, NVFP4: tiles a run (1 or kRunNv) */
    uint8_t fl[ETP__QB_MAX];              /* cast v3: kFl* facts of each tensor (cast_flags_v3) */
};


__device__ __forceinline__ float load_elem(const void *x, uint8_t dtype, size_t i)
{
    if (dtype == ETP__QB_BF16) return etp__qf_bf16_to_f32(static_cast<const uint16_t *>(x)[i]);
    return static_cast<const float *>(x)[i];
}

/* The tensor slot of this block and the block's tile within the tensor. */
__device__ __forceinline__ uint32_t find_tensor(const Params &p, uint32_t bid, uint32_t *local)
{
    uint32_t lo = 0, hi = p.b.n; /* last k with tile_start[k] <= bid */
    while (hi - lo > 1) {
        const uint32_t mid = (lo + hi) / 2;
        if (p.tile_start[mid] <= bid)
            lo = mid;
        else
            hi = mid;
    }
    *local = bid - p.tile_start[lo];
    return lo;
}

__device__ __forceinline__ bool skipped(const etp__qbatch_t &b)
{
    return b.noop != nullptr && *b.noop != 0;
}


/* max(acc, m) for m = |x| as FP32 bits (sign cleared), a NaN ignored: the
 * reference's etp__qf_amax_step on bits (non-negative floats order like
 * their bits). */
__device__ __forceinline__ uint32_t amax_bits(uint32_t acc, uint32_t m)
{
    return m > 0x7f800000u ? acc : (m > acc ? m : acc);
}

/* p->tile_start: the prefix sum of units(k), the work units (tiles, runs,
 * chunks) of each tensor k of the batch, with tiles_c and runs_c at 1 for
 * units() to override. Returns the total; above 0x7fffffff the kernels'
 * indices would overflow (the caller refuses the batch). */
template <typename F>
inline uint64_t plan_units(const etp__qbatch_t *batch, Params *p, F &&units)
{
    uint64_t total = 0;
    for (uint32_t k = 0; k < batch->n; k++) {
        p->tiles_c[k] = 1;
        p->runs_c[k] = 1;
        p->tile_start[k] = (uint32_t)total;
        total += units(k);
        if (total > 0x7fffffffu) return total;
    }
    p->tile_start[batch->n] = (uint32_t)total;
    return total;
}

/* The launchers: the operation of `batch` on stream s, nothing allocated,
 * the host not synchronized. p: the parameter block, p.b a copy of the
 * batch (its compact field 0), everything else the launcher's to plan. */
cudaError_t launch_amax(cudaStream_t s, const etp__qbatch_t *batch, Params &p);    /* multi-amax (amax.cu) */
cudaError_t launch_cast_sr(cudaStream_t s, const etp__qbatch_t *batch, Params &p); /* stochastic rounding (cast_sr.cu) */
cudaError_t launch_cast_v3(cudaStream_t s, const etp__qbatch_t *batch, Params &p); /* rounding to nearest (cast_v3.cu) */
cudaError_t launch_dequant(cudaStream_t s, const etp__qbatch_t *batch, Params &p); /* dequantize (dequant.cu) */

} // namespace etp__qk

#endif /* ETP__KERNELS_QUANT_QK_COMMON_CUH */
