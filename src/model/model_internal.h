/* model_internal.h: private to src/model: where each parameter lives (slots),
 * per-layer weight views, the activation buffers forward keeps for backward,
 * and the helpers the model files share. Nothing outside src/model includes it
 * except tests/unit/test_model.c. */
#ifndef MT_MODEL_MODEL_INTERNAL_H
#define MT_MODEL_MODEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"
#include "model_shape.h"

/* Index into the registry (Model.param_info) of every parameter of one layer;
 * -1 where the config leaves the parameter out. */
typedef struct LayerSlots {
    int attn_norm;
    int q_weight, q_bias, k_weight, k_bias, v_weight, v_bias;
    int q_norm, k_norm;
    int o_weight;
    int mlp_norm;
    int gate_weight, up_weight, down_weight;
    /* MoE layers (dense gate/up/down are -1 there) */
    int router, expert_bias;              /* (E, C), (E) with load_balancing: expert_bias */
    int e_gate, e_up, e_down;             /* stacked experts: (E*I, C), (E*I, C), (E*C, I) */
    int s_gate, s_up, s_down;             /* shared expert (Is, C), (Is, C), (C, Is) */
    int lora_a[LORA_NUM_TARGETS];         /* LoRA (model_lora.c): A (rank, in) per target, -1 where none */
    int lora_b[LORA_NUM_TARGETS];         /* B (out, rank) */
} LayerSlots;

/* Registry indices of the whole model; lm_head is -1 with tied embeddings. */
typedef struct ModelSlots {
    int embed;
    int final_norm;
    int lm_head;
    LayerSlots *layers; /* num_layers entries (owned by whoever asked for them) */
} ModelSlots;

/* Pointers of one layer into params (or into grads: same layout). NULL where absent. */
typedef struct LayerWeights {
    float *attn_norm;
    float *q_weight, *q_bias, *k_weight, *k_bias, *v_weight, *v_bias;
    float *q_norm, *k_norm;
    float *o_weight;
    float *mlp_norm;
    float *gate_weight, *up_weight, *down_weight;
    float *router, *expert_bias, *e_gate, *e_up, *e_down, *s_gate, *s_up, *s_down;
    float *lora_a[LORA_NUM_TARGETS], *lora_b[LORA_NUM_TARGETS];
} LayerWeights;

/* What forward keeps of one layer for backward. N = B*T rows of this rank
 * (T = its tokens under context parallel); HD = H*D, KVD = KVH*D with this
 * rank's heads (tensor parallel); the residual stream and the norms have N/tp
 * rows under sequence parallel, N otherwise. */
typedef struct LayerActs {
    float *resid_in;     /* (N, C) input of the layer (residual stream) */
    float *attn_normed;  /* (N, C) attn_norm(resid_in) */
    float *attn_rstd;    /* (N) */
    float *q_pre;        /* (N, HD) q_proj output before qk-norm (qk_norm only) */
    float *k_pre;        /* (N, KVD) (qk_norm only) */
    float *q_rstd;       /* (N*H) per-head rstd of q_norm (qk_norm only) */
    float *k_rstd;       /* (N*KVH) (qk_norm only) */
    float *attn_in;      /* (N, C) q/k/v's input: attn_normed, or its all-gather under sequence parallel */
    float *q;            /* (N, HD) q after qk-norm and rope: attention's input */
    float *k;            /* (N, KVD) k after qk-norm and rope */
    float *v;            /* (N, KVD) */
    float *k_all;        /* (B, T*cp, KVD) keys of the whole sequence (context parallel only) */
    float *v_all;        /* (B, T*cp, KVD) (context parallel only) */
    float *probs;        /* (B, H, T, T*cp) */
    float *attn_out;     /* (N, HD) attention output, o_proj's input */
    float *resid_mid;    /* (N, C) resid_in + o_proj(attn_out) */
    float *mlp_normed;   /* (N, C) mlp_norm(resid_mid) */
    float *mlp_rstd;     /* (N) */
    float *mlp_in;       /* (N, C) gate/up's input: mlp_normed, or its all-gather under sequence parallel */
    float *gate;         /* (N, I) */
    float *up;           /* (N, I) */
    float *act;          /* (N, I) silu(gate) * up, down_proj's input */
    float *lora_h[LORA_NUM_TARGETS]; /* (N, rank) A x of each LoRA target (gathered over tp), B's input */
} LayerActs;

/* The load-balancing record of one MoE layer's last forward: what its
 * backward needs of the routing statistics (moe_layer.c, balance_loss).
 * Kept per layer and per activation set in every recompute mode: a
 * recomputed forward reuses it instead of counting the micro-batch again. */
typedef struct MoeBalance {
    double *aux_counts;     /* (aux_rows, E) the counts the load-balancing loss weighs the
                             * probabilities with: of the micro-batch (all cp ranks), of each
                             * sequence (seq_aux_loss), or the running global ones */
    int aux_rows, aux_cap;  /* rows of aux_counts (1, or the sequences), and its room */
    int aux_span;           /* tokens of this rank per row */
    double aux_scale;       /* d aux / d p[n, e] = aux_scale * aux_counts[row of n, e] */
    double z_scale;         /* d z-loss / d lse[n]^2 = z_scale (z_loss_coeff / all tokens) */
    double aux_loss;        /* the last forward's load-balancing loss (with its coefficient) */
    double z_loss;          /* the last forward's z-loss (with its coefficient) */
} MoeBalance;

/* Scratch for backward: activation gradients, reused layer after layer. */
typedef struct GradScratch {
    float *d_resid;      /* (N, C) gradient of the residual stream */
    float *d_normed;     /* (N, C) gradient of a norm's output */
    float *d_attn_out;   /* (N, HD) */
    float *d_q, *d_q2;   /* (N, HD) two buffers: through rope, then qk-norm */
    float *d_k, *d_k2;   /* (N, KVD) */
    float *d_v;          /* (N, KVD) */
    float *d_k_all, *d_v_all; /* (B, T*cp, KVD) (context parallel only) */
    float *d_full;       /* (N, C) a residual-stream gradient gathered over tp (sequence parallel only) */
    float *d_act;        /* (N, I) */
    float *d_gate;       /* (N, I) */
    float *d_up;         /* (N, I) */
    float *lora_dh;      /* (N, rank) a LoRA target's gradient of h (LoRA only) */
    float *lora_dh_part; /* (N, rank / tp) its columns of this rank's A (column-parallel targets, tp > 1) */
} GradScratch;

/* The products the GPU computes as one FP8 product each (model_fp8.h). */
typedef enum { LINEAR_QKV, LINEAR_O, LINEAR_GATE_UP, LINEAR_DOWN, LINEAR_NUM_GROUPS } LinearGroup;

typedef struct ModelPriv {
    ModelSlots slots;
    ModelShape shape;           /* this rank's sizes, tp/cp ranks and chunks (model_shape.h) */
    LayerWeights *weights;      /* num_layers views into params */
    LayerWeights *weight_grads; /* num_layers views into grads */
    float *embed, *final_norm, *lm_head;       /* lm_head == embed when tied */
    float *d_embed, *d_final_norm, *d_lm_head; /* d_lm_head == d_embed when tied */

    float *rope_cos, *rope_sin; /* (max_T, D/2) at this rank's positions (model_rope_rows) */
    int32_t *positions;         /* (max_T) this rank's positions in the sequence */
    int rope_T;                 /* the T they were built for (context parallel: they depend on T) */
    bool packed;                /* packed rows (model_set_packed_positions) for the next forwards */
    int packed_B, packed_T;     /* the micro-batch they are for (T: this rank's tokens) */
    int32_t *packed_pos;        /* (B, T * cp) each position's place in its sample, whole rows */
    bool has_pad;               /* packed and some row has padding: */
    uint8_t *token_pad;         /* (B * T) 1 where this rank's token is a packed row's padding (model_token_pad) */
    size_t token_pad_cap;
    float *packed_cos, *packed_sin; /* (B * T, D/2): the RoPE rows of this rank's tokens' places */
    size_t packed_cap, packed_rope_cap;
    float *seq_cos, *seq_sin;   /* context parallel and packed: the tables of places 0..seq_T-1 */
    int seq_T;

    /* precision: fp8 (model_fp8.c): each layer's groups' input and weight scales of the last forward, and
     * the emulation's scratch (grown as needed) */
    float (*fp8_scales)[LINEAR_NUM_GROUPS][2];
    float *fp8_x, *fp8_w, *fp8_g, *fp8_dx, *fp8_dw;
    size_t fp8_x_cap, fp8_w_cap, fp8_g_cap, fp8_dx_cap, fp8_dw_cap;

    float *act_memory;          /* one allocation for everything below */
    size_t act_floats;          /* its size */
    LayerActs *acts;            /* num_layers; with recompute, what is recomputed points into `work` */
    struct MoeActs **moe;       /* num_layers: the MoE layers' activations, NULL for dense layers
                                 * (recompute full: all point to moe_work) */
    MoeBalance *moe_balance;    /* num_layers: the MoE layers' routing statistics (unused for dense layers) */

    /* The recompute working set (model->recompute != none): one layer's
     * recomputed buffers, allocated by the base model and shared by its
     * clones (one backward runs at a time on a rank). */
    bool owns_work;             /* the base model: frees work_memory and moe_work */
    float *work_memory;
    size_t work_floats;
    LayerActs work;             /* the recomputed buffers (NULL where the mode keeps the buffer per layer) */
    struct MoeActs *moe_work;   /* recompute full: the one MoeActs of every MoE layer */
    float *recompute_out;       /* recompute full: (residual rows, C) where a recomputed layer's output goes */
    bool recomputing;           /* inside a recomputed forward: MoE layers count no statistics */
    float *final_resid;         /* (N, C) output of the last layer */
    float *chunk_out[MT_MAX_CHUNKS]; /* output of each chunk's last layer (final_resid for the last chunk) */
    float *proj_out;            /* (N, C) scratch: o_proj / down_proj output before the residual add */
    float *lora_part;           /* (N, rank) scratch: A x of this rank's block before its gather (LoRA, tp > 1) */
    float *shard;               /* (N/tp, C) scratch: a reduce-scatter's result (sequence parallel) */
    double *row_lse;            /* (N) logsumexp of each row of the logits (vocab parallel) */
    float *final_normed;        /* (N, C) */
    float *final_in;            /* (N, C) lm_head's input: final_normed, or its all-gather (sequence parallel) */
    float *final_rstd;          /* (N) */
    float *logits;              /* (N, V) this rank's vocab columns; dlogits in place after backward */
    float *losses;              /* (N) */
    GradScratch scratch;

    int32_t *inputs;            /* (max_B * max_T) tokens of the last forward */
    int32_t *targets;           /* (max_B * max_T) targets of the last forward */
    int B, T;                   /* shape of the last forward */
    long num_targets;           /* non-ignored targets of the last forward */
    int backward_ready;         /* 1 after a forward with targets, 0 after backward */
    float loss_scale;           /* of the running backward (set by the last stage's head, or given) */
} ModelPriv;

/* The next forward's padding mask (ModelPriv.token_pad), NULL when no token is padding. */
static inline const uint8_t *model_token_pad(const ModelPriv *pr) {
    return pr->packed && pr->has_pad ? pr->token_pad : NULL;
}

/* Checks a config for the dense model; 0, or -1 with a message naming the key. */
int model_config_validate(const ModelConfig *cfg, char *err, size_t errlen);

/* A copy of cfg with defaults filled (head_dim = C/H when 0, init_std = 0.02 when 0).
 * Dies with MT_EXIT_USAGE when the config is invalid. */
ModelConfig model_config_resolve(const ModelConfig *cfg);

/* Declares the parameters `part` holds of a resolved config, in layout order.
 * Returns a malloc'd array of *count entries (offsets contiguous from 0) and
 * sets *total_floats. When slots != NULL, fills it (slots->layers malloc'd,
 * indexed by local layer: model_local_layer). */
ParamInfo *model_registry_build(const ModelConfig *cfg, const ModelPartition *part, int *count, long *total_floats,
                                ModelSlots *slots);

/* The local index of (global) layer `layer` in part, or -1 when part does not hold it. */
int model_local_layer(const ModelPartition *part, int layer);

/* The RoPE tables of a micro-batch of B x T tokens, for rope_forward/_backward with rB x rT rows: this rank's T
 * positions (rows of the whole sequence's under context parallel) with rB = B, rT = T; packed rows: one table row
 * per token at its position in its sample, rB = 1, rT = B * T. */
void model_rope_tables(Model *model, int B, int T, const float **cos, const float **sin, int *rB, int *rT);

/* One transformer block's forward (local layer l): acts[l].resid_in -> out. */
void model_block_forward(Model *model, int l, float *out, int B, int T);
/* Its attention core: probs and attn_out from q, k, v (gathering keys and values over cp first). */
void model_attention_core(Model *model, int l, int B, int T);

/* Views of one layer's parameters (grads: false) or gradients (true; NULL
 * for frozen parameters). */
LayerWeights model_layer_view(const Model *model, bool grads, int layer);

/* LoRA (model_lora.c) on the output of target t of local layer l:
 *   forward   y += (alpha / rank) * B (A x), keeping h = A x in acts[l].lora_h[t];
 *   backward  dB, dA and dx from dy.
 * x is the projection's input (N rows: its (N, C) input for q/k/v and
 * gate/up, this rank's (N, in / tp) columns for o and down). y is the
 * projection's output: this rank's (N, out / tp) for a column-parallel
 * target; for o and down the (N, C) partial sum before the tp reduction, of
 * which this rank's B adds its columns. dy is laid out like y, gathered
 * under sequence parallel. No-ops when layer l has no adapter on t. */
void lora_forward(Model *model, int l, LoraTarget t, float *y, const float *x, int N);
void lora_backward(Model *model, int l, LoraTarget t, float *dx, const float *dy, const float *x, int N);

#endif
