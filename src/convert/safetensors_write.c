/* safetensors_write.c: writing safetensors files the way the reference
 * writer does (tensors ordered by dtype then name, compact header padded
 * with spaces to 8 bytes, {"format": "pt"} metadata from the caller), and
 * sharding a model over several files with model.safetensors.index.json. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/error.h"
#include "../core/json.h"
#include "../core/float16.h"
#include "safetensors.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Elements converted and written at a time: 2^20 a thread, so that a tensor streamed from a checkpoint (4 MiB
 * chunks of fp32: 2^20 elements) decodes that many chunks at once on the OpenMP threads (ckpt_reader.c), up to
 * 16 (96 MiB of buffer). */
static size_t block_elements(void) {
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    return ((size_t)1 << 20) * (size_t)(threads < 1 ? 1 : threads > 16 ? 16 : threads);
}

static uint64_t tensor_numel(const StWriteTensor *t) {
    uint64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (uint64_t)t->shape[i];
    return n;
}

size_t st_write_tensor_bytes(const StWriteTensor *tensor) {
    return (size_t)(tensor_numel(tensor) * st_dtype_size(tensor->dtype));
}

/* The reference order: larger dtypes first (F32, BF16, F16), then by name. */
static int compare_tensors(const void *a, const void *b) {
    const StWriteTensor *x = *(const StWriteTensor *const *)a, *y = *(const StWriteTensor *const *)b;
    if (x->dtype != y->dtype) return (int)x->dtype - (int)y->dtype;
    return strcmp(x->name, y->name);
}

/* Convert and write one tensor's data in blocks of `size` elements (`block`
 * holds that many floats and as many halves). Returns 0, or -1 with err. */
static int write_data(FILE *out, const char *path, const StWriteTensor *t, float *block, size_t size, char *err,
                      size_t errlen) {
    uint64_t n = tensor_numel(t);
    uint16_t *half = (uint16_t *)(block + size);
    for (uint64_t start = 0; start < n; start += size) {
        size_t count = (size_t)(n - start < size ? n - start : size);
        const float *in = t->data ? t->data + start : block;
        if (!t->data && t->fill(t->fill_ctx, (int64_t)start, (int64_t)count, block, err, errlen) != 0) return -1;
        bool failed;
        if (t->dtype == ST_F32) {
            failed = fwrite(in, sizeof(float), count, out) != count;
        } else {
            const bool bf16 = t->dtype == ST_BF16;
#pragma omp parallel for schedule(static) if (count >= ((size_t)1 << 18))
            for (size_t i = 0; i < count; i++) half[i] = bf16 ? f32_to_bf16(in[i]) : f32_to_f16(in[i]);
            failed = fwrite(half, sizeof(uint16_t), count, out) != count;
        }
        if (failed) {
            mt_set_error(err, errlen, "%s: cannot write: %s", path, strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* Progress reporting while a file is written: tensors done before it, and in all. */
typedef struct Progress {
    StProgressFn fn;
    void *ctx;
    int done, total;
} Progress;

static int write_file(const char *path, const StWriteTensor *tensors, int count, const StMetadataEntry *metadata,
                      int num_metadata, Progress *progress, char *err, size_t errlen) {
    const StWriteTensor **order = mt_malloc((size_t)(count ? count : 1) * sizeof *order);
    for (int i = 0; i < count; i++) order[i] = &tensors[i];
    qsort(order, (size_t)count, sizeof *order, compare_tensors);

    JsonWriter w;
    jw_init(&w, 0);
    jw_begin_object(&w);
    if (num_metadata > 0) {
        jw_key(&w, "__metadata__");
        jw_begin_object(&w);
        for (int i = 0; i < num_metadata; i++) {
            jw_key(&w, metadata[i].key);
            jw_string(&w, metadata[i].value);
        }
        jw_end_object(&w);
    }
    uint64_t offset = 0;
    for (int i = 0; i < count; i++) {
        const StWriteTensor *t = order[i];
        uint64_t nbytes = st_write_tensor_bytes(t);
        jw_key(&w, t->name);
        jw_begin_object(&w);
        jw_key(&w, "dtype");
        jw_string(&w, st_dtype_name(t->dtype));
        jw_key(&w, "shape");
        jw_begin_array(&w);
        for (int d = 0; d < t->ndim; d++) jw_int(&w, t->shape[d]);
        jw_end_array(&w);
        jw_key(&w, "data_offsets");
        jw_begin_array(&w);
        jw_int(&w, (int64_t)offset);
        jw_int(&w, (int64_t)(offset + nbytes));
        jw_end_array(&w);
        jw_end_object(&w);
        offset += nbytes;
    }
    jw_end_object(&w);
    while (w.len % 8 != 0) jw_raw(&w, " ", 1);

    int status = -1;
    float *buffer = NULL;
    FILE *out = fopen(path, "wb");
    if (!out) {
        mt_set_error(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        goto done;
    }
    unsigned char length[8];
    for (int i = 0; i < 8; i++) length[i] = (unsigned char)((uint64_t)w.len >> (8 * i));
    bool failed = fwrite(length, 1, 8, out) != 8 || fwrite(w.data, 1, w.len, out) != w.len;
    if (failed) mt_set_error(err, errlen, "%s: cannot write: %s", path, strerror(errno));
    const size_t block = block_elements();
    buffer = mt_malloc(block * (sizeof(float) + sizeof(uint16_t)));
    for (int i = 0; i < count && !failed; i++) {
        failed = write_data(out, path, order[i], buffer, block, err, errlen) != 0;
        if (progress && progress->fn) progress->fn(progress->ctx, ++progress->done, progress->total);
    }
    if (!failed && (fflush(out) != 0 || fsync(fileno(out)) != 0)) {
        mt_set_error(err, errlen, "%s: cannot write: %s", path, strerror(errno));
        failed = true;
    }
    if (fclose(out) != 0 && !failed) {
        mt_set_error(err, errlen, "%s: cannot write: %s", path, strerror(errno));
        failed = true;
    }
    if (failed) {
        remove(path);
        goto done;
    }
    status = 0;
done:
    free(buffer);
    free(order);
    jw_free(&w);
    return status;
}

int st_write_file(const char *path, const StWriteTensor *tensors, int count, const StMetadataEntry *metadata,
                  int num_metadata, char *err, size_t errlen) {
    return write_file(path, tensors, count, metadata, num_metadata, NULL, err, errlen);
}

static int write_text_file(const char *path, const char *text, size_t len, char *err, size_t errlen) {
    FILE *out = fopen(path, "wb");
    if (!out) {
        mt_set_error(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        return -1;
    }
    bool failed = fwrite(text, 1, len, out) != len || fflush(out) != 0 || fsync(fileno(out)) != 0;
    if (fclose(out) != 0) failed = true;
    if (failed) {
        mt_set_error(err, errlen, "%s: cannot write: %s", path, strerror(errno));
        remove(path);
        return -1;
    }
    return 0;
}

typedef struct WeightEntry {
    const char *name;
    int shard;
} WeightEntry;

static int compare_entries(const void *a, const void *b) {
    return strcmp(((const WeightEntry *)a)->name, ((const WeightEntry *)b)->name);
}

static int write_index(const char *dir, const StWriteTensor *tensors, const int *shard_of, int count, int num_shards,
                       uint64_t total_size, int64_t total_parameters, char *err, size_t errlen) {
    WeightEntry *entries = mt_malloc((size_t)count * sizeof *entries);
    for (int i = 0; i < count; i++) entries[i] = (WeightEntry){tensors[i].name, shard_of[i]};
    qsort(entries, (size_t)count, sizeof *entries, compare_entries);
    JsonWriter w;
    jw_init(&w, 2);
    jw_begin_object(&w);
    jw_key(&w, "metadata");
    jw_begin_object(&w);
    jw_key(&w, "total_parameters");
    jw_int(&w, total_parameters);
    jw_key(&w, "total_size");
    jw_int(&w, (int64_t)total_size);
    jw_end_object(&w);
    jw_key(&w, "weight_map");
    jw_begin_object(&w);
    for (int i = 0; i < count; i++) {
        char file[64];
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", entries[i].shard + 1, num_shards);
        jw_key(&w, entries[i].name);
        jw_string(&w, file);
    }
    jw_end_object(&w);
    jw_end_object(&w);
    jw_raw(&w, "\n", 1);
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    int status = write_text_file(path, w.data, w.len, err, errlen);
    jw_free(&w);
    free(entries);
    return status;
}

int st_write_model(const char *dir, const StWriteTensor *tensors, int count, uint64_t max_shard_bytes,
                   int64_t total_parameters, StProgressFn progress, void *progress_ctx, char *err, size_t errlen) {
    static const StMetadataEntry format_pt = {"format", "pt"};
    /* huggingface_hub's split (split_state_dict_into_shards_factory): tensors
     * in the given order fill the current shard; one that would overflow it
     * closes it; one larger than the limit becomes a shard of its own at
     * once (numbered before the open shard). Shards are numbered as closed.
     * Tensors that share a storage (same_storage) go where the first of them
     * goes, which counts the whole storage (get_torch_storage_size). */
    int *shard_of = mt_malloc((size_t)(count ? count : 1) * sizeof *shard_of);
    int *open_members = mt_malloc((size_t)(count ? count : 1) * sizeof *open_members);
    uint64_t total = 0, open_bytes = 0;
    int num_shards = 0, num_open = 0;
    for (int i = 0; i <= count;) {
        int end = i; /* [i, end): one storage */
        uint64_t bytes = 0;
        while (end < count && (end == i || tensors[end].same_storage)) bytes += st_write_tensor_bytes(&tensors[end++]);
        if (i < count && bytes > max_shard_bytes) {
            for (int k = i; k < end; k++) shard_of[k] = num_shards;
            num_shards++;
            total += bytes;
            i = end;
            continue;
        }
        if (num_open > 0 && (i == count || open_bytes + bytes > max_shard_bytes)) {
            for (int k = 0; k < num_open; k++) shard_of[open_members[k]] = num_shards;
            num_shards++;
            num_open = 0;
            open_bytes = 0;
        }
        if (i == count) break;
        for (int k = i; k < end; k++) open_members[num_open++] = k;
        open_bytes += bytes;
        total += bytes;
        i = end;
    }
    free(open_members);
    int status = 0;
    char path[4096];
    Progress report = {progress, progress_ctx, 0, count};
    if (num_shards <= 1) {
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        status = write_file(path, tensors, count, &format_pt, 1, &report, err, errlen);
        free(shard_of);
        return status;
    }
    StWriteTensor *subset = mt_malloc((size_t)count * sizeof *subset);
    for (int shard = 0; shard < num_shards && status == 0; shard++) {
        int n = 0;
        for (int i = 0; i < count; i++)
            if (shard_of[i] == shard) subset[n++] = tensors[i];
        snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", dir, shard + 1, num_shards);
        status = write_file(path, subset, n, &format_pt, 1, &report, err, errlen);
    }
    if (status == 0)
        status = write_index(dir, tensors, shard_of, count, num_shards, total, total_parameters, err, errlen);
    free(subset);
    free(shard_of);
    return status;
}
