/* pipeline.c: the pipeline executor (pipeline.h). Rank s's chunk v is
 * virtual stage g = v * stages + s: it receives its input from virtual stage
 * g - 1 and sends its output to g + 1; gradients flow back the same way.
 * Sends are buffered (comm_send_copy), receives block, so any order a valid
 * schedule gives cannot deadlock; every send is completed before returning. */
#include "pipeline.h"

#include <stdlib.h>
#include <string.h>

#include "../core/error.h"

void pipeline_init(Pipeline *p, const Comm *group, int vpp, Model *base) {
    memset(p, 0, sizeof *p);
    p->group = group;
    p->stage = group->rank;
    p->stages = group->size;
    p->vpp = vpp;
    p->base = base;
}

void pipeline_free(Pipeline *p) {
    for (int i = 1; i < p->num_slots; i++) model_free(p->slots[i]);
    free(p->slots);
    free(p->busy);
    free(p->slot_of);
    free(p->ops);
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
    p->slots[p->num_slots] = p->num_slots == 0 ? p->base : model_clone_activations(p->base);
    p->busy[p->num_slots] = true;
    return p->num_slots++;
}

/* Message tags: which micro-batch and receiving chunk, and which direction. */
static int tag_of(const Pipeline *p, int micro, int chunk, int backward) {
    return ((micro * p->vpp + chunk) * 2 + backward) % 32768;
}

static void run_forward(Pipeline *p, PipeOp op, int B, int T, PipelineLoad load, void *arg, double *loss_sum) {
    const int s = p->stage, S = p->stages, v = op.chunk, g = v * S + s, last = S * p->vpp - 1;
    if (v == 0) p->slot_of[op.micro] = acquire_slot(p);
    Model *m = p->slots[p->slot_of[op.micro]];
    const long floats = model_stage_floats(m, B, T);
    const int32_t *inputs, *targets;
    if (v == 0) {
        load(arg, op.micro, &inputs, &targets);
        model_forward_start(m, g == 0 ? inputs : NULL, B, T);
    }
    if (g > 0) comm_recv(p->group, model_stage_input(m, v), (size_t)floats, COMM_FLOAT, (s - 1 + S) % S,
                         tag_of(p, op.micro, v, 0));
    model_forward_layers(m, v);
    if (g == last) {
        load(arg, op.micro, &inputs, &targets);
        *loss_sum += (double)model_forward_head(m, targets);
    } else {
        const int next_chunk = s == S - 1 ? v + 1 : v;
        comm_send_copy(p->group, model_stage_output(m, v), (size_t)floats, COMM_FLOAT, (s + 1) % S,
                       tag_of(p, op.micro, next_chunk, 0));
    }
}

static void run_backward(Pipeline *p, PipeOp op, float loss_scale, int B, int T) {
    const int s = p->stage, S = p->stages, v = op.chunk, g = v * S + s, last = S * p->vpp - 1;
    Model *m = p->slots[p->slot_of[op.micro]];
    const long floats = model_stage_floats(m, B, T);
    model_set_backward_scale(m, loss_scale);
    if (g == last) model_backward_head(m, loss_scale);
    else comm_recv(p->group, model_stage_grad(m), (size_t)floats, COMM_FLOAT, (s + 1) % S, tag_of(p, op.micro, v, 1));
    model_backward_layers(m, v);
    if (g == 0) {
        model_backward_finish(m);
    } else {
        const int prev_chunk = s == 0 ? v - 1 : v;
        comm_send_copy(p->group, model_stage_grad(m), (size_t)floats, COMM_FLOAT, (s - 1 + S) % S,
                       tag_of(p, op.micro, prev_chunk, 1));
    }
}

double pipeline_run(Pipeline *p, int M, bool forward_only, float loss_scale, int B, int T, PipelineLoad load,
                    void *arg) {
    if (M > p->micro_capacity) {
        p->micro_capacity = M;
        p->slot_of = mt_realloc(p->slot_of, (size_t)M * sizeof *p->slot_of);
        p->ops = mt_realloc(p->ops, (size_t)M * 2 * p->vpp * sizeof *p->ops);
    }
    const int n = pipeline_schedule(p->stages, p->vpp, p->stage, M, forward_only, p->ops);
    if (n < 0)
        mt_die(MT_EXIT_USAGE, "pipeline: the interleaved schedule (vpp %d) needs the micro-batches per step (%d) to "
               "be a multiple of pp (%d)", p->vpp, M, p->stages);
    double loss_sum = 0.0;
    for (int i = 0; i < n; i++) {
        const PipeOp op = p->ops[i];
        if (op.forward) run_forward(p, op, B, T, load, arg, &loss_sum);
        else run_backward(p, op, loss_scale, B, T);
        /* a micro-batch's activations are free after its last pass on this rank */
        if ((forward_only && op.forward && op.chunk == p->vpp - 1) || (!op.forward && op.chunk == 0))
            p->busy[p->slot_of[op.micro]] = false;
    }
    comm_wait_sends();
    return loss_sum;
}
