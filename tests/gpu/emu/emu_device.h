// emu_device.h: what a kernels/*.cu file sees of the GPU when the emulator
// compiles it for the CPU (tests/gpu/emu/README.md). cu2cpp.py rewrites the
// file (launches, shared memory, the functions that hold PTX) and g++ reads
// it with this header in front: the built-in indices, warp and block
// synchronisation, atomics, the math intrinsics, and the PTX helpers under
// the names the kernels give them (cp.async, ldmatrix, mma.m16n8k16, ex2),
// all from their documented semantics. The execution itself (one fibre per
// CUDA thread, blocks one after another) is emu_exec.cpp's.
#ifndef MT_EMU_DEVICE_H
#define MT_EMU_DEVICE_H

// The compute capability the kernels' sm_90-only branches see (__CUDA_ARCH__ itself stays undefined: the CUDA
// headers take it to mean device code): the emulator runs the code an H100 or H200 runs.
#define MT_EMULATED_SM 90

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <vector_types.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <tuple>
#include <type_traits>

#include "emu_streams.h"

// The racecheck build (make gpu-emu-tsan-build, tests/gpu/emu/README.md): the kernels compiled with
// ThreadSanitizer, emu_exec.cpp (built without it, with EMU_TSAN) telling it which CUDA thread runs and what orders
// their memory accesses (EMU_UNCHECKED_BEGIN/END: emu_streams.h).
#if defined(__SANITIZE_THREAD__) || defined(EMU_TSAN)
// The blocks of a launch take turns among up to EMU_POOL_SETS sets of thread slots, in the pool of its stream (up
// to EMU_BLOCK_SETS / EMU_POOL_SETS pools): EMU_BLOCK_SETS copies of shared memory in all (emu_exec.cpp)
#define EMU_POOL_SETS 8
#define EMU_BLOCK_SETS 32
#else
#define EMU_POOL_SETS 1
#define EMU_BLOCK_SETS 1
#endif

#undef __global__
// kernels/launch.cuh's elementwise_blocks: the grid-stride kernels' most blocks here (a GPU: 65535 x 8). 32 blocks
// of 256 threads loop over a launch's elements, spread over every set of thread slots of the racecheck.
#define EMU_ELEMENTWISE_BLOCKS 32
#define __global__
#define __launch_bounds__(...)

// ---- the built-in indices of the running CUDA thread (set by the scheduler) ----
extern thread_local uint3 threadIdx, blockIdx;
extern thread_local dim3 blockDim, gridDim;
static const int warpSize = 32;

// ---- synchronisation and warp exchange (emu_exec.cpp) ----
void emu_syncthreads(void);
void emu_syncwarp(unsigned mask);
// Every lane of the warp gives `bytes` (at most EMU_SLOT) at `mine`; the
// call returns when all have, with the warp's 32 values (lane-major,
// EMU_SLOT bytes apart). `mask` must name every lane of the warp, each of
// which must still run (the emulator checks).
#define EMU_SLOT 64
const unsigned char *emu_warp_exchange(unsigned mask, const void *mine, size_t bytes);
unsigned emu_lane(void);
void *emu_dynamic_smem(void);
void emu_shared_poison(void *p, size_t bytes);  // first thread of the block to declare it: poisoned
// The running block's set: which of the `copies` of a static __shared__ array it uses (cu2cpp.py passes
// EMU_BLOCK_SETS; fails if the array has fewer copies than the set's index, a kernel built without the racecheck).
unsigned emu_shared_set(unsigned copies);
[[noreturn]] void emu_fail(const char *what);    // prints the kernel, block and thread, and aborts
// Host side, for test_emu_checks: the first byte of this host thread's fibre stacks (mapped by the call if this
// thread has none yet) that AddressSanitizer marks as poisoned, or NULL (always NULL without AddressSanitizer).
const void *emu_fibre_stacks_poisoned(void);

// reinterpret_cast to a pointer, as cu2cpp.py writes it: the pointer must be aligned for its type (uint4 16, float2
// 8, __nv_bfloat162 4), as a GPU's vector load or store needs; x86 would take a misaligned one silently.
template <class P, class Q>
static inline P emu_pointer_cast(Q q) {
    P p = reinterpret_cast<P>(q);
    if ((uintptr_t)p % alignof(typename std::remove_pointer<P>::type)) {
        char what[120];
        snprintf(what, sizeof what, "a vector access at %p, not aligned to its %zu bytes", (const void *)p,
                 alignof(typename std::remove_pointer<P>::type));
        emu_fail(what);
    }
    return p;
}

static inline void __syncthreads(void) { emu_syncthreads(); }
static inline void __syncwarp(unsigned mask = 0xffffffffu) { emu_syncwarp(mask); }

template <class T>
static inline T emu_lane_value(const unsigned char *all, int lane) {
    T v;
    EMU_UNCHECKED_BEGIN();
    memcpy(&v, all + EMU_SLOT * lane, sizeof v);
    EMU_UNCHECKED_END();
    return v;
}
template <class T>
static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    static_assert(sizeof(T) <= 16, "a shuffle moves at most 16 bytes");
    const int lane = (int)emu_lane();
    const unsigned char *all = emu_warp_exchange(mask, &v, sizeof v);
    return emu_lane_value<T>(all, lane / width * width + ((src % width) + width) % width);
}
template <class T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
    const int lane = (int)emu_lane();
    const unsigned char *all = emu_warp_exchange(mask, &v, sizeof v);
    const int src = lane ^ lane_mask;
    return src < (lane / width + 1) * width ? emu_lane_value<T>(all, src) : v;
}
template <class T>
static inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    const int lane = (int)emu_lane();
    const unsigned char *all = emu_warp_exchange(mask, &v, sizeof v);
    return lane % width >= (int)delta ? emu_lane_value<T>(all, lane - (int)delta) : v;
}
template <class T>
static inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    const int lane = (int)emu_lane();
    const unsigned char *all = emu_warp_exchange(mask, &v, sizeof v);
    return lane % width + (int)delta < width ? emu_lane_value<T>(all, lane + (int)delta) : v;
}
static inline unsigned __ballot_sync(unsigned mask, int pred) {
    const int mine = pred != 0;
    const unsigned char *all = emu_warp_exchange(mask, &mine, sizeof mine);
    unsigned bits = 0;
    for (int i = 0; i < 32; i++)
        if ((mask >> i & 1u) && emu_lane_value<int>(all, i)) bits |= 1u << i;
    return bits;
}
static inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
static inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == __ballot_sync(mask, 1); }

// ---- atomics (blocks may run on several host threads: real atomics) ----
template <class T>
static inline T emu_atomic_float_add(T *p, T v) {
    T old, want;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do want = old + v;
    while (!__atomic_compare_exchange(p, &old, &want, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
}
static inline float atomicAdd(float *p, float v) { return emu_atomic_float_add(p, v); }
static inline double atomicAdd(double *p, double v) { return emu_atomic_float_add(p, v); }
static inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline unsigned atomicAdd(unsigned *p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
// sm_90's vector reduction: each element atomic on its own, as on a GPU (the pointer's 16-byte alignment is
// checked at the kernel's reinterpret_cast to float4, as every vector cast is)
static inline float4 atomicAdd(float4 *p, float4 v) {
    float *f = (float *)p;
    float4 old;
    old.x = emu_atomic_float_add(f, v.x);
    old.y = emu_atomic_float_add(f + 1, v.y);
    old.z = emu_atomic_float_add(f + 2, v.z);
    old.w = emu_atomic_float_add(f + 3, v.w);
    return old;
}
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
    return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
static inline int atomicMax(int *p, int v) {
    int old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
static inline int atomicMin(int *p, int v) {
    int old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (old > v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}
static inline int atomicExch(int *p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
static inline int atomicCAS(int *p, int compare, int v) {
    __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return compare;
}
// The racecheck sees no order in a fence (GCC 12's ThreadSanitizer does not model fences), so a hand-over between
// blocks through __threadfence and an atomic counter (the last block reads the others' partials) would be reported
// there although a GPU orders it; no kernel does that (tests/gpu/emu/README.md).
static inline void __threadfence(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// ---- math and bit intrinsics ----
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline unsigned __float_as_uint(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
inline int __float_as_int(float f) { return (int)__float_as_uint(f); }
inline float __int_as_float(int i) { return __uint_as_float((unsigned)i); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
template <class T>
inline T __ldg(const T *p) { return *p; }
inline size_t __cvta_generic_to_shared(const void *p) { return (size_t)p; }

// CUDA's integer min and max overloads (the float ones are fminf / fmaxf).
template <class A, class B>
static inline typename std::common_type<A, B>::type min(A a, B b) { return b < a ? b : a; }
template <class A, class B>
static inline typename std::common_type<A, B>::type max(A a, B b) { return a < b ? b : a; }

// A kernel's identity for its attributes: its function (a name, a template-id or a pointer variable).
template <class T>
static inline const void *emu_kernel_id(T *kernel) { return reinterpret_cast<const void *>(kernel); }
// Records a kernel's cudaFuncAttributeMaxDynamicSharedMemorySize (emu_exec.cpp); launches above 48 KB need it.
void emu_set_max_dynamic_smem(const void *kernel, int bytes);

// The templated form of cudaFuncSetAttribute that cuda_runtime.h gives C++.
template <class T>
static inline cudaError_t cudaFuncSetAttribute(T *kernel, enum cudaFuncAttribute attr, int value) {
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || value > 227 * 1024) return cudaErrorInvalidValue;
        emu_set_max_dynamic_smem(emu_kernel_id(kernel), value);
    }
    return cudaSuccess;
}

// ---- launches (cu2cpp.py turns kernel<<<g, b, smem, stream>>>(args) into emu_launch) ----
struct EmuCfg {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    EmuCfg(dim3 g, dim3 b, size_t s = 0, cudaStream_t st = 0) : grid(g), block(b), smem(s), stream(st) {}
};
typedef void (*EmuBody)(void *ctx);
void emu_run(const char *name, const EmuCfg &cfg, EmuBody body, void *ctx);
// false, with cudaGetLastError's answer set, for a launch CUDA refuses (kernel: emu_kernel_id)
bool emu_launch_ok(const EmuCfg &cfg, const void *kernel);

// A launch queued on its stream (emu_streams.h): the kernel runs when the stream gets to it, with the arguments as
// they were at the launch.
template <class F, class Args>
struct EmuLaunch {
    const char *name;
    EmuCfg cfg;
    F call;
    Args args;
    static void run(void *p) {
        EmuLaunch *l = (EmuLaunch *)p;
        emu_run(l->name, l->cfg, [](void *ctx) { const EmuLaunch *x = (const EmuLaunch *)ctx; std::apply(x->call, x->args); },
                p);
    }
    static void drop(void *p) { delete (EmuLaunch *)p; }
};

// A kernel's pointer argument must point into device memory (emu_runtime.c: inside one live cudaMalloc
// allocation): a host pointer, which the emulator's threads would read as any other, faults on a GPU. Pointers
// inside structs passed by value are not seen.
extern "C" int emu_device_bytes(const void *p, size_t bytes);
void emu_kernel_pointer_fault(const char *name, int index, const void *p);
template <class T>
static inline void emu_check_argument(const char *name, int index, const T &value) {
    if constexpr (std::is_pointer<T>::value)
        if (value && !emu_device_bytes((const void *)value, 0)) emu_kernel_pointer_fault(name, index, (const void *)value);
}

// The launch as cu2cpp.py writes it: `args` the arguments evaluated at the launch, `call` the kernel called with
// them (by every emulated thread).
template <class Args, class F>
static inline void emu_launch(const char *name, const void *kernel, const EmuCfg &cfg, Args &&args, F call) {
    typedef EmuLaunch<F, typename std::decay<Args>::type> L;
    std::apply([name](const auto &...arg) { int i = 0; (emu_check_argument(name, i++, arg), ...); }, args);
    if (emu_launch_ok(cfg, kernel))
        emu_stream_submit(cfg.stream, L::run, L::drop, new L{name, cfg, call, std::forward<Args>(args)});
}

// ---- the PTX helpers, under the kernels' names (cu2cpp.py removes their definitions) ----
typedef __nv_bfloat16 emu_bf16;
void emu_cp_async(void *dst, const void *src, int bytes, bool pred);
void emu_cp_async_commit(void);
void emu_cp_async_wait(int pending);
void emu_ldmatrix_x4(unsigned r[4], const void *p, bool trans);
void emu_mma_m16n8k16(float d[4], const unsigned a[4], unsigned b0, unsigned b1);

static inline void cp_async16(void *dst, const void *src, bool pred) { emu_cp_async(dst, src, 16, pred); }
static inline void cp_async4(void *dst, const void *src, bool pred) { emu_cp_async(dst, src, 4, pred); }
static inline void cp_async_commit(void) { emu_cp_async_commit(); }
static inline void cp_async_wait_all(void) { emu_cp_async_wait(0); }
template <int N>
static inline void cp_async_wait(void) { emu_cp_async_wait(N); }
static inline void ldsm4(unsigned (&r)[4], const emu_bf16 *p) { emu_ldmatrix_x4(r, p, false); }
static inline void ldsm4t(unsigned (&r)[4], const emu_bf16 *p) { emu_ldmatrix_x4(r, p, true); }
static inline void ldmatrix_x4(unsigned r[4], const emu_bf16 *p) { emu_ldmatrix_x4(r, p, false); }
static inline void ldmatrix_x4_trans(unsigned r[4], const emu_bf16 *p) { emu_ldmatrix_x4(r, p, true); }
static inline void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    emu_mma_m16n8k16(c, a, b0, b1);
}
static inline void mma_bf16(float d[4], const unsigned a[4], unsigned b0, unsigned b1) {
    emu_mma_m16n8k16(d, a, b0, b1);
}
// ex2.approx.ftz: 2^x with denormal results flushed to zero.
static inline float fast_exp2(float x) {
    const float y = exp2f(x);
    return fabsf(y) < 1.17549435e-38f ? 0.0f : y;
}

#endif
