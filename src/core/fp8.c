/* fp8.c: E4M3 / E5M2 conversions (fp8.h), on the fp32 bit pattern.
 * fp32 -> fp8 of a magnitude a below the largest finite value:
 *   normal (a >= the smallest normal, 2^(1-bias)): round the fp32 pattern's
 *     mantissa to the format's bits, to nearest, ties to even (add half an
 *     fp8 ulp minus one, plus the kept lowest bit, then cut: a carry moves
 *     into the exponent, as it should), then rebias the exponent;
 *   subnormal (below it): a / 2^(1-bias-m) rounded to an integer with
 *     rintf (ties to even in the default rounding mode; the scaling by a power
 *     of two is exact) is the code, 2^m (the smallest normal) included.
 * A magnitude at or beyond the largest finite value (infinity included)
 * saturates; NaN gives the canonical NaN with its sign. fp8_quantize takes
 * the rounded value straight from the rounded pattern (no round trip
 * through the code). tests/unit/test_fp8.c checks both against ml_dtypes'
 * tables and against the value-by-value definition on millions of inputs. */
#include "fp8.h"

#include <math.h>
#include <string.h>

typedef struct Fp8Layout {
    int mantissa_bits, bias;
    float max;
    uint8_t max_code, nan_code;
} Fp8Layout;

static const Fp8Layout layouts[2] = {{3, 7, 448.0f, 0x7e, 0x7f}, {2, 15, 57344.0f, 0x7b, 0x7e}};

float fp8_max(Fp8Format format) { return layouts[format].max; }

static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float float_of(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* The fp32 pattern of a normal magnitude `a` (bits, below the format's max and at least its smallest normal)
 * rounded to the format's mantissa bits, ties to even: still an fp32 pattern. */
static uint32_t round_normal(uint32_t a, int mantissa_bits) {
    const int cut = 23 - mantissa_bits;
    const uint32_t r = a + ((1u << (cut - 1)) - 1u) + ((a >> cut) & 1u);
    return r >> cut << cut;
}

/* The smallest normal's exponent as an fp32 pattern: a magnitude pattern below it is subnormal in the format. */
static uint32_t smallest_normal_bits(const Fp8Layout *f) { return (uint32_t)(127 + 1 - f->bias) << 23; }

/* |x| (a finite magnitude below 2^(1-bias)) rounded to a multiple of the smallest subnormal, in units of it. */
static float subnormal_units(float a, const Fp8Layout *f) {
    return rintf(a * ldexpf(1.0f, f->bias - 1 + f->mantissa_bits));
}

uint8_t fp8_from_f32(float x, Fp8Format format) {
    const Fp8Layout *f = &layouts[format];
    const uint32_t u = bits_of(x), a = u & 0x7fffffffu;
    const uint8_t sign = (uint8_t)(u >> 24 & 0x80u);
    if (a > 0x7f800000u) return sign | f->nan_code; /* quiet NaN, sign kept (fp8.h) */
    if (float_of(a) >= f->max) return sign | f->max_code; /* saturate (infinity too) */
    if (a < smallest_normal_bits(f)) return sign | (uint8_t)subnormal_units(float_of(a), f);
    const uint32_t r = round_normal(a, f->mantissa_bits) >> (23 - f->mantissa_bits);
    return sign | (uint8_t)(r - ((uint32_t)(127 - f->bias) << f->mantissa_bits));
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
    const Fp8Layout *f = &layouts[format];
    const uint32_t normal = smallest_normal_bits(f);
    const float unit = ldexpf(1.0f, 1 - f->bias - f->mantissa_bits); /* the smallest subnormal */
    for (long i = 0; i < n; i++) {
        const uint32_t u = bits_of(x[i] * scale), a = u & 0x7fffffffu, sign = u & 0x80000000u;
        uint32_t q;
        if (a > 0x7f800000u) q = sign | 0x7fc00000u; /* fp8_to_f32 of the NaN code */
        else if (float_of(a) >= f->max) q = sign | bits_of(f->max);
        else if (a < normal) q = sign | bits_of(subnormal_units(float_of(a), f) * unit);
        else q = sign | round_normal(a, f->mantissa_bits);
        out[i] = float_of(q);
    }
}

float fp8_amax(const float *x, long n) {
    float amax = 0.0f;
    for (long i = 0; i < n; i++) {
        const float a = fabsf(x[i]);
        if (a > amax) amax = a; /* false for a NaN: skipped, as fmaxf skips it in TE's amax kernels */
    }
    return amax;
}
