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
static int compare_adapters(const PeftConfig *a, const PeftConfig *b, const char *dir, char *why, size_t whylen) {
    if (a->type == PEFT_NONE) return 0;
    char theirs[256], differ[1024];
    peft_config_text(a, theirs, sizeof theirs);
    if (b->type == PEFT_NONE) {
        snprintf(why, whylen, "the checkpoint has LoRA adapters but the recipe has no peft: section; to train them on, "
                 "give the recipe the checkpoint's, peft: %s (or leave peft: out and give model: %.1024s/model.yaml, "
                 "which carries it); to train the merged model whole, merge them first (megatrain convert %.1024s OUT "
                 "--merge-lora) and init_from OUT", theirs, dir, dir);
        return -1;
    }
    if (peft_config_difference(a, b, MODEL_MATCH_FUNCTION, differ, sizeof differ) == 0) return 0;
    snprintf(why, whylen, "%s; the recipe's peft: must match the checkpoint's, peft: %s (or leave peft: out and give "
             "model: %.1024s/model.yaml, which carries it)", differ, theirs, dir);
    return -1;
}

/* The checkpoint directory `path` names (dir), its model config (stored), checked against cfg. */
static int check(const char *path, const ModelConfig *cfg, char *dir, size_t dirlen, ModelConfig *stored, char *err,
                 size_t errlen) {
    char why[4096];
    if (ckpt_latest_dir(path, dir, dirlen, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "init_from: %s", why);
        return MT_EXIT_FAILURE;
    }
    if (ckpt_read_model_config(dir, stored, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "init_from: %s", why);
        return MT_EXIT_FAILURE;
    }
    if (compare_configs(stored, cfg, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "init_from: %s: %s; the recipe's model: must match the checkpoint's", dir, why);
        return MT_EXIT_USAGE;
    }
    if (compare_adapters(&stored->peft, &cfg->peft, dir, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "init_from: %s: %s", dir, why);
        return MT_EXIT_USAGE;
    }
    return 0;
}

int init_from_check(const char *path, const ModelConfig *cfg, char *err, size_t errlen) {
    char dir[4096];
    ModelConfig stored;
    return check(path, cfg, dir, sizeof dir, &stored, err, errlen);
}

int init_from_checkpoint(Model *model, const char *path, CkptHfFiles *carried, CkptBaseRef *base, char *err,
                         size_t errlen) {
    char dir[4096], why[4096];
    ModelConfig stored;
    const int status = check(path, &model->cfg, dir, sizeof dir, &stored, err, errlen);
    if (status != 0) return status;
    /* LoRA from a model without adapters (a converted Hugging Face model): its weights become the frozen base
     * and the adapters keep their initialisation; from a LoRA checkpoint, the adapters come along */
    const bool base_only = model->cfg.peft.type == PEFT_LORA && stored.peft.type == PEFT_NONE;
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
    const bool own_ids = model_config_inherit_unset(&model->cfg, &stored);
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
