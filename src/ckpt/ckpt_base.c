/* ckpt_base.c: LoRA checkpoints that reference their frozen base instead of
 * storing it (checkpoint.frozen_base: reference, record BASE): which base a
 * run records, and checking a recorded base before its weights are loaded.
 *
 * A base is a checkpoint directory (absolute, symlinks resolved) and the
 * CRC-32C of its metadata.mtck at the time it was recorded. That file lists
 * every chunk of every tensor with its CRC, so an unchanged CRC means the
 * same weights; a base is never followed further than one level (a run
 * started from a checkpoint that references a base records that base). */
#include "ckpt_base.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/crc32c.h"
#include "../core/error.h"
#include "checkpoint.h"
#include "ckpt_fs.h"
#include "ckpt_run.h"

/* The CRC-32C of dir/metadata.mtck. Returns 0, or -1 with err (errno kept from the read). */
static int metadata_crc(const char *dir, uint32_t *crc, char *err, size_t errlen) {
    char path[PATH_MAX + 32];
    ckpt_file_path(path, sizeof path, dir, CKPT_METADATA_FILE);
    unsigned char *data = NULL;
    size_t len = 0;
    if (ckpt_read_file(path, CKPT_MAX_METADATA_BYTES, &data, &len, err, errlen) != 0) return -1;
    *crc = crc32c(0, data, len);
    free(data);
    return 0;
}

int ckpt_read_base_ref(const char *dir, CkptBaseRef *base, char *err, size_t errlen) {
    CkptReader *r = ckpt_reader_open_metadata(dir, err, errlen);
    if (!r) return -1;
    *base = r->meta.base;
    ckpt_reader_close(r);
    return 0;
}

int ckpt_base_ref_of(const char *dir, CkptBaseRef *base, char *err, size_t errlen) {
    memset(base, 0, sizeof *base);
    CkptBaseRef own;
    if (ckpt_read_base_ref(dir, &own, err, errlen) != 0) return -1;
    if (own.present) { /* it references a base itself: that one holds the weights */
        *base = own;
        return 0;
    }
    char *resolved = realpath(dir, NULL);
    if (!resolved) {
        mt_set_error(err, errlen, "%s: cannot resolve the path: %s", dir, strerror(errno));
        return -1;
    }
    const size_t n = strlen(resolved);
    int rc = 0;
    if (n > CKPT_BASE_DIR_MAX) {
        mt_set_error(err, errlen, "%s: its absolute path has %zu bytes, a checkpoint can reference at most %d (with "
                     "checkpoint.frozen_base: store the checkpoints store the base instead)", dir, n, CKPT_BASE_DIR_MAX);
        rc = -1;
    } else {
        memcpy(base->dir, resolved, n + 1);
        rc = metadata_crc(resolved, &base->metadata_crc32c, err, errlen);
    }
    free(resolved);
    base->present = rc == 0;
    return rc;
}

#define BASE_FIX "checkpoint.frozen_base: store writes checkpoints that hold their frozen base themselves"

CkptReader *ckpt_base_open(const char *ckpt, const CkptBaseRef *base, char *err, size_t errlen) {
    struct stat st;
    const int found = stat(base->dir, &st);
    if (found != 0 || !S_ISDIR(st.st_mode)) {
        mt_set_error(err, errlen,
                     "%s holds no frozen base weights: it references those of %s (saved with checkpoint.frozen_base: reference, or auto), "
                     "which is missing (%s); restore %s (the checkpoint the run started from with init_from) and try "
                     "again (" BASE_FIX ")",
                     ckpt, base->dir, found != 0 ? strerror(errno) : "not a directory", base->dir);
        return NULL;
    }
    uint32_t crc = 0;
    char why[2048];
    if (metadata_crc(base->dir, &crc, why, sizeof why) != 0) {
        mt_set_error(err, errlen,
                     "%s holds no frozen base weights: it references those of %s (saved with checkpoint.frozen_base: reference, or auto), "
                     "whose metadata is missing or unreadable (%s); restore %s (the checkpoint the run started from "
                     "with init_from) and try again (" BASE_FIX ")",
                     ckpt, base->dir, why, base->dir);
        return NULL;
    }
    if (crc != base->metadata_crc32c) {
        mt_set_error(err, errlen,
                     "%s holds no frozen base weights: it references those of %s (saved with checkpoint.frozen_base: reference, or auto), "
                     "but that checkpoint has changed: its metadata.mtck has CRC-32C %08x, the reference recorded "
                     "%08x, so it is not the base the adapters were trained on; put the original checkpoint back at %s "
                     "and try again (" BASE_FIX ")",
                     ckpt, base->dir, crc, base->metadata_crc32c, base->dir);
        return NULL;
    }
    CkptReader *r = ckpt_reader_open(base->dir, why, sizeof why);
    if (!r) ckpt_base_unreadable(err, errlen, ckpt, base, why);
    return r;
}

void ckpt_base_unreadable(char *err, size_t errlen, const char *ckpt, const CkptBaseRef *base, const char *why) {
    mt_set_error(err, errlen,
                 "%s holds no frozen base weights: it references those of %s (saved with checkpoint.frozen_base: reference, or auto), "
                 "which cannot be read: %s; restore %s as it was and try again (" BASE_FIX ")",
                 ckpt, base->dir, why, base->dir);
}

int ckpt_check_base(const char *dir, char *err, size_t errlen) {
    CkptBaseRef base;
    if (ckpt_read_base_ref(dir, &base, err, errlen) != 0) return CKPT_ERR_UNREADABLE;
    if (!base.present) return 0;
    CkptReader *r = ckpt_base_open(dir, &base, err, errlen);
    if (!r) return CKPT_ERR_BASE;
    ckpt_reader_close(r);
    return 0;
}

bool ckpt_is_run_checkpoint(const char *dir) {
    char path[CKPT_BASE_DIR_MAX + 2];
    snprintf(path, sizeof path, "%s", dir);
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') path[--n] = '\0';
    char *slash = strrchr(path, '/');
    if (!slash || ckpt_parse_iter_name(slash + 1) < 0) return false;
    *slash = '\0';
    const char *parent = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    return strcmp(parent, "checkpoints") == 0;
}
