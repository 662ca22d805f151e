/* loss_mask.h: the loss mask of an SFT dataset (`data build --format sft`):
 * PREFIX_mask.{bin,idx}, a uint8 Megatron indexed dataset beside
 * PREFIX.{bin,idx} with the same documents and sequence lengths, one byte
 * per token: 1 where the token counts in the loss (as a target), 0 where it
 * is masked. */
#ifndef MT_DATA_LOSS_MASK_H
#define MT_DATA_LOSS_MASK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "indexed_dataset.h"

/* PREFIX_mask of prefix into out (outlen bytes). */
void loss_mask_prefix(const char *prefix, char *out, size_t outlen);

/* Open the mask of the dataset `tokens` (opened from prefix) when
 * PREFIX_mask.idx exists. Returns 1 (mask open), 0 (no mask: a pretraining
 * dataset), or -1 with err when the mask is unreadable, not uint8, or has
 * other documents or lengths than the tokens. */
int loss_mask_open(IndexedDataset *mask, const IndexedDataset *tokens, const char *prefix, char *err, size_t errlen);

/* Whether `ds` (opened from prefix) is itself the loss mask of another dataset: prefix is TOKENS_mask, its dtype
 * uint8, and TOKENS.idx exists beside it; then TOKENS into tokens (tokens_len bytes). Training on a mask would read
 * its 0/1 bytes as tokens. */
bool loss_mask_of(const IndexedDataset *ds, const char *prefix, char *tokens, size_t tokens_len);

/* Tokens with mask 1 over the whole dataset. */
int64_t loss_mask_counted(const IndexedDataset *mask);

#endif
