/* test_ops_attention.c: the CPU backend's position and attention ops:
 * rope_tables_init (plain and llama3-scaled, against a direct double version
 * of transformers' formula), rope forward/backward, and causal grouped-query
 * attention (double reference, gradient checks, causality, GQA mapping), and
 * attention at a subset of query positions (attention_forward_at/backward_at,
 * for context parallelism): double reference and gradient checks with
 * shuffled positions, a context-parallel split of the queries against the
 * full attention, and identity positions against the plain ops, bit for bit.
 */
#include "ops_test_util.h"

#include "backend/backend.h"
#include "config/recipe.h"
#include "model/rope_tables.h"

static const BackendOps *ops = &cpu_backend;

/* ------------------------------------------------------------ rope tables */

/* transformers' default inv_freq and _compute_llama3_parameters, in double */
static double ref_inv_freq(int i, int D, double theta, const RopeScaling *s, int *band) {
    double inv = 1.0 / pow(theta, (double)(2 * i) / D);
    *band = 0;
    if (s == NULL || !s->enabled) return inv;
    double low_freq_wavelen = s->original_max_position_embeddings / s->low_freq_factor;
    double high_freq_wavelen = s->original_max_position_embeddings / s->high_freq_factor;
    double wavelen = 2.0 * M_PI / inv;
    if (wavelen > low_freq_wavelen) {
        *band = 2; /* low frequency: divided by factor */
        return inv / s->factor;
    }
    if (wavelen < high_freq_wavelen) return inv; /* high frequency: kept */
    *band = 1;
    double smooth = (s->original_max_position_embeddings / wavelen - s->low_freq_factor) /
                    (s->high_freq_factor - s->low_freq_factor);
    return (1.0 - smooth) * inv / s->factor + smooth * inv;
}

/* Tolerance for a table entry at position t with reference frequency inv:
 * transformers rounds the exponent 2i/D (an error ln(theta) * 2^-24 relative
 * in theta^e), theta^e, 1/x, the llama3 band arithmetic (<= 16 roundings'
 * worth, in the smoothed band) and t * inv_freq to fp32, so the angle is off
 * by at most t * inv * (ln(theta) + 17) * 2^-24; cos/sin add 2^-24 each. */
static double table_tol(int t, double inv, double theta) {
    return 0x1p-23 + t * inv * (log(theta) + 17.0) * 0x1p-24;
}

static void check_tables(int T, int D, double theta, const RopeScaling *scaling, int bands_seen[3]) {
    int half = D / 2;
    float *cos_t = zero_floats((long)T * half), *sin_t = zero_floats((long)T * half);
    rope_tables_init(cos_t, sin_t, T, D, theta, scaling);
    double worst = 0.0;
    for (int i = 0; i < half; i++) {
        int band;
        double inv = ref_inv_freq(i, D, theta, scaling, &band);
        bands_seen[band]++;
        for (int t = 0; t < T; t++) {
            double tol = table_tol(t, inv, theta);
            double dc = fabs(cos_t[t * half + i] - cos(t * inv)) / tol;
            double ds = fabs(sin_t[t * half + i] - sin(t * inv)) / tol;
            if (dc > worst) worst = dc;
            if (ds > worst) worst = ds;
        }
    }
    expect_below(worst, 1.0, "rope table error / its tolerance");
    free(cos_t), free(sin_t);
}

static void test_rope_tables_plain(void **state) {
    (void)state;
    int bands[3] = {0};
    RopeScaling off = {0};
    check_tables(200, 16, 10000.0, NULL, bands);
    check_tables(200, 64, 500000.0, &off, bands);
    assert_int_equal(bands[1] + bands[2], 0);
    /* position 0 is the identity rotation */
    float c[8], s[8];
    rope_tables_init(c, s, 1, 16, 10000.0, NULL);
    for (int i = 0; i < 8; i++) assert_true(c[i] == 1.0f && s[i] == 0.0f);
}

static void test_rope_tables_llama3(void **state) {
    (void)state;
    enum { T = 300, D = 64 };
    RopeScaling llama3 = {.enabled = true,
                          .factor = 8.0,
                          .low_freq_factor = 1.0,
                          .high_freq_factor = 4.0,
                          .original_max_position_embeddings = 8192};
    int bands[3] = {0};
    check_tables(T, D, 500000.0, &llama3, bands);
    /* D = 64, theta = 5e5 puts pairs in all three bands */
    assert_true(bands[0] > 0 && bands[1] > 0 && bands[2] > 0);

    /* the scaling really changed the tables where it should, and only there */
    float *cs = zero_floats(T * D / 2), *ss = zero_floats(T * D / 2);
    float *cp = zero_floats(T * D / 2), *sp = zero_floats(T * D / 2);
    rope_tables_init(cs, ss, T, D, 500000.0, &llama3);
    rope_tables_init(cp, sp, T, D, 500000.0, NULL);
    for (int i = 0; i < D / 2; i++) {
        int band;
        double inv = ref_inv_freq(i, D, 500000.0, &llama3, &band);
        double diff = 0.0;
        for (int t = 0; t < T; t++) diff = fmax(diff, fabs(ss[t * D / 2 + i] - sp[t * D / 2 + i]));
        if (band == 0) assert_true(diff == 0.0);
        else assert_true(diff > 100 * table_tol(T, inv, 500000.0));
    }
    free(cs), free(ss), free(cp), free(sp);
}

/* ------------------------------------------------------------ rope */

typedef struct {
    int B, T, NH, D;
    double *x;
    const float *cos, *sin;
    const float *r;
    double *out;
} RopeRef;

/* q * cos + rotate_half(q) * sin, rotate_half(x) = cat(-x2, x1) */
static void ref_rope(double *out, const double *x, const float *cos_t, const float *sin_t, int B, int T, int NH,
                     int D) {
    int half = D / 2;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                long base = (((long)b * T + t) * NH + h) * D;
                for (int j = 0; j < D; j++) {
                    int i = j % half;
                    double c = cos_t[t * half + i], s = sin_t[t * half + i];
                    double rotated = j < half ? -x[base + j + half] : x[base + j - half];
                    out[base + j] = x[base + j] * c + rotated * s;
                }
            }
}

static double rope_loss(void *p) {
    RopeRef *e = p;
    ref_rope(e->out, e->x, e->cos, e->sin, e->B, e->T, e->NH, e->D);
    return project(e->out, e->r, (long)e->B * e->T * e->NH * e->D);
}

static void test_rope(void **state) {
    (void)state;
    enum { B = 2, T = 5, NH = 3, D = 8, n = B * T * NH * D };
    Rng rng;
    rng_seed(&rng, 21);
    float cos_t[T * D / 2], sin_t[T * D / 2];
    rope_tables_init(cos_t, sin_t, T, D, 100.0, NULL);
    float *x = rand_floats(&rng, n, 1.0), *r = rand_floats(&rng, n, 1.0), *out = zero_floats(n);
    ops->rope_forward(out, x, cos_t, sin_t, B, T, NH, D);
    RopeRef e = {B, T, NH, D, to_doubles(x, n), cos_t, sin_t, r, malloc(sizeof(double) * n)};
    ref_rope(e.out, e.x, cos_t, sin_t, B, T, NH, D);
    expect_below(rel_error(out, e.out, n), FWD_TOL, "rope forward");

    float *inplace = copy_floats(x, n); /* out may equal inp */
    ops->rope_forward(inplace, inplace, cos_t, sin_t, B, T, NH, D);
    assert_memory_equal(inplace, out, n * sizeof(float));

    float *dx = zero_floats(n);
    ops->rope_backward(dx, r, cos_t, sin_t, B, T, NH, D);
    check_grad("rope dinp", dx, rope_loss, &e, e.x, n);
    float *start = rand_floats(&rng, n, 1.0), *twice = copy_floats(start, n);
    for (int k = 0; k < 2; k++) ops->rope_backward(twice, r, cos_t, sin_t, B, T, NH, D);
    check_accumulated("rope dinp accumulates", twice, start, dx, n);

    free(x), free(r), free(out), free(e.x), free(e.out), free(inplace), free(dx), free(start), free(twice);
}

/* ------------------------------------------------------------ attention */

typedef struct {
    int B, T, H, KVH, D;
    double *q, *k, *v;
    const float *r;
    double *out;
} AttentionRef;

static void ref_attention(double *out, const double *q, const double *k, const double *v, int B, int T, int H,
                          int KVH, int D) {
    double scores[64];
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int kvh = h / (H / KVH);
            for (int t = 0; t < T; t++) {
                const double *qr = q + (((long)b * T + t) * H + h) * D;
                double max = -INFINITY, sum = 0.0;
                for (int u = 0; u <= t; u++) {
                    const double *kr = k + (((long)b * T + u) * KVH + kvh) * D;
                    double s = 0.0;
                    for (int d = 0; d < D; d++) s += qr[d] * kr[d];
                    scores[u] = s / sqrt((double)D);
                    if (scores[u] > max) max = scores[u];
                }
                for (int u = 0; u <= t; u++) sum += exp(scores[u] - max);
                double *orow = out + (((long)b * T + t) * H + h) * D;
                for (int d = 0; d < D; d++) orow[d] = 0.0;
                for (int u = 0; u <= t; u++) {
                    double p = exp(scores[u] - max) / sum;
                    const double *vr = v + (((long)b * T + u) * KVH + kvh) * D;
                    for (int d = 0; d < D; d++) orow[d] += p * vr[d];
                }
            }
        }
}

static double attention_loss(void *p) {
    AttentionRef *e = p;
    ref_attention(e->out, e->q, e->k, e->v, e->B, e->T, e->H, e->KVH, e->D);
    return project(e->out, e->r, (long)e->B * e->T * e->H * e->D);
}

static void run_attention_case(int B, int T, int H, int KVH, int D, uint64_t seed) {
    long nq = (long)B * T * H * D, nkv = (long)B * T * KVH * D, np = (long)B * H * T * T;
    Rng rng;
    rng_seed(&rng, seed);
    float *q = rand_floats(&rng, nq, 1.5), *k = rand_floats(&rng, nkv, 1.5), *v = rand_floats(&rng, nkv, 1.0);
    float *r = rand_floats(&rng, nq, 1.0);
    float *out = zero_floats(nq), *probs = rand_floats(&rng, np, 1.0); /* garbage: must be overwritten */
    ops->attention_forward(out, probs, q, k, v, B, T, H, KVH, D);

    AttentionRef e = {B, T, H, KVH, D, to_doubles(q, nq), to_doubles(k, nkv), to_doubles(v, nkv), r,
                      malloc(sizeof(double) * nq)};
    ref_attention(e.out, e.q, e.k, e.v, B, T, H, KVH, D);
    expect_below(rel_error(out, e.out, nq), FWD_TOL, "attention forward");
    for (int bh = 0; bh < B * H; bh++) /* probs: rows sum to 1, zero above the diagonal */
        for (int t = 0; t < T; t++) {
            double sum = 0.0;
            for (int u = 0; u < T; u++) {
                float p = probs[((long)bh * T + t) * T + u];
                if (u > t) assert_true(p == 0.0f);
                else assert_true(p > 0.0f);
                sum += p;
            }
            expect_below(fabs(sum - 1.0), FWD_TOL, "attention probs row sum - 1");
        }

    float *dq = zero_floats(nq), *dk = zero_floats(nkv), *dv = zero_floats(nkv);
    ops->attention_backward(dq, dk, dv, r, probs, q, k, v, B, T, H, KVH, D);
    check_grad("attention dq", dq, attention_loss, &e, e.q, nq);
    check_grad("attention dk", dk, attention_loss, &e, e.k, nkv);
    check_grad("attention dv", dv, attention_loss, &e, e.v, nkv);

    float *sq = rand_floats(&rng, nq, 1.0), *sk = rand_floats(&rng, nkv, 1.0), *sv = rand_floats(&rng, nkv, 1.0);
    float *tq = copy_floats(sq, nq), *tk = copy_floats(sk, nkv), *tv = copy_floats(sv, nkv);
    for (int i = 0; i < 2; i++) ops->attention_backward(tq, tk, tv, r, probs, q, k, v, B, T, H, KVH, D);
    check_accumulated("attention dq accumulates", tq, sq, dq, nq);
    check_accumulated("attention dk accumulates", tk, sk, dk, nkv);
    check_accumulated("attention dv accumulates", tv, sv, dv, nkv);

    free(q), free(k), free(v), free(r), free(out), free(probs), free(e.q), free(e.k), free(e.v), free(e.out);
    free(dq), free(dk), free(dv), free(sq), free(sk), free(sv), free(tq), free(tk), free(tv);
}

static void test_attention_gqa(void **state) {
    (void)state;
    run_attention_case(2, 6, 4, 2, 8, 31); /* two query heads per kv head */
}

static void test_attention_mha(void **state) {
    (void)state;
    run_attention_case(2, 5, 2, 2, 8, 32); /* H == KVH */
}

static void test_attention_mqa(void **state) {
    (void)state;
    run_attention_case(1, 7, 3, 1, 4, 33); /* one kv head for all */
}

/* GQA equals multi-head attention on k/v heads repeated H/KVH times; the kv
 * gradients of GQA are the sums over the repeated heads. */
static void test_attention_gqa_is_repeated_kv(void **state) {
    (void)state;
    enum { B = 2, T = 6, H = 4, KVH = 2, D = 8, G = H / KVH };
    long nq = B * T * H * D, nkv = B * T * KVH * D, nrep = B * T * H * D, np = B * H * T * T;
    Rng rng;
    rng_seed(&rng, 34);
    float *q = rand_floats(&rng, nq, 1.0), *k = rand_floats(&rng, nkv, 1.0), *v = rand_floats(&rng, nkv, 1.0);
    float *dout = rand_floats(&rng, nq, 1.0);
    float *krep = zero_floats(nrep), *vrep = zero_floats(nrep);
    for (int bt = 0; bt < B * T; bt++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++) {
                krep[((long)bt * H + h) * D + d] = k[((long)bt * KVH + h / G) * D + d];
                vrep[((long)bt * H + h) * D + d] = v[((long)bt * KVH + h / G) * D + d];
            }
    float *out = zero_floats(nq), *probs = zero_floats(np), *out_rep = zero_floats(nq), *probs_rep = zero_floats(np);
    ops->attention_forward(out, probs, q, k, v, B, T, H, KVH, D);
    ops->attention_forward(out_rep, probs_rep, q, krep, vrep, B, T, H, H, D);
    assert_memory_equal(out, out_rep, nq * sizeof(float));
    assert_memory_equal(probs, probs_rep, np * sizeof(float));

    float *dq = zero_floats(nq), *dk = zero_floats(nkv), *dv = zero_floats(nkv);
    float *dq_rep = zero_floats(nq), *dk_rep = zero_floats(nrep), *dv_rep = zero_floats(nrep);
    ops->attention_backward(dq, dk, dv, dout, probs, q, k, v, B, T, H, KVH, D);
    ops->attention_backward(dq_rep, dk_rep, dv_rep, dout, probs_rep, q, krep, vrep, B, T, H, H, D);
    assert_memory_equal(dq, dq_rep, nq * sizeof(float));
    double *dk_sum = calloc(nkv, sizeof(double)), *dv_sum = calloc(nkv, sizeof(double));
    for (int bt = 0; bt < B * T; bt++)
        for (int h = 0; h < H; h++)
            for (int d = 0; d < D; d++) {
                dk_sum[((long)bt * KVH + h / G) * D + d] += dk_rep[((long)bt * H + h) * D + d];
                dv_sum[((long)bt * KVH + h / G) * D + d] += dv_rep[((long)bt * H + h) * D + d];
            }
    expect_below(rel_error(dk, dk_sum, nkv), FWD_TOL, "gqa dk vs summed repeated heads");
    expect_below(rel_error(dv, dv_sum, nkv), FWD_TOL, "gqa dv vs summed repeated heads");

    free(q), free(k), free(v), free(dout), free(krep), free(vrep), free(out), free(probs), free(out_rep);
    free(probs_rep), free(dq), free(dk), free(dv), free(dq_rep), free(dk_rep), free(dv_rep), free(dk_sum), free(dv_sum);
}

/* A token's k/v affect only outputs at its position and later; a gradient on
 * early outputs reaches no later k/v. */
static void test_attention_causal(void **state) {
    (void)state;
    enum { B = 1, T = 7, H = 2, KVH = 1, D = 4, CUT = 4 };
    long nq = B * T * H * D, nkv = B * T * KVH * D, np = B * H * T * T;
    Rng rng;
    rng_seed(&rng, 35);
    float *q = rand_floats(&rng, nq, 1.0), *k = rand_floats(&rng, nkv, 1.0), *v = rand_floats(&rng, nkv, 1.0);
    float *out1 = zero_floats(nq), *out2 = zero_floats(nq), *probs = zero_floats(np);
    ops->attention_forward(out1, probs, q, k, v, B, T, H, KVH, D);
    for (int d = 0; d < KVH * D; d++) { /* change the future token CUT */
        k[CUT * KVH * D + d] += 1.0f;
        v[CUT * KVH * D + d] -= 2.0f;
    }
    ops->attention_forward(out2, probs, q, k, v, B, T, H, KVH, D);
    long row = H * D;
    assert_memory_equal(out1, out2, CUT * row * sizeof(float));
    for (int t = CUT; t < T; t++) assert_memory_not_equal(out1 + t * row, out2 + t * row, row * sizeof(float));

    float *dout = zero_floats(nq), *dq = zero_floats(nq), *dk = zero_floats(nkv), *dv = zero_floats(nkv);
    for (long i = 0; i < CUT * row; i++) dout[i] = (float)rng_normal(&rng);
    ops->attention_backward(dq, dk, dv, dout, probs, q, k, v, B, T, H, KVH, D);
    for (long i = CUT * KVH * D; i < nkv; i++) assert_true(dk[i] == 0.0f && dv[i] == 0.0f);
    assert_true(max_abs(dk, CUT * KVH * D) > 0.0 && max_abs(dv, CUT * KVH * D) > 0.0);
    for (long i = CUT * row; i < nq; i++) assert_true(dq[i] == 0.0f);

    free(q), free(k), free(v), free(out1), free(out2), free(probs), free(dout), free(dq), free(dk), free(dv);
}

/* ------------------------------------------------------------ attention at query positions */

typedef struct {
    int B, Tq, Tk, H, KVH, D;
    const int32_t *q_pos;
    double *q, *k, *v;
    const float *r;
    double *out;
} AttentionAtRef;

/* query row t (at position q_pos[t]) attends to keys 0..q_pos[t] */
static void ref_attention_at(double *out, const double *q, const double *k, const double *v, const int32_t *q_pos,
                             int B, int Tq, int Tk, int H, int KVH, int D) {
    double scores[64];
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int kvh = h / (H / KVH);
            for (int t = 0; t < Tq; t++) {
                int pos = q_pos[t];
                const double *qr = q + (((long)b * Tq + t) * H + h) * D;
                double max = -INFINITY, sum = 0.0;
                for (int u = 0; u <= pos; u++) {
                    const double *kr = k + (((long)b * Tk + u) * KVH + kvh) * D;
                    double s = 0.0;
                    for (int d = 0; d < D; d++) s += qr[d] * kr[d];
                    scores[u] = s / sqrt((double)D);
                    if (scores[u] > max) max = scores[u];
                }
                for (int u = 0; u <= pos; u++) sum += exp(scores[u] - max);
                double *orow = out + (((long)b * Tq + t) * H + h) * D;
                for (int d = 0; d < D; d++) orow[d] = 0.0;
                for (int u = 0; u <= pos; u++) {
                    double p = exp(scores[u] - max) / sum;
                    const double *vr = v + (((long)b * Tk + u) * KVH + kvh) * D;
                    for (int d = 0; d < D; d++) orow[d] += p * vr[d];
                }
            }
        }
}

static double attention_at_loss(void *p) {
    AttentionAtRef *e = p;
    ref_attention_at(e->out, e->q, e->k, e->v, e->q_pos, e->B, e->Tq, e->Tk, e->H, e->KVH, e->D);
    return project(e->out, e->r, (long)e->B * e->Tq * e->H * e->D);
}

static void run_attention_at_case(const int32_t *q_pos, int B, int Tq, int Tk, int H, int KVH, int D,
                                  uint64_t seed) {
    long nq = (long)B * Tq * H * D, nkv = (long)B * Tk * KVH * D, np = (long)B * H * Tq * Tk;
    Rng rng;
    rng_seed(&rng, seed);
    float *q = rand_floats(&rng, nq, 1.5), *k = rand_floats(&rng, nkv, 1.5), *v = rand_floats(&rng, nkv, 1.0);
    float *r = rand_floats(&rng, nq, 1.0);
    float *out = zero_floats(nq), *probs = rand_floats(&rng, np, 1.0); /* garbage: must be overwritten */
    ops->attention_forward_at(out, probs, q, k, v, q_pos, B, Tq, Tk, H, KVH, D);

    AttentionAtRef e = {B, Tq, Tk, H, KVH, D, q_pos, to_doubles(q, nq), to_doubles(k, nkv), to_doubles(v, nkv), r,
                        malloc(sizeof(double) * nq)};
    ref_attention_at(e.out, e.q, e.k, e.v, q_pos, B, Tq, Tk, H, KVH, D);
    expect_below(rel_error(out, e.out, nq), FWD_TOL, "attention_at forward");
    for (int bh = 0; bh < B * H; bh++) /* probs: rows sum to 1, zero for keys after the query's position */
        for (int t = 0; t < Tq; t++) {
            double sum = 0.0;
            for (int u = 0; u < Tk; u++) {
                float p = probs[((long)bh * Tq + t) * Tk + u];
                if (u > q_pos[t]) assert_true(p == 0.0f);
                else assert_true(p > 0.0f);
                sum += p;
            }
            expect_below(fabs(sum - 1.0), FWD_TOL, "attention_at probs row sum - 1");
        }

    float *dq = zero_floats(nq), *dk = zero_floats(nkv), *dv = zero_floats(nkv);
    ops->attention_backward_at(dq, dk, dv, r, probs, q, k, v, q_pos, B, Tq, Tk, H, KVH, D);
    check_grad("attention_at dq", dq, attention_at_loss, &e, e.q, nq);
    check_grad("attention_at dk", dk, attention_at_loss, &e, e.k, nkv);
    check_grad("attention_at dv", dv, attention_at_loss, &e, e.v, nkv);
    /* keys after every query position get no gradient */
    int max_pos = 0;
    for (int t = 0; t < Tq; t++)
        if (q_pos[t] > max_pos) max_pos = q_pos[t];
    for (int b = 0; b < B; b++)
        for (long i = (long)(max_pos + 1) * KVH * D; i < (long)Tk * KVH * D; i++) {
            long at = (long)b * Tk * KVH * D + i;
            assert_true(dk[at] == 0.0f && dv[at] == 0.0f);
        }

    float *sq = rand_floats(&rng, nq, 1.0), *sk = rand_floats(&rng, nkv, 1.0), *sv = rand_floats(&rng, nkv, 1.0);
    float *tq = copy_floats(sq, nq), *tk = copy_floats(sk, nkv), *tv = copy_floats(sv, nkv);
    for (int i = 0; i < 2; i++)
        ops->attention_backward_at(tq, tk, tv, r, probs, q, k, v, q_pos, B, Tq, Tk, H, KVH, D);
    check_accumulated("attention_at dq accumulates", tq, sq, dq, nq);
    check_accumulated("attention_at dk accumulates", tk, sk, dk, nkv);
    check_accumulated("attention_at dv accumulates", tv, sv, dv, nkv);

    free(q), free(k), free(v), free(r), free(out), free(probs), free(e.q), free(e.k), free(e.v), free(e.out);
    free(dq), free(dk), free(dv), free(sq), free(sk), free(sv), free(tq), free(tk), free(tv);
}

/* The load-balanced context-parallel split: the sequence in 2*cp chunks,
 * rank r holds chunks r and 2*cp-1-r (ascending). Returns the count, T / cp. */
static int cp_positions(int32_t *pos, int rank, int cp, int T) {
    int chunk = T / (2 * cp), n = 0;
    for (int i = 0; i < chunk; i++) pos[n++] = rank * chunk + i;
    for (int i = 0; i < chunk; i++) pos[n++] = (2 * cp - 1 - rank) * chunk + i;
    return n;
}

static void test_attention_at_reference(void **state) {
    (void)state;
    int32_t pos[8];
    /* cp = 2, Tk = 8: rank 0 holds {0,1,6,7}, rank 1 holds {2,3,4,5} */
    assert_int_equal(cp_positions(pos, 0, 2, 8), 4);
    assert_true(pos[0] == 0 && pos[1] == 1 && pos[2] == 6 && pos[3] == 7);
    run_attention_at_case(pos, 2, 4, 8, 4, 2, 8, 41);
    assert_int_equal(cp_positions(pos, 1, 2, 8), 4);
    assert_true(pos[0] == 2 && pos[1] == 3 && pos[2] == 4 && pos[3] == 5);
    run_attention_at_case(pos, 2, 4, 8, 4, 2, 8, 42);
    /* shuffled and strided (with Tk = 9 two keys no query sees); MHA and MQA */
    const int32_t shuffled[5] = {5, 0, 3, 6, 1};
    run_attention_at_case(shuffled, 2, 5, 9, 2, 2, 8, 43);
    run_attention_at_case(shuffled, 1, 5, 7, 3, 1, 4, 44);
}

/* Splitting the queries of a full causal attention over cp ranks: each rank's
 * attention_forward_at gives the full attention's rows at its positions (the
 * same sums in the same order, so the same bits, and so do probs and dq), and
 * the ranks' dk, dv add up to the full backward's. */
static void run_attention_split(int cp, int B, int T, int H, int KVH, int D, uint64_t seed) {
    long nq = (long)B * T * H * D, nkv = (long)B * T * KVH * D, np = (long)B * H * T * T;
    long row = (long)H * D;
    Rng rng;
    rng_seed(&rng, seed);
    float *q = rand_floats(&rng, nq, 1.5), *k = rand_floats(&rng, nkv, 1.5), *v = rand_floats(&rng, nkv, 1.0);
    float *dout = rand_floats(&rng, nq, 1.0);
    float *out = zero_floats(nq), *probs = zero_floats(np);
    float *dq = zero_floats(nq), *dk = zero_floats(nkv), *dv = zero_floats(nkv);
    ops->attention_forward(out, probs, q, k, v, B, T, H, KVH, D);
    ops->attention_backward(dq, dk, dv, dout, probs, q, k, v, B, T, H, KVH, D);

    double *dk_sum = calloc(nkv, sizeof(double)), *dv_sum = calloc(nkv, sizeof(double));
    int32_t *pos = malloc(sizeof(int32_t) * T);
    for (int rank = 0; rank < cp; rank++) {
        int Tq = cp_positions(pos, rank, cp, T);
        long nql = (long)B * Tq * row, npl = (long)B * H * Tq * T;
        float *ql = zero_floats(nql), *doutl = zero_floats(nql);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < Tq; t++) {
                memcpy(ql + ((long)b * Tq + t) * row, q + ((long)b * T + pos[t]) * row, row * sizeof(float));
                memcpy(doutl + ((long)b * Tq + t) * row, dout + ((long)b * T + pos[t]) * row, row * sizeof(float));
            }
        float *outl = zero_floats(nql), *probsl = zero_floats(npl);
        float *dql = zero_floats(nql), *dkl = zero_floats(nkv), *dvl = zero_floats(nkv);
        ops->attention_forward_at(outl, probsl, ql, k, v, pos, B, Tq, T, H, KVH, D);
        ops->attention_backward_at(dql, dkl, dvl, doutl, probsl, ql, k, v, pos, B, Tq, T, H, KVH, D);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < Tq; t++) {
                long local = ((long)b * Tq + t) * row, full = ((long)b * T + pos[t]) * row;
                assert_memory_equal(outl + local, out + full, row * sizeof(float));
                assert_memory_equal(dql + local, dq + full, row * sizeof(float));
                for (int h = 0; h < H; h++)
                    assert_memory_equal(probsl + (((long)b * H + h) * Tq + t) * T,
                                        probs + (((long)b * H + h) * T + pos[t]) * T, T * sizeof(float));
            }
        for (long i = 0; i < nkv; i++) dk_sum[i] += dkl[i], dv_sum[i] += dvl[i];
        free(ql), free(doutl), free(outl), free(probsl), free(dql), free(dkl), free(dvl);
    }
    expect_below(rel_error(dk, dk_sum, nkv), 1e-6, "full dk vs sum of the cp ranks' dk");
    expect_below(rel_error(dv, dv_sum, nkv), 1e-6, "full dv vs sum of the cp ranks' dv");

    free(q), free(k), free(v), free(dout), free(out), free(probs), free(dq), free(dk), free(dv);
    free(dk_sum), free(dv_sum), free(pos);
}

static void test_attention_at_cp_split(void **state) {
    (void)state;
    run_attention_split(2, 2, 8, 4, 2, 8, 45);
    run_attention_split(3, 2, 12, 4, 1, 12, 46);
    run_attention_split(4, 1, 32, 2, 2, 16, 47);
}

/* Identity positions (Tq == Tk, q_pos[t] == t) are the plain ops, bit for bit. */
static void test_attention_at_identity(void **state) {
    (void)state;
    enum { B = 2, T = 13, H = 4, KVH = 2, D = 20 };
    long nq = B * T * H * D, nkv = B * T * KVH * D, np = B * H * T * T;
    Rng rng;
    rng_seed(&rng, 48);
    float *q = rand_floats(&rng, nq, 1.5), *k = rand_floats(&rng, nkv, 1.5), *v = rand_floats(&rng, nkv, 1.0);
    float *dout = rand_floats(&rng, nq, 1.0);
    int32_t pos[T];
    for (int t = 0; t < T; t++) pos[t] = t;
    float *out = zero_floats(nq), *probs = zero_floats(np), *out_at = zero_floats(nq), *probs_at = zero_floats(np);
    ops->attention_forward(out, probs, q, k, v, B, T, H, KVH, D);
    ops->attention_forward_at(out_at, probs_at, q, k, v, pos, B, T, T, H, KVH, D);
    assert_memory_equal(out, out_at, nq * sizeof(float));
    assert_memory_equal(probs, probs_at, np * sizeof(float));

    float *dq = rand_floats(&rng, nq, 1.0), *dk = rand_floats(&rng, nkv, 1.0), *dv = rand_floats(&rng, nkv, 1.0);
    float *dq_at = copy_floats(dq, nq), *dk_at = copy_floats(dk, nkv), *dv_at = copy_floats(dv, nkv);
    ops->attention_backward(dq, dk, dv, dout, probs, q, k, v, B, T, H, KVH, D);
    ops->attention_backward_at(dq_at, dk_at, dv_at, dout, probs, q, k, v, pos, B, T, T, H, KVH, D);
    assert_memory_equal(dq, dq_at, nq * sizeof(float));
    assert_memory_equal(dk, dk_at, nkv * sizeof(float));
    assert_memory_equal(dv, dv_at, nkv * sizeof(float));

    free(q), free(k), free(v), free(dout), free(out), free(probs), free(out_at), free(probs_at);
    free(dq), free(dk), free(dv), free(dq_at), free(dk_at), free(dv_at);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rope_tables_plain),  cmocka_unit_test(test_rope_tables_llama3),
        cmocka_unit_test(test_rope),               cmocka_unit_test(test_attention_gqa),
        cmocka_unit_test(test_attention_mha),      cmocka_unit_test(test_attention_mqa),
        cmocka_unit_test(test_attention_gqa_is_repeated_kv), cmocka_unit_test(test_attention_causal),
        cmocka_unit_test(test_attention_at_reference), cmocka_unit_test(test_attention_at_cp_split),
        cmocka_unit_test(test_attention_at_identity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
