/* gpt_sampling.c: builds and reads the GPT sample index of one dataset split
 * (see gpt_sampling.h). Building is O(documents * epochs + samples). */
#include "gpt_sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "../core/error.h"
#include "../core/rng.h"

/* More index entries than this is a configuration mistake, not a dataset. */
#define GPT_MAX_INDEX_ENTRIES (INT64_C(1) << 34)

void gpt_split_bounds(const double weights[3], int64_t num_documents, int64_t bounds[4]) {
    double sum = weights[0] + weights[1] + weights[2];
    bounds[0] = 0;
    for (int i = 0; i < 3; i++) {
        double share = sum > 0 ? weights[i] / sum : (i == 0);
        /* Python's round(): half to even, which nearbyint does in the default mode. */
        bounds[i + 1] = bounds[i] + (int64_t)nearbyint(share * (double)num_documents);
    }
    int64_t diff = bounds[3] - num_documents;
    for (int i = 1; i < 4; i++) {
        bounds[i] -= diff;
        if (bounds[i] < bounds[i - 1]) bounds[i] = bounds[i - 1];
        if (bounds[i] > num_documents) bounds[i] = num_documents;
    }
    bounds[3] = num_documents;
}

void gpt_split_sequences(const IndexedDataset *ds, const double weights[3], int split, int64_t *first_sequence,
                         int64_t *end_sequence) {
    int64_t bounds[4];
    gpt_split_bounds(weights, ds->num_documents_plus_one - 1, bounds);
    *first_sequence = indexed_document(ds, bounds[split]);
    *end_sequence = indexed_document(ds, bounds[split + 1]);
}

size_t gpt_index_block_bytes(int64_t document_index_len, int64_t num_samples) {
    return (size_t)(document_index_len + 3 * num_samples) * sizeof(int64_t);
}

void gpt_index_attach(GptSampleIndex *gi) {
    gi->document_index = gi->block;
    gi->sample_starts = gi->document_index + gi->document_index_len;
    gi->shuffle = gi->sample_starts + 2 * gi->num_samples;
}

int64_t gpt_shuffle_block(int64_t tokens_per_epoch, int seq_len) {
    int64_t block = tokens_per_epoch / seq_len;
    return block > 0 ? block : 1;
}

/* What asks for the samples, for the messages of an index too large. */
#define FEWER_SAMPLES "train.steps x the global batch size; train.eval_batches for validation"

/* Samples in the complete shuffle blocks of `samples`. */
static int64_t complete_block_samples(int64_t samples, int64_t block) { return samples / block * block; }

/* The refusal of an index with more than GPT_MAX_INDEX_ENTRIES entries: -1 with err. */
static int too_many_samples(const IndexedDataset *ds, int64_t target, int seq_len, int64_t epochs,
                            int64_t tokens_per_epoch, char *err, size_t errlen) {
    mt_set_error(err, errlen, "%s: %lld samples of %d tokens need %lld epochs of %lld tokens: too many for a sample "
                 "index; ask for fewer samples (%s)", ds->prefix, (long long)target, seq_len, (long long)epochs,
                 (long long)tokens_per_epoch, FEWER_SAMPLES);
    return -1;
}

int gpt_index_build(GptSampleIndex *gi, const IndexedDataset *ds, int64_t first_sequence, int64_t end_sequence,
                    int seq_len, uint64_t seed, int64_t num_samples, char *err, size_t errlen) {
    memset(gi, 0, sizeof(*gi));
    int64_t units = end_sequence - first_sequence;
    int64_t tokens_per_epoch = 0;
    for (int64_t s = first_sequence; s < end_sequence; s++) tokens_per_epoch += indexed_length(ds, s);
    if (seq_len <= 0) {
        mt_set_error(err, errlen, "%s: sequence length %d (expected > 0)", ds->prefix, seq_len);
        return -1;
    }
    if (units <= 0 || tokens_per_epoch == 0) {
        mt_set_error(err, errlen, "%s: the split has no tokens (%lld sequences)", ds->prefix, (long long)units);
        return -1;
    }
    int64_t target = num_samples > 0 ? num_samples : 1;
    /* Samples from T tokens: (T - 1) / seq_len (each needs seq_len + 1, sharing one). */
    double needed_tokens = (double)target * seq_len + 1;
    int64_t epochs = (int64_t)ceil(needed_tokens / (double)tokens_per_epoch);
    if (epochs < 1) epochs = 1;
    /* the estimate's epochs already past the limit: refused before the exact count below (whose products would
     * overflow for budgets near 2^63 tokens) */
    if ((double)epochs * (double)units + 3.0 * (double)target > (double)GPT_MAX_INDEX_ENTRIES)
        return too_many_samples(ds, target, seq_len, epochs, tokens_per_epoch, err, errlen);
    /* The sample order is shuffled in blocks of one epoch's worth of samples,
     * each block with its own seed, and only complete blocks may hold the
     * `target` samples: then the first `target` samples are the same whatever
     * num_samples was asked for, so a run resumed with more steps reads the
     * same data as one that asked for them from the start. */
    const int64_t block = gpt_shuffle_block(tokens_per_epoch, seq_len);
    while (complete_block_samples((epochs * tokens_per_epoch - 1) / seq_len, block) < target) epochs++;
    while (epochs > 1 && complete_block_samples(((epochs - 1) * tokens_per_epoch - 1) / seq_len, block) >= target)
        epochs--;
    int64_t samples = (epochs * tokens_per_epoch - 1) / seq_len;
    if ((double)epochs * (double)units + 3.0 * (double)samples > (double)GPT_MAX_INDEX_ENTRIES)
        return too_many_samples(ds, target, seq_len, epochs, tokens_per_epoch, err, errlen);
    const size_t bytes = gpt_index_block_bytes(epochs * units, samples);
    /* the host's memory, or less under an address-space limit (ulimit -v) */
    double host = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    struct rlimit limit;
    if (getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY && (double)limit.rlim_cur < host)
        host = (double)limit.rlim_cur;
    const double GiB = 1073741824.0;
    if (host > 0 && (double)bytes > host) { /* a clear error instead of "out of memory allocating N bytes" */
        mt_set_error(err, errlen, "%s: %lld samples of %d tokens need a sample index of %.1f GiB (%lld epochs of %lld "
                     "tokens), more than the %.1f GiB of memory this process may use: ask for fewer samples (%s)",
                     ds->prefix, (long long)target, seq_len,
                     (double)bytes / GiB, (long long)epochs, (long long)tokens_per_epoch, host / GiB, FEWER_SAMPLES);
        return -1;
    }
    gi->first_sequence = first_sequence;
    gi->end_sequence = end_sequence;
    gi->num_epochs = epochs;
    gi->document_index_len = epochs * units;
    gi->num_samples = samples;
    gi->block_bytes = gpt_index_block_bytes(gi->document_index_len, samples);
    gi->block = mt_malloc(gi->block_bytes);
    gpt_index_attach(gi);

    Rng rng;
    rng_seed(&rng, seed);
    for (int64_t e = 0; e < epochs; e++) {
        int64_t *epoch = gi->document_index + e * units;
        for (int64_t u = 0; u < units; u++) epoch[u] = first_sequence + u;
        rng_shuffle_i64(&rng, epoch, units);
    }
    /* Walk the concatenated documents once: sample k starts at token k * seq_len. */
    int64_t position = 0, document_start = 0;
    int64_t document_length = indexed_length(ds, gi->document_index[0]);
    for (int64_t k = 0; k < samples; k++) {
        int64_t token = k * (int64_t)seq_len;
        while (document_start + document_length <= token) {
            document_start += document_length;
            position++;
            document_length = indexed_length(ds, gi->document_index[position]);
        }
        gi->sample_starts[2 * k] = position;
        gi->sample_starts[2 * k + 1] = token - document_start;
    }
    for (int64_t k = 0; k < samples; k++) gi->shuffle[k] = k;
    for (int64_t start = 0; start < samples; start += block) {
        Rng block_rng;
        rng_seed(&block_rng, seed ^ (0x9e3779b97f4a7c15ULL * (uint64_t)(start / block + 1)));
        rng_shuffle_i64(&block_rng, gi->shuffle + start, start + block <= samples ? block : samples - start);
    }
    return 0;
}

int gpt_index_visit_sample(const GptSampleIndex *gi, const IndexedDataset *ds, int seq_len, int64_t k,
                           GptPieceVisit visit, void *arg) {
    int64_t position = gi->sample_starts[2 * k];
    int64_t offset = gi->sample_starts[2 * k + 1];
    int64_t need = (int64_t)seq_len + 1;
    while (need > 0 && position < gi->document_index_len) {
        int64_t seq = gi->document_index[position];
        int64_t available = indexed_length(ds, seq) - offset;
        int64_t take = available < need ? available : need;
        if (take > 0) {
            const int rc = visit(arg, seq, offset, take);
            if (rc != 0) return rc;
            need -= take;
        }
        offset = 0;
        position++;
    }
    return 0;
}

/* Where gpt_index_read_sample's next piece goes. */
typedef struct SampleReader {
    const IndexedDataset *ds;
    int32_t *out;
} SampleReader;

static int read_piece(void *arg, int64_t seq, int64_t offset, int64_t count) {
    SampleReader *r = arg;
    indexed_dataset_read(r->ds, seq, offset, count, r->out);
    r->out += count;
    return 0;
}

void gpt_index_read_sample(const GptSampleIndex *gi, const IndexedDataset *ds, int seq_len, int64_t k,
                           int32_t *out) {
    SampleReader reader = {ds, out};
    gpt_index_visit_sample(gi, ds, seq_len, k, read_piece, &reader);
    const int64_t missing = (int64_t)seq_len + 1 - (reader.out - out);
    if (missing > 0) memset(reader.out, 0, (size_t)missing * sizeof(*out)); /* unreachable for a valid index */
}

void gpt_index_free(GptSampleIndex *gi) {
    if (gi->map) munmap(gi->map, gi->map_bytes);
    else free(gi->block);
    memset(gi, 0, sizeof(*gi));
}

int gpt_index_validate(const GptSampleIndex *gi, const IndexedDataset *ds) {
    int64_t first = gi->first_sequence, end = gi->end_sequence;
    if (first < 0 || end > ds->num_sequences || first >= end || gi->num_samples < 1 ||
        gi->document_index_len != gi->num_epochs * (end - first))
        return -1;
    for (int64_t i = 0; i < gi->document_index_len; i++)
        if (gi->document_index[i] < first || gi->document_index[i] >= end) return -1;
    for (int64_t k = 0; k < gi->num_samples; k++) {
        int64_t position = gi->sample_starts[2 * k], offset = gi->sample_starts[2 * k + 1];
        if (position < 0 || position >= gi->document_index_len || offset < 0) return -1;
        int64_t length = indexed_length(ds, gi->document_index[position]);
        if (offset >= length) return -1;
        if (gi->shuffle[k] < 0 || gi->shuffle[k] >= gi->num_samples) return -1;
    }
    return 0;
}
