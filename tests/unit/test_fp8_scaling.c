/* test_fp8_scaling.c: the FP8 scale and the delayed-scaling state machine
 * (src/model/fp8_scaling.c) against Transformer Engine's rules, with every
 * expected value worked out here by hand:
 *   - the scale (fmax / amax) / 2^margin; the previous scale where amax is
 *     0, negative, inf or NaN; FLT_MAX where fmax / amax overflows (TE's
 *     reference divides by 2^margin after the overflow);
 *   - the history of lengths 1, 3 and 5 over sequences of amaxes, max and
 *     most_recent: the scales step by step and the rolled history (h[0] = 0,
 *     then the oldest to the newest amax); over a long sequence the scales
 *     equal the rule's other form, the largest of the last len amaxes;
 *   - tensors holding NaNs record the amax of the rest (fp8_amax), so a
 *     NaN step does not hold the scales for the history's length. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "core/float16.h"
#include "core/fp8.h"
#include "model/fp8_scaling.h"

static const float E4M3_MAX = 448.0f, E5M2_MAX = 57344.0f;

static void assert_same_float(float got, float want, const char *what, int step) {
    if (f32_bits(got) != f32_bits(want))
        fail_msg("%s, step %d: got %.9g (%08x), expected %.9g (%08x)", what, step, (double)got, f32_bits(got),
                 (double)want, f32_bits(want));
}

static Fp8Config delayed(Fp8AmaxAlgo algo, int margin) {
    return (Fp8Config){.recipe = FP8_RECIPE_DELAYED, .grad_format = FP8_E5M2, .amax_history_len = 0,
                       .amax_compute_algo = algo, .margin = margin};
}

static void test_scale_formula(void **state) {
    (void)state;
    assert_same_float(fp8_scale_from_amax(2.0f, E4M3_MAX, 0, 5.0f), 224.0f, "448 / 2", 0);
    assert_same_float(fp8_scale_from_amax(2.0f, E4M3_MAX, 1, 5.0f), 112.0f, "448 / 2 / 2", 0);
    assert_same_float(fp8_scale_from_amax(2.0f, E4M3_MAX, 3, 5.0f), 28.0f, "448 / 2 / 8", 0);
    /* 448 / 3 = 149.333..., rounded to fp32: 1.0010101...b * 2^7 -> 0x1.2aaaaap+7 */
    assert_same_float(fp8_scale_from_amax(3.0f, E4M3_MAX, 0, 5.0f), 0x1.2aaaaap+7f, "448 / 3", 0);
    assert_same_float(fp8_scale_from_amax(E5M2_MAX, E5M2_MAX, 0, 5.0f), 1.0f, "57344 / 57344", 0);
    assert_same_float(fp8_scale_from_amax(1.0f, E5M2_MAX, 2, 5.0f), 14336.0f, "57344 / 1 / 4", 0);
    assert_same_float(fp8_scale_from_amax(1.0f, E4M3_MAX, 64, 5.0f), 0x1.cp-56f, "448 / 2^64 = 1.75 * 2^-56", 0);
    assert_same_float(fp8_scale_from_amax(0.5f, E4M3_MAX, 0, NAN), 896.0f, "previous unused", 0);

    /* nothing to scale by: the previous scale */
    const float previous = 7.5f;
    const float keep[6] = {0.0f, -0.0f, -2.0f, INFINITY, -INFINITY, NAN};
    for (int i = 0; i < 6; i++)
        assert_same_float(fp8_scale_from_amax(keep[i], E4M3_MAX, 0, previous), previous, "amax <= 0 or not finite", i);
    assert_same_float(fp8_scale_from_amax(NAN, E4M3_MAX, 2, FLT_MAX), FLT_MAX, "NaN keeps FLT_MAX", 0);

    /* tiny amax: 448 / 1e-36 = 4.48e38 > FLT_MAX (3.40e38) overflows to inf, and inf / 2^margin stays
     * inf: FLT_MAX, with margin 0 and 1 (TE's fused kernel, (448 / 2) / 1e-36, would give 2.24e38) */
    assert_same_float(fp8_scale_from_amax(1e-36f, E4M3_MAX, 0, previous), FLT_MAX, "448 / 1e-36", 0);
    assert_same_float(fp8_scale_from_amax(1e-36f, E4M3_MAX, 1, previous), FLT_MAX, "448 / 1e-36 / 2", 0);
    assert_same_float(fp8_scale_from_amax(0x1p-149f, E5M2_MAX, 0, previous), FLT_MAX, "smallest subnormal", 0);
    /* 448 / 2e-36 = 2.24e38 still fits */
    const float fits = fp8_scale_from_amax(2e-36f, E4M3_MAX, 0, previous);
    assert_true(isfinite(fits) && fits < FLT_MAX && fits > 2.2e38f);
    /* huge amax: 448 / FLT_MAX = 1.3e-36, finite and positive */
    const float small = fp8_scale_from_amax(FLT_MAX, E4M3_MAX, 0, previous);
    assert_true(small > 1.3e-36f && small < 1.4e-36f);
}

static void test_history_init_free(void **state) {
    (void)state;
    Fp8History h;
    fp8_history_init(&h, 3);
    assert_int_equal(h.len, 3);
    assert_true(h.scale == 1.0f);
    for (int i = 0; i < 3; i++) assert_true(h.amax[i] == 0.0f);
    fp8_history_free(&h);
    assert_null(h.amax);
    assert_int_equal(h.len, 0);
}

/* Feeds amax[0..n-1]; after each update the scale must be want[t], and, when
 * `hist` is given, the history hist[t][0..len-1]. */
static void run_sequence(const char *what, int len, Fp8AmaxAlgo algo, int margin, float fmax, const float *amax,
                         const float *want, const float (*hist)[5], int n) {
    Fp8History h;
    fp8_history_init(&h, len);
    const Fp8Config cfg = delayed(algo, margin);
    for (int t = 0; t < n; t++) {
        fp8_history_update(&h, amax[t], &cfg, fmax);
        assert_same_float(h.scale, want[t], what, t + 1);
        if (hist)
            for (int i = 0; i < len; i++) assert_same_float(h.amax[i], hist[t][i], what, t + 1);
    }
    fp8_history_free(&h);
}

/* len 1: no roll, h[0] written then zeroed; max and most_recent are the same rule:
 * 448/2, 448/4, 0 keeps, 448/1, NaN keeps, 448/8, inf keeps, 448/0.5 */
static void test_history_len1(void **state) {
    (void)state;
    const float amax[8] = {2, 4, 0, 1, NAN, 8, INFINITY, 0.5f};
    const float want[8] = {224, 112, 112, 448, 448, 56, 56, 896};
    const float hist[8][5] = {{0}};
    run_sequence("len 1 max", 1, FP8_AMAX_MAX, 0, E4M3_MAX, amax, want, hist, 8);
    run_sequence("len 1 most_recent", 1, FP8_AMAX_MOST_RECENT, 0, E4M3_MAX, amax, want, hist, 8);
}

/* len 3 on 2, 4, 1, 1, 1, 0.5, 0.5, 0.5. The history step by step, from TE's roll:
 *   [2,0,0] -> roll [0,0,2] -> h[0]=0: [0,0,2]; [4,0,2] -> [0,2,4]; [1,2,4] -> [2,4,1] -> [0,4,1];
 *   [1,4,1] -> [0,1,1]; [1,1,1] -> [0,1,1]; [0.5,1,1] -> [0,1,0.5]; [0.5,1,0.5] -> [0,0.5,0.5]; ...
 * max takes the max of the history before the roll: 2, 4, 4, 4, 1, 1, 1, 0.5 (the 4 counts three
 * times); most_recent the amax itself. */
static void test_history_len3(void **state) {
    (void)state;
    const float amax[8] = {2, 4, 1, 1, 1, 0.5f, 0.5f, 0.5f};
    const float hist[8][5] = {{0, 0, 2}, {0, 2, 4}, {0, 4, 1},      {0, 1, 1},
                              {0, 1, 1}, {0, 1, 0.5f}, {0, 0.5f, 0.5f}, {0, 0.5f, 0.5f}};
    const float want_max[8] = {224, 112, 112, 112, 448, 448, 448, 896};
    const float want_recent[8] = {224, 112, 448, 448, 448, 896, 896, 896};
    run_sequence("len 3 max", 3, FP8_AMAX_MAX, 0, E4M3_MAX, amax, want_max, hist, 8);
    run_sequence("len 3 most_recent", 3, FP8_AMAX_MOST_RECENT, 0, E4M3_MAX, amax, want_recent, hist, 8);
    /* margin 1 halves every scale */
    float half[8];
    for (int t = 0; t < 8; t++) half[t] = want_max[t] / 2;
    run_sequence("len 3 max margin 1", 3, FP8_AMAX_MAX, 1, E4M3_MAX, amax, half, hist, 8);
}

/* len 3 with zeros, NaN and inf among the amaxes.
 *   2, 0, 0, 0, 1:  max: windows {2} {2,0} {2,0,0} {0,0,0} {0,0,1} -> 224, 224, 224, keeps 224, 448;
 *                   most_recent: 224, keeps, keeps, keeps, 448.
 *   2, NaN, 1, 1, 1, 4:  max: a NaN in the window keeps the scale while it is there (3 updates):
 *                   224, 224, 224, 224, 448, 112; most_recent: 224, keeps 224, 448, 448, 448, 112.
 *   inf, 1:  the first scale keeps TE's initial 1; max: 1, 1 (inf still in the window);
 *                   most_recent: 1, 448. */
static void test_history_len3_zero_nan_inf(void **state) {
    (void)state;
    const float zeros[5] = {2, 0, 0, 0, 1};
    const float zeros_want[5] = {224, 224, 224, 224, 448};
    const float zeros_hist[5][5] = {{0, 0, 2}, {0, 2, 0}, {0, 0, 0}, {0, 0, 0}, {0, 0, 1}};
    run_sequence("zeros max", 3, FP8_AMAX_MAX, 0, E4M3_MAX, zeros, zeros_want, zeros_hist, 5);
    run_sequence("zeros most_recent", 3, FP8_AMAX_MOST_RECENT, 0, E4M3_MAX, zeros, zeros_want, zeros_hist, 5);

    const float nan[6] = {2, NAN, 1, 1, 1, 4};
    const float nan_max[6] = {224, 224, 224, 224, 448, 112};
    const float nan_recent[6] = {224, 224, 448, 448, 448, 112};
    run_sequence("NaN max", 3, FP8_AMAX_MAX, 0, E4M3_MAX, nan, nan_max, NULL, 6);
    run_sequence("NaN most_recent", 3, FP8_AMAX_MOST_RECENT, 0, E4M3_MAX, nan, nan_recent, NULL, 6);

    const float inf[2] = {INFINITY, 1};
    const float inf_max[2] = {1, 1}, inf_recent[2] = {1, 448};
    run_sequence("inf max", 3, FP8_AMAX_MAX, 0, E4M3_MAX, inf, inf_max, NULL, 2);
    run_sequence("inf most_recent", 3, FP8_AMAX_MOST_RECENT, 0, E4M3_MAX, inf, inf_recent, NULL, 2);
}

/* A step whose tensor held NaNs records the amax of the rest (fp8_amax skips NaNs, as TE's fmaxf does; an all-NaN
 * tensor gives 0), so no NaN enters the history. Tensors {2, -1}, {NaN, NaN}, {0.5, NaN}, {1}, {1}: amaxes 2, 0,
 * 0.5, 1, 1; len 3, max: 224, 224, 224, then 448 once the 2 has left the window (a NaN recorded instead would keep
 * 224 at step 4, and with the default len 1024 for 1024 steps). */
static void test_nan_tensors_do_not_freeze(void **state) {
    (void)state;
    const float t0[2] = {2, -1}, t1[2] = {NAN, -NAN}, t2[2] = {0.5f, NAN}, t3[1] = {1}, t4[1] = {1};
    const float amax[5] = {fp8_amax(t0, 2), fp8_amax(t1, 2), fp8_amax(t2, 2), fp8_amax(t3, 1), fp8_amax(t4, 1)};
    const float want[5] = {224, 224, 224, 448, 448};
    const float hist[5][5] = {{0, 0, 2}, {0, 2, 0}, {0, 0, 0.5f}, {0, 0.5f, 1}, {0, 1, 1}};
    run_sequence("NaN tensors, max", 3, FP8_AMAX_MAX, 0, E4M3_MAX, amax, want, hist, 5);
}

/* len 5 on 3, 1, 7, 2, 2, 2, 2, 2, 9: max over the last five: 3, 3, 7, 7, 7, 7, 7, 2, 9
 * (the 7 of step 3 leaves after step 7) */
static void test_history_len5(void **state) {
    (void)state;
    const float amax[9] = {3, 1, 7, 2, 2, 2, 2, 2, 9};
    const float want[9] = {448.0f / 3, 448.0f / 3, 64, 64, 64, 64, 64, 224, 448.0f / 9};
    const float hist[9][5] = {{0, 0, 0, 0, 3}, {0, 0, 0, 3, 1}, {0, 0, 3, 1, 7}, {0, 3, 1, 7, 2}, {0, 1, 7, 2, 2},
                              {0, 7, 2, 2, 2}, {0, 2, 2, 2, 2}, {0, 2, 2, 2, 2}, {0, 2, 2, 2, 9}};
    run_sequence("len 5 max", 5, FP8_AMAX_MAX, 0, E4M3_MAX, amax, want, hist, 9);
}

/* 60 amaxes over many binades (some 0) with len 5, margin 2 and E5M2's 57344: the scale after
 * step t is (57344 / a) / 4 with a the largest of amax[t-4..t] (max) or amax[t] (most_recent),
 * the scale before where a is 0; the history ends as [0, amax[56..59]]. */
static void test_history_len5_window(void **state) {
    (void)state;
    enum { N = 60, LEN = 5 };
    float amax[N], want_max[N], want_recent[N];
    for (int t = 0; t < N; t++) /* 2^-9 .. 2^9 times 1, 1.25 or 1.5; every seventh 0 */
        amax[t] = t % 7 == 6 ? 0.0f : ldexpf(1.0f + (float)(t % 3) / 4, (t * 5) % 19 - 9);
    float max_scale = 1.0f, recent_scale = 1.0f;
    for (int t = 0; t < N; t++) {
        float a = 0.0f;
        for (int s = t - LEN + 1; s <= t; s++)
            if (s >= 0 && amax[s] > a) a = amax[s];
        if (a > 0) max_scale = (E5M2_MAX / a) / 4;
        if (amax[t] > 0) recent_scale = (E5M2_MAX / amax[t]) / 4;
        want_max[t] = max_scale;
        want_recent[t] = recent_scale;
    }
    run_sequence("window max", LEN, FP8_AMAX_MAX, 2, E5M2_MAX, amax, want_max, NULL, N);
    run_sequence("window most_recent", LEN, FP8_AMAX_MOST_RECENT, 2, E5M2_MAX, amax, want_recent, NULL, N);

    Fp8History h;
    fp8_history_init(&h, LEN);
    const Fp8Config cfg = delayed(FP8_AMAX_MAX, 2);
    for (int t = 0; t < N; t++) fp8_history_update(&h, amax[t], &cfg, E5M2_MAX);
    assert_same_float(h.amax[0], 0.0f, "history slot 0", N);
    for (int i = 1; i < LEN; i++) assert_same_float(h.amax[i], amax[N - LEN + i], "history", N);
    fp8_history_free(&h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scale_formula),
        cmocka_unit_test(test_history_init_free),
        cmocka_unit_test(test_history_len1),
        cmocka_unit_test(test_history_len3),
        cmocka_unit_test(test_history_len3_zero_nan_inf),
        cmocka_unit_test(test_nan_tensors_do_not_freeze),
        cmocka_unit_test(test_history_len5),
        cmocka_unit_test(test_history_len5_window),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
