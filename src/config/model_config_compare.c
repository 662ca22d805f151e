/* model_config_compare.c: a checkpoint's model against a recipe's, driven by
 * the schema: each model and peft key says what the two must agree on
 * (RecipeKey.match: WEIGHTS or FUNCTION, recipe_schema.c), so resume's and
 * init_from's checks list no keys of their own. Plain values compare here;
 * the keys whose value needs the section around it (the rope_scaling
 * block, the moe block and its layers, the adapters' target modules) bring
 * their own comparison (RecipeKey.differ,
 * recipe_custom_model.c and recipe_custom_peft.c). */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../core/error.h"
#include "recipe_schema.h"

int say_difference(const char *path, const char *ckpt, const char *recipe, char *why, size_t whylen) {
    snprintf(why, whylen, "%s is %s in the checkpoint but %s in the recipe", path, ckpt, recipe);
    return -1;
}

/* A plain key's value as text; whether a and b hold the same value. */
static bool same_value(const RecipeKey *key, const char *a, const char *b, char *ta, char *tb, size_t len) {
    switch (key->type) {
    case KT_INT:
        snprintf(ta, len, "%d", *(const int *)a), snprintf(tb, len, "%d", *(const int *)b);
        return *(const int *)a == *(const int *)b;
    case KT_LONG:
        snprintf(ta, len, "%ld", *(const long *)a), snprintf(tb, len, "%ld", *(const long *)b);
        return *(const long *)a == *(const long *)b;
    case KT_U64:
        snprintf(ta, len, "%llu", (unsigned long long)*(const uint64_t *)a);
        snprintf(tb, len, "%llu", (unsigned long long)*(const uint64_t *)b);
        return *(const uint64_t *)a == *(const uint64_t *)b;
    case KT_DOUBLE:
        snprintf(ta, len, "%.17g", *(const double *)a), snprintf(tb, len, "%.17g", *(const double *)b);
        return *(const double *)a == *(const double *)b;
    case KT_BOOL:
        snprintf(ta, len, "%s", *(const bool *)a ? "true" : "false");
        snprintf(tb, len, "%s", *(const bool *)b ? "true" : "false");
        return *(const bool *)a == *(const bool *)b;
    case KT_ENUM:
        snprintf(ta, len, "%s", key->names[*(const int *)a]), snprintf(tb, len, "%s", key->names[*(const int *)b]);
        return *(const int *)a == *(const int *)b;
    case KT_STRING:
        snprintf(ta, len, "'%s'", a), snprintf(tb, len, "'%s'", b);
        return strcmp(a, b) == 0;
    default: return true; /* sections and custom keys: never here */
    }
}

int section_difference(const void *ckpt, const void *recipe, const RecipeKey *keys, const char *prefix,
                       ModelMatch level, char *why, size_t whylen) {
    for (const RecipeKey *key = keys; key->name; key++) {
        if (!key->match || key->match > level) continue;
        char path[MT_KEY_PATH_MAX];
        join_path(path, sizeof path, prefix, key->name);
        if (key->differ) {
            if (key->differ(ckpt, recipe, path, level, why, whylen) != 0) return -1;
            continue;
        }
        if (key->type == KT_CUSTOM) mt_die(MT_EXIT_FAILURE, "recipe schema: %s is compared but says not how", path);
        const char *a = (const char *)ckpt + key->offset, *b = (const char *)recipe + key->offset;
        if (key->type == KT_SECTION) {
            if (section_difference(a, b, key->keys, path, level, why, whylen) != 0) return -1;
            continue;
        }
        char ta[64], tb[64];
        if (!same_value(key, a, b, ta, tb, sizeof ta)) return say_difference(path, ta, tb, why, whylen);
    }
    return 0;
}

int model_config_difference(const ModelConfig *ckpt, const ModelConfig *recipe, ModelMatch level, char *why,
                            size_t whylen) {
    return section_difference(ckpt, recipe, recipe_model_keys, "model", level, why, whylen);
}

int peft_config_difference(const PeftConfig *ckpt, const PeftConfig *recipe, ModelMatch level, char *why,
                           size_t whylen) {
    return section_difference(ckpt, recipe, find_key(recipe_root_keys, "peft")->keys, "peft", level, why, whylen);
}
