/* train.c: `megatrain run` and `megatrain resume`: the training loop (steps,
 * evaluation, metrics, checkpoints, SIGTERM / SIGUSR1, the start banner and
 * the final line).
 *
 * Training is bit-for-bit deterministic for a recipe: timings feed only the
 * tokens/s and elapsed columns, never the computation. */
#include "train.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../ckpt/ckpt_async.h"
#include "../ckpt/ckpt_run.h"
#include "../core/error.h"
#include "../core/timer.h"
#include "../dist/comm.h"
#include "../dist/dp_sync.h"
#include "../obs/health.h"
#include "../obs/replica_check.h"
#include "../config/batch_schedule.h"
#include "metrics.h"
#include "run_notes.h"
#include "train_ckpt.h"
#include "train_context.h"
#include "train_signal.h"

/* 1234567 -> "1.23M" (for the banner). */
static void format_params(char *out, size_t len, double count) {
    if (count >= 1e9) snprintf(out, len, "%.2fB", count / 1e9);
    else if (count >= 1e6) snprintf(out, len, "%.2fM", count / 1e6);
    else if (count >= 1e3) snprintf(out, len, "%.2fK", count / 1e3);
    else snprintf(out, len, "%.0f", count);
}

static void print_banner(const TrainContext *ctx) {
    const Recipe *recipe = ctx->recipe;
    const ModelConfig *m = &recipe->model;
    const TrainConfig *t = &recipe->train;
    char params[32];
    format_params(params, sizeof params, (double)model_count_params(m));
    mt_log("megatrain: run '%s' -> %s", recipe->run.name, recipe->run.dir);
    mt_log("model: %s, %s params, %d layers, hidden %d, heads %d (kv %d), vocab %d", model_family_name(m->family),
           params, m->num_layers, m->hidden_size, m->num_attention_heads, m->num_key_value_heads, m->vocab_size);
    if (m->peft.type == PEFT_LORA) {
        char trained[32];
        format_params(trained, sizeof trained, (double)ctx->model->num_grad_floats);
        mt_log("peft: LoRA rank %d, alpha %g: %s trainable parameters on rank 0, the base frozen", m->peft.rank,
               m->peft.alpha, trained);
    }
    if (recipe->precision == DTYPE_FP8) {
        const Fp8Config *f = &recipe->fp8;
        char scaling[96];
        if (f->recipe == FP8_RECIPE_DELAYED)
            snprintf(scaling, sizeof scaling, "delayed scaling (amax history %d, its %s, margin %d)",
                     f->amax_history_len, f->amax_compute_algo == FP8_AMAX_MAX ? "max" : "most recent", f->margin);
        else snprintf(scaling, sizeof scaling, "tensorwise current scaling (margin %d)", f->margin);
        mt_log("precision: fp8, %s: the linear layers' products take E4M3 inputs forward, %s gradients backward "
               "(docs/fp8.md)", scaling, f->grad_format == FP8_E5M2 ? "E5M2" : "E4M3");
    }
    const TrainLayout *l = &ctx->layout;
    if (l->world_size > 1) {
        char mine[32], vpp[32] = "", experts[48] = "";
        format_params(mine, sizeof mine, (double)ctx->model->num_floats);
        if (l->vpp > 1) snprintf(vpp, sizeof vpp, " (interleaved, vpp %d)", l->vpp);
        if (ctx->recipe->model.moe.num_experts > 0) /* etp 1 said too: Megatron's default, not tp */
            snprintf(experts, sizeof experts, "; experts: ep %d x etp %d", ctx->part.ep, ctx->part.etp);
        mt_log("layout: %d ranks = tp %d x cp %d x dp %d x pp %d%s%s%s%s; rank 0 holds %s params", l->world_size,
               l->tp, l->cp, l->dp_size, l->pp, vpp, ctx->part.sequence_parallel ? ", sequence parallel" : "",
               ctx->device->zero1_on ? ", distributed optimizer" : "", experts, mine);
    }
    if (ctx->pipeline_note[0]) mt_log("%s", ctx->pipeline_note);
    /* One dataset: the samples it holds. A blend holds as many as the schedule asks for (Megatron's blended
     * dataset), so the count of datasets says more. */
    char of[64];
    const int blended = data_loader_num_datasets(ctx->train_data);
    if (blended > 1) snprintf(of, sizeof of, "blended from %d datasets", blended);
    else if (data_loader_packed(ctx->train_data))
        snprintf(of, sizeof of, "of %lld packed rows%s", (long long)data_loader_num_samples(ctx->train_data),
                 train_schedule_samples(t, ctx->total_steps) > data_loader_num_samples(ctx->train_data)
                     ? ", repeated" : "");
    else snprintf(of, sizeof of, "of %lld", (long long)data_loader_num_samples(ctx->train_data));
    /* what the CPU does with a GPU precision: bf16 computes in fp32 there; fp8 rounds the linear layers' operands */
    const bool cpu = strcmp(recipe->run.device, "cpu") == 0;
    const char *computed = !cpu ? "" : recipe->precision == DTYPE_BF16 ? " (the cpu computes in fp32)"
                           : recipe->precision == DTYPE_FP8 ? " (emulated on the cpu: fp8 operands, fp32 products)"
                                                             : "";
    mt_log("train: %ld steps, seq_len %d, micro_batch %d, dp %d, %lld train samples (%s), %s, device %s, precision %s%s",
           ctx->total_steps, t->seq_len, t->micro_batch_size, ctx->layout.dp_size,
           (long long)train_schedule_samples(t, ctx->total_steps), of, ctx->valid_data ? "eval on" : "eval off",
           recipe->run.device, dtype_name(recipe->precision), computed);
    char lr[RUN_NOTE_LEN];
    run_notes_lr_line(recipe, ctx->total_steps, lr, sizeof lr);
    mt_log("%s", lr);
    /* what `all` resolved to (a resume resolves it again from the same recipe and data: the same samples) */
    if (t->eval_batches == MT_EVAL_BATCHES_ALL && (ctx->valid_data || ctx->test_data)) {
        char valid[256] = "", test[256] = "";
        if (ctx->valid_data)
            eval_extent_describe(&ctx->valid_extent, recipe->data.num_valid > 0 ? "data.valid"
                                 : "data.split's validation share", valid, sizeof valid);
        if (ctx->test_data)
            eval_extent_describe(&ctx->test_extent, recipe->data.num_test > 0 ? "data.test" : "the test share", test,
                                 sizeof test);
        mt_log("eval: train.eval_batches all is %s%s%s", valid,
               !test[0] ? "" : valid[0] ? "; test_loss: " : "test_loss: ", test);
    }
}

static bool is_multiple(long step, long interval) { return interval > 0 && step % interval == 0; }

/* With several ranks the message names the rank it comes from. */
static void print_error(const char *err) {
    fflush(stdout);
    if (comm_world()->size > 1 && strncmp(err, "rank ", 5) != 0)
        fprintf(stderr, "megatrain: error: rank %d: %s\n", comm_world()->rank, err);
    else
        fprintf(stderr, "megatrain: error: %s\n", err);
}

/* After a failed save (said, on rank 0): where the run goes on from, as the log's last line. A full disk (or a
 * quota) names the room the run's retention needs. */
static void say_after_failed_save(const TrainContext *ctx, const char *err) {
    if (comm_world()->rank != 0) return;
    long *steps = NULL;
    char why[512];
    const int n = ckpt_list_steps(ctx->checkpoints_dir, &steps, why, sizeof why);
    const long newest = n > 0 ? steps[n - 1] : -1;
    free(steps);
    if (n < 0) { /* the directory cannot be listed: nothing to say of where to go on from */
        fflush(stdout);
        fprintf(stderr, "megatrain: error: the run stopped after step %ld; %s\n", ctx->state.step, why);
        return;
    }
    const Recipe *recipe = ctx->recipe;
    char room[320] = "";
    if (strstr(err, strerror(ENOSPC)) || strstr(err, strerror(EDQUOT))) {
        if (recipe->checkpoint.keep_last > 0)
            snprintf(room, sizeof room, " (room for checkpoint.keep_last = %d checkpoints and the one being written: "
                     "`megatrain plan` says how much)", recipe->checkpoint.keep_last);
        else
            snprintf(room, sizeof room, " (room for every checkpoint, checkpoint.keep_last = 0, and the one being "
                     "written)");
    }
    fflush(stdout);
    if (newest >= 0)
        fprintf(stderr, "megatrain: error: the run stopped after step %ld; its newest checkpoint is %s/iter_%07ld: once "
                "the cause is fixed%s, `megatrain resume %s` continues from step %ld\n", ctx->state.step,
                ctx->checkpoints_dir, newest, room, recipe->run.dir, newest);
    else if (ctx->resumed_from[0]) /* a branch into a new run.dir that has saved none yet: where it came from */
        fprintf(stderr, "megatrain: error: the run stopped after step %ld and has no checkpoint in %s yet: once the "
                "cause is fixed%s, `megatrain resume %s --set run.dir=%s` continues from step %ld again\n",
                ctx->state.step, ctx->checkpoints_dir, room, ctx->resumed_from, recipe->run.dir, ctx->start_step);
    else
        fprintf(stderr, "megatrain: error: the run stopped after step %ld and has no checkpoint: once the cause is "
                "fixed%s, it starts over\n", ctx->state.step, room);
}

/* A step or evaluation that every rank refused at once (TRAIN_DATA_REFUSED: a token outside the vocabulary): the
 * ranks that read the sample say so, and the run stops with status 1 without a checkpoint of that step; a save in
 * flight still completes (train_loop) and the ranks end MPI together, without an abort (run_context). */
static int stop_on_refused_data(TrainContext *ctx, const char *why) {
    if (why[0]) {
        char err[4096];
        mt_set_error(err, sizeof err, "%s; stopping the run (no checkpoint of this step; those saved before it are "
                     "kept)", why);
        print_error(err);
    }
    ctx->stopped_together = true;
    return MT_EXIT_FAILURE;
}

/* Which ranks write what: the weights (dp = cp = 0), the routed experts under expert parallel (the first ep dp
 * ranks hold every expert once), and anything at all (with the distributed optimizer every dp rank of cp 0 writes
 * its parts of the moments). */
static bool params_writer(const TrainContext *ctx) { return ctx->grid.coords.dp == 0 && ctx->grid.coords.cp == 0; }
static bool experts_writer(const TrainContext *ctx) {
    return ctx->grid.coords.dp < ctx->part.ep && ctx->grid.coords.cp == 0;
}
static bool checkpoint_writer(const TrainContext *ctx) {
    return ctx->device->zero1_on ? ctx->grid.coords.cp == 0 : params_writer(ctx) || experts_writer(ctx);
}

/* Save at the current step with every rank (a collective: each rank with
 * dp = cp = 0 writes its blocks of the model into its own shard file, under
 * expert parallel the first ep dp ranks their experts, and with the
 * distributed optimizer every dp rank its part of the moments; rank 0 writes
 * the metadata, src/ckpt/ckpt_dist.h). Parameters that are not all finite
 * are never saved. 0 or -1 (printed), the same on every rank. */
static int save_now(TrainContext *ctx, CkptSaver *saver) {
    if (ckpt_saver_last_step(saver) == ctx->state.step) return 0;
    ModelDevice *dev = ctx->device;
    const bool writer = checkpoint_writer(ctx); /* every rank that writes: what it writes must be the device's */
    if (writer) dev->ops->to_host(dev); /* weights and AdamW moments from the device */
    char err[2048];
    int status = 0;
    /* every rank checks what it holds (when the host holds a copy: the writers, which refreshed theirs) */
    double finite = (!dev->host_current && !writer) || health_params_finite(ctx->model) ? 1.0 : 0.0;
    if (ctx->layout.world_size > 1) finite = dp_sum_double(comm_world(), finite) == (double)ctx->layout.world_size;
    if (!finite) {
        mt_set_error(err, sizeof err, "step %ld: the parameters hold NaN or Inf; not saving a checkpoint",
                     ctx->state.step);
        if (comm_world()->rank == 0) print_error(err);
        status = -1;
    } else {
        const CkptMoments moments = train_ckpt_moments(&dev->optimizer);
        const CkptState state = train_ckpt_state(&ctx->state, dev->optimizer.step, ctx->recipe);
        if (ckpt_saver_save(saver, ctx->model, &moments, &state, err, sizeof err) != 0) {
            if (comm_world()->rank == 0) print_error(err);
            say_after_failed_save(ctx, err);
            status = -1;
        }
    }
    return status;
}

/* Health across steps: non-finite steps in a row and in total, loss spikes. */
typedef struct HealthState {
    long bad_in_row, bad_total;
    LossSpikeDetector spikes;
} HealthState;

/* After step `step`: a non-finite step (its update already skipped) is
 * logged with the first parameter whose gradient went bad, and stops the
 * run when it makes more than train.max_nonfinite_steps in a row; a finite
 * loss far above its running mean logs a warning. 0, or -1 with err (not yet printed) to stop. */
static int check_health(TrainContext *ctx, const StepResult *result, HealthState *health, long step, char *err,
                        size_t errlen) {
    const int max_bad = ctx->recipe->train.max_nonfinite_steps;
    if (!result->nonfinite) {
        health->bad_in_row = 0;
        double mean, std;
        if (loss_spike_check(&health->spikes, result->loss, &mean, &std))
            mt_log_warn("step %ld: loss spike: %.4f against a running mean of %.4f (std %.4f)", step, result->loss,
                   mean, std);
        return 0;
    }
    health->bad_in_row++;
    health->bad_total++;
    ctx->device->ops->grads_to_host(ctx->device);
    const int bad = health_first_nonfinite_grad(ctx->model);
    char what[256];
    snprintf(what, sizeof what, "loss %g, grad norm %g; first non-finite gradient: %s", result->loss,
             result->grad_norm, bad >= 0 ? ctx->model->param_info[bad].name : "none");
    if (health->bad_in_row > max_bad) {
        mt_set_error(err, errlen,
                     "step %ld: %s; stopping after %ld non-finite step(s) in a row (train.max_nonfinite_steps = %d); "
                     "the update was skipped, no checkpoint written (a lower optimizer.lr may help)",
                     step, what, health->bad_in_row, max_bad);
        return -1;
    }
    mt_log_warn("step %ld: skipped the update: %s (%ld in a row, %ld in total; train.max_nonfinite_steps = %d)",
           step, what, health->bad_in_row, health->bad_total, max_bad);
    return 0;
}

/* Every train.replica_check_interval steps with dp > 1: the same parameters
 * on every replica (src/obs/replica_check.h): the dense ones over dp, the
 * routed experts (the end of the flat array) over the ranks holding the
 * same experts (edp). 0, or -1 on every rank when any dp group differs
 * (printed by that group's ranks): the verdict, agreed within each dp group,
 * is summed over the world so that every rank stops at this step. */
static int check_replicas(TrainContext *ctx, long step) {
    /* the test's flip must reach the weights that compute: the host's own where they are the device's */
    if (ctx->device->host_current) replica_check_test_flip(comm_world()->rank, step, ctx->model->params);
    if (ctx->layout.dp_size <= 1 || !is_multiple(step, ctx->recipe->train.replica_check_interval)) return 0;
    ctx->device->ops->to_host(ctx->device);
    const Model *m = ctx->model;
    size_t dense = (size_t)m->num_floats;
    for (int i = 0; i < m->num_params && ctx->part.ep > 1; i++)
        if (m->param_info[i].expert && m->param_info[i].offset < dense) dense = m->param_info[i].offset;
    char err[1024];
    int rc = replica_check(&ctx->grid.groups[GROUP_DP], m->params, dense, step, err, sizeof err);
    if (rc == 0 && dense < (size_t)m->num_floats)
        rc = replica_check(&ctx->grid.groups[GROUP_EDP], m->params + dense, (size_t)m->num_floats - dense, step, err,
                           sizeof err);
    if (rc != 0) print_error(err);
    const bool any = dp_sum_double(comm_world(), rc != 0 ? 1.0 : 0.0) > 0.0;
    return any ? -1 : 0;
}

/* Model TFLOP/s per device (6N + attention, as Megatron counts), MFU when the
 * device's peak is known, peak memory, and on a GPU with NVML the mean power
 * and tokens per joule since the last logged step. */
static void efficiency_columns(TrainContext *ctx, StepMetrics *m, double tokens) {
    const Recipe *recipe = ctx->recipe;
    const double per_token = model_flops_per_token(&ctx->model->cfg, recipe->train.seq_len);
    m->tflops = m->tokens_per_s * per_token / (double)ctx->layout.world_size / 1e12;
    double peak = recipe->logging.peak_tflops;
    if (!(peak > 0.0)) peak = ctx->device->ops->peak_tflops(ctx->device);
    m->mfu = peak > 0.0 ? 100.0 * m->tflops / peak : NAN;
    m->peak_mem_gib = ctx->device->ops->peak_bytes(ctx->device) / 1073741824.0;
    m->power_w = m->tokens_per_joule = NAN;
    double joules, watts;
    if (energy_meter_read(&ctx->energy, &joules, &watts) && joules > 0.0) {
        m->power_w = watts;
        m->tokens_per_joule = tokens / (double)ctx->layout.world_size / joules;
    }
}

/* This rank's reason to stop before the next step, from the recipe's exit limits, checked after each step done in
 * this process (as Megatron does after each iteration: a job always makes progress): a step that is a multiple of
 * train.exit_interval, or train.exit_duration_mins since the process began, its setup included (a job's time limit
 * less a step and a save; Megatron counts from its start too: a setup that loads a large checkpoint or builds the
 * data's index takes minutes the limit must hold). 0 for none. */
static int exit_limit(const TrainContext *ctx) {
    const TrainConfig *t = &ctx->recipe->train;
    if (ctx->state.step == ctx->start_step) return 0;
    if (t->exit_interval > 0 && ctx->state.step % t->exit_interval == 0) return TRAIN_STOP_INTERVAL;
    if (t->exit_duration_mins > 0 && mt_now() - mt_process_start() >= 60.0 * t->exit_duration_mins)
        return TRAIN_STOP_DURATION;
    return 0;
}

/* After a stop by the recipe's own limit, which the run keeps (its recipe.yaml): where a plain resume stops again,
 * and the --set that runs on to the end, into buf ("" for a signal's stop, or when the next stop is the end). */
static void stops_again(const TrainContext *ctx, int stop, char *buf, size_t len) {
    const TrainConfig *t = &ctx->recipe->train;
    const long step = ctx->state.step, next = t->exit_interval > 0 ? (step / t->exit_interval + 1) * t->exit_interval : 0;
    buf[0] = '\0';
    if (stop == TRAIN_STOP_INTERVAL && next < ctx->total_steps)
        snprintf(buf, len, " (it stops again after step %ld, the next multiple of train.exit_interval %ld, which the "
                 "run keeps; add --set train.exit_interval=0 to run to the end)", next, t->exit_interval);
    else if (stop == TRAIN_STOP_DURATION)
        snprintf(buf, len, " (it stops again %g minutes after it starts, train.exit_duration_mins, which the run "
                 "keeps; add --set train.exit_duration_mins=0 to run to the end)", t->exit_duration_mins);
}

/* What the step lines measure from: the loop's start, the last logged step's time and tokens, and the time since
 * then that the loop spent outside training (evaluations, checkpoint saves and the waits for a previous background
 * save), which the throughput leaves out. */
typedef struct LogClock {
    double start, last_time;
    double paused_s;
    int64_t last_tokens, schedule_samples;
} LogClock;

/* Step `step`'s line (rank 0) and metrics record. The training throughput (tok/s, TFLOP/s, MFU, eta) counts the
 * time since the last line less clock->paused_s (evaluations, saves), which starts again from 0. */
static void log_step(TrainContext *ctx, MetricsWriter *metrics, const StepResult *result, long step, double eval_loss,
                     double test_loss, LogClock *clock) {
    const double now = mt_now();
    const double interval_s = (now - clock->last_time) - clock->paused_s;
    const double tokens = (double)(ctx->state.consumed_tokens - clock->last_tokens);
    StepMetrics m = {
        .step = step,
        .total_steps = ctx->total_steps,
        .loss = result->loss,
        .lr = result->lr,
        .weight_decay = result->weight_decay,
        .global_batch_size = result->global_batch_size,
        .grad_norm = result->grad_norm,
        .tokens_per_s = interval_s > 0 ? tokens / interval_s : 0,
        .consumed_tokens = (double)ctx->state.consumed_tokens,
        .consumed_samples = ctx->state.consumed_samples,
        .elapsed_s = now - clock->start,
        .time = mt_unix_time(),
        .eta_s = NAN,
        .eval_loss = eval_loss,
        .test_loss = test_loss,
        .moe_aux_loss = result->moe ? result->moe_aux_loss : NAN,
        .moe_lb_loss = result->moe ? result->moe_lb_loss : NAN,
        .moe_z_loss = result->moe ? result->moe_z_loss : NAN,
        .moe_imbalance = result->moe ? result->moe_imbalance : NAN,
        .moe_drop_rate = result->moe ? result->moe_drop_rate : NAN,
        .moe_spill_rate = result->moe ? result->moe_spill_rate : NAN,
    };
    efficiency_columns(ctx, &m, tokens);
    const int64_t samples_left = clock->schedule_samples - ctx->state.consumed_samples;
    if (step < ctx->total_steps && samples_left > 0 && m.tokens_per_s > 0)
        m.eta_s = (double)samples_left * (double)ctx->recipe->train.seq_len / m.tokens_per_s;
    if (comm_world()->rank == 0) metrics_print(&m);
    metrics_write(metrics, &m);
    clock->last_time = now;
    clock->paused_s = 0.0;
    clock->last_tokens = ctx->state.consumed_tokens;
}

/* The steps from ctx->state.step to total_steps, with metrics, evaluation,
 * checkpoints (every checkpoint.interval steps, at the end, and on SIGTERM /
 * SIGUSR1, after which it stops with status 0). Returns the exit status. */
static int train_loop(TrainContext *ctx, MetricsWriter *metrics) {
    const Recipe *recipe = ctx->recipe;
    const long log_interval = recipe->logging.interval > 0 ? recipe->logging.interval : 1;
    const double start_time = mt_now();
    LogClock clock = {.start = start_time, .last_time = start_time, .last_tokens = ctx->state.consumed_tokens,
                      .schedule_samples = train_schedule_samples(&recipe->train, ctx->total_steps)};
    StepResult result = {0};
    HealthState health = {.spikes = loss_spike_detector(50, 20, 6.0)};
    int status = MT_EXIT_OK;
    int stop_signal = 0;
    char err[4096]; /* a refused sample's message with its step and dataset: up to 3 KiB */
    bool alone = false; /* this rank failed while the others may go on (they wait in its collectives) */

    CkptSaver *saver = ckpt_saver_create(ctx->checkpoints_dir, recipe);
    ckpt_saver_carry_hf_files(saver, &ctx->hf_files);
    ckpt_saver_reference_base(saver, &ctx->frozen_base);
    ckpt_saver_record_data(saver, ctx->datasets, ctx->num_datasets);
    const ModelDevice *dev = ctx->device;
    ckpt_saver_distribute(saver, comm_world(), checkpoint_writer(ctx));
    ckpt_saver_write_kinds(saver, params_writer(ctx), experts_writer(ctx));
    if (dev->zero1_on) ckpt_saver_shard_moments(saver, dev->zero1.begin, dev->zero1.end, dev->zero1.num_ranges);
    train_signals_install();
    /* A stop (a signal, train.exit_interval, train.exit_duration_mins) is asked once before the first step, once
     * after each step but the last, and again after an evaluation and after a checkpoint's save, every rank at once
     * (train_stop_requested is a collective; each of these is every rank's): a step it follows is logged (the
     * checkpoint's step has its line and metrics) and saved. */
    if (ctx->state.step < ctx->total_steps) stop_signal = train_stop_requested(exit_limit(ctx));
    while (ctx->state.step < ctx->total_steps && !stop_signal) {
        const int stepped = train_step(ctx, &result, err, sizeof err);
        if (stepped == TRAIN_DATA_REFUSED) {
            status = stop_on_refused_data(ctx, err);
            break;
        }
        /* a step that failed here, or a communicator that failed under it (a peer died: NCCL reports it late) */
        if (stepped != 0 || ctx->device->ops->comms_check(ctx->device, err, sizeof err) != 0) {
            print_error(err);
            status = MT_EXIT_FAILURE;
            alone = true;
            break;
        }
        const long step = ctx->state.step; /* 1-based: the step just done */
        /* the health verdict comes from the loss and grad norm every rank agrees on; a step that stops the run on
         * it has its line and metrics (as every skipped step does, below), then the error */
        if (check_health(ctx, &result, &health, step, err, sizeof err) != 0) {
            log_step(ctx, metrics, &result, step, NAN, NAN, &clock);
            print_error(err);
            status = MT_EXIT_FAILURE;
            ctx->stopped_together = true;
            break;
        }
        if (check_replicas(ctx, step) != 0) { /* every rank's verdict */
            status = MT_EXIT_FAILURE;
            ctx->stopped_together = true;
            break;
        }
        if (step < ctx->total_steps) stop_signal = train_stop_requested(exit_limit(ctx));
        /* every eval_interval steps and after the last (Megatron's evaluation at the end of training) */
        const bool eval_now =
            ctx->valid_data && (is_multiple(step, recipe->train.eval_interval) || step == ctx->total_steps);
        /* the test share once, after the last step (Megatron's test evaluation at the end of training) */
        const bool test_now = ctx->test_data && step == ctx->total_steps;
        /* a step whose update was skipped as non-finite is always logged (its null grad_norm or loss) */
        const bool log_now = step == 1 || is_multiple(step, log_interval) || step == ctx->total_steps || eval_now ||
                             stop_signal || result.nonfinite;
        if (log_now) {
            double eval_loss = NAN, test_loss = NAN;
            const double eval_start = mt_now();
            if (eval_now && train_evaluate(ctx, &eval_loss, err, sizeof err) == TRAIN_DATA_REFUSED) {
                status = stop_on_refused_data(ctx, err);
                break;
            }
            /* not after a signal (the run stops and saves); a sample it refuses costs only the test loss: the run
             * is trained, and its last checkpoint is saved as usual (train_stop_requested: every rank at once) */
            if (test_now && !train_stop_requested(0) &&
                train_evaluate_test(ctx, &test_loss, err, sizeof err) == TRAIN_DATA_REFUSED) {
                if (err[0]) mt_warn("%s: no test_loss (the run's last checkpoint is saved as usual)", err);
                test_loss = NAN;
            }
            /* a signal that stopped the evaluation (or came during it), or a time limit it took the run past, stops
             * the run after this step (every rank evaluated: the collective is every rank's) */
            if (eval_now && !stop_signal && step < ctx->total_steps)
                stop_signal = train_stop_requested(exit_limit(ctx));
            if (eval_now || test_now) clock.paused_s += mt_now() - eval_start;
            log_step(ctx, metrics, &result, step, eval_loss, test_loss, &clock);
        }
        /* A background save that failed stops the run: it must not go on
         * believing it has that checkpoint. */
        const bool save_due = is_multiple(step, recipe->checkpoint.interval) || step == ctx->total_steps;
        const double save_start = mt_now();
        if (save_due ? save_now(ctx, saver) != 0 : ckpt_saver_poll(saver, err, sizeof err) != 0) {
            if (!save_due && comm_world()->rank == 0) print_error(err);
            if (!save_due) say_after_failed_save(ctx, err);
            status = MT_EXIT_FAILURE;
            ctx->stopped_together = true; /* a save's verdict is every rank's (save_now, ckpt_saver_poll) */
            break;
        }
        const double save_s = mt_now() - save_start; /* in this step's timers, out of the next line's throughput */
        ctx->timers.checkpoint += save_s;
        clock.paused_s += save_s;
        /* a stop that came during the save (a signal, the time limit it took the run past): here, not after another
         * step and save; save_due is every rank's, so is this collective */
        if (save_due && !stop_signal && step < ctx->total_steps) {
            stop_signal = train_stop_requested(exit_limit(ctx));
            if (stop_signal && !log_now) log_step(ctx, metrics, &result, step, NAN, NAN, &clock);
        }
        if (is_multiple(step, recipe->logging.timers_interval)) {
            if (comm_world()->rank == 0) metrics_print_timers(&ctx->timers, step);
            ctx->timers = (StepTimers){0};
        }
    }
    if (status == MT_EXIT_OK && stop_signal && ctx->state.step > ctx->start_step && save_now(ctx, saver) != 0) {
        status = MT_EXIT_FAILURE;
        ctx->stopped_together = true;
    }
    /* A rank that failed on its own must not wait in the saver's collectives
     * while the others wait in the step's: it ends the job here (a save in
     * flight leaves only its temporary directory, removed by the next save).
     * A failure every rank agrees on (non-finite steps, a failed save,
     * differing replicas, refused data) still lets a save in flight complete below, and the
     * ranks end MPI together (run_context). */
    if (alone && comm_world()->size > 1) dist_finish(status);
    if (ckpt_saver_wait(saver, err, sizeof err) != 0) { /* every rank's verdict, as a save's */
        if (comm_world()->rank == 0) print_error(err);
        say_after_failed_save(ctx, err);
        status = MT_EXIT_FAILURE;
        ctx->stopped_together = true;
    }
    ckpt_saver_free(saver); /* the signal handlers stay: a second SIGTERM here is not fatal (train_signal.h) */

    if (status == MT_EXIT_OK && stop_signal && ctx->state.step == ctx->start_step)
        mt_log("stopped by %s before the first step: nothing new to save", train_stop_name(stop_signal));
    else if (status == MT_EXIT_OK && stop_signal) {
        char again[256];
        stops_again(ctx, stop_signal, again, sizeof again);
        mt_log("stopped by %s after step %ld: checkpoint in %s/iter_%07ld; continue with `megatrain resume %s`%s",
               train_stop_name(stop_signal), ctx->state.step, ctx->checkpoints_dir, ctx->state.step, recipe->run.dir,
               again);
    }
    else if (status == MT_EXIT_OK) {
        char lost[256] = ""; /* what a full disk took from metrics.jsonl and TensorBoard (warned of as it happened) */
        const long lines = metrics_lines_lost(metrics), events = metrics_events_lost(metrics);
        if (lines > 0 || events > 0)
            snprintf(lost, sizeof lost, " (incomplete: %ld logged step(s) without their line, %ld without their "
                     "TensorBoard events; see the warnings)", lines, events);
        if (ctx->start_step > 0) /* a resumed run: the run's totals, this session's time */
            mt_log("done: %ld steps, %lld tokens (this session: steps %ld-%ld in %.1fs), final loss %.4f; metrics in "
                   "%s/metrics.jsonl%s", ctx->state.step, (long long)ctx->state.consumed_tokens, ctx->start_step + 1,
                   ctx->state.step, mt_now() - start_time, result.loss, recipe->run.dir, lost);
        else
            mt_log("done: %ld steps, %lld tokens in %.1fs, final loss %.4f; metrics in %s/metrics.jsonl%s",
                   ctx->state.step, (long long)ctx->state.consumed_tokens, mt_now() - start_time, result.loss,
                   recipe->run.dir, lost);
    }
    return status;
}

/* A setup that failed, torn down: said here, or already by the first rank of those that agreed on it, which
 * end MPI together (a failure one rank met alone ends the job from main: dist_finish). */
static int setup_failed(TrainContext *ctx, int status, const char *err) {
    const bool together = ctx->stopped_together;
    if (!together) print_error(err);
    train_teardown(ctx);
    if (together) dist_finish_together(status);
    return status;
}

/* Open metrics.jsonl, print the banner, train, tear down. A writer that cannot open stops the run before its first
 * step, as a refusal in setup does: a run.dir the run made goes (train_remove_refused_run_dir), and every rank
 * stops with rank 0, which alone writes the metrics (train_setup_agree: none goes on into the first step's
 * collectives without it). */
static int run_context(TrainContext *ctx) {
    char err[2048] = "";
    MetricsWriter metrics = {0};
    int opened = 0;
    if (comm_world()->rank == 0 && metrics_open(&metrics, ctx->recipe->run.dir, ctx->recipe->logging.tensorboard,
                                                 ctx->start_step + 1, err, sizeof err) != 0)
        opened = MT_EXIT_FAILURE;
    if (train_setup_agree(ctx, opened, err) != 0) {
        if (comm_world()->rank == 0) train_remove_refused_run_dir(ctx);
        return setup_failed(ctx, MT_EXIT_FAILURE, err);
    }
    print_banner(ctx);
    char bus[64], why[256];
    if (ctx->device->ops->pci_bus_id(ctx->device, bus, sizeof bus) &&
        !energy_meter_open(&ctx->energy, bus, why, sizeof why))
        mt_log("energy: not measured: %s", why);
    int status = train_loop(ctx, &metrics);
    metrics_close(&metrics);
    /* One failing rank of several ends the job before anything is torn down:
     * destroying an NCCL communicator waits for the other ranks, which are
     * waiting in a collective for this one. Ranks that stopped together are
     * waiting for nothing: they tear down and end MPI, each exiting with the
     * status. */
    const bool together = ctx->stopped_together;
    if (status != MT_EXIT_OK && comm_world()->size > 1 && !together) dist_finish(status);
    train_teardown(ctx);
    if (together) dist_finish_together(status);
    return status;
}

int train_run(const Recipe *recipe) {
    TrainContext ctx;
    char err[2048];
    int status = train_setup(&ctx, recipe, err, sizeof err);
    if (status != 0) return setup_failed(&ctx, status, err);
    return run_context(&ctx);
}

int train_resume(const Recipe *recipe, const char *checkpoint_dir, bool load_optimizer, char *unreadable,
                 size_t unreadable_len) {
    TrainContext ctx;
    char err[2048];
    int status = train_setup_resume(&ctx, recipe, checkpoint_dir, load_optimizer, err, sizeof err);
    if (status == TRAIN_CHECKPOINT_UNREADABLE) {
        mt_set_error(unreadable, unreadable_len, "%s", err);
        train_teardown(&ctx);
        return status;
    }
    if (status != 0) return setup_failed(&ctx, status, err);
    mt_log("resume: from %s at step %ld (%lld samples, %lld tokens consumed)", checkpoint_dir, ctx.state.step,
           (long long)ctx.state.consumed_samples, (long long)ctx.state.consumed_tokens);
    if (ctx.state.step >= ctx.total_steps) {
        /* a requeued job of a finished run: its last line says so as a run that ends does (a job script tells a
         * finished run from a stopped one by `done:`, docs/checkpoints.md) */
        mt_log("done: the run is complete: its checkpoint is at step %ld of %ld (nothing to train; raise %s with "
               "--set to go on)", ctx.state.step, ctx.total_steps, recipe->train.steps > 0 ? "train.steps" : "train.tokens");
        train_teardown(&ctx);
        return MT_EXIT_OK;
    }
    return run_context(&ctx);
}
