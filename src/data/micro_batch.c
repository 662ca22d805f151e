/* micro_batch.c: a micro-batch's inputs and targets from a DataLoader
 * (micro_batch.h says how a sample becomes them). */
#include "micro_batch.h"

#include <stdio.h>
#include <stdlib.h>

#include "../core/error.h"

void micro_batch_init(MicroBatch *mb, int size, int seq_len, int local_len) {
    mb->size = size;
    mb->seq_len = seq_len;
    mb->local_len = local_len;
    mb->positions = mt_malloc((size_t)local_len * sizeof(int32_t));
    for (int t = 0; t < local_len; t++) mb->positions[t] = t;
    mb->inputs = mt_malloc((size_t)size * (size_t)local_len * sizeof(int32_t));
    mb->targets = mt_malloc((size_t)size * (size_t)local_len * sizeof(int32_t));
    mb->places = mt_malloc((size_t)size * (size_t)seq_len * sizeof(int32_t));
    mb->sample = mt_malloc(((size_t)seq_len + 1) * sizeof(int32_t));
    mb->sample_mask = mt_malloc(((size_t)seq_len + 1) * sizeof(int32_t));
    mb->refused[0] = '\0';
}

void micro_batch_free(MicroBatch *mb) {
    free(mb->positions);
    free(mb->inputs);
    free(mb->targets);
    free(mb->places);
    free(mb->sample);
    free(mb->sample_mask);
}

/* Sample b (loader sample `index`) holds a token outside the vocabulary: the first such message is kept (never
 * empty: callers stop on it), and the sample becomes inputs 0, targets -1. */
static void refuse_sample(MicroBatch *mb, const DataLoader *loader, int64_t index, int b) {
    if (!mb->refused[0] && data_loader_check_sample(loader, index, mb->refused, sizeof mb->refused) == 0)
        snprintf(mb->refused, sizeof mb->refused, "sample %lld holds a token outside the model's vocabulary",
                 (long long)index); /* the loader's search finds what its get saw: not reached */
    const int T = mb->local_len;
    for (int t = 0; t < T; t++) {
        mb->inputs[(long)b * T + t] = 0;
        mb->targets[(long)b * T + t] = -1;
    }
}

const int32_t *micro_batch_load_part(MicroBatch *mb, const DataLoader *loader, int64_t first, int count) {
    const int B = mb->size, S = mb->seq_len, T = mb->local_len;
    const int32_t *positions = mb->positions;
    mb->empty = true;
    const bool packed = data_loader_packed(loader), masked = !packed && data_loader_has_mask(loader);
    for (int b = 0; b < B; b++) {
        const bool padding = b >= count;
        const int64_t index = padding ? first : first + b;
        int rc;
        if (packed) { /* whole rows (sample: inputs, sample_mask: targets), this rank's tokens */
            rc = data_loader_get_packed(loader, index, mb->sample, mb->sample_mask, mb->places + (long)b * S);
            for (int t = 0; t < S && mb->empty && rc == 0 && !padding; t++) mb->empty = mb->sample_mask[t] < 0;
        } else {
            rc = data_loader_get(loader, index, mb->sample);
            if (masked) data_loader_get_mask(loader, index, mb->sample_mask);
            if (!masked && rc == 0 && !padding) mb->empty = false;
            for (int t = 0; t < S && mb->empty && masked && rc == 0 && !padding; t++) mb->empty = !mb->sample_mask[t + 1];
        }
        for (int t = 0; t < T; t++) {
            const int32_t target = packed ? mb->sample_mask[positions[t]]
                                   : !masked || mb->sample_mask[positions[t] + 1] ? mb->sample[positions[t] + 1] : -1;
            mb->inputs[(long)b * T + t] = mb->sample[positions[t]];
            mb->targets[(long)b * T + t] = padding ? -1 : target;
        }
        if (rc != 0) refuse_sample(mb, loader, index, b);
    }
    return packed ? mb->places : NULL;
}

const int32_t *micro_batch_load(MicroBatch *mb, const DataLoader *loader, int64_t first) {
    return micro_batch_load_part(mb, loader, first, mb->size);
}

long micro_batch_counted(const MicroBatch *mb) {
    const long n = (long)mb->size * mb->local_len;
    long count = 0;
    for (long i = 0; i < n; i++) count += mb->targets[i] >= 0;
    return count;
}
