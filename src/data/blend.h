/* blend.h: Megatron's BlendedDataset assignment of samples to datasets.
 *
 * Global sample i goes to the dataset whose share is furthest behind its
 * weight: argmax_d (weights[d] * max(i, 1) - count[d]) (first on ties), the
 * greedy rule of Megatron's build_blending_indices. Each dataset's count of
 * the first n samples then stays within about one of weight * n.
 */
#ifndef MT_DATA_BLEND_H
#define MT_DATA_BLEND_H

#include <stdint.h>

/* weights: normalised (sum 1), num_datasets >= 1. Fills dataset_index[size]
 * and dataset_sample_index[size] (the sample's index within its dataset). */
void blend_build_indices(const double *weights, int num_datasets, int64_t size, int32_t *dataset_index,
                         int64_t *dataset_sample_index);

/* Samples to ask of each dataset for `size` blended samples: Megatron's
 * ceil(weight * size * 1.005). */
int64_t blend_samples_per_dataset(double weight, int64_t size);

#endif
