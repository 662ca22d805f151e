/* hf_config_write.c: a ModelConfig as a transformers config.json (keys
 * sorted and indented as transformers' save_pretrained writes them), and the
 * checks that a config has a faithful transformers counterpart. */
#include <stdio.h>
#include <string.h>

#include "../core/error.h"
#include "../core/json.h"
#include "../model/model.h"
#include "hf_config.h"
#include "hf_families.h"

const char *hf_model_type(ModelFamily family) {
    const HfFamily *f = hf_family_of(family);
    return f ? f->model_type : NULL;
}

const char *hf_architecture(ModelFamily family) {
    const HfFamily *f = hf_family_of(family);
    return f ? f->architecture : NULL;
}

/* What transformers' MoE blocks cannot express (but the expert biases: hf_config_check_exportable, last). */
static int check_moe_exportable(const ModelConfig *cfg, char *err, size_t errlen) {
    const MoeConfig *m = &cfg->moe;
    const char *family = model_family_name(cfg->family);
    if (m->shared_expert_intermediate_size > 0) {
        mt_set_error(err, errlen, "model.moe.shared_expert_intermediate_size: %s in transformers has no shared expert",
                     family);
        return -1;
    }
    if (m->score_function != SCORE_SOFTMAX) {
        mt_set_error(err, errlen, "model.moe.score_function: %s in transformers routes with softmax", family);
        return -1;
    }
    if (cfg->family == FAMILY_MIXTRAL) {
        if (!m->norm_topk_prob) {
            mt_set_error(err, errlen, "model.moe.norm_topk_prob: Mixtral always renormalises the top-k weights");
            return -1;
        }
        if (m->moe_intermediate_size != cfg->intermediate_size) {
            mt_set_error(err, errlen, "model.moe.moe_intermediate_size: Mixtral's experts are intermediate_size wide "
                         "(%d), found %d", cfg->intermediate_size, m->moe_intermediate_size);
            return -1;
        }
        for (int l = 0; l < cfg->num_layers; l++)
            if (!model_layer_is_moe(cfg, l)) {
                mt_set_error(err, errlen, "model.moe.layer_freq: Mixtral has experts on every layer (layer %d is dense)", l);
                return -1;
            }
    }
    return 0;
}

int hf_config_check_exportable(const ModelConfig *cfg, char *err, size_t errlen) {
    const char *family = model_family_name(cfg->family);
    if (!hf_model_type(cfg->family)) {
        mt_set_error(err, errlen, "model.family: %s cannot be converted", family);
        return -1;
    }
    if (cfg->family == FAMILY_LLAMA && cfg->attention_bias) {
        mt_set_error(err, errlen,
                     "model.attention_bias: a llama model with q/k/v biases has no transformers counterpart "
                     "(LlamaForCausalLM's attention_bias also adds an o_proj bias)");
        return -1;
    }
    if (model_family_is_moe(cfg->family) && check_moe_exportable(cfg, err, errlen))
        return -1;
    if (cfg->family == FAMILY_MIXTRAL && cfg->attention_bias) {
        mt_set_error(err, errlen, "model.attention_bias: MixtralForCausalLM has no attention biases");
        return -1;
    }
    if ((cfg->family == FAMILY_QWEN3 || cfg->family == FAMILY_QWEN3_MOE) && cfg->attention_bias) {
        mt_set_error(err, errlen,
                     "model.attention_bias: a qwen3 model with q/k/v biases has no transformers counterpart "
                     "(Qwen3ForCausalLM's attention_bias also adds an o_proj bias)");
        return -1;
    }
    if (cfg->family == FAMILY_QWEN2 && !cfg->attention_bias) {
        mt_set_error(err, errlen,
                     "model.attention_bias: Qwen2ForCausalLM always has q/k/v biases; a qwen2 model without them "
                     "cannot be written");
        return -1;
    }
    const bool qwen3 = cfg->family == FAMILY_QWEN3 || cfg->family == FAMILY_QWEN3_MOE;
    if (!qwen3 && cfg->qk_norm) {
        mt_set_error(err, errlen, "model.qk_norm: %s in transformers has no q/k norm (qwen3 has)", family);
        return -1;
    }
    if (qwen3 && !cfg->qk_norm) {
        mt_set_error(err, errlen, "model.qk_norm: Qwen3ForCausalLM always has q/k norms; a qwen3 model without them "
                                  "cannot be written");
        return -1;
    }
    /* last: the one refusal an option lifts, so it names the option only when nothing else stands in the way */
    if (model_family_is_moe(cfg->family) && cfg->moe.load_balancing == LB_EXPERT_BIAS) {
        mt_set_error(err, errlen, "model.moe.load_balancing: expert_bias routing has no transformers counterpart for "
                     "%s (its routers add a bias per expert to the scores to choose the experts); --drop-expert-bias "
                     "exports the model without the biases, which routes some tokens to other experts than the "
                     "trained model does (convert says how many)", family);
        return -1;
    }
    return 0;
}

static void key_int(JsonWriter *w, const char *key, long value) {
    jw_key(w, key);
    jw_int(w, value);
}

static void key_double(JsonWriter *w, const char *key, double value) {
    jw_key(w, key);
    jw_double(w, value);
}

static void key_bool(JsonWriter *w, const char *key, bool value) {
    jw_key(w, key);
    jw_bool(w, value);
}

static void key_string(JsonWriter *w, const char *key, const char *value) {
    jw_key(w, key);
    jw_string(w, value);
}

/* "key": id, or null when there is none and with_null (config.json says
 * null, so that transformers does not fall back to its class's default). */
static void key_token_id(JsonWriter *w, const char *key, bool has, int id, bool with_null) {
    if (!has && !with_null) return;
    jw_key(w, key);
    if (has) jw_int(w, id);
    else jw_null(w);
}

static void key_eos_token_id(JsonWriter *w, const SpecialTokenIds *ids, bool with_null) {
    if (!ids->eos_is_list) {
        key_token_id(w, "eos_token_id", ids->num_eos > 0, ids->eos[0], with_null);
        return;
    }
    jw_key(w, "eos_token_id");
    jw_begin_array(w);
    for (int i = 0; i < ids->num_eos; i++) jw_int(w, ids->eos[i]);
    jw_end_array(w);
}

static void write_rope_scaling(JsonWriter *w, const RopeScaling *rs) {
    jw_key(w, "rope_scaling");
    if (!rs->enabled) {
        jw_null(w);
        return;
    }
    jw_begin_object(w);
    key_double(w, "factor", rs->factor);
    key_double(w, "high_freq_factor", rs->high_freq_factor);
    key_double(w, "low_freq_factor", rs->low_freq_factor);
    key_int(w, "original_max_position_embeddings", rs->original_max_position_embeddings);
    key_string(w, "rope_type", "llama3");
    jw_end_object(w);
}

/* Qwen3-MoE's dense layers, the MoE layers' complement. */
static void write_mlp_only_layers(JsonWriter *w, const ModelConfig *cfg) {
    jw_key(w, "mlp_only_layers");
    jw_begin_array(w);
    for (int l = 0; l < cfg->num_layers; l++)
        if (!model_layer_is_moe(cfg, l)) jw_int(w, l);
    jw_end_array(w);
}

char *hf_config_to_json(const ModelConfig *cfg, const char *torch_dtype) {
    const bool qwen = cfg->family == FAMILY_QWEN2 || cfg->family == FAMILY_QWEN3 || cfg->family == FAMILY_QWEN3_MOE;
    const bool moe = model_family_is_moe(cfg->family);
    const bool qwen_moe = cfg->family == FAMILY_QWEN3_MOE, mixtral = cfg->family == FAMILY_MIXTRAL;
    const MoeConfig *m = &cfg->moe; /* MoE keys in the Hub's spelling, in sorted place */
    const int head_dim = cfg->head_dim ? cfg->head_dim : cfg->hidden_size / cfg->num_attention_heads;
    JsonWriter w;
    jw_init(&w, 2);
    jw_begin_object(&w);
    jw_key(&w, "architectures");
    jw_begin_array(&w);
    jw_string(&w, hf_architecture(cfg->family));
    jw_end_array(&w);
    if (cfg->family != FAMILY_QWEN2) key_bool(&w, "attention_bias", false);
    key_double(&w, "attention_dropout", 0.0);
    key_token_id(&w, "bos_token_id", cfg->token_ids.has_bos, cfg->token_ids.bos, true);
    if (qwen_moe) key_int(&w, "decoder_sparse_step", 1);
    key_eos_token_id(&w, &cfg->token_ids, true);
    key_int(&w, "head_dim", head_dim);
    key_string(&w, "hidden_act", "silu");
    key_int(&w, "hidden_size", cfg->hidden_size);
    key_double(&w, "initializer_range", cfg->init_std > 0 ? cfg->init_std : 0.02);
    key_int(&w, "intermediate_size", cfg->intermediate_size);
    key_int(&w, "max_position_embeddings", cfg->max_position_embeddings);
    if (qwen) key_int(&w, "max_window_layers", cfg->num_layers);
    if (cfg->family == FAMILY_LLAMA) key_bool(&w, "mlp_bias", false);
    if (qwen_moe) write_mlp_only_layers(&w, cfg);
    key_string(&w, "model_type", hf_model_type(cfg->family));
    if (qwen_moe) {
        key_int(&w, "moe_intermediate_size", m->moe_intermediate_size);
        key_bool(&w, "norm_topk_prob", m->norm_topk_prob);
    }
    key_int(&w, "num_attention_heads", cfg->num_attention_heads);
    if (qwen_moe) key_int(&w, "num_experts", m->num_experts);
    if (moe) key_int(&w, "num_experts_per_tok", m->num_experts_per_tok);
    key_int(&w, "num_hidden_layers", cfg->num_layers);
    key_int(&w, "num_key_value_heads", cfg->num_key_value_heads);
    if (mixtral) key_int(&w, "num_local_experts", m->num_experts);
    if (moe) key_bool(&w, "output_router_logits", false);
    key_token_id(&w, "pad_token_id", cfg->token_ids.has_pad, cfg->token_ids.pad, true);
    key_double(&w, "rms_norm_eps", cfg->rms_norm_eps);
    write_rope_scaling(&w, &cfg->rope_scaling);
    key_double(&w, "rope_theta", cfg->rope_theta);
    if (moe) key_double(&w, "router_aux_loss_coef", m->aux_loss_coeff);
    if (mixtral) key_double(&w, "router_jitter_noise", 0.0);
    if (qwen || cfg->family == FAMILY_MIXTRAL) {
        jw_key(&w, "sliding_window");
        jw_null(&w);
    }
    key_bool(&w, "tie_word_embeddings", cfg->tie_word_embeddings);
    key_string(&w, "torch_dtype", torch_dtype);
    key_bool(&w, "use_cache", true);
    if (qwen) key_bool(&w, "use_sliding_window", false);
    key_int(&w, "vocab_size", cfg->vocab_size);
    jw_end_object(&w);
    jw_raw(&w, "\n", 1);
    return w.data; /* the writer's buffer now belongs to the caller */
}

char *hf_generation_config_json(const ModelConfig *cfg) {
    const SpecialTokenIds *ids = &cfg->token_ids;
    JsonWriter w;
    jw_init(&w, 2);
    jw_begin_object(&w);
    key_bool(&w, "_from_model_config", true);
    key_token_id(&w, "bos_token_id", ids->has_bos, ids->bos, false);
    if (ids->num_eos > 0) key_eos_token_id(&w, ids, false);
    key_bool(&w, "output_attentions", false);
    key_bool(&w, "output_hidden_states", false);
    key_token_id(&w, "pad_token_id", ids->has_pad, ids->pad, false);
    key_bool(&w, "use_cache", true);
    jw_end_object(&w);
    jw_raw(&w, "\n", 1);
    return w.data;
}
