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
 *
 * reference.safetensors also holds int32 and float64 tensors (tokens, the
 * optimizer's hyper-parameters), which our safetensors reader (model weights
 * only: F32/BF16/F16) refuses; ref_open() below reads that file with the
 * JSON reader directly. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "config/recipe.h"
#include "convert/hf_config.h"
#include "convert/hf_names.h"
#include "convert/safetensors.h"
#include "core/json.h"
#include "model/model.h"
#include "train/grad_clip.h"
#include "train/optimizer.h"

#define LOGITS_TOL 1e-5
#define LOSS_TOL 1e-5
#define GRAD_TOL 1e-4
#define ADAMW_TOL 1e-4
#define ADAMW_MAX_STEPS 16

/* ---- the fixtures directory ---- */

/* $MT_HF_FIXTURES, else tests/fixtures/hf next to this file (tests run from the repo root). */
static void fixture_path(char *out, size_t outlen, const char *name, const char *file) {
    const char *dir = getenv("MT_HF_FIXTURES");
    if (dir && *dir) {
        snprintf(out, outlen, "%s/%s/%s", dir, name, file);
        return;
    }
    char here[1024];
    snprintf(here, sizeof here, "%s", __FILE__); /* .../tests/unit/test_hf_parity.c */
    char *slash = strrchr(here, '/');
    if (slash) *slash = '\0';                     /* .../tests/unit */
    slash = strrchr(here, '/');
    if (slash) *slash = '\0'; else snprintf(here, sizeof here, "tests"); /* .../tests */
    snprintf(out, outlen, "%s/fixtures/hf/%s/%s", here, name, file);
}

/* ---- reference.safetensors (any dtype) ---- */

typedef struct RefTensor {
    const char *name;
    const char *dtype; /* "F32", "I32", "F64" */
    long numel;
    const unsigned char *data;
} RefTensor;

typedef struct RefFile {
    unsigned char *bytes;
    size_t len;
    JsonValue *header;
    size_t data_start;
} RefFile;

static RefFile ref_open(const char *path) {
    RefFile ref = {0};
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("%s: cannot open (run python3 tests/fixtures/hf/make_fixtures.py)", path);
    fseek(f, 0, SEEK_END);
    ref.len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    ref.bytes = malloc(ref.len);
    assert_non_null(ref.bytes);
    assert_int_equal(fread(ref.bytes, 1, ref.len, f), ref.len);
    fclose(f);
    assert_true(ref.len >= 8);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; i--) header_len = header_len << 8 | ref.bytes[i];
    assert_true(header_len <= ref.len - 8);
    char err[256];
    ref.header = json_parse((const char *)ref.bytes + 8, header_len, err, sizeof err);
    if (!ref.header) fail_msg("%s: header: %s", path, err);
    ref.data_start = 8 + header_len;
    return ref;
}

static void ref_close(RefFile *ref) {
    json_free(ref->header);
    free(ref->bytes);
}

/* Tensor `name` of dtype `dtype`; fails the test when absent or of another dtype. */
static RefTensor ref_get(const RefFile *ref, const char *name, const char *dtype) {
    const JsonValue *info = json_get(ref->header, name);
    if (!info) fail_msg("reference.safetensors has no tensor '%s'", name);
    const JsonValue *dt = json_get(info, "dtype"), *shape = json_get(info, "shape"),
                    *offsets = json_get(info, "data_offsets");
    assert_non_null(dt);
    assert_non_null(shape);
    assert_non_null(offsets);
    if (strcmp(dt->string, dtype) != 0) fail_msg("reference '%s' is %s, expected %s", name, dt->string, dtype);
    long numel = 1;
    for (size_t i = 0; i < shape->count; i++) numel *= (long)shape->items[i]->integer;
    size_t elem = strcmp(dtype, "F64") == 0 ? 8 : 4;
    size_t begin = (size_t)offsets->items[0]->integer, end = (size_t)offsets->items[1]->integer;
    assert_int_equal(end - begin, (size_t)numel * elem);
    assert_true(ref->data_start + end <= ref->len);
    return (RefTensor){name, dt->string, numel, ref->bytes + ref->data_start + begin};
}

/* Copies of reference tensors (the data need not be aligned). */
static float *ref_f32(const RefFile *ref, const char *name, long *numel) {
    RefTensor t = ref_get(ref, name, "F32");
    float *out = malloc((size_t)t.numel * sizeof *out);
    memcpy(out, t.data, (size_t)t.numel * sizeof *out);
    if (numel) *numel = t.numel;
    return out;
}

static int32_t *ref_i32(const RefFile *ref, const char *name, long *numel) {
    RefTensor t = ref_get(ref, name, "I32");
    int32_t *out = malloc((size_t)t.numel * sizeof *out);
    memcpy(out, t.data, (size_t)t.numel * sizeof *out);
    if (numel) *numel = t.numel;
    return out;
}

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

/* ---- one case: the HF model in our Model ---- */

typedef struct Case {
    const char *name;
    ModelConfig cfg;
    Model *model;
    RefFile ref;
    int B, T;
    int32_t *inputs, *targets;
} Case;

/* Fill every registry parameter from the HF weights (as `convert` maps them). */
static void load_hf_weights(Case *c) {
    char dir[1100], err[512];
    fixture_path(dir, sizeof dir, c->name, "");
    StModel *st = st_model_open(dir, err, sizeof err);
    if (!st) fail_msg("%s", err);
    for (int k = 0; k < c->model->num_params; k++) {
        const ParamInfo *info = &c->model->param_info[k];
        char hf[160];
        if (hf_name_from_ours(c->cfg.family, info->name, hf, sizeof hf) != 0)
            fail_msg("%s: no HF name for '%s'", c->name, info->name);
        int i = st_model_find(st, hf);
        if (i < 0) fail_msg("%s: model.safetensors has no '%s' (ours '%s')", c->name, hf, info->name);
        const StTensor *t = st->tensors[i];
        assert_int_equal(t->ndim, info->ndim);
        assert_int_equal(t->shape[0], info->shape[0]);
        if (info->ndim == 2) assert_int_equal(t->shape[1], info->shape[1]);
        st_tensor_to_f32(t, c->model->params + info->offset);
        st->used[i] = true;
    }
    for (int i = 0; i < st->num_tensors; i++)
        if (!st->used[i]) fail_msg("%s: HF tensor '%s' has no registry parameter", c->name, st->tensors[i]->name);
    st_model_close(st);
}

static Case case_open(const char *name) {
    Case c = {.name = name};
    char path[1100], err[512];
    fixture_path(path, sizeof path, name, "config.json");
    if (hf_config_read(path, &c.cfg, err, sizeof err) != 0) fail_msg("%s", err);
    fixture_path(path, sizeof path, name, "reference.safetensors");
    c.ref = ref_open(path);
    const JsonValue *shape = json_get(json_get(c.ref.header, "inputs"), "shape");
    assert_non_null(shape);
    assert_int_equal(shape->count, 2);
    c.B = (int)shape->items[0]->integer;
    c.T = (int)shape->items[1]->integer;
    long n_in, n_tg;
    c.inputs = ref_i32(&c.ref, "inputs", &n_in);
    c.targets = ref_i32(&c.ref, "targets", &n_tg);
    assert_int_equal(n_in, (long)c.B * c.T);
    assert_int_equal(n_tg, (long)c.B * c.T);
    c.model = model_create(&c.cfg, &cpu_backend, c.B, c.T);
    load_hf_weights(&c);
    return c;
}

static void case_close(Case *c) {
    model_free(c->model);
    free(c->inputs);
    free(c->targets);
    ref_close(&c->ref);
}

/* ---- the checks ---- */

static void check_forward_backward(const char *name) {
    Case c = case_open(name);
    Model *m = c.model;
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
    double worst = 0.0;
    const char *worst_name = "";
    for (int k = 0; k < m->num_params; k++) {
        const ParamInfo *info = &m->param_info[k];
        char hf[160], key[200];
        assert_int_equal(hf_name_from_ours(c.cfg.family, info->name, hf, sizeof hf), 0);
        snprintf(key, sizeof key, "grad.%s", hf);
        long n;
        float *ref_grad = ref_f32(&c.ref, key, &n);
        assert_int_equal(n, info->numel);
        double e = relative_error(m->grads + info->offset, ref_grad, n);
        free(ref_grad);
        if (!(e < GRAD_TOL)) fail_msg("%s: gradient of %s (%s): relative error %.3e >= %.0e", name, info->name, hf, e,
                                      GRAD_TOL);
        if (e > worst) worst = e, worst_name = info->name;
    }
    /* every reference gradient was compared: as many "grad." tensors as parameters */
    int num_ref_grads = 0;
    for (size_t i = 0; i < c.ref.header->count; i++)
        num_ref_grads += strncmp(c.ref.header->members[i].key, "grad.", 5) == 0;
    assert_int_equal(num_ref_grads, m->num_params);
    printf("  %-16s %d gradients, worst rel err %.2e (%s)\n", name, m->num_params, worst, worst_name);
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
