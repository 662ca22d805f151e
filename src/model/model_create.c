/* model_create.c: builds a Model: resolves the config, lays out params and
 * grads from the registry, points per-layer views into them, fills the RoPE
 * tables and allocates every activation buffer once for max_B x max_T. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "model_internal.h"
#include "moe_layer.h"

/* Hands out consecutive pieces of one allocation; with base == NULL it only
 * counts. Pieces are rounded to 16 floats (64 bytes) to keep them aligned. */
typedef struct Carver {
    float *base;
    size_t used;
} Carver;

static float *carve(Carver *c, size_t floats) {
    float *p = c->base ? c->base + c->used : NULL;
    c->used += (floats + 15) & ~(size_t)15;
    return p;
}

static void layout_activations(Carver *c, ModelPriv *pr, const ModelConfig *cfg, size_t B, size_t T) {
    const ModelShape *sh = &pr->shape;
    const size_t N = B * T, C = (size_t)sh->C, I = (size_t)sh->I, V = (size_t)sh->V;
    const size_t H = (size_t)sh->H, KVH = (size_t)sh->KVH, HD = (size_t)sh->HD, KVD = (size_t)sh->KVD;
    const size_t Tall = T * (size_t)sh->cp;      /* keys per sequence */
    const size_t R = (size_t)model_shape_rows(sh, (int)N); /* residual-stream rows */
    const bool sp = sh->sp, cp = sh->cp > 1;
    for (int l = 0; l < sh->L; l++) {
        LayerActs *a = &pr->acts[l];
        a->resid_in = carve(c, R * C);
        a->attn_normed = carve(c, R * C);
        a->attn_rstd = carve(c, R);
        a->attn_in = sp ? carve(c, N * C) : a->attn_normed;
        if (cfg->qk_norm) {
            a->q_pre = carve(c, N * HD);
            a->k_pre = carve(c, N * KVD);
            a->q_rstd = carve(c, N * H);
            a->k_rstd = carve(c, N * KVH);
        }
        a->q = carve(c, N * HD);
        a->k = carve(c, N * KVD);
        a->v = carve(c, N * KVD);
        a->k_all = cp ? carve(c, B * Tall * KVD) : a->k;
        a->v_all = cp ? carve(c, B * Tall * KVD) : a->v;
        a->probs = carve(c, B * H * T * Tall);
        a->attn_out = carve(c, N * HD);
        a->resid_mid = carve(c, R * C);
        a->mlp_normed = carve(c, R * C);
        a->mlp_rstd = carve(c, R);
        a->mlp_in = sp ? carve(c, N * C) : a->mlp_normed;
        if (pr->moe[l]) continue; /* its MLP keeps its own buffers (moe_layer.h) */
        a->gate = carve(c, N * I);
        a->up = carve(c, N * I);
        a->act = carve(c, N * I);
    }
    pr->final_resid = carve(c, R * C);
    for (int v = 0; v < sh->num_chunks; v++)
        pr->chunk_out[v] = v + 1 < sh->num_chunks ? carve(c, R * C) : pr->final_resid;
    pr->proj_out = carve(c, N * C);
    pr->shard = carve(c, R * C);
    if (sh->has_head) {
        pr->final_normed = carve(c, R * C);
        pr->final_rstd = carve(c, R);
        pr->final_in = sp ? carve(c, N * C) : pr->final_normed;
        pr->logits = carve(c, N * V);
        pr->losses = carve(c, N);
    }
    GradScratch *s = &pr->scratch;
    s->d_resid = carve(c, R * C);
    s->d_normed = carve(c, N * C);
    s->d_attn_out = carve(c, N * HD);
    s->d_q = carve(c, N * HD);
    s->d_q2 = carve(c, N * HD);
    s->d_k = carve(c, N * KVD);
    s->d_k2 = carve(c, N * KVD);
    s->d_v = carve(c, N * KVD);
    s->d_k_all = cp ? carve(c, B * Tall * KVD) : NULL;
    s->d_v_all = cp ? carve(c, B * Tall * KVD) : NULL;
    s->d_full = sp ? carve(c, N * C) : NULL;
    s->d_act = carve(c, N * I);
    s->d_gate = carve(c, N * I);
    s->d_up = carve(c, N * I);
}

static float *slot_ptr(const Model *model, float *base, int slot) {
    return slot < 0 ? NULL : base + model->param_info[slot].offset;
}

const ParamInfo *model_embed_param(const Model *model) {
    const int slot = ((const ModelPriv *)model->priv)->slots.embed;
    return slot < 0 ? NULL : &model->param_info[slot];
}

LayerWeights model_layer_view(const Model *model, float *base, int layer) {
    const LayerSlots *s = &((const ModelPriv *)model->priv)->slots.layers[layer];
    LayerWeights w;
    w.attn_norm = slot_ptr(model, base, s->attn_norm);
    w.q_weight = slot_ptr(model, base, s->q_weight);
    w.q_bias = slot_ptr(model, base, s->q_bias);
    w.k_weight = slot_ptr(model, base, s->k_weight);
    w.k_bias = slot_ptr(model, base, s->k_bias);
    w.v_weight = slot_ptr(model, base, s->v_weight);
    w.v_bias = slot_ptr(model, base, s->v_bias);
    w.q_norm = slot_ptr(model, base, s->q_norm);
    w.k_norm = slot_ptr(model, base, s->k_norm);
    w.o_weight = slot_ptr(model, base, s->o_weight);
    w.mlp_norm = slot_ptr(model, base, s->mlp_norm);
    w.gate_weight = slot_ptr(model, base, s->gate_weight);
    w.up_weight = slot_ptr(model, base, s->up_weight);
    w.down_weight = slot_ptr(model, base, s->down_weight);
    w.router = slot_ptr(model, base, s->router);
    w.expert_bias = slot_ptr(model, base, s->expert_bias);
    w.e_gate = slot_ptr(model, base, s->e_gate);
    w.e_up = slot_ptr(model, base, s->e_up);
    w.e_down = slot_ptr(model, base, s->e_down);
    w.s_gate = slot_ptr(model, base, s->s_gate);
    w.s_up = slot_ptr(model, base, s->s_up);
    w.s_down = slot_ptr(model, base, s->s_down);
    return w;
}

/* Layer views, RoPE tables and activation buffers of a model whose
 * registry, params and grads exist. */
static void create_priv(Model *model) {
    const ModelConfig *c = &model->cfg;
    const ModelPartition *part = &model->part;
    const int max_B = model->max_B, max_T = model->max_T;
    ModelPriv *pr = mt_calloc(1, sizeof *pr);
    model->priv = pr;
    pr->shape = model_shape_of(c, part);
    int count;
    long total;
    free(model_registry_build(c, part, &count, &total, &pr->slots)); /* the slots of model->param_info */

    const int L = part->num_layers;
    pr->weights = mt_malloc((size_t)(L > 0 ? L : 1) * sizeof *pr->weights);
    pr->weight_grads = mt_malloc((size_t)(L > 0 ? L : 1) * sizeof *pr->weight_grads);
    for (int l = 0; l < L; l++) {
        pr->weights[l] = model_layer_view(model, model->params, l);
        pr->weight_grads[l] = model_layer_view(model, model->grads, l);
    }
    pr->embed = slot_ptr(model, model->params, pr->slots.embed);
    pr->d_embed = slot_ptr(model, model->grads, pr->slots.embed);
    pr->final_norm = slot_ptr(model, model->params, pr->slots.final_norm);
    pr->d_final_norm = slot_ptr(model, model->grads, pr->slots.final_norm);
    /* Tied embeddings: the lm_head matmul reads embed.weight and its gradient
     * accumulates into embed's gradient. */
    int head = c->tie_word_embeddings ? pr->slots.embed : pr->slots.lm_head;
    pr->lm_head = part->has_head ? slot_ptr(model, model->params, head) : NULL;
    pr->d_lm_head = part->has_head ? slot_ptr(model, model->grads, head) : NULL;

    const size_t rope_rows = (size_t)(max_T > 0 ? max_T : 1) * (c->head_dim / 2);
    pr->rope_cos = mt_malloc(rope_rows * sizeof(float));
    pr->rope_sin = mt_malloc(rope_rows * sizeof(float));
    pr->positions = mt_calloc((size_t)(max_T > 0 ? max_T : 1), sizeof(int32_t));
    model_rope_rows(&pr->shape, c, max_T, pr->rope_cos, pr->rope_sin, pr->positions);
    pr->rope_T = max_T;

    pr->acts = mt_calloc((size_t)(L > 0 ? L : 1), sizeof *pr->acts);
    pr->moe = mt_calloc((size_t)(L > 0 ? L : 1), sizeof *pr->moe);
    for (int v = 0, l = 0; v < part->num_chunks; v++)
        for (int i = 0; i < part->chunk_layers[v]; i++, l++)
            if (model_layer_is_moe(c, part->chunk_first[v] + i) && max_B > 0)
                pr->moe[l] = moe_acts_create(c, part->ep, part->etp, max_B * max_T);
    Carver counter = {NULL, 0};
    layout_activations(&counter, pr, c, (size_t)max_B, (size_t)max_T);
    pr->act_memory = mt_calloc(counter.used ? counter.used : 1, sizeof(float));
    Carver carver = {pr->act_memory, 0};
    layout_activations(&carver, pr, c, (size_t)max_B, (size_t)max_T);

    pr->row_lse = mt_calloc((size_t)max_B * max_T + 1, sizeof(double));
    pr->inputs = mt_calloc((size_t)max_B * max_T + 1, sizeof(int32_t));
    pr->targets = mt_calloc((size_t)max_B * max_T + 1, sizeof(int32_t));
}

Model *model_clone_activations(const Model *base) {
    Model *model = mt_calloc(1, sizeof *model);
    *model = *base;
    model->shares_params = true;
    create_priv(model);
    return model;
}

Model *model_create(const ModelConfig *cfg, const BackendOps *ops, int max_B, int max_T) {
    ModelConfig resolved = model_config_resolve(cfg);
    ModelPartition whole = model_partition_whole(&resolved);
    return model_create_part(&resolved, &whole, ops, max_B, max_T);
}

Model *model_create_part(const ModelConfig *cfg, const ModelPartition *part, const BackendOps *ops, int max_B,
                         int max_T) {
    /* 0 x 0: the registry and the weights only (a GPU run keeps its activations on the device). */
    if (max_B < 0 || max_T < 0 || (max_B == 0) != (max_T == 0))
        mt_die(MT_EXIT_USAGE, "model: micro-batch shape must be positive, found %d x %d", max_B, max_T);
    Model *model = mt_calloc(1, sizeof *model);
    model->cfg = model_config_resolve(cfg);
    const ModelConfig *c = &model->cfg;
    char err[512];
    model->part = *part;
    if (model->part.ep < 1) model->part.ep = 1; /* unset: none */
    if (model->part.etp < 1) model->part.etp = 1;
    if (model_partition_check(c, &model->part, max_T > 0 ? max_T * part->cp : 0, err, sizeof err) != 0)
        mt_die(MT_EXIT_USAGE, "%s", err);
    part = &model->part;
    model->ops = ops;
    model->max_B = max_B;
    model->max_T = max_T;

    model->param_info = model_registry_build(c, part, &model->num_params, &model->num_floats, NULL);
    if (c->family == FAMILY_MIXTRAL || c->family == FAMILY_QWEN3_MOE)
        model->moe_step = moe_step_create(part->num_layers, c->moe.num_experts);
    model->params = mt_calloc((size_t)model->num_floats, sizeof(float));
    model->grads = mt_calloc((size_t)model->num_floats, sizeof(float));
    create_priv(model);
    return model;
}

void model_free(Model *model) {
    if (!model) return;
    ModelPriv *pr = model->priv;
    if (pr) {
        free(pr->slots.layers);
        free(pr->weights);
        free(pr->weight_grads);
        free(pr->rope_cos);
        free(pr->rope_sin);
        free(pr->positions);
        free(pr->row_lse);
        for (int l = 0; l < model->part.num_layers; l++) moe_acts_free(pr->moe[l]);
        free(pr->moe);
        free(pr->acts);
        free(pr->act_memory);
        free(pr->inputs);
        free(pr->targets);
        free(pr);
    }
    if (!model->shares_params) {
        moe_step_free(model->moe_step);
        free(model->param_info);
        free(model->params);
        free(model->grads);
    }
    free(model);
}

void model_zero_grad(Model *model) { memset(model->grads, 0, (size_t)model->num_floats * sizeof(float)); }

const float *model_logits(const Model *model) { return ((const ModelPriv *)model->priv)->logits; }

void model_copy_block(const ParamInfo *p, float *block, float *whole, bool to_block) {
    const long G1 = p->global_shape[1], G2 = p->global_shape[2];
    if (p->ndim < 3) { /* rows of shape[1] */
        for (long i0 = 0; i0 < p->shape[0]; i0++) {
            float *b = block + i0 * p->shape[1], *w = whole + (p->global_start[0] + i0) * G1 + p->global_start[1];
            memcpy(to_block ? b : w, to_block ? w : b, (size_t)p->shape[1] * sizeof(float));
        }
        return;
    }
    for (long i0 = 0; i0 < p->shape[0]; i0++)
        for (long i1 = 0; i1 < p->shape[1]; i1++) { /* the last dim is contiguous in both */
            float *b = block + (i0 * p->shape[1] + i1) * p->shape[2];
            float *w = whole + ((p->global_start[0] + i0) * G1 + p->global_start[1] + i1) * G2 + p->global_start[2];
            memcpy(to_block ? b : w, to_block ? w : b, (size_t)p->shape[2] * sizeof(float));
        }
}
