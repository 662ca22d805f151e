/* eval_options.c: `megatrain eval`'s command line: --help, the options
 * with a value (--name VALUE or --name=VALUE), the flags, and a usage error
 * naming the option for anything else. */
#include "eval_options.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/cli.h"
#include "../core/error.h"
#include "../model/model_device.h"

#define DEFAULT_BATCHES 8
#define DEFAULT_SEQ_LEN 256
#define DEFAULT_MICRO_BATCH 4
#define DEFAULT_SEED 1234 /* run.seed's default in recipes */

const char *const eval_usage_text =
    "usage: megatrain eval CKPT [--data PREFIX] [--split TRAIN,VALID,TEST] [--test] [--batches N|all] [--seq-len T]\n"
    "                           [--micro-batch-size B] [--seed S] [--pack|--no-pack [--pack-overlong error|truncate]]\n"
    "                           [--loss per_micro_batch|per_token] [--device D] [--json]\n"
    "\n"
    "Print the mean next-token loss (6 decimals) of the model in checkpoint CKPT over\n"
    "N batches of B samples of T tokens from the Megatron dataset PREFIX (.bin/.idx),\n"
    "used whole and read as a run reads data.valid, or its validation share with\n"
    "--split. A run's checkpoint gives what the command line leaves out from the run's\n"
    "recipe (its seed, seq_len, micro_batch_size, eval_batches, data.pack, train.loss, and\n"
    "without --data its data.valid, or its data.train with data.split; with --test its\n"
    "data.test or data.split's test share), so that `megatrain eval RUN_DIR` prints its\n"
    "eval_loss (and `--test` its test_loss); a line on stderr says what was taken,\n"
    "and a note which options would give the run's eval_loss when those given do not.\n"
    "A dataset with a loss mask (data build --format sft: PREFIX_mask.{bin,idx}) is\n"
    "scored on its unmasked targets only. CKPT is a checkpoint directory, or a run (or\n"
    "checkpoints/) directory: its newest checkpoint. The defaults below are those of a\n"
    "checkpoint without a recipe (a conversion's).\n"
    "\n"
    "  --data PREFIX           the dataset (required without a run's recipe, and for a run that evaluated\n"
    "                          on a blend of datasets)\n"
    "  --split W               TRAIN,VALID,TEST weights (e.g. 98,2,0; a missing share is 0): score the documents that a run with\n"
    "                          data.train PREFIX and this data.split validates on (default: all of PREFIX,\n"
    "                          as data.valid)\n"
    "  --test                  score test data instead, as a run's test_loss: with --split its test\n"
    "                          share, else all of PREFIX (as data.test)\n"
    "  --batches N             batches to average over (default 8); all: every sample of the data once, in\n"
    "                          ceil(samples / B) batches, the last one's places past the data's end masked\n"
    "                          padding and its loss weighed by its samples (as train.eval_batches: all)\n"
    "  --seq-len T             tokens per sample (default 256; at most the model's\n"
    "                          max_position_embeddings)\n"
    "  --micro-batch-size B    samples per batch (default 4)\n"
    "  --seed S                the sampling seed (default 1234, as run.seed)\n"
    "  --pack                  a sample is a row of whole documents packed first-fit decreasing, each\n"
    "                          attending to itself only (as data.pack: true; cpu only); --no-pack: not\n"
    "  --pack-overlong P       with --pack, a document longer than T + 1 tokens: error (the default)\n"
    "                          or truncate to its first T + 1 (as data.pack_overlong)\n"
    "  --loss L                per_micro_batch (the default: the mean of the batches' mean losses) or\n"
    "                          per_token (the sum over every counted target of all batches over their\n"
    "                          number), as train.loss; per_token is cpu only\n"
    "  --device D              cpu (default; fp32) or cuda (one GPU, bf16 as a run computes there)\n"
    "  --json                  print one JSON object instead: checkpoint, step, loss, perplexity,\n"
    "                          batches, micro_batch_size, seq_len, tokens, samples, data, split, share, seed,\n"
    "                          device, loss_reduction, pack, masked, counted\n";

/* A positive integer option value; -1 (reported, with `besides`: the word it takes too) when it is not one. */
static long parse_positive(const char *name, const char *text, long max, const char *besides) {
    char *end = NULL;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value <= 0 || value > max) {
        mt_error("eval: %s: expected a positive integer up to %ld%s%s, found '%s'", name, max, besides[0] ? " " : "",
                 besides, text);
        return -1;
    }
    return value;
}

/* The options that take a value, in the order of names[]. */
enum { OPT_DATA, OPT_BATCHES, OPT_SEQ_LEN, OPT_MICRO_BATCH, OPT_SEED, OPT_DEVICE, OPT_PACK_OVERLONG, OPT_LOSS,
       OPT_SPLIT, NUM_VALUE_OPTIONS };
static const char *const names[NUM_VALUE_OPTIONS] = {"--data",   "--batches", "--seq-len",        "--micro-batch-size",
                                                     "--seed",   "--device",  "--pack-overlong", "--loss",
                                                     "--split"};

/* Option k's value into opt. Returns 0, or 2 (reported). */
static int set_value(EvalOptions *opt, int k, const char *value) {
    switch (k) {
    case OPT_DATA: opt->data = value; opt->given |= EVAL_GAVE_DATA; return 0;
    case OPT_BATCHES:
        opt->given |= EVAL_GAVE_BATCHES;
        if (strcmp(value, "all") == 0) { /* as train.eval_batches: all */
            opt->batches = MT_EVAL_BATCHES_ALL;
            return 0;
        }
        opt->batches = parse_positive(names[k], value, 1L << 30, "or all");
        return opt->batches < 0 ? 2 : 0;
    case OPT_SEQ_LEN:
        opt->seq_len = parse_positive(names[k], value, 1L << 20, "");
        opt->seq_len_given = true;
        opt->given |= EVAL_GAVE_SEQ_LEN;
        return opt->seq_len < 0 ? 2 : 0;
    case OPT_MICRO_BATCH:
        opt->micro_batch_size = parse_positive(names[k], value, 1L << 16, "");
        opt->given |= EVAL_GAVE_MICRO_BATCH;
        return opt->micro_batch_size < 0 ? 2 : 0;
    case OPT_DEVICE: opt->device = value; return 0;
    case OPT_SPLIT: {
        opt->split_given = true;
        opt->given |= EVAL_GAVE_SPLIT;
        if (data_split_parse(value, opt->split) == 0 && opt->split[0] > 0) return 0; /* the share: check_options */
        mt_error("eval: --split: expected TRAIN,VALID,TEST weights with positive TRAIN and VALID (as data.split, e.g. "
                 "98,2,0, a missing share 0; with --test a positive TEST), found '%s'", value);
        return 2;
    }
    case OPT_PACK_OVERLONG:
        opt->given |= EVAL_GAVE_PACK_OVERLONG;
        if (pack_overlong_parse(value, &opt->pack_overlong) == 0) return 0;
        mt_error("eval: --pack-overlong: expected %s or %s, found '%s'", pack_overlong_name(PACK_OVERLONG_ERROR),
                 pack_overlong_name(PACK_OVERLONG_TRUNCATE), value);
        return 2;
    case OPT_LOSS:
        opt->given |= EVAL_GAVE_LOSS;
        if (loss_reduction_parse(value, &opt->loss) == 0) return 0;
        mt_error("eval: --loss: expected %s or %s, found '%s'", loss_reduction_name(LOSS_PER_MICRO_BATCH),
                 loss_reduction_name(LOSS_PER_TOKEN), value);
        return 2;
    case OPT_SEED: {
        char *end = NULL;
        errno = 0;
        unsigned long long seed = strtoull(value, &end, 10);
        if (errno != 0 || end == value || *end != '\0' || value[0] == '-') {
            mt_error("eval: --seed: expected a non-negative integer, found '%s'", value);
            return 2;
        }
        opt->seed = (uint64_t)seed;
        opt->given |= EVAL_GAVE_SEED;
        return 0;
    }
    default: return 2;
    }
}

/* What the options say together. Returns 0, or 2 (reported). */
static int check_options(const EvalOptions *opt) {
    if (!opt->ckpt || !opt->ckpt[0]) {
        mt_error("eval: missing CKPT (a checkpoint, run or checkpoints/ directory)\n%s", eval_usage_text);
        return 2;
    }
    if (opt->data && !opt->data[0]) {
        mt_error("eval: --data: expected a dataset PREFIX, found an empty one\n%s", eval_usage_text);
        return 2;
    }
    if (!model_device_exists(opt->device)) {
        mt_error("eval: --device: expected cpu or cuda, found '%s'", opt->device);
        return 2;
    }
    return 0;
}

int eval_options_check(const EvalOptions *opt) {
    if ((opt->given & EVAL_GAVE_PACK_OVERLONG) && !opt->pack) {
        mt_error("eval: --pack-overlong: only with --pack (it says what packing does with an overlong document)");
        return 2;
    }
    if (opt->split_given && !(opt->split[opt->test ? 2 : 1] > 0)) {
        mt_error("eval: --split: expected TRAIN,VALID,TEST weights with positive TRAIN and %s (as data.split, e.g. "
                 "%s), found %g,%g,%g", opt->test ? "TEST (--test scores it)" : "VALID", opt->test ? "98,1,1" : "98,2,0",
                 opt->split[0], opt->split[1], opt->split[2]);
        return 2;
    }
    if (opt->data && strlen(opt->data) >= MT_PATH_MAX) {
        mt_error("eval: --data: the prefix is longer than %d characters", MT_PATH_MAX - 1);
        return 2;
    }
    if (opt->micro_batch_size * opt->seq_len > INT_MAX / 2) {
        mt_error("eval: --micro-batch-size x --seq-len (%ld x %ld) is too large", opt->micro_batch_size,
                 opt->seq_len);
        return 2;
    }
    if (!opt->data) {
        mt_error("eval: --data PREFIX is required: %s is no run's checkpoint with one dataset to evaluate on\n%s",
                 opt->ckpt, eval_usage_text);
        return 2;
    }
    return 0;
}

int eval_parse_options(int argc, char **argv, EvalOptions *opt) {
    memset(opt, 0, sizeof *opt);
    opt->batches = DEFAULT_BATCHES;
    opt->seq_len = DEFAULT_SEQ_LEN;
    opt->micro_batch_size = DEFAULT_MICRO_BATCH;
    opt->seed = DEFAULT_SEED;
    opt->device = "cpu";
    opt->pack_overlong = PACK_OVERLONG_ERROR;
    opt->loss = LOSS_PER_MICRO_BATCH;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(eval_usage_text, stdout);
            return 1;
        }
        if (strcmp(a, "--json") == 0) {
            opt->json = true;
            continue;
        }
        if (strcmp(a, "--pack") == 0 || strcmp(a, "--no-pack") == 0) {
            opt->pack = strcmp(a, "--pack") == 0;
            opt->given |= EVAL_GAVE_PACK;
            continue;
        }
        if (strcmp(a, "--test") == 0) {
            opt->test = true;
            continue;
        }
        if (a[0] != '-' || a[1] == '\0') {
            if (opt->ckpt) {
                mt_error("eval: unexpected argument '%s' (checkpoint already given as '%s')\n%s", a, opt->ckpt,
                         eval_usage_text);
                return 2;
            }
            opt->ckpt = a;
            continue;
        }
        int k = 0;
        size_t n = 0;
        for (; k < NUM_VALUE_OPTIONS; k++) {
            n = strlen(names[k]);
            if (strncmp(a, names[k], n) == 0 && (a[n] == '\0' || a[n] == '=')) break;
        }
        if (k == NUM_VALUE_OPTIONS) {
            cli_unknown_option("eval", a, eval_usage_text);
            return 2;
        }
        const char *value = a[n] == '=' ? a + n + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!value) {
            mt_error("eval: %s needs a value\n%s", names[k], eval_usage_text);
            return 2;
        }
        if (k == OPT_DATA && opt->data) { /* as the other options, the last would win: a blend's datasets, silently */
            mt_error("eval: --data given twice (eval scores one dataset: a blend's datasets are evaluated one at a "
                     "time)");
            return 2;
        }
        if (set_value(opt, k, value) != 0) return 2;
    }
    return check_options(opt);
}
