/* recipe_write.c: write the fully resolved recipe as YAML (run.dir/recipe.yaml)
 * so that recipe_load of it gives the same Recipe: every key, the model
 * inline, doubles in the shortest form that reads back exactly. Written to
 * a temporary name and renamed, so a reader never sees half a file. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/crc32c.h"
#include "../core/fs.h"
#include "recipe_schema.h"
#include "../core/error.h"

size_t yaml_quote(const char *text, char *out, size_t len) {
    size_t n = 0;
#define PUT(...) n += (size_t)snprintf(n < len ? out + n : NULL, n < len ? len - n : 0, __VA_ARGS__)
    PUT("\"");
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (*p == '"' || *p == '\\') PUT("\\%c", *p);
        else if (*p == '\n') PUT("\\n");
        else if (*p == '\t') PUT("\\t");
        else if (*p < 0x20 || *p == 0x7f) PUT("\\x%02X", *p);
        else if (p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) { /* C1 controls: NEL folds as a line break */
            PUT("\\x%02X", p[1]);
            p += 1;
        } else if (p[0] == 0xe2 && p[1] == 0x80 && (p[2] == 0xa8 || p[2] == 0xa9)) { /* line, paragraph separator */
            PUT("\\u%s", p[2] == 0xa8 ? "2028" : "2029");
            p += 2;
        } else if (p[0] == 0xef && p[1] == 0xbb && p[2] == 0xbf) { /* a BOM, which a reader drops */
            PUT("\\uFEFF");
            p += 2;
        } else if (p[0] == 0xef && p[1] == 0xbf && (p[2] == 0xbe || p[2] == 0xbf)) { /* U+FFFE, U+FFFF: refused raw */
            PUT("\\u%s", p[2] == 0xbe ? "FFFE" : "FFFF");
            p += 2;
        } else {
            PUT("%c", *p);
        }
    }
    PUT("\"");
#undef PUT
    return n;
}

void write_yaml_string(FILE *out, const char *text) {
    const size_t n = yaml_quote(text, NULL, 0);
    char *quoted = mt_malloc(n + 1);
    yaml_quote(text, quoted, n + 1);
    fputs(quoted, out);
    free(quoted);
}

/* A whole number below 1e15 as one ("30"); otherwise the shortest "%.Ng"
 * that reads back as exactly `value` (at most 17 digits), with ".0" added to
 * a bare exponent form so YAML 1.1 readers see a float ("1.0e-08", not
 * "1e-08"). */
void write_yaml_double(FILE *out, double value) {
    char text[64];
    if (value == floor(value) && fabs(value) < 1e15) { /* a whole number as one: 30, not 3.0e+01 */
        fprintf(out, "%.0f", value);
        return;
    }
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(text, sizeof text, "%.*g", digits, value);
        if (strtod(text, NULL) == value) break;
    }
    char *exponent = strchr(text, 'e');
    if (exponent && !strchr(text, '.')) {
        char tail[32];
        snprintf(tail, sizeof tail, "%s", exponent);
        snprintf(exponent, sizeof text - (size_t)(exponent - text), ".0%s", tail);
    }
    fputs(text, out);
}

void write_token_count(FILE *out, double tokens) {
    if (tokens == floor(tokens) && tokens < 9007199254740992.0) fprintf(out, "%.0f", tokens);
    else write_yaml_double(out, tokens);
}

static void write_key(FILE *out, const void *base, const RecipeKey *key, int indent) {
    const char *field = (const char *)base + key->offset;
    if (key->write) {
        key->write(out, base, key->name, indent);
        return;
    }
    if (key->type == KT_SECTION) {
        fprintf(out, "%*s%s:\n", indent, "", key->name);
        write_section(out, field, key->keys, indent + 2);
        return;
    }
    fprintf(out, "%*s%s: ", indent, "", key->name);
    if (key->word && (key->type == KT_INT ? *(const int *)field : *(const long *)field) == key->word_value) {
        fprintf(out, "%s\n", key->word);
        return;
    }
    switch (key->type) {
    case KT_INT: fprintf(out, "%d", *(const int *)field); break;
    case KT_LONG:
        if (key->nullable && *(const long *)field == 0) fprintf(out, "null");
        else fprintf(out, "%ld", *(const long *)field);
        break;
    case KT_U64: fprintf(out, "%llu", (unsigned long long)*(const uint64_t *)field); break;
    case KT_DOUBLE:
        if (key->nullable && *(const double *)field <= 0) fprintf(out, "null");
        else write_yaml_double(out, *(const double *)field);
        break;
    case KT_BOOL: fprintf(out, "%s", *(const bool *)field ? "true" : "false"); break;
    case KT_ENUM: fprintf(out, "%s", key->names[*(const int *)field]); break;
    case KT_STRING:
        if (key->nullable && field[0] == '\0') fprintf(out, "null");
        else write_yaml_string(out, field);
        break;
    default: break;
    }
    fputc('\n', out);
}

void write_section(FILE *out, const void *base, const RecipeKey *keys, int indent) {
    for (const RecipeKey *key = keys; key->name; key++) write_key(out, base, key, indent);
}

int recipe_write(const Recipe *recipe, const char *path, char *err, size_t errlen) {
    char tmp[MT_PATH_MAX + 16];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *out = fopen(tmp, "w");
    if (!out) {
        mt_set_error(err, errlen, "%s: cannot write: %s", tmp, strerror(errno));
        return -1;
    }
    fprintf(out, "# The fully resolved recipe of this run (from %s).\n", recipe->source_path);
    Recipe *written = mt_malloc(sizeof *written); /* data.cache_dir's default stays tied to run.dir: null */
    *written = *recipe;
    if (recipe_cache_dir_is_default(recipe)) written->data.cache_dir[0] = '\0';
    write_section(out, written, recipe_root_keys, 0);
    free(written);
    if (mt_fclose_sync(out) != 0 || rename(tmp, path) != 0) { /* synced: a power loss leaves the old or the new */
        mt_set_error(err, errlen, "%s: cannot write: %s", path, strerror(errno));
        remove(tmp);
        return -1;
    }
    return 0;
}

uint32_t recipe_crc32c_without_data_paths(const Recipe *recipe) {
    Recipe *copy = mt_malloc(sizeof *copy);
    *copy = *recipe;
    for (int i = 0; i < copy->data.num_train; i++) copy->data.train[i].path[0] = '\0';
    for (int i = 0; i < copy->data.num_valid; i++) copy->data.valid[i].path[0] = '\0';
    for (int i = 0; i < copy->data.num_test; i++) copy->data.test[i].path[0] = '\0';
    copy->data.cache_dir[0] = '\0';
    const uint32_t crc = recipe_crc32c(copy);
    free(copy);
    return crc;
}

char *recipe_yaml_text(const Recipe *recipe, size_t *len) {
    char *text = NULL;
    *len = 0;
    FILE *out = open_memstream(&text, len);
    if (!out) mt_die(MT_EXIT_FAILURE, "out of memory writing the recipe");
    write_section(out, recipe, recipe_root_keys, 0);
    fclose(out);
    return text;
}

uint32_t recipe_crc32c(const Recipe *recipe) {
    size_t len = 0;
    char *text = recipe_yaml_text(recipe, &len);
    const uint32_t crc = crc32c(0, text, len);
    free(text);
    return crc;
}

/* The line starting at *at (advanced past it), its newline dropped, whole (a data path may be long): malloc'd. */
static char *next_line(const char **at) {
    const char *end = strchr(*at, '\n');
    const size_t n = end ? (size_t)(end - *at) : strlen(*at);
    char *line = mt_malloc(n + 1);
    memcpy(line, *at, n);
    line[n] = '\0';
    *at += n + (end != NULL);
    return line;
}

void recipe_text_difference(const char *ours, const char *theirs, const char *ours_name, const char *theirs_name,
                            char *out, size_t outlen) {
    char sections[8][64] = {{0}}; /* the keys of the enclosing sections, by indent / 2 */
    const char *a = ours, *b = theirs;
    snprintf(out, outlen, "(no line differs)");
    while (*a || *b) {
        char *la = next_line(&a), *lb = next_line(&b);
        const size_t indent = strspn(la, " ");
        const bool item = !strncmp(la + indent, "- ", 2); /* a list's item: named by its list, shown whole */
        const char *colon = item ? NULL : strchr(la + indent, ':');
        char key[1200] = "";
        for (size_t level = 0; level < indent / 2 && level < 8; level++)
            if (sections[level][0])
                snprintf(key + strlen(key), sizeof key - strlen(key), "%s%.63s", key[0] ? "." : "", sections[level]);
        if (colon)
            snprintf(key + strlen(key), sizeof key - strlen(key), "%s%.*s", key[0] ? "." : "",
                     (int)(colon - la - indent), la + indent);
        const bool differ = strcmp(la, lb) != 0;
        if (differ) {
            const char *ours_value = colon ? colon + 1 + strspn(colon + 1, " ") : la + indent;
            const char *lb_colon = item ? NULL : strchr(lb, ':');
            const char *theirs_value = lb_colon ? lb_colon + 1 + strspn(lb_colon + 1, " ") : lb + strspn(lb, " ");
            snprintf(out, outlen, "%s: '%s' %s, '%s' %s", key[0] ? key : "(top level)", ours_value, ours_name,
                     theirs_value, theirs_name);
        } else if (colon && indent / 2 < 8) { /* a section's key: the prefix of the lines indented below it */
            snprintf(sections[indent / 2], sizeof sections[0], "%.*s", (int)(colon - la - indent), la + indent);
            for (size_t level = indent / 2 + 1; level < 8; level++) sections[level][0] = '\0';
        }
        free(la);
        free(lb);
        if (differ) return;
    }
}

/* The (key path, value) pairs of a recipe_yaml_text text, a list's items as "list[i]"; values malloc'd. */
typedef struct KeyValue {
    char key[800];
    char *value;
} KeyValue;

static int key_values(const char *text, KeyValue **out) {
    char sections[8][64] = {{0}};
    int n = 0, item = 0;
    size_t cap = 0;
    KeyValue *kv = NULL;
    char list[800] = "";
    for (const char *at = text; *at;) {
        char *line = next_line(&at);
        const size_t indent = strspn(line, " ");
        const bool is_item = !strncmp(line + indent, "- ", 2);
        const char *colon = is_item ? NULL : strchr(line + indent, ':');
        char prefix[256] = "";
        for (size_t level = 0; level < indent / 2 && level < 8; level++)
            if (sections[level][0])
                snprintf(prefix + strlen(prefix), sizeof prefix - strlen(prefix), "%s%.63s", prefix[0] ? "." : "",
                         sections[level]);
        kv = mt_grow(kv, &cap, (size_t)n + 1, sizeof *kv);
        KeyValue *e = &kv[n];
        if (line[indent] && is_item) {
            snprintf(e->key, sizeof e->key, "%s[%d]", list, item++);
            e->value = mt_strdup(line + indent + 2);
            n++;
        } else if (line[indent] && colon) {
            const char *value = colon + 1 + strspn(colon + 1, " ");
            snprintf(e->key, sizeof e->key, "%s%s%.*s", prefix, prefix[0] ? "." : "", (int)(colon - line - indent),
                     line + indent);
            if (*value) {
                e->value = mt_strdup(value);
                n++;
            } else { /* a section, or a list whose items follow */
                snprintf(list, sizeof list, "%s", e->key);
                item = 0;
                if (indent / 2 < 8) {
                    snprintf(sections[indent / 2], sizeof sections[0], "%.*s", (int)(colon - line - indent),
                             line + indent);
                    for (size_t level = indent / 2 + 1; level < 8; level++) sections[level][0] = '\0';
                }
            }
        }
        free(line);
    }
    *out = kv;
    return n;
}

static void free_key_values(KeyValue *kv, int n) {
    for (int i = 0; i < n; i++) free(kv[i].value);
    free(kv);
}

static const KeyValue *find_key_value(const KeyValue *kv, int n, const char *key) {
    for (int i = 0; i < n; i++)
        if (!strcmp(kv[i].key, key)) return &kv[i];
    return NULL;
}

/* The items of list `key` in kv ("key[0]", "key[1]", ...) as "[a, b]" into out; how many. */
static int list_items(const KeyValue *kv, int n, const char *key, char *out, size_t len) {
    int count = 0;
    size_t used = (size_t)snprintf(out, len, "[");
    char item[820];
    for (;; count++) {
        snprintf(item, sizeof item, "%s[%d]", key, count);
        const KeyValue *e = find_key_value(kv, n, item);
        if (!e) break;
        if (used < len) used += (size_t)snprintf(out + used, len - used, "%s%s", count ? ", " : "", e->value);
    }
    if (used < len) snprintf(out + used, len - used, "]");
    return count;
}

/* key "K[i]" -> "K" into base; false when key is no list's item. */
static bool item_of(const char *key, char *base, size_t len) {
    const char *open = strrchr(key, '[');
    if (!open || key[strlen(key) - 1] != ']') return false;
    snprintf(base, len, "%.*s", (int)(open - key), key);
    return true;
}

int recipe_text_changes(const char *before, const char *after, char *out, size_t outlen, const char *const *watched,
                        char *hit, size_t hitlen) {
    KeyValue *a = NULL, *b = NULL;
    const int na = key_values(before, &a), nb = key_values(after, &b);
    int changes = 0;
    size_t used = 0;
    out[0] = '\0';
    if (hit && hitlen) hit[0] = '\0';
    for (int pass = 0; pass < 2; pass++) { /* changed or added keys (in after's order), then removed ones */
        const KeyValue *from = pass ? a : b, *other = pass ? b : a;
        const int count = pass ? na : nb, other_count = pass ? nb : na;
        for (int i = 0; i < count; i++) {
            const KeyValue *match = find_key_value(other, other_count, from[i].key);
            if (pass && match) continue; /* seen in the first pass */
            if (!pass && match && !strcmp(match->value, from[i].value)) continue;
            const char *old_value = pass ? from[i].value : match ? match->value : "(none)";
            const char *new_value = pass ? "(none)" : from[i].value;
            /* a key that is a value on one side and a list on the other (data.valid null -> [{path: ...}]): one
             * change, the list whole, said where the value is (its items' own changes left out) */
            char base[800], first[820], items[1200];
            snprintf(first, sizeof first, "%s[0]", from[i].key);
            if (item_of(from[i].key, base, sizeof base) && !find_key_value(from, count, base) &&
                find_key_value(other, other_count, base))
                continue; /* said with the value of the other side */
            if (!match && find_key_value(other, other_count, first)) {
                list_items(other, other_count, from[i].key, items, sizeof items);
                old_value = pass ? from[i].value : items;
                new_value = pass ? items : from[i].value;
            }
            if (used < outlen)
                used += (size_t)snprintf(out + used, outlen - used, "%s%s %s -> %s", changes ? "; " : "", from[i].key,
                                         old_value, new_value);
            changes++;
            for (int w = 0; watched && watched[w] && hit && hitlen && !hit[0]; w++)
                if (!strncmp(from[i].key, watched[w], strlen(watched[w]))) snprintf(hit, hitlen, "%s", from[i].key);
        }
    }
    free_key_values(a, na);
    free_key_values(b, nb);
    return changes;
}
