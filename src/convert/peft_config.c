/* peft_config.c: PEFT's adapter_config.json read into a PeftConfig and
 * written from one (peft_config.h). */
#include "peft_config.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../core/error.h"
#include "../core/fs.h"
#include "../core/json.h"

typedef struct Reader {
    const char *label;
    const JsonValue *root;
    char *err;
    size_t errlen;
} Reader;

/* The member `key` of the root, NULL when absent or null (PEFT's unset). */
static const JsonValue *member(const Reader *r, const char *key) {
    const JsonValue *v = json_get(r->root, key);
    return v && v->type != JSON_NULL ? v : NULL;
}

static int bad(const Reader *r, const char *key, const char *expected, const JsonValue *found) {
    char what[96];
    if (found && found->type == JSON_STRING) snprintf(what, sizeof what, "\"%.80s\"", found->string);
    else if (found && found->type == JSON_NUMBER) snprintf(what, sizeof what, "%.15g", found->number);
    else if (found && found->type == JSON_BOOL) snprintf(what, sizeof what, "%s", found->boolean ? "true" : "false");
    else snprintf(what, sizeof what, "%s", found ? json_type_name(found->type) : "nothing");
    mt_set_error(r->err, r->errlen, "%s: %s: expected %s, found %s", r->label, key, expected, what);
    return -1;
}

/* A positive finite number, `fallback` (PEFT's default) when absent. */
static int read_positive(const Reader *r, const char *key, double fallback, double *out) {
    const JsonValue *v = member(r, key);
    if (!v) return *out = fallback, 0;
    if (v->type != JSON_NUMBER || !isfinite(v->number) || v->number <= 0) return bad(r, key, "a positive number", v);
    *out = v->number;
    return 0;
}

/* target_modules: a list of entries (lora_target_match: names, or paths as PEFT saves "all-linear" expanded), or
 * "all-linear" in any case (every projection but the output layer, as PEFT reads it for a causal LM). With the
 * base's num_layers (> 0), a projection listed for some layers must be listed for all of them. */
static int read_targets(const Reader *r, int num_layers, unsigned *targets) {
    const JsonValue *v = member(r, "target_modules");
    if (v && v->type == JSON_STRING) {
        if (strcasecmp(v->string, "all-linear") != 0)
            return bad(r, "target_modules", "a list of module names or \"all-linear\" (a regular expression is not "
                                            "read: list the modules it matches)", v);
        *targets = LORA_ALL_TARGETS;
        return 0;
    }
    if (!v || v->type != JSON_ARRAY || v->count == 0)
        return bad(r, "target_modules", "a list of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (or "
                                        "their paths), or \"all-linear\"", v);
    unsigned char listed[LORA_NUM_TARGETS][MT_MAX_LAYERS] = {{0}}; /* [t][L]: projection t of layer L is listed */
    unsigned every = 0, some = 0;
    for (size_t i = 0; i < v->count; i++) {
        const JsonValue *item = v->items[i];
        LoraTarget t;
        long layer;
        char key[64];
        snprintf(key, sizeof key, "target_modules[%zu]", i);
        if (item->type != JSON_STRING || strlen(item->string) != item->string_len ||
            lora_target_match(item->string, &t, &layer) != 0)
            return bad(r, key, "a projection LoRA adapts in megatrain, by name (q_proj, k_proj, v_proj, o_proj, "
                               "gate_proj, up_proj, down_proj) or path (mlp.down_proj, model.layers.0.mlp.down_proj)",
                       item);
        if (layer < 0) {
            every |= 1u << t;
            continue;
        }
        if (layer >= MT_MAX_LAYERS || (num_layers > 0 && layer >= num_layers)) {
            char expected[96];
            snprintf(expected, sizeof expected, "a layer of the base model (it has %d)",
                     num_layers > 0 ? num_layers : MT_MAX_LAYERS);
            return bad(r, key, expected, item);
        }
        listed[t][layer] = 1;
        some |= 1u << t;
    }
    for (int t = 0; t < LORA_NUM_TARGETS; t++) {
        if (!(some & 1u << t) || (every & 1u << t) || num_layers <= 0) continue;
        int count = 0;
        for (int l = 0; l < num_layers; l++) count += listed[t][l];
        if (count < num_layers) {
            mt_set_error(r->err, r->errlen, "%s: target_modules: lists %s in %d of the base model's %d layers: "
                         "megatrain adapts a projection in every layer or in none (as layers_to_transform: null); "
                         "or is the base model not the one the adapter was trained on?",
                         r->label, lora_target_name((LoraTarget)t), count, num_layers);
            return -1;
        }
    }
    *targets = every | some;
    return 0;
}

/* The keys of PEFT's LoraConfig that megatrain reads (peft_config_parse), and those that do not change what saved
 * adapters compute; any other key must be at a default that changes nothing (default_value), else it is refused,
 * with the reason below where one is known: PEFT adds keys each release, and a LoRA variant's key left unread
 * would convert its adapters as a plain LoRA they are not. */
static const char *const read_keys[] = {"peft_type", "task_type", "r", "lora_alpha", "target_modules", "lora_dropout",
                                        "bias", "base_model_name_or_path", "init_lora_weights", NULL};
static const char *const neutral_keys[] = {"peft_version", "inference_mode", "revision", "auto_mapping",
                                           "layers_pattern", "megatron_core", "qalora_group_size",
                                           "ensure_weight_tying", "eva_config", "corda_config", NULL};
/* keys whose default PEFT writes as {} or [] (for any other key {} may switch a variant on: PEFT makes a default
 * config of it) */
static const char *const empty_default_keys[] = {"loftq_config", "rank_pattern", "alpha_pattern", "modules_to_save",
                                                 "exclude_modules", "target_parameters", NULL};
static const struct {
    const char *key, *why;
} default_keys[] = {
    {"use_rslora", "rank-stabilised LoRA scales by lora_alpha / sqrt(r), megatrain by lora_alpha / r"},
    {"use_dora", "DoRA's magnitude vectors are not implemented"},
    {"fan_in_fan_out", "weights stored transposed, as GPT-2's Conv1D, are not a family megatrain has"},
    {"lora_bias", "a bias on lora_B is not implemented"},
    {"use_qalora", "quantization-aware LoRA is not implemented"},
    {"rank_pattern", "every adapter has rank r in megatrain: a pattern may only repeat r"},
    {"alpha_pattern", "every adapter has lora_alpha in megatrain: a pattern may only repeat lora_alpha"},
    {"layers_to_transform", "megatrain adapts every layer: a list may only name them all"},
    {"layer_replication", "megatrain does not replicate layers"},
    {"modules_to_save", "modules trained whole beside the adapters are not read"},
    {"exclude_modules", "megatrain adapts every layer's target modules"},
    {"target_parameters", "megatrain adapts modules, not parameters"},
    {"trainable_token_indices", "trainable tokens are not implemented"},
    {"alora_invocation_tokens", "activated LoRA applies the adapters only after its invocation tokens"},
    {"megatron_config", "Megatron-parallel PEFT layers are not read"},
    {NULL, NULL},
};

static bool listed_in(const char *const *keys, const char *key) {
    for (; *keys; keys++)
        if (strcmp(*keys, key) == 0) return true;
    return false;
}

/* What PEFT leaves a feature it does not use at: null or false, and for the keys that default to one, {} or [] */
static bool default_value(const char *key, const JsonValue *v) {
    return v->type == JSON_NULL || (v->type == JSON_BOOL && !v->boolean) ||
           ((v->type == JSON_ARRAY || v->type == JSON_OBJECT) && v->count == 0 && listed_in(empty_default_keys, key));
}

/* Settings that say what megatrain does anyway: a rank_pattern (alpha_pattern) giving every module it names rank r
 * (lora_alpha), and layers_to_transform listing every layer of the base (num_layers of them; any list of layer
 * indices while num_layers is unknown, 0: the caller reads the file again once it knows the base). */
static bool no_op_value(const char *key, const JsonValue *v, const PeftConfig *peft, int num_layers) {
    const bool ranks = strcmp(key, "rank_pattern") == 0;
    if ((ranks || strcmp(key, "alpha_pattern") == 0) && v->type == JSON_OBJECT) {
        for (size_t i = 0; i < v->count; i++) {
            const JsonValue *x = v->members[i].value;
            if (x->type != JSON_NUMBER || x->number != (ranks ? (double)peft->rank : peft->alpha)) return false;
        }
        return true;
    }
    if (strcmp(key, "layers_to_transform") != 0 || num_layers > MT_MAX_LAYERS) return false;
    const int bound = num_layers > 0 ? num_layers : MT_MAX_LAYERS; /* unknown: the caller reads it again with them */
    const size_t n = v->type == JSON_ARRAY ? v->count : 1;
    unsigned char seen[MT_MAX_LAYERS] = {0};
    int layers = 0;
    for (size_t i = 0; i < n; i++) {
        const JsonValue *x = v->type == JSON_ARRAY ? v->items[i] : v;
        if (x->type != JSON_NUMBER || x->number != floor(x->number) || x->number < 0 || x->number >= bound)
            return false;
        layers += !seen[(int)x->number];
        seen[(int)x->number] = 1;
    }
    return num_layers <= 0 || layers == num_layers;
}

/* Every key that is neither read nor neutral at its default; keys repeated count as their last (json_get's). */
static int check_other_keys(const Reader *r, const PeftConfig *peft, int num_layers) {
    for (size_t i = 0; i < r->root->count; i++) {
        const JsonMember *m = &r->root->members[i];
        if (strlen(m->key) != m->key_len || listed_in(read_keys, m->key) || listed_in(neutral_keys, m->key) ||
            json_get(r->root, m->key) != m->value || default_value(m->key, m->value) ||
            no_op_value(m->key, m->value, peft, num_layers))
            continue;
        const char *why = "a setting this reader does not know: a LoRA variant, or an option newer than it";
        for (int k = 0; default_keys[k].key; k++)
            if (strcmp(default_keys[k].key, m->key) == 0) why = default_keys[k].why;
        char key[72], expected[256];
        snprintf(key, sizeof key, "%.64s", m->key);
        const JsonType type = m->value->type;
        const bool empty_ok = listed_in(empty_default_keys, m->key);
        snprintf(expected, sizeof expected, "%s (%s)",
                 type == JSON_BOOL ? "false" : empty_ok ? "null or empty" : "null", why);
        return bad(r, key, expected, m->value);
    }
    return 0;
}

/* init_lora_weights: how PEFT initialised A and B. These only set A and B (EVA from activations, at training time);
 * "pissa", "olora", "corda", "loftq", "lora_ga" ... also rewrite the base weights, which PEFT does again when it
 * loads the adapter, so its model is not the base plus the adapters. */
static const char *const plain_inits[] = {"gaussian", "orthogonal", "eva", "mica", NULL};
static int read_init(const Reader *r) {
    const JsonValue *v = member(r, "init_lora_weights");
    if (!v || v->type == JSON_BOOL) return 0;
    for (int i = 0; v->type == JSON_STRING && plain_inits[i]; i++)
        if (strcasecmp(v->string, plain_inits[i]) == 0) return 0;
    return bad(r, "init_lora_weights", "true, false, \"gaussian\", \"orthogonal\", \"eva\" or \"mica\" (\"pissa\", "
                                       "\"olora\", \"corda\", \"loftq\", \"lora_ga\" rewrite the base weights, which "
                                       "PEFT does again as it loads the adapter: save such an adapter with "
                                       "path_initial_model_for_weight_conversion for a plain LoRA of the original "
                                       "base)", v);
}

int peft_config_parse(const char *text, size_t len, const char *label, int num_layers, PeftConfig *out,
                      char *base_model, size_t base_model_len, char *note, size_t notelen, char *err, size_t errlen) {
    char why[512];
    JsonValue *root = json_parse(text, len, why, sizeof why);
    if (!root) {
        mt_set_error(err, errlen, "%s: %s", label, why);
        return -1;
    }
    Reader r = {label, root, err, errlen};
    PeftConfig peft = {.type = PEFT_LORA};
    double rank = 0, dropout = 0;
    const JsonValue *type = member(&r, "peft_type"), *task = member(&r, "task_type"), *bias = member(&r, "bias");
    const JsonValue *base = member(&r, "base_model_name_or_path"), *drop = member(&r, "lora_dropout");
    int status = -1;
    if (root->type != JSON_OBJECT) {
        mt_set_error(err, errlen, "%s: expected a JSON object (PEFT's adapter_config.json), found %s", label,
                     json_type_name(root->type));
        goto done;
    }
    if (!type || type->type != JSON_STRING || strcmp(type->string, "LORA") != 0) {
        bad(&r, "peft_type", "\"LORA\" (megatrain reads LoRA adapters)", type);
        goto done;
    }
    if (task && (task->type != JSON_STRING || strcmp(task->string, "CAUSAL_LM") != 0)) {
        bad(&r, "task_type", "\"CAUSAL_LM\" or null (megatrain trains causal language models)", task);
        goto done;
    }
    if (read_positive(&r, "r", 8, &rank) != 0) goto done;
    if (rank != floor(rank) || rank > 1 << 20) {
        bad(&r, "r", "a positive integer", member(&r, "r"));
        goto done;
    }
    peft.rank = (int)rank;
    if (read_positive(&r, "lora_alpha", 8, &peft.alpha) != 0 || read_targets(&r, num_layers, &peft.targets) != 0)
        goto done;
    if (drop && (drop->type != JSON_NUMBER || !isfinite(drop->number) || drop->number < 0 || drop->number >= 1)) {
        bad(&r, "lora_dropout", "a number in [0, 1)", drop);
        goto done;
    }
    dropout = drop ? drop->number : 0;
    if (bias && (bias->type != JSON_STRING || strcmp(bias->string, "none") != 0)) {
        bad(&r, "bias", "\"none\" (megatrain's LoRA has no biases of its own)", bias);
        goto done;
    }
    if (base && (base->type != JSON_STRING ||
                 (base_model && (base->string_len >= base_model_len || strlen(base->string) != base->string_len)))) {
        char expected[96];
        snprintf(expected, sizeof expected, "a string or null (a name or path of at most %zu bytes, no NUL)",
                 base_model ? base_model_len - 1 : (size_t)0);
        bad(&r, "base_model_name_or_path", expected, base);
        goto done;
    }
    if (read_init(&r) != 0 || check_other_keys(&r, &peft, num_layers) != 0) goto done;
    if (base_model) snprintf(base_model, base_model_len, "%s", base ? base->string : "");
    if (note) {
        note[0] = '\0';
        if (dropout != 0)
            snprintf(note, notelen, "lora_dropout %g is read as 0: megatrain's LoRA has no dropout (it changes "
                     "training only, not what the adapters compute)", dropout);
    }
    *out = peft;
    status = 0;
done:
    json_free(root);
    return status;
}

int peft_config_read(const char *path, int num_layers, PeftConfig *out, char *base_model, size_t base_model_len,
                     char *note, size_t notelen, char *err, size_t errlen) {
    size_t n = 0; /* a regular file of at most 1 MiB: never blocks on a FIFO */
    char *text = mt_read_file(path, (size_t)1 << 20, &n, err, errlen);
    if (!text) return -1;
    const int status =
        peft_config_parse(text, n, path, num_layers, out, base_model, base_model_len, note, notelen, err, errlen);
    free(text);
    return status;
}

/* The LoraConfig fields PeftModel.from_pretrained reads, with PEFT's defaults for the features megatrain does not
 * use (no dropout, bias, rsLoRA or DoRA), keys sorted as PEFT writes them. */
char *peft_config_to_json(const PeftConfig *peft, const char *base_model) {
    JsonWriter w;
    jw_init(&w, 2);
    jw_begin_object(&w);
    jw_key(&w, "alpha_pattern");
    jw_begin_object(&w);
    jw_end_object(&w);
    jw_key(&w, "base_model_name_or_path"); /* what AutoPeftModelForCausalLM loads; null: pass the base yourself */
    base_model ? jw_string(&w, base_model) : jw_null(&w);
    jw_key(&w, "bias");
    jw_string(&w, "none");
    jw_key(&w, "fan_in_fan_out");
    jw_bool(&w, false);
    jw_key(&w, "inference_mode");
    jw_bool(&w, true);
    jw_key(&w, "init_lora_weights");
    jw_bool(&w, true);
    jw_key(&w, "layers_pattern");
    jw_null(&w);
    jw_key(&w, "layers_to_transform");
    jw_null(&w);
    jw_key(&w, "lora_alpha");
    if (peft->alpha == floor(peft->alpha) && fabs(peft->alpha) < 1e15) jw_int(&w, (int64_t)peft->alpha);
    else jw_double(&w, peft->alpha);
    jw_key(&w, "lora_dropout");
    jw_double(&w, peft->dropout);
    jw_key(&w, "modules_to_save");
    jw_null(&w);
    jw_key(&w, "peft_type");
    jw_string(&w, "LORA");
    jw_key(&w, "r");
    jw_int(&w, peft->rank);
    jw_key(&w, "rank_pattern");
    jw_begin_object(&w);
    jw_end_object(&w);
    jw_key(&w, "revision");
    jw_null(&w);
    jw_key(&w, "target_modules");
    jw_begin_array(&w);
    for (int t = 0; t < LORA_NUM_TARGETS; t++)
        if (lora_targets(peft, (LoraTarget)t)) jw_string(&w, lora_target_name((LoraTarget)t));
    jw_end_array(&w);
    jw_key(&w, "task_type");
    jw_string(&w, "CAUSAL_LM");
    jw_key(&w, "use_dora");
    jw_bool(&w, false);
    jw_key(&w, "use_rslora");
    jw_bool(&w, false);
    jw_end_object(&w);
    jw_raw(&w, "\n", 1);
    return w.data; /* the writer's buffer now belongs to the caller */
}

