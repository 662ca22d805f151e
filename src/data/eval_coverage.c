/* eval_coverage.c: the warning of an evaluation that reads validation samples twice (eval_coverage.h). */
#include "eval_coverage.h"

#include <stdio.h>

bool eval_coverage_repeats(const DataLoader *loader, int64_t batches, int64_t micro_batch_size,
                           const EvalCoverageNames *names, char *msg, size_t msglen) {
    const int64_t distinct = data_loader_distinct_samples(loader), read = batches * micro_batch_size;
    if (read <= distinct) return false;
    const bool packed = data_loader_packed(loader);
    const int blend = data_loader_num_datasets(loader);
    char holds[160];
    if (blend > 1) /* a blend: the samples before its first repeat */
        snprintf(holds, sizeof holds, "(a blend of %d datasets) gives %lld %s before it repeats one", blend,
                 (long long)distinct, packed ? "packed rows" : "samples");
    else
        snprintf(holds, sizeof holds, "holds %lld %s", (long long)distinct,
                 packed ? "packed rows" : "samples of one epoch ((tokens - 1) / seq_len)");
    const int64_t once = distinct / micro_batch_size;
    char advice[200];
    if (once == 0)
        snprintf(advice, sizeof advice, "it holds fewer than one micro-batch: give a smaller %s (at most %lld), or "
                 "more validation data", names->micro_batch_size, (long long)distinct);
    else if (once * micro_batch_size == distinct)
        snprintf(advice, sizeof advice, "%s %lld reads each once", names->batches, (long long)once);
    else
        snprintf(advice, sizeof advice, "%s %lld reads %lld of them once, none twice", names->batches,
                 (long long)once, (long long)(once * micro_batch_size));
    snprintf(msg, msglen, "%s %s; %s %lld x %s %lld reads %lld, so %lld are read again and %s counts their tokens "
             "twice or more: %s", names->data, holds, names->batches, (long long)batches, names->micro_batch_size,
             (long long)micro_batch_size, (long long)read, (long long)(read - distinct), names->loss, advice);
    return true;
}
