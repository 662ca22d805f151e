/* indexed_dataset.c: reader for Megatron-LM's MMIDIDX indexed dataset.
 *
 * PREFIX.idx and PREFIX.bin are mmapped read-only (the .idx's arrays, at
 * unaligned offsets, are read through the header's accessors). Every header
 * field and every sequence is checked so a bad file is an error naming the
 * file, never a crash.
 */
#include "indexed_dataset.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/crc32c.h"
#include "../core/error.h"
#include "../core/fs.h"
#include "indexed_dataset_format.h"

int indexed_dtype_size(int dtype_code) {
    switch (dtype_code) {
    case IDX_DTYPE_UINT8: case IDX_DTYPE_INT8: return 1;
    case IDX_DTYPE_INT16: case IDX_DTYPE_UINT16: return 2;
    case IDX_DTYPE_INT32: case IDX_DTYPE_FLOAT32: return 4;
    case IDX_DTYPE_INT64: case IDX_DTYPE_FLOAT64: return 8;
    default: return 0;
    }
}

const char *indexed_dtype_name(int dtype_code) {
    static const char *const names[] = {"?",     "uint8",   "int8",    "int16", "int32",
                                        "int64", "float64", "float32", "uint16"};
    return (dtype_code >= 1 && dtype_code <= 8) ? names[dtype_code] : "unknown";
}

static uint64_t read_u64_le(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Decimal text of v into buf (40 digits at most). */
static const char *format_u128(unsigned __int128 v, char buf[48]) {
    char *p = buf + 47;
    *p = '\0';
    do {
        *--p = (char)('0' + (int)(v % 10));
        v /= 10;
    } while (v);
    return p;
}

/* Whether warning `what` of `path` is met for the first time (of up to 64 remembered): a dataset's warnings are
 * said once by each process (to stderr, also under `eval`, which silences its log), not by each of the loaders
 * (train, validation, test) that open it. */
static bool first_warning(const char *path, char what) {
    static uint64_t seen[64];
    static int count;
    uint64_t h = 0xcbf29ce484222325ULL ^ (uint8_t)what;
    for (const char *c = path; *c; c++) h = (h ^ (uint8_t)*c) * 0x100000001b3ULL;
    for (int i = 0; i < count; i++)
        if (seen[i] == h) return false;
    if (count < 64) seen[count++] = h;
    return true;
}

/* pread exactly n bytes; 0 on success. */
static int read_exact(int fd, void *buf, size_t n, off_t at) {
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t got = pread(fd, p, n, at);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1;
        p += got;
        n -= (size_t)got;
        at += got;
    }
    return 0;
}

/* Read and check PREFIX.idx's header, and map the file into ds (its arrays read through the accessors). */
static int open_index(IndexedDataset *ds, const char *path, char *err, size_t errlen) {
    uint64_t file_size = 0;
    int fd = mt_open_regular(path, NULL, &file_size, err, errlen); /* a FIFO is refused, not waited on */
    if (fd < 0) return -1;
    uint8_t header[IDX_HEADER_BYTES];
    int rc = -1;
    if (file_size < IDX_HEADER_BYTES || read_exact(fd, header, IDX_HEADER_BYTES, 0) != 0) {
        mt_set_error(err, errlen, "%s: truncated index: %llu bytes, the header alone needs %d", path,
                     (unsigned long long)file_size, IDX_HEADER_BYTES);
        goto done;
    }
    if (memcmp(header, IDX_MAGIC, IDX_MAGIC_BYTES) != 0) {
        mt_set_error(err, errlen, "%s: not a Megatron indexed dataset (bad magic; expected \"MMIDIDX\\0\\0\")",
                     path);
        goto done;
    }
    uint64_t version = read_u64_le(header + 9);
    if (version != IDX_VERSION) {
        mt_set_error(err, errlen, "%s: unsupported index version %llu (expected %d)", path,
                     (unsigned long long)version, IDX_VERSION);
        goto done;
    }
    int dtype = header[17];
    if (indexed_dtype_size(dtype) == 0) {
        mt_set_error(err, errlen, "%s: unknown token dtype code %d (expected 1..8)", path, dtype);
        goto done;
    }
    if (dtype == IDX_DTYPE_FLOAT32 || dtype == IDX_DTYPE_FLOAT64) {
        mt_set_error(err, errlen, "%s: token dtype %s is not supported (tokens must be integers)", path,
                     indexed_dtype_name(dtype));
        goto done;
    }
    uint64_t n = read_u64_le(header + 18), d = read_u64_le(header + 26);
    /* 34 + 12 n + 8 d < 2^69: exact in 128 bits, whatever the header claims */
    unsigned __int128 need = (unsigned __int128)IDX_HEADER_BYTES + (unsigned __int128)12 * n + (unsigned __int128)8 * d;
    if (need > file_size) {
        char need_text[48];
        mt_set_error(err, errlen,
                     "%s: truncated index: %llu sequences and %llu document entries need %s bytes, file has %llu",
                     path, (unsigned long long)n, (unsigned long long)d, format_u128(need, need_text),
                     (unsigned long long)file_size);
        goto done;
    }
    if (d < 1) {
        mt_set_error(err, errlen, "%s: document index is empty (it must start with 0)", path);
        goto done;
    }
    if (need < file_size && first_warning(path, 'm')) { /* Megatron's multimodal datasets keep a mode byte a sequence there */
        const unsigned long long extra = (unsigned long long)(file_size - (uint64_t)need);
        mt_log_warn("%s: %llu bytes after the document index%s; megatrain reads the tokens as text and ignores them",
                    path, extra, extra == n ? " (one a sequence: a Megatron multimodal dataset's sequence modes)" : "");
    }
    void *map = mmap(NULL, (size_t)file_size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        mt_set_error(err, errlen, "%s: cannot mmap: %s", path, strerror(errno));
        goto done;
    }
    (void)madvise(map, (size_t)file_size, MADV_WILLNEED); /* the checks below read it all */
    ds->dtype_code = dtype;
    ds->token_size = indexed_dtype_size(dtype);
    ds->num_sequences = (int64_t)n;
    ds->num_documents_plus_one = (int64_t)d;
    ds->lengths_at = (const uint8_t *)map + IDX_HEADER_BYTES;
    ds->offsets_at = ds->lengths_at + 4 * n;
    ds->documents_at = ds->offsets_at + 8 * n;
    ds->idx_map = map;
    ds->idx_map_size = (size_t)file_size;
    rc = 0;
done:
    close(fd);
    return rc;
}

static int open_bin(IndexedDataset *ds, const char *path, char *err, size_t errlen) {
    uint64_t file_size = 0;
    int fd = mt_open_regular(path, NULL, &file_size, err, errlen); /* a FIFO is refused, not waited on */
    if (fd < 0) return -1;
    ds->bin_size = (size_t)file_size;
    ds->bin = NULL;
    if (ds->bin_size > 0) {
        void *map = mmap(NULL, ds->bin_size, PROT_READ, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) {
            mt_set_error(err, errlen, "%s: cannot mmap: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
        ds->bin = map;
    }
    close(fd);
    return 0;
}

/* Every sequence inside .bin and token-aligned; document index sane. */
static int check_contents(const IndexedDataset *ds, const char *idx_path, const char *bin_path, char *err,
                          size_t errlen) {
    int64_t ts = ds->token_size;
    for (int64_t i = 0; i < ds->num_sequences; i++) {
        int64_t len = indexed_length(ds, i), off = indexed_offset(ds, i);
        if (len < 0 || off < 0 || off % ts != 0) {
            mt_set_error(err, errlen, "%s: sequence %lld has length %lld and byte offset %lld (expected >= 0, "
                         "offset a multiple of %lld)", idx_path, (long long)i, (long long)len, (long long)off,
                         (long long)ts);
            return -1;
        }
        if ((uint64_t)off > ds->bin_size || (uint64_t)len > (ds->bin_size - (uint64_t)off) / (uint64_t)ts) {
            mt_set_error(err, errlen, "%s: sequence %lld (%lld tokens of %lld bytes from byte %lld) lies outside the "
                         "file (%zu bytes); truncated or mismatched with %s", bin_path, (long long)i, (long long)len,
                         (long long)ts, (long long)off, ds->bin_size, idx_path);
            return -1;
        }
    }
    if (indexed_document(ds, 0) != 0) {
        mt_set_error(err, errlen, "%s: document index starts with %lld (expected 0)", idx_path,
                     (long long)indexed_document(ds, 0));
        return -1;
    }
    for (int64_t j = 1; j < ds->num_documents_plus_one; j++) {
        const int64_t doc = indexed_document(ds, j);
        if (doc < indexed_document(ds, j - 1) || doc > ds->num_sequences) {
            mt_set_error(err, errlen, "%s: document index entry %lld is %lld (expected non-decreasing, <= %lld "
                         "sequences)", idx_path, (long long)j, (long long)doc, (long long)ds->num_sequences);
            return -1;
        }
    }
    const int64_t last = indexed_document(ds, ds->num_documents_plus_one - 1);
    if (last != ds->num_sequences && first_warning(idx_path, 'd')) /* Megatron's builder ends it there; its reader skips them */
        mt_log_warn("%s: the document index ends at sequence %lld of %lld: the last %lld sequences belong to no "
                    "document and are not used", idx_path, (long long)last, (long long)ds->num_sequences,
                    (long long)(ds->num_sequences - last));
    return 0;
}

int indexed_dataset_open(IndexedDataset *ds, const char *prefix, char *err, size_t errlen) {
    memset(ds, 0, sizeof(*ds));
    char idx_path[1100], bin_path[1100];
    if (strlen(prefix) >= sizeof(ds->prefix)) {
        mt_set_error(err, errlen, "%s: dataset prefix too long", prefix);
        return -1;
    }
    strcpy(ds->prefix, prefix);
    snprintf(idx_path, sizeof(idx_path), "%s.idx", prefix);
    snprintf(bin_path, sizeof(bin_path), "%s.bin", prefix);
    if (open_index(ds, idx_path, err, errlen) != 0) {
        /* PREFIX.idx given for PREFIX: say which prefix the files name */
        const size_t n = strlen(prefix);
        struct stat sb;
        if (n > 4 && (!strcmp(prefix + n - 4, ".idx") || !strcmp(prefix + n - 4, ".bin")) && stat(idx_path, &sb) != 0) {
            const size_t used = strlen(err);
            snprintf(err + used, errlen > used ? errlen - used : 0, " (a dataset is named by its prefix, without "
                     ".bin or .idx: %.*s)", (int)(n - 4), prefix);
        }
        return -1;
    }
    if (open_bin(ds, bin_path, err, errlen) != 0 || check_contents(ds, idx_path, bin_path, err, errlen) != 0) {
        indexed_dataset_close(ds);
        return -1;
    }
    return 0;
}

void indexed_dataset_close(IndexedDataset *ds) {
    if (ds->bin) munmap((void *)ds->bin, ds->bin_size);
    if (ds->idx_map) munmap(ds->idx_map, ds->idx_map_size);
    memset(ds, 0, sizeof(*ds));
}

/* Read [p, p + n) of a mapping ahead, in large reads: the loader's MADV_RANDOM (indexed_dataset_advise_random)
 * would otherwise fault it in one page per read (512 synchronous reads a MiB on a cold file). Advice only. */
static void read_ahead(const uint8_t *p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), start = (uintptr_t)p & ~(page - 1);
    if (n > 0) (void)madvise((void *)start, (uintptr_t)p + n - start, MADV_WILLNEED);
}

/* The .idx whole, then the .bin's first and last MiB (the .bin whole below 2 MiB). */
static uint32_t contents_crc(uint32_t crc, const IndexedDataset *ds) {
    enum { END_BYTES = 1 << 20 };
    crc = crc32c(crc, ds->idx_map, ds->idx_map_size);
    if (ds->bin_size <= 2 * (size_t)END_BYTES) {
        if (!ds->bin) return crc;
        read_ahead(ds->bin, ds->bin_size);
        return crc32c(crc, ds->bin, ds->bin_size);
    }
    read_ahead(ds->bin, END_BYTES);
    read_ahead(ds->bin + ds->bin_size - END_BYTES, END_BYTES);
    crc = crc32c(crc, ds->bin, END_BYTES);
    return crc32c(crc, ds->bin + ds->bin_size - END_BYTES, END_BYTES);
}

DatasetFingerprint indexed_dataset_fingerprint(const IndexedDataset *ds, const IndexedDataset *mask) {
    DatasetFingerprint fp = {.documents = ds->num_documents_plus_one - 1, .idx_bytes = ds->idx_map_size,
                             .bin_bytes = ds->bin_size, .crc32c = contents_crc(0, ds)};
    if (mask) {
        fp.idx_bytes += mask->idx_map_size;
        fp.bin_bytes += mask->bin_size;
        fp.crc32c = contents_crc(fp.crc32c, mask);
    }
    return fp;
}

void indexed_dataset_advise_random(const IndexedDataset *ds) {
    if (ds->bin && ds->bin_size > 0) (void)madvise((void *)ds->bin, ds->bin_size, MADV_RANDOM); /* advice only */
}

void indexed_dataset_advise_sequential(const IndexedDataset *ds, size_t bytes) {
    if (bytes > ds->bin_size) bytes = ds->bin_size;
    if (ds->bin && bytes > 0) (void)madvise((void *)ds->bin, bytes, MADV_SEQUENTIAL);
}

void indexed_dataset_read(const IndexedDataset *ds, int64_t seq, int64_t offset, int64_t count, int32_t *out) {
    if (count <= 0) return; /* nothing to read; with an empty .bin, ds->bin is NULL */
    const uint8_t *base = ds->bin + indexed_offset(ds, seq) + offset * ds->token_size;
    switch (ds->dtype_code) {
    case IDX_DTYPE_UINT8: for (int64_t i = 0; i < count; i++) out[i] = base[i]; break;
    case IDX_DTYPE_INT8: for (int64_t i = 0; i < count; i++) out[i] = ((const int8_t *)base)[i]; break;
    case IDX_DTYPE_UINT16: for (int64_t i = 0; i < count; i++) out[i] = ((const uint16_t *)base)[i]; break;
    case IDX_DTYPE_INT16: for (int64_t i = 0; i < count; i++) out[i] = ((const int16_t *)base)[i]; break;
    case IDX_DTYPE_INT32: memcpy(out, base, (size_t)count * 4); break;
    case IDX_DTYPE_INT64: /* an id beyond int32 reads as -1, outside every vocabulary (cut to 32 bits it could be inside) */
        for (int64_t i = 0; i < count; i++) {
            const int64_t id = ((const int64_t *)base)[i];
            out[i] = id >= INT32_MIN && id <= INT32_MAX ? (int32_t)id : -1;
        }
        break;
    default: memset(out, 0, (size_t)count * sizeof(*out)); break;
    }
}
