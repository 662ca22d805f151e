/* pipeline_cuda.c: the CUDA model as a pipeline stage (pipeline.h): clones
 * for the activation sets (cuda_model_clone_activations), the stage steps
 * of cuda_model.h, and transfers staged through the host: the activations
 * (bf16) or their gradients (fp32) copied out of the GPU, sent with a
 * buffered MPI send, received and copied in. Simple and deadlock-free for
 * any schedule (NCCL's sends block until the peer's receive is posted);
 * the price is two PCIe copies per transfer. CUDA-only (make CUDA=1). */
#ifdef MT_CUDA
#include "pipeline_cuda.h"

#include <stdlib.h>

#include "../model/cuda/cuda_model.h"
#include "../core/error.h"

static void *host_buffer; /* staging for one transfer (comm_send_copy copies it again) */
static size_t host_bytes;

static void *staging(size_t bytes) {
    if (bytes > host_bytes) {
        host_buffer = mt_realloc(host_buffer, bytes);
        host_bytes = bytes;
    }
    return host_buffer;
}

/* Transfers go as 4-byte words when they can (MPI counts are ints: bf16 activations of the hidden size always can). */
static CommType word_type(size_t bytes) { return bytes % 4 == 0 ? COMM_FLOAT : COMM_BYTE; }
static size_t words(size_t bytes) { return bytes % 4 == 0 ? bytes / 4 : bytes; }

static void *gpu_clone(void *base) {
    char err[512];
    CudaModel *m = cuda_model_clone_activations(base, err, sizeof err);
    if (!m) mt_die(MT_EXIT_FAILURE, "pipeline: %s", err);
    return m;
}

static void gpu_free_clone(void *slot) { cuda_model_free(slot); }

static void gpu_forward_start(void *slot, const int32_t *inputs, int B, int T) {
    cuda_model_forward_start(slot, inputs, B, T);
}

static void gpu_forward_layers(void *slot, int chunk) { cuda_model_forward_layers(slot, chunk); }
static double gpu_forward_head(void *slot, const int32_t *targets) { return cuda_model_forward_head(slot, targets); }
static void gpu_backward_head(void *slot, float loss_scale) { cuda_model_backward_head(slot, loss_scale); }

static void gpu_backward_layers(void *slot, int chunk, float loss_scale, bool last) {
    cuda_model_backward_layers(slot, chunk, last);
}

static void gpu_backward_finish(void *slot, bool last) { cuda_model_backward_finish(slot, last); }

static void gpu_send(void *slot, int chunk, bool backward, const Comm *group, int dest, int tag, int B, int T) {
    const size_t bytes = cuda_model_stage_bytes(slot, backward);
    void *buf = staging(bytes);
    cuda_model_stage_to_host(slot, chunk, backward, buf);
    comm_send_copy(group, buf, words(bytes), word_type(bytes), dest, tag);
}

static void gpu_recv(void *slot, int chunk, bool backward, const Comm *group, int source, int tag, int B, int T) {
    const size_t bytes = cuda_model_stage_bytes(slot, backward);
    void *buf = staging(bytes);
    comm_recv(group, buf, words(bytes), word_type(bytes), source, tag);
    cuda_model_stage_from_host(slot, chunk, backward, buf);
}

const PipelineStageOps pipeline_cuda_ops = {
    .clone = gpu_clone,
    .free_clone = gpu_free_clone,
    .forward_start = gpu_forward_start,
    .forward_layers = gpu_forward_layers,
    .forward_head = gpu_forward_head,
    .backward_head = gpu_backward_head,
    .backward_layers = gpu_backward_layers,
    .backward_finish = gpu_backward_finish,
    .send = gpu_send,
    .recv = gpu_recv,
};
#endif
