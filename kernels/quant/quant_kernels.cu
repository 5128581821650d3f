/*
 * Quantization kernels: multi-amax, NVFP4 and MXFP8 cast-only (rowwise and
 * columnwise in one pass, 1D or 16x16 NVFP4 blocks, scales row-major or in
 * cuBLASLt's swizzled order), and dequantize, each ONE launch over all the
 * tensors of a batch (the v3 cast: one per input type the batch holds).
 *
 * Every tensor of a batch is cut into tiles; the grid is the concatenation
 * of all tensors' tiles, and a block finds its tensor by binary search in a
 * prefix sum of tile counts that travels in the kernel parameters with the
 * batch (no device memory, nothing to allocate, graph-capturable).
 *
 * The arithmetic is the host reference's, from the same header
 * (quant/formats/qf_codec.h), compiled with --fmad=false: results equal the
 * reference bit for bit (tests/gpu/test_quant_gpu.c checks it).
 *
 * This file is the entry point; each operation lives in its own file:
 * amax.cu (multi-amax), cast_v3.cu with the cast_v3_*.cuh pieces (the
 * cast of every batch rounding to nearest; cast_v3_whole.cuh: MXFP8
 * batches of whole tiles), cast_sr.cu (stochastic rounding) and
 * dequant.cu, sharing qk_common.cuh.
 */
#include <string.h>

#include "quant_kernels.h"
#include "qk_common.cuh"

extern "C" cudaError_t etp__cuda_quant_launch(cudaStream_t s, const etp__qbatch_t *batch)
{
    using namespace etp__qk;
    if (batch->n == 0) return cudaSuccess;
    if (batch->n > ETP__QB_MAX) return cudaErrorInvalidValue;
    /* the parameter block: the batch (only its tensors are meaningful) and
     * the tile prefix sums */
    static_assert(sizeof(Params) < 32764, "kernel parameters are limited to 32764 bytes");
    Params p;
    memcpy(&p.b, batch, etp__qbatch_bytes(batch->n));
    p.per_block = 1;
    p.run = 1;
    p.b.compact = 0; /* the v3 cast's launches decide */
    switch (batch->op) {
    case ETP__QB_AMAX:
        return launch_amax(s, batch, p);
    case ETP__QB_CAST:
        if (batch->stochastic) return launch_cast_sr(s, batch, p);
        return launch_cast_v3(s, batch, p);
    default:
        return launch_dequant(s, batch, p);
    }
}
