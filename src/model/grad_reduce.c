/* grad_reduce.c: gradient reductions and the grad norm's sum of squares
 * over the parallel layout (grad_reduce.h). With expert parallel the routed
 * experts' weights differ between the ep ranks of a dp group: they are
 * averaged over the ranks that hold the same experts (edp) and summed over
 * ep in the norm. Every sum that replicas keep is computed so that all of
 * them get the same bits (comm_sum_identical, dp_sum_double). Only the
 * trainable parameters have gradients (Model.grads: LoRA's adapters, or all). */
#include "grad_reduce.h"

#include "../dist/dp_sync.h"
#include "optimizer.h"

void model_reduce_grads(Model *m, const Grid *grid, const Zero1 *zero1) {
    if (m->part.tp > 1)
        for (int i = 0; i < m->num_params; i++) {
            const ParamInfo *p = &m->param_info[i];
            if (p->tp_partial_grad && !p->frozen)
                comm_sum_identical(&grid->groups[GROUP_TP], model_grad_of(m, p), (size_t)p->numel, 1.0f);
        }
    if (grid->in_embedding && m->cfg.tie_word_embeddings) { /* embed on the first stage, its copy on the last */
        const ParamInfo *embed = model_embed_param(m);
        if (embed && !embed->frozen)
            comm_sum_identical(&grid->groups[GROUP_EMBEDDING], model_grad_of(m, embed), (size_t)embed->numel, 1.0f);
    }
    if (m->part.cp > 1) comm_sum_identical(&grid->groups[GROUP_CP], m->grads, (size_t)m->num_grad_floats, 1.0f);
    if (zero1) {
        zero1_reduce_scatter_grads(zero1, m->grads);
    } else if (m->part.ep > 1 && m->trainable_offset == 0) { /* experts: the dp mean over the ranks holding the
                                                               * same experts (edp); LoRA trains its adapters alone */
        const float scale = 1.0f / (float)grid->groups[GROUP_DP].size;
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
        dp_average_grads(&grid->groups[GROUP_DP], m->grads, (size_t)m->num_grad_floats);
    }
}

/* Sum of squares of grads[begin, end) in double. */
static double sumsq(const float *grads, size_t begin, size_t end) { return grad_sumsq(grads + begin, (long)(end - begin)); }

double model_grad_sumsq(const Model *m, const Grid *grid, const Zero1 *zero1) {
    const bool ep = m->part.ep > 1;
    bool all_owned = !zero1 && !ep;
    for (int i = 0; i < m->num_params && all_owned; i++) all_owned = m->param_info[i].norm_owner;
    double sum = 0.0, experts = 0.0;
    for (int i = 0; i < m->num_params && !all_owned; i++) {
        const ParamInfo *p = &m->param_info[i];
        if (!p->norm_owner || p->frozen) continue;
        const size_t begin = (size_t)(model_grad_of(m, p) - m->grads), end = begin + (size_t)p->numel;
        if (!zero1 && p->expert && ep) { /* each ep rank holds other experts */
            experts += sumsq(m->grads, begin, end);
            continue;
        }
        if (!zero1) {
            sum += sumsq(m->grads, begin, end);
            continue;
        }
        /* the distributed optimizer: only this rank's parts are reduced (every rank's parts are disjoint, the
         * experts' too, over edp and ep) */
        for (int r = 0; r < zero1->num_ranges; r++) {
            const size_t b = zero1->begin[r] > begin ? zero1->begin[r] : begin;
            const size_t e = zero1->end[r] < end ? zero1->end[r] : end;
            if (b < e) sum += sumsq(m->grads, b, e);
        }
    }
    if (all_owned) sum = sumsq(m->grads, 0, (size_t)m->num_grad_floats); /* the single-rank order */
    if (zero1) sum = dp_sum_double(&grid->groups[GROUP_DP], sum);
    if (ep) sum += dp_sum_double(&grid->groups[GROUP_EP], experts);
    return dp_sum_double(&grid->groups[GROUP_TP], sum);
}
