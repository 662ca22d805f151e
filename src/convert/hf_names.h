/* hf_names.h: our parameter names (the registry, model.h) <-> Hugging Face
 * transformers' state-dict names, one table per family.
 *
 * "{L}" in a table stands for a layer, "{E}" for an expert: our stacked
 * expert tensors (E*I, C) are E Hugging Face tensors (I, C), one per expert.
 * A registry parameter with no entry in its family's table has no place in
 * that family's transformers model (e.g. q/k/v biases in llama, whose HF
 * attention_bias also adds an o_proj bias), and cannot be converted.
 */
#ifndef MT_CONVERT_HF_NAMES_H
#define MT_CONVERT_HF_NAMES_H

#include <stddef.h>

#include "../config/recipe.h"
#include "../model/model.h"

/* Writes the HF name of registry parameter `ours` into out. Returns 0, or -1
 * when the family's table has no entry for it (or out is too small, or it
 * is a stack of experts: hf_pieces). */
int hf_name_from_ours(ModelFamily family, const char *ours, char *out, size_t outlen);

/* Writes the registry name of HF tensor `hf` into out. Returns 0, or -1 when
 * the family's table has no entry for it. */
int hf_name_to_ours(ModelFamily family, const char *hf, char *out, size_t outlen);

/* One Hugging Face tensor holding rows [row0, row0 + rows) of a registry
 * parameter, and its place in transformers' state_dict. */
typedef struct HfPiece {
    char name[160];
    long row0, rows;
    long position;
} HfPiece;

/* The HF tensors of registry parameter `info`: one, or, for the stacked
 * experts of a MoE layer, num_experts row blocks (expert e: rows e * R/E ..).
 * Returns how many (written into pieces, room for max), or -1 when the
 * family's table has no entry for it. */
int hf_pieces(ModelFamily family, const ParamInfo *info, int num_experts, HfPiece *pieces, int max);

/* Where HF tensor `hf` comes in transformers' state_dict of the family
 * (a sort key: smaller comes first), or -1 when the table has no entry. */
long hf_name_position(ModelFamily family, const char *hf);

#endif
