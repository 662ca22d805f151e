/* model_create.c: builds a Model: resolves the config, lays out params and
 * grads from the registry, points per-layer views into them, fills the RoPE
 * tables and allocates every activation buffer once for max_B x max_T. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "model_fp8.h"
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

/* What a recompute mode does not keep per layer: the attention core
 * (probabilities, output, and under context parallel the gathered keys and
 * values), the SwiGLU activation, and (full) all the rest but the input. */
typedef struct Recomputed {
    bool core, swiglu, rest;
} Recomputed;

static Recomputed recomputed_of(Recompute mode) {
    return (Recomputed){.core = mode != RECOMPUTE_NONE, .swiglu = mode != RECOMPUTE_NONE,
                        .rest = mode == RECOMPUTE_FULL};
}

/* One buffer of a layer: carved when the layer keeps it, else the working
 * set's. Building the working set itself (build): carved when recomputed,
 * else NULL. */
static float *piece(Carver *c, size_t floats, bool recomputed, bool build, float *work_buf) {
    if (build) return recomputed ? carve(c, floats) : NULL;
    return recomputed ? work_buf : carve(c, floats);
}

/* A layer's activation buffers (build: the working set's, into pr->work).
 * mlp: the dense MLP's gate/up/act too (a MoE layer's MLP keeps its own, moe_layer.h). */
static void carve_layer(Carver *c, ModelPriv *pr, LayerActs *a, bool build, Recomputed r, bool qk_norm, bool mlp,
                        size_t B, size_t T) {
    const ModelShape *sh = &pr->shape;
    const LayerActs *w = &pr->work;
    const size_t N = B * T, C = (size_t)sh->C, I = (size_t)sh->I;
    const size_t H = (size_t)sh->H, KVH = (size_t)sh->KVH, HD = (size_t)sh->HD, KVD = (size_t)sh->KVD;
    const size_t Tall = T * (size_t)sh->cp;      /* keys per sequence */
    const size_t R = (size_t)model_shape_rows(sh, (int)N); /* residual-stream rows */
    const bool sp = sh->sp, cp = sh->cp > 1;
#define PIECE(field, floats, recomputed) a->field = piece(c, (floats), (recomputed), build, w->field)
#define PIECE_OR(cond, field, floats, recomputed, otherwise) a->field = (cond) ? piece(c, (floats), (recomputed), build, w->field) : (otherwise)
    PIECE(resid_in, R * C, false);
    PIECE(attn_normed, R * C, r.rest);
    PIECE(attn_rstd, R, r.rest);
    PIECE_OR(sp, attn_in, N * C, r.rest, a->attn_normed);
    if (qk_norm) {
        PIECE(q_pre, N * HD, r.rest);
        PIECE(k_pre, N * KVD, r.rest);
        PIECE(q_rstd, N * H, r.rest);
        PIECE(k_rstd, N * KVH, r.rest);
    }
    PIECE(q, N * HD, r.rest);
    PIECE(k, N * KVD, r.rest);
    PIECE(v, N * KVD, r.rest);
    PIECE_OR(cp, k_all, B * Tall * KVD, r.core, a->k);
    PIECE_OR(cp, v_all, B * Tall * KVD, r.core, a->v);
    PIECE(probs, B * H * T * Tall, r.core);
    PIECE(attn_out, N * HD, r.core);
    PIECE(resid_mid, R * C, r.rest);
    PIECE(mlp_normed, R * C, r.rest);
    PIECE(mlp_rstd, R, r.rest);
    PIECE_OR(sp, mlp_in, N * C, r.rest, a->mlp_normed);
    if (!mlp) return;
    PIECE(gate, N * I, r.rest);
    PIECE(up, N * I, r.rest);
    PIECE(act, N * I, r.swiglu);
#undef PIECE
#undef PIECE_OR
}

/* Every activation buffer of one set into c; with work != NULL (the base
 * model of a recompute mode) first the working set into work. */
static void layout_activations(Carver *c, Carver *work, ModelPriv *pr, const ModelConfig *cfg, Recompute mode,
                               size_t B, size_t T) {
    const ModelShape *sh = &pr->shape;
    const size_t N = B * T, C = (size_t)sh->C, I = (size_t)sh->I, V = (size_t)sh->V;
    const size_t HD = (size_t)sh->HD, KVD = (size_t)sh->KVD;
    const size_t Tall = T * (size_t)sh->cp;      /* keys per sequence */
    const size_t R = (size_t)model_shape_rows(sh, (int)N); /* residual-stream rows */
    const bool sp = sh->sp, cp = sh->cp > 1;
    const Recomputed r = recomputed_of(mode);
    if (work) {
        bool any_dense = false;
        for (int l = 0; l < sh->L; l++) any_dense = any_dense || !pr->moe[l];
        carve_layer(work, pr, &pr->work, true, r, cfg->qk_norm, any_dense, B, T);
        pr->recompute_out = mode == RECOMPUTE_FULL ? carve(work, R * C) : NULL;
    }
    for (int l = 0; l < sh->L; l++) carve_layer(c, pr, &pr->acts[l], false, r, cfg->qk_norm, !pr->moe[l], B, T);
    /* LoRA: each adapter's A x, kept per layer in every recompute mode (rank floats per token) */
    const size_t rank = cfg->peft.type == PEFT_LORA ? (size_t)cfg->peft.rank : 0;
    for (int l = 0; l < sh->L; l++)
        for (int t = 0; t < LORA_NUM_TARGETS; t++)
            pr->acts[l].lora_h[t] = pr->slots.layers[l].lora_a[t] >= 0 ? carve(c, N * rank) : NULL;
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
    s->lora_dh = rank ? carve(c, N * rank) : NULL;
    s->lora_dh_part = rank ? carve(c, N * rank / (size_t)sh->tp) : NULL;
    pr->lora_part = rank ? carve(c, N * rank / (size_t)sh->tp) : NULL;
}

/* A parameter's values, or (grads) its gradient: NULL for no parameter or a frozen one's gradient. */
static float *slot_ptr(const Model *model, bool grads, int slot) {
    if (slot < 0) return NULL;
    const ParamInfo *p = &model->param_info[slot];
    return grads ? model_grad_of(model, p) : model->params + p->offset;
}

const ParamInfo *model_embed_param(const Model *model) {
    const int slot = ((const ModelPriv *)model->priv)->slots.embed;
    return slot < 0 ? NULL : &model->param_info[slot];
}

LayerWeights model_layer_view(const Model *model, bool grads, int layer) {
    const LayerSlots *s = &((const ModelPriv *)model->priv)->slots.layers[layer];
    LayerWeights w;
    for (int t = 0; t < LORA_NUM_TARGETS; t++) {
        w.lora_a[t] = slot_ptr(model, grads, s->lora_a[t]);
        w.lora_b[t] = slot_ptr(model, grads, s->lora_b[t]);
    }
    w.attn_norm = slot_ptr(model, grads, s->attn_norm);
    w.q_weight = slot_ptr(model, grads, s->q_weight);
    w.q_bias = slot_ptr(model, grads, s->q_bias);
    w.k_weight = slot_ptr(model, grads, s->k_weight);
    w.k_bias = slot_ptr(model, grads, s->k_bias);
    w.v_weight = slot_ptr(model, grads, s->v_weight);
    w.v_bias = slot_ptr(model, grads, s->v_bias);
    w.q_norm = slot_ptr(model, grads, s->q_norm);
    w.k_norm = slot_ptr(model, grads, s->k_norm);
    w.o_weight = slot_ptr(model, grads, s->o_weight);
    w.mlp_norm = slot_ptr(model, grads, s->mlp_norm);
    w.gate_weight = slot_ptr(model, grads, s->gate_weight);
    w.up_weight = slot_ptr(model, grads, s->up_weight);
    w.down_weight = slot_ptr(model, grads, s->down_weight);
    w.router = slot_ptr(model, grads, s->router);
    w.expert_bias = slot_ptr(model, grads, s->expert_bias);
    w.e_gate = slot_ptr(model, grads, s->e_gate);
    w.e_up = slot_ptr(model, grads, s->e_up);
    w.e_down = slot_ptr(model, grads, s->e_down);
    w.s_gate = slot_ptr(model, grads, s->s_gate);
    w.s_up = slot_ptr(model, grads, s->s_up);
    w.s_down = slot_ptr(model, grads, s->s_down);
    return w;
}

/* Layer views, RoPE tables and activation buffers of a model whose
 * registry, params and grads exist; a clone (base != NULL) shares base's
 * recompute working set. */
static void create_priv(Model *model, const ModelPriv *base) {
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
    pr->fp8_scales = mt_calloc((size_t)(L > 0 ? L : 1), sizeof *pr->fp8_scales);
    pr->weight_grads = mt_malloc((size_t)(L > 0 ? L : 1) * sizeof *pr->weight_grads);
    for (int l = 0; l < L; l++) {
        pr->weights[l] = model_layer_view(model, false, l);
        pr->weight_grads[l] = model_layer_view(model, true, l);
    }
    pr->embed = slot_ptr(model, false, pr->slots.embed);
    pr->d_embed = slot_ptr(model, true, pr->slots.embed);
    pr->final_norm = slot_ptr(model, false, pr->slots.final_norm);
    pr->d_final_norm = slot_ptr(model, true, pr->slots.final_norm);
    /* Tied embeddings: the lm_head matmul reads embed.weight and its gradient
     * accumulates into embed's gradient. */
    int head = c->tie_word_embeddings ? pr->slots.embed : pr->slots.lm_head;
    pr->lm_head = part->has_head ? slot_ptr(model, false, head) : NULL;
    pr->d_lm_head = part->has_head ? slot_ptr(model, true, head) : NULL;

    const size_t rope_rows = (size_t)(max_T > 0 ? max_T : 1) * (c->head_dim / 2);
    pr->rope_cos = mt_malloc(rope_rows * sizeof(float));
    pr->rope_sin = mt_malloc(rope_rows * sizeof(float));
    pr->positions = mt_calloc((size_t)(max_T > 0 ? max_T : 1), sizeof(int32_t));
    model_rope_rows(&pr->shape, c, max_T, pr->rope_cos, pr->rope_sin, pr->positions);
    pr->rope_T = max_T;

    const Recompute mode = model->recompute;
    pr->owns_work = mode != RECOMPUTE_NONE && !base;
    if (base) { /* the base's working set */
        pr->work = base->work;
        pr->work_memory = base->work_memory;
        pr->moe_work = base->moe_work;
        pr->recompute_out = base->recompute_out;
    }
    pr->acts = mt_calloc((size_t)(L > 0 ? L : 1), sizeof *pr->acts);
    pr->moe = mt_calloc((size_t)(L > 0 ? L : 1), sizeof *pr->moe);
    pr->moe_balance = mt_calloc((size_t)(L > 0 ? L : 1), sizeof *pr->moe_balance);
    for (int v = 0, l = 0; v < part->num_chunks; v++)
        for (int i = 0; i < part->chunk_layers[v]; i++, l++) {
            if (!model_layer_is_moe(c, part->chunk_first[v] + i) || max_B == 0) continue;
            moe_balance_init(&pr->moe_balance[l], c->moe.num_experts);
            if (mode != RECOMPUTE_FULL) {
                pr->moe[l] = moe_acts_create(c, part->ep, part->etp, max_B * max_T);
                continue;
            }
            /* full: every MoE layer of every activation set recomputes into the one working MoeActs */
            if (pr->owns_work && !pr->moe_work) pr->moe_work = moe_acts_create(c, part->ep, part->etp, max_B * max_T);
            pr->moe[l] = pr->moe_work;
        }
    Carver counter = {NULL, 0}, work_counter = {NULL, 0};
    layout_activations(&counter, pr->owns_work ? &work_counter : NULL, pr, c, mode, (size_t)max_B, (size_t)max_T);
    pr->act_floats = counter.used;
    pr->act_memory = mt_calloc(counter.used ? counter.used : 1, sizeof(float));
    if (pr->owns_work) {
        pr->work_floats = work_counter.used;
        pr->work_memory = mt_calloc(work_counter.used ? work_counter.used : 1, sizeof(float));
    }
    Carver carver = {pr->act_memory, 0}, work_carver = {pr->work_memory, 0};
    layout_activations(&carver, pr->owns_work ? &work_carver : NULL, pr, c, mode, (size_t)max_B, (size_t)max_T);

    pr->row_lse = mt_calloc((size_t)max_B * max_T + 1, sizeof(double));
    pr->inputs = mt_calloc((size_t)max_B * max_T + 1, sizeof(int32_t));
    pr->targets = mt_calloc((size_t)max_B * max_T + 1, sizeof(int32_t));
}

Model *model_clone_activations(const Model *base) {
    Model *model = mt_calloc(1, sizeof *model);
    *model = *base;
    model->shares_params = true;
    create_priv(model, base->priv);
    return model;
}

Model *model_create(const ModelConfig *cfg, const BackendOps *ops, int max_B, int max_T) {
    ModelConfig resolved = model_config_resolve(cfg);
    ModelPartition whole = model_partition_whole(&resolved);
    return model_create_part(&resolved, &whole, ops, max_B, max_T);
}

Model *model_create_part(const ModelConfig *cfg, const ModelPartition *part, const BackendOps *ops, int max_B,
                         int max_T) {
    return model_create_recompute(cfg, part, ops, max_B, max_T, RECOMPUTE_NONE);
}

Model *model_create_recompute(const ModelConfig *cfg, const ModelPartition *part, const BackendOps *ops, int max_B,
                              int max_T, Recompute recompute) {
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
    model->recompute = recompute;

    model->param_info = model_registry_build(c, part, &model->num_params, &model->num_floats, NULL);
    if (model_family_is_moe(c->family))
        model->moe_step = moe_step_create(part->num_layers, c->moe.num_experts);
    model->loss_tokens = mt_calloc(1, sizeof *model->loss_tokens);
    model->params = mt_calloc((size_t)model->num_floats, sizeof(float));
    /* gradients of the trainable parameters only (LoRA: the adapters, declared last) */
    model->trainable_offset = registry_trainable_offset(model->param_info, model->num_params, model->num_floats);
    model->num_grad_floats = model->num_floats - model->trainable_offset;
    model->grads = mt_calloc((size_t)(model->num_grad_floats > 0 ? model->num_grad_floats : 1), sizeof(float));
    create_priv(model, NULL);
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
        free(pr->packed_pos);
        free(pr->token_pad);
        free(pr->packed_cos);
        free(pr->packed_sin);
        free(pr->seq_cos);
        free(pr->seq_sin);
        free(pr->fp8_scales);
        free(pr->fp8_x), free(pr->fp8_w), free(pr->fp8_g), free(pr->fp8_dx), free(pr->fp8_dw);
        free(pr->row_lse);
        for (int l = 0; l < model->part.num_layers; l++) {
            if (pr->moe[l] != pr->moe_work) moe_acts_free(pr->moe[l]);
            moe_balance_free(&pr->moe_balance[l]);
        }
        if (pr->owns_work) {
            moe_acts_free(pr->moe_work);
            free(pr->work_memory);
        }
        free(pr->moe);
        free(pr->moe_balance);
        free(pr->acts);
        free(pr->act_memory);
        free(pr->inputs);
        free(pr->targets);
        free(pr);
    }
    if (!model->shares_params) {
        moe_step_free(model->moe_step);
        fp8_state_free(model->fp8_state);
        free(model->loss_tokens);
        free(model->param_info);
        free(model->params);
        free(model->grads);
    }
    free(model);
}

void model_zero_grad(Model *model) { memset(model->grads, 0, (size_t)model->num_grad_floats * sizeof(float)); }

ModelActivationBytes model_activation_bytes(const Model *model) {
    const ModelPriv *pr = model->priv;
    const size_t tokens = (size_t)model->max_B * model->max_T;
    ModelActivationBytes out = {0, 0};
    out.per_set = pr->act_floats * sizeof(float) + tokens * (sizeof(double) + 2 * sizeof(int32_t));
    for (int l = 0; l < model->part.num_layers; l++) {
        if (!pr->moe[l]) continue;
        out.per_set += (size_t)pr->moe_balance[l].aux_cap * model->cfg.moe.num_experts * sizeof(double);
        if (pr->moe[l] != pr->moe_work) out.per_set += pr->moe[l]->bytes;
    }
    if (pr->owns_work) out.working_set = pr->work_floats * sizeof(float) + (pr->moe_work ? pr->moe_work->bytes : 0);
    return out;
}

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
