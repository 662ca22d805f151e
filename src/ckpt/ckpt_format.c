/* ckpt_format.c: encoding metadata.mtck (see ckpt_format.h; decoding is in
 * ckpt_format_decode.c), and the names and sizes of dtypes and filters.
 *
 * Records of format 1, in this order (readers skip unknown tags):
 *   INFO  u32 num_ranks, i64 iteration, i64 created_unix, str writer
 *   STAT  i64 step, consumed_samples, consumed_tokens, u64 rng[4],
 *         i64 optimizer_step, total_steps, next_global_batch_size, f64 next_lr   (runs only)
 *   BASE  str dir (absolute, 1..1023 bytes), u32 crc32c of dir/metadata.mtck
 *         (a LoRA run's checkpoint that references its frozen base instead of storing it)
 *   DATA  u32 count, then per dataset: str split ("train" | "valid" | "test"), str path (1..1023 bytes),
 *         i64 documents, u64 idx_bytes, u64 bin_bytes, u32 crc32c   (runs only)
 *   FILE  u32 count, then per file: str name, str role, u64 size, u32 crc32c
 *   TENS  u32 count, then per tensor: str name, str dtype, u32 ndim, i64 shape[ndim],
 *         u32 num_chunks, then per chunk: u32 file, u64 offset, u64 stored_bytes,
 *         u64 raw_bytes, u32 crc32c, str codec ("zstd"), str filter,
 *         i64 start[ndim], i64 chunk_shape[ndim]
 */
#include "ckpt_format.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../core/crc32c.h"

const char *const ckpt_dtype_names[CKPT_NUM_DTYPES] = {"fp32", "bf16"};
const char *const ckpt_filter_names[CKPT_NUM_FILTERS] = {"none", "shuffle4"};
const char *const ckpt_role_names[CKPT_NUM_ROLES] = {"shard", "model_config", "recipe", "hf"};
static const size_t dtype_sizes[] = {4, 2};
#define MAX_NUMEL (INT64_C(1) << 56)

size_t ckpt_dtype_size(CkptDType dtype) { return (unsigned)dtype < CKPT_NUM_DTYPES ? dtype_sizes[dtype] : 0; }
const char *ckpt_dtype_name(CkptDType dtype) { return (unsigned)dtype < CKPT_NUM_DTYPES ? ckpt_dtype_names[dtype] : "?"; }
const char *ckpt_filter_name(CkptFilter filter) { return (unsigned)filter < CKPT_NUM_FILTERS ? ckpt_filter_names[filter] : "?"; }

int64_t ckpt_numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] <= 0 || n > MAX_NUMEL / shape[d]) return -1;
        n *= shape[d];
    }
    return n;
}

/* ---- encoding ---- */

typedef struct Buf {
    unsigned char *data;
    size_t len, cap;
} Buf;

static void put(Buf *b, const void *bytes, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        b->data = mt_realloc(b->data, cap);
        b->cap = cap;
    }
    memcpy(b->data + b->len, bytes, n);
    b->len += n;
}
static void put_u32(Buf *b, uint32_t v) {
    unsigned char x[4];
    for (int i = 0; i < 4; i++) x[i] = (unsigned char)(v >> (8 * i));
    put(b, x, 4);
}
static void put_u64(Buf *b, uint64_t v) {
    unsigned char x[8];
    for (int i = 0; i < 8; i++) x[i] = (unsigned char)(v >> (8 * i));
    put(b, x, 8);
}
static void put_i64(Buf *b, int64_t v) { put_u64(b, (uint64_t)v); }
static void put_f64(Buf *b, double v) {
    uint64_t bits;
    memcpy(&bits, &v, 8);
    put_u64(b, bits);
}
static void put_str(Buf *b, const char *s) {
    size_t n = strlen(s);
    put_u32(b, (uint32_t)n);
    put(b, s, n);
}
/* Start a record: tag and a length patched by end_record. */
static size_t begin_record(Buf *b, const char *tag) {
    put(b, tag, 4);
    put_u64(b, 0);
    return b->len;
}
static void end_record(Buf *b, size_t start) {
    uint64_t n = b->len - start;
    for (int i = 0; i < 8; i++) b->data[start - 8 + i] = (unsigned char)(n >> (8 * i));
}

int ckpt_meta_encode(const CkptMeta *meta, unsigned char **out, size_t *out_len, char *err, size_t errlen) {
    Buf b = {0};
    put(&b, CKPT_MAGIC, 8);
    put_u32(&b, CKPT_FORMAT_VERSION);
    put_u32(&b, 0); /* body CRC, patched below */
    put_u64(&b, 0); /* body length, patched below */

    size_t r = begin_record(&b, "INFO");
    put_u32(&b, meta->num_ranks);
    put_i64(&b, meta->iteration);
    put_i64(&b, meta->created_unix);
    put_str(&b, meta->writer ? meta->writer : "");
    end_record(&b, r);

    if (meta->has_state) {
        const CkptState *s = &meta->state;
        r = begin_record(&b, "STAT");
        put_i64(&b, s->step);
        put_i64(&b, s->consumed_samples);
        put_i64(&b, s->consumed_tokens);
        for (int i = 0; i < 4; i++) put_u64(&b, s->rng[i]);
        put_i64(&b, s->optimizer_step);
        put_i64(&b, s->total_steps);
        put_i64(&b, s->next_global_batch_size);
        put_f64(&b, s->next_lr);
        end_record(&b, r);
    }

    if (meta->base.present) {
        const size_t n = strnlen(meta->base.dir, sizeof meta->base.dir);
        if (n == 0 || n > CKPT_BASE_DIR_MAX || meta->base.dir[0] != '/') {
            mt_set_error(err, errlen, "base directory '%.*s': expected an absolute path of 1..%d bytes", (int)n,
                         meta->base.dir, CKPT_BASE_DIR_MAX);
            free(b.data);
            return -1;
        }
        r = begin_record(&b, "BASE");
        put_str(&b, meta->base.dir);
        put_u32(&b, meta->base.metadata_crc32c);
        end_record(&b, r);
    }

    if (meta->num_datasets > 0) {
        if (meta->num_datasets > CKPT_MAX_DATASETS) {
            mt_set_error(err, errlen, "%d datasets: at most %d are recorded", meta->num_datasets, CKPT_MAX_DATASETS);
            free(b.data);
            return -1;
        }
        r = begin_record(&b, "DATA");
        put_u32(&b, (uint32_t)meta->num_datasets);
        for (int i = 0; i < meta->num_datasets; i++) {
            const CkptDataset *d = &meta->datasets[i];
            put_str(&b, d->split);
            put_str(&b, d->path);
            put_i64(&b, d->documents);
            put_u64(&b, d->idx_bytes);
            put_u64(&b, d->bin_bytes);
            put_u32(&b, d->crc32c);
        }
        end_record(&b, r);
    }

    r = begin_record(&b, "FILE");
    put_u32(&b, (uint32_t)meta->num_files);
    for (int i = 0; i < meta->num_files; i++) {
        const CkptFileMeta *f = &meta->files[i];
        put_str(&b, f->name);
        put_str(&b, ckpt_role_names[f->role]);
        put_u64(&b, f->size);
        put_u32(&b, f->crc32c);
    }
    end_record(&b, r);

    r = begin_record(&b, "TENS");
    put_u32(&b, (uint32_t)meta->num_tensors);
    for (int i = 0; i < meta->num_tensors; i++) {
        const CkptTensorMeta *t = &meta->tensors[i];
        if (strlen(t->name) == 0 || strlen(t->name) > CKPT_NAME_MAX || t->ndim < 1 || t->ndim > CKPT_MAX_DIMS) {
            mt_set_error(err, errlen, "tensor '%s': the name must have 1..%d bytes and the tensor 1..%d dimensions",
                         t->name, CKPT_NAME_MAX, CKPT_MAX_DIMS);
            free(b.data);
            return -1;
        }
        put_str(&b, t->name);
        put_str(&b, ckpt_dtype_name(t->dtype));
        put_u32(&b, (uint32_t)t->ndim);
        for (int d = 0; d < t->ndim; d++) put_i64(&b, t->shape[d]);
        put_u32(&b, (uint32_t)t->num_chunks);
        for (int c = 0; c < t->num_chunks; c++) {
            const CkptChunk *ch = &t->chunks[c];
            put_u32(&b, ch->file);
            put_u64(&b, ch->offset);
            put_u64(&b, ch->stored_bytes);
            put_u64(&b, ch->raw_bytes);
            put_u32(&b, ch->crc32c);
            put_str(&b, CKPT_CODEC_ZSTD);
            put_str(&b, ckpt_filter_name(ch->filter));
            for (int d = 0; d < t->ndim; d++) put_i64(&b, ch->start[d]);
            for (int d = 0; d < t->ndim; d++) put_i64(&b, ch->shape[d]);
        }
    }
    end_record(&b, r);

    uint64_t body_len = b.len - CKPT_HEADER_BYTES;
    uint32_t crc = crc32c(0, b.data + CKPT_HEADER_BYTES, body_len);
    for (int i = 0; i < 4; i++) b.data[12 + i] = (unsigned char)(crc >> (8 * i));
    for (int i = 0; i < 8; i++) b.data[16 + i] = (unsigned char)(body_len >> (8 * i));
    *out = b.data;
    *out_len = b.len;
    return 0;
}
