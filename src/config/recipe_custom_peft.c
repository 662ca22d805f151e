/* recipe_custom_peft.c: the peft keys that are not plain scalars:
 * peft.target_modules (a list of PEFT's module names, or "all-linear"),
 * writing the section only when LoRA is on, reading a `peft:` block
 * from a checkpoint's model.yaml with the same table, and comparing two
 * adapters' target modules. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe_schema.h"

/* The table of the root key `peft` (recipe_schema.c declares it once). */
static const RecipeKey *peft_keys(void) { return find_key(recipe_root_keys, "peft")->keys; }

static int target_index(const char *name) {
    for (int t = 0; lora_target_names[t]; t++)
        if (strcmp(name, lora_target_names[t]) == 0) return t;
    return -1;
}

static void target_list(char *out, size_t len) {
    out[0] = '\0';
    for (int t = 0; lora_target_names[t]; t++) {
        size_t used = strlen(out);
        snprintf(out + used, len - used, "%s%s", t ? ", " : "", lora_target_names[t]);
    }
}

/* "[q_proj, v_proj]" */
static void targets_text(unsigned targets, char *out, size_t len) {
    size_t used = (size_t)snprintf(out, len, "[");
    for (int t = 0, n = 0; t < LORA_NUM_TARGETS && used < len; t++)
        if (targets >> t & 1u)
            used += (size_t)snprintf(out + used, len - used, "%s%s", n++ ? ", " : "", lora_target_names[t]);
    if (used < len) snprintf(out + used, len - used, "]");
}

void peft_config_text(const PeftConfig *peft, char *out, size_t len) {
    char targets[160], alpha[32];
    targets_text(peft->targets, targets, sizeof targets);
    snprintf(alpha, sizeof alpha, "%.15g", peft->alpha); /* the shortest that reads back as the same alpha */
    if (strtod(alpha, NULL) != peft->alpha) snprintf(alpha, sizeof alpha, "%.17g", peft->alpha);
    snprintf(out, len, "{type: lora, rank: %d, alpha: %s, target_modules: %s}", peft->rank, alpha, targets);
}

int read_target_modules(void *base, const YEntry *entry, const char *path, char *err, size_t errlen) {
    PeftConfig *peft = base;
    const YNode *node = entry->value;
    char found[128], names[160];
    target_list(names, sizeof names);
    if (node->kind == YNODE_SCALAR && strcmp(node->text, "all-linear") == 0) { /* PEFT's shorthand */
        peft->targets = LORA_ALL_TARGETS;
        return 0;
    }
    const bool one_name = node->kind == YNODE_SCALAR && target_index(node->text) >= 0;
    if (node->kind != YNODE_SEQUENCE || node->count == 0)
        return key_error(err, errlen, entry->loc, path, "expected a non-empty list of module names (%s) or all-linear, "
                         "found %s%s%s%s", names,
                         node->kind == YNODE_SEQUENCE ? "an empty list" : ytree_describe(node, found, sizeof found),
                         one_name ? " (one module is a list of one: [" : "", one_name ? node->text : "",
                         one_name ? "]; PEFT reads a lone string as a regular expression of whole module paths)" : "");
    unsigned targets = 0;
    for (int i = 0; i < node->count; i++) {
        const YNode *item = node->entries[i].value;
        /* a name, or its path as PEFT matches it (self_attn.q_proj, mlp.down_proj: every layer's) */
        LoraTarget matched;
        long layer = -1;
        const bool scalar = item->kind == YNODE_SCALAR;
        const int t = scalar && lora_target_match(item->text, &matched, &layer) == 0 ? (int)matched : -1;
        if (t >= 0 && layer >= 0)
            return key_error(err, errlen, node->entries[i].loc, path, "item %d: %s names layer %ld alone: LoRA here "
                             "adapts a projection in every layer (list %s)", i, item->text, layer,
                             lora_target_names[t]);
        if (scalar && strcmp(item->text, "all-linear") == 0)
            return key_error(err, errlen, node->entries[i].loc, path, "item %d: all-linear stands alone, not in a list "
                             "(target_modules: all-linear)", i);
        const char *guess = t < 0 && scalar ? suggest_name(lora_target_names, item->text) : NULL;
        char hint[64] = "";
        if (guess) snprintf(hint, sizeof hint, " (did you mean %s?)", guess);
        if (t < 0)
            return key_error(err, errlen, node->entries[i].loc, path,
                             "item %d: %s is not a layer LoRA adapts here%s; expected one of %s (PEFT's and Hugging "
                             "Face's names of the dense attention and MLP projections)", i,
                             ytree_describe(item, found, sizeof found), hint, names);
        if (targets >> t & 1u)
            return key_error(err, errlen, node->entries[i].loc, path, "item %d: %s is listed twice", i,
                             lora_target_names[t]);
        targets |= 1u << t;
    }
    peft->targets = targets;
    return 0;
}

void write_target_modules(FILE *out, const void *base, const char *name, int indent) {
    char list[160];
    targets_text(((const PeftConfig *)base)->targets, list, sizeof list);
    fprintf(out, "%*s%s: %s\n", indent, "", name, list);
}

int differ_target_modules(const void *ckpt, const void *recipe, const char *path, ModelMatch level, char *why,
                          size_t whylen) {
    (void)level;
    const PeftConfig *a = ckpt, *b = recipe;
    if (a->targets == b->targets) return 0;
    char x[160], y[160];
    targets_text(a->targets, x, sizeof x);
    targets_text(b->targets, y, sizeof y);
    return say_difference(path, x, y, why, whylen);
}

void write_peft_of(FILE *out, const PeftConfig *peft, int indent) {
    if (peft->type == PEFT_NONE) return;
    fprintf(out, "%*speft:\n", indent, "");
    write_section(out, peft, peft_keys(), indent + 2);
}

void write_peft_section(FILE *out, const void *base, const char *name, int indent) {
    (void)name;
    write_peft_of(out, &((const Recipe *)base)->model.peft, indent);
}

int read_peft_section(PeftConfig *peft, const YEntry *entry, char *err, size_t errlen) {
    if (ytree_is_null(entry->value)) return 0;
    return read_section(peft, peft_keys(), entry->value, entry->loc, "peft", err, errlen);
}
