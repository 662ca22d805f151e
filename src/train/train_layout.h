/* train_layout.h: where this process sits in the parallel layout of a run
 * (the grid of src/dist/grid.h built from the recipe's parallel section) and
 * which part of the model it holds (ModelPartition). Private to src/train. */
#ifndef MT_TRAIN_TRAIN_LAYOUT_H
#define MT_TRAIN_TRAIN_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>

#include "../config/recipe.h"
#include "../dist/grid.h"
#include "../model/model.h"

typedef struct TrainLayout {
    int world_size;
    int dp_size, dp_rank;
    int tp, cp, pp, vpp;
    int pp_rank;
    bool model_parallel;  /* tp * cp * pp > 1: the model is cut over ranks */
} TrainLayout;

/* The partition of the rank at `coords` in a grid of `layout` (comms not set). */
ModelPartition train_partition_of(const ModelConfig *cfg, const ParallelConfig *par, const GridLayout *layout,
                                  GridCoords coords);

/* Collective over the world: the grid of the recipe's layout, this rank's
 * TrainLayout and ModelPartition (its comms point into grid). Returns 0, or
 * MT_EXIT_USAGE with err set. */
int train_layout_create(const Recipe *recipe, Grid *grid, TrainLayout *layout, ModelPartition *part, char *err,
                        size_t errlen);

#endif
