/* ckpt_writer.c: one checkpoint directory from host buffers, crash-safe:
 *   1. mkdir <dir>.tmp.<pid>
 *   2. shard_00000.zst: chunks compressed in parallel groups, appended in order
 *   3. model.yaml, recipe.yaml, the files carried for Hugging Face (tokenizer, ...)
 *   4. metadata.mtck (lists the files with sizes and CRCs, then the tensors)
 *   5. fsync of every file and of the temporary directory
 *   6. rename to <dir> (never replacing), fsync of the parent
 * A crash before 6 leaves only the temporary directory, which readers ignore
 * and the next save removes. */
#include "ckpt_writer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zstd.h>

#include "../core/error.h"
#include "../core/fs.h"
#include "../core/progress.h"
#include "../core/timer.h"
#include "../version.h"
#include "ckpt_codec.h"
#include "ckpt_fs.h"
#include "ckpt_hf_files.h"
#include "ckpt_model_config.h"
#include "../core/crc32c.h"

#define SHARD_NAME "shard_00000.zst"

/* Whether this rank writes parameter `info` (owned, of a kind it writes, and not a frozen one left out). */
static bool writes(const ParamInfo *info, bool dense, bool experts, bool frozen) {
    return info->norm_owner && (info->expert ? experts : dense) && (frozen || !info->frozen);
}

CkptSource *ckpt_sources_from_model(const Model *model, const float *params, const float *m, const float *v,
                                    int *num_sources) {
    return ckpt_sources_of_kinds(model, params, model_extra_state(model).data, m, v, CKPT_DTYPE_FP32, true, true, true,
                                 num_sources);
}

/* Where parameter `info`'s moments start in the optimizer's arrays (laid out like the gradients: the
 * trainable region, model.h). */
static size_t moments_offset(const Model *model, const ParamInfo *info) {
    return info->offset - (size_t)model->trainable_offset;
}

/* The source of a whole-on-every-rank tensor `info` (extra state) read from data at its offset. */
static CkptSource whole_source(const ParamInfo *info, const float *data) {
    CkptSource s = {.name = info->name, .ndim = info->ndim, .data = data + info->offset, .dtype = CKPT_DTYPE_FP32};
    for (int d = 0; d < info->ndim; d++) s.global_shape[d] = s.shape[d] = info->shape[d];
    return s;
}

CkptSource *ckpt_sources_of_kinds(const Model *model, const float *params, const float *extra, const void *m,
                                  const void *v, CkptDType moments_dtype, bool dense, bool experts, bool frozen,
                                  int *num_sources) {
    const int copies = (m && v) ? 3 : 1;
    int owned = 0, trained = 0; /* frozen parameters (LoRA's base) have no moments */
    for (int i = 0; i < model->num_params; i++) {
        owned += writes(&model->param_info[i], dense, experts, frozen);
        trained += writes(&model->param_info[i], dense, experts, frozen) && !model->param_info[i].frozen;
    }
    const ModelExtraState state = model_extra_state(model);
    int extras = 0; /* written with the dense parameters, by tp rank 0 */
    for (int i = 0; extra && dense && i < state.count; i++) extras += state.info[i].norm_owner;
    const int n = owned + (copies - 1) * trained + extras;
    const size_t name_bytes = 128;
    char *block = mt_calloc(1, (size_t)n * (sizeof(CkptSource) + name_bytes));
    CkptSource *sources = (CkptSource *)block;
    char *names = block + (size_t)n * sizeof(CkptSource);
    static const char *const prefixes[] = {"", "optimizer.m.", "optimizer.v."};
    const void *bases[] = {params, m, v};
    const CkptDType dtypes[] = {CKPT_DTYPE_FP32, moments_dtype, moments_dtype};
    int k = 0;
    for (int c = 0; c < copies; c++)
        for (int i = 0; i < model->num_params; i++) {
            const ParamInfo *info = &model->param_info[i];
            if (!writes(info, dense, experts, frozen)) continue; /* a copy another rank writes, or left out */
            if (c > 0 && info->frozen) continue;          /* no moments */
            CkptSource *s = &sources[k];
            char *name = names + (size_t)k * name_bytes;
            snprintf(name, name_bytes, "%s%s", prefixes[c], info->name);
            s->name = name;
            s->ndim = info->ndim;
            for (int d = 0; d < info->ndim; d++) {
                s->global_shape[d] = info->global_shape[d];
                s->start[d] = info->global_start[d];
                s->shape[d] = info->shape[d];
            }
            s->data = (const char *)bases[c] + (c ? moments_offset(model, info) : info->offset) * ckpt_dtype_size(dtypes[c]);
            s->dtype = dtypes[c];
            k++;
        }
    for (int i = 0; extra && dense && i < state.count; i++)
        if (state.info[i].norm_owner) sources[k++] = whole_source(&state.info[i], extra); /* names are the model's */
    *num_sources = n;
    return sources;
}

/* Append the boxes of local elements [a, b) of parameter `info` (laid out
 * row-major in its block), reading from data (of dtype), named prefix + name. The
 * block is seen as 3-D (d0, d1, d2) with leading 1s: a run of the flat
 * range is a part of a row, whole rows of a plane, or whole planes. With
 * out == NULL only counts. Returns how many. */
static int range_rectangles(const ParamInfo *info, const char *prefix, long a, long b, const char *data,
                            CkptDType dtype, CkptSource *out, char *names, size_t name_bytes) {
    const int lead = 3 - info->ndim; /* leading dims of size 1 in the 3-D view */
    long d[3], gs[3], gshape[3];
    for (int i = 0; i < 3; i++) {
        const int k = i - lead;
        d[i] = k >= 0 ? info->shape[k] : 1;
        gs[i] = k >= 0 ? info->global_start[k] : 0;
        gshape[i] = k >= 0 ? info->global_shape[k] : 1;
    }
    int n = 0;
    while (a < b) {
        const long i0 = a / (d[1] * d[2]), rem = a % (d[1] * d[2]), i1 = rem / d[2], i2 = rem % d[2];
        long box[3];
        if (i2 != 0 || b - a < d[2]) { /* a part of one row */
            box[0] = box[1] = 1;
            box[2] = d[2] - i2 < b - a ? d[2] - i2 : b - a;
        } else if (i1 != 0 || b - a < d[1] * d[2]) { /* whole rows of one plane */
            box[0] = 1;
            box[1] = d[1] - i1 < (b - a) / d[2] ? d[1] - i1 : (b - a) / d[2];
            box[2] = d[2];
        } else { /* whole planes */
            box[0] = (b - a) / (d[1] * d[2]);
            box[1] = d[1];
            box[2] = d[2];
        }
        if (out) {
            CkptSource *s = &out[n];
            char *name = names + (size_t)n * name_bytes;
            snprintf(name, name_bytes, "%s%s", prefix, info->name);
            s->name = name;
            s->ndim = info->ndim;
            const long at[3] = {i0, i1, i2};
            for (int k = 0; k < info->ndim; k++) {
                s->global_shape[k] = gshape[k + lead];
                s->start[k] = gs[k + lead] + at[k + lead];
                s->shape[k] = box[k + lead];
            }
            s->data = data;
            s->dtype = dtype;
        }
        const long len = box[0] * box[1] * box[2];
        data += (size_t)len * ckpt_dtype_size(dtype);
        a += len;
        n++;
    }
    return n;
}

static int shard_rectangles(const Model *model, const char *prefix, const void *shard, CkptDType dtype,
                            const size_t *begin, const size_t *end, int num_ranges, CkptSource *out, char *names,
                            size_t name_bytes) {
    int n = 0;
    const char *data = shard;
    for (int r = 0; r < num_ranges; r++)
        for (int i = 0; i < model->num_params; i++) { /* the ranges are over the moments (the trainable region) */
            const ParamInfo *info = &model->param_info[i];
            if (info->frozen) continue;
            const size_t p0 = moments_offset(model, info), p1 = p0 + (size_t)info->numel;
            const size_t a = begin[r] > p0 ? begin[r] : p0, b = end[r] < p1 ? end[r] : p1;
            if (a >= b) continue;
            if (info->norm_owner)
                n += range_rectangles(info, prefix, (long)(a - p0), (long)(b - p0), data, dtype, out ? out + n : NULL,
                                      names ? names + (size_t)n * name_bytes : NULL, name_bytes);
            data += (b - a) * ckpt_dtype_size(dtype);
        }
    return n;
}

CkptSource *ckpt_sources_sharded(const Model *model, const float *params, const float *extra, bool dense, bool experts,
                                 bool frozen, const void *m_shard, const void *v_shard, CkptDType moments_dtype,
                                 const size_t *begin, const size_t *end, int num_ranges, int *num_sources) {
    int owned = 0;
    CkptSource *own = ckpt_sources_of_kinds(model, params, extra, NULL, NULL, CKPT_DTYPE_FP32, dense, experts, frozen,
                                            &owned);
    const int moments = shard_rectangles(model, "", NULL, moments_dtype, begin, end, num_ranges, NULL, NULL, 0);
    const int n = owned + 2 * moments;
    const size_t name_bytes = 128;
    char *block = mt_calloc(1, (size_t)(n ? n : 1) * (sizeof(CkptSource) + name_bytes));
    CkptSource *sources = (CkptSource *)block;
    char *names = block + (size_t)(n ? n : 1) * sizeof(CkptSource);
    int k = 0;
    for (int i = 0; i < owned; i++, k++) {
        sources[k] = own[i];
        snprintf(names + (size_t)k * name_bytes, name_bytes, "%s", own[i].name);
        sources[k].name = names + (size_t)k * name_bytes;
    }
    free(own);
    k += shard_rectangles(model, "optimizer.m.", m_shard, moments_dtype, begin, end, num_ranges, sources + k,
                          names + (size_t)k * name_bytes, name_bytes);
    k += shard_rectangles(model, "optimizer.v.", v_shard, moments_dtype, begin, end, num_ranges, sources + k,
                          names + (size_t)k * name_bytes, name_bytes);
    *num_sources = k;
    return sources;
}

/* One chunk to write: rows [row0, row0 + rows) of source `source` along
 * dim 0 and, when sub_rows > 0 (a 3-D source whose planes exceed a chunk),
 * of that one plane only [sub0, sub0 + sub_rows) along dim 1. */
typedef struct ChunkJob {
    int source;
    int64_t row0, rows;
    int64_t sub0, sub_rows;
    int64_t first;      /* its first element in the source's region */
    const void *raw;    /* in the source's data, or NULL: made by its fill */
    size_t raw_bytes;
    CkptFilter filter;  /* the payload's for fp32, none for bf16 */
} ChunkJob;

/* Compression buffers for one chunk in flight. */
typedef struct Slot {
    ZSTD_CCtx *cctx;
    unsigned char *input, *scratch, *dst; /* input: a filled chunk's raw bytes */
    size_t stored;
    uint32_t crc;
    int failed;
    char err[256];
} Slot;

static int64_t row_numel(const CkptSource *s) {
    int64_t n = 1;
    for (int d = 1; d < s->ndim; d++) n *= s->shape[d];
    return n;
}

/* Cut every source along dimension 0 into chunks of at most chunk_bytes
 * (at least one row each). Returns the jobs (malloc'ed). */
static ChunkJob *plan_chunks(const CkptPayload *p, size_t chunk_bytes, int *num_jobs) {
    int cap = 64, n = 0;
    ChunkJob *jobs = mt_malloc((size_t)cap * sizeof *jobs);
    for (int i = 0; i < p->num_sources; i++) {
        const CkptSource *s = &p->sources[i];
        const size_t elem = ckpt_dtype_size(s->dtype);
        const CkptFilter filter = s->dtype == CKPT_DTYPE_FP32 ? p->filter : CKPT_FILTER_NONE;
        const char *data = s->data;
        const size_t row_bytes = (size_t)row_numel(s) * elem;
        if (s->ndim == 3 && row_bytes > chunk_bytes) { /* a plane is too big: cut it along dim 1 */
            const size_t line_bytes = (size_t)s->shape[2] * elem;
            int64_t lines = line_bytes > 0 ? (int64_t)(chunk_bytes / line_bytes) : 1;
            if (lines < 1) lines = 1;
            for (int64_t row0 = 0; row0 < s->shape[0]; row0++)
                for (int64_t sub0 = 0; sub0 < s->shape[1]; sub0 += lines) {
                    if (n == cap) jobs = mt_realloc(jobs, (size_t)(cap *= 2) * sizeof *jobs);
                    const int64_t k = s->shape[1] - sub0 < lines ? s->shape[1] - sub0 : lines;
                    const int64_t first = (row0 * s->shape[1] + sub0) * s->shape[2];
                    jobs[n++] = (ChunkJob){i, row0, 1, sub0, k, first, data ? data + (size_t)first * elem : NULL,
                                           (size_t)k * line_bytes, filter};
                }
            continue;
        }
        int64_t rows_per_chunk = row_bytes > 0 ? (int64_t)(chunk_bytes / row_bytes) : 1;
        if (rows_per_chunk < 1) rows_per_chunk = 1;
        for (int64_t row0 = 0; row0 < s->shape[0]; row0 += rows_per_chunk) {
            if (n == cap) jobs = mt_realloc(jobs, (size_t)(cap *= 2) * sizeof *jobs);
            int64_t rows = s->shape[0] - row0 < rows_per_chunk ? s->shape[0] - row0 : rows_per_chunk;
            jobs[n++] = (ChunkJob){i, row0, rows, 0, 0, row0 * row_numel(s), data ? data + (size_t)row0 * row_bytes : NULL,
                                   (size_t)rows * row_bytes, filter};
        }
    }
    *num_jobs = n;
    return jobs;
}

/* Write the shard: compress `group` chunks at a time in parallel, append
 * them in order, and fill chunks[j] (the metadata of job j). */
static int write_shard(const char *path, const CkptPayload *p, const ChunkJob *jobs, int num_jobs, size_t chunk_bytes,
                       CkptChunk *chunks, uint64_t *shard_size, uint32_t *shard_crc, char *err, size_t errlen) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        mt_set_error(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        return -1;
    }
    size_t max_raw = 0;
    bool fills = false;
    for (int j = 0; j < num_jobs; j++) {
        if (jobs[j].raw_bytes > max_raw) max_raw = jobs[j].raw_bytes;
        fills |= !jobs[j].raw && p->sources[jobs[j].source].fill;
    }
    (void)chunk_bytes;
    const int threads = p->threads > 0 ? p->threads : 1;
    const int group = threads * 2;
    Slot *slots = mt_calloc((size_t)group, sizeof *slots);
    for (int s = 0; s < group; s++) {
        slots[s].cctx = ZSTD_createCCtx();
        slots[s].input = fills ? mt_malloc(max_raw ? max_raw : 1) : NULL;
        slots[s].scratch = mt_malloc(max_raw ? max_raw : 1);
        slots[s].dst = mt_malloc(ckpt_chunk_bound(max_raw));
    }
    uint64_t offset = 0, raw_total = 0;
    uint32_t crc = 0;
    int rc = 0;
    for (int j = 0; j < num_jobs; j++) raw_total += jobs[j].raw_bytes;
    Progress progress;
    progress_start(&progress, p->progress, "checkpoint", "saving", "chunks", num_jobs, raw_total);
    for (int first = 0; first < num_jobs && rc == 0; first += group) {
        const int count = num_jobs - first < group ? num_jobs - first : group;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
        for (int s = 0; s < count; s++) {
            const ChunkJob *job = &jobs[first + s];
            const CkptSource *src = &p->sources[job->source];
            Slot *slot = &slots[s];
            const bool made = !job->raw && src->fill; /* else in memory (NULL only for an empty region) */
            const void *raw = made ? slot->input : job->raw;
            slot->failed = made && src->fill(src, job->first, (int64_t)(job->raw_bytes / ckpt_dtype_size(src->dtype)),
                                                  slot->input, slot->err, sizeof slot->err) != 0;
            if (!slot->failed)
                slot->failed = ckpt_chunk_encode(slot->cctx, p->compression_level, job->filter, raw, job->raw_bytes,
                                                 slot->scratch, slot->dst, &slot->stored, &slot->crc, slot->err,
                                                 sizeof slot->err) != 0;
        }
        for (int s = 0; s < count && rc == 0; s++) {
            const ChunkJob *job = &jobs[first + s];
            const CkptSource *src = &p->sources[job->source];
            if (slots[s].failed) {
                mt_set_error(err, errlen, "tensor '%s': %s", src->name, slots[s].err);
                rc = -1;
                break;
            }
            if (mt_write_all(fd, slots[s].dst, slots[s].stored) != 0) {
                mt_set_error(err, errlen, "%s: write failed: %s", path, strerror(errno));
                rc = -1;
                break;
            }
            CkptChunk *ch = &chunks[first + s];
            ch->file = 0;
            ch->offset = offset;
            ch->stored_bytes = slots[s].stored;
            ch->raw_bytes = job->raw_bytes;
            ch->crc32c = slots[s].crc;
            ch->filter = job->filter;
            for (int d = 0; d < src->ndim; d++) {
                ch->start[d] = src->start[d];
                ch->shape[d] = src->shape[d];
            }
            ch->start[0] += job->row0;
            ch->shape[0] = job->rows;
            if (job->sub_rows > 0) {
                ch->start[1] += job->sub0;
                ch->shape[1] = job->sub_rows;
            }
            crc = crc32c(crc, slots[s].dst, slots[s].stored);
            offset += slots[s].stored;
            ckpt_test_slow_point();
        }
        progress_update(&progress, first + count);
    }
    progress_end(&progress);
    for (int s = 0; s < group; s++) {
        ZSTD_freeCCtx(slots[s].cctx);
        free(slots[s].input);
        free(slots[s].scratch);
        free(slots[s].dst);
    }
    free(slots);
    if (rc == 0 && mt_sync_close(fd) != 0) {
        mt_set_error(err, errlen, "%s: fsync failed: %s", path, strerror(errno));
        return -1;
    }
    if (rc != 0) close(fd);
    *shard_size = offset;
    *shard_crc = crc;
    return rc;
}

/* Write a small file into the temporary directory and describe it in *f. */
static int write_listed_file(const char *tmp, const char *name, CkptFileRole role, const void *data, size_t n,
                             CkptFileMeta *f, char *err, size_t errlen) {
    char path[MT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    if (ckpt_write_file(path, data, n, err, errlen) != 0) return -1;
    f->name = (char *)name;
    f->role = role;
    f->size = n;
    f->crc32c = crc32c(0, data, n);
    return 0;
}

/* The resolved recipe as text: recipe_write to a scratch file, read back. */
static int recipe_text(const Recipe *recipe, const char *tmp, unsigned char **text, size_t *len, char *err,
                       size_t errlen) {
    char path[MT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/recipe.yaml.scratch", tmp);
    if (recipe_write(recipe, path, err, errlen) != 0) return -1;
    int rc = ckpt_read_file(path, (size_t)64 << 20, text, len, err, errlen);
    unlink(path);
    return rc;
}

int ckpt_write_shard_file(const char *tmp, const char *name, uint32_t file_index, const CkptPayload *p,
                          CkptShard *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    const size_t chunk_bytes = p->chunk_bytes ? p->chunk_bytes : CKPT_DEFAULT_CHUNK_BYTES;
    int num_jobs = 0;
    ChunkJob *jobs = plan_chunks(p, chunk_bytes, &num_jobs);
    out->chunks = mt_calloc((size_t)(num_jobs ? num_jobs : 1), sizeof *out->chunks);
    out->tensors = mt_calloc((size_t)(p->num_sources ? p->num_sources : 1), sizeof *out->tensors);
    out->num_tensors = p->num_sources;
    char path[MT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    uint64_t size = 0;
    uint32_t crc = 0;
    int rc = write_shard(path, p, jobs, num_jobs, chunk_bytes, out->chunks, &size, &crc, err, errlen);
    if (rc == 0) {
        snprintf(out->name, sizeof out->name, "%s", name);
        out->file = (CkptFileMeta){out->name, CKPT_FILE_SHARD, size, crc};
        /* Tensors: one per source, its chunks in job order (jobs are grouped by source). */
        for (int j = 0, t = -1; j < num_jobs; j++) {
            out->chunks[j].file = file_index;
            if (t < 0 || jobs[j].source != jobs[j - 1].source) {
                t = jobs[j].source;
                const CkptSource *s = &p->sources[t];
                out->tensors[t] = (CkptTensorMeta){.name = (char *)s->name, .dtype = s->dtype,
                                                   .ndim = s->ndim, .chunks = &out->chunks[j]};
                memcpy(out->tensors[t].shape, s->global_shape, sizeof out->tensors[t].shape);
            }
            out->tensors[t].num_chunks++;
            out->raw_bytes += jobs[j].raw_bytes;
        }
    }
    free(jobs);
    if (rc != 0) ckpt_shard_free(out);
    return rc;
}

void ckpt_shard_free(CkptShard *shard) {
    free(shard->chunks);
    free(shard->tensors);
    memset(shard, 0, sizeof *shard);
}

int ckpt_write_metadata(const char *tmp, const CkptPayload *p, const CkptFileMeta *shards, int num_shards,
                        const CkptTensorMeta *tensors, int num_tensors, uint32_t num_ranks, CkptWriteStats *stats,
                        char *err, size_t errlen) {
    const int num_hf = p->hf_files ? p->hf_files->count : 0;
    CkptFileMeta *files = mt_calloc((size_t)num_shards + 2 + (size_t)num_hf, sizeof *files);
    memcpy(files, shards, (size_t)num_shards * sizeof *files);
    unsigned char *encoded = NULL, *recipe_yaml = NULL;
    char *model_yaml = NULL;
    int rc = -1;
    int num_files = num_shards;

    size_t model_len = 0;
    char config_why[1536];
    if (ckpt_model_config_check(p->model_config, config_why, sizeof config_why) != 0) { /* it would not load */
        mt_set_error(err, errlen, "%s: the model config cannot be saved so that it loads (%s)", tmp, config_why);
        goto done;
    }
    model_yaml = ckpt_model_config_yaml(p->model_config, &model_len);
    if (write_listed_file(tmp, CKPT_MODEL_FILE, CKPT_FILE_MODEL_CONFIG, model_yaml, model_len, &files[num_files++], err,
                          errlen) != 0)
        goto done;
    if (p->recipe) {
        size_t recipe_len = 0;
        if (recipe_text(p->recipe, tmp, &recipe_yaml, &recipe_len, err, errlen) != 0) goto done;
        if (write_listed_file(tmp, CKPT_RECIPE_FILE, CKPT_FILE_RECIPE, recipe_yaml, recipe_len, &files[num_files++],
                              err, errlen) != 0)
            goto done;
    }
    for (int i = 0; i < num_hf; i++) {
        const CkptHfFile *hf = &p->hf_files->files[i];
        if (!ckpt_hf_file_name_ok(hf->name)) {
            mt_set_error(err, errlen, "%s: '%s' is not a file a checkpoint carries (ckpt_hf_carried_names)", tmp,
                         hf->name);
            goto done;
        }
        if (write_listed_file(tmp, hf->name, CKPT_FILE_HF, hf->data, hf->size, &files[num_files++], err, errlen) != 0)
            goto done;
    }
    char writer[64];
    snprintf(writer, sizeof writer, "megatrain %s", MEGATRAIN_VERSION);
    CkptMeta meta = {
        .version = CKPT_FORMAT_VERSION,
        .writer = writer,
        .iteration = p->iteration,
        .created_unix = (int64_t)time(NULL),
        .num_ranks = num_ranks,
        .has_state = p->has_state,
        .state = p->state,
        .base = p->base && p->base->present ? *p->base : (CkptBaseRef){0},
        .num_datasets = p->num_datasets,
        .datasets = (CkptDataset *)p->datasets,
        .num_files = num_files,
        .files = files,
        .num_tensors = num_tensors,
        .tensors = (CkptTensorMeta *)tensors,
    };
    size_t encoded_len = 0;
    if (ckpt_meta_encode(&meta, &encoded, &encoded_len, err, errlen) != 0) goto done;
    /* What a reader will check (every tensor tiled exactly by its chunks,
     * from every rank's shard) is checked before anything is committed. */
    CkptMeta check;
    char why[512];
    if (ckpt_meta_decode(encoded, encoded_len, &check, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "%s: the metadata would not read back: %s", tmp, why);
        goto done;
    }
    ckpt_meta_free(&check);
    ckpt_test_slow_point();
    char path[MT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", tmp, CKPT_METADATA_FILE);
    if (ckpt_write_file(path, encoded, encoded_len, err, errlen) != 0) goto done;
    if (mt_sync_dir(tmp, err, errlen) != 0) goto done;
    if (stats) {
        stats->stored_bytes = encoded_len;
        for (int i = 0; i < num_files; i++) stats->stored_bytes += files[i].size;
    }
    rc = 0;
done:
    free(files);
    free(encoded);
    free(model_yaml);
    free(recipe_yaml);
    return rc;
}

/* Everything after the temporary directory exists; the caller removes it on failure. */
static int write_contents(const char *tmp, const CkptPayload *p, CkptWriteStats *stats, char *err, size_t errlen) {
    CkptShard shard;
    if (ckpt_write_shard_file(tmp, SHARD_NAME, 0, p, &shard, err, errlen) != 0) return -1;
    int rc = ckpt_write_metadata(tmp, p, &shard.file, 1, shard.tensors, shard.num_tensors, 1, stats, err, errlen);
    if (rc == 0 && stats) stats->raw_bytes = shard.raw_bytes;
    ckpt_shard_free(&shard);
    return rc;
}

static int make_temp_dir(const char *dir, bool host_name, char *tmp, size_t tmplen, char *err, size_t errlen) {
    struct stat st;
    if (lstat(dir, &st) == 0) {
        mt_set_error(err, errlen, "%s: already exists; a checkpoint is never overwritten", dir);
        return -1;
    }
    if ((host_name ? mt_temp_name_host(tmp, tmplen, dir) : mt_temp_name(tmp, tmplen, dir)) != 0) {
        mt_set_error(err, errlen, "%s: path too long", dir);
        return -1;
    }
    char ignored[256];
    ckpt_remove_tree(tmp, ignored, sizeof ignored); /* a leftover of this pid */
    if (mkdir(tmp, 0755) != 0) {
        mt_set_error(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
        return -1;
    }
    return 0;
}

int ckpt_make_temp_dir(const char *dir, char *tmp, size_t tmplen, char *err, size_t errlen) {
    return make_temp_dir(dir, false, tmp, tmplen, err, errlen);
}

int ckpt_commit_dir(const char *tmp, const char *dir, char *err, size_t errlen) {
    char ignored[256];
    ckpt_test_slow_point();
    if (mt_rename_noreplace(tmp, dir) != 0) {
        mt_set_error(err, errlen, "%s: cannot rename %s into place: %s", dir, tmp,
                     errno == EEXIST ? "it already exists; a checkpoint is never overwritten" : strerror(errno));
        ckpt_remove_tree(tmp, ignored, sizeof ignored);
        return -1;
    }
    char parent[MT_PATH_MAX];
    mt_parent_dir(dir, parent, sizeof parent);
    if (mt_sync_dir(parent, err, errlen) != 0) { /* durability unknown: report failure, leave nothing */
        ckpt_remove_tree(dir, ignored, sizeof ignored);
        return -1;
    }
    return 0;
}

static int write_payload(const char *dir, bool host_name, const CkptPayload *p, CkptWriteStats *stats, char *err,
                         size_t errlen) {
    const double start = mt_now();
    char tmp[MT_PATH_MAX + 128];
    if (make_temp_dir(dir, host_name, tmp, sizeof tmp, err, errlen) != 0) return -1;
    char ignored[256];
    if (write_contents(tmp, p, stats, err, errlen) != 0) {
        ckpt_remove_tree(tmp, ignored, sizeof ignored);
        return -1;
    }
    if (ckpt_commit_dir(tmp, dir, err, errlen) != 0) return -1;
    if (stats) stats->seconds = mt_now() - start;
    return 0;
}

int ckpt_write_payload(const char *dir, const CkptPayload *p, CkptWriteStats *stats, char *err, size_t errlen) {
    return write_payload(dir, false, p, stats, err, errlen);
}

int ckpt_write_payload_host_temp(const char *dir, const CkptPayload *p, CkptWriteStats *stats, char *err,
                                 size_t errlen) {
    return write_payload(dir, true, p, stats, err, errlen);
}
