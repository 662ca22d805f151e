/* comm_nccl.h: collectives over device buffers with NCCL, for a group of
 * ranks that already has a host Comm (comm.h): the NCCL id travels over MPI
 * (rank 0 makes it, a broadcast hands it out), each rank on its own GPU.
 * Compiled only with the CUDA backend (make CUDA=1). */
#ifndef MT_DIST_COMM_NCCL_H
#define MT_DIST_COMM_NCCL_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#include "comm.h"

typedef struct NcclComm {
    void *handle; /* ncclComm_t */
    int rank, size;
} NcclComm;

/* Collective over `group`: every rank calls it with its GPU selected.
 * Returns 0, or -1 with err set. */
int nccl_comm_create(NcclComm *out, const Comm *group, char *err, size_t errlen);
void nccl_comm_destroy(NcclComm *comm);

/* 0 while the communicator is healthy; -1 with err set when NCCL reported an
 * asynchronous error (a peer died, a network failure), after aborting the
 * communicator so that no kernel waits for it any longer. */
int nccl_check_async_error(NcclComm *comm, char *err, size_t errlen);

/* Element types of the device collectives: fp32, and bf16 as its raw 16 bits. */
typedef enum NcclDtype { NCCL_DTYPE_FLOAT, NCCL_DTYPE_BF16 } NcclDtype;

/* buf = mean over the group of buf (count floats, in place), enqueued on stream. */
void nccl_all_reduce_avg_float(const NcclComm *comm, float *buf, size_t count, cudaStream_t stream);
/* buf = sum over the group of buf (count elements, in place). */
void nccl_all_reduce_sum(const NcclComm *comm, void *buf, size_t count, NcclDtype type, cudaStream_t stream);
/* recv[r * count ...] = rank r's send (count elements each). */
void nccl_all_gather(const NcclComm *comm, const void *send, void *recv, size_t count, NcclDtype type,
                     cudaStream_t stream);
/* recv (count elements) = sum over ranks of send[rank * count ...]. */
void nccl_reduce_scatter_sum(const NcclComm *comm, const void *send, void *recv, size_t count, NcclDtype type,
                             cudaStream_t stream);

/* recv = the rows every rank sends this one, rank by rank: this rank's send holds send_counts[r] elements for
 * rank r, one after another; recv gets recv_counts[r] from rank r, one after another (the counts exchanged
 * beforehand: they must match the peers' send counts). Grouped point-to-point sends and receives. */
void nccl_all_to_all_v(const NcclComm *comm, const void *send, const long *send_counts, void *recv,
                       const long *recv_counts, NcclDtype type, cudaStream_t stream);
/* One point-to-point transfer: count elements of buf to (send) or from peer. */
typedef struct NcclP2p {
    void *buf;
    size_t count;
    NcclDtype type;
    int peer;
    int send; /* 1: a send, 0: a receive */
} NcclP2p;
/* The n transfers as one group (ncclGroupStart .. ncclGroupEnd), enqueued on stream: they progress together, and
 * NCCL matches the k-th send from a rank to a peer with the peer's k-th receive from it (no tags). A pipeline
 * step's transfers (src/dist/pipeline_transfers.h pairs them so that no order of the ranks' groups waits
 * forever). */
void nccl_p2p_group(const NcclComm *comm, const NcclP2p *ops, int n, cudaStream_t stream);

#endif
