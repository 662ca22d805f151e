/* test_lora.c: LoRA adapters in the CPU model (model.peft;
 * src/model/model_lora.c, model_registry.c):
 *   - the registry: PEFT's names and shapes per target, declared after every
 *     base parameter (the trainable region), the base frozen, gradients for
 *     the adapters only; a subset of targets; tp 2's shards as
 *     Megatron-Bridge cuts them (A on its rank for q/k/v/gate/up, on its in
 *     for o/down; B on its out);
 *   - the init: A uniform in +-1/sqrt(in) (PEFT's kaiming_uniform_ with
 *     a = sqrt(5)), B zero, and then the adapted model's logits are the base
 *     model's bit for bit;
 *   - finite differences through the whole model (B not zero): every
 *     adapter's gradient, for llama (tied), qwen2 (biases) and qwen3
 *     (qk-norm);
 *   - a checkpoint's model.yaml keeps peft, and resume's shape check
 *     refuses another rank, other targets or no adapters;
 *   - FLOPs per token: 4N for the frozen weights, 6N for the adapters.
 * The parity with Hugging Face PEFT is test_peft_parity.c. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <unistd.h>

#include "backend/backend.h"
#include "ckpt/ckpt_model_config.h"
#include "core/rng.h"
#include "model/model.h"
#include "test_tiny_config.h"

enum { B = 2, T = 6 };

static ModelConfig lora_config(ModelFamily family, unsigned targets) {
    ModelConfig cfg = tiny_config(family);
    cfg.attention_bias = family == FAMILY_QWEN2;
    cfg.peft = (PeftConfig){.type = PEFT_LORA, .rank = 4, .alpha = 8, .targets = targets};
    return cfg;
}

static void make_batch(uint64_t seed, int32_t *inputs, int32_t *targets, int n, int vocab) {
    Rng rng;
    rng_seed(&rng, seed);
    for (int i = 0; i < n; i++) inputs[i] = (int32_t)rng_below(&rng, (uint64_t)vocab);
    for (int i = 0; i < n; i++) targets[i] = (int32_t)rng_below(&rng, (uint64_t)vocab);
}

/* in and out of target t for a resolved tiny config */
static void target_dims(const ModelConfig *c, int t, long *in, long *out) {
    const long C = c->hidden_size, I = c->intermediate_size, HD = (long)c->num_attention_heads * c->head_dim;
    const long KVD = (long)c->num_key_value_heads * c->head_dim;
    const long ins[] = {C, C, C, HD, C, C, I}, outs[] = {HD, KVD, KVD, C, I, I, C};
    *in = ins[t];
    *out = outs[t];
}

static void test_registry(void **state) {
    (void)state;
    const unsigned targets = 1u << LORA_Q | 1u << LORA_V | 1u << LORA_DOWN;
    ModelConfig cfg = lora_config(FAMILY_LLAMA, targets);
    Model *m = model_create(&cfg, &cpu_backend, B, T);
    ModelConfig plain = cfg;
    plain.peft.type = PEFT_NONE;
    const long base_floats = model_count_params(&plain);
    assert_int_equal(m->trainable_offset, base_floats); /* the adapters after every base parameter */
    long adapters = 0;
    int num_adapters = 0;
    for (int i = 0; i < m->num_params; i++) {
        const ParamInfo *p = &m->param_info[i];
        const bool adapter = strstr(p->name, ".lora_") != NULL;
        assert_true(p->frozen == !adapter);
        assert_true(adapter == ((long)p->offset >= base_floats));
        assert_true(adapter ? model_grad_of(m, p) != NULL : model_grad_of(m, p) == NULL);
        if (adapter) {
            adapters += p->numel;
            num_adapters++;
            assert_int_equal(p->kind, PARAM_ADAPTER);
        }
    }
    assert_int_equal(num_adapters, cfg.num_layers * 3 * 2);
    assert_int_equal(m->num_grad_floats, adapters);
    assert_int_equal(m->num_floats, base_floats + adapters);
    const char *names[] = {"layers.1.attn.q_proj", "layers.1.attn.v_proj", "layers.1.mlp.down_proj"};
    const int ts[] = {LORA_Q, LORA_V, LORA_DOWN};
    ModelConfig resolved = cfg;
    for (int k = 0; k < 3; k++) {
        long in, out;
        target_dims(&resolved, ts[k], &in, &out);
        char name[96];
        snprintf(name, sizeof name, "%s.lora_A.weight", names[k]);
        const ParamInfo *a = model_find_param(m, name);
        assert_non_null(a);
        assert_int_equal(a->shape[0], 4);
        assert_int_equal(a->shape[1], in);
        snprintf(name, sizeof name, "%s.lora_B.weight", names[k]);
        const ParamInfo *b = model_find_param(m, name);
        assert_non_null(b);
        assert_int_equal(b->shape[0], out);
        assert_int_equal(b->shape[1], 4);
    }
    assert_null(model_find_param(m, "layers.0.attn.k_proj.lora_A.weight")); /* not a target */
    model_free(m);
}

/* tp 2: A of a column-parallel target split along its rank, of a row-parallel one along its in; B along its out. */
static void test_tp_shards(void **state) {
    (void)state;
    ModelConfig cfg = lora_config(FAMILY_LLAMA, LORA_ALL_TARGETS);
    ModelPartition part = model_partition_whole(&cfg);
    part.tp = 2;
    part.tp_rank = 1;
    int count;
    long total;
    ParamInfo *infos = model_registry_of(&cfg, &part, &count, &total);
    int seen = 0;
    for (int i = 0; i < count; i++) {
        const ParamInfo *p = &infos[i];
        if (!strstr(p->name, ".lora_")) continue;
        seen++;
        const bool row = strstr(p->name, "o_proj") || strstr(p->name, "down_proj");
        const bool is_a = strstr(p->name, "lora_A") != NULL;
        const int dim = is_a && row ? 1 : 0; /* the split dimension */
        assert_int_equal(p->shape[dim] * 2, p->global_shape[dim]);
        assert_int_equal(p->global_start[dim], p->shape[dim]); /* rank 1's half */
        assert_int_equal(p->shape[1 - dim], p->global_shape[1 - dim]);
        assert_true(p->norm_owner); /* every rank holds its own block */
        assert_false(p->tp_partial_grad);
    }
    assert_int_equal(seen, cfg.num_layers * LORA_NUM_TARGETS * 2);
    free(infos);
}

/* PEFT's init, and with B = 0 the base model's logits exactly. */
static void test_init_is_the_base_model(void **state) {
    (void)state;
    ModelConfig cfg = lora_config(FAMILY_QWEN3, LORA_ALL_TARGETS);
    Model *m = model_create(&cfg, &cpu_backend, B, T);
    model_init_weights(m, 5);
    for (int i = 0; i < m->num_params; i++) {
        const ParamInfo *p = &m->param_info[i];
        if (!strstr(p->name, ".lora_")) continue;
        const float *w = m->params + p->offset;
        if (strstr(p->name, "lora_B")) {
            for (long k = 0; k < p->numel; k++) assert_true(w[k] == 0.0f);
            continue;
        }
        const double bound = 1.0 / sqrt((double)p->global_shape[1]);
        double lo = 0, hi = 0;
        for (long k = 0; k < p->numel; k++) {
            assert_true(fabs(w[k]) <= bound);
            lo = fmin(lo, w[k]);
            hi = fmax(hi, w[k]);
        }
        assert_true(lo < -0.5 * bound && hi > 0.5 * bound); /* spread over the range */
    }
    ModelConfig plain = cfg;
    plain.peft.type = PEFT_NONE;
    Model *base = model_create(&plain, &cpu_backend, B, T);
    model_init_weights(base, 5); /* the base parameters' seeds are their registry indices: the same weights */
    assert_memory_equal(base->params, m->params, (size_t)base->num_floats * sizeof(float));
    int32_t inputs[B * T], targets[B * T];
    make_batch(6, inputs, targets, B * T, cfg.vocab_size);
    const float la = model_forward(m, inputs, targets, B, T), lb = model_forward(base, inputs, targets, B, T);
    assert_true(la == lb);
    assert_memory_equal(model_logits(m), model_logits(base), (size_t)B * T * cfg.vocab_size * sizeof(float));
    model_free(base);
    model_free(m);
}

/* Finite differences of the loss against the backward, for sampled elements of every adapter; B random so
 * that A's gradient is not zero. */
static void check_gradients(ModelConfig cfg, uint64_t seed) {
    Model *m = model_create(&cfg, &cpu_backend, B, T);
    model_init_weights(m, seed);
    Rng rng;
    rng_seed(&rng, seed + 1);
    for (int i = 0; i < m->num_params; i++) {
        const ParamInfo *p = &m->param_info[i];
        if (strstr(p->name, "lora_B"))
            for (long k = 0; k < p->numel; k++) m->params[p->offset + k] = (float)(0.3 * rng_normal(&rng));
    }
    int32_t inputs[B * T], targets[B * T];
    make_batch(seed + 2, inputs, targets, B * T, cfg.vocab_size);
    model_zero_grad(m);
    model_forward(m, inputs, targets, B, T);
    model_backward(m, 1.0f);
    const float eps = 1e-3f;
    int checked = 0;
    double largest = 0;
    for (int i = 0; i < m->num_params; i++) {
        const ParamInfo *p = &m->param_info[i];
        if (p->frozen) continue;
        const float *grad = model_grad_of(m, p);
        for (int sample = 0; sample < 4; sample++) {
            const long k = (long)rng_below(&rng, (uint64_t)p->numel);
            float *w = &m->params[p->offset + k];
            const float saved = *w;
            *w = saved + eps;
            const double plus = model_forward(m, inputs, targets, B, T);
            *w = saved - eps;
            const double minus = model_forward(m, inputs, targets, B, T);
            *w = saved;
            const double fd = (plus - minus) / (2.0 * eps);
            if (fabs(fd - grad[k]) > 1e-3 + 1e-2 * fabs(grad[k]))
                fail_msg("%s[%ld]: finite difference %.6g, backward %.6g", p->name, k, fd, grad[k]);
            largest = fmax(largest, fabs(grad[k]));
            checked++;
        }
    }
    assert_int_equal(checked, 4 * cfg.num_layers * LORA_NUM_TARGETS * 2);
    assert_true(largest > 1e-2); /* not a check of zeros */
    model_free(m);
}

static void test_gradcheck_llama_tied(void **state) {
    (void)state;
    ModelConfig cfg = lora_config(FAMILY_LLAMA, LORA_ALL_TARGETS);
    cfg.tie_word_embeddings = true;
    check_gradients(cfg, 61);
}

static void test_gradcheck_qwen2_biases(void **state) {
    (void)state;
    check_gradients(lora_config(FAMILY_QWEN2, LORA_ALL_TARGETS), 62);
}

static void test_gradcheck_qwen3_qk_norm(void **state) {
    (void)state;
    check_gradients(lora_config(FAMILY_QWEN3, LORA_ALL_TARGETS), 63);
}

/* A checkpoint's model.yaml carries peft (its adapters are parameters): written and read back the same; the
 * shape check refuses another rank or other targets. */
static void test_model_yaml_round_trip(void **state) {
    (void)state;
    ModelConfig cfg = lora_config(FAMILY_QWEN3, 1u << LORA_Q | 1u << LORA_O | 1u << LORA_UP);
    cfg.peft.alpha = 6.5;
    size_t len;
    char *text = ckpt_model_config_yaml(&cfg, &len);
    char path[] = "/tmp/mt_lora_model_XXXXXX", err[512];
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    close(fd);
    ModelConfig back;
    if (model_config_load(&back, path, err, sizeof err) != 0) fail_msg("%s\n%s", err, text);
    assert_true(back.peft.type == PEFT_LORA && back.peft.rank == 4 && back.peft.alpha == 6.5);
    assert_int_equal(back.peft.targets, cfg.peft.targets);
    assert_int_equal(back.hidden_size, cfg.hidden_size);
    assert_int_equal(ckpt_model_shape_check(&back, &cfg, err, sizeof err), 0);
    ModelConfig other = cfg;
    other.peft.rank = 8;
    assert_int_equal(ckpt_model_shape_check(&back, &other, err, sizeof err), -1);
    assert_non_null(strstr(err, "peft.rank is 4 in the checkpoint but 8 in the recipe"));
    other = cfg;
    other.peft.targets = LORA_ALL_TARGETS;
    assert_int_equal(ckpt_model_shape_check(&back, &other, err, sizeof err), -1);
    assert_non_null(strstr(err, "peft.target_modules is [q_proj, o_proj, up_proj] in the checkpoint but [q_proj, k_proj, v_proj, "
                                "o_proj, gate_proj, up_proj, down_proj] in the recipe"));
    other.peft.type = PEFT_NONE;
    assert_int_equal(ckpt_model_shape_check(&back, &other, err, sizeof err), -1);
    assert_non_null(strstr(err, "peft: the checkpoint's model has LoRA adapters, the recipe has no peft: section"));
    other = cfg; /* a boolean key said as the recipe writes it */
    other.attention_bias = !cfg.attention_bias;
    assert_int_equal(ckpt_model_shape_check(&back, &other, err, sizeof err), -1);
    assert_non_null(strstr(err, cfg.attention_bias ? "model.attention_bias is true in the checkpoint but false in the "
                                                     "recipe"
                                                   : "model.attention_bias is false in the checkpoint but true in the "
                                                     "recipe"));
    free(text);
    unlink(path);
}

/* FLOPs per token with LoRA: 4 per frozen matmul weight (no weight gradient), 6 per adapter weight. */
static void test_flops(void **state) {
    (void)state;
    ModelConfig cfg = lora_config(FAMILY_LLAMA, LORA_ALL_TARGETS);
    Model *m = model_create(&cfg, &cpu_backend, 1, 1);
    const double C = cfg.hidden_size, I = cfg.intermediate_size, V = cfg.vocab_size;
    const double HD = (double)cfg.num_attention_heads * cfg.head_dim, KVD = (double)cfg.num_key_value_heads * cfg.head_dim;
    const double matmul = cfg.num_layers * (2 * C * HD + 2 * C * KVD + 3 * C * I) + V * C;
    const double attention = 12.0 * cfg.num_layers * 7 * HD;
    assert_float_equal(model_flops_per_token(&cfg, 7), 4 * matmul + 6.0 * (double)m->num_grad_floats + attention, 1e-6);
    ModelConfig plain = cfg;
    plain.peft.type = PEFT_NONE;
    assert_float_equal(model_flops_per_token(&plain, 7), 6 * matmul + attention, 1e-6);
    model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_model_yaml_round_trip),
        cmocka_unit_test(test_flops),
        cmocka_unit_test(test_tp_shards),
        cmocka_unit_test(test_init_is_the_base_model),
        cmocka_unit_test(test_gradcheck_llama_tied),
        cmocka_unit_test(test_gradcheck_qwen2_biases),
        cmocka_unit_test(test_gradcheck_qwen3_qk_norm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
