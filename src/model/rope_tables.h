/* rope_tables.h: the RoPE cos/sin tables of a model config (rope_theta and
 * the llama3 rope_scaling of src/config), computed as transformers does
 * (rope_tables.c says how). The ops that apply them (backend.h: rope_forward)
 * take the tables, not the config. */
#ifndef MT_MODEL_ROPE_TABLES_H
#define MT_MODEL_ROPE_TABLES_H

#include "../config/recipe.h"

/* cos/sin (T, D/2) for positions 0..T-1 with inv_freq from theta and
 * optional llama3 scaling (NULL: none; as transformers' _compute_llama3_parameters). */
void rope_tables_init(float *cos, float *sin, int T, int D, double theta, const RopeScaling *scaling);

#endif
