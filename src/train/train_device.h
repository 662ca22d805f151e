/* train_device.h: the GPU side of a run (run.device: cuda). The host Model
 * keeps the registry and the weights for checkpoints; a CudaModel on the GPU
 * holds the fp32 master weights, gradients, AdamW states and activations and
 * does every step. Weights and optimizer states come back to the host before
 * a checkpoint is written, and go to the GPU after one is loaded.
 * Over several GPUs: one GPU per rank (its local rank picks it); data,
 * tensor and context parallel collectives through src/dist/device_comm.h
 * (NCCL), pipeline stages through pipeline_cuda.c.
 * In a build without CUDA (make without CUDA=1) attaching fails with a
 * message that says how to get one; nothing else is reachable then. */
#ifndef MT_TRAIN_TRAIN_DEVICE_H
#define MT_TRAIN_TRAIN_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "train_context.h"

/* Whether this binary was built with the CUDA backend. */
bool train_device_built(void);

/* Create the GPU model from ctx->model (weights) and ctx->optimizer (moments),
 * sized for the recipe's micro-batch. 0, or -1 with err set. */
int train_device_attach(TrainContext *ctx, char *err, size_t errlen);
void train_device_detach(TrainContext *ctx);

/* Forward of the micro-batch in ctx->inputs / ctx->targets; returns its
 * mean loss (and keeps what backward needs). */
double train_device_forward(TrainContext *ctx);
/* Backward of the last forward; returns when the GPU is done with it.
 * Gradients accumulate; on the last micro-batch of a step they are averaged
 * over the data-parallel GPUs (NCCL, overlapped with the backward) when
 * there are several. */
void train_device_backward(TrainContext *ctx, float loss_scale, bool last_micro_batch);
void train_device_zero_grad(TrainContext *ctx);
/* After the step's micro-batches (the pipeline's too): with tied embeddings
 * over pipeline stages, the first and last stages' embedding gradients
 * summed; returns when the GPU is done. */
void train_device_sync_grads(TrainContext *ctx);
double train_device_grad_norm(TrainContext *ctx);
/* One AdamW update (ctx->optimizer.step advances, as on the CPU); returns
 * when the GPU is done with it. */
void train_device_adamw(TrainContext *ctx, double lr, double grad_scale);
/* Weights and AdamW moments from the GPU into ctx->model / ctx->optimizer. */
void train_device_sync_to_host(TrainContext *ctx);
/* Gradients from the GPU into ctx->model->grads (to name a non-finite one). */
void train_device_sync_grads_to_host(TrainContext *ctx);
/* The GPU's dense bf16 peak in TFLOP/s from its name (datasheet values:
 * H100/H200 SXM 989, H100 PCIe 756, A100 312, ...), 0 when unknown. */
double train_device_peak_tflops(TrainContext *ctx);
/* NVML's energy meter for the run's GPU; false (why set) when unavailable. */
bool train_device_energy_open(TrainContext *ctx, char *why, int why_len);
/* Peak device memory of the process so far, in bytes. */
double train_device_peak_bytes(TrainContext *ctx);

#endif
