/* train_state.c: a fresh run's progress counters, and the number of samples
 * the whole batch schedule consumes. */
#include "train_state.h"

#include <string.h>

#include "../config/recipe.h"
#include "batch_schedule.h"

/* Keeps the loop's stream apart from other users of run.seed (weights, data). */
#define TRAIN_RNG_STREAM 0x747261696e6c6f6fULL

void train_state_init(TrainState *state, uint64_t seed) {
    memset(state, 0, sizeof *state);
    rng_seed(&state->rng, seed ^ TRAIN_RNG_STREAM);
}

int64_t train_schedule_samples(const TrainConfig *train, long total_steps) {
    int64_t samples = 0;
    double tokens = 0.0;
    for (long step = 0; step < total_steps; step++) {
        long gbs = global_batch_at(train, step, tokens);
        samples += gbs;
        tokens += (double)gbs * (double)train->seq_len;
    }
    return samples;
}
