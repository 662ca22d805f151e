/* moe_layer.c: the mixture-of-experts MLP on the CPU (moe_layer.h).
 *
 *   logits = x Wr^T (fp32)                                   (N, E)
 *   scores = softmax(logits) | sigmoid(logits)
 *   selected = top-k of scores (+ expert_bias, for the choice only)
 *   raw = scores[selected];  weight = raw / sum(raw) with norm_topk_prob
 *   capacity_factor c: each expert keeps its ceil(c N k / E) highest-scored
 *   assignments, the others are dropped (weight 0)
 *   out[n] = sum_j weight[n,j] * expert_{selected[n,j]}(x[n]) (+ shared(x[n]))
 *   expert_e(x) = down_e(silu(gate_e(x)) * up_e(x))
 *
 * Experts' weights are stacked: gate/up (E*I, C), down (E*C, I). Assignments
 * are grouped expert by expert (tokens ascending within an expert), so each
 * expert runs one matmul over its rows; combine and scatter go token by
 * token, slot by slot: the same sums in the same order for any thread count.
 *
 * Load balancing (Megatron's formulas; p = the scores, normalised to sum 1
 * per token for sigmoid; counts are assignments before dropping):
 *   aux_loss        coeff * E / (k N^2) * sum_e (sum_n p[n,e]) * count[e]
 *   seq_aux_loss    the same per sequence (T tokens), averaged over the B sequences
 *   global_aux_loss coeff * E / (k N G) * sum_e (sum_n p[n,e]) * G_e, with G_e
 *                   the counts summed over the step's micro-batches so far and
 *                   over the dp ranks, G their tokens
 *   expert_bias     no loss: a bias added to the scores for the choice only,
 *                   moved after each step toward the mean load (model_moe_step_end)
 *   z-loss          z_loss_coeff * mean_n logsumexp(logits[n])^2
 *
 * precision: fp8 (docs/fp8.md): the experts' products are FP8 products
 * (moe_dispatch.c: each expert its own scales), and so is the shared
 * expert's, as the layer's gate|up and down groups (model_fp8.h); the
 * router, its scores and top-k, the combine and the losses stay fp32. */
#include "moe_layer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../dist/dp_sync.h"
#include "model_fp8.h"
#include "model_parallel.h"

MoeActs *moe_acts_create(const ModelConfig *cfg, int ep, int etp, int max_tokens) {
    const MoeConfig *m = &cfg->moe;
    const size_t N = (size_t)(max_tokens > 0 ? max_tokens : 1), E = (size_t)m->num_experts;
    const size_t k = (size_t)m->num_experts_per_tok;
    const size_t C = (size_t)cfg->hidden_size, Is = (size_t)(m->shared_expert_intermediate_size / etp);
    MoeActs *a = mt_calloc(1, sizeof *a);
    a->logits = mt_calloc(N * E, sizeof(float));
    a->scores = mt_calloc(N * E, sizeof(float));
    a->selected = mt_calloc(N * k, sizeof(int32_t));
    a->raw = mt_calloc(N * k, sizeof(float));
    a->weight = mt_calloc(N * k, sizeof(float));
    a->position = mt_calloc(N * k, sizeof(int32_t));
    a->token = mt_calloc(N * k, sizeof(int32_t));
    a->offsets = mt_calloc(E + 1, sizeof(int32_t));
    a->xin = mt_calloc(N * k * C, sizeof(float));
    a->y = mt_calloc(N * k * C, sizeof(float));
    a->d_rows = mt_calloc(N * k * C, sizeof(float));
    a->d_xin = mt_calloc(N * k * C, sizeof(float));
    moe_experts_init(&a->ex, cfg, ep, etp, (int)(N * k));
    a->d_w = mt_calloc(N * k, sizeof(double));
    a->d_scores = mt_calloc(N * E, sizeof(float));
    a->d_logits = mt_calloc(N * E, sizeof(float));
    if (Is > 0) {
        a->s_gate = mt_calloc(N * Is, sizeof(float));
        a->s_up = mt_calloc(N * Is, sizeof(float));
        a->s_act = mt_calloc(N * Is, sizeof(float));
        a->d_shared_act = mt_calloc(N * Is, sizeof(float));
        a->d_shared_gate = mt_calloc(N * Is, sizeof(float));
        a->d_shared_up = mt_calloc(N * Is, sizeof(float));
    }
    a->counts = mt_calloc(E, sizeof(double));
    const size_t rows = N * k, ex_rows = (size_t)a->ex.cap, Ie = (size_t)(m->moe_intermediate_size / etp);
    a->bytes = (4 * N * E + 2 * rows) * sizeof(float) + (3 * rows + E + 1) * sizeof(int32_t) +
               4 * rows * C * sizeof(float) + rows * sizeof(double) + (Is > 0 ? 6 * N * Is * sizeof(float) : 0) +
               E * sizeof(double) + ex_rows * sizeof(int32_t) + ex_rows * (5 * C + 6 * Ie) * sizeof(float) +
               E / (size_t)ep * (sizeof *a->ex.fp8_scales + 2 * sizeof(float));
    return a;
}

void moe_balance_init(MoeBalance *b, int E) {
    memset(b, 0, sizeof *b);
    b->aux_counts = mt_calloc((size_t)E, sizeof(double));
    b->aux_cap = 1;
}

void moe_balance_free(MoeBalance *b) {
    free(b->aux_counts);
    b->aux_counts = NULL;
}

MoeStep *moe_step_create(int num_layers, int E) {
    MoeStep *s = mt_calloc(1, sizeof *s);
    s->num_layers = num_layers;
    s->E = E;
    s->counts = mt_calloc((size_t)(num_layers > 0 ? num_layers : 1) * E, sizeof(double));
    s->global_counts = mt_calloc((size_t)(num_layers > 0 ? num_layers : 1) * E, sizeof(double));
    s->global_tokens = mt_calloc((size_t)(num_layers > 0 ? num_layers : 1), sizeof(double));
    return s;
}

void moe_step_free(MoeStep *s) {
    if (!s) return;
    free(s->counts);
    free(s->global_counts);
    free(s->global_tokens);
    free(s);
}

void moe_acts_free(MoeActs *a) {
    if (!a) return;
    void *bufs[] = {a->logits, a->scores, a->selected, a->raw, a->weight, a->position, a->token, a->offsets,
                    a->xin, a->y, a->d_rows, a->d_xin, a->d_scores,
                    a->d_logits, a->s_gate, a->s_up, a->s_act, a->d_shared_act, a->d_shared_gate,
                    a->d_shared_up, a->counts, a->d_w};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    moe_experts_free(&a->ex);
    free(a);
}

void moe_router_scores(const MoeConfig *m, const float *logits, float *scores, int N, int E) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * E;
        float *s = scores + (size_t)n * E;
        if (m->score_function == SCORE_SIGMOID) {
            for (int e = 0; e < E; e++) s[e] = (float)(1.0 / (1.0 + exp(-(double)l[e])));
            continue;
        }
        double mx = -INFINITY, sum = 0.0;
        for (int e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
        for (int e = 0; e < E; e++) sum += exp((double)l[e] - mx);
        for (int e = 0; e < E; e++) s[e] = (float)(exp((double)l[e] - mx) / sum);
    }
}

void moe_top_k(const float *scores, const float *bias, int E, int k, int32_t *sel) {
    for (int j = 0; j < k; j++) {
        int best = -1;
        double best_v = -INFINITY;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int i = 0; i < j; i++) taken |= sel[i] == e;
            const double v = (double)scores[e] + (bias ? (double)bias[e] : 0.0);
            if (!taken && (best < 0 || v > best_v)) {
                best = e;
                best_v = v;
            }
        }
        sel[j] = best;
    }
}

/* The k best experts of each token (moe_top_k); raw and weights. */
static void route(const MoeConfig *m, MoeActs *a, const float *bias, int N, int E) {
    const int k = m->num_experts_per_tok;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *s = a->scores + (size_t)n * E;
        int32_t *sel = a->selected + (size_t)n * k;
        moe_top_k(s, bias, E, k, sel);
        double sum = 0.0;
        for (int j = 0; j < k; j++) {
            a->raw[(size_t)n * k + j] = s[sel[j]];
            sum += s[sel[j]];
        }
        for (int j = 0; j < k; j++)
            a->weight[(size_t)n * k + j] =
                m->norm_topk_prob ? (float)(a->raw[(size_t)n * k + j] / sum) : a->raw[(size_t)n * k + j];
    }
}

long moe_expert_rows_max(const MoeConfig *mc, int ep, long N) {
    const long E = mc->num_experts, k = mc->num_experts_per_tok, El = ep > 0 ? E / ep : 0;
    if (El <= 0 || k <= 0 || N <= 0) return 0; /* a dense model */
    long rows = (long)ep * N * (k < El ? k : El);
    if (mc->capacity_factor > 0) { /* group()'s capacity, with every rank's N at most N */
        const long per_rank_expert = (long)ceil(mc->capacity_factor * (double)N * k / E);
        if (E * per_rank_expert < rows) rows = E * per_rank_expert; /* ep ranks x E / ep experts */
    }
    return rows;
}

long moe_expert_rows_room(const MoeConfig *mc, int ep, long N) {
    const long most = moe_expert_rows_max(mc, ep, N);
    const long room = (long)ceil(1.25 * (double)N * mc->num_experts_per_tok); /* a balanced routing's and a quarter */
    return most < room ? most : room;
}

/* Group the assignments expert by expert (tokens ascending), dropping what
 * exceeds the capacity (lowest scores first). Fills position, token, offsets.
 * A padding token (pad[n], pad NULL: none) is routed nowhere: no row, not
 * counted, not in the capacity (which counts the `real` tokens), not dropped. */
static void group(const MoeConfig *m, MoeActs *a, int N, int E, const uint8_t *pad, long real) {
    const int k = m->num_experts_per_tok;
    memset(a->counts, 0, (size_t)E * sizeof(double));
    for (long i = 0; i < (long)N * k; i++)
        if (!pad || !pad[i / k]) a->counts[a->selected[i]] += 1.0;
    long capacity = real * k;
    if (m->capacity_factor > 0) capacity = (long)ceil(m->capacity_factor * (double)real * k / E);
    a->dropped = 0;
    int row = 0;
    for (int e = 0; e < E; e++) {
        a->offsets[e] = row;
        long have = (long)a->counts[e];
        double threshold = -INFINITY; /* keep scores above it, and ties by token order */
        long ties_kept = capacity;
        if (have > capacity) { /* the capacity-th highest raw score of this expert */
            float *vals = mt_malloc((size_t)have * sizeof(float));
            long c = 0;
            for (long i = 0; i < (long)N * k; i++)
                if (a->selected[i] == e && (!pad || !pad[i / k])) vals[c++] = a->raw[i];
            for (long i = 0; i < capacity; i++) { /* partial selection sort: enough for tests and small E */
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
                if (a->selected[i] != e) continue;
                if (pad && pad[n]) { /* padding: no expert computes it, nothing counts it */
                    a->position[i] = -1;
                    a->weight[i] = 0.0f;
                    continue;
                }
                bool keep = have <= capacity || a->raw[i] > threshold || (a->raw[i] == threshold && ties_kept-- > 0);
                if (!keep) {
                    a->position[i] = -1;
                    a->weight[i] = 0.0f;
                    a->dropped++;
                    continue;
                }
                a->position[i] = row;
                a->token[row++] = n;
            }
    }
    a->offsets[E] = row;
}

/* p[n, e]: the scores as probabilities (sigmoid scores normalised per token). */
static double prob(const MoeConfig *m, const float *s, int E, int e, double *row_sum_cache) {
    if (m->score_function != SCORE_SIGMOID) return s[e];
    if (*row_sum_cache < 0) {
        double sum = 0.0;
        for (int i = 0; i < E; i++) sum += s[i];
        *row_sum_cache = sum;
    }
    return s[e] / *row_sum_cache;
}

/* Sum over the cp group (the other parts of the same sequences), in place. */
static void cp_sum_counts(const Model *model, double *v, size_t n) {
    if (model->part.cp > 1 && model->part.cp_comm) comm_all_reduce_sum_double(model->part.cp_comm, v, n);
}

/* Room for `rows` rows of aux_counts. */
static void aux_rows_room(MoeBalance *b, int rows, int E) {
    if (rows <= b->aux_cap) return;
    b->aux_counts = mt_realloc(b->aux_counts, (size_t)rows * E * sizeof(double));
    b->aux_cap = rows;
}

/* The load-balancing loss of local layer l's last routing (this rank's
 * tokens' share of it: summed over cp it is the micro-batch's) and what its
 * gradient needs. Under context parallel a sequence's tokens are on cp ranks:
 * the counts are summed over the cp group and N, T count all of them.
 * Packed rows' padding (pad, NULL: none) counts nowhere: real is this rank's
 * other tokens, Nall the micro-batch's (over cp), and a row's T its own (seq_aux_loss,
 * each row's weight then folded into its aux_counts, aux_scale 1). */
static void balance_loss(Model *model, int l, const MoeActs *a, MoeBalance *bal, int B, int T, const uint8_t *pad,
                         long real, double Nall) {
    const MoeConfig *m = &model->cfg.moe;
    MoeStep *step = model->moe_step;
    const int N = B * T, E = m->num_experts, k = m->num_experts_per_tok, cp = model->part.cp;
    const double Tall = (double)T * cp;
    bal->aux_loss = 0.0;
    bal->aux_scale = 0.0;
    bal->aux_rows = 1;
    bal->aux_span = N;
    for (int e = 0; e < E; e++) step->counts[(size_t)l * E + e] += a->counts[e];
    if (m->load_balancing == LB_NONE || m->load_balancing == LB_EXPERT_BIAS || !(m->aux_loss_coeff > 0)) return;
    if (m->load_balancing == LB_SEQ_AUX_LOSS) { /* per sequence */
        aux_rows_room(bal, B, E);
        bal->aux_rows = B;
        bal->aux_span = T;
        memset(bal->aux_counts, 0, (size_t)B * E * sizeof(double));
        for (int n = 0; n < N; n++)
            for (int j = 0; j < k && !(pad && pad[n]); j++)
                bal->aux_counts[(size_t)(n / T) * E + a->selected[(size_t)n * k + j]] += 1.0;
        cp_sum_counts(model, bal->aux_counts, (size_t)B * E);
        double *row_tokens = NULL; /* packed: each row's tokens but its padding, over cp */
        if (pad) {
            row_tokens = mt_calloc((size_t)B, sizeof(double));
            for (int n = 0; n < N; n++) row_tokens[n / T] += !pad[n];
            cp_sum_counts(model, row_tokens, (size_t)B);
        }
        double total = 0.0;
        double *psum = mt_malloc((size_t)E * sizeof(double));
        for (int b = 0; b < B; b++) {
            memset(psum, 0, (size_t)E * sizeof(double));
            for (int t = 0; t < T; t++) {
                const int n = b * T + t;
                double cache = -1;
                for (int e = 0; e < E && !(pad && pad[n]); e++) psum[e] += prob(m, a->scores + (size_t)n * E, E, e, &cache);
            }
            double sum = 0.0;
            for (int e = 0; e < E; e++) sum += psum[e] * bal->aux_counts[(size_t)b * E + e];
            const double Tb = row_tokens ? row_tokens[b] : Tall;
            const double weight = Tb > 0 ? m->aux_loss_coeff * E / ((double)k * Tb * Tb) : 0.0;
            total += weight * sum;
            for (int e = 0; e < E && row_tokens; e++) bal->aux_counts[(size_t)b * E + e] *= weight / B;
        }
        free(psum);
        free(row_tokens);
        bal->aux_loss = total / B;
        bal->aux_scale = pad ? 1.0 : m->aux_loss_coeff * E / ((double)k * Tall * Tall * B);
        return;
    }
    aux_rows_room(bal, 1, E);
    double tokens;
    if (m->load_balancing == LB_GLOBAL_AUX_LOSS) { /* running counts over the step, the dp and cp ranks */
        double *mine = mt_malloc(((size_t)E + 1) * sizeof(double));
        memcpy(mine, a->counts, (size_t)E * sizeof(double));
        mine[E] = (double)real;
        if (model->part.dp_comm) comm_all_reduce_sum_double(model->part.dp_comm, mine, (size_t)E + 1);
        cp_sum_counts(model, mine, (size_t)E + 1);
        double *global = step->global_counts + (size_t)l * E;
        for (int e = 0; e < E; e++) global[e] += mine[e];
        step->global_tokens[l] += mine[E];
        free(mine);
        memcpy(bal->aux_counts, global, (size_t)E * sizeof(double));
        tokens = step->global_tokens[l];
    } else {
        memcpy(bal->aux_counts, a->counts, (size_t)E * sizeof(double));
        cp_sum_counts(model, bal->aux_counts, (size_t)E);
        tokens = Nall;
    }
    double sum = 0.0;
    for (int n = 0; n < N; n++) {
        double cache = -1;
        for (int e = 0; e < E && !(pad && pad[n]); e++)
            sum += prob(m, a->scores + (size_t)n * E, E, e, &cache) * bal->aux_counts[e];
    }
    /* (a micro-batch of padding alone counts nothing: no loss, no gradient) */
    bal->aux_scale = Nall > 0 && tokens > 0 ? m->aux_loss_coeff * E / ((double)k * Nall * tokens) : 0.0;
    bal->aux_loss = bal->aux_scale * sum;
}

static double row_logsumexp(const float *l, int E) {
    double mx = -INFINITY, sum = 0.0;
    for (int e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
    for (int e = 0; e < E; e++) sum += exp((double)l[e] - mx);
    return mx + log(sum);
}

void moe_forward(Model *model, int l, MoeActs *a, const float *x, float *out, int B, int T) {
    const BackendOps *ops = model->ops;
    const ModelConfig *c = &model->cfg;
    const MoeConfig *m = &c->moe;
    const ModelPriv *pr = model->priv;
    const LayerWeights *w = &pr->weights[l];
    MoeBalance *b = &pr->moe_balance[l];
    const int N = B * T, C = c->hidden_size, E = m->num_experts, k = m->num_experts_per_tok;
    const int Is = m->shared_expert_intermediate_size / model->part.etp; /* this rank's slice */
    a->N = N;

    /* packed rows' padding (model_set_packed_positions) is routed nowhere and counted nowhere */
    const uint8_t *pad = model_token_pad(pr);
    long real = N;
    for (int n = 0; n < N && pad; n++) real -= pad[n];
    ops->matmul_forward(a->logits, x, w->router, NULL, N, C, E);
    moe_router_scores(m, a->logits, a->scores, N, E);
    route(m, a, w->expert_bias, N, E);
    group(m, a, N, E, pad, real);
    if (!pr->recomputing) { /* statistics once per micro-batch: a recomputed forward keeps the first's record */
        double Nall = (double)N * model->part.cp; /* the micro-batch's tokens (but padding) */
        if (pad) {
            Nall = (double)real;
            cp_sum_counts(model, &Nall, 1);
        }
        balance_loss(model, l, a, b, B, T, pad, real, Nall);
        b->z_loss = 0.0;
        b->z_scale = Nall > 0 ? m->z_loss_coeff / Nall : 0.0; /* the mean over the whole micro-batch */
        if (m->z_loss_coeff > 0) {
            double sum = 0.0;
            for (int n = 0; n < N; n++) {
                if (pad && pad[n]) continue;
                const double lse = row_logsumexp(a->logits + (size_t)n * E, E);
                sum += lse * lse;
            }
            b->z_loss = b->z_scale * sum;
        }
        MoeStep *step = model->moe_step;
        step->aux_sum += b->aux_loss;
        step->z_sum += b->z_loss;
        step->dropped += a->dropped;
        step->assignments += real * k;
    }

    /* the experts, on the ranks that hold them */
    const int rows = a->offsets[E];
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) memcpy(a->xin + (size_t)r * C, x + (size_t)a->token[r] * C, (size_t)C * sizeof(float));
    moe_experts_forward(model, l, &a->ex, a->xin, a->offsets, a->y);
    if (Is > 0) { /* the shared expert sees every token: the layer's gate|up and down groups, as a dense MLP's */
        const LinearPart gate_up[2] = {{.weight = w->s_gate, .out = a->s_gate, .OC = Is},
                                       {.weight = w->s_up, .out = a->s_up, .OC = Is}};
        linear_group_forward(model, l, LINEAR_GATE_UP, x, N, C, gate_up, 2);
        ops->swiglu_forward(a->s_act, a->s_gate, a->s_up, (long)N * Is);
        const LinearPart down = {.weight = w->s_down, .out = out, .OC = C};
        linear_group_forward(model, l, LINEAR_DOWN, a->s_act, N, Is, &down, 1);
    } else {
        memset(out, 0, (size_t)N * C * sizeof(float));
    }
    /* combine: token by token, slot by slot */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        for (int j = 0; j < k; j++) {
            const int32_t r = a->position[(size_t)n * k + j];
            if (r < 0) continue;
            const float wt = a->weight[(size_t)n * k + j];
            const float *y = a->y + (size_t)r * C;
            for (int i = 0; i < C; i++) o[i] += wt * y[i];
        }
    }
}

void moe_backward(Model *model, int l, MoeActs *a, const float *x, const float *d_out, float *d_x, float loss_scale) {
    const BackendOps *ops = model->ops;
    const ModelConfig *c = &model->cfg;
    const MoeConfig *m = &c->moe;
    const ModelPriv *pr = model->priv;
    const LayerWeights *w = &pr->weights[l];
    const LayerWeights *dw = &pr->weight_grads[l];
    const MoeBalance *b = &pr->moe_balance[l];
    const int N = a->N, C = c->hidden_size, E = m->num_experts, k = m->num_experts_per_tok;
    const int etp = model->part.etp;
    const int Is = m->shared_expert_intermediate_size / etp;
    memset(a->d_scores, 0, (size_t)N * E * sizeof(float));

    /* combine: d_weight (the outputs' dot products) and the rows' output gradients */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = d_out + (size_t)n * C;
        for (int j = 0; j < k; j++) {
            const int32_t r = a->position[(size_t)n * k + j];
            a->d_w[(size_t)n * k + j] = 0.0;
            if (r < 0) continue;
            const float wt = a->weight[(size_t)n * k + j];
            const float *y = a->y + (size_t)r * C;
            float *dr = a->d_rows + (size_t)r * C;
            double dot = 0.0;
            for (int i = 0; i < C; i++) {
                dot += (double)g[i] * y[i];
                dr[i] = wt * g[i];
            }
            a->d_w[(size_t)n * k + j] = dot;
        }
    }
    /* expert tensor parallel: each tp rank has a slice of the outputs; the
     * whole dot products are their sum (the same on every tp rank) */
    if (etp > 1) tp_sum_doubles(model, a->d_w, (size_t)N * k);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) { /* through the renormalisation to the selected scores */
        const double *d_w = a->d_w + (size_t)n * k;
        double S = 0.0, sum_dw_w = 0.0;
        for (int j = 0; j < k; j++) {
            S += a->raw[(size_t)n * k + j];
            sum_dw_w += d_w[j] * a->weight[(size_t)n * k + j];
        }
        for (int j = 0; j < k; j++) {
            const double d_raw = m->norm_topk_prob ? (d_w[j] - sum_dw_w) / S : d_w[j];
            a->d_scores[(size_t)n * E + a->selected[(size_t)n * k + j]] += (float)d_raw;
        }
    }
    /* the experts (their ranks' weight gradients accumulate there) */
    moe_experts_backward(model, l, &a->ex, a->d_rows, a->d_xin);
    /* scatter the rows' input gradients back to their tokens */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *dxn = d_x + (size_t)n * C;
        for (int j = 0; j < k; j++) {
            const int32_t r = a->position[(size_t)n * k + j];
            if (r < 0) continue;
            const float *dr = a->d_xin + (size_t)r * C;
            for (int i = 0; i < C; i++) dxn[i] += dr[i];
        }
    }
    if (Is > 0) {
        memset(a->d_shared_act, 0, (size_t)N * Is * sizeof(float));
        memset(a->d_shared_gate, 0, (size_t)N * Is * sizeof(float));
        memset(a->d_shared_up, 0, (size_t)N * Is * sizeof(float));
        const LinearPart down = {.weight = w->s_down, .dout = d_out, .dweight = dw->s_down, .OC = C};
        linear_group_backward(model, l, LINEAR_DOWN, a->d_shared_act, a->s_act, N, Is, &down, 1);
        ops->swiglu_backward(a->d_shared_gate, a->d_shared_up, a->d_shared_act, a->s_gate, a->s_up, (long)N * Is);
        const LinearPart gate_up[2] = {
            {.weight = w->s_gate, .dout = a->d_shared_gate, .dweight = dw->s_gate, .OC = Is},
            {.weight = w->s_up, .dout = a->d_shared_up, .dweight = dw->s_up, .OC = Is}};
        linear_group_backward(model, l, LINEAR_GATE_UP, d_x, x, N, C, gate_up, 2);
    }

    /* the load-balancing loss: d aux / d p[n, e] = coeff E / (k N tokens) * counts[e] (per sequence for seq_aux_loss) */
    const uint8_t *pad = model_token_pad(pr); /* as the forward's */
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *ds = a->d_scores + (size_t)n * E;
        const float *s = a->scores + (size_t)n * E;
        if (pad && pad[n]) { /* routed nowhere, in no loss: no gradient to the router */
            memset(a->d_logits + (size_t)n * E, 0, (size_t)E * sizeof(float));
            continue;
        }
        double dp_row[MT_MOE_MAX_EXPERTS];
        for (int e = 0; e < E; e++) dp_row[e] = 0.0;
        if (b->aux_scale != 0.0) {
            const double *cnt = b->aux_counts + (size_t)(n / b->aux_span) * E;
            for (int e = 0; e < E; e++) dp_row[e] = loss_scale * b->aux_scale * cnt[e];
        }
        if (m->score_function == SCORE_SIGMOID) { /* p = s / sum(s): back to s */
            double S = 0.0, dot = 0.0;
            for (int e = 0; e < E; e++) S += s[e];
            for (int e = 0; e < E; e++) dot += dp_row[e] * s[e] / S;
            for (int e = 0; e < E; e++) ds[e] += (float)((dp_row[e] - dot) / S);
        } else {
            for (int e = 0; e < E; e++) ds[e] += (float)dp_row[e];
        }
        /* scores -> logits */
        float *dl = a->d_logits + (size_t)n * E;
        if (m->score_function == SCORE_SIGMOID) {
            for (int e = 0; e < E; e++) dl[e] = (float)((double)ds[e] * s[e] * (1.0 - s[e]));
        } else {
            double dot = 0.0;
            for (int e = 0; e < E; e++) dot += (double)ds[e] * s[e];
            for (int e = 0; e < E; e++) dl[e] = (float)((double)s[e] * ((double)ds[e] - dot));
        }
        if (m->z_loss_coeff > 0) { /* d (coeff/N sum lse^2) = coeff * 2 lse / N * softmax */
            const float *lg = a->logits + (size_t)n * E;
            const double lse = row_logsumexp(lg, E);
            for (int e = 0; e < E; e++)
                dl[e] += (float)(loss_scale * b->z_scale * 2.0 * lse * exp((double)lg[e] - lse));
        }
    }
    /* the router is whole on every tp rank: with etp > 1 the input gradient is
     * summed over tp by the caller, so only tp rank 0 adds the router's part */
    const bool router_dx = etp == 1 || model->part.tp_rank == 0;
    ops->matmul_backward(router_dx ? d_x : NULL, dw->router, NULL, a->d_logits, x, w->router, N, C, E);
}

void model_set_backward_scale(Model *model, float loss_scale) { ((ModelPriv *)model->priv)->loss_scale = loss_scale; }

void model_moe_step_begin(Model *model) {
    MoeStep *s = model->moe_step;
    if (!s) return;
    const size_t n = (size_t)(s->num_layers > 0 ? s->num_layers : 1) * s->E;
    memset(s->counts, 0, n * sizeof(double));
    memset(s->global_counts, 0, n * sizeof(double));
    memset(s->global_tokens, 0, (size_t)(s->num_layers > 0 ? s->num_layers : 1) * sizeof(double));
    s->aux_sum = s->z_sum = 0.0;
    s->dropped = s->assignments = 0;
    s->spills = s->dispatches = 0;
}

void model_moe_step_end(Model *model, const Comm *dp, long num_micro, bool update_bias, MoeStepStats *out) {
    memset(out, 0, sizeof *out);
    MoeStep *s = model->moe_step;
    if (!s) return;
    const MoeConfig *m = &model->cfg.moe;
    const int E = s->E, L = s->num_layers;
    if (dp && dp->size > 1) comm_all_reduce_sum_double(dp, s->counts, (size_t)L * E);
    cp_sum_counts(model, s->counts, (size_t)L * E); /* the same counts (and biases) on every cp rank */
    const ModelPriv *pr = model->priv;
    for (int l = 0; l < L; l++) {
        if (!pr->moe[l] && !pr->weights[l].router) continue;
        const double *c = s->counts + (size_t)l * E;
        double total = 0.0, most = 0.0;
        for (int e = 0; e < E; e++) {
            total += c[e];
            most = c[e] > most ? c[e] : most;
        }
        out->moe_layers++;
        out->imbalance_sum += total > 0 ? most / (total / E) : 0.0;
        float *bias = pr->weights[l].expert_bias;
        if (bias && update_bias && total > 0) /* toward the mean load (auxiliary-loss-free balancing) */
            for (int e = 0; e < E; e++) {
                const double diff = total / E - c[e];
                bias[e] += (float)(m->bias_update_rate * (diff > 0 ? 1.0 : diff < 0 ? -1.0 : 0.0));
            }
    }
    out->aux_loss = num_micro > 0 ? s->aux_sum / num_micro : 0.0;
    out->z_loss = num_micro > 0 ? s->z_sum / num_micro : 0.0;
    out->dropped = s->dropped;
    out->assignments = s->assignments;
    out->spills = s->spills;
    out->dispatches = s->dispatches;
}

double model_moe_last_aux(const Model *model) {
    const ModelPriv *pr = model->priv;
    double sum = 0.0;
    for (int l = 0; l < model->part.num_layers; l++)
        if (pr->moe[l]) sum += pr->moe_balance[l].aux_loss + pr->moe_balance[l].z_loss;
    return sum;
}
