/* float16.c: fp32 <-> bf16 / f16 bit conversions (see float16.h). */
#include "float16.h"

float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t f32_to_bf16(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu)) /* NaN: keep it a (quiet) NaN */
        return (uint16_t)((u >> 16) | 0x0040u);
    uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u); /* ties to even */
    return (uint16_t)((u + rounding) >> 16);
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1Fu;
    uint32_t mantissa = h & 0x3FFu;
    if (exponent == 0x1F) return bits_f32(sign | 0x7F800000u | (mantissa << 13)); /* inf, NaN */
    if (exponent == 0) {
        if (mantissa == 0) return bits_f32(sign); /* +-0 */
        /* subnormal: mantissa * 2^-24, exact in fp32 */
        float value = (float)mantissa * (1.0f / 16777216.0f);
        return sign ? -value : value;
    }
    return bits_f32(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t f32_to_f16(float f) {
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t abs = u & 0x7FFFFFFFu;
    if (abs >= 0x7F800000u) { /* inf or NaN */
        if (abs == 0x7F800000u) return sign | 0x7C00u;
        return sign | 0x7E00u | (uint16_t)((abs >> 13) & 0x1FFu);
    }
    if (abs >= 0x477FF000u) return sign | 0x7C00u; /* rounds to >= 65520: overflow to inf */
    int exponent = (int)(abs >> 23) - 127;
    if (exponent < -25) return sign; /* below half the smallest subnormal: zero */
    uint32_t mantissa = (abs & 0x7FFFFFu) | 0x800000u; /* 24 significant bits */
    int shift;       /* bits to drop from the 24-bit significand */
    uint32_t biased; /* f16 exponent field for normals */
    if (exponent < -14) { /* subnormal in f16 */
        shift = 13 + (-14 - exponent);
        biased = 0;
    } else {
        shift = 13;
        biased = (uint32_t)(exponent + 15);
        mantissa &= 0x7FFFFFu; /* the implicit bit is carried by the exponent field */
    }
    uint32_t kept = mantissa >> shift;
    uint32_t rest = mantissa & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (kept & 1u))) kept++;
    /* A carry out of the mantissa moves into the exponent field, which is right. */
    return sign | (uint16_t)((biased << 10) + kept);
}
