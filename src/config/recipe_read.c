/* recipe_read.c: the table-driven walk of a YAML mapping into a config
 * struct: scalar parsing, type and range errors, unknown keys with
 * "did you mean" suggestions, required keys. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "recipe_schema.h"
#include "../core/cli.h"
#include "../core/error.h"

int key_error(char *err, size_t errlen, YLoc loc, const char *path, const char *fmt, ...) {
    char where[MT_LOC_BUF], message[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    mt_set_error(err, errlen, "%s: %s: %s", yloc_format(loc, where, sizeof where), path, message);
    return -1;
}

const char *join_path(char *buf, size_t buflen, const char *prefix, const char *name) {
    if (prefix[0]) snprintf(buf, buflen, "%s.%s", prefix, name);
    else snprintf(buf, buflen, "%s", name);
    return buf;
}

int yscalar_double(const YNode *node, double *out) {
    if (!node || node->kind != YNODE_SCALAR || node->quoted || node->text[0] == '\0') return -1;
    char *end;
    errno = 0;
    double value = strtod(node->text, &end);
    if (*end != '\0' || errno == ERANGE || !isfinite(value)) return -1;
    *out = value;
    return 0;
}

int yscalar_long(const YNode *node, long long *out) {
    if (!node || node->kind != YNODE_SCALAR || node->quoted || node->text[0] == '\0') return -1;
    char *end;
    errno = 0;
    long long value = strtoll(node->text, &end, 10);
    if (*end == '\0' && errno == 0) {
        *out = value;
        return 0;
    }
    /* also accept integral numbers written like 1e5 or 100.0 */
    double real;
    if (yscalar_double(node, &real) == 0 && real == floor(real) && fabs(real) <= 9007199254740992.0) {
        *out = (long long)real;
        return 0;
    }
    return -1;
}

int yscalar_bool(const YNode *node, bool *out) {
    static const char *const yes[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", NULL};
    static const char *const no[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF", NULL};
    if (!node || node->kind != YNODE_SCALAR || node->quoted) return -1;
    for (int i = 0; yes[i]; i++)
        if (strcmp(node->text, yes[i]) == 0) { *out = true; return 0; }
    for (int i = 0; no[i]; i++)
        if (strcmp(node->text, no[i]) == 0) { *out = false; return 0; }
    return -1;
}

/* Whether integer_expectation states the upper bound. */
static bool states_max(long long min, long long max) { return max < LLONG_MAX && max < INT_MAX && min > INT_MIN; }

static const char *integer_expectation(char *buf, size_t buflen, long long min, long long max) {
    if (states_max(min, max)) snprintf(buf, buflen, "an integer in %lld..%lld", min, max);
    else if (min == 1) snprintf(buf, buflen, "a positive integer");
    else if (min > INT_MIN) snprintf(buf, buflen, "an integer >= %lld", min);
    else snprintf(buf, buflen, "an integer");
    return buf;
}

int read_integer(const YNode *node, YLoc loc, const char *path, long long min, long long max, long long *out,
                 char *err, size_t errlen) {
    char expect[96], found[128];
    long long value;
    double real;
    if (!states_max(min, max) && yscalar_double(node, &real) == 0 && real > (double)max) /* not "a positive integer" */
        return key_error(err, errlen, loc, path, "found %s, which is too large (expected at most %lld)",
                         ytree_describe(node, found, sizeof found), max);
    if (yscalar_long(node, &value) != 0 || value < min || value > max)
        return key_error(err, errlen, loc, path, "expected %s, found %s", integer_expectation(expect, sizeof expect, min, max),
                         ytree_describe(node, found, sizeof found));
    *out = value;
    return 0;
}

int read_number(const YNode *node, YLoc loc, const char *path, double min, double max, bool above_min,
                double *out, char *err, size_t errlen) {
    char expect[96], found[128];
    double value;
    if (max < MT_NO_MAX) snprintf(expect, sizeof expect, "a number in %s%g, %g]", above_min ? "(" : "[", min, max);
    else if (min > -MT_NO_MAX) snprintf(expect, sizeof expect, "a number %s %g", above_min ? ">" : ">=", min);
    else snprintf(expect, sizeof expect, "a number");
    if (yscalar_double(node, &value) != 0 || value < min || value > max || (above_min && value <= min))
        return key_error(err, errlen, loc, path, "expected %s, found %s", expect, ytree_describe(node, found, sizeof found));
    *out = value;
    return 0;
}

const RecipeKey *find_key(const RecipeKey *keys, const char *name) {
    for (const RecipeKey *key = keys; key->name; key++)
        if (strcmp(key->name, name) == 0) return key;
    return NULL;
}

const char *suggest_name(const char *const *names, const char *name) {
    const char *best = NULL;
    int best_distance = 3;
    for (; *names; names++) {
        const int d = mt_edit_distance(name, *names), longer = (int)strlen(name) - (int)strlen(*names);
        /* a typo, not another name: qkv_proj (a fused projection) is no q_proj */
        if (d < best_distance && d < (int)strlen(name) && longer >= -1 && longer <= 1) {
            best = *names;
            best_distance = d;
        }
    }
    return best;
}

/* Whether `name` is one of key->also's space-separated names. */
static bool also_names(const RecipeKey *key, const char *name) {
    const size_t len = strlen(name);
    for (const char *p = key->also; p && *p;) {
        const char *end = strchr(p, ' ');
        const size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == len && strncmp(p, name, n) == 0) return true;
        p = end ? end + 1 : p + n;
    }
    return false;
}

/* The key of `keys` that another project calls `name` (PEFT's r, lora_alpha, ...), or NULL. */
static const char *also_key(const RecipeKey *keys, const char *name) {
    for (const RecipeKey *key = keys; key->name; key++)
        if (also_names(key, name)) return key->name;
    return NULL;
}

const char *suggest_key(const RecipeKey *keys, const char *name) {
    if (also_key(keys, name)) return also_key(keys, name);
    const char *best = NULL;
    int best_distance = 3;
    size_t len = strlen(name);
    for (const RecipeKey *key = keys; key->name; key++) {
        int d = mt_edit_distance(name, key->name);
        if (d >= 3 && len >= 4 && strncmp(key->name, name, len) == 0) d = 2; /* "warmup" -> "warmup_steps" */
        if (d < best_distance && d < (int)strlen(name)) {
            best = key->name;
            best_distance = d;
        }
    }
    return best;
}

/* The key anywhere in the schema (under `keys`, at `prefix`) that another project calls `name` (RecipeKey.also:
 * Megatron's tensor_model_parallel_size for parallel.tp), its path written to out; NULL when none. */
static const RecipeKey *find_also(const RecipeKey *keys, const char *prefix, const char *name, char *out,
                                  size_t len) {
    for (const RecipeKey *key = keys; key->name; key++) {
        char path[MT_KEY_PATH_MAX];
        join_path(path, sizeof path, prefix, key->name);
        if (also_names(key, name)) {
            snprintf(out, len, "%s", path);
            return key;
        }
        const RecipeKey *found = key->type == KT_SECTION && key->keys ? find_also(key->keys, path, name, out, len)
                                                                      : NULL;
        if (found) return found;
    }
    return NULL;
}

/* The keys of that very name in other sections (a Megatron user's `lr` at the top, `train.seed`, `train.clip_grad`:
 * megatrain keeps them in optimizer, run, ...), their paths appended to out as "'a' or 'b'"; how many. */
static int find_name(const RecipeKey *keys, const char *prefix, const char *skip, const char *name, char *out,
                     size_t len) {
    int found = 0;
    for (const RecipeKey *key = keys; key->name; key++) {
        char path[MT_KEY_PATH_MAX];
        join_path(path, sizeof path, prefix, key->name);
        if (key->type == KT_SECTION && key->keys) {
            found += find_name(key->keys, path, skip, name, out, len);
        } else if (strcmp(key->name, name) == 0 && strcmp(prefix, skip) != 0) {
            const size_t used = strlen(out);
            snprintf(out + used, len - used, "%s'%s'", used ? " or " : "", path);
            found++;
        }
    }
    return found;
}

/* "LOC: unknown key 'PATH' (did you mean 'KEY'?)", with what differs when the key is another project's name for
 * it (recipe_also_note of `at`, PATH in megatrain's sections: torchtitan's decay_ratio, a fraction); -1. */
static int did_you_mean(const YEntry *entry, const char *path, const char *at, const char *key, char *err,
                        size_t errlen) {
    char where[MT_LOC_BUF];
    const char *note = recipe_also_note(at);
    mt_set_error(err, errlen, "%s: unknown key '%s' (did you mean '%s'?%s%s)",
                 yloc_format(entry->loc, where, sizeof where), path, key, note ? " " : "", note ? note : "");
    return -1;
}

static int unknown_key(const RecipeKey *keys, const YEntry *entry, const char *prefix, const char *shown,
                       char *err, size_t errlen);

/* `entry`, written `path`, is another project's name for the section `section` at `hint` (torchtitan's training for
 * train). Holding one key (a --set training.steps=10), that key is answered at its path in the section, itself
 * renamed where it is another project's too (training.max_norm: optimizer.clip_grad); else the section. -1. */
static int renamed_section(const RecipeKey *section, const YEntry *entry, const char *path, const char *at,
                           const char *hint, char *err, size_t errlen) {
    const YNode *node = entry->value;
    if (section->type != KT_SECTION || !section->keys || node->kind != YNODE_MAPPING || node->count != 1)
        return did_you_mean(entry, path, at, hint, err, errlen);
    const YEntry *child = &node->entries[0];
    char child_path[MT_KEY_PATH_MAX], child_hint[MT_KEY_PATH_MAX];
    join_path(child_path, sizeof child_path, path, child->key);
    for (const RecipeKey *key = section->keys; key->name; key++)
        if (strcmp(key->name, child->key) == 0) { /* the section's note (torchtitan's lr_scheduler) unless its own */
            join_path(child_hint, sizeof child_hint, hint, key->name);
            return did_you_mean(child, child_path, recipe_also_note(child_hint) ? child_hint : at, child_hint, err,
                                errlen);
        }
    return unknown_key(section->keys, child, hint, path, err, errlen);
}

/* An unknown key of the section `keys` at `prefix` (written as `shown`, another project's name for it, or prefix):
 * what it is in megatrain, or the section's keys; -1. */
static int unknown_key(const RecipeKey *keys, const YEntry *entry, const char *prefix, const char *shown,
                       char *err, size_t errlen) {
    char where[MT_LOC_BUF], path[MT_KEY_PATH_MAX], at[MT_KEY_PATH_MAX], hint[MT_KEY_PATH_MAX];
    join_path(path, sizeof path, shown, entry->key);
    join_path(at, sizeof at, prefix, entry->key); /* where it is in megatrain's sections, for the notes */
    /* Megatron's --load, --hidden-dropout, torchtitan's parallel.data_parallel_shard_degree, model.flavor */
    const char *no_key = recipe_no_key_note(at);
    if (no_key) {
        mt_set_error(err, errlen, "%s: unknown key '%s': %s", yloc_format(entry->loc, where, sizeof where), path,
                     no_key);
        return -1;
    }
    /* another project's name for a key of this section: that key, before a key of that very name in another
     * section (torchtitan's optimizer.name is no run.name) */
    const char *own = also_key(keys, entry->key);
    if (own) {
        const RecipeKey *key = keys;
        while (strcmp(key->name, own) != 0) key++;
        return renamed_section(key, entry, path, at, join_path(hint, sizeof hint, prefix, own), err, errlen);
    }
    char elsewhere[3 * MT_KEY_PATH_MAX] = "";
    if (find_name(recipe_root_keys, "", prefix, entry->key, elsewhere, sizeof elsewhere) > 0) {
        const char *note = recipe_also_note(at); /* torchtitan's checkpoint.export_dtype is not model.export_dtype */
        mt_set_error(err, errlen, "%s: unknown key '%s' (did you mean %s?%s%s)",
                     yloc_format(entry->loc, where, sizeof where), path, elsewhere, note ? " " : "", note ? note : "");
        return -1;
    }
    const char *guess = suggest_key(keys, entry->key);
    if (guess) return did_you_mean(entry, path, at, join_path(hint, sizeof hint, prefix, guess), err, errlen);
    const RecipeKey *other = find_also(recipe_root_keys, "", entry->key, hint, sizeof hint);
    if (other) return renamed_section(other, entry, path, at, hint, err, errlen); /* another section's, another name */
    char list[512] = "";
    for (const RecipeKey *key = keys; key->name; key++) {
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "", key->name);
    }
    mt_set_error(err, errlen, "%s: unknown key '%s' (valid keys%s%s: %s)", yloc_format(entry->loc, where, sizeof where), path,
                 prefix[0] ? " in " : "", prefix, list);
    return -1;
}

/* Whether a and the first n bytes of b are the same name but for case and '-' for '_' (Megatron's WSD for wsd,
 * PEFT's LORA for lora). */
static bool same_but_spelling_n(const char *a, const char *b, size_t n) {
    size_t i = 0;
    for (; a[i] && i < n; i++) {
        const int ca = a[i] == '-' ? '_' : tolower((unsigned char)a[i]);
        const int cb = b[i] == '-' ? '_' : tolower((unsigned char)b[i]);
        if (ca != cb) return false;
    }
    return a[i] == '\0' && i == n;
}

static bool same_but_spelling(const char *a, const char *b) { return same_but_spelling_n(a, b, strlen(b)); }

static int read_choice(const RecipeKey *key, const YNode *node, YLoc loc, const char *path, char *err, size_t errlen) {
    char list[256] = "", found[128], hint[160] = "";
    if (node->kind == YNODE_SCALAR && !ytree_is_null(node))
        for (int i = 0; key->names[i]; i++) {
            if (strcmp(node->text, key->names[i]) == 0) return i;
            if (same_but_spelling(node->text, key->names[i]))
                snprintf(hint, sizeof hint, " (did you mean %s?)", key->names[i]);
        }
    /* another project's spelling of a value (RecipeKey.value_also: "theirs=ours ...") */
    for (const char *p = key->value_also; !hint[0] && node->kind == YNODE_SCALAR && p && *p;) {
        const size_t n = strcspn(p, " "), eq = strcspn(p, "=");
        if (eq < n && same_but_spelling_n(node->text, p, eq))
            snprintf(hint, sizeof hint, " (did you mean %.*s? megatrain's name for %s)", (int)(n - eq - 1), p + eq + 1,
                     node->text);
        p += n + (p[n] == ' ');
    }
    for (int i = 0; key->names[i]; i++) {
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s%s", i ? " | " : "", key->names[i]);
    }
    return key_error(err, errlen, loc, path, "expected one of %s, found %s%s", list,
                     ytree_describe(node, found, sizeof found), hint);
}

static int read_key(void *base, const RecipeKey *key, const YEntry *entry, const char *path, char *err, size_t errlen) {
    const YNode *node = entry->value;
    char *field = (char *)base + key->offset;
    char found[128];
    long long integer;
    double real;
    if (key->type == KT_CUSTOM) return key->read(base, entry, path, err, errlen);
    if (key->type == KT_SECTION) return read_section(field, key->keys, node, entry->loc, path, err, errlen);
    switch (key->type) {
    case KT_INT:
    case KT_LONG:
    case KT_U64: {
        if (key->word && node->kind == YNODE_SCALAR && strcmp(node->text, key->word) == 0) {
            if (key->type == KT_INT) *(int *)field = (int)key->word_value;
            else *(long *)field = key->word_value;
            return 0;
        }
        long long min = key->type == KT_U64 ? 0 : key->type == KT_INT ? INT_MIN : LONG_MIN;
        long long max = key->type == KT_INT ? INT_MAX : LLONG_MAX;
        if (key->ranged) {
            min = (long long)key->min + (key->above_min ? 1 : 0);
            if (key->max < MT_NO_MAX && key->max < (double)max) max = (long long)key->max;
        }
        if (read_integer(node, entry->loc, path, min, max, &integer, err, errlen) != 0) {
            if (!key->word) return -1;
            char expect[96], hint[64] = "";
            const char *const words[] = {key->word, NULL};
            if (node->kind == YNODE_SCALAR && suggest_name(words, node->text))
                snprintf(hint, sizeof hint, " (did you mean %s?)", key->word);
            return key_error(err, errlen, entry->loc, path, "expected %s or %s, found %s%s",
                             integer_expectation(expect, sizeof expect, min, max), key->word,
                             ytree_describe(node, found, sizeof found), hint);
        }
        if (key->type == KT_INT) *(int *)field = (int)integer;
        else if (key->type == KT_LONG) *(long *)field = (long)integer;
        else *(uint64_t *)field = (uint64_t)integer;
        return 0;
    }
    case KT_DOUBLE:
        if (read_number(node, entry->loc, path, key->ranged ? key->min : -MT_NO_MAX, key->ranged ? key->max : MT_NO_MAX,
                        key->above_min, &real, err, errlen) != 0)
            return -1;
        *(double *)field = real;
        return 0;
    case KT_BOOL:
        if (yscalar_bool(node, (bool *)field) != 0)
            return key_error(err, errlen, entry->loc, path, "expected true or false, found %s",
                             ytree_describe(node, found, sizeof found));
        return 0;
    case KT_ENUM: {
        int index = read_choice(key, node, entry->loc, path, err, errlen);
        if (index < 0) return -1;
        *(int *)field = index;
        return 0;
    }
    case KT_STRING:
        if (key->names) {
            if (read_choice(key, node, entry->loc, path, err, errlen) < 0) return -1;
        } else if (node->kind != YNODE_SCALAR || ytree_is_null(node)) {
            return key_error(err, errlen, entry->loc, path, "expected a string, found %s",
                             ytree_describe(node, found, sizeof found));
        }
        if (strlen(node->text) >= key->size)
            return key_error(err, errlen, entry->loc, path, "expected at most %zu characters, found %zu",
                             key->size - 1, strlen(node->text));
        memcpy(field, node->text, strlen(node->text) + 1);
        return 0;
    default:
        return key_error(err, errlen, entry->loc, path, "internal error: bad key type");
    }
}

int read_section(void *base, const RecipeKey *keys, const YNode *map, YLoc loc, const char *path, char *err,
                 size_t errlen) {
    char found[128], key_path[MT_KEY_PATH_MAX];
    if (!map || map->kind != YNODE_MAPPING)
        return key_error(err, errlen, loc, path[0] ? path : "(top level)", "expected a mapping of keys, found %s",
                         map ? ytree_describe(map, found, sizeof found) : "nothing");
    for (int i = 0; i < map->count; i++) {
        const YEntry *entry = &map->entries[i];
        const RecipeKey *key = find_key(keys, entry->key);
        if (!key) return unknown_key(keys, entry, path, path, err, errlen);
        if (ytree_is_null(entry->value)) continue; /* null = not given: the default stays */
        if (read_key(base, key, entry, join_path(key_path, sizeof key_path, path, key->name), err, errlen) != 0)
            return -1;
    }
    for (const RecipeKey *key = keys; key->name; key++)
        if (key->required && (!key->required_if || key->required_if(base)) && !ytree_has(map, key->name)) {
            const YEntry *null_entry = ytree_entry(map, key->name);
            return key_error(err, errlen, null_entry ? null_entry->loc : loc,
                             join_path(key_path, sizeof key_path, path, key->name), "missing required key");
        }
    return 0;
}
