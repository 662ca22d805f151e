/* model_case.h: the tiny models the GPU model tests compare (test_cuda_model.c,
 * test_cuda_tp_model.c): a config per family, a CPU model with weights the
 * bf16 copy holds exactly (norms and biases moved off their 1 / 0 init so
 * their paths are exercised), and a random micro-batch with some ignored
 * targets. */
#ifndef MT_TESTS_GPU_MODEL_CASE_H
#define MT_TESTS_GPU_MODEL_CASE_H

#include <string.h>

#include "backend/backend.h"
#include "gpu_test_util.h"
#include "model/model.h"

static inline ModelConfig tiny(ModelFamily family, int C, int H, int KVH, int D) {
    ModelConfig c;
    memset(&c, 0, sizeof c);
    c.family = family;
    c.num_layers = 2;
    c.hidden_size = C;
    c.intermediate_size = 3 * C;
    c.num_attention_heads = H;
    c.num_key_value_heads = KVH;
    c.head_dim = D;
    c.vocab_size = 384;
    c.max_position_embeddings = 512;
    c.rope_theta = 10000.0;
    c.rms_norm_eps = 1e-6;
    c.init_std = 0.05;
    c.attention_bias = family == FAMILY_QWEN2;
    c.qk_norm = family == FAMILY_QWEN3;
    return c;
}

/* The whole model on the CPU for micro-batches of B x T, weights rounded to bf16. */
static inline Model *cpu_case_model(const ModelConfig *cfg, int B, int T, Rng *rng) {
    Model *cpu = model_create(cfg, &cpu_backend, B, T);
    model_init_weights(cpu, 7);
    for (int i = 0; i < cpu->num_params; i++) {
        const ParamInfo *p = &cpu->param_info[i];
        if (p->ndim == 1)
            for (long j = 0; j < p->numel; j++) cpu->params[p->offset + j] += (float)(0.1 * rng_normal(rng));
    }
    for (long i = 0; i < cpu->num_floats; i++) cpu->params[i] = round_bf16(cpu->params[i]);
    return cpu;
}

/* N random inputs and targets (every 7th target ignored). */
static inline void case_tokens(int N, int V, Rng *rng, int32_t *inputs, int32_t *targets) {
    for (int i = 0; i < N; i++) {
        inputs[i] = (int32_t)rng_below(rng, (uint64_t)V);
        targets[i] = i % 7 == 5 ? -1 : (int32_t)rng_below(rng, (uint64_t)V);
    }
}

#endif
