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
#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "cuda_kernels.h"

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

/* ---- grouped expert products (cuda_gemm.h) --------------------------------------------------------------- */

static CudaMoeGemm moe_gemm_how;
static pthread_once_t moe_gemm_once = PTHREAD_ONCE_INIT;

static void moe_gemm_read(void) {
    const char *v = getenv("MEGATRAIN_MOE_GEMM");
    if (!v || !*v || strcmp(v, "cublas_grouped") == 0) moe_gemm_how = CUDA_MOE_GEMM_CUBLAS_GROUPED;
    else if (strcmp(v, "cublas") == 0) moe_gemm_how = CUDA_MOE_GEMM_CUBLAS;
    else if (strcmp(v, "kernel") == 0) moe_gemm_how = CUDA_MOE_GEMM_KERNEL;
    else mt_die(MT_EXIT_USAGE, "MEGATRAIN_MOE_GEMM: expected cublas, cublas_grouped or kernel, found '%s'", v);
}

CudaMoeGemm cuda_moe_gemm_choice(void) {
    pthread_once(&moe_gemm_once, moe_gemm_read);
    return moe_gemm_how;
}

const char *cuda_moe_gemm_name(CudaMoeGemm how) {
    return how == CUDA_MOE_GEMM_KERNEL ? "kernel" : how == CUDA_MOE_GEMM_CUBLAS_GROUPED ? "cublas_grouped" : "cublas";
}

/* The kernel's conditions: dimensions and leading dimensions multiples of 8 (16 bytes of bf16), pointers 16-byte
 * aligned, the offsets on the device. */
static int kernel_takes(const CudaGroupedRows *g, const int *dims, int num_dims, const void *const *ptrs,
                        int num_ptrs) {
    if (!g->d_offsets) return 0;
    for (int i = 0; i < num_dims; i++)
        if (dims[i] < 0 || dims[i] % 8 != 0) return 0;
    for (int i = 0; i < num_ptrs; i++)
        if ((uintptr_t)ptrs[i] % 16 != 0) return 0;
    return 1;
}

/* One product of a grouped call, in cuBLAS's column-major terms (blas_gemm's arguments). */
typedef struct GroupedProblem {
    int transa, transb, m, n, k, lda, ldb, ldc;
    const void *A, *B;
    void *C;
    float beta;
} GroupedProblem;

/* The problems in one cublasGemmGroupedBatchedEx (bf16 inputs, fp32 compute, each problem its own group: the row
 * counts differ). Its sizes, scalars and group sizes are host arrays; the A, B, C pointer arrays device ones,
 * copied from the host on the stream (cudaMemcpyAsync stages a pageable source before returning) into
 * stream-ordered memory freed after the call. Returns cuBLAS's status. */
static cublasStatus_t grouped_gemm(CudaContext *ctx, const GroupedProblem *p, int count, cudaDataType_t c_type) {
    if (count <= 0) return CUBLAS_STATUS_SUCCESS;
    cublasOperation_t *ta = mt_malloc((size_t)count * sizeof *ta), *tb = mt_malloc((size_t)count * sizeof *tb);
    int *ints = mt_malloc((size_t)count * 7 * sizeof *ints);
    int *m = ints, *n = m + count, *k = n + count, *lda = k + count, *ldb = lda + count, *ldc = ldb + count;
    int *size = ldc + count;
    float *alpha = mt_malloc((size_t)count * 2 * sizeof *alpha), *beta = alpha + count;
    const void **ptrs = mt_malloc((size_t)count * 3 * sizeof *ptrs);
    for (int i = 0; i < count; i++) {
        ta[i] = p[i].transa ? CUBLAS_OP_T : CUBLAS_OP_N;
        tb[i] = p[i].transb ? CUBLAS_OP_T : CUBLAS_OP_N;
        m[i] = p[i].m;
        n[i] = p[i].n;
        k[i] = p[i].k;
        lda[i] = p[i].lda;
        ldb[i] = p[i].ldb;
        ldc[i] = p[i].ldc;
        size[i] = 1;
        alpha[i] = 1.0f;
        beta[i] = p[i].beta;
        ptrs[i] = p[i].A;
        ptrs[count + i] = p[i].B;
        ptrs[2 * count + i] = p[i].C;
    }
    const size_t bytes = (size_t)count * 3 * sizeof(void *);
    void **d_ptrs = NULL;
    CUDA_CHECK(cudaMallocAsync((void **)&d_ptrs, bytes, ctx->stream));
    CUDA_CHECK(cudaMemcpyAsync(d_ptrs, ptrs, bytes, cudaMemcpyHostToDevice, ctx->stream));
    const cublasStatus_t status = cublasGemmGroupedBatchedEx(
        ctx->blas, ta, tb, m, n, k, alpha, (const void *const *)d_ptrs, CUDA_R_16BF, lda,
        (const void *const *)(d_ptrs + count), CUDA_R_16BF, ldb, beta, d_ptrs + 2 * count, c_type, ldc, count, size,
        CUBLAS_COMPUTE_32F);
    CUDA_CHECK(cudaFreeAsync(d_ptrs, ctx->stream));
    free(ta);
    free(tb);
    free(ints);
    free(alpha);
    free(ptrs);
    return status;
}

/* Groups with rows: expert e's first row and count into first[i], rows[i], its index into group[i]; returns how many. */
static int busy_groups(const CudaGroupedRows *g, int *group, int *first, int *rows) {
    int count = 0;
    for (int e = 0; e < g->groups; e++) {
        const int n = g->offsets[e + 1] - g->offsets[e];
        if (n <= 0) continue;
        group[count] = e;
        first[count] = g->offsets[e];
        rows[count] = n;
        count++;
    }
    return count;
}

void cuda_grouped_forward(CudaContext *ctx, CudaMoeGemm how, const CudaGroupedRows *g, uint16_t *out, int ldo,
                          const uint16_t *inp, int ld_inp, const uint16_t *w0, const uint16_t *w1, int IC, int OC0,
                          int OC1) {
    if (!w1) OC1 = 0;
    if (how == CUDA_MOE_GEMM_KERNEL) {
        const int dims[] = {IC, OC0, OC1, ldo, ld_inp};
        const void *ptrs[] = {out, inp, w0, w1};
        if (kernel_takes(g, dims, 5, ptrs, 4)) {
            CUDA_CHECK(cuda_moe_gemm_forward(out, ldo, inp, ld_inp, w0, w1, g->d_offsets, g->groups, g->max_rows, IC,
                                             OC0, OC1, ctx->stream));
            return;
        }
    }
    int *group = mt_malloc((size_t)(g->groups > 0 ? g->groups : 1) * 3 * sizeof *group), *first = group + g->groups;
    int *rows = first + g->groups;
    const int busy = busy_groups(g, group, first, rows);
    if (how == CUDA_MOE_GEMM_CUBLAS_GROUPED) { /* gate and up: 2 x busy problems, distinct outputs */
        GroupedProblem *p = mt_malloc((size_t)(busy > 0 ? busy : 1) * 2 * sizeof *p);
        int count = 0;
        for (int s = 0; s < (w1 ? 2 : 1); s++)
            for (int i = 0; i < busy; i++) {
                const int oc = s ? OC1 : OC0;
                const uint16_t *w = (s ? w1 : w0) + (size_t)group[i] * oc * IC;
                p[count++] = (GroupedProblem){.transa = 1, .transb = 0, .m = oc, .n = rows[i], .k = IC, .lda = IC,
                                              .ldb = ld_inp, .ldc = ldo, .A = w, .B = inp + (size_t)first[i] * ld_inp,
                                              .C = out + (size_t)first[i] * ldo + (s ? OC0 : 0), .beta = 0.0f};
            }
        CUBLAS_CHECK(grouped_gemm(ctx, p, count, CUDA_R_16BF));
        free(p);
    } else {
        for (int i = 0; i < busy; i++) {
            const uint16_t *x = inp + (size_t)first[i] * ld_inp;
            uint16_t *o = out + (size_t)first[i] * ldo;
            blas_gemm(ctx, 1, 0, OC0, rows[i], IC, w0 + (size_t)group[i] * OC0 * IC, CUDA_R_16BF, IC, x, ld_inp, 0.0f,
                      o, CUDA_R_16BF, ldo);
            if (w1)
                blas_gemm(ctx, 1, 0, OC1, rows[i], IC, w1 + (size_t)group[i] * OC1 * IC, CUDA_R_16BF, IC, x, ld_inp,
                          0.0f, o + OC0, CUDA_R_16BF, ldo);
        }
    }
    free(group);
}

void cuda_grouped_backward_input(CudaContext *ctx, CudaMoeGemm how, const CudaGroupedRows *g, uint16_t *dinp,
                                 int ld_dinp, const uint16_t *dout, int ld_dout, const uint16_t *w0,
                                 const uint16_t *w1, int IC, int OC0, int OC1, int accumulate) {
    if (!w1) OC1 = 0;
    if (how == CUDA_MOE_GEMM_KERNEL) {
        const int dims[] = {IC, OC0, OC1, ld_dinp, ld_dout};
        const void *ptrs[] = {dinp, dout, w0, w1};
        if (kernel_takes(g, dims, 5, ptrs, 4)) {
            CUDA_CHECK(cuda_moe_gemm_backward_input(dinp, ld_dinp, dout, ld_dout, w0, w1, g->d_offsets, g->groups,
                                                    g->max_rows, IC, OC0, OC1, accumulate, ctx->stream));
            return;
        }
    }
    int *group = mt_malloc((size_t)(g->groups > 0 ? g->groups : 1) * 3 * sizeof *group), *first = group + g->groups;
    int *rows = first + g->groups;
    const int busy = busy_groups(g, group, first, rows);
    if (how == CUDA_MOE_GEMM_CUBLAS_GROUPED) { /* W1's products add to W0's: a second call, ordered after the first */
        GroupedProblem *p = mt_malloc((size_t)(busy > 0 ? busy : 1) * sizeof *p);
        for (int s = 0; s < (w1 ? 2 : 1); s++) {
            const int oc = s ? OC1 : OC0;
            for (int i = 0; i < busy; i++)
                p[i] = (GroupedProblem){.transa = 0, .transb = 0, .m = IC, .n = rows[i], .k = oc, .lda = IC,
                                        .ldb = ld_dout, .ldc = ld_dinp,
                                        .A = (s ? w1 : w0) + (size_t)group[i] * oc * IC,
                                        .B = dout + (size_t)first[i] * ld_dout + (s ? OC0 : 0),
                                        .C = dinp + (size_t)first[i] * ld_dinp,
                                        .beta = s || accumulate ? 1.0f : 0.0f};
            CUBLAS_CHECK(grouped_gemm(ctx, p, busy, CUDA_R_16BF));
        }
        free(p);
    } else {
        for (int i = 0; i < busy; i++) {
            const uint16_t *d = dout + (size_t)first[i] * ld_dout;
            uint16_t *o = dinp + (size_t)first[i] * ld_dinp;
            blas_gemm(ctx, 0, 0, IC, rows[i], OC0, w0 + (size_t)group[i] * OC0 * IC, CUDA_R_16BF, IC, d, ld_dout,
                      accumulate ? 1.0f : 0.0f, o, CUDA_R_16BF, ld_dinp);
            if (w1)
                blas_gemm(ctx, 0, 0, IC, rows[i], OC1, w1 + (size_t)group[i] * OC1 * IC, CUDA_R_16BF, IC, d + OC0,
                          ld_dout, 1.0f, o, CUDA_R_16BF, ld_dinp);
        }
    }
    free(group);
}

/* cublas_grouped's weight gradients: 1 one grouped call, 0 cuBLAS refused fp32 output (the loop), -1 not yet run. */
static int grouped_fp32 = -1;
static pthread_mutex_t grouped_fp32_lock = PTHREAD_MUTEX_INITIALIZER;

int cuda_grouped_weight_fp32_state(void) {
    pthread_mutex_lock(&grouped_fp32_lock);
    const int state = grouped_fp32;
    pthread_mutex_unlock(&grouped_fp32_lock);
    return state;
}

void cuda_grouped_backward_weight(CudaContext *ctx, CudaMoeGemm how, const CudaGroupedRows *g, float *g0, float *g1,
                                  const uint16_t *dout, int ld_dout, const uint16_t *inp, int ld_inp, int IC, int OC0,
                                  int OC1) {
    if (!g1) OC1 = 0;
    if (how == CUDA_MOE_GEMM_KERNEL) {
        const int dims[] = {IC, OC0, OC1, ld_dout, ld_inp};
        const void *ptrs[] = {g0, g1, dout, inp};
        if (kernel_takes(g, dims, 5, ptrs, 4)) {
            CUDA_CHECK(cuda_moe_gemm_backward_weight(g0, g1, dout, ld_dout, inp, ld_inp, g->d_offsets, g->groups, IC,
                                                     OC0, OC1, ctx->stream));
            return;
        }
    }
    int *group = mt_malloc((size_t)(g->groups > 0 ? g->groups : 1) * 3 * sizeof *group), *first = group + g->groups;
    int *rows = first + g->groups;
    const int busy = busy_groups(g, group, first, rows);
    int done = 0;
    if (how == CUDA_MOE_GEMM_CUBLAS_GROUPED && cuda_grouped_weight_fp32_state() != 0) {
        GroupedProblem *p = mt_malloc((size_t)(busy > 0 ? busy : 1) * 2 * sizeof *p);
        int count = 0;
        for (int s = 0; s < (g1 ? 2 : 1); s++)
            for (int i = 0; i < busy; i++) {
                const int oc = s ? OC1 : OC0;
                p[count++] = (GroupedProblem){.transa = 0, .transb = 1, .m = IC, .n = oc, .k = rows[i],
                                              .lda = ld_inp, .ldb = ld_dout, .ldc = IC,
                                              .A = inp + (size_t)first[i] * ld_inp,
                                              .B = dout + (size_t)first[i] * ld_dout + (s ? OC0 : 0),
                                              .C = (s ? g1 : g0) + (size_t)group[i] * oc * IC, .beta = 1.0f};
            }
        const cublasStatus_t status = grouped_gemm(ctx, p, count, CUDA_R_32F);
        free(p);
        if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) {
            pthread_mutex_lock(&grouped_fp32_lock);
            if (grouped_fp32 != 0)
                mt_log("experts' products: cublasGemmGroupedBatchedEx takes no bf16 inputs with fp32 output "
                       "(%s, as cuBLAS 13.1 on an H200): the weight gradients go through one cublasGemmEx per "
                       "expert", cublasGetStatusString(status));
            grouped_fp32 = 0;
            pthread_mutex_unlock(&grouped_fp32_lock);
        } else {
            CUBLAS_CHECK(status);
            if (count > 0) {
                pthread_mutex_lock(&grouped_fp32_lock);
                grouped_fp32 = 1;
                pthread_mutex_unlock(&grouped_fp32_lock);
            }
            done = 1;
        }
    }
    if (!done)
        for (int i = 0; i < busy; i++) {
            const uint16_t *x = inp + (size_t)first[i] * ld_inp, *d = dout + (size_t)first[i] * ld_dout;
            blas_gemm(ctx, 0, 1, IC, OC0, rows[i], x, CUDA_R_16BF, ld_inp, d, ld_dout, 1.0f,
                      g0 + (size_t)group[i] * OC0 * IC, CUDA_R_32F, IC);
            if (g1)
                blas_gemm(ctx, 0, 1, IC, OC1, rows[i], x, CUDA_R_16BF, ld_inp, d + OC0, ld_dout, 1.0f,
                          g1 + (size_t)group[i] * OC1 * IC, CUDA_R_32F, IC);
        }
    free(group);
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
