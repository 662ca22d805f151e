/* zero1.h: the distributed optimizer (ZeRO-1, Megatron's
 * --use-distributed-optimizer) over the data-parallel group, for host
 * buffers. The flat parameter array is cut into the same buckets as
 * dp_sync.h, each bucket into dp equal parts; rank r owns part r of every
 * bucket. Per step: gradients are reduce-scattered (each rank gets the mean
 * of its parts), the global norm comes from every rank's parts (src/train/grad_sync.c), each rank
 * updates its parts with AdamW moments kept for its parts only (1/dp of the
 * memory), and the parameters are all-gathered, so every replica holds the
 * same bits. Checkpoints hold the whole moments: each rank writes its parts
 * (ckpt_sources_sharded), and after a load zero1_take_shard keeps this
 * rank's (so any dp size can resume them). */
#ifndef MT_DIST_ZERO1_H
#define MT_DIST_ZERO1_H

#include <stddef.h>

#include "comm.h"

typedef struct Zero1 {
    const Comm *dp;
    const Comm *edp;    /* expert parallel: the group of the expert region (NULL: none) */
    size_t count;       /* floats in the flat array */
    size_t dense;       /* [0, dense) is sharded over dp, [dense, count) over edp */
    float expert_scale; /* the expert region's gradients: the edp mean times this (edp / dp) */
    int num_ranges;
    size_t *begin, *end; /* this rank's parts: [begin[i], end[i]) in the flat array, ascending */
    size_t owned;       /* floats in those parts (the shard) */
} Zero1;

/* One bucket of the split: [at, at + n) of the flat array, in region 0 (the dense weights, over dp) or 1 (the
 * routed experts, over edp); rank r owns [at + r * share, at + (r + 1) * share) clipped to the bucket. A device
 * implementation runs the same collectives bucket by bucket (src/model/cuda/cuda_model_zero1.c). */
typedef struct Zero1Bucket {
    int region;
    size_t at, n, share;
} Zero1Bucket;

void zero1_init(Zero1 *z, const Comm *dp, size_t count);
/* With expert parallel: the routed experts' weights at the end of the flat
 * array, [dense, count), replicated over edp only: sharded over edp, their
 * gradients the edp sum times expert_scale / edp. */
void zero1_init_split(Zero1 *z, const Comm *dp, size_t dense, const Comm *edp, size_t count, float expert_scale);
void zero1_free(Zero1 *z);

/* Collective: grads on this rank's parts become the dp mean (other floats are left as they were; the
 * expert region: see zero1_init_split). */
void zero1_reduce_scatter_grads(const Zero1 *z, float *grads);
/* Collective: every rank's parts of buf to every rank (buf is complete everywhere after). */
void zero1_all_gather(const Zero1 *z, float *buf);
/* The buckets, region 0's then region 1's, each in flat order: how many, and bucket i. */
int zero1_num_buckets(const Zero1 *z);
Zero1Bucket zero1_bucket(const Zero1 *z, int i);
/* A region's group (dp or edp) and the factor its summed gradients are scaled by (1 / dp; expert_scale / edp). */
const Comm *zero1_region_group(const Zero1 *z, int region);
float zero1_region_scale(const Zero1 *z, int region);
/* shard[owned] = this rank's parts of full[count], elements of elem_bytes
 * bytes (the moments are fp32 or bf16). */
void zero1_take_shard(const Zero1 *z, const void *full, void *shard, size_t elem_bytes);

#endif
