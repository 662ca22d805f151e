/* pipeline.h: running a step's micro-batches through the pipeline stages
 * (pp > 1): the schedule of pipeline_schedule.h, activations and their
 * gradients sent point to point over the pipeline group, one set of
 * activations per micro-batch in flight on this rank. The model a stage
 * runs is reached through the PipelineStageOps of its ModelDevice
 * (src/model/model_device.h), whichever device computes it. */
#ifndef MT_TRAIN_PIPELINE_H
#define MT_TRAIN_PIPELINE_H

#include <stdbool.h>
#include <stdint.h>

#include "../dist/comm.h"
#include "../dist/pipeline_transfers.h"
#include "../model/model_device.h"

/* Fills *inputs and *targets (B x T tokens of this rank) with micro-batch `micro`, and *positions with its
 * packed rows' places (model_set_packed_positions; NULL: plain rows). Returns the weight of its loss in the sum
 * pipeline_run returns: 1 for a step's; an evaluation's last partial batch weighs its share of samples
 * (src/data/eval_coverage.h). */
typedef double (*PipelineLoad)(void *arg, int micro, const int32_t **inputs, const int32_t **targets,
                               const int32_t **positions);

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
    PipeStep *steps;      /* the running step's, pipeline_transfers.h */
} Pipeline;

void pipeline_init(Pipeline *p, const Comm *group, int vpp, void *base, const PipelineStageOps *ops);
void pipeline_free(Pipeline *p);
/* Make the activation sets (the base and clones) for the most micro-batches
 * the schedule keeps in flight on this stage in steps of up to max_micro
 * micro-batches, so that a model that cannot hold them fails now rather
 * than inside a step. Returns how many exist. */
int pipeline_reserve(Pipeline *p, int max_micro);

/* Forward (and, unless forward_only, backward with loss_scale) of M
 * micro-batches of B x T tokens. Returns the sum of their losses, each times
 * its weight (PipelineLoad), on the last stage, 0 on the others. Dies when the interleaved schedule cannot take M. */
double pipeline_run(Pipeline *p, int M, bool forward_only, float loss_scale, int B, int T, PipelineLoad load,
                    void *arg);

#endif
