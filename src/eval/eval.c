/* eval.c: `megatrain eval CKPT --data PREFIX`: loads a checkpoint's model
 * config and weights (CKPT a checkpoint directory, or a run or checkpoints/
 * directory: its newest checkpoint, as `convert` takes it), reads batches
 * from a Megatron indexed dataset (used whole, as data.valid is in a
 * recipe) and prints the mean next-token loss:
 *
 *   eval: loss 2.345678 over 8 batches of 4 x 256 tokens (CKPT)
 *
 * with ", packed", ", loss mask: 31.2% of targets counted" and ", per-token
 * mean" before the checkpoint when they apply, or, with --json, one JSON
 * object (print_json says its fields).
 *
 * Batches are drawn exactly as a run's evaluation draws them (train_evaluate
 * in src/train/train_step.c with data.valid = PREFIX): batch i is samples
 * i*B .. i*B+B-1 of the validation loader built with the same seed and
 * seq_len (and data.pack with --pack), read into inputs and targets by the
 * run's own reader (micro_batch_load, src/data/micro_batch.h: an SFT
 * dataset's loss mask leaves only the unmasked targets counted; packed rows
 * give the model each position's place in its document, set_positions).
 * The loss is the mean of the batches' means, or with --loss per_token the
 * sum over every counted target over their number (the batches' targets
 * are counted first, set_loss_tokens(count / batches), as train_evaluate
 * does). --batches all reads every sample of the data once, as
 * train.eval_batches: all: the last batch padded with masked samples and
 * weighed by its samples (src/data/eval_coverage.h). So `eval` with a run's seed, seq_len, micro_batch_size,
 * eval_batches, data.pack and train.loss reproduces that run's eval_loss at
 * the checkpoint's step. The model runs on --device (cpu, the default, in
 * fp32; cuda in bf16, as a run with precision: bf16 computes, which refuses
 * --pack and per_token as run.device: cuda does) through its ModelDevice
 * (src/model/model_device.h); the index is built in memory (no cache
 * files). */
#include "eval.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../ckpt/checkpoint.h"
#include "../config/recipe.h"
#include "../convert/ckpt_latest_dir.h"
#include "../core/json.h"
#include "../core/error.h"
#include "../core/fs.h"
#include "../data/data_loader.h"
#include "../data/dataset_tokenizer.h"
#include "../data/eval_coverage.h"
#include "../data/micro_batch.h"
#include "../dist/grid.h"
#include "../model/model_device.h"
#include "../plan/plan.h"
#include "eval_options.h"
#include "eval_run_settings.h"

/* What an evaluation found. */
typedef struct EvalResult {
    double loss;  /* the mean loss (of the batches' means, or per token) */
    long counted; /* targets that counted in it (not masked, not padding) */
    long empty;   /* batches in which none did (MicroBatch.empty) */
    bool masked;  /* the dataset has a loss mask */
} EvalResult;

/* Batch `batch` of extent into mb (the last of `all` padded: micro_batch_load_part), the model told where its
 * packed samples are; -1 (reported) when a sample holds a token outside the model's vocabulary (the loader checks
 * every token: data_loader_set_vocab). */
static int load_batch(ModelDevice *dev, MicroBatch *mb, const DataLoader *loader, const EvalExtent *extent,
                      long batch) {
    const int32_t *places =
        micro_batch_load_part(mb, loader, (int64_t)batch * mb->size, eval_extent_batch_samples(extent, batch));
    if (mb->refused[0]) {
        mt_error("eval: %s", mb->refused);
        return -1;
    }
    dev->ops->set_positions(dev, places, mb->size, mb->local_len);
    return 0;
}

/* The loss over extent's batches (train_evaluate's on one rank); -1 (reported) on bad data. */
static int evaluate(ModelDevice *dev, const DataLoader *loader, const EvalOptions *opt, const EvalExtent *extent,
                    EvalResult *res) {
    MicroBatch mb;
    micro_batch_init(&mb, (int)opt->micro_batch_size, (int)opt->seq_len, (int)opt->seq_len);
    memset(res, 0, sizeof *res);
    res->masked = data_loader_has_mask(loader);
    int rc = 0;
    const bool per_token = opt->loss == LOSS_PER_TOKEN;
    const long batches = (long)extent->batches;
    if (per_token) { /* every batch's counted targets first: the divisor of each batch's sum */
        double count = 0;
        for (long batch = 0; batch < batches && rc == 0; batch++) {
            rc = load_batch(dev, &mb, loader, extent, batch);
            count += (double)micro_batch_counted(&mb);
        }
        dev->ops->set_loss_tokens(dev, count > 0 ? count / (double)batches : 1.0);
    }
    double loss_sum = 0.0;
    for (long batch = 0; batch < batches && rc == 0; batch++) {
        rc = load_batch(dev, &mb, loader, extent, batch);
        if (rc != 0) break;
        loss_sum += eval_extent_weight(extent, batch, per_token) *
                    dev->ops->forward(dev, mb.inputs, mb.targets, mb.size, mb.local_len);
        res->counted += micro_batch_counted(&mb);
        res->empty += mb.empty;
    }
    micro_batch_free(&mb);
    res->loss = loss_sum / eval_extent_divisor(extent, per_token);
    return rc;
}

/* --json: one object, keys in this order:
 *   checkpoint        the checkpoint directory evaluated (CKPT, or the newest of a run)
 *   step              the step it was saved at, null for weights without a training state (convert)
 *   loss              the mean next-token loss (nats per token, all digits of the double)
 *   perplexity        exp(loss)
 *   batches, micro_batch_size, seq_len: what was read
 *   tokens, samples   what was averaged over: samples x seq_len tokens, samples = batches x micro_batch_size, or
 *                     with --batches all the samples the data holds (the last batch's padding not counted)
 *   data, seed, device: the dataset prefix, the sampling seed, cpu or cuda
 *   loss_reduction    per_micro_batch or per_token (--loss)
 *   pack              whether samples were packed rows (--pack)
 *   masked            whether the dataset has a loss mask (only its unmasked targets counted)
 *   counted           the targets that counted (tokens, less masked ones and packed rows' padding) */
static void print_json(const char *ckpt, const EvalOptions *opt, const EvalExtent *extent, const EvalResult *res) {
    long step = 0;
    char why[512];
    const bool has_step = ckpt_read_step(ckpt, &step, why, sizeof why) == 0;
    JsonWriter w;
    jw_init(&w, 0);
    jw_begin_object(&w);
    jw_key(&w, "checkpoint");
    jw_string(&w, ckpt);
    jw_key(&w, "step");
    if (has_step) jw_int(&w, step);
    else jw_null(&w);
    jw_key(&w, "loss");
    jw_double(&w, res->loss);
    jw_key(&w, "perplexity");
    jw_double(&w, exp(res->loss));
    const struct {
        const char *key;
        int64_t value;
    } counts[] = {{"batches", extent->batches},
                  {"micro_batch_size", opt->micro_batch_size},
                  {"seq_len", opt->seq_len},
                  {"tokens", extent->samples * opt->seq_len},
                  {"samples", extent->samples}};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        jw_key(&w, counts[i].key);
        jw_int(&w, counts[i].value);
    }
    jw_key(&w, "data");
    jw_string(&w, opt->data);
    jw_key(&w, "split"); /* the weights of --split, or null: all of the dataset */
    if (opt->split_given) {
        jw_begin_array(&w);
        for (int i = 0; i < 3; i++) jw_double(&w, opt->split[i]);
        jw_end_array(&w);
    } else {
        jw_null(&w);
    }
    jw_key(&w, "share"); /* which share of --split: "valid" or "test"; "test" with --test alone (all of the
                          * dataset as data.test); null without either */
    if (opt->split_given || opt->test) jw_string(&w, opt->test ? "test" : "valid");
    else jw_null(&w);
    jw_key(&w, "seed");
    jw_uint(&w, opt->seed);
    jw_key(&w, "device");
    jw_string(&w, opt->device);
    jw_key(&w, "loss_reduction");
    jw_string(&w, loss_reduction_name(opt->loss));
    jw_key(&w, "pack");
    jw_bool(&w, opt->pack);
    jw_key(&w, "masked");
    jw_bool(&w, res->masked);
    jw_key(&w, "counted");
    jw_int(&w, res->counted);
    jw_end_object(&w);
    printf("%.*s\n", (int)w.len, w.data);
    jw_free(&w);
}

/* The line: "eval: loss L over N batches of B x T tokens[, all S samples once][, the validation share of split A,B,C |
 * , as test data][, packed][, loss
 * mask: P% of targets counted | , P% of targets counted][, per-token mean] (CKPT)"; the share is said when a mask or
 * padding left targets out (not the masked padding of --batches all's last batch). */
static void print_line(const char *ckpt, const EvalOptions *opt, const EvalExtent *extent, const EvalResult *res) {
    const double tokens = (double)extent->samples * (double)opt->seq_len;
    printf("eval: loss %.6f over %lld batch%s of %ld x %ld tokens", res->loss, (long long)extent->batches,
           extent->batches == 1 ? "" : "es", opt->micro_batch_size, opt->seq_len);
    if (extent->all) printf(", all %lld samples once", (long long)extent->samples);
    if (opt->split_given)
        printf(", the %s share of split %g,%g,%g", opt->test ? "test" : "validation", opt->split[0], opt->split[1],
               opt->split[2]);
    else if (opt->test)
        printf(", as test data"); /* all of --data, sampled as a run's data.test */
    if (opt->pack) printf(", packed");
    if (res->masked || (double)res->counted < tokens)
        printf(", %s%.1f%% of targets counted", res->masked ? "loss mask: " : "",
               100.0 * (double)res->counted / tokens);
    if (opt->loss == LOSS_PER_TOKEN) printf(", per-token mean");
    printf(" (%s)\n", ckpt);
}

/* The device opt asks for: the whole model on a grid of one rank. */
static ModelDeviceSetup device_setup(const ModelConfig *cfg, const EvalOptions *opt, Grid *grid,
                                     const ModelPartition *part) {
    static const ParallelConfig parallel = {.tp = 1, .pp = 1, .vpp = 1, .cp = 1, .ep = 1, .etp = 1};
    return (ModelDeviceSetup){.device = opt->device, .cfg = cfg, .parallel = &parallel, .part = part, .grid = grid,
                              .micro_batch_size = (int)opt->micro_batch_size, .seq_len = (int)opt->seq_len,
                              .precision = DTYPE_BF16, .loss = opt->loss, .packed = opt->pack};
}

/* The device of setup with the checkpoint's weights; NULL (reported). */
static ModelDevice *open_device(const char *ckpt, const ModelDeviceSetup *setup) {
    char err[4096];
    ModelDevice *dev = model_device_create(setup, err, sizeof err);
    if (!dev) {
        mt_error("eval (--device %s): %s", setup->device, err);
        return NULL;
    }
    if (ckpt_load_model(ckpt, dev->host, err, sizeof err) != 0) {
        mt_error("eval: %s", err);
        model_device_free(dev);
        return NULL;
    }
    dev->ops->from_host(dev);
    return dev;
}

/* The validation loader of opt's dataset, as a run with data.valid = PREFIX opens it (data.test = PREFIX with
 * --test), or with --split as a run with data.train = PREFIX and that data.split (its test share with --test);
 * NULL (reported). */
static DataLoader *open_data(const EvalOptions *opt) {
    DataConfig data;
    memset(&data, 0, sizeof data);
    DataSource *source;
    if (opt->split_given) {
        data.num_train = 1;
        source = &data.train[0];
        memcpy(data.split, opt->split, sizeof data.split);
    } else if (opt->test) {
        data.num_test = 1;
        source = &data.test[0];
        data.split[0] = 1.0; /* unused with data.test; a valid split for the loader's checks */
    } else {
        data.num_valid = 1;
        source = &data.valid[0];
        data.split[0] = 1.0; /* unused with data.valid; a valid split for the loader's checks */
    }
    snprintf(source->path, sizeof source->path, "%s", opt->data);
    source->weight = 1.0;
    data.cache_dir[0] = '\0';
    data.pack = opt->pack;
    data.pack_overlong = opt->pack_overlong;
    char err[4096];
    const DataSplit split = opt->test ? SPLIT_TEST : SPLIT_VALID;
    DataLoader *loader =
        opt->batches == MT_EVAL_BATCHES_ALL
            ? data_loader_create_whole(&data, split, (int)opt->seq_len, opt->seed, err, sizeof err)
            : data_loader_create(&data, split, (int)opt->seq_len, opt->seed, opt->batches * opt->micro_batch_size, err,
                                 sizeof err);
    if (!loader) { /* the loader names recipe keys; say which options they are here */
        const char *key = strstr(err, "data.valid[0].path: ") == err   ? "data.valid[0].path: "
                          : strstr(err, "data.test[0].path: ") == err  ? "data.test[0].path: "
                          : strstr(err, "data.train[0].path: ") == err ? "data.train[0].path: " : NULL;
        mt_error("eval: %s%s%s", key ? "--data: " : "", key ? err + strlen(key) : err,
                 strstr(err, "data.pack_overlong") ? " (here: --pack-overlong, --seq-len)" : "");
    }
    return loader;
}

/* A warning when the --batches x --micro-batch-size samples read some of the data twice (eval_coverage.h). */
static void warn_repeats(const DataLoader *loader, const EvalOptions *opt) {
    char data[MT_PATH_MAX + 80], msg[MT_PATH_MAX + 1200];
    snprintf(data, sizeof data, "%s--data %s", opt->split_given ? opt->test ? "the test share (--split) of "
                                                                            : "the validation share (--split) of "
                                                    : opt->test ? "the test data " : "",
             opt->data);
    const EvalCoverageNames names = {data, "--batches", "--micro-batch-size", "--seq-len", "the loss"};
    if (opt->batches != MT_EVAL_BATCHES_ALL && eval_coverage_repeats(loader, opt->batches, opt->micro_batch_size, &names, msg, sizeof msg))
        mt_warn("eval: %s", msg);
}

/* --data against the tokenizer.json the checkpoint carries (src/data/dataset_tokenizer.h); -1 (reported). */
static int check_tokenizer(const char *ckpt, const char *data) {
    CkptHfFiles files = {0};
    char err[4096], source[MT_PATH_MAX + 80];
    int rc = ckpt_hf_files_read(ckpt, &files, err, sizeof err);
    const CkptHfFile *tok = rc == 0 ? ckpt_hf_files_find(&files, "tokenizer.json") : NULL;
    snprintf(source, sizeof source, "the checkpoint %s", ckpt);
    if (rc == 0 && tok) rc = dataset_tokenizer_check(data, "--data", tok->data, tok->size, source, err, sizeof err);
    if (rc > 0) mt_warn("eval: %s", err); /* a stale record: ignored */
    else if (rc != 0) mt_error("eval: %s", err);
    rc = rc > 0 ? 0 : rc;
    ckpt_hf_files_free(&files);
    return rc;
}

/* Before anything is allocated: the model and its batch fit one process's memory (the host's RAM and swap; the GPU's
 * with --device cuda), by the estimate of a run's check (plan.h: eval's model device is one rank of a one-rank run;
 * on the CPU its weights and activations alone). 0, or 2 (reported, naming the options). */
static int check_memory(const ModelConfig *cfg, const EvalOptions *opt) {
    static Recipe r;
    recipe_set_defaults(&r);
    r.model = *cfg;
    snprintf(r.run.device, sizeof r.run.device, "%s", opt->device);
    r.precision = strcmp(opt->device, "cuda") == 0 ? DTYPE_BF16 : DTYPE_FP32;
    r.train.seq_len = (int)opt->seq_len;
    r.train.micro_batch_size = (int)opt->micro_batch_size;
    r.train.num_batch_stages = 1;
    r.train.batch_stages[0] = (BatchStage){.start = 0, .global_batch_size = opt->micro_batch_size};
    r.train.loss = opt->loss;
    r.data.pack = opt->pack;
    const double available = plan_rank_memory(&r), GiB = 1073741824.0;
    if (!(available > 0)) return 0; /* unknown: the allocation itself says */
    Plan *p = mt_malloc(sizeof *p);
    char err[512];
    const bool planned = plan_compute(p, &r, 1, err, sizeof err) == 0;
    /* on the CPU what a forward touches: the weights and the activations (the gradients and AdamW states a model
     * device allocates stay untouched, zero pages that take no memory); a GPU's one arena is allocated whole */
    const PlanStage *st = &p->stages[0];
    const double need = !planned ? 0 : p->gpu ? st->total_bytes
                                              : st->weight_bytes + st->activation_bytes + st->logits_bytes;
    const bool over = planned && need > available;
    if (over)
        mt_error("eval: --micro-batch-size %ld x --seq-len %ld: the model and its batch need about %.1f GiB, more "
                 "than %s (%.1f GiB): give a smaller --micro-batch-size (or --seq-len)", opt->micro_batch_size,
                 opt->seq_len, need / GiB, p->gpu ? "the device's memory" : "this host's memory and swap",
                 available / GiB);
    free(p);
    return over ? MT_EXIT_USAGE : 0;
}

/* --data PREFIX as the command line gives it: its PREFIX.idx there, said before the checks of the options and the
 * model (not there: usage, as data inspect's; there but not to be read: a failure). 0, or the exit status. */
static int check_data_path(const EvalOptions *opt) {
    if (!(opt->given & EVAL_GAVE_DATA)) return 0; /* the run's own dataset: its loader says what is wrong */
    char idx[MT_PATH_MAX + 8];
    struct stat st;
    snprintf(idx, sizeof idx, "%s.idx", opt->data);
    if (stat(idx, &st) == 0) return 0;
    const int e = errno;
    mt_error("eval: --data: %s: cannot open: %s (expected the PREFIX of a dataset, PREFIX.idx and PREFIX.bin, as "
             "`megatrain data build` writes)", idx, strerror(e));
    return mt_path_stat_status(e);
}

int eval_main(int argc, char **argv) {
    EvalOptions opt;
    int rc = eval_parse_options(argc, argv, &opt);
    if (rc == 1) return MT_EXIT_OK;
    if (rc != 0) return MT_EXIT_USAGE;
    mt_log_enabled = 0; /* stdout is the result alone: no loader lines (packing, index building) before it */

    struct stat st;
    if (stat(opt.ckpt, &st) != 0) { /* a path the command line names that is not there: usage, as every command's;
                                     * one that cannot be read (no permission): a failure */
        const int e = errno, status = mt_path_stat_status(e);
        mt_error("eval: %s: %s (%s)", opt.ckpt,
                 status == MT_EXIT_USAGE ? "no such checkpoint directory" : "cannot read the checkpoint directory",
                 strerror(e));
        return status;
    }
    if (!S_ISDIR(st.st_mode)) {
        mt_error("eval: %s: not a directory (expected a checkpoint, run or checkpoints/ directory)", opt.ckpt);
        return MT_EXIT_USAGE;
    }
    if ((rc = check_data_path(&opt)) != 0) return rc;
    char err[4096], ckpt[MT_PATH_MAX + 64];
    if (ckpt_latest_dir(opt.ckpt, ckpt, sizeof ckpt, err, sizeof err) != 0) {
        mt_error("eval: %s", err);
        return MT_EXIT_FAILURE;
    }
    if (eval_run_settings(ckpt, &opt) != 0 || eval_options_check(&opt) != 0) return MT_EXIT_USAGE;
    ModelConfig cfg;
    if (ckpt_read_model_config(ckpt, &cfg, err, sizeof err) != 0) {
        mt_error("eval: %s", err);
        return MT_EXIT_FAILURE;
    }
    if (opt.seq_len > cfg.max_position_embeddings) { /* as a run refuses train.seq_len above it */
        mt_error("eval: --seq-len: expected at most the model's max_position_embeddings (%d), found %ld%s",
                 cfg.max_position_embeddings, opt.seq_len,
                 opt.seq_len_given ? "" : " (the default: give --seq-len, e.g. the run's train.seq_len)");
        return MT_EXIT_USAGE;
    }

    if (check_tokenizer(ckpt, opt.data) != 0) return MT_EXIT_FAILURE;
    eval_note_run_settings(ckpt, &opt);
    if (check_memory(&cfg, &opt) != 0) return MT_EXIT_USAGE;

    /* the whole model on this process: a grid of one rank */
    Grid grid;
    GridLayout layout;
    grid_layout(1, 1, 1, 1, &layout, err, sizeof err);
    grid_create(&grid, &layout, comm_world());
    const ModelPartition part = model_partition_whole(&cfg);
    const ModelDeviceSetup setup = device_setup(&cfg, &opt, &grid, &part);
    const int status = model_device_check(&setup, err, sizeof err); /* what the device cannot run, before the data */
    if (status != 0) {
        const bool per_token = opt.loss == LOSS_PER_TOKEN;
        mt_error("eval (--device %s%s%s): %s", opt.device, opt.pack ? " --pack" : "",
                 per_token ? " --loss per_token" : "", err);
        grid_free(&grid);
        return status;
    }
    DataLoader *loader = open_data(&opt); /* a missing --data was said first (check_data_path) */
    if (loader) data_loader_set_vocab(loader, cfg.vocab_size);
    if (loader) warn_repeats(loader, &opt);
    const EvalExtent extent = loader ? eval_extent(loader, opt.batches, opt.micro_batch_size) : (EvalExtent){0};
    if (loader && extent.batches == 0) { /* --batches all of data shorter than one sample */
        mt_error("eval: --batches all: %s holds no whole sample of --seq-len + 1 = %ld tokens: give a smaller "
                 "--seq-len", opt.data, opt.seq_len + 1);
        data_loader_free(loader);
        grid_free(&grid);
        return MT_EXIT_USAGE;
    }
    ModelDevice *dev = loader ? open_device(ckpt, &setup) : NULL;
    EvalResult res;
    rc = dev ? evaluate(dev, loader, &opt, &extent, &res) : -1;
    model_device_free(dev);
    grid_free(&grid);
    if (loader) data_loader_free(loader);
    if (rc != 0) return MT_EXIT_FAILURE;
    if (res.counted == 0) { /* a mean over no target: no loss to report (it read 0) */
        mt_error("eval: no target counted in the %lld batch%s of %ld x %ld tokens (the loss mask or the packed rows' "
                 "padding left none): no loss to report; give more --batches or a longer --seq-len",
                 (long long)extent.batches, extent.batches == 1 ? "" : "es", opt.micro_batch_size, opt.seq_len);
        return MT_EXIT_FAILURE;
    }
    if (res.empty > 0 && opt.loss == LOSS_PER_MICRO_BATCH) /* train_step.c's say_empty_batches, for this command */
        fprintf(stderr, "eval: note: %ld of the %ld batches hold no target that counts (every target masked by the "
                "data's loss mask, or padding): each counts as loss 0 in the mean (--loss per_micro_batch), which "
                "lowers it; --loss per_token weighs every counted token alike\n", res.empty, (long)extent.batches);
    if (opt.json) print_json(ckpt, &opt, &extent, &res);
    else print_line(ckpt, &opt, &extent, &res);
    if (!isfinite(res.loss)) {
        mt_error("eval: the loss is %g (the checkpoint's weights are not finite?)", res.loss);
        return MT_EXIT_FAILURE;
    }
    return MT_EXIT_OK;
}
