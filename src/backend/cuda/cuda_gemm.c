/* cuda_gemm.c: row-major products on cuBLASLt's column-major API (see
 * cuda_gemm.h). A row-major (R x C) matrix is the column-major (C x R)
 * matrix with the same bytes, so each product is stated on the transposes:
 *   forward:         out^T (OC x N)  = W^T (T) * inp^T (N)
 *   backward input:  dinp^T (IC x N) = W^T (N) * dout^T (N)
 *   backward weight: dW^T (IC x OC) += inp^T (N) * dout (T)
 * Descriptors and the heuristic's algorithm are cached per shape, type and
 * pointer alignment, so the step loop makes no heuristic queries. */
#include "cuda_gemm.h"

#include <pthread.h>
#include <string.h>

#include "cuda_check.h"

typedef struct GemmKey {
    int transa, transb, m, n, k, lda, ldb, ldc;
    cudaDataType_t c_type;
    int beta_one, has_bias, alignment;
} GemmKey;

typedef struct GemmPlan {
    GemmKey key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
} GemmPlan;

#define GEMM_CACHE_SIZE 128
static GemmPlan cache[GEMM_CACHE_SIZE];
static int cache_used;
/* Models on several threads of one process (tests of tensor parallel on one GPU) share the cache. */
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

/* Largest power of two (up to 256) dividing every address. */
static int common_alignment(const void *const *ptrs, int n) {
    uintptr_t bits = 256;
    for (int i = 0; i < n; i++)
        if (ptrs[i]) bits |= (uintptr_t)ptrs[i];
    int align = 1;
    while (align < 256 && !(bits & (uintptr_t)align)) align <<= 1;
    return align;
}

static GemmPlan *plan_locked(CudaContext *ctx, const GemmKey *key);

static GemmPlan *plan_for(CudaContext *ctx, const GemmKey *key) {
    pthread_mutex_lock(&cache_lock);
    GemmPlan *p = plan_locked(ctx, key);
    pthread_mutex_unlock(&cache_lock);
    return p;
}

static GemmPlan *plan_locked(CudaContext *ctx, const GemmKey *key) {
    for (int i = 0; i < cache_used; i++)
        if (memcmp(&cache[i].key, key, sizeof *key) == 0) return &cache[i];
    if (cache_used == GEMM_CACHE_SIZE) mt_die(MT_EXIT_FAILURE, "cuBLASLt: more than %d product shapes", GEMM_CACHE_SIZE);
    GemmPlan *p = &cache[cache_used];
    memset(p, 0, sizeof *p);
    p->key = *key;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = key->transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = key->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (key->has_bias) {
        cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    }
    /* Stored shapes (column-major rows x cols) of A, B, C. */
    const int a_rows = key->transa ? key->k : key->m, a_cols = key->transa ? key->m : key->k;
    const int b_rows = key->transb ? key->n : key->k, b_cols = key->transb ? key->k : key->n;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, a_rows, a_cols, key->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, b_rows, b_cols, key->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, key->c_type, key->m, key->n, key->ldc));

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t workspace = ctx->blaslt_workspace_bytes;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                      sizeof workspace));
    uint32_t align = (uint32_t)key->alignment;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align, sizeof align));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align, sizeof align));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align, sizeof align));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align, sizeof align));
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    if (key->has_bias) { /* the bias pointer is set per call; the heuristic needs one to be declared */
        void *dummy = ctx->blaslt_workspace;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dummy, sizeof dummy));
    }
    cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(ctx->blaslt, p->op, p->a, p->b, p->c, p->c, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (status != CUBLAS_STATUS_SUCCESS || found == 0)
        mt_die(MT_EXIT_FAILURE,
               "cuBLASLt: no algorithm for a %s x %s product m=%d n=%d k=%d (lda %d, ldb %d, ldc %d, %s output%s): %s",
               key->transa ? "T" : "N", key->transb ? "T" : "N", key->m, key->n, key->k, key->lda, key->ldb,
               key->ldc, key->c_type == CUDA_R_32F ? "fp32" : "bf16", key->has_bias ? ", bias" : "",
               cublasLtGetStatusString(status));
    p->algo = result.algo;
    cache_used++;
    return p;
}

/* D = alpha op(A) op(B) + beta C in column-major terms; C and D share layout and type. */
static void gemm(CudaContext *ctx, int transa, int transb, int m, int n, int k, const void *A, int lda, const void *B,
                 int ldb, const void *C, void *D, int ldc, cudaDataType_t c_type, float beta, const void *bias) {
    if (m <= 0 || n <= 0 || k <= 0) return;
    const void *ptrs[5] = {A, B, C, D, bias};
    GemmKey key;
    memset(&key, 0, sizeof key); /* padding too: keys are compared with memcmp */
    key.transa = transa;
    key.transb = transb;
    key.m = m;
    key.n = n;
    key.k = k;
    key.lda = lda;
    key.ldb = ldb;
    key.ldc = ldc;
    key.c_type = c_type;
    key.beta_one = beta != 0.0f;
    key.has_bias = bias != NULL;
    key.alignment = common_alignment(ptrs, 5);
    GemmPlan *p = plan_for(ctx, &key);
    /* the bias pointer lives in the shared descriptor: set and used under the lock (models on several threads) */
    if (bias) {
        pthread_mutex_lock(&cache_lock);
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasLtMatmul(ctx->blaslt, p->op, &alpha, A, p->a, B, p->b, &beta, C ? C : D, p->c, D, p->c, &p->algo,
                                ctx->blaslt_workspace, ctx->blaslt_workspace_bytes, ctx->stream));
    if (bias) pthread_mutex_unlock(&cache_lock);
}

void cuda_gemm_forward(CudaContext *ctx, uint16_t *out, int ldo, const uint16_t *inp, const uint16_t *weight,
                       const uint16_t *bias, const uint16_t *residual, int N, int IC, int OC) {
    gemm(ctx, 1, 0, OC, N, IC, weight, IC, inp, IC, residual, out, ldo, CUDA_R_16BF, residual ? 1.0f : 0.0f, bias);
}

void cuda_gemm_backward_input(CudaContext *ctx, uint16_t *dinp, const uint16_t *dout, int ld_dout,
                              const uint16_t *weight, int N, int IC, int OC, int accumulate) {
    gemm(ctx, 0, 0, IC, N, OC, weight, IC, dout, ld_dout, accumulate ? dinp : NULL, dinp, IC, CUDA_R_16BF,
         accumulate ? 1.0f : 0.0f, NULL);
}

void cuda_gemm_backward_weight(CudaContext *ctx, float *dweight, const uint16_t *dout, int ld_dout,
                               const uint16_t *inp, int N, int IC, int OC) {
    gemm(ctx, 0, 1, IC, OC, N, inp, IC, dout, ld_dout, dweight, dweight, IC, CUDA_R_32F, 1.0f, NULL);
}

/* ---- cuBLAS (cublasGemmEx): shapes that change every call -------------- */

static void blas_gemm(CudaContext *ctx, int transa, int transb, int m, int n, int k, const void *A,
                      cudaDataType_t ab_type, int lda, const void *B, int ldb, float beta, void *C,
                      cudaDataType_t c_type, int ldc) {
    if (m <= 0 || n <= 0 || k <= 0) return;
    const float alpha = 1.0f;
    CUBLAS_CHECK(cublasGemmEx(ctx->blas, transa ? CUBLAS_OP_T : CUBLAS_OP_N, transb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n,
                              k, &alpha, A, ab_type, lda, B, ab_type, ldb, &beta, C, c_type, ldc, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
}

void cuda_gemm_rows_forward(CudaContext *ctx, uint16_t *out, int ldo, const uint16_t *inp, int ld_inp,
                            const uint16_t *weight, int N, int IC, int OC) {
    blas_gemm(ctx, 1, 0, OC, N, IC, weight, CUDA_R_16BF, IC, inp, ld_inp, 0.0f, out, CUDA_R_16BF, ldo);
}

void cuda_gemm_rows_backward_input(CudaContext *ctx, uint16_t *dinp, const uint16_t *dout, int ld_dout,
                                   const uint16_t *weight, int N, int IC, int OC, int accumulate) {
    blas_gemm(ctx, 0, 0, IC, N, OC, weight, CUDA_R_16BF, IC, dout, ld_dout, accumulate ? 1.0f : 0.0f, dinp,
              CUDA_R_16BF, IC);
}

void cuda_gemm_rows_backward_weight(CudaContext *ctx, float *dweight, const uint16_t *dout, int ld_dout,
                                    const uint16_t *inp, int ld_inp, int N, int IC, int OC) {
    blas_gemm(ctx, 0, 1, IC, OC, N, inp, CUDA_R_16BF, ld_inp, dout, ld_dout, 1.0f, dweight, CUDA_R_32F, IC);
}

void cuda_sgemm_forward(CudaContext *ctx, float *out, const float *inp, const float *weight, int N, int IC, int OC) {
    blas_gemm(ctx, 1, 0, OC, N, IC, weight, CUDA_R_32F, IC, inp, IC, 0.0f, out, CUDA_R_32F, OC);
}

void cuda_sgemm_backward(CudaContext *ctx, float *dinp, float *dweight, const float *dout, const float *inp,
                         const float *weight, int N, int IC, int OC) {
    blas_gemm(ctx, 0, 0, IC, N, OC, weight, CUDA_R_32F, IC, dout, OC, 0.0f, dinp, CUDA_R_32F, IC);
    blas_gemm(ctx, 0, 1, IC, OC, N, inp, CUDA_R_32F, IC, dout, OC, 1.0f, dweight, CUDA_R_32F, IC);
}

void cuda_gemm_cache_clear(void) {
    pthread_mutex_lock(&cache_lock);
    for (int i = 0; i < cache_used; i++) {
        cublasLtMatmulDescDestroy(cache[i].op);
        cublasLtMatrixLayoutDestroy(cache[i].a);
        cublasLtMatrixLayoutDestroy(cache[i].b);
        cublasLtMatrixLayoutDestroy(cache[i].c);
    }
    cache_used = 0;
    pthread_mutex_unlock(&cache_lock);
}
