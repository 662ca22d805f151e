/* moe_case.h: the tiny MoE models the GPU model tests compare
 * (test_cuda_model.c, test_cuda_parallel_model.c): a config, a router made
 * decisive so that bf16 rounding rarely swaps experts, and the smallest
 * routing gap of the CPU's last forward (a micro-batch is drawn until it
 * has none under 1%: the GPU must then route exactly as the CPU). */
#ifndef MT_TESTS_GPU_MOE_CASE_H
#define MT_TESTS_GPU_MOE_CASE_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "model/model_internal.h"
#include "model/moe_layer.h"
#include "model_case.h"

static inline ModelConfig moe_case(ModelFamily family, int E, int k, MoeLoadBalancing lb) {
    ModelConfig c = tiny(family, 64, 4, 2, 16);
    c.qk_norm = family == FAMILY_QWEN3_MOE;
    MoeConfig *m = &c.moe;
    m->num_experts = E;
    m->num_experts_per_tok = k;
    m->moe_intermediate_size = 32;
    m->norm_topk_prob = true;
    m->score_function = SCORE_SOFTMAX;
    m->load_balancing = lb;
    m->aux_loss_coeff = lb == LB_EXPERT_BIAS || lb == LB_NONE ? 0.0 : 0.01;
    m->layer_freq = 1;
    m->bias_update_rate = 1e-3;
    return c;
}

/* MoE cases: a decisive router (its weights x6) on inputs the bf16 copies hold almost exactly (o_proj and the
 * experts' down projections x0.1, so the residual stream stays near the bf16 embedding rows): near-ties between
 * experts, which bf16 rounding would break differently from the CPU's fp32, become rare. */
static inline void sharpen_router(Model *cpu) {
    for (int i = 0; i < cpu->num_params; i++) {
        const ParamInfo *p = &cpu->param_info[i];
        const float scale = strstr(p->name, "router.weight") ? 6.0f
                            : strstr(p->name, "o_proj.weight") || strstr(p->name, "experts.down_proj") ? 0.1f
                                                                                                       : 1.0f;
        for (long j = 0; j < p->numel && scale != 1.0f; j++)
            cpu->params[p->offset + j] = round_bf16(cpu->params[p->offset + j] * scale);
    }
}

/* The smallest relative gap, over the tokens and MoE layers of the CPU's last forward, between the k-th chosen
 * expert's score (+ bias) and the best one left out, and with a capacity between the last assignment an expert
 * keeps and the first it drops. */
static inline double routing_margin(const Model *cpu, int N) {
    const ModelPriv *pr = cpu->priv;
    const MoeConfig *mc = &cpu->cfg.moe;
    const int E = mc->num_experts, k = mc->num_experts_per_tok;
    double worst = INFINITY;
    float *raw = malloc((size_t)N * k * sizeof(float));
    for (int l = 0; l < cpu->part.num_layers; l++) {
        const MoeActs *a = pr->moe[l];
        if (!a) continue;
        const float *bias = pr->weights[l].expert_bias;
        for (int n = 0; n < N && k < E; n++) {
            double kth = INFINITY, next = -INFINITY;
            for (int e = 0; e < E; e++) {
                const double v = (double)a->scores[(size_t)n * E + e] + (bias ? bias[e] : 0.0);
                bool chosen = false;
                for (int j = 0; j < k; j++) chosen = chosen || a->selected[(size_t)n * k + j] == e;
                if (chosen && v < kth) kth = v;
                if (!chosen && v > next) next = v;
            }
            const double gap = (kth - next) / fabs(kth);
            if (gap < worst) worst = gap;
        }
        if (!(mc->capacity_factor > 0)) continue;
        const long capacity = (long)ceil(mc->capacity_factor * (double)N * k / E);
        for (int e = 0; e < E; e++) {
            long count = 0;
            for (long i = 0; i < (long)N * k; i++)
                if (a->selected[i] == e) raw[count++] = a->raw[i];
            if (count <= capacity) continue;
            for (long i = 0; i <= capacity; i++) /* the capacity + 1 highest, in order */
                for (long j = i + 1; j < count; j++)
                    if (raw[j] > raw[i]) {
                        const float t = raw[i];
                        raw[i] = raw[j];
                        raw[j] = t;
                    }
            const double gap = (raw[capacity - 1] - raw[capacity]) / fabs(raw[capacity - 1]);
            if (gap < worst) worst = gap;
        }
    }
    free(raw);
    return worst;
}

#endif
