/* comm.h: collective and point-to-point communication over a group of ranks
 * (a Comm), for host buffers, implemented over MPI (comm_mpi.c).
 *
 * MPI is initialised only when the launcher's world size is > 1
 * (dist_init); a single-rank run never touches MPI, and every operation on a
 * group of one rank is a local copy or a no-op. Counts are in elements. */
#ifndef MT_DIST_COMM_H
#define MT_DIST_COMM_H

#include <stddef.h>

/* A group of ranks (MPI communicator underneath). */
typedef struct Comm {
    void *handle; /* MPI_Comm*, or NULL for a group of one rank without MPI */
    int rank;     /* this process's rank within the group */
    int size;     /* number of ranks in the group */
} Comm;

typedef enum CommType { COMM_FLOAT, COMM_DOUBLE, COMM_INT32, COMM_INT64, COMM_BYTE } CommType;

/* Start MPI (MPI_THREAD_FUNNELED at least) when launch_world_size() > 1 and
 * fill the world group; with one rank it only fills a group of one. Dies
 * (exit 1) when MPI cannot start. Idempotent. */
void dist_init(int *argc, char ***argv);
/* The world group (a group of one rank before dist_init). */
const Comm *comm_world(void);
/* Rank in the world; 0 for a single-rank run. */
int dist_rank(void);
/* End the job: status 0 finalises MPI; any other status, on a multi-rank
 * run, prints "rank R: stopping the job" and calls MPI_Abort so that no rank
 * is left waiting. Returns status (for a single-rank run); after MPI has
 * ended (dist_finish_together) it only returns status. */
int dist_finish(int status);
/* End the job when every rank stops with `status` at the same point, having
 * agreed on it (none waits in a collective): MPI is finalised whatever the
 * status, with no abort, so that each rank exits with it. Returns status. */
int dist_finish_together(int status);
/* Collective over the world (a group of one before dist_init): a status
 * every rank reaches at the same point, with its message. The lowest rank
 * whose status is not 0 prints its message (one line for a failure every
 * rank shares, such as a recipe error; "rank R: " before it when some ranks
 * did not fail); returns that rank's status on every rank, 0 when none
 * failed. */
int dist_report_first(int status, const char *message);
/* The same, the message printed as a warning (a checkpoint skipped, the run going on). */
int dist_warn_first(int status, const char *message);

/* In-place sums over the group. */
void comm_all_reduce_sum_float(const Comm *c, float *buf, size_t count);
void comm_all_reduce_sum_double(const Comm *c, double *buf, size_t count);
/* In-place max over the group, element by element. NaN wins: an element that is
 * NaN on any rank becomes NAN (the quiet NaN) on every rank; otherwise the
 * largest value, with -0 below +0. Exact and independent of the reduction
 * order (MPI_MAX on each float's bits mapped to an order-preserving int32). */
void comm_all_reduce_max_float(const Comm *c, float *buf, size_t count);
/* recv (count elements) = sum over ranks of send[rank * count ...]. */
void comm_reduce_scatter_sum_float(const Comm *c, const float *send, float *recv, size_t count);
/* recv[r * count ...] = rank r's send (count elements each). */
void comm_all_gather(const Comm *c, const void *send, void *recv, size_t count, CommType type);
/* Block r of send (count elements) goes to rank r; recv block r came from rank r. */
void comm_all_to_all(const Comm *c, const void *send, void *recv, size_t count, CommType type);
/* Variable blocks: send_counts[r] elements (from send, consecutively) go to
 * rank r; recv_counts[r] arrive from rank r (into recv, consecutively). */
void comm_all_to_all_v(const Comm *c, const void *send, const long *send_counts, void *recv, const long *recv_counts,
                       CommType type);
void comm_send(const Comm *c, const void *buf, size_t count, CommType type, int dest, int tag);
void comm_recv(const Comm *c, void *buf, size_t count, CommType type, int source, int tag);
/* A send that returns at once: buf is copied first, so the caller may reuse
 * it (the pipeline's activations). It is synchronous, as an NCCL send is: it
 * completes only once the receiver has posted the matching receive, never
 * into MPI's buffers, so the pipeline's pairing (pipeline_transfers.h) is
 * exercised by every run. comm_wait_sends completes every such send this
 * process started. */
void comm_send_copy(const Comm *c, const void *buf, size_t count, CommType type, int dest, int tag);
void comm_wait_sends(void);
void comm_broadcast(const Comm *c, void *buf, size_t count, CommType type, int root);
void comm_barrier(const Comm *c);

/* A sub-group of `parent`: ranks with the same color, ordered by key
 * (MPI_Comm_split). With no MPI, a group of one rank. */
void comm_split(const Comm *parent, int color, int key, Comm *out);
void comm_free(Comm *c);

#endif
