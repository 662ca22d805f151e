/* model_fp8_state.c: the delayed-scaling state of the model's FP8 casts
 * (fp8.recipe: delayed; the math of one tensor is in fp8_scaling.h).
 *
 * Every layer has FP8_LAYER_TENSORS cast tensors: for each product group
 * (q|k|v, o, gate|up, down, LinearGroup order; in a MoE layer gate|up and down
 * are the shared expert's) its input, its weights and the gradient of its
 * output (Fp8Operand order); in a MoE model, then, for every routed expert e
 * (its index in the whole model) the same three for its gate|up and for its
 * down (FP8_EXPERT_TENSORS each). Each has a scale and an amax history of
 * fp8.amax_history_len. A step runs:
 *
 *   step begin:  recorded[t] = 0 for every tensor t
 *   each cast:   q = fp8(x * scale[t]);  recorded[t] = max(recorded[t], amax(x))     (this rank's x only)
 *   step end:    a[t] = max of recorded[t] over the tp, cp and dp groups      (one collective for all t)
 *                fp8_history_update(history[t], a[t]): the scale of the next step's casts
 *
 * So the scales change once per optimizer step, from the amaxes of all the
 * step's micro-batches on every rank: every layout (tp, sp, cp, pp, vpp, dp,
 * ep, etp, gradient accumulation) casts with the scales one rank would use,
 * and a recomputed forward casts as its forward did. (An expert's amax is
 * recorded by the ranks that hold it, 0 elsewhere: the max over dp, which
 * holds the ep group, is the expert's.) Transformer Engine updates at
 * the end of each autocast region (a micro-batch's forward, and its
 * backward), which makes the scales depend on how the global batch is cut
 * into micro-batches; docs/fp8.md says why megatrain does not.
 *
 * The state is shared by the base model and its clones (the pipeline's
 * activation sets) and checkpointed as two tensors per layer, named by the
 * layer's index in the whole model (docs/fp8.md, "Checkpoints"):
 *   fp8.layers.{i}.amax_history  (K, len)     K = FP8_LAYER_TENSORS + FP8_EXPERT_TENSORS * experts
 *   fp8.layers.{i}.scale         (K)
 * replicated over tp, cp and dp (every rank holds the same after step end). */
#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../dist/comm.h"
#include "fp8_scaling.h"
#include "model_fp8.h"

struct Fp8State {
    int num_layers, len;
    int K;            /* tensors per layer: FP8_LAYER_TENSORS + FP8_EXPERT_TENSORS * (the model's routed experts) */
    float *data;      /* history (L, K, len) | scale (L, K): the checkpointed block */
    float *history, *scale;
    float *recorded;  /* (L, K) this rank's largest amax of each tensor this step */
    ParamInfo *info;  /* 2 per layer: its history and its scales, offsets into data */
};

/* The index in the whole model of this rank's layer l. */
static int global_layer(const Model *m, int l) {
    for (int v = 0; v < m->part.num_chunks; v++) {
        if (l < m->part.chunk_layers[v]) return m->part.chunk_first[v] + l;
        l -= m->part.chunk_layers[v];
    }
    return -1;
}

static void describe(ParamInfo *p, int ndim, long rows, long cols, size_t offset, const char *name, int layer) {
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "fp8.layers.%d.%s", layer, name);
    p->ndim = ndim;
    p->shape[0] = p->global_shape[0] = rows;
    p->shape[1] = p->global_shape[1] = ndim > 1 ? cols : 1;
    p->shape[2] = p->global_shape[2] = 1;
    p->numel = rows * (ndim > 1 ? cols : 1);
    p->offset = offset;
    p->global_index = -1;
    p->no_decay = true;
    p->frozen = true;
}

/* The routed experts of the model (0 without MoE layers). */
static int model_experts(const Model *m) {
    for (int layer = 0; layer < m->cfg.num_layers; layer++)
        if (model_layer_is_moe(&m->cfg, layer)) return m->cfg.moe.num_experts;
    return 0;
}

Fp8State *fp8_state_create(const Model *m, int len) {
    Fp8State *s = mt_calloc(1, sizeof *s);
    const int L = m->part.num_layers, K = FP8_LAYER_TENSORS + FP8_EXPERT_TENSORS * model_experts(m);
    s->K = K;
    s->num_layers = L;
    s->len = len;
    const size_t hist = (size_t)L * K * (size_t)len;
    s->data = mt_calloc(hist + (size_t)L * K + 1, sizeof(float));
    s->history = s->data;
    s->scale = s->data + hist;
    for (size_t i = 0; i < (size_t)L * K; i++) s->scale[i] = 1.0f; /* TE's initial state: scale 1, amaxes 0 */
    s->recorded = mt_calloc((size_t)L * K + 1, sizeof(float));
    s->info = mt_calloc((size_t)(2 * L + 1), sizeof *s->info);
    for (int l = 0; l < L; l++) {
        const int layer = global_layer(m, l);
        describe(&s->info[2 * l], 2, K, len, (size_t)l * K * (size_t)len, "amax_history", layer);
        describe(&s->info[2 * l + 1], 1, K, 1, hist + (size_t)l * K, "scale", layer);
        /* replicated over tp, cp and dp: tp rank 0 of the writers writes it (as a norm weight) */
        s->info[2 * l].norm_owner = s->info[2 * l + 1].norm_owner = m->part.tp_rank == 0;
    }
    return s;
}

void fp8_state_free(Fp8State *s) {
    if (!s) return;
    free(s->data);
    free(s->recorded);
    free(s->info);
    free(s);
}

/* A tensor's index: of a group (expert < 0) or of routed expert `expert`'s product `group` (0 gate|up, 1 down). */
static size_t tensor_index(const Fp8State *s, int l, int expert, int group, Fp8Operand operand) {
    const size_t row = expert < 0 ? (size_t)group * FP8_OPERANDS
                                  : FP8_LAYER_TENSORS + (size_t)expert * FP8_EXPERT_TENSORS + (size_t)group * FP8_OPERANDS;
    return (size_t)l * (size_t)s->K + row + (size_t)operand;
}

/* the largest magnitude the tensor's casts saw (fp8_amax skips NaNs, as TE's amax kernels do) */
static void record(float *r, float amax) { *r = fmaxf(*r, amax); }

float fp8_state_scale(const Model *m, int l, LinearGroup group, Fp8Operand operand) {
    return m->fp8_state->scale[tensor_index(m->fp8_state, l, -1, group, operand)];
}

void fp8_state_record(Model *m, int l, LinearGroup group, Fp8Operand operand, float amax) {
    record(&m->fp8_state->recorded[tensor_index(m->fp8_state, l, -1, group, operand)], amax);
}

float fp8_state_expert_scale(const Model *m, int l, int expert, int product, Fp8Operand operand) {
    return m->fp8_state->scale[tensor_index(m->fp8_state, l, expert, product, operand)];
}

void fp8_state_expert_record(Model *m, int l, int expert, int product, Fp8Operand operand, float amax) {
    record(&m->fp8_state->recorded[tensor_index(m->fp8_state, l, expert, product, operand)], amax);
}

void model_fp8_step_begin(Model *m) {
    Fp8State *s = m->fp8_state;
    if (s) memset(s->recorded, 0, (size_t)s->num_layers * (size_t)s->K * sizeof(float));
}

/* The format a tensor of the state casts to: the gradients' fp8.grad_format, E4M3 otherwise. */
static Fp8Format tensor_format(size_t t, const Fp8Config *cfg) {
    return t % FP8_OPERANDS == FP8_GRAD ? cfg->grad_format : FP8_E4M3;
}

void model_fp8_step_end(Model *m, const Comm *dp) {
    Fp8State *s = m->fp8_state;
    if (!s) return;
    const size_t n = (size_t)s->num_layers * (size_t)s->K;
    model_fp8_amax_reduce(m, s->recorded, (int)n, true);
    if (dp) comm_all_reduce_max_float(dp, s->recorded, n);
    for (size_t t = 0; t < n; t++) {
        Fp8History h = {.amax = s->history + t * (size_t)s->len, .len = s->len, .scale = s->scale[t]};
        fp8_history_update(&h, s->recorded[t], &m->fp8, fp8_max(tensor_format(t, &m->fp8)));
        s->scale[t] = h.scale;
        s->recorded[t] = 0.0f;
    }
}

/* Whether tensor t's history holds no amax (never cast in its window, or a history of length 1). */
static bool history_empty(const Fp8State *s, size_t t) {
    for (int i = 0; i < s->len; i++)
        if (s->history[t * (size_t)s->len + (size_t)i] != 0.0f) return false;
    return true;
}

int model_fp8_rescale(Model *m, const Fp8Config *from) {
    Fp8State *s = m->fp8_state;
    if (!s) return 0;
    const size_t n = (size_t)s->num_layers * (size_t)s->K;
    int changed = 0;
    for (size_t t = 0; t < n; t++) {
        /* a power of two: 57344 / 448 = 2^7, and the margins' 2^-margin */
        const float factor = fp8_max(tensor_format(t, &m->fp8)) / fp8_max(tensor_format(t, from)) *
                             ldexpf(1.0f, from->margin - m->fp8.margin);
        float *scale = &s->scale[t];
        /* TE's initial scale, kept while no amax came (the new settings would keep it too); FLT_MAX: an amax so
         * small that fmax / amax overflowed, as it does under either setting */
        if (factor == 1.0f || *scale == FLT_MAX || (*scale == 1.0f && history_empty(s, t))) continue;
        *scale *= factor;
        if (isinf(*scale)) *scale = FLT_MAX;
        changed++;
    }
    return changed;
}

ModelExtraState model_extra_state(const Model *m) {
    const Fp8State *s = m->fp8_state;
    if (!s) return (ModelExtraState){0};
    return (ModelExtraState){.info = s->info, .count = 2 * s->num_layers, .data = s->data,
                             .num_floats = (long)s->num_layers * s->K * (s->len + 1)};
}

bool model_is_extra_state(const char *name) { return strncmp(name, "fp8.", 4) == 0; }
