/* indexed_dataset.h: Megatron-LM's MMIDIDX indexed dataset (PREFIX.bin + PREFIX.idx).
 *
 * Format (little-endian): 9-byte magic "MMIDIDX\0\0"; u64 version = 1; u8 dtype
 * code (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32,
 * 8 uint16); u64 sequence count N; u64 document count D; int32[N] sequence
 * lengths (tokens); int64[N] byte offsets into .bin; int64[D] document
 * boundaries (sequence indices, starting with 0). Both files are mmapped
 * read-only, so the ranks of a node that read one dataset share its pages; the
 * arrays of the .idx sit at unaligned offsets (the header is 34 bytes) and are
 * read through indexed_length / indexed_offset / indexed_document.
 */
#ifndef MT_DATA_INDEXED_DATASET_H
#define MT_DATA_INDEXED_DATASET_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum { IDX_DTYPE_UINT8 = 1, IDX_DTYPE_INT8 = 2, IDX_DTYPE_INT16 = 3, IDX_DTYPE_INT32 = 4,
       IDX_DTYPE_INT64 = 5, IDX_DTYPE_FLOAT64 = 6, IDX_DTYPE_FLOAT32 = 7, IDX_DTYPE_UINT16 = 8 };

typedef struct IndexedDataset {
    char prefix[1024];
    int dtype_code;
    int token_size;             /* bytes per token */
    int64_t num_sequences;
    int64_t num_documents_plus_one; /* length of doc_index (documents + 1) */
    /* the .idx's arrays in its mapping (little-endian, unaligned): int32 lengths[N], int64 byte offsets into
     * .bin [N], int64 document boundaries [D] */
    const uint8_t *lengths_at, *offsets_at, *documents_at;
    const uint8_t *bin;
    size_t bin_size;
    void *idx_map;
    size_t idx_map_size;
} IndexedDataset;

/* Tokens of sequence i. */
static inline int64_t indexed_length(const IndexedDataset *ds, int64_t i) {
    int32_t v;
    memcpy(&v, ds->lengths_at + 4 * i, 4);
    return v;
}

/* Byte offset of sequence i in .bin. */
static inline int64_t indexed_offset(const IndexedDataset *ds, int64_t i) {
    int64_t v;
    memcpy(&v, ds->offsets_at + 8 * i, 8);
    return v;
}

/* Entry j of the document index: the first sequence of document j (j = documents: the sequence count). */
static inline int64_t indexed_document(const IndexedDataset *ds, int64_t j) {
    int64_t v;
    memcpy(&v, ds->documents_at + 8 * j, 8);
    return v;
}

/* Open PREFIX.idx and PREFIX.bin; validates the header and that every
 * sequence lies inside .bin. Returns 0, or -1 with an error naming the file. */
int indexed_dataset_open(IndexedDataset *ds, const char *prefix, char *err, size_t errlen);
void indexed_dataset_close(IndexedDataset *ds);

/* How the .bin will be read, for the kernel's read-ahead (madvise): at random
 * places (MADV_RANDOM: a training sample of shuffled short documents touches
 * dozens of them, and each page fault would otherwise read a whole read-ahead
 * window, 8 MiB on common settings: gigabytes read for megabytes of tokens
 * when the file is not in the page cache), or its first `bytes` in order
 * (MADV_SEQUENTIAL, e.g. a scan of the first tokens; the rest as before). */
void indexed_dataset_advise_random(const IndexedDataset *ds);
void indexed_dataset_advise_sequential(const IndexedDataset *ds, size_t bytes);

/* Copy `count` tokens of sequence `seq` starting at token `offset` into out (as int32). */
void indexed_dataset_read(const IndexedDataset *ds, int64_t seq, int64_t offset, int64_t count, int32_t *out);

/* What tells a dataset's contents from another's, cheaply: its document
 * count, the sizes of both files, and the CRC-32C of the whole .idx (every
 * document's length) followed by the .bin's first and last MiB (the whole
 * .bin when it is smaller than 2 MiB). The same text built again with the
 * same tokenizer gives the same fingerprint; documents added, removed or
 * reordered, or another tokenizer, another one (but for a change inside the
 * .bin's middle that keeps every length). A checkpoint records its training
 * data's (resume warns when they differ: docs/checkpoints.md). */
typedef struct DatasetFingerprint {
    int64_t documents;
    uint64_t idx_bytes, bin_bytes;
    uint32_t crc32c;
} DatasetFingerprint;

/* ds's fingerprint; with a loss mask (loss_mask.h; NULL: none), the mask's files folded in (their sizes added,
 * their bytes after ds's in the CRC). */
DatasetFingerprint indexed_dataset_fingerprint(const IndexedDataset *ds, const IndexedDataset *mask);

/* Writer: add documents made of one sequence each, then finish. */
typedef struct IndexedDatasetWriter IndexedDatasetWriter;
IndexedDatasetWriter *indexed_dataset_writer_open(const char *prefix, int dtype_code, char *err, size_t errlen);
int indexed_dataset_writer_add_document(IndexedDatasetWriter *w, const int32_t *tokens, int64_t count);
/* Writes PREFIX.idx (and closes PREFIX.bin). Returns 0, or -1 with err. */
int indexed_dataset_writer_finish(IndexedDatasetWriter *w, char *err, size_t errlen);

#endif
