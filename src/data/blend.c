/* blend.c: greedy "largest error" blending (see blend.h). Building is
 * O(size * datasets); a lookup scans at most BLEND_BLOCK bytes. */
#include "blend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"

void blend_index_build(BlendIndex *b, const double *weights, int num_datasets, int64_t size) {
    memset(b, 0, sizeof *b);
    if (num_datasets < 1 || num_datasets > BLEND_MAX_DATASETS) mt_die(MT_EXIT_FAILURE, "blend: %d datasets", num_datasets);
    b->num_datasets = num_datasets;
    b->size = size;
    b->dataset = mt_malloc(size > 0 ? (size_t)size : 1);
    const int64_t blocks = (size + BLEND_BLOCK - 1) / BLEND_BLOCK;
    b->block_counts = mt_malloc((size_t)(blocks > 0 ? blocks : 1) * (size_t)num_datasets * sizeof(int64_t));
    int64_t *counts = mt_calloc((size_t)num_datasets, sizeof(*counts));
    for (int64_t i = 0; i < size; i++) {
        if (i % BLEND_BLOCK == 0)
            memcpy(b->block_counts + (i / BLEND_BLOCK) * num_datasets, counts, (size_t)num_datasets * sizeof(*counts));
        double position = i > 1 ? (double)i : 1.0;
        int best = 0;
        double best_error = weights[0] * position - (double)counts[0];
        for (int d = 1; d < num_datasets; d++) {
            double error = weights[d] * position - (double)counts[d];
            if (error > best_error) {
                best_error = error;
                best = d;
            }
        }
        b->dataset[i] = (uint8_t)best;
        counts[best]++;
    }
    free(counts);
}

/* numpy's sum of a float64 array (its pairwise_sum): under 8 values in order; up to 128 in 8 running sums, each
 * taking every 8th value, added as ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)), then the rest in order;
 * more in two halves (the first a multiple of 8). Blends of 8 or more datasets sum in another order than a
 * loop, and the normalised weights then differ in the last bit, which moves samples of the greedy's ties. */
static double numpy_sum(const double *a, int n) {
    if (n < 8) {
        double s = 0.0;
        for (int i = 0; i < n; i++) s += a[i];
        return s;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; j++) r[j] = a[j];
        int i = 8;
        for (; i < n - n % 8; i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double s = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) s += a[i];
        return s;
    }
    int half = n / 2;
    half -= half % 8;
    return numpy_sum(a, half) + numpy_sum(a + half, n - half);
}

void blend_normalize(double *weights, int n) {
    const double total = numpy_sum(weights, n);
    for (int d = 0; d < n; d++) weights[d] /= total;
}

int blend_index_get(const BlendIndex *b, int64_t i, int64_t *in_dataset) {
    const int d = b->dataset[i];
    const int64_t start = i / BLEND_BLOCK * BLEND_BLOCK;
    int64_t n = b->block_counts[(i / BLEND_BLOCK) * b->num_datasets + d];
    for (int64_t j = start; j < i; j++) n += b->dataset[j] == d;
    *in_dataset = n;
    return d;
}

void blend_index_free(BlendIndex *b) {
    free(b->dataset);
    free(b->block_counts);
    memset(b, 0, sizeof *b);
}

int64_t blend_samples_per_dataset(double weight, int64_t size) {
    return (int64_t)ceil(weight * (double)size * 1.005);
}
