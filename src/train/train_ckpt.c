/* train_ckpt.c: TrainState and AdamW to and from what a checkpoint holds
 * (train_ckpt.h). */
#include "train_ckpt.h"

#include <string.h>

#include "../config/batch_schedule.h"
#include "lr_schedule.h"

CkptState train_ckpt_state(const TrainState *state, long optimizer_step, const Recipe *recipe) {
    CkptState s = {
        .step = state->step,
        .consumed_samples = state->consumed_samples,
        .consumed_tokens = state->consumed_tokens,
        .optimizer_step = optimizer_step,
    };
    memcpy(s.rng, state->rng.s, sizeof s.rng);
    if (recipe) {
        const long total = train_total_steps(&recipe->train);
        s.total_steps = total;
        s.next_global_batch_size = global_batch_at(&recipe->train, state->step, (double)state->consumed_tokens);
        s.next_lr = lr_at(&recipe->optimizer, state->step, total);
    }
    return s;
}

void train_state_from_ckpt(TrainState *state, const CkptState *saved) {
    state->step = (long)saved->step;
    state->consumed_samples = saved->consumed_samples;
    state->consumed_tokens = saved->consumed_tokens;
    memcpy(state->rng.s, saved->rng, sizeof state->rng.s);
}

CkptMoments train_ckpt_moments(const AdamW *opt) {
    return (CkptMoments){.num_floats = opt->num_floats,
                         .dtype = opt->state_dtype == DTYPE_BF16 ? CKPT_DTYPE_BF16 : CKPT_DTYPE_FP32,
                         .m = adamw_m(opt), .v = adamw_v(opt), .step = opt->step};
}

void train_ckpt_moments_done(AdamW *opt, const CkptMoments *moments) { opt->step = moments->step; }
