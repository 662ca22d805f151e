/* pipeline_schedule.c: 1F1B and interleaved 1F1B orders (pipeline_schedule.h). */
#include "pipeline_schedule.h"

#include <stdlib.h>

#include "../core/error.h"

/* Forward number k of this rank (0..M*vpp-1): which micro-batch and chunk. */
static PipeOp forward_op(int pp, int vpp, int k) {
    const int group = pp * vpp;
    return (PipeOp){.forward = true, .micro = (k / group) * pp + k % pp, .chunk = (k / pp) % vpp};
}

/* Backward number k: the chunks in reverse. */
static PipeOp backward_op(int pp, int vpp, int k) {
    PipeOp op = forward_op(pp, vpp, k);
    op.forward = false;
    op.chunk = vpp - 1 - op.chunk;
    return op;
}

int pipeline_warmup(int pp, int vpp, int stage, int M, bool forward_only) {
    const int total = M * vpp;
    if (forward_only) return total;
    const int warmup = vpp == 1 ? pp - stage - 1 : (pp - stage - 1) * 2 + (vpp - 1) * pp;
    return warmup < total ? warmup : total;
}

int pipeline_schedule(int pp, int vpp, int stage, int M, bool forward_only, PipeOp *ops) {
    int n = 0;
    if (forward_only) { /* groups of pp micro-batches, each group through the chunks in order */
        for (int first = 0; first < M; first += pp) {
            const int group = M - first < pp ? M - first : pp;
            for (int v = 0; v < vpp; v++)
                for (int j = 0; j < group; j++) ops[n++] = (PipeOp){true, first + j, v};
        }
        return n;
    }
    if (vpp > 1 && M % pp != 0) return -1;
    const int total = M * vpp;
    if (vpp == 1) { /* plain order: micro-batches one after the other */
        const int warmup = pipeline_warmup(pp, vpp, stage, M, false);
        for (int m = 0; m < warmup; m++) ops[n++] = (PipeOp){true, m, 0};
        for (int i = 0; i < M - warmup; i++) {
            ops[n++] = (PipeOp){true, warmup + i, 0};
            ops[n++] = (PipeOp){false, i, 0};
        }
        for (int i = M - warmup; i < M; i++) ops[n++] = (PipeOp){false, i, 0};
        return n;
    }
    const int warmup = pipeline_warmup(pp, vpp, stage, M, false);
    for (int k = 0; k < warmup; k++) ops[n++] = forward_op(pp, vpp, k);
    for (int i = 0; i < total - warmup; i++) {
        ops[n++] = forward_op(pp, vpp, warmup + i);
        ops[n++] = backward_op(pp, vpp, i);
    }
    for (int i = total - warmup; i < total; i++) ops[n++] = backward_op(pp, vpp, i);
    return n;
}

int pipeline_peak_in_flight(int pp, int vpp, int stage, int M) {
    if (M < 1) M = 1;
    if (M > 8 * pp) M = 8 * pp;
    if (vpp > 1) M = (M + pp - 1) / pp * pp;
    PipeOp *ops = mt_malloc((size_t)M * 2 * vpp * sizeof *ops);
    const int n = pipeline_schedule(pp, vpp, stage, M, false, ops);
    int live = 0, peak = 0;
    for (int i = 0; i < n; i++) {
        if (ops[i].chunk != 0) continue;
        live += ops[i].forward ? 1 : -1;
        if (live > peak) peak = live;
    }
    free(ops);
    return peak;
}
