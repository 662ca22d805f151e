/* pipeline_transfers.h: the point-to-point transfers of one pipeline rank's
 * schedule (pipeline_schedule.h), paired into groups that cannot deadlock
 * under rendezvous semantics (pure: no model, no communication).
 *
 * A rank's step is: post the previous step's ops' sends and this step's
 * ops' receives as one group; the group ends when its receives have
 * completed and its sends have been matched; then compute the step's ops.
 * A step holds one op, or in the interleaved steady state a forward and the
 * backward after it (Megatron's send_forward_backward_recv_forward_backward:
 * up to two sends and two receives). A closing step sends the last op's
 * output.
 *
 * Rendezvous semantics are what NCCL's grouped ncclSend/ncclRecv give on a
 * stream (a send is not buffered: it finishes when the peer's receive is
 * posted, and transfers between two ranks match in the order they are
 * posted, without tags), and what the CPU gets from synchronous-mode MPI
 * sends waited at the end of each group. Under buffered sends any order of
 * a valid schedule finishes; under rendezvous an order can wait in a cycle.
 * So pipeline_transfers_check runs every rank's groups against each other
 * in a simulation and says whether they all finish and whether the k-th
 * send from a rank to another is the k-th receive there (same micro-batch,
 * chunk and direction). The simulation is the CPU path's stricter form: a
 * group's sends are posted at once but its receives one after the other,
 * each after the one before has completed (blocking MPI receives); NCCL
 * posts a group's receives together, which can only finish sooner. The
 * unit test runs it for pp 2..16, vpp 1..8 and up to 4 pp + 3
 * micro-batches, training and evaluation; the executor (src/train/
 * pipeline.c) runs exactly these steps. */
#ifndef MT_DIST_PIPELINE_TRANSFERS_H
#define MT_DIST_PIPELINE_TRANSFERS_H

#include <stdbool.h>
#include <stddef.h>

#include "pipeline_schedule.h"

typedef struct PipeXfer {
    int peer;        /* the other rank (its stage) */
    int micro;       /* the micro-batch */
    bool backward;   /* a gradient, flowing toward stage 0 (false: an activation) */
    int chunk;       /* this rank's chunk whose buffer is sent or received into */
    int peer_chunk;  /* the other rank's chunk at the other end */
} PipeXfer;

/* A step: one group of transfers, then up to two ops with none between
 * them (a steady-state forward and the backward after it). */
#define PIPE_STEP_MAX 2
typedef struct PipeStep {
    int num_sends, num_recvs, num_ops;
    PipeXfer sends[PIPE_STEP_MAX]; /* the previous step's ops' outputs, posted first, in this order */
    PipeXfer recvs[PIPE_STEP_MAX]; /* this step's ops' inputs, in this order */
    PipeOp ops[PIPE_STEP_MAX];     /* none on the closing step */
} PipeStep;

/* Rank `stage`'s steps for M micro-batches into steps (room for
 * 2 * M * vpp + 1). Returns how many; -1 where pipeline_schedule refuses. */
int pipeline_steps(int pp, int vpp, int stage, int M, bool forward_only, PipeStep *steps);

/* Whether the groups of all pp ranks finish under rendezvous semantics and
 * their sends and receives match in order, pair of ranks by pair. Returns 0,
 * or -1 with the first rank that waits forever (or the first mismatch) in
 * why. */
int pipeline_transfers_check(int pp, int vpp, int M, bool forward_only, char *why, size_t whylen);

/* The same check of given steps: steps[s] (n[s] of them) for each of the pp ranks. */
int pipeline_steps_check(int pp, PipeStep *const *steps, const int *n, char *why, size_t whylen);

#endif
