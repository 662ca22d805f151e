/* fp8.c: E4M3 / E5M2 conversions (fp8.h). fp32 -> fp8 rounds the magnitude
 * on the grid of its binade (spacing 2^(e - mantissa bits), e clamped to the
 * smallest normal exponent so that subnormals share the smallest normal
 * binade's spacing) with rintf (ties to even in the default rounding mode:
 * the quotient by a power of two is exact), saturates what lands beyond the
 * largest finite value, then writes the fields. */
#include "fp8.h"

#include <math.h>

typedef struct Fp8Layout {
    int mantissa_bits, bias;
    float max;
} Fp8Layout;

static const Fp8Layout layouts[2] = {{3, 7, 448.0f}, {2, 15, 57344.0f}};

float fp8_max(Fp8Format format) { return layouts[format].max; }

uint8_t fp8_from_f32(float x, Fp8Format format) {
    const Fp8Layout *f = &layouts[format];
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return sign | (format == FP8_E4M3 ? 0x7f : 0x7e); /* quiet NaN, sign kept (fp8.h) */
    const int min_exp = 1 - f->bias; /* exponent of the smallest normal */
    float a = fabsf(x);
    if (a == 0.0f) return sign;
    if (a < f->max) {
        int e = ilogbf(a);
        if (e < min_exp) e = min_exp;
        const float quantum = ldexpf(1.0f, e - f->mantissa_bits);
        a = rintf(a / quantum) * quantum;
    }
    if (a > f->max) a = f->max; /* saturate (infinity too) */
    if (a == 0.0f) return sign;
    int e = ilogbf(a);
    if (e < min_exp) /* subnormal: exponent field 0 */
        return sign | (uint8_t)(a / ldexpf(1.0f, min_exp - f->mantissa_bits));
    const int mantissa = (int)(a / ldexpf(1.0f, e - f->mantissa_bits)) - (1 << f->mantissa_bits);
    return sign | (uint8_t)(((e + f->bias) << f->mantissa_bits) | mantissa);
}

float fp8_to_f32(uint8_t bits, Fp8Format format) {
    const Fp8Layout *f = &layouts[format];
    const int exp_bits = 7 - f->mantissa_bits, exp_mask = (1 << exp_bits) - 1;
    const int field = (bits >> f->mantissa_bits) & exp_mask, mantissa = bits & ((1 << f->mantissa_bits) - 1);
    const float sign = (bits & 0x80) ? -1.0f : 1.0f;
    /* copysignf: sign * NAN would not carry the sign (x86 returns the NaN operand) */
    if (format == FP8_E4M3 && field == exp_mask && mantissa == (1 << f->mantissa_bits) - 1) return copysignf(NAN, sign);
    if (format == FP8_E5M2 && field == exp_mask) return mantissa ? copysignf(NAN, sign) : sign * INFINITY;
    if (field == 0) return sign * ldexpf((float)mantissa, 1 - f->bias - f->mantissa_bits);
    return sign * ldexpf((float)((1 << f->mantissa_bits) + mantissa), field - f->bias - f->mantissa_bits);
}

void fp8_quantize(float *out, const float *x, long n, float scale, Fp8Format format) {
    for (long i = 0; i < n; i++) out[i] = fp8_to_f32(fp8_from_f32(x[i] * scale, format), format);
}

float fp8_amax(const float *x, long n) {
    float amax = 0.0f;
    for (long i = 0; i < n; i++) {
        const float a = fabsf(x[i]);
        if (isnan(a)) return NAN;
        if (a > amax) amax = a;
    }
    return amax;
}
