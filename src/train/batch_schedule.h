/* batch_schedule.h: the global batch size at a step.
 *
 * Step form: the last stage whose start <= step applies. Token form
 * (Megatron's "0:16 2.4B:320"): the last stage whose start <= consumed tokens. */
#ifndef MT_TRAIN_BATCH_SCHEDULE_H
#define MT_TRAIN_BATCH_SCHEDULE_H

#include "../config/recipe.h"

long global_batch_at(const TrainConfig *train, long step, double consumed_tokens);

/* Steps needed to consume train->tokens (or train->steps when tokens == 0). */
long train_total_steps(const TrainConfig *train);

#endif
