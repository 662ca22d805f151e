/* model_registry.c: the param registry of the model. Declares every
 * parameter once (name, shape, init, weight decay) in layout order and gives
 * each its offset into the one params allocation; with LoRA the base weights
 * are frozen and the adapters, declared last, are the trainable region that
 * grads and the AdamW moments cover (model.h). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "model_internal.h"

/* The first init index of the optional parameters: beyond any model's count of tensors. */
#define OPTIONAL_INDEX (1 << 24)

typedef struct RegistryBuilder {
    const ModelPartition *part;
    ParamInfo *infos;
    int count, capacity;
    long total;
    int global_count; /* parameters of the whole model seen so far (kept or not), but for the optional ones: */
    int optional_count; /* those an option adds to a model without changing the others' init (optional below) */
    bool optional;      /* the parameters declared next are optional: their init seeds (global_index) count from
                         * OPTIONAL_INDEX apart, so that the same seed gives every other parameter the same bits
                         * with or without them (as Megatron's expert bias, a buffer, draws nothing) */
    ParamKind kind;   /* of the parameters declared next */
} RegistryBuilder;

/* How tensor parallel cuts a parameter. Stacked experts (3-D) are cut over
 * ep along dim 0 (whole experts) and, with expert tensor parallel, over tp
 * along their intermediate dim (EP_ETP_DIM1: gate/up; EP_ETP_DIM2: down). */
typedef enum { TP_WHOLE, TP_ROWS, TP_COLS, EP_ETP_DIM1, EP_ETP_DIM2 } TpSplit;

/* Declares the next parameter of the whole model (dims[0..ndim)); keeps
 * this rank's block of it when `keep`, else only counts it. Returns its
 * index in this rank's registry, or -1. */
static int declare_dims(RegistryBuilder *b, bool keep, int ndim, const long *dims, TpSplit split, ParamInit init,
                        float init_std, const char *fmt, va_list ap) {
    const int global_index = b->optional ? OPTIONAL_INDEX + b->optional_count++ : b->global_count++;
    if (!keep) return -1;
    if (b->count == b->capacity) {
        b->capacity = b->capacity ? 2 * b->capacity : 64;
        b->infos = mt_realloc(b->infos, (size_t)b->capacity * sizeof *b->infos);
    }
    ParamInfo *p = &b->infos[b->count];
    memset(p, 0, sizeof *p);
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    const ModelPartition *part = b->part;
    const int tp = part->tp, r = part->tp_rank;
    p->ndim = ndim;
    for (int d = 0; d < 3; d++) p->global_shape[d] = p->shape[d] = d < ndim ? dims[d] : 1;
    /* divisibility was checked by model_partition_check */
    const int tp_dim = split == TP_ROWS ? 0 : split == TP_COLS ? 1 : split == EP_ETP_DIM1 ? 1 : split == EP_ETP_DIM2 ? 2 : -1;
    const int tp_parts = split == EP_ETP_DIM1 || split == EP_ETP_DIM2 ? part->etp : tp;
    if (tp_dim >= 0 && tp_parts > 1) {
        p->shape[tp_dim] = p->global_shape[tp_dim] / tp_parts;
        p->global_start[tp_dim] = p->shape[tp_dim] * r;
    }
    p->expert = split == EP_ETP_DIM1 || split == EP_ETP_DIM2;
    if (p->expert) { /* whole experts over ep */
        p->shape[0] = p->global_shape[0] / part->ep;
        p->global_start[0] = p->shape[0] * part->ep_rank;
    }
    p->numel = p->shape[0] * p->shape[1] * p->shape[2];
    p->offset = (size_t)b->total;
    p->init = init;
    p->init_std = init == INIT_NORMAL || init == INIT_UNIFORM ? init_std : 0.0f;
    p->no_decay = p->ndim == 1; /* norms and biases are exactly the 1-D parameters */
    p->global_index = global_index;
    p->kind = b->kind;
    /* tp blocks are each counted by their rank; a tensor every tp rank holds
     * whole (replicas, and experts without expert tensor parallel) by tp rank 0 */
    p->norm_owner = (tp_dim >= 0 && tp_parts > 1) || r == 0;
    b->total += p->numel;
    return b->count++;
}

/* A 1-D (cols = 0) or 2-D parameter. */
static int declare(RegistryBuilder *b, bool keep, long rows, long cols, TpSplit split, ParamInit init,
                   float init_std, const char *fmt, ...) __attribute__((format(printf, 8, 9)));

static int declare(RegistryBuilder *b, bool keep, long rows, long cols, TpSplit split, ParamInit init,
                   float init_std, const char *fmt, ...) {
    const long dims[2] = {rows, cols};
    va_list ap;
    va_start(ap, fmt);
    int i = declare_dims(b, keep, cols > 0 ? 2 : 1, dims, split, init, init_std, fmt, ap);
    va_end(ap);
    return i;
}

/* A stack of experts [E, d1, d2]. */
static int declare_stack(RegistryBuilder *b, bool keep, long E, long d1, long d2, TpSplit split, float init_std,
                         const char *fmt, ...) __attribute__((format(printf, 8, 9)));

static int declare_stack(RegistryBuilder *b, bool keep, long E, long d1, long d2, TpSplit split, float init_std,
                         const char *fmt, ...) {
    const long dims[3] = {E, d1, d2};
    va_list ap;
    va_start(ap, fmt);
    int i = declare_dims(b, keep, 3, dims, split, INIT_NORMAL, init_std, fmt, ap);
    va_end(ap);
    return i;
}

/* A replicated norm weight; its gradient is partial over tp when `partial`. */
static int norm(RegistryBuilder *b, bool keep, long size, bool partial, const char *fmt, int layer) {
    int i = declare(b, keep, size, 0, TP_WHOLE, INIT_ONES, 0, fmt, layer);
    if (i >= 0) b->infos[i].tp_partial_grad = partial && b->part->tp > 1;
    return i;
}

/* LoRA's adapters of layer i (keep: this rank holds the layer), declared
 * after every base parameter. A (rank, in) starts as PEFT's
 * kaiming_uniform_(a=sqrt(5)): uniform with bound 1/sqrt(in), the whole
 * tensor's in; B (out, rank) as zeros. Under tensor parallel they are split
 * as Megatron-Bridge's ParallelLinearAdapter splits them: for the
 * column-parallel q/k/v and gate/up, A along its rank (linear_in is a
 * ColumnParallelLinear gathering its output) and B along out (with the
 * base's rows); for the row-parallel o and down, A along in (with the
 * base's columns) and B along out (linear_out, gathering its output). */
static void declare_lora(RegistryBuilder *b, const ModelConfig *cfg, bool k, int i, LayerSlots *s) {
    const PeftConfig *peft = &cfg->peft;
    const long C = cfg->hidden_size, I = cfg->intermediate_size, r = peft->rank;
    const long HD = (long)cfg->num_attention_heads * cfg->head_dim, KVD = (long)cfg->num_key_value_heads * cfg->head_dim;
    const long in[LORA_NUM_TARGETS] = {C, C, C, HD, C, C, I};
    const long out[LORA_NUM_TARGETS] = {HD, KVD, KVD, C, I, I, C};
    b->kind = PARAM_ADAPTER;
    for (int t = 0; t < LORA_NUM_TARGETS; t++) {
        if (!lora_targets(peft, (LoraTarget)t)) continue;
        if (t >= LORA_GATE && model_layer_is_moe(cfg, i)) continue; /* refused by peft_validate; no dense MLP */
        const bool row_parallel = t == LORA_O || t == LORA_DOWN;
        const char *block = t <= LORA_O ? "attn" : "mlp", *name = lora_target_name((LoraTarget)t);
        const float bound = (float)(1.0 / sqrt((double)in[t]));
        s->lora_a[t] = declare(b, k, r, in[t], row_parallel ? TP_COLS : TP_ROWS, INIT_UNIFORM, bound,
                               "layers.%d.%s.%s.lora_A.weight", i, block, name);
        s->lora_b[t] = declare(b, k, out[t], r, TP_ROWS, INIT_ZEROS, 0, "layers.%d.%s.%s.lora_B.weight", i, block,
                               name);
    }
}

/* The routed experts of a MoE layer, stacked [E, ...], split over ep (and
 * over tp with expert tensor parallel). Declared
 * after every other parameter, so that they form one region at the end of
 * the flat arrays (the distributed optimizer shards it over edp). */
static void declare_moe_experts(RegistryBuilder *b, const ModelConfig *cfg, bool k, int i, float std, float out_std,
                                LayerSlots *s) {
    const MoeConfig *m = &cfg->moe;
    const long C = cfg->hidden_size, E = m->num_experts, I = m->moe_intermediate_size;
    b->kind = PARAM_EXPERTS;
    s->e_gate = declare_stack(b, k, E, I, C, EP_ETP_DIM1, std, "layers.%d.mlp.experts.gate_proj.weight", i);
    s->e_up = declare_stack(b, k, E, I, C, EP_ETP_DIM1, std, "layers.%d.mlp.experts.up_proj.weight", i);
    s->e_down = declare_stack(b, k, E, C, I, EP_ETP_DIM2, out_std, "layers.%d.mlp.experts.down_proj.weight", i);
}

#define EXPERT_BIAS_SUFFIX ".mlp.router.expert_bias"

bool model_is_expert_bias(const char *name) {
    const size_t n = strlen(name), m = strlen(EXPERT_BIAS_SUFFIX);
    return strncmp(name, "layers.", 7) == 0 && n > m && strcmp(name + n - m, EXPERT_BIAS_SUFFIX) == 0;
}

/* The rest of a MoE layer's MLP: the router, its selection bias
 * (expert_bias balancing; not trained: its gradient stays 0) and the shared
 * expert. The router is whole on every tp rank
 * holds and computes it whole (with expert tensor parallel the shared
 * expert is split like the dense MLP). */
static void declare_moe_mlp(RegistryBuilder *b, const ModelConfig *cfg, bool k, int i, float std, float out_std,
                            LayerSlots *s) {
    const MoeConfig *m = &cfg->moe;
    const long C = cfg->hidden_size, E = m->num_experts;
    const long Is = m->shared_expert_intermediate_size;
    b->kind = PARAM_EXPERTS;
    s->router = declare(b, k, E, C, TP_WHOLE, INIT_NORMAL, std, "layers.%d.mlp.router.weight", i);
    if (m->load_balancing == LB_EXPERT_BIAS) { /* optional: the other weights' init as without it */
        b->optional = true;
        s->expert_bias = declare(b, k, E, 0, TP_WHOLE, INIT_ZEROS, 0, "layers.%d" EXPERT_BIAS_SUFFIX, i);
        b->optional = false;
    }
    if (Is > 0) { /* with expert tensor parallel split like the dense MLP */
        b->kind = PARAM_SHARED_EXPERT;
        const TpSplit rows = b->part->etp > 1 ? TP_ROWS : TP_WHOLE, cols = b->part->etp > 1 ? TP_COLS : TP_WHOLE;
        s->s_gate = declare(b, k, Is, C, rows, INIT_NORMAL, std, "layers.%d.mlp.shared_expert.gate_proj.weight", i);
        s->s_up = declare(b, k, Is, C, rows, INIT_NORMAL, std, "layers.%d.mlp.shared_expert.up_proj.weight", i);
        s->s_down = declare(b, k, C, Is, cols, INIT_NORMAL, out_std, "layers.%d.mlp.shared_expert.down_proj.weight", i);
    }
}

ParamInfo *model_registry_build(const ModelConfig *cfg, const ModelPartition *part, int *count, long *total_floats,
                                ModelSlots *slots) {
    const long C = cfg->hidden_size, I = cfg->intermediate_size, V = cfg->vocab_size;
    const long HD = (long)cfg->num_attention_heads * cfg->head_dim;
    const long KVD = (long)cfg->num_key_value_heads * cfg->head_dim;
    const int L = cfg->num_layers;
    const float std = (float)cfg->init_std;
    /* Megatron's output-layer init: o_proj and down_proj feed the residual
     * stream, so their std shrinks with depth: init_std / sqrt(2 * num_layers). */
    const float out_std = (float)(cfg->init_std / sqrt(2.0 * L));
    const bool sp = part->sequence_parallel;
    const bool bias = cfg->attention_bias;

    RegistryBuilder b = {.part = part, .kind = PARAM_EMBEDDING};
    LayerSlots *ls = slots ? mt_calloc((size_t)(part->num_layers > 0 ? part->num_layers : 1), sizeof *ls) : NULL;
    /* The lm_head of tied embeddings on a last stage is a copy of embed.weight. */
    const bool tied_copy = part->has_head && !part->has_embed && cfg->tie_word_embeddings;
    int embed = declare(&b, part->has_embed || tied_copy, V, C, TP_ROWS, INIT_NORMAL, std, "embed.weight");
    for (int i = 0; i < L; i++) {
        const int local = model_local_layer(part, i);
        const bool k = local >= 0;
        LayerSlots s;
        memset(&s, -1, sizeof s);
        b.kind = PARAM_ATTENTION;
        s.attn_norm = norm(&b, k, C, sp, "layers.%d.attn_norm.weight", i);
        s.q_weight = declare(&b, k, HD, C, TP_ROWS, INIT_NORMAL, std, "layers.%d.attn.q_proj.weight", i);
        if (bias) s.q_bias = declare(&b, k, HD, 0, TP_ROWS, INIT_ZEROS, 0, "layers.%d.attn.q_proj.bias", i);
        s.k_weight = declare(&b, k, KVD, C, TP_ROWS, INIT_NORMAL, std, "layers.%d.attn.k_proj.weight", i);
        if (bias) s.k_bias = declare(&b, k, KVD, 0, TP_ROWS, INIT_ZEROS, 0, "layers.%d.attn.k_proj.bias", i);
        s.v_weight = declare(&b, k, KVD, C, TP_ROWS, INIT_NORMAL, std, "layers.%d.attn.v_proj.weight", i);
        if (bias) s.v_bias = declare(&b, k, KVD, 0, TP_ROWS, INIT_ZEROS, 0, "layers.%d.attn.v_proj.bias", i);
        if (cfg->qk_norm) { /* shared by the heads, which tp splits: partial gradients */
            s.q_norm = norm(&b, k, cfg->head_dim, true, "layers.%d.attn.q_norm.weight", i);
            s.k_norm = norm(&b, k, cfg->head_dim, true, "layers.%d.attn.k_norm.weight", i);
        }
        s.o_weight = declare(&b, k, C, HD, TP_COLS, INIT_NORMAL, out_std, "layers.%d.attn.o_proj.weight", i);
        s.mlp_norm = norm(&b, k, C, sp, "layers.%d.mlp_norm.weight", i);
        if (model_layer_is_moe(cfg, i)) {
            declare_moe_mlp(&b, cfg, k, i, std, out_std, &s);
        } else {
            b.kind = PARAM_MLP;
            s.gate_weight = declare(&b, k, I, C, TP_ROWS, INIT_NORMAL, std, "layers.%d.mlp.gate_proj.weight", i);
            s.up_weight = declare(&b, k, I, C, TP_ROWS, INIT_NORMAL, std, "layers.%d.mlp.up_proj.weight", i);
            s.down_weight = declare(&b, k, C, I, TP_COLS, INIT_NORMAL, out_std, "layers.%d.mlp.down_proj.weight", i);
        }
        if (ls && k) ls[local] = s;
    }
    b.kind = PARAM_ATTENTION;
    int final_norm = declare(&b, part->has_head, C, 0, TP_WHOLE, INIT_ONES, 0, "final_norm.weight");
    if (final_norm >= 0) b.infos[final_norm].tp_partial_grad = sp && part->tp > 1;
    b.kind = PARAM_EMBEDDING;
    int lm_head = declare(&b, part->has_head && !cfg->tie_word_embeddings, V, C, TP_ROWS, INIT_NORMAL, std,
                          "lm_head.weight");
    for (int i = 0; i < L; i++) /* the routed experts last */
        if (model_layer_is_moe(cfg, i)) {
            const int local = model_local_layer(part, i);
            LayerSlots dummy;
            declare_moe_experts(&b, cfg, local >= 0, i, std, out_std, ls && local >= 0 ? &ls[local] : &dummy);
        }
    if (tied_copy) b.infos[embed].norm_owner = false; /* the first stage counts and saves it */
    if (cfg->peft.type == PEFT_LORA) { /* the adapters last: the trainable region; the base frozen */
        for (int j = 0; j < b.count; j++) b.infos[j].frozen = true;
        for (int i = 0; i < L; i++) {
            const int local = model_local_layer(part, i);
            LayerSlots dummy;
            memset(&dummy, -1, sizeof dummy);
            declare_lora(&b, cfg, local >= 0, i, ls && local >= 0 ? &ls[local] : &dummy);
        }
    }

    if (slots) {
        slots->embed = embed;
        slots->final_norm = final_norm;
        slots->lm_head = lm_head;
        slots->layers = ls;
    }
    *count = b.count;
    *total_floats = b.total;
    return b.infos;
}

ParamInfo *model_registry_of(const ModelConfig *cfg, const ModelPartition *part, int *count, long *total_floats) {
    ModelConfig resolved = model_config_resolve(cfg);
    return model_registry_build(&resolved, part, count, total_floats, NULL);
}

long model_count_params(const ModelConfig *cfg) {
    ModelConfig resolved = model_config_resolve(cfg);
    int count;
    long total;
    ModelPartition whole = model_partition_whole(&resolved);
    ParamInfo *infos = model_registry_build(&resolved, &whole, &count, &total, NULL);
    free(infos);
    return total;
}

long registry_trainable_offset(const ParamInfo *infos, int count, long total_floats) {
    for (int i = 0; i < count; i++)
        if (!infos[i].frozen) return (long)infos[i].offset;
    return total_floats;
}

float *model_grad_of(const Model *model, const ParamInfo *p) {
    return p->frozen ? NULL : model->grads + (p->offset - (size_t)model->trainable_offset);
}

const ParamInfo *model_find_param(const Model *model, const char *name) {
    for (int i = 0; i < model->num_params; i++)
        if (strcmp(model->param_info[i].name, name) == 0) return &model->param_info[i];
    return NULL;
}
