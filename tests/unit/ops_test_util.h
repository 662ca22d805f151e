/* ops_test_util.h: helpers shared by the backend op tests (test_ops_*.c):
 * seeded random tensors, error measures, and a central-difference gradient
 * in double precision.
 *
 * How the gradient checks work: each test has a small double-precision
 * reference forward of its op and a scalar loss L = sum(out * r) with a fixed
 * random r. The numeric gradient of L is taken by central differences on the
 * double reference (step FD_STEP), the analytic one by the CPU backward in
 * fp32 with dout = r, and they are compared by
 *     max_i |analytic_i - numeric_i| / max_i |numeric_i|.
 *
 * Tolerances (the one place they are set):
 *   GRAD_TOL 1e-5: the numeric gradient is accurate to about 1e-8 relative
 *     (double central differences with an absolute step h = 1e-5: truncation
 *     h^2 |f'''| / 6 ~ 1e-10 for the O(1)-scale curvature of our inputs,
 *     rounding 2^-53 |L| / h ~ 1e-9 for |L| <= ~100). The fp32 analytic
 *     gradient carries rounding of at most K * 2^-24 relative to its scale for
 *     sums of K terms, K <= ~100 here, i.e. <= 6e-6 in the worst case (we
 *     measure <= 3e-7). A wrong formula (a missing term, a wrong index or
 *     scale) shows errors of 1e-2 and above.
 *   FWD_TOL 1e-5: an fp32 forward against the double reference, relative to
 *     the output's max, for the same reason (<= ~100 fp32 roundings of 2^-24).
 *   ACC_TOL 1e-6: (G0 + g) + g computed in fp32 against G0 + 2g in double:
 *     two roundings of 2^-24 each, plus an FMA difference inside BLAS.
 */
#ifndef MT_TESTS_OPS_TEST_UTIL_H
#define MT_TESTS_OPS_TEST_UTIL_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/rng.h"

#define GRAD_TOL 1e-5
#define FWD_TOL 1e-5
#define ACC_TOL 1e-6
#define FD_STEP 1e-5

static inline float *rand_floats(Rng *rng, long n, double scale) {
    float *a = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (long i = 0; i < n; i++) a[i] = (float)(scale * rng_normal(rng));
    return a;
}

static inline float *zero_floats(long n) { return calloc((size_t)(n > 0 ? n : 1), sizeof(float)); }

static inline float *copy_floats(const float *a, long n) {
    float *b = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    memcpy(b, a, (size_t)n * sizeof(float));
    return b;
}

static inline double *to_doubles(const float *a, long n) {
    double *d = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    for (long i = 0; i < n; i++) d[i] = a[i];
    return d;
}

/* max |a - ref| / max |ref| (absolute when ref is all zero) */
static inline double rel_error(const float *a, const double *ref, long n) {
    double max_diff = 0.0, max_ref = 0.0;
    for (long i = 0; i < n; i++) {
        double diff = fabs((double)a[i] - ref[i]);
        if (!(diff <= max_diff)) max_diff = diff; /* also catches NaN */
        if (fabs(ref[i]) > max_ref) max_ref = fabs(ref[i]);
    }
    return max_ref > 0.0 ? max_diff / max_ref : max_diff;
}

static inline double max_abs(const float *a, long n) {
    double m = 0.0;
    for (long i = 0; i < n; i++)
        if (fabs(a[i]) > m) m = fabs(a[i]);
    return m;
}

/* Fails the test (with the measured value) unless value < bound. */
#define expect_below(value, bound, what)                                                                      \
    do {                                                                                                      \
        double expect_value_ = (value);                                                                       \
        if (getenv("OPS_TEST_VERBOSE")) printf("  %-44s %.3e (bound %.0e)\n", (what), expect_value_, (bound)); \
        if (!(expect_value_ < (bound))) fail_msg("%s: %.6e is not below %.1e", (what), expect_value_, (bound)); \
    } while (0)

/* sum(out * r) in double */
static inline double project(const double *out, const float *r, long n) {
    double sum = 0.0;
    for (long i = 0; i < n; i++) sum += out[i] * r[i];
    return sum;
}

typedef double (*RefLossFn)(void *ctx);

/* Numeric gradient of loss(ctx) with respect to x[0..n) (an array the
 * reference reads), by central differences; x is restored afterwards. */
static inline double *numeric_grad(RefLossFn loss, void *ctx, double *x, long n) {
    double *grad = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    for (long i = 0; i < n; i++) {
        double saved = x[i];
        double h = FD_STEP;
        x[i] = saved + h;
        double plus = loss(ctx);
        x[i] = saved - h;
        double minus = loss(ctx);
        x[i] = saved;
        grad[i] = (plus - minus) / (2.0 * h);
    }
    return grad;
}

/* Compares an analytic gradient with the numeric one; fails over GRAD_TOL. */
static inline void check_grad(const char *what, const float *analytic, RefLossFn loss, void *ctx, double *x,
                              long n) {
    double *numeric = numeric_grad(loss, ctx, x, n);
    double max_num = 0.0;
    for (long i = 0; i < n; i++)
        if (fabs(numeric[i]) > max_num) max_num = fabs(numeric[i]);
    if (!(max_num > 1e-3)) fail_msg("%s: numeric gradient is ~0 (%g), the check would be vacuous", what, max_num);
    expect_below(rel_error(analytic, numeric, n), GRAD_TOL, what);
    free(numeric);
}

/* After a backward ran once on zeroed buffers (giving once) and twice on
 * buffers prefilled with start (giving twice), checks twice == start + 2 once. */
static inline void check_accumulated(const char *what, const float *twice, const float *start, const float *once,
                                     long n) {
    double *expected = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    for (long i = 0; i < n; i++) expected[i] = (double)start[i] + 2.0 * (double)once[i];
    if (!(max_abs(once, n) > 0.0)) fail_msg("%s: gradient is all zero, the check would be vacuous", what);
    expect_below(rel_error(twice, expected, n), ACC_TOL, what);
    free(expected);
}

#endif
