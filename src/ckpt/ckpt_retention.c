/* ckpt_retention.c: which checkpoints a run keeps (the newest keep_last, or
 * all of them when keep_last is 0, as torchtitan's keep_latest_k; plus every
 * multiple of keep_every, plus any that a kept one references as its frozen
 * base) and the deletion of the others, which runs only after a newer
 * checkpoint is complete, a log line each. */
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

/* A LoRA checkpoint may reference a checkpoint of the same directory as its frozen base (checkpoint.frozen_base:
 * reference): that one is kept as long as a kept checkpoint references it. */
static void keep_referenced_bases(const char *checkpoints_dir, const long *steps, int n, bool *keep) {
    for (int i = 0; i < n; i++) {
        if (!keep[i]) continue;
        char dir[MT_PATH_MAX + 32], why[256];
        ckpt_iter_path(dir, sizeof dir, checkpoints_dir, steps[i]);
        CkptBaseRef base;
        if (ckpt_read_base_ref(dir, &base, why, sizeof why) != 0 || !base.present) continue;
        for (int j = 0; j < n; j++) {
            if (keep[j]) continue;
            char other[MT_PATH_MAX + 32];
            ckpt_iter_path(other, sizeof other, checkpoints_dir, steps[j]);
            char *resolved = realpath(other, NULL);
            if (resolved && strcmp(resolved, base.dir) == 0) {
                keep[j] = true;
                mt_log("checkpoint retention: keeping %s, the frozen base that %s references", other, dir);
            }
            free(resolved);
        }
    }
}

int ckpt_apply_retention(const char *checkpoints_dir, int keep_last, long keep_every, char *err, size_t errlen) {
    long *steps = NULL;
    int n = ckpt_list_steps(checkpoints_dir, &steps, err, errlen);
    if (n <= 0) return n;
    bool *keep = mt_calloc((size_t)n, sizeof(bool));
    ckpt_retention_plan(steps, n, keep_last, keep_every, keep);
    keep_referenced_bases(checkpoints_dir, steps, n, keep);
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
