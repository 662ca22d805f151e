/* pipeline.h: running a step's micro-batches through the pipeline stages
 * (pp > 1): the schedule of pipeline_schedule.h, activations and their
 * gradients sent point to point over the pipeline group, one set of
 * activations per micro-batch in flight on this rank. The model a stage
 * runs is reached through PipelineStageOps: the CPU Model
 * (pipeline_cpu_ops, pipeline_cpu.c) or the CUDA model (pipeline_cuda.c). */
#ifndef MT_TRAIN_PIPELINE_H
#define MT_TRAIN_PIPELINE_H

#include <stdbool.h>
#include <stdint.h>

#include "../dist/comm.h"
#include "../dist/pipeline_schedule.h"

/* Fills *inputs and *targets (B x T tokens of this rank) with micro-batch `micro`. */
typedef void (*PipelineLoad)(void *arg, int micro, const int32_t **inputs, const int32_t **targets);

/* One stage's model, as the executor drives it. A slot is one set of
 * activations (the base model, or a clone sharing its weights and gradients).
 * `last` marks the backward of the step's last micro-batch (its gradient
 * reductions may start there). */
typedef struct PipelineStageOps {
    void *(*clone)(void *base);
    void (*free_clone)(void *slot);
    void (*forward_start)(void *slot, const int32_t *inputs, int B, int T); /* inputs NULL off the first stage */
    void (*forward_layers)(void *slot, int chunk);
    double (*forward_head)(void *slot, const int32_t *targets);
    void (*backward_head)(void *slot, float loss_scale);
    void (*backward_layers)(void *slot, int chunk, float loss_scale, bool last);
    void (*backward_finish)(void *slot, bool last);
    /* A buffered send of the chunk's output (forward) or of the stage input's gradient (backward), and the matching
     * receive into the chunk's input or the stage output's gradient; micro-batches of B x T tokens. */
    void (*send)(void *slot, int chunk, bool backward, const Comm *group, int dest, int tag, int B, int T);
    void (*recv)(void *slot, int chunk, bool backward, const Comm *group, int source, int tag, int B, int T);
} PipelineStageOps;

/* The CPU Model's (src/model/model.h). */
extern const PipelineStageOps pipeline_cpu_ops;

typedef struct Pipeline {
    const Comm *group;    /* the pipeline group: group rank = stage */
    int stage, stages, vpp;
    const PipelineStageOps *ops;
    void *base;           /* this rank's model (chunks 0..vpp-1); also the first activation set */
    int num_slots;
    void **slots;         /* activation sets: slots[0] = base, then clones made as needed */
    bool *busy;
    int *slot_of;         /* per micro-batch of the running step: its slot */
    int micro_capacity;
    PipeOp *schedule;
} Pipeline;

void pipeline_init(Pipeline *p, const Comm *group, int vpp, void *base, const PipelineStageOps *ops);
void pipeline_free(Pipeline *p);
/* Make the activation sets (the base and clones) for the most micro-batches
 * the schedule keeps in flight on this stage in steps of up to max_micro
 * micro-batches, so that a model that cannot hold them fails now rather
 * than inside a step. Returns how many exist. */
int pipeline_reserve(Pipeline *p, int max_micro);

/* Forward (and, unless forward_only, backward with loss_scale) of M
 * micro-batches of B x T tokens. Returns the sum of their losses on the last
 * stage, 0 on the others. Dies when the interleaved schedule cannot take M. */
double pipeline_run(Pipeline *p, int M, bool forward_only, float loss_scale, int B, int T, PipelineLoad load,
                    void *arg);

#endif
