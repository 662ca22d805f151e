/* data_loader.h: GPT-style samples from one or more blended indexed datasets.
 *
 * Megatron's GPTDataset scheme: the documents of each dataset's split are
 * shuffled per epoch with the seed, concatenated, and cut into samples of
 * seq_len + 1 tokens that cross document boundaries (a sample's last token is
 * the next sample's first); the sample order is shuffled too. Several
 * datasets are blended by weight (Megatron's BlendedDataset greedy
 * assignment). The index arrays are cached under cache_dir, keyed by a hash
 * of everything they depend on, so a restart does not rebuild them.
 *
 * Sample i of a loader is a pure function of (config, split, seq_len, seed, i):
 * the train loop's sampler position is just the number of consumed samples.
 * Each split's indices are built (gpt_sampling.h) with the seed
 * seed ^ (0x9e3779b97f4a7c15 * (split + 1)) (mod 2^64).
 *
 * Token ids against the model's vocabulary: data_loader_check_vocab looks at
 * the first tokens of each dataset before a run starts; after
 * data_loader_set_vocab every sample a get returns is checked too, and
 * data_loader_check_sample finds where a bad one is. All three report it
 * with the same message (the dataset, the id, its sequence and place, and
 * the `megatrain data inspect` command that shows the dataset's ids).
 */
#ifndef MT_DATA_DATA_LOADER_H
#define MT_DATA_DATA_LOADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../config/recipe.h"
#include "indexed_dataset.h"

typedef enum { SPLIT_TRAIN = 0, SPLIT_VALID = 1, SPLIT_TEST = 2 } DataSplit;

typedef struct DataLoader DataLoader;

/* Build (or load from cache) the indices for at least `num_samples` samples
 * of `split`. For SPLIT_VALID, data->valid is used when num_valid > 0, else
 * the split's valid share of data->train. Returns NULL with err set (naming
 * the file) on failure; an empty split is an error. */
DataLoader *data_loader_create(const DataConfig *data, DataSplit split, int seq_len, uint64_t seed,
                               int64_t num_samples, char *err, size_t errlen);

/* data_loader_create of every sample the split holds once (train.eval_batches: all, `megatrain eval --batches
 * all`): one dataset's holds them whatever it is built for; a blend is built for the samples of all its datasets
 * together, so that data_loader_distinct_samples finds where it first repeats one (or reads every one once), and
 * not where the samples built end. */
DataLoader *data_loader_create_whole(const DataConfig *data, DataSplit split, int seq_len, uint64_t seed, char *err,
                                     size_t errlen);

/* Samples available (>= the num_samples asked for). */
int64_t data_loader_num_samples(const DataLoader *loader);
/* Samples (packed rows, with data.pack) the loader reads from index 0 on before one repeats the data of an earlier
 * one: a dataset's packed rows, or the GPT samples of one epoch of its share, (tokens - 1) / seq_len (a later
 * sample reads the next epoch: the same documents reshuffled, gpt_sampling.h); in a blend, the samples before
 * the first that goes past its dataset's count, or every sample it was built for (num_samples) when none does.
 * An evaluation reading more than this counts some tokens twice (eval_coverage.h). */
int64_t data_loader_distinct_samples(const DataLoader *loader);
/* How many datasets the loader blends (1: one dataset, whose own samples num_samples counts). */
int data_loader_num_datasets(const DataLoader *loader);

/* Dataset i of the loader (0 <= i < data_loader_num_datasets): its prefix as opened, and its fingerprint
 * (indexed_dataset.h; its loss mask folded in) into *fp (NULL: the prefix only). The fingerprint reads the
 * dataset's whole .idx: for a checkpoint's record, once a run. */
const char *data_loader_dataset(const DataLoader *loader, int i, DatasetFingerprint *fp);

/* The fingerprint of the dataset at `prefix` as data_loader_dataset gives it (its loss mask folded in), for one
 * that no loader holds open: a dataset whose share of the split is empty and was left out of the blend. 0, or -1
 * with err. */
int data_fingerprint_path(const char *prefix, DatasetFingerprint *fp, char *err, size_t errlen);

/* From now on data_loader_get and data_loader_get_packed check every token
 * they return against the model's vocabulary [0, vocab_size) (0: no check,
 * the default). */
void data_loader_set_vocab(DataLoader *loader, int vocab_size);

/* Write sample `index` (seq_len + 1 tokens) into out. index wraps modulo
 * data_loader_num_samples. Returns 0, or -1 when a token lies outside the
 * vocabulary of data_loader_set_vocab (data_loader_check_sample says where:
 * one compare per token here, the search only then). */
int data_loader_get(const DataLoader *loader, int64_t index, int32_t *out);

/* Whether a dataset of the loader has an SFT loss mask (PREFIX_mask.{bin,idx},
 * loss_mask.h, opened and checked with its dataset). */
bool data_loader_has_mask(const DataLoader *loader);

/* The loss mask of sample `index` (seq_len + 1 values, 1: counted, 0:
 * masked) into out: the same tokens data_loader_get reads; all 1 for a
 * dataset without a mask. */
void data_loader_get_mask(const DataLoader *loader, int64_t index, int32_t *out);

/* data.pack: the loader's samples are packed rows of whole documents
 * (sft_packing.h); read them with data_loader_get_packed, not data_loader_get.
 * Each dataset is packed on its own (packed_loader.h); in a blend a row is
 * one sample of its dataset, assigned by the blending rule, so the weights
 * are the share of rows. */
bool data_loader_packed(const DataLoader *loader);

/* Packed sample `index` (wrapping): seq_len inputs, targets (-1: masked or
 * padding) and each token's position in its sample. Alone, a dataset's row
 * order[index % rows]; in a blend, sample i of dataset d (blend.h) is d's
 * row order[i % d's rows]: the row d's loader alone gives for i. Returns 0,
 * or -1 when an input or target lies outside the vocabulary of
 * data_loader_set_vocab, as data_loader_get (a raw target of -1, which
 * reads as a masked one, too). */
int data_loader_get_packed(const DataLoader *loader, int64_t index, int32_t *inputs, int32_t *targets,
                           int32_t *positions);

/* That the first tokens of each dataset of the loader (up to `max_tokens`
 * of each, from its first sequence on) lie in [0, vocab_size): a dataset
 * built with another tokenizer than the model's is refused before training
 * starts. Returns 0, or -1 with err naming the dataset, the token and where
 * it is. */
int data_loader_check_vocab(const DataLoader *loader, int vocab_size, int64_t max_tokens, char *err, size_t errlen);

/* That every token of sample `index` (plain or packed: its documents as the
 * row reads them) lies in the vocabulary of data_loader_set_vocab; for after
 * a get returned -1. Returns 0, or -1 with err naming the dataset, the token,
 * its sequence and its place there, data_loader_check_vocab's message. */
int data_loader_check_sample(const DataLoader *loader, int64_t index, char *err, size_t errlen);

void data_loader_free(DataLoader *loader);

#endif
