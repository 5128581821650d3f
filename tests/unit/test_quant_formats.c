/*
 * The element codecs, layouts and host reference quantizer of quant/formats
 * against references computed outside etp: ml_dtypes' conversions and
 * block-quantized tensors computed with numpy from the definitions
 * (tests/data/quant, made by tools/gen_quant_vectors.py), stochastic
 * rounding included (an independent Philox4x32-10, blocks_sr.txt);
 * saturation, round-up and special values from the definitions in
 * docs/FORMATS.md; every element code round-trips; dequantization exact,
 * element by element, against the documented decode done in this file; and
 * properties of quantize -> dequantize on fresh random data from a printed
 * seed.
 */
#include <math.h>

#include "test_util.h"
#include "quant/formats/qf_codec.h"
#include "quant/formats/qf_layout.h"
#include "quant/formats/quant_ref.h"

#ifndef ETP_TEST_DATA_DIR
#error "ETP_TEST_DATA_DIR must name tests/data (set by tests/quant.cmake)"
#endif

static uint64_t g_seed;

static FILE *open_data(const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/quant/%s", ETP_TEST_DATA_DIR, name);
    FILE *f = fopen(path, "r");
    if (!f) print_error("cannot open %s\n", path);
    assert_non_null(f);
    return f;
}

static float f32_of(uint32_t u)
{
    return etp__qf_float(u);
}

/* Two floats are the same result: equal bits, or both NaN (payloads of a
 * NaN are not part of any definition here). */
static int same_float(float a, float b)
{
    return etp__qf_bits(a) == etp__qf_bits(b) || (isnan(a) && isnan(b));
}

typedef uint8_t (*enc_fn)(float);
typedef float (*dec_fn)(uint8_t);

/* "enc <f32> <code>" and "dec <code> <f32>" lines of one element file. */
static void check_element_file(const char *name, enc_fn enc, dec_fn dec, int *n_enc, int *n_dec)
{
    FILE *f = open_data(name);
    char line[256], kind[8];
    int bad = 0;
    *n_enc = *n_dec = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned a, b;
        if (line[0] == '#' || sscanf(line, "%7s %x %x", kind, &a, &b) != 3) continue;
        if (strcmp(kind, "enc") == 0) {
            const uint8_t got = enc(f32_of(a));
            (*n_enc)++;
            if (got != b && bad++ < 10)
                print_error("%s: encode(%.9g = 0x%08x) = 0x%02x, expected 0x%02x\n", name,
                            (double)f32_of(a), a, got, b);
        } else if (strcmp(kind, "dec") == 0) {
            const float got = dec((uint8_t)a);
            (*n_dec)++;
            if (!same_float(got, f32_of(b)) && bad++ < 10)
                print_error("%s: decode(0x%02x) = %.9g, expected %.9g\n", name, a, (double)got,
                            (double)f32_of(b));
        }
    }
    fclose(f);
    assert_int_equal(bad, 0);
}

static uint8_t e2m1_enc(float x) { return etp__qf_e2m1_rne_satfinite(x); }
static float e2m1_dec(uint8_t c) { return etp__qf_e2m1_to_f32(c); }
static uint8_t e4m3_enc(float x) { return etp__qf_e4m3_rne_satfinite(x); }
static float e4m3_dec(uint8_t c) { return etp__qf_e4m3_to_f32(c); }
static uint8_t e5m2_enc(float x) { return etp__qf_e5m2_rne_satfinite(x); }
static float e5m2_dec(uint8_t c) { return etp__qf_e5m2_to_f32(c); }
static uint8_t e8m0_enc(float x) { return etp__qf_e8m0_round_up(x); }
static float e8m0_dec(uint8_t c) { return etp__qf_e8m0_to_f32(c); }

static void test_vectors_e4m3(void **state)
{
    (void)state;
    int ne, nd;
    check_element_file("e4m3.txt", e4m3_enc, e4m3_dec, &ne, &nd);
    assert_true(ne > 2000);
    assert_int_equal(nd, 256);
}

static void test_vectors_e5m2(void **state)
{
    (void)state;
    int ne, nd;
    check_element_file("e5m2.txt", e5m2_enc, e5m2_dec, &ne, &nd);
    assert_true(ne > 2000);
    assert_int_equal(nd, 256);
}

static void test_vectors_e2m1(void **state)
{
    (void)state;
    int ne, nd;
    check_element_file("e2m1.txt", e2m1_enc, e2m1_dec, &ne, &nd);
    assert_true(ne > 1500);
    assert_int_equal(nd, 16);
}

static void test_vectors_e8m0(void **state)
{
    (void)state;
    int ne, nd;
    check_element_file("e8m0.txt", e8m0_enc, e8m0_dec, &ne, &nd);
    assert_int_equal(nd, 256);
    assert_int_equal(ne, 255);
    /* "up <f32> <code>": the smallest power of two >= v, clamped */
    FILE *f = open_data("e8m0.txt");
    char line[256];
    int n = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned a, b;
        if (sscanf(line, "up %x %x", &a, &b) != 2) continue;
        n++;
        const uint8_t got = etp__qf_e8m0_round_up(f32_of(a));
        if (got != b && bad++ < 10)
            print_error("e8m0_round_up(%.9g) = 0x%02x, expected 0x%02x\n", (double)f32_of(a), got, b);
    }
    fclose(f);
    assert_true(n > 1000);
    assert_int_equal(bad, 0);
}

/* Saturation, special values and the E8M0 exceptions, from the definitions. */
/* The kernels' branch-free conversions equal the definitions: every BF16
 * pattern (with several low halves: ties, one past, all ones) and a stride
 * through all 2^32 FP32 patterns. (An exhaustive sweep of all 2^32 agreed
 * when they were written, the magic ones included; it takes minutes, too
 * long for every run.) */
static void check_fast(uint32_t u, size_t *bad)
{
    const float f = etp__qf_float(u);
    if (etp__qf_e4m3_rne_satfinite_fast(f) != etp__qf_e4m3_rne_satfinite(f) ||
        etp__qf_e5m2_rne_satfinite_fast(f) != etp__qf_e5m2_rne_satfinite(f) ||
        etp__qf_e2m1_rne_satfinite_fast(f) != etp__qf_e2m1_rne_satfinite(f)) {
        if (*bad == 0) print_error("fast conversion differs for 0x%08x\n", u);
        ++*bad;
    }
}

/* The branch-free stochastic rounding equals the definition for x = u's
 * float and random bits at and beside the rounding threshold (the draw
 * equal to the distance ratio, one step below and above it), the extremes
 * and a hash of u. */
static void check_sr_fast(uint32_t u, size_t *bad)
{
    const float x = etp__qf_float(u), v = fabsf(x);
    float frac = 0.0f;
    for (int c = 0; c < 7 && !isnan(v); c++) {
        const float lo = etp__qf_e2m1_to_f32((uint8_t)c), hi = etp__qf_e2m1_to_f32((uint8_t)(c + 1));
        if (lo <= v && v < hi) frac = (v - lo) / (hi - lo);
    }
    const uint32_t t = (uint32_t)(frac * 16777216.0f); /* the draw's 24 bits at the threshold */
    const uint32_t rs[] = {0u, 0xffffffffu, 0x80000000u, u * 2654435761u, t << 8, (t << 8) | 0xffu,
                           (t + 1u) << 8, t ? (t - 1u) << 8 : 0u};
    for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++)
        if (etp__qf_e2m1_sr_satfinite_fast(x, rs[i]) != etp__qf_e2m1_sr_satfinite(x, rs[i])) {
            if (*bad == 0) print_error("fast stochastic rounding differs for 0x%08x, r 0x%08x\n", u, rs[i]);
            ++*bad;
        }
}

/* The magic-number conversions of the v3 cast kernel, each over its range:
 * E2M1 every non-NaN input, E4M3 [+0, 464], E5M2 [+0, 61440), the NVFP4
 * block scale (code and value) every non-negative amax up to +Inf. */
static void check_magic(uint32_t u, size_t *bad)
{
    const float f = etp__qf_float(u);
    int ok = 1;
    if ((u & 0x7fffffffu) <= 0x7f800000u)
        ok &= etp__qf_e2m1_rne_satfinite_magic(f) == etp__qf_e2m1_rne_satfinite(f);
    if (u <= 0x7f800000u) {
        float value;
        const uint8_t sc = etp__qf_nvfp4_block_scale_magic(f, 1.0f, &value);
        ok &= sc == etp__qf_nvfp4_block_scale(f, 1.0f) &&
              etp__qf_bits(value) == etp__qf_bits(etp__qf_e4m3_to_f32(sc));
        if (f <= 464.0f) ok &= etp__qf_e4m3_magic(f) == etp__qf_e4m3_rne_satfinite(f);
        if (f < 61440.0f) ok &= etp__qf_e5m2_magic(f) == etp__qf_e5m2_rne_satfinite(f);
    }
    if (!ok) {
        if (*bad == 0) print_error("magic conversion differs for 0x%08x\n", u);
        ++*bad;
    }
}

/* The unclamped E2M1 magic addition of the NVFP4 cast's common path, for
 * every +0 <= a < ETP__QF_E2M1_UNCLAMPED_BELOW it is used on. */
static void check_unclamped(uint32_t u, size_t *bad)
{
    /* +0 up to the bound: the kernel's operand is |x| * m */
    if (u >= etp__qf_bits(ETP__QF_E2M1_UNCLAMPED_BELOW)) return;
    const float a = etp__qf_float(u);
    if (etp__qf_e2m1_magic_unclamped(a) != etp__qf_e2m1_rne_satfinite(a)) {
        if (*bad == 0) print_error("unclamped E2M1 magic differs for 0x%08x\n", u);
        ++*bad;
    }
}

static void test_fast_conversions(void **state)
{
    (void)state;
    size_t bad = 0;
    const uint32_t lows[] = {0x0000u, 0x0001u, 0x3fffu, 0x4000u, 0x4001u, 0x7fffu, 0x8000u,
                             0x8001u, 0xbfffu, 0xc000u, 0xffffu, 0x1234u};
    for (uint32_t hi = 0; hi < 0x10000u; hi++)
        for (size_t l = 0; l < sizeof lows / sizeof lows[0]; l++) {
            check_fast((hi << 16) | lows[l], &bad);
            check_sr_fast((hi << 16) | lows[l], &bad);
            check_magic((hi << 16) | lows[l], &bad);
            check_unclamped((hi << 16) | lows[l], &bad);
        }
    for (uint64_t u = 0; u < 0x100000000ull; u += 4093) {
        check_fast((uint32_t)u, &bad);
        check_sr_fast((uint32_t)u, &bad);
        check_magic((uint32_t)u, &bad);
        check_unclamped((uint32_t)u, &bad);
    }
    /* every input within 2^17 patterns below the bound (6.0 and past it up
     * to the bound itself) */
    for (uint32_t d = 1; d <= 0x20000u; d++) check_unclamped(etp__qf_bits(ETP__QF_E2M1_UNCLAMPED_BELOW) - d, &bad);
    /* every input near the E2M1 grid's points, for stochastic rounding */
    const float grid[] = {0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (size_t i = 0; i < sizeof grid / sizeof grid[0]; i++)
        for (uint32_t d = 0; d < 0x2000u; d++) {
            const uint32_t c = etp__qf_bits(grid[i]) - 0x1000u + d;
            check_sr_fast(c, &bad);
            check_sr_fast(c | 0x80000000u, &bad);
        }
    /* every input near the E2M1 grid's ties and the saturation bounds */
    const float edges[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 7.0f, 448.0f, 464.0f, 480.0f,
                           57344.0f, 61440.0f, 0.015625f, 6.103515625e-05f};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++)
        for (uint32_t d = 0; d < 0x20000u; d++) {
            const uint32_t c = etp__qf_bits(edges[i]) - 0x10000u + d;
            check_magic(c, &bad);
            check_magic(c | 0x80000000u, &bad);
            check_unclamped(c, &bad);
        }
    assert_int_equal(bad, 0);
}

static void test_saturation_and_specials(void **state)
{
    (void)state;
    const float inf = INFINITY, nan = NAN, fmax = 3.40282347e38f;
    /* E4M3: satfinite; a NaN's sign is dropped */
    const struct { float x; uint8_t c; } e4m3[] = {
        {448.0f, 0x7e}, {464.0f, 0x7e}, {465.0f, 0x7e}, {480.0f, 0x7e}, {1e30f, 0x7e},
        {fmax, 0x7e}, {inf, 0x7e}, {-inf, 0xfe}, {-500.0f, 0xfe}, {nan, 0x7f}, {-nan, 0x7f},
        {0.0f, 0x00}, {-0.0f, 0x80}, {0.0009765625f, 0x00} /* 2^-10: tie with 0 -> even (0) */,
        {0.00146484375f, 0x01} /* 1.5 * 2^-10 */, {1e-40f, 0x00}, {-1e-40f, 0x80}};
    for (size_t i = 0; i < sizeof e4m3 / sizeof e4m3[0]; i++) {
        if (etp__qf_e4m3_rne_satfinite(e4m3[i].x) != e4m3[i].c)
            print_error("e4m3(%g) = 0x%02x, expected 0x%02x\n", (double)e4m3[i].x,
                        etp__qf_e4m3_rne_satfinite(e4m3[i].x), e4m3[i].c);
        assert_int_equal(etp__qf_e4m3_rne_satfinite(e4m3[i].x), e4m3[i].c);
    }
    const struct { float x; uint8_t c; } e5m2[] = {
        {57344.0f, 0x7b}, {61440.0f, 0x7b}, {65536.0f, 0x7b}, {1e30f, 0x7b}, {inf, 0x7b},
        {-inf, 0xfb}, {nan, 0x7e}, {-nan, 0x7e}, {-0.0f, 0x80}};
    for (size_t i = 0; i < sizeof e5m2 / sizeof e5m2[0]; i++)
        assert_int_equal(etp__qf_e5m2_rne_satfinite(e5m2[i].x), e5m2[i].c);
    const struct { float x; uint8_t c; } e2m1[] = {
        {6.0f, 0x7}, {7.0f, 0x7}, {100.0f, 0x7}, {inf, 0x7}, {-inf, 0xf}, {-7.0f, 0xf},
        {nan, 0x7}, {-nan, 0x7}, {5.0f, 0x6} /* tie 4|6 -> even */, {0.25f, 0x0},
        {0.75f, 0x2}, {1.25f, 0x2}, {1.75f, 0x4}, {2.5f, 0x4}, {3.5f, 0x6}, {-0.0f, 0x8},
        {-0.1f, 0x8}, {0.2500001f, 0x1}};
    for (size_t i = 0; i < sizeof e2m1 / sizeof e2m1[0]; i++) {
        if (etp__qf_e2m1_rne_satfinite(e2m1[i].x) != e2m1[i].c)
            print_error("e2m1(%g) = 0x%x, expected 0x%x\n", (double)e2m1[i].x,
                        etp__qf_e2m1_rne_satfinite(e2m1[i].x), e2m1[i].c);
        assert_int_equal(etp__qf_e2m1_rne_satfinite(e2m1[i].x), e2m1[i].c);
    }
    /* E8M0 round-up as TransformerEngine's software path */
    const struct { float x; uint8_t c; } e8[] = {
        {nan, 0xff}, {inf, 0xfe}, {0.0f, 0x00}, {-0.0f, 0x00}, {1.0f, 127},
        {1.0000001f, 128}, {0.75f, 127}, {ldexpf(1.0f, 127), 254}, {fmax, 254} /* 0xFE not raised */,
        {ldexpf(1.0f, -127), 0}, {ldexpf(1.0f, -149), 0}, {ldexpf(1.5f, -127), 1},
        {ldexpf(1.0f, -126), 1}, {ldexpf(1.0f, -127) + ldexpf(1.0f, -149), 1}};
    for (size_t i = 0; i < sizeof e8 / sizeof e8[0]; i++) {
        if (etp__qf_e8m0_round_up(e8[i].x) != e8[i].c)
            print_error("e8m0_round_up(%g) = 0x%02x, expected 0x%02x\n", (double)e8[i].x,
                        etp__qf_e8m0_round_up(e8[i].x), e8[i].c);
        assert_int_equal(etp__qf_e8m0_round_up(e8[i].x), e8[i].c);
    }
    /* MXFP8 multiplier: 2^(127 - e) from the exponent bits, 1 for e = 0 */
    assert_true(etp__qf_mxfp8_multiplier(0) == 1.0f);
    assert_true(etp__qf_mxfp8_multiplier(127) == 1.0f);
    assert_true(etp__qf_mxfp8_multiplier(130) == 0.125f);
    assert_true(etp__qf_mxfp8_multiplier(1) == ldexpf(1.0f, 126));
    assert_true(etp__qf_mxfp8_multiplier(0xfe) == 0.0f);
    assert_true(etp__qf_mxfp8_multiplier(0xff) == -INFINITY);
    /* NVFP4 per-tensor scale */
    assert_true(etp__qf_nvfp4_s_enc(0.0f) == 1.0f);
    assert_true(etp__qf_nvfp4_s_enc(inf) == 1.0f);
    assert_true(etp__qf_nvfp4_s_enc(nan) == 1.0f);
    assert_true(etp__qf_nvfp4_s_enc(1e-38f) == 1.0f); /* 2688 / 1e-38 overflows */
    assert_true(etp__qf_nvfp4_s_enc(2688.0f) == 1.0f);
    assert_true(etp__qf_nvfp4_s_enc(1.0f) == 2688.0f);
    /* element multiplier clamps 1/0 to FLT_MAX */
    assert_true(etp__qf_nvfp4_multiplier(0, 1.0f) == fmax);
    assert_true(etp__qf_nvfp4_multiplier(0x38 /* 1.0 */, 0.5f) == 2.0f);
}

/* Every code of each format round-trips through decode and encode. */
static void test_round_trip_all_codes(void **state)
{
    (void)state;
    for (int c = 0; c < 256; c++) {
        const uint8_t s = (uint8_t)(c & 0x80);
        const uint8_t e4 = etp__qf_e4m3_rne_satfinite(etp__qf_e4m3_to_f32((uint8_t)c));
        if ((c & 0x7f) == 0x7f)
            assert_int_equal(e4, 0x7f); /* NaN stays NaN */
        else
            assert_int_equal(e4, c);
        const uint8_t e5 = etp__qf_e5m2_rne_satfinite(etp__qf_e5m2_to_f32((uint8_t)c));
        if ((c & 0x7f) > 0x7c)
            assert_int_equal(e5, 0x7e); /* NaNs: the canonical NaN */
        else if ((c & 0x7f) == 0x7c)
            assert_int_equal(e5, s | 0x7b); /* Inf saturates */
        else
            assert_int_equal(e5, c);
        if (c < 255)
            assert_int_equal(etp__qf_e8m0_round_up(etp__qf_e8m0_to_f32((uint8_t)c)), c);
        else
            assert_int_equal(etp__qf_e8m0_round_up(etp__qf_e8m0_to_f32((uint8_t)c)), 0xff);
    }
    for (int c = 0; c < 16; c++) {
        assert_int_equal(etp__qf_e2m1_rne_satfinite(etp__qf_e2m1_to_f32((uint8_t)c)), c);
        /* stochastic rounding leaves representable values alone, whatever the bits */
        assert_int_equal(etp__qf_e2m1_sr_satfinite(etp__qf_e2m1_to_f32((uint8_t)c), 0xffffffffu), c);
        assert_int_equal(etp__qf_e2m1_sr_satfinite(etp__qf_e2m1_to_f32((uint8_t)c), 0), c);
    }
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = etp__qf_bf16_to_f32((uint16_t)h);
        if (!isnan(f)) assert_int_equal(etp__qf_f32_to_bf16(f), h);
    }
}

/* Stochastic rounding: only the two neighbours, and up with the right
 * frequency (a statistical check with a wide margin). */
static void test_stochastic_rounding(void **state)
{
    (void)state;
    const float xs[] = {0.1f, 0.3f, 1.2f, 2.75f, 4.5f, 5.9f, -3.25f};
    for (size_t k = 0; k < sizeof xs / sizeof xs[0]; k++) {
        const float x = xs[k], ax = fabsf(x);
        float lo = 0.0f, hi = 0.0f;
        for (int c = 0; c < 7; c++) {
            const float v = etp__qf_e2m1_to_f32((uint8_t)c), w = etp__qf_e2m1_to_f32((uint8_t)(c + 1));
            if (v <= ax && ax < w) lo = v, hi = w;
        }
        const double p = (ax - lo) / (hi - lo);
        int ups = 0;
        const int n = 20000;
        for (int i = 0; i < n; i++) {
            const uint8_t c = etp__qf_e2m1_sr_satfinite(x, etp__qf_sr_bits(g_seed, 3, 0, (uint64_t)i));
            const float v = fabsf(etp__qf_e2m1_to_f32(c));
            assert_true(v == lo || v == hi);
            assert_int_equal(c & 8, x < 0 ? 8 : 0);
            ups += v == hi;
        }
        const double freq = (double)ups / n, sd = sqrt(p * (1 - p) / n);
        if (fabs(freq - p) > 6 * sd + 1e-3)
            print_error("SR of %g: up %.4f of the time, expected %.4f\n", (double)x, freq, p);
        assert_true(fabs(freq - p) <= 6 * sd + 1e-3);
    }
    /* Philox4x32-10 known answers (Random123's tests/kat_vectors: counter and
     * key all 0, all 1s, and the digits of pi) */
    static const uint32_t kat[3][10] = {
        {0, 0, 0, 0, 0, 0, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
        {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0x408f276du,
         0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
        {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u, 0xd16cfe09u,
         0x94fdccebu, 0x5001e420u, 0x24126ea1u}};
    for (int k = 0; k < 3; k++) {
        uint32_t c[4] = {kat[k][0], kat[k][1], kat[k][2], kat[k][3]};
        etp__qf_philox(c, kat[k][4], kat[k][5]);
        for (int w = 0; w < 4; w++) assert_int_equal(c[w], kat[k][6 + w]);
    }
}

/* Scale layouts: the documented formulas, cuBLAS's own example, and the
 * swizzle is a permutation. */
static void test_layouts(void **state)
{
    (void)state;
    /* NVFP4 A of [128, 128]: 8 K-blocks padded to 8; (5, 2) -> 82, (5, 5) -> 593 */
    assert_int_equal(etp__qf_scale_offset(5, 2, 8, 1), 82);
    assert_int_equal(etp__qf_scale_offset(5, 5, 8, 1), 593);
    assert_int_equal(etp__qf_scale_offset(5, 5, 8, 0), 45);
    etp__qf_scale_shape_t s = etp__qf_nvfp4_row_scales(300, 48);
    assert_int_equal(s.rows, 384);
    assert_int_equal(s.cols, 4);
    s = etp__qf_nvfp4_col_scales(48, 300);
    assert_int_equal(s.rows, 384);
    assert_int_equal(s.cols, 4);
    s = etp__qf_mxfp8_row_scales(1, 32 * 9);
    assert_int_equal(s.rows, 128);
    assert_int_equal(s.cols, 12);
    s = etp__qf_mxfp8_col_scales(32 * 5, 130);
    assert_int_equal(s.rows, 8);
    assert_int_equal(s.cols, 256);
    const size_t dims[][2] = {{128, 4}, {256, 8}, {384, 12}, {128, 16}};
    for (size_t d = 0; d < 4; d++) {
        const size_t R = dims[d][0], C = dims[d][1];
        uint8_t *seen = calloc(R * C, 1);
        for (size_t r = 0; r < R; r++)
            for (size_t c = 0; c < C; c++) {
                const size_t off = etp__qf_scale_offset(r, c, C, 1);
                assert_true(off < R * C);
                assert_int_equal(seen[off], 0);
                seen[off] = 1;
                /* each 128x4 tile is 512 contiguous bytes */
                assert_int_equal(off / 512, (r / 128) * (C / 4) + c / 4);
            }
        free(seen);
    }
    /* MXFP8 columnwise swizzle views the matrix as [K, M blocks] */
    s = etp__qf_mxfp8_col_scales(64, 128);
    assert_int_equal(etp__qf_mxfp8_col_scale_offset(1, 5, s, 0), 1 * 128 + 5);
    assert_int_equal(etp__qf_mxfp8_col_scale_offset(1, 5, s, 1), etp__qf_scale_offset(5, 1, 4, 1));
}

/* ---- exact dequantization, decoded here ------------------------------------ */

/* The documented decode of each element, written independently of
 * qf_codec.h: code values from their fields (ldexpf is exact), scale
 * offsets from the layout formula, S_enc from its definition. */
static float ind_e2m1(unsigned q)
{
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return (q & 8u) ? -mag[q & 7u] : mag[q & 7u];
}

static float ind_e4m3(unsigned c)
{
    const unsigned e = (c >> 3) & 15u, m = c & 7u;
    float v;
    if (e == 15u && m == 7u)
        v = NAN;
    else if (e == 0)
        v = ldexpf((float)m, -9);
    else
        v = ldexpf((float)(8u + m), (int)e - 10);
    return (c & 0x80u) ? -v : v;
}

static float ind_e5m2(unsigned c)
{
    const unsigned e = (c >> 2) & 31u, m = c & 3u;
    float v;
    if (e == 31u)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexpf((float)m, -16);
    else
        v = ldexpf((float)(4u + m), (int)e - 17);
    return (c & 0x80u) ? -v : v;
}

static float ind_e8m0(unsigned c)
{
    return c == 0xffu ? NAN : ldexpf(1.0f, (int)c - 127);
}

/* NaN results are the canonical 0x7FC00000 (docs/FORMATS.md). */
static uint32_t ind_canon_bits(float v)
{
    return isnan(v) ? 0x7fc00000u : etp__qf_bits(v);
}

/* BF16 of an FP32 (bits), nearest even; the canonical NaN stays 0x7FC0. */
static uint16_t ind_bf16(uint32_t u)
{
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static size_t ind_offset(size_t r, size_t c, size_t cols, int swizzle)
{
    if (!swizzle) return r * cols + c;
    return ((r / 128) * (cols / 4) + c / 4) * 512 + (r % 32) * 16 + ((r / 32) % 4) * 4 + c % 4;
}

/* Dequantize one direction (1 rowwise, 2 columnwise) of [rows, cols] with
 * etp's reference, to F32 and to BF16, and compare every element bit for bit
 * with the documented arithmetic done here: NVFP4 e2m1(q) * (S_dec_b *
 * (1 / S_enc)), MXFP8 element * 2^(e - 127), one FP32 operation at a time.
 * Returns the number of elements checked. */
static size_t check_dequant_exact(const etp__qref_cfg_t *cfg, unsigned dir, size_t rows, size_t cols,
                                  float amax, const uint8_t *data, const uint8_t *scales, const char *what)
{
    const int col = dir == 2;
    float *y = malloc(rows * cols * sizeof(float) + 1);
    uint16_t *yb = malloc(rows * cols * sizeof(uint16_t) + 1);
    etp__qref_dequantize(cfg, dir, rows, cols, amax, data, scales, y, ETP__QB_F32);
    etp__qref_dequantize(cfg, dir, rows, cols, amax, data, scales, yb, ETP__QB_BF16);
    float s_enc = 2688.0f / amax;
    if (amax == 0.0f || !isfinite(s_enc) || s_enc == 0.0f) s_enc = 1.0f;
    const float s_dec = 1.0f / s_enc;
    size_t bad = 0;
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < cols; j++) {
            float want;
            if (cfg->format == ETP__QB_NVFP4) {
                /* rowwise [rows, cols/2] bytes, columnwise the transpose */
                const size_t r = col ? j : i, k = col ? i : j, ld = col ? rows : cols;
                const unsigned q = (data[r * (ld / 2) + k / 2] >> (4 * (k % 2))) & 0xfu;
                const size_t scols = (ld / 16 + 3) / 4 * 4;
                const float sv = ind_e4m3(scales[ind_offset(r, k / 16, scols, cfg->swizzle)]);
                const float bs = sv * s_dec;
                want = ind_e2m1(q) * bs;
            } else {
                size_t off;
                if (col) {
                    /* [roundup(M/32,4), roundup(K,128)] row-major; swizzled as its transpose */
                    const size_t srows = (rows / 32 + 3) / 4 * 4, scols = (cols + 127) / 128 * 128;
                    off = cfg->swizzle ? ind_offset(j, i / 32, srows, 1) : (i / 32) * scols + j;
                } else {
                    off = ind_offset(i, j / 32, (cols / 32 + 3) / 4 * 4, cfg->swizzle);
                }
                const uint8_t c = data[i * cols + j];
                want = (cfg->e5m2 ? ind_e5m2(c) : ind_e4m3(c)) * ind_e8m0(scales[off]);
            }
            const uint32_t wb = ind_canon_bits(want), gb = etp__qf_bits(y[i * cols + j]);
            const uint16_t wh = ind_bf16(wb), gh = yb[i * cols + j];
            if ((wb != gb || wh != gh) && bad++ < 5)
                print_error("%s: dequantized (%zu, %zu) direction %u = 0x%08x / bf16 0x%04x, "
                            "expected 0x%08x / 0x%04x\n", what, i, j, dir, gb, gh, wb, wh);
        }
    free(y);
    free(yb);
    assert_int_equal(bad, 0);
    return rows * cols;
}

/* Every element code with every scale code (bytes no cast writes included:
 * NaN scales, E5M2 Inf, signed NaN codes), both directions, row-major and
 * swizzled scales, several per-tensor amaxes: exact, NaN canonical. */
static void test_dequant_all_codes(void **state)
{
    (void)state;
    enum { N = 256 };
    uint8_t *data = malloc(N * N), *scales = malloc(N * 8);
    for (int swizzle = 0; swizzle < 2; swizzle++) {
        /* NVFP4 rowwise [256, 16]: row r has the 16 codes and scale code r; the
         * same bytes are the columnwise copy of a [16, 256] tensor */
        memset(scales, 0, N * 4);
        for (size_t r = 0; r < N; r++) {
            for (size_t b = 0; b < 8; b++) data[r * 8 + b] = (uint8_t)((2 * b) | ((2 * b + 1) << 4));
            scales[ind_offset(r, 0, 4, swizzle)] = (uint8_t)r;
        }
        const float amaxes[] = {1.0f, 0.0f, 3.7f, 1e-3f, 2688.0f, 1e30f};
        for (size_t a = 0; a < sizeof amaxes / sizeof amaxes[0]; a++) {
            etp__qref_cfg_t nv = {ETP__QB_NVFP4, 0, 0, swizzle, 0, 0, 0};
            check_dequant_exact(&nv, 1, N, 16, amaxes[a], data, scales, "nvfp4 all codes");
            check_dequant_exact(&nv, 2, 16, N, amaxes[a], data, scales, "nvfp4 all codes");
        }
        for (int e5m2 = 0; e5m2 < 2; e5m2++) {
            etp__qref_cfg_t mx = {ETP__QB_MXFP8, e5m2, 0, swizzle, 0, 0, 0};
            /* rowwise [256, 256]: element (r, j) code j, its row's 8 blocks scale r */
            for (size_t r = 0; r < N; r++)
                for (size_t j = 0; j < N; j++) data[r * N + j] = (uint8_t)j;
            memset(scales, 0, N * 8);
            for (size_t r = 0; r < N; r++)
                for (size_t b = 0; b < 8; b++) scales[ind_offset(r, b, 8, swizzle)] = (uint8_t)r;
            check_dequant_exact(&mx, 1, N, N, 0, data, scales, "mxfp8 all codes");
            /* columnwise [256, 256]: element (i, j) code i, column j's blocks scale j */
            for (size_t i = 0; i < N; i++)
                for (size_t j = 0; j < N; j++) data[i * N + j] = (uint8_t)i;
            memset(scales, 0, N * 8);
            for (size_t mb = 0; mb < 8; mb++)
                for (size_t j = 0; j < N; j++)
                    scales[swizzle ? ind_offset(j, mb, 8, 1) : mb * N + j] = (uint8_t)j;
            check_dequant_exact(&mx, 2, N, N, 0, data, scales, "mxfp8 all codes");
        }
    }
    free(data);
    free(scales);
}

/* ---- block vectors ----------------------------------------------------------- */

typedef struct {
    size_t rows, cols;
    float *x;
    uint16_t *xb;
    int bf16; /* every value BF16-representable: both input dtypes are run */
} vtensor_t;

static size_t parse_hex_bytes(const char *s, uint8_t *out, size_t cap, size_t at)
{
    while (*s == ' ') s++;
    size_t n = 0;
    while (s[0] && s[1] && s[0] != '\n') {
        unsigned v;
        if (sscanf(s, "%2x", &v) != 1) break;
        assert_true(at + n < cap);
        out[at + n++] = (uint8_t)v;
        s += 2;
    }
    return n;
}

/* One file of block vectors: "tensor M K", its values ("x" lines of FP32
 * bits), then cases: "case nvfp4 <amax> block2d=B swizzle=S [seed=<hex>
 * tensor=T]" (seed: stochastic rounding with that seed and tensor id) or
 * "case mxfp8 0 e5m2=E swizzle=S", the expected bytes of each produced
 * direction, "end". The reference must produce the very bytes, from BF16
 * and FP32 inputs (FP32 only for tensors that are not BF16-representable),
 * through etp__qref_quantize and, for stochastic cases, through a batch
 * whose tensor index is the case's tensor id; the expected bytes then
 * dequantize exactly (check_dequant_exact). Returns the number of cases;
 * *n_sr counts the stochastic ones. */
static int run_block_file(const char *name, int require_bf16, int *n_sr)
{
    FILE *f = open_data(name);
    static char line[8192];
    vtensor_t t = {0};
    size_t nx = 0, ndq = 0;
    int cases = 0;
    *n_sr = 0;
    enum { CAP = 1 << 16 };
    uint8_t *want[4], *got[4];
    size_t have[4];
    for (int k = 0; k < 4; k++) {
        want[k] = malloc(CAP);
        got[k] = malloc(CAP);
    }
    const char *keys[4] = {"row_data", "row_scales", "col_data", "col_scales"};
    etp__qref_cfg_t cfg;
    float amax = 0;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "tensor ", 7) == 0) {
            free(t.x);
            free(t.xb);
            assert_int_equal(sscanf(line + 7, "%zu %zu", &t.rows, &t.cols), 2);
            t.x = malloc(t.rows * t.cols * sizeof(float));
            t.xb = malloc(t.rows * t.cols * sizeof(uint16_t));
            t.bf16 = 1;
            nx = 0;
        } else if (line[0] == 'x' && line[1] == ' ') {
            char *p = line + 2;
            unsigned v;
            int used;
            while (sscanf(p, "%x%n", &v, &used) == 1) {
                assert_true(nx < t.rows * t.cols);
                t.x[nx] = f32_of(v);
                t.xb[nx] = (uint16_t)(v >> 16);
                if (v & 0xffffu) t.bf16 = 0;
                if (require_bf16) assert_int_equal(v & 0xffffu, 0); /* BF16-representable */
                nx++;
                p += used;
            }
        } else if (strncmp(line, "case ", 5) == 0) {
            char fmt[16];
            unsigned a, o1, o2;
            memset(&cfg, 0, sizeof cfg);
            if (sscanf(line + 5, "nvfp4 %x block2d=%u swizzle=%u", &a, &o1, &o2) == 3) {
                cfg.format = ETP__QB_NVFP4;
                cfg.block2d = (int)o1;
                const char *sr = strstr(line, " seed=");
                if (sr) {
                    unsigned long long seed;
                    unsigned tid;
                    assert_int_equal(sscanf(sr, " seed=%llx tensor=%u", &seed, &tid), 2);
                    cfg.stochastic = 1;
                    cfg.seed = (uint64_t)seed;
                    cfg.tensor = (uint32_t)tid;
                }
            } else {
                assert_int_equal(sscanf(line + 5, "%15s %x e5m2=%u swizzle=%u", fmt, &a, &o1, &o2), 4);
                cfg.format = ETP__QB_MXFP8;
                cfg.e5m2 = (int)o1;
            }
            cfg.swizzle = (int)o2;
            amax = f32_of(a);
            memset(have, 0, sizeof have);
        } else if (strncmp(line, "end", 3) == 0) {
            assert_int_equal(nx, t.rows * t.cols);
            /* both input dtypes give the same bytes when the values are BF16;
             * stochastic cases also run as a batch (runs 2 and 3) */
            const int runs = cfg.stochastic ? 4 : 2;
            for (int run = 0; run < runs; run++) {
                const int dt = run & 1;
                if (!dt && !t.bf16) continue;
                const void *in = dt ? (const void *)t.x : (const void *)t.xb;
                const int dtype = dt ? ETP__QB_F32 : ETP__QB_BF16;
                for (int k = 0; k < 4; k++) tu_poison(got[k], CAP);
                if (run < 2) {
                    etp__qref_quantize(&cfg, in, dtype, t.rows, t.cols, amax, have[0] ? got[0] : NULL,
                                       got[1], have[2] ? got[2] : NULL, got[3]);
                } else {
                    /* the tensor id of stochastic rounding is the batch's first + i */
                    static etp__qbatch_t b;
                    static float amaxes[1024];
                    assert_true(cfg.tensor < 1024);
                    memset(&b, 0, sizeof b);
                    b.op = ETP__QB_CAST;
                    b.format = ETP__QB_NVFP4;
                    b.n = 1;
                    b.first = cfg.tensor;
                    b.block2d = (uint32_t)cfg.block2d;
                    b.swizzle = (uint32_t)cfg.swizzle;
                    b.stochastic = 1;
                    b.seed = cfg.seed;
                    amaxes[cfg.tensor] = amax;
                    b.amax = amaxes;
                    b.t[0].x = in;
                    b.t[0].dtype = (uint8_t)dtype;
                    b.t[0].rows = (uint32_t)t.rows;
                    b.t[0].cols = (uint32_t)t.cols;
                    b.t[0].row_data = have[0] ? got[0] : NULL;
                    b.t[0].row_scales = got[1];
                    b.t[0].col_data = have[2] ? got[2] : NULL;
                    b.t[0].col_scales = got[3];
                    etp__qref_run_batch(&b);
                }
                for (int k = 0; k < 4; k++) {
                    if (!have[k]) continue;
                    size_t bad = 0, first = 0;
                    for (size_t i = 0; i < have[k]; i++)
                        if (got[k][i] != want[k][i] && bad++ == 0) first = i;
                    if (bad)
                        print_error("%s case %d (%s [%zu, %zu] %s%s block2d %d e5m2 %d swizzle %d "
                                    "stochastic %d seed 0x%016llx tensor %u): %s: %zu bytes differ, "
                                    "first at %zu: 0x%02x, expected 0x%02x\n",
                                    name, cases, cfg.format == ETP__QB_NVFP4 ? "nvfp4" : "mxfp8", t.rows,
                                    t.cols, dt ? "f32" : "bf16", run >= 2 ? " batch" : "", cfg.block2d,
                                    cfg.e5m2, cfg.swizzle, cfg.stochastic, (unsigned long long)cfg.seed,
                                    (unsigned)cfg.tensor, keys[k], bad, first, got[k][first],
                                    want[k][first]);
                    assert_int_equal(bad, 0);
                    /* nothing written past the layout */
                    assert_int_equal(got[k][have[k]], 0xA5);
                }
            }
            /* the expected bytes dequantize exactly as documented */
            char what[96];
            snprintf(what, sizeof what, "%s case %d", name, cases);
            if (have[0]) ndq += check_dequant_exact(&cfg, 1, t.rows, t.cols, amax, want[0], want[1], what);
            if (have[2]) ndq += check_dequant_exact(&cfg, 2, t.rows, t.cols, amax, want[2], want[3], what);
            cases++;
            *n_sr += cfg.stochastic;
        } else {
            for (int k = 0; k < 4; k++) {
                const size_t kl = strlen(keys[k]);
                if (strncmp(line, keys[k], kl) == 0 && line[kl] == ' ')
                    have[k] += parse_hex_bytes(line + kl, want[k], CAP, have[k]);
            }
        }
    }
    fclose(f);
    free(t.x);
    free(t.xb);
    for (int k = 0; k < 4; k++) {
        free(want[k]);
        free(got[k]);
    }
    assert_true(ndq > 0);
    return cases;
}

static void test_block_vectors(void **state)
{
    (void)state;
    int n_sr;
    assert_int_equal(run_block_file("blocks.txt", 1, &n_sr), 40);
    assert_int_equal(n_sr, 0);
}

/* Stochastic rounding against vectors from an independent Philox4x32-10
 * (tools/gen_quant_vectors.py, checked there against Random123's known
 * answers): the random word of each (seed, tensor, direction, element), and
 * NVFP4 tensors rounded with them, bit for bit. */
static void test_sr_vectors(void **state)
{
    (void)state;
    FILE *f = open_data("blocks_sr.txt");
    char line[256];
    int n = 0, bad = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long seed, idx;
        unsigned tid, dir, r;
        if (sscanf(line, "srbits %llx %x %u %llx %x", &seed, &tid, &dir, &idx, &r) != 5) continue;
        n++;
        const uint32_t got = etp__qf_sr_bits((uint64_t)seed, tid, dir, (uint64_t)idx);
        if (got != r && bad++ < 10)
            print_error("sr_bits(seed 0x%016llx, tensor %u, dir %u, index 0x%llx) = 0x%08x, expected 0x%08x\n",
                        seed, tid, dir, idx, got, r);
    }
    fclose(f);
    assert_true(n >= 20);
    assert_int_equal(bad, 0);
    int n_sr;
    const int cases = run_block_file("blocks_sr.txt", 0, &n_sr);
    assert_int_equal(cases, 18);
    assert_int_equal(n_sr, cases);
}

/* ---- properties of quantize -> dequantize on random data ---------------------- */

static float rand_value(uint64_t a, uint64_t i)
{
    const uint64_t r = tu_rand(g_seed, a, 7, i);
    const float m = (float)(r & 0xffffff) / (float)0x1000000;
    const int e = (int)((r >> 24) % 24) - 12;
    return ((r >> 63) ? -1.0f : 1.0f) * ldexpf(0.5f + m, e);
}

typedef struct {
    size_t rows, cols;
    float *x;
    uint8_t *rd, *rs, *cd, *cs;
    float *yr, *yc;
} qbuf_t;

static void qbuf_init(qbuf_t *q, size_t rows, size_t cols, uint64_t tag)
{
    q->rows = rows;
    q->cols = cols;
    q->x = malloc(rows * cols * sizeof(float) + 1);
    for (size_t i = 0; i < rows * cols; i++) q->x[i] = rand_value(tag, i);
    const size_t big = rows * cols + 128 * 256 + 64;
    q->rd = malloc(big);
    q->rs = malloc(big);
    q->cd = malloc(big);
    q->cs = malloc(big);
    q->yr = malloc(rows * cols * sizeof(float) + 1);
    q->yc = malloc(rows * cols * sizeof(float) + 1);
    tu_poison(q->rd, big);
    tu_poison(q->rs, big);
    tu_poison(q->cd, big);
    tu_poison(q->cs, big);
}

static void qbuf_free(qbuf_t *q)
{
    free(q->x);
    free(q->rd);
    free(q->rs);
    free(q->cd);
    free(q->cs);
    free(q->yr);
    free(q->yc);
}

static void test_nvfp4_properties(void **state)
{
    (void)state;
    const size_t shapes[][2] = {{16, 16}, {32, 48}, {64, 160}, {48, 32}};
    for (size_t sidx = 0; sidx < 4; sidx++)
        for (int block2d = 0; block2d < 2; block2d++) {
            qbuf_t q;
            qbuf_init(&q, shapes[sidx][0], shapes[sidx][1], 100 + sidx);
            const float amax = etp__qref_amax(q.x, ETP__QB_F32, q.rows, q.cols);
            etp__qref_cfg_t cfg = {ETP__QB_NVFP4, 0, block2d, (int)(sidx & 1), 0, 0, 0};
            etp__qref_quantize(&cfg, q.x, ETP__QB_F32, q.rows, q.cols, amax, q.rd, q.rs, q.cd, q.cs);
            etp__qref_dequantize(&cfg, 1, q.rows, q.cols, amax, q.rd, q.rs, q.yr, ETP__QB_F32);
            etp__qref_dequantize(&cfg, 2, q.rows, q.cols, amax, q.cd, q.cs, q.yc, ETP__QB_F32);
            const float s_dec = 1.0f / etp__qf_nvfp4_s_enc(amax);
            for (size_t i = 0; i < q.rows; i++)
                for (size_t j = 0; j < q.cols; j++) {
                    const float x = q.x[i * q.cols + j], y = q.yr[i * q.cols + j];
                    /* the block's effective scale: E2M1 spacing is at most 2 units
                     * (4 -> 6), and the E4M3 scale rounds by at most 1/16 */
                    const uint8_t sc = q.rs[etp__qf_scale_offset(i, j / 16, etp__qf_roundup(q.cols / 16, 4), cfg.swizzle)];
                    const float unit = etp__qf_e4m3_to_f32(sc) * s_dec;
                    assert_true(fabsf(y - x) <= 0.25f * fabsf(x) + 0.25f * unit + 1e-30f);
                    assert_true(y == 0.0f || (y < 0) == (x < 0));
                    /* 2D blocks: the rowwise and columnwise copies are the same tensor */
                    if (block2d) assert_true(etp__qf_bits(y) == etp__qf_bits(q.yc[i * q.cols + j]));
                    const uint8_t csc = q.cs[etp__qf_scale_offset(j, i / 16, etp__qf_roundup(q.rows / 16, 4), cfg.swizzle)];
                    const float cunit = etp__qf_e4m3_to_f32(csc) * s_dec;
                    const float yc = q.yc[i * q.cols + j];
                    assert_true(fabsf(yc - x) <= 0.25f * fabsf(x) + 0.25f * cunit + 1e-30f);
                }
            /* the tensor's largest element: its block's scale is 448 (0x7E), it
             * encodes as +-6 and dequantizes to itself within 2^-21 relative
             * (a few FP32 roundings of S_enc, 1/S_enc and the multiplier) */
            size_t n_top = 0;
            for (size_t i = 0; i < q.rows; i++)
                for (size_t j = 0; j < q.cols; j++) {
                    const float x = q.x[i * q.cols + j];
                    if (fabsf(x) != amax) continue;
                    n_top++;
                    const uint8_t sc = q.rs[etp__qf_scale_offset(i, j / 16, etp__qf_roundup(q.cols / 16, 4), cfg.swizzle)];
                    const uint8_t code = (uint8_t)((q.rd[i * (q.cols / 2) + j / 2] >> (4 * (j % 2))) & 0xfu);
                    assert_int_equal(sc, 0x7e);
                    assert_int_equal(code, x < 0 ? 0xf : 0x7);
                    assert_true(fabsf(q.yr[i * q.cols + j] - x) <= ldexpf(fabsf(x), -21));
                    assert_true(fabsf(q.yc[i * q.cols + j] - x) <= ldexpf(fabsf(x), -21));
                }
            assert_true(n_top >= 1);
            /* exact dequantization (decoded independently) of these data, rounded
             * to nearest and stochastically */
            check_dequant_exact(&cfg, 1, q.rows, q.cols, amax, q.rd, q.rs, "nvfp4 properties");
            check_dequant_exact(&cfg, 2, q.rows, q.cols, amax, q.cd, q.cs, "nvfp4 properties");
            cfg.stochastic = 1;
            cfg.seed = g_seed;
            cfg.tensor = (uint32_t)sidx;
            etp__qref_quantize(&cfg, q.x, ETP__QB_F32, q.rows, q.cols, amax, q.rd, q.rs, q.cd, q.cs);
            check_dequant_exact(&cfg, 1, q.rows, q.cols, amax, q.rd, q.rs, "nvfp4 properties (stochastic)");
            check_dequant_exact(&cfg, 2, q.rows, q.cols, amax, q.cd, q.cs, "nvfp4 properties (stochastic)");
            qbuf_free(&q);
        }
}

static void test_mxfp8_properties(void **state)
{
    (void)state;
    const size_t shapes[][2] = {{32, 32}, {64, 96}, {96, 64}};
    for (size_t sidx = 0; sidx < 3; sidx++)
        for (int e5m2 = 0; e5m2 < 2; e5m2++) {
            qbuf_t q;
            qbuf_init(&q, shapes[sidx][0], shapes[sidx][1], 200 + sidx);
            etp__qref_cfg_t cfg = {ETP__QB_MXFP8, e5m2, 0, (int)(sidx & 1), 0, 0, 0};
            etp__qref_quantize(&cfg, q.x, ETP__QB_F32, q.rows, q.cols, 0, q.rd, q.rs, q.cd, q.cs);
            etp__qref_dequantize(&cfg, 1, q.rows, q.cols, 0, q.rd, q.rs, q.yr, ETP__QB_F32);
            etp__qref_dequantize(&cfg, 2, q.rows, q.cols, 0, q.cd, q.cs, q.yc, ETP__QB_F32);
            const float rel = e5m2 ? 0.125f : 0.0625f; /* half an ulp of 2 or 3 mantissa bits */
            for (size_t i = 0; i < q.rows * q.cols; i++) {
                const float x = q.x[i];
                for (int d = 0; d < 2; d++) {
                    const float y = d ? q.yc[i] : q.yr[i];
                    /* round-up scales never saturate; away from the subnormal range the
                     * error is within half an ulp of the element format; the data are
                     * spread over 24 binades so small elements of a block may be flushed */
                    const uint8_t e = d ? q.cs[etp__qf_mxfp8_col_scale_offset(i / q.cols / 32, i % q.cols, etp__qf_mxfp8_col_scales(q.rows, q.cols), cfg.swizzle)]
                                        : q.rs[etp__qf_scale_offset(i / q.cols, i % q.cols / 32, etp__qf_mxfp8_row_scales(q.rows, q.cols).cols, cfg.swizzle)];
                    const float tiny = etp__qf_e8m0_to_f32(e) * (e5m2 ? ldexpf(1.0f, -16) : ldexpf(1.0f, -9));
                    assert_true(fabsf(y - x) <= rel * fabsf(x) + tiny);
                }
            }
            check_dequant_exact(&cfg, 1, q.rows, q.cols, 0, q.rd, q.rs, "mxfp8 properties");
            check_dequant_exact(&cfg, 2, q.rows, q.cols, 0, q.cd, q.cs, "mxfp8 properties");
            qbuf_free(&q);
        }
}

/* The documented results for special values in blocks (docs/FORMATS.md). */
static void test_special_blocks(void **state)
{
    (void)state;
    float x[32 * 32];
    uint8_t rd[32 * 32], rs[128 * 4], cd[32 * 32], cs[4 * 128];
    etp__qref_cfg_t mx = {ETP__QB_MXFP8, 0, 0, 0, 0, 0, 0};
    /* all-zero: scale 0 (2^-127), elements +-0 */
    for (int i = 0; i < 32 * 32; i++) x[i] = (i & 1) ? -0.0f : 0.0f;
    etp__qref_quantize(&mx, x, ETP__QB_F32, 32, 32, 0, rd, rs, cd, cs);
    assert_int_equal(rs[0], 0);
    assert_int_equal(cs[0], 0);
    assert_int_equal(rd[0], 0x00);
    assert_int_equal(rd[1], 0x80);
    /* a NaN element: ignored by the amax, encoded as NaN; an Inf: scale 0xFE,
     * the Inf becomes NaN (Inf * 0), the rest of its block +-0 */
    for (int i = 0; i < 32 * 32; i++) x[i] = 1.0f;
    x[3] = NAN;
    x[32 + 5] = INFINITY;
    x[32 + 6] = -2.0f;
    etp__qref_quantize(&mx, x, ETP__QB_F32, 32, 32, 0, rd, rs, cd, cs);
    assert_int_equal(rs[0], 119);       /* round_up(1/448) = 2^-8 */
    assert_int_equal(rd[3], 0x7f);
    assert_int_equal(rd[0], etp__qf_e4m3_rne_satfinite(256.0f));
    assert_int_equal(rs[4], 0xfe);      /* row 1 */
    assert_int_equal(rd[32 + 5], 0x7f);
    assert_int_equal(rd[32 + 6], 0x80);
    assert_int_equal(rd[32 + 7], 0x00);
    /* NaN elements, scale 0xFE (2^127) times NaN and +-0: exact, NaN canonical */
    check_dequant_exact(&mx, 1, 32, 32, 0, rd, rs, "mxfp8 special values");
    check_dequant_exact(&mx, 2, 32, 32, 0, cd, cs, "mxfp8 special values");
    /* NVFP4: Inf makes the tensor amax Inf: S_enc = 1; its block's scale is
     * 448 and the Inf saturates to 6; a NaN element encodes as 6 (0x7) */
    uint8_t nrd[32 * 16], nrs[128 * 4];
    for (int i = 0; i < 32 * 32; i++) x[i] = 1.0f;
    x[40] = INFINITY;
    x[3] = NAN;
    etp__qref_cfg_t nv = {ETP__QB_NVFP4, 0, 0, 0, 0, 0, 0};
    const float amax = etp__qref_amax(x, ETP__QB_F32, 32, 32);
    assert_true(isinf(amax));
    etp__qref_quantize(&nv, x, ETP__QB_F32, 32, 32, amax, nrd, nrs, NULL, NULL);
    assert_int_equal(nrs[4 + 0], 0x7e); /* row 1, block 0: amax Inf -> 448 */
    assert_int_equal(nrd[16 + 4] & 0xf, 0x7); /* x[40] = row 1, col 8 */
    assert_int_equal(nrd[16 + 0], 0x00);      /* 1 / 448 -> 0 */
    assert_int_equal((nrd[1] >> 4) & 0xf, 0x7); /* x[3]: NaN -> 6 */
    assert_int_equal(nrs[0], etp__qf_e4m3_rne_satfinite(1.0f / 6.0f));
    check_dequant_exact(&nv, 1, 32, 32, amax, nrd, nrs, "nvfp4 special values");
}

int main(void)
{
    g_seed = tu_pick_seed();
    printf("test_quant_formats: seed %llu (rerun with ETP_TEST_SEED=%llu)\n",
           (unsigned long long)g_seed, (unsigned long long)g_seed);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors_e4m3),
        cmocka_unit_test(test_vectors_e5m2),
        cmocka_unit_test(test_vectors_e2m1),
        cmocka_unit_test(test_vectors_e8m0),
        cmocka_unit_test(test_fast_conversions),
        cmocka_unit_test(test_saturation_and_specials),
        cmocka_unit_test(test_round_trip_all_codes),
        cmocka_unit_test(test_stochastic_rounding),
        cmocka_unit_test(test_layouts),
        cmocka_unit_test(test_block_vectors),
        cmocka_unit_test(test_sr_vectors),
        cmocka_unit_test(test_dequant_all_codes),
        cmocka_unit_test(test_nvfp4_properties),
        cmocka_unit_test(test_mxfp8_properties),
        cmocka_unit_test(test_special_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
