/* cuda_model_internal.h: private to src/model/cuda: the CudaModel struct
 * and the helpers its files share:
 *   cuda_model.c           creation, the arena, host copies, grad norm, AdamW, memory, profiling;
 *   cuda_model_pass.c      forward and backward, the data-parallel gradient sync;
 *   cuda_model_moe.c       the mixture-of-experts MLP (router, permutation,
 *                          combine, auxiliary losses);
 *   cuda_model_experts.c   the routed experts' products;
 *   cuda_model_zero1.c     the distributed optimizer: bucketed reduce-scatters in the backward, the update of
 *                          this rank's parts, the parameters all-gathered before the next forward's layers;
 *   cuda_model_parallel.c  tensor (and sequence) and context parallel: the
 *                          collectives around the products, the vocab-parallel
 *                          embedding and cross entropy, the keys and values
 *                          of the whole sequence, the gradients reduced over
 *                          tp and cp.
 * Sizes (C, D, H, KVH, HD, KVD, I, V) are this rank's, from CudaModel.shape
 * (../model_shape.h, shared with the CPU model); N = B*T rows; R = the
 * residual stream's rows (model_shape_rows: N/tp under sequence parallel,
 * else N); under context parallel T is this rank's tokens and Tall = T * cp
 * the sequence's. */
#ifndef MT_MODEL_CUDA_MODEL_INTERNAL_H
#define MT_MODEL_CUDA_MODEL_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "../../dist/device_comm.h"
#include "../../backend/cuda/cuda_check.h"
#include "../../backend/cuda/cuda_context.h"
#include "../../backend/cuda/cuda_gemm.h"
#include "../../backend/cuda/cuda_kernels.h"
#include "../model_shape.h"
#include "cuda_model.h"

typedef uint16_t bf16_t;

/* MEGATRAIN_CUDA_PROFILE=N: every op is timed (the stream is synchronised
 * around it, so the run is slower) and the totals per kind of op are printed
 * after the first N optimizer steps (the first step included: it holds the
 * one-time choices of cuBLASLt algorithms). */
typedef enum {
    PROF_GEMM, PROF_ATTN_FWD, PROF_ATTN_BWD, PROF_NORM, PROF_ROPE, PROF_SWIGLU, PROF_LOSS, PROF_EMBED,
    PROF_TP_COMM, PROF_OPTIMIZER, PROF_MOE_ROUTER, PROF_MOE_PERMUTE, PROF_MOE_EXPERTS, PROF_MOE_A2A,
    PROF_COUNT
} ProfKind;

/* Offsets (in floats) of one layer's parameters in the flat layout; -1 when absent. */
typedef struct LayerOffsets {
    long attn_norm, q, q_bias, k, k_bias, v, v_bias, q_norm, k_norm, o, mlp_norm, gate, up, down;
    /* a MoE layer (gate, up, down are -1): the router (E, C), its selection bias (E), the stacked experts
     * (E*Ie, C), (E*Ie, C), (E*C, Ie) and the shared expert (Is, C), (Is, C), (C, Is) */
    bool moe;
    long router, expert_bias, e_gate, e_up, e_down, s_gate, s_up, s_down;
} LayerOffsets;

/* What forward keeps of one layer. Under sequence parallel the norms' outputs are this rank's R rows only: the
 * products' whole inputs are gathered into CudaModel.sp_in for the forward and again for the backward's weight
 * gradients (cuda_tp_enter), so sequence parallel keeps 1 / tp of them, as Megatron does. */
typedef struct LayerSaved {
    bf16_t *resid_in, *attn_normed, *qkv, *q, *k, *v, *attn_out, *resid_mid, *mlp_normed, *gate_up, *act;
    float *attn_rstd, *q_rstd, *k_rstd, *lse, *mlp_rstd;
    bf16_t *k_all, *v_all;     /* context parallel: (B, Tall, KVH*D) keys and values in sequence order */
    struct MoeSaved *moe;      /* a MoE layer's (cuda_model_moe.c), else NULL */
} LayerSaved;

/* A run of gradients reduced over tp before the step (CudaModel.tp_partial):
 * summed when each rank holds a partial sum (q/k-norm weights; the norms
 * under sequence parallel), averaged when each rank computed the whole
 * gradient of a replicated weight (the norms without sequence parallel:
 * fp32 atomics make the replicas' last bits differ, and the average keeps
 * the copies identical). */
typedef struct TpPartialGrad {
    long offset, numel;
    int layer;                 /* its layer, or -1 outside the layers (final norm) */
    bool average;
} TpPartialGrad;

struct CudaModel {
    ModelConfig cfg;
    const ParamInfo *info;     /* the host model's registry */
    int num_params;
    long num_floats;
    int max_B, max_T, B, T;
    CudaContext ctx;
    char device_name[320];

    /* this rank's part: its sizes, layers (a pipeline stage and its chunks), tensor and context parallel */
    ModelShape shape;
    CudaModel *base;           /* a clone (another activation set of base, cuda_model_clone_activations), or NULL */
    DeviceComm *tp_comm;       /* the tp group (cuda_model_set_tp_comm), NULL when tp == 1 */
    TpPartialGrad *tp_partial; /* gradients reduced over tp on the last micro-batch (TpPartialGrad) */
    int num_tp_partial;
    DeviceComm *cp_comm;       /* the cp group (cuda_model_set_cp_comm), NULL when cp == 1 */
    struct CudaStageDirect *pp; /* GPU-direct pipeline transfers (cuda_model_set_pp_comm; clones share it), or NULL */
    int32_t *positions;        /* device (max_T), context parallel: this rank's positions (model_rope_rows) */
    int32_t *seq_pos;          /* device (cp * max_T): every cp rank's positions (model_sequence_positions) */

    void *arena;               /* the one allocation */
    size_t arena_bytes, peak_used;
    float *params, *grads;     /* fp32 master (num_floats; with z1 this rank's shard, state_floats) and gradients */
    void *exp_avg, *exp_avg_sq; /* AdamW's m and v: fp32, or bf16 (bf16_states) */
    bool bf16_states;          /* optimizer.state_dtype: bf16 */
    bf16_t *params16;
    LayerOffsets *layers;
    long *layer_begin, *layer_end; /* each layer's [begin, end) in the flat layout */
    long embed, final_norm, lm_head;
    int qkv_fused;             /* q, k, v weights adjacent (no biases): one product */

    float *rope_cos, *rope_sin;
    int32_t *inputs, *targets; /* device, max_B * max_T */
    int32_t *host_targets;
    LayerSaved *saved;
    /* train.recompute: the one working set of the buffers the mode recomputes (only those fields are set), which
     * every layer's LayerSaved points into, and under full the recomputed layer's output; shared by the pipeline's
     * activation sets (one stream runs one backward at a time) */
    Recompute recompute;
    LayerSaved work;
    bf16_t *recompute_out;
    struct MoeSaved *moe_work; /* full: the MoE layers' device buffers, one set (cuda_model_moe.c) */
    bool recomputing;          /* full: the backward is rerunning a layer's forward (MoE: no statistics) */
    bf16_t *final_resid, *final_normed, *logits;
    float *final_rstd, *losses, *ce_lse;
    float *ce_stats, *ce_gathered; /* vocab parallel: (N, 3) this rank's row stats, (tp, N, 3) everyone's */
    float *host_losses;
    long num_targets;
    int backward_ready;
    float loss_scale;          /* the running backward's (the MoE auxiliary losses scale their gradients by it) */

    /* backward scratch */
    float *d_resid;
    bf16_t *d_resid16, *d_normed, *d_act, *d_gate_up, *d_attn_out, *dq, *dk, *dv, *d_qkv;
    void *attn_workspace;
    /* tensor parallel scratch: (N, C) rows before a reduce-scatter (sequence parallel) or of the
     * embedding; the gathered residual gradient in bf16 and fp32; a reduce-scatter's (R, C) result; under
     * sequence parallel a norm's output all-gathered, the input of the products after it (N, C) */
    bf16_t *tp_rows, *d_full16, *d_normed_shard, *sp_in;
    float *d_full32;
    /* context parallel scratch: the all-gathered keys or values (cp, B, T, KVD); the gradients of the
     * sequence's keys and values (fp32, B x Tall x KVD), of every rank's block, and of this rank's */
    bf16_t *kv_blocks;
    float *dk_all, *dv_all, *dkv_blocks, *dkv_mine;

    /* data-parallel gradient averaging (cuda_model_set_grad_sync) */
    DeviceComm *grad_sync;
    cudaStream_t comm_stream;
    cudaEvent_t *layer_done;   /* L + 1: one per layer, one for the rest */
    cudaEvent_t comm_done;

    int prof_on, prof_steps;
    double prof_t0, prof_s[PROF_COUNT];
    long prof_calls[PROF_COUNT];

    struct CudaZero1 *z1;      /* the distributed optimizer (cuda_model_zero1.c), NULL: none */
    long state_floats;         /* AdamW's moments held: num_floats, or this rank's shard (z1) */
    CudaAdamWChunk *chunks;    /* device */
    int num_chunks;
    CudaAdamWChunk *norm_chunks; /* device: the parameters this rank counts in the grad norm (tp > 1) */
    int num_norm_chunks;
    int norm_expert_chunk;     /* the first of them in the experts' region (ep > 1), else num_norm_chunks */
    double *norm_partial, *host_norm_partial;

    struct MoeScratch *moe;    /* the MoE layers' shared scratch (cuda_model_moe.c), NULL without MoE layers */
    MoeStep *moe_step;         /* the host Model's: the step's routing statistics (NULL: none) */
    const Comm *dp_host;       /* the host Model's dp group (global_aux_loss counts), NULL when dp == 1 */
    /* expert parallel (cuda_model_set_ep_comm): this rank holds local experts [ep_rank, ep_rank + 1) x E / ep */
    int ep, ep_rank;
    DeviceComm *ep_comm;       /* the ep group: the token dispatch and combine (all-to-all), NULL when ep == 1 */
    DeviceComm *edp_comm;      /* the ranks holding the same experts (their gradients' average), NULL: none */
    long expert_begin;         /* ep > 1: the routed experts' weights, [expert_begin, num_floats) */
    int etp;                   /* expert tensor parallel: 1 (experts whole on every tp rank) or tp (sliced) */
};

enum { NORM_PARTIALS = 1024 };

/* The arena is laid out twice over the same walk: the first pass (base NULL) counts bytes, the second hands out
 * pointers. */
typedef struct Carver {
    char *base;
    size_t used;
} Carver;

static inline void *carve(Carver *c, size_t bytes) {
    c->used = (c->used + 255) & ~(size_t)255; /* 256-byte alignment for cuBLASLt and vector loads */
    void *p = c->base ? c->base + c->used : NULL;
    c->used += bytes;
    return p;
}

#define CARVE(c, ptr, count) ((ptr) = carve((c), (size_t)(count) * sizeof *(ptr)))

/* Run a statement (an op's launch) and, when profiling, time it as `kind`. */
#define TIMED(m, kind, ...)      \
    do {                         \
        cuda_prof_begin(m);      \
        __VA_ARGS__;             \
        cuda_prof_end(m, kind);  \
    } while (0)

void cuda_prof_begin(CudaModel *m);
void cuda_prof_end(CudaModel *m, ProfKind kind);

static inline bf16_t *w16(CudaModel *m, long offset) { return offset < 0 ? NULL : m->params16 + offset; }
static inline float *g32(CudaModel *m, long offset) { return offset < 0 ? NULL : m->grads + offset; }

/* out[N,OC] (row stride ldo) = inp[N,IC] @ W^T (+ bias) (+ residual), W = the weight at offset w. */
void cuda_linear_forward(CudaModel *m, bf16_t *out, int ldo, const bf16_t *inp, long w, long bias,
                         const bf16_t *residual, int N, int IC, int OC);
/* dinp = dout @ W (+= when accumulate), dW += dout^T @ inp (fp32), and dbias
 * += column sums of dout when the layer has a bias. dout has row stride ld. */
void cuda_linear_backward(CudaModel *m, bf16_t *dinp, const bf16_t *dout, int ld, const bf16_t *inp, long w,
                          long bias, int N, int IC, int OC, int accumulate);

/* ---- cuda_model_parallel.c: with tp == 1 each is the plain op -------------- */

/* The (N, C) input of a column-parallel product from the norm's output x
 * (R rows): all-gathered into m->sp_in under sequence parallel (the one
 * buffer: it holds the last gathered input only), x otherwise. */
const bf16_t *cuda_tp_enter(CudaModel *m, const bf16_t *x, int N, int C);
/* Its backward: the gradient of x from the product's partial d_full (N, C):
 * summed over tp in place, or reduce-scattered (sequence parallel). */
const bf16_t *cuda_tp_enter_backward(CudaModel *m, bf16_t *d_full, int N, int C);
/* out (R rows) = residual + inp @ W^T summed over tp (a row-parallel product). */
void cuda_tp_row_parallel_residual(CudaModel *m, bf16_t *out, const bf16_t *residual, const bf16_t *inp, long w,
                                   int N, int IC, int C);
/* out (R rows) = residual + partial (N, C: this rank's partial sum, overwritten) summed over tp (tp > 1). */
void cuda_tp_sum_partial_residual(CudaModel *m, bf16_t *out, const bf16_t *residual, bf16_t *partial, int N, int C);
/* The (N, C) gradient of a row-parallel product's output from d_resid16 (R rows). */
const bf16_t *cuda_tp_leave_backward(CudaModel *m, int N, int C);
/* resid (R rows) = the embedding of tokens (this rank's vocabulary rows, summed over tp). */
void cuda_tp_embedding_forward(CudaModel *m, bf16_t *resid, int N, int C);
/* d_embed += d_resid (R rows, gathered over tp) for this rank's tokens. */
void cuda_tp_embedding_backward(CudaModel *m, int N, int C);
/* losses and ce_lse from this rank's logits columns (N, V). */
void cuda_tp_cross_entropy_forward(CudaModel *m, int N);
/* On the last micro-batch: the gradients of `layer` (-1: those outside the
 * layers) reduced over tp (those listed in tp_partial) and summed over cp. */
void cuda_parallel_reduce_grads(CudaModel *m, int layer);

/* Context parallel (cp == 1: plain causal attention): attn_out and lse of
 * layer s from its q, k, v, through the keys and values of the whole sequence
 * (all-gathered into k_all, v_all when gather_kv; else already there: the
 * selective recompute of the attention core). */
void cuda_cp_attention_forward(CudaModel *m, LayerSaved *s, int B, int T, bool gather_kv);
/* Its backward: dq, dk, dv (this rank's rows) from d_attn_out. */
void cuda_cp_attention_backward(CudaModel *m, const LayerSaved *s, int B, int T);

/* GPU-direct pipeline transfers' state and buffer (cuda_model_pass.c), freed by the base. */
void cuda_stage_direct_free(CudaModel *m);

/* ---- cuda_model_moe.c: the MoE MLP of a layer whose LayerOffsets.moe is set ---- */

/* Its buffers: what layer l's forward keeps (per activation set; host arrays allocated when c->base is NULL,
 * freed by cuda_moe_free_saved; under full recompute its device buffers are the working set's, carved before by
 * cuda_moe_layout_work) and, with shared, the scratch every MoE layer and activation set shares. */
void cuda_moe_layout_saved(CudaModel *m, Carver *c, int l);
void cuda_moe_layout_work(CudaModel *m, Carver *c);
void cuda_moe_layout_shared(CudaModel *m, Carver *c);
void cuda_moe_free_saved(CudaModel *m);
void cuda_moe_free_shared(CudaModel *m);
/* out (R rows) = resid (R rows) + the MoE MLP of x (N, C: whole, gathered over tp under sequence parallel) for
 * layer l, its rows of it (tp > 1: summed over tp with etp > 1); its statistics go to m->moe_step. Waits for the
 * routing's counts (the expert products are enqueued from the host). */
void cuda_moe_forward(CudaModel *m, int l, const bf16_t *x, const bf16_t *resid, bf16_t *out, int B, int T);
/* The gradient of the layer's MLP input (this rank's R rows) from dy (N, C) through layer l's MoE MLP of x (the
 * forward's input, gathered again under sequence parallel), with the auxiliary losses' gradients scaled by
 * loss_scale (through m->d_normed, (N, C)); the parameters' gradients accumulate. */
const bf16_t *cuda_moe_backward(CudaModel *m, int l, const bf16_t *x, const bf16_t *dy, float loss_scale);

/* ---- cuda_model_experts.c: the routed experts' products over rows grouped expert by expert ---- */

/* This rank's intermediate size of each routed expert and of the shared expert (etp > 1 slices both). */
static inline int cuda_moe_expert_I(const CudaModel *m) { return m->cfg.moe.moe_intermediate_size / m->etp; }
static inline int cuda_moe_shared_I(const CudaModel *m) { return m->cfg.moe.shared_expert_intermediate_size / m->etp; }

/* Where each local expert's rows are: expert j's are offsets[j] .. offsets[j+1] (host, experts + 1 entries);
 * d_offsets the same on the device. */
typedef struct CudaExpertRows {
    int experts;
    const int32_t *offsets, *d_offsets;
} CudaExpertRows;
/* gate_up (R, 2 Ie), act (R, Ie) and y (R, C) of the rows x (R, C), R = offsets[experts], through layer o's experts. */
void cuda_moe_experts_forward(CudaModel *m, const LayerOffsets *o, const CudaExpertRows *r, const bf16_t *x,
                              bf16_t *gate_up, bf16_t *act, bf16_t *y);
/* d_x (R, C, overwritten) from d_y (R, C); the experts' weight gradients accumulate (fp32). d_act and d_gate_up
 * are scratch of (R, Ie) and (R, 2 Ie). */
void cuda_moe_experts_backward(CudaModel *m, const LayerOffsets *o, const CudaExpertRows *r, const bf16_t *x,
                               const bf16_t *gate_up, const bf16_t *act, const bf16_t *d_y, bf16_t *d_act,
                               bf16_t *d_gate_up, bf16_t *d_x);

/* ---- cuda_model_zero1.c: the distributed optimizer (CudaModel.z1) ---- */

typedef struct CudaZero1 CudaZero1;
/* From the host's split (its buckets, this rank's parts); NULL with err set when it is not this model's. The
 * layers' offsets must be known (find_offsets). */
CudaZero1 *cuda_zero1_create(const CudaModel *m, const Zero1 *split, char *err, size_t errlen);
/* Its device scratch in the arena (layout), and its events once the arena is there. */
void cuda_zero1_layout(CudaModel *m, Carver *c);
void cuda_zero1_start(CudaModel *m);
void cuda_zero1_free(CudaZero1 *z);
/* The AdamW chunks of this rank's parts (norm_only: of the parameters it counts in the grad norm), their moments
 * at their place in the shard; *count of them (host array). */
CudaAdamWChunk *cuda_zero1_chunks(const Model *host, const Zero1 *split, bool norm_only, int *count);
/* The step's reduce-scatters: none enqueued yet (zero_grad); those layer l's backward completed (the last
 * micro-batch's); the rest but the held ones (the stage's last backward op; records comm_done). */
void cuda_zero1_step_begin(CudaModel *m);
void cuda_zero1_layer_done(CudaModel *m, int l);
void cuda_zero1_finish(CudaModel *m);
/* After the update: every bucket all-gathered and cast to bf16 on the comm stream. Then the compute stream waits
 * for layer l's parameters (l >= 0), the embedding's (-1) or all of them (-2). */
void cuda_zero1_gather(CudaModel *m);
void cuda_zero1_wait(CudaModel *m, int l);
/* The host's fp32 values of [offset, offset + count) into the model (bf16 copy, this rank's parts of the master, the
 * fp32 replica), and this rank's parts of the master into the host's flat array. */
void cuda_zero1_upload(CudaModel *m, long offset, long count, const float *host);
void cuda_zero1_download(CudaModel *m, float *host);
/* The fp32 values of the weight at flat `offset` that the GPU reads in fp32 (a MoE router, an expert_bias): the
 * master itself, or with the distributed optimizer their whole replica. */
const float *cuda_model_f32(CudaModel *m, long offset);

#endif
