/* blend.c: greedy "largest error" blending (see blend.h). O(size * datasets). */
#include "blend.h"

#include <math.h>
#include <stdlib.h>

#include "../core/error.h"

void blend_build_indices(const double *weights, int num_datasets, int64_t size, int32_t *dataset_index,
                         int64_t *dataset_sample_index) {
    int64_t *counts = mt_calloc((size_t)num_datasets, sizeof(*counts));
    for (int64_t i = 0; i < size; i++) {
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
        dataset_index[i] = best;
        dataset_sample_index[i] = counts[best]++;
    }
    free(counts);
}

int64_t blend_samples_per_dataset(double weight, int64_t size) {
    return (int64_t)ceil(weight * (double)size * 1.005);
}
