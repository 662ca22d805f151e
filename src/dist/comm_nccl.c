/* comm_nccl.c: NCCL communicators bootstrapped over the host Comm (see
 * comm_nccl.h). The whole file is CUDA-only. */
#ifdef MT_CUDA
#include "comm_nccl.h"

#include <nccl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"

/* A rank's GPU has several communicators in flight at once: the dp gradient averages on the comm stream while
 * the next layer's tp / cp / ep collectives run on the compute stream. NCCL kernels of two communicators that
 * two GPUs run in opposite orders wait for each other forever. From NCCL 2.26, NCCL_LAUNCH_ORDER_IMPLICIT=1
 * makes each GPU run its NCCL operations in the order the host launched them; megatrain launches them from one
 * host thread a GPU in the same order on every rank (the emulator's eager streams run exactly that order, and
 * its per-rank stream orders hang without the setting: tests/integration/test_gpu_emu_nccl.sh), so that order
 * is one every GPU can keep. Set once, before the first communicator, unless the environment sets it (0 turns it
 * off; a value in nccl.conf does not, as NCCL reads that file after this and keeps what is already set). */
static void nccl_order_launches(void) {
    static bool done;
    if (done) return;
    done = true;
    int version = 0;
    if (ncclGetVersion(&version) == ncclSuccess && version >= NCCL_VERSION(2, 26, 0))
        setenv("NCCL_LAUNCH_ORDER_IMPLICIT", "1", 0);
}

int nccl_comm_create(NcclComm *out, const Comm *group, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    nccl_order_launches();
    ncclUniqueId id;
    if (group->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess) {
            mt_set_error(err, errlen, "NCCL: ncclGetUniqueId failed: %s", ncclGetErrorString(r));
            return -1;
        }
    }
    comm_broadcast(group, &id, sizeof id, COMM_BYTE, 0);
    comm_barrier(group); /* some MPIs complete a broadcast lazily; ncclCommInitRank blocks until all ranks join */
    ncclComm_t comm;
    ncclResult_t r = ncclCommInitRank(&comm, group->size, id, group->rank);
    if (r != ncclSuccess) {
        mt_set_error(err, errlen,
                     "NCCL: rank %d of %d: ncclCommInitRank failed: %s (one GPU per rank, and some free GPU memory "
                     "for NCCL's buffers?)",
                     group->rank, group->size, ncclGetErrorString(r));
        return -1;
    }
    out->handle = comm;
    out->rank = group->rank;
    out->size = group->size;
    return 0;
}

void nccl_comm_destroy(NcclComm *comm) {
    if (comm && comm->handle) ncclCommDestroy((ncclComm_t)comm->handle);
    if (comm) comm->handle = NULL;
}

int nccl_check_async_error(NcclComm *comm, char *err, size_t errlen) {
    if (!comm->handle) return 0;
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError((ncclComm_t)comm->handle, &state);
    if (r == ncclSuccess && (state == ncclSuccess || state == ncclInProgress)) return 0;
    mt_set_error(err, errlen, "NCCL: rank %d of %d: the communicator failed: %s (a peer rank died or the network "
                 "failed)", comm->rank, comm->size, ncclGetErrorString(r != ncclSuccess ? r : state));
    ncclCommAbort((ncclComm_t)comm->handle);
    comm->handle = NULL;
    return -1;
}

static ncclDataType_t nccl_type(NcclDtype type) { return type == NCCL_DTYPE_BF16 ? ncclBfloat16 : ncclFloat32; }

static void check(const NcclComm *comm, ncclResult_t r, const char *what, size_t count) {
    if (r != ncclSuccess)
        mt_die(MT_EXIT_FAILURE, "NCCL: rank %d of %d: %s of %zu elements failed: %s", comm->rank, comm->size, what,
               count, ncclGetErrorString(r));
}

void nccl_all_reduce_avg_float(const NcclComm *comm, float *buf, size_t count, cudaStream_t stream) {
    if (count == 0) return;
    check(comm, ncclAllReduce(buf, buf, count, ncclFloat32, ncclAvg, (ncclComm_t)comm->handle, stream),
          "ncclAllReduce (average)", count);
}

void nccl_all_reduce_sum(const NcclComm *comm, void *buf, size_t count, NcclDtype type, cudaStream_t stream) {
    if (count == 0) return;
    check(comm, ncclAllReduce(buf, buf, count, nccl_type(type), ncclSum, (ncclComm_t)comm->handle, stream),
          "ncclAllReduce (sum)", count);
}

void nccl_all_gather(const NcclComm *comm, const void *send, void *recv, size_t count, NcclDtype type,
                     cudaStream_t stream) {
    if (count == 0) return;
    check(comm, ncclAllGather(send, recv, count, nccl_type(type), (ncclComm_t)comm->handle, stream), "ncclAllGather",
          count);
}

void nccl_reduce_scatter_sum(const NcclComm *comm, const void *send, void *recv, size_t count, NcclDtype type,
                             cudaStream_t stream) {
    if (count == 0) return;
    check(comm, ncclReduceScatter(send, recv, count, nccl_type(type), ncclSum, (ncclComm_t)comm->handle, stream),
          "ncclReduceScatter", count);
}

void nccl_all_to_all_v(const NcclComm *comm, const void *send, const long *send_counts, void *recv,
                       const long *recv_counts, NcclDtype type, cudaStream_t stream) {
    const size_t elem = type == NCCL_DTYPE_BF16 ? 2 : 4;
    size_t s_at = 0, r_at = 0, total = 0;
    check(comm, ncclGroupStart(), "ncclGroupStart (all-to-all)", 0);
    for (int r = 0; r < comm->size; r++) { /* a send and a receive per peer, one group: NCCL pairs them */
        if (send_counts[r] > 0)
            check(comm, ncclSend((const char *)send + s_at * elem, (size_t)send_counts[r], nccl_type(type), r,
                                 (ncclComm_t)comm->handle, stream), "ncclSend (all-to-all)", (size_t)send_counts[r]);
        if (recv_counts[r] > 0)
            check(comm, ncclRecv((char *)recv + r_at * elem, (size_t)recv_counts[r], nccl_type(type), r,
                                 (ncclComm_t)comm->handle, stream), "ncclRecv (all-to-all)", (size_t)recv_counts[r]);
        s_at += (size_t)send_counts[r];
        r_at += (size_t)recv_counts[r];
        total += (size_t)send_counts[r];
    }
    check(comm, ncclGroupEnd(), "ncclGroupEnd (all-to-all)", total);
}

void nccl_p2p_group(const NcclComm *comm, const NcclP2p *ops, int n, cudaStream_t stream) {
    if (n <= 0) return;
    size_t total = 0;
    check(comm, ncclGroupStart(), "ncclGroupStart (point-to-point)", 0);
    for (int i = 0; i < n; i++) {
        const NcclP2p *o = &ops[i];
        if (o->send)
            check(comm, ncclSend(o->buf, o->count, nccl_type(o->type), o->peer, (ncclComm_t)comm->handle, stream),
                  "ncclSend", o->count);
        else
            check(comm, ncclRecv(o->buf, o->count, nccl_type(o->type), o->peer, (ncclComm_t)comm->handle, stream),
                  "ncclRecv", o->count);
        total += o->count;
    }
    check(comm, ncclGroupEnd(), "ncclGroupEnd (point-to-point)", total);
}
#endif
