/* model_config_check.c: validates a ModelConfig for the dense model and fills
 * its defaults (head_dim, init_std) before anything is declared or allocated. */
#include <limits.h>
#include <stdbool.h>

#include "../core/error.h"
#include "model_internal.h"
#include "moe_layer.h"

#define DEFAULT_INIT_STD 0.02
/* 2^50 parameters: 1,000 times the largest trained models, and far inside a long element count. */
#define MODEL_MAX_PARAMS 0x1p50

static int positive(int value, const char *key, char *err, size_t errlen) {
    if (value > 0) return 0;
    mt_set_error(err, errlen, "model.%s: expected a positive integer, found %d", key, value);
    return -1;
}

int model_config_validate(const ModelConfig *cfg, char *err, size_t errlen) {
    if (model_family_is_moe(cfg->family)) {
        const MoeConfig *m = &cfg->moe;
        if (m->num_experts < 1 || m->num_experts > MT_MOE_MAX_EXPERTS) {
            mt_set_error(err, errlen, "model.moe.num_experts: expected 1..%d, found %d", MT_MOE_MAX_EXPERTS,
                         m->num_experts);
            return -1;
        }
        if (m->num_experts_per_tok < 1 || m->num_experts_per_tok > m->num_experts ||
            m->num_experts_per_tok > MT_MOE_MAX_TOPK) {
            mt_set_error(err, errlen, "model.moe.num_experts_per_tok: expected 1..min(num_experts, %d), found %d",
                         MT_MOE_MAX_TOPK, m->num_experts_per_tok);
            return -1;
        }
        if (positive(m->moe_intermediate_size, "moe.moe_intermediate_size", err, errlen)) return -1;
        if (m->capacity_factor > m->num_experts) { /* ceil(c N k / E) >= N k: nothing is dropped from E / k on */
            mt_set_error(err, errlen, "model.moe.capacity_factor: expected at most num_experts (%d), found %g: from "
                         "num_experts / num_experts_per_tok (%g) on no token is dropped; null is dropless",
                         m->num_experts, m->capacity_factor, (double)m->num_experts / m->num_experts_per_tok);
            return -1;
        }
    }
    if (positive(cfg->num_layers, "num_layers", err, errlen) ||
        positive(cfg->hidden_size, "hidden_size", err, errlen) ||
        positive(cfg->intermediate_size, "intermediate_size", err, errlen) ||
        positive(cfg->num_attention_heads, "num_attention_heads", err, errlen) ||
        positive(cfg->num_key_value_heads, "num_key_value_heads", err, errlen) ||
        positive(cfg->vocab_size, "vocab_size", err, errlen))
        return -1;
    if (cfg->num_layers > MT_MAX_LAYERS) {
        mt_set_error(err, errlen, "model.num_layers: %d is more than the supported %d", cfg->num_layers,
                     MT_MAX_LAYERS);
        return -1;
    }
    if (cfg->num_attention_heads % cfg->num_key_value_heads != 0) {
        mt_set_error(err, errlen,
                     "model.num_attention_heads (%d) must be a multiple of model.num_key_value_heads (%d)",
                     cfg->num_attention_heads, cfg->num_key_value_heads);
        return -1;
    }
    if (cfg->head_dim < 0) {
        mt_set_error(err, errlen, "model.head_dim: expected a positive even integer, found %d", cfg->head_dim);
        return -1;
    }
    if (cfg->head_dim == 0 && cfg->hidden_size % cfg->num_attention_heads != 0) {
        mt_set_error(err, errlen,
                     "model.head_dim is not given and model.hidden_size (%d) is not a multiple of "
                     "model.num_attention_heads (%d)",
                     cfg->hidden_size, cfg->num_attention_heads);
        return -1;
    }
    int head_dim = cfg->head_dim ? cfg->head_dim : cfg->hidden_size / cfg->num_attention_heads;
    if (head_dim % 2 != 0) {
        mt_set_error(err, errlen, "model.head_dim: rotary embeddings need an even head_dim, found %d", head_dim);
        return -1;
    }
    if ((long)cfg->num_attention_heads * head_dim > INT_MAX / 2) {
        mt_set_error(err, errlen, "model: num_attention_heads * head_dim (%ld) is too large",
                     (long)cfg->num_attention_heads * head_dim);
        return -1;
    }
    if (!(cfg->rope_theta > 0)) {
        mt_set_error(err, errlen, "model.rope_theta: expected a positive number, found %g", cfg->rope_theta);
        return -1;
    }
    if (!(cfg->rms_norm_eps >= 0)) {
        mt_set_error(err, errlen, "model.rms_norm_eps: expected a number >= 0, found %g", cfg->rms_norm_eps);
        return -1;
    }
    if (!(cfg->init_std >= 0)) {
        mt_set_error(err, errlen, "model.init_std: expected a number >= 0, found %g", cfg->init_std);
        return -1;
    }
    const PeftConfig *peft = &cfg->peft;
    if (peft->type == PEFT_LORA) { /* the recipe checks these with the line (peft_validate); here any config */
        const char *moe = lora_moe_refusal(cfg);
        if (moe) {
            mt_set_error(err, errlen, "peft: %s (model.family %s)", moe, model_family_name(cfg->family));
            return -1;
        }
        if (peft->rank < 1 || !(peft->alpha > 0) || (peft->targets & LORA_ALL_TARGETS) == 0 || peft->dropout != 0) {
            mt_set_error(err, errlen, "peft: expected rank >= 1 (found %d), alpha > 0 (found %g), at least one "
                         "target module and dropout 0 (found %g)", peft->rank, peft->alpha, peft->dropout);
            return -1;
        }
    }
    /* An upper estimate of the parameters (every projection, both embeddings): sizes each inside its own bound
     * can still multiply past what an element count or an offset holds. */
    const double H = cfg->hidden_size, kv = (double)cfg->num_key_value_heads * head_dim,
                 q = (double)cfg->num_attention_heads * head_dim;
    const bool moe = model_family_is_moe(cfg->family);
    const double mlp = moe ? (double)cfg->moe.num_experts * (3.0 * H * cfg->moe.moe_intermediate_size + H)
                           : 3.0 * H * cfg->intermediate_size;
    const double params = cfg->num_layers * (2.0 * H * q + 2.0 * H * kv + mlp + 2.0 * H) + 2.0 * cfg->vocab_size * H;
    if (params > MODEL_MAX_PARAMS) {
        mt_set_error(err, errlen, "model: its sizes make about %.3g parameters; at most 2^50 (%.3g) are supported",
                     params, MODEL_MAX_PARAMS);
        return -1;
    }
    const RopeScaling *rs = &cfg->rope_scaling;
    if (rs->enabled) {
        if (!(rs->factor > 0) || !(rs->low_freq_factor > 0) || rs->original_max_position_embeddings <= 0) {
            mt_set_error(err, errlen,
                         "model.rope_scaling: factor, low_freq_factor and original_max_position_embeddings "
                         "must be positive (found %g, %g, %d)",
                         rs->factor, rs->low_freq_factor, rs->original_max_position_embeddings);
            return -1;
        }
        if (!(rs->high_freq_factor > rs->low_freq_factor)) {
            mt_set_error(err, errlen,
                         "model.rope_scaling: high_freq_factor (%g) must be greater than low_freq_factor (%g)",
                         rs->high_freq_factor, rs->low_freq_factor);
            return -1;
        }
    }
    return 0;
}

ModelConfig model_config_resolve(const ModelConfig *cfg) {
    char err[512];
    if (model_config_validate(cfg, err, sizeof err) != 0) mt_die(MT_EXIT_USAGE, "%s", err);
    ModelConfig out = *cfg;
    if (out.head_dim == 0) out.head_dim = out.hidden_size / out.num_attention_heads;
    if (out.init_std == 0) out.init_std = DEFAULT_INIT_STD;
    return out;
}
