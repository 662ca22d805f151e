/* train_data_record.h: the datasets a run trains on, as its checkpoints
 * record them (record DATA: each dataset's prefix and fingerprint,
 * src/data/indexed_dataset.h), and resume's comparison of that record with
 * what the same paths hold when it starts. A dataset built again at its
 * path with other documents or another tokenizer makes the resumed run read
 * other samples than the uninterrupted one; the sample index cache, keyed by
 * the files' sizes and times, follows it silently, so resume says it. */
#ifndef MT_TRAIN_TRAIN_DATA_RECORD_H
#define MT_TRAIN_TRAIN_DATA_RECORD_H

#include "train_context.h"

/* Rank 0: ctx->datasets from its loaders: data.train's datasets ("train") and, when the recipe gives data.valid or
 * data.test and the run evaluates, their datasets ("valid", "test"), each once, those the loader left out (an empty
 * share of the split) included. Other ranks record none (they do not write the metadata). */
void train_data_record_make(TrainContext *ctx);

/* Rank 0, on resume from checkpoint_dir: a warning for each dataset of the checkpoint's record whose path this
 * run reads (the same list) with another fingerprint; nothing for a checkpoint without a record. */
void train_data_record_compare(const TrainContext *ctx, const char *checkpoint_dir);

#endif
