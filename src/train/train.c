/* train.c: `megatrain run`: the training loop (setup, steps, evaluation,
 * metrics, the start banner and the final line).
 *
 * Training is bit-for-bit deterministic for a recipe: timings feed only the
 * tokens/s and elapsed columns, never the computation. */
#include "train.h"

#include <math.h>
#include <stdio.h>

#include "../core/error.h"
#include "../core/timer.h"
#include "metrics.h"
#include "train_context.h"

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
    format_params(params, sizeof params, (double)ctx->model->num_floats);
    mt_log("megatrain: run '%s' -> %s", recipe->run.name, recipe->run.dir);
    mt_log("model: %s, %s params, %d layers, hidden %d, heads %d (kv %d), vocab %d", model_family_name(m->family),
           params, m->num_layers, m->hidden_size, m->num_attention_heads, m->num_key_value_heads, m->vocab_size);
    mt_log("train: %ld steps, seq_len %d, micro_batch %d, dp %d, %lld train samples (of %lld), %s, device %s",
           ctx->total_steps, t->seq_len, t->micro_batch_size, ctx->layout.dp_size,
           (long long)train_schedule_samples(t, ctx->total_steps),
           (long long)data_loader_num_samples(ctx->train_data),
           ctx->valid_data ? "eval on" : "eval off", recipe->run.device);
}

static bool is_multiple(long step, long interval) { return interval > 0 && step % interval == 0; }

int train_run(const Recipe *recipe) {
    TrainContext ctx;
    char err[2048];
    int status = train_setup(&ctx, recipe, err, sizeof err);
    if (status != 0) {
        fflush(stdout);
        fprintf(stderr, "megatrain: error: %s\n", err);
        train_teardown(&ctx);
        return status;
    }

    MetricsWriter metrics = {0};
    if (metrics_open(&metrics, recipe->run.dir, err, sizeof err) != 0) {
        fprintf(stderr, "megatrain: error: %s\n", err);
        train_teardown(&ctx);
        return MT_EXIT_FAILURE;
    }
    print_banner(&ctx);

    const long log_interval = recipe->logging.interval > 0 ? recipe->logging.interval : 1;
    const double start_time = mt_now();
    double last_log_time = start_time;
    int64_t last_log_tokens = ctx.state.consumed_tokens;
    StepResult result = {0};
    status = MT_EXIT_OK;

    while (ctx.state.step < ctx.total_steps) {
        if (train_step(&ctx, &result, err, sizeof err) != 0) {
            fflush(stdout);
            fprintf(stderr, "megatrain: error: %s\n", err);
            status = MT_EXIT_FAILURE;
            break;
        }
        const long step = ctx.state.step; /* 1-based: the step just done */
        const bool eval_now = ctx.valid_data && is_multiple(step, recipe->train.eval_interval);
        const bool log_now = is_multiple(step, log_interval) || step == ctx.total_steps || eval_now;
        if (!log_now) continue;

        const double eval_loss = eval_now ? train_evaluate(&ctx) : NAN;
        const double now = mt_now();
        const double interval_s = now - last_log_time;
        StepMetrics m = {
            .step = step,
            .total_steps = ctx.total_steps,
            .loss = result.loss,
            .lr = result.lr,
            .global_batch_size = result.global_batch_size,
            .grad_norm = result.grad_norm,
            .tokens_per_s = interval_s > 0 ? (double)(ctx.state.consumed_tokens - last_log_tokens) / interval_s : 0,
            .consumed_tokens = (double)ctx.state.consumed_tokens,
            .elapsed_s = now - start_time,
            .eval_loss = eval_loss,
        };
        metrics_print(&m);
        metrics_write(&metrics, &m);
        last_log_time = now;
        last_log_tokens = ctx.state.consumed_tokens;
    }

    if (status == MT_EXIT_OK)
        mt_log("done: %ld steps, %lld tokens in %.1fs, final loss %.4f; metrics in %s/metrics.jsonl",
               ctx.state.step, (long long)ctx.state.consumed_tokens, mt_now() - start_time, result.loss,
               recipe->run.dir);
    metrics_close(&metrics);
    train_teardown(&ctx);
    return status;
}
