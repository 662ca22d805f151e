/* emu_nccl.c: NCCL for the emulator (tests/gpu/emu/README.md): communicators of any number of ranks, each rank a
 * process of the job (mpirun), so that the CUDA build's NCCL transport (src/dist/comm_nccl.c) runs on the CPU.
 *
 * The unique id names a file under $TMPDIR (or /tmp) that every member maps shared; rank 0 removes its name once
 * all have joined, so nothing is left behind a run that ends. In it, each ordered pair of ranks (src, dst) has a
 * mailbox: a ring of kRing bytes that only src writes and only dst reads (head and tail byte counters, C11
 * atomics, so no lock). Every operation is messages through the mailboxes:
 *   - a send/receive pair: one message from the sender to the receiver;
 *   - all-reduce, reduce-scatter, all-gather: each rank sends its part to every other rank and sums (in rank
 *     order, in fp32, rounded once to the type: every rank gets the same bits) or places what it receives.
 * Messages through one mailbox follow each other whole, in the order their calls were posted (NCCL matches a
 * peer's sends and receives in that order, inside a group too). A message starts with a record of what the
 * sender called (the operation, its number on this communicator, the element count and type); the receiver compares it with its own call and aborts with both when they differ:
 * ranks calling collectives in different orders or with different counts, which hangs or corrupts real NCCL.
 * A send is done only when its receiver has taken the whole message (a rendezvous, as NCCL's sends of more than
 * its buffers hold are), so a pair of ranks that each send before they receive, outside one group, hangs here
 * whatever the size. A rank waits by polling with a growing sleep; when nothing moves for EMU_NCCL_TIMEOUT
 * seconds (default 120) it aborts naming the call and what it waits for (a hang on a GPU, for example two
 * communicators used in different orders).
 *
 * Launch order: with NCCL_LAUNCH_ORDER_IMPLICIT=1 in the environment when a communicator is made (NCCL 2.26 and
 * later), NCCL runs the operations of that device's communicators in the order the host launched them, whatever
 * their streams; the emulator does the same (each such operation's stream first waits for the operation launched
 * before it, and for nothing queued after that one). Without it, operations of two communicators on two streams run in whatever order the
 * streams reach them, which under EMU_STREAMS lists (a different stream order a rank) can differ between ranks
 * and hang, as it can on GPUs.
 *
 * Each call is queued on its stream like any other work (emu_streams.c: it runs at once, or when the stream is
 * made to run); it then runs to its end before the stream's next work. Between ncclGroupStart and ncclGroupEnd,
 * sends and receives are gathered and progressed together as one piece of work, as NCCL requires of an
 * all-to-all; a collective inside a group is queued at once. Operations: ncclSum and ncclAvg over
 * ncclFloat32 and ncclBfloat16, the types and reductions megatrain uses. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <nccl.h>

#include "emu_streams.h"

/* emu_runtime.c's check that [p, p + bytes) lies inside one cudaMalloc allocation; absent (NULL) where the
 * emulator's NCCL is linked without the runtime (test_emu_nccl, whose buffers are the host's). */
__attribute__((weak)) int emu_device_bytes(const void *p, size_t bytes);

#include "../../../src/core/float16.h"

enum { kRing = 1 << 18, kMaxRanks = 64, kMaxQueued = 2 * kMaxRanks * 4 };

typedef struct {
    _Atomic uint64_t head; /* bytes written by the sender, ever */
    char pad0[56];
    _Atomic uint64_t tail; /* bytes read by the receiver, ever */
    char pad1[56];
    unsigned char data[kRing];
} Mailbox;

typedef struct {
    _Atomic int joined;
    int nranks;
    char pad[56];
    Mailbox box[]; /* [src * nranks + dst] */
} Shared;

typedef struct EmuComm {
    int nranks, rank;
    bool implicit_order;  /* NCCL_LAUNCH_ORDER_IMPLICIT=1 when it was made */
    Shared *shared;     /* NULL for a communicator of one rank */
    size_t map_bytes;
    uint64_t collectives; /* collectives called so far */
    uint64_t *p2p;        /* messages sent to / received from each peer so far: [peer], [nranks + peer] */
} EmuComm;

/* What a message says of the call that sent it. */
typedef struct {
    uint32_t magic;
    int32_t op;
    uint64_t seq;
    uint64_t count;
    int32_t type;
    int32_t sender;
} Record;
static const uint32_t kRecordMagic = 0x4e43434c;

enum { OP_SEND, OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER };
static const char *op_name(int op) {
    static const char *names[] = {"ncclSend", "ncclAllReduce", "ncclReduceScatter", "ncclAllGather"};
    return op >= 0 && op <= OP_ALL_GATHER ? names[op] : "an unknown operation";
}
static const char *type_name(int t) { return t == ncclBfloat16 ? "bf16" : t == ncclFloat32 ? "fp32" : "other"; }

static size_t type_bytes(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}

/* ---- one transfer: a message through one mailbox, moved a piece at a time ---- */
typedef struct {
    Mailbox *box;
    bool sending;
    Record record;          /* sent first, or expected first */
    unsigned char got[sizeof(Record)];
    size_t header_done;     /* bytes of the record moved */
    unsigned char *data;    /* the payload's source or destination */
    size_t bytes, done;
    uint64_t end;           /* sending: the mailbox's head after this message; done when its tail gets there */
    int peer;
    const struct EmuComm *comm;
} Transfer;

/* Moves what the ring allows now; returns the bytes moved. */
static size_t ring_write(Mailbox *b, const unsigned char *src, size_t n) {
    const uint64_t head = atomic_load_explicit(&b->head, memory_order_relaxed);
    const uint64_t tail = atomic_load_explicit(&b->tail, memory_order_acquire);
    size_t room = kRing - (size_t)(head - tail);
    if (n > room) n = room;
    const size_t at = (size_t)(head % kRing), first = n < kRing - at ? n : kRing - at;
    memcpy(b->data + at, src, first);
    memcpy(b->data, src + first, n - first);
    atomic_store_explicit(&b->head, head + n, memory_order_release);
    return n;
}
static size_t ring_read(Mailbox *b, unsigned char *dst, size_t n) {
    const uint64_t tail = atomic_load_explicit(&b->tail, memory_order_relaxed);
    const uint64_t head = atomic_load_explicit(&b->head, memory_order_acquire);
    const size_t have = (size_t)(head - tail);
    if (n > have) n = have;
    const size_t at = (size_t)(tail % kRing), first = n < kRing - at ? n : kRing - at;
    memcpy(dst, b->data + at, first);
    memcpy(dst + first, b->data, n - first);
    atomic_store_explicit(&b->tail, tail + n, memory_order_release);
    return n;
}

static void check_record(const Transfer *t) {
    const EmuComm *c = t->comm;
    Record got;
    memcpy(&got, t->got, sizeof got);
    const Record *want = &t->record;
    if (got.magic == kRecordMagic && got.op == want->op && got.seq == want->seq && got.count == want->count &&
        got.type == want->type)
        return;
    fprintf(stderr,
            "EMU NCCL: rank %d of %d calls %s #%llu of %llu %s elements with rank %d, which called %s #%llu of %llu "
            "%s elements: the ranks' NCCL calls differ (on a GPU this hangs or corrupts)\n",
            c->rank, c->nranks, op_name(want->op), (unsigned long long)want->seq, (unsigned long long)want->count,
            type_name(want->type), t->peer, op_name(got.op), (unsigned long long)got.seq,
            (unsigned long long)got.count, type_name(got.type));
    abort();
}

/* One step of a transfer; returns the bytes moved. */
static size_t step(Transfer *t) {
    size_t moved = 0;
    if (t->header_done < sizeof(Record)) {
        const size_t n = sizeof(Record) - t->header_done;
        const size_t m = t->sending ? ring_write(t->box, (const unsigned char *)&t->record + t->header_done, n)
                                    : ring_read(t->box, t->got + t->header_done, n);
        t->header_done += m;
        if (t->sending) t->end = atomic_load_explicit(&t->box->head, memory_order_relaxed); /* its only writer */
        moved += m;
        if (t->header_done < sizeof(Record)) return moved;
        if (!t->sending) check_record(t);
    }
    if (t->done < t->bytes) {
        const size_t m = t->sending ? ring_write(t->box, t->data + t->done, t->bytes - t->done)
                                    : ring_read(t->box, t->data + t->done, t->bytes - t->done);
        t->done += m;
        moved += m;
        if (t->sending) t->end = atomic_load_explicit(&t->box->head, memory_order_relaxed);
    }
    return moved;
}

/* Its record and payload all through the ring (a send's may not have been taken yet). */
static bool moved_whole(const Transfer *t) { return t->header_done == sizeof(Record) && t->done == t->bytes; }

/* Moved whole, and, for a send, taken by its receiver. */
static bool finished(const Transfer *t) {
    return moved_whole(t) &&
           (!t->sending || atomic_load_explicit(&t->box->tail, memory_order_acquire) >= t->end);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double timeout_s(void) {
    const char *s = getenv("EMU_NCCL_TIMEOUT");
    return s && atof(s) > 0 ? atof(s) : 120.0;
}

/* Whether an earlier transfer of t's group in the same direction on the same mailbox (a rank's send to itself and
 * its receive share one) is still moving: messages through one ring follow each other whole, in the order posted (as NCCL matches a peer's sends and receives). A second receive from the
 * peer stepped while the first's payload is still arriving would otherwise take that payload's next bytes as its
 * record (seen in CI: the interleaved pipeline at pp 2 receives an activation and a gradient from its one peer). */
static bool behind(const Transfer *t, int i) {
    for (int j = 0; j < i; j++)
        if (t[j].box == t[i].box && t[j].sending == t[i].sending && !moved_whole(&t[j])) return true;
    return false;
}

/* Runs transfers until all are done, sleeping a little longer each round in which nothing moves. */
static void progress(const EmuComm *c, Transfer *t, int n, const char *what) {
    double idle_since = now_s();
    long sleep_ns = 0;
    for (;;) {
        size_t moved = 0;
        int left = 0;
        for (int i = 0; i < n; i++) {
            if (finished(&t[i])) continue;
            if (behind(t, i)) {
                left++;
                continue;
            }
            moved += step(&t[i]);
            if (finished(&t[i])) moved++; /* a send can finish without moving a byte: its receiver took it */
            else left++;
        }
        if (!left) return;
        if (moved) {
            idle_since = now_s();
            sleep_ns = 0;
            continue;
        }
        if (now_s() - idle_since > timeout_s()) {
            fprintf(stderr, "EMU NCCL: rank %d of %d: %s #%llu has not moved for %.0f s (EMU_NCCL_TIMEOUT); waiting "
                    "for:", c->rank, c->nranks, what, (unsigned long long)t[0].record.seq, timeout_s());
            for (int i = 0; i < n; i++)
                if (!finished(&t[i]))
                    fprintf(stderr, " %s rank %d (%zu of %zu bytes%s)", t[i].sending ? "a send to" : "a receive from",
                            t[i].peer, t[i].done, t[i].bytes,
                            t[i].sending && t[i].done == t[i].bytes ? ", not yet taken" : "");
            fprintf(stderr, ". A hang on a GPU: the ranks' NCCL calls, on this communicator or across communicators "
                            "(see NCCL_LAUNCH_ORDER_IMPLICIT), come in orders that wait for each other%s\n",
                    getenv("EMU_STREAMS") && strstr(getenv("EMU_STREAMS"), "lazy")
                        ? "; or, with EMU_STREAMS lazy, not one: the peer's call may still be queued on a lazy "
                          "stream of a host blocked outside the emulator (in MPI), which a GPU would run anyway "
                          "(tests/gpu/emu/README.md)"
                        : "");
            abort();
        }
        sleep_ns = sleep_ns ? (sleep_ns < 1000000 ? sleep_ns * 2 : sleep_ns) : 1000;
        nanosleep(&(struct timespec){0, sleep_ns}, NULL);
    }
}

static Transfer transfer(EmuComm *c, bool sending, int peer, Record record, void *data, size_t bytes) {
    Shared *s = c->shared;
    const int src = sending ? c->rank : peer, dst = sending ? peer : c->rank;
    return (Transfer){.box = &s->box[src * c->nranks + dst], .sending = sending, .record = record,
                      .data = data, .bytes = bytes, .peer = peer, .comm = c};
}

/* ---- communicators ---- */
ncclResult_t ncclGetVersion(int *v) {
    *v = NCCL_VERSION_CODE;
    return ncclSuccess;
}
const char *ncclGetErrorString(ncclResult_t r) {
    return r == ncclSuccess ? "no error" : "the emulator's NCCL failed (tests/gpu/emu/emu_nccl.c; see the EMU line)";
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    static _Atomic unsigned counter;
    memset(id, 0, sizeof *id);
    const char *dir = getenv("TMPDIR");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int n = snprintf(id->internal, sizeof id->internal, "%s/mt-emu-nccl-%d-%u-%ld", dir && *dir ? dir : "/tmp",
                     (int)getpid(), atomic_fetch_add(&counter, 1), (long)ts.tv_nsec);
    if (n <= 0 || (size_t)n >= sizeof id->internal) {
        fprintf(stderr, "EMU NCCL: the id's file name does not fit %zu bytes (TMPDIR too long?)\n",
                sizeof id->internal);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks) {
        fprintf(stderr, "EMU NCCL: ncclCommInitRank: rank %d of %d (the emulator serves 1 to %d ranks)\n", rank,
                nranks, kMaxRanks);
        return ncclInvalidArgument;
    }
    EmuComm *c = calloc(1, sizeof *c);
    c->nranks = nranks;
    c->rank = rank;
    const char *order = getenv("NCCL_LAUNCH_ORDER_IMPLICIT");
    c->implicit_order = order && atoi(order) == 1;
    c->p2p = calloc(2 * (size_t)nranks, sizeof *c->p2p);
    if (nranks > 1) {
        char name[sizeof id.internal + 1];
        memcpy(name, id.internal, sizeof id.internal);
        name[sizeof id.internal] = '\0';
        c->map_bytes = sizeof(Shared) + (size_t)nranks * nranks * sizeof(Mailbox);
        const int fd = open(name, O_RDWR | O_CREAT, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)c->map_bytes) != 0) {
            fprintf(stderr, "EMU NCCL: rank %d of %d: cannot make %s: %s\n", rank, nranks, name, strerror(errno));
            if (fd >= 0) close(fd);
            return ncclSystemError;
        }
        c->shared = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (c->shared == MAP_FAILED) {
            fprintf(stderr, "EMU NCCL: rank %d of %d: cannot map %s: %s\n", rank, nranks, name, strerror(errno));
            return ncclSystemError;
        }
        atomic_fetch_add(&c->shared->joined, 1);
        const double start = now_s();
        while (atomic_load(&c->shared->joined) < nranks) {
            if (now_s() - start > timeout_s()) {
                fprintf(stderr, "EMU NCCL: rank %d of %d: ncclCommInitRank: %d ranks joined in %.0f s\n", rank,
                        nranks, atomic_load(&c->shared->joined), timeout_s());
                abort();
            }
            nanosleep(&(struct timespec){0, 100000}, NULL);
        }
        if (rank == 0) unlink(name); /* every member has it mapped */
    }
    *comm = (ncclComm_t)c;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    EmuComm *c = (EmuComm *)comm;
    if (!c) return ncclSuccess;
    emu_streams_drain_all(); /* NCCL finishes the communicator's pending operations first */
    if (c->shared) munmap(c->shared, c->map_bytes);
    free(c->p2p);
    free(c);
    return ncclSuccess;
}
ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *r) {
    (void)comm;
    *r = ncclSuccess; /* every failure aborts the process where it happens */
    return ncclSuccess;
}

/* NCCL reads and writes device memory: a host pointer faults on a GPU. */
static void device_buffer(const void *p, size_t bytes, const char *what) {
    if (bytes && emu_device_bytes && !emu_device_bytes(p, bytes)) {
        fprintf(stderr, "EMU NCCL: %s's buffer %p (%zu bytes) is not inside one cudaMalloc allocation (a GPU faults "
                "on it)\n", what, p, bytes);
        abort();
    }
}
static bool overlap(const void *a, size_t an, const void *b, size_t bn) {
    const char *x = a, *y = b;
    return an && bn && x < y + bn && y < x + an;
}

/* ---- collectives: every rank's part to every other rank ---- */
static bool supported(ncclDataType_t t, ncclRedOp_t op, const char *what) {
    if ((t == ncclFloat32 || t == ncclBfloat16) && (op == ncclSum || op == ncclAvg)) return true;
    fprintf(stderr, "EMU NCCL: %s of type %d with operation %d: the emulator serves sum and average of fp32 and "
            "bf16\n", what, (int)t, (int)op);
    return false;
}

static float load(const void *p, size_t i, ncclDataType_t t) {
    return t == ncclFloat32 ? ((const float *)p)[i] : bf16_to_f32(((const uint16_t *)p)[i]);
}
static void store(void *p, size_t i, float v, ncclDataType_t t) {
    if (t == ncclFloat32) ((float *)p)[i] = v;
    else ((uint16_t *)p)[i] = f32_to_bf16(v);
}

/* Elements a collective moves per round: bounds the buffer of the other ranks' parts. */
enum { kChunk = 1 << 20 };

/* out[i] = the sum over ranks, in rank order, of part(rank)[i] (own: `mine`; the others' in `theirs`, rank order
 * without this rank), divided by nranks for ncclAvg; n elements. */
static void reduce(const EmuComm *c, const void *mine, const unsigned char *theirs, void *out, size_t n,
                   ncclDataType_t t, ncclRedOp_t op) {
    const size_t eb = type_bytes(t);
    for (size_t i = 0; i < n; i++) {
        float acc = 0.0f;
        for (int r = 0, k = 0; r < c->nranks; r++)
            acc += r == c->rank ? load(mine, i, t) : load(theirs + (size_t)k++ * n * eb, i, t);
        store(out, i, op == ncclAvg ? acc / (float)c->nranks : acc, t);
    }
}

/* Sends `send_of(peer)` (n elements) to every other rank and receives each one's part for this rank into
 * `theirs` (rank order without this rank), then reduces into out. */
static void exchange_and_reduce(EmuComm *c, int opcode, uint64_t seq, uint64_t count, const unsigned char *send,
                                size_t send_stride, const unsigned char *mine, void *out, size_t n, ncclDataType_t t,
                                ncclRedOp_t op, unsigned char *theirs) {
    const size_t eb = type_bytes(t);
    Transfer tr[2 * kMaxRanks];
    int k = 0, slot = 0;
    const Record rec = {kRecordMagic, opcode, seq, count, (int32_t)t, c->rank};
    for (int p = 0; p < c->nranks; p++) {
        if (p == c->rank) continue;
        tr[k++] = transfer(c, true, p, rec, (void *)(send + (size_t)p * send_stride), n * eb);
        tr[k++] = transfer(c, false, p, rec, theirs + (size_t)slot++ * n * eb, n * eb);
    }
    progress(c, tr, k, op_name(opcode));
    reduce(c, mine, theirs, out, n, t, op);
}

/* A collective as called: queued on its stream (emu_streams.h), numbered on its communicator when called. */
typedef struct {
    EmuComm *c;
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t type;
    ncclRedOp_t red;
    uint64_t seq;
} Call;

/* The last operation launched by this host thread (one device) on a communicator with implicit_order, as an
 * event recorded right after it on its stream. An operation on such a communicator first waits for it, and only
 * for it (NCCL_LAUNCH_ORDER_IMPLICIT orders NCCL's kernels, not the work queued after them). */
static _Thread_local cudaEvent_t ordered_last;
static void submit(const EmuComm *c, cudaStream_t st, EmuWorkFn run, void *ctx) {
    if (c->implicit_order && ordered_last) cudaStreamWaitEvent(st, ordered_last, 0);
    emu_stream_submit(st, run, free, ctx);
    if (c->implicit_order) {
        if (!ordered_last) cudaEventCreate(&ordered_last);
        cudaEventRecord(ordered_last, st);
    }
}

/* A collective's buffers, checked when called: device memory, and either apart or in place as NCCL allows it
 * (all-reduce: recv == send; reduce-scatter: recv == send + rank * count; all-gather: send == recv + rank *
 * count). Any other overlap gives the right answer here (each rank's part is read whole first) and garbage on a
 * GPU, whose ring steps read and write the buffers piece by piece. */
static void check_buffers(const Call *k, int opcode) {
    const size_t part = k->count * type_bytes(k->type), all = part * (size_t)k->c->nranks;
    const size_t send_bytes = opcode == OP_REDUCE_SCATTER ? all : part, recv_bytes = opcode == OP_ALL_GATHER ? all : part;
    device_buffer(k->send, send_bytes, op_name(opcode));
    device_buffer(k->recv, recv_bytes, op_name(opcode));
    const char *in_place = opcode == OP_REDUCE_SCATTER ? (const char *)k->send + (size_t)k->c->rank * part
                           : opcode == OP_ALL_GATHER ? (const char *)k->recv + (size_t)k->c->rank * part
                                                     : (const char *)k->send;
    const bool is_in_place = opcode == OP_ALL_GATHER ? k->send == in_place : k->recv == in_place;
    if (!is_in_place && overlap(k->send, send_bytes, k->recv, recv_bytes)) {
        fprintf(stderr, "EMU NCCL: rank %d of %d: %s's send buffer %p (%zu bytes) overlaps its receive buffer %p (%zu "
                "bytes) other than in place (NCCL's in-place forms only)\n", k->c->rank, k->c->nranks,
                op_name(opcode), k->send, send_bytes, k->recv, recv_bytes);
        abort();
    }
}

static ncclResult_t queue_call(cudaStream_t st, EmuWorkFn run, Call call) {
    call.seq = call.c->collectives++;
    Call *q = malloc(sizeof *q);
    *q = call;
    submit(call.c, st, run, q);
    return ncclSuccess;
}

/* All-reduce (every rank sends its whole buffer to each) or reduce-scatter (rank p's block is elements
 * [p * count, (p + 1) * count) of each sender's buffer), in chunks of kChunk elements. */
static void reduce_run(const Call *k, int opcode) {
    EmuComm *c = k->c;
    const size_t eb = type_bytes(k->type);
    if (c->nranks == 1) {
        if (k->count) memmove(k->recv, k->send, k->count * eb);
        return;
    }
    const size_t stride = opcode == OP_REDUCE_SCATTER ? k->count * eb : 0; /* from one peer's block to the next */
    unsigned char *theirs = malloc((size_t)(c->nranks - 1) * kChunk * eb);
    for (size_t at = 0; at < k->count; at += kChunk) {
        const size_t n = k->count - at < kChunk ? k->count - at : kChunk;
        const unsigned char *base = (const unsigned char *)k->send + at * eb;
        exchange_and_reduce(c, opcode, k->seq, k->count, base, stride, base + (size_t)c->rank * stride,
                            (unsigned char *)k->recv + at * eb, n, k->type, k->red, theirs);
    }
    free(theirs);
}
static void all_reduce_run(void *ctx) { reduce_run(ctx, OP_ALL_REDUCE); }
static void reduce_scatter_run(void *ctx) { reduce_run(ctx, OP_REDUCE_SCATTER); }

static void all_gather_run(void *ctx) {
    const Call *k = ctx;
    EmuComm *c = k->c;
    const size_t bytes = k->count * type_bytes(k->type);
    unsigned char *out = k->recv;
    if (bytes && k->send != out + (size_t)c->rank * bytes) memmove(out + (size_t)c->rank * bytes, k->send, bytes);
    if (c->nranks == 1) return;
    Transfer tr[2 * kMaxRanks];
    int n = 0;
    const Record rec = {kRecordMagic, OP_ALL_GATHER, k->seq, k->count, (int32_t)k->type, c->rank};
    for (int p = 0; p < c->nranks; p++) {
        if (p == c->rank) continue;
        tr[n++] = transfer(c, true, p, rec, out + (size_t)c->rank * bytes, bytes);
        tr[n++] = transfer(c, false, p, rec, out + (size_t)p * bytes, bytes);
    }
    progress(c, tr, n, "ncclAllGather");
}

ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t st) {
    if (!supported(t, op, "ncclAllReduce")) return ncclInvalidArgument;
    const Call call = {(EmuComm *)comm, s, r, count, t, op, 0};
    check_buffers(&call, OP_ALL_REDUCE);
    return queue_call(st, all_reduce_run, call);
}

ncclResult_t ncclReduceScatter(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t st) {
    if (!supported(t, op, "ncclReduceScatter")) return ncclInvalidArgument;
    const Call call = {(EmuComm *)comm, s, r, count, t, op, 0};
    check_buffers(&call, OP_REDUCE_SCATTER);
    return queue_call(st, reduce_scatter_run, call);
}

ncclResult_t ncclAllGather(const void *s, void *r, size_t count, ncclDataType_t t, ncclComm_t comm, cudaStream_t st) {
    const Call call = {(EmuComm *)comm, s, r, count, t, ncclSum, 0};
    check_buffers(&call, OP_ALL_GATHER);
    return queue_call(st, all_gather_run, call);
}

/* ---- point to point: gathered inside a group, queued on the stream at its end ---- */
static _Thread_local int group_depth;
static _Thread_local Transfer queued[kMaxQueued];
static _Thread_local int queued_count;
static _Thread_local cudaStream_t queued_stream; /* the first one's (NCCL runs a group on one stream) */

typedef struct {
    int count;
    Transfer t[];
} Group;
static void group_run(void *ctx) {
    Group *g = ctx;
    progress(g->t[0].comm, g->t, g->count, "a group of ncclSend/ncclRecv");
}

static ncclResult_t post(bool sending, void *data, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                         cudaStream_t st) {
    EmuComm *c = (EmuComm *)comm;
    if (peer < 0 || peer >= c->nranks) { /* itself included: NCCL pairs a send to self with the receive */
        fprintf(stderr, "EMU NCCL: rank %d of %d: %s with peer %d\n", c->rank, c->nranks,
                sending ? "ncclSend" : "ncclRecv", peer);
        return ncclInvalidArgument;
    }
    if (queued_count == kMaxQueued) {
        fprintf(stderr, "EMU NCCL: more than %d sends and receives in one group\n", kMaxQueued);
        return ncclInvalidUsage;
    }
    uint64_t *seq = &c->p2p[sending ? peer : c->nranks + peer];
    const Record rec = {kRecordMagic, OP_SEND, (*seq)++, count, (int32_t)t, sending ? c->rank : peer};
    device_buffer(data, count * type_bytes(t), sending ? "ncclSend" : "ncclRecv");
    if (queued_count == 0) queued_stream = st;
    queued[queued_count++] = transfer(c, sending, peer, rec, data, count * type_bytes(t));
    return group_depth == 0 ? ncclGroupEnd() : ncclSuccess; /* not in a group: runs now */
}

ncclResult_t ncclSend(const void *s, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t st) {
    return post(true, (void *)s, count, t, peer, comm, st);
}
ncclResult_t ncclRecv(void *r, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t st) {
    return post(false, r, count, t, peer, comm, st);
}

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

/* A GPU runs a group's transfers at once: a receive into memory that another transfer of the group reads (a send)
 * or writes (a receive) races with it there, whatever the order here (which copies a send's data at the start).
 * The first such pair, or -1. */
static int group_overlap(const Transfer *t, int n, int *other) {
    for (int i = 0; i < n; i++) {
        if (t[i].sending) continue;
        for (int j = 0; j < n; j++) {
            if (j != i && overlap(t[i].data, t[i].bytes, t[j].data, t[j].bytes)) {
                *other = j;
                return i;
            }
        }
    }
    return -1;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth > 0) group_depth--;
    if (group_depth > 0 || queued_count == 0) return ncclSuccess;
    int other = -1, recv = group_overlap(queued, queued_count, &other);
    if (recv >= 0) {
        const Transfer *r = &queued[recv], *o = &queued[other];
        fprintf(stderr, "EMU NCCL: rank %d of %d: a group's ncclRecv from rank %d into %p (%zu bytes) overlaps its %s "
                "%s rank %d at %p (%zu bytes): on a GPU they run at once\n", r->comm->rank, r->comm->nranks, r->peer,
                r->data, r->bytes, o->sending ? "ncclSend" : "ncclRecv", o->sending ? "to" : "from", o->peer, o->data,
                o->bytes);
        queued_count = 0;
        return ncclInvalidUsage;
    }
    Group *g = malloc(sizeof *g + (size_t)queued_count * sizeof(Transfer));
    g->count = queued_count;
    memcpy(g->t, queued, (size_t)queued_count * sizeof(Transfer));
    queued_count = 0;
    submit(g->t[0].comm, queued_stream, group_run, g);
    return ncclSuccess;
}
