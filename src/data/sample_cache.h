/* sample_cache.h: the GPT sample index of one (dataset, split) on disk.
 *
 * One file per (dataset, split) under the cache directory, named
 * BASENAME-SPLIT-KEY.gptidx where KEY is an FNV-1a 64 hash of everything the
 * index depends on: the dataset's absolute path, its .idx size and mtime, the
 * split's sequence range, seq_len, seed, the samples asked for and the format
 * version. The file holds a header (magic, version, key, sizes, and a
 * CRC-32C of the header and the block) and the index block; it is written to
 * a temporary name, fsync'ed, renamed into place and its directory fsync'ed.
 */
#ifndef MT_DATA_SAMPLE_CACHE_H
#define MT_DATA_SAMPLE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "gpt_sampling.h"

typedef struct SampleCacheKey {
    uint64_t hash;
    char path[2048]; /* the cache file */
} SampleCacheKey;

/* Compute the key and file name for this index. Returns 0, or -1 with err
 * when the dataset's .idx cannot be stat'ed or the path does not fit. */
int sample_cache_key(SampleCacheKey *key, const char *cache_dir, const IndexedDataset *ds, const char *split_name,
                     int64_t first_sequence, int64_t end_sequence, int seq_len, uint64_t seed,
                     int64_t num_samples, char *err, size_t errlen);

/* Load the index from key->path into gi: the file mapped read-only and shared
 * (the ranks of a node that load one file share its pages), its CRC-32C and
 * its index checked. The file is only ever replaced by a rename, never
 * rewritten in place, so the mapping stays valid. Returns 0 when a valid file was
 * read; 1 (gi untouched) when there is none; -1 (gi untouched) with the
 * reason in why when the file is there but unusable: unreadable, of another
 * version or key, of the wrong size, its CRC-32C does not match, or its
 * index does not fit the dataset. Such a file must be rebuilt, never used. */
int sample_cache_load(GptSampleIndex *gi, const SampleCacheKey *key, const IndexedDataset *ds, char *why,
                      size_t whylen);

/* Write gi to key->path atomically and durably (fsync of the file before the
 * rename and of the directory after), creating the directory. Returns 0 or -1 with err. */
int sample_cache_save(const GptSampleIndex *gi, const SampleCacheKey *key, char *err, size_t errlen);

#endif
