/* hf_names.c: the one table between our registry names and transformers'
 * names for every family ("{L}" stands for a layer index, "{E}" for an
 * expert), and the matching of a concrete name against a pattern. */
#include "hf_names.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

typedef struct NamePair {
    const char *ours;
    const char *hf;
} NamePair;

/* Families as bits, for the one table below. */
enum {
    LLAMA = 1 << FAMILY_LLAMA,
    QWEN2 = 1 << FAMILY_QWEN2,
    QWEN3 = 1 << FAMILY_QWEN3,
    MIXTRAL = 1 << FAMILY_MIXTRAL,
    QWEN3_MOE = 1 << FAMILY_QWEN3_MOE,
    ALL = LLAMA | QWEN2 | QWEN3 | MIXTRAL | QWEN3_MOE,
    DENSE_MLP = ALL & ~MIXTRAL, /* qwen3_moe's dense layers (mlp_only_layers) too */
};

/* One table beside the registry (src/model/model_registry.c declares the
 * names; this only pairs them with transformers'): every family's names, each
 * row marked with the families that have it. A family's rows, in table order,
 * are transformers' state_dict order (its module order): embeddings, then per
 * layer self_attn (q, k, v, o with qwen2's biases, then qwen3's q_norm and
 * k_norm), the MLP (router and experts, or gate, up, down), the two layer
 * norms, then the final norm and lm_head. Writing follows that order, so
 * shards split where save_pretrained splits them. Mixtral's sparse block has
 * the router "gate" and per expert w1 (gate), w2 (down), w3 (up); "{E}" is
 * the expert: our stacked tensors hold expert e in row block e. */
static const struct {
    NamePair names;
    unsigned families;
} all_names[] = {
    {{"embed.weight", "model.embed_tokens.weight"}, ALL},
    {{"layers.{L}.attn.q_proj.weight", "model.layers.{L}.self_attn.q_proj.weight"}, ALL},
    {{"layers.{L}.attn.q_proj.bias", "model.layers.{L}.self_attn.q_proj.bias"}, QWEN2},
    {{"layers.{L}.attn.k_proj.weight", "model.layers.{L}.self_attn.k_proj.weight"}, ALL},
    {{"layers.{L}.attn.k_proj.bias", "model.layers.{L}.self_attn.k_proj.bias"}, QWEN2},
    {{"layers.{L}.attn.v_proj.weight", "model.layers.{L}.self_attn.v_proj.weight"}, ALL},
    {{"layers.{L}.attn.v_proj.bias", "model.layers.{L}.self_attn.v_proj.bias"}, QWEN2},
    {{"layers.{L}.attn.o_proj.weight", "model.layers.{L}.self_attn.o_proj.weight"}, ALL},
    {{"layers.{L}.attn.q_norm.weight", "model.layers.{L}.self_attn.q_norm.weight"}, QWEN3 | QWEN3_MOE},
    {{"layers.{L}.attn.k_norm.weight", "model.layers.{L}.self_attn.k_norm.weight"}, QWEN3 | QWEN3_MOE},
    {{"layers.{L}.mlp.router.weight", "model.layers.{L}.block_sparse_moe.gate.weight"}, MIXTRAL},
    {{"layers.{L}.mlp.experts.gate_proj.weight", "model.layers.{L}.block_sparse_moe.experts.{E}.w1.weight"}, MIXTRAL},
    {{"layers.{L}.mlp.experts.down_proj.weight", "model.layers.{L}.block_sparse_moe.experts.{E}.w2.weight"}, MIXTRAL},
    {{"layers.{L}.mlp.experts.up_proj.weight", "model.layers.{L}.block_sparse_moe.experts.{E}.w3.weight"}, MIXTRAL},
    {{"layers.{L}.mlp.router.weight", "model.layers.{L}.mlp.gate.weight"}, QWEN3_MOE},
    {{"layers.{L}.mlp.experts.gate_proj.weight", "model.layers.{L}.mlp.experts.{E}.gate_proj.weight"}, QWEN3_MOE},
    {{"layers.{L}.mlp.experts.up_proj.weight", "model.layers.{L}.mlp.experts.{E}.up_proj.weight"}, QWEN3_MOE},
    {{"layers.{L}.mlp.experts.down_proj.weight", "model.layers.{L}.mlp.experts.{E}.down_proj.weight"}, QWEN3_MOE},
    {{"layers.{L}.mlp.gate_proj.weight", "model.layers.{L}.mlp.gate_proj.weight"}, DENSE_MLP},
    {{"layers.{L}.mlp.up_proj.weight", "model.layers.{L}.mlp.up_proj.weight"}, DENSE_MLP},
    {{"layers.{L}.mlp.down_proj.weight", "model.layers.{L}.mlp.down_proj.weight"}, DENSE_MLP},
    {{"layers.{L}.attn_norm.weight", "model.layers.{L}.input_layernorm.weight"}, ALL},
    {{"layers.{L}.mlp_norm.weight", "model.layers.{L}.post_attention_layernorm.weight"}, ALL},
    {{"final_norm.weight", "model.norm.weight"}, ALL},
    {{"lm_head.weight", "lm_head.weight"}, ALL},
};
enum { NUM_NAMES = sizeof all_names / sizeof all_names[0], NUM_FAMILIES = FAMILY_QWEN3_MOE + 1 };

/* Each family's rows of all_names, in order, ended by {NULL, NULL}. */
static NamePair family_tables[NUM_FAMILIES][NUM_NAMES + 1];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void build_family_tables(void) {
    for (int f = 0; f < NUM_FAMILIES; f++)
        for (int i = 0, n = 0; i < NUM_NAMES; i++)
            if (all_names[i].families & (1u << f)) family_tables[f][n++] = all_names[i].names;
}

static const NamePair *family_table(ModelFamily family) {
    if ((int)family < 0 || (int)family >= NUM_FAMILIES) return NULL;
    pthread_once(&tables_once, build_family_tables);
    return family_tables[family];
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
