/* ckpt_latest_dir.c: a run, checkpoints/ or checkpoint directory -> the
 * checkpoint to read (the newest iter_ directory, as `inspect` picks). */
#include "ckpt_latest_dir.h"

#include <stdio.h>
#include <stdlib.h>

#include "../ckpt/ckpt_locate.h"
#include "../ckpt/ckpt_run.h"
#include "../core/error.h"

int ckpt_latest_dir(const char *path, char *out, size_t outlen, char *err, size_t errlen) {
    CkptLocation loc;
    if (ckpt_locate(path, &loc, err, errlen) != 0) return -1;
    if (loc.single) {
        if ((size_t)snprintf(out, outlen, "%s", loc.checkpoint_dir) >= outlen) {
            mt_set_error(err, errlen, "%s: path too long", path);
            return -1;
        }
        return 0;
    }
    long *steps = NULL;
    char why[512];
    int n = ckpt_list_steps(loc.checkpoints_dir, &steps, why, sizeof why);
    if (n <= 0) {
        mt_set_error(err, errlen, "%s: %s", loc.checkpoints_dir, n < 0 ? why : "holds no checkpoints");
        free(steps);
        return -1;
    }
    int status = ckpt_iter_path(out, outlen, loc.checkpoints_dir, steps[n - 1]);
    free(steps);
    if (status != 0) mt_set_error(err, errlen, "%s: path too long", loc.checkpoints_dir);
    return status;
}
