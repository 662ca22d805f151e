/* test_fp8_linear.c: precision: fp8's linear products (src/model/model_fp8.c)
 * against a reference computed here from the definition: operands cast with
 * fp8.h at the scales fp8_max / amax (the group's weights sharing one
 * scale), products summed in double, rescaled; the backward with E5M2 and
 * E4M3 gradients, the bias gradient from the unquantised gradient. Also:
 * without fp8 the group calls are the backend's matmuls, bit for bit; and
 * the emulation does differ from fp32 (the casts are not skipped). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "core/fp8.h"
#include "core/rng.h"
#include "model/model.h"
#include "model/model_fp8.h"
#include "test_tiny_config.h"

enum { N = 6, IC = 16, OC0 = 8, OC1 = 12 };

static float *randoms(Rng *rng, long n, double scale) {
    float *x = malloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) x[i] = (float)(rng_normal(rng) * scale);
    return x;
}

static float amax_of(const float *x, long n) {
    float m = 0;
    for (long i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

/* a (n) cast to fp8 at scale s, as fp32 values */
static float *cast(const float *a, long n, float s, Fp8Format f) {
    float *q = malloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) q[i] = fp8_to_f32(fp8_from_f32(a[i] * s, f), f);
    return q;
}

static void expect_close(const float *got, const double *want, long n, double tol, const char *what) {
    double scale = 0, diff = 0;
    for (long i = 0; i < n; i++) {
        scale = fmax(scale, fabs(want[i]));
        diff = fmax(diff, fabs((double)got[i] - want[i]));
    }
    if (!(diff <= tol * scale)) fail_msg("%s: max difference %g for values up to %g", what, diff, scale);
}

static void check_group(Fp8Format grad_format) {
    ModelConfig cfg = tiny_config(FAMILY_LLAMA);
    Model *m = model_create(&cfg, &cpu_backend, 1, 8);
    const Fp8Config fp8 = {.recipe = FP8_RECIPE_TENSORWISE, .grad_format = grad_format, .margin = 0};
    model_set_fp8(m, &fp8);
    Rng rng;
    rng_seed(&rng, grad_format == FP8_E5M2 ? 21 : 22);
    float *x = randoms(&rng, (long)N * IC, 1.3), *w0 = randoms(&rng, (long)OC0 * IC, 0.2);
    float *w1 = randoms(&rng, (long)OC1 * IC, 0.05), *b0 = randoms(&rng, OC0, 0.1);
    float *g0 = randoms(&rng, (long)N * OC0, 1e-3), *g1 = randoms(&rng, (long)N * OC1, 3e-4);
    float *out0 = calloc((size_t)N * OC0, sizeof(float)), *out1 = calloc((size_t)N * OC1, sizeof(float));
    float *dx = calloc((size_t)N * IC, sizeof(float)), *dw0 = calloc((size_t)OC0 * IC, sizeof(float));
    float *dw1 = calloc((size_t)OC1 * IC, sizeof(float)), *db0 = calloc(OC0, sizeof(float));
    const LinearPart fwd[2] = {{.weight = w0, .bias = b0, .out = out0, .OC = OC0},
                               {.weight = w1, .out = out1, .OC = OC1}};
    linear_group_forward(m, 0, LINEAR_GATE_UP, x, N, IC, fwd, 2);
    const LinearPart bwd[2] = {{.weight = w0, .bias = b0, .dout = g0, .dweight = dw0, .dbias = db0, .OC = OC0},
                               {.weight = w1, .dout = g1, .dweight = dw1, .OC = OC1}};
    linear_group_backward(m, 0, LINEAR_GATE_UP, dx, x, N, IC, bwd, 2);

    /* the reference: one weight scale for the group, one gradient scale */
    const float sx = 448.0f / amax_of(x, (long)N * IC);
    const float sw = 448.0f / fmaxf(amax_of(w0, (long)OC0 * IC), amax_of(w1, (long)OC1 * IC));
    const float sg = fp8_max(grad_format) / fmaxf(amax_of(g0, (long)N * OC0), amax_of(g1, (long)N * OC1));
    float *xq = cast(x, (long)N * IC, sx, FP8_E4M3);
    float *wq[2] = {cast(w0, (long)OC0 * IC, sw, FP8_E4M3), cast(w1, (long)OC1 * IC, sw, FP8_E4M3)};
    float *gq[2] = {cast(g0, (long)N * OC0, sg, grad_format), cast(g1, (long)N * OC1, sg, grad_format)};
    const int OC[2] = {OC0, OC1};
    float *outs[2] = {out0, out1}, *dws[2] = {dw0, dw1};
    double *ref_dx = calloc((size_t)N * IC, sizeof(double));
    for (int p = 0; p < 2; p++) {
        double *ref = calloc((size_t)N * OC[p], sizeof(double)), *ref_dw = calloc((size_t)OC[p] * IC, sizeof(double));
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC[p]; o++) {
                double acc = 0;
                for (int i = 0; i < IC; i++) acc += (double)xq[n * IC + i] * wq[p][o * IC + i];
                ref[n * OC[p] + o] = acc / sx / sw + (p == 0 ? b0[o] : 0.0);
                for (int i = 0; i < IC; i++) {
                    ref_dx[n * IC + i] += (double)gq[p][n * OC[p] + o] * wq[p][o * IC + i] / sg / sw;
                    ref_dw[o * IC + i] += (double)gq[p][n * OC[p] + o] * xq[n * IC + i] / sg / sx;
                }
            }
        expect_close(outs[p], ref, (long)N * OC[p], 1e-6, "forward");
        expect_close(dws[p], ref_dw, (long)OC[p] * IC, 1e-6, "weight gradient");
        /* the cast does something: fp32 products differ */
        double far = 0;
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC[p]; o++) {
                double acc = p == 0 ? b0[o] : 0.0;
                for (int i = 0; i < IC; i++) acc += (double)x[n * IC + i] * (p == 0 ? w0 : w1)[o * IC + i];
                far = fmax(far, fabs(acc - ref[n * OC[p] + o]));
            }
        assert_true(far > 1e-4);
        free(ref), free(ref_dw);
    }
    expect_close(dx, ref_dx, (long)N * IC, 1e-6, "input gradient");
    for (int o = 0; o < OC0; o++) {
        double sum = 0;
        for (int n = 0; n < N; n++) sum += g0[n * OC0 + o];
        assert_true(fabs(db0[o] - sum) <= 1e-6 * fabs(sum) + 1e-9);
    }
    free(x), free(w0), free(w1), free(b0), free(g0), free(g1), free(out0), free(out1), free(dx), free(dw0);
    free(dw1), free(db0), free(xq), free(ref_dx);
    for (int p = 0; p < 2; p++) free(wq[p]), free(gq[p]);
    model_free(m);
}

static void test_fp8_group_e5m2_gradients(void **state) { check_group(FP8_E5M2); }
static void test_fp8_group_e4m3_gradients(void **state) { check_group(FP8_E4M3); }

/* Without fp8 a group is the backend's matmuls, bit for bit. */
static void test_fp32_group_is_matmul(void **state) {
    ModelConfig cfg = tiny_config(FAMILY_LLAMA);
    Model *m = model_create(&cfg, &cpu_backend, 1, 8);
    Rng rng;
    rng_seed(&rng, 23);
    float *x = randoms(&rng, (long)N * IC, 1.0), *w = randoms(&rng, (long)OC0 * IC, 0.2), *b = randoms(&rng, OC0, 0.1);
    float *g = randoms(&rng, (long)N * OC0, 0.01);
    float out[2][N * OC0], dx[2][N * IC], dw[2][OC0 * IC], db[2][OC0];
    memset(dx, 0, sizeof dx), memset(dw, 0, sizeof dw), memset(db, 0, sizeof db);
    const LinearPart part = {.weight = w, .bias = b, .out = out[0], .dout = g, .dweight = dw[0], .dbias = db[0],
                             .OC = OC0};
    linear_group_forward(m, 0, LINEAR_O, x, N, IC, &part, 1);
    linear_group_backward(m, 0, LINEAR_O, dx[0], x, N, IC, &part, 1);
    cpu_backend.matmul_forward(out[1], x, w, b, N, IC, OC0);
    cpu_backend.matmul_backward(dx[1], dw[1], db[1], g, x, w, N, IC, OC0);
    assert_memory_equal(out[0], out[1], sizeof out[0]);
    assert_memory_equal(dx[0], dx[1], sizeof dx[0]);
    assert_memory_equal(dw[0], dw[1], sizeof dw[0]);
    assert_memory_equal(db[0], db[1], sizeof db[0]);
    free(x), free(w), free(b), free(g);
    model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_group_e5m2_gradients),
        cmocka_unit_test(test_fp8_group_e4m3_gradients),
        cmocka_unit_test(test_fp32_group_is_matmul),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
