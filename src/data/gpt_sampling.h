/* gpt_sampling.h: Megatron GPTDataset index arrays for one dataset split.
 *
 * A split is a contiguous range of documents (Megatron's get_split_indices
 * over normalised weights); its units are the sequences of those documents.
 *   document index: the split's sequence ids, repeated for num_epochs; the
 *                   epochs are shuffled in turn (Fisher-Yates, rng_shuffle_i64)
 *                   by one Rng seeded once with the seed, so each epoch has
 *                   its own order;
 *   sample starts:  for sample k, the document-index position and token
 *                   offset of global token k * seq_len; the sample is the
 *                   seq_len + 1 tokens from there (crossing documents), so
 *                   consecutive samples share one token;
 *   shuffle:        a permutation of the samples within blocks of
 *                   gpt_shuffle_block() samples: block b (samples
 *                   [b * block, (b + 1) * block)) is shuffled by its own Rng,
 *                   seeded with seed ^ (0x9e3779b97f4a7c15 * (b + 1)) (mod 2^64).
 * num_epochs is the smallest whose complete shuffle blocks hold the samples
 * asked for. tests/fixtures/sampling/pinned_order.py re-implements this
 * description in Python; test_data_loader pins its order for a seed.
 * Everything lives in one block so the cache can write it in one go; a
 * built index's block is on the heap, a cached one's is the cache file mapped
 * read-only (sample_cache.c), which every rank of a node then shares through
 * the page cache.
 */
#ifndef MT_DATA_GPT_SAMPLING_H
#define MT_DATA_GPT_SAMPLING_H

#include <stddef.h>
#include <stdint.h>

#include "indexed_dataset.h"

typedef struct GptSampleIndex {
    int64_t first_sequence, end_sequence; /* the split's sequences: [first, end) */
    int64_t num_epochs;
    int64_t document_index_len;           /* num_epochs * (end - first) */
    int64_t num_samples;
    int64_t *document_index;              /* [document_index_len] sequence ids */
    int64_t *sample_starts;               /* [num_samples][2]: position, offset */
    int64_t *shuffle;                     /* [num_samples] */
    void *block;                          /* the three arrays */
    size_t block_bytes;
    void *map;                            /* non-NULL: block lies in this read-only mapping (map_bytes) */
    size_t map_bytes;
} GptSampleIndex;

/* Megatron's legacy get_train_valid_test_split_: documents [bounds[i], bounds[i+1]) belong to
 * split i; weights are normalised (their sum must be > 0), each share rounded half to even and the
 * bounds moved by what their sum misses. Megatron-core rounds the cumulative bounds instead, which
 * can put a bound one document apart (docs/megatron.md). */
void gpt_split_bounds(const double weights[3], int64_t num_documents, int64_t bounds[4]);

/* The sequence range of `split` (0 train, 1 valid, 2 test) of ds. */
void gpt_split_sequences(const IndexedDataset *ds, const double weights[3], int split, int64_t *first_sequence,
                         int64_t *end_sequence);

/* Bytes of the block for these sizes. */
size_t gpt_index_block_bytes(int64_t document_index_len, int64_t num_samples);
/* Point the arrays into gi->block (already allocated with gpt_index_block_bytes). */
void gpt_index_attach(GptSampleIndex *gi);

/* Samples per shuffle block: one epoch's worth (at least 1). The sample order
 * is a permutation within each block, seeded by (seed, block index). */
int64_t gpt_shuffle_block(int64_t tokens_per_epoch, int seq_len);

/* Build the arrays for sequences [first, end) of ds. Returns 0, or -1 with
 * err when the range has no tokens or the sizes are out of reach. The first
 * num_samples entries of the shuffled order do not depend on num_samples. */
int gpt_index_build(GptSampleIndex *gi, const IndexedDataset *ds, int64_t first_sequence, int64_t end_sequence,
                    int seq_len, uint64_t seed, int64_t num_samples, char *err, size_t errlen);

/* Sample `k` in unshuffled order: seq_len + 1 tokens into out. */
void gpt_index_read_sample(const GptSampleIndex *gi, const IndexedDataset *ds, int seq_len, int64_t k,
                           int32_t *out);

/* One piece of a sample: tokens [offset, offset + count) of sequence seq. Non-zero stops the visit. */
typedef int (*GptPieceVisit)(void *arg, int64_t seq, int64_t offset, int64_t count);

/* The pieces of sample `k` (unshuffled order) in order, the seq_len + 1
 * tokens gpt_index_read_sample reads: visit(arg, ...) for each until one
 * returns non-zero, which is returned; 0 when every piece was visited. */
int gpt_index_visit_sample(const GptSampleIndex *gi, const IndexedDataset *ds, int seq_len, int64_t k,
                           GptPieceVisit visit, void *arg);

/* Check every entry is in range for ds (for an index read from a cache file).
 * Returns 0, or -1 when the index cannot belong to this dataset. */
int gpt_index_validate(const GptSampleIndex *gi, const IndexedDataset *ds);

void gpt_index_free(GptSampleIndex *gi);

#endif
