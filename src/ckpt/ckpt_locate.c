/* ckpt_locate.c: telling a checkpoint, a run directory and a checkpoints
 * directory apart (see ckpt_locate.h). */
#include "ckpt_locate.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/error.h"
#include "../core/fs.h"
#include "ckpt_format.h"
#include "ckpt_fs.h"
#include "ckpt_run.h"

static bool is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

int ckpt_locate(const char *arg, CkptLocation *loc, char *err, size_t errlen) {
    memset(loc, 0, sizeof *loc);
    char path[MT_PATH_MAX];
    if (snprintf(path, sizeof path, "%s", arg) >= (int)sizeof path) {
        mt_set_error(err, errlen, "%s: path too long", arg);
        return -1;
    }
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') path[--n] = '\0';
    struct stat st;
    if (stat(path, &st) != 0 && mt_path_stat_status(errno) != MT_EXIT_USAGE) { /* there, but not to be read */
        mt_set_error(err, errlen, "%s: cannot read it: %s (expected a run directory, its checkpoints/ directory, or a "
                     "checkpoint directory iter_NNNNNNN)", arg, strerror(errno));
        return -1;
    }
    if (!is_dir(path)) {
        mt_set_error(err, errlen, "%s: %s (expected a run directory, its checkpoints/ directory, or a checkpoint "
                     "directory iter_NNNNNNN)", arg, stat(path, &st) == 0 ? "not a directory" : "no such directory");
        return CKPT_LOCATE_NO_DIR;
    }
    char probe[MT_PATH_MAX + 64];
    snprintf(probe, sizeof probe, "%s/%s", path, CKPT_METADATA_FILE);
    if (access(probe, F_OK) == 0 || ckpt_parse_iter_name(base_name(path)) >= 0) {
        loc->single = true;
        snprintf(loc->checkpoint_dir, sizeof loc->checkpoint_dir, "%s", path);
        char parent[MT_PATH_MAX];
        mt_parent_dir(path, parent, sizeof parent);
        if (strcmp(base_name(parent), "checkpoints") == 0) {
            snprintf(loc->checkpoints_dir, sizeof loc->checkpoints_dir, "%s", parent);
            mt_parent_dir(parent, loc->run_dir, sizeof loc->run_dir);
        }
        return 0;
    }
    snprintf(probe, sizeof probe, "%s/checkpoints", path);
    if (is_dir(probe)) {
        if (strlen(probe) >= sizeof loc->checkpoints_dir) {
            mt_set_error(err, errlen, "%s: path too long", probe);
            return -1;
        }
        memcpy(loc->checkpoints_dir, probe, strlen(probe) + 1);
        snprintf(loc->run_dir, sizeof loc->run_dir, "%s", path);
        return 0;
    }
    long *steps = NULL;
    char ignored[256];
    int count = ckpt_list_entries(path, &steps, ignored, sizeof ignored);
    free(steps);
    snprintf(probe, sizeof probe, "%s/%s", path, CKPT_LATEST_FILE);
    if (count > 0 || access(probe, F_OK) == 0) {
        snprintf(loc->checkpoints_dir, sizeof loc->checkpoints_dir, "%s", path);
        if (strcmp(base_name(path), "checkpoints") == 0) mt_parent_dir(path, loc->run_dir, sizeof loc->run_dir);
        return 0;
    }
    snprintf(probe, sizeof probe, "%s/config.json", path);
    if (access(probe, F_OK) == 0) { /* what a Hugging Face user tries first */
        mt_set_error(err, errlen, "%s: holds no checkpoints: it is a Hugging Face model directory (config.json); "
                     "convert it first: megatrain convert %s DST, then use DST", arg, arg);
        return -1;
    }
    mt_set_error(err, errlen, "%s: holds no checkpoints (expected a run directory with checkpoints/, a checkpoints "
                 "directory, or a checkpoint directory iter_NNNNNNN)", arg);
    return -1;
}
