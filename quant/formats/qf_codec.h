/*
 * Element codecs of the block-scaled formats: E2M1 (FP4), E4M3 and E5M2
 * (FP8), E8M0 (power-of-two scales), BF16; and the per-tensor and per-block
 * scale rules of NVFP4 and MXFP8 (docs/FORMATS.md defines every result).
 *
 * Plain static inline functions on bits, with no state, usable from C and
 * from CUDA (__host__ __device__ under nvcc), so the host reference and the
 * kernels run the very same arithmetic and agree bit for bit. Every
 * operation is a single IEEE FP32 operation (or integer work); kernels that
 * include this header are compiled with --fmad=false so that nvcc does not
 * contract a multiply and an add into an FMA the host does not make.
 */
#ifndef ETP__QF_CODEC_H
#define ETP__QF_CODEC_H

#include <stdint.h>

#ifdef __CUDACC__
#define ETP__QF_HD static inline __host__ __device__
#else
#include <string.h>
#define ETP__QF_HD static inline
#endif

/* Largest finite FP32 (FLT_MAX), spelled out so device code needs no <float.h>. */
#define ETP__QF_FLT_MAX 3.40282346638528859812e+38f

/* ---- raw bits -------------------------------------------------------- */

ETP__QF_HD uint32_t etp__qf_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

ETP__QF_HD float etp__qf_float(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

ETP__QF_HD int etp__qf_isnan(float f)
{
    return (etp__qf_bits(f) & 0x7fffffffu) > 0x7f800000u;
}

/* Any NaN as the one quiet NaN 0x7FC00000: x86 propagates an operand's NaN
 * (and makes 0xFFC00000 for Inf * 0), CUDA makes 0x7FFFFFFF, so every
 * dequantized value passes through here to be the same bits on both. */
ETP__QF_HD float etp__qf_canon(float f)
{
    return etp__qf_isnan(f) ? etp__qf_float(0x7fc00000u) : f;
}

/* max(a, |x|) where a NaN x is ignored (fmaxf semantics, as TransformerEngine's
 * amax): the amax of a tensor or block is the largest magnitude among its
 * non-NaN elements (+Inf if any is infinite), 0 for no elements. Written on
 * bits so that host and device need not agree on fmaxf's handling of -0. */
ETP__QF_HD float etp__qf_amax_step(float a, float x)
{
    uint32_t m = etp__qf_bits(x) & 0x7fffffffu;
    if (m > 0x7f800000u) return a;
    /* non-negative floats order like their bits */
    return m > etp__qf_bits(a) ? etp__qf_float(m) : a;
}

/* ---- BF16 ---------------------------------------------------------------- */

ETP__QF_HD float etp__qf_bf16_to_f32(uint16_t h)
{
    return etp__qf_float((uint32_t)h << 16);
}

/* Round to nearest even; NaN stays a (quiet) NaN of the same sign. */
ETP__QF_HD uint16_t etp__qf_f32_to_bf16(float f)
{
    uint32_t u = etp__qf_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* ---- rounding to a narrow float ------------------------------------------ */

/* The unsigned code of the narrow value nearest to the magnitude whose FP32
 * bits are `a` (sign cleared, not NaN), ties to even, in a format with
 * `mbits` explicit mantissa bits, exponent bias `bias` and subnormals; a code
 * above `maxcode` (the largest finite value) saturates to it, which is what
 * "satfinite" means: +Inf and anything past the largest finite value give the
 * largest finite value. Exact integer arithmetic on the FP32 significand. */
ETP__QF_HD uint32_t etp__qf_rne_code(uint32_t a, int mbits, int bias, uint32_t maxcode)
{
    int e = (int)(a >> 23) - 127;
    uint32_t mant = (a & 0x7fffffu) | 0x800000u;
    if ((a >> 23) == 0) { /* FP32 subnormal: no implicit bit */
        e = -126;
        mant = a & 0x7fffffu;
    }
    /* every format here has its largest finite value below 2^16 */
    if (e > 16) return maxcode;
    const int emin = 1 - bias;                     /* exponent of the smallest normal */
    const int qe = (e > emin ? e : emin) - mbits;  /* exponent of one unit in the last place */
    const int shift = qe - (e - 23);               /* >= 23 - mbits >= 20 */
    uint32_t n = 0;
    if (shift <= 25) { /* beyond 25 the value is below a quarter unit: 0 */
        n = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (n & 1u))) n++;
    }
    /* n counts units of 2^qe: in a normal binade the implicit bit is part of
     * n, and a carry into the next binade lands on the next exponent code. */
    const int be = e + bias > 1 ? e + bias : 1;
    const uint32_t code = ((uint32_t)(be - 1) << mbits) + n;
    return code > maxcode ? maxcode : code;
}

/* ---- E4M3 (float8_e4m3fn): bias 7, no Inf, NaN = S.1111.111, max 448 ---- */

/* rne_satfinite: NaN -> 0x7F (whatever its sign: the sign of a NaN that
 * arithmetic makes differs between x86 and CUDA, so it carries nothing);
 * +-Inf and |x| > 448 -> +-448 (0x7E/0xFE); zeros keep their sign. */
ETP__QF_HD uint8_t etp__qf_e4m3_rne_satfinite(float x)
{
    const uint32_t u = etp__qf_bits(x), s = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fu;
    return (uint8_t)(s | etp__qf_rne_code(a, 3, 7, 0x7eu));
}

ETP__QF_HD float etp__qf_e4m3_to_f32(uint8_t c)
{
    const uint32_t s = (uint32_t)(c & 0x80u) << 24, e = (c >> 3) & 0xfu, m = c & 7u;
    if (e == 15 && m == 7) return etp__qf_float(s | 0x7fc00000u);
    if (e == 0) {
        const float v = (float)m * 0.001953125f; /* m * 2^-9, exact */
        return s ? -v : v;
    }
    return etp__qf_float(s | ((e + 120u) << 23) | (m << 20));
}

/* ---- E5M2 (float8_e5m2): bias 15, IEEE-like, max 57344 ------------------- */

/* rne_satfinite: NaN -> 0x7E (sign dropped, as for E4M3); +-Inf and
 * |x| > 57344 -> +-57344 (0x7B/0xFB). */
ETP__QF_HD uint8_t etp__qf_e5m2_rne_satfinite(float x)
{
    const uint32_t u = etp__qf_bits(x), s = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7eu;
    return (uint8_t)(s | etp__qf_rne_code(a, 2, 15, 0x7bu));
}

ETP__QF_HD float etp__qf_e5m2_to_f32(uint8_t c)
{
    const uint32_t s = (uint32_t)(c & 0x80u) << 24, e = (c >> 2) & 0x1fu, m = c & 3u;
    if (e == 31) return etp__qf_float(s | (m ? 0x7fc00000u : 0x7f800000u));
    if (e == 0) {
        const float v = (float)m * 1.52587890625e-05f; /* m * 2^-16, exact */
        return s ? -v : v;
    }
    return etp__qf_float(s | ((e + 112u) << 23) | (m << 21));
}

/* ---- E2M1 (float4_e2m1fn): +-{0, 0.5, 1, 1.5, 2, 3, 4, 6}, 4 bits -------- */

/* rne_satfinite into the low nibble: |x| > 6 and +-Inf -> +-6 (0x7/0xF);
 * zeros keep their sign (-0 -> 0x8). E2M1 has no NaN: NaN -> 0x7 (+6), the
 * format's largest finite value, as the hardware's satfinite conversion
 * does; a NaN in a tensor is for the caller's amax check to find. */
ETP__QF_HD uint8_t etp__qf_e2m1_rne_satfinite(float x)
{
    const uint32_t u = etp__qf_bits(x), s = (u >> 28) & 0x8u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7u;
    return (uint8_t)(s | etp__qf_rne_code(a, 1, 1, 0x7u));
}

ETP__QF_HD float etp__qf_e2m1_to_f32(uint8_t c)
{
    /* 2 * value, as small integers: no table in device memory needed */
    const uint32_t m = c & 7u;
    const float twice = m < 4 ? (float)m : (float)((m & 1u ? 3u : 2u) << ((m >> 1) - 1u));
    const float v = twice * 0.5f;
    return (c & 8u) ? -v : v;
}

/* Stochastic rounding to E2M1 (satfinite): with lo <= |x| < hi the two
 * neighbouring magnitudes, round up to hi when u < (|x| - lo) / (hi - lo),
 * u = (r >> 8) * 2^-24 from the 32 random bits r. Every step is exact in
 * FP32 (the spacing is a power of two and lo <= |x| <= 2 lo or lo = 0), so
 * the probability is exactly the distance ratio quantized to 2^-24.
 * NaN -> 0x7; |x| >= 6 -> +-6; exact grid values are returned as they are. */
ETP__QF_HD uint8_t etp__qf_e2m1_sr_satfinite(float x, uint32_t r)
{
    const uint32_t u = etp__qf_bits(x), s = (u >> 28) & 0x8u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7u;
    const float v = etp__qf_float(a);
    if (v >= 6.0f) return (uint8_t)(s | 0x7u);
    uint32_t k = 0; /* the code of lo */
    while (k < 7 && etp__qf_e2m1_to_f32((uint8_t)(k + 1)) <= v) k++;
    const float lo = etp__qf_e2m1_to_f32((uint8_t)k);
    if (v == lo) return (uint8_t)(s | k);
    const float hi = etp__qf_e2m1_to_f32((uint8_t)(k + 1));
    const float frac = (v - lo) / (hi - lo);
    const float draw = (float)(r >> 8) * 5.9604644775390625e-08f; /* 2^-24 */
    return (uint8_t)(s | (draw < frac ? k + 1 : k));
}

/* ---- fast equivalents of the rne_satfinite conversions ------------------ */

/* Branch-free versions of etp__qf_{e4m3,e5m2,e2m1}_rne_satfinite for the
 * kernels' hot loops, equal to them for every one of the 2^32 FP32 inputs
 * (tests/unit/test_quant_formats.c sweeps them; the generic
 * etp__qf_rne_code stays the definition). In a normal binade of the narrow
 * format, rounding to `mbits` mantissa bits is an integer add on the FP32
 * bits: add half an output unit minus one, plus the lowest kept bit (ties go
 * to the even code), and shift; a carry out of the mantissa lands on the
 * next exponent as it should. Below the smallest normal the unit is fixed:
 * v * 2^k is a small integer plus a fraction, rounded to nearest even by
 * adding and subtracting 2^23 (both exact IEEE operations; v * 2^k is exact,
 * a scaling by a power of two). Codes past the largest finite one (and
 * +-Inf) are clamped to it. `minnorm` is the FP32 bits of the smallest
 * normal, `bias_code` the code offset between the FP32 exponent and the
 * narrow one, `sub_scale` 2^k with 2^-k the subnormal unit. */
ETP__QF_HD uint32_t etp__qf_rne_code_fast(uint32_t a, int mbits, uint32_t minnorm, uint32_t bias_code,
                                          float sub_scale, uint32_t maxcode)
{
    const int sh = 23 - mbits;
    const uint32_t n = (a + ((1u << (sh - 1)) - 1u) + ((a >> sh) & 1u)) >> sh;
    const uint32_t normal = n - bias_code; /* only used when a >= minnorm: no wrap */
    /* the subnormal path on a value that cannot overflow when a is large */
    const float f = etp__qf_float(a < minnorm ? a : 0u) * sub_scale;
    const uint32_t sub = (uint32_t)((f + 8388608.0f) - 8388608.0f);
    const uint32_t code = a < minnorm ? sub : normal;
    return code < maxcode ? code : maxcode;
}

ETP__QF_HD uint8_t etp__qf_e4m3_rne_satfinite_fast(float x)
{
    const uint32_t u = etp__qf_bits(x), s = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fu;
    /* smallest normal 2^-6, exponent offset (127 - 7) << 3, subnormal unit 2^-9 */
    return (uint8_t)(s | etp__qf_rne_code_fast(a, 3, 0x3c800000u, 960u, 512.0f, 0x7eu));
}

ETP__QF_HD uint8_t etp__qf_e5m2_rne_satfinite_fast(float x)
{
    const uint32_t u = etp__qf_bits(x), s = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7eu;
    /* smallest normal 2^-14, exponent offset (127 - 15) << 2, subnormal unit 2^-16 */
    return (uint8_t)(s | etp__qf_rne_code_fast(a, 2, 0x38800000u, 448u, 65536.0f, 0x7bu));
}

ETP__QF_HD uint8_t etp__qf_e2m1_rne_satfinite_fast(float x)
{
    const uint32_t u = etp__qf_bits(x), s = (u >> 28) & 0x8u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7u;
    /* smallest normal 1, exponent offset (127 - 1) << 1, subnormal unit 1/2 */
    return (uint8_t)(s | etp__qf_rne_code_fast(a, 1, 0x3f800000u, 252u, 2.0f, 0x7u));
}

/* etp__qf_e2m1_sr_satfinite without the search and the division, equal to
 * it for every input and every r (tests/unit/test_quant_formats.c), mostly
 * in integers. With n = r >> 8 the draw's 24 bits, "draw < frac" is
 * n < frac * 2^24, and frac * 2^24 is an integer read off |x|'s bits in the
 * normal binades: from 1 up, where one mantissa bit is kept (lo truncates
 * the other 22, spacing 2^(e-1)), frac * 2^24 = 4 * (those 22 bits), so
 * n < it iff (n >> 2) < them, and the code of lo is (bits >> 22) - 252;
 * in [0.5, 1) (lo 0.5, spacing 0.5) frac * 2^24 = 2 * (the 23 mantissa
 * bits). Below 0.5 (lo 0) frac * 2^24 = |x| * 2^25, an exact float
 * (subnormals included) that the exact float of n is compared with. */
ETP__QF_HD uint8_t etp__qf_e2m1_sr_satfinite_fast(float x, uint32_t r)
{
    const uint32_t u = etp__qf_bits(x), s = (u >> 28) & 0x8u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7u;
    if (a >= 0x40c00000u) return (uint8_t)(s | 0x7u); /* |x| >= 6: nothing above to round to */
    const uint32_t n = r >> 8;
    const int ge1 = a >= 0x3f800000u, ge_half = a >= 0x3f000000u;
    const uint32_t k = ge1 ? (a >> 22) - 252u : (uint32_t)ge_half;
    const int up = ge1 ? (n >> 2) < (a & 0x3fffffu)
                        : ge_half ? (n >> 1) < (a & 0x7fffffu)
                                  : (float)n < etp__qf_float(a) * 33554432.0f; /* 2^25 */
    return (uint8_t)(s | (k + (uint32_t)up));
}

/* ---- magic-number conversions (the v3 cast kernel's hot loops) ----------- */

/* Rounding a >= +0 to a narrow format in one FP32 addition, a + M: M is
 * 2^(E - 127 + 23 - mbits) for E = max(e, emin), e the FP32 exponent field
 * of a and emin that of the narrow format's smallest normal, so one unit in
 * the last place of M is the narrow spacing in a's binade (the subnormal
 * spacing below emin) and the IEEE addition rounds a to nearest even on the
 * narrow grid; M also carries (E - emin) << mbits in its low mantissa bits,
 * the narrow exponent, which makes the low byte of the sum's bits the narrow
 * code (an even offset: ties still go to the even code). M's bits are
 * E * k + c, k = 2^23 + 2^mbits, c = ((23 - mbits) << 23) - (emin << mbits):
 * a shift, a max and a multiply-add, no branch and no conversion
 * instruction (the `fast` functions above need a float-to-int conversion
 * and a select). The sum stays in M's binade only for small enough a: each
 * wrapper below states its range, and tests/unit/test_quant_formats.c sweeps
 * it against the definitions. */
ETP__QF_HD uint32_t etp__qf_magic_m(float a, uint32_t emin, uint32_t k, uint32_t c)
{
    const uint32_t e = etp__qf_bits(a) >> 23;
    return (e > emin ? e : emin) * k + c;
}

/* The bits of a + M (its low byte is the code); the kernel packs codes
 * straight from these bits. */
ETP__QF_HD uint32_t etp__qf_round_magic(float a, uint32_t emin, uint32_t k, uint32_t c)
{
    return etp__qf_bits(a + etp__qf_float(etp__qf_magic_m(a, emin, k, c)));
}

/* (emin, k, c) of the three element formats. */
#define ETP__QF_MAGIC_E2M1 127u, 0x00800002u, (22u << 23) - (127u << 1)
#define ETP__QF_MAGIC_E4M3 121u, 0x00800008u, (20u << 23) - (121u << 3)
#define ETP__QF_MAGIC_E5M2 113u, 0x00800004u, (21u << 23) - (113u << 2)

/* Below this bound the E2M1 magic addition needs no clamp: every +0 <= a <
 * 7 rounds to at most 6 and its sum stays in M's binade (7 itself would be
 * a tie going to the even 8, past the format). The cast kernel skips the
 * clamp for 16x16 blocks whose largest product is below it (the multiply
 * is monotonic, so no element's product is larger); test_quant_formats
 * checks every input up to it. */
#define ETP__QF_E2M1_UNCLAMPED_BELOW 7.0f

/* etp__qf_e2m1_rne_satfinite(a) for +0 <= a < ETP__QF_E2M1_UNCLAMPED_BELOW,
 * no clamp. */
ETP__QF_HD uint8_t etp__qf_e2m1_magic_unclamped(float a)
{
    return (uint8_t)(etp__qf_round_magic(a, ETP__QF_MAGIC_E2M1) & 0xfu);
}

/* etp__qf_e2m1_rne_satfinite(x) for every non-NaN x: |x| clamped to 6 first
 * (which also makes +-Inf and beyond +-6). */
ETP__QF_HD uint8_t etp__qf_e2m1_rne_satfinite_magic(float x)
{
    const uint32_t u = etp__qf_bits(x);
    float a = etp__qf_float(u & 0x7fffffffu);
    a = a < 6.0f ? a : 6.0f;
    return (uint8_t)(((u >> 28) & 8u) | (etp__qf_round_magic(a, ETP__QF_MAGIC_E2M1) & 0xfu));
}

/* The E4M3 magnitude code of +0 <= a <= 464 (etp__qf_e4m3_rne_satfinite(a)). */
ETP__QF_HD uint8_t etp__qf_e4m3_magic(float a)
{
    return (uint8_t)etp__qf_round_magic(a, ETP__QF_MAGIC_E4M3);
}

/* The E5M2 magnitude code of +0 <= a < 61440 (etp__qf_e5m2_rne_satfinite(a)). */
ETP__QF_HD uint8_t etp__qf_e5m2_magic(float a)
{
    return (uint8_t)etp__qf_round_magic(a, ETP__QF_MAGIC_E5M2);
}

/* etp__qf_nvfp4_block_scale(block_amax, s_enc_6) for a non-NaN block_amax,
 * and in *value the scale's value (etp__qf_e4m3_to_f32 of it): the sum
 * minus M, exact (both lie in one binade). Saturation first: a product
 * beyond 464 (+Inf included) gives 448 like 464 itself (the tie goes to
 * the even 0x7E). */
ETP__QF_HD uint8_t etp__qf_nvfp4_block_scale_magic(float block_amax, float s_enc_6, float *value)
{
    float v = block_amax * s_enc_6;
    v = v < 464.0f ? v : 464.0f;
    const uint32_t m = etp__qf_magic_m(v, ETP__QF_MAGIC_E4M3);
    const uint32_t f = etp__qf_bits(v + etp__qf_float(m));
    *value = etp__qf_float(f) - etp__qf_float(m);
    return (uint8_t)f;
}

/* MXFP8 element with the fast conversion (etp__qf_mxfp8_encode's result). */
ETP__QF_HD uint8_t etp__qf_mxfp8_encode_fast(float x, float s, int e5m2)
{
    const float v = x * s;
    return e5m2 ? etp__qf_e5m2_rne_satfinite_fast(v) : etp__qf_e4m3_rne_satfinite_fast(v);
}

/* ---- E8M0 (float8_e8m0fnu): 2^(c - 127), c = 0..254, 0xFF NaN ----------- */

/* Round up to a power of two, as TransformerEngine's software path does:
 * NaN -> 0xFF; +-Inf -> 0xFE; +-0 -> 0x00; otherwise the FP32 exponent field,
 * plus one if the mantissa is non-zero, except that an exponent field of
 * 0xFE is not raised (saturation) and an FP32 subnormal <= 2^-127 stays 0.
 * For finite v > 0 this is the smallest 2^(c-127) >= v, clamped to
 * [2^-127, 2^127]. Callers pass non-negative values (amax * 1/max). */
ETP__QF_HD uint8_t etp__qf_e8m0_round_up(float v)
{
    const uint32_t u = etp__qf_bits(v), a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0xffu;
    if (a == 0x7f800000u) return 0xfeu;
    if (a == 0) return 0x00u;
    uint32_t e = (u >> 23) & 0xffu;
    const uint32_t mant = u & 0x7fffffu;
    if (mant > 0 && e != 0xfeu && !(e == 0 && mant <= 0x400000u)) e++;
    return (uint8_t)e;
}

ETP__QF_HD float etp__qf_e8m0_to_f32(uint8_t c)
{
    if (c == 0xffu) return etp__qf_float(0x7fc00000u);
    if (c == 0) return etp__qf_float(0x00400000u); /* 2^-127, an FP32 subnormal */
    return etp__qf_float((uint32_t)c << 23);
}

/* ---- MXFP8 --------------------------------------------------------------- */

/* The reciprocal of the largest finite element value, computed once in FP32
 * and multiplied (never divided) by the block amax: 1/448 or 1/57344. */
ETP__QF_HD float etp__qf_mxfp8_inv_max(int e5m2)
{
    return e5m2 ? 1.0f / 57344.0f : 1.0f / 448.0f;
}

/* The block's scale code: e8m0_round_up(block_amax * inv_max). */
ETP__QF_HD uint8_t etp__qf_mxfp8_scale(float block_amax, float inv_max)
{
    return etp__qf_e8m0_round_up(block_amax * inv_max);
}

/* The element multiplier s = 2^(127 - e), built from exponent bits as
 * TransformerEngine does: the FP32 with exponent field 254 - e, and 1 when
 * e = 0. So e = 0xFE (an infinite block amax) gives 0.0 and e = 0xFF gives
 * -Inf; docs/FORMATS.md lists what that makes of the elements. The field is
 * computed in unsigned arithmetic (wrapping) to stay defined in C. */
ETP__QF_HD float etp__qf_mxfp8_multiplier(uint8_t e)
{
    if (e == 0) return 1.0f;
    return etp__qf_float((uint32_t)(254u - (uint32_t)e) << 23);
}

ETP__QF_HD uint8_t etp__qf_mxfp8_encode(float x, float s, int e5m2)
{
    const float v = x * s;
    return e5m2 ? etp__qf_e5m2_rne_satfinite(v) : etp__qf_e4m3_rne_satfinite(v);
}

/* Dequantized element: element value times 2^(e - 127) (one FP32 multiply;
 * a NaN element or scale gives the canonical NaN). */
ETP__QF_HD float etp__qf_mxfp8_decode(uint8_t c, uint8_t e, int e5m2)
{
    const float v = e5m2 ? etp__qf_e5m2_to_f32(c) : etp__qf_e4m3_to_f32(c);
    return etp__qf_canon(v * etp__qf_e8m0_to_f32(e));
}

/* ---- NVFP4 --------------------------------------------------------------- */

/* Per-tensor encode scale S_enc = 448 * 6 / amax, in FP32; 1 when amax is 0,
 * or S_enc is not finite (amax NaN, or so small that the quotient
 * overflows), or S_enc is 0 (amax = +Inf). */
ETP__QF_HD float etp__qf_nvfp4_s_enc(float amax)
{
    const float s = 2688.0f / amax;
    const uint32_t sa = etp__qf_bits(s) & 0x7fffffffu;
    if (amax == 0.0f || sa >= 0x7f800000u || sa == 0) return 1.0f;
    return s;
}

/* Block decode scale S_dec_b = e4m3_rne_satfinite(block_amax * (S_enc * (1/6))),
 * in exactly this order; s_enc_6 = S_enc * (1/6) is computed once per tensor. */
ETP__QF_HD uint8_t etp__qf_nvfp4_block_scale(float block_amax, float s_enc_6)
{
    return etp__qf_e4m3_rne_satfinite(block_amax * s_enc_6);
}

ETP__QF_HD float etp__qf_nvfp4_s_enc_6(float s_enc)
{
    return s_enc * (1.0f / 6.0f);
}

/* Element multiplier m = 1 / (float(S_dec_b) * (1 / S_enc)), clamped to
 * FLT_MAX (an all-zero block has S_dec_b = 0: m = FLT_MAX, its elements stay
 * +-0). s_dec = 1 / S_enc, computed once per tensor. */
ETP__QF_HD float etp__qf_nvfp4_multiplier(uint8_t scale, float s_dec)
{
    const float m = 1.0f / (etp__qf_e4m3_to_f32(scale) * s_dec);
    return m < ETP__QF_FLT_MAX ? m : ETP__QF_FLT_MAX; /* +Inf -> FLT_MAX */
}

/* Dequantized element: e2m1 value times (float(S_dec_b) * S_dec) (a NaN
 * scale gives the canonical NaN). */
ETP__QF_HD float etp__qf_nvfp4_decode(uint8_t nibble, uint8_t scale, float s_dec)
{
    return etp__qf_canon(etp__qf_e2m1_to_f32(nibble) * (etp__qf_e4m3_to_f32(scale) * s_dec));
}

/* ---- Philox4x32-10 (stochastic rounding) --------------------------------- */

ETP__QF_HD void etp__qf_philox(uint32_t ctr[4], uint32_t k0, uint32_t k1)
{
    for (int round = 0; round < 10; round++) {
        const uint64_t p0 = (uint64_t)0xD2511F53u * ctr[0];
        const uint64_t p1 = (uint64_t)0xCD9E8D57u * ctr[2];
        const uint32_t c0 = (uint32_t)(p1 >> 32) ^ ctr[1] ^ k0;
        const uint32_t c2 = (uint32_t)(p0 >> 32) ^ ctr[3] ^ k1;
        ctr[1] = (uint32_t)p1;
        ctr[3] = (uint32_t)p0;
        ctr[0] = c0;
        ctr[2] = c2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

/* The 32 random bits of element `index` (row * cols + col of the [rows,
 * cols] input) of tensor `tensor` in direction `dir` (0 rowwise, 1
 * columnwise), under `seed`: word index % 4 of Philox4x32-10 with key seed
 * and counter (index / 4 low, high, tensor, dir). */
ETP__QF_HD uint32_t etp__qf_sr_bits(uint64_t seed, uint32_t tensor, uint32_t dir, uint64_t index)
{
    const uint64_t q = index >> 2;
    uint32_t c[4] = {(uint32_t)q, (uint32_t)(q >> 32), tensor, dir};
    etp__qf_philox(c, (uint32_t)seed, (uint32_t)(seed >> 32));
    return c[index & 3u];
}

#endif /* ETP__QF_CODEC_H */
