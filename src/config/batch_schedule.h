/* batch_schedule.h: the global batch size at a step.
 *
 * Step form: the last stage whose start <= step applies. Token form
 * (Megatron's "0:16 2.4B:320"): the last stage whose start <= consumed tokens. */
#ifndef MT_CONFIG_BATCH_SCHEDULE_H
#define MT_CONFIG_BATCH_SCHEDULE_H

#include <stdint.h>

#include "recipe.h"

long global_batch_at(const TrainConfig *train, long step, double consumed_tokens);

/* Steps needed to consume train->tokens (or train->steps when tokens == 0). A resumed run's count goes on from
 * its position (train->resumed_step, resumed_tokens) with the schedule now in force. */
long train_total_steps(const TrainConfig *train);

/* Total train samples the schedule consumes over `total_steps` steps
 * (the sum of the global batch sizes; for a resumed run, the samples it
 * consumed plus the sum from its step on), for sizing the data loader
 * (INT64_MAX when more). */
int64_t train_schedule_samples(const TrainConfig *train, long total_steps);

#endif
