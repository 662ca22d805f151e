/* train.h: the training loop for `megatrain run` and `megatrain resume`. */
#ifndef MT_TRAIN_TRAIN_H
#define MT_TRAIN_TRAIN_H

#include <stdbool.h>

#include "../config/recipe.h"

/* Train per the recipe (already loaded and validated). Writes the resolved
 * recipe, metrics.jsonl, checkpoints and logs under recipe->run.dir.
 * Refuses (exit 2) a run.dir that already holds checkpoints: that is what
 * `megatrain resume` is for. Returns the exit status. */
int train_run(const Recipe *recipe);

/* What train_resume returns when the checkpoint failed verification before
 * anything was trained (the reason is in err): try an older one. */
#define TRAIN_CHECKPOINT_UNREADABLE (-100)

/* Continue a run from checkpoint directory `checkpoint_dir` with `recipe`
 * (the checkpoint's recipe with the --set overrides applied). The optimizer
 * state is loaded when load_optimizer, else started afresh. Saves, metrics
 * and signals as train_run; errors are printed, except the reason for
 * TRAIN_CHECKPOINT_UNREADABLE, which goes to err. */
int train_resume(const Recipe *recipe, const char *checkpoint_dir, bool load_optimizer, char *err, size_t errlen);

/* megatrain resume RUN_OR_CKPT_DIR [--set key.path=value ...] (resume_cmd.c):
 * continue a run from its newest valid checkpoint (or the one named). argv
 * holds the arguments after the command word. Returns the exit status. */
int resume_main(int argc, char **argv);

/* megatrain run RECIPE --resume-if-exists (resume_cmd.c), a requeued job's one command: when run.dir holds a
 * checkpoint, continue the run from its newest valid one, as `megatrain resume RUN_DIR --set ...` with the same
 * --set values would, provided that gives `recipe` (the file and --set resolved; so the --set values may change
 * what a resume may change, and a recipe file that changed is refused, naming the first key); else start it. MPI is already started (several ranks). Returns the exit status,
 * MPI ended. */
int run_or_resume(const Recipe *recipe, const char *const *sets, int num_sets);

#endif
