/* eval_run_settings.h: what `megatrain eval` takes from the run that wrote the checkpoint (its recipe.yaml): the
 * settings the command line leaves out, and a note when those it gives are not the run's. */
#ifndef MT_EVAL_EVAL_RUN_SETTINGS_H
#define MT_EVAL_EVAL_RUN_SETTINGS_H

#include "eval_options.h"

/* The options the command line did not give (EvalOptions.given) from checkpoint `ckpt`'s recipe: seq_len,
 * micro_batch_size, eval_batches, seed, data.pack, data.pack_overlong, train.loss, and without --data the data its
 * evaluation read (its one data.valid dataset, or its one data.train with its data.split; with --test, the
 * latter's test share). One line on stderr says what was taken. Nothing for a checkpoint without a recipe (a
 * conversion). Returns 0, or 2 (reported) when the run evaluated on a blend and --data is missing. */
int eval_run_settings(const char *ckpt, EvalOptions *opt);

/* When --data is what the run evaluated on and the settings given are not its own, a note on stderr with the options
 * that reproduce its eval_loss; for one dataset of a blend, a note that this is not its eval_loss. */
void eval_note_run_settings(const char *ckpt, const EvalOptions *opt);

#endif
