/* eval_coverage.h: whether an evaluation reads a validation sample twice.
 *
 * An evaluation of B batches of M samples reads samples 0 .. B*M - 1 of its
 * loader (batch b is samples b*M .. b*M + M - 1 on every layout: train_step.c's
 * evaluate, `megatrain eval`); the loader wraps past its samples
 * (data_loader_distinct_samples), so with more than the validation set holds
 * some samples come again and the loss counts their tokens twice or more.
 * The warning says so once, naming the numbers and the batches that read the
 * set once: a run says it at setup (train_setup.c), `megatrain eval` before
 * its result. */
#ifndef MT_DATA_EVAL_COVERAGE_H
#define MT_DATA_EVAL_COVERAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data_loader.h"

/* The names the message gives: the data ("data.valid", "--data d/valid"), the batches' and the micro-batch size's
 * settings ("train.eval_batches", "--batches"; "train.micro_batch_size", "--micro-batch-size") and the loss
 * ("eval_loss", "the loss"). */
typedef struct EvalCoverageNames {
    const char *data, *batches, *micro_batch_size, *loss;
} EvalCoverageNames;

/* True, with the warning in msg, when `batches` x `micro_batch_size` samples of loader read one more than once. */
bool eval_coverage_repeats(const DataLoader *loader, int64_t batches, int64_t micro_batch_size,
                           const EvalCoverageNames *names, char *msg, size_t msglen);

#endif
