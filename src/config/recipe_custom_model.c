/* recipe_custom_model.c: model keys that are not plain scalars:
 * rope_scaling (null or a llama3 mapping), moe.layer_freq (N or a 0/1 list),
 * and writing the moe block only for MoE families; which layers are MoE;
 * the comparisons of these keys between a checkpoint's model and a
 * recipe's. */
#include <string.h>

#include "recipe_schema.h"

static int read_rope_type(void *base, const YEntry *entry, const char *path, char *err, size_t errlen) {
    char found[128];
    /* Hugging Face's "default" is no scaling, as null is */
    if (entry->value->kind == YNODE_SCALAR && strcmp(entry->value->text, "default") == 0) {
        ((RopeScaling *)base)->enabled = false;
        return 0;
    }
    if (entry->value->kind != YNODE_SCALAR || strcmp(entry->value->text, "llama3") != 0)
        return key_error(err, errlen, entry->loc, path,
                         "expected llama3 (the only supported rope scaling) or default (none), found %s",
                         ytree_describe(entry->value, found, sizeof found));
    return 0;
}

static const RecipeKey rope_keys[] = {
    {.name = "type", .type = KT_CUSTOM, .read = read_rope_type},
    {.name = "rope_type", .type = KT_CUSTOM, .read = read_rope_type},
    {.name = "factor", .type = KT_DOUBLE, .offset = offsetof(RopeScaling, factor), .ranged = true, .min = 0,
     .max = MT_NO_MAX, .above_min = true, .match = MODEL_MATCH_FUNCTION},
    {.name = "low_freq_factor", .type = KT_DOUBLE, .offset = offsetof(RopeScaling, low_freq_factor), .ranged = true,
     .min = 0, .max = MT_NO_MAX, .above_min = true, .match = MODEL_MATCH_FUNCTION},
    {.name = "high_freq_factor", .type = KT_DOUBLE, .offset = offsetof(RopeScaling, high_freq_factor), .ranged = true,
     .min = 0, .max = MT_NO_MAX, .above_min = true, .match = MODEL_MATCH_FUNCTION},
    {.name = "original_max_position_embeddings", .type = KT_INT,
     .offset = offsetof(RopeScaling, original_max_position_embeddings), .ranged = true, .min = 1, .max = MT_NO_MAX,
     .match = MODEL_MATCH_FUNCTION},
    {0},
};

int read_rope_scaling(void *base, const YEntry *entry, const char *path, char *err, size_t errlen) {
    ModelConfig *model = base;
    RopeScaling *rope = &model->rope_scaling;
    char found[128], key_path[MT_KEY_PATH_MAX];
    if (ytree_is_null(entry->value)) {
        memset(rope, 0, sizeof *rope);
        return 0;
    }
    if (entry->value->kind != YNODE_MAPPING)
        return key_error(err, errlen, entry->loc, path,
                         "expected null or a mapping {type: llama3, factor, low_freq_factor, high_freq_factor, "
                         "original_max_position_embeddings}, found %s",
                         ytree_describe(entry->value, found, sizeof found));
    *rope = (RopeScaling){.enabled = true, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4,
                          .original_max_position_embeddings = 8192};
    if (read_section(rope, rope_keys, entry->value, entry->loc, path, err, errlen) != 0) return -1;
    /* the type says which scaling: an empty or partial mapping used to turn Llama 3.1's on with its defaults */
    if (!ytree_entry(entry->value, "type") && !ytree_entry(entry->value, "rope_type"))
        return key_error(err, errlen, entry->loc, path,
                         "expected a type: {type: llama3, factor, low_freq_factor, high_freq_factor, "
                         "original_max_position_embeddings}, or null for none");
    if (!rope->enabled) {
        memset(rope, 0, sizeof *rope);
        return 0;
    }
    if (rope->high_freq_factor <= rope->low_freq_factor) {
        const YEntry *at = ytree_entry(entry->value, "high_freq_factor");
        return key_error(err, errlen, at ? at->loc : entry->loc, join_path(key_path, sizeof key_path, path, "high_freq_factor"),
                         "expected a value above low_freq_factor (%g), found %g", rope->low_freq_factor,
                         rope->high_freq_factor);
    }
    return 0;
}

void write_rope_scaling(FILE *out, const void *base, const char *name, int indent) {
    const RopeScaling *rope = &((const ModelConfig *)base)->rope_scaling;
    fprintf(out, "%*s%s: ", indent, "", name);
    if (!rope->enabled) {
        fprintf(out, "null\n");
        return;
    }
    fprintf(out, "{type: llama3, factor: ");
    write_yaml_double(out, rope->factor);
    fprintf(out, ", low_freq_factor: ");
    write_yaml_double(out, rope->low_freq_factor);
    fprintf(out, ", high_freq_factor: ");
    write_yaml_double(out, rope->high_freq_factor);
    fprintf(out, ", original_max_position_embeddings: %d}\n", rope->original_max_position_embeddings);
}

int read_layer_freq(void *base, const YEntry *entry, const char *path, char *err, size_t errlen) {
    MoeConfig *moe = base;
    const YNode *node = entry->value;
    char found[128];
    long long value;
    if (node->kind == YNODE_SEQUENCE) {
        if (node->count < 1 || node->count > MT_MAX_LAYERS)
            return key_error(err, errlen, entry->loc, path, "expected a list of 1..%d zeros and ones, found %d items",
                             MT_MAX_LAYERS, node->count);
        memset(moe->layer_mask, 0, sizeof moe->layer_mask);
        for (int i = 0; i < node->count; i++) {
            const YNode *item = node->entries[i].value;
            if (yscalar_long(item, &value) != 0 || (value != 0 && value != 1))
                return key_error(err, errlen, node->entries[i].loc, path, "expected item %d to be 0 or 1, found %s", i,
                                 ytree_describe(item, found, sizeof found));
            moe->layer_mask[i] = (unsigned char)value;
        }
        moe->layer_mask_given = true;
        moe->layer_freq = 1;
        return 0;
    }
    if (yscalar_long(node, &value) != 0 || value < 1 || value > MT_MAX_LAYERS)
        return key_error(err, errlen, entry->loc, path, "expected an integer in 1..%d or a list of 0/1 per layer, found %s",
                         MT_MAX_LAYERS, ytree_describe(node, found, sizeof found));
    moe->layer_freq = (int)value;
    moe->layer_mask_given = false;
    memset(moe->layer_mask, 0, sizeof moe->layer_mask);
    return 0;
}

/* Needs num_layers, so it is called by write_moe_section with the model. */
static void write_layer_freq_of(FILE *out, const ModelConfig *model, int indent) {
    const MoeConfig *moe = &model->moe;
    fprintf(out, "%*slayer_freq: ", indent, "");
    if (!moe->layer_mask_given) {
        fprintf(out, "%d\n", moe->layer_freq);
        return;
    }
    fputc('[', out);
    for (int i = 0; i < model->num_layers; i++) fprintf(out, "%s%d", i ? ", " : "", moe->layer_mask[i]);
    fprintf(out, "]\n");
}

void write_layer_freq(FILE *out, const void *base, const char *name, int indent) {
    (void)out, (void)base, (void)name, (void)indent; /* written by write_moe_section */
}

void write_moe_section(FILE *out, const void *base, const char *name, int indent) {
    const ModelConfig *model = base;
    if (!model_family_is_moe(model->family)) return;
    const RecipeKey *moe_key = find_key(recipe_model_keys, "moe");
    fprintf(out, "%*s%s:\n", indent, "", name);
    write_section(out, &model->moe, moe_key->keys, indent + 2);
    write_layer_freq_of(out, model, indent + 2);
}

bool model_family_is_moe(ModelFamily family) { return family == FAMILY_MIXTRAL || family == FAMILY_QWEN3_MOE; }

bool model_layer_is_moe(const ModelConfig *cfg, int layer) {
    if (!model_family_is_moe(cfg->family)) return false;
    if (cfg->moe.layer_mask_given) return cfg->moe.layer_mask[layer] != 0;
    return layer % (cfg->moe.layer_freq > 0 ? cfg->moe.layer_freq : 1) == 0;
}

/* ---- a checkpoint's model against a recipe's (model_config_compare.c) ---- */

int differ_rope_scaling(const void *ckpt, const void *recipe, const char *path, ModelMatch level, char *why,
                        size_t whylen) {
    const RopeScaling *a = &((const ModelConfig *)ckpt)->rope_scaling, *b = &((const ModelConfig *)recipe)->rope_scaling;
    if (a->enabled != b->enabled)
        return say_difference(path, a->enabled ? "llama3" : "null", b->enabled ? "llama3" : "null", why, whylen);
    return a->enabled ? section_difference(a, b, rope_keys, path, level, why, whylen) : 0; /* none: nothing to say */
}

/* The section's keys, then which layers are MoE (layer_freq needs num_layers, as its writer does). */
int differ_moe_section(const void *ckpt, const void *recipe, const char *path, ModelMatch level, char *why,
                       size_t whylen) {
    const ModelConfig *a = ckpt, *b = recipe;
    if (!model_family_is_moe(a->family) || !model_family_is_moe(b->family)) return 0; /* no experts (family: first) */
    if (section_difference(&a->moe, &b->moe, find_key(recipe_model_keys, "moe")->keys, path, level, why, whylen) != 0)
        return -1;
    for (int l = 0; l < a->num_layers && l < b->num_layers; l++) {
        if (model_layer_is_moe(a, l) == model_layer_is_moe(b, l)) continue;
        snprintf(why, whylen, "layer %d is %s in the checkpoint but %s in the recipe (%s.layer_freq)", l,
                 model_layer_is_moe(a, l) ? "MoE" : "dense", model_layer_is_moe(b, l) ? "MoE" : "dense", path);
        return -1;
    }
    return 0;
}

int differ_layer_freq(const void *ckpt, const void *recipe, const char *path, ModelMatch level, char *why,
                      size_t whylen) {
    (void)ckpt, (void)recipe, (void)path, (void)level, (void)why, (void)whylen;
    return 0; /* compared by differ_moe_section, which has num_layers */
}
