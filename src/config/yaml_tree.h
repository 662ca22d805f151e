/* yaml_tree.h: a small YAML node tree (mapping / sequence / scalar) that
 * remembers the file and line of every node and key, so recipe errors can
 * point at them. Built from libyaml's document API; private to src/config. */
#ifndef MT_CONFIG_YAML_TREE_H
#define MT_CONFIG_YAML_TREE_H

#include <stdbool.h>
#include <stddef.h>

#define MT_LOC_BUF 1200 /* room for "FILE:LINE" or an override's text */

/* Most nodes one document may have once its aliases are expanded (every use
 * of an alias copies its anchor's nodes, so nested aliases grow
 * exponentially). The largest shipped recipe has 125 nodes, a blend of 20000
 * datasets about 100000; an alias bomb stops here in milliseconds. */
#define YTREE_MAX_NODES 100000
/* Bytes of YAML read at most (a file, a --set value): libyaml builds the whole document before the node cap. */
#define YTREE_MAX_BYTES (1 << 20)

typedef enum { YNODE_SCALAR, YNODE_MAPPING, YNODE_SEQUENCE } YNodeKind;

/* Where a node or key came from: a file and 1-based line, or an override
 * ("--set a.b=1") with line 0. */
typedef struct YLoc {
    char *file;
    int line;
} YLoc;

typedef struct YNode YNode;

typedef struct YEntry {
    char *key;       /* NULL for sequence items */
    YLoc loc;        /* of the key (or the item) */
    YNode *value;
} YEntry;

struct YNode {
    YNodeKind kind;
    YLoc loc;
    char *text;      /* scalar text */
    bool quoted;     /* scalar was quoted (so never null/number/bool) */
    int count;
    YEntry *entries; /* mapping pairs or sequence items */
};

/* Parse a file; returns NULL with err "FILE:LINE: ..." on a syntax error, a
 * missing file, an empty document or more than YTREE_MAX_NODES nodes (the
 * line of the outermost alias whose expansion crossed it). */
YNode *ytree_load_file(const char *path, char *err, size_t errlen);

/* Parse a YAML text (an override value); nodes get `origin` as file, line 0.
 * Empty text gives a null scalar. */
YNode *ytree_load_string(const char *text, const char *origin, char *err, size_t errlen);

void ytree_free(YNode *node);

/* Mapping lookup (NULL when absent or when `map` is not a mapping). */
YEntry *ytree_entry(const YNode *map, const char *key);
YNode *ytree_get(const YNode *map, const char *key);

/* The key is there with a non-null value (a null value means "not given"). */
bool ytree_has(const YNode *map, const char *key);

/* True for a plain null scalar: null, Null, NULL, ~ or empty. */
bool ytree_is_null(const YNode *node);

/* "a mapping", "a list", "null", "'text'" or "the string \"text\"" for messages. */
const char *ytree_describe(const YNode *node, char *buf, size_t buflen);

/* Set `value` at dotted `path` in `root`, creating mappings along the way
 * (a missing or null intermediate becomes a mapping). Takes ownership of
 * value. The key set and the mappings created get `loc`; mappings already
 * there keep theirs (a key missing from a recipe's section is blamed on the
 * section's line, not on an override that set another key in it). Returns
 * 0, or -1 with err when an intermediate node is a scalar or a list. */
int ytree_set_path(YNode *root, const char *path, YNode *value, YLoc loc, char *err, size_t errlen);

/* Format "FILE:LINE" (or just the override text when line is 0). */
const char *yloc_format(YLoc loc, char *buf, size_t buflen);

#endif
