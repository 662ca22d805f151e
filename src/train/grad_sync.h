/* grad_sync.h: after a step's backward on the CPU, the gradient every rank
 * needs, the global grad norm and the step's loss, over the groups of the
 * parallel layout (tensor, context, data and pipeline parallel). */
#ifndef MT_TRAIN_GRAD_SYNC_H
#define MT_TRAIN_GRAD_SYNC_H

#include "train_context.h"

/* Collective: this rank's gradients become its part of the single-rank
 * gradient: partial sums over tp (shared q/k norms; norms under sequence
 * parallel) summed, the tied embedding's two copies (first and last stage)
 * summed, the cp ranks' contributions summed, then the dp mean (with the
 * distributed optimizer, reduce-scattered: this rank's parts only; the
 * experts of expert parallel: over the ranks holding the same experts). */
void train_sync_grads(TrainContext *ctx);

/* Collective: the L2 norm of the whole model's gradient: every parameter
 * counted once (ParamInfo.norm_owner), summed over tp and pp (and over dp
 * parts with the distributed optimizer). The same bits on every rank. */
double train_grad_norm(const TrainContext *ctx);

/* Collective: the step's loss from this rank's mean over its micro-batches
 * (meaningful on the last pipeline stage): shared over pp, averaged over dp. */
double train_step_loss(const TrainContext *ctx, double local_mean);

#endif
