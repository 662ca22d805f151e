/* emu_runtime.c: the CUDA runtime, cuBLAS and cuBLASLt calls of megatrain's CUDA build, served on the CPU for the
 * emulator (tests/gpu/emu/README.md). Device memory is host memory; work on a stream goes through emu_streams.c's
 * queues (run at once, or later under EMU_STREAMS); matrix products go through OpenBLAS in fp32 from the bf16,
 * fp32 or FP8 operands (cuBLASLt's FP8 products: below), rounded to the output type once, as cuBLAS does with fp32 accumulation (NCCL is emu_nccl.c). The machine has EMU_GPUS emulated GPUs (default 1), told apart by their PCI bus ids: with one, every
 * rank of a job shares it and megatrain stages its collectives through the host, as on one real GPU; with as many
 * as ranks, each rank has its own and megatrain's collectives go through NCCL.
 *
 * Checks a GPU would not make: new device memory is filled with 0xff bytes (NaN in bf16 and fp32, -1 in integers)
 * unless EMU_POISON=0, so a read of memory nobody wrote shows; freeing a pointer that cudaMalloc did not return
 * aborts; the live allocations are kept in order, so that the kernels' cp.async sources are checked to lie inside
 * one (emu_device_bytes). */
#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "../../../src/core/float16.h"
#include "../../../src/core/fp8.h"
#include "emu_streams.h"

static _Thread_local cudaError_t last_error = cudaSuccess;
void emu_runtime_launch_error(cudaError_t status) { last_error = status; }

/* ---- memory ---- */
static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;
static size_t mem_used;
static const size_t kMemTotal = (size_t)80 << 30;
typedef struct {
    size_t bytes;
    uint64_t magic;
} AllocHead;
enum { kHead = 256 };
static const uint64_t kMagic = 0x454d5544455631ull;

static int poison_on(void) {
    const char *p = getenv("EMU_POISON");
    return !(p && strcmp(p, "0") == 0);
}

/* The live allocations, sorted by start, for emu_device_bytes. */
typedef struct {
    uintptr_t start, end;
} Range;
static Range *ranges;
static size_t range_count, range_cap;
static pthread_rwlock_t ranges_lock = PTHREAD_RWLOCK_INITIALIZER;

/* The number of ranges that start at or before p. */
static size_t ranges_upto(uintptr_t p) {
    size_t lo = 0, hi = range_count;
    while (lo < hi) {
        const size_t mid = (lo + hi) / 2;
        if (ranges[mid].start <= p) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}
static void range_add(const void *p, size_t bytes) {
    pthread_rwlock_wrlock(&ranges_lock);
    if (range_count == range_cap) {
        range_cap = range_cap ? 2 * range_cap : 256;
        ranges = realloc(ranges, range_cap * sizeof *ranges);
        if (!ranges) abort();
    }
    const size_t at = ranges_upto((uintptr_t)p);
    memmove(ranges + at + 1, ranges + at, (range_count - at) * sizeof *ranges);
    ranges[at] = (Range){(uintptr_t)p, (uintptr_t)p + bytes};
    range_count++;
    pthread_rwlock_unlock(&ranges_lock);
}
static void range_remove(const void *p) {
    pthread_rwlock_wrlock(&ranges_lock);
    const size_t at = ranges_upto((uintptr_t)p);
    if (at > 0 && ranges[at - 1].start == (uintptr_t)p) {
        memmove(ranges + at - 1, ranges + at, (range_count - at) * sizeof *ranges);
        range_count--;
    }
    pthread_rwlock_unlock(&ranges_lock);
}
/* 1 if [p, p + bytes) lies inside one live cudaMalloc allocation (its requested size, not the padding). */
int emu_device_bytes(const void *p, size_t bytes) {
    pthread_rwlock_rdlock(&ranges_lock);
    const size_t at = ranges_upto((uintptr_t)p);
    const int inside = at > 0 && (uintptr_t)p + bytes <= ranges[at - 1].end;
    pthread_rwlock_unlock(&ranges_lock);
    return inside;
}

/* A pointer the device reads or writes (`bytes` from it): outside every live allocation a GPU faults, where the
 * emulator's host memory would serve it. Aborts naming `what`. */
static void device_pointer(const void *p, size_t bytes, const char *what) {
    if (!emu_device_bytes(p, bytes)) {
        fprintf(stderr, "EMU: %s %p (%zu bytes) is not inside one cudaMalloc allocation (a GPU faults on it)\n", what,
                p, bytes);
        abort();
    }
}
static bool overlap(const void *a, size_t an, const void *b, size_t bn) {
    const char *x = a, *y = b;
    return an && bn && x < y + bn && y < x + an;
}

cudaError_t cudaMalloc(void **ptr, size_t bytes) {
    pthread_mutex_lock(&mem_lock);
    const int fits = mem_used + bytes <= kMemTotal;
    if (fits) mem_used += bytes;
    pthread_mutex_unlock(&mem_lock);
    if (!fits) return last_error = cudaErrorMemoryAllocation;
    void *mem = NULL; /* no padding past `bytes`: under AddressSanitizer a kernel's access past the end shows */
    if (posix_memalign(&mem, 256, kHead + bytes) != 0) return last_error = cudaErrorMemoryAllocation;
    unsigned char *raw = mem;
    AllocHead *h = (AllocHead *)raw;
    h->bytes = bytes;
    h->magic = kMagic;
    if (poison_on()) memset(raw + kHead, 0xff, bytes);
    *ptr = raw + kHead;
    range_add(*ptr, bytes);
    return cudaSuccess;
}
/* EMU_CHECK_FREED=1: at the process's end, device memory still allocated is reported on stderr ("EMU: N bytes of
 * device memory not freed") and the exit status becomes 3: what a program frees step by step (a MoE layer's spilled
 * expert side) and at its end must come to nothing. */
__attribute__((destructor)) static void check_freed(void) {
    const char *on = getenv("EMU_CHECK_FREED");
    if (!on || strcmp(on, "1") != 0 || mem_used == 0) return;
    fprintf(stderr, "EMU: %zu bytes of device memory not freed\n", mem_used);
    _Exit(3);
}
cudaError_t cudaMallocAsync(void **ptr, size_t bytes, cudaStream_t s) {
    (void)s;
    return cudaMalloc(ptr, bytes);
}
static AllocHead *alloc_head(void *ptr, const char *what) {
    AllocHead *h = (AllocHead *)((unsigned char *)ptr - kHead);
    if (h->magic != kMagic) {
        fprintf(stderr, "EMU: %s of %p, which cudaMalloc did not return (or freed twice)\n", what, ptr);
        abort();
    }
    return h;
}
static void free_now(void *ptr) {
    AllocHead *h = alloc_head(ptr, "cudaFree");
    range_remove(ptr);
    pthread_mutex_lock(&mem_lock);
    mem_used -= h->bytes;
    pthread_mutex_unlock(&mem_lock);
    h->magic = 0;
    free(h);
}
cudaError_t cudaFree(void *ptr) {
    if (!ptr) return cudaSuccess;
    emu_streams_drain_all(); /* cudaFree waits for the device */
    free_now(ptr);
    return cudaSuccess;
}
cudaError_t cudaFreeAsync(void *ptr, cudaStream_t s) {
    if (!ptr) return cudaSuccess;
    alloc_head(ptr, "cudaFreeAsync");
    emu_stream_submit(s, free_now, NULL, ptr);
    return cudaSuccess;
}
/* One pool, cudaMalloc's: what its attributes set (a release threshold) changes nothing here. */
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device) {
    static int the_pool;
    (void)device;
    *pool = (cudaMemPool_t)&the_pool;
    return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, enum cudaMemPoolAttr attr, void *value) {
    (void)pool;
    (void)attr;
    (void)value;
    return cudaSuccess;
}
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep) { /* nothing cached: cudaFree frees */
    (void)pool;
    (void)keep;
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    pthread_mutex_lock(&mem_lock);
    *free_bytes = kMemTotal - mem_used;
    pthread_mutex_unlock(&mem_lock);
    *total = kMemTotal;
    return cudaSuccess;
}

/* Copies and memsets, as CUDA documents them for pageable host memory (megatrain has no other kind): a copy from
 * the host is staged at the call (the host may reuse its buffer on return) and lands in the stream's order, after
 * its earlier work and before its later work only (another stream's work may run before it: an event orders it);
 * a copy to the host finishes the stream's earlier work and runs before returning; device-to-device copies and
 * memsets queue on the stream. Each side must be what the copy's kind says (a device pointer inside one
 * allocation), and a device-to-device copy's two ranges may not overlap (cudaMemcpy's are memcpy's rules). */
typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
    int value;
} Fill;
static void copy_run(void *ctx) {
    const Fill *f = ctx;
    memmove(f->dst, f->src, f->bytes);
}
static void set_run(void *ctx) {
    const Fill *f = ctx;
    memset(f->dst, f->value, f->bytes);
}
static void staged_drop(void *ctx) {
    Fill *f = ctx;
    free((void *)f->src);
    free(f);
}
static void copy_kind_check(void *d, const void *s, size_t n, enum cudaMemcpyKind k) {
    static const char *const names[] = {"cudaMemcpyHostToHost", "cudaMemcpyHostToDevice", "cudaMemcpyDeviceToHost",
                                        "cudaMemcpyDeviceToDevice", "cudaMemcpyDefault"};
    const char *name = k >= 0 && k <= cudaMemcpyDefault ? names[k] : "cudaMemcpy (unknown kind)";
    char what[96];
    if (k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice) {
        snprintf(what, sizeof what, "%s's destination", name);
        device_pointer(d, n, what);
    }
    if (k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice) {
        snprintf(what, sizeof what, "%s's source", name);
        device_pointer(s, n, what);
    }
    if ((k == cudaMemcpyHostToDevice && emu_device_bytes(s, 1)) || (k == cudaMemcpyDeviceToHost && emu_device_bytes(d, 1))) {
        fprintf(stderr, "EMU: %s from %p to %p: its host side is device memory (the kind is wrong)\n", name, s, d);
        abort();
    }
    if (k == cudaMemcpyDeviceToDevice && d != s && overlap(d, n, s, n)) {
        fprintf(stderr, "EMU: %s of %zu bytes from %p to %p: the ranges overlap (undefined on a GPU)\n", name, n, s, d);
        abort();
    }
}
static void queue_fill(cudaStream_t st, EmuWorkFn run, Fill f) {
    Fill *q = malloc(sizeof *q);
    *q = f;
    emu_stream_submit(st, run, free, q);
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) {
    if (n) copy_kind_check(d, s, n, k);
    emu_streams_drain_all();
    if (n) memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st) {
    if (!n) return cudaSuccess;
    copy_kind_check(d, s, n, k);
    if (k == cudaMemcpyDeviceToDevice) {
        queue_fill(st, copy_run, (Fill){d, s, n, 0});
        return cudaSuccess;
    }
    if (k == cudaMemcpyHostToDevice) {
        void *stage = malloc(n);
        memcpy(stage, s, n);
        Fill *q = malloc(sizeof *q);
        *q = (Fill){d, stage, n, 0};
        emu_stream_submit(st, copy_run, staged_drop, q);
        return cudaSuccess;
    }
    emu_stream_drain(st);
    memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *d, int v, size_t n) {
    if (n) device_pointer(d, n, "cudaMemset's destination");
    emu_streams_drain_all();
    if (n) memset(d, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t s) {
    if (n) device_pointer(d, n, "cudaMemsetAsync's destination");
    if (n) queue_fill(s, set_run, (Fill){d, NULL, n, v});
    return cudaSuccess;
}

/* ---- devices, streams, events, errors ---- */
static _Thread_local int current_device;
static int device_count(void) {
    const char *n = getenv("EMU_GPUS");
    return n && atoi(n) > 0 ? atoi(n) : 1;
}
cudaError_t cudaGetDeviceCount(int *n) {
    *n = device_count();
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    if (d < 0 || d >= device_count()) return last_error = cudaErrorInvalidDevice;
    current_device = d;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
    *d = current_device;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int d) {
    if (d < 0 || d >= device_count()) return cudaErrorInvalidDevice;
    memset(prop, 0, sizeof *prop);
    snprintf(prop->name, sizeof prop->name, "CPU emulator (tests/gpu/emu)");
    prop->major = 9;
    prop->minor = 0;
    prop->totalGlobalMem = kMemTotal;
    prop->multiProcessorCount = 132;
    prop->sharedMemPerBlockOptin = 227 * 1024;
    prop->sharedMemPerBlock = 48 * 1024;
    prop->maxThreadsPerBlock = 1024;
    prop->warpSize = 32;
    prop->memoryBusWidth = 5120;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties_v2(struct cudaDeviceProp *prop, int d) { return cudaGetDeviceProperties(prop, d); }
cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int d) {
    if (d < 0 || d >= device_count()) return cudaErrorInvalidDevice;
    snprintf(id, (size_t)len, "0000:%02x:00.0", d);
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
    const cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorMemoryAllocation: return "out of memory (the emulator's 80 GiB)";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    default: return "emulated error";
    }
}
const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    default: return "cudaErrorEmulated";
    }
}

/* ---- matrix products: column-major D (m x n, ldd) = alpha op(A) op(B) + beta C (+ bias[row]) ---- */
static int is_fp8(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }
static Fp8Format fp8_format(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 ? FP8_E4M3 : FP8_E5M2; }
static size_t type_bytes(cudaDataType_t t) { return is_fp8(t) ? 1 : t == CUDA_R_16BF ? 2 : 4; }
static float load(const void *p, cudaDataType_t t, size_t i) {
    if (is_fp8(t)) return fp8_to_f32(((const uint8_t *)p)[i], fp8_format(t));
    return t == CUDA_R_16BF ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}
/* FP8 outputs: round to nearest even, saturating to the largest finite value (the GPU's only fp32 -> fp8
 * conversion, cvt.rn.satfinite; src/core/fp8.h). */
static void store(void *p, cudaDataType_t t, size_t i, float v) {
    if (is_fp8(t)) ((uint8_t *)p)[i] = fp8_from_f32(v, fp8_format(t));
    else if (t == CUDA_R_16BF) ((uint16_t *)p)[i] = f32_to_bf16(v);
    else ((float *)p)[i] = v;
}
static int type_ok(cudaDataType_t t) { return t == CUDA_R_16BF || t == CUDA_R_32F; }

/* An FP8 product's scales and amax (cuBLASLt's descriptor attributes), all device pointers read when the product
 * runs: D = sd * (alpha sa sb op(A) op(B) + beta C + bias), amax = max |value before sd| (NULL: not asked for; a NaN
 * value makes it NaN, the emulator's choice: what a GPU does there is not documented). */
typedef struct {
    const float *sa, *sb, *sd;
    float *amax;
} Fp8Scales;

/* One product, queued on a stream with its scalars and host-side arguments copied (device memory is read when it
 * runs): column-major D (m x n, ldd, type dt) = alpha op(A) op(B) + beta C (+ bias[row], type biast). cuBLAS's calls
 * have dt = biast = ct; cublasLtMatmul's may differ (an FP8 product's D and bias). */
typedef struct {
    int ta, tb, m, n, k;
    float alpha, beta;
    const void *A, *B, *C;
    cudaDataType_t at, bt, ct, dt, biast;
    int lda, ldb, ldc, ldd;
    void *D;
    const void *bias;
    bool indirect; /* A, B, C and D are the addresses of device pointer-array slots (the grouped call): read late */
    bool fp8;      /* cuBLASLt's FP8 product: A and B FP8, the scales below */
    Fp8Scales f8;
} Product;

/* Runs p with its matrices at A, B, C, D (p's own, or read from the grouped call's pointer arrays). */
/* Bytes a column-major rows x cols matrix with leading dimension ld spans. */
static size_t span_bytes(int rows, int cols, int ld, cudaDataType_t t) {
    return rows > 0 && cols > 0 ? ((size_t)(cols - 1) * (size_t)ld + (size_t)rows) * type_bytes(t) : 0;
}
/* What a GPU needs of a product's matrices, checked when it runs (the grouped call's pointers are read then): each
 * inside one allocation; D overlapping neither input (the emulator reads them whole before writing D, a GPU's
 * tiles do not); C either D itself with D's layout, or apart from it. */
static void product_operands(const Product *p, const void *A, const void *B, const void *C, const void *D, int ar,
                             int ac, int br, int bc) {
    const size_t an = p->k > 0 ? span_bytes(ar, ac, p->lda, p->at) : 0, bn = p->k > 0 ? span_bytes(br, bc, p->ldb, p->bt) : 0,
                 cn = p->beta != 0.0f ? span_bytes(p->m, p->n, p->ldc, p->ct) : 0, dn = span_bytes(p->m, p->n, p->ldd, p->dt);
    if (an) device_pointer(A, an, "a matrix product's A");
    if (bn) device_pointer(B, bn, "a matrix product's B");
    if (cn) device_pointer(C, cn, "a matrix product's C");
    if (dn) device_pointer(D, dn, "a matrix product's D");
    if (p->bias) device_pointer(p->bias, (size_t)p->m * type_bytes(p->biast), "a matrix product's bias");
    if (overlap(A, an, D, dn) || overlap(B, bn, D, dn)) {
        fprintf(stderr, "EMU: a matrix product (m %d, n %d, k %d) writes D at %p over its input %s at %p: a GPU reads "
                "the inputs tile by tile while it writes D\n", p->m, p->n, p->k, D, overlap(A, an, D, dn) ? "A" : "B",
                overlap(A, an, D, dn) ? A : B);
        abort();
    }
    if (cn && (C == D ? p->ldc != p->ldd || p->ct != p->dt : overlap(C, cn, D, dn))) {
        fprintf(stderr, "EMU: a matrix product (m %d, n %d, k %d) with C at %p and D at %p: C must be D with D's layout, "
                "or apart from it\n", p->m, p->n, p->k, C, D);
        abort();
    }
}
static void product(const Product *p, const void *A, const void *B, const void *C, void *D) {
    const int m = p->m, n = p->n, k = p->k, ar = p->ta ? k : m, ac = p->ta ? m : k, br = p->tb ? n : k,
              bc = p->tb ? k : n;
    product_operands(p, A, B, C, D, ar, ac, br, bc);
    float alpha = p->alpha, sd = 1.0f, amax = 0.0f;
    if (p->fp8) {
        alpha = alpha * (p->f8.sa ? *p->f8.sa : 1.0f) * (p->f8.sb ? *p->f8.sb : 1.0f);
        if (p->f8.sd) sd = *p->f8.sd;
    }
    if (m == 0 || n == 0) {
        if (p->fp8 && p->f8.amax) *p->f8.amax = 0.0f;
        return;
    }
    float *a = malloc(((size_t)ar * ac + 1) * 4), *b = malloc(((size_t)br * bc + 1) * 4), *c = malloc((size_t)m * n * 4);
    for (int j = 0; j < ac; j++)
        for (int i = 0; i < ar; i++) a[(size_t)j * ar + i] = load(A, p->at, (size_t)j * p->lda + i);
    for (int j = 0; j < bc; j++)
        for (int i = 0; i < br; i++) b[(size_t)j * br + i] = load(B, p->bt, (size_t)j * p->ldb + i);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++)
            c[(size_t)j * m + i] = p->beta == 0.0f ? 0.0f : p->beta * load(C, p->ct, (size_t)j * p->ldc + i);
    if (k > 0)
        cblas_sgemm(CblasColMajor, p->ta ? CblasTrans : CblasNoTrans, p->tb ? CblasTrans : CblasNoTrans, m, n, k,
                    alpha, a, ar > 1 ? ar : 1, b, br > 1 ? br : 1, 1.0f, c, m);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            float z = c[(size_t)j * m + i] + (p->bias ? load(p->bias, p->biast, (size_t)i) : 0.0f);
            if (is_fp8(p->dt)) {
                const float az = fabsf(z);
                amax = isnan(az) || isnan(amax) ? NAN : fmaxf(amax, az);
                z *= sd;
            }
            store(D, p->dt, (size_t)j * p->ldd + i, z);
        }
    if (p->fp8 && p->f8.amax) *p->f8.amax = amax;
    free(a);
    free(b);
    free(c);
}
static void product_run(void *ctx) {
    const Product *p = ctx;
    if (p->indirect)
        product(p, *(const void *const *)p->A, *(const void *const *)p->B, *(const void *const *)p->C,
                *(void *const *)p->D);
    else
        product(p, p->A, p->B, p->C, p->D);
}
/* The types are ones the emulator computes: bf16 or fp32, and FP8 inputs and outputs in cuBLASLt's FP8 products. */
static int types_ok(const Product *p) {
    const int fp8 = p->fp8 && is_fp8(p->at) && is_fp8(p->bt);
    return (type_ok(p->at) || fp8) && (type_ok(p->bt) || fp8) && type_ok(p->ct) && type_ok(p->biast) &&
           (type_ok(p->dt) || (fp8 && is_fp8(p->dt)));
}
/* Checks the arguments now (as cuBLAS does when called), then queues the product. */
static cublasStatus_t queue_product(cudaStream_t st, Product p) {
    const int ar = p.ta ? p.k : p.m, br = p.tb ? p.n : p.k;
    if (p.m < 0 || p.n < 0 || p.k < 0 || !types_ok(&p) || p.lda < (ar > 1 ? ar : 1) || p.ldb < (br > 1 ? br : 1) ||
        p.ldc < (p.m > 1 ? p.m : 1) || p.ldd < (p.m > 1 ? p.m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    Product *q = malloc(sizeof *q);
    *q = p;
    emu_stream_submit(st, product_run, free, q);
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- cuBLAS ---- */
/* A handle keeps the stream its calls queue on. */
typedef struct {
    cudaStream_t stream;
} BlasHandle;
cublasStatus_t cublasCreate_v2(cublasHandle_t *h) {
    *h = (cublasHandle_t)calloc(1, sizeof(BlasHandle));
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) {
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) {
    ((BlasHandle *)h)->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *w, size_t n) {
    (void)h, (void)w, (void)n;
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS (emulated)";
    }
}
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType_t at, int lda, const void *B,
                            cudaDataType_t bt, int ldb, const void *beta, void *C, cudaDataType_t ct, int ldc,
                            cublasComputeType_t comp, cublasGemmAlgo_t algo) {
    (void)comp, (void)algo;
    return queue_product(((BlasHandle *)h)->stream,
                         (Product){.ta = ta != CUBLAS_OP_N, .tb = tb != CUBLAS_OP_N, .m = m, .n = n, .k = k,
                                   .alpha = *(const float *)alpha, .beta = *(const float *)beta, .A = A, .B = B,
                                   .C = C, .at = at, .bt = bt, .ct = ct, .dt = ct, .biast = ct, .lda = lda, .ldb = ldb, .ldc = ldc,
                                   .ldd = ldc, .D = C});
}
cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t h, const cublasOperation_t ta[],
                                          const cublasOperation_t tb[], const int m[], const int n[], const int k[],
                                          const void *alpha, const void *const A[], cudaDataType_t at,
                                          const int lda[], const void *const B[], cudaDataType_t bt, const int ldb[],
                                          const void *beta, void *const C[], cudaDataType_t ct, const int ldc[],
                                          int group_count, const int group_size[], cublasComputeType_t comp) {
    (void)comp;
    /* cuBLAS 13.1 on an H200 refused bf16 inputs with an fp32 output here (test_cuda_moe_gemm, 2026-11-28): so
     * does the emulator, so that megatrain's fallback (the weight gradients per expert) runs in CI as on a GPU */
    if (at == CUDA_R_16BF && ct == CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    size_t total = 0; /* the pointer arrays are read by the device: they live in device memory */
    for (int g = 0; g < group_count; g++) total += (size_t)group_size[g];
    device_pointer(A, total * sizeof *A, "cublasGemmGroupedBatchedEx's array of A pointers");
    device_pointer(B, total * sizeof *B, "cublasGemmGroupedBatchedEx's array of B pointers");
    device_pointer(C, total * sizeof *C, "cublasGemmGroupedBatchedEx's array of C pointers");
    int p = 0;
    for (int g = 0; g < group_count; g++)
        for (int i = 0; i < group_size[g]; i++, p++) {
            const cublasStatus_t s = queue_product(
                ((BlasHandle *)h)->stream,
                (Product){.ta = ta[g] != CUBLAS_OP_N, .tb = tb[g] != CUBLAS_OP_N, .m = m[g], .n = n[g], .k = k[g],
                          .alpha = ((const float *)alpha)[g], .beta = ((const float *)beta)[g], .A = &A[p],
                          .B = &B[p], .C = &C[p], .at = at, .bt = bt, .ct = ct, .dt = ct, .biast = ct, .lda = lda[g],
                          .ldb = ldb[g], .ldc = ldc[g], .ldd = ldc[g], .D = (void *)&C[p], .indirect = true});
            if (s != CUBLAS_STATUS_SUCCESS) return s;
        }
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- cuBLASLt: the descriptors keep what megatrain sets; the product is the one above ----
 *
 * FP8 products (A and B E4M3 / E5M2) follow our reading of cuBLASLt's requirements on sm_90 (secondhand quotes of
 * the cuBLAS documentation, cublasLt.h, NVIDIA's own callers; tests/gpu/emu/README.md lists the rules and where
 * each comes from; not yet confirmed on a GPU) and are refused otherwise, so that code written against the emulator
 * asks a Hopper GPU for nothing it refuses. Where the sources disagree or are silent the emulator refuses (stricter
 * than the library, which tests/gpu/test_cuda_cublaslt_fp8.c reports on a GPU): beta != 0 with an FP8 D, a bias with
 * an fp32 D, C's scale. The emulator accumulates in fp32 in OpenBLAS's order, whatever
 * CUBLASLT_MATMUL_DESC_FAST_ACCUM says: a Hopper FP8 product keeps fewer bits inside its k-blocks (fewer still with
 * fast accumulation), which the emulator does not show. fp16 is not emulated (megatrain does not use it). In place
 * (C == D) needs C's layout to be D's, for every product. */
enum { SCALE_A, SCALE_B, SCALE_C, SCALE_D };
typedef struct {
    int ta, tb;
    cublasComputeType_t compute;
    cublasLtEpilogue_t epilogue;
    const void *bias;
    int32_t bias_type;     /* CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE; -1: the default */
    const float *scale[4]; /* SCALE_A..SCALE_D's device pointers (NULL: 1) */
    float *amax_d;
    int8_t fast_accum;     /* accepted and kept; the emulator's accumulation does not change with it (above) */
} LtDesc;
typedef struct {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
} LtLayout;

/* Why cuBLASLt refuses this product (CUBLAS_STATUS_SUCCESS: it does not), from what the heuristic sees: the
 * descriptor and the layouts (the FP8 rules above; the pointers are cublasLtMatmul's). */
static cublasStatus_t lt_refusal(const LtDesc *x, const LtLayout *a, const LtLayout *b, const LtLayout *c,
                                 const LtLayout *d) {
    const int fp8 = is_fp8(a->type) || is_fp8(b->type), bias = x->epilogue == CUBLASLT_EPILOGUE_BIAS;
    if (!fp8) {
        if (x->scale[SCALE_A] || x->scale[SCALE_B] || x->scale[SCALE_C] || x->scale[SCALE_D] || x->amax_d)
            return CUBLAS_STATUS_INVALID_VALUE;
        if (x->bias_type != -1 && x->bias_type != (int32_t)c->type) return CUBLAS_STATUS_NOT_SUPPORTED;
        return CUBLAS_STATUS_SUCCESS;
    }
    if (!is_fp8(a->type) || !is_fp8(b->type) || (a->type == CUDA_R_8F_E5M2 && b->type == CUDA_R_8F_E5M2))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (!x->ta || x->tb || x->compute != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    const int e5m2_in = a->type == CUDA_R_8F_E5M2 || b->type == CUDA_R_8F_E5M2;
    if (is_fp8(d->type)) {
        if (c->type != CUDA_R_16BF || (d->type == CUDA_R_8F_E5M2 && !e5m2_in)) return CUBLAS_STATUS_NOT_SUPPORTED;
    } else if (!type_ok(d->type) || c->type != d->type || (bias && d->type == CUDA_R_32F)) {
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (bias && x->bias_type != -1 && x->bias_type != CUDA_R_16BF) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (x->scale[SCALE_C] || ((x->scale[SCALE_D] || x->amax_d) && !is_fp8(d->type)))
        return CUBLAS_STATUS_INVALID_VALUE;
    const uint64_t m = d->rows, n = d->cols, k = a->rows; /* A is transposed: k x m */
    if (m % 16 || n % 8 || k % 16 || a->ld % 16 || b->ld % 16 || (c->ld * (int64_t)type_bytes(c->type)) % 16 ||
        (d->ld * (int64_t)type_bytes(d->type)) % 16)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    return CUBLAS_STATUS_SUCCESS;
}

/* A pointer cuBLASLt reads or writes as device memory: a host pointer there faults on a GPU. */
static void lt_device_pointer(const void *p, size_t bytes, const char *what) {
    char said[96];
    snprintf(said, sizeof said, "cublasLtMatmul: %s", what);
    if (p) device_pointer(p, bytes, said);
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    *h = (cublasLtHandle_t)malloc(64);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}
size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }
const char *cublasLtGetStatusString(cublasStatus_t s) { return cublasGetStatusString(s); }
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t comp, cudaDataType_t scale) {
    if (scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    LtDesc *x = calloc(1, sizeof *x);
    x->compute = comp;
    x->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    x->bias_type = -1;
    *d = (cublasLtMatmulDesc_t)x;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    free(d);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size) {
    LtDesc *x = (LtDesc *)d;
    void *pointer = NULL; /* where a pointer attribute goes */
    size_t want = 4;      /* the enums' and int32_t's size */
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB:
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: break;
    case CUBLASLT_MATMUL_DESC_FAST_ACCUM: want = 1; break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: pointer = &x->bias; break;
    case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER: pointer = &x->scale[SCALE_A]; break;
    case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER: pointer = &x->scale[SCALE_B]; break;
    case CUBLASLT_MATMUL_DESC_C_SCALE_POINTER: pointer = &x->scale[SCALE_C]; break;
    case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER: pointer = &x->scale[SCALE_D]; break;
    case CUBLASLT_MATMUL_DESC_AMAX_D_POINTER: pointer = &x->amax_d; break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (size != (pointer ? sizeof(void *) : want)) return CUBLAS_STATUS_INVALID_VALUE;
    if (pointer) {
        memcpy(pointer, buf, sizeof(void *));
        return CUBLAS_STATUS_SUCCESS;
    }
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: x->ta = *(const cublasOperation_t *)buf != CUBLAS_OP_N; break;
    case CUBLASLT_MATMUL_DESC_TRANSB: x->tb = *(const cublasOperation_t *)buf != CUBLAS_OP_N; break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        x->epilogue = *(const cublasLtEpilogue_t *)buf;
        if (x->epilogue != CUBLASLT_EPILOGUE_DEFAULT && x->epilogue != CUBLASLT_EPILOGUE_BIAS)
            return CUBLAS_STATUS_NOT_SUPPORTED;
        break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: memcpy(&x->bias_type, buf, 4); break;
    default: x->fast_accum = *(const int8_t *)buf; break; /* CUBLASLT_MATMUL_DESC_FAST_ACCUM */
    }
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
    LtLayout *x = malloc(sizeof *x);
    *x = (LtLayout){type, rows, cols, ld};
    *l = (cublasLtMatrixLayout_t)x;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    free(l);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    *p = (cublasLtMatmulPreference_t)malloc(64);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    free(p);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t size) {
    (void)p, (void)attr, (void)buf, (void)size;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref, int wanted,
                                              cublasLtMatmulHeuristicResult_t results[], int *found) {
    (void)h, (void)pref;
    *found = 0;
    if (wanted < 1) return CUBLAS_STATUS_INVALID_VALUE;
    const cublasStatus_t refused = lt_refusal((const LtDesc *)op, (const LtLayout *)a, (const LtLayout *)b,
                                              (const LtLayout *)c, (const LtLayout *)d);
    if (refused != CUBLAS_STATUS_SUCCESS) return refused;
    memset(&results[0], 0, sizeof results[0]);
    results[0].state = CUBLAS_STATUS_SUCCESS;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t al, const void *B, cublasLtMatrixLayout_t bl, const void *beta,
                              const void *C, cublasLtMatrixLayout_t cl, void *D, cublasLtMatrixLayout_t dl,
                              const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_bytes,
                              cudaStream_t stream) {
    (void)h, (void)algo, (void)workspace, (void)workspace_bytes;
    const LtDesc *x = (const LtDesc *)op;
    const LtLayout *la = (const LtLayout *)al, *lb = (const LtLayout *)bl, *lc = (const LtLayout *)cl,
                   *ld = (const LtLayout *)dl;
    const int m = (int)ld->rows, n = (int)ld->cols, k = (int)(x->ta ? la->rows : la->cols);
    if ((int)(x->ta ? la->cols : la->rows) != m || (int)(x->tb ? lb->rows : lb->cols) != n ||
        (int)(x->tb ? lb->cols : lb->rows) != k || lc->rows != ld->rows || lc->cols != ld->cols)
        return CUBLAS_STATUS_INVALID_VALUE;
    const int fp8 = is_fp8(la->type) || is_fp8(lb->type);
    if (!fp8 && (lc->type != ld->type || la->type != lb->type)) return CUBLAS_STATUS_INVALID_VALUE;
    const cublasStatus_t refused = lt_refusal(x, la, lb, lc, ld);
    if (refused != CUBLAS_STATUS_SUCCESS) return refused;
    if (x->epilogue == CUBLASLT_EPILOGUE_BIAS && !x->bias) return CUBLAS_STATUS_INVALID_VALUE;
    const float b = *(const float *)beta;
    if (b != 0.0f && !C) return CUBLAS_STATUS_INVALID_VALUE;
    /* in place (C == D) only with one layout for both */
    if (C == D && (lc->type != ld->type || lc->ld != ld->ld)) return CUBLAS_STATUS_INVALID_VALUE;
    if (fp8 && b != 0.0f && is_fp8(ld->type)) return CUBLAS_STATUS_NOT_SUPPORTED; /* the stricter reading (above) */
    if (fp8) {
        const void *mats[] = {A, B, b != 0.0f ? C : NULL, D};
        for (int i = 0; i < 4; i++)
            if ((uintptr_t)mats[i] % 16) return CUBLAS_STATUS_INVALID_VALUE;
        static const char *const names[] = {"A's scale", "B's scale", "C's scale", "D's scale"};
        for (int i = 0; i < 4; i++) lt_device_pointer(x->scale[i], sizeof(float), names[i]);
        lt_device_pointer(x->amax_d, sizeof(float), "D's amax");
    }
    return queue_product(stream, (Product){.ta = x->ta, .tb = x->tb, .m = m, .n = n, .k = k,
                                           .alpha = *(const float *)alpha, .beta = b, .A = A, .B = B,
                                           .C = b != 0.0f ? C : D, .at = la->type, .bt = lb->type, .ct = lc->type,
                                           .lda = (int)la->ld, .ldb = (int)lb->ld,
                                           .ldc = (int)(b != 0.0f ? lc->ld : ld->ld), .ldd = (int)ld->ld, .D = D,
                                           .bias = x->epilogue == CUBLASLT_EPILOGUE_BIAS ? x->bias : NULL,
                                           .dt = ld->type, .biast = fp8 ? CUDA_R_16BF : lc->type,
                                           .fp8 = fp8,
                                           .f8 = {x->scale[SCALE_A], x->scale[SCALE_B], x->scale[SCALE_D], x->amax_d}});
}
