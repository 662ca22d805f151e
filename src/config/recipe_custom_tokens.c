/* recipe_custom_tokens.c: the model keys bos_token_id, eos_token_id and
 * pad_token_id (ModelConfig.token_ids): null (none, the default), a token id
 * >= 0, and for eos_token_id also a list of ids (Llama 3.1 stops at any of
 * [128001, 128008, 128009]), kept as a list when written. That each id is
 * below vocab_size is checked with the other keys (model_validate). Also
 * the rule by which a run inherits what its recipe leaves unset (the ids, export_dtype) from the checkpoint
 * it starts from. */
#include <limits.h>
#include <string.h>

#include "recipe_schema.h"

static int read_id(const YNode *node, YLoc loc, const char *path, int *out, char *err, size_t errlen) {
    long long value;
    if (read_integer(node, loc, path, 0, INT_MAX, &value, err, errlen) != 0) return -1;
    *out = (int)value;
    return 0;
}

int read_bos_token_id(void *base, const YEntry *entry, const char *path, char *err, size_t errlen) {
    SpecialTokenIds *ids = &((ModelConfig *)base)->token_ids;
    if (read_id(entry->value, entry->loc, path, &ids->bos, err, errlen) != 0) return -1;
    ids->has_bos = true;
    return 0;
}

int read_pad_token_id(void *base, const YEntry *entry, const char *path, char *err, size_t errlen) {
    SpecialTokenIds *ids = &((ModelConfig *)base)->token_ids;
    if (read_id(entry->value, entry->loc, path, &ids->pad, err, errlen) != 0) return -1;
    ids->has_pad = true;
    return 0;
}

int read_eos_token_id(void *base, const YEntry *entry, const char *path, char *err, size_t errlen) {
    SpecialTokenIds *ids = &((ModelConfig *)base)->token_ids;
    const YNode *node = entry->value;
    char found[128];
    if (node->kind != YNODE_SEQUENCE) {
        if (read_id(node, entry->loc, path, &ids->eos[0], err, errlen) != 0) return -1;
        ids->num_eos = 1;
        ids->eos_is_list = false;
        return 0;
    }
    if (node->count < 1 || node->count > MT_MAX_EOS_TOKEN_IDS)
        return key_error(err, errlen, entry->loc, path, "expected a token id or a list of 1 to %d ids, found %s",
                         MT_MAX_EOS_TOKEN_IDS, ytree_describe(node, found, sizeof found));
    for (int i = 0; i < node->count; i++)
        if (read_id(node->entries[i].value, node->entries[i].loc, path, &ids->eos[i], err, errlen) != 0) return -1;
    ids->num_eos = node->count;
    ids->eos_is_list = true;
    return 0;
}

static void write_id(FILE *out, const char *name, int indent, bool has, int id) {
    fprintf(out, "%*s%s: ", indent, "", name);
    if (has) fprintf(out, "%d\n", id);
    else fprintf(out, "null\n");
}

void write_bos_token_id(FILE *out, const void *base, const char *name, int indent) {
    const SpecialTokenIds *ids = &((const ModelConfig *)base)->token_ids;
    write_id(out, name, indent, ids->has_bos, ids->bos);
}

void write_pad_token_id(FILE *out, const void *base, const char *name, int indent) {
    const SpecialTokenIds *ids = &((const ModelConfig *)base)->token_ids;
    write_id(out, name, indent, ids->has_pad, ids->pad);
}

void write_eos_token_id(FILE *out, const void *base, const char *name, int indent) {
    const SpecialTokenIds *ids = &((const ModelConfig *)base)->token_ids;
    if (!ids->eos_is_list) {
        write_id(out, name, indent, ids->num_eos > 0, ids->eos[0]);
        return;
    }
    fprintf(out, "%*s%s: [", indent, "", name);
    for (int i = 0; i < ids->num_eos; i++) fprintf(out, "%s%d", i ? ", " : "", ids->eos[i]);
    fprintf(out, "]\n");
}

bool model_config_inherit_unset(ModelConfig *cfg, const ModelConfig *checkpoint) {
    if (cfg->export_dtype == EXPORT_AUTO) cfg->export_dtype = checkpoint->export_dtype;
    SpecialTokenIds *ids = &cfg->token_ids;
    const SpecialTokenIds *from = &checkpoint->token_ids;
    if (!ids->has_bos && from->has_bos) ids->has_bos = true, ids->bos = from->bos;
    if (!ids->has_pad && from->has_pad) ids->has_pad = true, ids->pad = from->pad;
    if (ids->num_eos == 0 && from->num_eos > 0) {
        ids->num_eos = from->num_eos;
        ids->eos_is_list = from->eos_is_list;
        memcpy(ids->eos, from->eos, sizeof ids->eos);
    }
    bool same = ids->has_bos == from->has_bos && (!ids->has_bos || ids->bos == from->bos) &&
                ids->has_pad == from->has_pad && (!ids->has_pad || ids->pad == from->pad) &&
                ids->num_eos == from->num_eos;
    for (int i = 0; same && i < ids->num_eos; i++) same = ids->eos[i] == from->eos[i];
    return !same;
}
