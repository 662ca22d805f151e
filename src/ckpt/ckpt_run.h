/* ckpt_run.h: the checkpoints of a run, run.dir/checkpoints/:
 *
 *   iter_0000040/                       complete checkpoints (7+ digits, Megatron's names)
 *   latest_checkpointed_iteration.txt   the step of the newest one ("40\n"), replaced atomically
 *   iter_0000050.tmp.PID/               a save in progress (or killed): ignored, removed by the next save
 *   iter_0000010.deleting/              a checkpoint being removed by retention (likewise)
 *
 * A save is committed when its directory is renamed into place; the pointer
 * is updated after that, and retention runs last. */
#ifndef MT_CKPT_CKPT_RUN_H
#define MT_CKPT_CKPT_RUN_H

#include <stdbool.h>
#include <stddef.h>

#include "../config/recipe.h"
#include "ckpt_writer.h"

#define CKPT_LATEST_FILE "latest_checkpointed_iteration.txt"

/* "<checkpoints_dir>/iter_0000040". Returns 0, or -1 when it does not fit. */
int ckpt_iter_path(char *out, size_t outlen, const char *checkpoints_dir, long step);

/* The step of an entry named exactly "iter_" + at least 7 digits; else -1. */
long ckpt_parse_iter_name(const char *name);

/* The steps of the iter_ directories in checkpoints_dir, ascending, into a
 * malloc'ed array (*steps; NULL when none). Returns how many (0 when the
 * directory does not exist), or -1 with err set. */
int ckpt_list_steps(const char *checkpoints_dir, long **steps, char *err, size_t errlen);
/* ckpt_list_steps over every entry named iter_N (a file or a dangling link too): what a new run must not mix
 * with, and what resume tries in turn (it stops at one that is not a checkpoint directory, ckpt_entry_not_dir)
 * rather than meet at its save of that step ("already exists"). */
int ckpt_list_entries(const char *checkpoints_dir, long **steps, char *err, size_t errlen);

/* 0 when `path` is a directory (or a link to one); else what it is into `what`, for a message, and 2 for a
 * symbolic link ("a symbolic link to 'T', which does not exist (a volume that is not mounted?)"), 1 for anything
 * else ("a regular file"). */
int ckpt_entry_not_dir(const char *path, char *what, size_t whatlen);

/* The entries of checkpoints_dir that a resume moved aside as unusable (iter_N.invalid, .invalid.K): how many;
 * when any, err says that the run can neither continue from them nor start afresh over them (for a caller that
 * found no checkpoint beside them). */
int ckpt_invalid_only(const char *checkpoints_dir, char *err, size_t errlen);

/* The step in latest_checkpointed_iteration.txt: 0; -1 when absent or
 * unreadable; -2 when it holds something else than a step number, or is
 * no regular file (a FIFO is never waited on) (a description of what, for a
 * message, into `found`). */
int ckpt_read_latest(const char *checkpoints_dir, long *step, char *found, size_t foundlen);

/* Replace latest_checkpointed_iteration.txt (temporary file, fsync, rename,
 * fsync of the directory). Returns 0 or -1 with err set. */
int ckpt_write_latest(const char *checkpoints_dir, long step, char *err, size_t errlen);

/* Remove what killed saves and deletions left behind (*.tmp.* and *.deleting). */
void ckpt_remove_leftovers(const char *checkpoints_dir);

/* Which checkpoints retention keeps: of `steps` (ascending, n of them), the
 * newest keep_last (all when 0) and every step that is a multiple of
 * keep_every (when > 0). keep[i] is set for each. */
void ckpt_retention_plan(const long *steps, int n, int keep_last, long keep_every, bool *keep);

/* Delete the checkpoints of checkpoints_dir that the plan does not keep
 * (renamed to *.deleting first, so a half-deleted one never looks like a
 * checkpoint). Returns the number deleted, or -1 with err set. */
int ckpt_apply_retention(const char *checkpoints_dir, int keep_last, long keep_every, char *err, size_t errlen);

/* One save of a run: remove leftovers, write iter_<step> (crash-safe), point
 * the latest file at it. Returns 0, or -1 with err set (the previous
 * checkpoints are untouched). stats may be NULL. Retention is the caller's
 * next step (ckpt_apply_retention), once it has said the save is done. */
int ckpt_save_run(const char *checkpoints_dir, long step, const CkptPayload *payload,
                  CkptWriteStats *stats, char *err, size_t errlen);

#endif
