/* test_tiny_config.h: the tiny models unit tests share: 2 layers, hidden
 * 16, intermediate 24, 4 heads (2 kv) of 4, vocabulary 32, init_std 0.3
 * (tiny_config); the MoE one adds 4 experts, top 2, expert intermediate 8,
 * the softmax router with aux_loss 0.1, every layer MoE (moe_test_config).
 * hf_test_config is the Hugging Face tests' (below). Tests change what they
 * need after. */
#ifndef MT_TEST_TINY_CONFIG_H
#define MT_TEST_TINY_CONFIG_H

#include <string.h>

#include "config/recipe.h"

static inline ModelConfig tiny_config(ModelFamily family) {
    ModelConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.family = family;
    cfg.num_layers = 2;
    cfg.hidden_size = 16;
    cfg.intermediate_size = 24;
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 2;
    cfg.head_dim = 4;
    cfg.vocab_size = 32;
    cfg.max_position_embeddings = 64;
    cfg.rope_theta = 10000.0;
    cfg.rms_norm_eps = 1e-5;
    cfg.init_std = 0.3;
    cfg.qk_norm = family == FAMILY_QWEN3 || family == FAMILY_QWEN3_MOE;
    return cfg;
}

static inline ModelConfig moe_test_config(ModelFamily family) {
    ModelConfig cfg = tiny_config(family);
    MoeConfig *m = &cfg.moe;
    m->num_experts = 4;
    m->num_experts_per_tok = 2;
    m->moe_intermediate_size = 8;
    m->norm_topk_prob = true;
    m->score_function = SCORE_SOFTMAX;
    m->load_balancing = LB_AUX_LOSS;
    m->aux_loss_coeff = 0.1;
    m->layer_freq = 1;
    m->bias_update_rate = 1e-3;
    return cfg;
}

/* The tests of the Hugging Face config and weight names: 3 layers, head_dim derived, no init_std, the
 * embedding tied or not, qwen2's attention bias and qwen3's qk norm (not qwen3_moe's). */
static inline ModelConfig hf_test_config(ModelFamily family, bool tied) {
    ModelConfig c = tiny_config(family);
    c.num_layers = 3;
    c.head_dim = 0;
    c.init_std = 0;
    c.tie_word_embeddings = tied;
    c.attention_bias = family == FAMILY_QWEN2;
    c.qk_norm = family == FAMILY_QWEN3;
    return c;
}

#endif
