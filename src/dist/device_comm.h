/* device_comm.h: collectives over device buffers for one group of ranks
 * (tensor parallel activations, data-parallel gradients), with one of two
 * transports:
 *   - NCCL (comm_nccl.h): one GPU per rank, the production path;
 *   - staged through the host: each call waits for `stream`, copies the
 *     buffer to the host, runs the host collective over the group's MPI
 *     Comm (comm.h) and copies the result back. Slow, but it runs where
 *     several ranks share one GPU, which NCCL refuses: a machine with one
 *     GPU can run a tensor-parallel layout and check it.
 * Both sum bf16 in fp32 and round once (NCCL: per reduction step); the
 * staged sums are bit-identical on every rank (comm_sum_identical).
 * Compiled only with the CUDA backend (make CUDA=1). */
#ifndef MT_DIST_DEVICE_COMM_H
#define MT_DIST_DEVICE_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include <cuda_runtime_api.h>

#include "comm.h"
#include "comm_nccl.h"
#include "thread_group.h"

typedef struct DeviceComm {
    const Comm *group;     /* the host group (outlives this); NULL with threads */
    ThreadGroup *threads;  /* ranks that are threads of this process (staged only), or NULL */
    bool staged;           /* through the host; else NCCL */
    NcclComm nccl;         /* NCCL's communicator (not staged) */
    int rank, size;
    void *host;            /* staging buffers, grown on demand */
    size_t host_bytes;
    float *host_f32;
    size_t host_f32_count;
} DeviceComm;

/* Collective over `group` (every rank calls it, its GPU selected). With one
 * rank and !staged, NCCL still makes a communicator (tests use it). Returns
 * 0, or -1 with err set. */
int device_comm_create(DeviceComm *out, const Comm *group, bool staged, char *err, size_t errlen);
/* Staged over the threads of this process: this thread is `rank` of `threads`. */
void device_comm_create_threads(DeviceComm *out, ThreadGroup *threads, int rank);
void device_comm_destroy(DeviceComm *c);
/* 0, or -1 with err set when NCCL reported an asynchronous error (a peer
 * died); the staged transport fails synchronously, through MPI. */
int device_comm_check(DeviceComm *c, char *err, size_t errlen);

/* buf = sum (or mean, with average) over the group, in place. */
void device_all_reduce(DeviceComm *c, void *buf, size_t count, NcclDtype type, bool average, cudaStream_t stream);
/* recv[r * count ...] = rank r's send (count elements each). */
void device_all_gather(DeviceComm *c, const void *send, void *recv, size_t count, NcclDtype type,
                       cudaStream_t stream);
/* The sum of a host value over the group, the same on every rank. */
double device_comm_sum_double(DeviceComm *c, double value);
/* recv[r * bytes ...] = rank r's host block send[this rank * bytes ...] (host memory: the MoE dispatch's counts). */
void device_comm_host_all_to_all(DeviceComm *c, const void *send, void *recv, size_t bytes);
/* values[0, n) = their sums over the group (host doubles, in place; whole numbers stay exact). */
void device_comm_sum_doubles(DeviceComm *c, double *values, size_t n);

/* recv (count elements) = sum over ranks of send[rank * count ...]. */
void device_reduce_scatter_sum(DeviceComm *c, const void *send, void *recv, size_t count, NcclDtype type,
                               cudaStream_t stream);

/* recv = rank r's send_counts[this rank] elements from every rank r, in rank order (send: send_counts[r]
 * elements for each rank r, in rank order; recv_counts[r] = what rank r sends here, exchanged beforehand).
 * The MoE token dispatch and combine over ep. */
void device_all_to_all_v(DeviceComm *c, const void *send, const long *send_counts, void *recv,
                         const long *recv_counts, NcclDtype type, cudaStream_t stream);
/* Point-to-point transfers as one group (nccl_p2p_group), NCCL only: a staged transport's ranks send through the
 * host themselves (the pipeline's MPI path), and calling this on one is a programming error (it dies). */
void device_p2p_group(DeviceComm *c, const NcclP2p *ops, int n, cudaStream_t stream);

#endif
