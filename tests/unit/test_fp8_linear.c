/* test_fp8_linear.c: precision: fp8's linear products (src/model/model_fp8.c)
 * against a reference computed here from the definition: operands cast with
 * fp8.h at the scales fp8_max / amax (the group's weights sharing one
 * scale), products summed in double, rescaled; the backward with E5M2 and
 * E4M3 gradients, the bias gradient from the unquantised gradient. Also:
 * without fp8 the group calls are the backend's matmuls, bit for bit; and
 * the emulation does differ from fp32 (the casts are not skipped); and
 * delayed scaling's state in the model (model_fp8_state.c). */
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

/* One group's operands and what the model computed from them. */
typedef struct Group {
    float *x, *w0, *w1, *b0, *g0, *g1;
    float *out0, *out1, *dx, *dw0, *dw1, *db0;
} Group;

static Group group_new(Rng *rng) {
    Group g = {.x = randoms(rng, (long)N * IC, 1.3), .w0 = randoms(rng, (long)OC0 * IC, 0.2),
               .w1 = randoms(rng, (long)OC1 * IC, 0.05), .b0 = randoms(rng, OC0, 0.1),
               .g0 = randoms(rng, (long)N * OC0, 1e-3), .g1 = randoms(rng, (long)N * OC1, 3e-4)};
    g.out0 = calloc((size_t)N * OC0, sizeof(float)), g.out1 = calloc((size_t)N * OC1, sizeof(float));
    g.dx = calloc((size_t)N * IC, sizeof(float)), g.dw0 = calloc((size_t)OC0 * IC, sizeof(float));
    g.dw1 = calloc((size_t)OC1 * IC, sizeof(float)), g.db0 = calloc(OC0, sizeof(float));
    return g;
}

static void group_free(Group *g) {
    float *all[] = {g->x, g->w0, g->w1, g->b0, g->g0, g->g1, g->out0, g->out1, g->dx, g->dw0, g->dw1, g->db0};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
}

/* The model's forward and backward of the group (layer 0's gate|up). */
static void group_run(Model *m, Group *g) {
    const LinearPart fwd[2] = {{.weight = g->w0, .bias = g->b0, .out = g->out0, .OC = OC0},
                               {.weight = g->w1, .out = g->out1, .OC = OC1}};
    linear_group_forward(m, 0, LINEAR_GATE_UP, g->x, N, IC, fwd, 2);
    const LinearPart bwd[2] = {
        {.weight = g->w0, .bias = g->b0, .dout = g->g0, .dweight = g->dw0, .dbias = g->db0, .OC = OC0},
        {.weight = g->w1, .dout = g->g1, .dweight = g->dw1, .OC = OC1}};
    linear_group_backward(m, 0, LINEAR_GATE_UP, g->dx, g->x, N, IC, bwd, 2);
}

/* The group's amaxes: of x, of both weights together, of both output gradients together. */
static float amax_x(const Group *g) { return amax_of(g->x, (long)N * IC); }
static float amax_w(const Group *g) { return fmaxf(amax_of(g->w0, (long)OC0 * IC), amax_of(g->w1, (long)OC1 * IC)); }
static float amax_g(const Group *g) { return fmaxf(amax_of(g->g0, (long)N * OC0), amax_of(g->g1, (long)N * OC1)); }

/* What the model computed equals the definition at scales sx, sw (one for the group's weights), sg. */
static void expect_reference(const Group *g, float sx, float sw, float sg, Fp8Format grad_format) {
    float *xq = cast(g->x, (long)N * IC, sx, FP8_E4M3);
    float *wq[2] = {cast(g->w0, (long)OC0 * IC, sw, FP8_E4M3), cast(g->w1, (long)OC1 * IC, sw, FP8_E4M3)};
    float *gq[2] = {cast(g->g0, (long)N * OC0, sg, grad_format), cast(g->g1, (long)N * OC1, sg, grad_format)};
    const int OC[2] = {OC0, OC1};
    float *outs[2] = {g->out0, g->out1}, *dws[2] = {g->dw0, g->dw1}, *ws[2] = {g->w0, g->w1};
    double *ref_dx = calloc((size_t)N * IC, sizeof(double));
    for (int p = 0; p < 2; p++) {
        double *ref = calloc((size_t)N * OC[p], sizeof(double)), *ref_dw = calloc((size_t)OC[p] * IC, sizeof(double));
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC[p]; o++) {
                double acc = 0;
                for (int i = 0; i < IC; i++) acc += (double)xq[n * IC + i] * wq[p][o * IC + i];
                ref[n * OC[p] + o] = acc / sx / sw + (p == 0 ? g->b0[o] : 0.0);
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
                double acc = p == 0 ? g->b0[o] : 0.0;
                for (int i = 0; i < IC; i++) acc += (double)g->x[n * IC + i] * ws[p][o * IC + i];
                far = fmax(far, fabs(acc - ref[n * OC[p] + o]));
            }
        assert_true(far > 1e-4);
        free(ref), free(ref_dw);
    }
    expect_close(g->dx, ref_dx, (long)N * IC, 1e-6, "input gradient");
    for (int o = 0; o < OC0; o++) {
        double sum = 0;
        for (int n = 0; n < N; n++) sum += g->g0[n * OC0 + o];
        assert_true(fabs(g->db0[o] - sum) <= 1e-6 * fabs(sum) + 1e-9);
    }
    free(xq), free(ref_dx);
    for (int p = 0; p < 2; p++) free(wq[p]), free(gq[p]);
}

/* tensorwise: each cast's scale from its own tensor's amax, now. */
static void check_group(Fp8Format grad_format) {
    ModelConfig cfg = tiny_config(FAMILY_LLAMA);
    Model *m = model_create(&cfg, &cpu_backend, 1, 8);
    const Fp8Config fp8 = {.recipe = FP8_RECIPE_TENSORWISE, .grad_format = grad_format, .margin = 0};
    model_set_fp8(m, &fp8);
    assert_int_equal(model_extra_state(m).count, 0); /* current scaling keeps no state */
    Rng rng;
    rng_seed(&rng, grad_format == FP8_E5M2 ? 21 : 22);
    Group g = group_new(&rng);
    group_run(m, &g);
    expect_reference(&g, 448.0f / amax_x(&g), 448.0f / amax_w(&g), fp8_max(grad_format) / amax_g(&g), grad_format);
    group_free(&g);
    model_free(m);
}

/* delayed: the first step casts at scale 1; the step's end turns each tensor's amax into the next step's scale
 * (fmax / amax, with margin 1 here: / 2); amaxes recorded before a step (an evaluation's) are forgotten; the state is
 * the model's extra state, two tensors per layer. */
static void test_fp8_group_delayed(void **state) {
    ModelConfig cfg = tiny_config(FAMILY_LLAMA);
    Model *m = model_create(&cfg, &cpu_backend, 1, 8);
    const Fp8Config fp8 = {.recipe = FP8_RECIPE_DELAYED, .grad_format = FP8_E5M2, .amax_history_len = 3,
                           .amax_compute_algo = FP8_AMAX_MAX, .margin = 1};
    model_set_fp8(m, &fp8);
    const ModelExtraState extra = model_extra_state(m);
    assert_int_equal(extra.count, 2 * cfg.num_layers);
    assert_string_equal(extra.info[0].name, "fp8.layers.0.amax_history");
    assert_int_equal(extra.info[0].shape[0], FP8_LAYER_TENSORS);
    assert_int_equal(extra.info[0].shape[1], 3);
    assert_string_equal(extra.info[1].name, "fp8.layers.0.scale");
    assert_true(model_is_extra_state(extra.info[3].name) && !model_is_extra_state("layers.0.attn_norm.weight"));

    Rng rng;
    rng_seed(&rng, 24);
    Group g1 = group_new(&rng), g2 = group_new(&rng), ev = group_new(&rng);
    for (long i = 0; i < (long)N * IC; i++) ev.x[i] *= 100.0f; /* an evaluation's large input */
    model_fp8_step_begin(m);
    group_run(m, &g1);
    expect_reference(&g1, 1.0f, 1.0f, 1.0f, FP8_E5M2);
    model_fp8_step_end(m, NULL);
    const float sx = 448.0f / amax_x(&g1) / 2, sw = 448.0f / amax_w(&g1) / 2, sg = 57344.0f / amax_g(&g1) / 2;
    const size_t t = (size_t)LINEAR_GATE_UP * FP8_OPERANDS;
    assert_true(fp8_state_scale(m, 0, LINEAR_GATE_UP, FP8_INPUT) == sx);
    assert_true(fp8_state_scale(m, 0, LINEAR_GATE_UP, FP8_WEIGHT) == sw);
    assert_true(fp8_state_scale(m, 0, LINEAR_GATE_UP, FP8_GRAD) == sg);
    assert_true(fp8_state_scale(m, 0, LINEAR_O, FP8_INPUT) == 1.0f); /* never cast: kept */
    assert_true(extra.data[(t + FP8_INPUT) * 3 + 2] == amax_x(&g1)); /* the newest amax last, slot 0 cleared */
    assert_true(extra.data[(t + FP8_INPUT) * 3 + 0] == 0.0f);
    assert_true(extra.data[(size_t)cfg.num_layers * FP8_LAYER_TENSORS * 3 + t + FP8_GRAD] == sg); /* the scales */

    linear_group_forward(m, 0, LINEAR_GATE_UP, ev.x, N, IC,
                         (LinearPart[]){{.weight = ev.w0, .out = ev.out0, .OC = OC0}}, 1);
    model_fp8_step_begin(m); /* forgets the evaluation's amax */
    group_run(m, &g2);       /* step 2 casts with step 1's scales */
    expect_reference(&g2, sx, sw, sg, FP8_E5M2);
    model_fp8_step_end(m, NULL);
    assert_true(fp8_state_scale(m, 0, LINEAR_GATE_UP, FP8_INPUT) == 448.0f / fmaxf(amax_x(&g1), amax_x(&g2)) / 2);
    group_free(&g1), group_free(&g2), group_free(&ev);
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
        cmocka_unit_test(test_fp8_group_delayed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
