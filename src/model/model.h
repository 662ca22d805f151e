/* model.h: a dense decoder-only transformer (llama, qwen2, qwen3) on one rank.
 *
 * The param registry is the spine: model_create() declares every parameter
 * once (global name, shape, init, whether weight decay applies) and lays all
 * of them out in ONE allocation (params), with a matching one for grads.
 * The optimizer, checkpoints and convert walk model->params; nothing else
 * lists parameters again.
 *
 * Parameter names (ours; HF names are derived by the convert tables):
 *   embed.weight                       [V, C]
 *   layers.{i}.attn_norm.weight        [C]
 *   layers.{i}.attn.q_proj.weight      [H*D, C]     (+ .bias [H*D] with attention_bias)
 *   layers.{i}.attn.k_proj.weight      [KVH*D, C]   (+ .bias)
 *   layers.{i}.attn.v_proj.weight      [KVH*D, C]   (+ .bias)
 *   layers.{i}.attn.q_norm.weight      [D]          (qk_norm only)
 *   layers.{i}.attn.k_norm.weight      [D]          (qk_norm only)
 *   layers.{i}.attn.o_proj.weight      [C, H*D]
 *   layers.{i}.mlp_norm.weight         [C]
 *   layers.{i}.mlp.gate_proj.weight    [I, C]
 *   layers.{i}.mlp.up_proj.weight      [I, C]
 *   layers.{i}.mlp.down_proj.weight    [C, I]
 *   final_norm.weight                  [C]
 *   lm_head.weight                     [V, C]       (absent with tie_word_embeddings)
 * MoE layers (model.moe) have, instead of gate/up/down_proj:
 *   layers.{i}.mlp.router.weight               [E, C]
 *   layers.{i}.mlp.router.expert_bias          [E]       (load_balancing: expert_bias)
 *   layers.{i}.mlp.shared_expert.{gate,up}_proj.weight [Is, C], down_proj [C, Is]
 * and, declared after every other parameter (one region at the end):
 *   layers.{i}.mlp.experts.gate_proj.weight    [E, I, C]
 *   layers.{i}.mlp.experts.up_proj.weight      [E, I, C]
 *   layers.{i}.mlp.experts.down_proj.weight    [E, C, I]
 * With LoRA (model.peft, src/model/model_lora.c) the base weights above are
 * frozen and, declared after all of them (the trainable region at the end),
 * each targeted projection P of layer i (attn.{q,k,v,o}_proj,
 * mlp.{gate,up,down}_proj) has
 *   layers.{i}.P.lora_A.weight   [rank, in]
 *   layers.{i}.P.lora_B.weight   [out, rank]
 * Gradients (Model.grads) and AdamW moments exist for the trainable region
 * only: the parameters from Model.trainable_offset on (all of them without LoRA).
 */
#ifndef MT_MODEL_MODEL_H
#define MT_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../backend/backend.h"
#include "../config/recipe.h"
#include "../dist/comm.h"

/* INIT_UNIFORM: uniform in [-init_std, init_std) (LoRA's A: PEFT's kaiming_uniform_(a=sqrt(5)), bound 1/sqrt(in)). */
typedef enum { INIT_NORMAL, INIT_ONES, INIT_ZEROS, INIT_UNIFORM } ParamInit;

/* What a parameter belongs to (each sized by its own recipe keys: plan names them). */
typedef enum {
    PARAM_EMBEDDING,     /* embed.weight, lm_head.weight: model.vocab_size x hidden_size */
    PARAM_ATTENTION,     /* q/k/v/o, their biases and norms, and the layer and final norms: model.hidden_size */
    PARAM_MLP,           /* the dense gate/up/down: model.intermediate_size */
    PARAM_EXPERTS,       /* the router and the routed experts: model.moe.* */
    PARAM_SHARED_EXPERT, /* the shared expert: model.moe.shared_expert_intermediate_size */
    PARAM_ADAPTER,       /* LoRA's A and B: peft.rank */
    PARAM_KINDS
} ParamKind;

typedef struct ParamInfo {
    char name[96];
    int ndim;          /* 1, 2, or 3 (stacked experts) */
    long shape[3];     /* this rank's block; 1 past ndim */
    long numel;
    size_t offset;     /* in floats, into Model.params / Model.grads */
    ParamInit init;
    float init_std;    /* for INIT_NORMAL; the bound for INIT_UNIFORM */
    bool no_decay;     /* norms and biases: no weight decay */
    /* Where this rank's block sits in the whole tensor (model_partition.h):
     * shape == global_shape and start 0 unless tensor parallel splits it. */
    long global_shape[3];
    long global_start[3];
    int global_index;  /* index in the whole model's registry (an optional parameter's apart: model_registry.c):
                        * its init seeds */
    bool tp_partial_grad; /* its gradient is a partial sum over the tp group (q/k norms; norms under
                           * sequence parallel): summed over tp before the step */
    bool norm_owner;   /* counted by this rank in the global grad norm and gathered from it for a
                        * checkpoint (false for a copy another rank also holds) */
    bool expert;       /* routed experts' weights: split over ep, replicated over edp only */
    bool frozen;       /* not trained (LoRA's base weights): no gradient, no AdamW moments */
    ParamKind kind;
} ParamInfo;

typedef struct Model Model; /* layer pointers and activations are private */
typedef struct MoeStep MoeStep; /* the routing statistics of a step (src/model/moe_layer.h) */
typedef struct Fp8State Fp8State; /* the delayed-scaling state of the FP8 casts (src/model/model_fp8_state.c) */

#define MT_MAX_CHUNKS 16
#define MT_MAX_EP 1024

/* How one rank's model is cut (tensor, sequence and context parallel, and
 * its pipeline stage). Sizes of 1 and the whole layer range: the whole model. */
typedef struct ModelPartition {
    int tp, tp_rank;             /* heads, kv heads, intermediate and vocab split tp ways */
    bool sequence_parallel;      /* residual stream and norms on (B*T)/tp rows */
    int cp, cp_rank;             /* the sequence split cp ways, load-balanced (model_cp_positions) */
    int num_chunks;              /* model chunks: 1, or vpp with the interleaved pipeline schedule */
    int chunk_first[MT_MAX_CHUNKS];  /* first layer of each chunk (consecutive layers, chunks ascending) */
    int chunk_layers[MT_MAX_CHUNKS]; /* layers in each chunk */
    int num_layers;              /* layers of this rank: the sum of chunk_layers */
    bool has_embed;              /* the first stage: the input embedding */
    bool has_head;               /* the last stage: final norm, lm_head and the loss (with tied
                                  * embeddings and pp > 1 it holds a copy of embed.weight) */
    const Comm *tp_comm, *cp_comm; /* groups of tp and cp ranks (outlive the model) */
    const Comm *dp_comm;         /* the dp group (MoE global_aux_loss counts), NULL for one rank */
    int ep, ep_rank;             /* expert parallel: this rank holds experts [ep_rank, ep_rank + 1) * E/ep */
    int etp;                     /* expert tensor parallel: 1 (experts whole on every tp rank) or tp (their
                                  * intermediate split over the tp group) */
    const Comm *ep_comm;         /* the ep group (token dispatch), inside the dp group */
} ModelPartition;

/* The whole model on one rank. */
ModelPartition model_partition_whole(const ModelConfig *cfg);

/* Whether `part` can cut a resolved config: tp divides the heads, the kv
 * heads, intermediate_size and vocab_size; 2*cp divides seq_len (and, under
 * sequence parallel, tp divides seq_len / cp), unless seq_len is 0 (not known:
 * a registry-only model); the layer range lies inside the model. 0, or -1
 * with err naming what does not divide. */
int model_partition_check(const ModelConfig *cfg, const ModelPartition *part, int seq_len, char *err,
                          size_t errlen);

/* The positions context-parallel rank cp_rank holds of a sequence of T * cp
 * tokens, in its order: chunk cp_rank then chunk 2cp-1-cp_rank of T/2 tokens
 * each (the load-balanced causal split). */
void model_cp_positions(int T, int cp, int cp_rank, int32_t *positions);

struct Model {
    ModelConfig cfg;
    ModelPartition part;
    const BackendOps *ops;
    int num_params;          /* entries in param_info */
    ParamInfo *param_info;
    long num_floats;         /* total parameter count */
    float *params;           /* one allocation, num_floats */
    long trainable_offset;   /* params [trainable_offset, num_floats) train, those before are frozen (0 without
                              * LoRA); the registry declares the trainable parameters last */
    long num_grad_floats;    /* num_floats - trainable_offset: the gradients and each AdamW moment */
    float *grads;            /* one allocation, num_grad_floats, accumulated by backward: parameter p's
                              * gradient is at p->offset - trainable_offset (model_grad_of) */
    int max_B, max_T;        /* activation buffers sized for these */
    float last_loss;         /* mean loss of the last forward with targets (see loss_tokens) */
    double *loss_tokens;     /* train.loss per_token: > 0, each micro-batch's loss is its sum over counted
                              * targets divided by this (model_set_loss_tokens); 0: by its own count (the
                              * mean). Shared with clones. */
    void *priv;              /* activations and per-layer views (model.c) */
    bool shares_params;      /* a clone (model_clone_activations): params, grads, registry are base's */
    MoeStep *moe_step;       /* MoE families: the step's routing statistics (shared with clones) */
    Recompute recompute;     /* what the backward recomputes (train.recompute; model_forward.c) */
    bool fp8_on;             /* precision: fp8: the linear layers' products in emulated FP8 (model_set_fp8) */
    Fp8Config fp8;           /* its scaling (the recipe's fp8: section) */
    Fp8State *fp8_state;     /* fp8.recipe delayed: every cast's scale and amax history (shared with clones) */
};

/* Declare the parameters, allocate params/grads (zeroed) and activations for
 * micro-batches of up to max_B x max_T tokens (0 x 0: no activations, for a
 * model that is trained on a GPU and only holds the weights here). Dies on an
 * invalid config. */
Model *model_create(const ModelConfig *cfg, const BackendOps *ops, int max_B, int max_T);
/* The same for one rank's part (part->cp > 1: max_T counts this rank's tokens, seq_len / cp). */
Model *model_create_part(const ModelConfig *cfg, const ModelPartition *part, const BackendOps *ops, int max_B,
                         int max_T);
/* The same with activation recomputation (train.recompute): `selective`
 * keeps no attention probabilities, attention output or SwiGLU activation
 * per layer, `full` only each layer's input; the backward recomputes the
 * rest into one working set (shared with the model's clones). */
Model *model_create_recompute(const ModelConfig *cfg, const ModelPartition *part, const BackendOps *ops, int max_B,
                              int max_T, Recompute recompute);
void model_free(Model *model);

/* precision: fp8: from now on the linear layers' products (q|k|v, o,
 * gate|up, down) compute as Hopper's FP8 products with cfg's scaling,
 * exactly emulated (src/model/model_fp8.c); NULL: fp32 again. Clones made
 * afterwards inherit it. fp8.recipe delayed: every cast's scale comes from
 * its amax history (scale 1, zeros at first), updated once per step by
 * model_fp8_step_end. In a MoE layer the routed experts' products too, each with its own scales
 * (moe_dispatch.c). */
void model_set_fp8(Model *model, const Fp8Config *cfg);

/* fp8.recipe delayed (nothing otherwise): before a step's micro-batches, forget the amaxes recorded since the
 * last step (an evaluation's); after them (a collective over tp, cp and dp), each cast's largest amax of the step
 * over those groups updates its history and scale (fp8_scaling.h), as one rank of any layout would. */
void model_fp8_step_begin(Model *model);
void model_fp8_step_end(Model *model, const Comm *dp);
/* fp8.recipe delayed: the scales loaded from a checkpoint written under the fp8 settings `from`, made this model's.
 * A scale is fmax / amax / 2^margin (fp8_scaling.h), so another fp8.grad_format or fp8.margin multiplies it by a
 * power of two: exactly the scale the model's settings give the same amax. TE's initial scale of a tensor that has
 * seen no amax stays 1. amax_compute_algo needs nothing: it applies from the next update. Returns how many changed. */
int model_fp8_rescale(Model *model, const Fp8Config *from);

/* What a run checkpoints besides the parameters and the optimizer's moments: state that is not trained (today
 * fp8.recipe delayed's scales and amax histories of this rank's layers), as tensors that `info` describes like
 * parameters (whole on every rank: offsets into `data`, norm_owner on the rank that writes them). count 0: none. */
typedef struct ModelExtraState {
    const ParamInfo *info;
    int count;
    float *data;
    long num_floats;
} ModelExtraState;
ModelExtraState model_extra_state(const Model *model);
/* Whether a checkpoint tensor's name is extra state (of any model: "fp8.layers.*"). */
bool model_is_extra_state(const char *name);
/* Whether a parameter is a router's expert bias (load_balancing: expert_bias, "layers.L.mlp.router.expert_bias"):
 * zeros in a fresh model, as Megatron's, and what init_from starts at zero when its checkpoint has none. */
bool model_is_expert_bias(const char *name);

/* The activation memory of a model, in bytes: what each activation set holds
 * (the model itself, and each clone again: the layers' kept buffers, the
 * logits, the backward's scratch, the MoE layers' own buffers) and the
 * recompute working set, allocated once by the base model and shared by its
 * clones (0 with recompute none). */
typedef struct ModelActivationBytes {
    size_t per_set;
    size_t working_set;
} ModelActivationBytes;
ModelActivationBytes model_activation_bytes(const Model *model);

/* Initialise every parameter from `seed`: normal(0, init_std) for matrices
 * (o_proj and down_proj scaled by 1/sqrt(2*num_layers), as Megatron does),
 * ones for norms, zeros for biases; LoRA's A uniform in +-1/sqrt(in) and B
 * zeros, as PEFT starts them. The same seed gives the same bits. */
void model_init_weights(Model *model, uint64_t seed);

/* Forward a micro-batch of B x T tokens (B <= max_B, T <= max_T).
 * With targets != NULL also computes the per-token losses and returns their
 * mean over non-ignored targets (targets < 0 are ignored); else returns 0.
 * Keeps what backward needs. */
float model_forward(Model *model, const int32_t *inputs, const int32_t *targets, int B, int T);

/* The same in steps, for a pipeline stage (model_forward is start, layers, head):
 * start: keeps the micro-batch shape (and `inputs`, when not NULL) and, on
 *   the first stage, embeds them; other stages put the received activations
 *   into model_stage_input first;
 * layers: this rank's layers, leaving the result in model_stage_output;
 * head (last stage only): final norm, lm_head and the loss, as model_forward.
 * With several chunks (interleaved schedule) each chunk's layers run on
 * their own: model_stage_input/output(model, chunk).
 * The stage's activations are (B*T/tp under sequence parallel, else B*T) x hidden_size floats. */
void model_forward_start(Model *model, const int32_t *inputs, int B, int T);
void model_forward_layers(Model *model, int chunk);
float model_forward_head(Model *model, const int32_t *targets);
float *model_stage_input(Model *model, int chunk);
float *model_stage_output(Model *model, int chunk);
/* Backward in steps: head (last stage) fills model_stage_grad with the
 * gradient of the stage output; other stages put the received gradient there
 * first; layers turns it into the gradient of the stage input (in
 * model_stage_grad again); finish adds the embedding's gradient (first stage). */
void model_backward_head(Model *model, float loss_scale);
void model_backward_layers(Model *model, int chunk);
void model_backward_finish(Model *model);
float *model_stage_grad(Model *model);
/* Floats of a stage's activations for a B x T micro-batch. */
long model_stage_floats(const Model *model, int B, int T);

/* Another set of activations for `base`: a Model that shares base's
 * parameters, gradients and registry (a pipeline keeps one per micro-batch
 * in flight). model_free frees only what it owns. */
Model *model_clone_activations(const Model *base);

/* Copy between a rank's block of parameter p (laid out by its shape) and
 * the whole tensor (by its global shape): into the block when to_block. */
void model_copy_block(const ParamInfo *p, float *block, float *whole, bool to_block);

/* The registry of the rank `part` describes, without allocating a model
 * (checkpoint gathering): *count entries, *total_floats floats. free() it. */
ParamInfo *model_registry_of(const ModelConfig *cfg, const ModelPartition *part, int *count, long *total_floats);

/* Logits (B*T, V) of the last forward (valid until the next backward). */
const float *model_logits(const Model *model);

/* train.loss per_token: from now on the loss of a forward with targets is
 * its sum over counted targets divided by `tokens` (the step's counted
 * targets over micro-batches x dp: the usual mean over micro-batches and dp
 * ranks then gives the per-token mean of the whole batch, and the backward
 * the matching gradient); tokens 0: the mean over its own counted targets. */
void model_set_loss_tokens(Model *model, double tokens);

/* Packed rows for the next forwards (and their backwards) of B x T tokens
 * (T: this rank's): positions (B, T * cp), whole rows on every cp rank, is
 * each position's place in its sample (0 where a sample starts, then +1 per
 * position); a row's padding is written -1 - place (sft_packing.h): a sample
 * of its own that no loss counts, and that the MoE layers leave out of their
 * routing and statistics (no expert row, no load-balancing or z-loss term,
 * not in the capacity), as a row without padding would. Attention is
 * restricted to each sample (attention_forward_doc) and RoPE takes these
 * places, so a packed row computes what its samples would one by one, on any
 * layout. NULL: plain rows again. Dies on places that do not restart at 0
 * or count up by 1. */
void model_set_packed_positions(Model *model, const int32_t *positions, int B, int T);

/* Backward of the last forward with targets: grads += d(loss_scale * mean loss)/d params. */
void model_backward(Model *model, float loss_scale);

void model_zero_grad(Model *model);

/* Where trainable parameter p's gradient starts in model->grads (and its
 * AdamW moments in the optimizer's arrays): p->offset - trainable_offset.
 * NULL for a frozen parameter. */
float *model_grad_of(const Model *model, const ParamInfo *p);
/* The first trainable float of a registry (its first non-frozen parameter's
 * offset; total_floats when all are frozen). */
long registry_trainable_offset(const ParamInfo *infos, int count, long total_floats);

/* Look up a parameter by name; NULL if absent. */
const ParamInfo *model_find_param(const Model *model, const char *name);

/* The embedding this rank holds (the first pipeline stage's, or the last
 * stage's copy with tied embeddings), from the registry's slots; NULL if none. */
const ParamInfo *model_embed_param(const Model *model);

/* What a step's MoE layers did on this rank (model_moe_step_end). */
typedef struct MoeStepStats {
    int moe_layers;        /* MoE layers on this rank */
    double aux_loss;       /* load-balancing losses (with their coefficient), summed over layers, per micro-batch */
    double z_loss;         /* likewise the router z-losses */
    double imbalance_sum;  /* sum over this rank's MoE layers of max / mean tokens per expert (counts over dp) */
    long dropped, assignments; /* capacity drops and token-expert assignments of the step (this rank) */
    long spills, dispatches;   /* GPU under ep: the layer forwards whose expert side spilled past the arena's room,
                                * of all the step's (this rank; 0 of 0 on the CPU and at ep 1) */
} MoeStepStats;

/* The loss scale of the backward about to run through model_backward_layers
 * on a stage without the head (the MoE auxiliary losses use it). */
void model_set_backward_scale(Model *model, float loss_scale);

/* The auxiliary losses (load balancing and z-loss, with their coefficients)
 * of the last forward, summed over this rank's MoE layers: what backward
 * differentiates besides the cross entropy (times its loss_scale). */
double model_moe_last_aux(const Model *model);

/* Before a step's micro-batches: forget the last step's routing counts. */
void model_moe_step_begin(Model *model);
/* After them (a collective over dp): the counts summed over dp, the stats,
 * and with load_balancing: expert_bias and update_bias (the step was not
 * skipped) each expert's bias moved by moe.bias_update_rate toward the mean
 * load (+ when under, - when over). */
void model_moe_step_end(Model *model, const Comm *dp, long num_micro, bool update_bias, MoeStepStats *out);

/* Parameter count for a config without allocating anything. */
long model_count_params(const ModelConfig *cfg);

/* Model FLOPs per token for training (6N + attention, Megatron's count) at seq_len T. */
double model_flops_per_token(const ModelConfig *cfg, int T);

#endif
