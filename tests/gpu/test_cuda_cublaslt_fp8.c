/* test_cuda_cublaslt_fp8.c: cuBLASLt's FP8 matrix products as the CPU
 * emulator models them (tests/gpu/emu/emu_runtime.c), checked against
 * src/core/fp8.c's exact values. On the emulator (CI, test_gpu_emu.sh) it
 * checks the model; on a Hopper GPU (`make test-gpu`, device_check.sh
 * tests) it checks that the real library computes the same and refuses at
 * least what the emulator refuses, so that FP8 code written and tested on
 * the emulator asks the GPU for nothing it cannot do. It uses cuBLASLt
 * directly, not megatrain's products (megatrain has no FP8 GPU path yet:
 * issue 20).
 *
 * The three products of a linear layer, as Transformer Engine runs them on
 * Hopper (cuBLAS's column-major terms; "TN": A transposed, B not; row-major
 * X [N, IC], W [OC, IC], dY [N, OC]):
 *   forward  Y^T  (OC x N)  = W  . X          A = W (E4M3), B = X (E4M3), bf16 out, bf16 bias
 *   dgrad    dX^T (IC x N)  = W^T-copy . dY   A = the transposed copy of W (E4M3), B = dY (E5M2), bf16 out
 *   wgrad    dW^T (IC x OC) += X^T-copy . dY^T-copy   A (E4M3), B (E5M2), fp32 out, beta 1
 * with the dequantising scales of A and B as device floats; and an FP8
 * output: E4M3 D with D's scale and amax (the max |value| before the scale),
 * saturating to +-448. Then the layouts and types the emulator refuses:
 * each must be refused by a GPU too (a GPU that accepts one is reported as
 * "the emulator is stricter", which is allowed; a GPU that refuses what the
 * emulator accepts fails the test).
 *
 * `test_cuda_cublaslt_fp8 host_scale` passes a host pointer as A's scale:
 * the emulator must abort (on a GPU that faults; never run it there).
 * Limits: a bf16 output is within 2^-8 of its value (rounded once), plus fp32
 * accumulation in another order: 8e-3 of the largest value; fp32 outputs
 * 1e-5; FP8 outputs within one code of fp8.c's (a value at a rounding
 * boundary may go either way), 99% exactly. A wrong scale, operand or
 * transpose shows errors of 0.3 and above.
 * Ends with "N passed, N failed"; exit 77 on a GPU other than sm_89 / sm_90
 * (other architectures have other FP8 rules). */
#include <cublasLt.h>

#include "core/fp8.h"
#include "gpu_test_util.h"

static int passed, failed, on_emulator;
static cublasLtHandle_t lt;

static void check(const char *what, double err, double limit) {
    if (report(what, err, limit)) passed++;
    else failed++;
}

static void check_true(const char *what, int ok) {
    printf("  %-44s %s\n", what, ok ? "ok" : "FAIL");
    if (ok) passed++;
    else failed++;
}

enum { N = 32, IC = 64, OC = 48, OC_N_MAX = OC * N };

/* One product's description: D (m x n, column-major) = sd * (alpha sa sb op(A) op(B) + beta C + bias). */
typedef struct {
    int ta, tb, m, n, k, lda, ldb, ldc;
    cudaDataType_t at, bt, ct, dt;
    const void *A, *B, *C, *bias;
    void *D;
    float beta;
    const float *sa, *sb, *sd;
    float *amax;
    int8_t fast_accum;
} Lt;

#define LT_CHECK(call)                                                                                         \
    do {                                                                                                       \
        cublasStatus_t s_ = (call);                                                                            \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                     \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cublasLtGetStatusString(s_));        \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

/* Runs it (heuristic, then the product) and returns cuBLASLt's status: the heuristic's refusal, or the call's. */
static cublasStatus_t lt_run(const Lt *p) {
    cublasLtMatmulDesc_t op;
    LT_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = p->ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
#define SET(attr, value)                                                                                       \
    if (status == CUBLAS_STATUS_SUCCESS) status = cublasLtMatmulDescSetAttribute(op, attr, &(value), sizeof(value))
    SET(CUBLASLT_MATMUL_DESC_TRANSA, ta);
    SET(CUBLASLT_MATMUL_DESC_TRANSB, tb);
    if (p->bias) {
        const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
        SET(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
        SET(CUBLASLT_MATMUL_DESC_BIAS_POINTER, p->bias);
    }
    if (p->sa) SET(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p->sa);
    if (p->sb) SET(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p->sb);
    if (p->sd) SET(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, p->sd);
    if (p->amax) SET(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, p->amax);
    if (p->fast_accum) SET(CUBLASLT_MATMUL_DESC_FAST_ACCUM, p->fast_accum);
#undef SET
    cublasLtMatrixLayout_t a, b, c, d;
    LT_CHECK(cublasLtMatrixLayoutCreate(&a, p->at, p->ta ? p->k : p->m, p->ta ? p->m : p->k, p->lda));
    LT_CHECK(cublasLtMatrixLayoutCreate(&b, p->bt, p->tb ? p->n : p->k, p->tb ? p->k : p->n, p->ldb));
    LT_CHECK(cublasLtMatrixLayoutCreate(&c, p->ct, p->m, p->n, p->ldc));
    LT_CHECK(cublasLtMatrixLayoutCreate(&d, p->dt, p->m, p->n, p->ldc));
    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t workspace_bytes = (size_t)32 << 20;
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                  sizeof workspace_bytes));
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    if (status == CUBLAS_STATUS_SUCCESS)
        status = cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, d, pref, 1, &result, &found);
    if (status == CUBLAS_STATUS_SUCCESS && found == 0) status = CUBLAS_STATUS_NOT_SUPPORTED;
    if (status == CUBLAS_STATUS_SUCCESS) {
        void *workspace;
        CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
        const float alpha = 1.0f;
        status = cublasLtMatmul(lt, op, &alpha, p->A, a, p->B, b, &p->beta, p->C ? p->C : p->D, c, p->D, d,
                                &result.algo, workspace, workspace_bytes, 0);
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK_CUDA(cudaFree(workspace));
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatrixLayoutDestroy(d);
    cublasLtMatmulDescDestroy(op);
    return status;
}

/* n values of x times scale cast to fp8 (what a cast kernel writes) on the device; the codes' exact values in
 * *values (host). */
static uint8_t *dev_fp8(const float *x, long n, float scale, Fp8Format format, float **values) {
    uint8_t *codes = malloc((size_t)n);
    *values = malloc((size_t)n * sizeof **values);
    for (long i = 0; i < n; i++) {
        codes[i] = fp8_from_f32(x[i] * scale, format);
        (*values)[i] = fp8_to_f32(codes[i], format);
    }
    uint8_t *dev = dev_copy(codes, (size_t)n);
    free(codes);
    return dev;
}

static float *dev_scalar(float v) { return dev_f32(&v, 1); }

/* The product's exact value in double: Z (m x n, column-major) = sa sb op(A) op(B) for TN (A stored k x m, lda; B
 * stored k x n, ldb), from the codes' values. */
static double *reference(const float *A, int lda, const float *B, int ldb, int m, int n, int k, double sa,
                         double sb) {
    double *z = malloc((size_t)m * n * sizeof *z);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double acc = 0.0;
            for (int l = 0; l < k; l++) acc += (double)A[(size_t)i * lda + l] * (double)B[(size_t)j * ldb + l];
            z[(size_t)j * m + i] = acc * sa * sb;
        }
    return z;
}

/* n zeros (a static buffer of the largest size used). */
static const float *ref_zero(long n) {
    static float zeros[OC_N_MAX];
    return n <= OC_N_MAX ? zeros : NULL;
}

static float max_abs(const float *x, long n) {
    float m = 0.0f;
    for (long i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

/* Row-major r x c to its transpose (c x r): the "transposed copy" a cast kernel also writes. */
static float *transposed(const float *x, int r, int c) {
    float *t = malloc((size_t)r * c * sizeof *t);
    for (int i = 0; i < r; i++)
        for (int j = 0; j < c; j++) t[(size_t)j * r + i] = x[(size_t)i * c + j];
    return t;
}


static void test_products(Rng *rng) {
    float *x = rand_bf16_values(rng, (long)N * IC, 1.0), *w = rand_bf16_values(rng, (long)OC * IC, 0.05);
    float *dy = rand_bf16_values(rng, (long)N * OC, 1e-3), *bias = rand_bf16_values(rng, OC, 0.1);
    const float sx = fp8_max(FP8_E4M3) / max_abs(x, (long)N * IC), sw = fp8_max(FP8_E4M3) / max_abs(w, (long)OC * IC);
    const float sg = fp8_max(FP8_E5M2) / max_abs(dy, (long)N * OC);
    float *xv, *wv, *dyv, *wtv, *xtv, *dytv;
    float *wt = transposed(w, OC, IC), *xt = transposed(x, N, IC), *dyt = transposed(dy, N, OC);
    uint8_t *d_x = dev_fp8(x, (long)N * IC, sx, FP8_E4M3, &xv), *d_w = dev_fp8(w, (long)OC * IC, sw, FP8_E4M3, &wv);
    uint8_t *d_dy = dev_fp8(dy, (long)N * OC, sg, FP8_E5M2, &dyv);
    uint8_t *d_wt = dev_fp8(wt, (long)OC * IC, sw, FP8_E4M3, &wtv), *d_xt = dev_fp8(xt, (long)N * IC, sx, FP8_E4M3, &xtv);
    uint8_t *d_dyt = dev_fp8(dyt, (long)N * OC, sg, FP8_E5M2, &dytv);
    float *d_isx = dev_scalar(1.0f / sx), *d_isw = dev_scalar(1.0f / sw), *d_isg = dev_scalar(1.0f / sg);

    printf("forward: Y^T (%d x %d) = W . X, E4M3 x E4M3, bf16 out, bf16 bias\n", OC, N);
    double *z = reference(wv, IC, xv, IC, OC, N, IC, 1.0 / sx, 1.0 / sw);
    float *ref = malloc((size_t)OC * N * sizeof *ref);
    for (int j = 0; j < N; j++)
        for (int i = 0; i < OC; i++) ref[(size_t)j * OC + i] = (float)(z[(size_t)j * OC + i] + bias[i]);
    uint16_t *d_bias = dev_bf16(bias, OC), *d_y = dev_bf16(ref, (long)OC * N);
    for (int fast = 0; fast < 2; fast++) {
        Lt p = {.ta = 1, .tb = 0, .m = OC, .n = N, .k = IC, .lda = IC, .ldb = IC, .ldc = OC, .at = CUDA_R_8F_E4M3,
                .bt = CUDA_R_8F_E4M3, .ct = CUDA_R_16BF, .dt = CUDA_R_16BF, .A = d_w, .B = d_x, .bias = d_bias,
                .D = d_y, .sa = d_isw, .sb = d_isx, .fast_accum = (int8_t)fast};
        CHECK_CUDA(cudaMemset(d_y, 0xff, (size_t)OC * N * 2));
        const cublasStatus_t s = lt_run(&p);
        check_true(fast ? "accepted, FAST_ACCUM 1" : "accepted", s == CUBLAS_STATUS_SUCCESS);
        if (s != CUBLAS_STATUS_SUCCESS) continue;
        float *got = host_from_bf16(d_y, (long)OC * N);
        check(fast ? "Y rel_max (fast accumulation)" : "Y rel_max", rel_max(got, ref, (long)OC * N), 8e-3);
        free(got);
    }
    free(z);
    free(ref);

    printf("dgrad: dX^T (%d x %d) = W^T-copy . dY, E4M3 x E5M2, bf16 out\n", IC, N);
    z = reference(wtv, OC, dyv, OC, IC, N, OC, 1.0 / sw, 1.0 / sg);
    ref = malloc((size_t)IC * N * sizeof *ref);
    for (long i = 0; i < (long)IC * N; i++) ref[i] = (float)z[i];
    uint16_t *d_dx = dev_bf16(ref, (long)IC * N);
    CHECK_CUDA(cudaMemset(d_dx, 0xff, (size_t)IC * N * 2));
    Lt g = {.ta = 1, .tb = 0, .m = IC, .n = N, .k = OC, .lda = OC, .ldb = OC, .ldc = IC, .at = CUDA_R_8F_E4M3,
            .bt = CUDA_R_8F_E5M2, .ct = CUDA_R_16BF, .dt = CUDA_R_16BF, .A = d_wt, .B = d_dy, .D = d_dx,
            .sa = d_isw, .sb = d_isg};
    cublasStatus_t s = lt_run(&g);
    check_true("accepted", s == CUBLAS_STATUS_SUCCESS);
    if (s == CUBLAS_STATUS_SUCCESS) {
        float *got = host_from_bf16(d_dx, (long)IC * N);
        check("dX rel_max", rel_max(got, ref, (long)IC * N), 8e-3);
        free(got);
    }
    free(z);
    free(ref);

    printf("wgrad: dW^T (%d x %d) += X^T-copy . dY^T-copy, E4M3 x E5M2, fp32 out, beta 1\n", IC, OC);
    z = reference(xtv, N, dytv, N, IC, OC, N, 1.0 / sx, 1.0 / sg);
    float *dw0 = rand_bf16_values(rng, (long)IC * OC, 1e-3);
    ref = malloc((size_t)IC * OC * sizeof *ref);
    for (long i = 0; i < (long)IC * OC; i++) ref[i] = (float)(z[i] + dw0[i]);
    float *d_dw = dev_f32(dw0, (long)IC * OC);
    Lt u = {.ta = 1, .tb = 0, .m = IC, .n = OC, .k = N, .lda = N, .ldb = N, .ldc = IC, .at = CUDA_R_8F_E4M3,
            .bt = CUDA_R_8F_E5M2, .ct = CUDA_R_32F, .dt = CUDA_R_32F, .A = d_xt, .B = d_dyt, .C = d_dw, .D = d_dw,
            .beta = 1.0f, .sa = d_isx, .sb = d_isg};
    s = lt_run(&u);
    check_true("accepted", s == CUBLAS_STATUS_SUCCESS);
    if (s == CUBLAS_STATUS_SUCCESS) {
        float *got = host_from_f32(d_dw, (long)IC * OC);
        check("dW rel_max", rel_max(got, ref, (long)IC * OC), 1e-5);
        free(got);
    }
    free(z);
    free(ref);
    free(dw0);

    printf("FP8 output: E4M3 D (%d x %d) with D's scale and amax, saturating\n", OC, N);
    z = reference(wv, IC, xv, IC, OC, N, IC, 1.0 / sx, 1.0 / sw);
    double amax_ref = 0.0;
    for (long i = 0; i < (long)OC * N; i++) amax_ref = fmax(amax_ref, fabs(z[i]));
    const float sd = (float)(600.0 / amax_ref); /* the largest |value| becomes 600: past 448, saturated */
    float *d_sd = dev_scalar(sd), *d_amax = dev_scalar(-1.0f);
    uint8_t *d_q;
    CHECK_CUDA(cudaMalloc((void **)&d_q, (size_t)OC * N));
    uint16_t *d_c = dev_bf16(ref_zero(OC * N), (long)OC * N); /* C of an FP8 D: bf16, apart from D, beta 0 */
    Lt q = {.ta = 1, .tb = 0, .m = OC, .n = N, .k = IC, .lda = IC, .ldb = IC, .ldc = OC, .at = CUDA_R_8F_E4M3,
            .bt = CUDA_R_8F_E4M3, .ct = CUDA_R_16BF, .dt = CUDA_R_8F_E4M3, .A = d_w, .B = d_x, .C = d_c, .D = d_q,
            .sa = d_isw, .sb = d_isx, .sd = d_sd, .amax = d_amax};
    s = lt_run(&q);
    check_true("accepted", s == CUBLAS_STATUS_SUCCESS);
    if (s == CUBLAS_STATUS_SUCCESS) {
        float amax;
        CHECK_CUDA(cudaMemcpy(&amax, d_amax, sizeof amax, cudaMemcpyDeviceToHost));
        check("amax (before D's scale) rel err", fabs(amax - amax_ref) / amax_ref, 1e-5);
        uint8_t *codes = malloc((size_t)OC * N);
        CHECK_CUDA(cudaMemcpy(codes, d_q, (size_t)OC * N, cudaMemcpyDeviceToHost));
        long exact = 0, off = 0, saturated = 0, unsaturated = 0;
        for (long i = 0; i < (long)OC * N; i++) {
            const float want_value = (float)(z[i] * sd);
            const uint8_t want = fp8_from_f32(want_value, FP8_E4M3);
            if (codes[i] == want) exact++;
            /* a value within accumulation noise of a rounding boundary may take the neighbour code */
            else if (abs((int)(codes[i] & 0x7f) - (int)(want & 0x7f)) > 1 || (codes[i] ^ want) & 0x80) off++;
            if (fabsf(want_value) > 464.0f * 1.0001f) {
                saturated++;
                if ((codes[i] & 0x7f) != 0x7e) unsaturated++;
            }
        }
        printf("  %ld of %d codes exact, %ld saturated\n", exact, OC * N, saturated);
        check_true("every code within one step of fp8.c's", off == 0);
        check_true("at least 99% exact", exact * 100 >= 99L * OC * N);
        check_true("past 448: exactly +-448 (never NaN)", saturated > 0 && unsaturated == 0);
        free(codes);
    }
    free(z);

    printf("refusals: what the emulator refuses, a GPU must refuse (or the emulator is stricter)\n");
    uint16_t *d_bf = dev_bf16(x, (long)N * IC);
    float *d_f32 = dev_f32(NULL, (long)OC * N);
    struct {
        const char *what;
        Lt p;
    } refused[] = {
        {"NN layout (A not transposed)", {.ta = 0, .tb = 0, .m = OC, .n = N, .k = IC, .lda = OC, .ldb = IC, .ldc = OC,
                                          .at = CUDA_R_8F_E4M3, .bt = CUDA_R_8F_E4M3, .ct = CUDA_R_16BF,
                                          .dt = CUDA_R_16BF, .A = d_w, .B = d_x, .D = d_y}},
        {"TT layout (B transposed)", {.ta = 1, .tb = 1, .m = OC, .n = N, .k = IC, .lda = IC, .ldb = N, .ldc = OC,
                                      .at = CUDA_R_8F_E4M3, .bt = CUDA_R_8F_E4M3, .ct = CUDA_R_16BF,
                                      .dt = CUDA_R_16BF, .A = d_w, .B = d_x, .D = d_y}},
        {"E5M2 x E5M2", {.ta = 1, .tb = 0, .m = OC, .n = N, .k = IC, .lda = IC, .ldb = IC, .ldc = OC,
                         .at = CUDA_R_8F_E5M2, .bt = CUDA_R_8F_E5M2, .ct = CUDA_R_16BF, .dt = CUDA_R_16BF,
                         .A = d_w, .B = d_x, .D = d_y}},
        {"E4M3 x bf16", {.ta = 1, .tb = 0, .m = OC, .n = N, .k = IC, .lda = IC, .ldb = IC, .ldc = OC,
                         .at = CUDA_R_8F_E4M3, .bt = CUDA_R_16BF, .ct = CUDA_R_16BF, .dt = CUDA_R_16BF, .A = d_w,
                         .B = d_bf, .D = d_y}},
        {"E5M2 D from E4M3 x E4M3", {.ta = 1, .tb = 0, .m = OC, .n = N, .k = IC, .lda = IC, .ldb = IC, .ldc = OC,
                                     .at = CUDA_R_8F_E4M3, .bt = CUDA_R_8F_E4M3, .ct = CUDA_R_16BF,
                                     .dt = CUDA_R_8F_E5M2, .A = d_w, .B = d_x, .C = d_c, .D = d_q}},
        {"fp32 C with a bf16 D", {.ta = 1, .tb = 0, .m = OC, .n = N, .k = IC, .lda = IC, .ldb = IC, .ldc = OC,
                                  .at = CUDA_R_8F_E4M3, .bt = CUDA_R_8F_E4M3, .ct = CUDA_R_32F, .dt = CUDA_R_16BF,
                                  .A = d_w, .B = d_x, .C = d_f32, .D = d_y, .beta = 1.0f}},
        {"m = 40 (not a multiple of 16)", {.ta = 1, .tb = 0, .m = 40, .n = N, .k = IC, .lda = IC, .ldb = IC,
                                           .ldc = OC, .at = CUDA_R_8F_E4M3, .bt = CUDA_R_8F_E4M3, .ct = CUDA_R_16BF,
                                           .dt = CUDA_R_16BF, .A = d_w, .B = d_x, .D = d_y}},
        {"k = 56 (not a multiple of 16)", {.ta = 1, .tb = 0, .m = OC, .n = N, .k = 56, .lda = IC, .ldb = IC,
                                           .ldc = OC, .at = CUDA_R_8F_E4M3, .bt = CUDA_R_8F_E4M3, .ct = CUDA_R_16BF,
                                           .dt = CUDA_R_16BF, .A = d_w, .B = d_x, .D = d_y}},
        {"amax with a bf16 D", {.ta = 1, .tb = 0, .m = OC, .n = N, .k = IC, .lda = IC, .ldb = IC, .ldc = OC,
                                .at = CUDA_R_8F_E4M3, .bt = CUDA_R_8F_E4M3, .ct = CUDA_R_16BF, .dt = CUDA_R_16BF,
                                .A = d_w, .B = d_x, .D = d_y, .amax = d_amax}},
        {"A's scale on a bf16 product", {.ta = 1, .tb = 0, .m = OC, .n = N, .k = IC, .lda = IC, .ldb = IC,
                                         .ldc = OC, .at = CUDA_R_16BF, .bt = CUDA_R_16BF, .ct = CUDA_R_16BF,
                                         .dt = CUDA_R_16BF, .A = d_bf, .B = d_bf, .D = d_y, .sa = d_isx}},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        const cublasStatus_t st = lt_run(&refused[i].p);
        char what[128];
        snprintf(what, sizeof what, "%s: %s", refused[i].what, cublasLtGetStatusString(st));
        if (st == CUBLAS_STATUS_SUCCESS && !on_emulator) {
            printf("  %-44s accepted here: the emulator is stricter (allowed)\n", what);
            passed++;
        } else {
            check_true(what, st != CUBLAS_STATUS_SUCCESS);
        }
    }

    free(x), free(w), free(dy), free(bias), free(wt), free(xt), free(dyt);
    free(xv), free(wv), free(dyv), free(wtv), free(xtv), free(dytv);
    cudaFree(d_x), cudaFree(d_w), cudaFree(d_dy), cudaFree(d_wt), cudaFree(d_xt), cudaFree(d_dyt);
    cudaFree(d_isx), cudaFree(d_isw), cudaFree(d_isg), cudaFree(d_bias), cudaFree(d_y), cudaFree(d_dx);
    cudaFree(d_dw), cudaFree(d_sd), cudaFree(d_amax), cudaFree(d_q), cudaFree(d_c), cudaFree(d_bf), cudaFree(d_f32);
}

/* A host pointer as A's scale: the emulator aborts, naming it (test_gpu_emu.sh expects the message). */
static int host_scale(void) {
    Rng rng;
    rng_seed(&rng, 3);
    float *x = rand_bf16_values(&rng, (long)N * IC, 1.0), *xv;
    uint8_t *d_x = dev_fp8(x, (long)N * IC, 1.0f, FP8_E4M3, &xv);
    uint16_t *d_y = dev_bf16(x, (long)OC * N); /* any bf16 values: the output */
    static float host = 1.0f;
    Lt p = {.ta = 1, .tb = 0, .m = OC, .n = N, .k = IC, .lda = IC, .ldb = IC, .ldc = OC, .at = CUDA_R_8F_E4M3,
            .bt = CUDA_R_8F_E4M3, .ct = CUDA_R_16BF, .dt = CUDA_R_16BF, .A = d_x, .B = d_x, .D = d_y, .sa = &host};
    printf("status %s (the emulator should have stopped)\n", cublasLtGetStatusString(lt_run(&p)));
    return 1;
}

int main(int argc, char **argv) {
    struct cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    on_emulator = strncmp(prop.name, "CPU emulator", 12) == 0;
    if (!(prop.major == 9 && prop.minor == 0) && !(prop.major == 8 && prop.minor == 9)) {
        printf("skipped: %s is sm_%d%d; these are the FP8 rules of sm_89 and sm_90\n", prop.name, prop.major,
               prop.minor);
        return 77;
    }
    LT_CHECK(cublasLtCreate(&lt));
    printf("%s, cuBLASLt %zu\n", prop.name, cublasLtGetVersion());
    if (argc > 1 && strcmp(argv[1], "host_scale") == 0) return host_scale();
    Rng rng;
    rng_seed(&rng, 20261125);
    test_products(&rng);
    cublasLtDestroy(lt);
    printf("\n%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
