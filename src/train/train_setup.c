/* train_setup.c: building and tearing down a TrainContext for a fresh run
 * (run.dir, the resolved recipe.yaml, data loaders, model, optimizer); the
 * part a resumed run shares (train_setup_common) is here too. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../ckpt/ckpt_fs.h"
#include "../ckpt/ckpt_run.h"
#include "../convert/ckpt_latest_dir.h"
#include "../convert/hf_config.h"
#include "../convert/init_from.h"
#include "../core/error.h"
#include "../core/timer.h"
#include "../core/fs.h"
#include "../data/dataset_tokenizer.h"
#include "../data/eval_coverage.h"
#include "../dist/comm.h"
#include "../plan/plan.h"
#include "../config/batch_schedule.h"
#include "../config/recipe_schema.h"
#include "train_context.h"
#include "run_notes.h"
#include "train_data_record.h"

/* mkdir -p for run.dir, with the key named in any error; *made: the shallowest directory it made (mt_make_dirs_made). */
static int make_dirs(const char *path, char *made, size_t madelen, char *err, size_t errlen) {
    char why[MT_PATH_MAX + 256];
    if (mt_make_dirs_made(path, made, madelen, why, sizeof why) == 0) return 0;
    mt_set_error(err, errlen, "run.dir: %s", why);
    return -1;
}

/* A fresh run starts a fresh metrics.jsonl (metrics_open appends). */
static int truncate_metrics(const char *run_dir, char *err, size_t errlen) {
    char path[MT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    FILE *f = mt_fopen_output(path, false, err, errlen);
    if (!f) return -1;
    fclose(f);
    return 0;
}

/* Rank 0: a warning when train.eval_batches x train.micro_batch_size samples read some of loader twice. */
static void warn_eval_repeats(const TrainContext *ctx, const DataLoader *loader, const char *data, const char *loss) {
    const EvalCoverageNames names = {data, "train.eval_batches", "train.micro_batch_size", "train.seq_len", loss};
    char msg[1024];
    if (comm_world()->rank == 0 && ctx->recipe->train.eval_batches != MT_EVAL_BATCHES_ALL &&
        eval_coverage_repeats(loader, ctx->recipe->train.eval_batches, ctx->recipe->train.micro_batch_size, &names,
                              msg, sizeof msg))
        mt_warn("%s", msg);
}

/* The loader of an evaluation's data: for train.eval_batches all, every sample it holds once
 * (data_loader_create_whole), else enough for the batches. */
static DataLoader *open_eval_loader(const TrainContext *ctx, DataSplit split, char *err, size_t errlen) {
    const Recipe *recipe = ctx->recipe;
    const TrainConfig *train = &recipe->train;
    if (train->eval_batches == MT_EVAL_BATCHES_ALL)
        return data_loader_create_whole(&recipe->data, split, train->seq_len, recipe->run.seed, err, errlen);
    const int64_t samples = (int64_t)train->eval_batches * train->micro_batch_size * ctx->layout.dp_size;
    return data_loader_create(&recipe->data, split, train->seq_len, recipe->run.seed, samples, err, errlen);
}

/* What test_loss scores: data.test, or data.split's test share of data.train (recipe_validate: not both). */
const char *train_test_data_name(const DataConfig *data) {
    return data->num_test > 0 ? "data.test" : "data.split's test share of data.train";
}

/* Open ctx->valid_data when evaluation is on; it stays NULL (with a warning)
 * when there is no validation data. With evaluation on, data.test or
 * data.split's test share (of data.train; none beside data.valid) opens
 * ctx->test_data, for one evaluation after the last step (agree_test_data:
 * every rank has it or none does). data.test that cannot be opened is an
 * error, as data.valid is; a split's test share a warning. Returns 0, or -1
 * with err set. */
static int open_valid_data(TrainContext *ctx, char *err, size_t errlen) {
    const Recipe *recipe = ctx->recipe;
    const TrainConfig *train = &recipe->train;
    if (train->eval_interval <= 0 || train->eval_batches == 0) return 0;
    const bool own_test = recipe->data.num_test > 0;
    const bool test_share = own_test || (recipe->data.num_valid == 0 && recipe->data.split[2] > 0.0);
    const char *test_name = train_test_data_name(&recipe->data);
    char loader_err[1024];
    if (recipe->data.num_valid == 0 && !(recipe->data.split[1] > 0.0)) {
        if (comm_world()->rank == 0) /* (before rank 0 alone logs: setup_common) */
            mt_warn("evaluation is off during training: train.eval_interval is %ld but there is no validation data "
                    "(data.valid is null and data.split gives it no share)%s%s%s", train->eval_interval,
                    test_share ? "; " : "", test_share ? test_name : "",
                    test_share ? " is evaluated after the last step" : "");
    } else {
        ctx->valid_data = open_eval_loader(ctx, SPLIT_VALID, loader_err, sizeof loader_err);
        if (!ctx->valid_data) {
            mt_set_error(err, errlen, "validation data: %s", loader_err);
            return -1;
        }
        ctx->valid_extent = eval_extent(ctx->valid_data, train->eval_batches, train->micro_batch_size);
        if (ctx->valid_extent.batches == 0) {
            mt_set_error(err, errlen, "train.eval_batches: all: the validation data (%s) holds no whole sample of "
                         "train.seq_len + 1 = %d tokens: give a smaller seq_len, or more validation data",
                         recipe->data.num_valid > 0 ? "data.valid" : "data.split's validation share of data.train",
                         train->seq_len + 1);
            return -1;
        }
        warn_eval_repeats(ctx, ctx->valid_data, recipe->data.num_valid > 0 ? "data.valid" : "data.split's validation "
                          "share of data.train", "eval_loss");
    }
    if (!test_share) return 0;
    ctx->test_data = open_eval_loader(ctx, SPLIT_TEST, loader_err, sizeof loader_err);
    if (ctx->test_data) ctx->test_extent = eval_extent(ctx->test_data, train->eval_batches, train->micro_batch_size);
    if (!ctx->test_data && own_test) {
        mt_set_error(err, errlen, "test data: %s", loader_err);
        return -1;
    } else if (!ctx->test_data) {
        mt_warn("no test evaluation: data.split's test share: %s", loader_err);
    } else if (ctx->test_extent.batches == 0 && own_test) {
        mt_set_error(err, errlen, "train.eval_batches: all: the test data (data.test) holds no whole sample of "
                     "train.seq_len + 1 = %d tokens: give a smaller seq_len, or more test data", train->seq_len + 1);
        return -1;
    } else if (ctx->test_extent.batches == 0) { /* every rank alike: the count is the data's */
        mt_warn("no test evaluation: train.eval_batches: all: data.split's test share holds no whole sample of "
                "train.seq_len + 1 = %d tokens", train->seq_len + 1);
        data_loader_free(ctx->test_data);
        ctx->test_data = NULL;
    } else {
        warn_eval_repeats(ctx, ctx->test_data, test_name, "test_loss");
    }
    return 0;
}

/* Collective, after the ranks agreed on their data: every rank keeps the test share's loader or none does (its
 * evaluation after the last step is collective; a rank that could not open it said why). */
static void agree_test_data(TrainContext *ctx) {
    if (ctx->layout.world_size <= 1) return;
    double have = ctx->test_data ? 1.0 : 0.0;
    comm_all_reduce_sum_double(comm_world(), &have, 1);
    if (have == 0.0 || have == (double)ctx->layout.world_size) return;
    if (ctx->test_data) {
        mt_log_warn("no test evaluation: another rank could not open %s", train_test_data_name(&ctx->recipe->data));
        data_loader_free(ctx->test_data);
        ctx->test_data = NULL;
    }
}

/* The first VOCAB_CHECK_TOKENS tokens of each dataset inside the model's vocabulary (a dataset of another
 * tokenizer is refused here, naming it, rather than at its first out-of-range token in a forward); the loaders
 * check every token they read after that (a token further on stops the run at the step that reads it, naming it:
 * micro_batch.h, TRAIN_DATA_REFUSED). */
#define VOCAB_CHECK_TOKENS ((int64_t)1 << 24)
static int check_vocab(const TrainContext *ctx, char *err, size_t errlen) {
    const int V = ctx->recipe->model.vocab_size;
    char why[1536];
    if (data_loader_check_vocab(ctx->train_data, V, VOCAB_CHECK_TOKENS, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "training data: %s", why);
        return -1;
    }
    /* validation and test from data.split read the training datasets, checked above */
    if (ctx->valid_data && ctx->recipe->data.num_valid > 0 && data_loader_check_vocab(ctx->valid_data, V, VOCAB_CHECK_TOKENS, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "validation data: %s", why);
        return -1;
    }
    if (ctx->test_data && ctx->recipe->data.num_test > 0 &&
        data_loader_check_vocab(ctx->test_data, V, VOCAB_CHECK_TOKENS, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "test data: %s", why);
        return -1;
    }
    data_loader_set_vocab(ctx->train_data, V);
    if (ctx->valid_data) data_loader_set_vocab(ctx->valid_data, V);
    if (ctx->test_data) data_loader_set_vocab(ctx->test_data, V);
    return 0;
}

/* Each dataset of `data` against `tok` (a tokenizer.json), dataset_tokenizer_check's way: -1 with err for one
 * that another tokenizer made; a stale record is warned about (by rank 0) and passes. */
static int check_datasets(const DataConfig *data, const CkptHfFile *tok, const char *model_source, char *err,
                          size_t errlen) {
    const struct {
        const char *key;
        const DataSource *sources;
        int count;
    } lists[] = {{"train", data->train, data->num_train}, {"valid", data->valid, data->num_valid},
                 {"test", data->test, data->num_test}};
    char what[64];
    for (size_t l = 0; l < sizeof lists / sizeof lists[0]; l++)
        for (int i = 0; i < lists[l].count; i++) {
            snprintf(what, sizeof what, "data.%s[%d]", lists[l].key, i);
            const int rc = dataset_tokenizer_check(lists[l].sources[i].path, what, tok->data, tok->size, model_source,
                                                   err, errlen);
            if (rc < 0) return -1;
            if (rc > 0 && comm_world()->rank == 0) mt_warn("%s", err);
        }
    return 0;
}

int train_check_data_tokenizer(const Recipe *recipe, const char *ckpt_dir, const char *model_source, char *err,
                               size_t errlen) {
    char dir[MT_PATH_MAX + 64], why[1024], source[MT_PATH_MAX + 128];
    CkptHfFiles files = {0};
    if (ckpt_latest_dir(ckpt_dir, dir, sizeof dir, why, sizeof why) != 0 ||
        ckpt_hf_files_read(dir, &files, why, sizeof why) != 0)
        return 0; /* the load that follows says what is wrong */
    const CkptHfFile *tok = ckpt_hf_files_find(&files, "tokenizer.json");
    snprintf(source, sizeof source, "%s %s", model_source, dir);
    const int rc = tok ? check_datasets(&recipe->data, tok, source, err, errlen) : 0;
    ckpt_hf_files_free(&files);
    return rc;
}

/* The most micro-batches a step of the batch schedule has on this rank. */
static int max_micro_batches(const TrainContext *ctx) {
    const TrainConfig *train = &ctx->recipe->train;
    long most = 1;
    for (int i = 0; i < train->num_batch_stages; i++) {
        const long m = train->batch_stages[i].global_batch_size / ((long)train->micro_batch_size * ctx->layout.dp_size);
        if (m > most) most = m;
    }
    return (int)most;
}

/* pp > 1: the executor over the device's stage steps, with the activations of every micro-batch this stage keeps
 * in flight allocated now, not mid-step (after the device's communicators: clones copy them). */
static void setup_pipeline(TrainContext *ctx) {
    const ModelDevice *d = ctx->device;
    pipeline_init(&ctx->pipe, &ctx->grid.groups[GROUP_PP], ctx->layout.vpp, d->stage_base, d->ops->stage);
    const int sets = pipeline_reserve(&ctx->pipe, max_micro_batches(ctx));
    char size[64] = "";
    const double bytes = (double)d->ops->stage->slot_bytes(d->stage_base);
    if (bytes >= 0.01 * 1073741824.0) snprintf(size, sizeof size, " of %.2f GiB", bytes / 1073741824.0);
    else if (bytes > 0) snprintf(size, sizeof size, " of %.2f MiB", bytes / 1048576.0);
    /* said in the banner (print_banner), after the run's header */
    snprintf(ctx->pipeline_note, sizeof ctx->pipeline_note,
             "pipeline parallel: %d stages on %s, activations sent with %s; stage 0 keeps %d activation set%s%s",
             ctx->layout.pp, d->ops->name, d->ops->stage->transport(d->stage_base), sets, sets == 1 ? "" : "s", size);
}

/* What run.device's model is made from: the recipe and this rank's part of the grid. */
static ModelDeviceSetup device_setup_of(const TrainContext *ctx, const Recipe *recipe) {
    /* With context parallel a rank holds seq_len / cp tokens of each sample. */
    return (ModelDeviceSetup){.device = recipe->run.device,
                              .cfg = &recipe->model,
                              .parallel = &recipe->parallel,
                              .part = &ctx->part,
                              .grid = &ctx->grid,
                              .micro_batch_size = recipe->train.micro_batch_size,
                              .seq_len = recipe->train.seq_len / ctx->layout.cp,
                              .distributed_optimizer = recipe->parallel.distributed_optimizer,
                              .precision = recipe->precision,
                              .fp8 = recipe->precision == DTYPE_FP8 ? &recipe->fp8 : NULL,
                              .recompute = recipe->train.recompute,
                              .loss = recipe->train.loss,
                              .packed = recipe->data.pack,
                              .state_dtype = recipe->optimizer.state_dtype};
}

/* The setup warnings rank 0 prints: settings this run does not use, and a model that cannot be exported. */
static void warn_unused_settings(const Recipe *recipe) {
    if (recipe->precision != DTYPE_FP8 && !fp8_config_is_default(&recipe->fp8))
        mt_log_warn("the fp8: settings apply with precision: fp8 only; this run's precision is %s, so they are "
               "not used", dtype_name(recipe->precision));
    const PeftConfig *peft = &recipe->model.peft;
    if (peft->type == PEFT_NONE && (peft->rank != 0 || peft->alpha != 0 || peft->targets != LORA_ALL_TARGETS))
        mt_log_warn("peft.type: none trains every parameter: the peft: section's rank, alpha and target_modules are "
                    "not used (type: lora for adapters)");
    if (recipe->parallel.sequence_parallel && recipe->parallel.tp == 1)
        mt_log_warn("parallel.sequence_parallel splits the sequence over the tensor-parallel ranks: at "
               "parallel.tp 1 it does nothing");
    if (recipe->parallel.distributed_optimizer && recipe_dp_size(recipe, comm_world()->size) == 1)
        mt_log_warn("parallel.distributed_optimizer shards the optimizer over the data-parallel ranks: at dp 1 "
               "(this launch's %d rank%s) it does nothing", comm_world()->size, comm_world()->size == 1 ? "" : "s");
    const Fp8Config fp8_default = fp8_config_default();
    if (recipe->precision == DTYPE_FP8 && recipe->fp8.recipe == FP8_RECIPE_TENSORWISE &&
        (recipe->fp8.amax_history_len != fp8_default.amax_history_len ||
         recipe->fp8.amax_compute_algo != fp8_default.amax_compute_algo))
        mt_log_warn("fp8.amax_history_len and fp8.amax_compute_algo apply to fp8.recipe: delayed only; this run's "
               "tensorwise scaling takes each tensor's own amax, so they are not used");
    const OptimizerConfig *o = &recipe->optimizer;
    if (o->decay != DECAY_WSD && (o->wsd_decay_steps != 0 || o->wsd_decay_style != WSD_MINUS_SQRT))
        mt_log_warn("optimizer.schedule.wsd_decay_steps and wsd_decay_style apply to decay: wsd only; this "
               "run's decay is %s, so they are not used", lr_decay_name(o->decay));
    const CheckpointConfig *ck = &recipe->checkpoint;
    if (ck->keep_every > 0 && ck->interval > 0 && ck->keep_every % ck->interval != 0) {
        long a = ck->keep_every, b = ck->interval; /* their least common multiple: the steps kept */
        while (b) {
            const long r = a % b;
            a = b;
            b = r;
        }
        mt_log_warn("checkpoint.keep_every %ld is not a multiple of checkpoint.interval %ld: a checkpoint is saved "
                    "every %ld steps, so only those at multiples of %ld are kept beyond keep_last", ck->keep_every,
                    ck->interval, ck->interval, ck->keep_every / a * ck->interval);
    }
    const MoeConfig *moe = &recipe->model.moe;
    ModelConfig defaults;
    model_set_defaults(&defaults);
    if ((moe->load_balancing == LB_EXPERT_BIAS || moe->load_balancing == LB_NONE) && moe->num_experts > 0 &&
        moe->aux_loss_coeff != defaults.moe.aux_loss_coeff)
        /* a line, not a warning: a converted model's coefficient comes from its config.json, not from the user */
        mt_log("model.moe.aux_loss_coeff (%g) weighs the auxiliary load-balancing loss; load_balancing: %s has none, "
               "so it is not used", moe->aux_loss_coeff, moe->load_balancing == LB_NONE ? "none" : "expert_bias");
    char why[1024], ignored[1024];
    ModelConfig unbiased = recipe->model; /* the expert biases alone in the way: convert has an option for them */
    unbiased.moe.load_balancing = LB_NONE;
    if (hf_config_check_exportable(&recipe->model, why, sizeof why) != 0) {
        if (hf_config_check_exportable(&unbiased, ignored, sizeof ignored) == 0)
            mt_log_warn("this model has no Hugging Face counterpart: transformers' %s has no expert biases "
                        "(model.moe.load_balancing: expert_bias), so `megatrain convert` exports its checkpoints "
                        "only with --drop-expert-bias, and the exported model then routes some tokens to other "
                        "experts than the trained one", hf_architecture(recipe->model.family));
        else
            mt_log_warn("this model has no Hugging Face counterpart, so `megatrain convert` will not export its "
                        "checkpoints: %s", why);
    }
    const double *split = recipe->data.split;
    if (recipe->data.num_valid > 0 && (split[1] > 0.0 || split[2] > 0.0) && comm_world()->rank == 0)
        mt_warn("data.split [%g, %g, %g] is not used: data.valid gives the validation data, and all of data.train "
                "trains; drop data.split (--set \"data.split=[100, 0, 0]\"), or data.valid to split data.train",
                split[0], split[1], split[2]);
    run_notes_say(recipe); /* a dataset listed twice, validation data unread or trained on, the lr schedule */
}

/* The inputs of setup, before the model and the loaders: the grid (the only collective here, which every rank
 * reaches unless the recipe fails them all alike), then checks local to each rank. 0 or an exit status with err. */
static int setup_inputs(TrainContext *ctx, const Recipe *recipe, const char *tokenizer_dir,
                        const char *tokenizer_source, char *err, size_t errlen) {
    int status = train_layout_create(recipe, &ctx->grid, &ctx->layout, &ctx->part, err, errlen);
    if (status != 0) return status;
    /* (the batch stages against micro_batch_size * dp, and what the layout cannot do: the recipe's validation) */
    const ModelDeviceSetup device = device_setup_of(ctx, recipe);
    status = model_device_check(&device, err, errlen);
    if (status != 0) return status;
    warn_unused_settings(recipe);
    /* a model too large for this host (or GPU) is refused naming its key, not met by "out of memory" */
    if (plan_check_memory(recipe, ctx->layout.world_size, err, errlen) != 0) return MT_EXIT_USAGE;

    const TrainConfig *train = &recipe->train;
    ctx->total_steps = train_total_steps(train);
    if (ctx->total_steps <= 0) {
        mt_set_error(err, errlen, "train: nothing to do (train.steps and train.tokens give 0 steps)");
        return MT_EXIT_USAGE;
    }
    /* the data against the tokenizer of the model it trains, before the loaders, the model and its weights */
    if (tokenizer_dir && train_check_data_tokenizer(recipe, tokenizer_dir, tokenizer_source, err, errlen) != 0)
        return MT_EXIT_FAILURE;
    return 0;
}

/* The data loaders of this rank (train, and validation and test with evaluation on) and the vocabulary check.
 * Local: no collective. 0, or an exit status with err. */
static int open_loaders(TrainContext *ctx, const Recipe *recipe, char *err, size_t errlen) {
    const TrainConfig *train = &recipe->train;
    char loader_err[1024];
    int64_t train_samples = train_schedule_samples(train, ctx->total_steps);
    ctx->train_data = data_loader_create(&recipe->data, SPLIT_TRAIN, train->seq_len, recipe->run.seed,
                                         train_samples, loader_err, sizeof loader_err);
    if (!ctx->train_data) {
        mt_set_error(err, errlen, "training data: %s", loader_err);
        return MT_EXIT_FAILURE;
    }
    if (open_valid_data(ctx, err, errlen) != 0) return MT_EXIT_FAILURE;
    if (check_vocab(ctx, err, errlen) != 0) return MT_EXIT_FAILURE;
    return 0;
}

/* Collective: every rank runs rank 0's recipe (the same file and --set values; mpirun's MPMD form can give ranks
 * different ones, which met later as mismatched collectives). 0, or an exit status with err. */
static int same_recipe_as_rank0(const Recipe *recipe, char *err, size_t errlen) {
    uint32_t crc[2] = {recipe_crc32c(recipe), recipe_crc32c_without_data_paths(recipe)}, rank0[2] = {crc[0], crc[1]};
    comm_broadcast(comm_world(), rank0, 2, COMM_INT32, 0);
    /* rank 0's text too (a few KB, once): a rank that differs names the first key that does */
    size_t len = 0;
    char *text = recipe_yaml_text(recipe, &len);
    int64_t len0 = (int64_t)len;
    comm_broadcast(comm_world(), &len0, 1, COMM_INT64, 0);
    char *text0 = mt_malloc((size_t)len0 + 1);
    if (comm_world()->rank == 0) memcpy(text0, text, len);
    comm_broadcast(comm_world(), text0, (size_t)len0, COMM_BYTE, 0);
    text0[len0] = '\0';
    char where[2600] = "";
    if (crc[0] != rank0[0]) recipe_text_difference(text, text0, "here", "on rank 0", where, sizeof where);
    free(text);
    free(text0);
    if (crc[0] == rank0[0]) return 0;
    char cwd[MT_PATH_MAX] = "?";
    if (crc[1] == rank0[1]) { /* the same recipe, its relative data paths taken from another directory */
        if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, "?");
        mt_set_error(err, errlen, "it resolves the recipe's data paths to other files than rank 0 does (relative "
                     "paths are taken from the current directory, here %s; data.train[0].path is %s): start every rank "
                     "in the same directory, or give absolute paths", cwd,
                     recipe->data.num_train ? recipe->data.train[0].path : "none");
        return MT_EXIT_USAGE;
    }
    mt_set_error(err, errlen, "its resolved recipe differs from rank 0's, first at %s: every rank must run the same "
                 "recipe with the same --set values", where);
    return MT_EXIT_USAGE;
}

int train_setup_same_recipe(TrainContext *ctx, const Recipe *recipe, char *err, size_t errlen) {
    return train_setup_agree(ctx, same_recipe_as_rank0(recipe, err, errlen), err);
}

int train_setup_agree(TrainContext *ctx, int status, const char *err) {
    status = dist_report_first(status, err);
    if (status != 0) ctx->stopped_together = true;
    return status;
}

int train_setup_common(TrainContext *ctx, const Recipe *recipe, const char *tokenizer_dir,
                       const char *tokenizer_source, char *err, size_t errlen) {
    memset(ctx, 0, sizeof *ctx);
    ctx->recipe = recipe;
    /* a test's stand-in for a long setup (a large checkpoint's load, a data set's index built), which
     * train.exit_duration_mins counts */
    mt_test_delay("MEGATRAIN_TEST_SLOW_SETUP_MS");
    if (comm_world()->rank != 0) mt_log_enabled = mt_lead_rank = 0; /* rank 0 prints for the job */
    train_state_init(&ctx->state, recipe->run.seed);
    snprintf(ctx->checkpoints_dir, sizeof ctx->checkpoints_dir, "%s/checkpoints", recipe->run.dir);

    /* A refusal here (a data path, a vocabulary, a tokenizer, memory) is every rank's, or one rank's before the
     * model's collectives: the ranks agree on it, it is said once and no rank aborts. */
    int status = train_setup_agree(ctx, setup_inputs(ctx, recipe, tokenizer_dir, tokenizer_source, err, errlen), err);
    if (status != 0) return status;
    /* Rank 0 opens its loaders first, building the sample indices and writing their cache (data.cache_dir); the
     * other ranks then map those files, one copy a node in the page cache instead of an index built and held by
     * every rank, or build their own where they cannot see them (another node's disk); where rank 0 failed they
     * do not start (rank 0 says why). Packed rows are not cached: with data.pack they open together. open_loaders is local and every rank reaches the broadcast (the recipe decides for all alike), so
     * this cannot deadlock. */
    const Comm *world = comm_world();
    const bool rank0_first = world->size > 1 && !recipe->data.pack;
    if (!rank0_first || world->rank == 0) status = open_loaders(ctx, recipe, err, errlen);
    if (rank0_first) {
        int32_t rank0_status = status;
        comm_broadcast(world, &rank0_status, 1, COMM_INT32, 0);
        if (world->rank != 0 && rank0_status != 0) {
            mt_set_error(err, errlen, "rank 0 could not open the data (it says why)");
            status = rank0_status;
        } else if (world->rank != 0) {
            status = open_loaders(ctx, recipe, err, errlen);
        }
    }
    status = train_setup_agree(ctx, status, err);
    if (status != 0) return status;
    agree_test_data(ctx);
    train_data_record_make(ctx);

    const TrainConfig *train = &recipe->train;
    micro_batch_init(&ctx->batch, train->micro_batch_size, train->seq_len, train->seq_len / ctx->layout.cp);
    model_cp_positions(train->seq_len / ctx->layout.cp, ctx->layout.cp, ctx->part.cp_rank, ctx->batch.positions);

    const ModelDeviceSetup device = device_setup_of(ctx, recipe);
    ctx->device = model_device_create(&device, err, errlen);
    if (!ctx->device) return MT_EXIT_FAILURE;
    ctx->model = ctx->device->host;
    if (ctx->layout.pp > 1) setup_pipeline(ctx);
    return 0;
}

int train_lock_run_dir(const char *run_dir, char *err, size_t errlen) {
    char path[MT_PATH_MAX + 32], holder[320];
    snprintf(path, sizeof path, "%s/%s", run_dir, TRAIN_RUN_DIR_LOCK);
    const int rc = mt_lock_file(path, holder, sizeof holder);
    if (rc == 1) {
        mt_set_error(err, errlen,
                     "run.dir: '%s' is in use by another megatrain process (%s, says %s): two processes writing one "
                     "run would break each other's checkpoints and metrics.jsonl; wait for it to end, or choose "
                     "another run.dir (--set run.dir=NEW)",
                     run_dir, holder[0] ? holder : "which one is not recorded", path);
        return -1;
    }
    if (rc < 0 && (errno == ENOLCK || errno == EOPNOTSUPP || errno == ENOSYS)) {
        mt_warn("run.dir: %s cannot be locked (%s): nothing keeps a second process from writing this run at the "
                "same time", path, strerror(errno));
        return 0;
    }
    if (rc < 0) {
        mt_set_error(err, errlen, "run.dir: %s: cannot create: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

int train_check_writers(const Recipe *recipe, char *err, size_t errlen) {
    if (!recipe->logging.tensorboard) return 0;
    char dir[MT_PATH_MAX + 16], why[MT_PATH_MAX + 256];
    snprintf(dir, sizeof dir, "%s/tensorboard", recipe->run.dir);
    if (mt_make_dirs(dir, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "logging.tensorboard: %s (expected a directory for the event files: remove or rename "
                     "it, or --set logging.tensorboard=false)", why);
        return -1;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        mt_set_error(err, errlen, "logging.tensorboard: %s: cannot write there: %s", dir, strerror(errno));
        return -1;
    }
    return 0;
}

void train_remove_refused_run_dir(const TrainContext *ctx) {
    const Recipe *recipe = ctx->recipe;
    const char *run_dir = recipe->run.dir;
    if (!ctx->made_dir[0]) return; /* run.dir was there: it stays as it was found */
    static const char *const written[] = {"recipe.yaml", "metrics.jsonl", TRAIN_RUN_DIR_LOCK};
    char path[MT_PATH_MAX + 32], ignored[256];
    for (size_t i = 0; i < sizeof written / sizeof *written; i++) {
        snprintf(path, sizeof path, "%s/%s", run_dir, written[i]);
        unlink(path);
    }
    if (recipe_cache_dir_is_default(recipe)) ckpt_remove_tree(recipe->data.cache_dir, ignored, sizeof ignored);
    snprintf(path, sizeof path, "%s/tensorboard", run_dir); /* train_check_writers' (empty: no event file yet) */
    rmdir(path);
    mt_remove_made_dirs(run_dir, ctx->made_dir);
}

/* A fresh run must not mix its checkpoints with an earlier run's, nor start over a run whose checkpoints a resume
 * moved aside as unusable (its history), nor save over an entry named like a checkpoint that is none. */
static int refuse_existing_checkpoints(const TrainContext *ctx, char *err, size_t errlen) {
    struct stat st;
    const char *dir = ctx->recipe->run.dir, *checkpoints = ctx->checkpoints_dir;
    const int found = stat(dir, &st);
    const bool file = found == 0 && !S_ISDIR(st.st_mode), under_file = found != 0 && errno == ENOTDIR;
    if (file || under_file) {
        mt_set_error(err, errlen, "run.dir: '%s' is not a directory (%s): choose another run.dir", dir,
                     file ? "a file of that name is there" : "a part of its path is a file");
        return MT_EXIT_USAGE;
    }
    long *steps = NULL;
    const int dirs = ckpt_list_steps(checkpoints, &steps, err, errlen);
    const long newest_dir = dirs > 0 ? steps[dirs - 1] : 0;
    free(steps);
    if (dirs < 0) return MT_EXIT_FAILURE;
    if (dirs > 0) {
        mt_set_error(err, errlen,
                     "run.dir: '%s' already holds checkpoints (the newest at step %ld); continue that run with "
                     "`megatrain resume %s`, or choose another run.dir (or remove %s)",
                     dir, newest_dir, dir, checkpoints);
        return MT_EXIT_USAGE;
    }
    const int entries = ckpt_list_entries(checkpoints, &steps, err, errlen);
    const long newest_entry = entries > 0 ? steps[entries - 1] : 0;
    free(steps);
    if (entries < 0) return MT_EXIT_FAILURE;
    if (entries > 0) { /* no checkpoint at all: a stray file, a dangling link (an archive not mounted) */
        char path[MT_PATH_MAX + 32], what[MT_PATH_MAX + 96];
        ckpt_iter_path(path, sizeof path, checkpoints, newest_entry);
        const bool link = ckpt_entry_not_dir(path, what, sizeof what) == 2;
        mt_set_error(err, errlen, "run.dir: '%s' holds no checkpoint, but %s%s is named like one and is %s: a save "
                     "of that step would collide with it; %s, or choose another run.dir", dir, path,
                     entries > 1 ? " (among others)" : "", what,
                     link ? "mount what it links to and `megatrain resume` the run, remove the link" : "remove it");
        return MT_EXIT_USAGE;
    }
    char why[2048];
    if (ckpt_invalid_only(checkpoints, why, sizeof why) > 0) {
        mt_set_error(err, errlen, "run.dir: %s", why);
        return MT_EXIT_USAGE;
    }
    return 0;
}

/* A LoRA run's checkpoints reference the frozen base its init_from gave (`base`) or store it
 * (checkpoint.frozen_base; a random base, without init_from, is always stored; auto stores a base that is a
 * run's checkpoint, which that run's retention may delete); one line says which. */
static void choose_frozen_base(TrainContext *ctx, const Recipe *recipe, const CkptBaseRef *base) {
    if (recipe->model.peft.type != PEFT_LORA) return;
    if (recipe->peft_source[0])
        mt_log("peft: LoRA rank %d, alpha %g from the peft: section of %s (the model file; the recipe has none of "
               "its own)", recipe->model.peft.rank, recipe->model.peft.alpha, recipe->peft_source);
    const FrozenBaseMode mode = recipe->checkpoint.frozen_base;
    if (!recipe->init_from[0] && mode == FROZEN_BASE_REFERENCE) { /* asked, and nothing to reference */
        mt_log_warn("checkpoint.frozen_base: reference is not done: the frozen base is random (no init_from), and no "
                    "checkpoint holds it, so every checkpoint stores it");
    } else if (!recipe->init_from[0]) {
        mt_log("checkpoint: the frozen base is random (no init_from): every checkpoint stores it");
    } else if (mode == FROZEN_BASE_STORE) {
        mt_log("checkpoint: every checkpoint stores the frozen base (checkpoint.frozen_base: store)");
    } else if (mode == FROZEN_BASE_AUTO && ckpt_is_run_checkpoint(base->dir)) {
        mt_log("checkpoint: every checkpoint stores the frozen base, because %s is a checkpoint of a training run, "
               "which that run's retention (checkpoint.keep_last) may delete (checkpoint.frozen_base: auto; "
               "checkpoints that reference a base outside a run's checkpoints/ directory, such as one `megatrain "
               "convert` wrote, stay small)", base->dir);
    } else {
        ctx->frozen_base = *base;
        mt_log("checkpoint: the checkpoints hold the adapters and reference the frozen base in %s (its metadata.mtck "
               "CRC-32C %08x; checkpoint.frozen_base: %s): resume, eval and convert --merge-lora need it there",
               base->dir, base->metadata_crc32c, mode == FROZEN_BASE_AUTO ? "auto" : "reference");
        if (ckpt_is_run_checkpoint(base->dir))
            mt_log_warn("checkpoint: the frozen base %s is a checkpoint of a training run: if that run's retention "
                        "deletes it, this run's checkpoints no longer load (checkpoint.frozen_base: store keeps the "
                        "base in them)", base->dir);
    }
}

int train_setup(TrainContext *ctx, const Recipe *recipe, char *err, size_t errlen) {
    memset(ctx, 0, sizeof *ctx);
    ctx->recipe = recipe;
    snprintf(ctx->checkpoints_dir, sizeof ctx->checkpoints_dir, "%s/checkpoints", recipe->run.dir);
    /* before rank 0 writes anything of its recipe into run.dir */
    if (train_setup_same_recipe(ctx, recipe, err, errlen) != 0) return MT_EXIT_USAGE;
    /* a run.dir that another process trains in is said first (`resume` there would be refused as well); one that
     * does not exist yet is made below */
    struct stat before;
    char made[MT_PATH_MAX] = ""; /* the shallowest directory of run.dir's path this run made (setup_common clears
                                  * ctx: kept here until the end) */
    int status = 0;
    if (comm_world()->rank == 0 && stat(recipe->run.dir, &before) == 0 && S_ISDIR(before.st_mode) &&
        train_lock_run_dir(recipe->run.dir, err, errlen) != 0)
        status = MT_EXIT_FAILURE;
    if (status == 0) status = refuse_existing_checkpoints(ctx, err, errlen);
    /* Rank 0 alone writes run.dir; the others wait for it, and stop with it when it cannot. Here it makes and locks
     * it (the data's index cache may lie in it); recipe.yaml and a fresh metrics.jsonl only once the run is accepted
     * (below), so that a refusal leaves a run.dir that was there as it found it: an earlier attempt's metrics.jsonl
     * (one that died before its first checkpoint) not cut, its recipe.yaml not replaced. */
    if (status == 0 && comm_world()->rank == 0 &&
        (make_dirs(recipe->run.dir, made, sizeof made, err, errlen) != 0 ||
         train_lock_run_dir(recipe->run.dir, err, errlen) != 0)) {
        /* the directories it made, if empty (a run.dir another process made and locks, both having seen it
         * missing, is that one's: its files are not this run's to remove) */
        mt_remove_made_dirs(recipe->run.dir, made);
        made[0] = '\0';
        status = MT_EXIT_FAILURE;
    }
    status = train_setup_agree(ctx, status, err);
    /* init_from's model against the recipe's before the data is read (a large data set's index takes a while); the
     * weights' load checks it again */
    if (status == 0 && recipe->init_from[0])
        status = train_setup_agree(ctx, init_from_check(recipe->init_from, &recipe->model, err, errlen), err);
    if (status == 0) status = train_setup_common(ctx, recipe, recipe->init_from[0] ? recipe->init_from : NULL,
                                                 "init_from", err, errlen);
    if (status == 0) {
        model_init_weights(ctx->model, recipe->run.seed);
        const bool reference = recipe->model.peft.type == PEFT_LORA &&
                               recipe->checkpoint.frozen_base != FROZEN_BASE_STORE;
        CkptBaseRef base = {0};
        if (recipe->init_from[0])
            status = init_from_checkpoint(ctx->model, recipe->init_from, &ctx->hf_files, reference ? &base : NULL, err,
                                          errlen);
        if (status == 0) choose_frozen_base(ctx, recipe, &base);
        /* every rank reads init_from alone (no collective since the model's): they agree on what they found */
        status = train_setup_agree(ctx, status, err);
    }
    if (status == 0) { /* accepted: the run's recipe and a fresh metrics.jsonl (metrics_open appends), once the
                        * TensorBoard writer's directory is there (a refusal for it cut metrics.jsonl) */
        char path[MT_PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/recipe.yaml", recipe->run.dir);
        if (comm_world()->rank == 0 &&
            (train_check_writers(recipe, err, errlen) != 0 || recipe_write(recipe, path, err, errlen) != 0 ||
             truncate_metrics(recipe->run.dir, err, errlen) != 0))
            status = MT_EXIT_FAILURE;
        status = train_setup_agree(ctx, status, err);
    }
    snprintf(ctx->made_dir, sizeof ctx->made_dir, "%s", made);
    if (status != 0) {
        train_remove_refused_run_dir(ctx);
        return status;
    }
    ctx->device->ops->from_host(ctx->device);
    return 0;
}

void train_teardown(TrainContext *ctx) {
    energy_meter_close(&ctx->energy);
    ckpt_hf_files_free(&ctx->hf_files);
    free(ctx->datasets);
    if (ctx->layout.pp > 1) pipeline_free(&ctx->pipe); /* the activation clones before their base */
    model_device_free(ctx->device);
    if (ctx->train_data) data_loader_free(ctx->train_data);
    if (ctx->valid_data) data_loader_free(ctx->valid_data);
    if (ctx->test_data) data_loader_free(ctx->test_data);
    micro_batch_free(&ctx->batch);
    if (ctx->layout.world_size > 0) grid_free(&ctx->grid);
    memset(ctx, 0, sizeof *ctx);
}
