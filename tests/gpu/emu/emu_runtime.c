/* emu_runtime.c: the CUDA runtime, cuBLAS and cuBLASLt calls of megatrain's CUDA build, served on the CPU for the
 * emulator (tests/gpu/emu/README.md). Device memory is host memory; work on a stream goes through emu_streams.c's
 * queues (run at once, or later under EMU_STREAMS); matrix products go through OpenBLAS in fp32 from the bf16 or
 * fp32 operands, rounded to the output type once, as cuBLAS does with fp32 accumulation (NCCL is emu_nccl.c). The machine has EMU_GPUS emulated GPUs (default 1), told apart by their PCI bus ids: with one, every
 * rank of a job shares it and megatrain stages its collectives through the host, as on one real GPU; with as many
 * as ranks, each rank has its own and megatrain's collectives go through NCCL.
 *
 * Checks a GPU would not make: new device memory is filled with 0xff bytes (NaN in bf16 and fp32, -1 in integers)
 * unless EMU_POISON=0, so a read of memory nobody wrote shows; freeing a pointer that cudaMalloc did not return
 * aborts; the live allocations are kept in order, so that the kernels' cp.async sources are checked to lie inside
 * one (emu_device_bytes). */
#include <cblas.h>
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
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
    pthread_mutex_lock(&mem_lock);
    *free_bytes = kMemTotal - mem_used;
    pthread_mutex_unlock(&mem_lock);
    *total = kMemTotal;
    return cudaSuccess;
}

/* Copies and memsets: those that touch host memory (pageable: megatrain has no other kind) finish the stream's
 * earlier work and run before returning, as CUDA does; device-to-device ones and memsets queue on the stream. */
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
static void queue_fill(cudaStream_t st, EmuWorkFn run, Fill f) {
    Fill *q = malloc(sizeof *q);
    *q = f;
    emu_stream_submit(st, run, free, q);
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) {
    (void)k;
    emu_streams_drain_all();
    if (n) memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st) {
    if (!n) return cudaSuccess;
    if (k == cudaMemcpyDeviceToDevice) {
        queue_fill(st, copy_run, (Fill){d, s, n, 0});
        return cudaSuccess;
    }
    emu_stream_drain(st);
    memmove(d, s, n);
    return cudaSuccess;
}
cudaError_t cudaMemset(void *d, int v, size_t n) {
    emu_streams_drain_all();
    if (n) memset(d, v, n);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t s) {
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
static float load(const void *p, cudaDataType_t t, size_t i) {
    return t == CUDA_R_16BF ? bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}
static void store(void *p, cudaDataType_t t, size_t i, float v) {
    if (t == CUDA_R_16BF) ((uint16_t *)p)[i] = f32_to_bf16(v);
    else ((float *)p)[i] = v;
}
static int type_ok(cudaDataType_t t) { return t == CUDA_R_16BF || t == CUDA_R_32F; }

/* The arguments were checked by queue_product. */
static void product(int ta, int tb, int m, int n, int k, float alpha, const void *A, cudaDataType_t at, int lda,
                    const void *B, cudaDataType_t bt, int ldb, float beta, const void *C, cudaDataType_t ct, int ldc,
                    void *D, int ldd, const void *bias) {
    const int ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    if (m == 0 || n == 0) return;
    float *a = malloc(((size_t)ar * ac + 1) * 4), *b = malloc(((size_t)br * bc + 1) * 4), *c = malloc((size_t)m * n * 4);
    for (int j = 0; j < ac; j++)
        for (int i = 0; i < ar; i++) a[(size_t)j * ar + i] = load(A, at, (size_t)j * lda + i);
    for (int j = 0; j < bc; j++)
        for (int i = 0; i < br; i++) b[(size_t)j * br + i] = load(B, bt, (size_t)j * ldb + i);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) c[(size_t)j * m + i] = beta == 0.0f ? 0.0f : beta * load(C, ct, (size_t)j * ldc + i);
    if (k > 0)
        cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
                    ar > 1 ? ar : 1, b, br > 1 ? br : 1, 1.0f, c, m);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++)
            store(D, ct, (size_t)j * ldd + i, c[(size_t)j * m + i] + (bias ? load(bias, ct, (size_t)i) : 0.0f));
    free(a);
    free(b);
    free(c);
}

/* One product, queued on a stream with its scalars and host-side arguments copied (device memory is read when it
 * runs). */
typedef struct {
    int ta, tb, m, n, k;
    float alpha, beta;
    const void *A, *B, *C;
    cudaDataType_t at, bt, ct;
    int lda, ldb, ldc, ldd;
    void *D;
    const void *bias;
    bool indirect; /* A, B, C and D are the addresses of device pointer-array slots (the grouped call): read late */
} Product;
static void product_run(void *ctx) {
    const Product *p = ctx;
    const void *A = p->A, *B = p->B, *C = p->C;
    void *D = p->D;
    if (p->indirect) {
        A = *(const void *const *)p->A, B = *(const void *const *)p->B, C = *(const void *const *)p->C;
        D = *(void *const *)p->D;
    }
    product(p->ta, p->tb, p->m, p->n, p->k, p->alpha, A, p->at, p->lda, B, p->bt, p->ldb, p->beta, C, p->ct, p->ldc,
            D, p->ldd, p->bias);
}
/* Checks the arguments now (as cuBLAS does when called), then queues the product. */
static cublasStatus_t queue_product(cudaStream_t st, Product p) {
    const int ar = p.ta ? p.k : p.m, br = p.tb ? p.n : p.k;
    if (p.m < 0 || p.n < 0 || p.k < 0 || !type_ok(p.at) || !type_ok(p.bt) || !type_ok(p.ct) ||
        p.lda < (ar > 1 ? ar : 1) || p.ldb < (br > 1 ? br : 1) || p.ldc < (p.m > 1 ? p.m : 1) ||
        p.ldd < (p.m > 1 ? p.m : 1))
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
                         (Product){ta != CUBLAS_OP_N, tb != CUBLAS_OP_N, m, n, k, *(const float *)alpha,
                                   *(const float *)beta, A, B, C, at, bt, ct, lda, ldb, ldc, ldc, C, NULL, false});
}
cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t h, const cublasOperation_t ta[],
                                          const cublasOperation_t tb[], const int m[], const int n[], const int k[],
                                          const void *alpha, const void *const A[], cudaDataType_t at,
                                          const int lda[], const void *const B[], cudaDataType_t bt, const int ldb[],
                                          const void *beta, void *const C[], cudaDataType_t ct, const int ldc[],
                                          int group_count, const int group_size[], cublasComputeType_t comp) {
    (void)comp;
    int p = 0;
    for (int g = 0; g < group_count; g++)
        for (int i = 0; i < group_size[g]; i++, p++) {
            const cublasStatus_t s = queue_product(
                ((BlasHandle *)h)->stream,
                (Product){ta[g] != CUBLAS_OP_N, tb[g] != CUBLAS_OP_N, m[g], n[g], k[g], ((const float *)alpha)[g],
                          ((const float *)beta)[g], &A[p], &B[p], &C[p], at, bt, ct, lda[g], ldb[g], ldc[g], ldc[g],
                          (void *)&C[p], NULL, true});
            if (s != CUBLAS_STATUS_SUCCESS) return s;
        }
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- cuBLASLt: the descriptors keep what megatrain sets; the product is the one above ---- */
typedef struct {
    int ta, tb;
    cublasLtEpilogue_t epilogue;
    const void *bias;
} LtDesc;
typedef struct {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
} LtLayout;

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
    (void)comp;
    if (scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    LtDesc *x = calloc(1, sizeof *x);
    x->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
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
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: x->ta = *(const cublasOperation_t *)buf != CUBLAS_OP_N; break;
    case CUBLASLT_MATMUL_DESC_TRANSB: x->tb = *(const cublasOperation_t *)buf != CUBLAS_OP_N; break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
        x->epilogue = *(const cublasLtEpilogue_t *)buf;
        if (x->epilogue != CUBLASLT_EPILOGUE_DEFAULT && x->epilogue != CUBLASLT_EPILOGUE_BIAS)
            return CUBLAS_STATUS_NOT_SUPPORTED;
        break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: memcpy(&x->bias, buf, sizeof x->bias); break;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    (void)size;
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
    (void)h, (void)op, (void)a, (void)b, (void)c, (void)d, (void)pref;
    *found = 0;
    if (wanted < 1) return CUBLAS_STATUS_INVALID_VALUE;
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
        (int)(x->tb ? lb->cols : lb->rows) != k || lc->rows != ld->rows || lc->cols != ld->cols ||
        lc->type != ld->type || la->type != lb->type)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (x->epilogue == CUBLASLT_EPILOGUE_BIAS && !x->bias) return CUBLAS_STATUS_INVALID_VALUE;
    const float b = *(const float *)beta;
    return queue_product(stream, (Product){x->ta, x->tb, m, n, k, *(const float *)alpha, b, A, B, b != 0.0f ? C : D,
                                           la->type, lb->type, lc->type, (int)la->ld, (int)lb->ld,
                                           (int)(b != 0.0f ? lc->ld : ld->ld), (int)ld->ld, D,
                                           x->epilogue == CUBLASLT_EPILOGUE_BIAS ? x->bias : NULL, false});
}
