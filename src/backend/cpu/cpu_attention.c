/* cpu_attention.c: causal grouped-query attention on the CPU.
 *
 * The general form (the _at ops) takes Tq queries at global positions
 * pos[t] = q_pos[t] (any order, each in [0, Tk)) against Tk keys/values at
 * positions 0..Tk-1, for context parallelism: a rank holds some query
 * positions but the keys/values of the whole sequence. Plain causal attention
 * is the case Tq = Tk = T, pos[t] = t (q_pos == NULL), with the same bits.
 * q is (B, Tq, H, D); k and v are (B, Tk, KVH, D); query head h reads kv head
 * h / (H / KVH). probs (B, H, Tq, Tk) holds the softmax rows (zero for the
 * invisible keys u > pos[t]) for the backward.
 *
 *   forward:  s[t,u] = scale * q[t].k[u] (u <= pos[t]), p = softmax_u(s), out[t] = sum_u p[t,u] v[u]
 *   backward: dp[t,u] = dout[t].v[u]
 *             ds[t,u] = p[t,u] * (dp[t,u] - sum_u' p[t,u'] dp[t,u'])
 *             dq[t] += scale * sum_u ds[t,u] k[u]
 *             dk[u] += scale * sum_{h in group} sum_{t: pos[t] >= u} ds[t,u] q[t]
 *             dv[u] += sum_{h in group} sum_{t: pos[t] >= u} p[t,u] dout[t]
 * The backward runs in two passes: one parallel over query rows (dq and the
 * row sums), one parallel over key rows (dk, dv; it recomputes dp rather than
 * keeping a (B,H,Tq,Tk) buffer). Every sum runs in a fixed order that does not
 * depend on the thread count: dot products over D in fp32 with eight fixed
 * partial sums (so the compiler can vectorise them), softmax sums and sums
 * over positions in double, keys in ascending u and queries in ascending t
 * (not ascending pos[t]).
 *
 * Packed rows (the _doc ops): doc_pos[b,p] is position p's place inside its
 * sample of row b (over the Tk key positions), so the sample of the query at
 * pos starts at lo = pos - doc_pos[b,pos] and key u is visible iff
 * lo <= u <= pos: document-masked causal attention from the per-row
 * positions, with no Tq x Tk mask built, with identity query positions or a
 * context-parallel rank's. Keys before lo get probability 0 and are skipped
 * by every loop, so a packed row computes the same sums, in the same order,
 * as its samples one by one. doc_pos NULL: lo = 0.
 */
#include <math.h>
#include <stdlib.h>

#include "cpu_ops.h"
#include "../../core/error.h"

/* sum_i a[i] b[i]: eight interleaved fp32 partial sums combined pairwise,
 * then the tail; the same order on every call. */
static inline float dot_f32(const float *a, const float *b, int n) {
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) lane[j] += a[i + j] * b[i + j];
    float sum = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

/* acc[d] += scale * x[d] (elementwise, so vectorising changes no bits) */
static inline void axpy_f64(double *acc, double scale, const float *x, int n) {
#pragma omp simd
    for (int d = 0; d < n; d++) acc[d] += scale * x[d];
}

/* pos[t]: the global position of query row t (t itself when q_pos == NULL) */
static inline int query_pos(const int32_t *q_pos, int t) { return q_pos ? q_pos[t] : t; }

/* The first key the query at position pos of batch row b sees: the start of its sample (0 unless
 * packed; doc_pos has Tk positions per row). */
static inline int first_key(const int32_t *doc_pos, int b, int Tk, int pos) {
    return doc_pos ? pos - doc_pos[(size_t)b * Tk + pos] : 0;
}

/* Each packed row: positions 0, 1, ... restarting at 0 (a new sample) anywhere. */
static void check_doc_positions(const char *op, const int32_t *doc_pos, int B, int T) {
    if (!doc_pos) return;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int p = doc_pos[(size_t)b * T + t];
            if (p != 0 && (t == 0 || p != doc_pos[(size_t)b * T + t - 1] + 1))
                mt_die(MT_EXIT_FAILURE, "%s: row %d, token %d at sample position %d (expected 0 or %d)", op, b, t, p,
                       t == 0 ? 0 : doc_pos[(size_t)b * T + t - 1] + 1);
        }
}

static void check_positions(const char *op, const int32_t *q_pos, int Tq, int Tk) {
    if (q_pos == NULL) {
        if (Tq != Tk) mt_die(MT_EXIT_FAILURE, "%s: Tq (%d) != Tk (%d) without query positions", op, Tq, Tk);
        return;
    }
    for (int t = 0; t < Tq; t++)
        if (q_pos[t] < 0 || q_pos[t] >= Tk)
            mt_die(MT_EXIT_FAILURE, "%s: query %d at position %d, outside [0, %d)", op, t, (int)q_pos[t], Tk);
}

static void attention_forward(float *out, float *probs, const float *q, const float *k, const float *v,
                              const int32_t *q_pos, const int32_t *doc_pos, int B, int Tq, int Tk, int H, int KVH,
                              int D) {
    int group = H / KVH;
    float scale = (float)(1.0 / sqrt((double)D));
#pragma omp parallel
    {
        double *acc = mt_malloc((size_t)(D > 0 ? D : 1) * sizeof(double));
#pragma omp for collapse(3) schedule(static)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < H; h++) {
                for (int t = 0; t < Tq; t++) {
                    int kvh = h / group;
                    int pos = query_pos(q_pos, t), lo = first_key(doc_pos, b, Tk, pos);
                    const float *qrow = q + (((size_t)b * Tq + t) * H + h) * D;
                    float *prow = probs + (((size_t)b * H + h) * Tq + t) * Tk;
                    /* scores, then the softmax in place in the probs row */
                    float max_score = -INFINITY;
                    for (int u = lo; u <= pos; u++) {
                        const float *krow = k + (((size_t)b * Tk + u) * KVH + kvh) * D;
                        float score = dot_f32(qrow, krow, D) * scale;
                        prow[u] = score;
                        if (score > max_score) max_score = score;
                    }
                    double sum = 0.0;
                    for (int u = lo; u <= pos; u++) {
                        float e = expf(prow[u] - max_score);
                        prow[u] = e;
                        sum += e;
                    }
                    double inv_sum = 1.0 / sum;
                    for (int u = lo; u <= pos; u++) prow[u] = (float)(prow[u] * inv_sum);
                    for (int u = 0; u < lo; u++) prow[u] = 0.0f;
                    for (int u = pos + 1; u < Tk; u++) prow[u] = 0.0f;

                    for (int d = 0; d < D; d++) acc[d] = 0.0;
                    for (int u = lo; u <= pos; u++) {
                        const float *vrow = v + (((size_t)b * Tk + u) * KVH + kvh) * D;
                        axpy_f64(acc, prow[u], vrow, D);
                    }
                    float *orow = out + (((size_t)b * Tq + t) * H + h) * D;
                    for (int d = 0; d < D; d++) orow[d] = (float)acc[d];
                }
            }
        }
        free(acc);
    }
}

static void attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *probs,
                               const float *q, const float *k, const float *v, const int32_t *q_pos,
                               const int32_t *doc_pos, int B, int Tq, int Tk, int H, int KVH, int D) {
    int group = H / KVH;
    double scale = (float)(1.0 / sqrt((double)D));
    /* rowsum[b,h,t] = sum_u p[t,u] dp[t,u], needed by both passes */
    double *rowsum = mt_malloc(((size_t)B * H * Tq > 0 ? (size_t)B * H * Tq : 1) * sizeof(double));

    /* pass 1: one query row at a time -> rowsum and dq */
#pragma omp parallel
    {
        double *dp = mt_malloc((size_t)(Tk > 0 ? Tk : 1) * sizeof(double));
        double *acc = mt_malloc((size_t)(D > 0 ? D : 1) * sizeof(double));
#pragma omp for collapse(3) schedule(static)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < H; h++) {
                for (int t = 0; t < Tq; t++) {
                    int kvh = h / group;
                    int pos = query_pos(q_pos, t), lo = first_key(doc_pos, b, Tk, pos);
                    const float *prow = probs + (((size_t)b * H + h) * Tq + t) * Tk;
                    const float *dorow = dout + (((size_t)b * Tq + t) * H + h) * D;
                    double sum = 0.0;
                    for (int u = lo; u <= pos; u++) {
                        const float *vrow = v + (((size_t)b * Tk + u) * KVH + kvh) * D;
                        dp[u] = dot_f32(dorow, vrow, D);
                        sum += prow[u] * dp[u];
                    }
                    rowsum[((size_t)b * H + h) * Tq + t] = sum;
                    for (int d = 0; d < D; d++) acc[d] = 0.0;
                    for (int u = lo; u <= pos; u++) {
                        const float *krow = k + (((size_t)b * Tk + u) * KVH + kvh) * D;
                        axpy_f64(acc, prow[u] * (dp[u] - sum), krow, D);
                    }
                    float *dqrow = dq + (((size_t)b * Tq + t) * H + h) * D;
                    for (int d = 0; d < D; d++) dqrow[d] += (float)(scale * acc[d]);
                }
            }
        }
        free(dp);
        free(acc);
    }

    /* pass 2: one key row at a time -> dk and dv, summed over the group's query
     * heads and, in ascending t, over the queries that see key u (pos[t] >= u;
     * with identity positions those are t = u..T-1) */
#pragma omp parallel
    {
        double *acc_k = mt_malloc((size_t)(D > 0 ? D : 1) * sizeof(double));
        double *acc_v = mt_malloc((size_t)(D > 0 ? D : 1) * sizeof(double));
#pragma omp for collapse(3) schedule(static)
        for (int b = 0; b < B; b++) {
            for (int kvh = 0; kvh < KVH; kvh++) {
                for (int u = 0; u < Tk; u++) {
                    const float *vrow = v + (((size_t)b * Tk + u) * KVH + kvh) * D;
                    for (int d = 0; d < D; d++) acc_k[d] = acc_v[d] = 0.0;
                    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                        for (int t = q_pos ? 0 : u; t < Tq; t++) {
                            if (q_pos && q_pos[t] < u) continue;
                            if (doc_pos && first_key(doc_pos, b, Tk, query_pos(q_pos, t)) > u) {
                                if (q_pos) continue; /* any order */
                                break;               /* identity positions: later t start later */
                            }
                            double p = probs[(((size_t)b * H + h) * Tq + t) * Tk + u];
                            const float *dorow = dout + (((size_t)b * Tq + t) * H + h) * D;
                            const float *qrow = q + (((size_t)b * Tq + t) * H + h) * D;
                            double ds = p * (dot_f32(dorow, vrow, D) - rowsum[((size_t)b * H + h) * Tq + t]);
                            axpy_f64(acc_v, p, dorow, D);
                            axpy_f64(acc_k, ds, qrow, D);
                        }
                    }
                    float *dkrow = dk + (((size_t)b * Tk + u) * KVH + kvh) * D;
                    float *dvrow = dv + (((size_t)b * Tk + u) * KVH + kvh) * D;
                    for (int d = 0; d < D; d++) {
                        dkrow[d] += (float)(scale * acc_k[d]);
                        dvrow[d] += (float)acc_v[d];
                    }
                }
            }
        }
        free(acc_k);
        free(acc_v);
    }
    free(rowsum);
}

void cpu_attention_forward_at(float *out, float *probs, const float *q, const float *k, const float *v,
                              const int32_t *q_pos, int B, int Tq, int Tk, int H, int KVH, int D) {
    check_positions("attention_forward_at", q_pos, Tq, Tk);
    attention_forward(out, probs, q, k, v, q_pos, NULL, B, Tq, Tk, H, KVH, D);
}

void cpu_attention_backward_at(float *dq, float *dk, float *dv, const float *dout, const float *probs,
                               const float *q, const float *k, const float *v, const int32_t *q_pos, int B, int Tq,
                               int Tk, int H, int KVH, int D) {
    check_positions("attention_backward_at", q_pos, Tq, Tk);
    attention_backward(dq, dk, dv, dout, probs, q, k, v, q_pos, NULL, B, Tq, Tk, H, KVH, D);
}

void cpu_attention_forward_doc(float *out, float *probs, const float *q, const float *k, const float *v,
                               const int32_t *q_pos, const int32_t *doc_pos, int B, int Tq, int Tk, int H, int KVH,
                               int D) {
    check_positions("attention_forward_doc", q_pos, Tq, Tk);
    check_doc_positions("attention_forward_doc", doc_pos, B, Tk);
    attention_forward(out, probs, q, k, v, q_pos, doc_pos, B, Tq, Tk, H, KVH, D);
}

void cpu_attention_backward_doc(float *dq, float *dk, float *dv, const float *dout, const float *probs,
                                const float *q, const float *k, const float *v, const int32_t *q_pos,
                                const int32_t *doc_pos, int B, int Tq, int Tk, int H, int KVH, int D) {
    check_positions("attention_backward_doc", q_pos, Tq, Tk);
    check_doc_positions("attention_backward_doc", doc_pos, B, Tk);
    attention_backward(dq, dk, dv, dout, probs, q, k, v, q_pos, doc_pos, B, Tq, Tk, H, KVH, D);
}

void cpu_attention_forward(float *out, float *probs, const float *q, const float *k, const float *v, int B, int T,
                           int H, int KVH, int D) {
    cpu_attention_forward_at(out, probs, q, k, v, NULL, B, T, T, H, KVH, D);
}

void cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *probs, const float *q,
                            const float *k, const float *v, int B, int T, int H, int KVH, int D) {
    cpu_attention_backward_at(dq, dk, dv, dout, probs, q, k, v, NULL, B, T, T, H, KVH, D);
}
