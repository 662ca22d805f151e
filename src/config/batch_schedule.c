/* batch_schedule.c: the global batch size at a step, and the number of steps
 * a token budget takes.
 *
 * Stages are sorted by start (the recipe validator checks that the first is 0
 * and that starts increase); the last stage whose start is reached applies.
 * In step form the start is compared with the step, in token form (Megatron's
 * "0:16 2.4B:320") with the tokens consumed before the step. */
#include "batch_schedule.h"

#include <math.h>
#include <stdint.h>

long global_batch_at(const TrainConfig *train, long step, double consumed_tokens) {
    const double position = train->batch_stages_in_tokens ? consumed_tokens : (double)step;
    long gbs = train->batch_stages[0].global_batch_size;
    for (int i = 1; i < train->num_batch_stages; i++) {
        if (train->batch_stages[i].start <= position) gbs = train->batch_stages[i].global_batch_size;
        else break;
    }
    return gbs;
}

/* The schedule walked from step 0 (or a resumed run's position) in runs of steps that share a stage (one global batch size), a run at a
 * time rather than a step at a time (a budget of 2^53 steps or tokens is a few runs, not 2^53 iterations):
 * until max_steps steps or until target_tokens tokens are consumed (0: no target), whichever comes first.
 * Exact integer arithmetic (starts in token form rounded up: a stage applies once consumed >= start). */
typedef struct ScheduleWalk {
    __int128 steps, tokens, samples;
} ScheduleWalk;

static ScheduleWalk walk_schedule(const TrainConfig *train, __int128 max_steps, __int128 target_tokens) {
    /* from where a resumed run stands (0 for a fresh one): what it consumed is counted as it was, not as the
     * schedule now in force would have had it */
    ScheduleWalk w = {train->resumed_step, (__int128)train->resumed_tokens, train->resumed_samples};
    const int n = train->num_batch_stages;
    while (w.steps < max_steps && (target_tokens <= 0 || w.tokens < target_tokens)) {
        const __int128 position = train->batch_stages_in_tokens ? w.tokens : w.steps;
        int s = 0;
        for (int i = 1; i < n && (__int128)ceil(train->batch_stages[i].start) <= position; i++) s = i;
        const __int128 gbs = train->batch_stages[s].global_batch_size, per_step = gbs * train->seq_len;
        if (gbs <= 0 || train->seq_len <= 0) break; /* invalid recipe: never loop forever */
        __int128 run = max_steps - w.steps;
        if (s + 1 < n) { /* until the next stage starts */
            const __int128 next = (__int128)ceil(train->batch_stages[s + 1].start);
            const __int128 left = train->batch_stages_in_tokens ? (next - w.tokens + per_step - 1) / per_step
                                                                : next - w.steps;
            if (left < run) run = left;
        }
        if (target_tokens > 0) {
            const __int128 left = (target_tokens - w.tokens + per_step - 1) / per_step;
            if (left < run) run = left;
        }
        if (run < 1) run = 1;
        w.steps += run;
        /* tokens only where they are compared (step form could overflow them: 2^53 steps of huge batches) */
        if (train->batch_stages_in_tokens || target_tokens > 0) w.tokens += run * per_step;
        w.samples += run * gbs;
    }
    return w;
}

long train_total_steps(const TrainConfig *train) {
    if (train->tokens <= 0) return train->steps;
    /* each step consumes global_batch * seq_len tokens; the recipe holds tokens to 2^53, so the steps fit */
    const ScheduleWalk w = walk_schedule(train, (__int128)1 << 62, (__int128)ceil(train->tokens));
    return (long)w.steps;
}

int64_t train_schedule_samples(const TrainConfig *train, long total_steps) {
    const ScheduleWalk w = walk_schedule(train, total_steps, 0);
    return w.samples > INT64_MAX ? INT64_MAX : (int64_t)w.samples;
}
