/* train.h: the training loop for `megatrain run`. */
#ifndef MT_TRAIN_TRAIN_H
#define MT_TRAIN_TRAIN_H

#include "../config/recipe.h"

/* Train per the recipe (already loaded and validated). Writes the resolved
 * recipe, metrics.jsonl and logs under recipe->run.dir. Returns exit status. */
int train_run(const Recipe *recipe);

#endif
