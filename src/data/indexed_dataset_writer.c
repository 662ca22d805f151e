/* indexed_dataset_writer.c: writes a Megatron MMIDIDX dataset.
 *
 * Tokens stream to PREFIX.bin.tmp.HOST.PID as documents arrive (a build
 * killed outright leaves it; the next build into PREFIX on that host removes
 * it once its process is gone); sequence lengths
 * stay in memory (4 bytes per document; the byte offsets are their running
 * sum, computed when the index is written). finish() writes
 * PREFIX.idx.tmp.HOST.PID, fsyncs both and renames them to PREFIX.bin, then
 * PREFIX.idx (the .idx last: a prefix with an .idx is complete), and fsyncs
 * the directory. Existing files are never replaced unless overwrite is set;
 * then the old PREFIX.idx is removed first, so that no moment shows a new
 * .bin beside an old .idx. Each document is one sequence, as Megatron's
 * tools/preprocess_data.py writes them without --split-sentences, so the
 * document index is 0, 1, ..., N (N + 1 entries).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/error.h"
#include "../core/fs.h"
#include "indexed_dataset.h"
#include "indexed_dataset_format.h"
#include "indexed_dataset_writer.h"

struct IndexedDatasetWriter {
    char bin_path[1100], idx_path[1100];
    char bin_temp[1200], idx_temp[1200];
    FILE *bin;
    bool overwrite;
    int dtype_code, token_size;
    int64_t num_documents, capacity, num_tokens, bin_bytes;
    int32_t *lengths;
    uint8_t *encode_buffer; /* tokens converted to the file dtype */
    size_t encode_capacity;
    char error[1500];
};

IndexedDatasetWriter *indexed_dataset_writer_open(const char *prefix, int dtype_code, char *err, size_t errlen) {
    if (indexed_dtype_size(dtype_code) == 0 || dtype_code == IDX_DTYPE_FLOAT32 ||
        dtype_code == IDX_DTYPE_FLOAT64) {
        mt_set_error(err, errlen, "%s: cannot write token dtype code %d (expected an integer dtype)", prefix,
                     dtype_code);
        return NULL;
    }
    IndexedDatasetWriter *w = mt_calloc(1, sizeof(*w));
    w->dtype_code = dtype_code;
    w->token_size = indexed_dtype_size(dtype_code);
    int a = snprintf(w->bin_path, sizeof(w->bin_path), "%s.bin", prefix);
    int b = snprintf(w->idx_path, sizeof(w->idx_path), "%s.idx", prefix);
    if (a < 0 || b < 0 || (size_t)a >= sizeof(w->bin_path) || (size_t)b >= sizeof(w->idx_path) ||
        mt_temp_name_host(w->bin_temp, sizeof(w->bin_temp), w->bin_path) != 0 ||
        mt_temp_name_host(w->idx_temp, sizeof(w->idx_temp), w->idx_path) != 0) {
        mt_set_error(err, errlen, "%s: output prefix too long", prefix);
        free(w);
        return NULL;
    }
    /* what a build killed outright (SIGKILL, a crash) left here: its process is gone */
    char first[4096];
    const int stale = mt_remove_stale_temps(w->bin_path, first, sizeof first) +
                      mt_remove_stale_temps(w->idx_path, first, sizeof first);
    if (stale) mt_log("removed %d temporary file(s) of an earlier build that was killed (%s)", stale, first);
    w->bin = fopen(w->bin_temp, "wb");
    if (!w->bin) {
        mt_set_error(err, errlen, "%s: cannot create: %s", w->bin_temp, strerror(errno));
        free(w);
        return NULL;
    }
    setvbuf(w->bin, NULL, _IOFBF, 1 << 20);
    return w;
}

static int token_fits(int dtype_code, int32_t t) {
    switch (dtype_code) {
    case IDX_DTYPE_UINT8: return t >= 0 && t <= 255;
    case IDX_DTYPE_INT8: return t >= -128 && t <= 127;
    case IDX_DTYPE_UINT16: return t >= 0 && t <= 65535;
    case IDX_DTYPE_INT16: return t >= -32768 && t <= 32767;
    default: return 1;
    }
}

/* Little-endian encoding of one token (x86 and ARM are little-endian; done
 * byte by byte so the file is right on any host). */
static void encode_token(uint8_t *p, int32_t t, int size) {
    int64_t v = t;
    for (int i = 0; i < size; i++) p[i] = (uint8_t)((uint64_t)v >> (8 * i));
}

int indexed_dataset_writer_add_document(IndexedDatasetWriter *w, const int32_t *tokens, int64_t count) {
    if (w->error[0]) return -1;
    if (count < 0 || count > INT32_MAX) {
        snprintf(w->error, sizeof(w->error), "%s: document %lld has %lld tokens (expected 0..%d)", w->bin_path,
                 (long long)w->num_documents, (long long)count, INT32_MAX);
        return -1;
    }
    for (int64_t i = 0; i < count; i++) {
        if (!token_fits(w->dtype_code, tokens[i])) {
            snprintf(w->error, sizeof(w->error), "%s: token %d (document %lld) does not fit dtype %s", w->bin_path,
                     tokens[i], (long long)w->num_documents, indexed_dtype_name(w->dtype_code));
            return -1;
        }
    }
    size_t bytes = (size_t)count * (size_t)w->token_size;
    if (bytes > w->encode_capacity) {
        w->encode_capacity = bytes * 2;
        w->encode_buffer = mt_realloc(w->encode_buffer, w->encode_capacity);
    }
    for (int64_t i = 0; i < count; i++) encode_token(w->encode_buffer + i * w->token_size, tokens[i], w->token_size);
    if (bytes > 0 && fwrite(w->encode_buffer, 1, bytes, w->bin) != bytes) {
        snprintf(w->error, sizeof(w->error), "%s: write failed: %s", w->bin_temp, strerror(errno));
        return -1;
    }
    if (w->num_documents == w->capacity) {
        w->capacity = w->capacity ? 2 * w->capacity : 1024;
        w->lengths = mt_realloc(w->lengths, (size_t)w->capacity * sizeof(*w->lengths));
    }
    w->lengths[w->num_documents] = (int32_t)count;
    w->num_documents++;
    w->num_tokens += count;
    w->bin_bytes += (int64_t)bytes;
    return 0;
}

static void free_writer(IndexedDatasetWriter *w) {
    free(w->lengths);
    free(w->encode_buffer);
    free(w);
}

void indexed_dataset_writer_abort(IndexedDatasetWriter *w) {
    if (!w) return;
    if (w->bin) fclose(w->bin);
    unlink(w->bin_temp);
    unlink(w->idx_temp);
    free_writer(w);
}

void indexed_dataset_writer_set_overwrite(IndexedDatasetWriter *w, bool overwrite) { w->overwrite = overwrite; }
const char *indexed_dataset_writer_error(const IndexedDatasetWriter *w) { return w->error; }
int64_t indexed_dataset_writer_documents(const IndexedDatasetWriter *w) { return w->num_documents; }
int64_t indexed_dataset_writer_tokens(const IndexedDatasetWriter *w) { return w->num_tokens; }

static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Write the whole .idx to f; 0 or -1. */
static int write_index(IndexedDatasetWriter *w, FILE *f) {
    uint8_t header[IDX_HEADER_BYTES];
    int64_t n = w->num_documents;
    memcpy(header, IDX_MAGIC, IDX_MAGIC_BYTES);
    put_u64(header + 9, IDX_VERSION);
    header[17] = (uint8_t)w->dtype_code;
    put_u64(header + 18, (uint64_t)n);
    put_u64(header + 26, (uint64_t)n + 1);
    if (fwrite(header, 1, sizeof(header), f) != sizeof(header)) return -1;
    uint8_t buf[8 * 512];
    int64_t offset = 0; /* pass 1: the byte offset of sequence j */
    for (int pass = 0; pass < 3; pass++) {
        int64_t count = pass == 2 ? n + 1 : n;
        int size = pass == 0 ? 4 : 8;
        for (int64_t start = 0; start < count; start += 512) {
            int64_t m = count - start < 512 ? count - start : 512;
            for (int64_t i = 0; i < m; i++) {
                int64_t j = start + i, v = j;
                if (pass == 0) v = w->lengths[j];
                if (pass == 1) v = offset, offset += (int64_t)w->lengths[j] * w->token_size;
                for (int k = 0; k < size; k++) buf[i * size + k] = (uint8_t)((uint64_t)v >> (8 * k));
            }
            if (fwrite(buf, (size_t)size, (size_t)m, f) != (size_t)m) return -1;
        }
    }
    return 0;
}

/* fflush + fsync + fclose; 0 or -1. */
static int close_synced(FILE *f) {
    if (fflush(f) != 0) {
        fclose(f);
        return -1;
    }
    int fd = dup(fileno(f));
    fclose(f);
    return fd < 0 ? -1 : mt_sync_close(fd);
}

/* Rename the synced temporary files into place, the .bin first, the .idx
 * last, then fsync the directory. Returns 0, or -1 with err (nothing of the
 * new dataset left under the prefix; with overwrite the old .idx is gone). */
static int place_files(IndexedDatasetWriter *w, char *err, size_t errlen) {
    char dir[sizeof w->bin_path];
    mt_parent_dir(w->bin_path, dir, sizeof dir);
    if (w->overwrite) {
        if (unlink(w->idx_path) != 0 && errno != ENOENT) {
            mt_set_error(err, errlen, "%s: cannot remove the old index: %s", w->idx_path, strerror(errno));
            return -1;
        }
        if (mt_sync_dir(dir, err, errlen) != 0) return -1;
        if (rename(w->bin_temp, w->bin_path) != 0) {
            mt_set_error(err, errlen, "%s: cannot rename into place: %s", w->bin_path, strerror(errno));
            return -1;
        }
        if (rename(w->idx_temp, w->idx_path) != 0) {
            mt_set_error(err, errlen, "%s: cannot rename into place: %s", w->idx_path, strerror(errno));
            unlink(w->bin_path); /* the new .bin without its index */
            return -1;
        }
    } else {
        if (mt_rename_noreplace(w->bin_temp, w->bin_path) != 0) {
            mt_set_error(err, errlen, "%s: cannot rename into place: %s", w->bin_path,
                         errno == EEXIST ? "it already exists (not replaced)" : strerror(errno));
            return -1;
        }
        if (mt_rename_noreplace(w->idx_temp, w->idx_path) != 0) {
            mt_set_error(err, errlen, "%s: cannot rename into place: %s", w->idx_path,
                         errno == EEXIST ? "it already exists (not replaced)" : strerror(errno));
            unlink(w->bin_path); /* ours: it did not exist before */
            return -1;
        }
    }
    return mt_sync_dir(dir, err, errlen);
}

int indexed_dataset_writer_seal(IndexedDatasetWriter *w, char *err, size_t errlen) {
    if (w->error[0]) {
        mt_set_error(err, errlen, "%s", w->error);
        indexed_dataset_writer_abort(w);
        return -1;
    }
    FILE *bin = w->bin;
    w->bin = NULL;
    if (close_synced(bin) != 0) {
        mt_set_error(err, errlen, "%s: write failed: %s", w->bin_temp, strerror(errno));
        indexed_dataset_writer_abort(w);
        return -1;
    }
    FILE *idx = fopen(w->idx_temp, "wb");
    int failed = !idx;
    if (idx) {
        failed = write_index(w, idx) != 0;
        failed = (close_synced(idx) != 0) || failed;
    }
    if (failed) {
        mt_set_error(err, errlen, "%s: write failed: %s", w->idx_temp, strerror(errno));
        indexed_dataset_writer_abort(w);
        return -1;
    }
    return 0;
}

int indexed_dataset_writer_place(IndexedDatasetWriter *w, char *err, size_t errlen) {
    if (place_files(w, err, errlen) != 0) {
        indexed_dataset_writer_abort(w);
        return -1;
    }
    free_writer(w);
    return 0;
}

int indexed_dataset_writer_finish(IndexedDatasetWriter *w, char *err, size_t errlen) {
    if (indexed_dataset_writer_seal(w, err, errlen) != 0) return -1;
    return indexed_dataset_writer_place(w, err, errlen);
}
