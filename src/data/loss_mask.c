/* loss_mask.c: open and check an SFT dataset's loss mask (loss_mask.h). */
#include "loss_mask.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/error.h"

void loss_mask_prefix(const char *prefix, char *out, size_t outlen) { snprintf(out, outlen, "%s_mask", prefix); }

int loss_mask_open(IndexedDataset *mask, const IndexedDataset *tokens, const char *prefix, char *err, size_t errlen) {
    char mask_prefix[1100], idx[1200];
    loss_mask_prefix(prefix, mask_prefix, sizeof mask_prefix);
    snprintf(idx, sizeof idx, "%s.idx", mask_prefix);
    struct stat sb;
    if (stat(idx, &sb) != 0) return 0;
    if (indexed_dataset_open(mask, mask_prefix, err, errlen) != 0) return -1;
    const char *why = NULL;
    if (mask->dtype_code != IDX_DTYPE_UINT8) why = "its dtype is not uint8";
    else if (mask->num_sequences != tokens->num_sequences ||
             mask->num_documents_plus_one != tokens->num_documents_plus_one)
        why = "it has another number of documents or sequences";
    else if (memcmp(mask->lengths_at, tokens->lengths_at, (size_t)tokens->num_sequences * 4) != 0 ||
             memcmp(mask->documents_at, tokens->documents_at, (size_t)tokens->num_documents_plus_one * 8) != 0)
        why = "its documents have other lengths";
    if (why) {
        mt_set_error(err, errlen, "%s: the loss mask of %s.{bin,idx} does not match it: %s (rebuild both with "
                     "`data build --format sft`)", idx, prefix, why);
        indexed_dataset_close(mask);
        return -1;
    }
    return 1;
}

bool loss_mask_of(const IndexedDataset *ds, const char *prefix, char *tokens, size_t tokens_len) {
    const size_t n = strlen(prefix), suffix = strlen("_mask");
    if (ds->dtype_code != IDX_DTYPE_UINT8 || n <= suffix || strcmp(prefix + n - suffix, "_mask") != 0 ||
        n - suffix >= tokens_len)
        return false;
    snprintf(tokens, tokens_len, "%.*s", (int)(n - suffix), prefix);
    char idx[1200];
    snprintf(idx, sizeof idx, "%s.idx", tokens);
    struct stat sb;
    return stat(idx, &sb) == 0;
}

int64_t loss_mask_counted(const IndexedDataset *mask) {
    int64_t counted = 0;
    for (int64_t q = 0; q < mask->num_sequences; q++) {
        const uint8_t *b = mask->bin + indexed_offset(mask, q);
        for (int32_t i = 0; i < indexed_length(mask, q); i++) counted += b[i] != 0;
    }
    return counted;
}
