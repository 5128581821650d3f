/*
 * Quantization kernels: multi-amax, NVFP4 and MXFP8 cast-only (rowwise and
 * columnwise in one pass, 1D or 16x16 NVFP4 blocks, scales row-major or in
 * cuBLASLt's swizzled order), and dequantize, each ONE launch over all the
 * tensors of a batch.
 *
 * Every tensor of a batch is cut into tiles; the grid is the concatenation
 * of all tensors' tiles, and a block finds its tensor by binary search in a
 * prefix sum of tile counts that travels in the kernel parameters with the
 * batch (no device memory, nothing to allocate, graph-capturable).
 *
 * The arithmetic is the host reference's, from the same header
 * (quant/formats/qf_codec.h), compiled with --fmad=false: results equal the
 * reference bit for bit (tests/gpu/test_quant_gpu.c checks it).
 */
#include <stdint.h>
#include <string.h>

#include "quant_kernels.h"
#include "quant/formats/qf_codec.h"
#include "quant/formats/qf_layout.h"

namespace {

constexpr int kThreads = 256;
constexpr int kTile = 64;                 /* cast tiles are 64 x 64 elements */
constexpr uint32_t kAmaxChunk = 8192;     /* elements per multi-amax block */
constexpr uint32_t kDequantChunk = 4096;  /* elements per dequantize block */

struct Params {
    etp__qbatch_t b;
    uint32_t tile_start[ETP__QB_MAX + 1]; /* prefix sum of tiles per tensor */
    uint32_t tiles_c[ETP__QB_MAX];        /* cast: tile columns per tensor */
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

/* ---- multi-amax ---------------------------------------------------------- */

/* Each block takes the amax of its chunk, folds it into the tensor's running
 * maximum in the workspace (float bits of non-negative values order like
 * unsigned integers), and counts itself done; the last block of the tensor
 * writes the result and returns the workspace slots to zero for the next
 * launch. */
__global__ void __launch_bounds__(kThreads) amax_kernel(const __grid_constant__ Params p)
{
    const etp__qbatch_t &b = p.b;
    if (skipped(b)) return;
    uint32_t local;
    const uint32_t k = find_tensor(p, blockIdx.x, &local);
    const etp__qb_tensor_t &t = b.t[k];
    const size_t count = (size_t)t.rows * t.cols;
    const size_t begin = (size_t)local * kAmaxChunk;
    const size_t end = begin + kAmaxChunk < count ? begin + kAmaxChunk : count;
    float a = 0.0f;
    for (size_t i = begin + threadIdx.x; i < end; i += kThreads)
        a = etp__qf_amax_step(a, load_elem(t.x, t.dtype, i));
    /* block reduction: warp shuffles, then the warps' results */
    for (int off = 16; off > 0; off /= 2) {
        const float o = __shfl_xor_sync(0xffffffffu, a, off);
        a = etp__qf_amax_step(a, o);
    }
    __shared__ float warp_max[kThreads / 32];
    if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = a;
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int w = 1; w < kThreads / 32; w++) a = etp__qf_amax_step(a, warp_max[w]);
    unsigned int *ws_max = static_cast<unsigned int *>(b.workspace);
    unsigned int *ws_done = ws_max + ETP__QB_MAX;
    const uint32_t tiles = p.tile_start[k + 1] - p.tile_start[k];
    if (tiles == 1) { /* alone: no need to meet anyone */
        const uint32_t idx = b.first + k;
        if (b.amax_row) b.amax_row[idx] = a;
        if (b.amax_col) b.amax_col[idx] = a;
        return;
    }
    atomicMax(&ws_max[k], __float_as_uint(a));
    __threadfence();
    const unsigned int done = atomicAdd(&ws_done[k], 1u);
    if (done == tiles - 1) {
        __threadfence();
        const float r = __uint_as_float(atomicExch(&ws_max[k], 0u));
        atomicExch(&ws_done[k], 0u);
        const uint32_t idx = b.first + k;
        if (b.amax_row) b.amax_row[idx] = r;
        if (b.amax_col) b.amax_col[idx] = r;
    }
}

/* ---- cast ---------------------------------------------------------------- */

/* Element extents a tensor's tiles cover: the data and every produced scale
 * matrix with its padding (padding scales are written as zeros by the tiles
 * that cover them). Multiples of 64. */
__host__ __device__ inline void cast_extent(const etp__qbatch_t &b, const etp__qb_tensor_t &t,
                                            size_t *re, size_t *ce)
{
    size_t r = 0, c = 0;
    const bool nv = b.format == ETP__QB_NVFP4;
    if (t.row_data) { /* scale rows padded to 128; scale columns to 4 blocks */
        r = etp__qf_roundup(t.rows, 128);
        c = etp__qf_roundup(t.cols, nv ? 64 : 128);
    }
    if (t.col_data) { /* NVFP4: [roundup(K,128), roundup(M/16,4)]; MXFP8: [roundup(M/32,4), roundup(K,128)] */
        const size_t cr = etp__qf_roundup(t.rows, nv ? 64 : 128);
        const size_t cc = etp__qf_roundup(t.cols, 128);
        r = r > cr ? r : cr;
        c = c > cc ? c : cc;
    }
    *re = r;
    *ce = c;
}

struct CastShared {
    float x[kTile][kTile + 1];
    float blk2d[kTile / 16][kTile / 16]; /* NVFP4 16x16 block amaxes */
};

__device__ __forceinline__ uint32_t sr_bits(const etp__qbatch_t &b, uint32_t k, uint32_t dir,
                                            size_t i, size_t j, size_t cols)
{
    return etp__qf_sr_bits(b.seed, b.first + k, dir, (uint64_t)i * cols + j);
}

__device__ __forceinline__ uint8_t fp4(const etp__qbatch_t &b, uint32_t k, float v, uint32_t dir,
                                       size_t i, size_t j, size_t cols)
{
    if (b.stochastic) return etp__qf_e2m1_sr_satfinite(v, sr_bits(b, k, dir, i, j, cols));
    return etp__qf_e2m1_rne_satfinite(v);
}

__global__ void __launch_bounds__(kThreads) cast_kernel(const __grid_constant__ Params p)
{
    const etp__qbatch_t &b = p.b;
    if (skipped(b)) return;
    uint32_t local;
    const uint32_t k = find_tensor(p, blockIdx.x, &local);
    const etp__qb_tensor_t &t = b.t[k];
    const size_t M = t.rows, K = t.cols;
    const size_t r0 = (size_t)(local / p.tiles_c[k]) * kTile;
    const size_t c0 = (size_t)(local % p.tiles_c[k]) * kTile;
    __shared__ CastShared sh;

    /* 1. the tile, as FP32, zero outside the tensor (zeros do not change an amax) */
    for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
        const int r = e / kTile, c = e % kTile;
        const size_t gi = r0 + r, gj = c0 + c;
        sh.x[r][c] = (gi < M && gj < K) ? load_elem(t.x, t.dtype, gi * K + gj) : 0.0f;
    }
    __syncthreads();

    if (b.format == ETP__QB_NVFP4) {
        const float amax = b.amax[b.first + k];
        const float s_enc = etp__qf_nvfp4_s_enc(amax);
        const float s_enc_6 = etp__qf_nvfp4_s_enc_6(s_enc), s_dec = 1.0f / s_enc;
        if (b.block2d) {
            if (threadIdx.x < 16) {
                const int br = threadIdx.x / 4, bc = threadIdx.x % 4;
                float a = 0.0f;
                for (int r = 0; r < 16; r++)
                    for (int c = 0; c < 16; c++) a = etp__qf_amax_step(a, sh.x[br * 16 + r][bc * 16 + c]);
                sh.blk2d[br][bc] = a;
            }
            __syncthreads();
        }
        const int rr = threadIdx.x / 4, seg = threadIdx.x % 4; /* 64 rows x 4 segments of 16 */
        if (t.row_data) {
            const etp__qf_scale_shape_t ss = etp__qf_nvfp4_row_scales(M, K);
            const size_t gi = r0 + rr, kb = c0 / 16 + seg;
            if (gi < ss.rows && kb < ss.cols) {
                uint8_t *scales = static_cast<uint8_t *>(t.row_scales);
                const size_t off = etp__qf_scale_offset(gi, kb, ss.cols, b.swizzle);
                if (gi < M && kb < K / 16) {
                    float a = 0.0f;
                    if (b.block2d)
                        a = sh.blk2d[rr / 16][seg];
                    else
                        for (int c = 0; c < 16; c++) a = etp__qf_amax_step(a, sh.x[rr][seg * 16 + c]);
                    const uint8_t sc = etp__qf_nvfp4_block_scale(a, s_enc_6);
                    const float m = etp__qf_nvfp4_multiplier(sc, s_dec);
                    scales[off] = sc;
                    uint8_t *dst = static_cast<uint8_t *>(t.row_data) + gi * (K / 2) + kb * 8;
                    for (int c = 0; c < 16; c += 2) {
                        const size_t gj = kb * 16 + c;
                        const uint8_t lo = fp4(b, k, sh.x[rr][seg * 16 + c] * m, 0, gi, gj, K);
                        const uint8_t hi = fp4(b, k, sh.x[rr][seg * 16 + c + 1] * m, 0, gi, gj + 1, K);
                        dst[c / 2] = (uint8_t)(lo | (hi << 4));
                    }
                } else {
                    scales[off] = 0;
                }
            }
        }
        if (t.col_data) {
            const etp__qf_scale_shape_t ss = etp__qf_nvfp4_col_scales(M, K);
            const int cc = threadIdx.x % kTile, cseg = threadIdx.x / kTile; /* 64 cols x 4 segments */
            const size_t gj = c0 + cc, mb = r0 / 16 + cseg;
            if (gj < ss.rows && mb < ss.cols) {
                uint8_t *scales = static_cast<uint8_t *>(t.col_scales);
                const size_t off = etp__qf_scale_offset(gj, mb, ss.cols, b.swizzle);
                if (gj < K && mb < M / 16) {
                    float a = 0.0f;
                    if (b.block2d)
                        a = sh.blk2d[cseg][cc / 16];
                    else
                        for (int r = 0; r < 16; r++) a = etp__qf_amax_step(a, sh.x[cseg * 16 + r][cc]);
                    const uint8_t sc = etp__qf_nvfp4_block_scale(a, s_enc_6);
                    const float m = etp__qf_nvfp4_multiplier(sc, s_dec);
                    scales[off] = sc;
                    uint8_t *dst = static_cast<uint8_t *>(t.col_data) + gj * (M / 2) + mb * 8;
                    for (int r = 0; r < 16; r += 2) {
                        const size_t gi = mb * 16 + r;
                        const uint8_t lo = fp4(b, k, sh.x[cseg * 16 + r][cc] * m, 1, gi, gj, K);
                        const uint8_t hi = fp4(b, k, sh.x[cseg * 16 + r + 1][cc] * m, 1, gi + 1, gj, K);
                        dst[r / 2] = (uint8_t)(lo | (hi << 4));
                    }
                } else {
                    scales[off] = 0;
                }
            }
        }
        return;
    }

    /* MXFP8: 64 rows x 2 segments of 32 (rowwise), 64 columns x 2 segments (columnwise) */
    const int e5m2 = (int)b.e5m2;
    const float inv_max = etp__qf_mxfp8_inv_max(e5m2);
    if (t.row_data && threadIdx.x < 128) {
        const etp__qf_scale_shape_t ss = etp__qf_mxfp8_row_scales(M, K);
        const int rr = threadIdx.x / 2, seg = threadIdx.x % 2;
        const size_t gi = r0 + rr, kb = c0 / 32 + seg;
        if (gi < ss.rows && kb < ss.cols) {
            uint8_t *scales = static_cast<uint8_t *>(t.row_scales);
            const size_t off = etp__qf_scale_offset(gi, kb, ss.cols, b.swizzle);
            if (gi < M && kb < K / 32) {
                float a = 0.0f;
                for (int c = 0; c < 32; c++) a = etp__qf_amax_step(a, sh.x[rr][seg * 32 + c]);
                const uint8_t e = etp__qf_mxfp8_scale(a, inv_max);
                const float s = etp__qf_mxfp8_multiplier(e);
                scales[off] = e;
                uint8_t *dst = static_cast<uint8_t *>(t.row_data) + gi * K + kb * 32;
                for (int c = 0; c < 32; c++) dst[c] = etp__qf_mxfp8_encode(sh.x[rr][seg * 32 + c], s, e5m2);
            } else {
                scales[off] = 0;
            }
        }
    }
    if (t.col_data && threadIdx.x >= 128) {
        const etp__qf_scale_shape_t ss = etp__qf_mxfp8_col_scales(M, K);
        const int cc = (threadIdx.x - 128) % kTile, cseg = (threadIdx.x - 128) / kTile;
        const size_t gj = c0 + cc, mb = r0 / 32 + cseg;
        if (mb < ss.rows && gj < ss.cols) {
            uint8_t *scales = static_cast<uint8_t *>(t.col_scales);
            const size_t off = etp__qf_mxfp8_col_scale_offset(mb, gj, ss, b.swizzle);
            if (gj < K && mb < M / 32) {
                float a = 0.0f;
                for (int r = 0; r < 32; r++) a = etp__qf_amax_step(a, sh.x[cseg * 32 + r][cc]);
                const uint8_t e = etp__qf_mxfp8_scale(a, inv_max);
                const float s = etp__qf_mxfp8_multiplier(e);
                scales[off] = e;
                uint8_t *dst = static_cast<uint8_t *>(t.col_data);
                for (int r = 0; r < 32; r++)
                    dst[(mb * 32 + r) * K + gj] = etp__qf_mxfp8_encode(sh.x[cseg * 32 + r][cc], s, e5m2);
            } else {
                scales[off] = 0;
            }
        }
    }
}

/* ---- dequantize ------------------------------------------------------------ */

__global__ void __launch_bounds__(kThreads) dequant_kernel(const __grid_constant__ Params p)
{
    const etp__qbatch_t &b = p.b;
    if (skipped(b)) return;
    uint32_t local;
    const uint32_t k = find_tensor(p, blockIdx.x, &local);
    const etp__qb_tensor_t &t = b.t[k];
    const size_t M = t.rows, K = t.cols, count = M * K;
    const bool col = b.direction == 2;
    const uint8_t *data = static_cast<const uint8_t *>(col ? t.col_data : t.row_data);
    const uint8_t *scales = static_cast<const uint8_t *>(col ? t.col_scales : t.row_scales);
    const size_t begin = (size_t)local * kDequantChunk;
    const size_t end = begin + kDequantChunk < count ? begin + kDequantChunk : count;
    if (b.format == ETP__QB_NVFP4) {
        const float s_dec = 1.0f / etp__qf_nvfp4_s_enc(b.amax[b.first + k]);
        const etp__qf_scale_shape_t ss =
            col ? etp__qf_nvfp4_col_scales(M, K) : etp__qf_nvfp4_row_scales(M, K);
        for (size_t e = begin + threadIdx.x; e < end; e += kThreads) {
            const size_t i = e / K, j = e % K;
            const size_t r = col ? j : i, c = col ? i : j, ld = col ? M : K;
            const uint8_t q = (uint8_t)((data[r * (ld / 2) + c / 2] >> (4 * (c % 2))) & 0xfu);
            const uint8_t sc = scales[etp__qf_scale_offset(r, c / 16, ss.cols, b.swizzle)];
            const float v = etp__qf_nvfp4_decode(q, sc, s_dec);
            if (t.dtype == ETP__QB_BF16)
                static_cast<uint16_t *>(t.y)[e] = etp__qf_f32_to_bf16(v);
            else
                static_cast<float *>(t.y)[e] = v;
        }
    } else {
        const etp__qf_scale_shape_t ss =
            col ? etp__qf_mxfp8_col_scales(M, K) : etp__qf_mxfp8_row_scales(M, K);
        for (size_t e = begin + threadIdx.x; e < end; e += kThreads) {
            const size_t i = e / K, j = e % K;
            const size_t off = col ? etp__qf_mxfp8_col_scale_offset(i / 32, j, ss, b.swizzle)
                                   : etp__qf_scale_offset(i, j / 32, ss.cols, b.swizzle);
            const float v = etp__qf_mxfp8_decode(data[e], scales[off], (int)b.e5m2);
            if (t.dtype == ETP__QB_BF16)
                static_cast<uint16_t *>(t.y)[e] = etp__qf_f32_to_bf16(v);
            else
                static_cast<float *>(t.y)[e] = v;
        }
    }
}

} // namespace

extern "C" cudaError_t etp__cuda_quant_launch(cudaStream_t s, const etp__qbatch_t *batch)
{
    if (batch->n == 0) return cudaSuccess;
    if (batch->n > ETP__QB_MAX) return cudaErrorInvalidValue;
    /* the parameter block: the batch (only its tensors are meaningful) and
     * the tile prefix sums */
    static_assert(sizeof(Params) < 32764, "kernel parameters are limited to 32764 bytes");
    Params p;
    memcpy(&p.b, batch, etp__qbatch_bytes(batch->n));
    uint64_t total = 0;
    for (uint32_t k = 0; k < batch->n; k++) {
        const etp__qb_tensor_t &t = batch->t[k];
        const uint64_t count = (uint64_t)t.rows * t.cols;
        uint64_t tiles = 0;
        p.tiles_c[k] = 1;
        if (batch->op == ETP__QB_AMAX) {
            tiles = count ? (count + kAmaxChunk - 1) / kAmaxChunk : 1; /* an empty tensor still gets its 0 */
        } else if (batch->op == ETP__QB_DEQUANT) {
            tiles = (count + kDequantChunk - 1) / kDequantChunk;
        } else {
            size_t re, ce;
            cast_extent(batch[0], t, &re, &ce);
            tiles = (uint64_t)(re / kTile) * (ce / kTile);
            p.tiles_c[k] = ce / kTile ? (uint32_t)(ce / kTile) : 1;
        }
        p.tile_start[k] = (uint32_t)total;
        total += tiles;
        if (total > 0x7fffffffu) return cudaErrorInvalidValue;
    }
    p.tile_start[batch->n] = (uint32_t)total;
    if (total == 0) return cudaSuccess;
    void *args[] = {&p};
    const void *fn = batch->op == ETP__QB_AMAX   ? (const void *)amax_kernel
                     : batch->op == ETP__QB_CAST ? (const void *)cast_kernel
                                                 : (const void *)dequant_kernel;
    return cudaLaunchKernel(fn, dim3((unsigned)total), dim3(kThreads), args, 0, s);
}
