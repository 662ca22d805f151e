/* thread_group.h: the host collectives of a group whose ranks are threads of
 * one process. The staged device transport (device_comm.h) runs on it in
 * tests that put every rank of a tensor-parallel group on one GPU in one
 * process, with no launcher. The same semantics as comm.h's MPI
 * collectives; sums are taken in rank order, so every rank gets the same
 * bits. Every rank calls every operation, in the same order. */
#ifndef MT_DIST_THREAD_GROUP_H
#define MT_DIST_THREAD_GROUP_H

#include <stddef.h>

typedef struct ThreadGroup ThreadGroup;

ThreadGroup *thread_group_create(int size);
void thread_group_free(ThreadGroup *g);
int thread_group_size(const ThreadGroup *g);

/* buf = scale * (sum over ranks of buf), count floats, the same bits everywhere. */
void thread_group_sum(ThreadGroup *g, int rank, float *buf, size_t count, float scale);
/* recv[r * bytes ...] = rank r's send (bytes each). */
void thread_group_all_gather(ThreadGroup *g, int rank, const void *send, void *recv, size_t bytes);
/* recv (count floats) = sum over ranks of send[rank * count ...]. */
void thread_group_reduce_scatter(ThreadGroup *g, int rank, const float *send, float *recv, size_t count);
/* The sum over ranks of value. */
double thread_group_sum_double(ThreadGroup *g, int rank, double value);
/* recv = what every rank r sends this one, in rank order: send holds send_bytes[q] bytes for each rank q, one after
 * another; recv_bytes[r] (what rank r sends here) must match. */
void thread_group_all_to_all_v(ThreadGroup *g, int rank, const void *send, const long *send_bytes, void *recv,
                               const long *recv_bytes);

#endif
