/* ckpt_model_config.h: the model config of a checkpoint as YAML (model.yaml,
 * in the form of a configs/ architecture file, read back by
 * model_config_load), and the comparison resume uses to refuse a change of
 * model shape. */
#ifndef MT_CKPT_CKPT_MODEL_CONFIG_H
#define MT_CKPT_CKPT_MODEL_CONFIG_H

#include <stddef.h>

#include "../config/recipe.h"

/* The YAML text of `cfg` (malloc'ed, NUL-terminated). */
char *ckpt_model_config_yaml(const ModelConfig *cfg, size_t *len);

/* That `cfg` written as model.yaml loads back (model_config_load_text) as
 * the same model: a config from outside (convert's config.json) may hold
 * values the YAML reader refuses (rms_norm_eps 0, a subnormal). 0, or -1
 * with err saying what the reader says of model.yaml ("model.yaml:
 * rms_norm_eps: expected a number > 0, found '0'"). */
int ckpt_model_config_check(const ModelConfig *cfg, char *err, size_t errlen);

/* 0 when a model built from `wanted` has the same parameters (names and
 * shapes) as one built from `stored` (the keys the schema marks WEIGHTS, and
 * the same adapters); else -1 with err naming the first key that differs,
 * e.g. "model.hidden_size is 64 in the checkpoint but 128 in the recipe". */
int ckpt_model_shape_check(const ModelConfig *stored, const ModelConfig *wanted, char *err, size_t errlen);

#endif
