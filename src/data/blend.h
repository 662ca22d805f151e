/* blend.h: Megatron's BlendedDataset assignment of samples to datasets.
 *
 * Global sample i goes to the dataset whose share is furthest behind its
 * weight: argmax_d (weights[d] * max(i, 1) - count[d]) (first on ties), the
 * greedy rule of Megatron's build_blending_indices, with the weights normalised as megatron-core's
 * normalize() does (blend_normalize): every sample's dataset is megatron-core's (test_megatron_data). Each dataset's count of
 * the first n samples then stays within about one of weight * n.
 *
 * Megatron keeps two arrays a sample (the dataset, and the sample's index in
 * it: 9 to 16 bytes); a long run's blend held gigabytes on every rank. Here a
 * sample keeps its dataset in a byte (at most 256 datasets), and every
 * BLEND_BLOCK samples the counts so far of each dataset: the index in its
 * dataset is that count plus the matches in the block before it (a scan of
 * under BLEND_BLOCK bytes). About 1 byte a sample.
 */
#ifndef MT_DATA_BLEND_H
#define MT_DATA_BLEND_H

#include <stdint.h>

#define BLEND_MAX_DATASETS 256
#define BLEND_BLOCK 4096

typedef struct BlendIndex {
    int num_datasets;
    int64_t size;
    uint8_t *dataset;      /* [size]: the dataset of each sample */
    int64_t *block_counts; /* [blocks][num_datasets]: each dataset's samples before the block */
} BlendIndex;

/* Divide weights[0..n) by their sum (n >= 1, a positive sum), the sum taken as megatron-core's normalize()
 * takes it: numpy's sum of a float64 array. */
void blend_normalize(double *weights, int n);

/* weights: normalised (sum 1), 1 <= num_datasets <= BLEND_MAX_DATASETS. */
void blend_index_build(BlendIndex *b, const double *weights, int num_datasets, int64_t size);

/* The dataset of sample i (0 <= i < size), and into *in_dataset the sample's index within it (its dataset's
 * samples before it). */
int blend_index_get(const BlendIndex *b, int64_t i, int64_t *in_dataset);

void blend_index_free(BlendIndex *b);

/* Samples to ask of each dataset for `size` blended samples: ceil(weight * size * 1.005), Megatron's legacy
 * rule; megatron-core 0.16.1 asks ceil(ceil(weight * size) * 1.005), at most one more. Never fewer than the
 * greedy draws (test_megatron_data, against megatron-core's build_blending_indices). */
int64_t blend_samples_per_dataset(double weight, int64_t size);

#endif
