/* yaml_tree.c: libyaml document -> YNode tree with file/line locations,
 * plus lookup and dotted-path assignment (for --set overrides). */
#include "yaml_tree.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "../core/error.h"
#include "../core/fs.h"

#define YTREE_MAX_DEPTH 64

static YNode *node_new(YNodeKind kind, const char *file, int line) {
    YNode *node = mt_calloc(1, sizeof *node);
    node->kind = kind;
    node->loc.file = mt_strdup(file);
    node->loc.line = line;
    return node;
}

static YEntry *node_append(YNode *node) {
    node->entries = mt_realloc(node->entries, (size_t)(node->count + 1) * sizeof *node->entries);
    YEntry *entry = &node->entries[node->count++];
    memset(entry, 0, sizeof *entry);
    return entry;
}

void ytree_free(YNode *node) {
    if (!node) return;
    for (int i = 0; i < node->count; i++) {
        free(node->entries[i].key);
        free(node->entries[i].loc.file);
        ytree_free(node->entries[i].value);
    }
    free(node->entries);
    free(node->text);
    free(node->loc.file);
    free(node);
}

const char *yloc_format(YLoc loc, char *buf, size_t buflen) {
    if (loc.line > 0) snprintf(buf, buflen, "%s:%d", loc.file, loc.line);
    else snprintf(buf, buflen, "%s", loc.file);
    return buf;
}

/* State of one document's conversion. libyaml's document API resolves an
 * alias to the anchored node itself, so the tree gets a copy of that node at
 * every use: nested aliases grow exponentially (ten aliases of a list of ten
 * aliases...). `nodes` counts what was made, capped at YTREE_MAX_NODES. */
typedef struct Convert {
    yaml_document_t *doc;
    const char *file;
    bool lines;            /* false for overrides: every location gets line 0 */
    char *err;
    size_t errlen;
    long nodes;            /* YNodes made so far */
    size_t doc_nodes;      /* libyaml nodes (each alias use is not one) */
    unsigned char *seen;   /* per libyaml node: converted once (a later use is an alias) */
    bool in_alias;         /* inside the expansion of an alias... */
    int alias_line;        /* ...used on this line (the outermost one) */
} Convert;

static YNode *convert(Convert *cv, int index, int depth);

/* Convert child `index` of a node, used on `line` (the key's line in a
 * mapping; in a list the list's first line, as libyaml keeps no position
 * for an alias). A node already seen is an alias: the node cap, when its
 * expansion crosses it, is reported at this use. */
static YNode *convert_child(Convert *cv, int index, int line, int depth) {
    if (cv->in_alias || !cv->seen[index - 1]) return convert(cv, index, depth);
    cv->in_alias = true;
    cv->alias_line = line;
    YNode *node = convert(cv, index, depth);
    cv->in_alias = false;
    return node;
}

/* Convert libyaml node `index` (1-based) of the document. */
static YNode *convert(Convert *cv, int index, int depth) {
    yaml_node_t *src = yaml_document_get_node(cv->doc, index);
    const char *file = cv->file;
    int line = cv->lines ? (int)src->start_mark.line + 1 : 0;
    char where[MT_LOC_BUF];
    YLoc here = {(char *)file, line};
    if (depth > YTREE_MAX_DEPTH) {
        mt_set_error(cv->err, cv->errlen, "%s: YAML nested too deeply (recursive alias?)",
                     yloc_format(here, where, sizeof where));
        return NULL;
    }
    if (++cv->nodes > YTREE_MAX_NODES) {
        /* blame the outermost alias being expanded, if any */
        YLoc at = {(char *)file, cv->in_alias ? cv->alias_line : line};
        if (cv->doc_nodes > YTREE_MAX_NODES)
            mt_set_error(cv->err, cv->errlen, "%s: the YAML document has more than %d nodes; a recipe needs a few "
                         "hundred", yloc_format(at, where, sizeof where), YTREE_MAX_NODES);
        else
            mt_set_error(cv->err, cv->errlen,
                         "%s: YAML aliases expand the document past %d nodes (each *alias repeats every node of "
                         "its &anchor); a recipe needs a few hundred",
                         yloc_format(at, where, sizeof where), YTREE_MAX_NODES);
        return NULL;
    }
    cv->seen[index - 1] = 1;
    if (src->type == YAML_SCALAR_NODE) {
        YNode *node = node_new(YNODE_SCALAR, file, line);
        node->text = mt_malloc(src->data.scalar.length + 1);
        memcpy(node->text, src->data.scalar.value, src->data.scalar.length);
        node->text[src->data.scalar.length] = '\0';
        node->quoted = src->data.scalar.style != YAML_PLAIN_SCALAR_STYLE &&
                       src->data.scalar.style != YAML_ANY_SCALAR_STYLE;
        return node;
    }
    if (src->type == YAML_SEQUENCE_NODE) {
        YNode *node = node_new(YNODE_SEQUENCE, file, line);
        for (yaml_node_item_t *it = src->data.sequence.items.start; it < src->data.sequence.items.top; it++) {
            YNode *child = convert_child(cv, *it, line, depth + 1);
            if (!child) { ytree_free(node); return NULL; }
            YEntry *entry = node_append(node);
            entry->loc.file = mt_strdup(file);
            entry->loc.line = child->loc.line;
            entry->value = child;
        }
        return node;
    }
    YNode *node = node_new(YNODE_MAPPING, file, line);
    for (yaml_node_pair_t *p = src->data.mapping.pairs.start; p < src->data.mapping.pairs.top; p++) {
        yaml_node_t *key = yaml_document_get_node(cv->doc, p->key);
        YLoc key_loc = {(char *)file, cv->lines ? (int)key->start_mark.line + 1 : 0};
        if (key->type != YAML_SCALAR_NODE) {
            mt_set_error(cv->err, cv->errlen, "%s: YAML mapping key must be a plain name, found a %s",
                         yloc_format(key_loc, where, sizeof where),
                         key->type == YAML_MAPPING_NODE ? "mapping" : "list");
            ytree_free(node);
            return NULL;
        }
        const char *name = (const char *)key->data.scalar.value;
        if (ytree_entry(node, name)) {
            mt_set_error(cv->err, cv->errlen, "%s: duplicate key '%s'", yloc_format(key_loc, where, sizeof where),
                         name);
            ytree_free(node);
            return NULL;
        }
        YNode *child = convert_child(cv, p->value, key_loc.line, depth + 1);
        if (!child) { ytree_free(node); return NULL; }
        YEntry *entry = node_append(node);
        entry->key = mt_strdup(name);
        entry->loc.file = mt_strdup(file);
        entry->loc.line = key_loc.line;
        entry->value = child;
    }
    return node;
}

/* Run the libyaml loader on an initialised parser. */
static YNode *load_with(yaml_parser_t *parser, const char *file, bool lines, char *err, size_t errlen) {
    yaml_document_t doc;
    char where[MT_LOC_BUF];
    if (!yaml_parser_load(parser, &doc)) {
        YLoc at = {(char *)file, lines ? (int)parser->problem_mark.line + 1 : 0};
        char started[64] = "";
        if (lines && parser->context && parser->context_mark.line != parser->problem_mark.line)
            snprintf(started, sizeof started, " (started at line %d)", (int)parser->context_mark.line + 1);
        mt_set_error(err, errlen, "%s: YAML syntax error: %s%s%s%s", yloc_format(at, where, sizeof where),
                     parser->problem ? parser->problem : "malformed YAML", parser->context ? " " : "",
                     parser->context ? parser->context : "", started);
        return NULL;
    }
    YNode *root = NULL;
    yaml_node_t *top = yaml_document_get_root_node(&doc);
    if (!top) {
        if (lines) {
            mt_set_error(err, errlen, "%s:1: the file is empty; expected a YAML mapping of keys", file);
        } else {
            root = node_new(YNODE_SCALAR, file, 0);
            root->text = mt_strdup("");
        }
    } else {
        size_t count = (size_t)(doc.nodes.top - doc.nodes.start);
        Convert cv = {&doc, file, lines, err, errlen, 0, count, mt_calloc(count, 1), false, 0};
        root = convert(&cv, 1, 0);
        free(cv.seen);
    }
    yaml_document_delete(&doc);
    /* a second document (after ---) would be ignored without a word: refused, to the end of the stream (documents
     * of nothing, a trailing ---, are let be) */
    while (root) {
        if (!yaml_parser_load(parser, &doc)) {
            YLoc at = {(char *)file, lines ? (int)parser->problem_mark.line + 1 : 0};
            mt_set_error(err, errlen, "%s: YAML syntax error after the document: %s",
                         yloc_format(at, where, sizeof where), parser->problem ? parser->problem : "malformed YAML");
            ytree_free(root);
            return NULL;
        }
        const yaml_node_t *next = yaml_document_get_root_node(&doc);
        const bool end = next == NULL;
        const bool empty = next && next->type == YAML_SCALAR_NODE && next->data.scalar.length == 0;
        YLoc at = {(char *)file, lines ? (int)doc.start_mark.line + 1 : 0};
        yaml_document_delete(&doc);
        if (end) break;
        if (!empty) {
            mt_set_error(err, errlen, "%s: a second YAML document (after ---); a recipe is one document",
                         yloc_format(at, where, sizeof where));
            ytree_free(root);
            return NULL;
        }
    }
    return root;
}

YNode *ytree_load_file(const char *path, char *err, size_t errlen) {
    /* a directory would make libyaml say only "input error", a FIFO would block: both refused here */
    uint64_t size = 0;
    FILE *fp = mt_fopen_regular(path, "a YAML file", &size, err, errlen);
    if (!fp) return NULL;
    if (size > YTREE_MAX_BYTES) { /* libyaml holds the whole document before the node cap can apply */
        mt_set_error(err, errlen, "%s: %.1f MiB; a recipe is a few KiB (at most %d MiB)", path,
                     (double)size / 1048576.0, YTREE_MAX_BYTES >> 20);
        fclose(fp);
        return NULL;
    }
    yaml_parser_t parser;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_file(&parser, fp);
    YNode *root = load_with(&parser, path, true, err, errlen);
    yaml_parser_delete(&parser);
    fclose(fp);
    return root;
}

YNode *ytree_load_string(const char *text, const char *origin, char *err, size_t errlen) {
    if (strlen(text) > YTREE_MAX_BYTES) {
        mt_set_error(err, errlen, "%s: %.1f MiB of YAML; a value is a few bytes (at most %d MiB)", origin,
                     (double)strlen(text) / 1048576.0, YTREE_MAX_BYTES >> 20);
        return NULL;
    }
    yaml_parser_t parser;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, strlen(text));
    YNode *root = load_with(&parser, origin, false, err, errlen);
    yaml_parser_delete(&parser);
    return root;
}

YEntry *ytree_entry(const YNode *map, const char *key) {
    if (!map || map->kind != YNODE_MAPPING) return NULL;
    for (int i = 0; i < map->count; i++)
        if (strcmp(map->entries[i].key, key) == 0) return &map->entries[i];
    return NULL;
}

YNode *ytree_get(const YNode *map, const char *key) {
    YEntry *entry = ytree_entry(map, key);
    return entry ? entry->value : NULL;
}

bool ytree_has(const YNode *map, const char *key) {
    YNode *value = ytree_get(map, key);
    return value && !ytree_is_null(value);
}

bool ytree_is_null(const YNode *node) {
    if (!node || node->kind != YNODE_SCALAR || node->quoted) return false;
    const char *t = node->text;
    return t[0] == '\0' || strcmp(t, "~") == 0 || strcmp(t, "null") == 0 || strcmp(t, "Null") == 0 ||
           strcmp(t, "NULL") == 0;
}

const char *ytree_describe(const YNode *node, char *buf, size_t buflen) {
    if (node->kind == YNODE_MAPPING) snprintf(buf, buflen, "a mapping");
    else if (node->kind == YNODE_SEQUENCE) snprintf(buf, buflen, "a list");
    else if (ytree_is_null(node)) snprintf(buf, buflen, "null");
    else if (node->quoted) snprintf(buf, buflen, "the string \"%.80s\"", node->text);
    else snprintf(buf, buflen, "'%.80s'", node->text);
    return buf;
}

static void set_loc(YLoc *dst, YLoc src) {
    free(dst->file);
    dst->file = mt_strdup(src.file);
    dst->line = src.line;
}

int ytree_set_path(YNode *root, const char *path, YNode *value, YLoc loc, char *err, size_t errlen) {
    char *copy = mt_strdup(path);
    YNode *map = root;
    char *part = copy;
    int rc = 0;
    for (;;) {
        char *dot = strchr(part, '.');
        if (dot) *dot = '\0';
        if (part[0] == '\0') {
            mt_set_error(err, errlen, "%s: empty key name in '%s'", loc.file, path);
            rc = -1;
            break;
        }
        if (map->kind != YNODE_MAPPING) {
            /* only reachable for a null intermediate (checked below) or root */
            mt_set_error(err, errlen, "%s: cannot set '%s': '%s' is not a mapping", loc.file, path, part);
            rc = -1;
            break;
        }
        YEntry *entry = ytree_entry(map, part);
        if (!entry) {
            entry = node_append(map);
            entry->key = mt_strdup(part);
            entry->loc.file = mt_strdup(loc.file);
            entry->loc.line = loc.line;
        } else if (!dot) {
            set_loc(&entry->loc, loc); /* an existing section keeps its line: only the key set is the override's */
        }
        if (!dot) {
            ytree_free(entry->value);
            entry->value = value;
            value = NULL;
            break;
        }
        if (!entry->value || ytree_is_null(entry->value)) {
            ytree_free(entry->value);
            entry->value = node_new(YNODE_MAPPING, loc.file, loc.line);
        } else if (entry->value->kind != YNODE_MAPPING) {
            char buf[96];
            mt_set_error(err, errlen, "%s: cannot set '%s': '%.*s' is %s, not a mapping", loc.file, path,
                         (int)(dot - copy), path, ytree_describe(entry->value, buf, sizeof buf));
            rc = -1;
            break;
        }
        map = entry->value;
        part = dot + 1;
    }
    ytree_free(value);
    free(copy);
    return rc;
}
