/* pipeline_schedule.h: the order in which one pipeline rank runs the
 * forward and backward passes of a step's micro-batches (pure: no model,
 * no communication, so it can be checked alone).
 *
 * With vpp = 1 it is 1F1B (PipeDream-flush, Megatron's default): stage s of
 * pp runs min(pp - s - 1, M) warm-up forwards, then alternates one forward
 * and one backward, then drains the backwards. With vpp > 1 it is Megatron's
 * interleaved 1F1B: rank s holds model chunks v = 0..vpp-1, chunk v being
 * virtual stage v * pp + s; micro-batches go through the chunks in groups
 * of pp, and the warm-up is (pp - s - 1) * 2 + (vpp - 1) * pp forwards.
 * Forward-only (evaluation, any M): the interleaved order without
 * backwards, micro-batches in groups of pp (the last one smaller) each
 * group through chunk 0, then chunk 1, ...: a micro-batch comes back to
 * rank s for its next chunk after the pp - 1 others of its group, so no
 * rank waits once the pipeline is full (micro-batch after micro-batch, a
 * rank would wait for each one's whole trip round the other ranks), and at
 * most pp micro-batches are in flight on a rank. With vpp = 1 that is
 * micro-batch after micro-batch. Every rank runs its ops in one global
 * order in which each op needs only earlier ones, so none can deadlock. */
#ifndef MT_DIST_PIPELINE_SCHEDULE_H
#define MT_DIST_PIPELINE_SCHEDULE_H

#include <stdbool.h>

typedef struct PipeOp {
    bool forward;     /* false: backward */
    int micro;        /* micro-batch index, 0..M-1 */
    int chunk;        /* model chunk on this rank, 0..vpp-1 */
} PipeOp;

/* The ops of rank `stage` for M micro-batches into ops (room for 2 * M * vpp),
 * forwards only when forward_only. Returns how many; -1 when the interleaved
 * schedule cannot take M (vpp > 1 with backward needs M to be a multiple of pp). */
int pipeline_schedule(int pp, int vpp, int stage, int M, bool forward_only, PipeOp *ops);

/* How many forwards rank `stage` runs before its first backward (all of
 * them when forward_only); the schedule alternates after them. */
int pipeline_warmup(int pp, int vpp, int stage, int M, bool forward_only);

/* The most micro-batches rank `stage` keeps in flight (from the forward of
 * its chunk 0 to the backward of its chunk 0: one set of activations each)
 * in a step of up to M micro-batches (rounded up to a multiple of pp for
 * vpp > 1; the steady state does not grow past 8 pp of them). */
int pipeline_peak_in_flight(int pp, int vpp, int stage, int M);

#endif
