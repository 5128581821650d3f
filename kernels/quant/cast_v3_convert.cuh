/*
 * The v3 cast (cast_v3.cu, which alone includes this): block amaxes, code
 * conversion and packing, data stores.
 */
#ifndef ETP__KERNELS_QUANT_CAST_V3_CONVERT_CUH
#define ETP__KERNELS_QUANT_CAST_V3_CONVERT_CUH

#include "cast_v3_tile.cuh"

namespace etp__qk {

/* ---- v3 amaxes: |x| maxima as FP32 bits with a NaN counting as the largest
 * (the caller looks for one and then takes the per-element path) --------- */

/* The per-element paths' amaxes of the thread's 8x8 piece, each row's (ra)
 * and each column's (ca) over this lane's elements, skipping NaNs as the
 * reference does (amax_bits); the callers reduce them over lanes. */
template <bool kBf>
__device__ __forceinline__ void piece_amax_safe_v3(const uint32_t (&w)[8][8], uint32_t (&ra)[8], uint32_t (&ca)[8])
{
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
}

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


} // namespace etp__qk

#endif /* ETP__KERNELS_QUANT_CAST_V3_CONVERT_CUH */
