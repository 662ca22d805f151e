/* eval_coverage.h: what an evaluation reads of its data, and whether it reads a validation sample twice.
 *
 * An evaluation of B batches of M samples reads samples 0 .. B*M - 1 of its
 * loader (batch b is samples b*M .. b*M + M - 1 on every layout: train_step.c's
 * evaluate, `megatrain eval`); the loader wraps past its samples
 * (data_loader_distinct_samples), so with more than the validation set holds
 * some samples come again and the loss counts their tokens twice or more.
 * The warning says so once, naming the numbers and the batches that read the
 * set once: a run says it at setup (train_setup.c), `megatrain eval` before
 * its result.
 *
 * train.eval_batches: all (`megatrain eval --batches all`) reads every sample the set holds once, no more:
 * ceil(samples / M) batches, the last of them partial when M does not divide the samples. That batch is
 * padded: its places past the set's last sample hold masked samples (every target -1), which count nothing,
 * so no sample is dropped and none counted twice. Its mean loss (over the samples it holds) is weighed by
 * their share of M (eval_extent_weight): under train.loss per_micro_batch the eval loss is then the mean over
 * the samples of their batch's mean, each batch weighed by its samples, as Hugging Face's Trainer weighs a
 * short last batch (with every target counted, the mean over every token of the set); under per_token every
 * counted target weighs alike anyway. With whole batches every weight is 1: the mean of the batches' means.
 * The count depends on the data, the seed, seq_len and data.pack alone (data_loader_distinct_samples), so a
 * resumed run (whose checkpoint holds the recipe and the datasets' fingerprints) finds the same samples. */
#ifndef MT_DATA_EVAL_COVERAGE_H
#define MT_DATA_EVAL_COVERAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data_loader.h"

/* The names the message gives: the data ("data.valid", "--data d/valid"), the batches', the micro-batch size's and
 * the sequence length's settings ("train.eval_batches", "--batches"; "train.micro_batch_size", "--micro-batch-size";
 * "train.seq_len", "--seq-len") and the loss ("eval_loss", "the loss"). */
typedef struct EvalCoverageNames {
    const char *data, *batches, *micro_batch_size, *seq_len, *loss;
} EvalCoverageNames;

/* What an evaluation reads: `batches` micro-batches of micro_batch_size samples, of which the first `samples`
 * count (batches x micro_batch_size; with `all` the samples the set holds, the last batch's places past them
 * padding). */
typedef struct EvalExtent {
    int64_t batches, samples, micro_batch_size;
    bool all; /* train.eval_batches: all (--batches all) */
} EvalExtent;

/* The extent of `batches` (a count, or MT_EVAL_BATCHES_ALL: loader's distinct samples, built by
 * data_loader_create_whole) batches of micro_batch_size samples over loader. batches 0 when the set holds no sample
 * (data_loader_create refuses an empty split before). */
EvalExtent eval_extent(const DataLoader *loader, int64_t batches, int64_t micro_batch_size);

/* The samples of batch b that count: micro_batch_size; fewer in the last batch of `all`; 0 past the last. */
int eval_extent_batch_samples(const EvalExtent *e, int64_t b);

/* The weight of batch b's loss in the evaluation's sum, and the sum's divisor (eval_extent_divisor): under
 * per_micro_batch its samples over micro_batch_size and the extent's samples over micro_batch_size; under per_token
 * 1 and the batches (set_loss_tokens divides each batch's summed loss by the counted targets over the batches). */
double eval_extent_weight(const EvalExtent *e, int64_t b, bool per_token);
double eval_extent_divisor(const EvalExtent *e, bool per_token);

/* "37 batches of 4: the 147 samples DATA holds, each once; the last batch holds 3 and 1 masked padding sample,
 * which counts nothing" for `all`, or "8 batches of 4", into buf. */
void eval_extent_describe(const EvalExtent *e, const char *data, char *buf, size_t len);

/* True, with the warning in msg, when `batches` x `micro_batch_size` samples of loader read one more than once. */
bool eval_coverage_repeats(const DataLoader *loader, int64_t batches, int64_t micro_batch_size,
                           const EvalCoverageNames *names, char *msg, size_t msglen);

#endif
