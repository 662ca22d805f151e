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

/* Returns 0; CKPT_LOCATE_NO_DIR when `arg` does not exist or is not a directory (the command line names no such
 * directory: a usage error, exit 2); or -1 (a directory that holds no checkpoint, a path too long, a path stat(2)
 * cannot read for another reason: no permission, a loop of links); err says what was expected. */
#define CKPT_LOCATE_NO_DIR (-2)
int ckpt_locate(const char *arg, CkptLocation *loc, char *err, size_t errlen);

#endif
