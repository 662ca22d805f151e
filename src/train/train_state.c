/* train_state.c: a fresh run's progress counters. */
#include "train_state.h"

#include <string.h>

#include "../config/recipe.h"

/* Keeps the loop's stream apart from other users of run.seed (weights, data). */
#define TRAIN_RNG_STREAM 0x747261696e6c6f6fULL

void train_state_init(TrainState *state, uint64_t seed) {
    memset(state, 0, sizeof *state);
    rng_seed(&state->rng, seed ^ TRAIN_RNG_STREAM);
}
