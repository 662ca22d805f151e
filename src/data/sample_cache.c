/* sample_cache.c: reads and writes GPT sample index cache files (see sample_cache.h). */
#include "sample_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/crc32c.h"
#include "../core/error.h"
#include "../core/fs.h"

#define CACHE_MAGIC "MTGPTIDX"
/* 2: sample order shuffled per epoch-sized block; 3: a CRC-32C of the file,
 * fsync'ed before the rename (files of older versions have other names and
 * are never read: the version is part of the key). */
#define CACHE_VERSION 3

typedef struct CacheHeader {
    char magic[8];
    uint64_t version;
    uint64_t key;
    int64_t first_sequence, end_sequence, num_epochs, document_index_len, num_samples;
    uint32_t crc; /* CRC-32C of this header (with crc 0) followed by the index block */
    uint32_t reserved; /* 0 */
} CacheHeader;

_Static_assert(sizeof(CacheHeader) == 72, "the cache header is 72 bytes");

/* The CRC-32C of the header h (its crc field taken as 0) and the block. */
static uint32_t cache_crc(const CacheHeader *h, const void *block, size_t block_bytes) {
    CacheHeader zeroed = *h;
    zeroed.crc = 0;
    return crc32c(crc32c(0, &zeroed, sizeof(zeroed)), block, block_bytes);
}

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

static uint64_t fnv1a_i64(uint64_t h, int64_t v) { return fnv1a(h, &v, sizeof(v)); }

int sample_cache_key(SampleCacheKey *key, const char *cache_dir, const IndexedDataset *ds, const char *split_name,
                     int64_t first_sequence, int64_t end_sequence, int seq_len, uint64_t seed,
                     int64_t num_samples, char *err, size_t errlen) {
    char idx_path[1100], absolute[PATH_MAX];
    struct stat st;
    snprintf(idx_path, sizeof(idx_path), "%s.idx", ds->prefix);
    if (stat(idx_path, &st) != 0 || !realpath(idx_path, absolute)) {
        mt_set_error(err, errlen, "%s: cannot stat: %s", idx_path, strerror(errno));
        return -1;
    }
    uint64_t h = 0xcbf29ce484222325ULL;
    h = fnv1a_i64(h, CACHE_VERSION);
    h = fnv1a(h, absolute, strlen(absolute) + 1);
    h = fnv1a_i64(h, (int64_t)st.st_size);
    h = fnv1a_i64(h, (int64_t)st.st_mtim.tv_sec);
    h = fnv1a_i64(h, (int64_t)st.st_mtim.tv_nsec);
    h = fnv1a_i64(h, (int64_t)ds->bin_size);
    h = fnv1a(h, split_name, strlen(split_name) + 1);
    h = fnv1a_i64(h, first_sequence);
    h = fnv1a_i64(h, end_sequence);
    h = fnv1a_i64(h, seq_len);
    h = fnv1a_i64(h, (int64_t)seed);
    h = fnv1a_i64(h, num_samples);
    key->hash = h;
    const char *base = strrchr(ds->prefix, '/');
    base = base ? base + 1 : ds->prefix;
    int n = snprintf(key->path, sizeof(key->path), "%s/%.200s-%s-%016llx.gptidx", cache_dir, base, split_name,
                     (unsigned long long)h);
    if (n < 0 || (size_t)n >= sizeof(key->path)) {
        mt_set_error(err, errlen, "%s: cache directory path too long", cache_dir);
        return -1;
    }
    return 0;
}

/* Map and check the open cache file fd into *out (its block in the mapping: every process that maps the file
 * shares its pages). Returns 0, or -1 with the reason in why (nothing mapped). */
static int read_cache(int fd, GptSampleIndex *out, const SampleCacheKey *key, const IndexedDataset *ds, char *why,
                      size_t whylen) {
    CacheHeader h;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        mt_set_error(why, whylen, "cannot stat: %s", strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        mt_set_error(why, whylen, "not a regular file");
        return -1;
    }
    if ((uint64_t)st.st_size < sizeof(h) || pread(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h)) {
        mt_set_error(why, whylen, "%lld bytes: shorter than its %zu-byte header", (long long)st.st_size, sizeof(h));
        return -1;
    }
    if (memcmp(h.magic, CACHE_MAGIC, 8) != 0) {
        mt_set_error(why, whylen, "not a sample index cache file");
        return -1;
    }
    if (h.version != CACHE_VERSION || h.key != key->hash) {
        mt_set_error(why, whylen, "its header says version %llu, key %016llx", (unsigned long long)h.version,
                     (unsigned long long)h.key);
        return -1;
    }
    if (h.document_index_len < 0 || h.num_samples <= 0 || h.document_index_len >= (INT64_C(1) << 40) ||
        h.num_samples >= (INT64_C(1) << 40)) {
        mt_set_error(why, whylen, "impossible sizes in its header");
        return -1;
    }
    GptSampleIndex loaded;
    memset(&loaded, 0, sizeof(loaded));
    loaded.block_bytes = gpt_index_block_bytes(h.document_index_len, h.num_samples);
    if ((uint64_t)st.st_size != sizeof(h) + loaded.block_bytes) {
        mt_set_error(why, whylen, "%lld bytes where its header says %llu", (long long)st.st_size,
                     (unsigned long long)(sizeof(h) + loaded.block_bytes));
        return -1;
    }
    loaded.first_sequence = h.first_sequence;
    loaded.end_sequence = h.end_sequence;
    loaded.num_epochs = h.num_epochs;
    loaded.document_index_len = h.document_index_len;
    loaded.num_samples = h.num_samples;
    loaded.map_bytes = (size_t)st.st_size;
    loaded.map = mmap(NULL, loaded.map_bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (loaded.map == MAP_FAILED) {
        mt_set_error(why, whylen, "cannot map: %s", strerror(errno));
        return -1;
    }
    loaded.block = (char *)loaded.map + sizeof(h); /* 72 bytes in: the arrays' 8-byte alignment holds */
    gpt_index_attach(&loaded);
    uint32_t crc = 0;
    if ((crc = cache_crc(&h, loaded.block, loaded.block_bytes)) != h.crc)
        mt_set_error(why, whylen, "CRC-32C %08x where its header says %08x", crc, h.crc);
    else if (gpt_index_validate(&loaded, ds) != 0)
        mt_set_error(why, whylen, "its index does not fit the dataset");
    else {
        *out = loaded;
        return 0;
    }
    munmap(loaded.map, loaded.map_bytes);
    return -1;
}

int sample_cache_load(GptSampleIndex *gi, const SampleCacheKey *key, const IndexedDataset *ds, char *why,
                      size_t whylen) {
    int fd = open(key->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO there is not waited on */
    if (fd < 0) {
        if (errno == ENOENT) return 1;
        mt_set_error(why, whylen, "cannot open: %s", strerror(errno));
        return -1;
    }
    int rc = read_cache(fd, gi, key, ds, why, whylen);
    close(fd); /* the mapping stays */
    return rc;
}

int sample_cache_save(const GptSampleIndex *gi, const SampleCacheKey *key, char *err, size_t errlen) {
    char temp[2100], dir[sizeof(key->path)];
    if (mt_make_parent_dirs(key->path, err, errlen) != 0) return -1;
    /* "FILE.tmp.HOST.PID": a run killed while writing it left one, which nothing else removes (an index's size
     * each: 392 MB for 4M samples), and a rank of another node writing the same file (its own cache_dir on a
     * shared file system) never has the same name */
    char first[sizeof(temp)];
    const int stale = mt_remove_stale_temps(key->path, first, sizeof(first));
    if (stale > 0)
        mt_log("data: removed %d temporary file(s) of a sample index cache write that was killed (%s)", stale, first);
    if (mt_temp_name_host(temp, sizeof(temp), key->path) != 0) {
        mt_set_error(err, errlen, "%s: path too long", key->path);
        return -1;
    }
    CacheHeader h;
    memset(&h, 0, sizeof(h));
    memcpy(h.magic, CACHE_MAGIC, 8);
    h.version = CACHE_VERSION;
    h.key = key->hash;
    h.first_sequence = gi->first_sequence;
    h.end_sequence = gi->end_sequence;
    h.num_epochs = gi->num_epochs;
    h.document_index_len = gi->document_index_len;
    h.num_samples = gi->num_samples;
    h.crc = cache_crc(&h, gi->block, gi->block_bytes);
    int fd = open(temp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) {
        mt_set_error(err, errlen, "%s: cannot create: %s", temp, strerror(errno));
        return -1;
    }
    /* The file reaches the disk before its name does (fsync, rename, fsync of
     * the directory): a crash leaves the old file, the new one, or a temporary. */
    if (mt_write_all(fd, &h, sizeof(h)) != 0 || mt_write_all(fd, gi->block, gi->block_bytes) != 0) {
        int saved_errno = errno;
        close(fd);
        unlink(temp);
        mt_set_error(err, errlen, "%s: cannot write the sample index cache: %s", key->path, strerror(saved_errno));
        return -1;
    }
    if (mt_sync_close(fd) != 0 || rename(temp, key->path) != 0) {
        int saved_errno = errno;
        unlink(temp);
        mt_set_error(err, errlen, "%s: cannot write the sample index cache: %s", key->path, strerror(saved_errno));
        return -1;
    }
    mt_parent_dir(key->path, dir, sizeof(dir));
    return mt_sync_dir(dir, err, errlen);
}
