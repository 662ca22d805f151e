/* hf_names.c: the per-family name tables between our registry names and
 * transformers' names ("{L}" stands for a layer index), and the matching of
 * a concrete name against a pattern. */
#include "hf_names.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

typedef struct NamePair {
    const char *ours;
    const char *hf;
} NamePair;

/* Each table lists transformers' state_dict order (its module order):
 * embeddings, then per layer self_attn (q, k, v, o with their biases, then
 * qwen3's q_norm and k_norm), mlp (gate, up, down), the two layer norms,
 * then the final norm and lm_head. Writing follows that order, so shards
 * split where save_pretrained splits them. */

/* LlamaForCausalLM: no biases we can express, no qk-norm. */
static const NamePair llama_names[] = {
    {"embed.weight", "model.embed_tokens.weight"},
    {"layers.{L}.attn.q_proj.weight", "model.layers.{L}.self_attn.q_proj.weight"},
    {"layers.{L}.attn.k_proj.weight", "model.layers.{L}.self_attn.k_proj.weight"},
    {"layers.{L}.attn.v_proj.weight", "model.layers.{L}.self_attn.v_proj.weight"},
    {"layers.{L}.attn.o_proj.weight", "model.layers.{L}.self_attn.o_proj.weight"},
    {"layers.{L}.mlp.gate_proj.weight", "model.layers.{L}.mlp.gate_proj.weight"},
    {"layers.{L}.mlp.up_proj.weight", "model.layers.{L}.mlp.up_proj.weight"},
    {"layers.{L}.mlp.down_proj.weight", "model.layers.{L}.mlp.down_proj.weight"},
    {"layers.{L}.attn_norm.weight", "model.layers.{L}.input_layernorm.weight"},
    {"layers.{L}.mlp_norm.weight", "model.layers.{L}.post_attention_layernorm.weight"},
    {"final_norm.weight", "model.norm.weight"},
    {"lm_head.weight", "lm_head.weight"},
    {NULL, NULL},
};

/* Qwen2ForCausalLM: q, k, v always carry biases (o_proj does not). */
static const NamePair qwen2_names[] = {
    {"embed.weight", "model.embed_tokens.weight"},
    {"layers.{L}.attn.q_proj.weight", "model.layers.{L}.self_attn.q_proj.weight"},
    {"layers.{L}.attn.q_proj.bias", "model.layers.{L}.self_attn.q_proj.bias"},
    {"layers.{L}.attn.k_proj.weight", "model.layers.{L}.self_attn.k_proj.weight"},
    {"layers.{L}.attn.k_proj.bias", "model.layers.{L}.self_attn.k_proj.bias"},
    {"layers.{L}.attn.v_proj.weight", "model.layers.{L}.self_attn.v_proj.weight"},
    {"layers.{L}.attn.v_proj.bias", "model.layers.{L}.self_attn.v_proj.bias"},
    {"layers.{L}.attn.o_proj.weight", "model.layers.{L}.self_attn.o_proj.weight"},
    {"layers.{L}.mlp.gate_proj.weight", "model.layers.{L}.mlp.gate_proj.weight"},
    {"layers.{L}.mlp.up_proj.weight", "model.layers.{L}.mlp.up_proj.weight"},
    {"layers.{L}.mlp.down_proj.weight", "model.layers.{L}.mlp.down_proj.weight"},
    {"layers.{L}.attn_norm.weight", "model.layers.{L}.input_layernorm.weight"},
    {"layers.{L}.mlp_norm.weight", "model.layers.{L}.post_attention_layernorm.weight"},
    {"final_norm.weight", "model.norm.weight"},
    {"lm_head.weight", "lm_head.weight"},
    {NULL, NULL},
};

/* Qwen3ForCausalLM: per-head RMSNorm of q and k. */
static const NamePair qwen3_names[] = {
    {"embed.weight", "model.embed_tokens.weight"},
    {"layers.{L}.attn.q_proj.weight", "model.layers.{L}.self_attn.q_proj.weight"},
    {"layers.{L}.attn.k_proj.weight", "model.layers.{L}.self_attn.k_proj.weight"},
    {"layers.{L}.attn.v_proj.weight", "model.layers.{L}.self_attn.v_proj.weight"},
    {"layers.{L}.attn.o_proj.weight", "model.layers.{L}.self_attn.o_proj.weight"},
    {"layers.{L}.attn.q_norm.weight", "model.layers.{L}.self_attn.q_norm.weight"},
    {"layers.{L}.attn.k_norm.weight", "model.layers.{L}.self_attn.k_norm.weight"},
    {"layers.{L}.mlp.gate_proj.weight", "model.layers.{L}.mlp.gate_proj.weight"},
    {"layers.{L}.mlp.up_proj.weight", "model.layers.{L}.mlp.up_proj.weight"},
    {"layers.{L}.mlp.down_proj.weight", "model.layers.{L}.mlp.down_proj.weight"},
    {"layers.{L}.attn_norm.weight", "model.layers.{L}.input_layernorm.weight"},
    {"layers.{L}.mlp_norm.weight", "model.layers.{L}.post_attention_layernorm.weight"},
    {"final_norm.weight", "model.norm.weight"},
    {"lm_head.weight", "lm_head.weight"},
    {NULL, NULL},
};

static const NamePair *family_table(ModelFamily family) {
    switch (family) {
    case FAMILY_LLAMA: return llama_names;
    case FAMILY_QWEN2: return qwen2_names;
    case FAMILY_QWEN3: return qwen3_names;
    default: return NULL; /* MoE families: tables arrive with their models */
    }
}

/* Does `name` match `pattern`? On a match, *layer is the index in place of
 * "{L}" (or -1 when the pattern has none). Digits must be canonical
 * (no leading zeros, no sign). */
static int match(const char *pattern, const char *name, long *layer) {
    const char *hole = strstr(pattern, "{L}");
    if (!hole) {
        *layer = -1;
        return strcmp(pattern, name) == 0;
    }
    size_t prefix = (size_t)(hole - pattern);
    const char *suffix = hole + 3;
    if (strncmp(pattern, name, prefix) != 0) return 0;
    const char *p = name + prefix;
    if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9')) return 0;
    long value = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (value > 100000000L) return 0;
        value = value * 10 + (*p - '0');
    }
    if (strcmp(p, suffix) != 0) return 0;
    *layer = value;
    return 1;
}

static int expand(const char *pattern, long layer, char *out, size_t outlen) {
    const char *hole = strstr(pattern, "{L}");
    int n = hole ? snprintf(out, outlen, "%.*s%ld%s", (int)(hole - pattern), pattern, layer, hole + 3)
                 : snprintf(out, outlen, "%s", pattern);
    return n >= 0 && (size_t)n < outlen ? 0 : -1;
}

static int translate(ModelFamily family, const char *name, int to_hf, char *out, size_t outlen) {
    const NamePair *table = family_table(family);
    if (!table) return -1;
    for (const NamePair *pair = table; pair->ours; pair++) {
        long layer;
        if (match(to_hf ? pair->ours : pair->hf, name, &layer))
            return expand(to_hf ? pair->hf : pair->ours, layer, out, outlen);
    }
    return -1;
}

long hf_name_position(ModelFamily family, const char *hf) {
    const NamePair *table = family_table(family);
    if (!table) return -1;
    bool layers_seen = false;
    for (long entry = 0; table[entry].ours; entry++) {
        long layer;
        bool per_layer = strstr(table[entry].hf, "{L}") != NULL;
        layers_seen = layers_seen || per_layer;
        if (!match(table[entry].hf, hf, &layer)) continue;
        /* before the layers: group 0; layer l: group l + 1; after them: last */
        long group = per_layer ? layer + 1 : layers_seen ? 100000000L + 1 : 0;
        return group * 64 + entry;
    }
    return -1;
}

int hf_name_from_ours(ModelFamily family, const char *ours, char *out, size_t outlen) {
    return translate(family, ours, 1, out, outlen);
}

int hf_name_to_ours(ModelFamily family, const char *hf, char *out, size_t outlen) {
    return translate(family, hf, 0, out, outlen);
}
