/* eval_coverage.c: what an evaluation reads (train.eval_batches, `all` resolved) and the warning of an evaluation
 * that reads validation samples twice (eval_coverage.h). */
#include "eval_coverage.h"

#include <stdio.h>

EvalExtent eval_extent(const DataLoader *loader, int64_t batches, int64_t micro_batch_size) {
    EvalExtent e = {batches, batches * micro_batch_size, micro_batch_size, batches == MT_EVAL_BATCHES_ALL};
    if (e.all) {
        e.samples = data_loader_distinct_samples(loader);
        e.batches = (e.samples + micro_batch_size - 1) / micro_batch_size;
    }
    return e;
}

int eval_extent_batch_samples(const EvalExtent *e, int64_t b) {
    const int64_t left = e->samples - b * e->micro_batch_size;
    return left <= 0 ? 0 : left < e->micro_batch_size ? (int)left : (int)e->micro_batch_size;
}

double eval_extent_weight(const EvalExtent *e, int64_t b, bool per_token) {
    if (per_token) return b < e->batches ? 1.0 : 0.0;
    return (double)eval_extent_batch_samples(e, b) / (double)e->micro_batch_size;
}

double eval_extent_divisor(const EvalExtent *e, bool per_token) {
    return per_token ? (double)e->batches : (double)e->samples / (double)e->micro_batch_size;
}

void eval_extent_describe(const EvalExtent *e, const char *data, char *buf, size_t len) {
    const char *plural = e->batches == 1 ? "" : "es";
    if (!e->all) {
        snprintf(buf, len, "%lld batch%s of %lld", (long long)e->batches, plural, (long long)e->micro_batch_size);
        return;
    }
    const int last = e->batches > 0 ? eval_extent_batch_samples(e, e->batches - 1) : 0;
    char tail[128] = "";
    if (last > 0 && last < e->micro_batch_size)
        snprintf(tail, sizeof tail, "; the last batch holds %d and %lld masked padding sample%s, which count%s "
                 "nothing", last, (long long)(e->micro_batch_size - last), e->micro_batch_size - last == 1 ? "" : "s",
                 e->micro_batch_size - last == 1 ? "s" : "");
    snprintf(buf, len, "%lld batch%s of %lld: the %lld sample%s %s holds, each once%s", (long long)e->batches, plural,
             (long long)e->micro_batch_size, (long long)e->samples, e->samples == 1 ? "" : "s", data, tail);
}

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
    if (distinct == 0) /* one epoch is shorter than a sample: no micro-batch size helps */
        snprintf(advice, sizeof advice, "it holds no whole sample of %s + 1 tokens: give a smaller %s, or more data "
                 "in it", names->seq_len, names->seq_len);
    else if (once == 0)
        snprintf(advice, sizeof advice, "it holds fewer than one micro-batch: give a smaller %s (at most %lld), or "
                 "more data in it", names->micro_batch_size, (long long)distinct);
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
