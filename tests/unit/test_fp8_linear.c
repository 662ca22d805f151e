/* test_fp8_linear.c: precision: fp8's linear products (src/model/model_fp8.c)
 * and the MoE experts' (src/model/moe_dispatch.c) against a reference
 * computed here from the definition: operands cast with fp8.h at the scales
 * fp8_max / amax (a group's weights sharing one scale; each expert its own
 * scales, from its own rows and weights), products summed in double,
 * rescaled; the backward with E5M2 and E4M3 gradients, the bias gradient
 * from the unquantised gradient. The experts include one with no rows (no
 * NaN, no gradient) and one with a single row. Also: without fp8 a group
 * and the experts are the backend's matmuls, bit for bit; and the emulation
 * does differ from fp32 (the casts are not skipped); and delayed scaling's
 * state in the model (model_fp8_state.c). */
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
#include "model/moe_dispatch.h"
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

/* The reference of one group's product over N rows of x (N, IC), its parts' weights w[p] (OC[p], IC) and output
 * gradients g[p] (N, OC[p]) cast at the scales sx, sw (E4M3) and sg (gf), summed in double:
 *   out[p] = xq wq[p]^T / sx / sw,   dx = sum_p gq[p] wq[p] / sg / sw,   dw[p] = gq[p]^T xq / sg / sx. */
static void reference(const float *x, int n_rows, int ic, int count, const float *const *w, const int *oc,
                      const float *const *g, float sx, float sw, float sg, Fp8Format gf, double **out, double *dx,
                      double **dw) {
    float *xq = cast(x, (long)n_rows * ic, sx, FP8_E4M3);
    for (long i = 0; i < (long)n_rows * ic; i++) dx[i] = 0;
    for (int p = 0; p < count; p++) {
        float *wq = cast(w[p], (long)oc[p] * ic, sw, FP8_E4M3), *gq = cast(g[p], (long)n_rows * oc[p], sg, gf);
        for (long i = 0; i < (long)oc[p] * ic; i++) dw[p][i] = 0;
        for (int n = 0; n < n_rows; n++)
            for (int o = 0; o < oc[p]; o++) {
                double acc = 0;
                for (int i = 0; i < ic; i++) acc += (double)xq[n * ic + i] * wq[o * ic + i];
                out[p][n * oc[p] + o] = acc / sx / sw;
                for (int i = 0; i < ic; i++) {
                    dx[n * ic + i] += (double)gq[n * oc[p] + o] * wq[o * ic + i] / sg / sw;
                    dw[p][o * ic + i] += (double)gq[n * oc[p] + o] * xq[n * ic + i] / sg / sx;
                }
            }
        free(wq), free(gq);
    }
    free(xq);
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

/* What the model computed equals the reference at scales sx, sw (one for the group's weights), sg; the bias
 * gradient is the unquantised gradient's sum; and the casts do something (fp32 products differ). */
static void expect_reference(const Group *g, float sx, float sw, float sg, Fp8Format grad_format) {
    const int OC[2] = {OC0, OC1};
    const float *ws[2] = {g->w0, g->w1}, *gs[2] = {g->g0, g->g1};
    float *outs[2] = {g->out0, g->out1}, *dws[2] = {g->dw0, g->dw1};
    double *ref[2], *ref_dw[2], *ref_dx = calloc((size_t)N * IC, sizeof(double));
    for (int p = 0; p < 2; p++) {
        ref[p] = calloc((size_t)N * OC[p], sizeof(double));
        ref_dw[p] = calloc((size_t)OC[p] * IC, sizeof(double));
    }
    reference(g->x, N, IC, 2, ws, OC, gs, sx, sw, sg, grad_format, ref, ref_dx, ref_dw);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC0; o++) ref[0][n * OC0 + o] += g->b0[o];
    for (int p = 0; p < 2; p++) {
        expect_close(outs[p], ref[p], (long)N * OC[p], 1e-6, "forward");
        expect_close(dws[p], ref_dw[p], (long)OC[p] * IC, 1e-6, "weight gradient");
        double far = 0;
        for (int n = 0; n < N; n++)
            for (int o = 0; o < OC[p]; o++) {
                double acc = p == 0 ? g->b0[o] : 0.0;
                for (int i = 0; i < IC; i++) acc += (double)g->x[n * IC + i] * ws[p][o * IC + i];
                far = fmax(far, fabs(acc - ref[p][n * OC[p] + o]));
            }
        assert_true(far > 1e-4);
        free(ref[p]), free(ref_dw[p]);
    }
    expect_close(g->dx, ref_dx, (long)N * IC, 1e-6, "input gradient");
    for (int o = 0; o < OC0; o++) {
        double sum = 0;
        for (int n = 0; n < N; n++) sum += g->g0[n * OC0 + o];
        assert_true(fabs(g->db0[o] - sum) <= 1e-6 * fabs(sum) + 1e-9);
    }
    free(ref_dx);
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

/* delayed on a rank of dp 2: its gradients are dp times the one-rank gradients (averaged later), so the history
 * records their amax divided by dp, as one rank would see it: the next scale is the one-rank run's (a history of
 * dp times the amax would cast with 1/dp of the range, and resume on another dp at other scales). */
static void test_fp8_group_delayed_dp(void **state) {
    (void)state;
    ModelConfig cfg = tiny_config(FAMILY_LLAMA);
    Model *m = model_create(&cfg, &cpu_backend, 1, 8);
    const Fp8Config fp8 = {.recipe = FP8_RECIPE_DELAYED, .grad_format = FP8_E5M2, .amax_history_len = 2,
                           .amax_compute_algo = FP8_AMAX_MAX, .margin = 0};
    model_set_fp8(m, &fp8);
    const Comm dp2 = {.size = 2};
    m->part.dp_comm = &dp2;
    Rng rng;
    rng_seed(&rng, 25);
    Group g = group_new(&rng);
    const float one_rank = amax_g(&g);
    for (long i = 0; i < (long)N * OC0; i++) g.g0[i] *= 2.0f;
    for (long i = 0; i < (long)N * OC1; i++) g.g1[i] *= 2.0f;
    model_fp8_step_begin(m);
    group_run(m, &g);
    model_fp8_step_end(m, NULL);
    assert_true(fp8_state_scale(m, 0, LINEAR_GATE_UP, FP8_GRAD) == 57344.0f / one_rank);
    assert_true(fp8_state_scale(m, 0, LINEAR_GATE_UP, FP8_INPUT) == 448.0f / amax_x(&g)); /* not divided */
    m->part.dp_comm = NULL;
    group_free(&g);
    model_free(m);
}

/* A delayed checkpoint resumed with another fp8.grad_format and margin: its scales, made the new settings' by
 * model_fp8_rescale, are bit for bit those a run with the new settings computed from the same amaxes; a tensor never
 * cast keeps 1; the same settings (or another amax_compute_algo) change nothing. */
static void test_fp8_rescale_on_resume(void **state) {
    (void)state;
    ModelConfig cfg = tiny_config(FAMILY_LLAMA);
    const Fp8Config then = {.recipe = FP8_RECIPE_DELAYED, .grad_format = FP8_E5M2, .amax_history_len = 3,
                            .amax_compute_algo = FP8_AMAX_MAX, .margin = 1};
    Fp8Config now = then;
    now.grad_format = FP8_E4M3;
    now.margin = 0;
    Model *a = model_create(&cfg, &cpu_backend, 1, 8), *b = model_create(&cfg, &cpu_backend, 1, 8),
          *resumed = model_create(&cfg, &cpu_backend, 1, 8);
    model_set_fp8(a, &then);
    model_set_fp8(b, &now);
    model_set_fp8(resumed, &now);
    Rng rng;
    rng_seed(&rng, 26);
    Group g = group_new(&rng);
    for (int k = 0; k < 2; k++) { /* the same amaxes under either setting (the inputs are the same) */
        Model *m = k == 0 ? a : b;
        model_fp8_step_begin(m);
        group_run(m, &g);
        model_fp8_step_end(m, NULL);
    }
    const ModelExtraState ea = model_extra_state(a), eb = model_extra_state(b), er = model_extra_state(resumed);
    memcpy(er.data, ea.data, (size_t)ea.num_floats * sizeof(float)); /* what resume loads */
    assert_int_equal(model_fp8_rescale(resumed, &now), 0);
    assert_true(fp8_state_scale(resumed, 0, LINEAR_GATE_UP, FP8_GRAD) ==
                fp8_state_scale(a, 0, LINEAR_GATE_UP, FP8_GRAD)); /* nothing changed */
    assert_int_equal(model_fp8_rescale(resumed, &then), FP8_OPERANDS); /* gate|up's three casts */
    assert_memory_equal(er.data, eb.data, (size_t)eb.num_floats * sizeof(float));
    assert_true(fp8_state_scale(resumed, 0, LINEAR_GATE_UP, FP8_GRAD) == 448.0f / amax_g(&g));
    assert_true(fp8_state_scale(resumed, 0, LINEAR_O, FP8_GRAD) == 1.0f); /* never cast */
    Fp8Config algo = now;
    algo.amax_compute_algo = FP8_AMAX_MOST_RECENT;
    assert_int_equal(model_fp8_rescale(resumed, &algo), 0);
    group_free(&g);
    model_free(a), model_free(b), model_free(resumed);
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

/* The routed experts of a MoE layer: 4 experts with 3, 0, 1 and 5 rows (expert 3's inputs 8 times larger, so
 * the experts' scales differ), run by moe_experts_forward / _backward (ep 1). */
enum { EXPERTS = 4, EXPERT_ROWS = 9 };
static const int32_t expert_offsets[EXPERTS + 1] = {0, 3, 3, 4, 9};

typedef struct ExpertsRun {
    Model *m;
    MoeExperts ex;
    float *in, *dout, *out, *din; /* (EXPERT_ROWS, C) */
} ExpertsRun;

static ExpertsRun experts_run(const Fp8Config *fp8, uint64_t seed) {
    ModelConfig cfg = moe_test_config(FAMILY_QWEN3_MOE);
    ExpertsRun r = {.m = model_create(&cfg, &cpu_backend, 1, 8)};
    model_init_weights(r.m, seed);
    model_zero_grad(r.m);
    if (fp8) model_set_fp8(r.m, fp8);
    model_fp8_step_begin(r.m); /* a step's amaxes from here (delayed scaling) */
    const int C = r.m->cfg.hidden_size;
    Rng rng;
    rng_seed(&rng, seed);
    r.in = randoms(&rng, (long)EXPERT_ROWS * C, 1.0);
    for (long i = (long)expert_offsets[3] * C; i < (long)EXPERT_ROWS * C; i++) r.in[i] *= 8.0f;
    r.dout = randoms(&rng, (long)EXPERT_ROWS * C, 1e-3);
    r.out = calloc((size_t)EXPERT_ROWS * C, sizeof(float));
    r.din = calloc((size_t)EXPERT_ROWS * C, sizeof(float));
    moe_experts_init(&r.ex, &r.m->cfg, 1, 1, EXPERT_ROWS);
    moe_experts_forward(r.m, 0, &r.ex, r.in, expert_offsets, r.out);
    moe_experts_backward(r.m, 0, &r.ex, r.dout, r.din);
    return r;
}

static void experts_run_free(ExpertsRun *r) {
    moe_experts_free(&r->ex);
    free(r->in), free(r->dout), free(r->out), free(r->din);
    model_free(r->m);
}

/* Expert j's product against the reference from the inputs it had (x: its rows of the product's input; the
 * scales from their amaxes and the expert's own weights). */
static void check_expert_product(const ExpertsRun *r, int j, int g, Fp8Format gf) {
    const ModelPriv *pr = r->m->priv;
    const LayerWeights *w = &pr->weights[0], *dw = &pr->weight_grads[0];
    const MoeExperts *ex = &r->ex;
    const int C = r->m->cfg.hidden_size, I = r->m->cfg.moe.moe_intermediate_size;
    const int r0 = expert_offsets[j], n = expert_offsets[j + 1] - r0;
    const long wj = (long)j * I * C;
    const bool gu = g == EXPERT_GATE_UP;
    const int ic = gu ? C : I, count = gu ? 2 : 1, oc[2] = {gu ? I : C, I};
    const float *x = gu ? r->in + (long)r0 * C : ex->act + (long)r0 * I;
    const float *ws[2] = {gu ? w->e_gate + wj : w->e_down + wj, w->e_up + wj};
    const float *dws[2] = {gu ? dw->e_gate + wj : dw->e_down + wj, dw->e_up + wj};
    const float *gs[2] = {gu ? ex->d_gate + (long)r0 * I : r->dout + (long)r0 * C, ex->d_up + (long)r0 * I};
    const float *outs[2] = {gu ? ex->gate + (long)r0 * I : r->out + (long)r0 * C, ex->up + (long)r0 * I};
    const float *dx = gu ? r->din + (long)r0 * C : ex->d_act + (long)r0 * I;
    float wmax = 0, gmax = 0;
    for (int p = 0; p < count; p++) {
        wmax = fmaxf(wmax, amax_of(ws[p], (long)oc[p] * ic));
        gmax = fmaxf(gmax, amax_of(gs[p], (long)n * oc[p]));
    }
    const float sx = 448.0f / amax_of(x, (long)n * ic), sw = 448.0f / wmax, sg = fp8_max(gf) / gmax;
    assert_true(ex->fp8_scales[j][g][0] == sx && ex->fp8_scales[j][g][1] == sw && ex->fp8_scales[j][g][2] == sg);
    double *ref[2], *ref_dw[2], *ref_dx = calloc((size_t)n * ic, sizeof(double));
    for (int p = 0; p < count; p++) {
        ref[p] = calloc((size_t)n * oc[p], sizeof(double));
        ref_dw[p] = calloc((size_t)oc[p] * ic, sizeof(double));
    }
    reference(x, n, ic, count, ws, oc, gs, sx, sw, sg, gf, ref, ref_dx, ref_dw);
    for (int p = 0; p < count; p++) {
        expect_close(outs[p], ref[p], (long)n * oc[p], 1e-6, "expert forward");
        expect_close(dws[p], ref_dw[p], (long)oc[p] * ic, 1e-6, "expert weight gradient");
        free(ref[p]), free(ref_dw[p]);
    }
    expect_close(dx, ref_dx, (long)n * ic, 1e-6, "expert input gradient");
    free(ref_dx);
}

static void check_experts(Fp8Format grad_format) {
    const Fp8Config fp8 = {.recipe = FP8_RECIPE_TENSORWISE, .grad_format = grad_format, .margin = 0};
    ExpertsRun r = experts_run(&fp8, grad_format == FP8_E5M2 ? 31 : 32);
    const ModelPriv *pr = r.m->priv;
    const int C = r.m->cfg.hidden_size, I = r.m->cfg.moe.moe_intermediate_size;
    for (int j = 0; j < EXPERTS; j++) {
        if (expert_offsets[j + 1] == expert_offsets[j]) { /* no rows: no gradient, an input scale of 1 */
            for (long i = 0; i < (long)I * C; i++) {
                const long at = (long)j * I * C + i;
                assert_true(pr->weight_grads[0].e_gate[at] == 0 && pr->weight_grads[0].e_up[at] == 0 &&
                            pr->weight_grads[0].e_down[at] == 0);
            }
            assert_true(r.ex.fp8_scales[j][EXPERT_GATE_UP][0] == 1.0f && r.ex.fp8_scales[j][EXPERT_DOWN][0] == 1.0f);
            continue;
        }
        check_expert_product(&r, j, EXPERT_GATE_UP, grad_format);
        check_expert_product(&r, j, EXPERT_DOWN, grad_format);
    }
    for (long i = 0; i < (long)EXPERT_ROWS * C; i++) assert_true(isfinite(r.out[i]) && isfinite(r.din[i]));
    /* each expert its own scales: expert 3's larger inputs give a smaller input scale than expert 0's */
    assert_true(r.ex.fp8_scales[3][EXPERT_GATE_UP][0] < r.ex.fp8_scales[0][EXPERT_GATE_UP][0] / 4);
    experts_run_free(&r);
}

/* delayed with experts: each expert's two products keep their own input, weight and gradient histories (a slot
 * shared with another expert's product would scale one expert by another's amaxes): after the first step each
 * scale is fmax over the amax of what that expert's product cast; an expert without rows keeps scale 1. */
static void test_fp8_experts_delayed(void **state) {
    (void)state;
    const Fp8Config fp8 = {.recipe = FP8_RECIPE_DELAYED, .grad_format = FP8_E5M2, .amax_history_len = 2,
                           .amax_compute_algo = FP8_AMAX_MAX, .margin = 0};
    ExpertsRun r = experts_run(&fp8, 34);
    model_fp8_step_end(r.m, NULL);
    const ModelPriv *pr = r.m->priv;
    const LayerWeights *w = &pr->weights[0];
    const int C = r.m->cfg.hidden_size, I = r.m->cfg.moe.moe_intermediate_size;
    for (int j = 0; j < EXPERTS; j++) {
        const int r0 = expert_offsets[j], n = expert_offsets[j + 1] - r0;
        const long wj = (long)j * I * C;
        float want[2][FP8_OPERANDS];
        want[EXPERT_GATE_UP][FP8_INPUT] = 448.0f / amax_of(r.in + (long)r0 * C, (long)n * C);
        want[EXPERT_GATE_UP][FP8_WEIGHT] = 448.0f / fmaxf(amax_of(w->e_gate + wj, (long)I * C),
                                                           amax_of(w->e_up + wj, (long)I * C));
        want[EXPERT_GATE_UP][FP8_GRAD] = 57344.0f / fmaxf(amax_of(r.ex.d_gate + (long)r0 * I, (long)n * I),
                                                           amax_of(r.ex.d_up + (long)r0 * I, (long)n * I));
        want[EXPERT_DOWN][FP8_INPUT] = 448.0f / amax_of(r.ex.act + (long)r0 * I, (long)n * I);
        want[EXPERT_DOWN][FP8_WEIGHT] = 448.0f / amax_of(w->e_down + wj, (long)I * C);
        want[EXPERT_DOWN][FP8_GRAD] = 57344.0f / amax_of(r.dout + (long)r0 * C, (long)n * C);
        for (int g = 0; g < 2; g++)
            for (int o = 0; o < FP8_OPERANDS; o++) {
                const float got = fp8_state_expert_scale(r.m, 0, j, g, (Fp8Operand)o);
                if (n == 0 && o != FP8_WEIGHT) want[g][o] = 1.0f; /* nothing cast: kept */
                if (got != want[g][o])
                    fail_msg("expert %d product %d operand %d: scale %g, expected %g", j, g, o, got, want[g][o]);
            }
    }
    experts_run_free(&r);
}

static void test_fp8_experts_e5m2_gradients(void **state) { check_experts(FP8_E5M2); }
static void test_fp8_experts_e4m3_gradients(void **state) { check_experts(FP8_E4M3); }

/* Without fp8 the experts are the backend's matmuls and SwiGLU, bit for bit. */
static void test_fp32_experts_are_matmuls(void **state) {
    ExpertsRun r = experts_run(NULL, 33);
    const ModelPriv *pr = r.m->priv;
    const LayerWeights *w = &pr->weights[0], *dw = &pr->weight_grads[0];
    const int C = r.m->cfg.hidden_size, I = r.m->cfg.moe.moe_intermediate_size;
    float gate[I * EXPERT_ROWS], up[I * EXPERT_ROWS], act[I * EXPERT_ROWS], y[C * EXPERT_ROWS];
    float d_act[I * EXPERT_ROWS], d_gate[I * EXPERT_ROWS], d_up[I * EXPERT_ROWS], d_x[C * EXPERT_ROWS];
    float *dwg = calloc((size_t)EXPERTS * I * C, sizeof(float)), *dwu = calloc((size_t)EXPERTS * I * C, sizeof(float));
    float *dwd = calloc((size_t)EXPERTS * I * C, sizeof(float));
    memset(d_act, 0, sizeof d_act), memset(d_gate, 0, sizeof d_gate), memset(d_up, 0, sizeof d_up);
    memset(d_x, 0, sizeof d_x);
    for (int j = 0; j < EXPERTS; j++) {
        const int r0 = expert_offsets[j], n = expert_offsets[j + 1] - r0;
        const long wj = (long)j * I * C, ri = (long)r0 * I, rc = (long)r0 * C;
        if (n == 0) continue;
        cpu_backend.matmul_forward(gate + ri, r.in + rc, w->e_gate + wj, NULL, n, C, I);
        cpu_backend.matmul_forward(up + ri, r.in + rc, w->e_up + wj, NULL, n, C, I);
        cpu_backend.swiglu_forward(act + ri, gate + ri, up + ri, (long)n * I);
        cpu_backend.matmul_forward(y + rc, act + ri, w->e_down + wj, NULL, n, I, C);
        cpu_backend.matmul_backward(d_act + ri, dwd + wj, NULL, r.dout + rc, act + ri, w->e_down + wj, n, I, C);
        cpu_backend.swiglu_backward(d_gate + ri, d_up + ri, d_act + ri, gate + ri, up + ri, (long)n * I);
        cpu_backend.matmul_backward(d_x + rc, dwg + wj, NULL, d_gate + ri, r.in + rc, w->e_gate + wj, n, C, I);
        cpu_backend.matmul_backward(d_x + rc, dwu + wj, NULL, d_up + ri, r.in + rc, w->e_up + wj, n, C, I);
    }
    assert_memory_equal(r.out, y, sizeof y);
    assert_memory_equal(r.din, d_x, sizeof d_x);
    assert_memory_equal(dw->e_gate, dwg, (size_t)EXPERTS * I * C * sizeof(float));
    assert_memory_equal(dw->e_up, dwu, (size_t)EXPERTS * I * C * sizeof(float));
    assert_memory_equal(dw->e_down, dwd, (size_t)EXPERTS * I * C * sizeof(float));
    free(dwg), free(dwu), free(dwd);
    experts_run_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_group_e5m2_gradients),
        cmocka_unit_test(test_fp8_group_e4m3_gradients),
        cmocka_unit_test(test_fp32_group_is_matmul),
        cmocka_unit_test(test_fp8_group_delayed),
        cmocka_unit_test(test_fp8_group_delayed_dp),
        cmocka_unit_test(test_fp8_rescale_on_resume),
        cmocka_unit_test(test_fp8_experts_delayed),
        cmocka_unit_test(test_fp8_experts_e5m2_gradients),
        cmocka_unit_test(test_fp8_experts_e4m3_gradients),
        cmocka_unit_test(test_fp32_experts_are_matmuls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
