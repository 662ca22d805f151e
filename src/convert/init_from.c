/* init_from.c: the recipe key init_from: check the checkpoint's model config
 * against the recipe's model, then load its weights. */
#include "init_from.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "../ckpt/checkpoint.h"
#include "../core/error.h"
#include "ckpt_latest_dir.h"

/* The first setting in which a (the checkpoint's model) and b (the recipe's) differ, as a message; 0 when none:
 * every key the schema marks (the weights' shapes and what they compute), and the routing's one rule of its own:
 * routers trained with expert biases cannot drop them (adding them is allowed: they start at zero). */
static int compare_configs(const ModelConfig *a, const ModelConfig *b, char *why, size_t whylen) {
    if (model_config_difference(a, b, MODEL_MATCH_FUNCTION, why, whylen) != 0) return -1;
    if (model_family_is_moe(a->family) && a->moe.load_balancing == LB_EXPERT_BIAS &&
        b->moe.load_balancing != LB_EXPERT_BIAS) {
        snprintf(why, whylen, "the checkpoint's routers choose with expert biases (model.moe.load_balancing: "
                 "expert_bias), which the recipe's load_balancing would drop: keep expert_bias");
        return -1;
    }
    return 0;
}

/* A checkpoint with LoRA adapters needs a recipe with the same ones, scaled alike (a model without adapters fits any
 * peft). */
static int compare_adapters(const PeftConfig *a, const PeftConfig *b, char *why, size_t whylen) {
    if (a->type == PEFT_NONE) return 0;
    if (b->type == PEFT_NONE) {
        snprintf(why, whylen, "the checkpoint has LoRA adapters (peft.rank %d) but the recipe has no peft: section "
                 "(merge them first: megatrain convert CKPT --merge-lora OUT)", a->rank);
        return -1;
    }
    return peft_config_difference(a, b, MODEL_MATCH_FUNCTION, why, whylen);
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
    const bool adds_biases = model_family_is_moe(stored.family) &&
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
