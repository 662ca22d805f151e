/* model_parallel.c: the collectives inside the model for tensor, sequence and
 * context parallel (Megatron's layout), and the vocab-parallel embedding and
 * cross entropy. With tp = cp = 1 every function here is the plain op.
 *
 * Tensor parallel: q/k/v and gate/up are column-parallel (this rank's heads
 * and intermediate rows), o_proj and down_proj row-parallel: their outputs
 * are partial sums over the tp group. Entering the parallel region is
 * identity forward and a sum backward; leaving it a sum forward and identity
 * backward. Under sequence parallel the residual stream holds N/tp rows of
 * each rank, so entering is an all-gather (backward: reduce-scatter) and
 * leaving a reduce-scatter (backward: all-gather). Every sum that replicas
 * keep is bit-identical across the group (comm_sum_identical).
 *
 * Context parallel: each rank holds two chunks of the sequence; keys and
 * values are all-gathered into sequence order for attention, and their
 * gradients reduce-scattered back to the ranks that hold them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../dist/dp_sync.h"
#include "model_parallel.h"

static bool tp_on(const Model *m) { return m->part.tp > 1; }
static bool sp_on(const Model *m) { return ((const ModelPriv *)m->priv)->shape.sp; }

long model_stage_floats(const Model *m, int B, int T) {
    return (long)model_shape_rows(&((const ModelPriv *)m->priv)->shape, B * T) * m->cfg.hidden_size;
}

const float *tp_enter(const Model *m, float *full, const float *x, int N, int C) {
    if (!sp_on(m)) return x;
    comm_all_gather(m->part.tp_comm, x, full, (size_t)(N / m->part.tp) * C, COMM_FLOAT);
    return full;
}

const float *tp_enter_backward(const Model *m, float *d_full, float *shard, int N, int C) {
    if (!tp_on(m)) return d_full;
    if (!sp_on(m)) {
        comm_sum_identical(m->part.tp_comm, d_full, (size_t)N * C, 1.0f);
        return d_full;
    }
    comm_reduce_scatter_sum_float(m->part.tp_comm, d_full, shard, (size_t)(N / m->part.tp) * C);
    return shard;
}

const float *tp_leave(const Model *m, float *partial, float *shard, int N, int C) {
    return tp_enter_backward(m, partial, shard, N, C); /* the same sums, forward */
}

const float *tp_leave_backward(const Model *m, float *d_full, const float *d_out, int N, int C) {
    return tp_enter(m, d_full, d_out, N, C);
}

/* ---------------------------------------------------------------- vocab parallel */

void vocab_embedding_forward(const Model *m, float *out, float *scratch, const int32_t *tokens, int N) {
    const ModelPriv *pr = m->priv;
    const int C = m->cfg.hidden_size;
    if (!tp_on(m)) {
        m->ops->embedding_forward(out, tokens, pr->embed, N, C);
        return;
    }
    /* rows of this rank's vocabulary; zeros elsewhere; summed over tp */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const int v = tokens[n] - pr->shape.vocab_start;
        float *row = scratch + (size_t)n * C;
        if (v >= 0 && v < pr->shape.V) memcpy(row, pr->embed + (size_t)v * C, (size_t)C * sizeof(float));
        else memset(row, 0, (size_t)C * sizeof(float));
    }
    const float *sum = tp_leave(m, scratch, out, N, C);
    if (sum != out) memcpy(out, sum, (size_t)model_shape_rows(&pr->shape, N) * C * sizeof(float));
}

void vocab_embedding_backward(const Model *m, float *d_full, const float *d_out, const int32_t *tokens, int N) {
    const ModelPriv *pr = m->priv;
    const int C = m->cfg.hidden_size;
    if (!tp_on(m)) {
        m->ops->embedding_backward(pr->d_embed, d_out, tokens, N, C);
        return;
    }
    const float *d = tp_leave_backward(m, d_full, d_out, N, C);
    /* rows in token order, channels in parallel: the same sums for any thread count */
#pragma omp parallel for schedule(static)
    for (int c0 = 0; c0 < C; c0 += 64) {
        const int c1 = c0 + 64 < C ? c0 + 64 : C;
        for (int n = 0; n < N; n++) {
            const int v = tokens[n] - pr->shape.vocab_start;
            if (v < 0 || v >= pr->shape.V) continue;
            float *drow = pr->d_embed + (size_t)v * C;
            for (int c = c0; c < c1; c++) drow[c] += d[(size_t)n * C + c];
        }
    }
}

void tp_sum_doubles(const Model *m, double *v, size_t n) {
    const int tp = m->part.tp;
    if (tp <= 1) return;
    double *gathered = mt_malloc(n * (size_t)tp * sizeof(double));
    comm_all_gather(m->part.tp_comm, v, gathered, n, COMM_DOUBLE);
    for (size_t i = 0; i < n; i++) {
        double sum = 0.0;
        for (int r = 0; r < tp; r++) sum += gathered[(size_t)r * n + i];
        v[i] = sum;
    }
    free(gathered);
}

/* The rank-order sum over tp of one double per row, identical on every rank. */
static void tp_sum_rows(const Model *m, double *rows, double *gathered, int N) {
    const int tp = m->part.tp;
    comm_all_gather(m->part.tp_comm, rows, gathered, (size_t)N, COMM_DOUBLE);
    for (int n = 0; n < N; n++) {
        double sum = 0.0;
        for (int r = 0; r < tp; r++) sum += gathered[(size_t)r * N + n];
        rows[n] = sum;
    }
}

double vocab_cross_entropy_forward(const Model *m, float *losses, double *row_lse, const float *logits,
                                   const int32_t *targets, int N) {
    const ModelPriv *pr = m->priv;
    const int V = pr->shape.V;
    if (!tp_on(m)) return m->ops->cross_entropy_forward(losses, logits, targets, N, V);
    const int tp = m->part.tp;
    double *max = mt_malloc((size_t)N * sizeof(double));
    double *sum = mt_malloc((size_t)N * sizeof(double));
    double *target_logit = mt_malloc((size_t)N * sizeof(double));
    double *gathered = mt_malloc((size_t)N * tp * sizeof(double));
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *row = logits + (size_t)n * V;
        double mx = -INFINITY;
        for (int i = 0; i < V; i++)
            if (row[i] > mx) mx = row[i];
        max[n] = mx;
        const int t = targets[n] - pr->shape.vocab_start;
        target_logit[n] = targets[n] >= 0 && t >= 0 && t < V ? (double)row[t] : 0.0;
    }
    /* the global max of each row */
    comm_all_gather(m->part.tp_comm, max, gathered, (size_t)N, COMM_DOUBLE);
    for (int n = 0; n < N; n++)
        for (int r = 0; r < tp; r++)
            if (gathered[(size_t)r * N + n] > max[n]) max[n] = gathered[(size_t)r * N + n];
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *row = logits + (size_t)n * V;
        double s = 0.0;
        for (int i = 0; i < V; i++) s += exp((double)row[i] - max[n]);
        sum[n] = s;
    }
    tp_sum_rows(m, sum, gathered, N);
    tp_sum_rows(m, target_logit, gathered, N);
    double total = 0.0;
    for (int n = 0; n < N; n++) {
        row_lse[n] = max[n] + log(sum[n]);
        const double loss = targets[n] >= 0 ? row_lse[n] - target_logit[n] : 0.0;
        losses[n] = (float)loss;
        if (targets[n] >= 0) total += loss;
    }
    free(max);
    free(sum);
    free(target_logit);
    free(gathered);
    return total;
}

void vocab_cross_entropy_backward(const Model *m, float *dlogits, const double *row_lse, const int32_t *targets,
                                  float dloss, int N) {
    const ModelPriv *pr = m->priv;
    const int V = pr->shape.V;
    if (!tp_on(m)) {
        m->ops->cross_entropy_backward(dlogits, dlogits, targets, dloss, N, V);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *row = dlogits + (size_t)n * V;
        if (targets[n] < 0) {
            memset(row, 0, (size_t)V * sizeof(float));
            continue;
        }
        const int t = targets[n] - pr->shape.vocab_start;
        for (int i = 0; i < V; i++) {
            const double p = exp((double)row[i] - row_lse[n]);
            row[i] = (float)((p - (i == t ? 1.0 : 0.0)) * dloss);
        }
    }
}

/* ---------------------------------------------------------------- context parallel */

void cp_gather_kv(const Model *m, float *all, const float *local, int B, int T, int KVD) {
    const int cp = m->part.cp, Tall = T * cp;
    float *gathered = mt_malloc((size_t)cp * B * T * KVD * sizeof(float));
    int32_t *seq_pos = mt_malloc((size_t)Tall * sizeof(int32_t));
    comm_all_gather(m->part.cp_comm, local, gathered, (size_t)B * T * KVD, COMM_FLOAT);
    model_sequence_positions(&((const ModelPriv *)m->priv)->shape, T, seq_pos);
    for (int r = 0; r < cp; r++) {
        const int32_t *pos = seq_pos + (size_t)r * T;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                memcpy(all + ((size_t)b * Tall + pos[t]) * KVD, gathered + (((size_t)r * B + b) * T + t) * KVD,
                       (size_t)KVD * sizeof(float));
    }
    free(gathered);
    free(seq_pos);
}

void cp_scatter_kv_grad(const Model *m, float *d_local, const float *d_all, int B, int T, int KVD) {
    const int cp = m->part.cp, Tall = T * cp;
    const size_t block = (size_t)B * T * KVD;
    float *send = mt_malloc((size_t)cp * block * sizeof(float));
    float *mine = mt_malloc(block * sizeof(float));
    int32_t *seq_pos = mt_malloc((size_t)Tall * sizeof(int32_t));
    model_sequence_positions(&((const ModelPriv *)m->priv)->shape, T, seq_pos);
    for (int r = 0; r < cp; r++) {
        const int32_t *pos = seq_pos + (size_t)r * T;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                memcpy(send + (((size_t)r * B + b) * T + t) * KVD, d_all + ((size_t)b * Tall + pos[t]) * KVD,
                       (size_t)KVD * sizeof(float));
    }
    comm_reduce_scatter_sum_float(m->part.cp_comm, send, mine, block);
    for (size_t i = 0; i < block; i++) d_local[i] += mine[i];
    free(send);
    free(mine);
    free(seq_pos);
}

double cp_sum(const Model *m, double value) { return dp_sum_double(m->part.cp_comm, value); }
