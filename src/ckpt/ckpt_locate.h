/* ckpt_locate.h: what a RUN_OR_CKPT_DIR argument names (resume, inspect):
 * one checkpoint (a directory holding metadata.mtck, or named iter_NNNNNNN),
 * a run directory (holding checkpoints/), or a checkpoints directory. */
#ifndef MT_CKPT_CKPT_LOCATE_H
#define MT_CKPT_CKPT_LOCATE_H

#include <stdbool.h>
#include <stddef.h>

#include "../config/recipe.h"

typedef struct CkptLocation {
    bool single;                          /* the argument is one checkpoint */
    char checkpoint_dir[MT_PATH_MAX];     /* that checkpoint (single only) */
    char checkpoints_dir[MT_PATH_MAX];    /* the run's checkpoints/ ("" when not known) */
    char run_dir[MT_PATH_MAX];            /* the run directory ("" when not known) */
} CkptLocation;

/* Returns 0, or -1 with err saying what was expected. */
int ckpt_locate(const char *arg, CkptLocation *loc, char *err, size_t errlen);

#endif
