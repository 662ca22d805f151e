/* build_pipeline.c: `data build`'s threads. The calling thread reads the
 * input into batches (build_reader.c) and writes the tokenized batches in
 * input order (through the sink); `workers` threads tokenize batches as
 * they come (build_batch.c), each with its own encoder.
 *
 * Batches live in a ring of 2 x workers + 2 slots, numbered in input order:
 * a slot is filled (FREE -> READY) by the reader, claimed in order by a
 * worker (WORKING), finished (DONE), and handed to the sink when every
 * earlier one has been (then FREE again). The reader waits when every slot
 * is in use, so memory stays bounded whatever the input's size. The output
 * is the same bytes for any number of workers: batches are cut from the
 * input alone, and each one's documents depend on its text alone.
 *
 * SIGINT, SIGTERM and SIGHUP are blocked in the workers, so they reach the
 * calling thread, which checks the stop flag at least every 0.25 s.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../core/error.h"
#include "build_internal.h"

typedef enum { SLOT_FREE, SLOT_READY, SLOT_WORKING, SLOT_DONE } SlotState;

typedef struct Pipeline {
    pthread_mutex_t mu;
    pthread_cond_t work_ready, batch_done;
    BuildBatch *slots;
    SlotState *state;
    int nslots;
    int64_t filled, claimed, written; /* batches so far; batch k lives in slot k % nslots */
    bool shutdown;
    const BuildSpec *spec;
} Pipeline;

int build_default_workers(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    return 1;
}

static void *worker_main(void *arg) {
    Pipeline *p = arg;
    BuildWorkerState ws;
    build_worker_init(&ws, p->spec);
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->shutdown && p->claimed == p->filled) pthread_cond_wait(&p->work_ready, &p->mu);
        if (p->shutdown) break;
        int slot = (int)(p->claimed++ % p->nslots);
        p->state[slot] = SLOT_WORKING;
        pthread_mutex_unlock(&p->mu);
        build_batch_run(p->spec, &ws, &p->slots[slot]);
        pthread_mutex_lock(&p->mu);
        p->state[slot] = SLOT_DONE;
        pthread_cond_signal(&p->batch_done);
    }
    pthread_mutex_unlock(&p->mu);
    build_worker_free(&ws);
    return NULL;
}

/* Wait for a finished batch, at most 0.25 s (mu held). */
static void wait_a_little(Pipeline *p) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until); /* batch_done waits on the monotonic clock: a clock step cannot stretch it */
    until.tv_nsec += 250 * 1000 * 1000;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&p->batch_done, &p->mu, &until);
}

int build_pipeline_run(BuildReader *r, const BuildSpec *spec, int workers, BuildSink sink, void (*tick)(void *),
                       void *ctx, char *err, size_t errlen) {
    Pipeline p;
    memset(&p, 0, sizeof p);
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.work_ready, NULL);
    pthread_condattr_t monotonic;
    pthread_condattr_init(&monotonic);
    pthread_condattr_setclock(&monotonic, CLOCK_MONOTONIC);
    pthread_cond_init(&p.batch_done, &monotonic);
    pthread_condattr_destroy(&monotonic);
    p.nslots = 2 * workers + 2;
    p.slots = mt_calloc((size_t)p.nslots, sizeof *p.slots);
    p.state = mt_calloc((size_t)p.nslots, sizeof *p.state);
    p.spec = spec;

    sigset_t stops, old;
    sigemptyset(&stops);
    sigaddset(&stops, SIGINT);
    sigaddset(&stops, SIGTERM);
    sigaddset(&stops, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &stops, &old);
    pthread_t *threads = mt_calloc((size_t)workers, sizeof *threads);
    int started = 0, create_error = 0;
    while (started < workers && (create_error = pthread_create(&threads[started], NULL, worker_main, &p)) == 0)
        started++;
    pthread_sigmask(SIG_SETMASK, &old, NULL);

    int status = PIPELINE_DONE, read_error = 0;
    bool input_ended = false;
    if (started == 0) {
        mt_set_error(err, errlen, "data build: cannot start a worker thread: %s", strerror(create_error));
        status = PIPELINE_READ_ERROR;
        input_ended = true;
    }
    for (;;) {
        pthread_mutex_lock(&p.mu);
        bool stop_now = false;
        while (p.written < p.filled && p.state[p.written % p.nslots] == SLOT_DONE) {
            BuildBatch *b = &p.slots[p.written % p.nslots];
            pthread_mutex_unlock(&p.mu);
            int rc = sink(ctx, b);
            build_batch_trim(b);
            pthread_mutex_lock(&p.mu);
            p.state[p.written % p.nslots] = SLOT_FREE;
            p.written++;
            if (rc != 0) {
                status = PIPELINE_STOPPED_BY_SINK;
                stop_now = true;
                break;
            }
        }
        bool can_fill = !input_ended && p.filled - p.written < p.nslots;
        if (!stop_now && !can_fill) {
            if (input_ended && p.written == p.filled) {
                pthread_mutex_unlock(&p.mu);
                break;
            }
            wait_a_little(&p);
        }
        pthread_mutex_unlock(&p.mu);
        if (stop_now) break;
        if (tick) tick(ctx);
        if (*r->stop) {
            status = PIPELINE_STOPPED_BY_SIGNAL;
            break;
        }
        if (!can_fill) continue;
        int slot = (int)(p.filled % p.nslots); /* FREE: only this thread fills */
        int rc = build_reader_fill(r, &p.slots[slot].in, BUILD_BATCH_BYTES, err, errlen);
        if (rc == READ_OK) {
            p.slots[slot].format = r->format;
            pthread_mutex_lock(&p.mu);
            p.state[slot] = SLOT_READY;
            p.filled++;
            pthread_cond_signal(&p.work_ready);
            pthread_mutex_unlock(&p.mu);
        } else if (rc == READ_END) {
            input_ended = true;
        } else if (rc == READ_STOPPED) {
            status = PIPELINE_STOPPED_BY_SIGNAL;
            break;
        } else { /* write what came before first: an earlier bad line is the error to report */
            input_ended = true;
            read_error = 1;
        }
    }
    pthread_mutex_lock(&p.mu);
    p.shutdown = true;
    pthread_cond_broadcast(&p.work_ready);
    pthread_mutex_unlock(&p.mu);
    for (int i = 0; i < started; i++) pthread_join(threads[i], NULL);
    if (status == PIPELINE_DONE && read_error) status = PIPELINE_READ_ERROR;
    for (int i = 0; i < p.nslots; i++) build_batch_free(&p.slots[i]);
    free(p.slots);
    free(p.state);
    free(threads);
    pthread_cond_destroy(&p.work_ready);
    pthread_cond_destroy(&p.batch_done);
    pthread_mutex_destroy(&p.mu);
    return status;
}
