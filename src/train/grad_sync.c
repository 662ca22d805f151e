/* grad_sync.c: gradient reductions, grad norm and loss over the parallel
 * layout (grad_sync.h). With expert parallel the routed experts' weights
 * differ between the ep ranks of a dp group: they are averaged over the
 * ranks that hold the same experts (edp) and summed over ep in the norm. Every sum that replicas keep is computed so that all
 * of them get the same bits (comm_sum_identical, dp_sum_double). */
#include "grad_sync.h"

#include <math.h>
#include <string.h>

#include "../dist/dp_sync.h"

void train_sync_grads(TrainContext *ctx) {
    Model *m = ctx->model;
    const Grid *grid = &ctx->grid;
    if (ctx->layout.tp > 1)
        for (int i = 0; i < m->num_params; i++) {
            const ParamInfo *p = &m->param_info[i];
            if (p->tp_partial_grad) comm_sum_identical(&grid->groups[GROUP_TP], m->grads + p->offset, (size_t)p->numel, 1.0f);
        }
    if (grid->in_embedding && m->cfg.tie_word_embeddings) { /* embed on the first stage, its copy on the last */
        const ParamInfo *embed = model_embed_param(m);
        if (embed) comm_sum_identical(&grid->groups[GROUP_EMBEDDING], m->grads + embed->offset, (size_t)embed->numel, 1.0f);
    }
    if (ctx->layout.cp > 1) comm_sum_identical(&grid->groups[GROUP_CP], m->grads, (size_t)m->num_floats, 1.0f);
    if (ctx->zero1_on) {
        zero1_reduce_scatter_grads(&ctx->zero1, m->grads);
    } else if (ctx->part.ep > 1) { /* experts: the dp mean over the ranks holding the same experts (edp) */
        const float scale = 1.0f / (float)ctx->layout.dp_size;
        for (int i = 0, run = 0; i <= m->num_params; i++) {
            const bool expert = i < m->num_params && m->param_info[i].expert;
            if (i == m->num_params || expert) { /* the dense run [run, i) */
                if (i > run) {
                    const ParamInfo *first = &m->param_info[run], *last = &m->param_info[i - 1];
                    dp_average_grads(&grid->groups[GROUP_DP], m->grads + first->offset,
                                     last->offset + (size_t)last->numel - first->offset);
                }
                run = i + 1;
            }
            if (expert) {
                const ParamInfo *p = &m->param_info[i];
                comm_sum_identical(&grid->groups[GROUP_EDP], m->grads + p->offset, (size_t)p->numel, scale);
            }
        }
    } else {
        dp_average_grads(&grid->groups[GROUP_DP], m->grads, (size_t)m->num_floats);
    }
}

/* Sum of squares of grads[begin, end) in double. */
static double sumsq(const float *grads, size_t begin, size_t end) { return grad_sumsq(grads + begin, (long)(end - begin)); }

double train_grad_norm(const TrainContext *ctx) {
    const Model *m = ctx->model;
    bool all_owned = !ctx->zero1_on && ctx->part.ep == 1;
    for (int i = 0; i < m->num_params && all_owned; i++) all_owned = m->param_info[i].norm_owner;
    double sum = 0.0, experts = 0.0;
    for (int i = 0; i < m->num_params && !all_owned; i++) {
        const ParamInfo *p = &m->param_info[i];
        if (!p->norm_owner) continue;
        const size_t begin = p->offset, end = p->offset + (size_t)p->numel;
        if (!ctx->zero1_on && p->expert && ctx->part.ep > 1) { /* each ep rank holds other experts */
            experts += sumsq(m->grads, begin, end);
            continue;
        }
        if (!ctx->zero1_on) {
            sum += sumsq(m->grads, begin, end);
            continue;
        }
        /* the distributed optimizer: every rank's parts are disjoint (the experts' too, over edp and ep) */
        /* the distributed optimizer: only this rank's parts are reduced */
        const Zero1 *z = &ctx->zero1;
        for (int r = 0; r < z->num_ranges; r++) {
            const size_t b = z->begin[r] > begin ? z->begin[r] : begin, e = z->end[r] < end ? z->end[r] : end;
            if (b < e) sum += sumsq(m->grads, b, e);
        }
    }
    if (all_owned) sum = sumsq(m->grads, 0, (size_t)m->num_floats); /* the single-rank order */
    if (ctx->zero1_on) sum = dp_sum_double(&ctx->grid.groups[GROUP_DP], sum);
    if (ctx->part.ep > 1) sum += dp_sum_double(&ctx->grid.groups[GROUP_EP], experts);
    sum = dp_sum_double(&ctx->grid.groups[GROUP_TP], sum);
    sum = dp_sum_double(&ctx->grid.groups[GROUP_PP], sum);
    return sqrt(sum);
}

double train_step_loss(const TrainContext *ctx, double local_mean) {
    double loss = local_mean;
    if (ctx->layout.pp > 1) loss = dp_sum_double(&ctx->grid.groups[GROUP_PP], ctx->part.has_head ? loss : 0.0);
    return dp_average_double(&ctx->grid.groups[GROUP_DP], loss);
}
