/* hf_names.h: our parameter names (the registry, model.h) <-> Hugging Face
 * transformers' state-dict names, one table per family.
 *
 * "{L}" in a table stands for a layer, "{E}" for an expert: our stacked
 * expert tensors (E, I, C) are E Hugging Face tensors (I, C), one per expert.
 * A registry parameter with no entry in its family's table has no place in
 * that family's transformers model (e.g. q/k/v biases in llama, whose HF
 * attention_bias also adds an o_proj bias), and cannot be converted.
 */
#ifndef MT_CONVERT_HF_NAMES_H
#define MT_CONVERT_HF_NAMES_H

#include <stdbool.h>
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

/* One Hugging Face tensor holding a contiguous part of a registry parameter
 * (`offset` floats in, `shape` of it), and its place in transformers' state_dict. */
typedef struct HfPiece {
    char name[160];
    long offset;
    int ndim;
    long shape[2];
    long position;
} HfPiece;

/* The HF tensors of registry parameter `info` (a whole model's): one, or,
 * for the stacked experts [E, d1, d2] of a MoE layer, one [d1, d2] per expert.
 * Returns how many (written into pieces, room for max), or -1 when the
 * family's table has no entry for it. */
int hf_pieces(ModelFamily family, const ParamInfo *info, int num_experts, HfPiece *pieces, int max);

/* Where HF tensor `hf` comes in the state_dict that save_pretrained shards
 * (a sort key: smaller comes first), or -1 when the table has no entry:
 * module order for the dense families; for the MoE families the order of
 * transformers 5, which sorts the names of its fused-expert model
 * (dot_natural_key) and then splits each fused tensor expert by expert. */
long hf_name_position(ModelFamily family, const char *hf);

/* Whether transformers 5 saves the family's experts as slices of fused
 * tensors: the experts of one registry parameter (one projection of one
 * layer) then share a storage, which decides where shards split. */
bool hf_saves_fused_experts(ModelFamily family);

/* The tensor of transformers 5's in-memory model (what save_file(model.state_dict()) writes) that holds Hub tensor
 * `hub` (expanded: layer and expert numbers in it): its name into fused, the expert (-1: the whole tensor, renamed:
 * Mixtral's router), and which of `parts` equal row blocks of that expert it is (gate_up_proj: 0 gate, 1 up, of
 * 2). 0, or -1 when `hub` is not held by a fused tensor. */
int hf_fused_source(const char *hub, char *fused, size_t fusedlen, long *expert, int *part, int *parts);

#endif
