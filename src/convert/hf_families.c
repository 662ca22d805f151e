/* hf_families.c: the supported Hugging Face families (hf_families.h). */
#include "hf_families.h"

#include <stdio.h>
#include <string.h>

static const HfFamily families[] = {
    /* family, model_type, architecture,
     *   {rope_theta, rms_norm_eps, max_position_embeddings, num_key_value_heads, head_dim, num_experts_per_tok} */
    {FAMILY_LLAMA, "llama", "LlamaForCausalLM", {1e4, 1e-6, 2048, 0, 0, 0}},
    {FAMILY_QWEN2, "qwen2", "Qwen2ForCausalLM", {1e4, 1e-6, 32768, 32, 0, 0}},
    {FAMILY_QWEN3, "qwen3", "Qwen3ForCausalLM", {1e4, 1e-6, 32768, 32, 128, 0}},
    {FAMILY_MIXTRAL, "mixtral", "MixtralForCausalLM", {1e6, 1e-5, 131072, 8, 0, 2}},
    {FAMILY_QWEN3_MOE, "qwen3_moe", "Qwen3MoeForCausalLM", {1e4, 1e-6, 32768, 4, 0, 8}},
};
enum { NUM_FAMILIES = sizeof families / sizeof families[0] };

const HfFamily *hf_family_by_type(const char *model_type) {
    for (int i = 0; i < NUM_FAMILIES; i++)
        if (strcmp(families[i].model_type, model_type) == 0) return &families[i];
    return NULL;
}

const HfFamily *hf_family_of(ModelFamily family) {
    for (int i = 0; i < NUM_FAMILIES; i++)
        if (families[i].family == family) return &families[i];
    return NULL;
}

void hf_family_list(char *out, size_t outlen) {
    size_t used = 0;
    if (outlen > 0) out[0] = '\0';
    for (int i = 0; i < NUM_FAMILIES && used < outlen; i++)
        used += (size_t)snprintf(out + used, outlen - used, "%s%s", i ? ", " : "", families[i].model_type);
}
