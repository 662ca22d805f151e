/* hf_config.c: reading a Hugging Face config.json into a ModelConfig, with
 * transformers' defaults per model_type and clear refusals for settings our
 * model cannot reproduce. */
#include "hf_config.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../core/fs.h"
#include "../core/json.h"
#include "../model/moe_layer.h"
#include "hf_families.h"

typedef struct Reader {
    const char *label;
    const JsonValue *root;
    char *err;
    size_t errlen;
    const HfDefaults *defaults; /* the family's, once model_type is read */
} Reader;

/* The member `key` of obj, NULL when absent or null (transformers treats null as unset). */
static const JsonValue *member(const JsonValue *obj, const char *key) {
    const JsonValue *v = json_get(obj, key);
    return v && v->type != JSON_NULL ? v : NULL;
}

static int bad(Reader *r, const char *key, const char *expected, const JsonValue *found) {
    mt_set_error(r->err, r->errlen, "%s: %s: expected %s, found %s", r->label, key, expected,
                 found ? json_type_name(found->type) : "nothing");
    return -1;
}

/* An integer in [min, max]; `fallback` when absent unless required (< 0 fallback = required). */
static int read_int_in(Reader *r, const JsonValue *obj, const char *key, int min, int max, long fallback, int *out) {
    const JsonValue *v = member(obj, key);
    if (!v) {
        if (fallback < 0) {
            mt_set_error(r->err, r->errlen, "%s: missing required key \"%s\"", r->label, key);
            return -1;
        }
        *out = (int)fallback;
        return 0;
    }
    int64_t value;
    if (json_as_int64(v, &value) != 0 || value < min || value > max) {
        char expected[64];
        snprintf(expected, sizeof expected, "an integer >= %d", min);
        if (v->type == JSON_NUMBER && v->number > max) {
            mt_set_error(r->err, r->errlen, "%s: %s: %.15g is too large (expected at most %d)", r->label, key,
                         v->number, max);
            return -1;
        }
        if (v->type == JSON_NUMBER) {
            mt_set_error(r->err, r->errlen, "%s: %s: expected %s, found %g", r->label, key, expected, v->number);
            return -1;
        }
        return bad(r, key, expected, v);
    }
    *out = (int)value;
    return 0;
}

static int read_int(Reader *r, const JsonValue *obj, const char *key, int min, long fallback, int *out) {
    return read_int_in(r, obj, key, min, INT_MAX, fallback, out);
}

static int read_double(Reader *r, const JsonValue *obj, const char *key, double fallback, double *out) {
    const JsonValue *v = member(obj, key);
    if (!v) {
        *out = fallback;
        return 0;
    }
    if (v->type != JSON_NUMBER || !isfinite(v->number)) return bad(r, key, "a finite number", v);
    *out = v->number;
    return 0;
}

static int read_bool(Reader *r, const JsonValue *obj, const char *key, bool fallback, bool *out) {
    const JsonValue *v = member(obj, key);
    if (!v) {
        *out = fallback;
        return 0;
    }
    if (v->type != JSON_BOOL) return bad(r, key, "true or false", v);
    *out = v->boolean;
    return 0;
}

static int refuse_true(Reader *r, const char *key, const char *why) {
    bool value;
    if (read_bool(r, r->root, key, false, &value) != 0) return -1;
    if (!value) return 0;
    mt_set_error(r->err, r->errlen, "%s: %s: true is not supported (%s)", r->label, key, why);
    return -1;
}

/* RoPE scaling from a rope_scaling / rope_parameters object (`where` names it). */
static int read_rope_scaling(Reader *r, const JsonValue *obj, const char *where, RopeScaling *out) {
    memset(out, 0, sizeof *out);
    if (obj->type != JSON_OBJECT) return bad(r, where, "an object", obj);
    const JsonValue *type = member(obj, "rope_type");
    if (!type) type = member(obj, "type");
    if (!type || (type->type == JSON_STRING && strcmp(type->string, "default") == 0)) return 0;
    if (type->type != JSON_STRING) return bad(r, where, "a \"rope_type\" string", type);
    if (strcmp(type->string, "llama3") != 0) {
        mt_set_error(r->err, r->errlen, "%s: %s: rope_type '%s' is not supported (supported: default, llama3)",
                     r->label, where, type->string);
        return -1;
    }
    char key[128];
    const char *fields[] = {"factor", "low_freq_factor", "high_freq_factor"};
    double *targets[] = {&out->factor, &out->low_freq_factor, &out->high_freq_factor};
    for (int i = 0; i < 3; i++) {
        snprintf(key, sizeof key, "%s.%s", where, fields[i]);
        const JsonValue *v = member(obj, fields[i]);
        if (!v || v->type != JSON_NUMBER || !(v->number > 0) || !isfinite(v->number))
            return bad(r, key, "a positive number (llama3 rope scaling needs it)", v);
        *targets[i] = v->number;
    }
    snprintf(key, sizeof key, "%s.original_max_position_embeddings", where);
    const JsonValue *v = member(obj, "original_max_position_embeddings");
    int64_t original;
    if (!v || json_as_int64(v, &original) != 0 || original <= 0 || original > INT_MAX)
        return bad(r, key, "a positive integer (llama3 rope scaling needs it)", v);
    out->original_max_position_embeddings = (int)original;
    if (!(out->high_freq_factor > out->low_freq_factor)) {
        mt_set_error(r->err, r->errlen, "%s: %s: high_freq_factor (%g) must be greater than low_freq_factor (%g)",
                     r->label, where, out->high_freq_factor, out->low_freq_factor);
        return -1;
    }
    out->enabled = true;
    return 0;
}

/* rope_theta and scaling, from rope_parameters (transformers 5) or
 * rope_theta + rope_scaling (transformers 4). */
static int read_rope(Reader *r, ModelConfig *cfg) {
    const JsonValue *params = member(r->root, "rope_parameters");
    if (params) {
        if (params->type != JSON_OBJECT) return bad(r, "rope_parameters", "an object", params);
        double top;
        if (read_double(r, r->root, "rope_theta", r->defaults->rope_theta, &top) != 0) return -1;
        const JsonValue *theta = member(params, "rope_theta");
        if (theta && (theta->type != JSON_NUMBER || !isfinite(theta->number)))
            return bad(r, "rope_parameters.rope_theta", "a finite number", theta);
        cfg->rope_theta = theta ? theta->number : top;
        if (read_rope_scaling(r, params, "rope_parameters", &cfg->rope_scaling) != 0) return -1;
    } else {
        if (read_double(r, r->root, "rope_theta", r->defaults->rope_theta, &cfg->rope_theta) != 0) return -1;
        const JsonValue *scaling = member(r->root, "rope_scaling");
        memset(&cfg->rope_scaling, 0, sizeof cfg->rope_scaling);
        if (scaling && read_rope_scaling(r, scaling, "rope_scaling", &cfg->rope_scaling) != 0) return -1;
    }
    if (!(cfg->rope_theta > 0)) {
        mt_set_error(r->err, r->errlen, "%s: rope_theta: expected a positive number, found %g", r->label,
                     cfg->rope_theta);
        return -1;
    }
    return 0;
}

static int read_family(Reader *r, ModelFamily *family) {
    const JsonValue *type = member(r->root, "model_type");
    char supported[256];
    hf_family_list(supported, sizeof supported);
    if (!type || type->type != JSON_STRING) {
        mt_set_error(r->err, r->errlen, "%s: missing \"model_type\" (supported: %s)", r->label, supported);
        return -1;
    }
    const HfFamily *known = hf_family_by_type(type->string);
    if (!known) {
        mt_set_error(r->err, r->errlen, "%s: model_type '%s' is not a supported family (supported: %s)", r->label,
                     type->string, supported);
        return -1;
    }
    *family = known->family;
    r->defaults = &known->defaults;
    return 0;
}

/* The MoE keys: Mixtral's num_local_experts (every layer sparse, top-k
 * renormalised, experts of intermediate_size); Qwen3-MoE's num_experts (or
 * num_local_experts, as transformers 5 writes it), moe_intermediate_size,
 * norm_topk_prob, and decoder_sparse_step / mlp_only_layers for which layers
 * are sparse (layer i when (i + 1) % step == 0 and i is not listed). */
static int read_moe(Reader *r, ModelConfig *cfg) {
    MoeConfig *m = &cfg->moe;
    const JsonValue *root = r->root;
    m->score_function = SCORE_SOFTMAX;
    m->load_balancing = LB_AUX_LOSS;
    m->layer_freq = 1;
    m->bias_update_rate = 1e-3;
    /* Qwen3-MoE's own key is num_experts (transformers 5 may write num_local_experts), Mixtral's num_local_experts */
    const char *experts_key = member(root, "num_experts")         ? "num_experts"
                              : member(root, "num_local_experts") ? "num_local_experts"
                              : cfg->family == FAMILY_MIXTRAL     ? "num_local_experts"
                                                                  : "num_experts";
    if (read_int_in(r, root, experts_key, 1, MT_MOE_MAX_EXPERTS, -1, &m->num_experts) ||
        read_int_in(r, root, "num_experts_per_tok", 1, MT_MOE_MAX_TOPK, r->defaults->num_experts_per_tok,
                    &m->num_experts_per_tok) ||
        read_double(r, root, "router_aux_loss_coef", 0.001, &m->aux_loss_coeff))
        return -1;
    if (m->num_experts_per_tok > m->num_experts) {
        mt_set_error(r->err, r->errlen, "%s: num_experts_per_tok: expected at most %s (%d), found %d", r->label,
                     experts_key, m->num_experts, m->num_experts_per_tok);
        return -1;
    }
    double jitter = 0.0;
    if (read_double(r, root, "router_jitter_noise", 0.0, &jitter) != 0) return -1;
    if (jitter != 0.0) /* transformers multiplies the router's input by it in training only (as PEFT's lora_dropout) */
        mt_warn("%s: router_jitter_noise %g is read as 0: megatrain's router has no jitter (transformers applies it in "
                "training only, so the model computes the same; a run here trains without it)", r->label, jitter);
    if (cfg->family == FAMILY_MIXTRAL) {
        m->moe_intermediate_size = cfg->intermediate_size;
        m->norm_topk_prob = true;
        return 0;
    }
    int step = 1;
    if (read_int(r, root, "moe_intermediate_size", 1, -1, &m->moe_intermediate_size) ||
        read_bool(r, root, "norm_topk_prob", false, &m->norm_topk_prob) ||
        read_int(r, root, "decoder_sparse_step", 1, 1, &step))
        return -1;
    const JsonValue *dense = member(root, "mlp_only_layers");
    if (dense && dense->type != JSON_ARRAY) return bad(r, "mlp_only_layers", "a list of layer indices", dense);
    if (step == 1 && (!dense || dense->count == 0)) return 0;
    m->layer_mask_given = true;
    for (int i = 0; i < cfg->num_layers && i < MT_MAX_LAYERS; i++) m->layer_mask[i] = (i + 1) % step == 0;
    for (size_t i = 0; dense && i < dense->count; i++) {
        int64_t layer;
        if (json_as_int64(dense->items[i], &layer) != 0)
            return bad(r, "mlp_only_layers", "layer indices (integers)", dense->items[i]);
        if (layer < 0 || layer >= cfg->num_layers) {
            mt_set_error(r->err, r->errlen, "%s: mlp_only_layers: expected layer indices from 0 to num_hidden_layers - 1 "
                         "(%d), found %lld", r->label, cfg->num_layers - 1, (long long)layer);
            return -1;
        }
        m->layer_mask[layer] = 0;
    }
    return 0;
}

/* One token id: 0 when absent or null (*has false), -1 when malformed. An id
 * outside [0, vocab_size) is dropped with a warning (old configs say
 * pad_token_id: -1 for none). */
static int read_token_id(Reader *r, const JsonValue *v, const char *key, int vocab_size, bool *has, int *id) {
    *has = false;
    if (!v || v->type == JSON_NULL) return 0;
    int64_t value;
    if (json_as_int64(v, &value) != 0) return bad(r, key, "a token id (an integer) or null", v);
    if (value < 0 || value >= vocab_size) {
        mt_warn("%s: %s: %lld is not a token id of this vocabulary (0..%d); it is left out", r->label, key,
                (long long)value, vocab_size - 1);
        return 0;
    }
    *has = true;
    *id = (int)value;
    return 0;
}

/* bos_token_id, eos_token_id (an id or a list of ids: Llama 3.1's
 * [128001, 128008, 128009]) and pad_token_id. */
static int read_token_ids(Reader *r, int vocab_size, SpecialTokenIds *ids) {
    memset(ids, 0, sizeof *ids);
    if (read_token_id(r, member(r->root, "bos_token_id"), "bos_token_id", vocab_size, &ids->has_bos, &ids->bos) ||
        read_token_id(r, member(r->root, "pad_token_id"), "pad_token_id", vocab_size, &ids->has_pad, &ids->pad))
        return -1;
    const JsonValue *eos = member(r->root, "eos_token_id");
    if (!eos || eos->type != JSON_ARRAY) {
        bool has = false;
        if (read_token_id(r, eos, "eos_token_id", vocab_size, &has, &ids->eos[0]) != 0) return -1;
        ids->num_eos = has;
        return 0;
    }
    if (eos->count > MT_MAX_EOS_TOKEN_IDS) {
        mt_set_error(r->err, r->errlen, "%s: eos_token_id: a list of %zu ids, megatrain keeps at most %d", r->label,
                     eos->count, MT_MAX_EOS_TOKEN_IDS);
        return -1;
    }
    ids->eos_is_list = true;
    for (size_t i = 0; i < eos->count; i++) {
        bool has = false;
        if (read_token_id(r, eos->items[i], "eos_token_id", vocab_size, &has, &ids->eos[ids->num_eos]) != 0)
            return -1;
        ids->num_eos += has;
    }
    return 0;
}

/* Shape rules the dense model needs (model_config_validate says the same). */
static int check_shapes(Reader *r, const ModelConfig *cfg) {
    if (cfg->num_attention_heads % cfg->num_key_value_heads != 0) {
        mt_set_error(r->err, r->errlen, "%s: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)",
                     r->label, cfg->num_attention_heads, cfg->num_key_value_heads);
        return -1;
    }
    if (cfg->head_dim <= 0 || cfg->head_dim % 2 != 0) {
        mt_set_error(r->err, r->errlen, "%s: head_dim: expected a positive even integer, found %d", r->label,
                     cfg->head_dim);
        return -1;
    }
    if ((long)cfg->num_attention_heads * cfg->head_dim > INT_MAX / 2) {
        mt_set_error(r->err, r->errlen, "%s: num_attention_heads x head_dim (%d x %d) is too large", r->label,
                     cfg->num_attention_heads, cfg->head_dim);
        return -1;
    }
    return 0;
}

/* The weights' dtype as config.json says it (transformers 5's dtype, or torch_dtype), for the export back: float32,
 * bfloat16 or float16; auto (fp32) when absent or anything else (it changes no computation here). */
static void read_export_dtype(const JsonValue *root, ExportDtype *out) {
    const JsonValue *v = member(root, "dtype");
    if (!v || v->type != JSON_STRING) v = member(root, "torch_dtype");
    static const char *const torch_names[] = {[EXPORT_FP32] = "float32", [EXPORT_BF16] = "bfloat16",
                                              [EXPORT_FP16] = "float16"};
    *out = EXPORT_AUTO;
    for (int d = EXPORT_FP32; d <= EXPORT_FP16 && v && v->type == JSON_STRING; d++)
        if (strcmp(v->string, torch_names[d]) == 0) *out = (ExportDtype)d;
}

int hf_config_parse(const char *text, size_t len, const char *label, ModelConfig *out, char *err, size_t errlen) {
    char why[256];
    JsonValue *root = json_parse(text, len, why, sizeof why);
    if (!root) {
        mt_set_error(err, errlen, "%s: %s", label, why);
        return -1;
    }
    Reader r = {label, root, err, errlen, NULL};
    ModelConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    int status = -1;
    if (root->type != JSON_OBJECT) {
        mt_set_error(err, errlen, "%s: expected a JSON object, found %s", label, json_type_name(root->type));
        goto done;
    }
    if (read_family(&r, &cfg.family) != 0) goto done;
    const bool qwen = cfg.family == FAMILY_QWEN2 || cfg.family == FAMILY_QWEN3 || cfg.family == FAMILY_QWEN3_MOE;
    const HfDefaults *defaults = r.defaults;
    if (read_int(&r, root, "hidden_size", 1, -1, &cfg.hidden_size) ||
        read_int(&r, root, "intermediate_size", 1, -1, &cfg.intermediate_size) ||
        read_int_in(&r, root, "num_hidden_layers", 1, MT_MAX_LAYERS, -1, &cfg.num_layers) ||
        read_int(&r, root, "num_attention_heads", 1, -1, &cfg.num_attention_heads) ||
        read_int(&r, root, "vocab_size", 1, -1, &cfg.vocab_size) ||
        read_int(&r, root, "num_key_value_heads", 1,
                 /* absent: the class's default; null: the heads, as the config classes that accept a null read it */
                 defaults->num_key_value_heads && !json_get(root, "num_key_value_heads") ? defaults->num_key_value_heads
                                                                                         : cfg.num_attention_heads,
                 &cfg.num_key_value_heads) ||
        read_int(&r, root, "max_position_embeddings", 1, defaults->max_position_embeddings,
                 &cfg.max_position_embeddings))
        goto done;
    /* transformers: Qwen3Config defaults head_dim to 128; the others (Qwen3MoeConfig too) use hidden / heads. */
    long head_dim = defaults->head_dim ? defaults->head_dim : cfg.hidden_size / cfg.num_attention_heads;
    if (!member(root, "head_dim") && !defaults->head_dim && cfg.hidden_size % cfg.num_attention_heads != 0) {
        mt_set_error(err, errlen, "%s: head_dim is not given and hidden_size (%d) is not a multiple of "
                     "num_attention_heads (%d)", label, cfg.hidden_size, cfg.num_attention_heads);
        goto done;
    }
    if (read_int(&r, root, "head_dim", 1, head_dim, &cfg.head_dim) != 0) goto done;
    if (read_rope(&r, &cfg) != 0) goto done;
    if (read_token_ids(&r, cfg.vocab_size, &cfg.token_ids) != 0) goto done;
    if (read_double(&r, root, "rms_norm_eps", defaults->rms_norm_eps, &cfg.rms_norm_eps) != 0) goto done;
    if (!(cfg.rms_norm_eps >= 0)) {
        mt_set_error(err, errlen, "%s: rms_norm_eps: expected a number >= 0, found %g", label, cfg.rms_norm_eps);
        goto done;
    }
    read_export_dtype(root, &cfg.export_dtype);
    if (read_double(&r, root, "initializer_range", 0.02, &cfg.init_std) != 0) goto done;
    if (!(cfg.init_std > 0)) cfg.init_std = 0.02;
    if (read_bool(&r, root, "tie_word_embeddings", false, &cfg.tie_word_embeddings) != 0) goto done;
    const JsonValue *act = member(root, "hidden_act");
    if (act && (act->type != JSON_STRING || strcmp(act->string, "silu") != 0)) {
        mt_set_error(err, errlen, "%s: hidden_act: only \"silu\" is supported, found %s%s%s", label,
                     act->type == JSON_STRING ? "'" : "", act->type == JSON_STRING ? act->string : json_type_name(act->type),
                     act->type == JSON_STRING ? "'" : "");
        goto done;
    }
    if (cfg.family == FAMILY_QWEN2) {
        cfg.attention_bias = true; /* Qwen2 always has q, k, v biases, whatever attention_bias says */
    } else if (refuse_true(&r, "attention_bias", "transformers then also puts a bias on o_proj, which megatrain's "
                                                 "model does not have") != 0) {
        goto done;
    }
    if (refuse_true(&r, "mlp_bias", "megatrain's MLP has no biases") != 0) goto done;
    if (qwen && refuse_true(&r, "use_sliding_window", "megatrain has no sliding-window attention") != 0) goto done;
    if (cfg.family == FAMILY_MIXTRAL && member(root, "sliding_window")) {
        mt_set_error(err, errlen, "%s: sliding_window: megatrain has no sliding-window attention; expected null", label);
        goto done;
    }
    cfg.qk_norm = cfg.family == FAMILY_QWEN3 || cfg.family == FAMILY_QWEN3_MOE;
    if (model_family_is_moe(cfg.family) && read_moe(&r, &cfg) != 0) goto done;
    if (check_shapes(&r, &cfg) != 0) goto done;
    *out = cfg;
    status = 0;
done:
    json_free(root);
    return status;
}

int hf_config_read(const char *path, ModelConfig *out, char *err, size_t errlen) {
    size_t n = 0; /* a regular file of at most 64 MiB: never blocks on a FIFO */
    char *text = mt_read_file(path, (size_t)64 << 20, &n, err, errlen);
    if (!text) return -1;
    const int status = hf_config_parse(text, n, path, out, err, errlen);
    free(text);
    return status;
}
