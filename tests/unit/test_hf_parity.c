/* test_hf_parity.c: the CPU model against Hugging Face transformers.
 *
 * tests/fixtures/hf/<case>/ holds a tiny random transformers model
 * (config.json + model.safetensors) and reference.safetensors with, for one
 * fixed batch, the logits, the loss, the gradient of every parameter (under
 * its HF name, prefixed "grad.") and the losses of five AdamW steps, all
 * computed by transformers (tests/fixtures/hf/make_fixtures.py writes them;
 * docs/parity.md). Each case is read the way `convert` reads a model
 * (hf_config + safetensors + hf_names) into our Model on the CPU backend, then:
 *   forward:  logits and loss            relative error < 1e-5
 *   backward: every parameter's gradient relative error < 1e-4 (per tensor)
 *   AdamW:    five steps (clipping, weight decay groups, constant lr as in
 *             src/train/train_step.c); losses and grad norms < 1e-4
 * Relative error of a tensor = max |ours - ref| / max |ref| (over the whole
 * tensor; for a scalar, |ours - ref| / |ref|).
 * The fixtures are read by tests/unit/hf_fixture.h. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "hf_fixture.h"
#include "model/model_internal.h"
#include "model/moe_layer.h"
#include "train/grad_clip.h"
#include "train/optimizer.h"

#define LOGITS_TOL 1e-5
#define LOSS_TOL 1e-5
#define GRAD_TOL 1e-4
#define ADAMW_TOL 1e-4
#define ADAMW_MAX_STEPS 16

/* ---- relative error ---- */

/* max |a - b| / max |b| over n floats (b is the reference). */
static double relative_error(const float *a, const float *b, long n) {
    double max_diff = 0.0, max_ref = 0.0;
    for (long i = 0; i < n; i++) {
        double diff = fabs((double)a[i] - (double)b[i]);
        if (!(diff <= max_diff)) max_diff = diff; /* NaN propagates */
        if (fabs((double)b[i]) > max_ref) max_ref = fabs((double)b[i]);
    }
    return max_ref > 0.0 ? max_diff / max_ref : max_diff;
}

/* ---- the checks ---- */

/* Every parameter's gradient (each expert of a stack on its own) against
 * <prefix><HF name>, plus <also_prefix><HF name> when also_prefix is given
 * (a missing one counts as 0). Returns the worst relative error; *compared
 * counts the HF tensors. */
static double compare_gradients(Case *c, const char *prefix, const char *also_prefix, int *compared) {
    const Model *m = c->model;
    HfPiece pieces[HF_FIXTURE_MAX_EXPERTS];
    double worst = 0.0;
    for (int k = 0; k < m->num_params; k++) {
        const ParamInfo *info = &m->param_info[k];
        const int n_pieces = hf_pieces(c->cfg.family, info, c->cfg.moe.num_experts, pieces, HF_FIXTURE_MAX_EXPERTS);
        assert_true(n_pieces >= 1);
        for (int p = 0; p < n_pieces; p++) {
            char key[200];
            snprintf(key, sizeof key, "%.30s%.160s", prefix, pieces[p].name);
            long n;
            float *ref_grad = ref_f32(&c->ref, key, &n);
            assert_int_equal(n, pieces[p].shape[0] * (pieces[p].ndim == 2 ? pieces[p].shape[1] : 1));
            if (also_prefix) {
                snprintf(key, sizeof key, "%.30s%.160s", also_prefix, pieces[p].name);
                if (json_get(c->ref.header, key)) {
                    float *more = ref_f32(&c->ref, key, NULL);
                    for (long i = 0; i < n; i++) ref_grad[i] += more[i];
                    free(more);
                }
            }
            double e = relative_error(m->grads + info->offset + pieces[p].offset, ref_grad, n);
            free(ref_grad);
            if (!(e < GRAD_TOL))
                fail_msg("%s: gradient of %s (%s): relative error %.3e >= %.0e", c->name, info->name, pieces[p].name, e,
                         GRAD_TOL);
            if (e > worst) worst = e;
            ++*compared;
        }
    }
    return worst;
}

static void check_forward_backward(const char *name) {
    Case c = case_open(name);
    Model *m = c.model;
    m->cfg.moe.aux_loss_coeff = 0.0; /* MoE: "grad." holds the cross entropy's gradients only */
    const long N = (long)c.B * c.T, V = c.cfg.vocab_size;

    model_zero_grad(m);
    float loss = model_forward(m, c.inputs, c.targets, c.B, c.T);
    long n_logits;
    float *ref_logits = ref_f32(&c.ref, "logits", &n_logits);
    float *ref_loss = ref_f32(&c.ref, "loss", NULL);
    assert_int_equal(n_logits, N * V);
    double logits_err = relative_error(model_logits(m), ref_logits, N * V);
    double loss_err = fabs((double)loss - (double)ref_loss[0]) / fabs((double)ref_loss[0]);
    printf("  %-16s logits rel err %.2e, loss %.6f vs %.6f (rel err %.2e)\n", name, logits_err, loss, ref_loss[0],
           loss_err);
    if (!(logits_err < LOGITS_TOL)) fail_msg("%s: logits relative error %.3e >= %.0e", name, logits_err, LOGITS_TOL);
    if (!(loss_err < LOSS_TOL)) fail_msg("%s: loss %.8f vs %.8f: relative error %.3e", name, loss, ref_loss[0], loss_err);

    model_backward(m, 1.0f);
    int compared = 0;
    double worst = compare_gradients(&c, "grad.", NULL, &compared);
    /* every reference gradient was compared: as many "grad." tensors as HF tensors */
    int num_ref_grads = 0;
    for (size_t i = 0; i < c.ref.header->count; i++)
        num_ref_grads += strncmp(c.ref.header->members[i].key, "grad.", 5) == 0;
    assert_int_equal(num_ref_grads, compared);
    printf("  %-16s %d gradients, worst rel err %.2e\n", name, compared, worst);
    free(ref_logits);
    free(ref_loss);
    case_close(&c);
}

static void check_adamw(const char *name) {
    Case c = case_open(name);
    Model *m = c.model;
    RefTensor hp = ref_get(&c.ref, "adamw_hparams", "F64");
    assert_int_equal(hp.numel, 7);
    double h[7];
    memcpy(h, hp.data, sizeof h);
    OptimizerConfig opt;
    memset(&opt, 0, sizeof opt);
    opt.lr = opt.min_lr = h[0];
    opt.beta1 = h[1];
    opt.beta2 = h[2];
    opt.eps = h[3];
    opt.weight_decay = h[4];
    opt.clip_grad = h[5];
    opt.decay = DECAY_CONSTANT;
    const int steps = (int)h[6];
    assert_true(steps > 0 && steps <= ADAMW_MAX_STEPS);
    long n_losses, n_norms;
    float *ref_losses = ref_f32(&c.ref, "adamw_losses", &n_losses);
    float *ref_norms = ref_f32(&c.ref, "adamw_grad_norms", &n_norms);
    assert_int_equal(n_losses, steps);
    assert_int_equal(n_norms, steps);

    AdamW adamw;
    adamw_init(&adamw, m->num_floats);
    float losses[ADAMW_MAX_STEPS], norms[ADAMW_MAX_STEPS];
    for (int s = 0; s < steps; s++) { /* as train_step: one micro-batch, clip, constant lr */
        model_zero_grad(m);
        losses[s] = model_forward(m, c.inputs, c.targets, c.B, c.T);
        model_backward(m, 1.0f);
        double norm = grad_global_norm(m->grads, m->num_floats);
        norms[s] = (float)norm;
        adamw_step(&adamw, m, &opt, opt.lr, (float)grad_clip_scale(norm, opt.clip_grad));
    }
    printf("  %-16s adamw losses:", name);
    for (int s = 0; s < steps; s++) printf(" %.6f/%.6f", losses[s], ref_losses[s]);
    printf("\n");
    for (int s = 0; s < steps; s++) {
        double loss_err = fabs((double)losses[s] - ref_losses[s]) / fabs((double)ref_losses[s]);
        double norm_err = fabs((double)norms[s] - ref_norms[s]) / fabs((double)ref_norms[s]);
        if (!(loss_err < ADAMW_TOL))
            fail_msg("%s: AdamW step %d: loss %.8f vs %.8f, relative error %.3e", name, s + 1, losses[s],
                     ref_losses[s], loss_err);
        if (!(norm_err < ADAMW_TOL))
            fail_msg("%s: AdamW step %d: grad norm %.8f vs %.8f, relative error %.3e", name, s + 1, norms[s],
                     ref_norms[s], norm_err);
    }
    /* the steps changed something: the last loss is below the first */
    assert_true(losses[steps - 1] < losses[0]);
    adamw_free(&adamw);
    free(ref_losses);
    free(ref_norms);
    case_close(&c);
}

/* MoE: the router logits of every layer, transformers' load-balancing loss
 * (load_balancing_loss_func: the layers pooled, f[e] the share of top-k
 * choices, P[e] the mean probability, aux = E * sum_e f[e] P[e]) from our
 * routing, and the gradient of cross entropy + aux against grad. + grad_aux.:
 * our backward differentiates the per-layer loss aux_scale * sum_e (sum_n
 * p[n,e]) counts[e]; with counts = the pooled counts and aux_scale = E /
 * (L N)^2, that is exactly the derivative of transformers' pooled loss. */
static void check_moe_aux(const char *name) {
    Case c = case_open(name);
    Model *m = c.model;
    ModelPriv *pr = m->priv;
    const int N = c.B * c.T, E = c.cfg.moe.num_experts, k = c.cfg.moe.num_experts_per_tok, L = c.cfg.num_layers;
    m->cfg.moe.aux_loss_coeff = 1.0;
    m->cfg.moe.load_balancing = LB_AUX_LOSS;
    model_zero_grad(m);
    model_moe_step_begin(m);
    model_forward(m, c.inputs, c.targets, c.B, c.T);
    double *pooled = calloc((size_t)E, sizeof(double)), *psum = calloc((size_t)E, sizeof(double));
    for (int l = 0; l < L; l++) {
        const MoeActs *a = pr->moe[l];
        assert_non_null(a);
        char key[64];
        snprintf(key, sizeof key, "router_logits.%d", l);
        long n;
        float *ref = ref_f32(&c.ref, key, &n);
        assert_int_equal(n, (long)N * E);
        const double e_logits = relative_error(a->logits, ref, n);
        free(ref);
        if (!(e_logits < LOGITS_TOL)) fail_msg("%s: layer %d router logits: relative error %.3e", name, l, e_logits);
        for (int i = 0; i < N * k; i++) pooled[a->selected[i]] += 1.0;
        for (int i = 0; i < N * E; i++) psum[i % E] += a->scores[i];
    }
    double aux = 0.0;
    for (int e = 0; e < E; e++) aux += (pooled[e] / ((double)L * N)) * (psum[e] / ((double)L * N));
    aux *= E;
    float *ref_aux = ref_f32(&c.ref, "aux_loss", NULL);
    const double aux_err = fabs(aux - ref_aux[0]) / fabs((double)ref_aux[0]);
    printf("  %-16s aux loss %.6f vs %.6f (rel err %.2e)\n", name, aux, ref_aux[0], aux_err);
    if (!(aux_err < LOSS_TOL)) fail_msg("%s: aux loss %.8f vs %.8f", name, aux, ref_aux[0]);
    for (int l = 0; l < L; l++) { /* transformers' constants in our per-layer gradient */
        MoeActs *a = pr->moe[l];
        memcpy(a->aux_counts, pooled, (size_t)E * sizeof(double));
        a->aux_rows = 1;
        a->aux_span = N;
        a->aux_scale = (double)E / ((double)L * L * N * N);
    }
    model_backward(m, 1.0f);
    int compared = 0;
    double worst = compare_gradients(&c, "grad.", "grad_aux.", &compared);
    printf("  %-16s %d gradients of cross entropy + aux, worst rel err %.2e\n", name, compared, worst);
    free(pooled);
    free(psum);
    free(ref_aux);
    case_close(&c);
}

/* ---- the cases (tests/fixtures/hf/<name>/) ---- */

#define PARITY_CASE(name)                                                        \
    static void test_##name##_forward_backward(void **state) {                   \
        (void)state;                                                             \
        check_forward_backward(#name);                                           \
    }                                                                            \
    static void test_##name##_adamw(void **state) {                              \
        (void)state;                                                             \
        check_adamw(#name);                                                      \
    }

PARITY_CASE(llama_gqa_rope3)
PARITY_CASE(llama_tied)
PARITY_CASE(qwen2_bias)
PARITY_CASE(qwen3_qknorm)

#define MOE_PARITY_CASE(name)                                                    \
    static void test_##name##_forward_backward(void **state) {                   \
        (void)state;                                                             \
        check_forward_backward(#name);                                           \
    }                                                                            \
    static void test_##name##_aux(void **state) {                                \
        (void)state;                                                             \
        check_moe_aux(#name);                                                    \
    }

MOE_PARITY_CASE(mixtral_moe)
MOE_PARITY_CASE(qwen3_moe)

/* The fixtures exercise what they claim: the config features each case is for. */
static void test_fixture_configs(void **state) {
    (void)state;
    char path[1100], err[512];
    ModelConfig cfg;
    fixture_path(path, sizeof path, "llama_gqa_rope3", "config.json");
    assert_int_equal(hf_config_read(path, &cfg, err, sizeof err), 0);
    assert_int_equal(cfg.family, FAMILY_LLAMA);
    assert_true(cfg.num_key_value_heads < cfg.num_attention_heads);
    assert_true(cfg.rope_scaling.enabled);
    assert_int_equal(cfg.rope_scaling.original_max_position_embeddings, 32);
    fixture_path(path, sizeof path, "llama_tied", "config.json");
    assert_int_equal(hf_config_read(path, &cfg, err, sizeof err), 0);
    assert_true(cfg.tie_word_embeddings);
    fixture_path(path, sizeof path, "qwen2_bias", "config.json");
    assert_int_equal(hf_config_read(path, &cfg, err, sizeof err), 0);
    assert_int_equal(cfg.family, FAMILY_QWEN2);
    assert_true(cfg.attention_bias);
    fixture_path(path, sizeof path, "qwen3_qknorm", "config.json");
    assert_int_equal(hf_config_read(path, &cfg, err, sizeof err), 0);
    assert_int_equal(cfg.family, FAMILY_QWEN3);
    assert_true(cfg.qk_norm);
    assert_true(cfg.num_attention_heads * cfg.head_dim != cfg.hidden_size);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_configs),
        cmocka_unit_test(test_llama_gqa_rope3_forward_backward),
        cmocka_unit_test(test_llama_gqa_rope3_adamw),
        cmocka_unit_test(test_llama_tied_forward_backward),
        cmocka_unit_test(test_llama_tied_adamw),
        cmocka_unit_test(test_qwen2_bias_forward_backward),
        cmocka_unit_test(test_qwen2_bias_adamw),
        cmocka_unit_test(test_qwen3_qknorm_forward_backward),
        cmocka_unit_test(test_qwen3_qknorm_adamw),
        cmocka_unit_test(test_mixtral_moe_forward_backward),
        cmocka_unit_test(test_mixtral_moe_aux),
        cmocka_unit_test(test_qwen3_moe_forward_backward),
        cmocka_unit_test(test_qwen3_moe_aux),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
