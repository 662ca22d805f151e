/* moe_layer.h: private to src/model: the mixture-of-experts MLP of one layer
 * on the CPU: the router (fp32 logits, softmax or sigmoid scores, top-k with
 * an optional selection bias, optional renormalisation), the experts (SwiGLU
 * MLPs on the tokens routed to them, grouped expert by expert), an optional
 * shared expert, capacity dropping, and the auxiliary losses (load balancing
 * and z-loss), forward and backward. */
#ifndef MT_MODEL_MOE_LAYER_H
#define MT_MODEL_MOE_LAYER_H

#include <stdint.h>

#include "model_internal.h"
#include "moe_dispatch.h"

/* MT_MOE_MAX_EXPERTS and MT_MOE_MAX_TOPK: src/config/recipe.h (the recipe holds them too) */

/* What forward keeps of one MoE layer for backward (its load-balancing
 * record is the layer's MoeBalance, model_internal.h). */
typedef struct MoeActs {
    int N;                  /* tokens of the last forward */
    float *logits;          /* (N, E) router logits */
    float *scores;          /* (N, E) softmax or sigmoid of the logits */
    int32_t *selected;      /* (N, k) experts chosen */
    float *raw;             /* (N, k) their scores (no bias) */
    float *weight;          /* (N, k) combine weights (renormalised; 0 when dropped) */
    int32_t *position;      /* (N, k) row of the assignment in the grouped buffers, -1 when dropped */
    int32_t *token;         /* (N*k) token of each grouped row */
    int32_t *offsets;       /* (E+1) each expert's rows in the grouped buffers */
    float *xin, *y;         /* grouped rows (N*k, C): the tokens sent to the experts, what comes back */
    float *d_rows, *d_xin;  /* (N*k, C) their gradients */
    MoeExperts ex;          /* the expert side (this rank's experts, the rows routed to them) */
    float *s_gate, *s_up, *s_act;           /* shared expert (N, Is) */
    float *d_scores, *d_logits;             /* (N, E) */
    double *d_w;            /* (N, k) gradients of the combine weights (summed over tp with etp > 1) */
    float *d_shared_act, *d_shared_gate, *d_shared_up; /* (N, Is) */
    double *counts;         /* (E) assignments per expert in the last forward (before dropping) */
    long dropped;           /* assignments dropped by the capacity */
    size_t bytes;           /* what moe_acts_create allocated */
} MoeActs;

/* What a step's micro-batches add up, shared by a model and its activation
 * clones (model.h: MoeStep): per local layer, assignments per expert on this
 * rank, and for global_aux_loss the running counts over the dp ranks. */
struct MoeStep {
    int num_layers, E;         /* local layers (dense ones keep zeros) */
    double *counts;            /* (num_layers, E) this rank's assignments in the step */
    double *global_counts;     /* (num_layers, E) global_aux_loss: running, over the dp ranks */
    double *global_tokens;     /* (num_layers) */
    double aux_sum, z_sum;     /* losses summed over the step's forwards (and layers) */
    long dropped, assignments; /* over the step */
    long spills, dispatches;   /* GPU under ep: the layers' forwards whose expert side did not fit the arena's room
                                * (src/model/cuda/cuda_model_moe.c), of all its ep dispatches; 0 of 0 elsewhere */
};

/* The most rows one rank's experts compute for micro-batches of at most N routed tokens on each of the ep ranks
 * of its expert-parallel group (ep 1: its own): from each rank, each token's assignments to this rank's E / ep
 * experts (a token's k experts are distinct, so at most min(k, E / ep)); with a capacity_factor c, also at most
 * ceil(c N k / E) rows per expert from each rank, as routing keeps: the most a layer can give them. */
long moe_expert_rows_max(const MoeConfig *mc, int ep, long N);

/* The router's scores of N tokens from their logits (N x E), row by row: softmax (in double) or sigmoid. */
void moe_router_scores(const MoeConfig *m, const float *logits, float *scores, int N, int E);
/* One token's k best experts by score (+ bias, NULL for none; the combine weights are the scores alone) into sel,
 * best first, ties to the lower index: the routing's choice, also what convert --drop-expert-bias compares. */
void moe_top_k(const float *scores, const float *bias, int E, int k, int32_t *sel);
/* A quarter more than the rows a balanced routing gives one rank's experts (N k), or moe_expert_rows_max where that
 * is fewer (ep 1: N k, all of a rank's rows): what the CUDA model's arena holds for its expert side and `plan`
 * counts. Under ep a layer given more takes its expert side as it goes (src/model/cuda/cuda_model_moe.c): routing a
 * quarter past the mean to one rank's experts is rare once training is under way (the CPU's expert side starts with
 * the same margin). */
long moe_expert_rows_room(const MoeConfig *mc, int ep, long N);

MoeActs *moe_acts_create(const ModelConfig *cfg, int ep, int etp, int max_tokens);
void moe_acts_free(MoeActs *a);
/* A layer's load-balancing record (its aux_counts for E experts); free with moe_balance_free. */
void moe_balance_init(MoeBalance *b, int E);
void moe_balance_free(MoeBalance *b);

MoeStep *moe_step_create(int num_layers, int E);
void moe_step_free(MoeStep *s);

/* out (N, C) = the MoE MLP of x (N, C) for local layer l; B x T = N tokens.
 * Its routing statistics go into the layer's MoeBalance and the step's
 * MoeStep, except in a recomputed forward (ModelPriv.recomputing): that one
 * routes the same tokens the same way (the same weights and expert_bias
 * within a step) and keeps the MoeBalance of the first.
 * With expert tensor parallel (part.etp > 1) out is this tp rank's partial
 * sum (the caller sums it over tp), and so is the input gradient of backward. */
void moe_forward(Model *model, int l, MoeActs *a, const float *x, float *out, int B, int T);
/* d_x (N, C) += the gradient through the MoE MLP of d_out (N, C), with the
 * auxiliary losses' gradients scaled by loss_scale; parameter gradients accumulate. */
void moe_backward(Model *model, int l, MoeActs *a, const float *x, const float *d_out, float *d_x, float loss_scale);

#endif
