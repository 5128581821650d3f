/* 16-bit float conversions (round to nearest even), for host reductions. */
#ifndef ETP__HALF_H
#define ETP__HALF_H

#include <stdint.h>
#include <string.h>

static inline float etp__bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint32_t etp__f32_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float etp__bf16_to_f32(uint16_t h)
{
    return etp__bits_to_f32((uint32_t)h << 16);
}

static inline uint16_t etp__f32_to_bf16(float f)
{
    uint32_t u = etp__f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float etp__f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return etp__bits_to_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        /* subnormal: man * 2^-24, exact in FP32 */
        float f = (float)man * 5.9604644775390625e-08f;
        return sign ? -f : f;
    }
    return etp__bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t etp__f32_to_f16(float f)
{
    uint32_t u = etp__f32_to_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504: inf */
    if (a < 0x38800000u) {
        /* subnormal or zero: round a * 2^24 to an integer, ties to even */
        float x = etp__bits_to_f32(a) * 16777216.0f;
        uint32_t i = (uint32_t)x;
        float rem = x - (float)i;
        if (rem > 0.5f || (rem == 0.5f && (i & 1u))) i++;
        return (uint16_t)(sign | i);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

#endif /* ETP__HALF_H */
