/* fuzz_indexed_dataset.c: libFuzzer harness for Megatron indexed datasets
 * (src/data/indexed_dataset.c: PREFIX.idx and PREFIX.bin). Input: a
 * little-endian u32 L, then L bytes of .idx (fewer when the input is
 * shorter), then the .bin. A dataset that opens must keep every sequence
 * inside .bin and the document index in order; every token is read. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/indexed_dataset.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4) return 0;
    size_t idx_len = fuzz_u32(data);
    if (idx_len > size - 4) idx_len = size - 4;
    fuzz_write("data.idx", data + 4, idx_len);
    fuzz_write("data.bin", data + 4 + idx_len, size - 4 - idx_len);
    char prefix[600], err[2048] = "";
    snprintf(prefix, sizeof prefix, "%s/data", fuzz_dir());
    IndexedDataset ds;
    if (indexed_dataset_open(&ds, prefix, err, sizeof err) != 0) {
        if (!strstr(err, "/data.")) fuzz_fail("error does not name the file: '%s'", err);
        return 0;
    }
    for (int64_t i = 0; i < ds.num_sequences; i++) {
        int64_t len = indexed_length(&ds, i), off = indexed_offset(&ds, i);
        if (len < 0 || off < 0 || (uint64_t)off > ds.bin_size ||
            (uint64_t)len > (ds.bin_size - (uint64_t)off) / (uint64_t)ds.token_size)
            fuzz_fail("sequence %lld (offset %lld, %lld tokens) outside the %zu-byte .bin", (long long)i,
                      (long long)off, (long long)len, ds.bin_size);
        int32_t *tokens = malloc((size_t)len * sizeof(int32_t) + 1);
        indexed_dataset_read(&ds, i, 0, len, tokens);
        free(tokens);
    }
    if (ds.num_documents_plus_one < 1 || indexed_document(&ds, 0) != 0) fuzz_fail("document index does not start at 0");
    for (int64_t j = 1; j < ds.num_documents_plus_one; j++)
        if (indexed_document(&ds, j) < indexed_document(&ds, j - 1) || indexed_document(&ds, j) > ds.num_sequences)
            fuzz_fail("document index entry %lld out of order", (long long)j);
    indexed_dataset_close(&ds);
    return 0;
}
