/* float16.h: conversions between fp32 and the two 16-bit float formats of
 * safetensors (BF16, F16), bit-exact and round-to-nearest-even.
 *
 * bf16 -> fp32 and f16 -> fp32 are exact. fp32 -> bf16 / f16 round to
 * nearest, ties to even (as torch's .to() does); NaN stays NaN (quiet, sign
 * and top payload bits kept); f16 overflow becomes +-inf, tiny values
 * become subnormals or zero. A value that came from bf16 (or f16) converts
 * back to the same bits. f32_bits / bits_f32 view an fp32 number as its bits
 * and back.
 */
#ifndef MT_CORE_FLOAT16_H
#define MT_CORE_FLOAT16_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

#endif
