/* sft_packing.h: whole SFT samples (documents) packed into rows of seq_len
 * positions, first-fit decreasing, no sample split (data.pack).
 *
 * A document of L tokens takes L - 1 positions of a row: its tokens
 * 0..L-2 as inputs and 1..L-1 as targets (a target masked by the loss mask
 * becomes -1). Documents are placed longest first, each into the first row
 * with room for it (a segment tree over the rows' free positions finds it
 * in O(log rows)); ties keep the dataset order. A document with more than
 * seq_len + 1 tokens is refused (data.pack_overlong: error, naming the
 * dataset and the document) or cut to its first seq_len + 1 tokens
 * (truncate, counted); a document of one token has no target and takes no
 * position (counted). The rows' order is shuffled with the seed.
 *
 * A row's unused tail is padding: input 0, target -1, its places counting
 * from 0 as one more sample (so it attends to nothing before it), written
 * -1 - place (-1, -2, ...) so that the model knows it for padding: its MoE
 * layers route it nowhere and count it in no statistic
 * (model_set_packed_positions). */
#ifndef MT_DATA_SFT_PACKING_H
#define MT_DATA_SFT_PACKING_H

#include <stdbool.h>
#include <stdint.h>

#include "../config/recipe.h"
#include "indexed_dataset.h"

/* First-fit decreasing of n items of sizes[i] (each in [0, capacity]) into
 * bins of `capacity`: row_of[i] is item i's bin. Returns the number of bins. */
int64_t pack_first_fit_decreasing(const int64_t *sizes, int64_t n, int64_t capacity, int64_t *row_of);

typedef struct PackedRows {
    int seq_len;
    int64_t num_rows;
    int64_t *row_start;     /* [num_rows + 1]: row r's documents are docs[row_start[r] .. row_start[r + 1]) */
    int64_t *docs;          /* sequence ids, each row's in placement order */
    int64_t *order;         /* [num_rows]: the shuffled row order (row of sample i: order[i]) */
    int64_t documents, truncated, too_short;
} PackedRows;

/* Pack the sequences [first, end) of ds into rows of seq_len positions. 0,
 * or -1 with err (an overlong document under PACK_OVERLONG_ERROR; `key`
 * names the dataset in the message, e.g. "data.train[0]"). */
int packed_rows_build(PackedRows *rows, const IndexedDataset *ds, const char *key, int64_t first, int64_t end,
                      int seq_len, PackOverlong overlong, uint64_t seed, char *err, size_t errlen);

/* Sample `index` (row order[index % num_rows]): seq_len inputs, targets
 * (-1 where masked or padding) and positions in each sample. mask: the
 * dataset's loss mask, or NULL (every target counted). scratch holds
 * seq_len + 1 values. Returns false when a raw target is negative (int32
 * data: a -1 there would pass for a masked one), else true. */
bool packed_rows_read(const PackedRows *rows, const IndexedDataset *ds, const IndexedDataset *mask, int64_t index,
                      int32_t *inputs, int32_t *targets, int32_t *positions, int32_t *scratch);

/* The documents of sample `index`'s row (wrapping, as packed_rows_read):
 * rows->docs[*first .. *end), in the row's order. */
void packed_rows_documents(const PackedRows *rows, int64_t index, int64_t *first, int64_t *end);

/* The tokens a row reads of document (sequence) seq: its length, or its first
 * seq_len + 1 tokens when data.pack_overlong truncated it. */
int64_t packed_document_tokens(const PackedRows *rows, const IndexedDataset *ds, int64_t seq);

void packed_rows_free(PackedRows *rows);

#endif
