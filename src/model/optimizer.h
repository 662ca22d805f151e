/* optimizer.h: AdamW with fp32 states, decoupled weight decay, grad-norm clipping.
 *
 * Weight decay is skipped for parameters marked no_decay (norms, biases).
 * State is m and v (fp32) per parameter float plus the step count, so it can
 * be checkpointed. */
#ifndef MT_MODEL_OPTIMIZER_H
#define MT_MODEL_OPTIMIZER_H

#include "../config/recipe.h"
#include "../dist/zero1.h"
#include "model.h"

typedef struct AdamW {
    long num_floats;
    float *m;
    float *v;
    long step;               /* number of updates applied */
} AdamW;

void adamw_init(AdamW *opt, long num_floats);
void adamw_free(AdamW *opt);

/* L2 norm of all grads (computed in double). */
double grad_global_norm(const float *grads, long n);
/* Its square: the sum of squares in double, in blocks (the same bits for any thread count). */
double grad_sumsq(const float *grads, long n);

/* One update of every parameter of `model` with learning rate lr.
 * grads are multiplied by grad_scale first (clipping: min(1, clip/norm)). */
void adamw_step(AdamW *opt, Model *model, const OptimizerConfig *cfg, double lr, float grad_scale);

/* The same update of only the floats this rank owns under the distributed
 * optimizer (src/dist/zero1.h); opt->m and opt->v hold z->owned floats, the
 * rank's parts in order. The other floats of model->params are left as they
 * were (zero1_all_gather brings them). */
void adamw_step_shard(AdamW *opt, Model *model, const OptimizerConfig *cfg, double lr, float grad_scale,
                      const Zero1 *z);

#endif
