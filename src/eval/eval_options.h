/* eval_options.h: the command line of `megatrain eval` (its --help text,
 * eval_usage_text, says every option) read into EvalOptions. */
#ifndef MT_EVAL_EVAL_OPTIONS_H
#define MT_EVAL_EVAL_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "../config/recipe.h"

typedef struct EvalOptions {
    const char *ckpt;            /* CKPT: a checkpoint, run or checkpoints/ directory */
    const char *data;            /* --data PREFIX */
    long batches;                /* --batches N */
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
    bool test;                   /* --test: with --split, its test share (a run's test_loss) */
} EvalOptions;

extern const char *const eval_usage_text;

/* argv after "eval". Returns 0 to go on, 1 after --help (printed), 2 on a
 * usage error (reported, naming the option). */
int eval_parse_options(int argc, char **argv, EvalOptions *opt);

#endif
