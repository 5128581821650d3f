/*
 * The v3 cast (cast_v3.cu, which alone includes this): an MXFP8 tile.
 */
#ifndef ETP__KERNELS_QUANT_CAST_V3_MXFP8_CUH
#define ETP__KERNELS_QUANT_CAST_V3_MXFP8_CUH

#include "cast_v3_convert.cuh"

namespace etp__qk {

/* ---- v3 MXFP8 ------------------------------------------------------------- */

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

template <bool kBf, bool kWide>
__device__ __noinline__ void mx_tile_safe_v3(const etp__qbatch_t &b, const etp__qb_tensor_t &t, GeoV3 g,
                                             size_t R, size_t C, const SubV3 sub, TileScales &st)
{
    const uint32_t (&w)[8][8] = sub.w;
    const int e5m2 = (int)b.e5m2;
    const float inv = etp__qf_mxfp8_inv_max(e5m2);
    uint32_t ra[8], ca[8];
    piece_amax_safe_v3<kBf>(w, ra, ca);
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
        if (e5m2)
            mx_codes_out_v3<kBf, true>(t.row_data, t, R, C, w, sr, sc, false);
        else
            mx_codes_out_v3<kBf, false>(t.row_data, t, R, C, w, sr, sc, false);
        *reinterpret_cast<uint16_t *>(mx_st_row<kWide>(st, g.tc, g.tr + 2 * qr)) = (uint16_t)er;
    }
    if (cold) {
        if (e5m2)
            mx_codes_out_v3<kBf, true>(t.col_data, t, R, C, w, sr, sc, true);
        else
            mx_codes_out_v3<kBf, false>(t.col_data, t, R, C, w, sr, sc, true);
        *reinterpret_cast<uint16_t *>(mx_st_col<kWide>(st, g.wr, g.tc + 2 * qc)) = (uint16_t)ec;
    }
}


} // namespace etp__qk

#endif /* ETP__KERNELS_QUANT_CAST_V3_MXFP8_CUH */
