/* moe_dispatch.c: token dispatch and combine over the expert-parallel group
 * (moe_dispatch.h). Rank r of ep holds experts [r E/ep, (r+1) E/ep); rows
 * grouped by global expert are therefore already grouped by destination.
 * Received rows are reordered expert-major (expert j: rows from rank 0,
 * then rank 1, ...) so that each local expert runs one matmul.
 *
 * precision: fp8 (docs/fp8.md) computes each expert's gate|up and down as
 * one FP8 product each, as Transformer Engine's GroupedLinear does: every
 * expert's product has its own scales, from the amax of the rows it
 * computes (input, and output gradient in the backward) and of its own
 * weights, max-reduced over cp (the other parts of the sequences route
 * tokens to the same expert) and, with etp > 1, over tp (the rest of the
 * expert's weights and intermediate). Under ep the rows an expert computes
 * come from several dp ranks' micro-batches, and its amax covers them all,
 * as one GPU grouped product's does: ep layouts therefore match one rank
 * within FP8 rounding only. An expert with no rows casts nothing. */
#include "moe_dispatch.h"

#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../core/fp8.h"
#include "model_fp8.h"

static const Comm single = {.handle = NULL, .rank = 0, .size = 1};

static const Comm *group_of(const Model *m) { return m->part.ep_comm ? m->part.ep_comm : &single; }

/* Room for `rows` rows on the expert side (what arrives varies from step to
 * step: the buffers grow when more comes, never shrink). */
static void ensure_capacity(MoeExperts *x, int rows, size_t C, size_t I) {
    if (rows <= x->cap) return;
    const size_t cap = (size_t)rows + (size_t)rows / 4; /* some headroom against regrowing every step */
    x->order = mt_realloc(x->order, cap * sizeof(int32_t));
    float **c_bufs[] = {&x->recv, &x->x, &x->y, &x->d_y, &x->d_x};
    for (size_t i = 0; i < sizeof c_bufs / sizeof c_bufs[0]; i++) *c_bufs[i] = mt_realloc(*c_bufs[i], cap * C * sizeof(float));
    float **i_bufs[] = {&x->gate, &x->up, &x->act, &x->d_act, &x->d_gate, &x->d_up};
    for (size_t i = 0; i < sizeof i_bufs / sizeof i_bufs[0]; i++) *i_bufs[i] = mt_realloc(*i_bufs[i], cap * I * sizeof(float));
    x->cap = (int)cap;
}

void moe_experts_init(MoeExperts *x, const ModelConfig *cfg, int ep, int etp, int max_rows) {
    const MoeConfig *moe = &cfg->moe;
    const int El = moe->num_experts / ep;
    memset(x, 0, sizeof *x);
    x->send_rows = mt_calloc((size_t)ep, sizeof(long));
    x->recv_rows = mt_calloc((size_t)ep, sizeof(long));
    x->send_counts = mt_calloc((size_t)ep * El, sizeof(int64_t));
    x->recv_counts = mt_calloc((size_t)ep * El, sizeof(int64_t));
    x->offsets = mt_calloc((size_t)El + 1, sizeof(int32_t));
    x->fp8_scales = mt_calloc((size_t)El, sizeof *x->fp8_scales);
    x->fp8_amax = mt_calloc(2 * (size_t)El, sizeof(float));
    /* a balanced share to start with: this rank's own rows */
    ensure_capacity(x, max_rows > 0 ? max_rows : 1, (size_t)cfg->hidden_size, (size_t)(moe->moe_intermediate_size / etp));
}

void moe_experts_free(MoeExperts *x) {
    void *bufs[] = {x->send_rows, x->recv_rows, x->send_counts, x->recv_counts, x->order, x->offsets, x->recv,
                    x->x, x->gate, x->up, x->act, x->y, x->d_y, x->d_act, x->d_gate, x->d_up, x->d_x,
                    x->fp8_scales, x->fp8_amax};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    memset(x, 0, sizeof *x);
}

/* Exchange the row counts and plan the expert-major order of what arrives. */
static void plan(const Model *m, MoeExperts *x, const int32_t *offsets) {
    const Comm *g = group_of(m);
    const int ep = g->size, El = m->cfg.moe.num_experts / ep;
    for (int r = 0; r < ep; r++) {
        x->send_rows[r] = offsets[(r + 1) * El] - offsets[r * El];
        for (int j = 0; j < El; j++) x->send_counts[r * El + j] = offsets[r * El + j + 1] - offsets[r * El + j];
    }
    comm_all_to_all(g, x->send_counts, x->recv_counts, (size_t)El, COMM_INT64);
    long rows = 0;
    for (int s = 0; s < ep; s++) {
        x->recv_rows[s] = 0;
        for (int j = 0; j < El; j++) x->recv_rows[s] += x->recv_counts[s * El + j];
        rows += x->recv_rows[s];
    }
    if (rows > INT32_MAX / 2) mt_die(MT_EXIT_FAILURE, "moe: %ld rows routed to this rank's experts", rows);
    ensure_capacity(x, (int)rows, (size_t)m->cfg.hidden_size, (size_t)(m->cfg.moe.moe_intermediate_size / m->part.etp));
    x->rows = (int)rows;
    int pos = 0;
    for (int j = 0; j < El; j++) {
        x->offsets[j] = pos;
        long base = 0;
        for (int s = 0; s < ep; s++) {
            long within = 0;
            for (int i = 0; i < j; i++) within += x->recv_counts[s * El + i];
            for (long t = 0; t < x->recv_counts[s * El + j]; t++) x->order[pos++] = (int32_t)(base + within + t);
            base += x->recv_rows[s];
        }
    }
    x->offsets[El] = pos;
}

/* rows of `from` (n x width) in `order` (gather) or back (scatter) */
static void permute(float *to, const float *from, const int32_t *order, int n, int width, int gather) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        const size_t a = (size_t)i * width, b = (size_t)order[i] * width;
        memcpy(to + (gather ? a : b), from + (gather ? b : a), (size_t)width * sizeof(float));
    }
}

static void scale_counts(const long *rows, long *out, int n, long width) {
    for (int i = 0; i < n; i++) out[i] = rows[i] * width;
}

/* Expert j's product g over its rows: the parts (outputs and gradients in x, weights and their gradients in layer
 * l's stacks), its input rows and their gradient. */
typedef struct ExpertProduct {
    int rows, IC, count;
    const float *in;
    float *d_in;
    LinearPart parts[2];
    float *scales; /* x->fp8_scales[j][g]: input, weights, output gradient */
} ExpertProduct;

static ExpertProduct expert_product(const Model *model, int l, MoeExperts *x, int j, int g) {
    const ModelPriv *pr = model->priv;
    const LayerWeights *w = &pr->weights[l], *dw = &pr->weight_grads[l];
    const size_t C = (size_t)model->cfg.hidden_size;
    const size_t I = (size_t)(model->cfg.moe.moe_intermediate_size / model->part.etp); /* this rank's slice */
    const size_t r0 = (size_t)x->offsets[j], wj = (size_t)j * I * C; /* every expert matrix has I x C values */
    ExpertProduct p = {.rows = x->offsets[j + 1] - x->offsets[j], .scales = x->fp8_scales[j][g]};
    /* frozen experts (LoRA) have no weight gradients: NULL, no product */
    float *d_gate = dw->e_gate ? dw->e_gate + wj : NULL, *d_up = dw->e_up ? dw->e_up + wj : NULL;
    float *d_down = dw->e_down ? dw->e_down + wj : NULL;
    if (g == EXPERT_GATE_UP) {
        p.in = x->x + r0 * C, p.d_in = x->d_x + r0 * C, p.IC = (int)C, p.count = 2;
        p.parts[0] = (LinearPart){.weight = w->e_gate + wj, .out = x->gate + r0 * I, .dout = x->d_gate + r0 * I,
                                  .dweight = d_gate, .OC = (int)I};
        p.parts[1] = (LinearPart){.weight = w->e_up + wj, .out = x->up + r0 * I, .dout = x->d_up + r0 * I,
                                  .dweight = d_up, .OC = (int)I};
    } else {
        p.in = x->act + r0 * I, p.d_in = x->d_act + r0 * I, p.IC = (int)I, p.count = 1;
        p.parts[0] = (LinearPart){.weight = w->e_down + wj, .out = x->y + r0 * C, .dout = x->d_y + r0 * C,
                                  .dweight = d_down, .OC = (int)C};
    }
    return p;
}

/* fp8.recipe delayed: product g's scales of every local expert from its histories (model_fp8_state.c), its amaxes
 * recorded there (this rank's: the step's end reduces them). */
static void delayed_expert_scales(Model *model, int l, MoeExperts *x, int El, int g, bool backward) {
    const int first = model->part.ep_rank * El; /* the whole model's index of local expert 0 */
    const float dp = fp8_grad_divisor(model);
    for (int j = 0; j < El; j++) {
        const ExpertProduct p = expert_product(model, l, x, j, g);
        float *s = x->fp8_scales[j][g];
        if (backward) {
            fp8_state_expert_record(model, l, first + j, g, FP8_GRAD, linear_group_grad_amax(p.parts, p.count, p.rows) / dp);
            s[2] = fp8_state_expert_scale(model, l, first + j, g, FP8_GRAD) / dp;
            continue;
        }
        fp8_state_expert_record(model, l, first + j, g, FP8_INPUT, fp8_amax(p.in, (long)p.rows * p.IC));
        fp8_state_expert_record(model, l, first + j, g, FP8_WEIGHT, linear_group_weight_amax(p.parts, p.count, p.IC));
        s[0] = fp8_state_expert_scale(model, l, first + j, g, FP8_INPUT);
        s[1] = fp8_state_expert_scale(model, l, first + j, g, FP8_WEIGHT);
    }
}

/* precision: fp8: product g's scales of every local expert. The forward's (backward false): its input's, from the
 * rows it computes here, and its weights'; the backward's: its output gradient's. Each amax is max-reduced over cp
 * and, with etp > 1, tp (model_fp8_amax_reduce; the weights are the same on every cp rank): one collective for all
 * the experts. An expert with no rows here has an amax of 0 here (a scale of 1 when no rank has rows for it). */
static void expert_scales(Model *model, int l, MoeExperts *x, int El, int g, bool backward) {
    if (!model->fp8_on) return;
    if (model->fp8_state) {
        delayed_expert_scales(model, l, x, El, g, backward);
        return;
    }
    for (int j = 0; j < El; j++) {
        const ExpertProduct p = expert_product(model, l, x, j, g);
        if (backward) {
            x->fp8_amax[j] = linear_group_grad_amax(p.parts, p.count, p.rows);
            continue;
        }
        x->fp8_amax[j] = fp8_amax(p.in, (long)p.rows * p.IC);
        x->fp8_amax[El + j] = linear_group_weight_amax(p.parts, p.count, p.IC);
    }
    model_fp8_amax_reduce(model, x->fp8_amax, backward ? El : 2 * El, model->part.etp > 1);
    for (int j = 0; j < El; j++) {
        float *s = x->fp8_scales[j][g];
        if (backward) {
            s[2] = model_fp8_scale(model, x->fp8_amax[j], model->fp8.grad_format);
        } else {
            s[0] = model_fp8_scale(model, x->fp8_amax[j], FP8_E4M3);
            s[1] = model_fp8_scale(model, x->fp8_amax[El + j], FP8_E4M3);
        }
    }
}

/* Product g of every local expert that has rows: forward, or backward. */
static void experts_run(Model *model, int l, MoeExperts *x, int El, int g, bool backward) {
    expert_scales(model, l, x, El, g, backward);
    for (int j = 0; j < El; j++) {
        const ExpertProduct p = expert_product(model, l, x, j, g);
        if (p.rows == 0) continue;
        if (backward)
            linear_group_product_backward(model, p.d_in, p.in, p.rows, p.IC, p.parts, p.count, p.scales[0],
                                          p.scales[1], p.scales[2]);
        else
            linear_group_product_forward(model, p.in, p.rows, p.IC, p.parts, p.count, p.scales[0], p.scales[1]);
    }
}

void moe_experts_forward(Model *model, int l, MoeExperts *x, const float *in_rows, const int32_t *offsets,
                         float *out_rows) {
    const Comm *g = group_of(model);
    const int C = model->cfg.hidden_size, I = model->cfg.moe.moe_intermediate_size / model->part.etp; /* this rank's slice */
    const int ep = g->size, El = model->cfg.moe.num_experts / ep;
    plan(model, x, offsets);
    long send[MT_MAX_EP], recv[MT_MAX_EP];
    scale_counts(x->send_rows, send, ep, C);
    scale_counts(x->recv_rows, recv, ep, C);
    comm_all_to_all_v(g, in_rows, send, x->recv, recv, COMM_FLOAT);
    permute(x->x, x->recv, x->order, x->rows, C, 1);
    /* each expert: gate|up, SwiGLU, down, over its rows (the products expert by expert, SwiGLU over all rows) */
    experts_run(model, l, x, El, EXPERT_GATE_UP, false);
    model->ops->swiglu_forward(x->act, x->gate, x->up, (long)x->rows * I);
    experts_run(model, l, x, El, EXPERT_DOWN, false);
    permute(x->recv, x->y, x->order, x->rows, C, 0);
    comm_all_to_all_v(g, x->recv, recv, out_rows, send, COMM_FLOAT);
}

void moe_experts_backward(Model *model, int l, MoeExperts *x, const float *d_out_rows, float *d_in_rows) {
    const Comm *g = group_of(model);
    const int C = model->cfg.hidden_size, I = model->cfg.moe.moe_intermediate_size / model->part.etp; /* this rank's slice */
    const int ep = g->size, El = model->cfg.moe.num_experts / ep;
    long send[MT_MAX_EP], recv[MT_MAX_EP];
    scale_counts(x->send_rows, send, ep, C);
    scale_counts(x->recv_rows, recv, ep, C);
    comm_all_to_all_v(g, d_out_rows, send, x->recv, recv, COMM_FLOAT);
    permute(x->d_y, x->recv, x->order, x->rows, C, 1);
    memset(x->d_act, 0, (size_t)x->rows * I * sizeof(float));
    memset(x->d_gate, 0, (size_t)x->rows * I * sizeof(float));
    memset(x->d_up, 0, (size_t)x->rows * I * sizeof(float));
    memset(x->d_x, 0, (size_t)x->rows * C * sizeof(float));
    experts_run(model, l, x, El, EXPERT_DOWN, true);
    model->ops->swiglu_backward(x->d_gate, x->d_up, x->d_act, x->gate, x->up, (long)x->rows * I);
    experts_run(model, l, x, El, EXPERT_GATE_UP, true);
    permute(x->recv, x->d_x, x->order, x->rows, C, 0);
    comm_all_to_all_v(g, x->recv, recv, d_in_rows, send, COMM_FLOAT);
}
