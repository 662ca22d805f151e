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
 */
#ifndef MT_MODEL_MODEL_H
#define MT_MODEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../backend/backend.h"
#include "../config/recipe.h"

typedef enum { INIT_NORMAL, INIT_ONES, INIT_ZEROS } ParamInit;

typedef struct ParamInfo {
    char name[96];
    int ndim;          /* 1 or 2 */
    long shape[2];     /* shape[1] = 1 for 1-D */
    long numel;
    size_t offset;     /* in floats, into Model.params / Model.grads */
    ParamInit init;
    float init_std;    /* for INIT_NORMAL */
    bool no_decay;     /* norms and biases: no weight decay */
} ParamInfo;

typedef struct Model Model; /* layer pointers and activations are private */

struct Model {
    ModelConfig cfg;
    const BackendOps *ops;
    int num_params;          /* entries in param_info */
    ParamInfo *param_info;
    long num_floats;         /* total parameter count */
    float *params;           /* one allocation, num_floats */
    float *grads;            /* one allocation, num_floats, accumulated by backward */
    int max_B, max_T;        /* activation buffers sized for these */
    float last_loss;         /* mean loss of the last forward with targets */
    void *priv;              /* activations and per-layer views (model.c) */
};

/* Declare the parameters, allocate params/grads (zeroed) and activations for
 * micro-batches of up to max_B x max_T tokens (0 x 0: no activations, for a
 * model that is trained on a GPU and only holds the weights here). Dies on an
 * invalid config. */
Model *model_create(const ModelConfig *cfg, const BackendOps *ops, int max_B, int max_T);
void model_free(Model *model);

/* Initialise every parameter from `seed`: normal(0, init_std) for matrices
 * (o_proj and down_proj scaled by 1/sqrt(2*num_layers), as Megatron does),
 * ones for norms, zeros for biases. The same seed gives the same bits. */
void model_init_weights(Model *model, uint64_t seed);

/* Forward a micro-batch of B x T tokens (B <= max_B, T <= max_T).
 * With targets != NULL also computes the per-token losses and returns their
 * mean over non-ignored targets (targets < 0 are ignored); else returns 0.
 * Keeps what backward needs. */
float model_forward(Model *model, const int32_t *inputs, const int32_t *targets, int B, int T);

/* Logits (B*T, V) of the last forward (valid until the next backward). */
const float *model_logits(const Model *model);

/* Backward of the last forward with targets: grads += d(loss_scale * mean loss)/d params. */
void model_backward(Model *model, float loss_scale);

void model_zero_grad(Model *model);

/* Look up a parameter by name; NULL if absent. */
const ParamInfo *model_find_param(const Model *model, const char *name);

/* Parameter count for a config without allocating anything. */
long model_count_params(const ModelConfig *cfg);

/* Model FLOPs per token for training (6N + attention, Megatron's count) at seq_len T. */
double model_flops_per_token(const ModelConfig *cfg, int T);

#endif
