/* init_from.h: starting a run from the weights of a checkpoint (the recipe's
 * `init_from: CKPT_DIR`, e.g. a Hugging Face model converted by
 * `megatrain convert`). Only the weights (with the token ids and the files
 * carried for Hugging Face) are taken: the optimizer, the step and the data
 * position start fresh. */
#ifndef MT_CONVERT_INIT_FROM_H
#define MT_CONVERT_INIT_FROM_H

#include <stddef.h>

#include "../ckpt/checkpoint.h"
#include "../model/model.h"

/* Load the weights of checkpoint `path` (an iter_ directory, or a run or
 * checkpoints/ directory: its newest) into `model`, after checking that the
 * checkpoint's model config matches model->cfg in every setting that
 * changes the computation (not max_position_embeddings or
 * initializer_range). Returns 0, or an exit status with err set:
 * MT_EXIT_USAGE when the recipe's model differs from the checkpoint's,
 * MT_EXIT_FAILURE when the checkpoint is missing or unreadable.
 * The token ids model->cfg leaves unset are taken from the checkpoint, and
 * *carried (when not NULL; ckpt_hf_files_free it) receives the files the
 * checkpoint carries for the Hugging Face export (tokenizer,
 * generation_config.json), for the run to carry into its own checkpoints.
 * *base (when not NULL) receives the frozen base the loaded weights came
 * from (ckpt_base_ref_of: the checkpoint, or the base it references), for
 * a LoRA run's checkpoints to reference instead of storing it. */
int init_from_checkpoint(Model *model, const char *path, CkptHfFiles *carried, CkptBaseRef *base, char *err,
                         size_t errlen);

/* The checks alone, against a recipe's model cfg, before any data or weights are read (train_setup: a mismatch is
 * said before a large data set's index is built). The same statuses. */
int init_from_check(const char *path, const ModelConfig *cfg, char *err, size_t errlen);

#endif
