/* ckpt_retention.c: which checkpoints a run keeps (the newest keep_last, or
 * all of them when keep_last is 0, as torchtitan's keep_latest_k; plus every
 * multiple of keep_every) and the deletion of the others, which runs only after
 * a newer checkpoint is complete, a log line each. No checkpoint of a run's own
 * directory can be another's frozen base there: a LoRA run cannot start in a
 * run.dir holding checkpoints nor be resumed from one without adapters, and
 * checkpoint.frozen_base: auto stores a base that lies in any checkpoints/. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "checkpoint.h"
#include "ckpt_fs.h"
#include "ckpt_run.h"

void ckpt_retention_plan(const long *steps, int n, int keep_last, long keep_every, bool *keep) {
    const int newest = keep_last > 0 ? keep_last : n; /* 0: keep every one */
    for (int i = 0; i < n; i++)
        keep[i] = i >= n - newest || (keep_every > 0 && steps[i] % keep_every == 0);
}

int ckpt_apply_retention(const char *checkpoints_dir, int keep_last, long keep_every, char *err, size_t errlen) {
    long *steps = NULL;
    int n = ckpt_list_steps(checkpoints_dir, &steps, err, errlen);
    if (n <= 0) return n;
    bool *keep = mt_calloc((size_t)n, sizeof(bool));
    ckpt_retention_plan(steps, n, keep_last, keep_every, keep);
    int deleted = 0, rc = 0;
    for (int i = 0; i < n; i++) {
        if (keep[i]) continue;
        char dir[MT_PATH_MAX + 32], doomed[MT_PATH_MAX + 64];
        ckpt_iter_path(dir, sizeof dir, checkpoints_dir, steps[i]);
        snprintf(doomed, sizeof doomed, "%s.deleting", dir);
        if (rename(dir, doomed) != 0) {
            mt_set_error(err, errlen, "%s: cannot remove: %s", dir, strerror(errno));
            rc = -1;
            continue;
        }
        if (ckpt_remove_tree(doomed, err, errlen) != 0) {
            rc = -1;
        } else {
            deleted++;
            mt_log("checkpoint retention: removed %s (checkpoint.keep_last %d%s)", dir, keep_last,
                   keep_every > 0 ? ", not a multiple of checkpoint.keep_every" : "");
        }
    }
    free(keep);
    free(steps);
    return rc == 0 ? deleted : -1;
}
