/* lr_schedule.h: learning rate and weight decay at a step (Megatron's OptimizerParamScheduler).
 *
 * Linear warmup from warmup_init (0 by default) to lr over warmup_steps (or warmup_fraction of the
 * decay steps, not rounded), then by `decay` down to min_lr
 * at decay_steps (default train.steps): constant, linear, cosine,
 * inverse_sqrt, or wsd (constant until the final wsd_decay_steps, which decay
 * by wsd_decay_style). Steps are 0-based: step s uses lr_at(s).
 * Weight decay: weight_decay throughout, or with weight_decay_style linear or cosine from weight_decay at the first
 * step to weight_decay_end at the run's end (total_steps). */
#ifndef MT_TRAIN_LR_SCHEDULE_H
#define MT_TRAIN_LR_SCHEDULE_H

#include "../config/recipe.h"

/* total_steps is train.steps (or the estimate from train.tokens). */
double lr_at(const OptimizerConfig *opt, long step, long total_steps);
/* The weight decay of step `step`'s update (norms and biases take none whatever it is). */
double weight_decay_at(const OptimizerConfig *opt, long step, long total_steps);

#endif
