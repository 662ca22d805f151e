/* model_registry.c: the param registry of the dense model. Declares every
 * parameter once (name, shape, init, weight decay) in layout order and gives
 * each its offset into the one params allocation (grads use the same offsets). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "model_internal.h"

typedef struct RegistryBuilder {
    ParamInfo *infos;
    int count, capacity;
    long total;
    float init_std;
} RegistryBuilder;

/* Appends a parameter; returns its index. rows x cols (cols = 0 for 1-D). */
static int declare(RegistryBuilder *b, long rows, long cols, ParamInit init, float init_std, const char *fmt,
                   ...) __attribute__((format(printf, 6, 7)));

static int declare(RegistryBuilder *b, long rows, long cols, ParamInit init, float init_std, const char *fmt,
                   ...) {
    if (b->count == b->capacity) {
        b->capacity = b->capacity ? 2 * b->capacity : 64;
        b->infos = mt_realloc(b->infos, (size_t)b->capacity * sizeof *b->infos);
    }
    ParamInfo *p = &b->infos[b->count];
    memset(p, 0, sizeof *p);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    p->ndim = cols > 0 ? 2 : 1;
    p->shape[0] = rows;
    p->shape[1] = cols > 0 ? cols : 1;
    p->numel = p->shape[0] * p->shape[1];
    p->offset = (size_t)b->total;
    p->init = init;
    p->init_std = init == INIT_NORMAL ? init_std : 0.0f;
    p->no_decay = p->ndim == 1; /* norms and biases are exactly the 1-D parameters */
    b->total += p->numel;
    return b->count++;
}

static int matrix(RegistryBuilder *b, long rows, long cols, float std, const char *fmt, int layer) {
    return declare(b, rows, cols, INIT_NORMAL, std, fmt, layer);
}
static int norm(RegistryBuilder *b, long size, const char *fmt, int layer) {
    return declare(b, size, 0, INIT_ONES, 0, fmt, layer);
}
static int bias(RegistryBuilder *b, long size, const char *fmt, int layer) {
    return declare(b, size, 0, INIT_ZEROS, 0, fmt, layer);
}

ParamInfo *model_registry_build(const ModelConfig *cfg, int *count, long *total_floats, ModelSlots *slots) {
    const long C = cfg->hidden_size, I = cfg->intermediate_size, V = cfg->vocab_size;
    const long HD = (long)cfg->num_attention_heads * cfg->head_dim;
    const long KVD = (long)cfg->num_key_value_heads * cfg->head_dim;
    const int L = cfg->num_layers;
    const float std = (float)cfg->init_std;
    /* Megatron's output-layer init: o_proj and down_proj feed the residual
     * stream, so their std shrinks with depth: init_std / sqrt(2 * num_layers). */
    const float out_std = (float)(cfg->init_std / sqrt(2.0 * L));

    RegistryBuilder b = {0};
    LayerSlots *ls = slots ? mt_calloc((size_t)L, sizeof *ls) : NULL;
    int embed = declare(&b, V, C, INIT_NORMAL, std, "embed.weight");
    for (int i = 0; i < L; i++) {
        LayerSlots s;
        memset(&s, -1, sizeof s);
        s.attn_norm = norm(&b, C, "layers.%d.attn_norm.weight", i);
        s.q_weight = matrix(&b, HD, C, std, "layers.%d.attn.q_proj.weight", i);
        if (cfg->attention_bias) s.q_bias = bias(&b, HD, "layers.%d.attn.q_proj.bias", i);
        s.k_weight = matrix(&b, KVD, C, std, "layers.%d.attn.k_proj.weight", i);
        if (cfg->attention_bias) s.k_bias = bias(&b, KVD, "layers.%d.attn.k_proj.bias", i);
        s.v_weight = matrix(&b, KVD, C, std, "layers.%d.attn.v_proj.weight", i);
        if (cfg->attention_bias) s.v_bias = bias(&b, KVD, "layers.%d.attn.v_proj.bias", i);
        if (cfg->qk_norm) {
            s.q_norm = norm(&b, cfg->head_dim, "layers.%d.attn.q_norm.weight", i);
            s.k_norm = norm(&b, cfg->head_dim, "layers.%d.attn.k_norm.weight", i);
        }
        s.o_weight = matrix(&b, C, HD, out_std, "layers.%d.attn.o_proj.weight", i);
        s.mlp_norm = norm(&b, C, "layers.%d.mlp_norm.weight", i);
        s.gate_weight = matrix(&b, I, C, std, "layers.%d.mlp.gate_proj.weight", i);
        s.up_weight = matrix(&b, I, C, std, "layers.%d.mlp.up_proj.weight", i);
        s.down_weight = matrix(&b, C, I, out_std, "layers.%d.mlp.down_proj.weight", i);
        if (ls) ls[i] = s;
    }
    int final_norm = declare(&b, C, 0, INIT_ONES, 0, "final_norm.weight");
    int lm_head = -1;
    if (!cfg->tie_word_embeddings) lm_head = declare(&b, V, C, INIT_NORMAL, std, "lm_head.weight");

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

long model_count_params(const ModelConfig *cfg) {
    ModelConfig resolved = model_config_resolve(cfg);
    int count;
    long total;
    ParamInfo *infos = model_registry_build(&resolved, &count, &total, NULL);
    free(infos);
    return total;
}

const ParamInfo *model_find_param(const Model *model, const char *name) {
    for (int i = 0; i < model->num_params; i++)
        if (strcmp(model->param_info[i].name, name) == 0) return &model->param_info[i];
    return NULL;
}
