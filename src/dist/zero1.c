/* zero1.c: the distributed optimizer's sharding and collectives (see zero1.h).
 * Buckets and parts match dp_sync.c: a bucket of n floats is padded to a
 * multiple of dp, part r is [r * share, (r + 1) * share) of it. */
#include "zero1.h"

#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "dp_sync.h"

static size_t bucket_floats(void) { return DP_BUCKET_BYTES / sizeof(float); }

/* Bucket geometry: n floats from `at`, parts of `share`. */
static void bucket_at(const Zero1 *z, size_t at, size_t *n, size_t *share) {
    const size_t ranks = (size_t)z->dp->size, bucket = bucket_floats();
    *n = z->count - at < bucket ? z->count - at : bucket;
    *share = (*n + ranks - 1) / ranks;
}

void zero1_init(Zero1 *z, const Comm *dp, size_t count) {
    memset(z, 0, sizeof *z);
    z->dp = dp;
    z->count = count;
    const size_t bucket = bucket_floats(), buckets = (count + bucket - 1) / bucket;
    z->begin = mt_malloc((buckets ? buckets : 1) * sizeof(size_t));
    z->end = mt_malloc((buckets ? buckets : 1) * sizeof(size_t));
    for (size_t at = 0; at < count; at += bucket) {
        size_t n, share;
        bucket_at(z, at, &n, &share);
        size_t b = (size_t)dp->rank * share, e = b + share;
        if (b > n) b = n;
        if (e > n) e = n;
        if (e == b) continue;
        z->begin[z->num_ranges] = at + b;
        z->end[z->num_ranges] = at + e;
        z->num_ranges++;
        z->owned += e - b;
    }
}

void zero1_free(Zero1 *z) {
    free(z->begin);
    free(z->end);
    memset(z, 0, sizeof *z);
}

void zero1_reduce_scatter_grads(const Zero1 *z, float *grads) {
    const size_t ranks = (size_t)z->dp->size, bucket = bucket_floats();
    const size_t max_padded = ((z->count < bucket ? z->count : bucket) + ranks - 1) / ranks * ranks;
    float *send = mt_malloc((max_padded ? max_padded : 1) * sizeof(float));
    float *part = mt_malloc((max_padded / ranks + 1) * sizeof(float));
    const float scale = 1.0f / (float)z->dp->size;
    for (size_t at = 0; at < z->count; at += bucket) {
        size_t n, share;
        bucket_at(z, at, &n, &share);
        memcpy(send, grads + at, n * sizeof(float));
        memset(send + n, 0, (share * ranks - n) * sizeof(float));
        comm_reduce_scatter_sum_float(z->dp, send, part, share);
        const size_t b = (size_t)z->dp->rank * share;
        for (size_t i = 0; i < share && b + i < n; i++) grads[at + b + i] = part[i] * scale;
    }
    free(send);
    free(part);
}

/* All-gather over buckets of this rank's parts, taken from `shard` (packed)
 * or, when shard is NULL, from `full` itself; every bucket lands in full. */
static void gather_buckets(const Zero1 *z, float *full, const float *shard) {
    const size_t ranks = (size_t)z->dp->size, bucket = bucket_floats();
    const size_t max_padded = ((z->count < bucket ? z->count : bucket) + ranks - 1) / ranks * ranks;
    float *recv = mt_malloc((max_padded ? max_padded : 1) * sizeof(float));
    float *part = mt_malloc((max_padded / ranks + 1) * sizeof(float));
    size_t shard_at = 0;
    for (size_t at = 0; at < z->count; at += bucket) {
        size_t n, share;
        bucket_at(z, at, &n, &share);
        const size_t b = (size_t)z->dp->rank * share;
        const size_t mine = b >= n ? 0 : (b + share > n ? n - b : share);
        if (mine) memcpy(part, shard ? shard + shard_at : full + at + b, mine * sizeof(float));
        memset(part + mine, 0, (share - mine) * sizeof(float));
        shard_at += mine;
        comm_all_gather(z->dp, part, recv, share, COMM_FLOAT);
        memcpy(full + at, recv, n * sizeof(float));
    }
    free(recv);
    free(part);
}

void zero1_all_gather(const Zero1 *z, float *buf) { gather_buckets(z, buf, NULL); }


void zero1_take_shard(const Zero1 *z, const float *full, float *shard) {
    size_t at = 0;
    for (int r = 0; r < z->num_ranges; r++) {
        memcpy(shard + at, full + z->begin[r], (z->end[r] - z->begin[r]) * sizeof(float));
        at += z->end[r] - z->begin[r];
    }
}
