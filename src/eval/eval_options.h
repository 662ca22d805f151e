/* eval_options.h: the command line of `megatrain eval` (its --help text,
 * eval_usage_text, says every option) read into EvalOptions. */
#ifndef MT_EVAL_EVAL_OPTIONS_H
#define MT_EVAL_EVAL_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "../config/recipe.h"

/* Which options the command line gave (EvalOptions.given): the others take the run's recipe (eval_run_settings.h)
 * or the defaults. */
enum {
    EVAL_GAVE_DATA = 1u << 0,
    EVAL_GAVE_BATCHES = 1u << 1,
    EVAL_GAVE_SEQ_LEN = 1u << 2,
    EVAL_GAVE_MICRO_BATCH = 1u << 3,
    EVAL_GAVE_SEED = 1u << 4,
    EVAL_GAVE_PACK = 1u << 5, /* --pack or --no-pack */
    EVAL_GAVE_PACK_OVERLONG = 1u << 6,
    EVAL_GAVE_LOSS = 1u << 7,
    EVAL_GAVE_SPLIT = 1u << 8,
};

typedef struct EvalOptions {
    const char *ckpt;            /* CKPT: a checkpoint, run or checkpoints/ directory */
    const char *data;            /* --data PREFIX (NULL: the run's evaluation data, eval_run_settings) */
    unsigned given;              /* EVAL_GAVE_*: what the command line set */
    long batches;                /* --batches N, or all: MT_EVAL_BATCHES_ALL (resolved with the data: EvalExtent) */
    long seq_len;                /* --seq-len T */
    bool seq_len_given;          /* --seq-len was given (else the default) */
    long micro_batch_size;       /* --micro-batch-size B */
    uint64_t seed;               /* --seed S */
    const char *device;          /* --device cpu|cuda */
    bool json;                   /* --json */
    bool pack;                   /* --pack: samples are packed rows of whole documents (data.pack) */
    PackOverlong pack_overlong;  /* --pack-overlong error|truncate (data.pack_overlong) */
    LossReduction loss;          /* --loss per_micro_batch|per_token (train.loss) */
    bool split_given;            /* --split: score PREFIX's validation share as data.split gives it */
    double split[3];             /* --split TRAIN,VALID,TEST */
    bool test;                   /* --test: with --split its test share, else PREFIX whole as data.test (a run's
                                  * test_loss) */
} EvalOptions;

extern const char *const eval_usage_text;

/* argv after "eval". Returns 0 to go on, 1 after --help (printed), 2 on a
 * usage error (reported, naming the option). */
int eval_parse_options(int argc, char **argv, EvalOptions *opt);
/* What the options say together once the run's settings are in (eval_run_settings): a dataset, --pack-overlong only
 * with packing. 0, or 2 (reported). */
int eval_options_check(const EvalOptions *opt);

#endif
