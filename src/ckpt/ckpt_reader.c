/* ckpt_reader.c: opening a checkpoint, reading regions of its tensors chunk
 * by chunk (pread, zstd, unfilter, CRC), and whole-file verification. */
#include "ckpt_reader.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/error.h"
#include "../core/float16.h"
#include "../core/fs.h"
#include "ckpt_codec.h"
#include "ckpt_fs.h"
#include "../core/crc32c.h"

#define MAX_SMALL_FILE_BYTES ((size_t)64 << 20)

void ckpt_file_path(char *out, size_t outlen, const char *dir, const char *name) {
    snprintf(out, outlen, "%s/%s", dir, name);
}

/* The OpenMP threads a read across chunks may use (one without OpenMP: the fuzz harnesses' build). */
#ifdef _OPENMP
#include <omp.h>
static int max_threads(void) { return omp_get_max_threads(); }
static int thread_num(void) { return omp_get_thread_num(); }
#else
static int max_threads(void) { return 1; }
static int thread_num(void) { return 0; }
#endif

static void buffers_free(CkptChunkBuffers *b) {
    ZSTD_freeDCtx(b->dctx);
    free(b->stored);
    free(b->raw);
    free(b->scratch);
    free(b->converted);
}

uint64_t ckpt_tensor_stored_bytes(const CkptTensorMeta *t) {
    uint64_t n = 0;
    for (int c = 0; c < t->num_chunks; c++) n += t->chunks[c].stored_bytes;
    return n;
}

uint64_t ckpt_tensor_raw_bytes(const CkptTensorMeta *t) {
    uint64_t n = 0;
    for (int c = 0; c < t->num_chunks; c++) n += t->chunks[c].raw_bytes;
    return n;
}

int ckpt_reader_check_file(CkptReader *r, int index, bool with_crc, char *err, size_t errlen) {
    const CkptFileMeta *f = &r->meta.files[index];
    char path[MT_PATH_MAX + CKPT_NAME_MAX + 2];
    ckpt_file_path(path, sizeof path, r->dir, f->name);
    struct stat st;
    if (stat(path, &st) != 0) {
        mt_env_error_note(errno);
        mt_set_error(err, errlen, "%s: missing (%s)", path, strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        mt_set_error(err, errlen, "%s: is %s, expected a regular file (replaced)", path,
                     mt_file_kind((unsigned int)st.st_mode));
        return -1;
    }
    if ((uint64_t)st.st_size != f->size) {
        mt_set_error(err, errlen, "%s: %llu bytes, the metadata says %llu (truncated or replaced)", path,
                     (unsigned long long)st.st_size, (unsigned long long)f->size);
        return -1;
    }
    return with_crc ? ckpt_reader_verify_file(r, index, err, errlen) : 0;
}

CkptReader *ckpt_reader_open_metadata(const char *dir, char *err, size_t errlen) {
    CkptReader *r = mt_calloc(1, sizeof *r);
    snprintf(r->dir, sizeof r->dir, "%s", dir);
    char path[MT_PATH_MAX + 32];
    ckpt_file_path(path, sizeof path, dir, CKPT_METADATA_FILE);
    unsigned char *data = NULL;
    size_t len = 0;
    char why[1024];
    if (ckpt_read_file(path, CKPT_MAX_METADATA_BYTES, &data, &len, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "%s (not a complete checkpoint)", why);
        free(r);
        return NULL;
    }
    int rc = ckpt_meta_decode(data, len, &r->meta, why, sizeof why);
    free(data);
    if (rc != 0) {
        mt_set_error(err, errlen, "%s: %s", path, why);
        free(r);
        return NULL;
    }
    r->fds = mt_malloc((size_t)r->meta.num_files * sizeof(int));
    for (int i = 0; i < r->meta.num_files; i++) r->fds[i] = -1;
    return r;
}

/* Shards by size (their chunks carry CRCs), the small files by CRC too; the
 * hf files are checked when read (ckpt_hf_files_read): a damaged tokenizer
 * does not make the weights unreadable. */
CkptReader *ckpt_reader_open(const char *dir, char *err, size_t errlen) {
    CkptReader *r = ckpt_reader_open_metadata(dir, err, errlen);
    if (!r) return NULL;
    for (int i = 0; i < r->meta.num_files; i++)
        if (r->meta.files[i].role != CKPT_FILE_HF &&
            ckpt_reader_check_file(r, i, r->meta.files[i].role != CKPT_FILE_SHARD, err, errlen) != 0) {
            ckpt_reader_close(r);
            return NULL;
        }
    return r;
}

void ckpt_reader_close(CkptReader *r) {
    if (!r) return;
    for (int i = 0; i < r->meta.num_files; i++)
        if (r->fds[i] >= 0) close(r->fds[i]);
    free(r->fds);
    buffers_free(&r->buf);
    for (int i = 0; i < r->num_workers; i++) buffers_free(&r->workers[i]);
    free(r->workers);
    ckpt_meta_free(&r->meta);
    free(r);
}

static int file_fd(CkptReader *r, uint32_t index, char *err, size_t errlen) {
    if (r->fds[index] >= 0) return r->fds[index];
    char path[MT_PATH_MAX + CKPT_NAME_MAX + 2];
    ckpt_file_path(path, sizeof path, r->dir, r->meta.files[index].name);
    r->fds[index] = mt_open_regular(path, NULL, NULL, err, errlen); /* a FIFO is refused, not waited on */
    return r->fds[index];
}

/* pread all n bytes: 0, -1 on an error (errno), READ_EOF when the file ends first. */
#define READ_EOF (-2)
static int read_exact(int fd, void *buf, size_t n, uint64_t offset) {
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t got = pread(fd, p, n, (off_t)offset);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return -1;
        if (got == 0) return READ_EOF;
        p += got;
        n -= (size_t)got;
        offset += (uint64_t)got;
    }
    return 0;
}

/* Why read_exact of file f (open as fd) failed with rc, into buf: a file
 * that ends early is called truncated, with its sizes (strerror would say
 * "Input/output error"). */
static const char *read_failure(int rc, int fd, const CkptFileMeta *f, char *buf, size_t len) {
    struct stat st;
    if (rc != READ_EOF) mt_env_error_note(errno);
    if (rc != READ_EOF) snprintf(buf, len, "%s", strerror(errno));
    else if (fstat(fd, &st) != 0) snprintf(buf, len, "the file is truncated: expected %llu bytes", (unsigned long long)f->size);
    else
        snprintf(buf, len, "the file is truncated: expected %llu bytes, found %llu", (unsigned long long)f->size,
                 (unsigned long long)st.st_size);
    return buf;
}

static void reserve(unsigned char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return;
    free(*buf);
    *buf = mt_malloc(need);
    *cap = need;
}

/* Read, decode and verify chunk c of tensor t into b->raw; its file is open (file_fd). Touches nothing of r but
 * reads, so threads with their own buffers may decode chunks at once. */
static int decode_chunk(const CkptReader *r, CkptChunkBuffers *b, const CkptTensorMeta *t, int c, char *err,
                        size_t errlen) {
    const CkptChunk *ch = &t->chunks[c];
    const CkptFileMeta *f = &r->meta.files[ch->file];
    const int fd = r->fds[ch->file];
    reserve(&b->stored, &b->stored_cap, ch->stored_bytes); /* inside the file: the metadata's bounds check */
    char why[512];
    int rc = read_exact(fd, b->stored, ch->stored_bytes, ch->offset);
    if (rc != 0) {
        mt_set_error(err, errlen, "%s/%s: tensor '%s' chunk %d: cannot read bytes %llu..%llu: %s", r->dir, f->name,
                     t->name, c, (unsigned long long)ch->offset, (unsigned long long)(ch->offset + ch->stored_bytes),
                     read_failure(rc, fd, f, why, sizeof why));
        return -1;
    }
    /* The raw size comes from the metadata; the frame says what it holds. Compared before allocating, so that
     * metadata claiming a huge tensor is called corrupt instead of running out of memory. */
    const unsigned long long frame = ZSTD_getFrameContentSize(b->stored, ch->stored_bytes);
    if (frame != ch->raw_bytes) {
        if (frame == ZSTD_CONTENTSIZE_ERROR) snprintf(why, sizeof why, "no zstd frame there");
        else if (frame == ZSTD_CONTENTSIZE_UNKNOWN) snprintf(why, sizeof why, "its zstd frame does not say its size");
        else snprintf(why, sizeof why, "its zstd frame holds %llu", frame);
        mt_set_error(err, errlen, "%s/%s: tensor '%s' chunk %d (bytes %llu..%llu): the metadata says %llu raw bytes, %s",
                     r->dir, f->name, t->name, c, (unsigned long long)ch->offset,
                     (unsigned long long)(ch->offset + ch->stored_bytes), (unsigned long long)ch->raw_bytes, why);
        return -1;
    }
    reserve(&b->raw, &b->raw_cap, ch->raw_bytes);
    reserve(&b->scratch, &b->scratch_cap, ch->raw_bytes);
    if (!b->dctx) b->dctx = ZSTD_createDCtx();
    if (ckpt_chunk_decode(b->dctx, ch, b->stored, b->raw, b->scratch, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "%s/%s: tensor '%s' chunk %d (bytes %llu..%llu): %s", r->dir, f->name, t->name, c,
                     (unsigned long long)ch->offset, (unsigned long long)(ch->offset + ch->stored_bytes), why);
        return -1;
    }
    return 0;
}

/* Chunk c of tensor t, verified, into r->buf.raw (unless it holds it already: reads of neighbouring regions share
 * a chunk). */
static int load_chunk(CkptReader *r, const CkptTensorMeta *t, int c, char *err, size_t errlen) {
    if (r->raw_tensor == t && r->raw_chunk == c) return 0;
    r->raw_tensor = NULL;
    if (file_fd(r, t->chunks[c].file, err, errlen) < 0) return -1;
    if (decode_chunk(r, &r->buf, t, c, err, errlen) != 0) return -1;
    r->raw_tensor = t;
    r->raw_chunk = c;
    return 0;
}

/* Copy the intersection of box `src` (holding src_data) and box `dst`
 * (holding dst_data) element by element runs along the last dimension. */
static void copy_intersection(int ndim, size_t elem, const int64_t *src_start, const int64_t *src_shape,
                              const unsigned char *src_data, const int64_t *dst_start, const int64_t *dst_shape,
                              unsigned char *dst_data) {
    int64_t lo[CKPT_MAX_DIMS], hi[CKPT_MAX_DIMS];
    for (int d = 0; d < ndim; d++) {
        lo[d] = src_start[d] > dst_start[d] ? src_start[d] : dst_start[d];
        int64_t a = src_start[d] + src_shape[d], b = dst_start[d] + dst_shape[d];
        hi[d] = a < b ? a : b;
        if (lo[d] >= hi[d]) return;
    }
    const int last = ndim - 1;
    const size_t run = (size_t)(hi[last] - lo[last]) * elem;
    int64_t idx[CKPT_MAX_DIMS];
    memcpy(idx, lo, sizeof idx);
    for (;;) {
        int64_t src_off = 0, dst_off = 0;
        for (int d = 0; d < ndim; d++) {
            src_off = src_off * src_shape[d] + (idx[d] - src_start[d]);
            dst_off = dst_off * dst_shape[d] + (idx[d] - dst_start[d]);
        }
        memcpy(dst_data + (size_t)dst_off * elem, src_data + (size_t)src_off * elem, run);
        int d = last - 1;
        while (d >= 0 && ++idx[d] == hi[d]) idx[d] = lo[d], d--;
        if (d < 0) break;
    }
}

static bool intersects(int ndim, const int64_t *a_start, const int64_t *a_shape, const int64_t *b_start,
                       const int64_t *b_shape) {
    for (int d = 0; d < ndim; d++)
        if (a_start[d] + a_shape[d] <= b_start[d] || b_start[d] + b_shape[d] <= a_start[d]) return false;
    return true;
}

/* The n elements of a decoded chunk (b->raw, of dtype `from`) as dtype `to`, in b->converted. */
static const unsigned char *convert_chunk(CkptChunkBuffers *b, CkptDType from, CkptDType to, size_t n) {
    reserve(&b->converted, &b->converted_cap, n * ckpt_dtype_size(to) + 1);
    if (from == CKPT_DTYPE_BF16 && to == CKPT_DTYPE_FP32) {
        const uint16_t *in = (const uint16_t *)b->raw;
        float *out = (float *)b->converted;
        for (size_t i = 0; i < n; i++) out[i] = bf16_to_f32(in[i]);
    } else { /* fp32 -> bf16 */
        const float *in = (const float *)b->raw;
        uint16_t *out = (uint16_t *)b->converted;
        for (size_t i = 0; i < n; i++) out[i] = f32_to_bf16(in[i]);
    }
    return b->converted;
}

/* Chunk c (decoded in b) copied where it meets the region into dst, as dtype. */
static void place_chunk(CkptChunkBuffers *b, const CkptTensorMeta *t, int c, const int64_t *start,
                        const int64_t *shape, CkptDType dtype, void *dst) {
    const CkptChunk *ch = &t->chunks[c];
    const unsigned char *data = t->dtype == dtype ? b->raw
                                : convert_chunk(b, t->dtype, dtype, ch->raw_bytes / ckpt_dtype_size(t->dtype));
    copy_intersection(t->ndim, ckpt_dtype_size(dtype), ch->start, ch->shape, data, start, shape, dst);
}

/* The n chunks `list` of t (each meeting the region, n > 1) decoded on the OpenMP threads, each with its own
 * buffers, and placed into dst (the chunks do not overlap, so neither do their places). The chunk r->buf holds
 * (the last one read) is placed from there, and the last chunk of the list is kept there for the next read:
 * regions read one after another (a tensor streamed in blocks, a block's boxes) share the chunk at their seam,
 * which is decoded once. The error is that of the first failing chunk in the list, as a read one chunk after
 * another reports it. */
static int read_chunks_parallel(CkptReader *r, const CkptTensorMeta *t, const int *list, int n, const int64_t *start,
                                const int64_t *shape, CkptDType dtype, void *dst, char *err, size_t errlen) {
    for (int k = 0; k < n; k++) /* the files opened here, not by the threads */
        if (file_fd(r, t->chunks[list[k]].file, err, errlen) < 0) return -1;
    const int threads = max_threads();
    if (r->num_workers < threads) {
        r->workers = mt_realloc(r->workers, (size_t)threads * sizeof *r->workers);
        memset(r->workers + r->num_workers, 0, (size_t)(threads - r->num_workers) * sizeof *r->workers);
        r->num_workers = threads;
    }
    int first_failed = n, last_by = -1; /* last_by: the worker that decoded list[n - 1] */
#pragma omp parallel for schedule(dynamic, 1)
    for (int k = 0; k < n; k++) {
        if (r->raw_tensor == t && r->raw_chunk == list[k]) { /* decoded by the last read */
            place_chunk(&r->buf, t, list[k], start, shape, dtype, dst);
            continue;
        }
        CkptChunkBuffers *b = &r->workers[thread_num()];
        char why[2048];
        if (decode_chunk(r, b, t, list[k], why, sizeof why) == 0) {
            place_chunk(b, t, list[k], start, shape, dtype, dst);
            if (k == n - 1) last_by = thread_num();
            continue;
        }
#pragma omp critical(ckpt_reader_error)
        if (k < first_failed) {
            first_failed = k;
            mt_set_error(err, errlen, "%s", why);
        }
    }
    if (first_failed < n) return -1;
    if (last_by >= 0) { /* r->buf takes the last chunk's buffers, the worker the old ones */
        const CkptChunkBuffers kept = r->buf;
        r->buf = r->workers[last_by];
        r->workers[last_by] = kept;
        r->raw_tensor = t;
        r->raw_chunk = list[n - 1];
    }
    return 0;
}

int ckpt_reader_read(CkptReader *r, const CkptTensorMeta *t, const int64_t *start, const int64_t *shape, float *dst,
                     char *err, size_t errlen) {
    return ckpt_reader_read_as(r, t, start, shape, CKPT_DTYPE_FP32, dst, err, errlen);
}

int ckpt_reader_read_as(CkptReader *r, const CkptTensorMeta *t, const int64_t *start, const int64_t *shape,
                        CkptDType dtype, void *dst, char *err, size_t errlen) {
    if (ckpt_dtype_size(t->dtype) == 0 || ckpt_dtype_size(dtype) == 0) {
        mt_set_error(err, errlen, "%s: tensor '%s' is %s and cannot be loaded as %s", r->dir, t->name,
                     ckpt_dtype_name(t->dtype), ckpt_dtype_name(dtype));
        return -1;
    }
    for (int d = 0; d < t->ndim; d++)
        if (start[d] < 0 || shape[d] < 1 || start[d] + shape[d] > t->shape[d]) {
            mt_set_error(err, errlen, "%s: tensor '%s': region outside the tensor in dimension %d", r->dir, t->name, d);
            return -1;
        }
    int *list = mt_malloc((size_t)(t->num_chunks ? t->num_chunks : 1) * sizeof *list), n = 0;
    for (int c = 0; c < t->num_chunks; c++)
        if (intersects(t->ndim, t->chunks[c].start, t->chunks[c].shape, start, shape)) list[n++] = c;
    int rc = 0;
    if (n > 1 && max_threads() > 1) {
        rc = read_chunks_parallel(r, t, list, n, start, shape, dtype, dst, err, errlen);
    } else {
        for (int k = 0; k < n && rc == 0; k++) {
            rc = load_chunk(r, t, list[k], err, errlen);
            if (rc == 0) place_chunk(&r->buf, t, list[k], start, shape, dtype, dst);
        }
    }
    free(list);
    return rc;
}

int ckpt_reader_verify_tensor(CkptReader *r, const CkptTensorMeta *t, char *err, size_t errlen) {
    for (int c = 0; c < t->num_chunks; c++)
        if (load_chunk(r, t, c, err, errlen) != 0) return -1;
    return 0;
}

int ckpt_reader_verify_file(CkptReader *r, int index, char *err, size_t errlen) {
    const CkptFileMeta *f = &r->meta.files[index];
    int fd = file_fd(r, (uint32_t)index, err, errlen);
    if (fd < 0) return -1;
    char path[MT_PATH_MAX + CKPT_NAME_MAX + 2];
    ckpt_file_path(path, sizeof path, r->dir, f->name);
    const size_t block = (size_t)1 << 22;
    unsigned char *buf = mt_malloc(block);
    uint32_t crc = 0;
    int rc = 0;
    for (uint64_t offset = 0; offset < f->size;) {
        size_t n = f->size - offset < block ? (size_t)(f->size - offset) : block;
        int got = read_exact(fd, buf, n, offset);
        if (got != 0) {
            char why[256];
            mt_set_error(err, errlen, "%s: read failed: %s", path, read_failure(got, fd, f, why, sizeof why));
            rc = -1;
            break;
        }
        crc = crc32c(crc, buf, n);
        offset += n;
    }
    free(buf);
    if (rc == 0 && crc != f->crc32c) {
        mt_set_error(err, errlen, "%s: checksum mismatch (stored %08x, computed %08x): the file is corrupt", path,
                     f->crc32c, crc);
        rc = -1;
    }
    return rc;
}
