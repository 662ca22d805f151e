/* hf_families.h: the one table of the model families `convert` moves to and
 * from Hugging Face: our family, transformers' model_type (config.json), its
 * architecture class and the defaults of its config class. Reading config.json, writing it, the error that
 * lists the supported types and `convert --help` all come from this table. */
#ifndef MT_CONVERT_HF_FAMILIES_H
#define MT_CONVERT_HF_FAMILIES_H

#include <stddef.h>

#include "../config/recipe.h"

/* transformers' defaults for config.json keys a file may leave out (its config classes' __init__, checked by
 * tests/unit/test_hf_config.c against tests/fixtures/hf/config_defaults.json, which transformers itself wrote). */
typedef struct HfDefaults {
    double rope_theta, rms_norm_eps;
    int max_position_embeddings;
    int num_key_value_heads; /* 0: num_attention_heads */
    int head_dim;            /* 0: hidden_size / num_attention_heads */
    int num_experts_per_tok; /* MoE families */
} HfDefaults;

typedef struct HfFamily {
    ModelFamily family;
    const char *model_type;   /* config.json "model_type" */
    const char *architecture; /* config.json "architectures": [...] */
    HfDefaults defaults;
} HfFamily;

/* The family whose model_type is `model_type`, or NULL. */
const HfFamily *hf_family_by_type(const char *model_type);

/* The entry of `family`, or NULL for a family convert does not support. */
const HfFamily *hf_family_of(ModelFamily family);

/* "llama, qwen2, ..." (every model_type, in table order) into out. */
void hf_family_list(char *out, size_t outlen);

#endif
