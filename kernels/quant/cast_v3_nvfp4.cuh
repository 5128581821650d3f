/*
 * The v3 cast (cast_v3.cu, which alone includes this): an NVFP4 tile, its
 * columnwise codes staged in shared memory.
 */
#ifndef ETP__KERNELS_QUANT_CAST_V3_NVFP4_CUH
#define ETP__KERNELS_QUANT_CAST_V3_NVFP4_CUH

#include "cast_v3_convert.cuh"

namespace etp__qk {

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
 * 16-byte reads conflict-free. The rowwise codes were once staged the
 * same way; stored straight from registers (whole sectors
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
    nv_out_v3(t.row_data, t.rows, t.cols, R, C, w);
}

__device__ __forceinline__ void nv_cols_out_v3(const etp__qb_tensor_t &t, size_t R, size_t C,
                                               const uint32_t (&w)[8], uint8_t *stage)
{
    if (stage)
        stage_put_v3(stage, (int)(C % kTileV3), (int)(R % kTileV3), w);
    else
        nv_out_v3(t.col_data, t.cols, t.rows, C, R, w);
}

/* ---- v3 NVFP4 ------------------------------------------------------------- */

/* The per-element path (a NaN in the warp's blocks): the codec's conversions,
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
        piece_amax_safe_v3<kBf>(w, ra, ca);
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

/* 1D blocks: of a block's 8 amaxes a (rows or columns) the lane computes
 * half h's 4 scales and multipliers and trades multipliers with the block's
 * other lane (lane ^ X), which computed the other half; returns the 4
 * scale bytes, sets m, and flags a NaN amax in *bad. */
template <int X>
__device__ __forceinline__ uint32_t nv_half_mults_v3(const uint32_t (&a)[8], int h, float s_enc_6, float s_dec,
                                                     float (&m)[8], uint32_t *bad)
{
    uint32_t bytes = 0;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const uint32_t x = h ? a[4 + q] : a[q];
        *bad |= x > 0x7f800000u;
        uint8_t s;
        const float mine = nv_mult_v3(x, s_enc_6, s_dec, &s);
        bytes |= (uint32_t)s << (8 * q);
        const float other = __shfl_xor_sync(kFull, mine, X);
        m[q] = h ? other : mine;
        m[4 + q] = h ? mine : other;
    }
    return bytes;
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
        if (__any_sync(kFull, !(__uint_as_float(a) * m < ETP__QF_E2M1_UNCLAMPED_BELOW))) {
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
        sr = nv_half_mults_v3<1>(ra, hr, s_enc_6, s_dec, mr, &bad);
    }
    if (cold) {
        uint32_t ca[8];
        cols_amax_v3<kBf, 8, 0>(w, ca);
        sc = nv_half_mults_v3<8>(ca, hc, s_enc_6, s_dec, mc, &bad);
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


} // namespace etp__qk

#endif /* ETP__KERNELS_QUANT_CAST_V3_NVFP4_CUH */
