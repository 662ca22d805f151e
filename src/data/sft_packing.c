/* sft_packing.c: SFT samples packed into rows, first-fit decreasing
 * (sft_packing.h). */
#include "sft_packing.h"

#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../core/rng.h"

typedef struct SizedItem {
    int64_t size, index;
} SizedItem;

static int larger_first(const void *a, const void *b) {
    const SizedItem *x = a, *y = b;
    if (x->size != y->size) return x->size > y->size ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index; /* ties: dataset order */
}

int64_t pack_first_fit_decreasing(const int64_t *sizes, int64_t n, int64_t capacity, int64_t *row_of) {
    if (n == 0) return 0;
    SizedItem *items = mt_malloc((size_t)n * sizeof *items);
    for (int64_t i = 0; i < n; i++) items[i] = (SizedItem){sizes[i], i};
    qsort(items, (size_t)n, sizeof *items, larger_first);
    /* a max segment tree over n possible rows' free positions: leaves at [leaves, 2 leaves) */
    int64_t leaves = 1;
    while (leaves < n) leaves *= 2;
    int64_t *free_max = mt_malloc((size_t)(2 * leaves) * sizeof *free_max);
    for (int64_t i = 0; i < 2 * leaves; i++) free_max[i] = capacity;
    int64_t rows = 0;
    for (int64_t k = 0; k < n; k++) {
        const int64_t need = items[k].size;
        int64_t node = 1;
        while (node < leaves) node = free_max[2 * node] >= need ? 2 * node : 2 * node + 1; /* leftmost with room */
        const int64_t row = node - leaves;
        row_of[items[k].index] = row;
        if (row + 1 > rows) rows = row + 1;
        free_max[node] -= need;
        for (node /= 2; node >= 1; node /= 2)
            free_max[node] = free_max[2 * node] > free_max[2 * node + 1] ? free_max[2 * node] : free_max[2 * node + 1];
    }
    free(free_max);
    free(items);
    return rows;
}

int packed_rows_build(PackedRows *rows, const IndexedDataset *ds, const char *key, int64_t first, int64_t end,
                      int seq_len, PackOverlong overlong, uint64_t seed, char *err, size_t errlen) {
    memset(rows, 0, sizeof *rows);
    rows->seq_len = seq_len;
    const int64_t n = end - first;
    int64_t *sizes = mt_malloc((size_t)(n > 0 ? n : 1) * sizeof *sizes);
    int64_t *row_of = mt_malloc((size_t)(n > 0 ? n : 1) * sizeof *row_of);
    int64_t overlong_first = -1, overlong_count = 0, longest = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t len = indexed_length(ds, first + i);
        if (len > longest) longest = len;
        if (len - 1 > seq_len) {
            if (overlong_first < 0) overlong_first = first + i;
            overlong_count++;
            rows->truncated++;
            len = seq_len + 1;
        }
        if (len < 2) rows->too_short++;
        sizes[i] = len >= 2 ? len - 1 : 0;
    }
    if (overlong_count > 0 && overlong == PACK_OVERLONG_ERROR) { /* all of them said at once: seq_len chosen once */
        mt_set_error(err, errlen,
                     "%s %s: %lld document%s longer than train.seq_len + 1 = %d tokens (the first, document %lld; the "
                     "longest %lld tokens): packed samples are never split; raise train.seq_len to %lld for all of "
                     "them, or set data.pack_overlong: truncate to keep each one's first %d tokens", key, ds->prefix,
                     (long long)overlong_count, overlong_count == 1 ? " is" : "s are", seq_len + 1,
                     (long long)overlong_first, (long long)longest, (long long)longest - 1, seq_len + 1);
        free(sizes);
        free(row_of);
        return -1;
    }
    int64_t num_rows = pack_first_fit_decreasing(sizes, n, seq_len, row_of);
    rows->row_start = mt_calloc((size_t)num_rows + 1, sizeof *rows->row_start);
    rows->docs = mt_malloc((size_t)(n > 0 ? n : 1) * sizeof *rows->docs);
    for (int64_t i = 0; i < n; i++)
        if (sizes[i] > 0) rows->row_start[row_of[i] + 1]++;
    for (int64_t r = 0; r < num_rows; r++) rows->row_start[r + 1] += rows->row_start[r];
    int64_t *fill = mt_malloc((size_t)(num_rows > 0 ? num_rows : 1) * sizeof *fill);
    memcpy(fill, rows->row_start, (size_t)num_rows * sizeof *fill);
    for (int64_t i = 0; i < n; i++)
        if (sizes[i] > 0) rows->docs[fill[row_of[i]]++] = first + i;
    rows->documents = rows->row_start[num_rows];
    /* a row of only one-token documents holds nothing: drop such rows from the order */
    rows->order = mt_malloc((size_t)(num_rows > 0 ? num_rows : 1) * sizeof *rows->order);
    int64_t kept = 0;
    for (int64_t r = 0; r < num_rows; r++)
        if (rows->row_start[r + 1] > rows->row_start[r]) rows->order[kept++] = r;
    Rng rng;
    rng_seed(&rng, seed);
    rng_shuffle_i64(&rng, rows->order, kept);
    rows->num_rows = kept;
    free(fill);
    free(sizes);
    free(row_of);
    if (kept == 0) {
        mt_set_error(err, errlen, "%s %s: no document with 2 tokens or more to pack", key, ds->prefix);
        packed_rows_free(rows);
        return -1;
    }
    return 0;
}

void packed_rows_documents(const PackedRows *rows, int64_t index, int64_t *first, int64_t *end) {
    int64_t i = index % rows->num_rows;
    if (i < 0) i += rows->num_rows;
    const int64_t r = rows->order[i];
    *first = rows->row_start[r];
    *end = rows->row_start[r + 1];
}

int64_t packed_document_tokens(const PackedRows *rows, const IndexedDataset *ds, int64_t seq) {
    const int64_t len = indexed_length(ds, seq);
    return len > rows->seq_len + 1 ? rows->seq_len + 1 : len; /* truncate (an error otherwise, at build) */
}

bool packed_rows_read(const PackedRows *rows, const IndexedDataset *ds, const IndexedDataset *mask, int64_t index,
                      int32_t *inputs, int32_t *targets, int32_t *positions, int32_t *scratch) {
    const int T = rows->seq_len;
    int64_t first, end;
    packed_rows_documents(rows, index, &first, &end);
    int at = 0;
    int32_t signs = 0; /* the raw tokens OR'd: negative when one is (a -1 among them reads as a masked target) */
    for (int64_t k = first; k < end; k++) {
        const int64_t seq = rows->docs[k];
        const int64_t len = packed_document_tokens(rows, ds, seq);
        indexed_dataset_read(ds, seq, 0, len, scratch);
        for (int64_t t = 0; t + 1 < len; t++) {
            inputs[at + t] = scratch[t];
            targets[at + t] = scratch[t + 1];
            positions[at + t] = (int32_t)t;
            signs |= scratch[t + 1];
        }
        if (mask) {
            indexed_dataset_read(mask, seq, 0, len, scratch);
            for (int64_t t = 0; t + 1 < len; t++)
                if (!scratch[t + 1]) targets[at + t] = -1;
        }
        at += (int)(len - 1);
    }
    for (int t = at; t < T; t++) { /* padding: one more sample that counts nothing, its places written -1 - place */
        inputs[t] = 0;
        targets[t] = -1;
        positions[t] = -1 - (t - at);
    }
    return signs >= 0;
}

void packed_rows_free(PackedRows *rows) {
    free(rows->row_start);
    free(rows->docs);
    free(rows->order);
    memset(rows, 0, sizeof *rows);
}
