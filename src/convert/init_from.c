/* init_from.c: the recipe key init_from: check the checkpoint's model config
 * against the recipe's model, then load its weights. */
#include "init_from.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "../ckpt/checkpoint.h"
#include "../core/error.h"
#include "ckpt_latest_dir.h"

static int head_dim_of(const ModelConfig *c) {
    return c->head_dim ? c->head_dim : c->hidden_size / c->num_attention_heads;
}

/* One integer or boolean setting of a model config, as the checkpoint and the recipe have it. */
typedef struct Setting {
    const char *key; /* after "model." */
    long ckpt, recipe;
    bool boolean;    /* said as true / false */
} Setting;

/* The first of n settings that differ, as a message into why: -1; 0 when none does. */
static int first_difference(const Setting *s, size_t n, char *why, size_t whylen) {
    for (size_t i = 0; i < n; i++) {
        if (s[i].ckpt == s[i].recipe) continue;
        if (s[i].boolean)
            snprintf(why, whylen, "model.%s is %s in the checkpoint but %s in the recipe", s[i].key,
                     s[i].ckpt ? "true" : "false", s[i].recipe ? "true" : "false");
        else
            snprintf(why, whylen, "model.%s is %ld in the checkpoint but %ld in the recipe", s[i].key, s[i].ckpt,
                     s[i].recipe);
        return -1;
    }
    return 0;
}

/* The routing of a MoE model (a and b of one MoE family): its experts' shapes and what the router computes must be
 * the checkpoint's; the balancing and the capacity are training choices, except that routers trained with expert
 * biases (which the choice adds) cannot drop them. Adding expert biases is allowed: they start at zero. */
static int compare_moe(const ModelConfig *a, const ModelConfig *b, char *why, size_t whylen) {
    const MoeConfig *x = &a->moe, *y = &b->moe;
    const Setting settings[] = {
        {"moe.num_experts", x->num_experts, y->num_experts, false},
        {"moe.num_experts_per_tok", x->num_experts_per_tok, y->num_experts_per_tok, false},
        {"moe.moe_intermediate_size", x->moe_intermediate_size, y->moe_intermediate_size, false},
        {"moe.shared_expert_intermediate_size", x->shared_expert_intermediate_size, y->shared_expert_intermediate_size, false},
        {"moe.norm_topk_prob", x->norm_topk_prob, y->norm_topk_prob, true},
    };
    if (first_difference(settings, sizeof settings / sizeof settings[0], why, whylen) != 0) return -1;
    if (x->score_function != y->score_function) {
        snprintf(why, whylen, "model.moe.score_function is %s in the checkpoint but %s in the recipe",
                 x->score_function == SCORE_SIGMOID ? "sigmoid" : "softmax",
                 y->score_function == SCORE_SIGMOID ? "sigmoid" : "softmax");
        return -1;
    }
    for (int l = 0; l < a->num_layers; l++) {
        if (model_layer_is_moe(a, l) == model_layer_is_moe(b, l)) continue;
        snprintf(why, whylen, "layer %d is %s in the checkpoint but %s in the recipe (model.moe.layer_freq)", l,
                 model_layer_is_moe(a, l) ? "MoE" : "dense", model_layer_is_moe(b, l) ? "MoE" : "dense");
        return -1;
    }
    if (x->load_balancing == LB_EXPERT_BIAS && y->load_balancing != LB_EXPERT_BIAS) {
        snprintf(why, whylen, "the checkpoint's routers choose with expert biases (model.moe.load_balancing: "
                 "expert_bias), which the recipe's load_balancing would drop: keep expert_bias");
        return -1;
    }
    return 0;
}

/* The first setting in which a (checkpoint) and b (recipe) differ, as a message; 0 when none. */
static int compare_configs(const ModelConfig *a, const ModelConfig *b, char *why, size_t whylen) {
    if (a->family != b->family) {
        snprintf(why, whylen, "model.family is %s in the checkpoint but %s in the recipe", model_family_name(a->family),
                 model_family_name(b->family));
        return -1;
    }
    const Setting settings[] = {
        {"num_layers", a->num_layers, b->num_layers, false},
        {"hidden_size", a->hidden_size, b->hidden_size, false},
        {"intermediate_size", a->intermediate_size, b->intermediate_size, false},
        {"num_attention_heads", a->num_attention_heads, b->num_attention_heads, false},
        {"num_key_value_heads", a->num_key_value_heads, b->num_key_value_heads, false},
        {"head_dim", head_dim_of(a), head_dim_of(b), false},
        {"vocab_size", a->vocab_size, b->vocab_size, false},
        {"tie_word_embeddings", a->tie_word_embeddings, b->tie_word_embeddings, true},
        {"attention_bias", a->attention_bias, b->attention_bias, true},
        {"qk_norm", a->qk_norm, b->qk_norm, true},
        {"rope_scaling", a->rope_scaling.enabled, b->rope_scaling.enabled, true},
        {"rope_scaling.original_max_position_embeddings", a->rope_scaling.original_max_position_embeddings,
         b->rope_scaling.original_max_position_embeddings, false},
    };
    if (first_difference(settings, sizeof settings / sizeof settings[0], why, whylen) != 0) return -1;
    const struct {
        const char *key;
        double ckpt, recipe;
    } reals[] = {
        {"rope_theta", a->rope_theta, b->rope_theta},
        {"rms_norm_eps", a->rms_norm_eps, b->rms_norm_eps},
        {"rope_scaling.factor", a->rope_scaling.factor, b->rope_scaling.factor},
        {"rope_scaling.low_freq_factor", a->rope_scaling.low_freq_factor, b->rope_scaling.low_freq_factor},
        {"rope_scaling.high_freq_factor", a->rope_scaling.high_freq_factor, b->rope_scaling.high_freq_factor},
    };
    for (size_t i = 0; i < sizeof reals / sizeof reals[0]; i++) {
        if (i >= 2 && !a->rope_scaling.enabled) break; /* both disabled: the factors mean nothing */
        if (reals[i].ckpt == reals[i].recipe) continue;
        snprintf(why, whylen, "model.%s is %.17g in the checkpoint but %.17g in the recipe", reals[i].key,
                 reals[i].ckpt, reals[i].recipe);
        return -1;
    }
    return a->family == FAMILY_MIXTRAL || a->family == FAMILY_QWEN3_MOE ? compare_moe(a, b, why, whylen) : 0;
}

/* A checkpoint with LoRA adapters needs a recipe with the same ones (a model without adapters fits any peft). */
static int compare_adapters(const PeftConfig *a, const PeftConfig *b, char *why, size_t whylen) {
    if (a->type == PEFT_NONE) return 0;
    if (b->type == PEFT_NONE) {
        snprintf(why, whylen, "the checkpoint has LoRA adapters (peft.rank %d) but the recipe has no peft: section "
                 "(merge them first: megatrain convert CKPT --merge-lora OUT)", a->rank);
        return -1;
    }
    if (a->rank != b->rank) {
        snprintf(why, whylen, "peft.rank is %d in the checkpoint but %d in the recipe", a->rank, b->rank);
        return -1;
    }
    if (a->targets != b->targets) {
        snprintf(why, whylen, "peft.target_modules differ between the checkpoint and the recipe");
        return -1;
    }
    return 0;
}

int init_from_checkpoint(Model *model, const char *path, CkptHfFiles *carried, CkptBaseRef *base, char *err,
                         size_t errlen) {
    char dir[4096], why[4096];
    if (ckpt_latest_dir(path, dir, sizeof dir, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "init_from: %s", why);
        return MT_EXIT_FAILURE;
    }
    ModelConfig stored;
    if (ckpt_read_model_config(dir, &stored, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "init_from: %s", why);
        return MT_EXIT_FAILURE;
    }
    if (compare_configs(&stored, &model->cfg, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "init_from: %s: %s; the recipe's model: must match the checkpoint's", dir, why);
        return MT_EXIT_USAGE;
    }
    /* LoRA from a model without adapters (a converted Hugging Face model): its weights become the frozen base
     * and the adapters keep their initialisation; from a LoRA checkpoint, the adapters come along */
    const bool base_only = model->cfg.peft.type == PEFT_LORA && stored.peft.type == PEFT_NONE;
    if (compare_adapters(&stored.peft, &model->cfg.peft, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "init_from: %s: %s; the recipe's peft: must match the checkpoint's", dir, why);
        return MT_EXIT_USAGE;
    }
    if (ckpt_load_init(dir, model, base_only, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "init_from: %s", why);
        return MT_EXIT_FAILURE;
    }
    /* said from the configs, not this rank's count: rank 0's pipeline stage may hold no MoE layer */
    const bool adds_biases = (stored.family == FAMILY_MIXTRAL || stored.family == FAMILY_QWEN3_MOE) &&
                             stored.moe.load_balancing != LB_EXPERT_BIAS && model->cfg.moe.load_balancing == LB_EXPERT_BIAS;
    if (adds_biases)
        mt_log("init_from: %s has no expert biases (its routers were trained without load_balancing: expert_bias): "
               "the routers' biases start at zero", dir);
    if (base && ckpt_base_ref_of(dir, base, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "init_from: %s", why);
        return MT_EXIT_FAILURE;
    }
    const bool own_ids = model_token_ids_inherit(&model->cfg.token_ids, &stored.token_ids);
    if (carried) {
        if (ckpt_hf_files_read(dir, carried, why, sizeof why) != 0) {
            mt_set_error(err, errlen, "init_from: %s", why);
            return MT_EXIT_FAILURE;
        }
        if (own_ids && ckpt_hf_files_find(carried, "generation_config.json"))
            mt_warn("init_from: the recipe's token ids differ from those of %s; its generation_config.json is "
                    "carried as it is, with the checkpoint's ids",
                    dir);
    }
    mt_log("init_from: %s from %s (the optimizer starts fresh)",
           base_only ? "the frozen base weights (the LoRA adapters start as initialised)" : "weights", dir);
    return 0;
}
