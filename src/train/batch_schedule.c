/* batch_schedule.c: the global batch size at a step, and the number of steps
 * a token budget takes.
 *
 * Stages are sorted by start (the recipe validator checks that the first is 0
 * and that starts increase); the last stage whose start is reached applies.
 * In step form the start is compared with the step, in token form (Megatron's
 * "0:16 2.4B:320") with the tokens consumed before the step. */
#include "batch_schedule.h"

long global_batch_at(const TrainConfig *train, long step, double consumed_tokens) {
    const double position = train->batch_stages_in_tokens ? consumed_tokens : (double)step;
    long gbs = train->batch_stages[0].global_batch_size;
    for (int i = 1; i < train->num_batch_stages; i++) {
        if (train->batch_stages[i].start <= position) gbs = train->batch_stages[i].global_batch_size;
        else break;
    }
    return gbs;
}

long train_total_steps(const TrainConfig *train) {
    if (train->tokens <= 0) return train->steps;
    /* Simulate the schedule: each step consumes global_batch * seq_len tokens. */
    double consumed = 0.0;
    long step = 0;
    while (consumed < train->tokens) {
        long gbs = global_batch_at(train, step, consumed);
        if (gbs <= 0 || train->seq_len <= 0) return step; /* invalid recipe: never loop forever */
        consumed += (double)gbs * (double)train->seq_len;
        step++;
    }
    return step;
}
