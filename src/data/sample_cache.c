/* sample_cache.c: reads and writes GPT sample index cache files (see sample_cache.h). */
#include "sample_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/error.h"
#include "../core/fs.h"

#define CACHE_MAGIC "MTGPTIDX"
#define CACHE_VERSION 2 /* 2: sample order shuffled per epoch-sized block */

typedef struct CacheHeader {
    char magic[8];
    uint64_t version;
    uint64_t key;
    int64_t first_sequence, end_sequence, num_epochs, document_index_len, num_samples;
} CacheHeader;

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

int sample_cache_load(GptSampleIndex *gi, const SampleCacheKey *key, const IndexedDataset *ds) {
    FILE *f = fopen(key->path, "rb");
    if (!f) return -1;
    CacheHeader h;
    struct stat st;
    GptSampleIndex loaded;
    memset(&loaded, 0, sizeof(loaded));
    int ok = fstat(fileno(f), &st) == 0 && fread(&h, sizeof(h), 1, f) == 1 &&
             memcmp(h.magic, CACHE_MAGIC, 8) == 0 && h.version == CACHE_VERSION && h.key == key->hash &&
             h.document_index_len >= 0 && h.num_samples > 0 && h.document_index_len < (INT64_C(1) << 40) &&
             h.num_samples < (INT64_C(1) << 40);
    if (ok) {
        loaded.block_bytes = gpt_index_block_bytes(h.document_index_len, h.num_samples);
        ok = (uint64_t)st.st_size == sizeof(h) + loaded.block_bytes;
    }
    if (ok) {
        loaded.first_sequence = h.first_sequence;
        loaded.end_sequence = h.end_sequence;
        loaded.num_epochs = h.num_epochs;
        loaded.document_index_len = h.document_index_len;
        loaded.num_samples = h.num_samples;
        loaded.block = mt_malloc(loaded.block_bytes);
        gpt_index_attach(&loaded);
        ok = fread(loaded.block, 1, loaded.block_bytes, f) == loaded.block_bytes &&
             gpt_index_validate(&loaded, ds) == 0;
        if (!ok) free(loaded.block);
    }
    fclose(f);
    if (!ok) return -1;
    *gi = loaded;
    return 0;
}

int sample_cache_save(const GptSampleIndex *gi, const SampleCacheKey *key, char *err, size_t errlen) {
    char temp[2100];
    if (mt_make_parent_dirs(key->path, err, errlen) != 0) return -1;
    if (mt_temp_name(temp, sizeof(temp), key->path) != 0) {
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
    FILE *f = fopen(temp, "wb");
    if (!f) {
        mt_set_error(err, errlen, "%s: cannot create: %s", temp, strerror(errno));
        return -1;
    }
    int ok = fwrite(&h, sizeof(h), 1, f) == 1 && fwrite(gi->block, 1, gi->block_bytes, f) == gi->block_bytes &&
             fflush(f) == 0;
    int saved_errno = errno;
    if (fclose(f) != 0) ok = 0;
    if (ok && rename(temp, key->path) != 0) {
        saved_errno = errno;
        ok = 0;
    }
    if (!ok) {
        unlink(temp);
        mt_set_error(err, errlen, "%s: cannot write the sample index cache: %s", key->path, strerror(saved_errno));
        return -1;
    }
    return 0;
}
