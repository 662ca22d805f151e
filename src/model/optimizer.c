/* optimizer.c: AdamW (as torch.optim.AdamW) with fp32 moments, and the global
 * gradient norm used for clipping.
 *
 * Per float, at update t = opt->step (1-based) with g = grad * grad_scale:
 *   p -= lr * weight_decay * p              (skipped for no_decay params)
 *   m  = beta1 * m + (1 - beta1) * g
 *   v  = beta2 * v + (1 - beta2) * g^2
 *   p -= lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
 * The arithmetic of one float is done in double and stored as float. Every
 * float is updated independently, so the OpenMP loop gives the same bits for
 * any thread count. The norm sums fixed-size blocks in parallel and then adds
 * the block sums in order, so it too is independent of the thread count. */
#include "optimizer.h"

#include <math.h>
#include <stdlib.h>

#include "../core/error.h"

#define NORM_BLOCK 16384L          /* floats per partial sum of the norm */
#define PARALLEL_MIN_FLOATS 32768L /* smaller params are updated by one thread */

void adamw_init(AdamW *opt, long num_floats) {
    opt->num_floats = num_floats;
    opt->m = mt_calloc((size_t)num_floats, sizeof(float));
    opt->v = mt_calloc((size_t)num_floats, sizeof(float));
    opt->step = 0;
}

void adamw_free(AdamW *opt) {
    free(opt->m);
    free(opt->v);
    opt->m = opt->v = NULL;
    opt->num_floats = 0;
    opt->step = 0;
}

double grad_global_norm(const float *grads, long n) { return sqrt(grad_sumsq(grads, n)); }

double grad_sumsq(const float *grads, long n) {
    if (n <= 0) return 0.0;
    long num_blocks = (n + NORM_BLOCK - 1) / NORM_BLOCK;
    double *block_sums = mt_malloc((size_t)num_blocks * sizeof(double));
#pragma omp parallel for schedule(static)
    for (long b = 0; b < num_blocks; b++) {
        long begin = b * NORM_BLOCK;
        long end = begin + NORM_BLOCK < n ? begin + NORM_BLOCK : n;
        double sum = 0.0;
        for (long i = begin; i < end; i++) sum += (double)grads[i] * (double)grads[i];
        block_sums[b] = sum;
    }
    double total = 0.0;
    for (long b = 0; b < num_blocks; b++) total += block_sums[b];
    free(block_sums);
    return total;
}

/* Update floats [begin, end) of params/grads/m/v. */
static void adamw_update_range(float *params, const float *grads, float *m, float *v, long begin, long end,
                               double lr, double decay_factor, double beta1, double beta2, double eps,
                               double bias_correction1, double bias_correction2, double grad_scale) {
#pragma omp parallel for schedule(static) if (end - begin >= PARALLEL_MIN_FLOATS)
    for (long i = begin; i < end; i++) {
        double g = (double)grads[i] * grad_scale;
        double p = (double)params[i] * decay_factor;
        double mi = beta1 * (double)m[i] + (1.0 - beta1) * g;
        double vi = beta2 * (double)v[i] + (1.0 - beta2) * g * g;
        double m_hat = mi / bias_correction1;
        double v_hat = vi / bias_correction2;
        p -= lr * m_hat / (sqrt(v_hat) + eps);
        m[i] = (float)mi;
        v[i] = (float)vi;
        params[i] = (float)p;
    }
}

/* AdamW's per-update constants. */
typedef struct AdamWUpdate {
    double lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2, grad_scale;
} AdamWUpdate;

static AdamWUpdate begin_update(AdamW *opt, const OptimizerConfig *cfg, double lr, float grad_scale) {
    opt->step++;
    const double t = (double)opt->step;
    return (AdamWUpdate){.lr = lr, .beta1 = cfg->beta1, .beta2 = cfg->beta2, .eps = cfg->eps,
                         .weight_decay = cfg->weight_decay, .bias_correction1 = 1.0 - pow(cfg->beta1, t),
                         .bias_correction2 = 1.0 - pow(cfg->beta2, t), .grad_scale = (double)grad_scale};
}

/* Update params/grads [begin, end) of parameter `info`, whose moments are at m, v (indexed from begin). */
static void update_param_range(Model *model, const ParamInfo *info, float *m, float *v, long begin, long end,
                               const AdamWUpdate *u) {
    const double decay_factor = info->no_decay ? 1.0 : 1.0 - u->lr * u->weight_decay;
    adamw_update_range(model->params + begin, model->grads + begin, m, v, 0, end - begin, u->lr, decay_factor,
                       u->beta1, u->beta2, u->eps, u->bias_correction1, u->bias_correction2, u->grad_scale);
}

void adamw_step(AdamW *opt, Model *model, const OptimizerConfig *cfg, double lr, float grad_scale) {
    if (opt->num_floats != model->num_floats)
        mt_die(MT_EXIT_FAILURE, "optimizer state holds %ld floats but the model has %ld", opt->num_floats,
               model->num_floats);
    const AdamWUpdate u = begin_update(opt, cfg, lr, grad_scale);
    for (int k = 0; k < model->num_params; k++) {
        const ParamInfo *info = &model->param_info[k];
        const long begin = (long)info->offset;
        update_param_range(model, info, opt->m + begin, opt->v + begin, begin, begin + info->numel, &u);
    }
}

void adamw_step_shard(AdamW *opt, Model *model, const OptimizerConfig *cfg, double lr, float grad_scale,
                      const Zero1 *z) {
    if ((size_t)opt->num_floats != z->owned)
        mt_die(MT_EXIT_FAILURE, "optimizer state holds %ld floats but this rank's shard has %zu", opt->num_floats,
               z->owned);
    const AdamWUpdate u = begin_update(opt, cfg, lr, grad_scale);
    size_t shard_at = 0;
    int k = 0; /* parameters are in layout order, as the ranges */
    for (int r = 0; r < z->num_ranges; r++) {
        const long b = (long)z->begin[r], e = (long)z->end[r];
        while (k < model->num_params && (long)(model->param_info[k].offset + model->param_info[k].numel) <= b) k++;
        for (int j = k; j < model->num_params && (long)model->param_info[j].offset < e; j++) {
            const ParamInfo *info = &model->param_info[j];
            const long lo = (long)info->offset > b ? (long)info->offset : b;
            const long hi = (long)(info->offset + info->numel) < e ? (long)(info->offset + info->numel) : e;
            const size_t at = shard_at + (size_t)(lo - b);
            update_param_range(model, info, opt->m + at, opt->v + at, lo, hi, &u);
        }
        shard_at += (size_t)(e - b);
    }
}
