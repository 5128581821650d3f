/*
 * The stochastic-rounding cast (NVFP4 elements only: the quantizer refuses
 * it for MXFP8): 64 x 64 tiles through shared memory as FP32, one launch
 * for the batch, each element's random word drawn by Philox as the host
 * reference draws it (etp__qf_sr_bits). The general cast (cast_v3.cu)
 * rounds to nearest only: its register-blocked conversion of 8 x 8
 * pieces has no room for a random word per element.
 */
#include "qk_common.cuh"

namespace etp__qk {
namespace {

constexpr int kTile = 64; /* cast tiles are 64 x 64 elements */
constexpr int kCastBlocksPerSm = 4;     /* resident blocks per SM (launch bounds) */

/* ---- cast: shared pieces ------------------------------------------------------ */

/* Element extents a tensor's tiles cover: the data and every produced scale
 * matrix with its padding (padding scales are written as zeros by the tiles
 * that cover them). Multiples of 64. */
inline void cast_extent_sr(const etp__qb_tensor_t &t, size_t *re, size_t *ce)
{
    size_t r = 0, c = 0;
    if (t.row_data) { /* [roundup(M,128), roundup(K/16,4)] */
        r = etp__qf_roundup(t.rows, 128);
        c = etp__qf_roundup(t.cols, 64);
    }
    if (t.col_data) { /* [roundup(K,128), roundup(M/16,4)] */
        const size_t cr = etp__qf_roundup(t.rows, 64);
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

struct CastSharedSr {
    float x[kTile][kTile + 1];
    float seg[kTile][4];                 /* NVFP4: amax of each row's 16-element segments */
    float blk2d[kTile / 16][kTile / 16]; /* NVFP4 16x16 block amaxes */
    uint4 srb[kThreads / 4][16];         /* stochastic rounding: a 4-column group's Philox words */
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
                                           const TileRegs &tr, CastSharedSr &sh)
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

/* 16 NVFP4 elements v[0..15] with multiplier m into two words of codes,
 * rounded stochastically; (i, j) of element 0 and its step (di, dj). */
__device__ __forceinline__ void fp4x16(const etp__qbatch_t &b, uint32_t k, const float *v, float m,
                                       uint32_t dir, size_t i, size_t j, size_t di, size_t dj,
                                       size_t cols, uint32_t *w0, uint32_t *w1)
{
    uint32_t w[2] = {0u, 0u};
    const uint64_t idx0 = (uint64_t)i * cols + j;
    if (dj == 1 && (idx0 & 3u) == 0) {
        /* a row's 16 elements from 4 aligned groups of 4: one Philox call
         * gives a group's 4 words (etp__qf_sr_bits' definition) */
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const uint64_t g = (idx0 >> 2) + (uint64_t)q;
            uint32_t r[4] = {(uint32_t)g, (uint32_t)(g >> 32), b.first + k, dir};
            etp__qf_philox(r, (uint32_t)b.seed, (uint32_t)(b.seed >> 32));
#pragma unroll
            for (int x = 0; x < 4; x++) {
                const int c = 4 * q + x;
                w[c / 8] |= (uint32_t)etp__qf_e2m1_sr_satfinite_fast(v[c] * m, r[x]) << (4 * (c % 8));
            }
        }
    } else {
#pragma unroll /* constant indices: v and w stay in registers */
        for (int c = 0; c < 16; c++)
            w[c / 8] |= (uint32_t)etp__qf_e2m1_sr_satfinite_fast(v[c] * m, sr_bits(b, k, dir, i + c * di,
                                                                                    j + c * dj, cols))
                        << (4 * (c % 8));
    }
    *w0 = w[0];
    *w1 = w[1];
}

/* The same with the 16 random words given. */
__device__ __forceinline__ void fp4x16_bits(const float *v, float m, const uint32_t (&rb)[16], uint32_t *w0,
                                            uint32_t *w1)
{
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int c = 0; c < 16; c++)
        w[c / 8] |= (uint32_t)etp__qf_e2m1_sr_satfinite_fast(v[c] * m, rb[c]) << (4 * (c % 8));
    *w0 = w[0];
    *w1 = w[1];
}

/* Stochastic rounding's words of a columnwise segment, column gj, rows
 * row0..row0+15, with K a multiple of 4: an element's word is word gj % 4
 * of the Philox call of its row's group of 4 columns, which the 4 threads
 * of those columns (consecutive threads, the same rows) share: each makes
 * 4 of the 16 calls and they trade the words through shared memory, 4
 * calls a thread instead of 16. Called by all 4 threads of the group. */
__device__ __forceinline__ void sr_col_bits(const etp__qbatch_t &b, uint32_t k, size_t row0, size_t gj,
                                            size_t K, CastSharedSr &sh, uint32_t (&rb)[16])
{
    const unsigned lane = threadIdx.x & 31u, x = lane & 3u;
    const unsigned mask = 0xFu << (lane & 28u);
    uint4 *g = sh.srb[threadIdx.x >> 2];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const unsigned c = 4 * x + (unsigned)j;
        const uint64_t q = ((uint64_t)(row0 + c) * K + (gj & ~(size_t)3)) >> 2;
        uint32_t r[4] = {(uint32_t)q, (uint32_t)(q >> 32), b.first + k, 1u};
        etp__qf_philox(r, (uint32_t)b.seed, (uint32_t)(b.seed >> 32));
        g[c] = make_uint4(r[0], r[1], r[2], r[3]);
    }
    __syncwarp(mask);
#pragma unroll
    for (int c = 0; c < 16; c++) rb[c] = reinterpret_cast<const uint32_t *>(&g[c])[x];
    __syncwarp(mask); /* read before the next tile's calls overwrite them */
}

__device__ __forceinline__ float amax16(const float *v)
{
    uint32_t a = 0;
#pragma unroll
    for (int c = 0; c < 16; c++) a = amax_bits(a, etp__qf_bits(v[c]) & 0x7fffffffu);
    return __uint_as_float(a);
}

/* One tile in shared memory, quantized, every thread a 16-element row
 * segment, then a 16-element column segment. Scale entries of the padding
 * that the tile covers are written as zeros. */
__device__ __forceinline__ void cast_tile(const etp__qbatch_t &b, uint32_t k, size_t r0, size_t c0,
                                          CastSharedSr &sh)
{
    const etp__qb_tensor_t &t = b.t[k];
    const size_t M = t.rows, K = t.cols;
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
                /* (K a multiple of 4: the 4 threads of a column group
                 * all take this branch, or none does) */
                if ((K & 3) == 0) {
                    uint32_t rb[16];
                    sr_col_bits(b, k, mb * 16, gj, K, sh, rb);
                    fp4x16_bits(v, m, rb, &w0, &w1);
                } else {
                    fp4x16(b, k, v, m, 1, mb * 16, gj, 1, 0, K, &w0, &w1);
                }
                store_fp4x16(static_cast<uint8_t *>(t.col_data) + gj * (M / 2) + mb * 8, w0, w1);
            } else {
                scales[off] = 0;
            }
        }
    }
}

/* Tiles blockIdx.x, + gridDim.x, ...: each iteration puts the tile loaded
 * ahead into shared memory, starts the loads of the next one, then
 * quantizes the current one while they are in flight. */
__global__ void __launch_bounds__(kThreads, kCastBlocksPerSm) cast_kernel_sr(const __grid_constant__ Params p)
{
    const etp__qbatch_t &b = p.b;
    if (skipped(b)) return;
    __shared__ CastSharedSr sh;
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


} // namespace

cudaError_t launch_cast_sr(cudaStream_t s, const etp__qbatch_t *batch, Params &p)
{
    if (batch->format != ETP__QB_NVFP4 || !batch->stochastic) return cudaErrorInvalidValue;
    const uint64_t total = plan_units(batch, &p, [&](uint32_t k) -> uint64_t {
        size_t re, ce;
        cast_extent_sr(batch->t[k], &re, &ce);
        p.tiles_c[k] = ce / kTile ? (uint32_t)(ce / kTile) : 1;
        return (uint64_t)(re / kTile) * (ce / kTile);
    });
    if (total > 0x7fffffffu) return cudaErrorInvalidValue;
    if (total == 0) return cudaSuccess;
    /* as many blocks as the device holds at once, each looping (sms = 0:
     * one per tile) */
    uint64_t grid = total;
    if (batch->sms) {
        const uint64_t most = (uint64_t)batch->sms * kCastBlocksPerSm;
        grid = total < most ? total : most;
    }
    void *args[] = {&p};
    return cudaLaunchKernel((const void *)cast_kernel_sr, dim3((unsigned)grid), dim3(kThreads), args, 0, s);
}

} // namespace etp__qk
