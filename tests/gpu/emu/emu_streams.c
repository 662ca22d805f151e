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
 * on it may still be waited for.
 *
 * In the racecheck build (make gpu-emu-tsan-build, ThreadSanitizer) each stream runs its work as a
 * ThreadSanitizer fibre of its own, in any of the orders above, ordered only as CUDA orders streams: a stream's
 * work in its own order, each piece after what the host did before enqueuing it; the work after a
 * cudaStreamWaitEvent after the event's record; the host, after a synchronize (of the stream, of an event, of
 * the device, or a call that finishes the stream's work, such as a copy to pageable host memory), after that
 * work. So a kernel, copy or collective on one stream touching memory that another stream's work writes with no
 * event between is reported, whichever ran first (test_emu_checks racecheck streams). */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "emu_streams.h"

#ifdef __SANITIZE_THREAD__
#include <sys/mman.h>

#include <sanitizer/tsan_interface.h>
void emu_run_on_stack(void *stack, size_t bytes, void (*fn)(void *), void *ctx); /* emu_exec.cpp */
void AnnotateIgnoreSyncBegin(const char *file, int line);
void AnnotateIgnoreSyncEnd(const char *file, int line);
#define RACECHECK 1
#else
#define RACECHECK 0
#endif

/* An event's record: when its work ran, and (racecheck) `sync`, which ThreadSanitizer synchronises on, released
 * when the stream's work gets there. Counted: the event, the record's work and each wait, so that an event
 * destroyed before its record ran (as CUDA allows) leaves the record its own. */
typedef struct Mark {
    int refs;
    double ms;
    char sync;
} Mark;
static Mark *mark_new(int refs) {
    EMU_UNCHECKED_BEGIN();
    Mark *m = calloc(1, sizeof *m);
    m->refs = refs;
    EMU_UNCHECKED_END();
    return m;
}
static void mark_put(Mark *m) {
    EMU_UNCHECKED_BEGIN();
    if (m && --m->refs == 0) free(m);
    EMU_UNCHECKED_END();
}

typedef struct Work {
    EmuWorkFn run, drop;
    void *ctx;
    struct Work *next;
    char enqueued; /* racecheck: released by the host as it enqueues the work, acquired as the work starts */
} Work;

struct CUstream_st {
    Work *head, *tail;
    uint64_t submitted, done; /* work enqueued and work finished, ever */
    bool running;             /* inside its own drain */
    bool lazy;                /* queues its work (EMU_STREAMS) */
    struct CUstream_st *next_of_thread;
    void *fiber;              /* racecheck: the ThreadSanitizer fibre its work runs as, */
    char *stack;              /* on a stack of its own (kStreamStack bytes above a guard page) */
    char all;                 /* racecheck: released after each piece of its work, acquired by a synchronize */
};

struct CUevent_st {
    struct CUstream_st *stream;  /* where it was last recorded, or NULL */
    uint64_t target;             /* the stream's work up to and including the record */
    Mark *mark;                  /* its last record, or NULL */
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
    const bool lazy = mode() == LAZY;
    EMU_UNCHECKED_BEGIN();
    legacy_stream.lazy = lazy;
    EMU_UNCHECKED_END();
    return &legacy_stream;
}

typedef struct {
    EmuWorkFn run, drop;
    void *ctx;
    char *enqueued;
    struct CUstream_st *x;
} Piece;
static void run_piece(void *arg) {
    EMU_UNCHECKED_BEGIN(); /* handed over on the host's stack */
    const Piece p = *(const Piece *)arg;
    EMU_UNCHECKED_END();
#if RACECHECK
    __tsan_acquire(p.enqueued);
#endif
    p.run(p.ctx);
    if (p.drop) p.drop(p.ctx);
#if RACECHECK
    __tsan_release(&p.x->all);
#endif
}

/* Runs one piece of x's work; `enqueued` (racecheck) holds the host's state when it was enqueued. */
static void run_work(struct CUstream_st *x, EmuWorkFn run, EmuWorkFn drop, void *ctx, char *enqueued) {
    Piece p = {run, drop, ctx, enqueued, x};
#if RACECHECK
    enum { kStreamStack = 8 << 20, kPage = 4096 };
    void *was = __tsan_get_current_fiber(); /* the host, or a stream whose wait drains x */
    EMU_UNCHECKED_BEGIN();
    if (!x->fiber) {
        char *m = mmap(NULL, kPage + kStreamStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "EMU: cannot map a stream's stack\n");
            abort();
        }
        mprotect(m, kPage, PROT_NONE);
        x->stack = m + kPage;
        /* a fibre starts after its creator's past, which here may hold other streams' work the host synchronised
         * with; a stream's work is ordered after the host by each piece's `enqueued` instead */
        AnnotateIgnoreSyncBegin(__FILE__, __LINE__);
        x->fiber = __tsan_create_fiber(0);
        AnnotateIgnoreSyncEnd(__FILE__, __LINE__);
    }
    void *fiber = x->fiber;
    char *stack = x->stack;
    EMU_UNCHECKED_END();
    __tsan_switch_to_fiber(fiber, __tsan_switch_to_fiber_no_sync);
    emu_run_on_stack(stack, kStreamStack, run_piece, &p);
    __tsan_switch_to_fiber(was, __tsan_switch_to_fiber_no_sync);
#else
    run_piece(&p);
#endif
}

/* The host (or whoever synchronises) after all of x's work that has run. */
static void synchronised_with(struct CUstream_st *x) {
#if RACECHECK
    __tsan_acquire(&x->all);
#else
    (void)x;
#endif
}

/* Runs s's work up to and including the target-th piece. */
static void drain_to(struct CUstream_st *s, uint64_t target) {
    EMU_UNCHECKED_BEGIN(); /* the queue's fields: the racecheck's fibres take turns at them, as the host thread does */
    const bool finished = s->done >= target, running = s->running;
    if (!finished) s->running = true;
    EMU_UNCHECKED_END();
    if (finished) return;
    if (running) {
        fprintf(stderr, "EMU: streams wait for each other: a stream's queued work waits for later work of its own "
                        "(through events on other streams); a deadlock on a GPU\n");
        abort();
    }
    for (;;) {
        EMU_UNCHECKED_BEGIN();
        Work *w = s->done < target ? s->head : NULL;
        if (w) {
            s->head = w->next;
            if (!s->head) s->tail = NULL;
        } else {
            s->running = false;
        }
        EMU_UNCHECKED_END();
        if (!w) return;
        run_work(s, w->run, w->drop, w->ctx, &w->enqueued);
        EMU_UNCHECKED_BEGIN();
        free(w);
        s->done++;
        EMU_UNCHECKED_END();
    }
}

static uint64_t submitted_of(const struct CUstream_st *x) {
    EMU_UNCHECKED_BEGIN();
    const uint64_t n = x->submitted;
    EMU_UNCHECKED_END();
    return n;
}

void emu_stream_drain(cudaStream_t s) {
    struct CUstream_st *x = stream_of(s);
    drain_to(x, submitted_of(x));
    synchronised_with(x);
}

void emu_streams_drain_all(void) {
    emu_stream_drain(0);
    for (struct CUstream_st *x = thread_streams; x; x = x->next_of_thread) {
        drain_to(x, submitted_of(x));
        synchronised_with(x);
    }
}

void emu_stream_submit(cudaStream_t s, EmuWorkFn run, EmuWorkFn drop, void *ctx) {
    struct CUstream_st *x = stream_of(s);
    EMU_UNCHECKED_BEGIN();
    x->submitted++;
    const bool lazy = x->lazy;
    Work *w = NULL;
    if (lazy) {
        w = malloc(sizeof *w);
        *w = (Work){run, drop, ctx, NULL, 0};
        if (x->tail) x->tail->next = w;
        else x->head = w;
        x->tail = w;
    }
    EMU_UNCHECKED_END();
    if (lazy) {
#if RACECHECK
        __tsan_release(&w->enqueued);
#endif
        return;
    }
    char enqueued;
#if RACECHECK
    __tsan_release(&enqueued);
#endif
    run_work(x, run, drop, ctx, &enqueued);
    EMU_UNCHECKED_BEGIN();
    x->done++;
    EMU_UNCHECKED_END();
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
/* A GPU gets through a stream's work on its own; here each question moves it on by one piece, and the stream is
 * "not ready" while work is left (a lazy stream's queue), so that a program's polling loops take their not-ready
 * branch (megatrain's: the check for a failed peer) as they do on a GPU. */
cudaError_t cudaStreamQuery(cudaStream_t s) {
    struct CUstream_st *x = stream_of(s);
    EMU_UNCHECKED_BEGIN();
    const uint64_t done = x->done;
    EMU_UNCHECKED_END();
    if (done < submitted_of(x)) {
        drain_to(x, done + 1);
        return cudaErrorNotReady;
    }
    synchronised_with(x);
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
    mark_put(e->mark);
    free(e);
    return cudaSuccess;
}

static void record_run(void *ctx) {
    Mark *m = ctx;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    m->ms = (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
#if RACECHECK
    __tsan_release(&m->sync);
#endif
}
static void record_drop(void *ctx) { mark_put(ctx); }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    struct CUstream_st *x = stream_of(s);
    mark_put(e->mark);
    e->mark = mark_new(2); /* the event's, and its record's until that runs */
    emu_stream_submit(s, record_run, record_drop, e->mark);
    e->stream = x;
    e->target = submitted_of(x);
    return cudaSuccess;
}

typedef struct {
    struct CUstream_st *stream;
    uint64_t target;
    Mark *mark;
} Wait;
static void wait_run(void *ctx) {
    const Wait *w = ctx;
    drain_to(w->stream, w->target);
#if RACECHECK
    __tsan_acquire(&w->mark->sync);
#endif
}
static void wait_drop(void *ctx) {
    Wait *w = ctx;
    mark_put(w->mark);
    free(w);
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    (void)flags;
    /* s's later work waits for the record as it is now (a later one does not move it); a stream runs its own
     * work in order */
    if (!e->stream || stream_of(s) == e->stream) return cudaSuccess;
    EMU_UNCHECKED_BEGIN();
    e->mark->refs++;
    EMU_UNCHECKED_END();
    Wait *w = malloc(sizeof *w);
    *w = (Wait){e->stream, e->target, e->mark};
    emu_stream_submit(s, wait_run, wait_drop, w);
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (!e->stream) return cudaSuccess;
    drain_to(e->stream, e->target);
#if RACECHECK
    __tsan_acquire(&e->mark->sync);
#endif
    return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) { return cudaEventSynchronize(e); }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    cudaEventSynchronize(a);
    cudaEventSynchronize(b);
    *ms = a->mark && b->mark ? (float)(b->mark->ms - a->mark->ms) : 0.0f;
    return cudaSuccess;
}
