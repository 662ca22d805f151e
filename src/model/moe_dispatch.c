/* moe_dispatch.c: token dispatch and combine over the expert-parallel group
 * (moe_dispatch.h). Rank r of ep holds experts [r E/ep, (r+1) E/ep); rows
 * grouped by global expert are therefore already grouped by destination.
 * Received rows are reordered expert-major (expert j: rows from rank 0,
 * then rank 1, ...) so that each local expert runs one matmul. */
#include "moe_dispatch.h"

#include <stdlib.h>
#include <string.h>

#include "../core/error.h"

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
    /* a balanced share to start with: this rank's own rows */
    ensure_capacity(x, max_rows > 0 ? max_rows : 1, (size_t)cfg->hidden_size, (size_t)(moe->moe_intermediate_size / etp));
}

void moe_experts_free(MoeExperts *x) {
    void *bufs[] = {x->send_rows, x->recv_rows, x->send_counts, x->recv_counts, x->order, x->offsets, x->recv,
                    x->x, x->gate, x->up, x->act, x->y, x->d_y, x->d_act, x->d_gate, x->d_up, x->d_x};
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

void moe_experts_forward(Model *model, int l, MoeExperts *x, const float *in_rows, const int32_t *offsets,
                         float *out_rows) {
    const BackendOps *ops = model->ops;
    const ModelPriv *pr = model->priv;
    const LayerWeights *w = &pr->weights[l];
    const Comm *g = group_of(model);
    const int C = model->cfg.hidden_size, I = model->cfg.moe.moe_intermediate_size / model->part.etp; /* this rank's slice */
    const int ep = g->size, El = model->cfg.moe.num_experts / ep;
    plan(model, x, offsets);
    long send[MT_MAX_EP], recv[MT_MAX_EP];
    scale_counts(x->send_rows, send, ep, C);
    scale_counts(x->recv_rows, recv, ep, C);
    comm_all_to_all_v(g, in_rows, send, x->recv, recv, COMM_FLOAT);
    permute(x->x, x->recv, x->order, x->rows, C, 1);
    for (int j = 0; j < El; j++) {
        const int r0 = x->offsets[j], n = x->offsets[j + 1] - r0;
        if (n == 0) continue;
        const float *xe = x->x + (size_t)r0 * C;
        ops->matmul_forward(x->gate + (size_t)r0 * I, xe, w->e_gate + (size_t)j * I * C, NULL, n, C, I);
        ops->matmul_forward(x->up + (size_t)r0 * I, xe, w->e_up + (size_t)j * I * C, NULL, n, C, I);
        ops->swiglu_forward(x->act + (size_t)r0 * I, x->gate + (size_t)r0 * I, x->up + (size_t)r0 * I, (long)n * I);
        ops->matmul_forward(x->y + (size_t)r0 * C, x->act + (size_t)r0 * I, w->e_down + (size_t)j * C * I, NULL, n, I, C);
    }
    permute(x->recv, x->y, x->order, x->rows, C, 0);
    comm_all_to_all_v(g, x->recv, recv, out_rows, send, COMM_FLOAT);
}

void moe_experts_backward(Model *model, int l, MoeExperts *x, const float *d_out_rows, float *d_in_rows) {
    const BackendOps *ops = model->ops;
    const ModelPriv *pr = model->priv;
    const LayerWeights *w = &pr->weights[l];
    const LayerWeights *dw = &pr->weight_grads[l];
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
    for (int j = 0; j < El; j++) {
        const int r0 = x->offsets[j], n = x->offsets[j + 1] - r0;
        if (n == 0) continue;
        ops->matmul_backward(x->d_act + (size_t)r0 * I, dw->e_down + (size_t)j * C * I, NULL, x->d_y + (size_t)r0 * C,
                             x->act + (size_t)r0 * I, w->e_down + (size_t)j * C * I, n, I, C);
        ops->swiglu_backward(x->d_gate + (size_t)r0 * I, x->d_up + (size_t)r0 * I, x->d_act + (size_t)r0 * I,
                             x->gate + (size_t)r0 * I, x->up + (size_t)r0 * I, (long)n * I);
        const float *xe = x->x + (size_t)r0 * C;
        ops->matmul_backward(x->d_x + (size_t)r0 * C, dw->e_gate + (size_t)j * I * C, NULL, x->d_gate + (size_t)r0 * I,
                             xe, w->e_gate + (size_t)j * I * C, n, C, I);
        ops->matmul_backward(x->d_x + (size_t)r0 * C, dw->e_up + (size_t)j * I * C, NULL, x->d_up + (size_t)r0 * I, xe,
                             w->e_up + (size_t)j * I * C, n, C, I);
    }
    permute(x->recv, x->d_x, x->order, x->rows, C, 0);
    comm_all_to_all_v(g, x->recv, recv, d_in_rows, send, COMM_FLOAT);
}
