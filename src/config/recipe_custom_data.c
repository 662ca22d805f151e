/* recipe_custom_data.c: data.train / data.valid (a prefix, or a list of
 * {path, weight} or prefixes) and data.split ([train, valid, test] weights
 * or Megatron's "98,2,0"; missing shares are 0, as Megatron pads them). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recipe_schema.h"

static const RecipeKey source_keys[] = {
    {.name = "path", .type = KT_STRING, .offset = offsetof(DataSource, path), .size = MT_PATH_MAX, .required = true},
    {.name = "weight", .type = KT_DOUBLE, .offset = offsetof(DataSource, weight), .ranged = true, .min = 0,
     .max = MT_NO_MAX, .above_min = true},
    {0},
};

/* text is a number > 0 (a Megatron --data-path weight), into *weight */
static bool weight_text(const char *text, double *weight) {
    char *end = NULL;
    const double w = strtod(text, &end);
    if (end == text || *end != '\0' || !(w > 0) || !isfinite(w)) return false;
    *weight = w;
    return true;
}

static int read_one_source(DataSource *source, const YNode *node, YLoc loc, const char *path, char *err, size_t errlen) {
    char found[128];
    source->weight = 0.0; /* none given */
    if (node->kind == YNODE_MAPPING) return read_section(source, source_keys, node, loc, path, err, errlen);
    if (node->kind != YNODE_SCALAR || ytree_is_null(node))
        return key_error(err, errlen, loc, path, "expected a dataset prefix or {path, weight}, found %s",
                         ytree_describe(node, found, sizeof found));
    if (strlen(node->text) >= MT_PATH_MAX)
        return key_error(err, errlen, loc, path, "expected a path of at most %d characters", MT_PATH_MAX - 1);
    double weight;
    if (!node->quoted && weight_text(node->text, &weight)) /* a weight of Megatron's --data-path form, unpaired */
        return key_error(err, errlen, loc, path, "expected a dataset prefix, found the number %s (Megatron's "
                         "--data-path form pairs each weight with a prefix: [W1, P1, W2, P2], or "
                         "[{path: P1, weight: W1}, ...]; a prefix that is a number is quoted)", node->text);
    memcpy(source->path, node->text, strlen(node->text) + 1);
    return 0;
}

/* Megatron's --data-path form, "W1 P1 W2 P2 ..." (one string) or [W1, P1, W2, P2, ...]: weights and prefixes in
 * turn, as Megatron reads it (its first word a number: pairs; a prefix may read as a number). n words (words[i] the
 * i-th's text; a quoted one in a list is never a weight): 1 and the sources when it is that form, 0 when it is not
 * (the first word is no weight), -1 (reported) when it starts as that form but is not it, or holds more sources
 * than a recipe does. */
static int megatron_sources(DataSource *sources, int *count, const char *const *words, const bool *quoted, int n,
                            YLoc loc, const char *path, char *err, size_t errlen) {
    double w;
    if (n < 2 || (quoted && quoted[0]) || !weight_text(words[0], &w)) return 0;
    for (int i = 0; i < n; i++) {
        const bool weight = (!quoted || !quoted[i]) && weight_text(words[i], &w);
        if (i % 2 == 0 && !weight)
            return key_error(err, errlen, loc, path, "Megatron's --data-path form pairs each weight with a prefix "
                             "(W1, P1, W2, P2, ...): word %d, '%s', is no weight", i + 1, words[i]);
        if (strlen(words[i]) >= MT_PATH_MAX)
            return key_error(err, errlen, loc, path, "expected a path of at most %d characters", MT_PATH_MAX - 1);
    }
    if (n % 2 != 0)
        return key_error(err, errlen, loc, path, "Megatron's --data-path form pairs each weight with a prefix (W1, "
                         "P1, W2, P2, ...): the last weight, '%s', has none", words[n - 1]);
    if (n / 2 > MT_MAX_DATA_SOURCES)
        return key_error(err, errlen, loc, path, "expected at most %d data sources, found %d", MT_MAX_DATA_SOURCES,
                         n / 2);
    for (int i = 0; i < n; i += 2) {
        weight_text(words[i], &sources[i / 2].weight);
        memcpy(sources[i / 2].path, words[i + 1], strlen(words[i + 1]) + 1);
    }
    *count = n / 2;
    return 1;
}

/* A string's words that are no Megatron --data-path form (its first word no weight) but hold a weight after a
 * prefix, as "data/a 0.5 data/b" writes it: that weight's text, else NULL (a prefix with spaces). */
static const char *after_prefix_weight(const char *const *words, int n) {
    double w;
    for (int i = 1; i < n; i++)
        if (weight_text(words[i], &w)) return words[i];
    return NULL;
}

/* A string's whitespace-separated words, for megatron_sources: into buf (a copy), pointers in words. */
static int split_words(const char *text, char *buf, size_t buflen, const char **words, int max) {
    snprintf(buf, buflen, "%s", text);
    int n = 0;
    for (char *save = NULL, *w = strtok_r(buf, " \t\n", &save); w && n < max; w = strtok_r(NULL, " \t\n", &save))
        words[n++] = w;
    return n;
}

static int read_sources(DataSource *sources, int *count, const YEntry *entry, const char *path, char *err,
                        size_t errlen) {
    const YNode *node = entry->value;
    char item_path[MT_KEY_PATH_MAX];
    memset(sources, 0, sizeof(DataSource) * MT_MAX_DATA_SOURCES);
    *count = 0;
    /* a Megatron user's --data-path, as a string or a list */
    const char *words[2 * MT_MAX_DATA_SOURCES + 2];
    bool quoted[2 * MT_MAX_DATA_SOURCES + 2];
    int n = 0, megatron = 0;
    const bool list = node->kind == YNODE_SEQUENCE;
    if (node->kind == YNODE_SCALAR && !ytree_is_null(node) && strchr(node->text, ' ')) {
        static char buf[(2 * MT_MAX_DATA_SOURCES + 2) * MT_PATH_MAX];
        n = split_words(node->text, buf, sizeof buf, words, (int)(sizeof words / sizeof words[0]));
    } else if (list && node->count <= (int)(sizeof words / sizeof words[0])) {
        for (int i = 0; i < node->count && node->entries[i].value->kind == YNODE_SCALAR; i++) {
            quoted[n] = node->entries[i].value->quoted; /* "0.5": a prefix that looks like a number */
            words[n++] = node->entries[i].value->text;
        }
        if (n != node->count) n = 0;
    }
    if (n > 0 && (megatron = megatron_sources(sources, count, words, list ? quoted : NULL, n, entry->loc, path, err,
                                              errlen)) != 0)
        return megatron < 0 ? -1 : 0;
    if (!list && after_prefix_weight(words, n) != NULL)
        return key_error(err, errlen, entry->loc, path, "expected Megatron's --data-path form, which starts with a "
                         "weight: \"W1 PATH1 W2 PATH2 ...\", found the weight '%s' after the prefix '%s' (a prefix "
                         "with spaces in its name is written {path: ...})", after_prefix_weight(words, n), words[0]);
    if (node->kind != YNODE_SEQUENCE) {
        if (node->kind == YNODE_MAPPING || (node->kind == YNODE_SCALAR && !ytree_is_null(node))) {
            *count = 1;
            return read_one_source(&sources[0], node, entry->loc, path, err, errlen);
        }
        return key_error(err, errlen, entry->loc, path, "expected a list of {path, weight}, found null");
    }
    if (node->count == 0 || node->count > MT_MAX_DATA_SOURCES)
        return key_error(err, errlen, entry->loc, path, "expected a list of 1..%d data sources, found %d",
                         MT_MAX_DATA_SOURCES, node->count);
    for (int i = 0; i < node->count; i++) {
        snprintf(item_path, sizeof item_path, "%s[%d]", path, i);
        if (read_one_source(&sources[i], node->entries[i].value, node->entries[i].loc, item_path, err, errlen) != 0)
            return -1;
    }
    *count = node->count;
    return 0;
}

int read_train_sources(void *base, const YEntry *entry, const char *path, char *err, size_t errlen) {
    DataConfig *data = base;
    return read_sources(data->train, &data->num_train, entry, path, err, errlen);
}

/* A list that may be null (data.valid, data.test: none, the split gives it). */
static int read_optional_sources(DataSource *sources, int *count, const YEntry *entry, const char *path, char *err,
                                 size_t errlen) {
    if (ytree_is_null(entry->value)) {
        memset(sources, 0, MT_MAX_DATA_SOURCES * sizeof *sources);
        *count = 0;
        return 0;
    }
    return read_sources(sources, count, entry, path, err, errlen);
}

int read_valid_sources(void *base, const YEntry *entry, const char *path, char *err, size_t errlen) {
    DataConfig *data = base;
    return read_optional_sources(data->valid, &data->num_valid, entry, path, err, errlen);
}

int read_test_sources(void *base, const YEntry *entry, const char *path, char *err, size_t errlen) {
    DataConfig *data = base;
    return read_optional_sources(data->test, &data->num_test, entry, path, err, errlen);
}

static void write_sources(FILE *out, const DataSource *sources, int count, const char *name, int indent) {
    fprintf(out, "%*s%s:", indent, "", name);
    if (count == 0) {
        fprintf(out, " null\n");
        return;
    }
    fputc('\n', out);
    for (int i = 0; i < count; i++) {
        fprintf(out, "%*s- {path: ", indent + 2, "");
        write_yaml_string(out, sources[i].path);
        if (sources[i].weight > 0) { /* none given stays none */
            fprintf(out, ", weight: ");
            write_yaml_double(out, sources[i].weight);
        }
        fprintf(out, "}\n");
    }
}

void write_train_sources(FILE *out, const void *base, const char *name, int indent) {
    const DataConfig *data = base;
    write_sources(out, data->train, data->num_train, name, indent);
}

void write_valid_sources(FILE *out, const void *base, const char *name, int indent) {
    const DataConfig *data = base;
    write_sources(out, data->valid, data->num_valid, name, indent);
}

void write_test_sources(FILE *out, const void *base, const char *name, int indent) {
    const DataConfig *data = base;
    write_sources(out, data->test, data->num_test, name, indent);
}

int data_split_parse(const char *text, double split[3]) {
    const char *p = text;
    split[0] = split[1] = split[2] = 0.0; /* "99,1" is [99, 1, 0], as Megatron pads a short split */
    for (int i = 0; i < 3; i++) {
        char *end = NULL;
        split[i] = strtod(p, &end);
        if (end == p || !(split[i] >= 0)) return -1;
        if (*end == '\0') break;
        if (i == 2 || (*end != ',' && *end != '/')) return -1;
        p = end + 1;
    }
    if (!isfinite(split[0] + split[1] + split[2])) return -1; /* inf, or a sum past the doubles: no shares */
    return split[0] > 0 ? 0 : -2;
}

/* The first share of split text "98,2,-1" that is a negative number (its text, up to the next separator), or NULL. */
static const char *negative_share(const char *text) {
    for (const char *p = text; *p; p += strcspn(p, ",/"), p += *p ? 1 : 0) {
        char *end = NULL;
        const double share = strtod(p, &end);
        if (end != p && share < 0) return p;
    }
    return NULL;
}

int read_split(void *base, const YEntry *entry, const char *path, char *err, size_t errlen) {
    DataConfig *data = base;
    const YNode *node = entry->value;
    char found[128];
    double split[3];
    if (node->kind == YNODE_SEQUENCE && node->count >= 1 && node->count <= 3) {
        split[1] = split[2] = 0.0; /* [99, 1] is [99, 1, 0] */
        for (int i = 0; i < node->count; i++)
            if (yscalar_double(node->entries[i].value, &split[i]) != 0 || split[i] < 0)
                return key_error(err, errlen, node->entries[i].loc, path, "expected weights >= 0, found %s",
                                 ytree_describe(node->entries[i].value, found, sizeof found));
    } else if (node->kind == YNODE_SCALAR && !ytree_is_null(node)) {
        const char *negative = negative_share(node->text);
        if (negative)
            return key_error(err, errlen, entry->loc, path, "expected weights >= 0, found '%.*s' in %s",
                             (int)strcspn(negative, ",/"), negative, ytree_describe(node, found, sizeof found));
        if (data_split_parse(node->text, split) == -1) /* -2: no positive train weight, said below */
            return key_error(err, errlen, entry->loc, path, "expected [train, valid, test] weights like [98, 2, 0], found %s",
                             ytree_describe(node, found, sizeof found));
    } else {
        return key_error(err, errlen, entry->loc, path, "expected [train, valid, test] weights like [98, 2, 0] (shares left out are 0), found %s",
                         node->kind == YNODE_SEQUENCE ? "a list of another length" : ytree_describe(node, found, sizeof found));
    }
    if (split[0] <= 0)
        return key_error(err, errlen, entry->loc, path, "expected a positive train weight, found %g", split[0]);
    if (!isfinite(split[0] + split[1] + split[2]))
        return key_error(err, errlen, entry->loc, path, "expected weights whose sum is a number, found %g + %g + %g",
                         split[0], split[1], split[2]);
    memcpy(data->split, split, sizeof split);
    return 0;
}

void write_split(FILE *out, const void *base, const char *name, int indent) {
    const DataConfig *data = base;
    fprintf(out, "%*s%s: [", indent, "", name);
    for (int i = 0; i < 3; i++) {
        if (i) fprintf(out, ", ");
        write_yaml_double(out, data->split[i]);
    }
    fprintf(out, "]\n");
}
