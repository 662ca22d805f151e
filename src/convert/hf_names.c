/* hf_names.c: the one table between our registry names and transformers'
 * names for every family ("{L}" stands for a layer index, "{E}" for an
 * expert), and the matching of a concrete name against a pattern. */
#include "hf_names.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
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
 * are transformers' module order: embeddings, then per layer self_attn (q, k,
 * v, o with qwen2's biases, then qwen3's q_norm and k_norm), the MLP (router
 * and experts, or gate, up, down), the two layer norms, then the final norm
 * and lm_head. Mixtral's sparse block has the router "gate" and per expert
 * w1 (gate), w2 (down), w3 (up); "{E}" is the expert: our stacked tensors
 * hold expert e in row block e.
 *
 * fused_names below says where the MoE rows live in transformers 5's model. */
typedef struct NameRow {
    NamePair names;
    unsigned families;
} NameRow;

static const NameRow all_names[] = {
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

/* Where a Hub tensor lives in transformers 5's model, when elsewhere: each
 * MoE layer's experts are two fused parameters, mlp.experts.gate_up_proj
 * [E, 2I, C] (part 0 the gate, part 1 the up projection) and
 * mlp.experts.down_proj [E, C, I], and Mixtral's block_sparse_moe is mlp
 * (transformers/conversion_mapping.py: "mixtral", and "qwen2_moe", which
 * qwen3_moe uses). hf_name_position orders the sorted families by these. */
static const struct {
    const char *hf, *fused;
    int part;
} fused_names[] = {
    {"model.layers.{L}.block_sparse_moe.gate.weight", "model.layers.{L}.mlp.gate.weight", 0},
    {"model.layers.{L}.block_sparse_moe.experts.{E}.w1.weight", "model.layers.{L}.mlp.experts.gate_up_proj", 0},
    {"model.layers.{L}.block_sparse_moe.experts.{E}.w3.weight", "model.layers.{L}.mlp.experts.gate_up_proj", 1},
    {"model.layers.{L}.block_sparse_moe.experts.{E}.w2.weight", "model.layers.{L}.mlp.experts.down_proj", 0},
    {"model.layers.{L}.mlp.experts.{E}.gate_proj.weight", "model.layers.{L}.mlp.experts.gate_up_proj", 0},
    {"model.layers.{L}.mlp.experts.{E}.up_proj.weight", "model.layers.{L}.mlp.experts.gate_up_proj", 1},
    {"model.layers.{L}.mlp.experts.{E}.down_proj.weight", "model.layers.{L}.mlp.experts.down_proj", 0},
};

/* The families whose save_pretrained (transformers 5) sorts the state_dict
 * by name before sharding: revert_weight_conversion
 * (transformers/core_model_loading.py) sorts by dot_natural_key whenever the
 * model has weight conversions, which the MoE families always have (their
 * fused experts). A dense model built in Python has none and keeps module
 * order (as transformers 4 saved every model). */
static const unsigned sorted_on_save = MIXTRAL | QWEN3_MOE;

/* Each family's rows of all_names, in order, ended by {NULL, NULL}; `row`
 * the matching all_names entry and `rank` its place in save order among the
 * family's rows (table order, or sorted as sorted_on_save says). */
static NamePair family_tables[NUM_FAMILIES][NUM_NAMES + 1];
static const NameRow *family_rows[NUM_FAMILIES][NUM_NAMES];
static long family_ranks[NUM_FAMILIES][NUM_NAMES];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static int expand(const char *pattern, long layer, long expert, char *out, size_t outlen);

/* The name a row sorts by when saved (its transformers 5 name, layer 0), and its part. */
static int save_name(const NameRow *row, char *out, size_t outlen) {
    for (size_t i = 0; i < sizeof fused_names / sizeof fused_names[0]; i++)
        if (strcmp(fused_names[i].hf, row->names.hf) == 0) {
            expand(fused_names[i].fused, 0, 0, out, outlen);
            return fused_names[i].part;
        }
    expand(row->names.hf, 0, 0, out, outlen);
    return 0;
}

/* Python's dot_natural_key order (transformers/core_model_loading.py):
 * names split at '.'; an all-digit part is a number and comes before any
 * other part; other parts compare as text, then by a numeric suffix
 * ("shard_2" < "shard_11"); a name that is a prefix of another comes first. */
static int dot_natural_compare(const char *a, const char *b) {
    for (;;) {
        size_t la = strcspn(a, "."), lb = strcspn(b, ".");
        size_t ta = la, tb = lb; /* the text before a numeric suffix */
        while (ta > 0 && a[ta - 1] >= '0' && a[ta - 1] <= '9') ta--;
        while (tb > 0 && b[tb - 1] >= '0' && b[tb - 1] <= '9') tb--;
        const bool da = la > 0 && ta == 0, db = lb > 0 && tb == 0; /* all digits */
        if (da != db) return da ? -1 : 1;
        int c = 0;
        if (!da) { /* text, then the numeric suffix (none before any) */
            c = memcmp(a, b, ta < tb ? ta : tb);
            if (c == 0 && ta != tb) c = ta < tb ? -1 : 1;
            if (c == 0 && (ta == la) != (tb == lb)) c = ta == la ? -1 : 1;
        }
        if (c == 0 && (da || ta < la)) { /* numbers: fewer digits (no leading zeros in our names) first */
            size_t na = la - ta, nb = lb - tb;
            c = na != nb ? (na < nb ? -1 : 1) : memcmp(a + ta, b + tb, na);
        }
        if (c != 0) return c < 0 ? -1 : 1;
        if (a[la] == '\0' || b[lb] == '\0') return a[la] == b[lb] ? 0 : a[la] == '\0' ? -1 : 1;
        a += la + 1;
        b += lb + 1;
    }
}

static int family_of_sort; /* build_family_tables runs once, under pthread_once */
static int compare_rows(const void *x, const void *y) {
    const NameRow *a = family_rows[family_of_sort][*(const int *)x], *b = family_rows[family_of_sort][*(const int *)y];
    char na[160], nb[160];
    const int pa = save_name(a, na, sizeof na), pb = save_name(b, nb, sizeof nb);
    int c = dot_natural_compare(na, nb);
    return c ? c : pa - pb;
}

static void build_family_tables(void) {
    for (int f = 0; f < NUM_FAMILIES; f++) {
        int n = 0;
        for (int i = 0; i < NUM_NAMES; i++)
            if (all_names[i].families & (1u << f)) {
                family_rows[f][n] = &all_names[i];
                family_tables[f][n++] = all_names[i].names;
            }
        int order[NUM_NAMES];
        for (int i = 0; i < n; i++) order[i] = i;
        if (sorted_on_save & (1u << f)) {
            family_of_sort = f;
            qsort(order, (size_t)n, sizeof order[0], compare_rows);
        }
        for (int i = 0; i < n; i++) family_ranks[f][order[i]] = i;
    }
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
    const bool sorted = sorted_on_save & (1u << family);
    /* the first per-layer row: a row outside the layers sorts before or after it */
    long first_layer_row = -1;
    for (long entry = 0; table[entry].ours && first_layer_row < 0; entry++)
        if (strstr(table[entry].hf, "{L}")) first_layer_row = entry;
    bool layers_seen = false;
    for (long entry = 0; table[entry].ours; entry++) {
        long layer, expert;
        bool per_layer = strstr(table[entry].hf, "{L}") != NULL;
        layers_seen = layers_seen || per_layer;
        if (!match(table[entry].hf, hf, &layer, &expert)) continue;
        /* before the layers: group 0; layer l: group l + 1; after them: last */
        bool after = layers_seen;
        if (sorted && !per_layer && first_layer_row >= 0) {
            char mine[160], first[160];
            save_name(family_rows[family][entry], mine, sizeof mine);
            save_name(family_rows[family][first_layer_row], first, sizeof first);
            after = dot_natural_compare(mine, first) > 0;
        }
        long group = per_layer ? layer + 1 : after ? 100000000L + 1 : 0;
        /* within a group by rank; the experts of a row one after the other
         * (sorted: all experts' gate, then all up, as transformers 5 splits
         * the fused tensor); module order: expert after expert, each's
         * tensors in table order, as transformers 4's ModuleList */
        long slot;
        if (expert < 0) slot = family_ranks[family][entry] << 24;
        else if (sorted) slot = (family_ranks[family][entry] << 24) + expert;
        else {
            long first_expert_entry = entry;
            while (first_expert_entry > 0 && strstr(table[first_expert_entry - 1].hf, "{E}")) first_expert_entry--;
            slot = (first_expert_entry << 24) + expert * 64 + (entry - first_expert_entry);
        }
        return (group << 32) + slot;
    }
    return -1;
}

int hf_fused_source(const char *hub, char *fused, size_t fusedlen, long *expert, int *part, int *parts) {
    const size_t rows = sizeof fused_names / sizeof fused_names[0];
    for (size_t i = 0; i < rows; i++) {
        long layer;
        if (!match(fused_names[i].hf, hub, &layer, expert)) continue;
        if (expand(fused_names[i].fused, layer, -1, fused, fusedlen) != 0) return -1;
        *part = fused_names[i].part;
        *parts = 1;
        for (size_t j = 0; j < rows; j++)
            if (strcmp(fused_names[j].fused, fused_names[i].fused) == 0 && fused_names[j].part + 1 > *parts)
                *parts = fused_names[j].part + 1;
        return 0;
    }
    return -1;
}

bool hf_saves_fused_experts(ModelFamily family) {
    return (int)family >= 0 && (int)family < NUM_FAMILIES && (sorted_on_save & (1u << family));
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
