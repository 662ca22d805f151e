/* train_step.c: one optimizer step (gradient accumulation over micro-batches,
 * clipping, AdamW) and the evaluation pass.
 *
 * Sample order follows Megatron's pretraining sampler: a step takes the next
 * global_batch samples; micro-batch i of dp rank r reads samples
 * consumed + i * mbs * dp + r * mbs + [0, mbs). A sample is seq_len + 1
 * tokens: inputs are its first seq_len, targets the same shifted by one
 * (an SFT dataset's loss mask sets a masked target to -1: ignored); the
 * reading is src/data/micro_batch.c, which `megatrain eval` shares.
 * train.loss per_token: before the micro-batches every rank counts its
 * counted targets of the step, one all-reduce over cp and dp sums them, and
 * the model divides each micro-batch's summed loss by that total over
 * micro-batches x dp (set_loss_tokens), so that the usual mean over
 * micro-batches and dp ranks is the per-token mean of the global batch.
 * Evaluation does the same over its batches (Megatron's evaluate with
 * --calculate-per-token-loss): the eval loss is the sum of every counted
 * target's loss over the total count, not a mean of batch means.
 * train.eval_batches: all evaluates every validation sample once, the last
 * batch padded with masked samples and weighed by its samples under
 * per_micro_batch (src/data/eval_coverage.h says why that is exact); the
 * count is resolved where the loaders are built (ctx->valid_extent).
 * data.pack: a sample is a packed row of whole documents (sft_packing.h);
 * every rank reads whole rows and keeps its positions' tokens (context
 * parallel), and the model gets each position's place in its document over
 * the whole row (set_positions before the forward; under pp, forward_start
 * of every stage's activation set).
 * With dp > 1 the gradients and the loss are averaged over the dp group
 * before the norm, so every rank takes the same step. The model is reached
 * only through its ModelDevice (src/model/model_device.h), whichever device
 * computes it. */
#include <math.h>
#include <stdlib.h>

#include "../core/error.h"
#include "../core/timer.h"
#include "../dist/comm.h"
#include "../dist/dp_sync.h"
#include "../obs/health.h"
#include "../config/batch_schedule.h"
#include "grad_clip.h"
#include "lr_schedule.h"
#include "train_context.h"
#include "train_signal.h"

/* Seconds since *t, and *t moved to now. */
static double lap(double *t) {
    const double now = mt_now();
    const double dt = now - *t;
    *t = now;
    return dt;
}

/* Tokens of each sample this rank holds: seq_len / cp. */
static int local_seq_len(const TrainContext *ctx) { return ctx->recipe->train.seq_len / ctx->layout.cp; }

/* The device told where the packed samples of the micro-batch just loaded start (NULL: plain rows; pp 1). */
static void tell_device(TrainContext *ctx, const int32_t *places) {
    ctx->device->ops->set_positions(ctx->device, places, ctx->recipe->train.micro_batch_size, local_seq_len(ctx));
}

/* What the pipeline's loader callback needs to find micro-batch i. */
typedef struct MicroSource {
    TrainContext *ctx;
    const DataLoader *loader;
    int64_t base;      /* training: the step's first sample */
    const EvalExtent *eval; /* evaluation (NULL: training): this rank's batch first_micro + micro (load_eval_batch) */
    bool per_token;    /* evaluation: train.loss per_token (each batch weighs 1, eval_extent_weight) */
    long first_micro;  /* evaluation: the round's first batch of this rank */
    long next_counted; /* first_micro + micro of the next micro-batch for count_empty: the last stage loads each
                        * twice (its start, its head), and the stages start them in order */
} MicroSource;

/* First sample of micro-batch `micro` of this rank in a batch starting at `base`. */
static int64_t micro_batch_start(const TrainContext *ctx, int64_t base, long micro) {
    const int64_t mbs = ctx->recipe->train.micro_batch_size;
    return base + (int64_t)micro * mbs * ctx->layout.dp_size + (int64_t)ctx->layout.dp_rank * mbs;
}

static int64_t eval_batch_start(const TrainContext *ctx, long micro) {
    return ((int64_t)ctx->layout.dp_rank + (int64_t)micro * ctx->layout.dp_size) * ctx->recipe->train.micro_batch_size;
}

/* The evaluation's batch that micro-batch `micro` of this dp rank reads. */
static int64_t eval_batch_of(const TrainContext *ctx, long micro) {
    return (int64_t)ctx->layout.dp_rank + (int64_t)micro * ctx->layout.dp_size;
}

/* Evaluation batch `micro` of this dp rank (`all`'s last one partial: its places past the set's last sample
 * masked, micro_batch_load_part); past its last one, batch 0 with every target ignored (a forward that adds no
 * loss). Returns the packed places, as micro_batch_load. */
static const int32_t *load_eval_batch(TrainContext *ctx, const EvalExtent *extent, const DataLoader *loader,
                                      long micro) {
    const int samples = eval_extent_batch_samples(extent, eval_batch_of(ctx, micro));
    const bool padding = samples == 0;
    const int32_t *places = padding ? micro_batch_load(&ctx->batch, loader, 0)
                                    : micro_batch_load_part(&ctx->batch, loader, eval_batch_start(ctx, micro), samples);
    if (padding) {
        for (long i = 0; i < (long)ctx->recipe->train.micro_batch_size * local_seq_len(ctx); i++)
            ctx->batch.targets[i] = -1;
        ctx->batch.empty = false; /* no batch of the data: not one whose targets are all masked */
    }
    return places;
}

/* The micro-batch just loaded, for the loss it will give: counted in ctx->empty_batches when no target of it
 * counts, on the rank that computes its loss (every rank of pp 1, the last stage of a pipeline). */
static void count_empty(TrainContext *ctx) {
    if (ctx->layout.pp == 1 || ctx->part.has_head) ctx->empty_batches += ctx->batch.empty;
}

static double pipeline_load(void *arg, int micro, const int32_t **inputs, const int32_t **targets,
                            const int32_t **positions) {
    MicroSource *src = arg;
    if (src->eval) *positions = load_eval_batch(src->ctx, src->eval, src->loader, src->first_micro + micro);
    else *positions = micro_batch_load(&src->ctx->batch, src->loader, micro_batch_start(src->ctx, src->base, micro));
    if (src->first_micro + micro >= src->next_counted) {
        count_empty(src->ctx);
        src->next_counted = src->first_micro + micro + 1;
    }
    *inputs = src->ctx->batch.inputs;
    *targets = src->ctx->batch.targets;
    return src->eval ? eval_extent_weight(src->eval, eval_batch_of(src->ctx, src->first_micro + micro), src->per_token)
                     : 1.0;
}

/* Collective over pp and dp: `value` summed over the pipeline stages (pp > 1) and the dp ranks, whether any
 * rank refused a sample it read (micro_batch.h: a token outside the vocabulary) and (empty_batches, may be NULL)
 * the micro-batches of every replica in which no target counts (count_empty), carried beside the value in the
 * same reductions. Every rank of a dp replica reads its samples whole (each pipeline stage loads every
 * micro-batch; tp and cp ranks read the same samples), so pp and dp reach every rank that could have refused one. */
static double sum_over_replicas(const TrainContext *ctx, double value, bool *refused, long *empty_batches) {
    double v[3] = {value, ctx->batch.refused[0] != '\0', (double)ctx->empty_batches};
    if (ctx->layout.pp > 1) dp_sum_doubles(&ctx->grid.groups[GROUP_PP], v, 3);
    dp_sum_doubles(&ctx->grid.groups[GROUP_DP], v, 3);
    *refused = v[1] > 0;
    if (empty_batches) *empty_batches = (long)v[2];
    return v[0];
}

/* Collective: the step's loss from this rank's mean over its micro-batches
 * (meaningful on the last pipeline stage): shared over pp, averaged over dp;
 * *refused and *empty_batches as sum_over_replicas. */
static double step_loss(const TrainContext *ctx, double local_mean, bool *refused, long *empty_batches) {
    const double loss = ctx->layout.pp > 1 && !ctx->part.has_head ? 0.0 : local_mean;
    return sum_over_replicas(ctx, loss, refused, empty_batches) / (double)ctx->layout.dp_size;
}

/* Every rank agreed that `what` held a refused sample: err is its error on the first rank (tp, cp and pp 0) of
 * each dp replica that read one, so that it is printed once per replica, and "" on every other rank. */
static int refused_data(const TrainContext *ctx, long step, const char *what, char *err, size_t errlen) {
    const GridCoords *c = &ctx->grid.coords;
    if (ctx->batch.refused[0] && c->tp == 0 && c->cp == 0 && c->pp == 0)
        mt_set_error(err, errlen, "step %ld: %s: %s", step, what, ctx->batch.refused);
    else
        mt_set_error(err, errlen, "%s", "");
    return TRAIN_DATA_REFUSED;
}

/* Test hook: MEGATRAIN_TEST_FAIL_RANK=R makes world rank R fail at step 3,
 * to check that one failing rank brings the whole job down. */
static bool test_failure_due(const TrainContext *ctx) {
    const char *rank = getenv("MEGATRAIN_TEST_FAIL_RANK");
    return rank && *rank && atoi(rank) == comm_world()->rank && ctx->state.step + 1 == 3;
}

/* train.loss per_token (a collective over cp and dp): the counted targets of
 * n micro-batches of every rank, this rank's from the step's training
 * batches (eval NULL) or its evaluation batches from `eval`, read as `extent` says (padding counts nothing).
 * Divided by what the losses' mean divides by, it is the divisor of each
 * micro-batch's summed loss (set_loss_tokens); 1 when nothing is counted
 * (every loss is 0 whatever the divisor). */
static double loss_tokens(TrainContext *ctx, long n, const DataLoader *eval, const EvalExtent *extent,
                          double batches) {
    double count = 0;
    for (long micro = 0; micro < n; micro++) {
        if (eval) load_eval_batch(ctx, extent, eval, micro);
        else micro_batch_load(&ctx->batch, ctx->train_data, micro_batch_start(ctx, ctx->state.consumed_samples, micro));
        count += (double)micro_batch_counted(&ctx->batch);
    }
    count = dp_sum_double(&ctx->grid.groups[GROUP_DP], dp_sum_double(&ctx->grid.groups[GROUP_CP], count));
    return count > 0 ? count / batches : 1.0;
}

/* Forward and backward of this rank's micro-batches of the step (through the
 * pipeline when pp > 1). Returns the sum of their mean losses (on the last
 * pipeline stage; 0 on the others). */
static double run_micro_batches(TrainContext *ctx, long num_micro, StepTimers *timers, double *t) {
    const int B = ctx->recipe->train.micro_batch_size, T = local_seq_len(ctx);
    const float loss_scale = (float)(1.0 / (double)num_micro) * health_planted_nan_scale(ctx->state.step + 1);
    if (ctx->layout.pp > 1) {
        MicroSource src = {ctx, ctx->train_data, ctx->state.consumed_samples, NULL, false, 0, 0};
        double sum = pipeline_run(&ctx->pipe, (int)num_micro, false, loss_scale, B, T, pipeline_load, &src);
        timers->pipeline += lap(t); /* forward, backward, transfers and data interleave */
        return sum;
    }
    ModelDevice *dev = ctx->device;
    double loss_sum = 0.0;
    for (long micro = 0; micro < num_micro; micro++) {
        tell_device(ctx, micro_batch_load(&ctx->batch, ctx->train_data,
                                          micro_batch_start(ctx, ctx->state.consumed_samples, micro)));
        count_empty(ctx);
        timers->data += lap(t);
        loss_sum += dev->ops->forward(dev, ctx->batch.inputs, ctx->batch.targets, B, T);
        timers->forward += lap(t);
        dev->ops->backward(dev, loss_scale, micro + 1 == num_micro);
        timers->backward += lap(t);
    }
    return loss_sum;
}

/* After the update: the MoE layers' statistics over every rank (a collective
 * over dp and pp) and the expert-bias update. */
static void moe_step_end(TrainContext *ctx, long num_micro, StepResult *result) {
    MoeStepStats st;
    result->moe = ctx->device->ops->moe_step_end(ctx->device, num_micro, !result->nonfinite, &st);
    if (!result->moe) return;
    const Comm *pp = &ctx->grid.groups[GROUP_PP], *dp = &ctx->grid.groups[GROUP_DP], *cp = &ctx->grid.groups[GROUP_CP];
    const double layers = dp_sum_double(pp, st.moe_layers);
    const double imbalance = dp_sum_double(pp, st.imbalance_sum);
    /* each cp rank holds its tokens' share of the losses */
    const double aux = dp_average_double(dp, dp_sum_double(cp, dp_sum_double(pp, st.aux_loss + st.z_loss)));
    /* each alone, without its coefficient, per MoE layer: what Megatron logs as load_balancing_loss and z_loss */
    const MoeConfig *moe = &ctx->recipe->model.moe;
    const double lb = dp_average_double(dp, dp_sum_double(cp, dp_sum_double(pp, st.aux_loss)));
    const double z = dp_average_double(dp, dp_sum_double(cp, dp_sum_double(pp, st.z_loss)));
    const bool has_lb = moe->aux_loss_coeff > 0 && moe->load_balancing != LB_EXPERT_BIAS && moe->load_balancing != LB_NONE;
    result->moe_lb_loss = has_lb && layers > 0 ? lb / moe->aux_loss_coeff / layers : NAN;
    result->moe_z_loss = moe->z_loss_coeff > 0 && layers > 0 ? z / moe->z_loss_coeff / layers : NAN;
    const double dropped = dp_sum_double(dp, dp_sum_double(cp, dp_sum_double(pp, (double)st.dropped)));
    const double assignments = dp_sum_double(dp, dp_sum_double(cp, dp_sum_double(pp, (double)st.assignments)));
    /* none where no auxiliary loss is trained (expert_bias or none without a z-loss, or no MoE layer): not a 0 */
    result->moe_aux_loss = (has_lb || moe->z_loss_coeff > 0) && layers > 0 ? aux : NAN;
    result->moe_imbalance = layers > 0 ? imbalance / layers : NAN;
    result->moe_drop_rate = assignments > 0 ? dropped / assignments : 0.0;
    const double spills = dp_sum_double(dp, dp_sum_double(cp, dp_sum_double(pp, (double)st.spills)));
    const double dispatches = dp_sum_double(dp, dp_sum_double(cp, dp_sum_double(pp, (double)st.dispatches)));
    result->moe_spill_rate = dispatches > 0 ? spills / dispatches : NAN;
}

/* Rank 0 warns, once a run for training and once for evaluation, when micro-batches held no target that counts
 * (`empty` of `total` over every replica; the loss mask or padding left none): under train.loss per_micro_batch
 * each such one counts as loss 0 in the mean, which lowers the loss (and in training scales the others'
 * gradients down); under either reduction a step or an evaluation with none at all has loss 0 (and no gradient).
 * `metric` is the evaluation's ("eval_loss"), NULL for a training step. */
static void say_empty_batches(TrainContext *ctx, const char *metric, long empty, long total) {
    bool *said = metric ? &ctx->said_empty_eval : &ctx->said_empty_train;
    const bool all = empty >= total, per_token = ctx->recipe->train.loss == LOSS_PER_TOKEN;
    if (*said || empty == 0 || (per_token && !all)) return;
    *said = true;
    const long step = ctx->state.step + (metric ? 0 : 1);
    const char *why = "every target masked by the data's loss mask, or padding";
    if (all && metric)
        mt_log_warn("%s at step %ld is 0: no target of its %ld batches counts (%s); said once", metric, step, total,
                    why);
    else if (all)
        mt_log_warn("step %ld: no target of the global batch counts (%s): its loss is 0 and its gradient zero, but "
                    "AdamW's moments and weight decay still moved the weights; said once", step, why);
    else if (metric)
        mt_log_warn("%s at step %ld: %ld of its %ld batches hold no target that counts (%s): each counts as loss 0 "
                    "in the mean (train.loss: per_micro_batch), which lowers %s; train.loss: per_token weighs every "
                    "counted token alike; said once", metric, step, empty, total, why, metric);
    else
        mt_log_warn("step %ld: %ld of its %ld micro-batches hold no target that counts (%s): each counts as loss 0 "
                    "in the step's mean (train.loss: per_micro_batch), which lowers the loss logged and scales the "
                    "others' gradients down; train.loss: per_token weighs every counted token alike; said once",
                    step, empty, total, why);
}

int train_step(TrainContext *ctx, StepResult *result, char *err, size_t errlen) {
    const TrainConfig *train = &ctx->recipe->train;
    const OptimizerConfig *opt = &ctx->recipe->optimizer;
    TrainState *state = &ctx->state;
    const int B = train->micro_batch_size;
    const int T = train->seq_len;

    const long gbs = global_batch_at(train, state->step, (double)state->consumed_tokens);
    const long per_micro = (long)B * ctx->layout.dp_size;
    if (gbs <= 0 || gbs % per_micro != 0) {
        mt_set_error(err, errlen,
                     "step %ld: global batch size %ld is not a multiple of micro_batch_size x dp = %d x %d",
                     state->step + 1, gbs, B, ctx->layout.dp_size);
        return -1;
    }
    const long num_micro = gbs / per_micro;

    ModelDevice *dev = ctx->device;
    StepTimers *timers = &ctx->timers;
    if (timers->steps == 0) timers->first_step = state->step + 1;
    double t = mt_now();
    dev->ops->zero_grad(dev);
    dev->ops->step_begin(dev);
    const bool per_token = train->loss == LOSS_PER_TOKEN;
    if (per_token) /* the losses' mean is taken over micro-batches x dp */
        dev->ops->set_loss_tokens(dev, loss_tokens(ctx, num_micro, NULL, NULL, (double)num_micro * ctx->layout.dp_size));
    ctx->empty_batches = 0;
    const double loss_sum = run_micro_batches(ctx, num_micro, timers, &t);
    if (per_token) dev->ops->set_loss_tokens(dev, 0); /* back to each batch's mean */
    /* Every rank ends with the gradient of the mean loss over the whole
     * global batch (the single-rank result) before the norm, clipping and
     * AdamW (src/model/grad_reduce.h says how; a GPU overlaps the dp
     * averages with the last backward). */
    dev->ops->reduce_grads(dev);
    bool refused;
    long empty;
    const double loss = step_loss(ctx, loss_sum / (double)num_micro, &refused, &empty);
    timers->comm += lap(&t);
    if (!refused) say_empty_batches(ctx, NULL, empty, num_micro * ctx->layout.dp_size);
    if (refused) /* no update, the counters unmoved: the step never happened */
        return refused_data(ctx, state->step + 1, "training data", err, errlen);
    if (test_failure_due(ctx)) {
        mt_set_error(err, errlen, "rank %d: step %ld: failure injected by MEGATRAIN_TEST_FAIL_RANK",
                     comm_world()->rank, state->step + 1);
        return -1;
    }
    /* the stage's sum of squares (each parameter once over tp, dp parts and ep), summed over the stages */
    const double grad_norm = sqrt(dp_sum_double(&ctx->grid.groups[GROUP_PP], dev->ops->grad_sumsq(dev)));
    /* A NaN or Inf loss or grad norm skips the update (parameters and
     * optimizer state untouched); the step still counts, as in Megatron,
     * and train.c decides whether the run goes on. */
    const double lr = lr_at(opt, state->step, ctx->total_steps);
    OptimizerConfig step_opt = *opt; /* the step's weight decay (optimizer.weight_decay_style) */
    step_opt.weight_decay = weight_decay_at(opt, state->step, ctx->total_steps);
    result->nonfinite = !isfinite(loss) || !isfinite(grad_norm);
    if (!result->nonfinite) {
        const double clip_scale = grad_clip_scale(grad_norm, opt->clip_grad);
        dev->ops->optimizer_step(dev, &step_opt, lr, clip_scale);
    }

    moe_step_end(ctx, num_micro, result); /* after the update: the expert biases move only when it ran */
    dev->ops->fp8_step_end(dev); /* delayed scaling: the next step's scales (also after a skipped update, as TE) */
    timers->optimizer += lap(&t);
    timers->steps++;
    state->step++;
    state->consumed_samples += gbs;
    state->consumed_tokens += (int64_t)gbs * T;

    result->global_batch_size = gbs;
    result->loss = loss;
    result->grad_norm = grad_norm;
    result->lr = lr;
    result->weight_decay = opt->weight_decay_style == WD_CONSTANT ? NAN : step_opt.weight_decay;
    return 0;
}

/* Evaluation batches between two looks for a stop signal (collective over all ranks). */
#define EVAL_SIGNAL_BATCHES 8

/* What an evaluation reads: the validation data (eval_loss) or the test share (test_loss). */
typedef struct EvalSet {
    const DataLoader *loader;
    const EvalExtent *extent; /* its batches (train.eval_batches resolved: ctx->valid_extent, test_extent) */
    const char *data;   /* in a refusal: "validation data" */
    const char *metric; /* "eval_loss" */
} EvalSet;

/* The evaluation stopped by a signal (every rank at once) after `done` of this dp rank's batches: *eval_loss NAN
 * (no eval_loss). Returns 0, or TRAIN_DATA_REFUSED when a batch read before the signal was refused (the ranks
 * agree on that here, as at the evaluation's end). */
static int eval_stopped(TrainContext *ctx, const EvalSet *set, long done, bool per_token, double *eval_loss,
                        char *err, size_t errlen) {
    mt_log("evaluation stopped by a signal after %ld of %ld batches (no %s for this step)",
           done * ctx->layout.dp_size, (long)set->extent->batches, set->metric);
    if (per_token) ctx->device->ops->set_loss_tokens(ctx->device, 0);
    *eval_loss = NAN;
    bool refused;
    sum_over_replicas(ctx, 0.0, &refused, NULL);
    return refused ? refused_data(ctx, ctx->state.step, set->data, err, errlen) : 0;
}

/* A long evaluation's progress: a line every 30 s (MEGATRAIN_TEST_EVAL_PROGRESS_SECONDS for the tests; rank 0
 * prints; every rank may call it), from the batches `done` on this dp rank of its share. */
typedef struct EvalProgress {
    double started, said;
} EvalProgress;

static double eval_progress_seconds(void) {
    const char *env = getenv("MEGATRAIN_TEST_EVAL_PROGRESS_SECONDS");
    const double s = env ? atof(env) : 30.0;
    return s >= 0 ? s : 30.0;
}

static void eval_progress(const TrainContext *ctx, const EvalSet *set, EvalProgress *p, long done, long per_rank) {
    const double now = mt_now();
    if (done == 0 || now - p->said < eval_progress_seconds()) return;
    p->said = now;
    const long total = (long)set->extent->batches, batches = done * ctx->layout.dp_size;
    mt_log("evaluation (%s): %ld of %ld batches, %.0f s, about %.0f s left", set->metric,
           batches < total ? batches : total, total, now - p->started,
           (now - p->started) * (double)(per_rank - done) / (double)done);
}

static int evaluate(TrainContext *ctx, const EvalSet *set, double *eval_loss, char *err, size_t errlen) {
    const TrainConfig *train = &ctx->recipe->train;
    /* Batch b reads samples b * mbs + [0, mbs) on every layout; dp rank r
     * evaluates batches r, r + dp, ... and the sums are added up. Every dp
     * rank runs the same number of forwards (a MoE forward has collectives
     * over dp): a rank past its last batch runs one with every target
     * ignored, which adds nothing. Every rank asks train_stop_requested (a
     * collective) at the same batches: a long evaluation stops at SIGTERM
     * within EVAL_SIGNAL_BATCHES batches' time (a preemption's grace period).
     * Each batch's loss is added times its weight (eval_extent_weight: 1 but
     * for `all`'s last partial batch under per_micro_batch). */
    const EvalExtent *extent = set->extent;
    const long batches = (long)extent->batches;
    const long per_rank = (batches + ctx->layout.dp_size - 1) / ctx->layout.dp_size;
    const bool per_token = train->loss == LOSS_PER_TOKEN && batches > 0;
    if (per_token) /* the batches' mean is taken over their number */
        ctx->device->ops->set_loss_tokens(ctx->device, loss_tokens(ctx, per_rank, set->loader, extent, (double)batches));
    ctx->empty_batches = 0;
    double loss_sum = 0.0;
    EvalProgress progress = {mt_now(), mt_now()};
    if (ctx->layout.pp > 1) {
        /* in rounds of EVAL_SIGNAL_BATCHES * pp micro-batches (whole groups of pp: the forward-only schedule
         * keeps every rank busy through them, pipeline_schedule.h): a rank runs 1/(pp * vpp) of the model an
         * op, so a round takes about as long as EVAL_SIGNAL_BATCHES whole forwards, and its fill at most 1/9
         * of that */
        const long round = (long)EVAL_SIGNAL_BATCHES * ctx->layout.pp;
        MicroSource src = {ctx, set->loader, 0, extent, per_token, 0, 0};
        for (long done = 0; done < per_rank; done += round) {
            if (done > 0 && train_stop_requested(0)) return eval_stopped(ctx, set, done, per_token, eval_loss, err, errlen);
            eval_progress(ctx, set, &progress, done, per_rank);
            src.first_micro = done;
            const int M = (int)(per_rank - done < round ? per_rank - done : round);
            loss_sum += pipeline_run(&ctx->pipe, M, true, 0.0f, train->micro_batch_size, local_seq_len(ctx),
                                     pipeline_load, &src);
        }
    } else {
        /* a forward with collectives over tp and cp only (their ranks share their dp rank) needs no padding */
        ModelDevice *dev = ctx->device;
        const long mine = (batches - ctx->layout.dp_rank + ctx->layout.dp_size - 1) / ctx->layout.dp_size;
        for (long micro = 0; micro < per_rank; micro++) {
            if (micro > 0 && micro % EVAL_SIGNAL_BATCHES == 0 && train_stop_requested(0))
                return eval_stopped(ctx, set, micro, per_token, eval_loss, err, errlen);
            if (micro % EVAL_SIGNAL_BATCHES == 0) eval_progress(ctx, set, &progress, micro, per_rank);
            if (micro >= (dev->eval_lockstep ? per_rank : mine)) continue;
            tell_device(ctx, load_eval_batch(ctx, extent, set->loader, micro));
            count_empty(ctx);
            loss_sum += eval_extent_weight(extent, eval_batch_of(ctx, micro), per_token) *
                        dev->ops->forward(dev, ctx->batch.inputs, ctx->batch.targets, train->micro_batch_size,
                                          local_seq_len(ctx));
        }
    }
    if (per_token) ctx->device->ops->set_loss_tokens(ctx->device, 0);
    bool refused;
    long empty;
    loss_sum = sum_over_replicas(ctx, loss_sum, &refused, &empty); /* under pp the last stage has it */
    *eval_loss = batches > 0 ? loss_sum / eval_extent_divisor(extent, per_token) : NAN;
    if (!refused && batches > 0) say_empty_batches(ctx, set->metric, empty, batches);
    return refused ? refused_data(ctx, ctx->state.step, set->data, err, errlen) : 0;
}

int train_evaluate(TrainContext *ctx, double *eval_loss, char *err, size_t errlen) {
    const EvalSet set = {ctx->valid_data, &ctx->valid_extent, "evaluation: validation data", "eval_loss"};
    return evaluate(ctx, &set, eval_loss, err, errlen);
}

int train_evaluate_test(TrainContext *ctx, double *test_loss, char *err, size_t errlen) {
    const EvalSet set = {ctx->test_data, &ctx->test_extent, "evaluation: test data", "test_loss"};
    return evaluate(ctx, &set, test_loss, err, errlen);
}
