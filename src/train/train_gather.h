/* train_gather.h: the whole model on one rank, gathered from the parts of a
 * parallel layout, for a checkpoint written by world rank 0. Private to src/train. */
#ifndef MT_TRAIN_TRAIN_GATHER_H
#define MT_TRAIN_TRAIN_GATHER_H

#include "train_context.h"

/* Collective over the world. On world rank 0: `whole` (a whole model,
 * weights only; created when NULL) holding every parameter and, when `opt` is not NULL (this rank's full
 * moments, laid out like its params), *whole_opt initialised with the whole
 * moments. The ranks with dp = cp = 0 send their parts; the others hold
 * copies and send nothing. Returns NULL on the other ranks. */
Model *train_gather_whole(const TrainContext *ctx, Model *whole, const AdamW *opt, AdamW *whole_opt);

#endif
