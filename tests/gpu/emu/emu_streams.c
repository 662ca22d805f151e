/* emu_streams.c: CUDA streams and events for the emulator (tests/gpu/emu/README.md), in one of two orders.
 *
 * EMU_STREAMS=eager (the default): every piece of work (kernel, copy, memset, cuBLAS call, NCCL call, event) runs
 * when it is enqueued, so all streams together run in program order.
 *
 * EMU_STREAMS=lazy: each stream keeps its work in a queue and runs it only when the program makes it: a
 * synchronize (of the stream, of an event recorded on it, of the device), cudaStreamQuery, a copy between the
 * host and the device on it (with pageable host memory, the only kind megatrain uses, CUDA finishes the stream's
 * earlier work before such a copy returns), a synchronous runtime call (cudaMemcpy, cudaMemset, cudaFree: every
 * stream of the thread), or another stream's cudaStreamWaitEvent reached in that stream's queue. So a stream runs
 * its work as late as its consumers allow: a consumer on another stream that lacks its cudaStreamWaitEvent runs
 * before the producer and reads what was there before (0xff poison, last step's values), and a producer that
 * overwrites a buffer another stream still has to read (a missing wait the other way) is read after the
 * overwrite. Either shows as a wrong result against the CPU. Two streams waiting for each other abort (a deadlock
 * on a GPU).
 *
 * EMU_STREAMS=lazy-first: the first stream each host thread creates (megatrain's compute stream) is lazy, every
 * other stream (the legacy one included) eager. A side stream's work then runs at once, before the compute
 * stream's earlier work unless it waits for it: a side stream consuming the compute stream's results without a
 * cudaStreamWaitEvent reads them before they exist, which lazy alone cannot show (there the consumer runs only
 * when the producer's stream makes it).
 *
 * Streams belong to the host thread that made them (the GPU tests run ranks as threads; each has its own); the
 * legacy default stream (0) is one per host thread. A destroyed stream's record stays allocated: events recorded
 * on it may still be waited for. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "emu_streams.h"

typedef struct Work {
    EmuWorkFn run, drop;
    void *ctx;
    struct Work *next;
} Work;

struct CUstream_st {
    Work *head, *tail;
    uint64_t submitted, done; /* work enqueued and work finished, ever */
    bool running;             /* inside its own drain */
    bool lazy;                /* queues its work (EMU_STREAMS) */
    struct CUstream_st *next_of_thread;
};

struct CUevent_st {
    double ms;                   /* when its record ran */
    struct CUstream_st *stream;  /* where it was last recorded, or NULL */
    uint64_t target;             /* the stream's work up to and including the record */
};

static _Thread_local struct CUstream_st legacy_stream;
static _Thread_local struct CUstream_st *thread_streams; /* this thread's streams, the legacy one not included */

enum { EAGER, LAZY, LAZY_FIRST };
/* EMU_STREAMS names one order, or a comma-separated list of them: the job's rank i (Open MPI's
 * OMPI_COMM_WORLD_RANK, 0 outside mpirun) takes entry i modulo the list's length, so that ranks run their
 * streams in different orders, as GPUs whose timings differ do. */
static int stream_mode = -1;
static pthread_once_t stream_mode_once = PTHREAD_ONCE_INIT;

static void read_mode(void) {
    const char *v = getenv("EMU_STREAMS"), *r = getenv("OMPI_COMM_WORLD_RANK");
    char list[256];
    snprintf(list, sizeof list, "%s", v ? v : "");
    int entries = 1;
    for (const char *c = list; *c; c++) entries += *c == ',';
    int pick = (r ? atoi(r) : 0) % entries;
    char *rest = list, *name = strsep(&rest, ",");
    while (name && pick-- > 0) name = strsep(&rest, ","); /* an empty entry counts (and means eager) */
    stream_mode = !name || !*name || strcmp(name, "eager") == 0 ? EAGER : strcmp(name, "lazy") == 0 ? LAZY
                : strcmp(name, "lazy-first") == 0 ? LAZY_FIRST : -1;
    if (stream_mode < 0) {
        fprintf(stderr, "EMU: EMU_STREAMS=%s: expected eager, lazy or lazy-first, or a comma-separated list of "
                        "them (one a rank)\n", v);
        abort();
    }
}

/* Read once, whichever rank thread asks first (ThreadSanitizer saw two threads fill a plain static at once). */
static int mode(void) {
    pthread_once(&stream_mode_once, read_mode);
    return stream_mode;
}

static struct CUstream_st *stream_of(cudaStream_t s) {
    if (s) return s;
    legacy_stream.lazy = mode() == LAZY;
    return &legacy_stream;
}

/* Runs s's work up to and including the target-th piece. */
static void drain_to(struct CUstream_st *s, uint64_t target) {
    if (s->done >= target) return;
    if (s->running) {
        fprintf(stderr, "EMU: streams wait for each other: a stream's queued work waits for later work of its own "
                        "(through events on other streams); a deadlock on a GPU\n");
        abort();
    }
    s->running = true;
    while (s->done < target) {
        Work *w = s->head;
        s->head = w->next;
        if (!s->head) s->tail = NULL;
        w->run(w->ctx);
        if (w->drop) w->drop(w->ctx);
        free(w);
        s->done++;
    }
    s->running = false;
}

void emu_stream_drain(cudaStream_t s) {
    struct CUstream_st *x = stream_of(s);
    drain_to(x, x->submitted);
}

void emu_streams_drain_all(void) {
    emu_stream_drain(0);
    for (struct CUstream_st *x = thread_streams; x; x = x->next_of_thread) drain_to(x, x->submitted);
}

void emu_stream_submit(cudaStream_t s, EmuWorkFn run, EmuWorkFn drop, void *ctx) {
    struct CUstream_st *x = stream_of(s);
    x->submitted++;
    if (!x->lazy) {
        run(ctx);
        if (drop) drop(ctx);
        x->done++;
        return;
    }
    Work *w = malloc(sizeof *w);
    *w = (Work){run, drop, ctx, NULL};
    if (x->tail) x->tail->next = w;
    else x->head = w;
    x->tail = w;
}

/* ---- streams ---- */
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    (void)flags;
    struct CUstream_st *x = calloc(1, sizeof *x);
    x->lazy = mode() == LAZY || (mode() == LAZY_FIRST && !thread_streams);
    x->next_of_thread = thread_streams;
    thread_streams = x;
    *s = x;
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    emu_stream_drain(s); /* CUDA finishes a destroyed stream's work; the record stays for its events */
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    emu_stream_drain(s);
    return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) {
    emu_stream_drain(s); /* a GPU gets there on its own; here the question makes it */
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    emu_streams_drain_all();
    return cudaSuccess;
}

/* ---- events ---- */
cudaError_t cudaEventCreate(cudaEvent_t *e) {
    *e = calloc(1, sizeof **e);
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    (void)flags;
    return cudaEventCreate(e);
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    free(e);
    return cudaSuccess;
}

static void stamp(void *ctx) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    *(double *)ctx = (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    struct CUstream_st *x = stream_of(s);
    emu_stream_submit(s, stamp, NULL, &e->ms);
    e->stream = x;
    e->target = x->submitted;
    return cudaSuccess;
}

typedef struct {
    struct CUstream_st *stream;
    uint64_t target;
} Wait;
static void wait_run(void *ctx) {
    const Wait *w = ctx;
    drain_to(w->stream, w->target);
}
/* s's later work waits for `before`'s first `target` pieces of work. */
static void wait_for(cudaStream_t s, struct CUstream_st *before, uint64_t target) {
    if (stream_of(s) == before) return; /* a stream runs its own work in order */
    Wait *w = malloc(sizeof *w);
    *w = (Wait){before, target};
    emu_stream_submit(s, wait_run, free, w);
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    (void)flags;
    if (e->stream) wait_for(s, e->stream, e->target); /* the record as it is now: a later one does not move it */
    return cudaSuccess;
}
uint64_t emu_stream_submitted(cudaStream_t s) { return stream_of(s)->submitted; }
void emu_stream_after(cudaStream_t s, cudaStream_t before, uint64_t target) { wait_for(s, stream_of(before), target); }
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (e->stream) drain_to(e->stream, e->target);
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) { return cudaEventSynchronize(e); }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    cudaEventSynchronize(a);
    cudaEventSynchronize(b);
    *ms = (float)(b->ms - a->ms);
    return cudaSuccess;
}
