/* ckpt_dist.h: a checkpoint written by many ranks. Each writing rank writes
 * its own shard file (shard_RRRRR.zst, RRRRR its world rank) holding its
 * blocks of the global tensors; rank 0 gathers every rank's chunk list and
 * writes the one metadata file, then commits the directory as a single-rank
 * save does (temporary name, fsync, rename, latest pointer, retention). The
 * files are those of any checkpoint: any layout reads them.
 *
 * The three steps: begin (collective), write (writers only, not collective:
 * it may run on the background writer thread), finish (collective). A
 * failure on any rank makes finish fail on every rank and removes the
 * temporary directory: the previous checkpoints stay as they were. */
#ifndef MT_CKPT_CKPT_DIST_H
#define MT_CKPT_CKPT_DIST_H

#include <stdbool.h>
#include <stddef.h>

#include "../config/recipe.h"
#include "../dist/comm.h"
#include "ckpt_writer.h"

typedef struct CkptDistSave {
    const Comm *world;
    bool writer;                    /* this rank writes a shard */
    long step;
    char dir[MT_PATH_MAX + 32];     /* checkpoints_dir/iter_NNNNNNN */
    char tmp[MT_PATH_MAX + 64];     /* its temporary name (rank 0's pid) */
    CkptShard shard;                /* this rank's, after write */
    int status;                     /* 0, or -1 after a failed write (err) */
    char err[1024];
    double start;                   /* when begin ran (for the seconds of the stats) */
} CkptDistSave;

/* Collective over world: rank 0 makes checkpoints_dir, removes leftovers and
 * creates the temporary directory of iter_<step>; every rank learns its
 * name. Returns 0, or -1 on every rank with err set. */
int ckpt_dist_begin(CkptDistSave *save, const Comm *world, const char *checkpoints_dir, long step, bool writer,
                    char *err, size_t errlen);

/* This rank's shard file from the payload's sources (each a block of a
 * global tensor; every element of every tensor written by exactly one rank).
 * Records a failure in save->status / save->err. */
void ckpt_dist_write(CkptDistSave *save, const CkptPayload *payload);

/* Collective: rank 0 gathers the chunk lists, writes the metadata from
 * payload (model config, recipe, state: rank 0's), commits the directory,
 * points the latest file at it (retention is the caller's). Returns 0, or -1
 * on every rank with err set (nothing left of this save). stats (rank 0) may
 * be NULL. */
int ckpt_dist_finish(CkptDistSave *save, const CkptPayload *payload,
                     const char *checkpoints_dir, CkptWriteStats *stats, char *err, size_t errlen);

#endif
