/* health.h: training health checks: which parameter's gradient went
 * non-finite, whether the parameters are all finite (before a checkpoint),
 * the loss spike detector, and the test-only switch that plants a NaN. */
#ifndef MT_OBS_HEALTH_H
#define MT_OBS_HEALTH_H

#include <stdbool.h>

#include "../model/model.h"

/* Index (registry order) of the first parameter whose gradient holds a NaN
 * or an infinity, or -1 when every gradient is finite. */
int health_first_nonfinite_grad(const Model *model);

/* True when every parameter value is finite. */
bool health_params_finite(const Model *model);

/* Test-only: the loss-gradient scale for 1-based step `step`: NaN when the
 * environment variable MEGATRAIN_TEST_NAN_STEP names that step, else 1. */
float health_planted_nan_scale(long step);

/* Loss spike detector: exponential moving mean and variance of the loss
 * (weight 2 / (window + 1), like an EMA over `window` steps); a loss above
 * mean + threshold * std is a spike once warmup losses have been seen.
 * Non-finite losses are ignored (the non-finite check handles them). */
typedef struct LossSpikeDetector {
    int window;          /* e.g. 50 */
    int warmup;          /* losses seen before warning, e.g. 20 */
    double threshold;    /* in standard deviations, e.g. 6 */
    long seen;
    double mean, var;
} LossSpikeDetector;

LossSpikeDetector loss_spike_detector(int window, int warmup, double threshold);

/* Feed one loss; true when it is a spike against the statistics before it
 * (*mean and *std, when not NULL, receive those statistics). A spike is
 * still folded into the statistics afterwards. */
bool loss_spike_check(LossSpikeDetector *d, double loss, double *mean, double *std);

#endif
