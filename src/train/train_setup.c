/* train_setup.c: building and tearing down a TrainContext for a fresh run
 * (run.dir, the resolved recipe.yaml, data loaders, model, optimizer); the
 * part a resumed run shares (train_setup_common) is here too. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../backend/backend.h"
#include "../ckpt/ckpt_run.h"
#include "../convert/init_from.h"
#include "../core/error.h"
#include "../core/fs.h"
#include "../dist/comm.h"
#include "../plan/plan.h"
#include "batch_schedule.h"
#include "train_context.h"
#include "train_device.h"

/* mkdir -p for run.dir, with the key named in any error. */
static int make_dirs(const char *path, char *err, size_t errlen) {
    char why[MT_PATH_MAX + 256];
    if (mt_make_dirs(path, why, sizeof why) == 0) return 0;
    mt_set_error(err, errlen, "run.dir: %s", why);
    return -1;
}

/* What this build cannot do yet, as user-facing errors. */
static int check_supported(const Recipe *recipe, const TrainLayout *layout, char *err, size_t errlen) {
    const bool cuda = strcmp(recipe->run.device, "cuda") == 0;
    if (!cuda && strcmp(recipe->run.device, "cpu") != 0) {
        mt_set_error(err, errlen, "run.device: '%s' is not a device; expected cpu or cuda", recipe->run.device);
        return MT_EXIT_USAGE;
    }
    if (cuda && !train_device_built()) {
        mt_set_error(err, errlen,
                     "run.device: 'cuda' needs a build with the CUDA backend (make CUDA=1, then build/megatrain); "
                     "this one is CPU only");
        return MT_EXIT_FAILURE;
    }
    if (cuda && recipe->parallel.distributed_optimizer && layout->dp_size > 1) {
        mt_set_error(err, errlen,
                     "parallel.distributed_optimizer: not implemented on GPUs yet (it is on the CPU); set it to "
                     "false for run.device: cuda");
        return MT_EXIT_USAGE;
    }
    if (cuda && recipe->precision != DTYPE_BF16) {
        mt_set_error(err, errlen,
                     "precision: '%s' is not available with run.device: cuda (the GPU computes in bf16 with fp32 "
                     "master weights, gradients and AdamW states); set precision: bf16",
                     dtype_name(recipe->precision));
        return MT_EXIT_USAGE;
    }

    if (recipe->model.family == FAMILY_MIXTRAL || recipe->model.family == FAMILY_QWEN3_MOE) {
        const ParallelConfig *par = &recipe->parallel;
        if (cuda) {
            mt_set_error(err, errlen, "model.family: '%s' (mixture of experts) trains on the CPU only for now; set "
                         "run.device: cpu", model_family_name(recipe->model.family));
            return MT_EXIT_USAGE;
        }
        if (par->cp > 1 && recipe->model.moe.capacity_factor > 0) {
            mt_set_error(err, errlen, "model.moe.capacity_factor: not implemented with context parallel (cp %d): an "
                         "expert's capacity spans the cp ranks' tokens; set it to null (dropless) or cp to 1", par->cp);
            return MT_EXIT_USAGE;
        }
    }
    for (int g = 0; cuda && g < layout->pp * layout->vpp; g++) {
        int first, count;
        parallel_stage_layers(&recipe->parallel, recipe->model.num_layers, g, &first, &count);
        if (count == 0) {
            mt_set_error(err, errlen, "parallel.pp_layers: virtual stage %d has no layers: on GPUs every pipeline "
                         "stage (chunk) holds at least one (a stage of none runs on the CPU only)", g);
            return MT_EXIT_USAGE;
        }
    }
    const TrainConfig *train = &recipe->train;
    const long per_micro = (long)train->micro_batch_size * layout->dp_size;
    for (int i = 0; i < train->num_batch_stages; i++) {
        long gbs = train->batch_stages[i].global_batch_size;
        if (gbs <= 0 || gbs % per_micro != 0) {
            mt_set_error(err, errlen,
                         "train.global_batch_size: %ld is not a multiple of micro_batch_size x dp = %d x %d",
                         gbs, train->micro_batch_size, layout->dp_size);
            return MT_EXIT_USAGE;
        }
    }
    return 0;
}

/* A fresh run starts a fresh metrics.jsonl (metrics_open appends). */
static int truncate_metrics(const char *run_dir, char *err, size_t errlen) {
    char path[MT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    FILE *f = fopen(path, "w");
    if (!f) {
        mt_set_error(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        return -1;
    }
    fclose(f);
    return 0;
}

/* Open ctx->valid_data when evaluation is on; it stays NULL (with a warning)
 * when there is no validation data. Returns 0, or -1 with err set. */
static int open_valid_data(TrainContext *ctx, char *err, size_t errlen) {
    const Recipe *recipe = ctx->recipe;
    const TrainConfig *train = &recipe->train;
    if (train->eval_interval <= 0 || train->eval_batches <= 0) return 0;
    if (recipe->data.num_valid == 0 && !(recipe->data.split[1] > 0.0)) {
        mt_warn("evaluation is off: train.eval_interval is %ld but there is no validation data "
                "(data.valid is null and data.split gives it no share)",
                train->eval_interval);
        return 0;
    }
    int64_t samples = (int64_t)train->eval_batches * train->micro_batch_size * ctx->layout.dp_size;
    char loader_err[1024];
    ctx->valid_data = data_loader_create(&recipe->data, SPLIT_VALID, train->seq_len, recipe->run.seed, samples,
                                         loader_err, sizeof loader_err);
    if (!ctx->valid_data) {
        mt_set_error(err, errlen, "validation data: %s", loader_err);
        return -1;
    }
    return 0;
}

int train_setup_common(TrainContext *ctx, const Recipe *recipe, char *err, size_t errlen) {
    memset(ctx, 0, sizeof *ctx);
    ctx->recipe = recipe;
    if (comm_world()->rank != 0) mt_log_enabled = 0; /* rank 0 prints for the job */
    train_state_init(&ctx->state, recipe->run.seed);
    snprintf(ctx->checkpoints_dir, sizeof ctx->checkpoints_dir, "%s/checkpoints", recipe->run.dir);

    int status = train_layout_create(recipe, &ctx->grid, &ctx->layout, &ctx->part, err, errlen);
    if (status != 0) return status;
    status = check_supported(recipe, &ctx->layout, err, errlen);
    if (status != 0) return status;
    /* a model too large for this host (or GPU) is refused naming its key, not met by "out of memory" */
    if (plan_check_memory(recipe, ctx->layout.world_size, err, errlen) != 0) return MT_EXIT_USAGE;

    const TrainConfig *train = &recipe->train;
    ctx->total_steps = train_total_steps(train);
    if (ctx->total_steps <= 0) {
        mt_set_error(err, errlen, "train: nothing to do (train.steps and train.tokens give 0 steps)");
        return MT_EXIT_USAGE;
    }

    char loader_err[1024];
    int64_t train_samples = train_schedule_samples(train, ctx->total_steps);
    ctx->train_data = data_loader_create(&recipe->data, SPLIT_TRAIN, train->seq_len, recipe->run.seed,
                                         train_samples, loader_err, sizeof loader_err);
    if (!ctx->train_data) {
        mt_set_error(err, errlen, "training data: %s", loader_err);
        return MT_EXIT_FAILURE;
    }
    if (open_valid_data(ctx, err, errlen) != 0) return MT_EXIT_FAILURE;

    /* With context parallel a rank holds seq_len / cp tokens of each sample. */
    const int B = train->micro_batch_size, T = train->seq_len / ctx->layout.cp;
    ctx->sample = mt_malloc(((size_t)train->seq_len + 1) * sizeof(int32_t));
    ctx->inputs = mt_malloc((size_t)B * (size_t)T * sizeof(int32_t));
    ctx->targets = mt_malloc((size_t)B * (size_t)T * sizeof(int32_t));
    ctx->positions = mt_malloc((size_t)T * sizeof(int32_t));
    model_cp_positions(T, ctx->layout.cp, ctx->part.cp_rank, ctx->positions);

    /* On a GPU the activations live on the device: the host model holds the weights only. */
    const bool cuda = strcmp(recipe->run.device, "cuda") == 0;
    ctx->model = model_create_part(&recipe->model, &ctx->part, &cpu_backend, cuda ? 0 : B, cuda ? 0 : T);
    if (ctx->layout.pp > 1)
        pipeline_init(&ctx->pipe, &ctx->grid.groups[GROUP_PP], ctx->layout.vpp, ctx->model, &pipeline_cpu_ops);
    if (recipe->optimizer.state_dtype != DTYPE_FP32)
        mt_warn("optimizer.state_dtype: %s states are not implemented on the CPU yet; using fp32",
                dtype_name(recipe->optimizer.state_dtype));
    /* ZeRO-1 over dp: each rank keeps the moments of its part of every bucket only */
    ctx->zero1_on = recipe->parallel.distributed_optimizer && ctx->layout.dp_size > 1;
    if (ctx->zero1_on && ctx->part.ep > 1) { /* the experts (the end of the flat array) shard over edp */
        size_t dense = (size_t)ctx->model->num_floats;
        for (int i = 0; i < ctx->model->num_params; i++)
            if (ctx->model->param_info[i].expert && ctx->model->param_info[i].offset < dense)
                dense = ctx->model->param_info[i].offset;
        zero1_init_split(&ctx->zero1, &ctx->grid.groups[GROUP_DP], dense, &ctx->grid.groups[GROUP_EDP],
                         (size_t)ctx->model->num_floats, 1.0f / (float)ctx->part.ep);
    } else if (ctx->zero1_on) {
        zero1_init(&ctx->zero1, &ctx->grid.groups[GROUP_DP], (size_t)ctx->model->num_floats);
    }
    adamw_init(&ctx->optimizer, ctx->zero1_on ? (long)ctx->zero1.owned : ctx->model->num_floats);
    return 0;
}

/* A fresh run must not mix its checkpoints with an earlier run's. */
static int refuse_existing_checkpoints(const TrainContext *ctx, char *err, size_t errlen) {
    long *steps = NULL;
    int n = ckpt_list_steps(ctx->checkpoints_dir, &steps, err, errlen);
    if (n < 0) return MT_EXIT_FAILURE;
    long newest = n > 0 ? steps[n - 1] : 0;
    free(steps);
    if (n == 0) return 0;
    mt_set_error(err, errlen,
                 "run.dir: '%s' already holds checkpoints (the newest at step %ld); continue that run with "
                 "`megatrain resume %s`, or choose another run.dir (or remove %s)",
                 ctx->recipe->run.dir, newest, ctx->recipe->run.dir, ctx->checkpoints_dir);
    return MT_EXIT_USAGE;
}

int train_setup(TrainContext *ctx, const Recipe *recipe, char *err, size_t errlen) {
    memset(ctx, 0, sizeof *ctx);
    ctx->recipe = recipe;
    snprintf(ctx->checkpoints_dir, sizeof ctx->checkpoints_dir, "%s/checkpoints", recipe->run.dir);
    int status = refuse_existing_checkpoints(ctx, err, errlen);
    if (status != 0) return status;
    /* Rank 0 alone writes run.dir; the others wait for it (a rank 0 that
     * fails here ends the job: src/dist/comm.h, dist_finish). */
    if (comm_world()->rank == 0) {
        if (make_dirs(recipe->run.dir, err, errlen) != 0) return MT_EXIT_FAILURE;
        char path[MT_PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/recipe.yaml", recipe->run.dir);
        if (recipe_write(recipe, path, err, errlen) != 0) return MT_EXIT_FAILURE;
        if (truncate_metrics(recipe->run.dir, err, errlen) != 0) return MT_EXIT_FAILURE;
    }
    comm_barrier(comm_world());

    status = train_setup_common(ctx, recipe, err, errlen);
    if (status != 0) return status;
    model_init_weights(ctx->model, recipe->run.seed);
    if (recipe->init_from[0]) status = init_from_checkpoint(ctx->model, recipe->init_from, err, errlen);
    return status;
}

void train_teardown(TrainContext *ctx) {
    energy_meter_close(&ctx->energy);
    if (ctx->cuda) train_device_detach(ctx);
    if (ctx->layout.pp > 1) pipeline_free(&ctx->pipe);
    if (ctx->model) model_free(ctx->model);
    if (ctx->optimizer.m) adamw_free(&ctx->optimizer);
    if (ctx->zero1_on) zero1_free(&ctx->zero1);
    if (ctx->train_data) data_loader_free(ctx->train_data);
    if (ctx->valid_data) data_loader_free(ctx->valid_data);
    free(ctx->sample);
    free(ctx->inputs);
    free(ctx->targets);
    free(ctx->positions);
    if (ctx->layout.world_size > 0) grid_free(&ctx->grid);
    memset(ctx, 0, sizeof *ctx);
}
