/* pipeline.c: the pipeline executor (pipeline.h). Rank s's chunk v is
 * virtual stage g = v * stages + s: it receives its input from virtual stage
 * g - 1 and sends its output to g + 1; gradients flow back the same way.
 * It runs the steps of pipeline_transfers.h: each step posts the previous
 * ops' sends and its own receives as one group and waits until the group's
 * sends have been received, then computes. The sends are synchronous
 * (comm_send_copy completes only once matched, as an NCCL send does), so a
 * pairing that could wait forever would hang every pipeline test; why it
 * cannot is pipeline_transfers_check, run over every shape up to pp 16 in
 * the unit tests. Every send is complete when a step returns (on the CPU;
 * a GPU's NCCL transfers are recorded by send and recv and posted as one
 * group by post_transfers, complete in the stream's order: the ops after
 * them on the same stream wait for them, the host does not). */
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
    free(p->steps);
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

static void post_send(Pipeline *p, const PipeXfer *x, int B, int T) {
    p->ops->send(p->slots[p->slot_of[x->micro]], x->chunk, x->backward, p->group, x->peer,
                 tag_of(p, x->micro, x->peer_chunk, x->backward), B, T);
}

static void post_recv(Pipeline *p, const PipeXfer *x, int B, int T) {
    p->ops->recv(p->slots[p->slot_of[x->micro]], x->chunk, x->backward, p->group, x->peer,
                 tag_of(p, x->micro, x->chunk, x->backward), B, T);
}

/* A micro-batch's first pass on this rank takes an activation set; every stage starts it (a packed
 * micro-batch's places hold for all its chunks and its backward). */
static void start_micro(Pipeline *p, PipeOp op, int B, int T, PipelineLoad load, void *arg) {
    const int32_t *inputs, *targets, *positions;
    p->slot_of[op.micro] = acquire_slot(p);
    load(arg, op.micro, &inputs, &targets, &positions);
    p->ops->forward_start(p->slots[p->slot_of[op.micro]], p->stage == 0 ? inputs : NULL, positions, B, T);
}

static void run_forward(Pipeline *p, PipeOp op, PipelineLoad load, void *arg, double *loss_sum) {
    const int g = op.chunk * p->stages + p->stage, last = p->stages * p->vpp - 1;
    void *m = p->slots[p->slot_of[op.micro]];
    p->ops->forward_layers(m, op.chunk);
    if (g == last) {
        const int32_t *inputs, *targets, *positions;
        const double weight = load(arg, op.micro, &inputs, &targets, &positions);
        *loss_sum += weight * p->ops->forward_head(m, targets);
    }
}

static void run_backward(Pipeline *p, PipeOp op, float loss_scale, bool last_micro) {
    const int g = op.chunk * p->stages + p->stage, last = p->stages * p->vpp - 1;
    void *m = p->slots[p->slot_of[op.micro]];
    if (g == last) p->ops->backward_head(m, loss_scale);
    p->ops->backward_layers(m, op.chunk, loss_scale, last_micro);
    if (g == 0) p->ops->backward_finish(m, last_micro);
}

/* Whether op is the micro-batch's last pass on this rank (its activations are free after its sends). */
static bool last_pass(const Pipeline *p, PipeOp op, bool forward_only) {
    return forward_only ? op.forward && op.chunk == p->vpp - 1 : !op.forward && op.chunk == 0;
}

double pipeline_run(Pipeline *p, int M, bool forward_only, float loss_scale, int B, int T, PipelineLoad load,
                    void *arg) {
    if (M > p->micro_capacity) {
        p->micro_capacity = M;
        p->slot_of = mt_realloc(p->slot_of, (size_t)M * sizeof *p->slot_of);
        p->steps = mt_realloc(p->steps, ((size_t)M * 2 * p->vpp + 1) * sizeof *p->steps);
    }
    const int n = pipeline_steps(p->stages, p->vpp, p->stage, M, forward_only, p->steps);
    if (n < 0)
        mt_die(MT_EXIT_USAGE, "pipeline: the interleaved schedule (vpp %d) needs the micro-batches per step (%d) to "
               "be a multiple of pp (%d)", p->vpp, M, p->stages);
    double loss_sum = 0.0;
    for (int i = 0; i < n; i++) {
        const PipeStep *st = &p->steps[i];
        /* the group: the previous ops' sends (the data is taken at once), then this step's receives; it ends
         * when every send has been received (pipeline_transfers.h: paired so that this cannot wait forever) */
        for (int j = 0; j < st->num_sends; j++) post_send(p, &st->sends[j], B, T);
        /* a slot whose last pass was the previous step's may start a new micro-batch now, before a GPU's deferred
         * send of its output has run: safe because forward_start writes only the first chunk's input, never a
         * chunk's output (the CUDA model refuses chunks without layers, so the two never coincide) */
        if (i > 0)
            for (int j = 0; j < p->steps[i - 1].num_ops; j++)
                if (last_pass(p, p->steps[i - 1].ops[j], forward_only))
                    p->busy[p->slot_of[p->steps[i - 1].ops[j].micro]] = false;
        for (int j = 0; j < st->num_ops; j++)
            if (st->ops[j].forward && st->ops[j].chunk == 0) start_micro(p, st->ops[j], B, T, load, arg);
        for (int j = 0; j < st->num_recvs; j++) post_recv(p, &st->recvs[j], B, T);
        p->ops->post_transfers(p->base); /* NCCL: the group's sends and receives, posted together */
        comm_wait_sends();
        for (int j = 0; j < st->num_ops; j++) {
            const PipeOp op = st->ops[j];
            if (op.forward) run_forward(p, op, load, arg, &loss_sum);
            else run_backward(p, op, loss_scale, op.micro == M - 1);
        }
    }
    return loss_sum;
}
