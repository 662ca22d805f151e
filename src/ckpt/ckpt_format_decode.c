/* ckpt_format_decode.c: decoding and validating metadata.mtck (the records
 * are listed in ckpt_format.c). The decoder trusts nothing: every length is
 * checked against what is left, counts are bounded by the bytes they need,
 * and the tensors' chunks must lie inside their tensor, reference a shard
 * file within its recorded size, not overlap, and cover the tensor. */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "ckpt_format.h"
#include "../core/crc32c.h"

typedef struct Cursor {
    const unsigned char *p, *end;
    char *err;
    size_t errlen;
    bool failed;
    const char *where; /* record being read, for messages */
} Cursor;

static void fail(Cursor *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(Cursor *c, const char *fmt, ...) {
    if (c->failed) return;
    c->failed = true;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mt_set_error(c->err, c->errlen, "metadata record %s: %s", c->where, msg);
}
static size_t left(const Cursor *c) { return (size_t)(c->end - c->p); }
static bool take(Cursor *c, size_t n, const char *what) {
    if (c->failed) return false;
    if (left(c) < n) {
        fail(c, "truncated (reading %s)", what);
        return false;
    }
    return true;
}
static uint64_t get_u64(Cursor *c, const char *what) {
    if (!take(c, 8, what)) return 0;
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)c->p[i] << (8 * i);
    c->p += 8;
    return v;
}
static uint32_t get_u32(Cursor *c, const char *what) {
    if (!take(c, 4, what)) return 0;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)c->p[i] << (8 * i);
    c->p += 4;
    return v;
}
static int64_t get_i64(Cursor *c, const char *what) { return (int64_t)get_u64(c, what); }
static double get_f64(Cursor *c, const char *what) {
    uint64_t bits = get_u64(c, what);
    double v;
    memcpy(&v, &bits, 8);
    return v;
}
/* A string of at most max bytes without NULs, malloc'ed (NULL on failure). */
static char *get_str(Cursor *c, size_t max, const char *what) {
    uint32_t n = get_u32(c, what);
    if (c->failed) return NULL;
    if (n > max) {
        fail(c, "%s: %u bytes long (at most %zu expected)", what, n, max);
        return NULL;
    }
    if (!take(c, n, what)) return NULL;
    if (memchr(c->p, '\0', n)) {
        fail(c, "%s: contains a NUL byte", what);
        return NULL;
    }
    char *s = mt_malloc((size_t)n + 1);
    memcpy(s, c->p, n);
    s[n] = '\0';
    c->p += n;
    return s;
}
/* Index of `s` in names[0..count), or -1 (with a message naming `what`). */
static int get_name_index(Cursor *c, const char *const *names, int count, const char *what) {
    char *s = get_str(c, 32, what);
    if (!s) return -1;
    for (int i = 0; i < count; i++)
        if (strcmp(s, names[i]) == 0) {
            free(s);
            return i;
        }
    fail(c, "unknown %s '%s' (written by a newer megatrain?)", what, s);
    free(s);
    return -1;
}

static void decode_info(Cursor *c, CkptMeta *m) {
    m->num_ranks = get_u32(c, "num_ranks");
    m->iteration = get_i64(c, "iteration");
    m->created_unix = get_i64(c, "created_unix");
    m->writer = get_str(c, CKPT_NAME_MAX, "writer");
    if (c->failed) return;
    if (m->num_ranks < 1) fail(c, "num_ranks is 0");
    else if (m->iteration < 0) fail(c, "negative iteration %lld", (long long)m->iteration);
}

static void decode_state(Cursor *c, CkptMeta *m) {
    CkptState *s = &m->state;
    s->step = get_i64(c, "step");
    s->consumed_samples = get_i64(c, "consumed_samples");
    s->consumed_tokens = get_i64(c, "consumed_tokens");
    for (int i = 0; i < 4; i++) s->rng[i] = get_u64(c, "rng");
    s->optimizer_step = get_i64(c, "optimizer_step");
    s->total_steps = get_i64(c, "total_steps");
    s->next_global_batch_size = get_i64(c, "next_global_batch_size");
    s->next_lr = get_f64(c, "next_lr");
    if (c->failed) return;
    /* what a run writes: counters far below 2^53 (9e15 tokens), an update at most per step, a token at least per
     * sample; other values (a crafted record whose CRC was made to match) would overflow the step's arithmetic */
    const int64_t most = (int64_t)1 << 53;
    if (s->step < 0 || s->consumed_samples < 0 || s->consumed_tokens < 0 || s->optimizer_step < 0)
        fail(c, "negative progress counters");
    else if (s->step > most || s->consumed_samples > most || s->consumed_tokens > most)
        fail(c, "progress counters beyond 2^53 (step %lld, samples %lld, tokens %lld)", (long long)s->step,
             (long long)s->consumed_samples, (long long)s->consumed_tokens);
    else if (s->optimizer_step > s->step || s->consumed_samples > s->consumed_tokens)
        fail(c, "inconsistent progress counters (step %lld, optimizer step %lld, samples %lld, tokens %lld)",
             (long long)s->step, (long long)s->optimizer_step, (long long)s->consumed_samples,
             (long long)s->consumed_tokens);
    m->has_state = true;
}

/* BASE: exactly a non-empty absolute path of at most CKPT_BASE_DIR_MAX bytes and a CRC, nothing after them. */
static void decode_base(Cursor *c, CkptMeta *m) {
    char *dir = get_str(c, CKPT_BASE_DIR_MAX, "base directory");
    m->base.metadata_crc32c = get_u32(c, "base metadata crc32c");
    if (!c->failed && dir[0] != '/') fail(c, "base directory '%s' is not an absolute path", dir);
    else if (!c->failed && left(c) > 0) fail(c, "%zu bytes after its fields", left(c));
    if (!c->failed) {
        memcpy(m->base.dir, dir, strlen(dir) + 1);
        m->base.present = true;
    }
    free(dir);
}

/* DATA: a count, then each dataset's split ("train" | "valid" | "test"; a reader before data.test drops a record
 * with "test", as below), a non-empty prefix, its counts and CRC; nothing after them. */
static void decode_datasets(Cursor *c, CkptMeta *m) {
    static const char *const splits[] = {"train", "valid", "test"};
    uint32_t count = get_u32(c, "dataset count");
    if (c->failed) return;
    if (count == 0 || count > CKPT_MAX_DATASETS || count > left(c) / 40) { /* a dataset takes at least 40 bytes */
        fail(c, "dataset count %u does not fit the record", count);
        return;
    }
    m->datasets = mt_calloc(count, sizeof *m->datasets);
    for (uint32_t i = 0; i < count && !c->failed; i++) {
        CkptDataset *d = &m->datasets[i];
        const int split = get_name_index(c, splits, 3, "dataset split");
        char *path = get_str(c, CKPT_BASE_DIR_MAX, "dataset path");
        d->documents = get_i64(c, "dataset documents");
        d->idx_bytes = get_u64(c, "dataset idx bytes");
        d->bin_bytes = get_u64(c, "dataset bin bytes");
        d->crc32c = get_u32(c, "dataset crc32c");
        if (!c->failed && path[0] == '\0') fail(c, "an empty dataset path");
        else if (!c->failed && d->documents < 0) fail(c, "dataset %s: %lld documents", path, (long long)d->documents);
        if (!c->failed) {
            snprintf(d->split, sizeof d->split, "%s", splits[split]);
            memcpy(d->path, path, strlen(path) + 1);
            m->num_datasets = (int)i + 1;
        }
        free(path);
    }
    if (!c->failed && left(c) > 0) fail(c, "%zu bytes after its datasets", left(c));
}

/* DATA feeds only resume's warning: a record this reader cannot decode (a split or a field of a later version, or
 * damage the body's CRC missed) is dropped, with meta->datasets_unreadable set, rather than making the whole
 * checkpoint unreadable (resume would move it aside as corrupt). */
static void decode_datasets_leniently(Cursor *c, CkptMeta *m) {
    decode_datasets(c, m);
    if (!c->failed) return;
    free(m->datasets);
    m->datasets = NULL;
    m->num_datasets = 0;
    m->datasets_unreadable = true;
    c->failed = false;
    if (c->errlen > 0) c->err[0] = '\0';
}

static bool valid_file_name(const char *name) {
    return name[0] != '\0' && !strchr(name, '/') && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

static void decode_files(Cursor *c, CkptMeta *m) {
    uint32_t count = get_u32(c, "file count");
    if (c->failed) return;
    if (count == 0 || count > left(c) / 20) { /* a file takes at least 20 bytes */
        fail(c, "file count %u does not fit the record", count);
        return;
    }
    m->files = mt_calloc(count, sizeof *m->files);
    for (uint32_t i = 0; i < count && !c->failed; i++) {
        CkptFileMeta *f = &m->files[i];
        f->name = get_str(c, CKPT_NAME_MAX, "file name");
        m->num_files = (int)i + 1;
        int role = get_name_index(c, ckpt_role_names, CKPT_NUM_ROLES, "file role");
        f->size = get_u64(c, "file size");
        f->crc32c = get_u32(c, "file crc32c");
        if (c->failed) return;
        f->role = (CkptFileRole)role;
        if (!valid_file_name(f->name)) fail(c, "bad file name '%s'", f->name);
        for (uint32_t j = 0; j < i && !c->failed; j++)
            if (strcmp(m->files[j].name, f->name) == 0) fail(c, "file '%s' listed twice", f->name);
    }
}

static bool boxes_overlap(int ndim, const CkptChunk *a, const CkptChunk *b) {
    for (int d = 0; d < ndim; d++)
        if (a->start[d] + a->shape[d] <= b->start[d] || b->start[d] + b->shape[d] <= a->start[d]) return false;
    return true;
}

static void decode_chunk(Cursor *c, const CkptMeta *m, CkptTensorMeta *t, CkptChunk *ch) {
    ch->file = get_u32(c, "chunk file");
    ch->offset = get_u64(c, "chunk offset");
    ch->stored_bytes = get_u64(c, "chunk stored_bytes");
    ch->raw_bytes = get_u64(c, "chunk raw_bytes");
    ch->crc32c = get_u32(c, "chunk crc32c");
    static const char *const codecs[] = {CKPT_CODEC_ZSTD};
    get_name_index(c, codecs, 1, "codec");
    int filter = get_name_index(c, ckpt_filter_names, CKPT_NUM_FILTERS, "filter");
    for (int d = 0; d < t->ndim; d++) ch->start[d] = get_i64(c, "chunk start");
    for (int d = 0; d < t->ndim; d++) ch->shape[d] = get_i64(c, "chunk shape");
    if (c->failed) return;
    ch->filter = (CkptFilter)filter;
    if (ch->file >= (uint32_t)m->num_files || m->files[ch->file].role != CKPT_FILE_SHARD) {
        fail(c, "tensor '%s': chunk refers to file %u, which is not a shard file", t->name, ch->file);
        return;
    }
    for (int d = 0; d < t->ndim; d++)
        if (ch->start[d] < 0 || ch->shape[d] < 1 || ch->start[d] > t->shape[d] - ch->shape[d]) {
            fail(c, "tensor '%s': a chunk lies outside the tensor in dimension %d", t->name, d);
            return;
        }
    int64_t numel = ckpt_numel(t->ndim, ch->shape);
    if (numel < 0 || ch->raw_bytes != (uint64_t)numel * ckpt_dtype_size(t->dtype)) {
        fail(c, "tensor '%s': a chunk's raw_bytes %llu does not match its shape", t->name,
             (unsigned long long)ch->raw_bytes);
        return;
    }
    if (ch->filter == CKPT_FILTER_SHUFFLE4 && ch->raw_bytes % 4 != 0) {
        fail(c, "tensor '%s': shuffle4 on %llu bytes (not a multiple of 4)", t->name, (unsigned long long)ch->raw_bytes);
        return;
    }
    const uint64_t file_size = m->files[ch->file].size;
    if (ch->stored_bytes == 0 || ch->offset > file_size || ch->stored_bytes > file_size - ch->offset)
        fail(c, "tensor '%s': a chunk's bytes %llu..%llu lie outside %s (%llu bytes)", t->name,
             (unsigned long long)ch->offset, (unsigned long long)(ch->offset + ch->stored_bytes),
             m->files[ch->file].name, (unsigned long long)file_size);
}

static void decode_tensor(Cursor *c, const CkptMeta *m, CkptTensorMeta *t) {
    t->name = get_str(c, CKPT_NAME_MAX, "tensor name");
    int dtype = get_name_index(c, ckpt_dtype_names, CKPT_NUM_DTYPES, "dtype");
    uint32_t ndim = get_u32(c, "ndim");
    if (c->failed) return;
    t->dtype = (CkptDType)dtype;
    if (t->name[0] == '\0' || ndim < 1 || ndim > CKPT_MAX_DIMS) {
        fail(c, "tensor '%s': %u dimensions (1..%d expected)", t->name, ndim, CKPT_MAX_DIMS);
        return;
    }
    t->ndim = (int)ndim;
    for (int d = 0; d < t->ndim; d++) t->shape[d] = get_i64(c, "shape");
    uint32_t num_chunks = get_u32(c, "chunk count");
    if (c->failed) return;
    int64_t numel = ckpt_numel(t->ndim, t->shape);
    if (numel < 0) {
        fail(c, "tensor '%s': bad shape", t->name);
        return;
    }
    if (num_chunks == 0 || num_chunks > left(c) / 36) { /* a chunk takes at least 36 bytes */
        fail(c, "tensor '%s': chunk count %u does not fit the record", t->name, num_chunks);
        return;
    }
    t->chunks = mt_calloc(num_chunks, sizeof *t->chunks);
    int64_t covered = 0;
    for (uint32_t k = 0; k < num_chunks && !c->failed; k++) {
        decode_chunk(c, m, t, &t->chunks[k]);
        t->num_chunks = (int)k + 1;
        if (!c->failed) covered += ckpt_numel(t->ndim, t->chunks[k].shape);
    }
    if (c->failed) return;
    for (int a = 0; a < t->num_chunks && !c->failed; a++)
        for (int b = a + 1; b < t->num_chunks; b++)
            if (boxes_overlap(t->ndim, &t->chunks[a], &t->chunks[b])) {
                fail(c, "tensor '%s': chunks %d and %d overlap", t->name, a, b);
                break;
            }
    if (!c->failed && covered != numel)
        fail(c, "tensor '%s': its chunks hold %lld of %lld elements", t->name, (long long)covered, (long long)numel);
}

static int compare_names(const void *a, const void *b, void *context) {
    const CkptMeta *m = context;
    return strcmp(m->tensors[*(const int *)a].name, m->tensors[*(const int *)b].name);
}

static void decode_tensors(Cursor *c, CkptMeta *m) {
    uint32_t count = get_u32(c, "tensor count");
    if (c->failed) return;
    if (count > left(c) / 20) {
        fail(c, "tensor count %u does not fit the record", count);
        return;
    }
    m->tensors = mt_calloc(count ? count : 1, sizeof *m->tensors);
    for (uint32_t i = 0; i < count && !c->failed; i++) {
        m->num_tensors = (int)i + 1;
        decode_tensor(c, m, &m->tensors[i]);
    }
    if (c->failed) return;
    m->by_name = mt_malloc((size_t)(count ? count : 1) * sizeof(int));
    for (int i = 0; i < m->num_tensors; i++) m->by_name[i] = i;
    qsort_r(m->by_name, (size_t)m->num_tensors, sizeof(int), compare_names, m);
    for (int i = 1; i < m->num_tensors; i++)
        if (strcmp(m->tensors[m->by_name[i - 1]].name, m->tensors[m->by_name[i]].name) == 0) {
            fail(c, "tensor '%s' listed twice", m->tensors[m->by_name[i]].name);
            return;
        }
}

static _Atomic unsigned newer_version;

unsigned ckpt_meta_newer(void) { return atomic_load(&newer_version); }
void ckpt_meta_newer_clear(void) { atomic_store(&newer_version, 0); }

int ckpt_meta_decode(const unsigned char *data, size_t len, CkptMeta *meta, char *err, size_t errlen) {
    memset(meta, 0, sizeof *meta);
    if (len < CKPT_HEADER_BYTES || memcmp(data, CKPT_MAGIC, 8) != 0) {
        mt_set_error(err, errlen, "not a megatrain checkpoint metadata file (%s)",
                     len < CKPT_HEADER_BYTES ? "too short" : "bad magic bytes");
        return -1;
    }
    Cursor header = {data + 8, data + CKPT_HEADER_BYTES, err, errlen, false, "header"};
    meta->version = get_u32(&header, "version");
    uint32_t crc = get_u32(&header, "crc");
    uint64_t body_len = get_u64(&header, "length");
    if (meta->version != CKPT_FORMAT_VERSION) {
        /* a newer megatrain's only where the rest of the header (which every version keeps) holds: the body's length
         * and CRC-32C, and a version a few above this one; a flipped bit or a torn header stays corrupt, and resume
         * goes on to an older checkpoint */
        const bool whole = body_len == len - CKPT_HEADER_BYTES && crc32c(0, data + CKPT_HEADER_BYTES, body_len) == crc;
        if (meta->version > CKPT_FORMAT_VERSION && meta->version <= CKPT_FORMAT_VERSION + CKPT_NEWER_VERSIONS && whole) {
            atomic_store(&newer_version, meta->version);
            mt_set_error(err, errlen, "format version %u (this megatrain reads version %d; a newer megatrain wrote "
                         "it)", meta->version, CKPT_FORMAT_VERSION);
        } else {
            mt_set_error(err, errlen, "format version %u (this megatrain reads version %d)%s: the file is corrupt",
                         meta->version, CKPT_FORMAT_VERSION, whole ? "" : ", and its length or checksum is off");
        }
        return -1;
    }
    if (body_len != len - CKPT_HEADER_BYTES) {
        mt_set_error(err, errlen, "metadata is %zu bytes, its header says %llu (truncated or padded)", len,
                     (unsigned long long)(body_len + CKPT_HEADER_BYTES));
        return -1;
    }
    uint32_t actual = crc32c(0, data + CKPT_HEADER_BYTES, body_len);
    if (actual != crc) {
        mt_set_error(err, errlen, "metadata checksum mismatch (stored %08x, computed %08x): the file is corrupt", crc,
                     actual);
        return -1;
    }
    Cursor body = {data + CKPT_HEADER_BYTES, data + len, err, errlen, false, "(body)"};
    int seen_info = 0, seen_state = 0, seen_base = 0, seen_data = 0, seen_files = 0, seen_tensors = 0;
    while (!body.failed && left(&body) > 0) {
        char tag[5] = {0};
        if (!take(&body, 12, "record header")) break;
        memcpy(tag, body.p, 4);
        body.p += 4;
        uint64_t n = get_u64(&body, "record length");
        if (n > left(&body)) {
            fail(&body, "record '%.4s' claims %llu bytes, %zu are left", tag, (unsigned long long)n, left(&body));
            break;
        }
        Cursor rec = {body.p, body.p + n, err, errlen, false, tag};
        body.p += n;
        /* a repeated record is refused before decoding it: decoding would overwrite (and leak) the first */
        int *seen = strcmp(tag, "INFO") == 0 ? &seen_info : strcmp(tag, "STAT") == 0 ? &seen_state
                  : strcmp(tag, "BASE") == 0 ? &seen_base : strcmp(tag, "DATA") == 0 ? &seen_data
                  : strcmp(tag, "FILE") == 0 ? &seen_files
                  : strcmp(tag, "TENS") == 0 ? &seen_tensors : NULL;
        if (!seen) continue; /* a record of a later version */
        if (*seen) {
            fail(&body, "record '%s' appears twice", tag);
            break;
        }
        *seen = 1;
        if (seen == &seen_info) decode_info(&rec, meta);
        else if (seen == &seen_state) decode_state(&rec, meta);
        else if (seen == &seen_base) decode_base(&rec, meta);
        else if (seen == &seen_data) decode_datasets_leniently(&rec, meta);
        else if (seen == &seen_files) decode_files(&rec, meta);
        else if (!seen_files) fail(&rec, "comes before the FILE record");
        else decode_tensors(&rec, meta);
        if (rec.failed) body.failed = true;
    }
    if (!body.failed && (!seen_info || !seen_files || !seen_tensors))
        fail(&body, "missing record %s", !seen_info ? "INFO" : !seen_files ? "FILE" : "TENS");
    if (body.failed) {
        ckpt_meta_free(meta);
        return -1;
    }
    return 0;
}

void ckpt_meta_free(CkptMeta *meta) {
    free(meta->writer);
    for (int i = 0; i < meta->num_files; i++) free(meta->files[i].name);
    free(meta->files);
    free(meta->datasets);
    for (int i = 0; i < meta->num_tensors; i++) {
        free(meta->tensors[i].name);
        free(meta->tensors[i].chunks);
    }
    free(meta->tensors);
    free(meta->by_name);
    memset(meta, 0, sizeof *meta);
}

const CkptTensorMeta *ckpt_meta_find(const CkptMeta *meta, const char *name) {
    if (!meta->by_name) return NULL;
    int lo = 0, hi = meta->num_tensors - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const CkptTensorMeta *t = &meta->tensors[meta->by_name[mid]];
        int cmp = strcmp(name, t->name);
        if (cmp == 0) return t;
        if (cmp < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}
