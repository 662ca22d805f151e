/* train_resume.c: setting up a TrainContext from a checkpoint for
 * `megatrain resume`: weights, optimizer moments and step, TrainState; then
 * the run directory (recipe.yaml rewritten with the recipe now in force,
 * metrics.jsonl cut back to the checkpoint's step so that the steps
 * trained again after a crash are not listed twice). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../ckpt/checkpoint.h"
#include "../core/error.h"
#include "../core/fs.h"
#include "../dist/comm.h"
#include "resume_report.h"
#include "train.h"
#include "train_ckpt.h"
#include "train_data_record.h"
#include "train_context.h"
#include "lr_schedule.h"

/* Whether a metrics.jsonl line goes: cut short (no newline: a crash or a full disk; the next line appended would run
 * into it), or of a step after `step`. */
static bool metrics_line_dropped(const char *line, ssize_t n, long step, long *dropped, long *incomplete) {
    if (line[n - 1] != '\n') {
        ++*incomplete;
        return true;
    }
    long line_step = 0;
    if (sscanf(line, "{\"step\":%ld", &line_step) == 1 && line_step > step) {
        ++*dropped;
        return true;
    }
    return false;
}

/* Keep the lines of run_dir/metrics.jsonl whose "step" is at most `step`, and drop a last line without its newline.
 * Nothing to drop leaves the file as it is; lines to drop that end it (the usual case: the run's steps ascend) are cut
 * off in place, which needs no room (a resume after a full disk) and keeps the file `tail -f` follows; only lines to
 * drop among kept ones (a file edited by hand) make a copy that replaces it. */
static int trim_metrics(const char *run_dir, long step, char *err, size_t errlen) {
    char path[MT_PATH_MAX + 32], tmp[MT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    struct stat st;
    if (stat(path, &st) != 0 && errno == ENOENT) return 0; /* nothing logged yet: metrics_open creates it */
    FILE *in = mt_fopen_regular(path, NULL, NULL, err, errlen); /* never blocks on a FIFO */
    if (!in) return -1;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long dropped = 0, incomplete = 0;
    off_t offset = 0, cut = -1;
    bool suffix = true; /* every line from the first dropped one on is dropped */
    while ((n = getline(&line, &cap, in)) > 0) {
        if (metrics_line_dropped(line, n, step, &dropped, &incomplete)) {
            if (cut < 0) cut = offset;
        } else if (cut >= 0) {
            suffix = false;
        }
        offset += n;
    }
    int status = 0;
    if (cut >= 0 && suffix) {
        const int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || ftruncate(fd, cut) != 0 || fsync(fd) != 0) {
            mt_set_error(err, errlen, "%s: cannot cut off the lines after step %ld: %s", path, step, strerror(errno));
            status = -1;
        }
        if (fd >= 0) close(fd);
    } else if (cut >= 0) {
        FILE *out = NULL;
        if (mt_temp_name(tmp, sizeof tmp, path) != 0) {
            mt_set_error(err, errlen, "%s: path too long", path);
            status = -1;
        } else if (!(out = fopen(tmp, "w"))) {
            mt_set_error(err, errlen, "%s: cannot write: %s", tmp, strerror(errno));
            status = -1;
        }
        rewind(in);
        long ignored = 0;
        while (status == 0 && (n = getline(&line, &cap, in)) > 0)
            if (!metrics_line_dropped(line, n, step, &ignored, &ignored)) fwrite(line, 1, (size_t)n, out);
        if (out && (mt_fclose_sync(out) != 0 || status != 0 || rename(tmp, path) != 0)) { /* synced: old or new */
            if (status == 0) mt_set_error(err, errlen, "%s: cannot rewrite: %s", path, strerror(errno));
            unlink(tmp);
            status = -1;
        }
    }
    free(line);
    fclose(in);
    if (status != 0) return -1;
    if (dropped > 0) mt_log("resume: dropped %ld line(s) of metrics.jsonl after step %ld", dropped, step);
    if (incomplete > 0) mt_log("resume: dropped the incomplete last line of %s (it ends without a newline)", path);
    return 0;
}

/* Every rank must start from the same checkpoint: when any rank failed to
 * load it, or loaded another step, all report it unreadable together (and
 * fall back together), or all report the frozen base it references
 * (CKPT_ERR_BASE: the checkpoint is fine, nothing falls back) when any rank
 * could not load that. A collective; returns the common result code. */
static int agree_on_load(int rc, long step, char *err, size_t errlen) {
    const Comm *world = comm_world();
    if (world->size <= 1) return rc;
    int64_t mine[2] = {rc, step}, *all = mt_malloc((size_t)world->size * 2 * sizeof(int64_t));
    comm_all_gather(world, mine, all, 2, COMM_INT64);
    for (int r = 0; r < world->size; r++)
        if (all[2 * r] == CKPT_ERR_BASE) { /* whatever this rank met: every rank stops the same way */
            if (rc != CKPT_ERR_BASE)
                mt_set_error(err, errlen, "rank %d could not load the frozen base this checkpoint references (rank %d "
                             "says why)", r, r);
            free(all);
            return CKPT_ERR_BASE;
        }
    /* a checkpoint that does not fit the recipe on one rank (a tensor only its stage needs) does not fit the run:
     * every rank refuses it together, nothing moved aside (before, the others took it for unreadable, and the
     * rank that could not load it aborted the job) */
    for (int r = 0; r < world->size; r++)
        if (all[2 * r] == CKPT_ERR_MISMATCH) {
            free(all);
            return CKPT_ERR_MISMATCH;
        }
    /* a rank that could not load it says why (resume_cmd.c, once); ranks that loaded other steps say so */
    int agreed = rc;
    bool any_failed = false;
    for (int r = 0; r < world->size; r++) any_failed |= all[2 * r] != 0;
    for (int r = 0; r < world->size && agreed == rc; r++)
        if (all[2 * r] != 0 || all[2 * r + 1] != all[1]) {
            if (rc == 0 && any_failed) err[0] = '\0';
            else if (rc == 0) mt_set_error(err, errlen, "rank %d loaded step %lld, rank 0 step %lld", r,
                                           (long long)all[2 * r + 1], (long long)all[1]);
            agreed = rc != 0 ? rc : CKPT_ERR_UNREADABLE;
        }
    free(all);
    return agreed;
}

/* A LoRA checkpoint that references its frozen base: the resumed run's checkpoints reference the same base,
 * unless checkpoint.frozen_base is now store; one that stores it: they store it too (resume_cmd.c sets store). */
static int keep_frozen_base(TrainContext *ctx, const Recipe *recipe, const char *checkpoint_dir, char *err,
                            size_t errlen) {
    if (recipe->model.peft.type != PEFT_LORA) return 0;
    CkptBaseRef base;
    if (ckpt_read_base_ref(checkpoint_dir, &base, err, errlen) != 0) return -1;
    if (!base.present)
        mt_log("resume: %s stores its frozen base: the checkpoints of this run store it too", checkpoint_dir);
    else if (recipe->checkpoint.frozen_base == FROZEN_BASE_STORE)
        mt_log("resume: the frozen base loaded from %s is stored in every checkpoint from now on "
               "(checkpoint.frozen_base: store)", base.dir);
    else
        ctx->frozen_base = base;
    if (ctx->frozen_base.present)
        mt_log("resume: the checkpoints keep referencing the frozen base in %s (checkpoint.frozen_base: %s)",
               base.dir, recipe->checkpoint.frozen_base == FROZEN_BASE_AUTO ? "auto" : "reference");
    return 0;
}

/* optimizer.weight_decay_style linear or cosine spans the run: a resume with another train.steps re-stretches it
 * (Megatron's wd_incr_steps is train_iters too), said as the lr's change is below. */
static void warn_weight_decay_change(const OptimizerConfig *o, const CkptState *saved, long total_steps) {
    if (o->weight_decay_style == WD_CONSTANT || saved->total_steps == total_steps) return;
    const double now = weight_decay_at(o, (long)saved->step, total_steps);
    const double then = weight_decay_at(o, (long)saved->step, (long)saved->total_steps);
    if (now == then) return;
    mt_warn("resume: the weight decay of step %lld is %.4g under this recipe, %.4g under the checkpoint's run: "
            "optimizer.weight_decay_style %s spans train.steps, now %ld steps (the checkpoint's run: %lld)",
            (long long)saved->step + 1, now, then, weight_decay_style_name(o->weight_decay_style), total_steps,
            (long long)saved->total_steps);
}

/* A resume whose --set moves the learning rate off the checkpoint's schedule (a longer train.steps with
 * decay_steps null re-stretches the decay; a new optimizer.lr) goes on with the new one, as asked, but says so
 * with both rates: Megatron refuses this unless told --override-opt_param-scheduler, and a silent jump of the lr
 * shows only as a loss that rises. */
static void warn_schedule_change(const Recipe *recipe, const CkptState *saved, long total_steps) {
    if (comm_world()->rank != 0 || saved->total_steps <= 0) return;
    warn_weight_decay_change(&recipe->optimizer, saved, total_steps);
    const double now = lr_at(&recipe->optimizer, (long)saved->step, total_steps);
    const double then = saved->next_lr;
    if (fabs(now - then) <= 1e-6 * fmax(fabs(now), fabs(then))) return;
    char why[512];
    const OptimizerConfig *o = &recipe->optimizer;
    if (o->decay_steps == 0 && (o->decay != DECAY_CONSTANT || o->warmup_fraction > 0) &&
        saved->total_steps != total_steps)
        snprintf(why, sizeof why, "optimizer.schedule.decay_steps is null, so the %s spans train.steps, now %ld "
                 "steps (the checkpoint's run: %lld); --set optimizer.schedule.decay_steps=%lld keeps its schedule",
                 o->decay == DECAY_CONSTANT ? "warmup_fraction's share" : o->warmup_fraction > 0 ? "warmup and decay"
                 : "decay", total_steps, (long long)saved->total_steps, (long long)saved->total_steps);
    else
        snprintf(why, sizeof why, "this resume's --set changed optimizer.lr, min_lr or optimizer.schedule");
    mt_warn("resume: the learning rate of step %lld is %.3e under this recipe, %.3e under the checkpoint's "
            "(%.2fx): %s", (long long)saved->step + 1, now, then, then > 0 ? now / then : INFINITY, why);
}

/* fp8.recipe delayed: the checkpoint's scales were computed under its recipe's fp8: settings. A --set of
 * fp8.grad_format or fp8.margin makes them this run's (model_fp8_rescale); kept as stored, the first step would cast
 * with another format's scales (after e5m2 -> e4m3 its gradients saturate above 1/128 of their amax). */
static void rescale_fp8(Model *model, const char *checkpoint_dir, const CkptState *saved) {
    if (!model->fp8_state) return;
    static Recipe stored;
    char path[MT_PATH_MAX + 32], err[2048];
    snprintf(path, sizeof path, "%s/%s", checkpoint_dir, CKPT_RECIPE_FILE);
    if (recipe_load_resumed(&stored, path, NULL, 0, 0, (long)saved->step, (double)saved->consumed_tokens,
                            saved->consumed_samples, err, sizeof err) != 0) {
        if (comm_world()->rank == 0)
            mt_warn("resume: the checkpoint's fp8: settings are unknown (%s): its FP8 scales are used as stored", err);
        return;
    }
    if (stored.precision != DTYPE_FP8 || stored.fp8.recipe != FP8_RECIPE_DELAYED) return; /* it held no scales */
    const Fp8Config *now = &model->fp8, *then = &stored.fp8;
    const int changed = model_fp8_rescale(model, then);
    if (changed > 0 && comm_world()->rank == 0)
        mt_log("resume: %d FP8 scales made this run's: the checkpoint's were for fp8.grad_format %s, margin %d; this "
               "run has %s, margin %d (docs/fp8.md)", changed, then->grad_format == FP8_E5M2 ? "e5m2" : "e4m3",
               then->margin, now->grad_format == FP8_E5M2 ? "e5m2" : "e4m3", now->margin);
}

int train_setup_resume(TrainContext *ctx, const Recipe *recipe, const char *checkpoint_dir, bool load_optimizer,
                       char *err, size_t errlen) {
    memset(ctx, 0, sizeof *ctx); /* train_teardown is safe after any return */
    if (train_setup_same_recipe(ctx, recipe, err, errlen) != 0) return MT_EXIT_USAGE;
    /* run.dir is this process's before anything is loaded: another one writing there refuses this resume */
    int status = 0;
    if (comm_world()->rank == 0 &&
        (mt_make_dirs(recipe->run.dir, err, errlen) != 0 || train_lock_run_dir(recipe->run.dir, err, errlen) != 0))
        status = MT_EXIT_FAILURE;
    if (train_setup_agree(ctx, status, err) != 0) return MT_EXIT_FAILURE;
    status = train_setup_common(ctx, recipe, checkpoint_dir, "resume from", err, errlen);
    if (status != 0) return status;

    /* The checkpoint holds the full moments (fp32 or bf16: they are loaded as
     * this run's state dtype); with the distributed optimizer this rank keeps its shard. */
    ModelDevice *dev = ctx->device;
    AdamW full = {0};
    if (dev->zero1_on && load_optimizer)
        adamw_init_dtype(&full, ctx->model->num_grad_floats, dev->optimizer.state_dtype);
    AdamW *into = !load_optimizer ? NULL : dev->zero1_on ? &full : &dev->optimizer;
    CkptMoments moments = into ? train_ckpt_moments(into) : (CkptMoments){0};
    CkptState saved;
    int rc = ckpt_load_training(checkpoint_dir, ctx->model, into ? &moments : NULL, &saved, err, errlen);
    if (rc == 0) {
        rescale_fp8(ctx->model, checkpoint_dir, &saved);
        train_state_from_ckpt(&ctx->state, &saved);
        if (into) train_ckpt_moments_done(into, &moments);
    }
    if (rc == 0 && into == &full) {
        const size_t elem = adamw_state_elem_bytes(full.state_dtype);
        zero1_take_shard(&dev->zero1, adamw_m(&full), adamw_m(&dev->optimizer), elem);
        zero1_take_shard(&dev->zero1, adamw_v(&full), adamw_v(&dev->optimizer), elem);
        dev->optimizer.step = full.step;
    }
    adamw_free(&full);
    const int mine = rc;
    rc = agree_on_load(rc, ctx->state.step, err, errlen);
    if (rc == CKPT_ERR_UNREADABLE) return TRAIN_CHECKPOINT_UNREADABLE;
    /* the checkpoint is fine: not skipped, not moved aside; the first rank that could not load the base says why */
    if (rc == CKPT_ERR_BASE) return train_setup_agree(ctx, mine == CKPT_ERR_BASE ? MT_EXIT_FAILURE : 0, err);
    if (rc == CKPT_ERR_MISMATCH && comm_world()->size > 1) /* the first rank it did not fit says why */
        return train_setup_agree(ctx, mine == CKPT_ERR_MISMATCH ? MT_EXIT_USAGE : 0, err);
    if (rc != 0) return MT_EXIT_USAGE;
    /* the checkpoint loaded on every rank: what the recipe in force changes, said once (resume_report.h) */
    resume_report_say(recipe, checkpoint_dir, ctx->valid_data != NULL);
    warn_schedule_change(recipe, &saved, ctx->total_steps);
    train_data_record_compare(ctx, checkpoint_dir);
    dev->ops->from_host(dev); /* the loaded weights and moments to the device that computes */
    /* carried on: the files for the Hugging Face export, the token ids and export dtype the recipe leaves unset */
    ModelConfig stored;
    int status_after = 0;
    if (ckpt_hf_files_read(checkpoint_dir, &ctx->hf_files, err, errlen) != 0 ||
        ckpt_read_model_config(checkpoint_dir, &stored, err, errlen) != 0)
        status_after = MT_EXIT_FAILURE;
    if (status_after == 0) {
        model_config_inherit_unset(&ctx->model->cfg, &stored);
        if (keep_frozen_base(ctx, recipe, checkpoint_dir, err, errlen) != 0) status_after = MT_EXIT_FAILURE;
    }
    ctx->start_step = ctx->state.step;
    snprintf(ctx->resumed_from, sizeof ctx->resumed_from, "%s", checkpoint_dir);
    if (status_after == 0 && !load_optimizer)
        mt_log("resume: optimizer state not loaded (checkpoint.load_optimizer: false): AdamW starts afresh");

    /* Rank 0 alone writes run.dir; the others wait for it, and stop with it when it cannot. A resume with nothing
     * to do (the checkpoint at train.steps) leaves it as it is: its --set values never ran. */
    if (status_after == 0 && comm_world()->rank == 0 && ctx->state.step < ctx->total_steps) {
        char path[MT_PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/recipe.yaml", recipe->run.dir);
        if (train_check_writers(recipe, err, errlen) != 0 || recipe_write(recipe, path, err, errlen) != 0 ||
            trim_metrics(recipe->run.dir, ctx->state.step, err, errlen) != 0)
            status_after = MT_EXIT_FAILURE;
    }
    return train_setup_agree(ctx, status_after, err);
}
