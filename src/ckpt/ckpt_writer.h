/* ckpt_writer.h: writing one checkpoint directory from host buffers (the
 * engine behind ckpt_write_dir and the sync and async savers).
 *
 * A writing rank passes its regions of global tensors (CkptSource); each
 * region is cut along its first dimension into chunks of at most
 * chunk_bytes, compressed in parallel, and appended as zstd frames to
 * shard_RRRRR.zst. One rank for now: it also writes model.yaml, recipe.yaml
 * and metadata.mtck; a multi-rank save will gather the chunk lists to rank 0
 * before that last step, with no change to the files. */
#ifndef MT_CKPT_CKPT_WRITER_H
#define MT_CKPT_CKPT_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../config/recipe.h"
#include "../model/model.h"
#include "../train/optimizer.h"
#include "../train/train_state.h"
#include "ckpt_format.h"

#define CKPT_DEFAULT_CHUNK_BYTES ((size_t)4 << 20)

/* A region of a global fp32 tensor held by this rank (row-major). */
typedef struct CkptSource {
    const char *name;
    int ndim;
    int64_t global_shape[CKPT_MAX_DIMS];
    int64_t start[CKPT_MAX_DIMS];
    int64_t shape[CKPT_MAX_DIMS];
    const float *data;
} CkptSource;

typedef struct CkptPayload {
    int num_sources;
    const CkptSource *sources;
    const ModelConfig *model_config;
    const Recipe *recipe;          /* nullable: no recipe.yaml */
    bool has_state;
    CkptState state;
    int64_t iteration;             /* recorded in INFO (the step, or 0) */
    int compression_level;         /* 1..22 */
    CkptFilter filter;
    int threads;                   /* compression threads, >= 1 */
    size_t chunk_bytes;            /* 0: CKPT_DEFAULT_CHUNK_BYTES */
} CkptPayload;

typedef struct CkptWriteStats {
    uint64_t raw_bytes;            /* tensor bytes */
    uint64_t stored_bytes;         /* bytes of every file written */
    double seconds;
} CkptWriteStats;

/* The sources of a model's parameters and, when m/v are not NULL, the
 * optimizer moments "optimizer.m.<name>" / "optimizer.v.<name>", reading
 * from `params`, `m`, `v` (each laid out like model->params). The array and
 * its names are one allocation: free() it. */
CkptSource *ckpt_sources_from_model(const Model *model, const float *params, const float *m, const float *v,
                                    int *num_sources);

/* The CkptState of a run at `state` (the schedule position follows from recipe). */
CkptState ckpt_state_of(const TrainState *state, long optimizer_step, const Recipe *recipe);

/* Write the checkpoint directory `dir` (which must not exist) under the
 * temporary name "<dir>.tmp.<pid>", fsync everything, rename it into place
 * and fsync the parent. On failure nothing is left at `dir` or the
 * temporary name; returns -1 with err set. stats may be NULL. */
int ckpt_write_payload(const char *dir, const CkptPayload *payload, CkptWriteStats *stats, char *err, size_t errlen);

#endif
