/* train_step.c: one optimizer step (gradient accumulation over micro-batches,
 * clipping, AdamW) and the evaluation pass.
 *
 * Sample order follows Megatron's pretraining sampler: a step takes the next
 * global_batch samples; micro-batch i of dp rank r reads samples
 * consumed + i * mbs * dp + r * mbs + [0, mbs). A sample is seq_len + 1
 * tokens: inputs are its first seq_len, targets the same shifted by one. */
#include <math.h>

#include "../core/error.h"
#include "batch_schedule.h"
#include "grad_clip.h"
#include "lr_schedule.h"
#include "train_context.h"

/* Fill ctx->inputs / ctx->targets with micro_batch_size samples from `first`. */
static void load_micro_batch(TrainContext *ctx, const DataLoader *loader, int64_t first) {
    const int B = ctx->recipe->train.micro_batch_size;
    const int T = ctx->recipe->train.seq_len;
    for (int b = 0; b < B; b++) {
        data_loader_get(loader, first + b, ctx->sample);
        for (int t = 0; t < T; t++) {
            ctx->inputs[(long)b * T + t] = ctx->sample[t];
            ctx->targets[(long)b * T + t] = ctx->sample[t + 1];
        }
    }
}

/* First sample of micro-batch `micro` of this rank in a batch starting at `base`. */
static int64_t micro_batch_start(const TrainContext *ctx, int64_t base, long micro) {
    const int64_t mbs = ctx->recipe->train.micro_batch_size;
    return base + (int64_t)micro * mbs * ctx->layout.dp_size + (int64_t)ctx->layout.dp_rank * mbs;
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

    model_zero_grad(ctx->model);
    double loss_sum = 0.0;
    for (long micro = 0; micro < num_micro; micro++) {
        load_micro_batch(ctx, ctx->train_data, micro_batch_start(ctx, state->consumed_samples, micro));
        loss_sum += (double)model_forward(ctx->model, ctx->inputs, ctx->targets, B, T);
        model_backward(ctx->model, (float)(1.0 / (double)num_micro));
    }
    const double loss = loss_sum / (double)num_micro;
    const double grad_norm = grad_global_norm(ctx->model->grads, ctx->model->num_floats);
    if (!isfinite(loss) || !isfinite(grad_norm)) {
        mt_set_error(err, errlen, "step %ld: %s is %g; stopping (a lower optimizer.lr may help)",
                     state->step + 1, isfinite(loss) ? "grad norm" : "loss", isfinite(loss) ? grad_norm : loss);
        return -1;
    }

    const double clip_scale = grad_clip_scale(grad_norm, opt->clip_grad);
    const double lr = lr_at(opt, state->step, ctx->total_steps);
    adamw_step(&ctx->optimizer, ctx->model, opt, lr, (float)clip_scale);

    state->step++;
    state->consumed_samples += gbs;
    state->consumed_tokens += (int64_t)gbs * T;

    result->global_batch_size = gbs;
    result->loss = loss;
    result->grad_norm = grad_norm;
    result->lr = lr;
    return 0;
}

double train_evaluate(TrainContext *ctx) {
    const TrainConfig *train = &ctx->recipe->train;
    double loss_sum = 0.0;
    for (long batch = 0; batch < train->eval_batches; batch++) {
        load_micro_batch(ctx, ctx->valid_data, micro_batch_start(ctx, 0, batch));
        loss_sum += (double)model_forward(ctx->model, ctx->inputs, ctx->targets, train->micro_batch_size,
                                          train->seq_len);
    }
    return train->eval_batches > 0 ? loss_sum / (double)train->eval_batches : NAN;
}
