/* ckpt_latest_dir.h: the checkpoint directory that a user's path names for
 * reading weights (convert, init_from): the checkpoint itself, or the newest
 * checkpoint of a run directory or checkpoints/ directory (see
 * src/ckpt/ckpt_locate.h for what is recognised). */
#ifndef MT_CONVERT_CKPT_LATEST_DIR_H
#define MT_CONVERT_CKPT_LATEST_DIR_H

#include <stddef.h>

/* Writes the checkpoint directory for `path` into out. Returns 0, or -1 with err set. */
int ckpt_latest_dir(const char *path, char *out, size_t outlen, char *err, size_t errlen);

#endif
