/* lr_schedule.c: the learning rate and the weight decay at a step, following Megatron-LM's
 * OptimizerParamScheduler.get_lr and get_wd (megatron/core/optimizer_param_scheduler.py).
 *
 * Step indexing. Megatron builds the scheduler with step(0), so its counter
 * num_steps is 0 while the first update is computed, and it advances the
 * counter after every update. Our step s is 0-based and the update of step s
 * uses lr_at(s), which is Megatron's get_lr() with num_steps = s:
 *
 *   warmup (w > 0 and s <= w, w = warmup_steps, or warmup_fraction * decay_steps, not rounded, as Megatron's
 *   lr_warmup_steps = lr_warmup_fraction * lr_decay_steps):
 *       i + (lr - i) * s / w              (i = warmup_init, Megatron's lr_warmup_init, 0 by default:
 *                                          i at s = 0, the full lr at s = w)
 *   constant:                             lr (also past decay_steps, as in Megatron)
 *   s > decay_steps:                      min_lr
 *   inverse_sqrt:                         max(min_lr, lr * sqrt(max(warmup,1)) / sqrt(max(s,1)))
 *   otherwise, with r = (s - warmup) / (decay_steps - warmup) in [0, 1]:
 *       linear  coeff = 1 - r
 *       cosine  coeff = 0.5 * (cos(pi r) + 1)
 *       wsd     coeff = 1 until s <= decay_steps - wsd_decay_steps, then with
 *               q = (s - (decay_steps - wsd_decay_steps)) / wsd_decay_steps:
 *               linear 1 - q, cosine 0.5 (cos(pi q) + 1),
 *               exponential 2 * 0.5^q - 1, minus_sqrt 1 - sqrt(q)
 *       lr_at = min_lr + coeff * (lr - min_lr)
 *
 * decay_steps = 0 in the recipe means total_steps.
 *
 * Weight decay (get_wd; Megatron's wd_incr_steps is the run's length, train_iters x global batch in samples, which
 * is total_steps here), with a = weight_decay, b = weight_decay_end, r = s / total_steps:
 *   constant, or s > total_steps:         a (b past the end)
 *   linear                                a + r (b - a)
 *   cosine                                a + 0.5 (cos(pi (1 - r)) + 1) (b - a)   (slow first, fast last) */
#include "lr_schedule.h"

#include <math.h>

static double wsd_coefficient(WsdDecayStyle style, double ratio) {
    switch (style) {
    case WSD_LINEAR: return 1.0 - ratio;
    case WSD_COSINE: return 0.5 * (cos(M_PI * ratio) + 1.0);
    case WSD_EXPONENTIAL: return 2.0 * pow(0.5, ratio) - 1.0;
    case WSD_MINUS_SQRT: return 1.0 - sqrt(ratio);
    }
    return 1.0;
}

double lr_at(const OptimizerConfig *opt, long step, long total_steps) {
    const double max_lr = opt->lr;
    const double min_lr = opt->min_lr;
    const long decay_steps = opt->decay_steps > 0 ? opt->decay_steps : total_steps;
    const double warmup = opt->warmup_fraction > 0 ? opt->warmup_fraction * (double)decay_steps
                          : opt->warmup_steps > 0   ? (double)opt->warmup_steps
                                                    : 0.0;
    if (step < 0) step = 0;

    if (warmup > 0 && (double)step <= warmup) return opt->warmup_init + (max_lr - opt->warmup_init) * (double)step / warmup;

    if (opt->decay == DECAY_CONSTANT) return max_lr;

    if (step > decay_steps) return min_lr;

    if (opt->decay == DECAY_INVERSE_SQRT) {
        double w = warmup > 1 ? warmup : 1.0;
        double s = step > 1 ? (double)step : 1.0;
        double lr = max_lr * sqrt(w) / sqrt(s);
        return lr > min_lr ? lr : min_lr;
    }

    /* Here warmup < step <= decay_steps, so the span is positive unless both are 0. */
    const double span = (double)decay_steps - warmup;
    if (span <= 0) return max_lr;
    double ratio = ((double)step - warmup) / span;

    double coeff = 1.0;
    switch (opt->decay) {
    case DECAY_LINEAR: coeff = 1.0 - ratio; break;
    case DECAY_COSINE: coeff = 0.5 * (cos(M_PI * ratio) + 1.0); break;
    case DECAY_WSD: {
        long anneal_start = decay_steps - opt->wsd_decay_steps;
        if (opt->wsd_decay_steps <= 0 || step <= anneal_start) {
            coeff = 1.0;
        } else {
            double wsd_ratio = (double)(step - anneal_start) / (double)opt->wsd_decay_steps;
            coeff = wsd_coefficient(opt->wsd_decay_style, wsd_ratio);
        }
        break;
    }
    case DECAY_CONSTANT:
    case DECAY_INVERSE_SQRT: break; /* handled above */
    }
    return min_lr + coeff * (max_lr - min_lr);
}

double weight_decay_at(const OptimizerConfig *opt, long step, long total_steps) {
    if (opt->weight_decay_style == WD_CONSTANT) return opt->weight_decay;
    if (step > total_steps) return opt->weight_decay_end;
    const double ratio = total_steps > 0 && step > 0 ? (double)step / (double)total_steps : 0.0;
    const double coeff = opt->weight_decay_style == WD_LINEAR ? ratio : 0.5 * (cos(M_PI * (1.0 - ratio)) + 1.0);
    return opt->weight_decay + coeff * (opt->weight_decay_end - opt->weight_decay);
}
