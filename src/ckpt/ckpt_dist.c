/* ckpt_dist.c: checkpoints written by many ranks (ckpt_dist.h). The chunk
 * lists travel to rank 0 as fixed-size records; rank 0 orders the tensors
 * (parameters, then optimizer.m., then optimizer.v., each in the order the
 * ranks first name them) and the chunks of each by position, and the
 * metadata encoder checks that the chunks tile every tensor exactly before
 * anything is committed. */
#include "ckpt_dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/error.h"
#include "../core/fs.h"
#include "../core/timer.h"
#include "ckpt_fs.h"
#include "ckpt_run.h"

#define TAG_HEADER 7101
#define TAG_RECORDS 7102

/* One chunk of one tensor, as a rank sends it to rank 0. */
typedef struct ChunkRecord {
    char name[CKPT_NAME_MAX];
    int32_t ndim;
    int32_t dtype;      /* CkptDType of the tensor */
    int64_t global_shape[CKPT_MAX_DIMS];
    CkptChunk chunk;
    int64_t order;      /* rank 0: the first position of this tensor's name */
} ChunkRecord;

/* What each rank tells rank 0 before its records. */
typedef struct ShardHeader {
    int64_t status;     /* 0, or -1: the write failed */
    int64_t num_records;
    uint64_t size;
    uint32_t crc;
    char err[1024];
} ShardHeader;

/* The status agreed by every rank: -1 when any rank's is. */
static int agree(const Comm *world, int status) {
    if (world->size <= 1) return status;
    int32_t mine = status != 0, *all = mt_malloc((size_t)world->size * sizeof(int32_t));
    comm_all_gather(world, &mine, all, 1, COMM_INT32);
    int failed = 0;
    for (int r = 0; r < world->size; r++) failed |= all[r];
    free(all);
    return failed ? -1 : 0;
}

int ckpt_dist_begin(CkptDistSave *save, const Comm *world, const char *checkpoints_dir, long step, bool writer,
                    char *err, size_t errlen) {
    memset(save, 0, sizeof *save);
    save->world = world;
    save->writer = writer;
    save->step = step;
    save->start = mt_now();
    int status = 0;
    if (ckpt_iter_path(save->dir, sizeof save->dir, checkpoints_dir, step) != 0) {
        mt_set_error(err, errlen, "%s: path too long", checkpoints_dir);
        status = -1;
    }
    if (status == 0 && world->rank == 0) {
        if (mt_make_dirs(checkpoints_dir, err, errlen) != 0) status = -1;
        if (status == 0) {
            ckpt_remove_leftovers(checkpoints_dir);
            status = ckpt_make_temp_dir(save->dir, save->tmp, sizeof save->tmp, err, errlen);
        }
    }
    if (agree(world, status) != 0) {
        if (status == 0) mt_set_error(err, errlen, "checkpoint at step %ld: rank 0 could not prepare %s", step, save->dir);
        return -1;
    }
    comm_broadcast(world, save->tmp, sizeof save->tmp, COMM_BYTE, 0);
    return 0;
}

void ckpt_dist_write(CkptDistSave *save, const CkptPayload *payload) {
    if (!save->writer || payload->num_sources == 0) return; /* nothing of its own to write */
    char name[64];
    snprintf(name, sizeof name, "shard_%05d.zst", save->world->rank);
    save->status = ckpt_write_shard_file(save->tmp, name, 0, payload, &save->shard, save->err, sizeof save->err);
}

/* This rank's records (one per chunk), malloc'ed. */
static ChunkRecord *records_of(const CkptShard *shard, int64_t *count) {
    int64_t n = 0;
    for (int t = 0; t < shard->num_tensors; t++) n += shard->tensors[t].num_chunks;
    ChunkRecord *out = mt_calloc((size_t)(n ? n : 1), sizeof *out);
    int64_t k = 0;
    for (int t = 0; t < shard->num_tensors; t++) {
        const CkptTensorMeta *tm = &shard->tensors[t];
        for (int c = 0; c < tm->num_chunks; c++, k++) {
            snprintf(out[k].name, sizeof out[k].name, "%s", tm->name);
            out[k].ndim = tm->ndim;
            out[k].dtype = (int32_t)tm->dtype;
            memcpy(out[k].global_shape, tm->shape, sizeof out[k].global_shape);
            out[k].chunk = tm->chunks[c];
        }
    }
    *count = n;
    return out;
}

static int prefix_class(const char *name) {
    if (strncmp(name, "optimizer.m.", 12) == 0) return 1;
    if (strncmp(name, "optimizer.v.", 12) == 0) return 2;
    return 0;
}

static int by_name_then_position(const void *a, const void *b) {
    const ChunkRecord *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    if (c) return c;
    return (x->order > y->order) - (x->order < y->order);
}

static int by_tensor_then_start(const void *a, const void *b) {
    const ChunkRecord *x = a, *y = b;
    int cx = prefix_class(x->name), cy = prefix_class(y->name);
    if (cx != cy) return cx - cy;
    if (x->order != y->order) return (x->order > y->order) - (x->order < y->order);
    for (int d = 0; d < CKPT_MAX_DIMS; d++)
        if (x->chunk.start[d] != y->chunk.start[d]) return (x->chunk.start[d] > y->chunk.start[d]) - (x->chunk.start[d] < y->chunk.start[d]);
    return 0;
}

/* Rank 0: order the records into tensors (records sorted in place). */
static CkptTensorMeta *tensors_of(ChunkRecord *records, int64_t n, CkptChunk **chunks_out, int *num_tensors) {
    for (int64_t i = 0; i < n; i++) records[i].order = i; /* arrival position */
    qsort(records, (size_t)n, sizeof *records, by_name_then_position);
    for (int64_t i = 1; i < n; i++) /* every record of a name takes the name's first position */
        if (strcmp(records[i].name, records[i - 1].name) == 0) records[i].order = records[i - 1].order;
    qsort(records, (size_t)n, sizeof *records, by_tensor_then_start);
    CkptChunk *chunks = mt_calloc((size_t)(n ? n : 1), sizeof *chunks);
    CkptTensorMeta *tensors = mt_calloc((size_t)(n ? n : 1), sizeof *tensors);
    int t = -1;
    for (int64_t i = 0; i < n; i++) {
        chunks[i] = records[i].chunk;
        if (t < 0 || strcmp(records[i].name, records[i - 1].name) != 0) {
            t++;
            tensors[t] = (CkptTensorMeta){.name = records[i].name, .dtype = (CkptDType)records[i].dtype,
                                          .ndim = records[i].ndim, .chunks = &chunks[i]};
            memcpy(tensors[t].shape, records[i].global_shape, sizeof tensors[t].shape);
        }
        tensors[t].num_chunks++;
    }
    *chunks_out = chunks;
    *num_tensors = t + 1;
    return tensors;
}

/* Rank 0: receive every rank's header and records, write the metadata and commit. */
static int gather_and_commit(CkptDistSave *save, const CkptPayload *payload,
                             const char *checkpoints_dir, CkptWriteStats *stats, char *err, size_t errlen) {
    const Comm *world = save->world;
    ChunkRecord *all = NULL;
    int64_t total = 0;
    CkptFileMeta *files = mt_calloc((size_t)world->size, sizeof *files);
    char (*names)[64] = mt_calloc((size_t)world->size, sizeof *names);
    int num_files = 0, status = 0;
    uint64_t raw = 0;
    for (int r = 0; r < world->size; r++) {
        ShardHeader h = {0};
        ChunkRecord *mine = NULL;
        if (r == 0) {
            h.status = save->status;
            snprintf(h.err, sizeof h.err, "%s", save->err);
            if (save->writer && save->status == 0) {
                mine = records_of(&save->shard, &h.num_records);
                h.size = save->shard.file.size;
                h.crc = save->shard.file.crc32c;
            }
        } else {
            comm_recv(world, &h, sizeof h, COMM_BYTE, r, TAG_HEADER);
            if (h.num_records > 0) {
                mine = mt_calloc((size_t)h.num_records, sizeof *mine);
                comm_recv(world, mine, (size_t)h.num_records * sizeof *mine, COMM_BYTE, r, TAG_RECORDS);
            }
        }
        if (h.status != 0 && status == 0) {
            mt_set_error(err, errlen, "rank %d: %s", r, h.err);
            status = -1;
        }
        if (h.num_records > 0) {
            snprintf(names[num_files], sizeof names[num_files], "shard_%05d.zst", r);
            files[num_files] = (CkptFileMeta){names[num_files], CKPT_FILE_SHARD, h.size, h.crc};
            for (int64_t i = 0; i < h.num_records; i++) mine[i].chunk.file = (uint32_t)num_files;
            all = mt_realloc(all, (size_t)(total + h.num_records) * sizeof *all);
            memcpy(all + total, mine, (size_t)h.num_records * sizeof *mine);
            total += h.num_records;
            num_files++;
        }
        free(mine);
    }
    if (status == 0) {
        for (int64_t i = 0; i < total; i++) raw += all[i].chunk.raw_bytes;
        int num_tensors = 0;
        CkptChunk *chunks = NULL;
        CkptTensorMeta *tensors = tensors_of(all, total, &chunks, &num_tensors);
        status = ckpt_write_metadata(save->tmp, payload, files, num_files, tensors, num_tensors,
                                     (uint32_t)num_files, stats, err, errlen);
        free(tensors);
        free(chunks);
    }
    char ignored[256];
    if (status != 0) ckpt_remove_tree(save->tmp, ignored, sizeof ignored);
    if (status == 0) status = ckpt_commit_dir(save->tmp, save->dir, err, errlen);
    if (status == 0) status = ckpt_write_latest(checkpoints_dir, save->step, err, errlen);
    if (status == 0) {
        if (stats) {
            stats->raw_bytes = raw;
            stats->seconds = mt_now() - save->start;
        }
    }
    free(all);
    free(files);
    free(names);
    return status;
}

int ckpt_dist_finish(CkptDistSave *save, const CkptPayload *payload,
                     const char *checkpoints_dir, CkptWriteStats *stats, char *err, size_t errlen) {
    const Comm *world = save->world;
    int status = 0;
    if (world->rank == 0) {
        status = gather_and_commit(save, payload, checkpoints_dir, stats, err, errlen);
    } else {
        ShardHeader h = {.status = save->status};
        snprintf(h.err, sizeof h.err, "%s", save->err);
        ChunkRecord *mine = NULL;
        if (save->writer && save->status == 0) {
            mine = records_of(&save->shard, &h.num_records);
            h.size = save->shard.file.size;
            h.crc = save->shard.file.crc32c;
        }
        comm_send(world, &h, sizeof h, COMM_BYTE, 0, TAG_HEADER);
        if (h.num_records > 0)
            comm_send(world, mine, (size_t)h.num_records * sizeof *mine, COMM_BYTE, 0, TAG_RECORDS);
        free(mine);
    }
    ckpt_shard_free(&save->shard);
    int32_t agreed = status;
    comm_broadcast(world, &agreed, 1, COMM_INT32, 0);
    if (agreed != 0 && world->rank != 0)
        mt_set_error(err, errlen, "checkpoint at step %ld failed on another rank (rank 0 says why)", save->step);
    return agreed != 0 ? -1 : 0;
}
