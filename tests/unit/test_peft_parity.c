/* test_peft_parity.c: LoRA in the CPU model against Hugging Face PEFT.
 *
 * tests/fixtures/peft/<case>/ holds a tiny transformers model (base/), LoRA
 * adapters PEFT saved for it (adapter/: adapter_config.json and
 * adapter_model.safetensors; A and B both random) and reference.safetensors
 * with the PEFT model's logits, loss, the gradient of every adapter, and
 * the logits of PEFT's merge_and_unload (tests/fixtures/peft/make_fixtures.py
 * writes them). Each case is read into our Model: the base through the
 * convert tables (hf_config, hf_names), peft from adapter_config.json (read by
 * peft_config.c, as convert reads it), the
 * adapters through lora_export.c's PEFT names. Then, with the tolerances of
 * the transformers parity test (test_hf_parity.c):
 *   forward:  logits and loss                       relative error < 1e-5
 *   backward: every adapter's gradient (and none    relative error < 1e-4
 *             for the frozen base)                  per tensor
 *   merge:    lora_merge's model against PEFT's     relative error < 1e-5
 *             merge_and_unload logits
 *   export:   lora_write_peft writes PEFT's tensor names, shapes and bytes
 *             and the adapter_config.json fields PEFT reads (r, lora_alpha,
 *             target_modules, peft_type, task_type) as PEFT's own files have
 *   import:   convert_peft_to_ckpt's checkpoint holds the same floats, and
 *             its model gives PEFT's logits                 < 1e-5;
 *             onto a checkpoint of the base, the adapters alone referencing
 *             it load as the same floats
 * Relative error of a tensor = max |ours - ref| / max |ref|. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ckpt/checkpoint.h"
#include "convert/convert.h"
#include "convert/lora_export.h"
#include "convert/peft_config.h"
#include "hf_fixture.h"

#define LOGITS_TOL 1e-5
#define LOSS_TOL 1e-5
#define GRAD_TOL 1e-4

/* tests/fixtures/peft/<name>/<file>, next to this file's directory (tests run from the repository's root). */
static void peft_path(char *out, size_t outlen, const char *name, const char *file) {
    char here[1024];
    snprintf(here, sizeof here, "%s", __FILE__);
    char *slash = strrchr(here, '/');
    if (slash) *slash = '\0';
    slash = strrchr(here, '/');
    if (slash) *slash = '\0'; else snprintf(here, sizeof here, "tests");
    snprintf(out, outlen, "%s/fixtures/peft/%s/%s", here, name, file);
}

static double relative_error(const float *a, const float *b, long n) {
    double max_diff = 0.0, max_ref = 0.0;
    for (long i = 0; i < n; i++) {
        const double diff = fabs((double)a[i] - (double)b[i]);
        if (!(diff <= max_diff)) max_diff = diff; /* NaN propagates */
        if (fabs((double)b[i]) > max_ref) max_ref = fabs((double)b[i]);
    }
    return max_ref > 0.0 ? max_diff / max_ref : max_diff;
}

static JsonValue *read_json(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("%s: cannot open (python3 tests/fixtures/peft/make_fixtures.py writes it)", path);
    char text[16384];
    const size_t len = fread(text, 1, sizeof text, f);
    fclose(f);
    char err[256];
    JsonValue *v = json_parse(text, len, err, sizeof err);
    if (!v) fail_msg("%s: %s", path, err);
    return v;
}

/* peft from PEFT's adapter_config.json, as `megatrain convert` reads it (peft_config.c). */
static PeftConfig read_adapter_config(const char *path, int num_layers) {
    PeftConfig peft;
    char note[256], err[512];
    if (peft_config_read(path, num_layers, &peft, NULL, 0, note, sizeof note, err, sizeof err) != 0) fail_msg("%s", err);
    assert_string_equal(note, "");
    return peft;
}

/* The base's weights through hf_pieces (as convert reads them), the adapters under their PEFT names; every
 * tensor of both files used exactly once. */
static void load_weights(Case *c) {
    char dir[1100], path[1200], err[512];
    peft_path(dir, sizeof dir, c->name, "base");
    StModel *base = st_model_open(dir, err, sizeof err);
    if (!base) fail_msg("%s", err);
    peft_path(path, sizeof path, c->name, "adapter/adapter_model.safetensors");
    StFile *adapters = st_open(path, err, sizeof err);
    if (!adapters) fail_msg("%s", err);
    int adapters_used = 0;
    for (int k = 0; k < c->model->num_params; k++) {
        const ParamInfo *info = &c->model->param_info[k];
        float *dst = c->model->params + info->offset;
        if (!info->frozen) {
            char name[192];
            assert_int_equal(lora_peft_name(c->cfg.family, info->name, name, sizeof name), 0);
            const StTensor *t = st_find(adapters, name);
            if (!t) fail_msg("%s: adapter_model.safetensors has no '%s' (ours '%s')", c->name, name, info->name);
            assert_int_equal(t->ndim, 2);
            assert_int_equal(t->shape[0], info->shape[0]);
            assert_int_equal(t->shape[1], info->shape[1]);
            st_tensor_to_f32(t, dst);
            adapters_used++;
            continue;
        }
        HfPiece piece;
        assert_int_equal(hf_pieces(c->cfg.family, info, 0, &piece, 1), 1);
        const int i = st_model_find(base, piece.name);
        if (i < 0) fail_msg("%s: model.safetensors has no '%s'", c->name, piece.name);
        assert_int_equal(base->tensors[i]->numel, info->numel);
        st_tensor_to_f32(base->tensors[i], dst);
        base->used[i] = true;
    }
    assert_int_equal(adapters_used, adapters->num_tensors);
    for (int i = 0; i < base->num_tensors; i++)
        if (!base->used[i]) fail_msg("%s: base tensor '%s' has no registry parameter", c->name, base->tensors[i]->name);
    st_close(adapters);
    st_model_close(base);
}

static Case case_open_peft(const char *name) {
    Case c = {.name = name};
    char path[1200], err[512];
    peft_path(path, sizeof path, name, "base/config.json");
    if (hf_config_read(path, &c.cfg, err, sizeof err) != 0) fail_msg("%s", err);
    peft_path(path, sizeof path, name, "adapter/adapter_config.json");
    c.cfg.peft = read_adapter_config(path, c.cfg.num_layers);
    peft_path(path, sizeof path, name, "reference.safetensors");
    case_read_reference(&c, path);
    c.model = model_create(&c.cfg, &cpu_backend, c.B, c.T);
    load_weights(&c);
    return c;
}

static void check_logits(const char *what, const char *name, const float *logits, const RefFile *ref, const char *key,
                         long n) {
    long n_ref;
    float *want = ref_f32(ref, key, &n_ref);
    assert_int_equal(n_ref, n);
    const double e = relative_error(logits, want, n);
    printf("  %-6s %-34s rel err %.2e\n", name, what, e);
    if (!(e < LOGITS_TOL)) fail_msg("%s: %s: relative error %.3e >= %.0e", name, what, e, LOGITS_TOL);
    free(want);
}

static void check_forward_backward(const char *name) {
    Case c = case_open_peft(name);
    Model *m = c.model;
    const long N = (long)c.B * c.T, V = c.cfg.vocab_size;
    model_zero_grad(m);
    const float loss = model_forward(m, c.inputs, c.targets, c.B, c.T);
    check_logits("logits (PEFT model)", name, model_logits(m), &c.ref, "logits", N * V);
    float *ref_loss = ref_f32(&c.ref, "loss", NULL);
    const double loss_err = fabs((double)loss - (double)ref_loss[0]) / fabs((double)ref_loss[0]);
    printf("  %-6s loss %.6f vs %.6f                rel err %.2e\n", name, loss, ref_loss[0], loss_err);
    if (!(loss_err < LOSS_TOL)) fail_msg("%s: loss %.8f vs %.8f", name, loss, ref_loss[0]);

    model_backward(m, 1.0f);
    int compared = 0, num_ref = 0;
    double worst = 0.0;
    long adapter_floats = 0;
    for (int k = 0; k < m->num_params; k++) {
        const ParamInfo *info = &m->param_info[k];
        if (info->frozen) {
            assert_null(model_grad_of(m, info)); /* the base has no gradient */
            continue;
        }
        char key[220], peft[192];
        assert_int_equal(lora_peft_name(c.cfg.family, info->name, peft, sizeof peft), 0);
        snprintf(key, sizeof key, "grad.%s", peft);
        long n;
        float *want = ref_f32(&c.ref, key, &n);
        assert_int_equal(n, info->numel);
        const double e = relative_error(model_grad_of(m, info), want, n);
        free(want);
        if (!(e < GRAD_TOL)) fail_msg("%s: %s: relative error %.3e >= %.0e", name, key, e, GRAD_TOL);
        worst = fmax(worst, e);
        adapter_floats += info->numel;
        compared++;
    }
    for (size_t i = 0; i < c.ref.header->count; i++) num_ref += strncmp(c.ref.header->members[i].key, "grad.", 5) == 0;
    assert_int_equal(compared, num_ref); /* every reference gradient, nothing else */
    assert_int_equal(m->num_grad_floats, adapter_floats);
    printf("  %-6s %d adapter gradients, worst rel err %.2e\n", name, compared, worst);
    free(ref_loss);
    case_close(&c);
}

/* lora_merge's model (no adapters) against the logits of PEFT's merge_and_unload. */
static void check_merge(const char *name) {
    Case c = case_open_peft(name);
    ModelConfig plain = c.cfg;
    plain.peft.type = PEFT_NONE;
    Model *merged = model_create(&plain, &cpu_backend, c.B, c.T);
    char err[512];
    if (lora_merge(c.model, merged, err, sizeof err) != 0) fail_msg("%s: %s", name, err);
    assert_int_equal(merged->num_grad_floats, merged->num_floats);
    model_forward(merged, c.inputs, c.targets, c.B, c.T);
    const long n = (long)c.B * c.T * c.cfg.vocab_size;
    check_logits("logits (merged vs merge_and_unload)", name, model_logits(merged), &c.ref, "merged_logits", n);
    model_free(merged);
    case_close(&c);
}

/* What lora_write_peft writes is what PEFT saved: the same tensors (names, shapes, bytes: the weights came
 * from there), the "format": "pt" metadata, and the adapter_config.json fields PEFT's loader reads. */
static void check_export(const char *name) {
    Case c = case_open_peft(name);
    char dir[] = "/tmp/mt_peft_export_XXXXXX", path[1200], theirs_path[1200], err[512];
    assert_non_null(mkdtemp(dir));
    const LoraAdapters adapters = lora_adapters_of(c.model);
    if (lora_write_peft(&adapters, dir, ST_F32, NULL, err, sizeof err) != 0) fail_msg("%s: %s", name, err);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    peft_path(theirs_path, sizeof theirs_path, name, "adapter/adapter_model.safetensors");
    StFile *ours = st_open(path, err, sizeof err), *theirs = st_open(theirs_path, err, sizeof err);
    assert_non_null(ours);
    assert_non_null(theirs);
    assert_int_equal(ours->num_tensors, theirs->num_tensors);
    for (int i = 0; i < theirs->num_tensors; i++) {
        const StTensor *t = &theirs->tensors[i], *o = st_find(ours, t->name);
        if (!o) fail_msg("%s: our adapter_model.safetensors has no '%s'", name, t->name);
        assert_int_equal(o->dtype, t->dtype);
        assert_int_equal(o->ndim, t->ndim);
        for (int d = 0; d < t->ndim; d++) assert_int_equal(o->shape[d], t->shape[d]);
        assert_int_equal(o->nbytes, t->nbytes);
        assert_memory_equal(o->data, t->data, t->nbytes);
    }
    assert_string_equal(st_metadata_get(ours, "format"), "pt");
    const int num_tensors = theirs->num_tensors;
    st_close(ours);
    st_close(theirs);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    peft_path(theirs_path, sizeof theirs_path, name, "adapter/adapter_config.json");
    const PeftConfig a = read_adapter_config(path, c.cfg.num_layers), b = read_adapter_config(theirs_path, c.cfg.num_layers);
    assert_int_equal(a.rank, b.rank);
    assert_true(a.alpha == b.alpha);
    assert_int_equal(a.targets, b.targets);
    assert_true(a.dropout == b.dropout);
    JsonValue *mine = read_json(path), *peft = read_json(theirs_path);
    const char *same[] = {"peft_type", "task_type", "bias"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        assert_string_equal(json_get(mine, same[i])->string, json_get(peft, same[i])->string);
    assert_int_equal(json_get(mine, "r")->integer, json_get(peft, "r")->integer); /* as JSON, not through our reader */
    assert_true(json_get(mine, "lora_alpha")->number == json_get(peft, "lora_alpha")->number);
    json_free(mine);
    json_free(peft);
    printf("  %-6s lora_write_peft: %d tensors and adapter_config.json as PEFT saved them\n", name, num_tensors);
    snprintf(path, sizeof path, "rm -rf '%s'", dir);
    assert_int_equal(system(path), 0);
    /* an alpha that is not an integer is written as it is (PEFT scales by lora_alpha / r) */
    c.model->cfg.peft.alpha = 6.5;
    assert_non_null(mkdtemp(strcpy(dir, "/tmp/mt_peft_export_XXXXXX"))); /* adapters.cfg is the model's */
    if (lora_write_peft(&adapters, dir, ST_F32, NULL, err, sizeof err) != 0) fail_msg("%s: %s", name, err);
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    assert_true(read_adapter_config(path, c.cfg.num_layers).alpha == 6.5);
    snprintf(path, sizeof path, "rm -rf '%s'", dir);
    assert_int_equal(system(path), 0);
    case_close(&c);
}

/* `megatrain convert ADAPTER DST --base-model BASE`: the checkpoint holds the model the fixture's files make (every
 * float the same bits as load_weights reads them), with its peft: section, and gives PEFT's logits. */
static void check_import(const char *name) {
    Case c = case_open_peft(name);
    char dir[] = "/tmp/mt_peft_import_XXXXXX", dst[1200], adapter[1200], base[1200], err[1024];
    assert_non_null(mkdtemp(dir));
    snprintf(dst, sizeof dst, "%s/ckpt", dir);
    peft_path(adapter, sizeof adapter, name, "adapter");
    peft_path(base, sizeof base, name, "base");
    const ConvertOptions options = {.progress = false};
    if (convert_peft_to_ckpt(adapter, base, dst, &options, err, sizeof err) != 0) fail_msg("%s: %s", name, err);
    ModelConfig stored;
    if (ckpt_read_model_config(dst, &stored, err, sizeof err) != 0) fail_msg("%s: %s", name, err);
    if (model_config_difference(&stored, &c.cfg, MODEL_MATCH_FUNCTION, err, sizeof err) != 0 ||
        peft_config_difference(&stored.peft, &c.cfg.peft, MODEL_MATCH_FUNCTION, err, sizeof err) != 0)
        fail_msg("%s: the checkpoint's model: %s", name, err);
    Model *m = model_create(&stored, &cpu_backend, c.B, c.T);
    if (ckpt_load_model(dst, m, err, sizeof err) != 0) fail_msg("%s: %s", name, err);
    assert_int_equal(m->num_floats, c.model->num_floats);
    assert_int_equal(m->trainable_offset, c.model->trainable_offset);
    assert_memory_equal(m->params, c.model->params, (size_t)m->num_floats * sizeof(float));
    model_forward(m, c.inputs, c.targets, c.B, c.T);
    check_logits("logits (imported checkpoint)", name, model_logits(m), &c.ref, "logits",
                 (long)c.B * c.T * c.cfg.vocab_size);
    model_free(m);
    /* onto a megatrain checkpoint of the base: the adapters alone, the base's floats read through the reference */
    char base_ckpt[1300], small[1300];
    snprintf(base_ckpt, sizeof base_ckpt, "%s/base", dir);
    snprintf(small, sizeof small, "%s/adapters", dir);
    if (convert_hf_to_ckpt(base, base_ckpt, &options, err, sizeof err) != 0 ||
        convert_peft_to_ckpt(adapter, base_ckpt, small, &options, err, sizeof err) != 0)
        fail_msg("%s: %s", name, err);
    m = model_create(&stored, &cpu_backend, c.B, c.T);
    if (ckpt_load_model(small, m, err, sizeof err) != 0) fail_msg("%s: %s", name, err);
    assert_memory_equal(m->params, c.model->params, (size_t)m->num_floats * sizeof(float));
    model_free(m);
    snprintf(dst, sizeof dst, "rm -rf '%s'", dir);
    assert_int_equal(system(dst), 0);
    case_close(&c);
}

#define PEFT_CASE(name)                                                                                            \
    static void test_##name##_forward_backward(void **state) {                                                      \
        (void)state;                                                                                                \
        check_forward_backward(#name);                                                                              \
    }                                                                                                               \
    static void test_##name##_merge(void **state) {                                                                 \
        (void)state;                                                                                                \
        check_merge(#name);                                                                                         \
    }                                                                                                               \
    static void test_##name##_export(void **state) {                                                                \
        (void)state;                                                                                                \
        check_export(#name);                                                                                        \
    }                                                                                                               \
    static void test_##name##_import(void **state) {                                                                \
        (void)state;                                                                                                \
        check_import(#name);                                                                                        \
    }

PEFT_CASE(llama)
PEFT_CASE(qwen3)

/* The fixtures exercise what they claim: tied embeddings with every target; qk-norm, head_dim * heads != hidden,
 * a subset of targets and alpha / rank != 2. */
static void test_fixture_configs(void **state) {
    (void)state;
    Case c = case_open_peft("llama");
    assert_int_equal(c.cfg.family, FAMILY_LLAMA);
    assert_true(c.cfg.tie_word_embeddings);
    assert_int_equal(c.cfg.peft.targets, LORA_ALL_TARGETS);
    case_close(&c);
    c = case_open_peft("qwen3");
    assert_int_equal(c.cfg.family, FAMILY_QWEN3);
    assert_true(c.cfg.qk_norm);
    assert_true(c.cfg.num_attention_heads * c.cfg.head_dim != c.cfg.hidden_size);
    assert_true(c.cfg.peft.targets != LORA_ALL_TARGETS && c.cfg.peft.targets != 0);
    assert_true(c.cfg.peft.alpha / c.cfg.peft.rank != 2.0);
    case_close(&c);
    (void)case_open; /* hf_fixture.h's opening of a transformers fixture (tests/fixtures/hf) is not used here */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixture_configs),
        cmocka_unit_test(test_llama_forward_backward),
        cmocka_unit_test(test_llama_merge),
        cmocka_unit_test(test_llama_export),
        cmocka_unit_test(test_llama_import),
        cmocka_unit_test(test_qwen3_forward_backward),
        cmocka_unit_test(test_qwen3_merge),
        cmocka_unit_test(test_qwen3_export),
        cmocka_unit_test(test_qwen3_import),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
