/* pipeline.c: the pipeline executor (pipeline.h). Rank s's chunk v is
 * virtual stage g = v * stages + s: it receives its input from virtual stage
 * g - 1 and sends its output to g + 1; gradients flow back the same way.
 * Sends are buffered, receives block, so any order a valid schedule gives
 * cannot deadlock; every send is completed before returning. */
#include "pipeline.h"

#include <stdlib.h>
#include <string.h>

#include "../core/error.h"

void pipeline_init(Pipeline *p, const Comm *group, int vpp, void *base, const PipelineStageOps *ops) {
    memset(p, 0, sizeof *p);
    p->group = group;
    p->stage = group->rank;
    p->stages = group->size;
    p->vpp = vpp;
    p->base = base;
    p->ops = ops;
}

void pipeline_free(Pipeline *p) {
    for (int i = 1; i < p->num_slots; i++) p->ops->free_clone(p->slots[i]);
    free(p->slots);
    free(p->busy);
    free(p->slot_of);
    free(p->schedule);
    memset(p, 0, sizeof *p);
}

static int acquire_slot(Pipeline *p) {
    for (int i = 0; i < p->num_slots; i++)
        if (!p->busy[i]) {
            p->busy[i] = true;
            return i;
        }
    p->slots = mt_realloc(p->slots, (size_t)(p->num_slots + 1) * sizeof *p->slots);
    p->busy = mt_realloc(p->busy, (size_t)(p->num_slots + 1) * sizeof *p->busy);
    p->slots[p->num_slots] = p->num_slots == 0 ? p->base : p->ops->clone(p->base);
    p->busy[p->num_slots] = true;
    return p->num_slots++;
}

int pipeline_reserve(Pipeline *p, int max_micro) {
    const int sets = pipeline_peak_in_flight(p->stages, p->vpp, p->stage, max_micro);
    while (p->num_slots < sets) acquire_slot(p);
    for (int i = 0; i < p->num_slots; i++) p->busy[i] = false;
    return p->num_slots;
}

/* Message tags: which micro-batch and receiving chunk, and which direction. */
static int tag_of(const Pipeline *p, int micro, int chunk, int backward) {
    return ((micro * p->vpp + chunk) * 2 + backward) % 32768;
}

static void run_forward(Pipeline *p, PipeOp op, int B, int T, PipelineLoad load, void *arg, double *loss_sum) {
    const int s = p->stage, S = p->stages, v = op.chunk, g = v * S + s, last = S * p->vpp - 1;
    if (v == 0) p->slot_of[op.micro] = acquire_slot(p);
    void *m = p->slots[p->slot_of[op.micro]];
    const int32_t *inputs, *targets, *positions;
    if (v == 0) { /* every stage: a packed micro-batch's places hold for all its chunks and its backward */
        load(arg, op.micro, &inputs, &targets, &positions);
        p->ops->forward_start(m, g == 0 ? inputs : NULL, positions, B, T);
    }
    if (g > 0) p->ops->recv(m, v, false, p->group, (s - 1 + S) % S, tag_of(p, op.micro, v, 0), B, T);
    p->ops->forward_layers(m, v);
    if (g == last) {
        load(arg, op.micro, &inputs, &targets, &positions);
        *loss_sum += p->ops->forward_head(m, targets);
    } else {
        const int next_chunk = s == S - 1 ? v + 1 : v;
        p->ops->send(m, v, false, p->group, (s + 1) % S, tag_of(p, op.micro, next_chunk, 0), B, T);
    }
}

static void run_backward(Pipeline *p, PipeOp op, float loss_scale, bool last_micro, int B, int T) {
    const int s = p->stage, S = p->stages, v = op.chunk, g = v * S + s, last = S * p->vpp - 1;
    void *m = p->slots[p->slot_of[op.micro]];
    if (g == last) p->ops->backward_head(m, loss_scale);
    else p->ops->recv(m, v, true, p->group, (s + 1) % S, tag_of(p, op.micro, v, 1), B, T);
    p->ops->backward_layers(m, v, loss_scale, last_micro);
    if (g == 0) {
        p->ops->backward_finish(m, last_micro);
    } else {
        const int prev_chunk = s == 0 ? v - 1 : v;
        p->ops->send(m, v, true, p->group, (s - 1 + S) % S, tag_of(p, op.micro, prev_chunk, 1), B, T);
    }
}

double pipeline_run(Pipeline *p, int M, bool forward_only, float loss_scale, int B, int T, PipelineLoad load,
                    void *arg) {
    if (M > p->micro_capacity) {
        p->micro_capacity = M;
        p->slot_of = mt_realloc(p->slot_of, (size_t)M * sizeof *p->slot_of);
        p->schedule = mt_realloc(p->schedule, (size_t)M * 2 * p->vpp * sizeof *p->schedule);
    }
    const int n = pipeline_schedule(p->stages, p->vpp, p->stage, M, forward_only, p->schedule);
    if (n < 0)
        mt_die(MT_EXIT_USAGE, "pipeline: the interleaved schedule (vpp %d) needs the micro-batches per step (%d) to "
               "be a multiple of pp (%d)", p->vpp, M, p->stages);
    double loss_sum = 0.0;
    for (int i = 0; i < n; i++) {
        const PipeOp op = p->schedule[i];
        if (op.forward) run_forward(p, op, B, T, load, arg, &loss_sum);
        else run_backward(p, op, loss_scale, op.micro == M - 1, B, T);
        /* a micro-batch's activations are free after its last pass on this rank */
        if ((forward_only && op.forward && op.chunk == p->vpp - 1) || (!op.forward && op.chunk == 0))
            p->busy[p->slot_of[op.micro]] = false;
    }
    comm_wait_sends();
    return loss_sum;
}
