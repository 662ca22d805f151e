/* expert_bias_drop.h: `megatrain convert --drop-expert-bias`: what exporting a
 * model trained with model.moe.load_balancing: expert_bias without its
 * routers' biases changes, said on stderr before anything is written.
 *
 * The biases (DeepSeek-V3's auxiliary-loss-free balancing) are added to the
 * router's scores for the top-k choice only (src/model/moe_layer.c);
 * transformers' Qwen3-MoE and Mixtral have none, so the exported model
 * chooses by the scores alone and sends some tokens to other experts than
 * the trained one. How many depends on the hidden states the routers see,
 * which a checkpoint does not hold; expert_bias_drop.c probes each router
 * with what it does hold (the token embeddings) and says so. */
#ifndef MT_CONVERT_EXPERT_BIAS_DROP_H
#define MT_CONVERT_EXPERT_BIAS_DROP_H

#include <stddef.h>

#include "../ckpt/checkpoint.h"
#include "../model/model.h"

/* At most this many token ids probe the routers (every id of a smaller vocabulary, else evenly spaced). */
#define EXPERT_BIAS_PROBES 1024

/* Checkpoint `ckpt` (model cfg, load_balancing expert_bias), its parameters streamed from `from` over the registry
 * `infos`: for each MoE layer, the spread of its biases and the share of top-k choices that change without them on
 * the probes, a warning and a line per layer on stderr. Reads the embedding rows of the probes (EXPERT_BIAS_PROBES x
 * hidden_size floats, twice: about 8 MiB at hidden_size 1024) and one router at a time. 0, or -1 with err. */
int expert_bias_drop_say(const char *ckpt, const ModelConfig *cfg, CkptParams *from, const ParamInfo *infos,
                         int num_params, char *err, size_t errlen);

#endif
