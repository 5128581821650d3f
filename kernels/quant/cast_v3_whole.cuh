/*
 * The v3 cast (cast_v3.cu, which alone includes this): MXFP8 of BF16
 * batches made only of whole 32 x 512 tiles, its own kernel.
 */
#ifndef ETP__KERNELS_QUANT_CAST_V3_WHOLE_CUH
#define ETP__KERNELS_QUANT_CAST_V3_WHOLE_CUH

#include "cast_v3_mxfp8.cuh"
#include "cast_v3_scales.cuh"

namespace etp__qk {

/* ---- whole tiles -----------------------------------------------------------
 *
 * Expert weights are BF16 with rows a multiple of 128 and columns of 512
 * (64 x [1024, 512], [7168, 2048], ...), quantized in both directions
 * (forward and backward GEMMs). For such batches the general
 * kernel's care for edges is pure cost: Nsight Compute counted ~1200
 * instructions a warp-tile in its BF16 MXFP8 kernel (64 x [1024, 512],
 * H200), about half of them edge and alignment tests around every row's
 * stores, each element unpacked once per direction, a binary search and a
 * division per tile, and the runtime E4M3/E5M2 choice, which doubled the
 * code the instruction cache holds (11% of its stall samples waited for
 * instructions, 9% for the parameter block's indexed loads). Here:
 * - no edges at all: a batch qualifies only if every tensor does
 *   (whole_ok_v3), so no scale padding exists and every store is a whole
 *   8-byte piece of a row, its address one add a row; one direction alone
 *   (not a weight's case) is left to the general kernel, so one
 *   instantiation per element type;
 * - the input travels two tiles ahead through a ring of shared stages;
 * - each element is unpacked to FP32 once and scaled for both directions;
 * - E4M3 and E5M2 are separate instantiations;
 * - a block's next tensor is found by one ballot over the following 32
 *   prefix sums (a warp's lanes read one each), not a binary search;
 * - the scale of a finite block amax is e8m0_round_up without its
 *   non-finite branches; blocks with a NaN or an infinity (amax bits at
 *   or above 0x7f80 in BF16) take the general kernel's per-element path
 *   (mx_tile_safe_v3), as there.
 * Geometry, registers' layout, scale staging and write-out are the general
 * wide-tile kernel's (cast_v3_tile.cuh), so outputs are the same bytes. */

/* resident blocks per SM (launch bounds) and tiles in flight a block */
constexpr int kWholeBlocksPerSm = 2;
constexpr int kWholeDepth = 2;
constexpr size_t kWholeDyn = (size_t)kWholeDepth * 8 * kThreads * sizeof(uint4);

/* Tensor t qualifies for the whole-tile kernel (an empty one, of any
 * shape and with any buffers, has no tiles and writes nothing: its scale
 * arrays have no rows or no columns). */
__host__ inline bool whole_ok_v3(const etp__qbatch_t *b, const etp__qb_tensor_t &t)
{
    const auto al = [](const void *q, uintptr_t a) { return (reinterpret_cast<uintptr_t>(q) & (a - 1)) == 0; };
    if (b->format != ETP__QB_MXFP8 || b->swizzle) return false;
    if (t.rows == 0 || t.cols == 0) return true;
    return t.dtype == ETP__QB_BF16 && t.rows % 128 == 0 && t.cols % kWideCols == 0 && al(t.x, 16) &&
           t.row_data != nullptr && t.col_data != nullptr && al(t.row_data, 8) && al(t.col_data, 8) &&
           al(t.row_scales, 4) && al(t.col_scales, 4);
}

/* e8m0_round_up(amax * inv) of a finite amax (FP32 bits): the reference's
 * etp__qf_e8m0_round_up less its NaN, infinity and 0xFE cases, which a
 * finite product below 2^120 never meets (the BF16 maximum times 1/448). */
__device__ __forceinline__ uint32_t e8m0_up_finite_v3(uint32_t amax, float inv)
{
    const uint32_t u = __float_as_uint(__uint_as_float(amax) * inv);
    const uint32_t e = u >> 23, m = u & 0x7fffffu;
    return e + ((m != 0u && (e != 0u || m > 0x400000u)) ? 1u : 0u);
}

/* etp__qf_mxfp8_multiplier: 2^(127 - e), 1 for e = 0. */
__device__ __forceinline__ float mx_mult_bits_v3(uint32_t e)
{
    return e ? __uint_as_float((254u - e) << 23) : 1.0f;
}

/* One direction's scales of the thread's 8 rows (columns) with amaxes a[8]
 * (FP32 bits): the block's lane q (of 4: lanes base + q * stride) computes
 * those of its rows 2q and 2q + 1 (E8M0 bytes 0 and 1 of the result, *bad
 * set for a NaN or infinite amax), all 8 multipliers come back by shuffles. */
__device__ __forceinline__ uint32_t whole_scales_v3(const uint32_t (&a)[8], int q, int base, int stride, float inv,
                                                    float (&m)[8], uint32_t *bad)
{
    float s[2];
    uint32_t e2 = 0;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint32_t x = q == 0 ? a[h] : q == 1 ? a[2 + h] : q == 2 ? a[4 + h] : a[6 + h];
        *bad |= x >= 0x7f800000u;
        const uint32_t e = e8m0_up_finite_v3(x, inv);
        s[h] = mx_mult_bits_v3(e);
        e2 |= (e & 0xffu) << (8 * h);
    }
#pragma unroll
    for (int l = 0; l < 4; l++)
#pragma unroll
        for (int h = 0; h < 2; h++) m[2 * l + h] = __shfl_sync(kFull, s[h], base | (l * stride));
    return e2;
}

/* The thread's 8 rows of codes in both directions, each element unpacked
 * once; rp / cp: row 0's 8 codes in each copy. */
template <bool kE5>
__device__ __forceinline__ void whole_codes_v3(const uint32_t (&w)[8][8], const float (&sr)[8], const float (&sc)[8],
                                               uint8_t *rp, uint8_t *cp, size_t K)
{
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float f[8];
#pragma unroll
        for (int e = 0; e < 8; e++) f[e] = elem_v3<true>(w[i], e);
        *reinterpret_cast<uint2 *>(rp + i * K) =
            make_uint2(fp8x4_v3<kE5>(f[0] * sr[i], f[1] * sr[i], f[2] * sr[i], f[3] * sr[i]),
                       fp8x4_v3<kE5>(f[4] * sr[i], f[5] * sr[i], f[6] * sr[i], f[7] * sr[i]));
        *reinterpret_cast<uint2 *>(cp + i * K) =
            make_uint2(fp8x4_v3<kE5>(f[0] * sc[0], f[1] * sc[1], f[2] * sc[2], f[3] * sc[3]),
                       fp8x4_v3<kE5>(f[4] * sc[4], f[5] * sc[5], f[6] * sc[6], f[7] * sc[7]));
    }
}

/* A tile of a whole-tile batch: tensor k, first row and column. */
struct WholeTileV3 {
    uint32_t k;
    size_t r0, c0;
};

/* Tile u's place, searching from tensor k (u's tensor or an earlier one):
 * how many of the next 32 prefix sums are at most u, a lane each. */
__device__ __forceinline__ WholeTileV3 whole_tile_v3(const Params &p, uint32_t k, uint32_t u, int lane)
{
    for (;;) {
        const uint32_t j = k + 1 + (uint32_t)lane;
        const uint32_t n = __popc(__ballot_sync(kFull, j <= p.b.n && p.tile_start[j] <= u));
        k += n;
        if (n < 32) break;
    }
    const uint32_t local = u - p.tile_start[k], rt = local / p.tiles_c[k];
    return {k, (size_t)rt * kWideRows, (size_t)(local - rt * p.tiles_c[k]) * kWideCols};
}

/* The thread's 8 rows of tile w into its slots of one ring stage (one
 * commit group; each thread reads back only its own slots). */
__device__ __forceinline__ void whole_fetch_v3(const Params &p, const WholeTileV3 &w, const GeoV3 &g, uint4 *stage)
{
    const etp__qb_tensor_t &t = p.b.t[w.k];
    const size_t K = t.cols;
    const uint16_t *x = static_cast<const uint16_t *>(t.x) + (w.r0 + g.tr) * K + w.c0 + g.tc;
#pragma unroll
    for (int i = 0; i < 8; i++) cp_async16_v3(&stage[i * kThreads + g.tid], x + i * K);
}

/* Tiles blockIdx.x, + gridDim.x, ... of a whole-tile batch (p.tile_start:
 * the tiles' prefix sums, p.tiles_c[k]: tensor k's tile columns). The
 * input travels kWholeDepth tiles ahead through a ring of shared stages
 * (dynamic shared memory, kWholeDepth x 32 KiB): with one tile ahead the
 * kernel issued instructions 41% of the time and still took as long as
 * with 30% more of them (Nsight Compute, 64 x [1024, 512], H200): it
 * waited on the loads' latency. Scale bytes alternate between two shared
 * buffers, one barrier a tile, as in cast_kernel_v3. */
template <bool kE5>
__global__ void __launch_bounds__(kThreads, kWholeBlocksPerSm) cast_kernel_whole_v3(const __grid_constant__ Params p)
{
    const etp__qbatch_t &b = p.b;
    if (skipped(b)) return;
    __shared__ __align__(16) TileScales st[2];
    extern __shared__ __align__(16) uint4 ring[]; /* [kWholeDepth][8 rows][kThreads] */
    const uint32_t total = p.tile_start[b.n], G = gridDim.x;
    uint32_t u = blockIdx.x;
    if (u >= total) return;
    const GeoV3 g = geo_v3<true>();
    const float inv = etp__qf_mxfp8_inv_max(kE5 ? 1 : 0);
    const int qr = g.cg & 3, qc = g.rg;
    WholeTileV3 cur = whole_tile_v3(p, 0, u, g.lane), ld = cur;
    uint32_t lu = u; /* the last tile asked for */
    whole_fetch_v3(p, cur, g, ring);
    cp_async_commit_v3();
#pragma unroll
    for (int d = 1; d < kWholeDepth; d++) { /* a group each, empty past the end */
        if (lu + G < total) {
            lu += G;
            ld = whole_tile_v3(p, ld.k, lu, g.lane);
            whole_fetch_v3(p, ld, g, ring + d * 8 * kThreads);
        }
        cp_async_commit_v3();
    }
    int slot = 0;
    for (int par = 0;; par ^= 1) {
        const etp__qb_tensor_t &t = b.t[cur.k];
        const size_t K = t.cols, off = (cur.r0 + g.tr) * K + cur.c0 + g.tc;
        uint4 *stage = ring + slot * 8 * kThreads;
        cp_async_wait_v3<kWholeDepth - 1>(); /* this tile's group */
        uint4 lo[8];
#pragma unroll
        for (int i = 0; i < 8; i++) lo[i] = stage[i * kThreads + g.tid];
        uint32_t w[8][8];
        words_v3<true>(lo, lo, w);
        uint32_t bad = 0, er, ec;
        float sr[8], sc[8];
        {
            uint32_t a[8];
            rows_amax_v3<true, 1, 2>(w, a);
            er = whole_scales_v3(a, qr, g.lane & ~3, 1, inv, sr, &bad);
            cols_amax_v3<true, 8, 16>(w, a);
            ec = whole_scales_v3(a, qc, g.lane & 7, 8, inv, sc, &bad);
        }
        /* the stage just read takes the tile kWholeDepth on: its values
         * are consumed above (the amaxes depend on every word) before the
         * same thread's copies into it are issued, as the general
         * kernel's single stage does */
        if (lu + G < total) {
            lu += G;
            ld = whole_tile_v3(p, ld.k, lu, g.lane);
            whole_fetch_v3(p, ld, g, stage);
        }
        cp_async_commit_v3();
        if (__any_sync(kFull, bad != 0)) {
            mx_tile_safe_v3<true, true>(b, t, g, cur.r0 + g.tr, cur.c0 + g.tc, sub_v3(w), st[par]);
        } else {
            whole_codes_v3<kE5>(w, sr, sc, static_cast<uint8_t *>(t.row_data) + off,
                                static_cast<uint8_t *>(t.col_data) + off, K);
            *reinterpret_cast<uint16_t *>(mx_st_row<true>(st[par], g.tc, g.tr + 2 * qr)) = (uint16_t)er;
            *reinterpret_cast<uint16_t *>(mx_st_col<true>(st[par], g.wr, g.tc + 2 * qc)) = (uint16_t)ec;
        }
        __syncthreads();
        mx_wide_scales_out_v3(t, kFlRow | kFlCol, cur.r0, cur.c0, st[par]);
        u += G;
        if (u >= total) break;
        cur = whole_tile_v3(p, cur.k, u, g.lane);
        slot = slot + 1 == kWholeDepth ? 0 : slot + 1;
    }
}

/* Launches the whole-tile kernel for `batch` if every tensor qualifies
 * (*done set), else leaves it to the general one. */
inline cudaError_t launch_whole_v3(cudaStream_t s, const etp__qbatch_t *batch, Params &p, bool *done)
{
    *done = false;
    for (uint32_t k = 0; k < batch->n; k++)
        if (!whole_ok_v3(batch, batch->t[k])) return cudaSuccess;
    const uint64_t total = plan_units(batch, &p, [&](uint32_t k) -> uint64_t {
        const etp__qb_tensor_t &t = batch->t[k];
        p.tiles_c[k] = t.cols / kWideCols ? t.cols / kWideCols : 1;
        return (uint64_t)(t.rows / kWideRows) * (t.cols / kWideCols);
    });
    if (total > 0x7fffffffu) return cudaErrorInvalidValue;
    *done = true;
    if (total == 0) return cudaSuccess;
    const uint64_t most = (uint64_t)batch->sms * kWholeBlocksPerSm;
    const uint64_t grid = batch->sms && most < total ? most : total;
    void *args[] = {&p};
    const void *fn = batch->e5m2 ? (const void *)cast_kernel_whole_v3<true> : (const void *)cast_kernel_whole_v3<false>;
    /* the ring is beyond the 48 KiB a block gets without asking */
    const cudaError_t ea = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kWholeDyn);
    if (ea != cudaSuccess) return ea;
    return cudaLaunchKernel(fn, dim3((unsigned)grid), dim3(kThreads), args, kWholeDyn, s);
}

} // namespace etp__qk

#endif /* ETP__KERNELS_QUANT_CAST_V3_WHOLE_CUH */
