/* pipeline_cpu.c: the CPU Model as a pipeline stage (pipeline.h): clones
 * for the activation sets, the stage steps of model.h, and buffered sends
 * of fp32 activations and gradients over MPI. */
#include "pipeline.h"

#include "../model/model.h"

static void *cpu_clone(void *base) { return model_clone_activations(base); }
static void cpu_free_clone(void *slot) { model_free(slot); }

static void cpu_forward_start(void *slot, const int32_t *inputs, int B, int T) {
    model_forward_start(slot, inputs, B, T);
}

static void cpu_forward_layers(void *slot, int chunk) { model_forward_layers(slot, chunk); }
static double cpu_forward_head(void *slot, const int32_t *targets) { return model_forward_head(slot, targets); }
static void cpu_backward_head(void *slot, float loss_scale) { model_backward_head(slot, loss_scale); }

static void cpu_backward_layers(void *slot, int chunk, float loss_scale, bool last) {
    model_set_backward_scale(slot, loss_scale);
    model_backward_layers(slot, chunk);
}

static void cpu_backward_finish(void *slot, bool last) { model_backward_finish(slot); }

static void cpu_send(void *slot, int chunk, bool backward, const Comm *group, int dest, int tag, int B, int T) {
    Model *m = slot;
    comm_send_copy(group, backward ? model_stage_grad(m) : model_stage_output(m, chunk),
                   (size_t)model_stage_floats(m, B, T), COMM_FLOAT, dest, tag);
}

static void cpu_recv(void *slot, int chunk, bool backward, const Comm *group, int source, int tag, int B, int T) {
    Model *m = slot;
    comm_recv(group, backward ? model_stage_grad(m) : model_stage_input(m, chunk), (size_t)model_stage_floats(m, B, T),
              COMM_FLOAT, source, tag);
}

const PipelineStageOps pipeline_cpu_ops = {
    .clone = cpu_clone,
    .free_clone = cpu_free_clone,
    .forward_start = cpu_forward_start,
    .forward_layers = cpu_forward_layers,
    .forward_head = cpu_forward_head,
    .backward_head = cpu_backward_head,
    .backward_layers = cpu_backward_layers,
    .backward_finish = cpu_backward_finish,
    .send = cpu_send,
    .recv = cpu_recv,
};
