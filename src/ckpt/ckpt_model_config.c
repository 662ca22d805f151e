/* ckpt_model_config.c: model.yaml (written with the recipe schema's own
 * writer, so every model key round-trips through model_config_load) and the
 * model-shape comparison. */
#include "ckpt_model_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../config/recipe_schema.h"
#include "../core/error.h"
#include "../model/model.h"
#include "ckpt_format.h"

char *ckpt_model_config_yaml(const ModelConfig *cfg, size_t *len) {
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    if (!out) mt_die(MT_EXIT_FAILURE, "out of memory");
    fputs("# The model of this checkpoint (the keys of a recipe's `model:`; a LoRA run's also its `peft:`).\n", out);
    write_section(out, cfg, recipe_model_keys, 0);
    write_peft_of(out, &cfg->peft, 0);
    fclose(out);
    *len = size;
    return text;
}

static bool is_moe(const ModelConfig *m) { return m->family == FAMILY_MIXTRAL || m->family == FAMILY_QWEN3_MOE; }

int ckpt_model_shape_check(const ModelConfig *stored, const ModelConfig *wanted, char *err, size_t errlen) {
    const char *refusal = "a run cannot be resumed with a different model shape (start a new run, e.g. with the "
                          "checkpoint's weights converted)";
    if (stored->family != wanted->family) {
        mt_set_error(err, errlen, "model.family: the checkpoint's model is '%s', the recipe asks for '%s'; %s",
                     model_family_name(stored->family), model_family_name(wanted->family), refusal);
        return -1;
    }
    struct {
        const char *key;
        long have, want;
    } fields[] = {
        {"num_layers", stored->num_layers, wanted->num_layers},
        {"hidden_size", stored->hidden_size, wanted->hidden_size},
        {"intermediate_size", stored->intermediate_size, wanted->intermediate_size},
        {"num_attention_heads", stored->num_attention_heads, wanted->num_attention_heads},
        {"num_key_value_heads", stored->num_key_value_heads, wanted->num_key_value_heads},
        {"head_dim", stored->head_dim, wanted->head_dim},
        {"vocab_size", stored->vocab_size, wanted->vocab_size},
        {"tie_word_embeddings", stored->tie_word_embeddings, wanted->tie_word_embeddings},
        {"attention_bias", stored->attention_bias, wanted->attention_bias},
        {"qk_norm", stored->qk_norm, wanted->qk_norm},
        {"moe.num_experts", is_moe(stored) ? stored->moe.num_experts : 0, is_moe(wanted) ? wanted->moe.num_experts : 0},
        {"moe.moe_intermediate_size", is_moe(stored) ? stored->moe.moe_intermediate_size : 0,
         is_moe(wanted) ? wanted->moe.moe_intermediate_size : 0},
        {"moe.shared_expert_intermediate_size", is_moe(stored) ? stored->moe.shared_expert_intermediate_size : 0,
         is_moe(wanted) ? wanted->moe.shared_expert_intermediate_size : 0},
        /* peft (a root key, named as such below): which adapters there are and their rank */
        {"peft.type", stored->peft.type, wanted->peft.type},
        {"peft.rank", stored->peft.type ? stored->peft.rank : 0, wanted->peft.type ? wanted->peft.rank : 0},
        {"peft.target_modules", stored->peft.type ? (long)stored->peft.targets : 0,
         wanted->peft.type ? (long)wanted->peft.targets : 0},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        if (fields[i].have == fields[i].want) continue;
        if (strcmp(fields[i].key, "peft.type") == 0)
            mt_set_error(err, errlen, "peft: the checkpoint's model has %s, the recipe %s; %s",
                         stored->peft.type ? "LoRA adapters" : "no adapters",
                         wanted->peft.type ? "asks for LoRA" : "has no peft: section", refusal);
        else if (strcmp(fields[i].key, "peft.target_modules") == 0)
            mt_set_error(err, errlen, "peft.target_modules: the checkpoint's adapters are on other layers than the "
                         "recipe's; %s", refusal);
        else if (!strcmp(fields[i].key, "tie_word_embeddings") || !strcmp(fields[i].key, "attention_bias") ||
                 !strcmp(fields[i].key, "qk_norm")) /* the recipe's booleans, as the recipe writes them */
            mt_set_error(err, errlen, "model.%s: the checkpoint's model has %s, the recipe asks for %s; %s",
                         fields[i].key, fields[i].have ? "true" : "false", fields[i].want ? "true" : "false", refusal);
        else
            mt_set_error(err, errlen, "%s%s: the checkpoint's model has %ld, the recipe asks for %ld; %s",
                         strncmp(fields[i].key, "peft.", 5) == 0 ? "" : "model.", fields[i].key, fields[i].have,
                         fields[i].want, refusal);
        return -1;
    }
    if (is_moe(stored)) {
        for (int l = 0; l < stored->num_layers && l < MT_MAX_LAYERS; l++) {
            bool a = model_layer_is_moe(stored, l), b = model_layer_is_moe(wanted, l);
            if (a != b) {
                mt_set_error(err, errlen, "model.moe.layer_freq: layer %d is %s in the checkpoint and %s in the recipe; %s",
                             l, a ? "MoE" : "dense", b ? "MoE" : "dense", refusal);
                return -1;
            }
        }
    }
    return 0;
}

int ckpt_model_config_check(const ModelConfig *cfg, char *err, size_t errlen) {
    size_t len = 0;
    char *text = ckpt_model_config_yaml(cfg, &len);
    ModelConfig back;
    char why[1024];
    int rc = model_config_load_text(&back, text, CKPT_MODEL_FILE, why, sizeof why);
    if (rc != 0) mt_set_error(err, errlen, "%s", why);
    else if ((rc = ckpt_model_shape_check(&back, cfg, why, sizeof why)) != 0)
        mt_set_error(err, errlen, "model.yaml would load back as another model: %s", why);
    free(text);
    return rc;
}
