/* test_model.c: the dense model (src/model) on tiny configs with the CPU
 * backend: the param registry, init (determinism, statistics), forward
 * (causality, ignored targets) and backward (finite differences for every
 * parameter tensor of llama/qwen2/qwen3, accumulation, loss scaling, a tiny
 * overfit), FLOPs, and the refusal of invalid configs. */
#include <math.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/model.h"
#include "model/model_internal.h"

enum { B = 2, T = 5, L = 2, C = 16, H = 4, KVH = 2, D = 4, I = 24, V = 32 };

static ModelConfig tiny_config(ModelFamily family, bool tied, bool rope_scaling) {
    ModelConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.family = family;
    cfg.num_layers = L;
    cfg.hidden_size = C;
    cfg.intermediate_size = I;
    cfg.num_attention_heads = H;
    cfg.num_key_value_heads = KVH;
    cfg.head_dim = D;
    cfg.vocab_size = V;
    cfg.max_position_embeddings = 64;
    cfg.rope_theta = 10000.0;
    cfg.rms_norm_eps = 1e-5;
    cfg.tie_word_embeddings = tied;
    cfg.attention_bias = family == FAMILY_QWEN2;
    cfg.qk_norm = family == FAMILY_QWEN3;
    cfg.init_std = 0.02;
    if (rope_scaling) {
        /* original_max_position_embeddings 64 puts the slow rotary frequency
         * (wavelength 2*pi*100 ~ 628 for D = 4) beyond low_freq_wavelen = 64,
         * so llama3 scaling really changes the tables in this tiny model. */
        cfg.rope_scaling.enabled = true;
        cfg.rope_scaling.factor = 8.0;
        cfg.rope_scaling.low_freq_factor = 1.0;
        cfg.rope_scaling.high_freq_factor = 4.0;
        cfg.rope_scaling.original_max_position_embeddings = 64;
    }
    return cfg;
}

/* Random tokens; targets are the next input (a learnable pattern) except a few ignored. */
static void make_batch(uint64_t seed, int32_t *inputs, int32_t *targets, int n, int ignored_every) {
    Rng rng;
    rng_seed(&rng, seed);
    for (int i = 0; i < n; i++) inputs[i] = (int32_t)rng_below(&rng, V);
    for (int i = 0; i < n; i++) {
        targets[i] = (int32_t)rng_below(&rng, V);
        if (ignored_every > 0 && i % ignored_every == ignored_every - 1) targets[i] = -1;
    }
}

static double max_abs(const float *x, long n) {
    double m = 0;
    for (long i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

/* ---------------------------------------------------------------- registry */

typedef struct Expected {
    char name[96];
    long rows, cols; /* cols 0: 1-D */
} Expected;

static int expect(Expected *e, int n, long rows, long cols, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e[n].name, sizeof e[n].name, fmt, ap);
    va_end(ap);
    e[n].rows = rows;
    e[n].cols = cols;
    return n + 1;
}

static void check_registry(ModelFamily family, bool tied) {
    ModelConfig cfg = tiny_config(family, tied, false);
    Model *model = model_create(&cfg, &cpu_backend, 1, 4);
    Expected e[128];
    int n = 0;
    const int HD = H * D, KVD = KVH * D;
    n = expect(e, n, V, C, "embed.weight");
    for (int l = 0; l < L; l++) {
        n = expect(e, n, C, 0, "layers.%d.attn_norm.weight", l);
        n = expect(e, n, HD, C, "layers.%d.attn.q_proj.weight", l);
        if (cfg.attention_bias) n = expect(e, n, HD, 0, "layers.%d.attn.q_proj.bias", l);
        n = expect(e, n, KVD, C, "layers.%d.attn.k_proj.weight", l);
        if (cfg.attention_bias) n = expect(e, n, KVD, 0, "layers.%d.attn.k_proj.bias", l);
        n = expect(e, n, KVD, C, "layers.%d.attn.v_proj.weight", l);
        if (cfg.attention_bias) n = expect(e, n, KVD, 0, "layers.%d.attn.v_proj.bias", l);
        if (cfg.qk_norm) {
            n = expect(e, n, D, 0, "layers.%d.attn.q_norm.weight", l);
            n = expect(e, n, D, 0, "layers.%d.attn.k_norm.weight", l);
        }
        n = expect(e, n, C, HD, "layers.%d.attn.o_proj.weight", l);
        n = expect(e, n, C, 0, "layers.%d.mlp_norm.weight", l);
        n = expect(e, n, I, C, "layers.%d.mlp.gate_proj.weight", l);
        n = expect(e, n, I, C, "layers.%d.mlp.up_proj.weight", l);
        n = expect(e, n, C, I, "layers.%d.mlp.down_proj.weight", l);
    }
    n = expect(e, n, C, 0, "final_norm.weight");
    if (!tied) n = expect(e, n, V, C, "lm_head.weight");

    assert_int_equal(model->num_params, n);
    size_t next_offset = 0;
    for (int i = 0; i < n; i++) {
        const ParamInfo *p = &model->param_info[i];
        assert_string_equal(p->name, e[i].name);
        assert_int_equal(p->ndim, e[i].cols ? 2 : 1);
        assert_int_equal(p->shape[0], e[i].rows);
        assert_int_equal(p->shape[1], e[i].cols ? e[i].cols : 1);
        assert_int_equal(p->numel, e[i].rows * (e[i].cols ? e[i].cols : 1));
        assert_int_equal(p->offset, next_offset); /* contiguous, in order, so no overlap */
        next_offset += (size_t)p->numel;
        bool is_norm_or_bias = strstr(p->name, "norm.weight") != NULL || strstr(p->name, ".bias") != NULL;
        assert_int_equal(p->no_decay, is_norm_or_bias);
        if (strstr(p->name, "norm.weight")) assert_int_equal(p->init, INIT_ONES);
        else if (strstr(p->name, ".bias")) assert_int_equal(p->init, INIT_ZEROS);
        else assert_int_equal(p->init, INIT_NORMAL);
        assert_ptr_equal(model_find_param(model, p->name), p);
    }
    assert_int_equal(next_offset, model->num_floats);
    assert_int_equal(model_count_params(&cfg), model->num_floats);

    /* the count, written out independently of the registry */
    long per_layer = 2L * C + 2L * HD * C + 2L * KVD * C + 3L * I * C;
    if (cfg.attention_bias) per_layer += HD + 2L * KVD;
    if (cfg.qk_norm) per_layer += 2L * D;
    long total = (long)V * C + L * per_layer + C + (tied ? 0 : (long)V * C);
    assert_int_equal(model->num_floats, total);

    assert_true((model_find_param(model, "lm_head.weight") == NULL) == tied);
    assert_null(model_find_param(model, "layers.2.attn_norm.weight"));
    model_free(model);
}

static void test_registry_llama_untied(void **state) { check_registry(FAMILY_LLAMA, false); }
static void test_registry_llama_tied(void **state) { check_registry(FAMILY_LLAMA, true); }
static void test_registry_qwen2(void **state) { check_registry(FAMILY_QWEN2, false); }
static void test_registry_qwen3(void **state) { check_registry(FAMILY_QWEN3, true); }

/* head_dim 0 means hidden_size / num_attention_heads; init_std 0 means 0.02. */
static void test_config_defaults(void **state) {
    ModelConfig cfg = tiny_config(FAMILY_LLAMA, false, false);
    cfg.head_dim = 0;
    cfg.init_std = 0;
    cfg.hidden_size = 32;
    Model *model = model_create(&cfg, &cpu_backend, 1, 4);
    assert_int_equal(model->cfg.head_dim, 8);
    assert_true(model->cfg.init_std == 0.02);
    assert_int_equal(model_find_param(model, "layers.0.attn.q_proj.weight")->shape[0], H * 8);
    model_free(model);
}

/* ---------------------------------------------------------------- init */

static void test_init_determinism(void **state) {
    ModelConfig cfg = tiny_config(FAMILY_QWEN3, false, false);
    Model *a = model_create(&cfg, &cpu_backend, B, T);
    Model *b = model_create(&cfg, &cpu_backend, B, T);
    model_init_weights(a, 1234);
    int threads = omp_get_max_threads();
    omp_set_num_threads(1); /* the bits must not depend on the thread count */
    model_init_weights(b, 1234);
    omp_set_num_threads(threads);
    assert_memory_equal(a->params, b->params, (size_t)a->num_floats * sizeof(float));

    int32_t inputs[B * T], targets[B * T];
    make_batch(7, inputs, targets, B * T, 0);
    float loss_a = model_forward(a, inputs, targets, B, T);
    float loss_b = model_forward(b, inputs, targets, B, T);
    assert_memory_equal(&loss_a, &loss_b, sizeof loss_a);
    assert_memory_equal(model_logits(a), model_logits(b), (size_t)B * T * V * sizeof(float));

    model_init_weights(b, 1235);
    long differ = 0, normal = 0;
    for (int i = 0; i < a->num_params; i++) {
        const ParamInfo *p = &a->param_info[i];
        if (p->init != INIT_NORMAL) continue;
        for (long k = 0; k < p->numel; k++) {
            normal++;
            differ += a->params[p->offset + k] != b->params[p->offset + k];
        }
    }
    assert_int_equal(differ, normal);
    float loss_c = model_forward(b, inputs, targets, B, T);
    assert_true(loss_c != loss_a);

    /* parameters of the same shape are not copies of each other (seeded per parameter) */
    const ParamInfo *g0 = model_find_param(a, "layers.0.mlp.gate_proj.weight");
    const ParamInfo *u0 = model_find_param(a, "layers.0.mlp.up_proj.weight");
    assert_memory_not_equal(a->params + g0->offset, a->params + u0->offset, (size_t)g0->numel * sizeof(float));
    model_free(a);
    model_free(b);
}

static void check_normal_stats(const Model *model, const char *name, double want_std) {
    const ParamInfo *p = model_find_param(model, name);
    assert_non_null(p);
    double sum = 0, sq = 0;
    for (long k = 0; k < p->numel; k++) {
        double x = model->params[p->offset + k];
        sum += x;
        sq += x * x;
    }
    double mean = sum / p->numel, std = sqrt(sq / p->numel - mean * mean);
    /* The sample std of n normals has relative standard error 1/sqrt(2n) (<= 1.1%
     * for n >= 4096 here) and the mean has standard error std/sqrt(n): allow 5 sigma. */
    double rel_se = 1.0 / sqrt(2.0 * p->numel);
    assert_true(fabs(std / want_std - 1.0) < 5 * rel_se);
    assert_true(fabs(mean) < 5 * want_std / sqrt((double)p->numel));
    assert_true(p->init_std == (float)want_std);
}

static void test_init_statistics(void **state) {
    ModelConfig cfg = tiny_config(FAMILY_QWEN2, false, false);
    cfg.num_layers = 4;
    cfg.hidden_size = 64;
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 2;
    cfg.head_dim = 16;
    cfg.intermediate_size = 256;
    cfg.vocab_size = 512;
    cfg.init_std = 0.02;
    Model *model = model_create(&cfg, &cpu_backend, 1, 4);
    model_init_weights(model, 42);
    const double out_std = 0.02 / sqrt(2.0 * cfg.num_layers);
    check_normal_stats(model, "embed.weight", 0.02);
    check_normal_stats(model, "lm_head.weight", 0.02);
    check_normal_stats(model, "layers.1.attn.q_proj.weight", 0.02);
    check_normal_stats(model, "layers.2.mlp.up_proj.weight", 0.02);
    check_normal_stats(model, "layers.0.attn.o_proj.weight", out_std);
    check_normal_stats(model, "layers.3.mlp.down_proj.weight", out_std);
    for (int i = 0; i < model->num_params; i++) {
        const ParamInfo *p = &model->param_info[i];
        if (p->init == INIT_NORMAL) continue;
        float want = p->init == INIT_ONES ? 1.0f : 0.0f;
        for (long k = 0; k < p->numel; k++) assert_true(model->params[p->offset + k] == want);
    }
    model_free(model);
}

/* ---------------------------------------------------------------- forward */

static void test_forward_causal_and_batch_independent(void **state) {
    ModelConfig cfg = tiny_config(FAMILY_QWEN3, false, false);
    cfg.init_std = 0.3;
    Model *model = model_create(&cfg, &cpu_backend, B, T);
    model_init_weights(model, 3);
    int32_t inputs[B * T], targets[B * T];
    make_batch(11, inputs, targets, B * T, 0);
    model_forward(model, inputs, NULL, B, T);
    float *before = malloc((size_t)B * T * V * sizeof(float));
    memcpy(before, model_logits(model), (size_t)B * T * V * sizeof(float));
    const int changed = 3; /* change token t = 3 of sequence 0 */
    inputs[changed] = (inputs[changed] + 1) % V;
    model_forward(model, inputs, NULL, B, T);
    const float *after = model_logits(model);
    /* earlier positions of sequence 0 and all of sequence 1 are unchanged, bit for bit */
    assert_memory_equal(before, after, (size_t)changed * V * sizeof(float));
    assert_memory_equal(before + (size_t)T * V, after + (size_t)T * V, (size_t)T * V * sizeof(float));
    for (int t = changed; t < T; t++)
        assert_memory_not_equal(before + (size_t)t * V, after + (size_t)t * V, (size_t)V * sizeof(float));
    free(before);
    model_free(model);
}

static void test_rope_scaling_changes_logits(void **state) {
    ModelConfig plain = tiny_config(FAMILY_LLAMA, true, false);
    ModelConfig scaled = tiny_config(FAMILY_LLAMA, true, true);
    plain.init_std = scaled.init_std = 0.3;
    Model *a = model_create(&plain, &cpu_backend, B, T);
    Model *b = model_create(&scaled, &cpu_backend, B, T);
    model_init_weights(a, 5);
    model_init_weights(b, 5);
    int32_t inputs[B * T], targets[B * T];
    make_batch(13, inputs, targets, B * T, 0);
    model_forward(a, inputs, NULL, B, T);
    model_forward(b, inputs, NULL, B, T);
    /* position 0 has no rotation in either; later positions rotate differently */
    assert_memory_equal(model_logits(a), model_logits(b), (size_t)V * sizeof(float));
    assert_memory_not_equal(model_logits(a) + (size_t)(T - 1) * V, model_logits(b) + (size_t)(T - 1) * V,
                            (size_t)V * sizeof(float));
    model_free(a);
    model_free(b);
}

/* The loss is the mean over targets >= 0 of -log softmax(logits)[target], and
 * dlogits (left in the logits buffer by backward) are (softmax - onehot) *
 * loss_scale / count on counted rows and 0 on ignored ones. */
static void test_ignored_targets(void **state) {
    ModelConfig cfg = tiny_config(FAMILY_LLAMA, false, false);
    cfg.init_std = 0.3;
    Model *model = model_create(&cfg, &cpu_backend, B, T);
    model_init_weights(model, 9);
    int32_t inputs[B * T], targets[B * T];
    make_batch(17, inputs, targets, B * T, 3); /* every 3rd target is -1 */
    targets[0] = -100;                         /* any negative value is ignored */
    float loss = model_forward(model, inputs, targets, B, T);
    float *logits = malloc((size_t)B * T * V * sizeof(float));
    memcpy(logits, model_logits(model), (size_t)B * T * V * sizeof(float));
    double sum = 0;
    int count = 0;
    for (int n = 0; n < B * T; n++) {
        if (targets[n] < 0) continue;
        double mx = -INFINITY, z = 0;
        for (int v = 0; v < V; v++) mx = fmax(mx, logits[n * V + v]);
        for (int v = 0; v < V; v++) z += exp(logits[n * V + v] - mx);
        sum += log(z) + mx - logits[n * V + targets[n]];
        count++;
    }
    assert_int_equal(count, 6);
    assert_float_equal(loss, sum / count, 1e-5 * fabs(sum / count));
    assert_true(model->last_loss == loss);

    const float loss_scale = 0.75f;
    model_zero_grad(model);
    model_backward(model, loss_scale);
    const float *dlogits = model_logits(model);
    for (int n = 0; n < B * T; n++) {
        double mx = -INFINITY, z = 0;
        for (int v = 0; v < V; v++) mx = fmax(mx, logits[n * V + v]);
        for (int v = 0; v < V; v++) z += exp(logits[n * V + v] - mx);
        for (int v = 0; v < V; v++) {
            double want = targets[n] < 0 ? 0.0
                                         : (exp(logits[n * V + v] - mx) / z - (v == targets[n])) * loss_scale / count;
            assert_float_equal(dlogits[n * V + v], want, 1e-6);
        }
    }

    /* all targets ignored: loss 0 and no gradient at all */
    for (int n = 0; n < B * T; n++) targets[n] = -1;
    assert_true(model_forward(model, inputs, targets, B, T) == 0.0f);
    model_zero_grad(model);
    model_backward(model, 1.0f);
    assert_true(max_abs(model->grads, model->num_floats) == 0.0);
    free(logits);
    model_free(model);
}

/* ---------------------------------------------------------------- backward */

/* Central differences of the mean loss for every parameter tensor (3 random
 * entries each) against the analytic gradient.
 *
 * Tolerance: the forward is fp32 and model_forward returns a float loss
 * (~3.5, ulp 2.4e-7), so each loss carries a few ulps of rounding noise;
 * divided by 2 * eps = 2e-3 one ulp is 1.2e-4 of noise in the difference
 * (measured worst case ~3e-4). The O(eps^2) truncation error is far smaller.
 * So |fd - grad| <= 1e-3 + 1e-2 * |grad|: about 8 ulps of noise plus 1%. With
 * init_std 0.3 the gradients are O(1e-2..1), so a missing term, a wrong sign
 * or a factor error in any op's backward fails the check. */
static void check_gradients(ModelConfig cfg, uint64_t seed) {
    cfg.init_std = 0.3;
    Model *model = model_create(&cfg, &cpu_backend, B, T);
    model_init_weights(model, seed);
    int32_t inputs[B * T], targets[B * T];
    make_batch(seed + 100, inputs, targets, B * T, 4);
    model_zero_grad(model);
    model_forward(model, inputs, targets, B, T);
    model_backward(model, 1.0f);
    const double scale = max_abs(model->grads, model->num_floats);
    assert_true(scale > 1e-2);

    const float eps = 1e-3f;
    Rng rng;
    rng_seed(&rng, seed);
    for (int i = 0; i < model->num_params; i++) {
        const ParamInfo *p = &model->param_info[i];
        for (int sample = 0; sample < 3; sample++) {
            long k = (long)rng_below(&rng, (uint64_t)p->numel);
            float *w = &model->params[p->offset + k];
            float saved = *w;
            *w = saved + eps;
            double plus = model_forward(model, inputs, targets, B, T);
            *w = saved - eps;
            double minus = model_forward(model, inputs, targets, B, T);
            *w = saved;
            double fd = (plus - minus) / (2.0 * eps);
            double grad = model->grads[p->offset + k];
            double err = fabs(fd - grad);
            if (err > 1e-3 + 1e-2 * fabs(grad))
                fail_msg("%s[%ld]: finite difference %.6g, backward %.6g", p->name, k, fd, grad);
        }
    }
    model_free(model);
}

static void test_gradcheck_llama_tied_rope_scaling(void **state) {
    check_gradients(tiny_config(FAMILY_LLAMA, true, true), 21);
}
static void test_gradcheck_llama_untied(void **state) { check_gradients(tiny_config(FAMILY_LLAMA, false, false), 22); }
static void test_gradcheck_qwen2_biases(void **state) { check_gradients(tiny_config(FAMILY_QWEN2, false, false), 23); }
static void test_gradcheck_qwen3_qk_norm(void **state) { check_gradients(tiny_config(FAMILY_QWEN3, true, false), 24); }

/* Gradients accumulate across backward calls, and loss_scale scales them. */
static void test_gradient_accumulation_and_scale(void **state) {
    ModelConfig cfg = tiny_config(FAMILY_QWEN2, true, false);
    cfg.init_std = 0.3;
    Model *model = model_create(&cfg, &cpu_backend, B, T);
    model_init_weights(model, 31);
    int32_t inputs[B * T], targets[B * T];
    make_batch(32, inputs, targets, B * T, 0);
    const long n = model->num_floats;
    float *once = malloc((size_t)n * sizeof(float));
    float *twice = malloc((size_t)n * sizeof(float));

    model_zero_grad(model);
    model_forward(model, inputs, targets, B, T);
    model_backward(model, 1.0f);
    memcpy(once, model->grads, (size_t)n * sizeof(float));
    assert_true(max_abs(once, n) > 0);

    model_forward(model, inputs, targets, B, T);
    model_backward(model, 1.0f);
    memcpy(twice, model->grads, (size_t)n * sizeof(float));
    /* g + g is exact per element, but the ops sum several terms into the same
     * gradient (tied embedding, q/k/v into one input gradient...), so the second
     * pass rounds differently: allow a few fp32 ulps of the gradient scale. */
    double scale = max_abs(once, n);
    for (long i = 0; i < n; i++) assert_float_equal(twice[i], 2.0f * once[i], 1e-6 * scale);

    /* loss_scale 0.5 halves every gradient exactly: scaling by a power of two
     * commutes with every rounding in the (linear in dlogits) backward. */
    model_zero_grad(model);
    model_forward(model, inputs, targets, B, T);
    model_backward(model, 0.5f);
    for (long i = 0; i < n; i++) assert_true(model->grads[i] == 0.5f * once[i]);

    /* and a single pass leaves no trace after model_zero_grad */
    model_zero_grad(model);
    assert_true(max_abs(model->grads, n) == 0.0);
    free(once);
    free(twice);
    model_free(model);
}

/* 80 steps of plain SGD on one batch: forward and backward agree end to end.
 * (lr 0.3: at lr 1.0 the trajectory is chaotic, so one-ulp changes in an op
 * decided whether the loss fell 10x in time.) */
static void test_overfit_one_batch(void **state) {
    ModelConfig cfg = tiny_config(FAMILY_QWEN3, false, false);
    Model *model = model_create(&cfg, &cpu_backend, B, T);
    model_init_weights(model, 77);
    int32_t inputs[B * T], targets[B * T];
    make_batch(78, inputs, targets, B * T, 0);
    float first = 0, loss = 0;
    const float lr = 0.3f;
    for (int step = 0; step < 80; step++) {
        model_zero_grad(model);
        loss = model_forward(model, inputs, targets, B, T);
        if (step == 0) first = loss;
        model_backward(model, 1.0f);
        for (long i = 0; i < model->num_floats; i++) model->params[i] -= lr * model->grads[i];
    }
    assert_float_equal(first, logf((float)V), 0.1); /* small init: near-uniform predictions */
    assert_true(loss < first / 10.0f);
    model_free(model);
}

/* ---------------------------------------------------------------- flops */

static void test_flops_per_token(void **state) {
    ModelConfig cfg = tiny_config(FAMILY_QWEN2, false, false);
    const double HD = H * D, KVD = KVH * D;
    const double matmul = L * (C * HD + 2 * C * KVD + HD * C + 3.0 * C * I) + (double)V * C;
    assert_float_equal(model_flops_per_token(&cfg, 7), 6 * matmul + 12.0 * L * 7 * HD, 1e-6);
    /* tying the embedding does not remove the lm_head matmul */
    ModelConfig tied = tiny_config(FAMILY_QWEN2, true, false);
    assert_float_equal(model_flops_per_token(&tied, 7), model_flops_per_token(&cfg, 7), 1e-6);
    /* attention grows linearly with T: 12 * L * H * D per extra position */
    assert_float_equal(model_flops_per_token(&cfg, 8) - model_flops_per_token(&cfg, 7), 12.0 * L * HD, 1e-6);
}

/* ---------------------------------------------------------------- invalid configs */

static void check_invalid(ModelConfig cfg, const char *key) {
    char err[512] = "";
    assert_int_equal(model_config_validate(&cfg, err, sizeof err), -1);
    if (!strstr(err, key)) fail_msg("message '%s' does not name '%s'", err, key);
    /* model_create dies with the usage status instead of returning */
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        freopen("/dev/null", "w", stderr);
        model_create(&cfg, &cpu_backend, 1, 4);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), MT_EXIT_USAGE);
}

static void test_invalid_configs(void **state) {
    ModelConfig cfg = tiny_config(FAMILY_LLAMA, false, false);
    char err[512];
    assert_int_equal(model_config_validate(&cfg, err, sizeof err), 0);

    ModelConfig c = cfg;
    c.num_key_value_heads = 3; /* 4 heads are not a multiple of 3 */
    check_invalid(c, "num_key_value_heads");
    c = cfg;
    c.head_dim = 5;
    check_invalid(c, "head_dim");
    c = cfg;
    c.head_dim = 0;
    c.hidden_size = 18; /* 18 / 4 heads is not whole */
    check_invalid(c, "head_dim");
    c = cfg;
    c.family = FAMILY_MIXTRAL; /* a MoE family needs its moe block */
    check_invalid(c, "model.moe.num_experts");
    c.moe.num_experts = 4;
    c.moe.num_experts_per_tok = 5;
    check_invalid(c, "model.moe.num_experts_per_tok");
    c.moe.num_experts_per_tok = 2;
    c.moe.moe_intermediate_size = 8;
    c.moe.capacity_factor = 1e30; /* ceil(c N k / E) would overflow a long: at most num_experts */
    check_invalid(c, "model.moe.capacity_factor: expected at most num_experts (4)");
    c.moe.capacity_factor = 4.0;
    assert_int_equal(model_config_validate(&c, err, sizeof err), 0);
    c = cfg;
    c.num_layers = 0;
    check_invalid(c, "num_layers");
    c = cfg;
    c.vocab_size = -1;
    check_invalid(c, "vocab_size");
    c = tiny_config(FAMILY_LLAMA, false, true);
    c.rope_scaling.high_freq_factor = 1.0;
    check_invalid(c, "rope_scaling");
}

/* A token outside the vocabulary is a usage error, not a crash. */
static void test_token_out_of_vocab_dies(void **state) {
    ModelConfig cfg = tiny_config(FAMILY_LLAMA, false, false);
    Model *model = model_create(&cfg, &cpu_backend, B, T);
    int32_t inputs[B * T], targets[B * T];
    make_batch(1, inputs, targets, B * T, 0);
    inputs[4] = V;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        freopen("/dev/null", "w", stderr);
        model_forward(model, inputs, targets, B, T);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), MT_EXIT_USAGE);
    model_free(model);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry_llama_untied),
        cmocka_unit_test(test_registry_llama_tied),
        cmocka_unit_test(test_registry_qwen2),
        cmocka_unit_test(test_registry_qwen3),
        cmocka_unit_test(test_config_defaults),
        cmocka_unit_test(test_init_determinism),
        cmocka_unit_test(test_init_statistics),
        cmocka_unit_test(test_forward_causal_and_batch_independent),
        cmocka_unit_test(test_rope_scaling_changes_logits),
        cmocka_unit_test(test_ignored_targets),
        cmocka_unit_test(test_gradcheck_llama_tied_rope_scaling),
        cmocka_unit_test(test_gradcheck_llama_untied),
        cmocka_unit_test(test_gradcheck_qwen2_biases),
        cmocka_unit_test(test_gradcheck_qwen3_qk_norm),
        cmocka_unit_test(test_gradient_accumulation_and_scale),
        cmocka_unit_test(test_overfit_one_batch),
        cmocka_unit_test(test_flops_per_token),
        cmocka_unit_test(test_invalid_configs),
        cmocka_unit_test(test_token_out_of_vocab_dies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
