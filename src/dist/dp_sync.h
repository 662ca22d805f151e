/* dp_sync.h: sums and averages over a group that every rank gets bit for bit:
 * gradient buckets over dp, activations over tp, scalars. */
#ifndef MT_DIST_DP_SYNC_H
#define MT_DIST_DP_SYNC_H

#include <stddef.h>

#include "comm.h"

/* Bytes per all-reduce bucket over the flat gradient array. */
#define DP_BUCKET_BYTES ((size_t)16 << 20)

/* buf = scale * (sum over the group of buf), bit-identical on every rank:
 * each element is summed on one rank (reduce-scatter), then all-gathered, in
 * fixed-size buckets. For gradients, and for tensor parallel's activation
 * sums, whose copies must not drift apart. */
void comm_sum_identical(const Comm *group, float *buf, size_t count, float scale);

/* grads = (sum over the dp group of grads) / dp, in fixed-size buckets from
 * the start of the array (the same order on every rank, so the result is
 * deterministic and identical everywhere). No-op for a group of one. */
void dp_average_grads(const Comm *dp, float *grads, size_t count);
/* The mean of `value` over the dp group (the same on every rank). */
double dp_average_double(const Comm *dp, double value);
/* The sum of `value` over the dp group (the same on every rank). */
double dp_sum_double(const Comm *dp, double value);
/* Each of values[0 .. n) summed over the group in place, in one all-gather
 * (several scalars for the price of one; each as dp_sum_double sums it). */
void dp_sum_doubles(const Comm *dp, double *values, int n);

#endif
