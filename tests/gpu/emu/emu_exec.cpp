// emu_exec.cpp: runs the kernels of kernels/*.cu on the CPU (tests/gpu/emu/README.md).
//
// A launch runs its blocks one after another on the calling host thread;
// a block runs each CUDA thread as a fibre (its own stack, switched by
// emu_ctx_switch below, a few nanoseconds). A fibre runs until it exits or
// waits: at __syncthreads (released when every thread that still runs
// waits there), or at a warp exchange (a shuffle, a ballot, __syncwarp,
// ldmatrix, mma: released when every running lane of the warp waits
// there). Threads waiting at different barriers with nothing left to run
// is a deadlock on a GPU too: the emulator reports it and stops.
//
// Order: blocks, warps and the lanes of a warp run in ascending order, so a
// thread that reads what a higher-numbered thread (or block) writes without a
// barrier between reads it before it is written (shared memory: NaN). With
// EMU_ORDER=reverse all three run in descending order, which shows the other
// half: a read of a lower-numbered thread's or block's write that no barrier
// orders. A kernel whose result depends on the order is racy on a GPU.
//
// It checks what a GPU would leave to chance: shared memory starts as NaN
// (0xff bytes) in every block, so a read before a write shows; cp.async
// copies land at the issuing thread's wait_group, not before; ldmatrix rows
// and cp.async targets must be aligned and inside the block's dynamic
// shared memory, and a cp.async source (unless predicated off) inside one
// cudaMalloc allocation; a warp exchange must name every running lane of its warp.
// A failure prints the kernel, block and thread and aborts the program.
//
// Racecheck (the kernels built with ThreadSanitizer, this file without it and
// with EMU_TSAN; make gpu-emu-tsan-build): each thread slot is a
// ThreadSanitizer fibre, switched with no synchronisation, so two CUDA
// threads' accesses race unless something below orders them:
// __syncthreads (every waiting thread releases the barrier's generation and
// acquires it when the barrier opens), __syncwarp (the same for its warp),
// and the launching stream between launches (each fibre acquires the
// stream's fibre at its start, which acquires every fibre that ended once
// the launch is over; emu_streams.c runs each stream's work as a fibre of
// its own, and its kernels on a pool of thread slots of their own).
// Nothing orders the blocks of one launch, as on a GPU: they take turns
// among up to EMU_BLOCK_SETS sets of thread slots (as many sets of the
// launch's block size as 1024 slots hold, fewer when the process nears
// ThreadSanitizer's limit on fibres), each set with its own fibres,
// stacks, barriers and shared memory (dynamic, and the kernels' static
// __shared__ arrays, which cu2cpp.py gives one copy a set). Block (x, y, z)
// runs on set (x + y + z) % sets, so two blocks whose indices differ in one
// dimension by less than the number of sets (neighbours, a column of blocks
// adding to one row) run on different sets, and if they touch the same
// global memory without atomics it is reported (a lost update, a read of
// another block's output). The blocks of one set run in turn, each after
// the one before (they reuse its shared memory), so a race between two
// blocks of one set only is missed. Threads of a block are checked against
// each other whatever the order they run in. Shuffles, ballots, ldmatrix and
// mma order nothing (the PTX ISA gives them no memory ordering). A
// cp.async's copy is recorded at its issue, again after each barrier the
// issuing thread passes while it is pending, and at its wait, as a GPU may
// land it anywhere between; ldmatrix reads each lane's row as that lane.
//
// Host threads are independent (thread_local state): several ranks in one
// process each run their own launches.
#include <pthread.h>
#include <sys/mman.h>
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#else
#define ASAN_UNPOISON_MEMORY_REGION(addr, size) ((void)(addr), (void)(size))
#endif
#ifdef EMU_TSAN
#include <sanitizer/tsan_interface.h>
extern "C" void __tsan_read16(void *addr);
extern "C" void __tsan_read_range(void *addr, unsigned long size);
extern "C" void __tsan_write_range(void *addr, unsigned long size);
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "emu_device.h"

thread_local uint3 threadIdx, blockIdx;
thread_local dim3 blockDim, gridDim;

extern "C" void emu_runtime_launch_error(cudaError_t status);  // emu_runtime.c: cudaGetLastError's next answer
extern "C" int emu_device_bytes(const void *p, size_t bytes);   // emu_runtime.c: inside one live cudaMalloc

// ---- context switch (x86-64 System V): saves the callee-saved registers on the old stack, stores its pointer at
// *save and continues on `load`. The floating-point control registers are left alone: no kernel changes them, so
// every fibre runs with the host thread's ----
extern "C" void emu_ctx_switch(void **save, void *load);
asm(R"(
    .text
    .globl emu_ctx_switch
    .type emu_ctx_switch, @function
emu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_ctx_switch, .-emu_ctx_switch
)");

namespace {

enum State { READY, AT_BLOCK, AT_WARP, DONE };
enum { kMaxThreads = 1024, kStackBytes = 128 * 1024, kPage = 4096, kMaxDynamicSmem = 227 * 1024,
       kDefaultDynamicSmem = 48 * 1024 };

struct Copy {
    void *dst;
    const void *src;
    int bytes;
    bool pred;
};

struct Fiber {
    void *sp;
    State state;
    unsigned linear;
    unsigned slot;  // its stack (and racecheck fibre): set * threads of the block + linear
    uint3 idx;
    unsigned exchanges;  // warp exchanges made: picks the slot buffer (two, used in turn)
    unsigned barriers;   // __syncthreads passed (racecheck: the generation it releases)
    unsigned mask;       // the mask of the exchange it waits at
    std::vector<std::vector<Copy>> groups;  // committed cp.async groups, oldest first
    std::vector<Copy> open;                 // cp.async not yet committed
};

// The thread slots' stacks (and racecheck fibres) that the launches of one stream run on: one pool outside the
// racecheck; in it, up to EMU_BLOCK_SETS / EMU_POOL_SETS, one a stream (the first streams of the host thread to
// launch kernels; later ones share, which orders their kernels), so that kernels of different streams are not
// ordered by running on the same fibres, nor touch the same stacks or shared memory.
struct Pool {
    void *owner = nullptr;  // racecheck: the stream's ThreadSanitizer fibre (emu_streams.c), or none yet
    char *stacks = nullptr;
    unsigned guarded = 0;  // stacks with their guard page
#ifdef EMU_TSAN
    // one fibre per thread slot (made as launches need them), and the addresses they synchronise on: the stream's
    // hand-over to a launch's threads and theirs back, and, per set, two generations of the block barrier and of
    // each warp's __syncwarp
    void *tsan_fibers[kMaxThreads] = {};
    unsigned tsan_made = 0;
    char block_start, block_end, block_barrier[EMU_POOL_SETS][2], warp_barrier[EMU_POOL_SETS][2][kMaxThreads / 32];
    // each set's blocks in turn: the threads of a set's k-th block release set_free[set][k & 1] as they end and
    // acquire set_free[set][(k - 1) & 1] as they start (not their own block's: that would order its threads)
    char set_free[EMU_POOL_SETS][2];
    unsigned long set_blocks[EMU_POOL_SETS] = {};
#endif
};

struct Exec {
    void *sched_sp = nullptr;
    const void *sched_bottom = nullptr;  // the host thread's stack (for AddressSanitizer's fibre switches)
    size_t sched_size = 0;
    Pool pools[EMU_BLOCK_SETS / EMU_POOL_SETS];
    Pool *pool = &pools[0];  // the running launch's
    Fiber fibers[kMaxThreads];
    Fiber *cur = nullptr;
    unsigned nthreads = 0;
    EmuBody body = nullptr;
    void *ctx = nullptr;
    const char *kernel = "";
    alignas(128) unsigned char slots[2][kMaxThreads / 32][32][EMU_SLOT];
    // a block's dynamic shared memory, per set of each pool (copy = pool * EMU_POOL_SETS + set)
    alignas(128) unsigned char smem[EMU_BLOCK_SETS][kMaxDynamicSmem];
    size_t smem_bytes = 0;
    unsigned sets = 1, set = 0, copy = 0;  // the launch's sets of thread slots, the running block's, its copy
    unsigned long block_serial = 0;
    std::vector<std::pair<void *, unsigned long>> poisoned;
#ifdef EMU_TSAN
    void *host_fiber = nullptr;  // racecheck: the launching stream's ThreadSanitizer fibre
#endif
};

thread_local Exec *ex;

#ifdef EMU_TSAN
// ThreadSanitizer holds at most 8,128 threads and fibres in a process (GCC 12's runtime), and each of them makes
// every later synchronisation dearer (its vector clocks grow with the threads it has seen: test_cuda_model took
// 262 s with 4,096 here, 177 s with 1,280). Every rank thread of a test has its own fibres, a pool of them for each
// stream that launches kernels: a launch that would take the process past this many runs on fewer sets (emu_run),
// down to one, whose fibres it makes whatever the count. 1,280 gives the first pool four sets of 256 threads.
constexpr unsigned long kFibreBudget = 1280;
std::atomic<unsigned long> fibres_live{0};
#endif

// The emulator's own bookkeeping in a running kernel (its vectors' allocations and copies, which ThreadSanitizer
// sees through its interceptors), left out of the racecheck: per thread slot, or per host thread, the GPU has none
// of it. Outside the racecheck build it does nothing.
struct Unchecked {
    Unchecked() { EMU_UNCHECKED_BEGIN(); }
    ~Unchecked() { EMU_UNCHECKED_END(); }
};

// The host thread's state, unmapped when the thread ends (a stack's guard page is a mapping of its own, and a
// process has a bounded number of them).
struct ExecOwner {
    ~ExecOwner() {
        if (!ex) return;
        // AddressSanitizer keeps an unmapped range's shadow: clear the marks the last fibres left, so that the
        // next mapping of these addresses (often the next thread's stacks) starts clean
        for (Pool &p : ex->pools) {
            if (!p.stacks) continue;
            ASAN_UNPOISON_MEMORY_REGION(p.stacks, (size_t)kMaxThreads * kStackBytes);
            munmap(p.stacks, (size_t)kMaxThreads * kStackBytes);
#ifdef EMU_TSAN
            for (unsigned i = 0; i < p.tsan_made; i++) __tsan_destroy_fiber(p.tsan_fibers[i]);
            fibres_live -= p.tsan_made;
#endif
        }
        delete ex;
        ex = nullptr;
    }
};
thread_local ExecOwner exec_owner;

// A pool's thread-slot stacks, mapped when it is first used.
void map_stacks(Pool *p) {
    const size_t total = (size_t)kMaxThreads * kStackBytes;
    void *m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        fprintf(stderr, "EMU: cannot map %zu bytes of fibre stacks\n", total);
        abort();
    }
    p->stacks = (char *)m;
    // A fresh mapping can carry the shadow of what these addresses held before (a finished thread's fibre
    // stacks, whose last frames died marked): under AddressSanitizer that reads as a stack-use-after-scope in a
    // fibre that never did one, so the stacks start unpoisoned (test_emu_checks fresh_stacks)
    ASAN_UNPOISON_MEMORY_REGION(m, total);
}

Exec *exec_get() {
    if (ex) return ex;
    (void)&exec_owner;  // constructs it, so that its destructor runs at the thread's end
    ex = new Exec();
    map_stacks(&ex->pools[0]);
    pthread_attr_t attr;  // the host thread's stack, where the scheduler runs
    void *bottom = nullptr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
        pthread_attr_getstack(&attr, &bottom, &ex->sched_size);
        pthread_attr_destroy(&attr);
    }
    ex->sched_bottom = bottom;
    return ex;
}

// The pool of the running stream (racecheck: the current ThreadSanitizer fibre, emu_streams.c): its own, a free
// one, or when none is left a shared one.
Pool *pool_for(Exec *e) {
#ifdef EMU_TSAN
    void *owner = __tsan_get_current_fiber();
    const unsigned n = EMU_BLOCK_SETS / EMU_POOL_SETS;
    for (unsigned i = 0; i < n; i++)
        if (e->pools[i].owner == owner) return &e->pools[i];
    for (unsigned i = 0; i < n; i++)
        if (!e->pools[i].owner) {
            e->pools[i].owner = owner;
            if (!e->pools[i].stacks) map_stacks(&e->pools[i]);
            return &e->pools[i];
        }
    return &e->pools[((uintptr_t)owner >> 4) % n];
#else
    return &e->pools[0];
#endif
}

// The guard page below each stack, made when a launch first needs that many threads.
void guard_stacks(Pool *p, unsigned n) {
    for (unsigned i = p->guarded; i < n; i++) mprotect(p->stacks + (size_t)i * kStackBytes, kPage, PROT_NONE);
    if (n > p->guarded) p->guarded = n;
#ifdef EMU_TSAN
    for (; p->tsan_made < n; p->tsan_made++) {
        p->tsan_fibers[p->tsan_made] = __tsan_create_fiber(0);
    }
#endif
}

[[noreturn]] void fail_here(const char *what) {
    Exec *e = ex;
    fprintf(stderr, "EMU: kernel %s, block (%u,%u,%u) of (%u,%u,%u), thread (%u,%u,%u) of (%u,%u,%u): %s\n",
            e ? e->kernel : "?", blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x, gridDim.y, gridDim.z, threadIdx.x,
            threadIdx.y, threadIdx.z, blockDim.x, blockDim.y, blockDim.z, what);
    fflush(stderr);
    abort();
}

// One past the last thread of the warp of thread i.
unsigned warp_end(const Exec *e, unsigned i) { return (i | 31u) + 1 < e->nthreads ? (i | 31u) + 1 : e->nthreads; }

// EMU_ORDER=reverse: blocks, warps and lanes in descending order (the header).
bool reversed() {
    static const bool r = [] {
        const char *v = getenv("EMU_ORDER");
        if (v && *v && strcmp(v, "reverse") != 0 && strcmp(v, "forward") != 0) {
            fprintf(stderr, "EMU: EMU_ORDER=%s: expected forward or reverse\n", v);
            abort();
        }
        return v && strcmp(v, "reverse") == 0;
    }();
    return r;
}

// The first ready fibre of [from, end) in the run order (the last one under EMU_ORDER=reverse), or NULL.
Fiber *next_ready(Exec *e, unsigned from, unsigned end) {
    if (reversed()) {
        for (unsigned i = end; i-- > from;)
            if (e->fibers[i].state == READY) return &e->fibers[i];
        return nullptr;
    }
    for (unsigned i = from; i < end; i++)
        if (e->fibers[i].state == READY) return &e->fibers[i];
    return nullptr;
}

// Switches stacks: saves the running context's at *save, continues `to` (nullptr: the scheduler, on the host
// thread's stack). Under AddressSanitizer (the EMU_SANITIZE build) it is told of each switch, so that it checks
// the fibres' stacks as stacks; `dying`: the running fibre will not be resumed.
void switch_stacks(Exec *e, void **save, const Fiber *to, bool dying) {
#ifdef __SANITIZE_ADDRESS__
    void *fake_stack = nullptr;
    const void *bottom = to ? e->pool->stacks + (size_t)to->slot * kStackBytes : e->sched_bottom;
    __sanitizer_start_switch_fiber(dying ? nullptr : &fake_stack, bottom, to ? kStackBytes : e->sched_size);
    emu_ctx_switch(save, to ? to->sp : e->sched_sp);
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#else
    (void)dying;
#ifdef EMU_TSAN
    __tsan_switch_to_fiber(to ? e->pool->tsan_fibers[to->slot] : e->host_fiber, __tsan_switch_to_fiber_no_sync);
#endif
    emu_ctx_switch(save, to ? to->sp : e->sched_sp);
#endif
}

// Continues fibre f, saving the running context's stack pointer at *save.
void resume(Exec *e, void **save, Fiber *f, bool dying = false) {
    e->cur = f;
    threadIdx = f->idx;
    switch_stacks(e, save, f, dying);
}

// The running fibre waits (AT_BLOCK or AT_WARP) or ends (DONE): the next ready lane of its warp runs, or, when
// none is left, the scheduler (run_warp) decides.
void switch_away(State s) {
    Exec *e = ex;
    Fiber *f = e->cur;
    f->state = s;
    Fiber *next = reversed() ? next_ready(e, f->linear & ~31u, f->linear)
                             : next_ready(e, f->linear + 1, warp_end(e, f->linear));
    if (next) resume(e, &f->sp, next, s == DONE);
    else switch_stacks(e, &f->sp, nullptr, s == DONE);
}

void fiber_main() {
#ifdef __SANITIZE_ADDRESS__
    __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);  // entered by a switch_stacks that did not return
#endif
    Exec *e = ex;
#ifdef EMU_TSAN
    Pool *p = e->pool;
    __tsan_acquire(&p->block_start);  // after what the stream did before the launch
    const unsigned turn = (unsigned)(p->set_blocks[e->set] & 1u);
    __tsan_acquire(&p->set_free[e->set][turn ^ 1u]);  // after the set's block before, whose shared memory it reuses
#endif
    e->body(e->ctx);
#ifdef EMU_TSAN
    __tsan_release(&p->set_free[e->set][turn]);
    __tsan_release(&p->block_end);  // before what the stream does after the launch
#endif
    Fiber *f = e->cur;
    if (!f->open.empty()) fail_here("cp.async copies issued and never committed");
    for (auto &g : f->groups)
        if (!g.empty()) fail_here("exits with cp.async copies never waited for");
    {
        Unchecked u;
        f->groups.clear();
    }
    switch_away(DONE);
    abort();  // a finished fibre is never resumed
}

void fiber_init(Exec *e, unsigned i) {
    Fiber *f = &e->fibers[i];
    f->state = READY;
    f->linear = i;
    f->slot = e->set * e->nthreads + i;
    f->idx.x = i % blockDim.x;
    f->idx.y = i / blockDim.x % blockDim.y;
    f->idx.z = i / (blockDim.x * blockDim.y);
    f->exchanges = 0;
    f->barriers = 0;
    f->mask = 0;
    f->groups.clear();
    f->open.clear();
#ifdef __SANITIZE_ADDRESS__
    // The fibre that ended on this stack left its last frames (above the stack pointer it saved) with their
    // redzones marked; clear them, so that this block's fibre starts on a clean stack.
    char *top = e->pool->stacks + (size_t)(f->slot + 1) * kStackBytes, *low = f->sp ? (char *)f->sp : top;
    ASAN_UNPOISON_MEMORY_REGION(low, (size_t)(top - low));
#endif
    uint64_t *sp = (uint64_t *)(e->pool->stacks + (size_t)(f->slot + 1) * kStackBytes);
    *--sp = 0;                     // fiber_main's return address (never used); keeps the ABI's alignment
    *--sp = (uint64_t)fiber_main;  // where emu_ctx_switch's ret goes
    for (int r = 0; r < 6; r++) *--sp = 0;
    f->sp = sp;
}

// The lanes of a warp all waiting at an exchange (the ones that exited aside) go on; true if they do.
bool try_release_warp(Exec *e, unsigned w) {
    const unsigned first = w * 32, end = warp_end(e, first);
    unsigned running = 0, waiting = 0;
    for (unsigned i = first; i < end; i++) {
        if (e->fibers[i].state != DONE) running |= 1u << (i - first);
        if (e->fibers[i].state == AT_WARP) waiting |= 1u << (i - first);
    }
    if (!waiting || waiting != running) return false;
    for (unsigned i = first; i < end; i++) {
        Fiber *f = &e->fibers[i];
        if (f->state != AT_WARP) continue;
        if ((f->mask & running) != running || (f->mask & ~running) != 0) {
            e->cur = f;
            threadIdx = f->idx;
            char what[160];
            snprintf(what, sizeof what,
                     "warp exchange with mask 0x%08x while the running lanes of its warp are 0x%08x", f->mask,
                     running);
            fail_here(what);
        }
        f->state = READY;
    }
    return true;
}

// Runs warp w until each of its lanes has exited or waits at __syncthreads (or the warp is stuck).
void run_warp(Exec *e, unsigned w) {
    do {  // the first ready lane runs; each hands over to the next (switch_away)
        Fiber *f = next_ready(e, w * 32, warp_end(e, w * 32));
        if (f) resume(e, &e->sched_sp, f);
    } while (try_release_warp(e, w));
}

void run_block(Exec *e) {
    const unsigned n = e->nthreads, warps = (n + 31) / 32;
    e->block_serial++;
#ifdef EMU_TSAN
    e->pool->set_blocks[e->set]++;
#endif
    EMU_UNCHECKED_BEGIN();  // a fresh block's shared memory, written by no thread of it (nor ordered after the last)
    if (e->smem_bytes) memset(e->smem[e->copy], 0xff, e->smem_bytes);
    EMU_UNCHECKED_END();
#ifdef EMU_TSAN
    __tsan_release(&e->pool->block_start);  // what the stream did before the launch (it acquires no block until the end)
#endif
    for (unsigned i = 0; i < n; i++) fiber_init(e, i);
    for (;;) {
        for (unsigned k = 0; k < warps; k++) run_warp(e, reversed() ? warps - 1 - k : k);
        unsigned at_block = 0, done = 0;
        for (unsigned i = 0; i < n; i++) {
            at_block += e->fibers[i].state == AT_BLOCK;
            done += e->fibers[i].state == DONE;
        }
        if (done == n) return;
        if (at_block + done == n) {
            for (unsigned i = 0; i < n; i++)
                if (e->fibers[i].state == AT_BLOCK) e->fibers[i].state = READY;
            continue;
        }
        for (unsigned i = 0; i < n; i++)
            if (e->fibers[i].state == AT_WARP) {
                threadIdx = e->fibers[i].idx;
                break;
            }
        fail_here("deadlock: some threads wait at __syncthreads, others at a warp exchange");
    }
}

// EMU_PROFILE=1: the time each kernel took in the emulator, printed at exit (what to make faster).
struct Profile {
    std::mutex lock;
    std::map<std::string, std::pair<double, long>> kernels;
    bool on = getenv("EMU_PROFILE") && strcmp(getenv("EMU_PROFILE"), "1") == 0;
    ~Profile() {
        if (!on) return;
        std::vector<std::pair<double, std::string>> rows;
        for (auto &k : kernels) rows.emplace_back(k.second.first, k.first + " (" + std::to_string(k.second.second) + ")");
        std::sort(rows.rbegin(), rows.rend());
        for (auto &r : rows) fprintf(stderr, "EMU_PROFILE %9.3f s  %s\n", r.first, r.second.c_str());
    }
} profile;

}  // namespace

namespace {
// Each kernel's cudaFuncAttributeMaxDynamicSharedMemorySize, as cudaFuncSetAttribute set it.
std::mutex smem_attr_lock;
std::map<const void *, int> smem_attr;

// Dynamic shared memory a launch of kernel may ask for: its attribute once set (above or below 48 KB), else 48 KB.
size_t smem_allowed(const void *kernel) {
    std::lock_guard<std::mutex> g(smem_attr_lock);
    const auto it = smem_attr.find(kernel);
    return it == smem_attr.end() ? (size_t)kDefaultDynamicSmem : (size_t)it->second;
}
}  // namespace

void emu_set_max_dynamic_smem(const void *kernel, int bytes) {
    std::lock_guard<std::mutex> g(smem_attr_lock);
    smem_attr[kernel] = bytes;
}

void emu_kernel_pointer_fault(const char *name, int index, const void *p) {
    fprintf(stderr, "EMU: kernel %s: argument %d is %p, not inside a cudaMalloc allocation (a host pointer: a GPU "
            "faults on it)\n", name, index, p);
    abort();
}

bool emu_launch_ok(const EmuCfg &cfg, const void *kernel) {
    const unsigned long long threads = (unsigned long long)cfg.block.x * cfg.block.y * cfg.block.z;
    const bool smem_ok = cfg.smem <= kMaxDynamicSmem && cfg.smem <= smem_allowed(kernel);
    if (threads == 0 || threads > kMaxThreads || cfg.block.z > 64 || cfg.grid.x == 0 || cfg.grid.y == 0 ||
        cfg.grid.z == 0 || cfg.grid.x > 0x7fffffffu || cfg.grid.y > 65535 || cfg.grid.z > 65535 || !smem_ok) {
        emu_runtime_launch_error(!smem_ok ? cudaErrorInvalidValue : cudaErrorInvalidConfiguration);
        return false;
    }
    return true;
}

// ---- racecheck: a stream's work on its own stack (emu_streams.c), so that its locals are not the host's or
// another stream's memory; the calls nest (a stream's wait runs another stream's work) ----
namespace {
struct StackCall {
    void (*fn)(void *);
    void *ctx;
    void *back;
};
thread_local StackCall *stack_call;

[[noreturn]] void stack_entry() {
    StackCall *c = stack_call;
    c->fn(c->ctx);
    void *unused;
    emu_ctx_switch(&unused, c->back);
    abort();  // never resumed
}
}  // namespace

extern "C" void emu_run_on_stack(void *stack, size_t bytes, void (*fn)(void *), void *ctx) {
    StackCall c{fn, ctx, nullptr};
    uint64_t *sp = (uint64_t *)((char *)stack + bytes);
    *--sp = 0;                      // stack_entry's return address (never used); keeps the ABI's alignment
    *--sp = (uint64_t)stack_entry;  // where emu_ctx_switch's ret goes
    for (int r = 0; r < 6; r++) *--sp = 0;
    stack_call = &c;
    emu_ctx_switch(&c.back, sp);
}

void emu_run(const char *name, const EmuCfg &cfg, EmuBody body, void *ctx) {
    Exec *e = exec_get();
    if (e->cur) {
        fprintf(stderr, "EMU: kernel %s launched from inside kernel %s\n", name, e->kernel);
        abort();
    }
    e->kernel = name;
#ifdef EMU_TSAN
    e->host_fiber = __tsan_get_current_fiber();  // the stream's fibre whose work this launch is (emu_streams.c)
#endif
    e->body = body;
    e->ctx = ctx;
    e->nthreads = cfg.block.x * cfg.block.y * cfg.block.z; // emu_launch_ok bounded it
    e->pool = pool_for(e);
    e->sets = std::max(1u, std::min((unsigned)EMU_POOL_SETS, kMaxThreads / e->nthreads));
#ifdef EMU_TSAN
    // within the process's fibre budget: the fibres this pool has, and what is left of the budget, reserved before
    // they are made (guard_stacks), as other rank threads launch at the same time
    const unsigned long have = e->pool->tsan_made;
    unsigned long live = fibres_live.load(), make;
    do {
        const unsigned long left = kFibreBudget - std::min(kFibreBudget, live);
        e->sets = std::max(1u, std::min((unsigned)EMU_POOL_SETS, kMaxThreads / e->nthreads));
        while (e->sets > 1 && e->sets * e->nthreads > have + left) e->sets--;
        make = e->sets * e->nthreads > have ? e->sets * e->nthreads - have : 0;
    } while (!fibres_live.compare_exchange_weak(live, live + make));
#endif
    guard_stacks(e->pool, e->sets * e->nthreads);
    e->smem_bytes = cfg.smem;
    gridDim = cfg.grid;
    blockDim = cfg.block;
    const auto start = std::chrono::steady_clock::now();
    const bool r = reversed();
    for (unsigned k = 0; k < cfg.grid.z; k++)
        for (unsigned j = 0; j < cfg.grid.y; j++)
            for (unsigned i = 0; i < cfg.grid.x; i++) {
                blockIdx = r ? make_uint3(cfg.grid.x - 1 - i, cfg.grid.y - 1 - j, cfg.grid.z - 1 - k)
                             : make_uint3(i, j, k);
                e->set = (blockIdx.x + blockIdx.y + blockIdx.z) % e->sets;
                e->copy = (unsigned)(e->pool - e->pools) * EMU_POOL_SETS + e->set;
                run_block(e);
            }
    e->cur = nullptr;
    e->set = e->copy = 0;
#ifdef EMU_TSAN
    __tsan_acquire(&e->pool->block_end);  // every thread of the launch, ended
#endif
    if (profile.on) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::lock_guard<std::mutex> g(profile.lock);
        auto &k = profile.kernels[name];
        k.first += s;
        k.second++;
    }
}

#ifdef EMU_TSAN
// The running thread's cp.async copies not yet waited for, recorded again: a GPU may land each in any barrier
// interval from its issue to its wait.
static void record_pending_copies(void) {
    const Fiber *f = ex->cur;
    auto record = [](const Copy &c) {
        __tsan_write_range(c.dst, (unsigned long)c.bytes);
        if (c.pred) __tsan_read_range(const_cast<void *>(c.src), (unsigned long)c.bytes);
    };
    for (const Copy &c : f->open) record(c);
    for (const auto &g : f->groups)
        for (const Copy &c : g) record(c);
}
#endif

void emu_syncthreads(void) {
#ifdef EMU_TSAN
    char *generation = &ex->pool->block_barrier[ex->set][ex->cur->barriers++ & 1u];
    __tsan_release(generation);
    switch_away(AT_BLOCK);
    __tsan_acquire(generation);
    record_pending_copies();
#else
    switch_away(AT_BLOCK);
#endif
}

void emu_fail(const char *what) {
    if (ex && ex->cur) fail_here(what);
    fprintf(stderr, "EMU: host code: %s\n", what);  // outside a kernel (a launcher's own casts)
    fflush(stderr);
    abort();
}

unsigned emu_lane(void) { return ex->cur->linear & 31u; }

// The exchange; `orders_memory`: the lanes' accesses before it happen before those after it (__syncwarp).
static const unsigned char *warp_exchange(unsigned mask, const void *mine, size_t bytes, bool orders_memory) {
    Exec *e = ex;
    Fiber *f = e->cur;
    if (bytes > EMU_SLOT) fail_here("warp exchange of more than EMU_SLOT bytes");
    unsigned char(*table)[EMU_SLOT] = e->slots[f->exchanges & 1u][f->linear / 32];
    EMU_UNCHECKED_BEGIN();
    if (bytes) memcpy(table[f->linear & 31u], mine, bytes);
    EMU_UNCHECKED_END();
    f->mask = mask;
#ifdef EMU_TSAN
    char *generation = &e->pool->warp_barrier[e->set][f->exchanges & 1u][f->linear / 32];
    if (orders_memory) __tsan_release(generation);
#endif
    f->exchanges++;
    switch_away(AT_WARP);
#ifdef EMU_TSAN
    if (orders_memory) {
        __tsan_acquire(generation);
        record_pending_copies();
    }
#else
    (void)orders_memory;
#endif
    return table[0];
}

const unsigned char *emu_warp_exchange(unsigned mask, const void *mine, size_t bytes) {
    return warp_exchange(mask, mine, bytes, false);
}

// The mask must name every running lane of the warp, as a shuffle's must (the emulator's exchanges are whole-warp).
void emu_syncwarp(unsigned mask) { warp_exchange(mask, nullptr, 0, true); }

void *emu_dynamic_smem(void) { return ex->smem[ex->copy]; }

unsigned emu_shared_set(unsigned copies) {
    if (ex->copy >= copies) fail_here("a static __shared__ array with fewer copies than the racecheck's sets");
    return ex->copy;
}

const void *emu_fibre_stacks_poisoned(void) {
#ifdef __SANITIZE_ADDRESS__
    Exec *e = exec_get();
    return __asan_region_is_poisoned(e->pools[0].stacks, (size_t)kMaxThreads * kStackBytes);
#else
    return nullptr;
#endif
}

void emu_shared_poison(void *p, size_t bytes) {
    Exec *e = ex;
    Unchecked u;  // a fresh block's shared memory, written by no thread of it; the list is the emulator's
    for (auto &entry : e->poisoned)
        if (entry.first == p) {
            if (entry.second == e->block_serial) return;
            entry.second = e->block_serial;
            memset(p, 0xff, bytes);
            return;
        }
    e->poisoned.emplace_back(p, e->block_serial);
    memset(p, 0xff, bytes);
}

// ---- cp.async ----
static bool in_dynamic_smem(const void *p, size_t bytes) {
    const unsigned char *c = (const unsigned char *)p;
    const unsigned char *smem = ex->smem[ex->copy];
    return c >= smem && c + bytes <= smem + ex->smem_bytes;
}

void emu_cp_async(void *dst, const void *src, int bytes, bool pred) {
    if ((uintptr_t)dst % bytes || (pred && (uintptr_t)src % bytes)) fail_here("cp.async address misaligned");
    if (!in_dynamic_smem(dst, bytes)) fail_here("cp.async target outside the block's dynamic shared memory");
    if (pred && !emu_device_bytes(src, (size_t)bytes)) {
        char what[160];
        snprintf(what, sizeof what, "cp.async of %d bytes from %p, outside every cudaMalloc allocation (or across "
                 "the end of one)", bytes, src);
        fail_here(what);
    }
#ifdef EMU_TSAN
    __tsan_write_range(dst, (unsigned long)bytes);  // the copy may land from here on (and is recorded again at the wait)
    if (pred) __tsan_read_range(const_cast<void *>(src), (unsigned long)bytes);
#endif
    Unchecked u;
    ex->cur->open.push_back(Copy{dst, src, bytes, pred});
}

void emu_cp_async_commit(void) {
    Fiber *f = ex->cur;
    Unchecked u;
    f->groups.push_back(f->open);
    f->open.clear();
}

void emu_cp_async_wait(int pending) {
    Fiber *f = ex->cur;
    while ((int)f->groups.size() > pending) {
        for (const Copy &c : f->groups.front()) {
            if (c.pred) memcpy(c.dst, c.src, (size_t)c.bytes);
            else memset(c.dst, 0, (size_t)c.bytes);
        }
        Unchecked u;
        f->groups.erase(f->groups.begin());
    }
}

// ---- ldmatrix .x4 (.trans): lane l gives the address of row l % 8 of matrix l / 8 ----
void emu_ldmatrix_x4(unsigned r[4], const void *p, bool trans) {
    if ((uintptr_t)p % 16) fail_here("ldmatrix row address misaligned");
    if (!in_dynamic_smem(p, 16)) fail_here("ldmatrix row outside the block's dynamic shared memory");
#ifdef EMU_TSAN
    __tsan_read16(const_cast<void *>(p));  // this lane's row, read as this lane (the shared memory behind it)
#endif
    const unsigned char *all = emu_warp_exchange(0xffffffffu, &p, sizeof p);
    const unsigned l = emu_lane();
    EMU_UNCHECKED_BEGIN();  // the other lanes' addresses (registers on a GPU), and the rows, read above as their lanes
    auto row = [&](unsigned lane) {
        const uint16_t *q;
        memcpy(&q, all + EMU_SLOT * lane, sizeof q);
        return q;
    };
    for (unsigned i = 0; i < 4; i++) {
        if (!trans) {
            const uint16_t *q = row(i * 8 + (l >> 2));
            r[i] = (unsigned)q[2 * (l & 3)] | (unsigned)q[2 * (l & 3) + 1] << 16;
        } else {
            const uint16_t *q0 = row(i * 8 + 2 * (l & 3)), *q1 = row(i * 8 + 2 * (l & 3) + 1);
            r[i] = (unsigned)q0[l >> 2] | (unsigned)q1[l >> 2] << 16;
        }
    }
    EMU_UNCHECKED_END();
}

// ---- mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32: d += a b, g = lane / 4, q = lane % 4:
// a: {a0: (g, 2q..), a1: (g+8, 2q..), a2: (g, 2q+8..), a3: (g+8, 2q+8..)}; b: {b0: (k 2q.., n g), b1: (k 2q+8..,
// n g)}; d: {d0, d1: (g, 2q, 2q+1), d2, d3: (g+8, 2q, 2q+1)} ----
static float bf16_half(unsigned v, unsigned which) {
    const unsigned u = (which ? v >> 16 : v & 0xffffu) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void emu_mma_m16n8k16(float d[4], const unsigned a[4], unsigned b0, unsigned b1) {
    unsigned mine[6] = {a[0], a[1], a[2], a[3], b0, b1};
    const unsigned char *all = emu_warp_exchange(0xffffffffu, mine, sizeof mine);
    auto reg = [&](unsigned lane, unsigned k) {
        unsigned v;
        memcpy(&v, all + EMU_SLOT * lane + 4 * k, 4);
        return v;
    };
    const unsigned l = emu_lane(), g = l >> 2, q = l & 3;
    EMU_UNCHECKED_BEGIN();  // the other lanes' fragments: registers on a GPU
    // This lane's rows of a (g and g + 8) and columns of b (2q and 2q + 1), k = 0..15, unpacked once: row r's
    // k = 2p, 2p + 1 are the halves of lane 4 (r % 8) + p's a[(r >= 8) + 2 (k >= 8)]; column n's of lane 4n + p's
    // b[k >= 8].
    float arow[2][16], bcol[2][16];
    for (unsigned h = 0; h < 2; h++)
        for (unsigned p = 0; p < 4; p++)
            for (unsigned hi = 0; hi < 2; hi++) {
                const unsigned av = reg(4 * g + p, h + 2 * hi), bv = reg(4 * (2 * q + h) + p, 4 + hi);
                for (unsigned w = 0; w < 2; w++) {
                    arow[h][8 * hi + 2 * p + w] = bf16_half(av, w);
                    bcol[h][8 * hi + 2 * p + w] = bf16_half(bv, w);
                }
            }
    for (int i = 0; i < 4; i++) {  // d[i]: row g + 8 (i / 2), column 2q + i % 2; the products summed in k order
        const float *ar = arow[i >> 1], *bc = bcol[i & 1];
        float acc = d[i];
        for (unsigned k = 0; k < 16; k++) acc += ar[k] * bc[k];
        d[i] = acc;
    }
    EMU_UNCHECKED_END();
}
