/* fake_cuda.c: the CUDA runtime, cuBLAS and the moe_gemm launchers on host memory, so that
 * tests/gpu/test_cuda_moe_gemm.c and src/backend/cuda/cuda_gemm.c run on the CPU (run_test.sh): a check of the test
 * and of the host code; the kernel itself runs in the emulator (emu.cpp), or, above FAKE_EMU_FLOPS, as a reference. */
#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

/* ---- runtime ---- */
cudaError_t cudaMalloc(void **p, size_t n) { *p = aligned_alloc(256, (n + 255) / 256 * 256); return *p ? cudaSuccess : cudaErrorMemoryAllocation; }
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) { (void)s; return cudaMalloc(p, n); }
cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { (void)s; free(p); return cudaSuccess; }
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) { (void)k; memmove(d, s, n); return cudaSuccess; }
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st) { (void)k; (void)st; memmove(d, s, n); return cudaSuccess; }
cudaError_t cudaMemset(void *d, int v, size_t n) { memset(d, v, n); return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t s) { (void)s; return cudaSuccess; }
cudaError_t cudaSetDevice(int d) { (void)d; return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned f) { (void)f; *s = (cudaStream_t)malloc(8); return cudaSuccess; }
cudaError_t cudaStreamDestroy(cudaStream_t s) { free(s); return cudaSuccess; }
const char *cudaGetErrorString(cudaError_t e) { (void)e; return "fake error"; }
const char *cudaGetErrorName(cudaError_t e) { (void)e; return "fakeError"; }
cudaError_t cudaEventCreate(cudaEvent_t *e) { *e = (cudaEvent_t)calloc(1, sizeof(double)); return cudaSuccess; }
cudaError_t cudaEventDestroy(cudaEvent_t e) { free(e); return cudaSuccess; }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    (void)s;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    *(double *)e = t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) { (void)e; return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) { *ms = (float)(*(double *)b - *(double *)a); return cudaSuccess; }

/* ---- bf16 ---- */
static float fb(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static uint16_t tb(float f) { uint32_t u; memcpy(&u, &f, 4); u += 0x7fffu + ((u >> 16) & 1u); return (uint16_t)(u >> 16); }

static long gemm_calls, grouped_calls, kernel_launches;
static double skip_flops = 0; /* FAKE_SKIP_FLOPS: products above this many flops do nothing (timing runs) */

/* column-major C (m x n, ldc) = alpha op(A) op(B) + beta C */
static void col_gemm(int ta, int tb_, int m, int n, int k, float alpha, const void *A, cudaDataType_t at, int lda,
                     const void *B, cudaDataType_t bt, int ldb, float beta, void *C, cudaDataType_t ct, int ldc) {
    if (skip_flops > 0 && 2.0 * m * n * k > skip_flops) return;
    const int ar = ta ? k : m, ac = ta ? m : k, br = tb_ ? n : k, bc = tb_ ? k : n;
    if (lda < ar || ldb < br || ldc < m) { fprintf(stderr, "FAKE: bad leading dimension\n"); abort(); }
    float *a = malloc((size_t)ar * ac * 4), *b = malloc((size_t)br * bc * 4), *c = malloc((size_t)m * n * 4);
    for (int j = 0; j < ac; j++) for (int i = 0; i < ar; i++)
        a[(size_t)j * ar + i] = at == CUDA_R_16BF ? fb(((const uint16_t *)A)[(size_t)j * lda + i]) : ((const float *)A)[(size_t)j * lda + i];
    for (int j = 0; j < bc; j++) for (int i = 0; i < br; i++)
        b[(size_t)j * br + i] = bt == CUDA_R_16BF ? fb(((const uint16_t *)B)[(size_t)j * ldb + i]) : ((const float *)B)[(size_t)j * ldb + i];
    for (int j = 0; j < n; j++) for (int i = 0; i < m; i++)
        c[(size_t)j * m + i] = beta == 0.0f ? 0.0f : beta * (ct == CUDA_R_16BF ? fb(((uint16_t *)C)[(size_t)j * ldc + i]) : ((float *)C)[(size_t)j * ldc + i]);
    cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb_ ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, ar, b, br, 1.0f, c, m);
    for (int j = 0; j < n; j++) for (int i = 0; i < m; i++) {
        if (ct == CUDA_R_16BF) ((uint16_t *)C)[(size_t)j * ldc + i] = tb(c[(size_t)j * m + i]);
        else ((float *)C)[(size_t)j * ldc + i] = c[(size_t)j * m + i];
    }
    free(a); free(b); free(c);
}

/* ---- cuBLAS ---- */
cublasStatus_t cublasCreate_v2(cublasHandle_t *h) { *h = (cublasHandle_t)malloc(8); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasDestroy_v2(cublasHandle_t h) { free(h); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s) { (void)h; (void)s; return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *w, size_t n) { (void)h; (void)w; (void)n; return CUBLAS_STATUS_SUCCESS; }
const char *cublasGetStatusString(cublasStatus_t s) { return s == CUBLAS_STATUS_NOT_SUPPORTED ? "CUBLAS_STATUS_NOT_SUPPORTED" : "fake status"; }
const char *cublasLtGetStatusString(cublasStatus_t s) { return cublasGetStatusString(s); }
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb_, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType_t at, int lda, const void *B,
                            cudaDataType_t bt, int ldb, const void *beta, void *C, cudaDataType_t ct, int ldc,
                            cublasComputeType_t comp, cublasGemmAlgo_t algo) {
    (void)h; (void)comp; (void)algo;
    gemm_calls++;
    col_gemm(ta != CUBLAS_OP_N, tb_ != CUBLAS_OP_N, m, n, k, *(const float *)alpha, A, at, lda, B, bt, ldb,
             *(const float *)beta, C, ct, ldc);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t h, const cublasOperation_t ta[], const cublasOperation_t tb_[],
                                          const int m[], const int n[], const int k[], const void *alpha,
                                          const void *const A[], cudaDataType_t at, const int lda[],
                                          const void *const B[], cudaDataType_t bt, const int ldb[],
                                          const void *beta, void *const C[], cudaDataType_t ct, const int ldc[],
                                          int group_count, const int group_size[], cublasComputeType_t comp) {
    (void)h; (void)comp;
    const char *fp32 = getenv("FAKE_GROUPED_FP32");
    if (ct == CUDA_R_32F && fp32 && strcmp(fp32, "0") == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
    grouped_calls++;
    int p = 0;
    for (int g = 0; g < group_count; g++)
        for (int i = 0; i < group_size[g]; i++, p++)
            col_gemm(ta[g] != CUBLAS_OP_N, tb_[g] != CUBLAS_OP_N, m[g], n[g], k[g], ((const float *)alpha)[g], A[p], at,
                     lda[g], B[p], bt, ldb[g], ((const float *)beta)[g], C[p], ct, ldc[g]);
    return CUBLAS_STATUS_SUCCESS;
}
/* cuBLASLt: created and destroyed only */
cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) { *h = (cublasLtHandle_t)malloc(8); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) { free(h); return CUBLAS_STATUS_SUCCESS; }
/* ---- the kernels: the emulator for small launches, a reference for large ones ---- */
int emu_moe_gemm_forward(uint16_t *, int, const uint16_t *, int, const uint16_t *, const uint16_t *, const int32_t *,
                         int, int, int, int, int, void *);
int emu_moe_gemm_backward_input(uint16_t *, int, const uint16_t *, int, const uint16_t *, const uint16_t *,
                                const int32_t *, int, int, int, int, int, int, void *);
int emu_moe_gemm_backward_weight(float *, float *, const uint16_t *, int, const uint16_t *, int, const int32_t *, int,
                                 int, int, int, void *);
static double emu_limit = 5e7; /* FAKE_EMU_FLOPS: launches up to this many flops run in the emulator */

cudaError_t cuda_moe_gemm_forward(uint16_t *out, int ldo, const uint16_t *inp, int ld_inp, const uint16_t *w0,
                                  const uint16_t *w1, const int32_t *offsets, int groups, int max_rows, int IC,
                                  int OC0, int OC1, cudaStream_t stream) {
    kernel_launches++;
    if (!w1) OC1 = 0;
    const double flops = 2.0 * offsets[groups] * IC * (OC0 + OC1);
    if (flops <= emu_limit) return (cudaError_t)emu_moe_gemm_forward(out, ldo, inp, ld_inp, w0, w1, offsets, groups, max_rows, IC, OC0, OC1, stream);
    for (int e = 0; e < groups; e++) {
        const int f = offsets[e], n = offsets[e + 1] - f;
        if (n <= 0) continue;
        col_gemm(1, 0, OC0, n, IC, 1.0f, w0 + (size_t)e * OC0 * IC, CUDA_R_16BF, IC, inp + (size_t)f * ld_inp, CUDA_R_16BF, ld_inp, 0.0f, out + (size_t)f * ldo, CUDA_R_16BF, ldo);
        if (OC1) col_gemm(1, 0, OC1, n, IC, 1.0f, w1 + (size_t)e * OC1 * IC, CUDA_R_16BF, IC, inp + (size_t)f * ld_inp, CUDA_R_16BF, ld_inp, 0.0f, out + (size_t)f * ldo + OC0, CUDA_R_16BF, ldo);
    }
    return cudaSuccess;
}
cudaError_t cuda_moe_gemm_backward_input(uint16_t *dinp, int ld_dinp, const uint16_t *dout, int ld_dout,
                                         const uint16_t *w0, const uint16_t *w1, const int32_t *offsets, int groups,
                                         int max_rows, int IC, int OC0, int OC1, int accumulate,
                                         cudaStream_t stream) {
    kernel_launches++;
    if (!w1) OC1 = 0;
    const double flops = 2.0 * offsets[groups] * IC * (OC0 + OC1);
    if (flops <= emu_limit) return (cudaError_t)emu_moe_gemm_backward_input(dinp, ld_dinp, dout, ld_dout, w0, w1, offsets, groups, max_rows, IC, OC0, OC1, accumulate, stream);
    for (int e = 0; e < groups; e++) {
        const int f = offsets[e], n = offsets[e + 1] - f;
        if (n <= 0) continue;
        col_gemm(0, 0, IC, n, OC0, 1.0f, w0 + (size_t)e * OC0 * IC, CUDA_R_16BF, IC, dout + (size_t)f * ld_dout, CUDA_R_16BF, ld_dout, accumulate ? 1.0f : 0.0f, dinp + (size_t)f * ld_dinp, CUDA_R_16BF, ld_dinp);
        if (OC1) col_gemm(0, 0, IC, n, OC1, 1.0f, w1 + (size_t)e * OC1 * IC, CUDA_R_16BF, IC, dout + (size_t)f * ld_dout + OC0, CUDA_R_16BF, ld_dout, 1.0f, dinp + (size_t)f * ld_dinp, CUDA_R_16BF, ld_dinp);
    }
    return cudaSuccess;
}
cudaError_t cuda_moe_gemm_backward_weight(float *g0, float *g1, const uint16_t *dout, int ld_dout,
                                          const uint16_t *inp, int ld_inp, const int32_t *offsets, int groups, int IC,
                                          int OC0, int OC1, cudaStream_t stream) {
    kernel_launches++;
    if (!g1) OC1 = 0;
    const double flops = 2.0 * offsets[groups] * IC * (OC0 + OC1);
    if (flops <= emu_limit) return (cudaError_t)emu_moe_gemm_backward_weight(g0, g1, dout, ld_dout, inp, ld_inp, offsets, groups, IC, OC0, OC1, stream);
    for (int e = 0; e < groups; e++) {
        const int f = offsets[e], n = offsets[e + 1] - f;
        if (n <= 0) continue;
        col_gemm(0, 1, IC, OC0, n, 1.0f, inp + (size_t)f * ld_inp, CUDA_R_16BF, ld_inp, dout + (size_t)f * ld_dout, CUDA_R_16BF, ld_dout, 1.0f, g0 + (size_t)e * OC0 * IC, CUDA_R_32F, IC);
        if (OC1) col_gemm(0, 1, IC, OC1, n, 1.0f, inp + (size_t)f * ld_inp, CUDA_R_16BF, ld_inp, dout + (size_t)f * ld_dout + OC0, CUDA_R_16BF, ld_dout, 1.0f, g1 + (size_t)e * OC1 * IC, CUDA_R_32F, IC);
    }
    return cudaSuccess;
}

__attribute__((constructor)) static void fake_init(void) {
    const char *s = getenv("FAKE_SKIP_FLOPS");
    if (s) skip_flops = atof(s);
    const char *e = getenv("FAKE_EMU_FLOPS");
    if (e) emu_limit = atof(e);
}
__attribute__((destructor)) static void fake_report(void) {
    fprintf(stderr, "FAKE: %ld cublasGemmEx, %ld grouped calls, %ld kernel launches\n", gemm_calls, grouped_calls, kernel_launches);
}
