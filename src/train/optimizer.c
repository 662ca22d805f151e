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

double grad_global_norm(const float *grads, long n) {
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
    return sqrt(total);
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

void adamw_step(AdamW *opt, Model *model, const OptimizerConfig *cfg, double lr, float grad_scale) {
    if (opt->num_floats != model->num_floats)
        mt_die(MT_EXIT_FAILURE, "optimizer state holds %ld floats but the model has %ld", opt->num_floats,
               model->num_floats);
    opt->step++;
    const double t = (double)opt->step;
    const double bias_correction1 = 1.0 - pow(cfg->beta1, t);
    const double bias_correction2 = 1.0 - pow(cfg->beta2, t);
    for (int k = 0; k < model->num_params; k++) {
        const ParamInfo *info = &model->param_info[k];
        const double decay_factor = info->no_decay ? 1.0 : 1.0 - lr * cfg->weight_decay;
        long begin = (long)info->offset;
        adamw_update_range(model->params, model->grads, opt->m, opt->v, begin, begin + info->numel, lr,
                           decay_factor, cfg->beta1, cfg->beta2, cfg->eps, bias_correction1,
                           bias_correction2, (double)grad_scale);
    }
}
