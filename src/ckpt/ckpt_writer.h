/* ckpt_writer.h: writing one checkpoint directory from host buffers (the
 * engine behind ckpt_write_dir and the sync and async savers).
 *
 * A writing rank passes its regions of global tensors (CkptSource); each
 * region is cut along its first dimension into chunks of at most
 * chunk_bytes, compressed in parallel, and appended as zstd frames to
 * shard_RRRRR.zst. A single-rank save also writes model.yaml, recipe.yaml
 * and metadata.mtck (ckpt_write_payload); a save over ranks (ckpt_dist.h)
 * has each rank write its shard file and rank 0 the metadata of them all. */
#ifndef MT_CKPT_CKPT_WRITER_H
#define MT_CKPT_CKPT_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../config/recipe.h"
#include "../model/model.h"
#include "checkpoint.h"
#include "ckpt_format.h"

#define CKPT_DEFAULT_CHUNK_BYTES ((size_t)4 << 20)

struct CkptSource;
/* Produces elements [first, first + count) of a source's region (row-major,
 * of its dtype) into out: for a source not held in memory (convert streams
 * the Hugging Face tensors through it). Called from several threads at once,
 * for disjoint ranges. Returns 0, or -1 with err set. */
typedef int (*CkptFillFn)(const struct CkptSource *source, int64_t first, int64_t count, void *out, char *err,
                          size_t errlen);

/* A region of a global tensor held by this rank (row-major), of dtype fp32
 * (float) or bf16 (uint16_t bits): in memory at `data`, or, when data is
 * NULL, made chunk by chunk by `fill` (with `fill_ctx`). fp32 chunks are
 * written with the payload's filter, bf16 chunks without one. */
typedef struct CkptSource {
    const char *name;
    int ndim;
    int64_t global_shape[CKPT_MAX_DIMS];
    int64_t start[CKPT_MAX_DIMS];
    int64_t shape[CKPT_MAX_DIMS];
    const void *data;
    CkptDType dtype;               /* CKPT_DTYPE_FP32 (0) unless set */
    CkptFillFn fill;               /* when data is NULL */
    const void *fill_ctx;
} CkptSource;

typedef struct CkptPayload {
    int num_sources;
    const CkptSource *sources;
    const ModelConfig *model_config;
    const Recipe *recipe;          /* nullable: no recipe.yaml */
    const CkptHfFiles *hf_files;   /* nullable: files carried for the Hugging Face export (rank 0's) */
    const CkptBaseRef *base;       /* nullable: the frozen base the sources leave out (record BASE) */
    int num_datasets;              /* the data the run trained on (record DATA; 0: none recorded) */
    const CkptDataset *datasets;
    bool has_state;
    CkptState state;
    int64_t iteration;             /* recorded in INFO (the step, or 0) */
    int compression_level;         /* 1..22 */
    CkptFilter filter;
    int threads;                   /* compression threads, >= 1 */
    size_t chunk_bytes;            /* 0: CKPT_DEFAULT_CHUNK_BYTES */
    bool progress;                 /* a "checkpoint: saving ..." line on a terminal (not from a background thread) */
} CkptPayload;

typedef struct CkptWriteStats {
    uint64_t raw_bytes;            /* tensor bytes */
    uint64_t stored_bytes;         /* bytes of every file written */
    double seconds;
} CkptWriteStats;

/* The sources of a model's parameters and, when m/v are not NULL, the
 * optimizer moments "optimizer.m.<name>" / "optimizer.v.<name>" (fp32),
 * reading from `params`, `m`, `v` (each laid out like model->params): for a
 * rank of a parallel layout, its blocks of the global tensors that it owns
 * (ParamInfo.norm_owner: a replica another rank also holds is left out), and
 * the model's extra state from its own data. The array and
 * its names are one allocation: free() it. */
CkptSource *ckpt_sources_from_model(const Model *model, const float *params, const float *m, const float *v,
                                    int *num_sources);
/* The same with moments of `moments_dtype`, for the dense parameters only,
 * the routed experts only, or both (expert parallel: the experts' owners
 * are not the dense weights' owners), with or without the frozen ones
 * (LoRA's base: left out when the checkpoint references it, record BASE);
 * with the dense ones, the model's extra
 * state (model_extra_state: FP8 amax histories) that this rank owns, read
 * from `extra` (laid out like its data; NULL: not written). */
CkptSource *ckpt_sources_of_kinds(const Model *model, const float *params, const float *extra, const void *m,
                                  const void *v, CkptDType moments_dtype, bool dense, bool experts, bool frozen,
                                  int *num_sources);

/* The sources of a rank of the distributed optimizer: its blocks of the
 * parameters of the kinds it writes (dense, experts; none: both false; frozen and `extra` as above) and the moments of the flat ranges
 * [begin[i], end[i]) it owns (m_shard, v_shard: those ranges packed, in
 * order, of moments_dtype), each range cut into rectangles of the global tensors (a partial
 * row, whole rows, a partial row). One allocation: free() it. */
CkptSource *ckpt_sources_sharded(const Model *model, const float *params, const float *extra, bool dense, bool experts,
                                 bool frozen, const void *m_shard, const void *v_shard, CkptDType moments_dtype,
                                 const size_t *begin, const size_t *end, int num_ranges, int *num_sources);

/* One shard file written by one rank: its chunks and, per source, the
 * tensor they belong to (tensors[i].chunks points into chunks). */
typedef struct CkptShard {
    char name[64];
    CkptFileMeta file;             /* name points into `name` */
    CkptChunk *chunks;
    CkptTensorMeta *tensors;       /* one per source (names point into the payload's sources) */
    int num_tensors;
    uint64_t raw_bytes;
} CkptShard;

/* Write the payload's sources into <tmp>/<name> as one shard file (listed
 * as file `file_index` of the metadata), fsynced. Returns 0, or -1 with err
 * set (out is then empty). */
int ckpt_write_shard_file(const char *tmp, const char *name, uint32_t file_index, const CkptPayload *p,
                          CkptShard *out, char *err, size_t errlen);
void ckpt_shard_free(CkptShard *shard);

/* Write model.yaml, recipe.yaml (when p->recipe), the hf files and metadata.mtck listing
 * `shards` first and `tensors` (from p: the model config, recipe, state and
 * iteration) into tmp, then fsync tmp. stats->stored_bytes is set when stats. */
int ckpt_write_metadata(const char *tmp, const CkptPayload *p, const CkptFileMeta *shards, int num_shards,
                        const CkptTensorMeta *tensors, int num_tensors, uint32_t num_ranks, CkptWriteStats *stats,
                        char *err, size_t errlen);

/* The temporary directory of a save of `dir` ("<dir>.tmp.<pid>", created;
 * dir must not exist). Returns 0, or -1 with err set. */
int ckpt_make_temp_dir(const char *dir, char *tmp, size_t tmplen, char *err, size_t errlen);
/* Rename the complete tmp to dir (never replacing) and fsync the parent;
 * on failure nothing is left at either name. */
int ckpt_commit_dir(const char *tmp, const char *dir, char *err, size_t errlen);

/* Write the checkpoint directory `dir` (which must not exist) under the
 * temporary name "<dir>.tmp.<pid>", fsync everything, rename it into place
 * and fsync the parent. On failure nothing is left at `dir` or the
 * temporary name; returns -1 with err set. stats may be NULL. */
int ckpt_write_payload(const char *dir, const CkptPayload *payload, CkptWriteStats *stats, char *err, size_t errlen);
/* The same under the temporary name "<dir>.tmp.<host>.<pid>" (mt_temp_name_host), which a later process can tell
 * a killed writer's by (convert: mt_remove_stale_temps_with). */
int ckpt_write_payload_host_temp(const char *dir, const CkptPayload *payload, CkptWriteStats *stats, char *err,
                                 size_t errlen);

#endif
