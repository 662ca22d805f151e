/* pipeline.h: running a step's micro-batches through the pipeline stages
 * (pp > 1) on the CPU: the schedule of pipeline_schedule.h, activations and
 * their gradients sent point to point over the pipeline group, one set of
 * activations (a model clone) per micro-batch in flight on this rank. */
#ifndef MT_TRAIN_PIPELINE_H
#define MT_TRAIN_PIPELINE_H

#include <stdbool.h>
#include <stdint.h>

#include "../dist/comm.h"
#include "../model/model.h"
#include "pipeline_schedule.h"

/* Fills *inputs and *targets (B x T tokens of this rank) with micro-batch `micro`. */
typedef void (*PipelineLoad)(void *arg, int micro, const int32_t **inputs, const int32_t **targets);

typedef struct Pipeline {
    const Comm *group;    /* the pipeline group: group rank = stage */
    int stage, stages, vpp;
    Model *base;          /* this rank's model (chunks 0..vpp-1); also the first activation set */
    int num_slots;
    Model **slots;        /* activation sets: slots[0] = base, then clones made as needed */
    bool *busy;
    int *slot_of;         /* per micro-batch of the running step: its slot */
    int micro_capacity;
    PipeOp *ops;
} Pipeline;

void pipeline_init(Pipeline *p, const Comm *group, int vpp, Model *base);
void pipeline_free(Pipeline *p);

/* Forward (and, unless forward_only, backward with loss_scale) of M
 * micro-batches of B x T tokens. Returns the sum of their losses on the last
 * stage, 0 on the others. Dies when the interleaved schedule cannot take M. */
double pipeline_run(Pipeline *p, int M, bool forward_only, float loss_scale, int B, int T, PipelineLoad load,
                    void *arg);

#endif
