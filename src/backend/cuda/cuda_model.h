/* cuda_model.h: the dense transformer (llama, qwen2, qwen3) trained on one
 * GPU, or on one GPU per rank of a tensor- and context-parallel layout
 * (with sequence parallel or not; the host Model's ModelPartition says which
 * part; under context parallel max_T and T count this rank's tokens): fp32
 * master weights, fp32 gradients and AdamW states, a bf16 copy of
 * the weights that every product reads, bf16 activations.
 *
 * It mirrors a host Model (src/model): the same config, the same param
 * registry and the same flat layout, so params, grads and optimizer states
 * move between host and device as single copies (checkpoints and resume go
 * through the host Model). Everything is allocated at creation in one
 * device arena sized for micro-batches of up to max_B x max_T tokens: the
 * step loop never calls cudaMalloc or cudaFree.
 * Forward and backward follow src/model/model_forward.c and
 * model_backward.c op by op; the fusions are listed in cuda_model.c. */
#ifndef MT_BACKEND_CUDA_MODEL_H
#define MT_BACKEND_CUDA_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "../../model/model.h"

typedef struct CudaModel CudaModel;

/* Adam hyper-parameters of one update (lr already scheduled). */
typedef struct CudaAdamWStep {
    double lr, beta1, beta2, eps, weight_decay;
    double grad_scale;   /* clipping factor, 1 when no clipping */
    long step;           /* 1-based number of this update (bias correction) */
} CudaAdamWStep;

/* Create on GPU `device` for host->cfg, host->part and host->param_info
 * (this rank's blocks), upload host->params. NULL with err set when there is
 * no usable GPU, not enough memory, or a part with pipeline stages or
 * experts. With tp > 1 (cp > 1), cuda_model_set_tp_comm (set_cp_comm) before
 * the first forward. */
CudaModel *cuda_model_create(const Model *host, int device, int max_B, int max_T, char *err, size_t errlen);
void cuda_model_free(CudaModel *model);

/* Copies between the host arrays (num_floats each) and the device. Uploading
 * params also refreshes their bf16 copy. m and v may be NULL (left as is). */
void cuda_model_upload(CudaModel *model, const float *params, const float *m, const float *v);
void cuda_model_download(CudaModel *model, float *params, float *m, float *v);
/* The fp32 gradients from and to the host (health checks, tests). */
void cuda_model_download_grads(CudaModel *model, float *grads);
void cuda_model_upload_grads(CudaModel *model, const float *grads);

/* Forward a micro-batch (tokens are host arrays of B*T); with targets,
 * returns the mean loss over targets >= 0 and keeps what backward needs. */
float cuda_model_forward(CudaModel *model, const int32_t *inputs, const int32_t *targets, int B, int T);
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
/* Average gradients over `comm` (the data-parallel group) in backward. */
struct DeviceComm;
void cuda_model_set_grad_sync(CudaModel *model, struct DeviceComm *comm);
/* The tensor-parallel group's communicator (its size is host->part.tp). */
void cuda_model_set_tp_comm(CudaModel *model, struct DeviceComm *comm);
/* The context-parallel group's communicator (its size is host->part.cp). */
void cuda_model_set_cp_comm(CudaModel *model, struct DeviceComm *comm);
void cuda_model_zero_grad(CudaModel *model);
/* Wait until the GPU has done everything enqueued so far. */
void cuda_model_synchronize(CudaModel *model);
/* L2 norm of all gradients (fp32 squares, double partial sums); under tensor
 * parallel each parameter counted once over the tp group (a collective). */
double cuda_model_grad_norm(CudaModel *model);
/* One AdamW update of every parameter (decay skipped on norms and biases). */
void cuda_model_adamw(CudaModel *model, const CudaAdamWStep *step);

/* Bytes of device memory the model holds, and the peak the process reached
 * (cudaMemGetInfo: total minus the least free seen). */
size_t cuda_model_bytes(const CudaModel *model);
size_t cuda_model_peak_bytes(CudaModel *model);
/* "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)" */
const char *cuda_model_device_name(const CudaModel *model);
/* The GPU's PCI bus id ("0000:3B:00.0"), for NVML. */
void cuda_model_pci_bus_id(const CudaModel *model, char *out, int len);

#endif
