/* ckpt_fs.h: the file-system steps of a crash-safe save: a file written
 * whole, removal of a directory tree, and whole-file reads (complete writes,
 * fsync of directories and a rename that never replaces are in
 * src/core/fs.h). */
#ifndef MT_CKPT_CKPT_FS_H
#define MT_CKPT_CKPT_FS_H

#include <stddef.h>
#include <stdint.h>

#include "../core/fs.h"

/* Create `path` (which must not exist) with `data`, fsync and close it.
 * Returns 0, or -1 with err naming the file. */
int ckpt_write_file(const char *path, const void *data, size_t n, char *err, size_t errlen);

/* rm -r `path` (no error when it does not exist). Returns 0 or -1 with err. */
int ckpt_remove_tree(const char *path, char *err, size_t errlen);

/* Read a whole file (at most max_bytes) into a malloc'ed buffer.
 * Returns 0, or -1 with err naming the file. */
int ckpt_read_file(const char *path, size_t max_bytes, unsigned char **data, size_t *len, char *err, size_t errlen);

/* Sleep MEGATRAIN_TEST_SLOW_SAVE_MS milliseconds when that variable is set:
 * tests make saves slow so that a kill lands in the middle of one. */
void ckpt_test_slow_point(void);

#endif
