/* peft_config.c: PEFT's adapter_config.json read into a PeftConfig and
 * written from one (peft_config.h). */
#include "peft_config.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* A boolean PEFT leaves false for the LoRA megatrain computes: absent, null or false. */
static int refuse_true(const Reader *r, const char *key, const char *why) {
    const JsonValue *v = member(r, key);
    if (!v || (v->type == JSON_BOOL && !v->boolean)) return 0;
    char expected[256];
    snprintf(expected, sizeof expected, "false (%s)", why);
    return bad(r, key, expected, v);
}

/* A setting PEFT leaves empty for the LoRA megatrain computes: absent, null, an empty list or an empty object. */
static int refuse_set(const Reader *r, const char *key, const char *why) {
    const JsonValue *v = member(r, key);
    if (!v || ((v->type == JSON_ARRAY || v->type == JSON_OBJECT) && v->count == 0)) return 0;
    char expected[256];
    snprintf(expected, sizeof expected, "null or empty (%s)", why);
    return bad(r, key, expected, v);
}

/* A positive finite number, `fallback` (PEFT's default) when absent. */
static int read_positive(const Reader *r, const char *key, double fallback, double *out) {
    const JsonValue *v = member(r, key);
    if (!v) return *out = fallback, 0;
    if (v->type != JSON_NUMBER || !isfinite(v->number) || v->number <= 0) return bad(r, key, "a positive number", v);
    *out = v->number;
    return 0;
}

/* target_modules: a list of the projections' names (each a LoraTarget), or "all-linear" (every projection but the
 * output layer, as PEFT reads it for a causal LM). */
static int read_targets(const Reader *r, unsigned *targets) {
    const JsonValue *v = member(r, "target_modules");
    char expected[256];
    int used = snprintf(expected, sizeof expected, "a list of");
    for (int t = 0; t < LORA_NUM_TARGETS; t++)
        used += snprintf(expected + used, sizeof expected - (size_t)used, "%s%s", t ? ", " : " ",
                         lora_target_name((LoraTarget)t));
    snprintf(expected + used, sizeof expected - (size_t)used, ", or \"all-linear\"");
    if (v && v->type == JSON_STRING) {
        if (strcmp(v->string, "all-linear") != 0)
            return bad(r, "target_modules", "a list of module names or \"all-linear\" (a regular expression is not "
                                            "read: list the modules it matches)", v);
        *targets = LORA_ALL_TARGETS;
        return 0;
    }
    if (!v || v->type != JSON_ARRAY || v->count == 0) return bad(r, "target_modules", expected, v);
    *targets = 0;
    for (size_t i = 0; i < v->count; i++) {
        const JsonValue *item = v->items[i];
        int t = 0;
        while (item->type == JSON_STRING && t < LORA_NUM_TARGETS && strcmp(item->string, lora_target_name((LoraTarget)t)))
            t++;
        if (item->type != JSON_STRING || t == LORA_NUM_TARGETS) {
            char key[64];
            snprintf(key, sizeof key, "target_modules[%zu]", i);
            return bad(r, key, "one of the projections LoRA adapts in megatrain (q_proj, k_proj, v_proj, o_proj, "
                               "gate_proj, up_proj, down_proj)", item);
        }
        *targets |= 1u << t;
    }
    return 0;
}

int peft_config_parse(const char *text, size_t len, const char *label, PeftConfig *out, char *base_model,
                      size_t base_model_len, char *note, size_t notelen, char *err, size_t errlen) {
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
    if (read_positive(&r, "lora_alpha", 8, &peft.alpha) != 0 || read_targets(&r, &peft.targets) != 0) goto done;
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
    if (refuse_true(&r, "use_rslora", "rank-stabilised LoRA scales by lora_alpha / sqrt(r), megatrain by lora_alpha / r") ||
        refuse_true(&r, "use_dora", "DoRA's magnitude vectors are not implemented") ||
        refuse_true(&r, "fan_in_fan_out", "weights stored transposed, as GPT-2's Conv1D, are not a family megatrain has") ||
        refuse_true(&r, "lora_bias", "a bias on lora_B is not implemented") ||
        refuse_true(&r, "use_qalora", "quantization-aware LoRA is not implemented") ||
        refuse_set(&r, "rank_pattern", "every adapter has rank r in megatrain") ||
        refuse_set(&r, "alpha_pattern", "every adapter has lora_alpha in megatrain") ||
        refuse_set(&r, "layers_to_transform", "megatrain adapts every layer") ||
        refuse_set(&r, "layer_replication", "megatrain does not replicate layers") ||
        refuse_set(&r, "modules_to_save", "modules trained whole beside the adapters are not read") ||
        refuse_set(&r, "exclude_modules", "megatrain adapts every layer's target modules") ||
        refuse_set(&r, "target_parameters", "megatrain adapts modules, not parameters") ||
        refuse_set(&r, "trainable_token_indices", "trainable tokens are not implemented"))
        goto done;
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

int peft_config_read(const char *path, PeftConfig *out, char *base_model, size_t base_model_len, char *note,
                     size_t notelen, char *err, size_t errlen) {
    size_t n = 0; /* a regular file of at most 1 MiB: never blocks on a FIFO */
    char *text = mt_read_file(path, (size_t)1 << 20, &n, err, errlen);
    if (!text) return -1;
    const int status = peft_config_parse(text, n, path, out, base_model, base_model_len, note, notelen, err, errlen);
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

