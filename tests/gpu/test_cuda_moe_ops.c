/* test_cuda_moe_ops.c: the mixture-of-experts kernels (kernels/moe.cu: every
 * cuda_moe_* launcher of backend/cuda/cuda_kernels.h) against the CPU MoE
 * layer, src/model/moe_layer.c, which is the truth. Its steps are static
 * functions there, so each reference below is a plain loop that follows one
 * of them line by line; its comment names the function it mirrors.
 *
 * Each case runs the launchers in the order the CUDA model runs them
 * (src/model/cuda/cuda_model_moe.c): route, sort, capacity and sort again,
 * the balancing statistics, gather, combine, combine backward, scatter,
 * router backward. Every launcher is fed the CPU reference's values of its
 * inputs (uploaded), so a failure points at that launcher alone.
 *   integers (the experts chosen, rows, offsets, tokens, the sort's order,
 *   keep, counts) and copies (gather, the zeroed weights): exact
 *   fp32 element-wise (scores, lse, weights), the sums of the statistics and
 *   the combine weights' dot products: rel_max 1e-5 (test_cuda_ops.c's fp32 limit)
 *   the router backward (fp32 chains over E experts): rel_max 1e-4
 *   bf16 outputs (combine, scatter, the rows' gradients): rel_max 8e-3 (one
 *   rounding to bf16 after fp32 sums, as test_cuda_ops.c)
 * Router logits are drawn well separated (a random permutation of evenly
 * spaced values, jittered by a quarter step), and a token is drawn again
 * while two of its k + 1 best scores (+ expert_bias) are within 1e-4: so the
 * GPU's fp32 top-k is the CPU's, in the same order. Two cases draw exact ties
 * instead (integer logits: equal logits give equal scores on both sides),
 * which both must break toward the lower expert index.
 * Run by `make test-gpu`; needs a GPU. Ends with "N passed, N failed". */
#include <stdbool.h>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_kernels.h"
#include "gpu_test_util.h"
#include "model/moe_layer.h"

#define TOPK_MIN_GAP 1e-4

static int passed, failed;

static void check(const char *what, double err, double limit) {
    if (report(what, err, limit)) passed++;
    else failed++;
}

/* ---- device helpers for integers ---- */

static int32_t *dev_i32(const int32_t *host, long n) {
    return dev_copy(host, (size_t)(n > 0 ? n : 0) * sizeof(int32_t));
}

static int32_t *dev_i32_zero(long n) {
    int32_t *dev;
    CHECK_CUDA(cudaMalloc((void **)&dev, (size_t)(n > 0 ? n : 1) * sizeof *dev));
    CHECK_CUDA(cudaMemset(dev, 0, (size_t)(n > 0 ? n : 1) * sizeof *dev));
    return dev;
}

static int32_t *host_i32(const int32_t *dev, long n) {
    int32_t *out = malloc((size_t)(n > 0 ? n : 1) * sizeof *out);
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(out, dev, (size_t)n * sizeof *out, cudaMemcpyDeviceToHost));
    return out;
}

static uint8_t *host_u8(const uint8_t *dev, long n) {
    uint8_t *out = malloc((size_t)(n > 0 ? n : 1));
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(out, dev, (size_t)n, cudaMemcpyDeviceToHost));
    return out;
}

/* How many of n integers differ. */
static double mismatches(const int32_t *got, const int32_t *want, long n) {
    long d = 0;
    for (long i = 0; i < n; i++) d += got[i] != want[i];
    return (double)d;
}

static double mismatches_u8(const uint8_t *got, const uint8_t *want, long n) {
    long d = 0;
    for (long i = 0; i < n; i++) d += (got[i] != 0) != (want[i] != 0);
    return (double)d;
}

static float *to_float(const double *v, long n) {
    float *out = malloc((size_t)(n > 0 ? n : 1) * sizeof *out);
    for (long i = 0; i < n; i++) out[i] = (float)v[i];
    return out;
}

/* ---- the CPU reference: src/model/moe_layer.c, step by step ---- */

/* moe_layer.c router_scores: softmax (in double) or sigmoid of each row of logits. */
static void ref_router_scores(const float *logits, float *scores, int N, int E, int sigmoid) {
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * E;
        float *s = scores + (size_t)n * E;
        if (sigmoid) {
            for (int e = 0; e < E; e++) s[e] = (float)(1.0 / (1.0 + exp(-(double)l[e])));
            continue;
        }
        double mx = -INFINITY, sum = 0.0;
        for (int e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
        for (int e = 0; e < E; e++) sum += exp((double)l[e] - mx);
        for (int e = 0; e < E; e++) s[e] = (float)(exp((double)l[e] - mx) / sum);
    }
}

/* moe_layer.c route: the k best experts by score (+ bias), ties to the lower index (the CPU model's moe_top_k);
 * raw scores and weights. */
static void ref_route(const float *scores, const float *bias, int N, int E, int k, int renorm, int32_t *selected,
                      float *raw, float *weight) {
    for (int n = 0; n < N; n++) {
        const float *s = scores + (size_t)n * E;
        int32_t *sel = selected + (size_t)n * k;
        moe_top_k(s, bias, E, k, sel);
        double sum = 0.0;
        for (int j = 0; j < k; j++) {
            raw[(size_t)n * k + j] = s[sel[j]];
            sum += s[sel[j]];
        }
        for (int j = 0; j < k; j++)
            weight[(size_t)n * k + j] = renorm ? (float)(raw[(size_t)n * k + j] / sum) : raw[(size_t)n * k + j];
    }
}

/* moe_layer.c row_logsumexp (the z-loss's lse). */
static double ref_logsumexp(const float *l, int E) {
    double mx = -INFINITY, sum = 0.0;
    for (int e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
    for (int e = 0; e < E; e++) sum += exp((double)l[e] - mx);
    return mx + log(sum);
}

/* moe_layer.c prob's row sum: the sum of a token's scores (the sigmoid scores' normaliser). */
static double ref_score_sum(const float *s, int E) {
    double sum = 0.0;
    for (int i = 0; i < E; i++) sum += s[i];
    return sum;
}

/* moe_layer.c prob: p[n, e], the scores as probabilities (sigmoid scores normalised per token). */
static double ref_prob(const float *s, int E, int e, int sigmoid) { return sigmoid ? s[e] / ref_score_sum(s, E) : s[e]; }

/* moe_layer.c group: counts (before dropping), the capacity drops (lowest raw scores first, ties kept in
 * assignment order; weight 0, position -1), and the rows expert by expert, tokens ascending. Also what the GPU's
 * sort and capacity give besides: row_slot (each row's assignment) and keep. Returns the assignments dropped. */
static long ref_group(const int32_t *selected, const float *raw, float *weight, int N, int E, int k,
                      double capacity_factor, double *counts, int32_t *position, int32_t *token, int32_t *row_slot,
                      int32_t *offsets, uint8_t *keep) {
    memset(counts, 0, (size_t)E * sizeof(double));
    for (long i = 0; i < (long)N * k; i++) counts[selected[i]] += 1.0;
    long capacity = (long)N * k;
    if (capacity_factor > 0) capacity = (long)ceil(capacity_factor * (double)N * k / E);
    long dropped = 0;
    int row = 0;
    for (int e = 0; e < E; e++) {
        offsets[e] = row;
        long have = (long)counts[e];
        double threshold = -INFINITY; /* keep scores above it, and ties by token order */
        long ties_kept = capacity;
        if (have > capacity) { /* the capacity-th highest raw score of this expert */
            float *vals = malloc((size_t)have * sizeof(float));
            long c = 0;
            for (long i = 0; i < (long)N * k; i++)
                if (selected[i] == e) vals[c++] = raw[i];
            for (long i = 0; i < capacity; i++) { /* partial selection sort */
                long best = i;
                for (long j = i + 1; j < have; j++)
                    if (vals[j] > vals[best]) best = j;
                float t = vals[i];
                vals[i] = vals[best];
                vals[best] = t;
            }
            threshold = capacity > 0 ? vals[capacity - 1] : INFINITY;
            ties_kept = 0;
            for (long i = 0; i < capacity; i++) ties_kept += vals[i] == threshold;
            free(vals);
        }
        for (int n = 0; n < N; n++)
            for (int j = 0; j < k; j++) {
                const long i = (long)n * k + j;
                if (selected[i] != e) continue;
                bool kept = have <= capacity || raw[i] > threshold || (raw[i] == threshold && ties_kept-- > 0);
                keep[i] = kept;
                if (!kept) {
                    position[i] = -1;
                    weight[i] = 0.0f;
                    dropped++;
                    continue;
                }
                position[i] = row;
                row_slot[row] = (int32_t)i;
                token[row++] = n;
            }
    }
    offsets[E] = row;
    return dropped;
}

/* moe_layer.c balance_loss (cp 1): the assignments per expert of each group of span tokens (one group: aux_loss,
 * a sequence each: seq_aux_loss) and the sums of p over the group's tokens, both before dropping. */
static void ref_balance_stats(const int32_t *selected, const float *scores, int N, int E, int k, int span,
                              int sigmoid, double *counts, double *psum) {
    const int groups = N / span;
    memset(counts, 0, (size_t)groups * E * sizeof(double));
    memset(psum, 0, (size_t)groups * E * sizeof(double));
    for (int n = 0; n < N; n++)
        for (int j = 0; j < k; j++) counts[(size_t)(n / span) * E + selected[(size_t)n * k + j]] += 1.0;
    for (int n = 0; n < N; n++)
        for (int e = 0; e < E; e++) psum[(size_t)(n / span) * E + e] += ref_prob(scores + (size_t)n * E, E, e, sigmoid);
}

/* moe_layer.c balance_loss's loss, token by token as it sums it: aux_loss (span N: coeff E / (k N^2) sum_n sum_e
 * p[n,e] counts[e]) or seq_aux_loss (span T: per sequence with T, averaged over the B sequences); *scale its
 * aux_scale. */
static double ref_aux_loss(const float *scores, const double *counts, int N, int E, int k, int span, int sigmoid,
                           double coeff, double *scale) {
    if (span == N) {
        double sum = 0.0;
        for (int n = 0; n < N; n++)
            for (int e = 0; e < E; e++) sum += ref_prob(scores + (size_t)n * E, E, e, sigmoid) * counts[e];
        *scale = coeff * E / ((double)k * N * N);
        return *scale * sum;
    }
    const int B = N / span, T = span;
    double total = 0.0;
    double *psum = malloc((size_t)E * sizeof(double));
    for (int b = 0; b < B; b++) {
        memset(psum, 0, (size_t)E * sizeof(double));
        for (int t = 0; t < T; t++)
            for (int e = 0; e < E; e++) psum[e] += ref_prob(scores + (size_t)(b * T + t) * E, E, e, sigmoid);
        double sum = 0.0;
        for (int e = 0; e < E; e++) sum += psum[e] * counts[(size_t)b * E + e];
        total += coeff * E / ((double)k * T * T) * sum;
    }
    free(psum);
    *scale = coeff * E / ((double)k * T * T * B);
    return total / B;
}

/* moe_layer.c moe_backward, the router's part: d_scores from the combine weights' gradients through the
 * renormalisation, plus the load-balancing loss (aux_scale != 0: counts per group of aux_span tokens), then
 * scores -> logits, plus the z-loss (z_coeff > 0). */
static void ref_router_backward(float *d_logits, const double *d_w, const float *logits, const float *scores,
                                const int32_t *selected, const float *raw, const float *weight,
                                const double *aux_counts, int aux_span, double aux_scale, double z_coeff,
                                double z_scale, float loss_scale, int N, int E, int k, int sigmoid, int renorm) {
    float *d_scores = calloc((size_t)N * E, sizeof(float));
    for (int n = 0; n < N; n++) { /* through the renormalisation to the selected scores */
        const double *dw = d_w + (size_t)n * k;
        double S = 0.0, sum_dw_w = 0.0;
        for (int j = 0; j < k; j++) {
            S += raw[(size_t)n * k + j];
            sum_dw_w += dw[j] * weight[(size_t)n * k + j];
        }
        for (int j = 0; j < k; j++) {
            const double d_raw = renorm ? (dw[j] - sum_dw_w) / S : dw[j];
            d_scores[(size_t)n * E + selected[(size_t)n * k + j]] += (float)d_raw;
        }
    }
    double *dp_row = malloc((size_t)E * sizeof(double));
    for (int n = 0; n < N; n++) {
        float *ds = d_scores + (size_t)n * E;
        const float *s = scores + (size_t)n * E;
        for (int e = 0; e < E; e++) dp_row[e] = 0.0;
        if (aux_scale != 0.0) {
            const double *cnt = aux_counts + (size_t)(n / aux_span) * E;
            for (int e = 0; e < E; e++) dp_row[e] = loss_scale * aux_scale * cnt[e];
        }
        if (sigmoid) { /* p = s / sum(s): back to s */
            double S = 0.0, dot = 0.0;
            for (int e = 0; e < E; e++) S += s[e];
            for (int e = 0; e < E; e++) dot += dp_row[e] * s[e] / S;
            for (int e = 0; e < E; e++) ds[e] += (float)((dp_row[e] - dot) / S);
        } else {
            for (int e = 0; e < E; e++) ds[e] += (float)dp_row[e];
        }
        float *dl = d_logits + (size_t)n * E; /* scores -> logits */
        if (sigmoid) {
            for (int e = 0; e < E; e++) dl[e] = (float)((double)ds[e] * s[e] * (1.0 - s[e]));
        } else {
            double dot = 0.0;
            for (int e = 0; e < E; e++) dot += (double)ds[e] * s[e];
            for (int e = 0; e < E; e++) dl[e] = (float)((double)s[e] * ((double)ds[e] - dot));
        }
        if (z_coeff > 0) { /* d (coeff/N sum lse^2) = coeff * 2 lse / N * softmax */
            const float *lg = logits + (size_t)n * E;
            const double lse = ref_logsumexp(lg, E);
            for (int e = 0; e < E; e++) dl[e] += (float)(loss_scale * z_scale * 2.0 * lse * exp((double)lg[e] - lse));
        }
    }
    free(dp_row);
    free(d_scores);
}

/* moe_layer.c moe_forward's combine (out starts as the shared expert's output, or 0), plus the residual the model
 * adds after it: out[n] = resid[n] + shared[n] + sum_j weight[n,j] * y[position[n,j]]. */
static void ref_combine(float *out, const float *resid, const float *shared, const float *y, const int32_t *position,
                        const float *weight, int N, int k, int C) {
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        for (int i = 0; i < C; i++) o[i] = shared ? shared[(size_t)n * C + i] : 0.0f;
        for (int j = 0; j < k; j++) {
            const int32_t r = position[(size_t)n * k + j];
            if (r < 0) continue;
            const float wt = weight[(size_t)n * k + j];
            const float *yr = y + (size_t)r * C;
            for (int i = 0; i < C; i++) o[i] += wt * yr[i];
        }
        for (int i = 0; i < C && resid; i++) o[i] += resid[(size_t)n * C + i];
    }
}

/* moe_layer.c moe_backward's combine: d_w (the outputs' dot products, 0 when dropped) and the rows' gradients. */
static void ref_combine_backward(float *d_rows, double *d_w, const float *d_out, const float *y,
                                 const int32_t *position, const float *weight, int N, int k, int C) {
    for (int n = 0; n < N; n++) {
        const float *g = d_out + (size_t)n * C;
        for (int j = 0; j < k; j++) {
            const int32_t r = position[(size_t)n * k + j];
            d_w[(size_t)n * k + j] = 0.0;
            if (r < 0) continue;
            const float wt = weight[(size_t)n * k + j];
            const float *yr = y + (size_t)r * C;
            float *dr = d_rows + (size_t)r * C;
            double dot = 0.0;
            for (int i = 0; i < C; i++) {
                dot += (double)g[i] * yr[i];
                dr[i] = wt * g[i];
            }
            d_w[(size_t)n * k + j] = dot;
        }
    }
}

/* moe_layer.c moe_backward's scatter (dx += the rows' input gradients, token by token, slot by slot), plus the
 * router's input gradient, which its matmul_backward adds to the same d_x. */
static void ref_scatter(float *dx, const float *d_xin, const int32_t *position, const float *router_dx, int N, int k,
                        int C) {
    for (int n = 0; n < N; n++) {
        float *dxn = dx + (size_t)n * C;
        for (int j = 0; j < k; j++) {
            const int32_t r = position[(size_t)n * k + j];
            if (r < 0) continue;
            const float *dr = d_xin + (size_t)r * C;
            for (int i = 0; i < C; i++) dxn[i] += dr[i];
        }
        if (router_dx)
            for (int i = 0; i < C; i++) dxn[i] += router_dx[(size_t)n * C + i];
    }
}

/* ---- inputs ---- */

/* The smallest gap between consecutive values among a token's k + 1 best scores + bias (double, as route). */
static double topk_gap(const float *s, const float *bias, int E, int k) {
    double top[65];
    const int m = k + 1 < E ? k + 1 : E;
    for (int j = 0; j < m; j++) top[j] = -INFINITY;
    for (int e = 0; e < E; e++) {
        double v = (double)s[e] + (bias ? (double)bias[e] : 0.0);
        for (int j = 0; j < m; j++)
            if (v > top[j]) {
                const double t = top[j];
                top[j] = v;
                v = t;
            }
    }
    double gap = INFINITY;
    for (int j = 0; j + 1 < m; j++) gap = fmin(gap, top[j] - top[j + 1]);
    return gap;
}

/* One token's logits: a random permutation of E evenly spaced values over [-spread/2, spread/2], each moved by up
 * to a quarter step; the highest goes to expert hot (>= 0), the lowest to the last `cold` experts. */
static void draw_logits_row(Rng *rng, float *l, int E, double spread, int hot, int cold) {
    int64_t *rank = malloc((size_t)E * sizeof *rank);
    int64_t *rest = malloc((size_t)E * sizeof *rest);
    int n_rest = 0;
    for (int r = cold; r < E - (hot >= 0 ? 1 : 0); r++) rest[n_rest++] = r; /* the ranks left for the others */
    rng_shuffle_i64(rng, rest, n_rest);
    int64_t *low = malloc((size_t)(cold > 0 ? cold : 1) * sizeof *low);
    for (int r = 0; r < cold; r++) low[r] = r;
    rng_shuffle_i64(rng, low, cold);
    int next = 0;
    for (int e = 0; e < E; e++) {
        if (e == hot) rank[e] = E - 1;
        else if (e >= E - cold) rank[e] = low[e - (E - cold)];
        else rank[e] = rest[next++];
    }
    const double step = spread / (E - 1);
    for (int e = 0; e < E; e++) l[e] = (float)(step * ((double)rank[e] + 0.5 * (rng_uniform(rng) - 0.5)) - spread / 2);
    free(rank);
    free(rest);
    free(low);
}

/* ---- one case: the launchers in the CUDA model's order ---- */

typedef struct MoeOpsCase {
    const char *name;
    int N, E, k, C;
    int sigmoid, renorm;
    double spread;          /* range of the router logits */
    int ties;               /* logits from {-2, -1, 0, 1}: exact ties, which go to the lower index */
    int hot;                /* an expert on top of every token's logits (-1: none) */
    int cold;               /* the last `cold` experts at the bottom of every token's logits */
    double bias_std;        /* expert_bias normal(0, bias_std) (0: none) */
    int bias_forced;        /* expert_bias 10 + j on experts 1, 3, 5, ... (k of them): they win every token */
    double capacity_factor; /* 0: dropless */
    int seq_T;              /* seq_aux_loss over sequences of seq_T tokens; 0: aux_loss over the N tokens */
    double aux_coeff, z_coeff;
    int shared;             /* the combine adds a shared expert's output */
} MoeOpsCase;

static void run_case(Rng *rng, const MoeOpsCase *c) {
    const int N = c->N, E = c->E, k = c->k, C = c->C, A = N * k;
    const int span = c->seq_T > 0 ? c->seq_T : N, groups = N / span;
    printf("%s: N=%d E=%d top-%d C=%d %s%s%s%s%s\n", c->name, N, E, k, C, c->sigmoid ? "sigmoid" : "softmax",
           c->renorm ? " renorm" : "", c->bias_std > 0 || c->bias_forced ? " expert_bias" : "",
           c->capacity_factor > 0 ? " capacity" : "", c->z_coeff > 0 ? " z-loss" : "");
    if (N % span != 0 || k + 1 > E || k > 64 || c->hot >= E - c->cold || (c->bias_forced && 2 * k > E) ||
        (c->ties && (c->bias_std > 0 || c->bias_forced || c->hot >= 0 || c->cold > 0))) {
        printf("  bad case\n");
        failed++;
        return;
    }

    /* ---- route ---- */
    float *bias = NULL;
    if (c->bias_std > 0 || c->bias_forced) {
        bias = calloc((size_t)E, sizeof(float));
        for (int e = 0; e < E; e++) bias[e] = (float)(c->bias_std * rng_normal(rng));
        if (c->bias_forced)
            for (int j = 0; j < k; j++) bias[2 * j + 1] = (float)(10 + j);
    }
    float *logits = malloc((size_t)N * E * sizeof(float)), *scores = malloc((size_t)N * E * sizeof(float));
    long redrawn = 0;
    for (int n = 0; n < N; n++) { /* drawn again while the choice is near a tie */
        float *l = logits + (size_t)n * E, *s = scores + (size_t)n * E;
        for (int tries = 0;; tries++) {
            if (c->ties)
                for (int e = 0; e < E; e++) l[e] = (float)rng_below(rng, 4) - 2.0f;
            else
                draw_logits_row(rng, l, E, c->spread, c->hot, c->cold);
            ref_router_scores(l, s, 1, E, c->sigmoid);
            if (c->ties || topk_gap(s, bias, E, k) >= TOPK_MIN_GAP) break;
            if (tries == 1000) {
                printf("  no token without a near-tie in 1000 draws\n");
                failed++;
                free(logits); free(scores); free(bias);
                return;
            }
            redrawn++;
        }
    }
    int32_t *selected = malloc((size_t)A * sizeof(int32_t));
    float *raw = malloc((size_t)A * sizeof(float)), *weight = malloc((size_t)A * sizeof(float));
    float *lse = malloc((size_t)N * sizeof(float)), *score_sum = malloc((size_t)N * sizeof(float));
    ref_route(scores, bias, N, E, k, c->renorm, selected, raw, weight);
    for (int n = 0; n < N; n++) {
        lse[n] = (float)ref_logsumexp(logits + (size_t)n * E, E);
        score_sum[n] = (float)ref_score_sum(scores + (size_t)n * E, E);
    }
    { /* the case is what it says */
        long hot_missing = 0, cold_chosen = 0, biased = 0;
        for (int n = 0; n < N; n++) {
            bool has_hot = false;
            for (int j = 0; j < k; j++) {
                const int e = selected[(size_t)n * k + j];
                has_hot = has_hot || e == c->hot;
                cold_chosen += e >= E - c->cold;
            }
            hot_missing += c->hot >= 0 && !has_hot;
        }
        if (bias) { /* the tokens whose choice the bias changed */
            int32_t *sel0 = malloc((size_t)A * sizeof(int32_t));
            float *raw0 = malloc((size_t)A * sizeof(float)), *w0 = malloc((size_t)A * sizeof(float));
            ref_route(scores, NULL, N, E, k, c->renorm, sel0, raw0, w0);
            for (int n = 0; n < N; n++)
                biased += memcmp(sel0 + (size_t)n * k, selected + (size_t)n * k, (size_t)k * sizeof(int32_t)) != 0;
            free(sel0); free(raw0); free(w0);
        }
        printf("  %ld tokens drawn again (near-ties)%s", redrawn, c->hot >= 0 ? "; " : "\n");
        if (c->hot >= 0) printf("expert %d in every token's choice: %ld tokens without it\n", c->hot, hot_missing);
        if (c->hot >= 0) check("case: tokens without the hot expert", (double)hot_missing, 0.0);
        if (c->cold > 0) check("case: assignments to the cold experts", (double)cold_chosen, 0.0);
        if (bias) {
            printf("  expert_bias changes the choice of %ld of %d tokens\n", biased, N);
            check("case: no token's choice changed by the bias", biased > 0 ? 0.0 : 1.0, 0.0);
        }
    }
    float *d_logits_in = dev_f32(logits, (long)N * E), *d_bias = bias ? dev_f32(bias, E) : NULL;
    float *d_scores = dev_f32(NULL, (long)N * E), *d_lse = dev_f32(NULL, N), *d_ssum = dev_f32(NULL, N);
    float *d_raw = dev_f32(NULL, A), *d_weight = dev_f32(NULL, A);
    int32_t *d_selected = dev_i32_zero(A);
    CHECK_CUDA(cuda_moe_route(d_logits_in, d_bias, d_scores, d_lse, d_ssum, d_selected, d_raw, d_weight, N, E, k,
                              c->sigmoid, c->renorm, 0));
    {
        int32_t *g_sel = host_i32(d_selected, A);
        float *g_scores = host_from_f32(d_scores, (long)N * E), *g_lse = host_from_f32(d_lse, N);
        float *g_ssum = host_from_f32(d_ssum, N), *g_raw = host_from_f32(d_raw, A);
        float *g_weight = host_from_f32(d_weight, A);
        check("route: experts chosen, in order (exact)", mismatches(g_sel, selected, A), 0.0);
        check("route: scores", rel_max(g_scores, scores, (long)N * E), 1e-5);
        check("route: lse", rel_max(g_lse, lse, N), 1e-5);
        check("route: score sums", rel_max(g_ssum, score_sum, N), 1e-5);
        check("route: raw scores (no bias)", rel_max(g_raw, raw, A), 1e-5);
        check("route: combine weights", rel_max(g_weight, weight, A), 1e-5);
        free(g_sel); free(g_scores); free(g_lse); free(g_ssum); free(g_raw); free(g_weight);
    }

    /* ---- sort (every assignment), then capacity and sort again ---- */
    const int tiles = (A + MT_MOE_TILE - 1) / MT_MOE_TILE;
    double *counts = malloc((size_t)E * sizeof(double));
    int32_t *position = malloc((size_t)A * sizeof(int32_t)), *token = malloc((size_t)A * sizeof(int32_t));
    int32_t *row_slot = malloc((size_t)A * sizeof(int32_t)), *offsets = malloc(((size_t)E + 1) * sizeof(int32_t));
    uint8_t *keep = malloc((size_t)A);
    float *weight_all = malloc((size_t)A * sizeof(float)); /* the route's weights, before the drops */
    memcpy(weight_all, weight, (size_t)A * sizeof(float));
    ref_group(selected, raw, weight_all, N, E, k, 0.0, counts, position, token, row_slot, offsets, keep);
    int32_t *d_sel_ref = dev_i32(selected, A), *d_tile_hist = dev_i32_zero((long)tiles * E);
    int32_t *d_offsets = dev_i32_zero(E + 1), *d_position = dev_i32_zero(A), *d_token = dev_i32_zero(A);
    int32_t *d_row_slot = dev_i32_zero(A);
    CHECK_CUDA(cuda_moe_sort(d_sel_ref, NULL, d_tile_hist, d_offsets, d_position, d_token, d_row_slot, A, k, E, 0));
    {
        int32_t *g_off = host_i32(d_offsets, E + 1), *g_pos = host_i32(d_position, A);
        int32_t *g_tok = host_i32(d_token, A), *g_slot = host_i32(d_row_slot, A);
        long unstable = 0, empty = 0, full = 0;
        for (int e = 0; e < E; e++) {
            for (int r = g_off[e] + 1; r < g_off[e + 1] && r < A; r++) unstable += g_slot[r] <= g_slot[r - 1];
            empty += g_off[e + 1] == g_off[e];
            full += g_off[e + 1] - g_off[e] == N;
        }
        printf("  %d tiles; %ld experts without tokens, %ld with every token\n", tiles, empty, full);
        check("sort: offsets (exact)", mismatches(g_off, offsets, E + 1), 0.0);
        check("sort: positions (exact)", mismatches(g_pos, position, A), 0.0);
        check("sort: rows' tokens (exact)", mismatches(g_tok, token, A), 0.0);
        check("sort: rows' assignments (exact)", mismatches(g_slot, row_slot, A), 0.0);
        check("sort: rows of an expert out of assignment order", (double)unstable, 0.0);
        free(g_off); free(g_pos); free(g_tok); free(g_slot);
    }
    uint8_t *d_keep = NULL;
    long dropped = 0;
    if (c->capacity_factor > 0) {
        const long capacity = (long)ceil(c->capacity_factor * (double)N * k / E);
        memcpy(weight_all, weight, (size_t)A * sizeof(float));
        dropped = ref_group(selected, raw, weight, N, E, k, c->capacity_factor, counts, position, token, row_slot,
                            offsets, keep);
        float *d_raw_ref = dev_f32(raw, A), *d_w_cap = dev_f32(weight_all, A);
        CHECK_CUDA(cudaMalloc((void **)&d_keep, (size_t)A));
        CHECK_CUDA(cudaMemset(d_keep, 0xff, (size_t)A));
        /* row_slot and offsets of the sort above (checked equal to the CPU's) */
        CHECK_CUDA(cuda_moe_capacity(d_raw_ref, d_row_slot, d_offsets, d_keep, d_w_cap, E, capacity, 0));
        uint8_t *g_keep = host_u8(d_keep, A);
        float *g_w = host_from_f32(d_w_cap, A);
        printf("  capacity %ld: %ld of %d assignments dropped\n", capacity, dropped, A);
        check("case: no assignment dropped", dropped > 0 ? 0.0 : 1.0, 0.0);
        check("capacity: keep (exact)", mismatches_u8(g_keep, keep, A), 0.0);
        check("capacity: weights, dropped ones 0 (exact)", rel_max(g_w, weight, A), 0.0);
        CHECK_CUDA(cuda_moe_sort(d_sel_ref, d_keep, d_tile_hist, d_offsets, d_position, d_token, d_row_slot, A, k, E,
                                 0));
        int32_t *g_off = host_i32(d_offsets, E + 1), *g_pos = host_i32(d_position, A);
        const int R = offsets[E];
        int32_t *g_tok = host_i32(d_token, R), *g_slot = host_i32(d_row_slot, R);
        check("sort after capacity: offsets (exact)", mismatches(g_off, offsets, E + 1), 0.0);
        check("sort after capacity: positions, -1 dropped (exact)", mismatches(g_pos, position, A), 0.0);
        check("sort after capacity: rows' tokens (exact)", mismatches(g_tok, token, R), 0.0);
        check("sort after capacity: rows' assignments (exact)", mismatches(g_slot, row_slot, R), 0.0);
        free(g_keep); free(g_w); free(g_off); free(g_pos); free(g_tok); free(g_slot);
        cudaFree(d_raw_ref); cudaFree(d_w_cap);
    }
    const int R = offsets[E];

    /* ---- the load-balancing statistics, and the losses the host makes of them ---- */
    {
        double *ref_counts = malloc((size_t)groups * E * sizeof(double)), *ref_psum = malloc((size_t)groups * E * sizeof(double));
        ref_balance_stats(selected, scores, N, E, k, span, c->sigmoid, ref_counts, ref_psum);
        float *d_scores_ref = dev_f32(scores, (long)N * E), *d_ssum_ref = dev_f32(score_sum, N);
        int32_t *d_counts = dev_i32_zero((long)groups * E);
        double *d_psum;
        CHECK_CUDA(cudaMalloc((void **)&d_psum, (size_t)groups * E * sizeof(double)));
        CHECK_CUDA(cuda_moe_balance_stats(d_counts, d_psum, d_sel_ref, d_scores_ref, d_ssum_ref, N, E, k, span, 1,
                                          c->sigmoid, 0));
        int32_t *g_counts = host_i32(d_counts, (long)groups * E);
        double *g_psum = malloc((size_t)groups * E * sizeof(double));
        CHECK_CUDA(cudaMemcpy(g_psum, d_psum, (size_t)groups * E * sizeof(double), cudaMemcpyDeviceToHost));
        long count_err = 0;
        for (long i = 0; i < (long)groups * E; i++) count_err += g_counts[i] != (int32_t)ref_counts[i];
        float *gf = to_float(g_psum, (long)groups * E), *rf = to_float(ref_psum, (long)groups * E);
        printf("  statistics over %d group(s) of %d tokens\n", groups, span);
        check("balance stats: counts per group and expert (exact)", (double)count_err, 0.0);
        check("balance stats: probability sums", rel_max(gf, rf, (long)groups * E), 1e-5);
        /* the losses: moe_layer.c's token by token, and cuda_model_moe.c balance()'s from the GPU's statistics */
        double scale;
        const double aux_cpu = ref_aux_loss(scores, ref_counts, N, E, k, span, c->sigmoid, c->aux_coeff, &scale);
        double aux_gpu = 0.0;
        for (int g = 0; g < groups; g++) {
            double sum = 0.0;
            for (int e = 0; e < E; e++) sum += g_psum[(size_t)g * E + e] * (float)g_counts[(size_t)g * E + e];
            aux_gpu += c->seq_T > 0 ? c->aux_coeff * E / ((double)k * span * span) * sum / groups
                                    : c->aux_coeff * E / ((double)k * N * N) * sum;
        }
        double z_cpu = 0.0, z_gpu = 0.0;
        float *g_lse = host_from_f32(d_lse, N);
        for (int n = 0; n < N; n++) {
            const double l = ref_logsumexp(logits + (size_t)n * E, E);
            z_cpu += l * l;
            z_gpu += (double)g_lse[n] * g_lse[n];
        }
        z_cpu *= c->z_coeff / N;
        z_gpu *= c->z_coeff / N;
        printf("  %s %.6e (cpu) %.6e (from the gpu's statistics); z-loss %.6e %.6e\n",
               c->seq_T > 0 ? "seq_aux_loss" : "aux_loss", aux_cpu, aux_gpu, z_cpu, z_gpu);
        check("aux loss from the statistics", aux_cpu != 0.0 ? fabs(aux_gpu - aux_cpu) / fabs(aux_cpu) : fabs(aux_gpu),
              1e-5);
        if (c->z_coeff > 0) check("z-loss from the route's lse", fabs(z_gpu - z_cpu) / fabs(z_cpu), 1e-5);
        free(ref_counts); free(ref_psum); free(g_counts); free(g_psum); free(gf); free(rf); free(g_lse);
        cudaFree(d_scores_ref); cudaFree(d_ssum_ref); cudaFree(d_counts); cudaFree(d_psum);
    }

    /* ---- gather, combine ---- */
    float *x = rand_bf16_values(rng, (long)N * C, 1.0), *y = rand_bf16_values(rng, (long)R * C, 1.0);
    float *resid = rand_bf16_values(rng, (long)N * C, 1.0), *shared = rand_bf16_values(rng, (long)N * C, 1.0);
    uint16_t *d_x = dev_bf16(x, (long)N * C), *d_rows;
    CHECK_CUDA(cudaMalloc((void **)&d_rows, (size_t)(R > 0 ? R : 1) * C * sizeof(uint16_t)));
    int32_t *d_token_ref = dev_i32(token, R), *d_pos_ref = dev_i32(position, A);
    float *d_weight_ref = dev_f32(weight, A);
    CHECK_CUDA(cuda_moe_gather(d_rows, d_x, d_token_ref, R, C, 0));
    {
        float *g_rows = host_from_bf16(d_rows, (long)R * C), *want = malloc((size_t)(R > 0 ? R : 1) * C * sizeof(float));
        for (int r = 0; r < R; r++) memcpy(want + (size_t)r * C, x + (size_t)token[r] * C, (size_t)C * sizeof(float));
        check("gather: rows = x[token] (exact)", rel_max(g_rows, want, (long)R * C), 0.0);
        free(g_rows); free(want);
    }
    {
        float *out = malloc((size_t)N * C * sizeof(float));
        ref_combine(out, resid, c->shared ? shared : NULL, y, position, weight, N, k, C);
        uint16_t *d_resid = dev_bf16(resid, (long)N * C), *d_shared = dev_bf16(shared, (long)N * C);
        uint16_t *d_y = dev_bf16(y, (long)R * C), *d_out = dev_bf16(x, (long)N * C);
        CHECK_CUDA(cuda_moe_combine(d_out, d_resid, c->shared ? d_shared : NULL, d_y, d_pos_ref, d_weight_ref, N, k,
                                    C, 0));
        float *g_out = host_from_bf16(d_out, (long)N * C);
        check(c->shared ? "combine (+ residual + shared expert)" : "combine (+ residual)",
              rel_max(g_out, out, (long)N * C), 8e-3);
        /* under tensor parallel the residual is added after the tp sum: no residual here */
        ref_combine(out, NULL, c->shared ? shared : NULL, y, position, weight, N, k, C);
        CHECK_CUDA(cuda_moe_combine(d_out, NULL, c->shared ? d_shared : NULL, d_y, d_pos_ref, d_weight_ref, N, k, C,
                                    0));
        free(g_out);
        g_out = host_from_bf16(d_out, (long)N * C);
        check("combine without a residual (tensor parallel)", rel_max(g_out, out, (long)N * C), 8e-3);
        free(out); free(g_out);
        cudaFree(d_resid); cudaFree(d_shared); cudaFree(d_y); cudaFree(d_out);
    }

    /* ---- combine backward, scatter ---- */
    {
        float *dy = rand_bf16_values(rng, (long)N * C, 1.0);
        float *d_rows_ref = malloc((size_t)(R > 0 ? R : 1) * C * sizeof(float));
        double *d_w = malloc((size_t)A * sizeof(double));
        ref_combine_backward(d_rows_ref, d_w, dy, y, position, weight, N, k, C);
        uint16_t *d_dy = dev_bf16(dy, (long)N * C), *d_y = dev_bf16(y, (long)R * C), *d_drows;
        CHECK_CUDA(cudaMalloc((void **)&d_drows, (size_t)(R > 0 ? R : 1) * C * sizeof(uint16_t)));
        float *nan_w = malloc((size_t)A * sizeof(float));
        for (int i = 0; i < A; i++) nan_w[i] = NAN; /* every d_w is written, dropped ones too */
        float *d_dw = dev_f32(nan_w, A);
        CHECK_CUDA(cuda_moe_combine_backward(d_drows, d_dw, d_dy, d_y, d_pos_ref, d_weight_ref, A, k, C, 0));
        float *g_drows = host_from_bf16(d_drows, (long)R * C), *g_dw = host_from_f32(d_dw, A);
        float *dwf = to_float(d_w, A);
        check("combine backward: rows' gradients", rel_max(g_drows, d_rows_ref, (long)R * C), 8e-3);
        check("combine backward: weights' gradients (0 dropped)", rel_max(g_dw, dwf, A), 1e-5);
        free(dy); free(d_rows_ref); free(d_w); free(nan_w); free(g_drows); free(g_dw); free(dwf);
        cudaFree(d_dy); cudaFree(d_y); cudaFree(d_drows); cudaFree(d_dw);
    }
    {
        float *dx0 = rand_bf16_values(rng, (long)N * C, 1.0), *d_xin = rand_bf16_values(rng, (long)R * C, 1.0);
        float *router_dx = malloc((size_t)N * C * sizeof(float));
        for (long i = 0; i < (long)N * C; i++) router_dx[i] = (float)rng_normal(rng); /* fp32, not bf16 values */
        float *dx = malloc((size_t)N * C * sizeof(float));
        memcpy(dx, dx0, (size_t)N * C * sizeof(float));
        ref_scatter(dx, d_xin, position, router_dx, N, k, C);
        uint16_t *d_dx = dev_bf16(dx0, (long)N * C), *d_dxin = dev_bf16(d_xin, (long)R * C);
        float *d_router_dx = dev_f32(router_dx, (long)N * C);
        CHECK_CUDA(cuda_moe_scatter(d_dx, d_dxin, d_pos_ref, d_router_dx, N, k, C, 0));
        float *g_dx = host_from_bf16(d_dx, (long)N * C);
        check("scatter (in place, + router's fp32 part)", rel_max(g_dx, dx, (long)N * C), 8e-3);
        free(dx0); free(d_xin); free(router_dx); free(dx); free(g_dx);
        cudaFree(d_dx); cudaFree(d_dxin); cudaFree(d_router_dx);
    }

    /* ---- router backward: each term alone (so none hides under another), then all of them ---- */
    {
        const float loss_scale = 0.5f;
        double *d_w = malloc((size_t)A * sizeof(double)), *zero_w = calloc((size_t)A, sizeof(double));
        float *d_wf = malloc((size_t)A * sizeof(float)), *zero_wf = calloc((size_t)A, sizeof(float));
        for (int i = 0; i < A; i++) { /* combine backward's: 0 for a dropped assignment */
            d_wf[i] = position[i] < 0 ? 0.0f : (float)rng_normal(rng);
            d_w[i] = d_wf[i];
        }
        double *aux_counts = malloc((size_t)groups * E * sizeof(double)), *psum = malloc((size_t)groups * E * sizeof(double));
        ref_balance_stats(selected, scores, N, E, k, span, c->sigmoid, aux_counts, psum);
        double aux_scale;
        ref_aux_loss(scores, aux_counts, N, E, k, span, c->sigmoid, c->aux_coeff, &aux_scale);
        const double z_scale = c->z_coeff / N;
        float *coef = to_float(aux_counts, (long)groups * E); /* cuda_model_moe.c: the counts as floats */
        float *d_coef = dev_f32(coef, (long)groups * E), *d_dwf = dev_f32(d_wf, A), *d_zero = dev_f32(zero_wf, A);
        float *d_scores_ref = dev_f32(scores, (long)N * E), *d_ssum_ref = dev_f32(score_sum, N);
        float *d_lse_ref = dev_f32(lse, N), *d_raw_ref = dev_f32(raw, A), *d_dlogits = dev_f32(NULL, (long)N * E);
        float *want = malloc((size_t)N * E * sizeof(float));
        struct { const char *what; int dw, aux, z; } terms[] = {
            {"router backward: combine weights' gradients", 1, 0, 0},
            {"router backward: load-balancing loss alone", 0, 1, 0},
            {"router backward: z-loss alone", 0, 0, 1},
            {"router backward: all terms", 1, 1, 1},
        };
        for (size_t t = 0; t < sizeof terms / sizeof terms[0]; t++) {
            const int aux = terms[t].aux && c->aux_coeff > 0, z = terms[t].z && c->z_coeff > 0;
            if (!terms[t].dw && !aux && !z) continue; /* a term alone that this case does not have */
            ref_router_backward(want, terms[t].dw ? d_w : zero_w, logits, scores, selected, raw, weight, aux_counts,
                                span, aux ? aux_scale : 0.0, z ? c->z_coeff : 0.0, z_scale, loss_scale, N, E, k,
                                c->sigmoid, c->renorm);
            CHECK_CUDA(cuda_moe_router_backward(
                d_dlogits, terms[t].dw ? d_dwf : d_zero, d_logits_in, d_scores_ref, d_ssum_ref, d_lse_ref, d_sel_ref,
                d_raw_ref, d_weight_ref, aux ? d_coef : NULL, span, aux ? (float)(loss_scale * aux_scale) : 0.0f,
                z ? (float)(loss_scale * z_scale * 2.0) : 0.0f, N, E, k, c->sigmoid, c->renorm, 0));
            float *got = host_from_f32(d_dlogits, (long)N * E);
            check(terms[t].what, rel_max(got, want, (long)N * E), 1e-4);
            free(got);
        }
        free(d_w); free(zero_w); free(d_wf); free(zero_wf); free(aux_counts); free(psum); free(coef); free(want);
        cudaFree(d_coef); cudaFree(d_dwf); cudaFree(d_zero); cudaFree(d_scores_ref); cudaFree(d_ssum_ref);
        cudaFree(d_lse_ref); cudaFree(d_raw_ref); cudaFree(d_dlogits);
    }

    free(bias); free(logits); free(scores); free(selected); free(raw); free(weight); free(lse); free(score_sum);
    free(counts); free(position); free(token); free(row_slot); free(offsets); free(keep); free(weight_all);
    free(x); free(y); free(resid); free(shared);
    cudaFree(d_logits_in); cudaFree(d_bias); cudaFree(d_scores); cudaFree(d_lse); cudaFree(d_ssum); cudaFree(d_raw);
    cudaFree(d_weight); cudaFree(d_selected); cudaFree(d_sel_ref); cudaFree(d_tile_hist); cudaFree(d_offsets);
    cudaFree(d_position); cudaFree(d_token); cudaFree(d_row_slot); cudaFree(d_keep); cudaFree(d_x); cudaFree(d_rows);
    cudaFree(d_token_ref); cudaFree(d_pos_ref); cudaFree(d_weight_ref);
}

/* Capacity with exact ties: raw scores from four values, so an expert's capacity-th highest score is shared by
 * several assignments and the earlier ones (in assignment order) must be kept, as moe_layer.c group does. */
static void test_capacity_ties(Rng *rng, int N, int E, int k, double capacity_factor) {
    const int A = N * k, tiles = (A + MT_MOE_TILE - 1) / MT_MOE_TILE;
    const long capacity = (long)ceil(capacity_factor * (double)N * k / E);
    printf("capacity with tied scores: N=%d E=%d top-%d capacity %ld\n", N, E, k, capacity);
    int32_t *selected = malloc((size_t)A * sizeof(int32_t));
    float *raw = malloc((size_t)A * sizeof(float)), *weight = malloc((size_t)A * sizeof(float));
    for (int n = 0; n < N; n++) { /* k distinct experts, expert 0 twice as likely */
        for (int j = 0; j < k; j++) {
            int e;
            bool taken;
            do {
                e = rng_below(rng, 3) == 0 ? 0 : (int)rng_below(rng, (uint64_t)E);
                taken = false;
                for (int q = 0; q < j; q++) taken = taken || selected[(size_t)n * k + q] == e;
            } while (taken);
            selected[(size_t)n * k + j] = e;
            raw[(size_t)n * k + j] = (float)(1 + rng_below(rng, 4)) / 8.0f;
            weight[(size_t)n * k + j] = raw[(size_t)n * k + j] * 2.0f;
        }
    }
    float *weight_in = malloc((size_t)A * sizeof(float));
    memcpy(weight_in, weight, (size_t)A * sizeof(float));
    double *counts = malloc((size_t)E * sizeof(double));
    int32_t *position = malloc((size_t)A * sizeof(int32_t)), *token = malloc((size_t)A * sizeof(int32_t));
    int32_t *row_slot = malloc((size_t)A * sizeof(int32_t)), *offsets = malloc(((size_t)E + 1) * sizeof(int32_t));
    uint8_t *keep = malloc((size_t)A);
    const long dropped = ref_group(selected, raw, weight, N, E, k, capacity_factor, counts, position, token, row_slot,
                                   offsets, keep);
    long tied_drops = 0; /* dropped assignments whose score equals a kept one of the same expert */
    for (int i = 0; i < A; i++) {
        if (keep[i]) continue;
        for (int q = 0; q < A && !tied_drops; q++)
            if (keep[q] && selected[q] == selected[i] && raw[q] == raw[i]) tied_drops++;
    }
    printf("  %ld of %d assignments dropped, ties at the threshold: %s\n", dropped, A, tied_drops ? "yes" : "no");
    check("case: no tie at an expert's threshold", tied_drops > 0 ? 0.0 : 1.0, 0.0);
    int32_t *d_sel = dev_i32(selected, A), *d_hist = dev_i32_zero((long)tiles * E), *d_off = dev_i32_zero(E + 1);
    int32_t *d_pos = dev_i32_zero(A), *d_tok = dev_i32_zero(A), *d_slot = dev_i32_zero(A);
    float *d_raw = dev_f32(raw, A), *d_w = dev_f32(weight_in, A);
    uint8_t *d_keep;
    CHECK_CUDA(cudaMalloc((void **)&d_keep, (size_t)A));
    CHECK_CUDA(cuda_moe_sort(d_sel, NULL, d_hist, d_off, d_pos, d_tok, d_slot, A, k, E, 0));
    CHECK_CUDA(cuda_moe_capacity(d_raw, d_slot, d_off, d_keep, d_w, E, capacity, 0));
    CHECK_CUDA(cuda_moe_sort(d_sel, d_keep, d_hist, d_off, d_pos, d_tok, d_slot, A, k, E, 0));
    uint8_t *g_keep = host_u8(d_keep, A);
    float *g_w = host_from_f32(d_w, A);
    const int R = offsets[E];
    int32_t *g_off = host_i32(d_off, E + 1), *g_pos = host_i32(d_pos, A), *g_tok = host_i32(d_tok, R);
    int32_t *g_slot = host_i32(d_slot, R);
    check("capacity: keep, ties to the earlier assignment (exact)", mismatches_u8(g_keep, keep, A), 0.0);
    check("capacity: weights, dropped ones 0 (exact)", rel_max(g_w, weight, A), 0.0);
    check("sort after capacity: offsets (exact)", mismatches(g_off, offsets, E + 1), 0.0);
    check("sort after capacity: positions (exact)", mismatches(g_pos, position, A), 0.0);
    check("sort after capacity: rows' tokens (exact)", mismatches(g_tok, token, R), 0.0);
    check("sort after capacity: rows' assignments (exact)", mismatches(g_slot, row_slot, R), 0.0);
    free(selected); free(raw); free(weight); free(weight_in); free(counts); free(position); free(token);
    free(row_slot); free(offsets); free(keep); free(g_keep); free(g_w); free(g_off); free(g_pos); free(g_tok);
    free(g_slot);
    cudaFree(d_sel); cudaFree(d_hist); cudaFree(d_off); cudaFree(d_pos); cudaFree(d_tok); cudaFree(d_slot);
    cudaFree(d_raw); cudaFree(d_w); cudaFree(d_keep);
}

int main(void) {
    if (cuda_device_count() == 0) {
        printf("skip: no GPU\n");
        return 77;
    }
    Rng rng;
    rng_seed(&rng, 17);
    const MoeOpsCase cases[] = {
        /* top-1: one expert takes every token, the others none (Switch-style) */
        {.name = "top-1, one expert takes every token", .N = 96, .E = 8, .k = 1, .C = 64, .spread = 8.0, .hot = 3,
         .aux_coeff = 0.01},
        /* Mixtral: top-2 of 8 renormalised, the last two experts idle, capacity drops on the hot expert, seq aux */
        {.name = "top-2 renormalised, capacity, seq aux", .N = 128, .E = 8, .k = 2, .C = 48, .renorm = 1,
         .spread = 6.0, .hot = 0, .cold = 2, .capacity_factor = 1.0, .seq_T = 32, .aux_coeff = 0.02,
         .z_coeff = 1e-3, .shared = 1},
        /* Qwen3-30B-A3B: top-8 of 128 renormalised, several tiles, z-loss */
        {.name = "top-8 of 128 softmax renormalised", .N = 300, .E = 128, .k = 8, .C = 128, .renorm = 1,
         .spread = 8.0, .hot = -1, .aux_coeff = 1e-3, .z_coeff = 1e-3},
        /* top-8 of 60 (E not a multiple of 32) without renormalisation, capacity, 32 tiles, a shared expert */
        {.name = "top-8 of 60 softmax, capacity", .N = 1000, .E = 60, .k = 8, .C = 520, .spread = 8.0, .hot = 7,
         .cold = 4, .capacity_factor = 1.25, .aux_coeff = 0.01, .shared = 1},
        /* DeepSeek-V3-like: sigmoid, top-8 of 256, renormalised, expert_bias reordering the choice */
        {.name = "top-8 of 256 sigmoid renormalised, expert_bias", .N = 200, .E = 256, .k = 8, .C = 64,
         .sigmoid = 1, .renorm = 1, .spread = 8.0, .hot = -1, .bias_std = 0.01, .seq_T = 50, .aux_coeff = 1e-3,
         .z_coeff = 1e-3},
        /* sigmoid top-2 not renormalised; an expert_bias that decides the choice (experts 1 and 3 for every
         * token), whose weights stay the unbiased scores */
        {.name = "top-2 sigmoid, a deciding expert_bias", .N = 64, .E = 16, .k = 2, .C = 32, .sigmoid = 1,
         .spread = 6.0, .hot = -1, .bias_forced = 1, .aux_coeff = 0.01, .z_coeff = 1e-2},
        /* sigmoid top-1 with capacity drops and the seq statistics */
        {.name = "top-1 sigmoid, capacity, seq aux", .N = 256, .E = 32, .k = 1, .C = 64, .sigmoid = 1,
         .spread = 8.0, .hot = 5, .capacity_factor = 2.0, .seq_T = 64, .aux_coeff = 0.01},
        /* exactly tied scores: the choice and its order take the lower index, as moe_layer.c route; tied raw
         * scores at the capacity threshold keep the earlier assignment */
        {.name = "top-4 of 16 softmax renormalised, tied scores", .N = 128, .E = 16, .k = 4, .C = 32, .renorm = 1,
         .ties = 1, .hot = -1, .capacity_factor = 1.0, .aux_coeff = 0.01, .z_coeff = 1e-3},
        {.name = "top-2 of 8 sigmoid, tied scores", .N = 64, .E = 8, .k = 2, .C = 32, .sigmoid = 1, .ties = 1,
         .hot = -1, .seq_T = 16, .aux_coeff = 0.01},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&rng, &cases[i]);
    test_capacity_ties(&rng, 200, 8, 2, 1.0);
    test_capacity_ties(&rng, 700, 16, 4, 0.75); /* several tiles */
    printf("\n%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
