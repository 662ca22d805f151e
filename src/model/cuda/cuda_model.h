/* cuda_model.h: the transformer (llama, qwen2, qwen3; mixtral and qwen3_moe
 * with every expert on the rank, cuda_model_moe.c) trained on one
 * GPU, or on one GPU per rank of a tensor-, context- and pipeline-parallel
 * layout (a pipeline stage holds its chunks' layers)
 * (with sequence parallel or not; the host Model's ModelPartition says which
 * part; under context parallel max_T and T count this rank's tokens), with
 * activation recomputation or not (train.recompute): fp32
 * master weights, fp32 gradients, AdamW states in fp32 or bf16
 * (optimizer.state_dtype), a bf16 copy of the weights that every product
 * reads, bf16 activations; with the distributed optimizer the master and the
 * states are this rank's shard (cuda_model_zero1.c).
 *
 * It mirrors a host Model (src/model): the same config, the same param
 * registry and the same flat layout, so params, grads and optimizer states
 * move between host and device as single copies (checkpoints and resume go
 * through the host Model). Everything is allocated at creation in one
 * device arena sized for micro-batches of up to max_B x max_T tokens: the
 * step loop never calls cudaMalloc or cudaFree.
 * Forward and backward follow src/model/model_forward.c and
 * model_backward.c op by op; the fusions are listed in cuda_model.c. */
#ifndef MT_MODEL_CUDA_MODEL_H
#define MT_MODEL_CUDA_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../../dist/zero1.h"
#include "../model.h"

typedef struct CudaModel CudaModel;

/* Adam hyper-parameters of one update (lr already scheduled). */
typedef struct CudaAdamWStep {
    double lr, beta1, beta2, eps, weight_decay;
    double grad_scale;   /* clipping factor, 1 when no clipping */
    long step;           /* 1-based number of this update (bias correction) */
} CudaAdamWStep;

/* What a CUDA model is built with beyond the host model's shape; all zero (or NULL for the whole struct): fp32
 * moments and no recompute. */
typedef struct CudaModelOptions {
    DType state_dtype;   /* optimizer.state_dtype: AdamW's moments, DTYPE_FP32 or DTYPE_BF16 */
    Recompute recompute; /* train.recompute: what the backward recomputes (cuda_model_pass.c); full needs a model
                          * without MoE layers */
    const Zero1 *zero1;  /* parallel.distributed_optimizer: this rank's split over dp (and edp), whose AdamW moments
                          * the model holds (cuda_model_zero1.c); NULL: all of them. Needs cuda_model_set_grad_sync
                          * (and with ep > 1 cuda_model_set_ep_comm) before the first backward */
} CudaModelOptions;

/* Create on GPU `device` for host->cfg, host->part and host->param_info
 * (this rank's blocks), upload host->params; AdamW's moments zero. NULL with
 * err set when there is no usable GPU, not enough memory, a model chunk
 * without layers or options it cannot take. With tp > 1 (cp > 1, ep > 1),
 * cuda_model_set_tp_comm (set_cp_comm, set_ep_comm) before the first
 * forward. */
CudaModel *cuda_model_create(const Model *host, int device, int max_B, int max_T, const CudaModelOptions *options,
                             char *err, size_t errlen);
void cuda_model_free(CudaModel *model);

/* Copies between the host arrays (params: num_floats fp32; m and v of the model's state_dtype, as adamw_m and
 * adamw_v hold them: num_floats, or with the distributed optimizer this rank's shard) and the device. With the
 * distributed optimizer the device holds this rank's parts of the fp32 master only: download writes those into
 * params (the caller all-gathers the rest over dp), upload keeps those of the whole params it is given. Uploading params also refreshes their bf16 copy. m and v may be
 * NULL (left as is). */
void cuda_model_upload(CudaModel *model, const float *params, const void *m, const void *v);
void cuda_model_download(CudaModel *model, float *params, void *m, void *v);
/* params[offset, offset + count) (and their bf16 copy) from host (the MoE expert biases after a step). */
void cuda_model_upload_range(CudaModel *model, long offset, long count, const float *host);
/* Every MoE layer's expert_bias from host_params (the host's flat array, after model_moe_step_end moved them). */
void cuda_model_upload_expert_biases(CudaModel *model, const float *host_params);
/* The loss scale of the backward about to run through cuda_model_backward_layers on a pipeline stage without the
 * head (the MoE auxiliary losses use it; backward_head sets it on the last stage). */
void cuda_model_set_loss_scale(CudaModel *model, float loss_scale);
/* The fp32 gradients from and to the host (health checks, tests). */
void cuda_model_download_grads(CudaModel *model, float *grads);
void cuda_model_upload_grads(CudaModel *model, const float *grads);

/* Forward a micro-batch (tokens are host arrays of B*T); with targets,
 * returns the mean loss over targets >= 0 and keeps what backward needs. */
float cuda_model_forward(CudaModel *model, const int32_t *inputs, const int32_t *targets, int B, int T);
/* The same in steps, for a pipeline stage (cuda_model_forward is start,
 * layers, head): start keeps the micro-batch shape and, on the first stage,
 * embeds `inputs` (other stages first receive their input:
 * cuda_model_stage_from_host); layers runs one chunk's layers (a chunk per
 * virtual stage of the interleaved schedule, else one); head (last stage)
 * the final norm, the logits and, with targets, the loss. */
void cuda_model_forward_start(CudaModel *model, const int32_t *inputs, int B, int T);
void cuda_model_forward_layers(CudaModel *model, int chunk);
float cuda_model_forward_head(CudaModel *model, const int32_t *targets);
/* The experts local layer l chose for each token in the last forward ((B*T, k) into selected, host): true, or
 * false when layer l has no MoE MLP (tests). Under train.recompute: full the MoE layers share one set of buffers:
 * only the layer forwarded (or recomputed) last is there. */
bool cuda_model_download_routing(CudaModel *model, int l, int32_t *selected);
/* Logits (B*T, V) of the last forward, as fp32 on the host (tests, eval). */
void cuda_model_download_logits(CudaModel *model, float *logits);
/* grads += d(loss_scale * mean loss)/d params for the last forward. On the
 * last micro-batch of a step: the gradients that are partial over tp
 * (q/k-norm weights, and the norms under sequence parallel) are summed over
 * tp, and with a grad sync set every layer's gradients are averaged over the
 * data-parallel group as soon as that layer's backward is done, on a second
 * stream, while the backward of the layers below goes on; the rest
 * (embedding, final norm, lm_head) after the last. The call returns with the
 * averages ordered before later work. */
void cuda_model_backward(CudaModel *model, float loss_scale, int last_micro_batch);
/* The same in steps: head (last stage), layers (other stages first receive
 * the gradient of their output), finish (first stage: the embedding). The
 * last micro-batch's reductions of the parameters outside the layers run in
 * finish, or in layers of chunk 0 on a stage without the embedding (then
 * cuda_model_wait_grad_sync before the gradients are read). */
void cuda_model_backward_head(CudaModel *model, float loss_scale);
void cuda_model_backward_layers(CudaModel *model, int chunk, bool last_micro_batch);
void cuda_model_backward_finish(CudaModel *model, bool last_micro_batch);
/* Pipeline transfers through the host: a chunk's activations (bf16, its
 * residual rows x hidden) or, with grad, their gradient (fp32). to_host
 * copies the chunk's output (forward) or the gradient of its input
 * (backward); from_host fills the chunk's input or the gradient of its
 * output. Both return with the copy done. */
size_t cuda_model_stage_bytes(const CudaModel *model, bool grad);
void cuda_model_stage_to_host(CudaModel *model, int chunk, bool grad, void *host);
void cuda_model_stage_from_host(CudaModel *model, int chunk, bool grad, const void *host);
/* Pipeline transfers GPU to GPU (issue 18, item 5): NCCL send / receive over `comm`, the pipeline group (one GPU a
 * rank: not a staged group). Set on the base before clones are made (they share it). Then stage_send records a
 * send of the chunk's output (forward) or of the gradient of its input (backward, copied aside at once: the
 * activation sets share the gradient buffer, which a receive of the same group may fill) to `peer`, stage_recv a
 * receive into the chunk's input or the gradient of its output, and stage_post posts what was recorded (of any
 * activation set) as one NCCL group on the model's stream, then mirrors a received gradient in bf16. Ordered on
 * the stream like the ops around them: nothing waits on the host. */
struct DeviceComm;
void cuda_model_set_pp_comm(CudaModel *model, struct DeviceComm *comm);
bool cuda_model_stage_direct(const CudaModel *model);
void cuda_model_stage_send(CudaModel *model, int chunk, bool grad, int peer);
void cuda_model_stage_recv(CudaModel *model, int chunk, bool grad, int peer);
void cuda_model_stage_post(CudaModel *model);
/* Another set of activations for `base` (a pipeline keeps one per
 * micro-batch in flight): a model sharing base's weights, gradients, AdamW
 * states, scratch and communicators (a copy of them: make clones after
 * the set_* calls). NULL with err set when the GPU has no
 * room. cuda_model_free frees only what it owns; free clones before base. */
CudaModel *cuda_model_clone_activations(CudaModel *base, char *err, size_t errlen);
/* Average gradients over `comm` (the data-parallel group) in backward. */
struct DeviceComm;
void cuda_model_set_grad_sync(CudaModel *model, struct DeviceComm *comm);
/* grads[offset, offset + count) summed over `comm` (the tied embedding over pipeline stages). */
void cuda_model_sum_grads(CudaModel *model, struct DeviceComm *comm, long offset, long count);
/* The tensor-parallel group's communicator (its size is host->part.tp). */
void cuda_model_set_tp_comm(CudaModel *model, struct DeviceComm *comm);
/* Expert parallel: the ep group's communicator (the token all-to-all; its size is host->part.ep) and the
 * group of the ranks holding the same experts (edp: their gradients' average; NULL or a group of one: none).
 * Before the first forward, and with data parallel after cuda_model_set_grad_sync. */
void cuda_model_set_ep_comm(CudaModel *model, struct DeviceComm *ep, struct DeviceComm *edp);
/* The context-parallel group's communicator (its size is host->part.cp). */
void cuda_model_set_cp_comm(CudaModel *model, struct DeviceComm *comm);
void cuda_model_zero_grad(CudaModel *model);
/* The distributed optimizer with a tied embedding over pipeline stages: the gradients of [offset, offset + count)
 * (the embedding on this stage) are summed over the stages first, so the buckets touching them are left out of the
 * backward's reduce-scatters until cuda_model_zero1_reduce_held (after cuda_model_sum_grads), which returns with the
 * compute stream ordered after them. Both do nothing without the distributed optimizer. */
void cuda_model_zero1_hold(CudaModel *model, long offset, long count);
void cuda_model_zero1_reduce_held(CudaModel *model);
/* The compute stream waits for the data-parallel averages of the last
 * backward (a pipeline stage without the embedding leaves that to its
 * caller, so that its gradient is sent upstream first). */
void cuda_model_wait_grad_sync(CudaModel *model);
/* 0, or -1 with err set when one of the model's communicators (dp, tp, cp,
 * ep, edp, the pipeline's) failed asynchronously (a peer died). */
int cuda_model_comms_failed(CudaModel *model, char *err, size_t errlen);
/* Whether the GPU has done everything enqueued so far (does not wait). */
bool cuda_model_idle(CudaModel *model);
/* Wait until the GPU has done everything enqueued so far. */
void cuda_model_synchronize(CudaModel *model);
/* The sum of squares of the gradients (fp32 squares, double partial sums);
 * under tensor parallel each parameter counted once over the tp group (a
 * collective); with the distributed optimizer this rank's parts, summed over
 * dp. With pipeline parallel, the caller sums it over the stages. */
double cuda_model_grad_sumsq(CudaModel *model);
/* Its square root (one stage). */
double cuda_model_grad_norm(CudaModel *model);
/* One AdamW update of every parameter (decay skipped on norms and biases); with the distributed optimizer of this
 * rank's parts, then every part all-gathered over dp on the comm stream (the next forward's layers wait for their
 * own buckets only). */
void cuda_model_adamw(CudaModel *model, const CudaAdamWStep *step);

/* Bytes of device memory the model holds, and the peak the process reached
 * (cudaMemGetInfo: total minus the least free seen). */
size_t cuda_model_bytes(const CudaModel *model);
/* Bytes of one activation set (what each cuda_model_clone_activations adds). */
size_t cuda_model_activation_bytes(const CudaModel *model);
size_t cuda_model_peak_bytes(CudaModel *model);
/* "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)" */
const char *cuda_model_device_name(const CudaModel *model);
/* The GPU's PCI bus id ("0000:3B:00.0"), for NVML. */
void cuda_model_pci_bus_id(const CudaModel *model, char *out, int len);

#endif
