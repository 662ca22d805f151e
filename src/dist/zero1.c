/* zero1.c: the distributed optimizer's sharding and collectives (see zero1.h).
 * Buckets and parts match dp_sync.c: a bucket of n floats is padded to a
 * multiple of the group, part r is [r * share, (r + 1) * share) of it. With
 * expert parallel the flat array has two regions, each sharded over its group. */
#include "zero1.h"

#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "dp_sync.h"

/* MEGATRAIN_DP_BUCKET_BYTES (a test hook, at least 64): smaller buckets, so that a tiny model has many (the GPU's
 * reduce-scatters during the backward, the ragged last bucket of each region). Every rank must see the same value;
 * checkpoints hold whole moments, so it may differ between a run and its resume. */
static size_t bucket_floats(void) {
    const char *env = getenv("MEGATRAIN_DP_BUCKET_BYTES");
    const long bytes = env ? atol(env) : 0;
    return (bytes >= 64 ? (size_t)bytes : DP_BUCKET_BYTES) / sizeof(float);
}

/* A stretch of the flat array sharded over one group: the whole array, or
 * with expert parallel the dense part over dp and the experts over edp. */
typedef struct Region {
    const Comm *group;
    size_t at, count;   /* [at, at + count) of the flat array */
    float scale;        /* the reduced gradients' factor */
} Region;

static int regions_of(const Zero1 *z, Region *r) {
    r[0] = (Region){z->dp, 0, z->dense, 1.0f / (float)z->dp->size};
    if (!z->edp || z->count == z->dense) return 1;
    r[1] = (Region){z->edp, z->dense, z->count - z->dense, z->expert_scale / (float)z->edp->size};
    return 2;
}

/* Bucket geometry: n floats from `at` (relative to the region), parts of `share`. */
static void bucket_at(const Region *g, size_t at, size_t *n, size_t *share) {
    const size_t ranks = (size_t)g->group->size, bucket = bucket_floats();
    *n = g->count - at < bucket ? g->count - at : bucket;
    *share = (*n + ranks - 1) / ranks;
}

static size_t region_buckets(const Region *g) { return (g->count + bucket_floats() - 1) / bucket_floats(); }

int zero1_num_buckets(const Zero1 *z) {
    Region r[2];
    const int n = regions_of(z, r);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += region_buckets(&r[i]);
    return (int)total;
}

Zero1Bucket zero1_bucket(const Zero1 *z, int i) {
    Region r[2];
    const int n = regions_of(z, r);
    int region = 0;
    size_t index = (size_t)i;
    while (region + 1 < n && index >= region_buckets(&r[region])) index -= region_buckets(&r[region++]);
    Zero1Bucket b = {.region = region, .at = index * bucket_floats()};
    bucket_at(&r[region], b.at, &b.n, &b.share);
    b.at += r[region].at;
    return b;
}

const Comm *zero1_region_group(const Zero1 *z, int region) {
    Region r[2];
    return region < regions_of(z, r) ? r[region].group : NULL;
}

float zero1_region_scale(const Zero1 *z, int region) {
    Region r[2];
    return region < regions_of(z, r) ? r[region].scale : 0.0f;
}

static void add_ranges(Zero1 *z, const Region *g) {
    const size_t bucket = bucket_floats();
    for (size_t at = 0; at < g->count; at += bucket) {
        size_t n, share;
        bucket_at(g, at, &n, &share);
        size_t b = (size_t)g->group->rank * share, e = b + share;
        if (b > n) b = n;
        if (e > n) e = n;
        if (e == b) continue;
        z->begin[z->num_ranges] = g->at + at + b;
        z->end[z->num_ranges] = g->at + at + e;
        z->num_ranges++;
        z->owned += e - b;
    }
}

void zero1_init_split(Zero1 *z, const Comm *dp, size_t dense, const Comm *edp, size_t count, float expert_scale) {
    memset(z, 0, sizeof *z);
    z->dp = dp;
    z->edp = edp;
    z->count = count;
    z->dense = edp ? dense : count;
    z->expert_scale = expert_scale;
    const size_t bucket = bucket_floats(), buckets = (count + bucket - 1) / bucket + 2;
    z->begin = mt_malloc(buckets * sizeof(size_t));
    z->end = mt_malloc(buckets * sizeof(size_t));
    Region r[2];
    const int n = regions_of(z, r);
    for (int i = 0; i < n; i++) add_ranges(z, &r[i]);
}

void zero1_init(Zero1 *z, const Comm *dp, size_t count) { zero1_init_split(z, dp, count, NULL, count, 1.0f); }

void zero1_free(Zero1 *z) {
    free(z->begin);
    free(z->end);
    memset(z, 0, sizeof *z);
}

static void reduce_scatter_region(const Region *g, float *grads) {
    const size_t ranks = (size_t)g->group->size, bucket = bucket_floats();
    const size_t max_padded = ((g->count < bucket ? g->count : bucket) + ranks - 1) / ranks * ranks;
    float *send = mt_malloc((max_padded ? max_padded : 1) * sizeof(float));
    float *part = mt_malloc((max_padded / ranks + 1) * sizeof(float));
    for (size_t at = 0; at < g->count; at += bucket) {
        size_t n, share;
        bucket_at(g, at, &n, &share);
        memcpy(send, grads + g->at + at, n * sizeof(float));
        memset(send + n, 0, (share * ranks - n) * sizeof(float));
        comm_reduce_scatter_sum_float(g->group, send, part, share);
        const size_t b = (size_t)g->group->rank * share;
        for (size_t i = 0; i < share && b + i < n; i++) grads[g->at + at + b + i] = part[i] * g->scale;
    }
    free(send);
    free(part);
}

void zero1_reduce_scatter_grads(const Zero1 *z, float *grads) {
    Region r[2];
    const int n = regions_of(z, r);
    for (int i = 0; i < n; i++) reduce_scatter_region(&r[i], grads);
}

/* All-gather over buckets of this rank's parts of region g; every bucket lands in full. */
static void gather_region(const Region *g, float *full) {
    const size_t ranks = (size_t)g->group->size, bucket = bucket_floats();
    const size_t max_padded = ((g->count < bucket ? g->count : bucket) + ranks - 1) / ranks * ranks;
    float *recv = mt_malloc((max_padded ? max_padded : 1) * sizeof(float));
    float *part = mt_malloc((max_padded / ranks + 1) * sizeof(float));
    for (size_t at = 0; at < g->count; at += bucket) {
        size_t n, share;
        bucket_at(g, at, &n, &share);
        const size_t b = (size_t)g->group->rank * share;
        const size_t mine = b >= n ? 0 : (b + share > n ? n - b : share);
        if (mine) memcpy(part, full + g->at + at + b, mine * sizeof(float));
        memset(part + mine, 0, (share - mine) * sizeof(float));
        comm_all_gather(g->group, part, recv, share, COMM_FLOAT);
        memcpy(full + g->at + at, recv, n * sizeof(float));
    }
    free(recv);
    free(part);
}

void zero1_all_gather(const Zero1 *z, float *buf) {
    Region r[2];
    const int n = regions_of(z, r);
    for (int i = 0; i < n; i++) gather_region(&r[i], buf);
}

void zero1_take_shard(const Zero1 *z, const void *full, void *shard, size_t elem_bytes) {
    size_t at = 0;
    for (int r = 0; r < z->num_ranges; r++) {
        memcpy((char *)shard + at * elem_bytes, (const char *)full + z->begin[r] * elem_bytes,
               (z->end[r] - z->begin[r]) * elem_bytes);
        at += z->end[r] - z->begin[r];
    }
}
