/* model_fp8.c: the products of the linear layers (model_fp8.h). Without
 * FP8 each part is the backend's matmul, as before. With precision: fp8
 * each group is computed as Hopper's FP8 product computes it, exactly
 * emulated in fp32 (Transformer Engine's tensorwise current scaling; the
 * fp32 value of every FP8 code is exact, fp8.h):
 *
 *   forward:  sx = scale(amax(x)), sw = scale(max_i amax(W_i))           E4M3
 *             xq = fp8(x * sx), Wq_i = fp8(W_i * sw)
 *             out_i = (xq Wq_i^T) * ((1/sx) * (1/sw)) + b_i                fp32 accumulation, one rescale
 *   backward: sg = scale(max_i amax(dout_i))                             fp8.grad_format (E5M2: HYBRID)
 *             gq_i = fp8(dout_i * sg)
 *             dx += sum_i (gq_i Wq_i) * ((1/sg) * (1/sw))
 *             dW_i += (gq_i^T xq) * ((1/sg) * (1/sx));  db_i += sum_n dout_i   (from the unquantised dout)
 *
 * scale(amax) = fp8_max / amax / 2^margin (fp8_scaling.h). With
 * fp8.recipe delayed, each scale is instead the one its tensor's amax history
 * gives this step (model_fp8_state.c), and each amax (this rank's) is
 * recorded for the step's end. Tensorwise, each amax is the
 * max over the tp and cp groups (a weight shard, a head-split activation or
 * a rank's tokens of the sequence): every rank casts with the scale one
 * rank would use, so every layout computes the one-rank numbers. The
 * forward's sx and sw are kept per activation set for its backward (a
 * recomputed forward computes the same ones). The embedding, norms,
 * attention, lm_head and loss stay in fp32 (docs/fp8.md says why).
 * The MoE experts' products (moe_dispatch.c) use the same pieces with
 * their own per-expert scales: linear_group_product_forward / _backward
 * run one group's product once its scales are known. */
#include "model_fp8.h"

#include <math.h>

#include "../core/error.h"
#include "../core/fp8.h"
#include "../dist/comm.h"
#include "fp8_scaling.h"

/* The max of v over a group (NaN if any rank's is): the same on every rank. */
static float group_max(const Comm *c, float v) {
    comm_all_reduce_max_float(c, &v, 1);
    return v;
}

/* The amax of n values as one rank of the whole model sees it: over tp and cp. */
static float model_amax(const Model *m, const float *x, long n) {
    float a = fp8_amax(x, n);
    model_fp8_amax_reduce(m, &a, 1, true);
    return a;
}

static float cast_scale(const Model *m, float amax, Fp8Format format) {
    return fp8_scale_from_amax(amax, fp8_max(format), m->fp8.margin, 1.0f);
}

/* Scratch of at least n floats (grown, kept in priv). */
static float *scratch(float **buf, size_t *cap, size_t n) { return *buf = mt_grow(*buf, cap, n, sizeof(float)); }

/* out[i] = a[i] * scale + (bias of its column) over N rows of OC. */
static void rescale_rows(float *out, int N, int OC, float scale, const float *bias) {
    for (long r = 0; r < N; r++)
        for (int o = 0; o < OC; o++) out[r * OC + o] = out[r * OC + o] * scale + (bias ? bias[o] : 0.0f);
}

static void axpy(float *y, const float *x, float a, long n) {
    for (long i = 0; i < n; i++) y[i] += x[i] * a;
}

/* The parts' matmuls with the given scales (model_fp8.h): a group's FP8 product once its scales are known. */
void linear_group_product_forward(Model *m, const float *x, int N, int IC, const LinearPart *parts, int count,
                                  float sx, float sw) {
    const BackendOps *ops = m->ops;
    if (!m->fp8_on) {
        for (int i = 0; i < count; i++) ops->matmul_forward(parts[i].out, x, parts[i].weight, parts[i].bias, N, IC,
                                                            parts[i].OC);
        return;
    }
    ModelPriv *pr = m->priv;
    float *xq = scratch(&pr->fp8_x, &pr->fp8_x_cap, (size_t)N * IC);
    fp8_quantize(xq, x, (long)N * IC, sx, FP8_E4M3);
    const float alpha = (1.0f / sx) * (1.0f / sw);
    for (int i = 0; i < count; i++) {
        const LinearPart *p = &parts[i];
        float *wq = scratch(&pr->fp8_w, &pr->fp8_w_cap, (size_t)p->OC * IC);
        fp8_quantize(wq, p->weight, (long)p->OC * IC, sw, FP8_E4M3);
        ops->matmul_forward(p->out, xq, wq, NULL, N, IC, p->OC);
        rescale_rows(p->out, N, p->OC, alpha, p->bias);
    }
}

void linear_group_product_backward(Model *m, float *dx, const float *x, int N, int IC, const LinearPart *parts,
                                   int count, float sx, float sw, float sg) {
    const BackendOps *ops = m->ops;
    if (!m->fp8_on) {
        for (int i = 0; i < count; i++)
            ops->matmul_backward(dx, parts[i].dweight, parts[i].dbias, parts[i].dout, x, parts[i].weight, N, IC,
                                 parts[i].OC);
        return;
    }
    ModelPriv *pr = m->priv;
    const Fp8Format gf = m->fp8.grad_format;
    float *xq = scratch(&pr->fp8_x, &pr->fp8_x_cap, (size_t)N * IC);
    fp8_quantize(xq, x, (long)N * IC, sx, FP8_E4M3);
    float *dx_part = scratch(&pr->fp8_dx, &pr->fp8_dx_cap, (size_t)N * IC);
    const float alpha_dx = (1.0f / sg) * (1.0f / sw), alpha_dw = (1.0f / sg) * (1.0f / sx);
    for (int i = 0; i < count; i++) {
        const LinearPart *p = &parts[i];
        const long nw = (long)p->OC * IC, ng = (long)N * p->OC;
        float *wq = scratch(&pr->fp8_w, &pr->fp8_w_cap, (size_t)nw);
        fp8_quantize(wq, p->weight, nw, sw, FP8_E4M3);
        float *gq = scratch(&pr->fp8_g, &pr->fp8_g_cap, (size_t)ng);
        fp8_quantize(gq, p->dout, ng, sg, gf);
        float *dw_part = p->dweight ? scratch(&pr->fp8_dw, &pr->fp8_dw_cap, (size_t)nw) : NULL;
        for (long k = 0; k < (long)N * IC; k++) dx_part[k] = 0.0f;
        for (long k = 0; dw_part && k < nw; k++) dw_part[k] = 0.0f;
        ops->matmul_backward(dx ? dx_part : NULL, dw_part, NULL, gq, xq, wq, N, IC, p->OC);
        if (dx) axpy(dx, dx_part, alpha_dx, (long)N * IC);
        if (dw_part) axpy(p->dweight, dw_part, alpha_dw, nw);
        if (p->dbias) ops->matmul_backward(NULL, NULL, p->dbias, p->dout, x, p->weight, N, IC, p->OC);
    }
}

float linear_group_weight_amax(const LinearPart *parts, int count, int IC) {
    float wmax = 0.0f;
    for (int i = 0; i < count; i++) wmax = fmaxf(wmax, fp8_amax(parts[i].weight, (long)parts[i].OC * IC));
    return wmax;
}

float linear_group_grad_amax(const LinearPart *parts, int count, int N) {
    float gmax = 0.0f;
    for (int i = 0; i < count; i++) gmax = fmaxf(gmax, fp8_amax(parts[i].dout, (long)N * parts[i].OC));
    return gmax;
}

void model_fp8_amax_reduce(const Model *m, float *amax, int n, bool over_tp) {
    if (over_tp && m->part.tp > 1) comm_all_reduce_max_float(m->part.tp_comm, amax, (size_t)n);
    if (m->part.cp > 1) comm_all_reduce_max_float(m->part.cp_comm, amax, (size_t)n);
}

float model_fp8_scale(const Model *m, float amax, Fp8Format format) { return cast_scale(m, amax, format); }

void linear_group_forward(Model *m, int l, LinearGroup group, const float *x, int N, int IC, const LinearPart *parts,
                          int count) {
    if (!m->fp8_on) {
        linear_group_product_forward(m, x, N, IC, parts, count, 1.0f, 1.0f);
        return;
    }
    ModelPriv *pr = m->priv;
    float wmax = linear_group_weight_amax(parts, count, IC), sx, sw;
    if (m->fp8_state) { /* delayed: this step's scales; the amaxes are recorded for the step's end */
        fp8_state_record(m, l, group, FP8_INPUT, fp8_amax(x, (long)N * IC));
        fp8_state_record(m, l, group, FP8_WEIGHT, wmax);
        sx = fp8_state_scale(m, l, group, FP8_INPUT);
        sw = fp8_state_scale(m, l, group, FP8_WEIGHT);
    } else {
        if (m->part.tp > 1) wmax = group_max(m->part.tp_comm, wmax); /* weights are split over tp only */
        sx = cast_scale(m, model_amax(m, x, (long)N * IC), FP8_E4M3);
        sw = cast_scale(m, wmax, FP8_E4M3);
    }
    pr->fp8_scales[l][group][0] = sx;
    pr->fp8_scales[l][group][1] = sw;
    linear_group_product_forward(m, x, N, IC, parts, count, sx, sw);
}

void linear_group_backward(Model *m, int l, LinearGroup group, float *dx, const float *x, int N, int IC,
                           const LinearPart *parts, int count) {
    if (!m->fp8_on) {
        linear_group_product_backward(m, dx, x, N, IC, parts, count, 1.0f, 1.0f, 1.0f);
        return;
    }
    ModelPriv *pr = m->priv;
    const float sx = pr->fp8_scales[l][group][0], sw = pr->fp8_scales[l][group][1];
    float gmax = linear_group_grad_amax(parts, count, N), sg;
    if (m->fp8_state) {
        const float dp = fp8_grad_divisor(m); /* its casts see the gradients as one rank would */
        fp8_state_record(m, l, group, FP8_GRAD, gmax / dp);
        sg = fp8_state_scale(m, l, group, FP8_GRAD) / dp;
    } else {
        model_fp8_amax_reduce(m, &gmax, 1, true);
        sg = cast_scale(m, gmax, m->fp8.grad_format);
    }
    linear_group_product_backward(m, dx, x, N, IC, parts, count, sx, sw, sg);
}

/* Exact where dp is a power of 2. Tensorwise scaling needs no divisor: a power-of-2 factor cancels in fmax / amax. */
float fp8_grad_divisor(const Model *m) {
    return m->fp8_state && m->part.dp_comm ? (float)m->part.dp_comm->size : 1.0f;
}

void model_set_fp8(Model *model, const Fp8Config *cfg) {
    model->fp8_on = cfg != NULL;
    if (cfg) model->fp8 = *cfg;
    fp8_state_free(model->fp8_state);
    model->fp8_state = cfg && cfg->recipe == FP8_RECIPE_DELAYED ? fp8_state_create(model, cfg->amax_history_len) : NULL;
}
