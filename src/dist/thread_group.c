/* thread_group.c: collectives among the threads of one process (see
 * thread_group.h): each rank publishes a pointer, a barrier, every rank
 * reads what it needs from the others, a second barrier before anyone may
 * reuse its buffer. */
#include "thread_group.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"

struct ThreadGroup {
    int size;
    pthread_barrier_t barrier;
    const void **slots; /* size: each rank's published buffer */
};

ThreadGroup *thread_group_create(int size) {
    ThreadGroup *g = mt_calloc(1, sizeof *g);
    g->size = size;
    g->slots = mt_calloc((size_t)size, sizeof *g->slots);
    if (pthread_barrier_init(&g->barrier, NULL, (unsigned)size) != 0)
        mt_die(MT_EXIT_FAILURE, "thread group: cannot create a barrier for %d threads", size);
    return g;
}

void thread_group_free(ThreadGroup *g) {
    if (!g) return;
    pthread_barrier_destroy(&g->barrier);
    free(g->slots);
    free(g);
}

int thread_group_size(const ThreadGroup *g) { return g->size; }

static void publish(ThreadGroup *g, int rank, const void *buf) {
    g->slots[rank] = buf;
    pthread_barrier_wait(&g->barrier);
}

static void done(ThreadGroup *g) { pthread_barrier_wait(&g->barrier); }

void thread_group_sum(ThreadGroup *g, int rank, float *buf, size_t count, float scale) {
    float *sum = mt_malloc((count ? count : 1) * sizeof(float));
    publish(g, rank, buf);
    for (size_t i = 0; i < count; i++) {
        float s = 0.0f;
        for (int r = 0; r < g->size; r++) s += ((const float *)g->slots[r])[i];
        sum[i] = s * scale;
    }
    done(g); /* every rank has read every buffer: now overwrite ours */
    memcpy(buf, sum, count * sizeof(float));
    free(sum);
}

void thread_group_all_gather(ThreadGroup *g, int rank, const void *send, void *recv, size_t bytes) {
    publish(g, rank, send);
    for (int r = 0; r < g->size; r++) memcpy((char *)recv + (size_t)r * bytes, g->slots[r], bytes);
    done(g);
}

void thread_group_reduce_scatter(ThreadGroup *g, int rank, const float *send, float *recv, size_t count) {
    publish(g, rank, send);
    for (size_t i = 0; i < count; i++) {
        float s = 0.0f;
        for (int r = 0; r < g->size; r++) s += ((const float *)g->slots[r])[(size_t)rank * count + i];
        recv[i] = s;
    }
    done(g);
}

double thread_group_sum_double(ThreadGroup *g, int rank, double value) {
    publish(g, rank, &value);
    double sum = 0.0;
    for (int r = 0; r < g->size; r++) sum += *(const double *)g->slots[r];
    done(g);
    return sum;
}

void thread_group_all_to_all_v(ThreadGroup *g, int rank, const void *send, const long *send_bytes, void *recv,
                               const long *recv_bytes) {
    const struct { const void *send; const long *bytes; } mine = {send, send_bytes};
    publish(g, rank, &mine);
    long at = 0;
    for (int r = 0; r < g->size; r++) {
        const struct { const void *send; const long *bytes; } *from = g->slots[r];
        long offset = 0; /* rank r's block for this rank: after its blocks for ranks 0 .. rank - 1 */
        for (int q = 0; q < rank; q++) offset += from->bytes[q];
        if (from->bytes[rank] != recv_bytes[r])
            mt_die(MT_EXIT_FAILURE, "thread group: rank %d sends %ld bytes to rank %d, which expects %ld", r,
                   from->bytes[rank], rank, recv_bytes[r]);
        memcpy((char *)recv + at, (const char *)from->send + offset, (size_t)recv_bytes[r]);
        at += recv_bytes[r];
    }
    done(g);
}
