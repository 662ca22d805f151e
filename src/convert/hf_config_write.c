/* hf_config_write.c: a ModelConfig as a transformers config.json (keys
 * sorted and indented as transformers' save_pretrained writes them), and the
 * checks that a config has a faithful transformers counterpart. */
#include <stdio.h>
#include <string.h>

#include "../core/error.h"
#include "../core/json.h"
#include "hf_config.h"

const char *hf_model_type(ModelFamily family) {
    switch (family) {
    case FAMILY_LLAMA: return "llama";
    case FAMILY_QWEN2: return "qwen2";
    case FAMILY_QWEN3: return "qwen3";
    default: return NULL;
    }
}

const char *hf_architecture(ModelFamily family) {
    switch (family) {
    case FAMILY_LLAMA: return "LlamaForCausalLM";
    case FAMILY_QWEN2: return "Qwen2ForCausalLM";
    case FAMILY_QWEN3: return "Qwen3ForCausalLM";
    default: return NULL;
    }
}

int hf_config_check_exportable(const ModelConfig *cfg, char *err, size_t errlen) {
    const char *family = model_family_name(cfg->family);
    if (!hf_model_type(cfg->family)) {
        mt_set_error(err, errlen, "model.family: %s cannot be converted yet (supported: llama, qwen2, qwen3)", family);
        return -1;
    }
    if (cfg->family == FAMILY_LLAMA && cfg->attention_bias) {
        mt_set_error(err, errlen,
                     "model.attention_bias: a llama model with q/k/v biases has no transformers counterpart "
                     "(LlamaForCausalLM's attention_bias also adds an o_proj bias)");
        return -1;
    }
    if (cfg->family == FAMILY_QWEN3 && cfg->attention_bias) {
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
    if (cfg->family != FAMILY_QWEN3 && cfg->qk_norm) {
        mt_set_error(err, errlen, "model.qk_norm: %s in transformers has no q/k norm (qwen3 has)", family);
        return -1;
    }
    if (cfg->family == FAMILY_QWEN3 && !cfg->qk_norm) {
        mt_set_error(err, errlen, "model.qk_norm: Qwen3ForCausalLM always has q/k norms; a qwen3 model without them "
                                  "cannot be written");
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

char *hf_config_to_json(const ModelConfig *cfg, const char *torch_dtype) {
    const bool qwen = cfg->family != FAMILY_LLAMA;
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
    key_int(&w, "head_dim", head_dim);
    key_string(&w, "hidden_act", "silu");
    key_int(&w, "hidden_size", cfg->hidden_size);
    key_double(&w, "initializer_range", cfg->init_std > 0 ? cfg->init_std : 0.02);
    key_int(&w, "intermediate_size", cfg->intermediate_size);
    key_int(&w, "max_position_embeddings", cfg->max_position_embeddings);
    if (qwen) key_int(&w, "max_window_layers", cfg->num_layers);
    if (!qwen) key_bool(&w, "mlp_bias", false);
    key_string(&w, "model_type", hf_model_type(cfg->family));
    key_int(&w, "num_attention_heads", cfg->num_attention_heads);
    key_int(&w, "num_hidden_layers", cfg->num_layers);
    key_int(&w, "num_key_value_heads", cfg->num_key_value_heads);
    key_double(&w, "rms_norm_eps", cfg->rms_norm_eps);
    write_rope_scaling(&w, &cfg->rope_scaling);
    key_double(&w, "rope_theta", cfg->rope_theta);
    if (qwen) {
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
