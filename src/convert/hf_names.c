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

/* MixtralForCausalLM: llama attention, a sparse MoE block on every layer:
 * the router "gate", and per expert w1 (gate), w2 (down), w3 (up). "{E}" is
 * the expert: our stacked tensors hold expert e in row block e. */
static const NamePair mixtral_names[] = {
    {"embed.weight", "model.embed_tokens.weight"},
    {"layers.{L}.attn.q_proj.weight", "model.layers.{L}.self_attn.q_proj.weight"},
    {"layers.{L}.attn.k_proj.weight", "model.layers.{L}.self_attn.k_proj.weight"},
    {"layers.{L}.attn.v_proj.weight", "model.layers.{L}.self_attn.v_proj.weight"},
    {"layers.{L}.attn.o_proj.weight", "model.layers.{L}.self_attn.o_proj.weight"},
    {"layers.{L}.mlp.router.weight", "model.layers.{L}.block_sparse_moe.gate.weight"},
    {"layers.{L}.mlp.experts.gate_proj.weight", "model.layers.{L}.block_sparse_moe.experts.{E}.w1.weight"},
    {"layers.{L}.mlp.experts.down_proj.weight", "model.layers.{L}.block_sparse_moe.experts.{E}.w2.weight"},
    {"layers.{L}.mlp.experts.up_proj.weight", "model.layers.{L}.block_sparse_moe.experts.{E}.w3.weight"},
    {"layers.{L}.attn_norm.weight", "model.layers.{L}.input_layernorm.weight"},
    {"layers.{L}.mlp_norm.weight", "model.layers.{L}.post_attention_layernorm.weight"},
    {"final_norm.weight", "model.norm.weight"},
    {"lm_head.weight", "lm_head.weight"},
    {NULL, NULL},
};

/* Qwen3MoeForCausalLM: qwen3 attention; MoE layers have the router "gate"
 * and per expert gate/up/down; dense layers (mlp_only_layers) qwen3's MLP. */
static const NamePair qwen3_moe_names[] = {
    {"embed.weight", "model.embed_tokens.weight"},
    {"layers.{L}.attn.q_proj.weight", "model.layers.{L}.self_attn.q_proj.weight"},
    {"layers.{L}.attn.k_proj.weight", "model.layers.{L}.self_attn.k_proj.weight"},
    {"layers.{L}.attn.v_proj.weight", "model.layers.{L}.self_attn.v_proj.weight"},
    {"layers.{L}.attn.o_proj.weight", "model.layers.{L}.self_attn.o_proj.weight"},
    {"layers.{L}.attn.q_norm.weight", "model.layers.{L}.self_attn.q_norm.weight"},
    {"layers.{L}.attn.k_norm.weight", "model.layers.{L}.self_attn.k_norm.weight"},
    {"layers.{L}.mlp.router.weight", "model.layers.{L}.mlp.gate.weight"},
    {"layers.{L}.mlp.experts.gate_proj.weight", "model.layers.{L}.mlp.experts.{E}.gate_proj.weight"},
    {"layers.{L}.mlp.experts.up_proj.weight", "model.layers.{L}.mlp.experts.{E}.up_proj.weight"},
    {"layers.{L}.mlp.experts.down_proj.weight", "model.layers.{L}.mlp.experts.{E}.down_proj.weight"},
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
    case FAMILY_MIXTRAL: return mixtral_names;
    case FAMILY_QWEN3_MOE: return qwen3_moe_names;
    }
    return NULL;
}

/* Does `name` match `pattern`? "{L}" (layer) and "{E}" (expert) stand for
 * canonical non-negative integers (no leading zeros, no sign); on a match
 * *layer and *expert are them (-1 when the pattern has none). */
static int match(const char *pattern, const char *name, long *layer, long *expert) {
    *layer = *expert = -1;
    const char *p = pattern, *n = name;
    while (*p) {
        if (p[0] == '{' && (p[1] == 'L' || p[1] == 'E') && p[2] == '}') {
            if (*n < '0' || *n > '9' || (n[0] == '0' && n[1] >= '0' && n[1] <= '9')) return 0;
            long value = 0;
            for (; *n >= '0' && *n <= '9'; n++) {
                if (value > 100000000L) return 0;
                value = value * 10 + (*n - '0');
            }
            *(p[1] == 'L' ? layer : expert) = value;
            p += 3;
            continue;
        }
        if (*p++ != *n++) return 0;
    }
    return *n == '\0';
}

static int expand(const char *pattern, long layer, long expert, char *out, size_t outlen) {
    size_t used = 0;
    for (const char *p = pattern; *p;) {
        int n;
        if (p[0] == '{' && (p[1] == 'L' || p[1] == 'E') && p[2] == '}') {
            n = snprintf(out + used, outlen - used, "%ld", p[1] == 'L' ? layer : expert);
            p += 3;
        } else {
            n = snprintf(out + used, outlen - used, "%c", *p++);
        }
        if (n < 0 || (size_t)n >= outlen - used) return -1;
        used += (size_t)n;
    }
    if (used == 0 && outlen > 0) out[0] = '\0';
    return 0;
}

/* The table entry whose `ours` (to_hf) or `hf` pattern matches name; -1 when none. */
static long find_entry(const NamePair *table, const char *name, int to_hf, long *layer, long *expert) {
    for (long i = 0; table && table[i].ours; i++)
        if (match(to_hf ? table[i].ours : table[i].hf, name, layer, expert)) return i;
    return -1;
}

static int translate(ModelFamily family, const char *name, int to_hf, char *out, size_t outlen) {
    const NamePair *table = family_table(family);
    long layer, expert;
    long i = find_entry(table, name, to_hf, &layer, &expert);
    if (i < 0) return -1;
    if (to_hf && strstr(table[i].hf, "{E}")) return -1; /* stacked experts: hf_pieces */
    return expand(to_hf ? table[i].hf : table[i].ours, layer, expert, out, outlen);
}

long hf_name_position(ModelFamily family, const char *hf) {
    const NamePair *table = family_table(family);
    if (!table) return -1;
    bool layers_seen = false;
    long first_expert_entry = -1;
    for (long entry = 0; table[entry].ours; entry++) {
        long layer, expert;
        bool per_layer = strstr(table[entry].hf, "{L}") != NULL;
        layers_seen = layers_seen || per_layer;
        if (strstr(table[entry].hf, "{E}") && first_expert_entry < 0) first_expert_entry = entry;
        if (!match(table[entry].hf, hf, &layer, &expert)) continue;
        /* before the layers: group 0; layer l: group l + 1; after them: last;
         * within a layer by entry, the experts one after the other (each's
         * tensors in table order), as transformers' ModuleList of experts */
        long group = per_layer ? layer + 1 : layers_seen ? 100000000L + 1 : 0;
        long slot = expert < 0 ? entry << 24 : (first_expert_entry << 24) + expert * 64 + (entry - first_expert_entry);
        return (group << 32) + slot;
    }
    return -1;
}

int hf_name_from_ours(ModelFamily family, const char *ours, char *out, size_t outlen) {
    return translate(family, ours, 1, out, outlen);
}

int hf_name_to_ours(ModelFamily family, const char *hf, char *out, size_t outlen) {
    return translate(family, hf, 0, out, outlen);
}

int hf_pieces(ModelFamily family, const ParamInfo *info, int num_experts, HfPiece *pieces, int max) {
    const NamePair *table = family_table(family);
    long layer, expert;
    long i = find_entry(table, info->name, 1, &layer, &expert);
    if (i < 0 || max < 1) return -1;
    if (!strstr(table[i].hf, "{E}")) {
        if (info->ndim > 2 || expand(table[i].hf, layer, -1, pieces[0].name, sizeof pieces[0].name) != 0) return -1;
        pieces[0].offset = 0;
        pieces[0].ndim = info->ndim;
        pieces[0].shape[0] = info->shape[0];
        pieces[0].shape[1] = info->shape[1];
        pieces[0].position = hf_name_position(family, pieces[0].name);
        return 1;
    }
    if (info->ndim != 3 || num_experts < 1 || num_experts > max || info->shape[0] != num_experts) return -1;
    for (int e = 0; e < num_experts; e++) {
        if (expand(table[i].hf, layer, e, pieces[e].name, sizeof pieces[e].name) != 0) return -1;
        pieces[e].offset = e * info->shape[1] * info->shape[2];
        pieces[e].ndim = 2;
        pieces[e].shape[0] = info->shape[1];
        pieces[e].shape[1] = info->shape[2];
        pieces[e].position = hf_name_position(family, pieces[e].name);
    }
    return num_experts;
}
