/* model_device.h: the model as the training loop sees it, on whichever
 * device computes it. A ModelDevice is one rank's part of the model (the
 * host Model: the registry and the weights), its optimizer state, and an
 * implementation behind a table of functions (ModelDeviceOps, in the spirit
 * of ggml's backend tables):
 *   cpu   model_device_cpu.c: the host Model itself computes, in fp32
 *         (src/model/model_*.c); gradients reduced over MPI (grad_reduce.c),
 *         AdamW on the host (optimizer.c), the distributed optimizer (ZeRO-1).
 *   cuda  cuda/model_device_cuda.c: the CUDA model (cuda/cuda_model.h)
 *         holds the fp32 master weights, gradients, AdamW states and bf16
 *         activations on the rank's GPU; collectives through NCCL (or staged
 *         through the host, dist/device_comm.h). The host Model keeps the
 *         registry and a copy of the weights for checkpoints.
 * The training loop, the pipeline executor and evaluation (src/train) call
 * only this interface; none of them asks which device it is. Everything
 * here that is a collective is called by every rank of the groups named.
 *
 * A step, as src/train/train_step.c drives it:
 *   zero_grad, step_begin;
 *   per micro-batch: forward, backward (or, pp > 1, the stage ops through
 *     the pipeline executor, src/train/pipeline.c);
 *   reduce_grads: every rank holds its part of the single-rank gradient;
 *   grad_sumsq (summed over the stages by the loop), clipping, then
 *   optimizer_step; moe_step_end; fp8_step_end.
 * Checkpoints: to_host before the host's weights and moments are read,
 * from_host after they were written (initialisation, init_from, resume). */
#ifndef MT_MODEL_MODEL_DEVICE_H
#define MT_MODEL_MODEL_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../config/recipe.h"
#include "../dist/comm.h"
#include "../dist/grid.h"
#include "../dist/zero1.h"
#include "model.h"
#include "optimizer.h"

/* One pipeline stage's model, as the executor (src/train/pipeline.h) drives
 * it. A slot is one set of activations (the device's stage_base, or a clone
 * sharing its weights and gradients). `last` marks the backward of the
 * step's last micro-batch (its gradient reductions may start there). */
typedef struct PipelineStageOps {
    void *(*clone)(void *base);
    void (*free_clone)(void *slot);
    /* inputs NULL off the first stage; positions: the micro-batch's packed places on every stage (the device's
     * set_positions, for this slot), NULL for plain rows */
    void (*forward_start)(void *slot, const int32_t *inputs, const int32_t *positions, int B, int T);
    void (*forward_layers)(void *slot, int chunk);
    double (*forward_head)(void *slot, const int32_t *targets);
    void (*backward_head)(void *slot, float loss_scale);
    void (*backward_layers)(void *slot, int chunk, float loss_scale, bool last);
    void (*backward_finish)(void *slot, bool last);
    /* A send of the chunk's output (forward) or of the stage input's gradient (backward) that takes the data at
     * once (the slot may be reused on return; comm_wait_sends completes it), and the matching receive into the
     * chunk's input or the stage output's gradient; micro-batches of B x T tokens. The executor posts them in the
     * groups of src/dist/pipeline_transfers.h, so they may be unbuffered (rendezvous) as NCCL's are. */
    void (*send)(void *slot, int chunk, bool backward, const Comm *group, int dest, int tag, int B, int T);
    void (*recv)(void *slot, int chunk, bool backward, const Comm *group, int source, int tag, int B, int T);
    /* After a group's sends and receives: a transport that posts them together (NCCL's grouped send / receive)
     * does so now; one that posted each at once (MPI) does nothing. transport names it for the log. */
    void (*post_transfers)(void *base);
    const char *(*transport)(void *base);
    /* Bytes of one more activation set (what a clone adds); 0 when not known. */
    size_t (*slot_bytes)(void *base);
} PipelineStageOps;

typedef struct ModelDevice ModelDevice;

typedef struct ModelDeviceOps {
    const char *name;                         /* run.device: "cpu", "cuda" */
    void (*destroy)(ModelDevice *d);          /* the implementation's part (model_device_free does the rest) */
    /* Weights and AdamW moments: host -> device (after the host's were written) and device -> host (before
     * they are read: checkpoints, replica checks; with the distributed optimizer on a device that shards the
     * master, a collective over dp). grads_to_host: the gradients into host->grads. */
    void (*from_host)(ModelDevice *d);
    void (*to_host)(ModelDevice *d);
    void (*grads_to_host)(ModelDevice *d);
    void (*zero_grad)(ModelDevice *d);
    /* Forward of a micro-batch of B x T tokens (this rank's, host arrays): its mean loss over targets >= 0; keeps
     * what backward needs. Backward: grads += d(loss_scale * loss)/d params; `last` on the step's last
     * micro-batch (the data-parallel reductions may start during it). */
    double (*forward)(ModelDevice *d, const int32_t *inputs, const int32_t *targets, int B, int T);
    void (*backward)(ModelDevice *d, float loss_scale, bool last);
    /* train.loss per_token: the divisor of each later micro-batch's summed loss (model_set_loss_tokens:
     * the step's counted targets / (micro-batches x dp)); 0: each micro-batch's mean. */
    void (*set_loss_tokens)(ModelDevice *d, double tokens);
    /* data.pack: the next micro-batches' rows are packed samples; positions (B x T * cp, host: whole rows) is each
     * position's place in its sample (model_set_packed_positions). NULL: plain rows. Call before the forward
     * (a pipeline stage gets them through forward_start instead). */
    void (*set_positions)(ModelDevice *d, const int32_t *positions, int B, int T);
    /* Collective (tp, cp, dp, the embedding group): after a step's micro-batches, every rank holds its part of the
     * single-rank gradient (grad_reduce.h says which part). */
    void (*reduce_grads)(ModelDevice *d);
    /* Collective (tp; dp and ep where the gradient is split over them): the sum of squares of this pipeline
     * stage's gradient, each parameter counted once; the same bits on every rank of the stage. */
    double (*grad_sumsq)(ModelDevice *d);
    /* One AdamW update (d->optimizer.step advances) with gradients scaled by grad_scale (clipping). */
    void (*optimizer_step)(ModelDevice *d, const OptimizerConfig *cfg, double lr, double grad_scale);
    /* MoE routing statistics of the step: begin before its micro-batches; end after the update (a collective
     * over dp; update_bias when the update ran) returns false when the model has no MoE layer. */
    void (*step_begin)(ModelDevice *d);
    bool (*moe_step_end)(ModelDevice *d, long num_micro, bool update_bias, MoeStepStats *out);
    /* precision: fp8 with fp8.recipe delayed (nothing otherwise): after the step (a collective over tp, cp and
     * dp), the step's amaxes update every FP8 cast's history and scale (model_fp8_step_end); step_begin has
     * forgotten the amaxes recorded before the step. */
    void (*fp8_step_end)(ModelDevice *d);
    /* 0, or -1 with err set when a communicator failed asynchronously (a peer died). */
    int (*comms_check)(ModelDevice *d, char *err, size_t errlen);
    /* The device's dense bf16 peak in TFLOP/s (0: unknown), the peak memory this process used on it, and the
     * PCI bus id NVML knows it by (false: none). */
    double (*peak_tflops)(ModelDevice *d);
    double (*peak_bytes)(ModelDevice *d);
    bool (*pci_bus_id)(ModelDevice *d, char *out, int len);
    const PipelineStageOps *stage;            /* pp > 1: the stage steps of stage_base */
} ModelDeviceOps;

struct ModelDevice {
    const ModelDeviceOps *ops;
    Model *host;             /* this rank's registry and weights (on the CPU: the model that computes) */
    AdamW optimizer;         /* the moments on the host (with zero1: this rank's shard) and the update count */
    Zero1 zero1;             /* the distributed optimizer's split (zero1_on) */
    bool zero1_on;
    const Grid *grid;        /* the process grid the collectives run over */
    bool host_current;       /* host weights, gradients and moments are always the device's (the CPU) */
    bool eval_lockstep;      /* a forward has collectives over dp: every dp rank runs as many (MoE on the CPU) */
    void *stage_base;        /* the pipeline's base slot (PipelineStageOps) */
    void *impl;              /* the implementation's state */
};

/* The tables of an implementation: each names its functions device_* and
 * stage_* (static in its file), so that one list fills either table and
 * neither can leave an entry out. */
#define MODEL_DEVICE_STAGE_OPS                                                                                     \
    {.clone = stage_clone, .free_clone = stage_free_clone, .forward_start = stage_forward_start,                  \
     .forward_layers = stage_forward_layers, .forward_head = stage_forward_head,                                   \
     .backward_head = stage_backward_head, .backward_layers = stage_backward_layers,                               \
     .backward_finish = stage_backward_finish, .send = stage_send, .recv = stage_recv,                           \
     .post_transfers = stage_post_transfers, .transport = stage_transport, .slot_bytes = stage_slot_bytes}
#define MODEL_DEVICE_OPS(device_name, stage_ops)                                                                   \
    {.name = device_name, .destroy = device_destroy, .from_host = device_from_host, .to_host = device_to_host,     \
     .grads_to_host = device_grads_to_host, .zero_grad = device_zero_grad, .forward = device_forward,             \
     .backward = device_backward, .set_loss_tokens = device_set_loss_tokens,      \
     .set_positions = device_set_positions, .reduce_grads = device_reduce_grads, .grad_sumsq = device_grad_sumsq,           \
     .optimizer_step = device_optimizer_step, .step_begin = device_step_begin,                                    \
     .moe_step_end = device_moe_step_end, .fp8_step_end = device_fp8_step_end, .comms_check = device_comms_check, .peak_tflops = device_peak_tflops,   \
     .peak_bytes = device_peak_bytes, .pci_bus_id = device_pci_bus_id, .stage = (stage_ops)}

/* What a device is made from. */
typedef struct ModelDeviceSetup {
    const char *device;              /* run.device */
    const ModelConfig *cfg;
    const ParallelConfig *parallel;  /* the recipe's layout (every rank's pipeline stages) */
    const ModelPartition *part;      /* this rank's part (its comms point into grid) */
    const Grid *grid;
    int micro_batch_size, seq_len;   /* seq_len: this rank's tokens of a sample (seq_len / cp) */
    bool distributed_optimizer;      /* parallel.distributed_optimizer (used with dp > 1) */
    DType precision;
    const Fp8Config *fp8;            /* precision: fp8: the recipe's fp8: section (NULL otherwise) */
    Recompute recompute;             /* train.recompute (what the backward recomputes) */
    LossReduction loss;              /* train.loss */
    bool packed;                     /* data.pack: packed rows with per-sample attention */
    DType state_dtype;               /* optimizer.state_dtype: AdamW's moments (fp32 when zero) */
} ModelDeviceSetup;

/* Whether `name` is a device (run.device's values: "cpu", "cuda"), built in or not. */
bool model_device_exists(const char *name);

/* Whether `s` can run on s->device in this build, before anything is
 * allocated: 0, or an exit status (MT_EXIT_USAGE: the recipe asks for
 * what the device cannot do; MT_EXIT_FAILURE: the build lacks the device)
 * with err naming the key. */
int model_device_check(const ModelDeviceSetup *s, char *err, size_t errlen);

/* Create the host Model (weights zeroed), the optimizer state and the
 * device's model (a collective: communicators). NULL with err set. Then
 * write the host weights and call ops->from_host. */
ModelDevice *model_device_create(const ModelDeviceSetup *s, char *err, size_t errlen);
void model_device_free(ModelDevice *d);

/* The implementations' constructors (model_device_create picks one). */
ModelDevice *model_device_cpu_create(const ModelDeviceSetup *s, char *err, size_t errlen);
ModelDevice *model_device_cuda_create(const ModelDeviceSetup *s, char *err, size_t errlen);
int model_device_cuda_check(const ModelDeviceSetup *s, char *err, size_t errlen);

/* What run.device: cuda does not run yet (model_device_limits.c; host code in
 * every build): how many of the setup's settings it cannot take, with err
 * naming each key and what to set instead (one line each, after a summary
 * line, when there are several). Reads only cfg, parallel, precision,
 * packed and loss. */
int model_device_cuda_limits(const ModelDeviceSetup *s, char *err, size_t errlen);
/* The CUDA model's limits, for its own guards too: the attention kernels'
 * head sizes, and (NULL when none is hit) what a MoE model over etp ranks
 * would need. */
bool model_cuda_head_dim_ok(int head_dim);
const char *model_cuda_moe_limit(const ModelConfig *cfg, int etp);

/* For the implementations: the fields every device shares (host Model with
 * activations for B x T when host_computes, optimizer, zero1). */
ModelDevice *model_device_new(const ModelDeviceSetup *s, const ModelDeviceOps *ops, bool host_computes);

#endif
