/* comm_mpi.c: the Comm interface (comm.h) over MPI for host buffers, plus
 * starting and ending MPI for the process (dist_init / dist_finish). */
#include "comm.h"

#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "launch_env.h"

static Comm world = {.handle = NULL, .rank = 0, .size = 1};
static MPI_Comm world_handle = MPI_COMM_NULL;
static int mpi_started = 0;

/* Largest element count handed to one MPI call (counts are int). */
#define CHUNK ((size_t)1 << 28)

static MPI_Datatype mpi_type(CommType type) {
    switch (type) {
    case COMM_FLOAT: return MPI_FLOAT;
    case COMM_DOUBLE: return MPI_DOUBLE;
    case COMM_INT32: return MPI_INT32_T;
    case COMM_INT64: return MPI_INT64_T;
    case COMM_BYTE: break;
    }
    return MPI_BYTE;
}

static size_t type_size(CommType type) {
    switch (type) {
    case COMM_FLOAT: return sizeof(float);
    case COMM_DOUBLE: return sizeof(double);
    case COMM_INT32: return 4;
    case COMM_INT64: return 8;
    case COMM_BYTE: break;
    }
    return 1;
}

static MPI_Comm handle_of(const Comm *c) { return *(MPI_Comm *)c->handle; }

/* A failed MPI call: name the rank and bring the job down. */
static void check(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    mt_error("rank %d: %s failed: %s", world.rank, what, text);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(MT_EXIT_FAILURE);
}

static int small_count(size_t count, const char *what) {
    if (count > (size_t)INT_MAX) mt_die(MT_EXIT_FAILURE, "rank %d: %s of %zu elements is too large", world.rank, what, count);
    return (int)count;
}

/* atexit: a rank leaving without dist_finish(0) (mt_die, a failed setup)
 * must not leave the others waiting in a collective. */
static int finished = 0;
static void abort_job(int status) {
    if (!mpi_started || finished) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) return;
    fflush(stdout);
    fprintf(stderr, "megatrain: error: rank %d: stopping the job (exit status %d; see the error above)\n",
            world.rank, status);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, status);
}
static void abort_unfinished(void) { abort_job(MT_EXIT_FAILURE); }

void dist_init(int *argc, char ***argv) {
    if (mpi_started || launch_world_size() <= 1) return;
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        mt_die(MT_EXIT_FAILURE, "rank %d: MPI_Init_thread failed", launch_rank());
    mpi_started = 1;
    atexit(abort_unfinished);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if (provided < MPI_THREAD_FUNNELED)
        mt_die(MT_EXIT_FAILURE, "rank %d: the MPI library gives thread level %d, below MPI_THREAD_FUNNELED",
               launch_rank(), provided);
    world_handle = MPI_COMM_WORLD;
    world.handle = &world_handle;
    MPI_Comm_rank(MPI_COMM_WORLD, &world.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world.size);
    /* The recipe's layout was checked against the launcher's variable: MPI must agree. SLURM_NTASKS in a batch
     * script run without srun is the common case (one process, which would train as if it were several). */
    if (world.size != launch_world_size()) {
        if (world.rank == 0)
            mt_error("%s=%d says %d ranks, but MPI started %d: start every rank with srun or mpirun (or unset %s "
                     "for one process)", launch_world_size_name(), launch_world_size(), launch_world_size(),
                     world.size, launch_world_size_name());
        finished = 1;
        MPI_Finalize();
        exit(MT_EXIT_USAGE);
    }
}

const Comm *comm_world(void) { return &world; }
int dist_rank(void) { return world.rank; }

int dist_finish(int status) {
    if (!mpi_started || finished) return status;
    if (status != 0) abort_job(status);
    finished = 1;
    MPI_Finalize();
    return status;
}

int dist_finish_together(int status) {
    if (!mpi_started || finished) return status;
    finished = 1;
    MPI_Finalize();
    return status;
}

static int report_first(int status, const char *message, bool warning) {
    int32_t mine = status, *all = mt_malloc((size_t)world.size * sizeof *all);
    if (world.size > 1) comm_all_gather(&world, &mine, all, 1, COMM_INT32);
    else all[0] = mine;
    int first = 0, failed = 0;
    while (first < world.size && all[first] == 0) first++;
    for (int r = 0; r < world.size; r++) failed += all[r] != 0;
    const int agreed = first < world.size ? all[first] : 0;
    free(all);
    /* a failure only some ranks met names the rank (unless the message does) */
    if (agreed != 0 && first == world.rank) {
        void (*say)(const char *, ...) = warning ? mt_warn : mt_error;
        if (failed < world.size && strncmp(message, "rank ", 5) != 0) say("rank %d: %s", world.rank, message);
        else say("%s", message);
    }
    return agreed;
}

int dist_report_first(int status, const char *message) { return report_first(status, message, false); }
int dist_warn_first(int status, const char *message) { return report_first(status, message, true); }

void comm_all_reduce_sum_float(const Comm *c, float *buf, size_t count) {
    if (!c->handle || c->size == 1) return;
    for (size_t at = 0; at < count; at += CHUNK) {
        size_t n = count - at < CHUNK ? count - at : CHUNK;
        check(MPI_Allreduce(MPI_IN_PLACE, buf + at, (int)n, MPI_FLOAT, MPI_SUM, handle_of(c)), "all-reduce");
    }
}

void comm_all_reduce_sum_double(const Comm *c, double *buf, size_t count) {
    if (!c->handle || c->size == 1) return;
    for (size_t at = 0; at < count; at += CHUNK) {
        size_t n = count - at < CHUNK ? count - at : CHUNK;
        check(MPI_Allreduce(MPI_IN_PLACE, buf + at, (int)n, MPI_DOUBLE, MPI_SUM, handle_of(c)), "all-reduce");
    }
}

/* A float's bits as an int32 whose order is the floats' (-inf < ... < -0 < +0 < ... < +inf), every NaN mapped
 * above +inf (as the quiet NaN): MPI_MAX on the keys is the float max where NaN wins. The map is its own inverse
 * on the non-negative keys and on the negative ones. */
static int32_t float_key(int32_t bits) { return bits < 0 ? bits ^ INT32_MAX : bits; }

static void float_keys(float *buf, size_t n, bool to_keys) {
    const float nan = NAN;
    for (size_t i = 0; i < n; i++) {
        int32_t bits;
        memcpy(&bits, to_keys && isnan(buf[i]) ? &nan : &buf[i], sizeof bits);
        bits = float_key(bits);
        memcpy(&buf[i], &bits, sizeof bits);
    }
}

void comm_all_reduce_max_float(const Comm *c, float *buf, size_t count) {
    if (!c->handle || c->size == 1) return;
    for (size_t at = 0; at < count; at += CHUNK) {
        size_t n = count - at < CHUNK ? count - at : CHUNK;
        float_keys(buf + at, n, true);
        check(MPI_Allreduce(MPI_IN_PLACE, buf + at, (int)n, MPI_INT32_T, MPI_MAX, handle_of(c)), "all-reduce");
        float_keys(buf + at, n, false);
    }
}

void comm_reduce_scatter_sum_float(const Comm *c, const float *send, float *recv, size_t count) {
    if (!c->handle || c->size == 1) {
        if (recv != send) memmove(recv, send, count * sizeof(float));
        return;
    }
    check(MPI_Reduce_scatter_block(send, recv, small_count(count, "reduce-scatter"), MPI_FLOAT, MPI_SUM,
                                   handle_of(c)),
          "reduce-scatter");
}

void comm_all_gather(const Comm *c, const void *send, void *recv, size_t count, CommType type) {
    if (!c->handle || c->size == 1) {
        if (recv != send) memmove(recv, send, count * type_size(type));
        return;
    }
    int n = small_count(count, "all-gather");
    check(MPI_Allgather(send, n, mpi_type(type), recv, n, mpi_type(type), handle_of(c)), "all-gather");
}

void comm_all_to_all(const Comm *c, const void *send, void *recv, size_t count, CommType type) {
    if (!c->handle || c->size == 1) {
        if (recv != send) memmove(recv, send, count * type_size(type));
        return;
    }
    int n = small_count(count, "all-to-all");
    check(MPI_Alltoall(send, n, mpi_type(type), recv, n, mpi_type(type), handle_of(c)), "all-to-all");
}

void comm_all_to_all_v(const Comm *c, const void *send, const long *send_counts, void *recv, const long *recv_counts,
                       CommType type) {
    if (!c->handle || c->size == 1) {
        if (recv != send) memmove(recv, send, (size_t)send_counts[0] * type_size(type));
        return;
    }
    int *sc = mt_malloc((size_t)c->size * 4 * sizeof(int)), *sd = sc + c->size, *rc = sd + c->size, *rd = rc + c->size;
    long s_at = 0, r_at = 0;
    for (int r = 0; r < c->size; r++) {
        sc[r] = small_count((size_t)send_counts[r], "all-to-all");
        rc[r] = small_count((size_t)recv_counts[r], "all-to-all");
        sd[r] = small_count((size_t)s_at, "all-to-all");
        rd[r] = small_count((size_t)r_at, "all-to-all");
        s_at += send_counts[r];
        r_at += recv_counts[r];
    }
    check(MPI_Alltoallv(send, sc, sd, mpi_type(type), recv, rc, rd, mpi_type(type), handle_of(c)), "all-to-all");
    free(sc);
}

void comm_send(const Comm *c, const void *buf, size_t count, CommType type, int dest, int tag) {
    if (!c->handle) mt_die(MT_EXIT_FAILURE, "send to rank %d in a group of one rank", dest);
    check(MPI_Send(buf, small_count(count, "send"), mpi_type(type), dest, tag, handle_of(c)), "send");
}

void comm_recv(const Comm *c, void *buf, size_t count, CommType type, int source, int tag) {
    if (!c->handle) mt_die(MT_EXIT_FAILURE, "receive from rank %d in a group of one rank", source);
    check(MPI_Recv(buf, small_count(count, "receive"), mpi_type(type), source, tag, handle_of(c), MPI_STATUS_IGNORE),
          "receive");
}

/* Sends in flight (comm_send_copy): their requests and buffer copies. */
static MPI_Request *pending_requests;
static void **pending_buffers;
static int num_pending, pending_capacity;

/* Free the copies of the sends that have completed (keeps the memory to what is in flight). */
static void reap_sends(void) {
    if (num_pending == 0) return;
    int *done = mt_malloc((size_t)num_pending * sizeof(int)), count = 0;
    check(MPI_Testsome(num_pending, pending_requests, &count, done, MPI_STATUSES_IGNORE), "send completion");
    if (count == MPI_UNDEFINED) count = 0;
    for (int i = 0; i < count; i++) {
        free(pending_buffers[done[i]]);
        pending_buffers[done[i]] = NULL;
    }
    int kept = 0;
    for (int i = 0; i < num_pending; i++)
        if (pending_buffers[i]) {
            pending_buffers[kept] = pending_buffers[i];
            pending_requests[kept] = pending_requests[i];
            kept++;
        }
    num_pending = kept;
    free(done);
}

void comm_send_copy(const Comm *c, const void *buf, size_t count, CommType type, int dest, int tag) {
    if (!c->handle) mt_die(MT_EXIT_FAILURE, "send to rank %d in a group of one rank", dest);
    reap_sends();
    if (num_pending == pending_capacity) {
        pending_capacity = pending_capacity ? 2 * pending_capacity : 16;
        pending_requests = mt_realloc(pending_requests, (size_t)pending_capacity * sizeof *pending_requests);
        pending_buffers = mt_realloc(pending_buffers, (size_t)pending_capacity * sizeof *pending_buffers);
    }
    void *copy = mt_malloc(count * type_size(type) + 1);
    memcpy(copy, buf, count * type_size(type));
    pending_buffers[num_pending] = copy;
    check(MPI_Issend(copy, small_count(count, "send"), mpi_type(type), dest, tag, handle_of(c),
                    &pending_requests[num_pending]),
          "send");
    num_pending++;
}

void comm_wait_sends(void) {
    if (num_pending == 0) return;
    check(MPI_Waitall(num_pending, pending_requests, MPI_STATUSES_IGNORE), "send completion");
    for (int i = 0; i < num_pending; i++) free(pending_buffers[i]);
    num_pending = 0;
}

void comm_broadcast(const Comm *c, void *buf, size_t count, CommType type, int root) {
    if (!c->handle || c->size == 1) return;
    check(MPI_Bcast(buf, small_count(count, "broadcast"), mpi_type(type), root, handle_of(c)), "broadcast");
}

void comm_barrier(const Comm *c) {
    if (!c->handle || c->size == 1) return;
    check(MPI_Barrier(handle_of(c)), "barrier");
}

void comm_split(const Comm *parent, int color, int key, Comm *out) {
    if (!parent->handle) {
        *out = (Comm){.handle = NULL, .rank = 0, .size = 1};
        return;
    }
    MPI_Comm *h = mt_malloc(sizeof *h);
    check(MPI_Comm_split(handle_of(parent), color, key, h), "communicator split");
    out->handle = h;
    MPI_Comm_rank(*h, &out->rank);
    MPI_Comm_size(*h, &out->size);
}

void comm_free(Comm *c) {
    if (c->handle && c->handle != &world_handle) {
        MPI_Comm_free((MPI_Comm *)c->handle);
        free(c->handle);
    }
    *c = (Comm){.handle = NULL, .rank = 0, .size = 1};
}
