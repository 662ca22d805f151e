/* dp_sync.c: bucketed sums and averages of float arrays (gradients, and the
 * activations of tensor parallel) and scalar means over a group (dp_sync.h).
 *
 * A bucket is reduce-scattered (each element summed on exactly one rank) and
 * then all-gathered, rather than all-reduced: MPI does not promise that an
 * all-reduce gives bit-identical sums on every rank, and replicas whose
 * gradients differ in the last bit would drift apart. The bucket is padded
 * with zeros to a multiple of the group size. */
#include "dp_sync.h"

#include <stdlib.h>
#include <string.h>

#include "../core/error.h"

void comm_sum_identical(const Comm *group, float *buf, size_t count, float scale) {
    const Comm *dp = group;
    float *grads = buf;
    if (dp->size <= 1 || count == 0) {
        if (scale != 1.0f)
            for (size_t i = 0; i < count; i++) grads[i] *= scale;
        return;
    }
    const size_t ranks = (size_t)dp->size;
    const size_t bucket = DP_BUCKET_BYTES / sizeof(float);
    const size_t max_n = count < bucket ? count : bucket;
    const size_t max_padded = (max_n + ranks - 1) / ranks * ranks;
    float *send = mt_malloc(max_padded * sizeof(float));
    float *part = mt_malloc(max_padded / ranks * sizeof(float));
    for (size_t at = 0; at < count; at += bucket) {
        const size_t n = count - at < bucket ? count - at : bucket;
        const size_t padded = (n + ranks - 1) / ranks * ranks;
        const size_t share = padded / ranks;
        memcpy(send, grads + at, n * sizeof(float));
        memset(send + n, 0, (padded - n) * sizeof(float));
        comm_reduce_scatter_sum_float(dp, send, part, share);
        if (scale != 1.0f)
            for (size_t i = 0; i < share; i++) part[i] *= scale;
        comm_all_gather(dp, part, send, share, COMM_FLOAT);
        memcpy(grads + at, send, n * sizeof(float));
    }
    free(send);
    free(part);
}

void dp_average_grads(const Comm *dp, float *grads, size_t count) {
    if (dp->size > 1) comm_sum_identical(dp, grads, count, 1.0f / (float)dp->size);
}

void dp_sum_doubles(const Comm *dp, double *values, int n) {
    if (dp->size <= 1) return;
    /* Gather every rank's values and sum each in rank order: the same on all ranks. */
    double *all = mt_malloc((size_t)dp->size * (size_t)n * sizeof(double));
    comm_all_gather(dp, values, all, (size_t)n, COMM_DOUBLE);
    for (int i = 0; i < n; i++) {
        double sum = 0.0;
        for (int r = 0; r < dp->size; r++) sum += all[(size_t)r * n + i];
        values[i] = sum;
    }
    free(all);
}

double dp_sum_double(const Comm *dp, double value) {
    dp_sum_doubles(dp, &value, 1);
    return value;
}

double dp_average_double(const Comm *dp, double value) {
    return dp->size <= 1 ? value : dp_sum_double(dp, value) / (double)dp->size;
}
