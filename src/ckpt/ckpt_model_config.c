/* ckpt_model_config.c: model.yaml (written with the recipe schema's own
 * writer, so every model key round-trips through model_config_load) and the
 * model-shape comparison (the schema's, recipe.h's model_config_difference). */
#include "ckpt_model_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../config/recipe_schema.h"
#include "../core/error.h"
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

/* The adapters: the same kind (none or LoRA) and, with LoRA, the keys marked at `level` (rank and targets; alpha
 * too at FUNCTION). */
static int adapter_difference(const PeftConfig *stored, const PeftConfig *wanted, ModelMatch level, char *why,
                              size_t whylen) {
    if (stored->type != wanted->type) {
        snprintf(why, whylen, "peft: the checkpoint's model has %s, the recipe %s",
                 stored->type ? "LoRA adapters" : "no adapters", wanted->type ? "asks for LoRA" : "has no peft: section");
        return -1;
    }
    return stored->type != PEFT_NONE ? peft_config_difference(stored, wanted, level, why, whylen) : 0;
}

int ckpt_model_shape_check(const ModelConfig *stored, const ModelConfig *wanted, char *err, size_t errlen) {
    char why[1024];
    if (model_config_difference(stored, wanted, MODEL_MATCH_WEIGHTS, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "%s; a run cannot be resumed with a different model shape (start a new run, e.g. "
                     "with the checkpoint's weights converted)", why);
        return -1;
    }
    if (adapter_difference(&stored->peft, &wanted->peft, MODEL_MATCH_WEIGHTS, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "%s; a run cannot be resumed with other adapters (start a new run with these "
                     "adapters from its base model: init_from the base, as this run was)", why);
        return -1;
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
    else if ((rc = model_config_difference(&back, cfg, MODEL_MATCH_FUNCTION, why, sizeof why)) != 0 ||
             (rc = adapter_difference(&back.peft, &cfg->peft, MODEL_MATCH_FUNCTION, why, sizeof why)) != 0)
        mt_set_error(err, errlen, "model.yaml would load back as another model: %s", why);
    free(text);
    return rc;
}
