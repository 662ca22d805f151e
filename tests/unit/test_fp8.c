/* test_fp8.c: the E4M3 / E5M2 conversions of src/core/fp8.c bit for bit
 * against ml_dtypes (tests/fixtures/fp8, made by make_fixtures.py: 3,500 fp32
 * inputs of every value class with their saturating-cast bytes, and the fp32
 * bits of all 256 codes of each format); round trips of all 256 codes (NaN
 * codes to the canonical NaN of their sign, E5M2's infinities to the largest
 * finite value); fp8_quantize and fp8_amax on small arrays whose results are
 * worked out by hand in the comments; and fp8.c's bit-level conversion
 * against the value-by-value definition (round on the binade's grid with
 * rintf, below) on every 251st fp32 pattern (MT_FP8_STRIDE=1: all 2^32). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "core/float16.h"
#include "core/fp8.h"

#define FIXTURES "tests/fixtures/fp8"

static const char *const format_names[2] = {"E4M3", "E5M2"};

static FILE *open_fixture(const char *name) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", FIXTURES, name);
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("%s: cannot open (run from the repository root; made by %s/make_fixtures.py)", path, FIXTURES);
    return f;
}

/* Every line of encode.txt: fp8_from_f32 gives ml_dtypes' E4M3 and E5M2 bytes. */
static void test_encode_matches_ml_dtypes(void **state) {
    (void)state;
    FILE *f = open_fixture("encode.txt");
    char line[256], klass[256] = "";
    int checked = 0, wrong = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') {
            snprintf(klass, sizeof klass, "%s", line + 2);
            klass[strcspn(klass, "\n")] = '\0';
            continue;
        }
        unsigned x, want[2];
        assert_int_equal(sscanf(line, "%x %x %x", &x, &want[0], &want[1]), 3);
        for (int fmt = 0; fmt < 2; fmt++) {
            const unsigned got = fp8_from_f32(bits_f32(x), (Fp8Format)fmt);
            if (got != want[fmt] && wrong++ < 20)
                print_error("%s of %08x (%g, %s): got %02x, ml_dtypes %02x\n", format_names[fmt], x,
                            (double)bits_f32(x), klass, got, want[fmt]);
        }
        checked++;
    }
    fclose(f);
    assert_true(checked > 3000); /* the whole table was read */
    assert_int_equal(wrong, 0);
}

/* All 256 codes of decode.txt: fp8_to_f32 gives ml_dtypes' fp32 bits (NaN's sign included). */
static void test_decode_matches_ml_dtypes(void **state) {
    (void)state;
    FILE *f = open_fixture("decode.txt");
    char line[256];
    int checked = 0, wrong = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        unsigned code, want[2];
        assert_int_equal(sscanf(line, "%x %x %x", &code, &want[0], &want[1]), 3);
        assert_int_equal(code, (unsigned)checked); /* codes 00..ff in order */
        for (int fmt = 0; fmt < 2; fmt++) {
            const uint32_t got = f32_bits(fp8_to_f32((uint8_t)code, (Fp8Format)fmt));
            if (got != want[fmt] && wrong++ < 20)
                print_error("%s code %02x: got %08x, ml_dtypes %08x\n", format_names[fmt], code, got, want[fmt]);
        }
        checked++;
    }
    fclose(f);
    assert_int_equal(checked, 256);
    assert_int_equal(wrong, 0);
}

/* A few values fixed by the formats' definitions, independent of the fixture. */
static void test_format_constants(void **state) {
    (void)state;
    assert_true(fp8_max(FP8_E4M3) == 448.0f);
    assert_true(fp8_max(FP8_E5M2) == 57344.0f);
    assert_true(fp8_to_f32(0x7e, FP8_E4M3) == 448.0f);  /* S.1111.110 = 1.75 * 2^8 */
    assert_true(fp8_to_f32(0x7b, FP8_E5M2) == 57344.0f); /* S.11110.11 = 1.75 * 2^15 */
    assert_true(fp8_to_f32(0x01, FP8_E4M3) == ldexpf(1.0f, -9));
    assert_true(fp8_to_f32(0x01, FP8_E5M2) == ldexpf(1.0f, -16));
    assert_true(fp8_to_f32(0x08, FP8_E4M3) == ldexpf(1.0f, -6));  /* smallest normal */
    assert_true(fp8_to_f32(0x04, FP8_E5M2) == ldexpf(1.0f, -14));
    assert_true(fp8_to_f32(0x38, FP8_E4M3) == 1.0f);
    assert_true(fp8_to_f32(0x3c, FP8_E5M2) == 1.0f);
    assert_true(fp8_to_f32(0xfc, FP8_E5M2) == -INFINITY);
    assert_true(isnan(fp8_to_f32(0x7f, FP8_E4M3)) && isnan(fp8_to_f32(0x7d, FP8_E5M2)));
}

/* Every code decodes and encodes back to itself, but: NaN codes give the
 * canonical NaN of their sign (E4M3 0x7f, E5M2 0x7e), and E5M2's infinities
 * saturate to the largest finite value (0x7b) with their sign. */
static void test_round_trip_all_codes(void **state) {
    (void)state;
    for (int fmt = 0; fmt < 2; fmt++) {
        const uint8_t canonical_nan = fmt == FP8_E4M3 ? 0x7f : 0x7e, max_code = fmt == FP8_E4M3 ? 0x7e : 0x7b;
        int nans = 0, infs = 0;
        for (int c = 0; c < 256; c++) {
            const float v = fp8_to_f32((uint8_t)c, (Fp8Format)fmt);
            const uint8_t back = fp8_from_f32(v, (Fp8Format)fmt), sign = (uint8_t)(c & 0x80);
            uint8_t want = (uint8_t)c;
            if (isnan(v)) {
                want = sign | canonical_nan;
                nans++;
            } else if (isinf(v)) {
                want = sign | max_code;
                infs++;
            }
            if (back != want) fail_msg("%s code %02x -> %g -> %02x, expected %02x", format_names[fmt], c, (double)v,
                                       back, want);
        }
        assert_int_equal(nans, fmt == FP8_E4M3 ? 2 : 6); /* E4M3: S.1111.111; E5M2: S.11111.{01,10,11} */
        assert_int_equal(infs, fmt == FP8_E4M3 ? 0 : 2);
    }
}

static void assert_same_bits(float got, float want) {
    if (f32_bits(got) != f32_bits(want))
        fail_msg("got %g (%08x), expected %g (%08x)", (double)got, f32_bits(got), (double)want, f32_bits(want));
}

/* out = fp8(x * scale) as fp32, worked out by hand:
 *   scale 2: 0.1f -> 0.2f; E4M3 grid in [0.125, 0.25) is 2^-6: 12.8 -> 13 * 2^-6 = 0.203125;
 *            E5M2 grid there is 2^-5: 6.4 -> 6 * 2^-5 = 0.1875.
 *   -1000 -> -2000: E4M3 saturates to -448; E5M2 grid in [1024, 2048) is 256: 7.8125 -> 8 -> -2048.
 *   3.3f -> 6.6f: E4M3 grid in [4, 8) is 0.5: 13.2 -> 6.5; E5M2 grid is 1: 6.6 -> 7.
 *   1e-4f -> 2e-4f: E4M3's smallest subnormal is 2^-9 ~ 0.00195: 0.1024 -> +0;
 *            E5M2 grid in [2^-13, 2^-12) is 2^-15: 6.5536 -> 7 * 2^-15 = 0.000213623046875.
 *   -0 stays -0; NaN stays NaN (its sign: the input's). */
static void test_quantize_by_hand(void **state) {
    (void)state;
    const float x[7] = {0.1f, -1000.0f, 3.3f, 1e-4f, -0.0f, 0.0f, -NAN};
    const float want[2][6] = {{0.203125f, -448.0f, 6.5f, 0.0f, -0.0f, 0.0f},
                              {0.1875f, -2048.0f, 7.0f, 0.000213623046875f, -0.0f, 0.0f}};
    for (int fmt = 0; fmt < 2; fmt++) {
        float out[7];
        fp8_quantize(out, x, 7, 2.0f, (Fp8Format)fmt);
        for (int i = 0; i < 6; i++) assert_same_bits(out[i], want[fmt][i]);
        assert_true(isnan(out[6]) && signbit(out[6]));
        float inplace[7];
        memcpy(inplace, x, sizeof x);
        fp8_quantize(inplace, inplace, 7, 2.0f, (Fp8Format)fmt); /* out may equal x */
        assert_memory_equal(inplace, out, sizeof out);
    }
    /* a scale below 1: 1000 * 0.25 = 250; E4M3 grid in [128, 256) is 16: 15.625 -> 16 * 16 = 256;
     * E5M2 grid is 32: 7.8125 -> 8 * 32 = 256; an infinite input saturates */
    const float big[2] = {1000.0f, -INFINITY};
    float out[2];
    fp8_quantize(out, big, 2, 0.25f, FP8_E4M3);
    assert_same_bits(out[0], 256.0f);
    assert_same_bits(out[1], -448.0f);
    fp8_quantize(out, big, 2, 0.25f, FP8_E5M2);
    assert_same_bits(out[0], 256.0f);
    assert_same_bits(out[1], -57344.0f);
    fp8_quantize(out, big, 0, 1.0f, FP8_E4M3); /* n = 0 writes nothing */
    assert_same_bits(out[0], 256.0f);
}

/* The definition: the magnitude rounded on the grid of its binade (spacing 2^(e - mantissa bits), e clamped to
 * the smallest normal exponent so that subnormals share that binade's spacing) with rintf, saturated beyond the
 * largest finite value, then the fields written. */
static uint8_t definition_from_f32(float x, Fp8Format format) {
    const int mbits = format == FP8_E4M3 ? 3 : 2, bias = format == FP8_E4M3 ? 7 : 15;
    const float max = fp8_max(format);
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return sign | (format == FP8_E4M3 ? 0x7f : 0x7e);
    const int min_exp = 1 - bias;
    float a = fabsf(x);
    if (a == 0.0f) return sign;
    if (a < max) {
        int e = ilogbf(a);
        if (e < min_exp) e = min_exp;
        const float quantum = ldexpf(1.0f, e - mbits);
        a = rintf(a / quantum) * quantum;
    }
    if (a > max) a = max;
    if (a == 0.0f) return sign;
    const int e = ilogbf(a);
    if (e < min_exp) return sign | (uint8_t)(a / ldexpf(1.0f, min_exp - mbits));
    const int mantissa = (int)(a / ldexpf(1.0f, e - mbits)) - (1 << mbits);
    return sign | (uint8_t)(((e + bias) << mbits) | mantissa);
}

static float bits_float(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* fp8_from_f32 and fp8_quantize (scale 1, and a scale of 3: x * 3 rounded first) equal the definition. */
static void test_bit_level_matches_definition(void **state) {
    (void)state;
    const char *env = getenv("MT_FP8_STRIDE");
    const uint64_t stride = env && atoll(env) > 0 ? (uint64_t)atoll(env) : 251;
    enum { BATCH = 4096 };
    static float x[BATCH], q[BATCH], q3[BATCH];
    for (int fmt = 0; fmt < 2; fmt++) {
        const Fp8Format f = (Fp8Format)fmt;
        uint64_t checked = 0;
        for (uint64_t u = 0; u < (1ull << 32);) {
            int n = 0;
            for (; n < BATCH && u < (1ull << 32); n++, u += stride) x[n] = bits_float((uint32_t)u);
            fp8_quantize(q, x, n, 1.0f, f);
            fp8_quantize(q3, x, n, 3.0f, f);
            for (int i = 0; i < n; i++) {
                const uint8_t want = definition_from_f32(x[i], f), got = fp8_from_f32(x[i], f);
                if (got != want) fail_msg("%s: %a (0x%08x) gives 0x%02x, the definition 0x%02x", format_names[fmt], x[i],
                                          (unsigned)(u - (uint64_t)(n - i) * stride), got, want);
                const float value = fp8_to_f32(want, f), value3 = fp8_to_f32(definition_from_f32(x[i] * 3.0f, f), f);
                if (memcmp(&q[i], &value, sizeof value) != 0 || memcmp(&q3[i], &value3, sizeof value3) != 0)
                    fail_msg("%s: fp8_quantize(%a) gives %a / %a (scale 3), the definition %a / %a", format_names[fmt],
                             x[i], q[i], q3[i], value, value3);
            }
            checked += (uint64_t)n;
        }
        assert_true(checked >= (1ull << 32) / stride);
    }
}

static void test_amax(void **state) {
    (void)state;
    const float none[1] = {5.0f};
    assert_same_bits(fp8_amax(none, 0), 0.0f);
    const float mixed[4] = {-3.0f, 2.0f, 0.5f, -0.25f};
    assert_same_bits(fp8_amax(mixed, 4), 3.0f);
    assert_same_bits(fp8_amax(mixed + 1, 3), 2.0f);
    const float zeros[2] = {-0.0f, -0.0f};
    assert_same_bits(fp8_amax(zeros, 2), 0.0f); /* +0, not -0 */
    const float inf[3] = {1.0f, -INFINITY, 2.0f};
    assert_true(fp8_amax(inf, 3) == INFINITY);
    const float nan_mid[3] = {1.0f, NAN, 5.0f}, nan_last[3] = {1.0f, 5.0f, -NAN};
    assert_same_bits(fp8_amax(nan_mid, 3), 5.0f); /* NaNs skipped, as TE's fmaxf skips them */
    assert_same_bits(fp8_amax(nan_last, 3), 5.0f);
    const float all_nan[2] = {NAN, -NAN};
    assert_same_bits(fp8_amax(all_nan, 2), 0.0f);
    const float tiny[2] = {-1e-45f, 1e-45f / 2}; /* an fp32 subnormal (the second rounds to 0) */
    assert_same_bits(fp8_amax(tiny, 2), 1e-45f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encode_matches_ml_dtypes),
        cmocka_unit_test(test_decode_matches_ml_dtypes),
        cmocka_unit_test(test_format_constants),
        cmocka_unit_test(test_round_trip_all_codes),
        cmocka_unit_test(test_quantize_by_hand),
        cmocka_unit_test(test_amax),
        cmocka_unit_test(test_bit_level_matches_definition),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
