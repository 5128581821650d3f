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
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant_kernels.h"
#include "quant/formats/qf_codec.h"
#include "quant/formats/qf_layout.h"

namespace {

constexpr int kThreads = 256;
constexpr int kTile = 64;                 /* cast tiles are 64 x 64 elements */
constexpr uint32_t kDequantChunk = 4096;  /* elements per dequantize block */

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

/* What the v3 cast would otherwise test of a tensor on every tile (its
 * pointers' alignment, its shape's divisibility, which outputs it has):
 * the launcher's, once per launch. The BF16 NVFP4 kernel is bound by its
 * SMs' instruction issue, and those tests, 64-bit and loaded from the
 * parameter block each time, were 4% of its instructions (with the masks
 * of the old 16x16 amax; ncu, H200, docs/PERF.md ninth session). */
enum : uint8_t {
    kFlX16 = 1,   /* x 16-byte aligned, its rows whole 16-byte multiples: whole 8 x 8 pieces load as vectors */
    kFlRow = 2,   /* rowwise output */
    kFlCol = 4,   /* columnwise output */
    kFlStage = 8, /* NVFP4 columnwise codes staged: col_data 16-byte aligned, (rows / 2) % 16 == 0 */
    kFlRimg = 16, /* NVFP4 rowwise scales of whole runs collect in an image: unswizzled, their rows
                     whole 16-byte multiples, 16-byte aligned */
    kFlMerge = 32 /* NVFP4 columnwise scales merged by clusters: unswizzled, their rows whole 16-byte
                     multiples, 16-byte aligned */
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

/* ---- cast: shared pieces ------------------------------------------------------ */

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

__device__ __forceinline__ uint32_t sr_bits(const etp__qbatch_t &b, uint32_t k, uint32_t dir,
                                            size_t i, size_t j, size_t cols)
{
    return etp__qf_sr_bits(b.seed, b.first + k, dir, (uint64_t)i * cols + j);
}

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
constexpr int kCastBlocksPerSm = 4;     /* resident blocks per SM (launch bounds) */

/* max(acc, m) for m = |x| as FP32 bits (sign cleared), a NaN ignored: the
 * reference's etp__qf_amax_step on bits (non-negative floats order like
 * their bits). */
__device__ __forceinline__ uint32_t amax_bits(uint32_t acc, uint32_t m)
{
    return m > 0x7f800000u ? acc : (m > acc ? m : acc);
}

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

struct CastSharedV2 {
    float x[kTile][kTile + 1];
    float seg[kTile][4];                 /* NVFP4: amax of each row's 16-element segments */
    float blk2d[kTile / 16][kTile / 16]; /* NVFP4 16x16 block amaxes */
};

/* One tile's input, loaded into registers ahead of its use. */
struct TileRegs {
    uint4 r[4];
    int fast; /* loaded here (else: loaded into shared memory, element by element) */
    uint8_t dtype;
};

__device__ __forceinline__ void tile_coords(const Params &p, uint32_t tile, uint32_t *k, size_t *r0,
                                            size_t *c0)
{
    uint32_t local;
    *k = find_tensor(p, tile, &local);
    *r0 = (size_t)(local / p.tiles_c[*k]) * kTile;
    *c0 = (size_t)(local % p.tiles_c[*k]) * kTile;
}

/* Start the 16-byte loads of a tile lying wholly inside its tensor whose
 * rows are 16-byte aligned: 512 (BF16) or 1024 (FP32) vectors, 2 or 4 per
 * thread, vector v at row v / (vectors per row). Other tiles: fast = 0. */
__device__ __forceinline__ void tile_prefetch(const etp__qb_tensor_t &t, size_t r0, size_t c0,
                                              TileRegs *tr)
{
    const size_t es = t.dtype == ETP__QB_BF16 ? 2 : 4, M = t.rows, K = t.cols;
    tr->dtype = t.dtype;
    tr->fast = r0 + kTile <= M && c0 + kTile <= K && (reinterpret_cast<uintptr_t>(t.x) & 15u) == 0 &&
               (K * es) % 16 == 0;
    if (!tr->fast) return;
    const int vpr = (int)(kTile * es / 16), nvt = kTile * vpr / kThreads; /* per row, per thread */
    const char *x = static_cast<const char *>(t.x);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (i < nvt) {
            const int v = threadIdx.x + i * kThreads, row = v / vpr, cv = v % vpr;
            tr->r[i] = __ldg(reinterpret_cast<const uint4 *>(x + ((r0 + row) * K + c0) * es) + cv);
        }
    }
}

/* Put a tile into shared memory as FP32: from the registers of a fast tile,
 * else element by element, zeros outside the tensor (zeros do not change an
 * amax). */
__device__ __forceinline__ void tile_store(const etp__qb_tensor_t &t, size_t r0, size_t c0,
                                           const TileRegs &tr, CastSharedV2 &sh)
{
    if (tr.fast) {
        const bool bf = tr.dtype == ETP__QB_BF16;
        const int vpr = bf ? 8 : 16, nvt = bf ? 2 : 4;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (i < nvt) {
                const int v = threadIdx.x + i * kThreads, row = v / vpr, cv = v % vpr;
                const uint32_t w[4] = {tr.r[i].x, tr.r[i].y, tr.r[i].z, tr.r[i].w};
                if (bf) { /* element 2j is the low half of word j (little-endian) */
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        sh.x[row][cv * 8 + 2 * j] = __uint_as_float(w[j] << 16);
                        sh.x[row][cv * 8 + 2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
                    }
                } else {
#pragma unroll
                    for (int j = 0; j < 4; j++) sh.x[row][cv * 4 + j] = __uint_as_float(w[j]);
                }
            }
        }
        return;
    }
    const size_t M = t.rows, K = t.cols;
    for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
        const int r = e / kTile, c = e % kTile;
        const size_t gi = r0 + r, gj = c0 + c;
        sh.x[r][c] = (gi < M && gj < K) ? load_elem(t.x, t.dtype, gi * K + gj) : 0.0f;
    }
}

/* 16 E2M1 codes (code c in bits 4c..4c+3, so byte j holds elements 2j in
 * its low nibble and 2j+1 in its high one) to 8 bytes at dst. */
__device__ __forceinline__ void store_fp4x16(uint8_t *dst, uint32_t w0, uint32_t w1)
{
    if ((reinterpret_cast<uintptr_t>(dst) & 7u) == 0) {
        *reinterpret_cast<uint2 *>(dst) = make_uint2(w0, w1);
        return;
    }
    for (int j = 0; j < 4; j++) {
        dst[j] = (uint8_t)(w0 >> (8 * j));
        dst[4 + j] = (uint8_t)(w1 >> (8 * j));
    }
}

/* 16 NVFP4 elements v[0..15] with multiplier m into two words of codes;
 * (i, j) of element 0 and its step (di, dj) for stochastic rounding. */
__device__ __forceinline__ void fp4x16(const etp__qbatch_t &b, uint32_t k, const float *v, float m,
                                       uint32_t dir, size_t i, size_t j, size_t di, size_t dj,
                                       size_t cols, uint32_t *w0, uint32_t *w1)
{
    uint32_t w[2] = {0u, 0u};
    if (b.stochastic) {
#pragma unroll /* constant indices: v and w stay in registers */
        for (int c = 0; c < 16; c++)
            w[c / 8] |= (uint32_t)etp__qf_e2m1_sr_satfinite(v[c] * m, sr_bits(b, k, dir, i + c * di,
                                                                               j + c * dj, cols))
                        << (4 * (c % 8));
    } else {
#pragma unroll
        for (int c = 0; c < 16; c++)
            w[c / 8] |= (uint32_t)etp__qf_e2m1_rne_satfinite_fast(v[c] * m) << (4 * (c % 8));
    }
    *w0 = w[0];
    *w1 = w[1];
}

__device__ __forceinline__ float amax16(const float *v)
{
    uint32_t a = 0;
#pragma unroll
    for (int c = 0; c < 16; c++) a = amax_bits(a, etp__qf_bits(v[c]) & 0x7fffffffu);
    return __uint_as_float(a);
}

/* One tile in shared memory, quantized: NVFP4 (every thread: a 16-element
 * row segment, then a 16-element column segment) or MXFP8 (threads 0-127: a
 * 32-element row segment; 128-255: a 32-element column segment). Scale
 * entries of the padding that the tile covers are written as zeros. */
__device__ __forceinline__ void cast_tile(const etp__qbatch_t &b, uint32_t k, size_t r0, size_t c0,
                                          CastSharedV2 &sh)
{
    const etp__qb_tensor_t &t = b.t[k];
    const size_t M = t.rows, K = t.cols;
    if (b.format == ETP__QB_NVFP4) {
        const float amax = b.amax[b.first + k];
        const float s_enc = etp__qf_nvfp4_s_enc(amax);
        const float s_enc_6 = etp__qf_nvfp4_s_enc_6(s_enc), s_dec = 1.0f / s_enc;
        const int rr = threadIdx.x / 4, seg = threadIdx.x % 4; /* 64 rows x 4 segments of 16 */
        float v[16];
#pragma unroll
        for (int c = 0; c < 16; c++) v[c] = sh.x[rr][seg * 16 + c];
        const float ra = amax16(v);
        if (b.block2d) { /* 16x16 amax = the max of its 16 row segments' amaxes */
            sh.seg[rr][seg] = ra;
            __syncthreads();
            if (threadIdx.x < 16) {
                const int br = threadIdx.x / 4, bc = threadIdx.x % 4;
                uint32_t a = 0;
                for (int r = 0; r < 16; r++) a = amax_bits(a, etp__qf_bits(sh.seg[br * 16 + r][bc]));
                sh.blk2d[br][bc] = __uint_as_float(a);
            }
            __syncthreads();
        }
        if (t.row_data) {
            const etp__qf_scale_shape_t ss = etp__qf_nvfp4_row_scales(M, K);
            const size_t gi = r0 + rr, kb = c0 / 16 + seg;
            if (gi < ss.rows && kb < ss.cols) {
                uint8_t *scales = static_cast<uint8_t *>(t.row_scales);
                const size_t off = etp__qf_scale_offset(gi, kb, ss.cols, b.swizzle);
                if (gi < M && kb < K / 16) {
                    const float a = b.block2d ? sh.blk2d[rr / 16][seg] : ra;
                    const uint8_t sc = etp__qf_nvfp4_block_scale(a, s_enc_6);
                    const float m = etp__qf_nvfp4_multiplier(sc, s_dec);
                    scales[off] = sc;
                    uint32_t w0, w1;
                    fp4x16(b, k, v, m, 0, gi, kb * 16, 0, 1, K, &w0, &w1);
                    store_fp4x16(static_cast<uint8_t *>(t.row_data) + gi * (K / 2) + kb * 8, w0, w1);
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
#pragma unroll
                    for (int r = 0; r < 16; r++) v[r] = sh.x[cseg * 16 + r][cc];
                    const float a = b.block2d ? sh.blk2d[cseg][cc / 16] : amax16(v);
                    const uint8_t sc = etp__qf_nvfp4_block_scale(a, s_enc_6);
                    const float m = etp__qf_nvfp4_multiplier(sc, s_dec);
                    scales[off] = sc;
                    uint32_t w0, w1;
                    fp4x16(b, k, v, m, 1, mb * 16, gj, 1, 0, K, &w0, &w1);
                    store_fp4x16(static_cast<uint8_t *>(t.col_data) + gj * (M / 2) + mb * 8, w0, w1);
                } else {
                    scales[off] = 0;
                }
            }
        }
        return;
    }

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
                uint32_t a = 0;
                for (int c = 0; c < 32; c++) a = amax_bits(a, etp__qf_bits(sh.x[rr][seg * 32 + c]) & 0x7fffffffu);
                const uint8_t e = etp__qf_mxfp8_scale(__uint_as_float(a), inv_max);
                const float s = etp__qf_mxfp8_multiplier(e);
                scales[off] = e;
                uint32_t w[8] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
#pragma unroll
                for (int c = 0; c < 32; c++)
                    w[c / 4] |= (uint32_t)etp__qf_mxfp8_encode_fast(sh.x[rr][seg * 32 + c], s, e5m2)
                                << (8 * (c % 4));
                uint8_t *dst = static_cast<uint8_t *>(t.row_data) + gi * K + kb * 32;
                if ((reinterpret_cast<uintptr_t>(dst) & 15u) == 0) {
                    reinterpret_cast<uint4 *>(dst)[0] = make_uint4(w[0], w[1], w[2], w[3]);
                    reinterpret_cast<uint4 *>(dst)[1] = make_uint4(w[4], w[5], w[6], w[7]);
                } else {
#pragma unroll
                    for (int c = 0; c < 32; c++) dst[c] = (uint8_t)(w[c / 4] >> (8 * (c % 4)));
                }
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
                uint32_t a = 0;
                for (int r = 0; r < 32; r++) a = amax_bits(a, etp__qf_bits(sh.x[cseg * 32 + r][cc]) & 0x7fffffffu);
                const uint8_t e = etp__qf_mxfp8_scale(__uint_as_float(a), inv_max);
                const float s = etp__qf_mxfp8_multiplier(e);
                scales[off] = e;
                /* a warp writes 32 consecutive bytes of a row per store: whole sectors */
                uint8_t *dst = static_cast<uint8_t *>(t.col_data);
#pragma unroll 8
                for (int r = 0; r < 32; r++)
                    dst[(mb * 32 + r) * K + gj] = etp__qf_mxfp8_encode_fast(sh.x[cseg * 32 + r][cc], s, e5m2);
            } else {
                scales[off] = 0;
            }
        }
    }
}

/* Tiles blockIdx.x, + gridDim.x, ...: each iteration puts the tile loaded
 * ahead into shared memory, starts the loads of the next one, then
 * quantizes the current one while they are in flight. */
__global__ void __launch_bounds__(kThreads, kCastBlocksPerSm) cast_kernel_v2(const __grid_constant__ Params p)
{
    const etp__qbatch_t &b = p.b;
    if (skipped(b)) return;
    __shared__ CastSharedV2 sh;
    const uint32_t total = p.tile_start[b.n];
    uint32_t tile = blockIdx.x;
    if (tile >= total) return;
    uint32_t k;
    size_t r0, c0;
    tile_coords(p, tile, &k, &r0, &c0);
    TileRegs tr;
    tile_prefetch(b.t[k], r0, c0, &tr);
    while (true) {
        tile_store(b.t[k], r0, c0, tr, sh);
        __syncthreads();
        const uint32_t next = tile + gridDim.x;
        uint32_t nk = 0;
        size_t nr0 = 0, nc0 = 0;
        if (next < total) {
            tile_coords(p, next, &nk, &nr0, &nc0);
            tile_prefetch(b.t[nk], nr0, nc0, &tr);
        }
        cast_tile(b, k, r0, c0, sh);
        if (next >= total) break;
        __syncthreads(); /* every thread is done with sh before the next tile lands */
        tile = next;
        k = nk;
        r0 = nr0;
        c0 = nc0;
    }
}

/* ---- cast v3 (the default) -------------------------------------------------
 *
 * v2 put every tile in shared memory as FP32, converted each element with
 * ~15 instructions (a float-to-int conversion among them) once per
 * direction and stored the columnwise outputs a byte or 8 bytes at a time:
 * at 256 MiB it ran at 0.2-0.27 of a device copy, bound by instructions and
 * store transactions rather than by memory. v3 keeps each thread's 8 x 8
 * elements in registers from load to store:
 * - tiles of 128 x 128 elements for 256 threads; a warp covers 32 rows x 64
 *   columns, lane l rows 8 (l / 8) and columns 8 (l % 8) of it, so a 16-byte
 *   load is one row's 8 BF16 and a warp's load 4 rows x 128 contiguous
 *   bytes, and every block (1x16, 16x1, 16x16, 1x32, 32x1) lies in one warp:
 *   its amax is an integer max (two BF16 per instruction) finished by one or
 *   two shuffles, its scale computed by one of the block's lanes and
 *   shuffled to the others;
 * - NVFP4 elements are converted by one FP32 addition of a magic number
 *   (etp__qf_round_magic: the code lands in the low byte of the sum), codes
 *   packed with byte permutes, signs taken from the input words; MXFP8
 *   elements by the hardware's FP8 conversion, two per instruction (sm_89
 *   and later: its rounding is the reference's once the scale keeps every
 *   element finite and in range, which the fast path checks; it cut the
 *   MXFP8 kernel's instructions by about a third, from 0.71 to 0.85 of a
 *   copy). Hopper has no E2M1 conversion, and rounding through E4M3 first
 *   would round twice;
 * - an NVFP4 row of 8 codes is one 32-bit word, the columnwise copy is the
 *   8 x 8 nibble transpose of those words in registers; with 16x16 blocks
 *   both copies have the same codes, converted once;
 * - MXFP8 data leaves as 8 bytes per thread and row (a warp store fills
 *   whole 32-byte sectors of 4 rows), NVFP4 rowwise data as 4 bytes per
 *   thread and row (whole sectors too); NVFP4 columnwise data of whole
 *   tiles is staged in shared memory and leaves as 16-byte stores after
 *   the tile's barrier (stage_put_v3: stored from registers, 4 bytes of 8
 *   rows a thread, those half-sector stores alone halved the kernel's
 *   speed);
 * - scale bytes gather in shared memory and leave as 4-byte words in output
 *   order: a tile's scales are whole 512-byte swizzle tiles (unswizzled,
 *   4 or 8 bytes of each of 128 rows: pieces of sectors that other tiles
 *   complete, 6-8% slower than swizzled in the benchmark; hence NVFP4's
 *   runs and MXFP8's wide tiles below);
 * - the next tile's BF16 rows travel to shared memory by cp.async while
 *   the current ones are converted, each thread its own rows (no barrier,
 *   no registers held); FP32 tensors run in a second instantiation of the
 *   kernel (a second launch when a batch mixes the types) that loads in
 *   place, so neither type's registers crowd the other's.
 * A warp whose blocks hold a NaN (or, MXFP8, whose scale would let an
 * element pass the format's largest value: an infinite amax) converts with
 * the v2 functions instead, element by element. */

#ifdef ETP_QUANT_CAST_DIAG
/* A measuring build only (-DCMAKE_CUDA_FLAGS=-DETP_QUANT_CAST_DIAG): parts
 * of the v3 cast left out, their outputs wrong, to see where the time goes
 * when instruction counts do not tell (docs/PERF.md, fourth session). The
 * bits of ETP_QUANT_CAST_DIAG in the environment at each launch: 1 the
 * NVFP4 conversion, 2 the columnwise data stores, 4 the rowwise ones, 8 the
 * scale write-out, 16 the NVFP4 clamp, 32 the scale write-out's global
 * stores alone (the words are still gathered and their offsets computed). */
__constant__ uint32_t g_cast_diag;
#define ETP__CAST_LEAVE_OUT(bit) ((g_cast_diag & (bit)) != 0u)
#else
#define ETP__CAST_LEAVE_OUT(bit) false
#endif

constexpr int kTileV3 = 128;          /* v3 tiles: 128 x 128 elements */
/* resident blocks per SM (launch bounds) of the NVFP4 and the MXFP8
 * kernels; a build may override them to measure the occupancy / register
 * trade-off */
#ifdef ETP_QUANT_V3_NV_BLOCKS_PER_SM
constexpr int kCastV3NvBlocksPerSm = ETP_QUANT_V3_NV_BLOCKS_PER_SM;
#else
constexpr int kCastV3NvBlocksPerSm = 2;
#endif
#ifdef ETP_QUANT_V3_MX_BLOCKS_PER_SM
constexpr int kCastV3MxBlocksPerSm = ETP_QUANT_V3_MX_BLOCKS_PER_SM;
#else
constexpr int kCastV3MxBlocksPerSm = 2;
#endif
constexpr uint32_t kFull = 0xffffffffu;
constexpr uint32_t kAbs2 = 0x7fff7fffu; /* |x| of two BF16 */

/* One tile's scale bytes on their way out: [direction (0 rowwise, 1
 * columnwise)][block index in the tile][row (rowwise) or column]. */
typedef uint8_t TileScales[2][8][kTileV3];

/* A thread's 8 x 8 elements, by value for the per-element path: a call
 * (not inlined: its registers would crowd the fast path's) that copies
 * them only when taken. */
struct SubV3 {
    uint32_t w[8][8];
};

/* Wide tiles: MXFP8 with row-major (unswizzled) scales runs tiles of 32 x
 * 512 elements instead, so that a tile writes 16 bytes of each of 32
 * rowwise scale rows where a 128 x 128 tile wrote 4 bytes of each of 128
 * (pieces of sectors: on an H200 those stores cost 7% of the kernel, where
 * the swizzled layout's whole 512-byte tiles cost 2%), and its columnwise
 * scales are one row's 512 contiguous bytes. Every MXFP8 block (1x32,
 * 32x1) still lies in one warp. The swizzled layout keeps square tiles:
 * its 512-byte tiles are 128 rows deep. */
constexpr int kWideRows = 32, kWideCols = 512;

template <bool kWide>
struct TileDimV3 {
    static constexpr int kRows = kWide ? kWideRows : kTileV3, kCols = kWide ? kWideCols : kTileV3;
};

/* Elements extents v3 tiles cover: the data and all scale padding (scale
 * rows are padded to 128 in every layout). */
__host__ inline void cast_extent_v3(const etp__qb_tensor_t &t, bool wide, size_t *re, size_t *ce)
{
    const bool any = t.row_data != nullptr || t.col_data != nullptr;
    *re = any ? etp__qf_roundup(t.rows, kTileV3) : 0;
    *ce = any ? etp__qf_roundup(t.cols, wide ? kWideCols : kTileV3) : 0;
}

/* This thread's place in a tile: rows tr..tr+7, columns tc..tc+7. Column
 * neighbours are lanes ^1, ^2, ^4; row neighbours lanes ^8, ^16. Square
 * tiles: warps 2 wide, 4 deep; wide tiles: 8 wide, 1 deep. */
struct GeoV3 {
    int tid, lane, cg, rg, wr; /* thread, lane, lane % 8, lane / 8, the warp's 32-row band */
    int tr, tc;
};

template <bool kWide = false>
__device__ __forceinline__ GeoV3 geo_v3()
{
    GeoV3 g;
    const uint32_t tid = threadIdx.x;
    g.tid = (int)tid;
    g.lane = (int)(tid & 31);
    g.cg = g.lane & 7;
    g.rg = g.lane >> 3;
    g.wr = kWide ? 0 : (int)(tid >> 6);
    g.tr = g.wr * 32 + g.rg * 8;
    g.tc = (kWide ? (int)(tid >> 5) : (int)((tid >> 5) & 1)) * 64 + g.cg * 8;
    return g;
}

/* MXFP8 scale bytes of a tile in TileScales, flat per direction (1 KiB
 * each): rowwise [block of 32 columns][row], columnwise [32-row band][column]. */
template <bool kWide>
__device__ __forceinline__ uint8_t *mx_st_row(TileScales &st, int tc, int row)
{
    return &st[0][0][0] + (tc / 32) * TileDimV3<kWide>::kRows + row;
}

template <bool kWide>
__device__ __forceinline__ uint8_t *mx_st_col(TileScales &st, int band, int col)
{
    return &st[1][0][0] + band * kTileV3 + col; /* wide tiles: one band of 512 columns */
}

/* Runs: the v3 cast hands a block kRun* consecutive tiles of one tile row
 * at a time (fewer at a row's end), so that a run's rowwise scales leave
 * together: NVFP4 4 tiles x 8 bytes, 32 bytes of each scale row, whole
 * sectors, where one tile writes 8 bytes of each of 128 rows, pieces of
 * sectors other blocks complete (the unswizzled layout; 2 x H200: 0.73 ->
 * 0.80 of a copy at 256 MiB, docs/PERF.md; where there are runs enough for
 * every resident block: the launcher decides). MXFP8 stays a tile at a time:
 * runs of 8 gave it nothing unswizzled and cost 7% swizzled, likely as the
 * blocks' tiles at any moment spread over 8 times as many input rows. */
constexpr uint32_t kRunNv = 4, kRunMx = 1;
constexpr int kRunRowBytes = 32;

/* A run's tensor and place in it (tile row rt, run q of the row: tiles
 * q * run .. q * run + run - 1). */
struct TileV3 {
    uint32_t k, rt, q;
};

/* *t on entry: the previous run's tensor, most often this one's too (no
 * search then). */
__device__ __forceinline__ void tile_coords_v3(const Params &p, uint32_t run, TileV3 *t)
{
    uint32_t local;
    if (run >= p.tile_start[t->k] && run < p.tile_start[t->k + 1])
        local = run - p.tile_start[t->k];
    else
        t->k = find_tensor(p, run, &local);
    t->rt = local / p.runs_c[t->k];
    t->q = local % p.runs_c[t->k];
}

/* The run a grid stride after `cur` (run index `next`): within the same
 * tensor a step by the launcher's per-tensor quotient and remainder, no
 * division. */
__device__ __forceinline__ TileV3 tile_step_v3(const Params &p, const TileV3 &cur, uint32_t next)
{
    TileV3 t = cur;
    if (next < p.tile_start[cur.k + 1]) {
        t.rt = cur.rt + p.step_r[cur.k];
        t.q = cur.q + p.step_c[cur.k];
        if (t.q >= p.runs_c[cur.k]) {
            t.q -= p.runs_c[cur.k];
            t.rt++;
        }
        return t;
    }
    tile_coords_v3(p, next, &t);
    return t;
}

__device__ __forceinline__ uint32_t u4get(const uint4 &v, int j)
{
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

__device__ __forceinline__ void u4set(uint4 &v, int j, uint32_t w)
{
    if (j == 0)
        v.x = w;
    else if (j == 1)
        v.y = w;
    else if (j == 2)
        v.z = w;
    else
        v.w = w;
}

/* The thread's 8 x 8 elements lie wholly inside the tensor, in 16-byte
 * aligned rows (fl: the tensor's kFl*). */
__device__ __forceinline__ bool fast_v3(uint32_t fl, const etp__qb_tensor_t &t, size_t R, size_t C)
{
    return (fl & kFlX16) && R + 8 <= t.rows && C + 8 <= t.cols;
}

/* BF16: row i in d[i] (element 2j in the low half of word j). */
__device__ __forceinline__ void load_bf16_v3(const etp__qb_tensor_t &t, size_t R, size_t C, uint4 (&d)[8])
{
    const size_t K = t.cols;
    const uint16_t *x = static_cast<const uint16_t *>(t.x) + R * K + C;
#pragma unroll
    for (int i = 0; i < 8; i++) d[i] = __ldg(reinterpret_cast<const uint4 *>(x + i * K));
}

/* FP32: rows 0-3 in lo (two vectors each), rows 4-7 in hi. */
__device__ __forceinline__ void load_f32_v3(const etp__qb_tensor_t &t, size_t R, size_t C, uint4 (&lo)[8],
                                            uint4 (&hi)[8])
{
    const size_t K = t.cols;
    const float *x = static_cast<const float *>(t.x) + R * K + C;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint4 *a = reinterpret_cast<const uint4 *>(x + i * K);
        const uint4 *b = reinterpret_cast<const uint4 *>(x + (i + 4) * K);
        lo[2 * i] = __ldg(a);
        lo[2 * i + 1] = __ldg(a + 1);
        hi[2 * i] = __ldg(b);
        hi[2 * i + 1] = __ldg(b + 1);
    }
}

/* The next tile's BF16 rows go to shared memory by cp.async (16 bytes,
 * not through L1), each thread to its own slots: no barrier, no registers
 * held while they are in flight. */
__device__ __forceinline__ void cp_async16_v3(void *smem, const void *gmem)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

__device__ __forceinline__ void cp_async_commit_v3()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

__device__ __forceinline__ void cp_async_wait_v3()
{
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

/* The same layouts element by element, zeros outside the tensor (a zero
 * changes no amax; its codes are never stored). */
template <bool kBf>
__device__ __forceinline__ void load_slow_v3(const etp__qb_tensor_t &t, size_t R, size_t C, uint4 (&lo)[8],
                                             uint4 (&hi)[8])
{
    const size_t M = t.rows, K = t.cols;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const bool in = R + i < M;
        if (kBf) {
            const uint16_t *x = static_cast<const uint16_t *>(t.x) + (R + i) * K;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const size_t c = C + 2 * j;
                const uint32_t a = in && c < K ? x[c] : 0u, b = in && c + 1 < K ? x[c + 1] : 0u;
                u4set(lo[i], j, a | (b << 16));
            }
        } else {
            const uint32_t *x = static_cast<const uint32_t *>(t.x) + (R + i) * K;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const uint32_t v = in && C + j < K ? x[C + j] : 0u;
                if (i < 4)
                    u4set(lo[2 * i + j / 4], j & 3, v);
                else
                    u4set(hi[2 * (i - 4) + j / 4], j & 3, v);
            }
        }
    }
}

/* The registers as rows of words (BF16 uses words 0-3 of each row). */
template <bool kBf>
__device__ __forceinline__ void words_v3(const uint4 (&lo)[8], const uint4 (&hi)[8], uint32_t (&w)[8][8])
{
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (kBf)
                w[i][j] = j < 4 ? u4get(lo[i], j) : 0u;
            else
                w[i][j] = i < 4 ? u4get(lo[2 * i + j / 4], j & 3) : u4get(hi[2 * (i - 4) + j / 4], j & 3);
        }
}

__device__ __forceinline__ SubV3 sub_v3(const uint32_t (&w)[8][8])
{
    SubV3 s;
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int j = 0; j < 8; j++) s.w[i][j] = w[i][j];
    return s;
}

/* |element e| of a row as FP32 bits, and the element itself. */
template <bool kBf>
__device__ __forceinline__ uint32_t absbits_v3(const uint32_t (&r)[8], int e)
{
    if (!kBf) return r[e] & 0x7fffffffu;
    const uint32_t a = r[e >> 1] & kAbs2;
    return (e & 1) ? (a & 0xffff0000u) : (a << 16);
}

template <bool kBf>
__device__ __forceinline__ float elem_v3(const uint32_t (&r)[8], int e)
{
    if (!kBf) return __uint_as_float(r[e]);
    return __uint_as_float((e & 1) ? (r[e >> 1] & 0xffff0000u) : (r[e >> 1] << 16));
}

/* ---- v3 amaxes: |x| maxima as FP32 bits with a NaN counting as the largest
 * (the caller looks for one and then takes the per-element path) --------- */

/* [max over even columns, max over odd columns] of a BF16 row. */
__device__ __forceinline__ uint32_t bf16_row_max2(const uint32_t (&r)[8])
{
    return __vmaxu2(__vmaxu2(r[0] & kAbs2, r[1] & kAbs2), __vmaxu2(r[2] & kAbs2, r[3] & kAbs2));
}

/* Each row's max over this lane's 8 columns and lanes ^X1 (and ^X2). */
template <bool kBf, int X1, int X2>
__device__ __forceinline__ void rows_amax_v3(const uint32_t (&w)[8][8], uint32_t (&ra)[8])
{
    if (kBf) {
        uint32_t rp[4]; /* rows 2k (low half) and 2k+1 (high half) */
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint32_t a = bf16_row_max2(w[2 * k]), b = bf16_row_max2(w[2 * k + 1]);
            rp[k] = __vmaxu2(__byte_perm(a, b, 0x5410), __byte_perm(a, b, 0x7632));
        }
#pragma unroll
        for (int k = 0; k < 4; k++) {
            rp[k] = __vmaxu2(rp[k], __shfl_xor_sync(kFull, rp[k], X1));
            if (X2) rp[k] = __vmaxu2(rp[k], __shfl_xor_sync(kFull, rp[k], X2));
            ra[2 * k] = rp[k] << 16;
            ra[2 * k + 1] = rp[k] & 0xffff0000u;
        }
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            uint32_t a = 0;
#pragma unroll
            for (int e = 0; e < 8; e++) a = max(a, w[i][e] & 0x7fffffffu);
            a = max(a, __shfl_xor_sync(kFull, a, X1));
            if (X2) a = max(a, __shfl_xor_sync(kFull, a, X2));
            ra[i] = a;
        }
    }
}

/* Each column's max over this lane's 8 rows and lanes ^X1 (and ^X2). */
template <bool kBf, int X1, int X2>
__device__ __forceinline__ void cols_amax_v3(const uint32_t (&w)[8][8], uint32_t (&ca)[8])
{
    if (kBf) {
#pragma unroll
        for (int j = 0; j < 4; j++) { /* columns 2j (low half) and 2j+1 (high half) */
            uint32_t a = w[0][j] & kAbs2;
#pragma unroll
            for (int i = 1; i < 8; i++) a = __vmaxu2(a, w[i][j] & kAbs2);
            a = __vmaxu2(a, __shfl_xor_sync(kFull, a, X1));
            if (X2) a = __vmaxu2(a, __shfl_xor_sync(kFull, a, X2));
            ca[2 * j] = a << 16;
            ca[2 * j + 1] = a & 0xffff0000u;
        }
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) {
            uint32_t a = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) a = max(a, w[i][e] & 0x7fffffffu);
            a = max(a, __shfl_xor_sync(kFull, a, X1));
            if (X2) a = max(a, __shfl_xor_sync(kFull, a, X2));
            ca[e] = a;
        }
    }
}

/* The max over this lane's 64 elements and lanes ^1, ^8: a 16x16 block. */
template <bool kBf>
__device__ __forceinline__ uint32_t block2d_amax_v3(const uint32_t (&w)[8][8])
{
    uint32_t a = 0;
    if (kBf) {
        /* the largest |x| of each half without masking every word: the
         * unsigned maximum of the raw halves is the largest-magnitude
         * negative one if there is any (its sign bit set), the signed
         * maximum the largest positive one if there is any, else the
         * largest-magnitude negative one; the larger of their magnitudes
         * is the largest magnitude (a NaN's included) */
        uint32_t u = w[0][0], s = w[0][0];
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int j = i == 0 ? 1 : 0; j < 4; j++) {
                u = __vmaxu2(u, w[i][j]);
                s = __vmaxs2(s, w[i][j]);
            }
        a = __vmaxu2(u & kAbs2, s & kAbs2);
        a = max(a << 16, a & 0xffff0000u);
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int e = 0; e < 8; e++) a = max(a, w[i][e] & 0x7fffffffu);
    }
    a = max(a, __shfl_xor_sync(kFull, a, 1));
    return max(a, __shfl_xor_sync(kFull, a, 8));
}

/* ---- v3 codes ----------------------------------------------------------- */

/* The sign bits of a row's 8 elements at the top of their nibbles: bits
 * 8k+3 (element 2k) and 8k+7 (element 2k+1). */
template <bool kBf>
__device__ __forceinline__ uint32_t fp4_signs_v3(const uint32_t (&r)[8])
{
    uint32_t ev, od; /* bytes whose top bit is the sign of elements 0, 2, 4, 6 / 1, 3, 5, 7 */
    if (kBf) {
        const uint32_t a = __byte_perm(r[0], r[1], 0x7351), b = __byte_perm(r[2], r[3], 0x7351);
        ev = __byte_perm(a, b, 0x5410);
        od = __byte_perm(a, b, 0x7632);
    } else {
        ev = __byte_perm(__byte_perm(r[0], r[2], 0x0073), __byte_perm(r[4], r[6], 0x0073), 0x5410);
        od = __byte_perm(__byte_perm(r[1], r[3], 0x0073), __byte_perm(r[5], r[7], 0x0073), 0x5410);
    }
    return ((ev >> 4) & 0x08080808u) | (od & 0x80808080u);
}

/* E2M1 magnitudes of a row's |x| * m[e], element e in nibble e. The low
 * byte of each sum is its code (< 8): pairs are joined by a multiply-add,
 * the four bytes by permutes. */
template <bool kBf, bool kClamp = true>
__device__ __forceinline__ uint32_t e2m1_row_v3(const uint32_t (&r)[8], const float (&m)[8])
{
    uint32_t f[8], p[4];
#pragma unroll
    for (int e = 0; e < 8; e++) { /* |x| is a free operand modifier of the multiply */
        const float y = fabsf(elem_v3<kBf>(r, e)) * m[e];
        f[e] = etp__qf_round_magic(kClamp ? fminf(y, 6.0f) : y, ETP__QF_MAGIC_E2M1);
    }
#pragma unroll
    for (int j = 0; j < 4; j++) p[j] = f[2 * j + 1] * 16u + f[2 * j];
    return __byte_perm(__byte_perm(p[0], p[1], 0x0040), __byte_perm(p[2], p[3], 0x0040), 0x5410);
}

/* w[r] nibble c becomes w[c] nibble r: 4x4 blocks of nibbles swap as 16-bit
 * halves, then 2x2 blocks as bytes, then single nibbles. */
__device__ __forceinline__ void transpose_nibbles_v3(uint32_t (&w)[8])
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t a = w[i], b = w[i + 4];
        w[i] = __byte_perm(a, b, 0x5410);
        w[i + 4] = __byte_perm(a, b, 0x7632);
    }
#pragma unroll
    for (int i = 0; i < 8; i += (i & 1) ? 3 : 1) { /* 0, 1, 4, 5 */
        const uint32_t a = w[i], b = w[i + 2];
        w[i] = __byte_perm(a, b, 0x6240);
        w[i + 2] = __byte_perm(a, b, 0x7351);
    }
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
        const uint32_t a = w[i], b = w[i + 1];
        w[i] = (a & 0x0f0f0f0fu) | ((b << 4) & 0xf0f0f0f0u);
        w[i + 1] = ((a >> 4) & 0x0f0f0f0fu) | (b & 0xf0f0f0f0u);
    }
}

/* ---- v3 stores ------------------------------------------------------------ */

__device__ __forceinline__ void st4_v3(uint8_t *d, uint32_t v, bool aligned)
{
    if (aligned) {
        *reinterpret_cast<uint32_t *>(d) = v;
        return;
    }
#pragma unroll
    for (int j = 0; j < 4; j++) d[j] = (uint8_t)(v >> (8 * j));
}

/* NVFP4 data of either copy, a matrix of `outer` rows of inner / 2 bytes
 * (rowwise [M, K/2], K % 16 = 0; columnwise [K, M/2], M % 16 = 0): the
 * thread's 8 words (8 codes each) into rows O..O+7 at element I. Whole and
 * aligned (the common case): 8 plain stores, no per-row test. */
__device__ __forceinline__ void nv_out_v3(void *data, size_t outer, size_t inner, size_t O, size_t I,
                                          const uint32_t (&w)[8])
{
    const size_t ld = inner / 2;
    if (I >= inner) return;
    uint8_t *d = static_cast<uint8_t *>(data) + O * ld + I / 2;
    const bool al = (reinterpret_cast<uintptr_t>(data) & 3u) == 0;
    if (O + 8 <= outer && al) {
#pragma unroll
        for (int i = 0; i < 8; i++) *reinterpret_cast<uint32_t *>(d + i * ld) = w[i];
        return;
    }
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (O + i < outer) st4_v3(d + i * ld, w[i], al);
}

/* ---- NVFP4 data staged in shared memory ----------------------------------
 *
 * A thread's NVFP4 words are 4 bytes of 8 different output rows: stored
 * straight to memory, a warp's columnwise store fills half sectors of 8
 * rows (its 32 input rows are 16 bytes of each output row) and a rowwise
 * one 32-byte pieces of 4 rows. Measured on an H200 (256 MiB, the kernel
 * with the columnwise stores left out): those stores alone halved the
 * kernel's speed, where the conversion (left out the same way) cost 5%.
 * So a whole tile's columnwise codes (128 rows of 64 bytes) go to shared
 * memory first and leave, after the tile's barrier, as 16-byte stores, 4
 * threads to an output row's 64 contiguous bytes. The 16-byte chunks of a
 * staged row are XOR-swizzled by (row / 8) % 4, which halves the bank
 * conflicts of the threads' 4-byte writes (8 rows apart) and keeps the
 * 16-byte reads conflict-free. The rowwise codes were staged the same way
 * until the sixth session; stored straight from registers (whole sectors
 * already) they take 8 global stores a thread and tile where staging took
 * 8 shared stores, 2 shared loads and 2 global stores, the last four after
 * the barrier, on SMs that bound the BF16 kernel: 0.836 -> 0.873 of a copy
 * with swizzled scales (H200, 8 x [8192, 4096]), 1% less with row-major
 * ones. */
constexpr int kStageRowBytes = kTileV3 / 2;                  /* 64 */
constexpr int kStageBytes = kTileV3 * kStageRowBytes;         /* 8 KiB: one tile's columnwise codes */

__device__ __forceinline__ int stage_off_v3(int row, int chunk)
{
    return row * kStageRowBytes + ((chunk ^ ((row >> 3) & 3)) << 4);
}

/* The thread's 8 words into rows O..O+7 of a direction's stage (tile
 * coordinates), at word I / 8 of each. */
__device__ __forceinline__ void stage_put_v3(uint8_t *stage, int O, int I, const uint32_t (&w)[8])
{
    const int word = I >> 3;
#pragma unroll
    for (int i = 0; i < 8; i++)
        *reinterpret_cast<uint32_t *>(stage + stage_off_v3(O + i, word >> 2) + 4 * (word & 3)) = w[i];
}

/* A staged direction to memory: output rows O0..O0+127 of `ld` bytes, at
 * byte I0 of each (both 16-byte aligned: the launcher's check). */
__device__ __forceinline__ void stage_out_v3(const uint8_t *stage, void *data, size_t ld, size_t O0, size_t I0,
                                             int tid)
{
#pragma unroll
    for (int pass = 0; pass < kStageBytes / (16 * kThreads); pass++) {
        const int idx = tid + pass * kThreads, row = idx >> 2, c = idx & 3;
        const uint4 v = *reinterpret_cast<const uint4 *>(stage + stage_off_v3(row, c));
        *reinterpret_cast<uint4 *>(static_cast<uint8_t *>(data) + (O0 + row) * ld + I0 + 16 * c) = v;
    }
}

/* Row i's codes of columns C..C+7 (rowwise) to memory, and column c's of
 * rows R..R+7 (columnwise, after the nibble transpose) to the stage when
 * the tile is staged (non-null), else to memory. */
__device__ __forceinline__ void nv_rows_out_v3(const etp__qb_tensor_t &t, size_t R, size_t C,
                                               const uint32_t (&w)[8])
{
    if (ETP__CAST_LEAVE_OUT(4)) return;
    nv_out_v3(t.row_data, t.rows, t.cols, R, C, w);
}

__device__ __forceinline__ void nv_cols_out_v3(const etp__qb_tensor_t &t, size_t R, size_t C,
                                               const uint32_t (&w)[8], uint8_t *stage)
{
    if (ETP__CAST_LEAVE_OUT(2)) return;
    if (stage)
        stage_put_v3(stage, (int)(C % kTileV3), (int)(R % kTileV3), w);
    else
        nv_out_v3(t.col_data, t.cols, t.rows, C, R, w);
}

/* MXFP8 (either copy, [M, K]): the thread's 8 x 8 codes are whole and
 * 8-byte aligned in every row. */
__device__ __forceinline__ bool fp8_whole_v3(const void *data, const etp__qb_tensor_t &t, size_t R, size_t C)
{
    return R + 8 <= t.rows && C + 8 <= t.cols && t.cols % 8 == 0 &&
           (reinterpret_cast<uintptr_t>(data) & 7u) == 0;
}

/* Row i's 8 codes of columns C..C+7; whole: fp8_whole_v3. */
__device__ __forceinline__ void fp8_out_v3(void *data, const etp__qb_tensor_t &t, size_t R, size_t C, int i,
                                           uint32_t o0, uint32_t o1, bool whole)
{
    const size_t M = t.rows, K = t.cols;
    uint8_t *d = static_cast<uint8_t *>(data) + (R + i) * K + C;
    if (whole) {
        *reinterpret_cast<uint2 *>(d) = make_uint2(o0, o1);
        return;
    }
    if (R + i >= M || C >= K) return;
    if (C + 8 <= K && (reinterpret_cast<uintptr_t>(d) & 7u) == 0) {
        *reinterpret_cast<uint2 *>(d) = make_uint2(o0, o1);
        return;
    }
    const size_t n = K - C;
#pragma unroll
    for (int j = 0; j < 8; j++)
        if ((size_t)j < n) d[j] = (uint8_t)((j < 4 ? o0 : o1) >> (8 * (j & 3)));
}

/* ---- v3 NVFP4 ------------------------------------------------------------- */

/* The per-element path (a NaN in the warp's blocks): v2's conversions,
 * amaxes that skip NaNs, every scale computed where it is used. */
template <bool kBf>
__device__ __noinline__ void nv_tile_safe_v3(const etp__qbatch_t &b, const etp__qb_tensor_t &t, GeoV3 g,
                                             size_t R, size_t C, const SubV3 sub, float s_enc_6, float s_dec,
                                             TileScales &st, uint8_t *cstage)
{
    const uint32_t (&w)[8][8] = sub.w;
    float mr[8], mc[8];
    uint8_t sr[8], sc[8];
    if (b.block2d) {
        uint32_t a = 0;
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int e = 0; e < 8; e++) a = amax_bits(a, absbits_v3<kBf>(w[i], e));
        a = max(a, __shfl_xor_sync(kFull, a, 1));
        a = max(a, __shfl_xor_sync(kFull, a, 8));
        const uint8_t s = etp__qf_nvfp4_block_scale(__uint_as_float(a), s_enc_6);
        const float m = etp__qf_nvfp4_multiplier(s, s_dec);
#pragma unroll
        for (int x = 0; x < 8; x++) {
            mr[x] = mc[x] = m;
            sr[x] = sc[x] = s;
        }
    } else {
        uint32_t ra[8], ca[8];
#pragma unroll
        for (int x = 0; x < 8; x++) ra[x] = ca[x] = 0;
#pragma unroll
        for (int i = 0; i < 8; i++)
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const uint32_t v = absbits_v3<kBf>(w[i], e);
                ra[i] = amax_bits(ra[i], v);
                ca[e] = amax_bits(ca[e], v);
            }
#pragma unroll
        for (int x = 0; x < 8; x++) {
            ra[x] = max(ra[x], __shfl_xor_sync(kFull, ra[x], 1));
            ca[x] = max(ca[x], __shfl_xor_sync(kFull, ca[x], 8));
            sr[x] = etp__qf_nvfp4_block_scale(__uint_as_float(ra[x]), s_enc_6);
            sc[x] = etp__qf_nvfp4_block_scale(__uint_as_float(ca[x]), s_enc_6);
            mr[x] = etp__qf_nvfp4_multiplier(sr[x], s_dec);
            mc[x] = etp__qf_nvfp4_multiplier(sc[x], s_dec);
        }
    }
    if (t.row_data) {
        uint32_t o[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            o[i] = 0;
#pragma unroll
            for (int e = 0; e < 8; e++)
                o[i] |= (uint32_t)etp__qf_e2m1_rne_satfinite_fast(elem_v3<kBf>(w[i], e) * mr[i]) << (4 * e);
        }
        nv_rows_out_v3(t, R, C, o);
        if (!(g.cg & 1))
#pragma unroll
            for (int x = 0; x < 8; x++) st[0][g.tc / 16][g.tr + x] = sr[x];
    }
    if (t.col_data) {
        uint32_t o[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            o[i] = 0;
#pragma unroll
            for (int e = 0; e < 8; e++)
                o[i] |= (uint32_t)etp__qf_e2m1_rne_satfinite_fast(elem_v3<kBf>(w[i], e) * mc[e]) << (4 * e);
        }
        transpose_nibbles_v3(o);
        nv_cols_out_v3(t, R, C, o, cstage);
        if (!(g.rg & 1))
#pragma unroll
            for (int x = 0; x < 8; x++) st[1][g.tr / 16][g.tc + x] = sc[x];
    }
}

/* The multiplier of a block with amax bits a (etp__qf_nvfp4_multiplier of
 * etp__qf_nvfp4_block_scale), and the scale byte in *s. */
__device__ __forceinline__ float nv_mult_v3(uint32_t a, float s_enc_6, float s_dec, uint8_t *s)
{
    float val;
    *s = etp__qf_nvfp4_block_scale_magic(__uint_as_float(a), s_enc_6, &val);
    const float m = 1.0f / (val * s_dec);
    return m < ETP__QF_FLT_MAX ? m : ETP__QF_FLT_MAX;
}

/* prefetch() is called once every element has been read (by the amax):
 * it may then overwrite the shared memory the elements came from. k2d:
 * the batch has 16x16 blocks (no 1D code compiled). */
template <bool kBf, bool k2d, typename F>
__device__ __forceinline__ void nv_tile_v3(const etp__qbatch_t &b, const etp__qb_tensor_t &t, uint32_t fl,
                                           const GeoV3 &g, size_t R, size_t C, const uint32_t (&w)[8][8], float s_enc_6,
                                           float s_dec, TileScales &st, uint8_t *cstage,
                                           F &&prefetch)
{
    const bool rowd = (fl & kFlRow) != 0, cold = (fl & kFlCol) != 0;
    if (k2d || b.block2d) {
        const uint32_t a = block2d_amax_v3<kBf>(w);
        prefetch();
        if (__any_sync(kFull, a > 0x7f800000u)) {
            nv_tile_safe_v3<kBf>(b, t, g, R, C, sub_v3(w), s_enc_6, s_dec, st, cstage);
            return;
        }
        uint8_t s;
        const float m = nv_mult_v3(a, s_enc_6, s_dec, &s);
        const float mm[8] = {m, m, m, m, m, m, m, m};
        uint32_t o[8]; /* one set of codes for both copies */
        /* Only a product of 7 or more rounds past 6 (or leaves the magic
         * addition's range: ETP__QF_E2M1_UNCLAMPED_BELOW), and the block's
         * largest product bounds every element's (the multiply is
         * monotonic): most warps skip the clamp, 64 instructions a thread
         * and 5% of the kernel's time once its stores were staged (H200,
         * 256 MiB). */
        if (ETP__CAST_LEAVE_OUT(1)) {
#pragma unroll
            for (int i = 0; i < 8; i++) o[i] = w[i][0] ^ w[i][1] ^ w[i][2] ^ w[i][3] ^ __float_as_uint(m);
        } else if (!ETP__CAST_LEAVE_OUT(16) &&
                   __any_sync(kFull, !(__uint_as_float(a) * m < ETP__QF_E2M1_UNCLAMPED_BELOW))) {
#pragma unroll
            for (int i = 0; i < 8; i++) o[i] = e2m1_row_v3<kBf, true>(w[i], mm) | fp4_signs_v3<kBf>(w[i]);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) o[i] = e2m1_row_v3<kBf, false>(w[i], mm) | fp4_signs_v3<kBf>(w[i]);
        }
        const unsigned long long s8 = 0x0101010101010101ull * s;
        if (rowd) {
            nv_rows_out_v3(t, R, C, o);
            if (!(g.cg & 1)) *reinterpret_cast<unsigned long long *>(&st[0][g.tc / 16][g.tr]) = s8;
        }
        if (cold) {
            transpose_nibbles_v3(o);
            nv_cols_out_v3(t, R, C, o, cstage);
            if (!(g.rg & 1)) *reinterpret_cast<unsigned long long *>(&st[1][g.tr / 16][g.tc]) = s8;
        }
        return;
    }
    /* 1D: the two lanes of a block split its 8 rows (columns), each computes
     * 4 scales and hands the multipliers to the other */
    const int hr = g.cg & 1, hc = g.rg & 1;
    uint32_t bad = 0, sr = 0, sc = 0;
    float mr[8], mc[8];
    if (rowd) {
        uint32_t ra[8];
        rows_amax_v3<kBf, 1, 0>(w, ra);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const uint32_t a = hr ? ra[4 + q] : ra[q];
            bad |= a > 0x7f800000u;
            uint8_t s;
            const float m = nv_mult_v3(a, s_enc_6, s_dec, &s);
            sr |= (uint32_t)s << (8 * q);
            const float o = __shfl_xor_sync(kFull, m, 1);
            mr[q] = hr ? o : m;
            mr[4 + q] = hr ? m : o;
        }
    }
    if (cold) {
        uint32_t ca[8];
        cols_amax_v3<kBf, 8, 0>(w, ca);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const uint32_t a = hc ? ca[4 + q] : ca[q];
            bad |= a > 0x7f800000u;
            uint8_t s;
            const float m = nv_mult_v3(a, s_enc_6, s_dec, &s);
            sc |= (uint32_t)s << (8 * q);
            const float o = __shfl_xor_sync(kFull, m, 8);
            mc[q] = hc ? o : m;
            mc[4 + q] = hc ? m : o;
        }
    }
    prefetch();
    if (__any_sync(kFull, bad != 0)) {
        nv_tile_safe_v3<kBf>(b, t, g, R, C, sub_v3(w), s_enc_6, s_dec, st, cstage);
        return;
    }
    uint32_t sg[8];
#pragma unroll
    for (int i = 0; i < 8; i++) sg[i] = fp4_signs_v3<kBf>(w[i]);
    if (rowd) {
        uint32_t o[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const float mm[8] = {mr[i], mr[i], mr[i], mr[i], mr[i], mr[i], mr[i], mr[i]};
            o[i] = e2m1_row_v3<kBf>(w[i], mm) | sg[i];
        }
        nv_rows_out_v3(t, R, C, o);
        *reinterpret_cast<uint32_t *>(&st[0][g.tc / 16][g.tr + 4 * hr]) = sr;
    }
    if (cold) {
        uint32_t o[8];
#pragma unroll
        for (int i = 0; i < 8; i++) o[i] = e2m1_row_v3<kBf>(w[i], mc) | sg[i];
        transpose_nibbles_v3(o);
        nv_cols_out_v3(t, R, C, o, cstage);
        *reinterpret_cast<uint32_t *>(&st[1][g.tr / 16][g.tc + 4 * hc]) = sc;
    }
}

/* ---- v3 MXFP8 ------------------------------------------------------------- */

template <bool kBf, bool kWide>
__device__ __noinline__ void mx_tile_safe_v3(const etp__qbatch_t &b, const etp__qb_tensor_t &t, GeoV3 g,
                                             size_t R, size_t C, const SubV3 sub, TileScales &st)
{
    const uint32_t (&w)[8][8] = sub.w;
    const int e5m2 = (int)b.e5m2;
    const float inv = etp__qf_mxfp8_inv_max(e5m2);
    uint32_t ra[8], ca[8];
#pragma unroll
    for (int x = 0; x < 8; x++) ra[x] = ca[x] = 0;
#pragma unroll
    for (int i = 0; i < 8; i++)
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const uint32_t v = absbits_v3<kBf>(w[i], e);
            ra[i] = amax_bits(ra[i], v);
            ca[e] = amax_bits(ca[e], v);
        }
    if (t.row_data) {
        uint8_t er[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            ra[i] = max(ra[i], __shfl_xor_sync(kFull, ra[i], 1));
            ra[i] = max(ra[i], __shfl_xor_sync(kFull, ra[i], 2));
            er[i] = etp__qf_mxfp8_scale(__uint_as_float(ra[i]), inv);
            const float s = etp__qf_mxfp8_multiplier(er[i]);
            uint32_t o[2] = {0u, 0u};
#pragma unroll
            for (int e = 0; e < 8; e++)
                o[e / 4] |= (uint32_t)etp__qf_mxfp8_encode_fast(elem_v3<kBf>(w[i], e), s, e5m2) << (8 * (e & 3));
            fp8_out_v3(t.row_data, t, R, C, i, o[0], o[1], false);
        }
        if (!(g.cg & 3))
#pragma unroll
            for (int x = 0; x < 8; x++) *mx_st_row<kWide>(st, g.tc, g.tr + x) = er[x];
    }
    if (t.col_data) {
        uint8_t ec[8];
        float s[8];
#pragma unroll
        for (int e = 0; e < 8; e++) {
            ca[e] = max(ca[e], __shfl_xor_sync(kFull, ca[e], 8));
            ca[e] = max(ca[e], __shfl_xor_sync(kFull, ca[e], 16));
            ec[e] = etp__qf_mxfp8_scale(__uint_as_float(ca[e]), inv);
            s[e] = etp__qf_mxfp8_multiplier(ec[e]);
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            uint32_t o[2] = {0u, 0u};
#pragma unroll
            for (int e = 0; e < 8; e++)
                o[e / 4] |= (uint32_t)etp__qf_mxfp8_encode_fast(elem_v3<kBf>(w[i], e), s[e], e5m2)
                            << (8 * (e & 3));
            fp8_out_v3(t.col_data, t, R, C, i, o[0], o[1], false);
        }
        if (g.rg == 0)
#pragma unroll
            for (int x = 0; x < 8; x++) *mx_st_col<kWide>(st, g.wr, g.tc + x) = ec[x];
    }
}

/* The multiplier of a block with amax bits a, its scale byte in *e; *bad
 * set when an element could pass the format's largest value (NaN or
 * infinite amax: the magic conversion would be out of its range). */
__device__ __forceinline__ float mx_mult_v3(uint32_t a, float inv, float top, uint32_t *e, uint32_t *bad)
{
    const float af = __uint_as_float(a);
    const uint8_t c = etp__qf_mxfp8_scale(af, inv);
    const float s = etp__qf_mxfp8_multiplier(c);
    *bad |= !(af * s <= top);
    *e = c;
    return s;
}

/* One direction's MXFP8 scales of the thread's 8 rows (columns), amaxes
 * a[8]: the block's lane q (of 4: lanes base + q * stride) computes those
 * of its rows 2q and 2q + 1 (their E8M0 bytes into *e, bytes 0 and 1) and
 * all 8 multipliers come back by shuffles. */
__device__ __forceinline__ void mx_scales_v3(const uint32_t (&a)[8], int q, int base, int stride, float inv,
                                             float top, float (&m)[8], uint32_t *e, uint32_t *bad)
{
    float s[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint32_t x = q == 0 ? a[h] : q == 1 ? a[2 + h] : q == 2 ? a[4 + h] : a[6 + h];
        uint32_t c;
        s[h] = mx_mult_v3(x, inv, top, &c, bad);
        *e |= c << (8 * h);
    }
#pragma unroll
    for (int l = 0; l < 4; l++)
#pragma unroll
        for (int h = 0; h < 2; h++) m[2 * l + h] = __shfl_sync(kFull, s[h], base | (l * stride));
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ < 890
/* Bytes 0-3 of a word from four values (their low bytes). */
__device__ __forceinline__ uint32_t pack4_v3(uint32_t a, uint32_t b, uint32_t c, uint32_t d)
{
    return __byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, d, 0x0040), 0x5410);
}
#endif

/* Four FP8 codes (element 0 in the low byte) of FP32 values that are
 * finite and at most the format's largest value: the hardware's
 * round-to-nearest-even conversion (sm_89 and later), which is the
 * reference's rne_satfinite there, signs and subnormals included. */
template <bool kE5>
__device__ __forceinline__ uint32_t fp8x4_v3(float a, float b, float c, float d)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    uint32_t o;
    if (kE5)
        asm("{\n\t.reg .b16 lo, hi;\n\t"
            "cvt.rn.satfinite.e5m2x2.f32 lo, %2, %1;\n\t"
            "cvt.rn.satfinite.e5m2x2.f32 hi, %4, %3;\n\t"
            "mov.b32 %0, {lo, hi};\n\t}"
            : "=r"(o)
            : "f"(a), "f"(b), "f"(c), "f"(d));
    else
        asm("{\n\t.reg .b16 lo, hi;\n\t"
            "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n\t"
            "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n\t"
            "mov.b32 %0, {lo, hi};\n\t}"
            : "=r"(o)
            : "f"(a), "f"(b), "f"(c), "f"(d));
    return o;
#else
    const int e5 = kE5 ? 1 : 0;
    return pack4_v3(etp__qf_mxfp8_encode_fast(a, 1.0f, e5), etp__qf_mxfp8_encode_fast(b, 1.0f, e5),
                    etp__qf_mxfp8_encode_fast(c, 1.0f, e5), etp__qf_mxfp8_encode_fast(d, 1.0f, e5));
#endif
}

/* Row i's 8 codes of x * s[e] into the tensor (either copy). */
template <bool kBf, bool kE5>
__device__ __forceinline__ void mx_codes_out_v3(void *data, const etp__qb_tensor_t &t, size_t R, size_t C,
                                                const uint32_t (&w)[8][8], const float (&sr)[8],
                                                const float (&sc)[8], bool col)
{
    const bool whole = fp8_whole_v3(data, t, R, C);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float f[8];
#pragma unroll
        for (int e = 0; e < 8; e++) f[e] = elem_v3<kBf>(w[i], e) * (col ? sc[e] : sr[i]);
        fp8_out_v3(data, t, R, C, i, fp8x4_v3<kE5>(f[0], f[1], f[2], f[3]),
                   fp8x4_v3<kE5>(f[4], f[5], f[6], f[7]), whole);
    }
}

template <bool kBf, bool kWide, typename F>
__device__ __forceinline__ void mx_tile_v3(const etp__qbatch_t &b, const etp__qb_tensor_t &t, uint32_t fl,
                                           const GeoV3 &g, size_t R, size_t C, const uint32_t (&w)[8][8], TileScales &st,
                                           F &&prefetch)
{
    const bool rowd = (fl & kFlRow) != 0, cold = (fl & kFlCol) != 0;
    const int e5m2 = (int)b.e5m2;
    const float inv = etp__qf_mxfp8_inv_max(e5m2), top = e5m2 ? 57344.0f : 448.0f;
    /* the 4 lanes of a block take 2 of its 8 rows (columns) each for the scales */
    const int qr = g.cg & 3, qc = g.rg;
    uint32_t bad = 0, er = 0, ec = 0;
    float sr[8], sc[8];
    if (rowd) {
        uint32_t ra[8];
        rows_amax_v3<kBf, 1, 2>(w, ra);
        mx_scales_v3(ra, qr, g.lane & ~3, 1, inv, top, sr, &er, &bad);
    }
    if (cold) {
        uint32_t ca[8];
        cols_amax_v3<kBf, 8, 16>(w, ca);
        mx_scales_v3(ca, qc, g.lane & 7, 8, inv, top, sc, &ec, &bad);
    }
    prefetch();
    if (__any_sync(kFull, bad != 0)) {
        mx_tile_safe_v3<kBf, kWide>(b, t, g, R, C, sub_v3(w), st);
        return;
    }
    if (rowd) {
        if (!ETP__CAST_LEAVE_OUT(4)) {
            if (e5m2)
                mx_codes_out_v3<kBf, true>(t.row_data, t, R, C, w, sr, sc, false);
            else
                mx_codes_out_v3<kBf, false>(t.row_data, t, R, C, w, sr, sc, false);
        }
        *reinterpret_cast<uint16_t *>(mx_st_row<kWide>(st, g.tc, g.tr + 2 * qr)) = (uint16_t)er;
    }
    if (cold) {
        if (!ETP__CAST_LEAVE_OUT(2)) {
            if (e5m2)
                mx_codes_out_v3<kBf, true>(t.col_data, t, R, C, w, sr, sc, true);
            else
                mx_codes_out_v3<kBf, false>(t.col_data, t, R, C, w, sr, sc, true);
        }
        *reinterpret_cast<uint16_t *>(mx_st_col<kWide>(st, g.wr, g.tc + 2 * qc)) = (uint16_t)ec;
    }
}

/* ---- v3 scales out ------------------------------------------------------- */

__device__ __forceinline__ void scale_word_out_v3(void *base, size_t off, uint32_t v)
{
    uint8_t *d = static_cast<uint8_t *>(base) + off;
    if (ETP__CAST_LEAVE_OUT(32)) { /* everything but the store (a store kept for a value never seen) */
        if (v == 0x9e3779b9u) *static_cast<volatile uint8_t *>(base) = 0;
        return;
    }
    st4_v3(d, v, (reinterpret_cast<uintptr_t>(d) & 3u) == 0);
}

/* The row (column) of a tile, and the word of 4 blocks in it, whose scale
 * entries this thread writes. */
struct ScaleSlotV3 {
    int o, gi;
};

template <bool kNv>
__device__ __forceinline__ ScaleSlotV3 scale_slot_v3(bool swz, int tid)
{
    ScaleSlotV3 q;
    if (swz) { /* a 512-byte tile: word x holds rows x / 4 + 32 (x % 4) */
        const int x = tid & 127;
        q.gi = tid >> 7;
        q.o = (x >> 2) | ((x & 3) << 5);
    } else {
        q.o = kNv ? tid >> 1 : tid;
        q.gi = kNv ? tid & 1 : 0;
    }
    return q;
}

/* A word of 4 scale bytes st[d][g4 + j][o], j = 0..3 (byte j at bits 8j). */
__device__ __forceinline__ uint32_t scale_word_v3(const TileScales &st, int d, int g4, int o)
{
    return (uint32_t)st[d][g4][o] | (uint32_t)st[d][g4 + 1][o] << 8 | (uint32_t)st[d][g4 + 2][o] << 16 |
           (uint32_t)st[d][g4 + 3][o] << 24;
}

/* A wide MXFP8 tile's scales, unswizzled, padding included (zeros):
 * rowwise 16 bytes of each of its 32 rows (4 threads a row), columnwise
 * the 512 bytes of its 32-row band's scale row, 4 bytes a thread. */
__device__ __forceinline__ void mx_wide_scales_out_v3(const etp__qb_tensor_t &t, uint32_t fl, size_t r0, size_t c0,
                                                      TileScales &st)
{
    const int tid = threadIdx.x;
    const size_t M = t.rows, K = t.cols;
    if ((fl & kFlRow) && tid < 128) {
        const etp__qf_scale_shape_t ss = etp__qf_mxfp8_row_scales(M, K);
        const int o = tid >> 2, gi = tid & 3; /* row o, blocks 4 gi .. 4 gi + 3 */
        const size_t r = r0 + o, kb0 = c0 / 32, kb = kb0 + 4 * gi, kbs = K / 32;
        const uint8_t *e = mx_st_row<true>(st, 32 * 4 * gi, o); /* + 32 j: block 4 gi + j */
        if (r0 + kWideRows <= M && kb0 + 16 <= kbs) {
            const uint32_t v = (uint32_t)e[0] | (uint32_t)e[32] << 8 | (uint32_t)e[64] << 16 | (uint32_t)e[96] << 24;
            scale_word_out_v3(t.row_scales, etp__qf_scale_offset(r, kb, ss.cols, 0), v);
        } else if (r < ss.rows && kb < ss.cols) {
            uint32_t v = 0;
#pragma unroll
            for (int j = 0; j < 4; j++)
                if (r < M && kb + j < kbs) v |= (uint32_t)e[32 * j] << (8 * j);
            scale_word_out_v3(t.row_scales, etp__qf_scale_offset(r, kb, ss.cols, 0), v);
        }
    }
    if ((fl & kFlCol) && tid < 128) {
        const etp__qf_scale_shape_t ss = etp__qf_mxfp8_col_scales(M, K);
        const size_t mb = r0 / 32, kk = c0 + 4 * tid;
        if (mb < ss.rows && kk < ss.cols) {
            const uint8_t *e = mx_st_col<true>(st, 0, 4 * tid);
            uint32_t v;
            if (mb < M / 32 && kk + 4 <= K) {
                v = *reinterpret_cast<const uint32_t *>(e);
            } else {
                v = 0;
#pragma unroll
                for (int y = 0; y < 4; y++)
                    if (mb < M / 32 && kk + y < K) v |= (uint32_t)e[y] << (8 * y);
            }
            scale_word_out_v3(t.col_scales, etp__qf_mxfp8_col_scale_offset(mb, kk, ss, 0), v);
        }
    }
}

/* The tile's scale entries, padding included (zeros), as 4-byte words of 4
 * consecutive blocks, one word per thread, consecutive threads on
 * consecutive words of the output. A tile wholly inside the tensor takes
 * its words with no per-entry test. */
template <bool kNv, bool kUnswz = false>
__device__ __forceinline__ void scales_out_v3(const etp__qbatch_t &b, const etp__qb_tensor_t &t, uint32_t fl,
                                              size_t r0, size_t c0, const TileScales &st, uint8_t *rimg, int rimg_off,
                                              bool cols = true)
{
    /* from the special register, which the compiler re-reads at will: a
     * value computed once for the kernel and kept was spilled instead */
    const int tid = threadIdx.x;
    const bool swz = !kUnswz && b.swizzle; /* kUnswz: the launcher's guarantee (the cluster kernel) */
    const ScaleSlotV3 q = scale_slot_v3<kNv>(swz, tid);
    const size_t M = t.rows, K = t.cols;
    constexpr bool nv = kNv;
    constexpr int groups = nv ? 2 : 1; /* 4-block words per row (column) of a tile */
    const int o = q.o, gi = q.gi;
    /* compact (unswizzled 16x16 NVFP4): of a whole tile's 16 identical rows
     * (columns) only the last, which the expansion copies to the others */
    const bool skip = kNv && !swz && b.compact && (o & 15) != 15;
    if ((fl & kFlRow) && tid < 128 * groups) {
        if (rimg) { /* a whole run's: to its image, leaving with the run */
            *reinterpret_cast<uint32_t *>(rimg + o * kRunRowBytes + rimg_off + 4 * gi) =
                scale_word_v3(st, 0, 4 * gi, o);
        } else {
            const etp__qf_scale_shape_t ss = nv ? etp__qf_nvfp4_row_scales(M, K) : etp__qf_mxfp8_row_scales(M, K);
            const size_t r = r0 + o, kb0 = nv ? c0 / 16 : c0 / 32, kb = kb0 + 4 * gi, kbs = nv ? K / 16 : K / 32;
            if (r0 + kTileV3 <= M && kb0 + 4 * groups <= kbs) {
                if (!(skip && (fl & kFlRimg)))
                    scale_word_out_v3(t.row_scales, etp__qf_scale_offset(r, kb, ss.cols, swz),
                                      scale_word_v3(st, 0, 4 * gi, o));
            } else if (r < ss.rows && kb < ss.cols) {
                uint32_t v = 0;
#pragma unroll
                for (int j = 0; j < 4; j++)
                    if (r < M && kb + j < kbs) v |= (uint32_t)st[0][4 * gi + j][o] << (8 * j);
                scale_word_out_v3(t.row_scales, etp__qf_scale_offset(r, kb, ss.cols, swz), v);
            }
        }
    }
    if (!(fl & kFlCol) || !cols) return;
    if (nv) { /* [column, M-block], like rowwise */
        const etp__qf_scale_shape_t ss = etp__qf_nvfp4_col_scales(M, K);
        const size_t j = c0 + o, mb0 = r0 / 16, mb = mb0 + 4 * gi;
        if (c0 + kTileV3 <= K && mb0 + 8 <= M / 16) {
            if (!(skip && (fl & kFlMerge)))
                scale_word_out_v3(t.col_scales, etp__qf_scale_offset(j, mb, ss.cols, swz),
                                  scale_word_v3(st, 1, 4 * gi, o));
        } else if (j < ss.rows && mb < ss.cols) {
            uint32_t v = 0;
#pragma unroll
            for (int x = 0; x < 4; x++)
                if (j < K && mb + x < M / 16) v |= (uint32_t)st[1][4 * gi + x][o] << (8 * x);
            scale_word_out_v3(t.col_scales, etp__qf_scale_offset(j, mb, ss.cols, swz), v);
        }
        return;
    }
    /* MXFP8 in square tiles has swizzled scales (row-major ones take wide
     * tiles, mx_wide_scales_out_v3): the GEMM's view, column-major 4
     * M-blocks of a column */
    if (tid >= 128) return;
    const etp__qf_scale_shape_t ss = etp__qf_mxfp8_col_scales(M, K);
    const size_t mb0 = r0 / 32, kk = c0 + o;
    if (mb0 < ss.rows && kk < ss.cols) {
        uint32_t v = 0;
#pragma unroll
        for (int x = 0; x < 4; x++)
            if (kk < K && mb0 + x < M / 32) v |= (uint32_t)st[1][x][o] << (8 * x);
        scale_word_out_v3(t.col_scales, etp__qf_mxfp8_col_scale_offset(mb0, kk, ss, 1), v);
    }
}

/* ---- v3 kernel ------------------------------------------------------------ */

/* A whole run's rowwise scales (kRunRowBytes of each of 128 rows, from
 * row r0 and block kb0 of a [rows, ld] scale matrix; 16-byte aligned: the
 * kernel's check) to memory, 16 bytes a thread. */
__device__ __forceinline__ void run_out_v3(const uint8_t *rimg, void *scales, size_t ld, size_t r0, size_t kb0,
                                           int tid, bool compact)
{
    static_assert(kTileV3 * kRunRowBytes == 16 * kThreads, "one 16-byte piece a thread");
    const int row = tid / (kRunRowBytes / 16), h = tid % (kRunRowBytes / 16);
    if (compact && (row & 15) != 15) return; /* the expansion's (16x16 blocks) */
    const uint4 v = *reinterpret_cast<const uint4 *>(rimg + row * kRunRowBytes + 16 * h);
    if (ETP__CAST_LEAVE_OUT(32)) {
        if (v.x == 0x9e3779b9u) *static_cast<volatile uint8_t *>(scales) = 0;
        return;
    }
    *reinterpret_cast<uint4 *>(static_cast<uint8_t *>(scales) + (r0 + row) * ld + kb0 + 16 * h) = v;
}

/* ---- v3 clusters: a band's columnwise scales in larger pieces -------------
 *
 * NVFP4 16x16 scales in the row-major layout: a tile's columnwise scales are
 * 8 bytes of each of 128 scale rows, a quarter of a 32-byte sector that the
 * three tiles below it complete (docs/PERF.md, seventh session: those
 * pieces are the whole gap to the swizzled layout). A cluster of kBand
 * blocks converts the kBand tiles of a band (kBand tile rows, the same
 * columns) at the same time, in the grid-stride order of runs that keeps
 * neighbouring tiles' outputs together (DESIGN.md, tile order). With 16x16
 * blocks a tile's columnwise scales are only 8 x 8 distinct bytes (16 scale
 * rows repeat each), so every block sends its 64 through distributed shared
 * memory (st.async, counted by the receiver's mbarrier) to the blocks that
 * write the band's scale rows of those columns (block i: tile columns
 * kBandCols i ..), and each block writes its rows' kBand * 8 bytes as
 * 16-byte stores. kBand = 2 (half sectors) measured faster than 4 (whole
 * ones) on an H200: clusters of 4 do not fill every SM (62 of 66 fit, the
 * GPCs' slots not being multiples of 4), clusters of 2 do (docs/PERF.md,
 * eighth session). */
#ifdef ETP_QUANT_V3_BAND
constexpr uint32_t kBand = ETP_QUANT_V3_BAND; /* a measuring build's (2, 4 or 8) */
#else
constexpr uint32_t kBand = 2;
#endif
constexpr int kBandCols = kTileV3 / kBand;         /* the tile columns whose scale rows a block writes */
constexpr int kBandGroups = kBandCols / 16;        /* their 16-column groups */
constexpr int kBandPieces = kBand * 8 / 16;        /* 16-byte pieces of a band's scale row */
constexpr int kCimgBytes = 64; /* a parity's: [column group of the block][member][M-block] */
static_assert(kBandGroups * kBand * 8 == kCimgBytes && kBandPieces * kBandCols == 64, "64 pieces a tile");

/* The block's tile row in its cluster's band (read again where it is
 * used: a value kept across the tile loop would take a register the loop
 * has none of). */
__device__ __forceinline__ uint32_t band_member_v3()
{
    return blockIdx.x % kBand;
}

/* The cluster's barrier in its two halves, relaxed: a block arrives once
 * it has read the previous tile's pieces and sent this tile's, and waits a
 * tile later, before it sends into buffers the others may still read, so
 * the blocks of a cluster may drift a tile apart. (The first version, a
 * whole barrier with release semantics each tile, which compiles to a
 * fence on all the thread's global stores, with the merge's state held in
 * registers across the tile, ran 7-10% slower than no clusters at all.)
 * The bytes themselves are ordered by the receiver's mbarrier. Never
 * launched in clusters below sm_90 (etp__cuda_quant_cluster_fit). */
__device__ __forceinline__ void cluster_arrive_v3()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
#endif
}

/* The whole barrier with release semantics, once, after the mbarriers'
 * initialization. */
__device__ __forceinline__ void cluster_sync_v3()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\n"
                 "barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}

__device__ __forceinline__ unsigned smem_u32_v3(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void mbar_init_v3(uint64_t *bar)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32_v3(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

/* The owner's one arrival of a phase, expecting `bytes` from st.async. */
__device__ __forceinline__ void mbar_expect_v3(uint64_t *bar, uint32_t bytes)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32_v3(bar)), "r"(bytes)
                 : "memory");
#endif
}

__device__ __forceinline__ void mbar_wait_v3(uint64_t *bar, uint32_t parity)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("{\n"
                 ".reg .pred p;\n"
                 "W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra W;\n"
                 "}\n" ::"r"(smem_u32_v3(bar)),
                 "r"(parity)
                 : "memory");
#endif
}

/* A word to the same shared variable of block `rank`, counted by that
 * block's mbarrier (the same variable there as `bar` here). */
__device__ __forceinline__ void st_async_v3(void *local, uint64_t *bar, uint32_t rank, uint32_t v)
{
#if __CUDA_ARCH__ >= 900
    unsigned d, m;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(d) : "r"(smem_u32_v3(local)), "r"(rank));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(m) : "r"(smem_u32_v3(bar)), "r"(rank));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(d), "r"(v),
                 "r"(m)
                 : "memory");
#endif
}

__device__ __forceinline__ void cluster_wait_v3()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#endif
}


/* Tiles blockIdx.x, + gridDim.x, ... of the tensors of one input type
 * (kBf: BF16, else FP32; the launcher gives the others no tiles) and one
 * format (kNv: NVFP4, else MXFP8): each instantiation is allocated
 * registers, and fills the instruction cache, for its own case alone.
 * Scale bytes alternate between two shared buffers: one barrier per tile
 * (warps storing their own scales straight from registers, as 2-byte
 * pieces of words that other warps complete, measured slower; mbarriers
 * that let a warp run a tile ahead of the others instead of a block-wide
 * barrier, no faster). kClu: launched in clusters of kBand blocks, each
 * cluster walking bands of runs (kBand tile rows of one run each), block
 * i of the cluster tile row i of the band, merging columnwise scales as
 * above; the other instantiations are compiled as before. */
template <bool kBf, bool kNv, bool kWide, bool kClu = false>
__global__ void __launch_bounds__(kThreads, kNv ? kCastV3NvBlocksPerSm : kCastV3MxBlocksPerSm)
    cast_kernel_v3(const __grid_constant__ Params p)
{
    const etp__qbatch_t &b = p.b;
    if (skipped(b)) return;
    __shared__ __align__(16) TileScales st[2];
    __shared__ __align__(16) uint4 ahead[kBf ? 8 : 1][kThreads]; /* the next tile's rows, per thread */
    extern __shared__ __align__(16) uint8_t stage[]; /* NVFP4: [parity] staged columnwise codes */
    const uint32_t run_len = kNv ? p.run : kRunMx;
    constexpr int kBlocksPerTile = kNv ? kTileV3 / 16 : kTileV3 / 32; /* rowwise scale bytes of a tile row */
    /* a whole run's rowwise scales fill its image rows, or it has no image */
    constexpr bool kImg = kNv && kRunNv * kBlocksPerTile == kRunRowBytes;
    __shared__ __align__(16) uint8_t rimg[2][kImg ? kTileV3 * kRunRowBytes : 16]; /* whole runs' rowwise scales */
    static_assert(!kClu || (kNv && !kWide), "clusters are NVFP4's");
    __shared__ __align__(16) uint8_t cimg[kClu ? 2 * kCimgBytes : 16]; /* [parity] a band's merged scales */
    __shared__ uint64_t cbar[kClu ? 2 : 1]; /* [parity] cimg's bytes arrived */
    /* kClu: where thread i < 64 writes the previous tile's merged piece (in
     * shared memory: the kernel's registers are all taken, and a pointer
     * carried across a tile spilled) */
    __shared__ uint8_t *mdst[kClu ? 64 : 1];
    const uint32_t total = p.tile_start[b.n]; /* runs (kClu: bands of runs) */
    uint32_t run = kClu ? blockIdx.x / kBand : blockIdx.x; /* uniform in a cluster */
    if (run >= total) return;
    static_assert(!(kWide && kNv), "wide tiles are MXFP8's");
    constexpr int kTR = TileDimV3<kWide>::kRows, kTC = TileDimV3<kWide>::kCols;
    const GeoV3 g = geo_v3<kWide>();
    TileV3 cur = {0, 0, 0};
    tile_coords_v3(p, run, &cur);
    uint32_t j = 0; /* the tile of the run */
    bool have = false;  /* ahead holds this tile's input */
    uint32_t nvk = ~0u; /* the tensor s_enc_6 and s_dec belong to */
    float s_enc_6 = 1.0f, s_dec = 1.0f;
    /* the run whose image is complete and leaves after the next barrier */
    bool pend = false;
    const uint8_t *pend_img = nullptr;
    void *pend_scales = nullptr;
    size_t pend_ld = 0, pend_r0 = 0, pend_kb0 = 0;
    int rp = 0;           /* the image of the current run */
    uint8_t *rimg_cur = nullptr;
    /* kClu, one register: kArrived (at the cluster's barrier once), kPm (the
     * previous tile was merged), kLpar (its parity), kPh << p (cbar[p]'s
     * phase) */
    constexpr uint32_t kArrived = 1, kPm = 2, kLpar = 4, kPh = 8;
    uint32_t cs = 0;
    if (kClu) {
        if (g.tid == 0) {
            mbar_init_v3(&cbar[0]);
            mbar_init_v3(&cbar[1]);
        }
        cluster_sync_v3();
    }
    for (int par = 0;; par ^= 1) {
        const uint32_t k = cur.k;
        const etp__qb_tensor_t &t = b.t[k];
        const uint32_t fl = p.fl[k];
        const uint32_t len = min(run_len, p.tiles_c[k] - cur.q * run_len);
        const size_t r0 = (size_t)(kClu ? cur.rt * kBand + band_member_v3() : cur.rt) * kTR,
                     c0 = (size_t)(cur.q * run_len + j) * kTC;
        const size_t R = r0 + g.tr, C = c0 + g.tc;
        /* kClu: a band's tile row past the tensor's last has no tile (its
         * block still keeps the cluster's barriers) */
        const bool act = !kClu || r0 < etp__qf_roundup(t.rows, kTileV3);
        if (j == 0) {
            /* a whole run of an unswizzled rowwise layout collects its
             * scales in an image (the same for every thread) */
            rimg_cur = nullptr;
            if (kImg && (fl & kFlRimg) && len == kRunNv && r0 + kTileV3 <= t.rows &&
                (size_t)(cur.q + 1) * run_len * kTileV3 <= t.cols)
                rimg_cur = rimg[rp];
        }
        uint4 lo[8], hi[8];
        if (have) {
            cp_async_wait_v3();
#pragma unroll
            for (int i = 0; i < 8; i++) lo[i] = ahead[i][g.tid];
        } else if (!act) { /* defined values for the words below, never stored */
#pragma unroll
            for (int i = 0; i < 8; i++) lo[i] = hi[i] = make_uint4(0u, 0u, 0u, 0u);
        } else if (kBf) {
            if (fast_v3(fl, t, R, C))
                load_bf16_v3(t, R, C, lo);
            else
                load_slow_v3<true>(t, R, C, lo, hi);
        } else {
            if (fast_v3(fl, t, R, C))
                load_f32_v3(t, R, C, lo, hi);
            else
                load_slow_v3<false>(t, R, C, lo, hi);
        }
        /* the next tile: the run's next, or the first of the run a grid
         * stride on */
        bool more = j + 1 < len;
        TileV3 nt = cur;
        uint32_t nj = j + 1, nrun = run;
        if (!more) {
            nrun = run + (kClu ? gridDim.x / kBand : gridDim.x);
            more = nrun < total;
            nj = 0;
            if (more) nt = tile_step_v3(p, cur, nrun);
        }
        const size_t nr0 = (size_t)(kClu ? nt.rt * kBand + band_member_v3() : nt.rt) * kTR,
                     nc0 = (size_t)(nt.q * run_len + nj) * kTC;
        /* FP32 rows would need twice the shared memory: those load in place.
         * Whole tiles only, a test the same for the whole block (a tile at
         * the tensor's edge loads in place, each thread as fast_v3 says) */
        have = kBf && more && act && (p.fl[nt.k] & kFlX16) && nr0 + kTR <= b.t[nt.k].rows &&
               nc0 + kTC <= b.t[nt.k].cols;
        const auto prefetch = [&]() {
            if (!kBf || !have) return;
            const etp__qb_tensor_t &ntt = b.t[nt.k];
            const size_t K = ntt.cols;
            const uint16_t *x = static_cast<const uint16_t *>(ntt.x) + (nr0 + g.tr) * K + nc0 + g.tc;
#pragma unroll
            for (int i = 0; i < 8; i++) cp_async16_v3(&ahead[kBf ? i : 0][g.tid], x + i * K);
            cp_async_commit_v3();
        };
        constexpr bool nv = kNv;
        if (nv && k != nvk) {
            const float s_enc = etp__qf_nvfp4_s_enc(b.amax[b.first + k]);
            s_enc_6 = etp__qf_nvfp4_s_enc_6(s_enc);
            s_dec = 1.0f / s_enc;
            nvk = k;
        }
        /* NVFP4 columnwise codes of whole tiles with 16-byte aligned output
         * rows are staged (the same for every thread of the block) */
        uint8_t *cstage = nullptr;
        if (nv && (fl & kFlStage) && r0 + kTileV3 <= t.rows && c0 + kTileV3 <= t.cols)
            cstage = stage + par * kStageBytes;
        uint32_t w[8][8];
        words_v3<kBf>(lo, hi, w);
        if (act) {
            if (nv)
                nv_tile_v3<kBf, kClu>(b, t, fl, g, R, C, w, s_enc_6, s_dec, st[par], cstage, prefetch);
            else
                mx_tile_v3<kBf, kWide>(b, t, fl, g, R, C, w, st[par], prefetch);
        }
        __syncthreads();
        /* kClu (launched only for 16x16 blocks and row-major scales): the
         * band's kBand tiles whole, their columnwise scales merged (the same
         * for every block of the cluster) */
        const bool merged = kClu && (fl & kFlMerge) && (size_t)(cur.rt + 1) * kBand * kTileV3 <= t.rows &&
                            c0 + kTileV3 <= t.cols;
        /* every thread has filled the previous run's image: it leaves (the
         * image is filled again two runs on, after at least one more
         * barrier) */
        if (pend && !ETP__CAST_LEAVE_OUT(8)) run_out_v3(pend_img, pend_scales, pend_ld, pend_r0, pend_kb0, g.tid, b.compact);
        pend = false;
        if (act && !ETP__CAST_LEAVE_OUT(8)) {
            if (kWide)
                mx_wide_scales_out_v3(t, fl, r0, c0, st[par]);
            else
                scales_out_v3<kNv, kClu>(b, t, fl, r0, c0, st[par], rimg_cur, (int)j * kBlocksPerTile, !merged);
        }
        if (cstage && !ETP__CAST_LEAVE_OUT(2)) stage_out_v3(cstage, t.col_data, t.rows / 2, c0, r0 / 2, g.tid);
        if (kImg && rimg_cur && j + 1 == len) { /* the run's last tile */
            const etp__qf_scale_shape_t ss =
                kNv ? etp__qf_nvfp4_row_scales(t.rows, t.cols) : etp__qf_mxfp8_row_scales(t.rows, t.cols);
            pend = true;
            pend_img = rimg_cur;
            pend_scales = t.row_scales;
            pend_ld = ss.cols;
            pend_r0 = r0;
            pend_kb0 = (size_t)cur.q * kRunRowBytes;
        }
        if (kClu) {
            /* the previous tile's merged pieces, complete once their bytes
             * have arrived (the mbarrier). Reading them before arriving
             * (relaxed) is enough to let the senders reuse the buffer after
             * the next wait: their values are consumed, by the store, before
             * the arrival is issued. */
            if (cs & kArrived) cluster_wait_v3();
            if (cs & kPm) {
                const int q = par ^ 1;
                if (g.tid < 64) {
                    mbar_wait_v3(&cbar[q], (cs / (kPh << q)) & 1u);
                    const int jl = g.tid / kBandPieces, h = g.tid % kBandPieces;
                    const uint4 v =
                        *reinterpret_cast<const uint4 *>(&cimg[q * kCimgBytes + (jl >> 4) * (kBand * 8) + 16 * h]);
                    if (!ETP__CAST_LEAVE_OUT(8) && !ETP__CAST_LEAVE_OUT(32) && (!b.compact || (jl & 15) == 15))
                        *reinterpret_cast<uint4 *>(mdst[g.tid]) = v;
                }
                cs ^= kPh << q;
            }
            /* this tile's 16x16 blocks' scales, a word of 4 M-blocks a
             * thread, to the blocks that write them */
            if (merged) {
                if (g.tid == 0) mbar_expect_v3(&cbar[par], kCimgBytes);
                if (g.tid < 16) {
                    const int h = g.tid & 1, bj = g.tid >> 1;
                    const uint32_t v = (uint32_t)st[par][1][4 * h][bj * 16] |
                                       (uint32_t)st[par][1][4 * h + 1][bj * 16] << 8 |
                                       (uint32_t)st[par][1][4 * h + 2][bj * 16] << 16 |
                                       (uint32_t)st[par][1][4 * h + 3][bj * 16] << 24;
                    const int at = par * kCimgBytes + (bj % kBandGroups) * (kBand * 8) + band_member_v3() * 8 + 4 * h;
                    st_async_v3(&cimg[at], &cbar[par], (uint32_t)(bj / kBandGroups), v);
                }
                /* this block's kBandCols columns of the band: kBand * 8
                 * bytes (the kBand tiles' 8 M-blocks each) of kBandCols
                 * scale rows, 16 bytes a thread */
                if (g.tid < 64) {
                    const size_t cld = etp__qf_nvfp4_col_scales(t.rows, t.cols).cols;
                    const int jl = g.tid / kBandPieces, h = g.tid % kBandPieces;
                    const size_t row = c0 + band_member_v3() * kBandCols + jl;
                    mdst[g.tid] =
                        static_cast<uint8_t *>(t.col_scales) + row * cld + (size_t)cur.rt * (kBand * 8) + 16 * h;
                }
            }
            cs = (cs & ~(kPm | kLpar)) | kArrived | (merged ? kPm : 0u) | (par ? kLpar : 0u);
            cluster_arrive_v3();
        }
        if (j + 1 == len) rp ^= 1;
        if (!more) break;
        run = nrun;
        cur = nt;
        j = nj;
    }
    if (kImg && pend) {
        __syncthreads();
        if (!ETP__CAST_LEAVE_OUT(8)) run_out_v3(pend_img, pend_scales, pend_ld, pend_r0, pend_kb0, g.tid, b.compact);
    }
    if (kClu) { /* the last tile's merged pieces (and no block leaves while others may write to it) */
        cluster_wait_v3();
        if ((cs & kPm) && g.tid < 64) {
            const int q = (cs & kLpar) ? 1 : 0;
            mbar_wait_v3(&cbar[q], (cs / (kPh << q)) & 1u);
            const int jl = g.tid / kBandPieces, h = g.tid % kBandPieces;
            const uint4 v = *reinterpret_cast<const uint4 *>(&cimg[q * kCimgBytes + (jl >> 4) * (kBand * 8) + 16 * h]);
            if (!ETP__CAST_LEAVE_OUT(8) && !ETP__CAST_LEAVE_OUT(32) && (!b.compact || (jl & 15) == 15))
                *reinterpret_cast<uint4 *>(mdst[g.tid]) = v;
        }
    }
}

/* ---- compact scales: the expansion ----------------------------------------
 *
 * With 16x16 NVFP4 blocks every 16 consecutive rows of a row-major scale
 * matrix are equal (a block's scale repeats on each of its 16 rows, and in
 * the columnwise matrix on each of its 16 columns). A tile writes 8 or 16
 * bytes of each of its 128 rows, pieces of 32-byte sectors in 128
 * different lines; with compaction (batch.compact, whole interior tiles of
 * tensors kFlRimg / kFlMerge) it writes only rows 16g + 15, and this kernel
 * then copies each such row over rows 16g .. 16g + 14, whole lines. A
 * group's rows all lie inside the tensor (g < M / 16 rowwise, K / 16
 * columnwise): rows past it are padding, zero, and never copied over, and
 * a row 16g + 15 is complete once the cast is, every tile writing its part
 * of it (edge tiles write all their rows, which the copy rewrites with
 * equal bytes). Units: 16 bytes of one group's source row; p.tiles_c[k]:
 * the rowwise units of tensor k, then its columnwise ones. */
__global__ void __launch_bounds__(kThreads) expand_kernel_v3(const __grid_constant__ Params p)
{
    const etp__qbatch_t &b = p.b;
    if (skipped(b)) return;
    const uint32_t total = p.tile_start[b.n];
    for (uint32_t u = blockIdx.x * kThreads + threadIdx.x; u < total; u += gridDim.x * kThreads) {
        uint32_t local;
        const uint32_t k = find_tensor(p, u, &local);
        const etp__qb_tensor_t &t = b.t[k];
        uint8_t *base;
        size_t ld;
        if (local < p.tiles_c[k]) {
            base = static_cast<uint8_t *>(t.row_scales);
            ld = etp__qf_nvfp4_row_scales(t.rows, t.cols).cols;
        } else {
            local -= p.tiles_c[k];
            base = static_cast<uint8_t *>(t.col_scales);
            ld = etp__qf_nvfp4_col_scales(t.rows, t.cols).cols;
        }
        const size_t per = ld / 16, g = local / per;
        uint8_t *d = base + 16 * g * ld + 16 * (local % per);
        const uint4 v = *reinterpret_cast<const uint4 *>(d + 15 * ld);
#pragma unroll
        for (int i = 0; i < 15; i++) *reinterpret_cast<uint4 *>(d + i * ld) = v;
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

/* p's tile prefix sums for the batch: every tensor, or (v3 casts, only >= 0)
 * only those of input type `only`, the others getting no tiles; v3 counts
 * runs, or with band > 1 bands of `band` tile rows of a run. Returns the
 * total; above 0x7fffffff the kernels' indices would overflow. */
uint64_t plan_tiles(const etp__qbatch_t *batch, bool v3, int only, uint32_t run, Params *p, bool wide = false,
                    uint32_t band = 1)
{
    uint64_t total = 0;
    for (uint32_t k = 0; k < batch->n; k++) {
        const etp__qb_tensor_t &t = batch->t[k];
        const uint64_t count = (uint64_t)t.rows * t.cols;
        uint64_t tiles = 0;
        p->tiles_c[k] = 1;
        p->runs_c[k] = 1;
        if (batch->op == ETP__QB_AMAX) {
            tiles = count ? (count + kAmaxUnit - 1) / kAmaxUnit : 1; /* an empty tensor still gets its 0 */
        } else if (batch->op == ETP__QB_DEQUANT) {
            tiles = (count + kDequantChunk - 1) / kDequantChunk;
        } else if (only < 0 || t.dtype == only) {
            size_t re, ce;
            const size_t tr = v3 ? (wide ? kWideRows : kTileV3) : kTile;
            const size_t tc = v3 ? (wide ? kWideCols : kTileV3) : kTile;
            if (v3)
                cast_extent_v3(t, wide, &re, &ce);
            else
                cast_extent(batch[0], t, &re, &ce);
            tiles = (uint64_t)(re / tr) * (ce / tc);
            p->tiles_c[k] = ce / tc ? (uint32_t)(ce / tc) : 1;
            if (v3) { /* v3 counts runs of tiles along a tile row */
                p->runs_c[k] = (p->tiles_c[k] + run - 1) / run;
                tiles = (uint64_t)((re / tr + band - 1) / band) * p->runs_c[k];
            }
        }
        p->tile_start[k] = (uint32_t)total;
        total += tiles;
        if (total > 0x7fffffffu) return total;
    }
    p->tile_start[batch->n] = (uint32_t)total;
    return total;
}

/* The kFl* facts of tensor t of a v3 cast. */
uint8_t cast_flags_v3(const etp__qbatch_t *b, const etp__qb_tensor_t &t)
{
    const bool nv = b->format == ETP__QB_NVFP4;
    const size_t es = t.dtype == ETP__QB_BF16 ? 2 : 4;
    const auto al16 = [](const void *q) { return (reinterpret_cast<uintptr_t>(q) & 15u) == 0; };
    uint8_t f = 0;
    if (al16(t.x) && ((size_t)t.cols * es) % 16 == 0) f |= kFlX16;
    if (t.row_data) f |= kFlRow;
    if (t.col_data) f |= kFlCol;
    if (nv && t.col_data && (t.rows / 2) % 16 == 0 && al16(t.col_data)) f |= kFlStage;
    if (nv && t.row_data && !b->swizzle && etp__qf_nvfp4_row_scales(t.rows, t.cols).cols % 16 == 0 &&
        al16(t.row_scales))
        f |= kFlRimg;
    if (nv && t.col_data && !b->swizzle && etp__qf_nvfp4_col_scales(t.rows, t.cols).cols % 16 == 0 &&
        al16(t.col_scales))
        f |= kFlMerge;
    return f;
}

/* Runs a resident block from which a launch compacts its scales (the
 * default, ETP_QUANT_CAST_COMPACT=1). */
constexpr uint64_t kCompactRuns = 4;

/* The expansion's units (16 bytes of one group's source row) of the
 * tensors whose input type's cast compacted: p->tile_start their prefix
 * sum, p->tiles_c[k] tensor k's rowwise ones (its columnwise ones follow).
 * p == nullptr: the count alone (the launcher checks it before the cast
 * runs, and fills p after the cast's launches, whose plan p held). */
uint64_t plan_expand_v3(const etp__qbatch_t *b, const uint8_t *fl, const bool compacted[2], Params *p)
{
    uint64_t units = 0;
    for (uint32_t k = 0; k < b->n; k++) {
        const etp__qb_tensor_t &t = b->t[k];
        uint64_t ru = 0, cu = 0;
        if (t.dtype <= ETP__QB_F32 && compacted[t.dtype]) {
            if (fl[k] & kFlRimg) ru = (uint64_t)(t.rows / 16) * (etp__qf_nvfp4_row_scales(t.rows, t.cols).cols / 16);
            if (fl[k] & kFlMerge) cu = (uint64_t)(t.cols / 16) * (etp__qf_nvfp4_col_scales(t.rows, t.cols).cols / 16);
        }
        if (p) {
            p->tile_start[k] = (uint32_t)units;
            p->tiles_c[k] = (uint32_t)ru;
        }
        units += ru + cu;
    }
    if (p) p->tile_start[b->n] = (uint32_t)units;
    return units;
}

/* The NVFP4 v3 cast's dynamic shared memory: two tiles' staged columnwise
 * codes, beyond the 48 KiB a block gets without asking with the static
 * shared memory, so the kernel must be allowed it first. */
constexpr size_t kCastV3NvDyn = 2 * (size_t)kStageBytes;

/* A launch of `blocks` blocks in clusters of kBand (the kClu kernel); attr
 * is the configuration's storage. */
cudaLaunchConfig_t cluster_config_v3(unsigned blocks, cudaStream_t s, cudaLaunchAttribute *attr)
{
    cudaLaunchConfig_t cfg = {};
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = kBand;
    attr->val.clusterDim.y = 1;
    attr->val.clusterDim.z = 1;
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = kCastV3NvDyn;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cfg;
}

} // namespace

extern "C" cudaError_t etp__cuda_quant_cluster_fit(uint32_t *clusters)
{
    *clusters = 0;
    int dev = 0, can = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&can, cudaDevAttrClusterLaunch, dev);
    if (e != cudaSuccess || !can) return e;
    const void *fns[2] = {(const void *)cast_kernel_v3<true, true, false, true>,
                          (const void *)cast_kernel_v3<false, true, false, true>};
    int fit = 0x7fffffff;
    for (int f = 0; f < 2; f++) {
        e = cudaFuncSetAttribute(fns[f], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kCastV3NvDyn);
        if (e != cudaSuccess) return e;
        cudaLaunchAttribute attr;
        const cudaLaunchConfig_t cfg = cluster_config_v3(kBand, 0, &attr);
        int n = 0;
        e = cudaOccupancyMaxActiveClusters(&n, fns[f], &cfg);
        if (e != cudaSuccess) return e;
        fit = n < fit ? n : fit;
    }
    *clusters = fit > 0 ? (uint32_t)fit : 0u;
    return cudaSuccess;
}

extern "C" cudaError_t etp__cuda_quant_launch(cudaStream_t s, const etp__qbatch_t *batch)
{
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
#ifdef ETP_QUANT_CAST_DIAG
    {
        const char *d = getenv("ETP_QUANT_CAST_DIAG");
        const uint32_t bits = d ? (uint32_t)strtoul(d, nullptr, 0) : 0u;
        const cudaError_t e = cudaMemcpyToSymbolAsync(g_cast_diag, &bits, sizeof bits, 0, cudaMemcpyHostToDevice, s);
        if (e != cudaSuccess) return e;
    }
#endif
    void *args[] = {&p};
    /* cast: v3 unless asked for v2 (ETP_QUANT_CAST_KERNEL=2, kept until v3
     * has a GPU record); stochastic rounding stays on v2, whose per-element
     * path draws the random bits. v3 runs one launch per input type present
     * (one for a batch of one type, the usual case). */
    if (batch->op == ETP__QB_CAST && batch->cast_kernel != 2 && !batch->stochastic) {
        const bool nv = batch->format == ETP__QB_NVFP4;
        const bool wide = !nv && !batch->swizzle; /* square MXFP8 tiles: swizzled scales only */
        const uint64_t most = (uint64_t)batch->sms * (nv ? kCastV3NvBlocksPerSm : kCastV3MxBlocksPerSm);
        uint64_t totals[2];
        uint32_t runs[2] = {1, 1};
        /* compact scales (the expansion above), by default (compact 1) for
         * launches of at least kCompactRuns runs a resident block: smaller
         * ones, whose outputs L2 holds whole, complete their scale sectors
         * there and only pay for the second launch (H100, 64 x [1024,
         * 512]: 50 -> 54 us; 8 x [8192, 4096]: 344 -> 312 us; the
         * crossover on H100 and H200 near 4 x [8192, 4096], docs/PERF.md);
         * compact 2: every launch it applies to (tests) */
        const bool compact = batch->compact && nv && batch->block2d && !batch->swizzle;
        bool compacted[2] = {false, false};
        for (uint32_t k = 0; k < batch->n; k++) p.fl[k] = cast_flags_v3(batch, batch->t[k]);
        for (int dt = 0; dt < 2; dt++) { /* checked before anything is launched */
            if ((totals[dt] = plan_tiles(batch, true, dt, 1, &p, wide)) > 0x7fffffffu) return cudaErrorInvalidValue;
            /* NVFP4 in runs where there are enough to give every resident
             * block one: fewer, and a run's tiles would wait on one block
             * that many blocks could share (a [1024, 512] weight alone: 8
             * runs, 2.4x slower) */
            if (nv && totals[dt] >= (uint64_t)kRunNv * (most ? most : 1)) {
                runs[dt] = kRunNv;
                totals[dt] = plan_tiles(batch, true, dt, kRunNv, &p);
            }
            compacted[dt] = compact && totals[dt] > 0 &&
                            (batch->compact == 2 || (runs[dt] == kRunNv && totals[dt] >= kCompactRuns * most));
        }
        const uint64_t expand_units = plan_expand_v3(batch, p.fl, compacted, nullptr);
        if (expand_units > 0x7fffffffu) return cudaErrorInvalidValue;
        for (int dt = 0; dt < 2; dt++) {
            if (totals[dt] == 0) continue;
            /* NVFP4 16x16 blocks, row-major scales, in runs: clusters of
             * kBand blocks take bands of runs (the kClu kernel) */
            const bool clu = nv && runs[dt] == kRunNv && batch->clusters && batch->block2d && !batch->swizzle;
            const uint32_t band = clu ? kBand : 1;
            p.b.compact = compacted[dt] ? 1u : 0u;
            const uint64_t units = plan_tiles(batch, true, dt, runs[dt], &p, wide, band);
            p.run = runs[dt];
            uint64_t grid = units; /* kClu: clusters */
            /* clusters: as many as the device holds at once (fewer than
             * most / kBand where a GPC's slots are not a multiple of kBand;
             * more would run as a second wave) */
            const uint64_t most_c = most / kBand ? most / kBand : 1;
            const uint64_t fit = !clu ? most : batch->clusters < most_c ? batch->clusters : most_c;
            if (batch->sms) grid = grid < fit ? grid : fit;
            for (uint32_t k = 0; k < batch->n; k++) {
                p.step_r[k] = (uint32_t)(grid / p.runs_c[k]);
                p.step_c[k] = (uint32_t)(grid % p.runs_c[k]);
            }
            const bool bf = dt == ETP__QB_BF16;
            const void *fn = clu    ? (bf ? (const void *)cast_kernel_v3<true, true, false, true>
                                          : (const void *)cast_kernel_v3<false, true, false, true>)
                             : nv   ? (bf ? (const void *)cast_kernel_v3<true, true, false>
                                          : (const void *)cast_kernel_v3<false, true, false>)
                             : wide ? (bf ? (const void *)cast_kernel_v3<true, false, true>
                                          : (const void *)cast_kernel_v3<false, false, true>)
                                    : (bf ? (const void *)cast_kernel_v3<true, false, false>
                                          : (const void *)cast_kernel_v3<false, false, false>);
            const size_t dyn = nv ? kCastV3NvDyn : 0;
            if (dyn) {
                const cudaError_t ea = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn);
                if (ea != cudaSuccess) return ea;
            }
            if (clu) {
                cudaLaunchAttribute attr;
                const cudaLaunchConfig_t cfg = cluster_config_v3((unsigned)(grid * kBand), s, &attr);
                const cudaError_t e = cudaLaunchKernelExC(&cfg, fn, args);
                if (e != cudaSuccess) return e;
                continue;
            }
            const cudaError_t e = cudaLaunchKernel(fn, dim3((unsigned)grid), dim3(kThreads), args, dyn, s);
            if (e != cudaSuccess) return e;
        }
        if (expand_units == 0) return cudaSuccess;
        /* the compacted tensors' scale rows copied over their groups */
        plan_expand_v3(batch, p.fl, compacted, &p);
        uint64_t eg = (expand_units + kThreads - 1) / kThreads;
        const uint64_t ecap = (uint64_t)(batch->sms ? batch->sms : 1) * 16;
        eg = eg < ecap ? eg : ecap;
        return cudaLaunchKernel((const void *)expand_kernel_v3, dim3((unsigned)eg), dim3(kThreads), args, 0, s);
    }
    const uint64_t total = plan_tiles(batch, false, -1, 1, &p);
    if (total > 0x7fffffffu) return cudaErrorInvalidValue;
    if (total == 0) return cudaSuccess;
    /* one block per tile, or (the default kernels) as many blocks as the
     * device holds at once, each looping (sms = 0: one per tile) */
    uint64_t grid = total;
    const void *fn = (const void *)dequant_kernel;
    if (batch->op == ETP__QB_AMAX) {
        fn = (const void *)amax_kernel_v2;
        if (batch->sms) {
            const uint64_t most = (uint64_t)batch->sms * kAmaxBlocksPerSm;
            p.per_block = (uint32_t)((total + most - 1) / most);
            grid = (total + p.per_block - 1) / p.per_block;
        }
    } else if (batch->op == ETP__QB_CAST) {
        fn = (const void *)cast_kernel_v2;
        if (batch->sms) {
            const uint64_t most = (uint64_t)batch->sms * kCastBlocksPerSm;
            grid = total < most ? total : most;
        }
    }
    return cudaLaunchKernel(fn, dim3((unsigned)grid), dim3(kThreads), args, 0, s);
}
