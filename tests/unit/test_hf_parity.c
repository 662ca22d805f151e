/* test_hf_parity.c: the CPU model against Hugging Face transformers.
 *
 * tests/fixtures/hf/<case>/ holds a tiny random transformers model
 * (config.json + model.safetensors) and reference.safetensors with, for one
 * fixed batch, the logits, the loss, the gradient of every parameter (under
 * its HF name, prefixed "grad.") and a few training steps (clipping active,
 * AdamW), all computed by transformers and torch
 * (tests/fixtures/hf/make_fixtures.py writes them; docs/parity.md). Each case
 * is read the way `convert` reads a model (hf_config + safetensors +
 * hf_names) into our Model on the CPU backend, then:
 *   forward:  logits and loss            relative error < 1e-5
 *   backward: every parameter's gradient relative error < 1e-4 (per tensor)
 *   training: train_step itself (src/train/train_step.c: the function
 *             `megatrain run` calls, set up by train_setup with a recipe and
 *             a data set on disk), clip_grad below every step's grad norm:
 *             each step's loss and grad norm < 1e-4; every parameter's
 *             change over the steps < 1e-3 (per tensor; measured 5e-5 to
 *             1.7e-4; a clip scale from the squared norm, or none, gives
 *             0.14 to 0.26: make_fixtures.py)
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

#include "data/indexed_dataset.h"
#include "hf_fixture.h"
#include "model/model_internal.h"
#include "model/moe_layer.h"
#include "train/train_context.h"

#define LOGITS_TOL 1e-5
#define LOSS_TOL 1e-5
#define GRAD_TOL 1e-4
#define STEP_TOL 1e-4
#define UPDATE_TOL 1e-3
#define MAX_STEPS 16

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

/* Every parameter's values in `values` (a Model-sized array: gradients, or
 * the change of the weights; each expert of a stack on its own) against
 * <prefix><HF name>, plus <also_prefix><HF name> when also_prefix is given
 * (a missing one counts as 0), relative error < tol per tensor (INFINITY:
 * the caller checks). Returns the worst relative error, its HF name in
 * worst_name (when given); *compared counts the HF tensors. */
static double compare_params(Case *c, const float *values, const char *prefix, const char *also_prefix, double tol,
                             int *compared, char *worst_name, size_t worst_len) {
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
            float *ref = ref_f32(&c->ref, key, &n);
            assert_int_equal(n, pieces[p].shape[0] * (pieces[p].ndim == 2 ? pieces[p].shape[1] : 1));
            if (also_prefix) {
                snprintf(key, sizeof key, "%.30s%.160s", also_prefix, pieces[p].name);
                if (json_get(c->ref.header, key)) {
                    float *more = ref_f32(&c->ref, key, NULL);
                    for (long i = 0; i < n; i++) ref[i] += more[i];
                    free(more);
                }
            }
            double e = relative_error(values + info->offset + pieces[p].offset, ref, n);
            free(ref);
            if (!(e < tol))
                fail_msg("%s: %s%s (%s): relative error %.3e >= %.0e", c->name, prefix, pieces[p].name, info->name, e,
                         tol);
            if (e > worst || (worst_name && !worst_name[0])) {
                worst = e;
                if (worst_name) snprintf(worst_name, worst_len, "%.190s", pieces[p].name);
            }
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
    double worst = compare_params(&c, m->grads, "grad.", NULL, GRAD_TOL, &compared, NULL, 0);
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

/* ---- the training step ---- */

/* The train-step hyper-parameters (train_hparams, make_fixtures.py's TRAIN). */
typedef struct StepHparams {
    double lr, beta1, beta2, eps, weight_decay, clip_grad;
    int steps, warmup_steps, micro_batch_size, global_batch_size;
} StepHparams;

static StepHparams step_hparams(const RefFile *ref) {
    RefTensor t = ref_get(ref, "train_hparams", "F64");
    assert_int_equal(t.numel, 10);
    double h[10];
    memcpy(h, t.data, sizeof h);
    StepHparams hp = {h[0], h[1], h[2], h[3], h[4], h[5], (int)h[6], (int)h[7], (int)h[8], (int)h[9]};
    assert_true(hp.steps > 0 && hp.steps <= MAX_STEPS);
    assert_true(hp.clip_grad > 0.0); /* the check is about a step with clipping */
    assert_int_equal(hp.global_batch_size, 2); /* the data set's two samples, one of each per step */
    return hp;
}

/* DIR/recipe.yaml training on DIR/doc (one document) with the fixture's
 * optimizer; the model section is a placeholder that the caller replaces with
 * the fixture's config. */
static void write_step_recipe(const char *dir, const StepHparams *hp, int T) {
    char path[1200];
    snprintf(path, sizeof path, "%s/recipe.yaml", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f,
            "run: {name: hf-parity-step, dir: %s/run, seed: 1234, device: cpu}\n"
            "model: {family: llama, num_layers: 1, hidden_size: 32, intermediate_size: 64, num_attention_heads: 4,\n"
            "        num_key_value_heads: 4, vocab_size: 128, max_position_embeddings: 256}\n"
            "train: {steps: %d, seq_len: %d, micro_batch_size: %d, global_batch_size: %d, eval_interval: 0}\n"
            "optimizer:\n"
            "  type: adamw\n"
            "  lr: %.17g\n  min_lr: %.17g\n  betas: [%.17g, %.17g]\n  eps: %.17g\n  weight_decay: %.17g\n"
            "  clip_grad: %.17g\n"
            "  schedule: {warmup_steps: %d, decay: constant}\n"
            "precision: fp32\n"
            "data: {train: [{path: %s/doc, weight: 1.0}], split: [1, 0, 0]}\n"
            "checkpoint: {interval: 0}\n",
            dir, hp->steps, T, hp->micro_batch_size, hp->global_batch_size, hp->lr, hp->lr, hp->beta1, hp->beta2,
            hp->eps, hp->weight_decay, hp->clip_grad, hp->warmup_steps, dir);
    fclose(f);
}

/* Each step's two samples are A = doc[0:T+1] and B = doc[T:2T] + doc[0], one
 * of each (the premise of the reference, make_fixtures.py: Megatron's
 * sampling of a one-document data set, one shuffle block of two per epoch). */
static void check_step_samples(const TrainContext *ctx, const int32_t *doc, int T, int steps) {
    int32_t *a = malloc(((size_t)T + 1) * sizeof *a), *b = malloc(((size_t)T + 1) * sizeof *b);
    int32_t *got = malloc(((size_t)T + 1) * sizeof *got);
    memcpy(a, doc, ((size_t)T + 1) * sizeof *a);
    memcpy(b, doc + T, (size_t)T * sizeof *b);
    b[T] = doc[0];
    for (int s = 0; s < steps; s++) {
        int seen_a = 0, seen_b = 0;
        for (int i = 0; i < 2; i++) {
            data_loader_get(ctx->train_data, 2L * s + i, got);
            seen_a += memcmp(got, a, ((size_t)T + 1) * sizeof *a) == 0;
            seen_b += memcmp(got, b, ((size_t)T + 1) * sizeof *b) == 0;
        }
        if (seen_a != 1 || seen_b != 1)
            fail_msg("step %d reads samples A x %d, B x %d: not one of each, as the reference assumes "
                     "(tests/fixtures/hf/make_fixtures.py); did the sampling change?", s + 1, seen_a, seen_b);
    }
    free(a);
    free(b);
    free(got);
}

/* train_step, as `megatrain run` calls it, against torch: a recipe and a data
 * set in a scratch directory, train_setup, the fixture's weights, then
 * hp.steps steps: each step's loss and grad norm, and the change of every
 * parameter over the steps. */
static void check_train_step(const char *name) {
    Case c = case_open(name);
    const StepHparams hp = step_hparams(&c.ref);
    long doc_len;
    int32_t *doc = ref_i32(&c.ref, "train_document", &doc_len);
    const int T = (int)(doc_len / 2);
    assert_int_equal(doc_len, 2L * T);
    long n_losses, n_norms;
    float *ref_losses = ref_f32(&c.ref, "train_losses", &n_losses);
    float *ref_norms = ref_f32(&c.ref, "train_grad_norms", &n_norms);
    assert_int_equal(n_losses, hp.steps);
    assert_int_equal(n_norms, hp.steps);

    char dir[] = "/tmp/mt_hf_step_XXXXXX", path[1200], err[2048];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/doc", dir);
    IndexedDatasetWriter *w = indexed_dataset_writer_open(path, IDX_DTYPE_INT32, err, sizeof err);
    if (!w) fail_msg("%s", err);
    assert_int_equal(indexed_dataset_writer_add_document(w, doc, doc_len), 0);
    assert_int_equal(indexed_dataset_writer_finish(w, err, sizeof err), 0);
    write_step_recipe(dir, &hp, T);
    snprintf(path, sizeof path, "%s/recipe.yaml", dir);
    Recipe recipe;
    if (recipe_load(&recipe, path, NULL, 0, 1, err, sizeof err) != 0) fail_msg("%s", err);
    recipe.model = c.cfg; /* the fixture's model */

    TrainContext ctx;
    if (train_setup(&ctx, &recipe, err, sizeof err) != 0) fail_msg("%s: train_setup: %s", name, err);
    assert_int_equal(ctx.total_steps, hp.steps);
    assert_int_equal(ctx.model->num_floats, c.model->num_floats);
    assert_int_equal(ctx.model->num_params, c.model->num_params);
    for (int k = 0; k < c.model->num_params; k++) {
        assert_string_equal(ctx.model->param_info[k].name, c.model->param_info[k].name);
        assert_int_equal(ctx.model->param_info[k].offset, c.model->param_info[k].offset);
    }
    memcpy(ctx.model->params, c.model->params, (size_t)c.model->num_floats * sizeof(float));
    check_step_samples(&ctx, doc, T, hp.steps);

    /* every step, then the updates, before judging: a failure reports all three */
    double loss_err = 0.0, norm_err = 0.0;
    int loss_step = 0, norm_step = 0;
    printf("  %-16s train_step losses:", name);
    for (int s = 0; s < hp.steps; s++) {
        StepResult result;
        if (train_step(&ctx, &result, err, sizeof err) != 0) fail_msg("%s: train_step: %s", name, err);
        printf(" %.6f/%.6f", result.loss, ref_losses[s]);
        assert_false(result.nonfinite);
        assert_true(result.grad_norm > hp.clip_grad); /* clipping changed this step's update */
        const double le = fabs(result.loss - ref_losses[s]) / fabs((double)ref_losses[s]);
        const double ne = fabs(result.grad_norm - ref_norms[s]) / fabs((double)ref_norms[s]);
        if (!(le <= loss_err)) loss_err = le, loss_step = s + 1; /* NaN sticks */
        if (!(ne <= norm_err)) norm_err = ne, norm_step = s + 1;
    }
    printf("\n");
    assert_true(ref_losses[hp.steps - 1] < ref_losses[0]); /* the steps changed something */

    float *update = malloc((size_t)c.model->num_floats * sizeof *update);
    for (long i = 0; i < c.model->num_floats; i++) update[i] = ctx.model->params[i] - c.model->params[i];
    int compared = 0;
    char worst_name[200] = "";
    const double update_err =
        compare_params(&c, update, "train_update.", NULL, INFINITY, &compared, worst_name, sizeof worst_name);
    printf("  %-16s %d steps: losses rel err %.2e (step %d), grad norms %.2e (step %d); %d parameter updates, "
           "worst rel err %.2e (%s)\n", name, hp.steps, loss_err, loss_step, norm_err, norm_step, compared,
           update_err, worst_name);
    if (!(loss_err < STEP_TOL && norm_err < STEP_TOL && update_err < UPDATE_TOL))
        fail_msg("%s: train_step: losses rel err %.3e (step %d; tolerance %.0e), grad norms %.3e (step %d; %.0e), "
                 "parameter updates %.3e (%s; %.0e)", name, loss_err, loss_step, STEP_TOL, norm_err, norm_step,
                 STEP_TOL, update_err, worst_name, UPDATE_TOL);

    free(update);
    train_teardown(&ctx);
    snprintf(path, sizeof path, "rm -rf '%s'", dir);
    assert_int_equal(system(path), 0);
    free(doc);
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
        MoeBalance *a = &pr->moe_balance[l];
        memcpy(a->aux_counts, pooled, (size_t)E * sizeof(double));
        a->aux_rows = 1;
        a->aux_span = N;
        a->aux_scale = (double)E / ((double)L * L * N * N);
    }
    model_backward(m, 1.0f);
    int compared = 0;
    double worst = compare_params(&c, m->grads, "grad.", "grad_aux.", GRAD_TOL, &compared, NULL, 0);
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
    static void test_##name##_train_step(void **state) {                         \
        (void)state;                                                             \
        check_train_step(#name);                                                 \
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
MOE_PARITY_CASE(mixtral_hd16)
MOE_PARITY_CASE(qwen3_moe)
MOE_PARITY_CASE(qwen3_moe_nonorm)

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
    fixture_path(path, sizeof path, "mixtral_hd16", "config.json"); /* the Mixtral case the CUDA attention takes */
    assert_int_equal(hf_config_read(path, &cfg, err, sizeof err), 0);
    assert_int_equal(cfg.family, FAMILY_MIXTRAL);
    assert_int_equal(cfg.head_dim, 16);
    assert_true(cfg.num_key_value_heads < cfg.num_attention_heads);
    fixture_path(path, sizeof path, "qwen3_moe", "config.json");
    assert_int_equal(hf_config_read(path, &cfg, err, sizeof err), 0);
    assert_int_equal(cfg.family, FAMILY_QWEN3_MOE);
    assert_true(cfg.moe.norm_topk_prob);
    fixture_path(path, sizeof path, "qwen3_moe_nonorm", "config.json"); /* the combine weights not renormalised */
    assert_int_equal(hf_config_read(path, &cfg, err, sizeof err), 0);
    assert_int_equal(cfg.family, FAMILY_QWEN3_MOE);
    assert_false(cfg.moe.norm_topk_prob);
    assert_int_equal(cfg.head_dim, 16);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_configs),
        cmocka_unit_test(test_llama_gqa_rope3_forward_backward),
        cmocka_unit_test(test_llama_gqa_rope3_train_step),
        cmocka_unit_test(test_llama_tied_forward_backward),
        cmocka_unit_test(test_llama_tied_train_step),
        cmocka_unit_test(test_qwen2_bias_forward_backward),
        cmocka_unit_test(test_qwen2_bias_train_step),
        cmocka_unit_test(test_qwen3_qknorm_forward_backward),
        cmocka_unit_test(test_qwen3_qknorm_train_step),
        cmocka_unit_test(test_mixtral_moe_forward_backward),
        cmocka_unit_test(test_mixtral_moe_aux),
        cmocka_unit_test(test_mixtral_hd16_forward_backward),
        cmocka_unit_test(test_mixtral_hd16_aux),
        cmocka_unit_test(test_qwen3_moe_forward_backward),
        cmocka_unit_test(test_qwen3_moe_aux),
        cmocka_unit_test(test_qwen3_moe_nonorm_forward_backward),
        cmocka_unit_test(test_qwen3_moe_nonorm_aux),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
