/* train_state.h: everything about a run's progress that a checkpoint must
 * carry besides the weights and the optimizer moments.
 *
 * With the same recipe, the weights, the AdamW state and a TrainState, the
 * next step is fully determined: the data position is consumed_samples (a
 * loader's sample i is a pure function of the recipe and i), the batch size
 * and learning rate follow from step and consumed_tokens, and rng is the only
 * random state the loop owns. */
#ifndef MT_TRAIN_TRAIN_STATE_H
#define MT_TRAIN_TRAIN_STATE_H

#include <stdint.h>

#include "../config/recipe.h"
#include "../core/rng.h"

typedef struct TrainState {
    long step;                /* steps completed = the 0-based index of the next step */
    int64_t consumed_samples; /* train samples consumed by all data-parallel ranks */
    int64_t consumed_tokens;  /* consumed_samples * seq_len, summed step by step */
    Rng rng;                  /* the loop's random stream (seeded from run.seed) */
} TrainState;

/* A fresh run: nothing consumed yet, rng seeded from `seed`. */
void train_state_init(TrainState *state, uint64_t seed);

#endif
