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
 *   forward  Y^T  (OC x N)  = W . X                 A = W (E4M3), B = X (E4M3), bf16 out, bf16 bias, alpha 0.5
 *   dgrad    dX^T (IC x N)  = W^T-copy . dY         A = W's transposed copy (E4M3), B = dY (E5M2), bf16 out
 *   wgrad    dW^T (IC x OC) += X^T-copy . dY^T-copy A (E4M3), B (E5M2), fp32 out, beta 1, in place
 * with the dequantising scales of A and B as device floats; and FP8 outputs:
 * an E4M3 D with a bf16 bias, D's scale and amax (the max |value| before the
 * scale, bias included), saturating to +-448, and an E5M2 D from E4M3 x
 * E5M2. Then what the emulator refuses, each case the forward with one thing
 * changed: a GPU must refuse it too, or it is reported as "the emulator is
 * stricter" (allowed); a GPU that refuses what the emulator accepts fails.
 *
 * Limits. A Hopper FP8 product keeps about 14 bits inside each block of its
 * k sum (fewer with FAST_ACCUM), the emulator fp32. On a GPU: fp32 outputs and
 * the amax within 1e-3 of the largest value; a bf16 output, rounded once more
 * (2^-8 of its value), 8e-3; an FP8 output within one code step of fp8.c's
 * value plus 2^-9 of 448, and 99% of its codes exact. On the emulator, whose
 * fp32 sums differ from the double reference by about 1e-7: 1e-5, 4e-3 (the
 * rounding's own bound) and one code step. A wrong scale, operand or
 * transpose shows errors of 0.3 and above.
 *
 * `test_cuda_cublaslt_fp8 host_scale` passes a host pointer as A's scale:
 * the emulator must abort (on a GPU that faults; never run it there).
 * Ends with "N passed, N failed"; exit 77 on a GPU other than sm_89 / sm_90
 * (other architectures have other FP8 rules). */
#include <cublasLt.h>

#include "core/fp8.h"
#include "gpu_test_util.h"

static int passed, failed, on_emulator;
static cublasLtHandle_t lt;

/* The limit on a GPU, or the tighter one the emulator's fp32 accumulation meets (the header). */
static double limit_for(double gpu, double emulator) { return on_emulator ? emulator : gpu; }

static void check(const char *what, double err, double limit) {
    if (report(what, err, limit)) passed++;
    else failed++;
}

static void check_true(const char *what, int ok) {
    printf("  %-44s %s\n", what, ok ? "ok" : "FAIL");
    if (ok) passed++;
    else failed++;
}

enum { N = 32, IC = 64, OC = 48 };

/* One product: D (m x n, column-major) = sd * (alpha sa sb op(A) op(B) + beta C + bias). */
typedef struct {
    int ta, tb, m, n, k, lda, ldb, ldc;
    cudaDataType_t at, bt, ct, dt;
    cublasComputeType_t compute;
    int32_t bias_type; /* CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, -1: not set */
    const void *A, *B, *C, *bias;
    void *D;
    float alpha, beta;
    const float *sa, *sb, *sc, *sd;
    float *amax;
    int8_t fast_accum;
} Lt;

/* A TN product D (m x n) of A stored k x m and B stored k x n, C of D's type, alpha 1. */
static Lt tn(int m, int n, int k, cudaDataType_t at, const void *A, cudaDataType_t bt, const void *B,
             cudaDataType_t dt, void *D) {
    return (Lt){.ta = 1, .tb = 0, .m = m, .n = n, .k = k, .lda = k, .ldb = k, .ldc = m, .at = at, .bt = bt,
                .ct = dt, .dt = dt, .compute = CUBLAS_COMPUTE_32F, .bias_type = -1, .A = A, .B = B, .D = D,
                .alpha = 1.0f};
}

#define LT_CHECK(call)                                                                                         \
    do {                                                                                                       \
        cublasStatus_t s_ = (call);                                                                            \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                     \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cublasLtGetStatusString(s_));        \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

/* Runs it (heuristic, then the product) and returns cuBLASLt's status: the first refusal of the descriptor, the
 * heuristic or the call. */
static cublasStatus_t lt_run(const Lt *p) {
    cublasLtMatmulDesc_t op;
    cublasStatus_t status = cublasLtMatmulDescCreate(&op, p->compute, CUDA_R_32F);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    const cublasOperation_t ta = p->ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
#define SET(attr, value)                                                                                       \
    if (status == CUBLAS_STATUS_SUCCESS) status = cublasLtMatmulDescSetAttribute(op, attr, &(value), sizeof(value))
    SET(CUBLASLT_MATMUL_DESC_TRANSA, ta);
    SET(CUBLASLT_MATMUL_DESC_TRANSB, tb);
    if (p->bias) {
        const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
        SET(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
        SET(CUBLASLT_MATMUL_DESC_BIAS_POINTER, p->bias);
    }
    if (p->bias_type != -1) SET(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, p->bias_type);
    if (p->sa) SET(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, p->sa);
    if (p->sb) SET(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, p->sb);
    if (p->sc) SET(CUBLASLT_MATMUL_DESC_C_SCALE_POINTER, p->sc);
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
        status = cublasLtMatmul(lt, op, &p->alpha, p->A, a, p->B, b, &p->beta, p->C ? p->C : p->D, c, p->D, d,
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

/* One operand cast to FP8 as a cast kernel writes it: the codes on the device, their exact values on the host. */
typedef struct {
    uint8_t *dev;
    float *values;
} Fp8Tensor;

static Fp8Tensor fp8_tensor(const float *x, long n, float scale, Fp8Format format) {
    uint8_t *codes = malloc((size_t)n);
    Fp8Tensor t = {NULL, malloc((size_t)n * sizeof(float))};
    for (long i = 0; i < n; i++) {
        codes[i] = fp8_from_f32(x[i] * scale, format);
        t.values[i] = fp8_to_f32(codes[i], format);
    }
    t.dev = dev_copy(codes, (size_t)n);
    free(codes);
    return t;
}

static void fp8_tensor_free(Fp8Tensor *t) {
    cudaFree(t->dev);
    free(t->values);
}

static float *dev_scalar(float v) { return dev_f32(&v, 1); }

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

/* The product's exact value in double: Z (m x n, column-major) = scale op(A) op(B) for TN (A stored k x m, B
 * stored k x n, both with leading dimension k), from the codes' values. */
static double *reference(const Fp8Tensor *A, const Fp8Tensor *B, int m, int n, int k, double scale) {
    double *z = malloc((size_t)m * n * sizeof *z);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double acc = 0.0;
            for (int l = 0; l < k; l++) acc += (double)A->values[(size_t)i * k + l] * (double)B->values[(size_t)j * k + l];
            z[(size_t)j * m + i] = acc * scale;
        }
    return z;
}

/* The layer's operands, cast as TE casts them: X and W in E4M3, dY in E5M2, each with its transposed copy, and
 * the dequantising scales 1/s on the device. */
typedef struct {
    Fp8Tensor x, w, dy, xt, wt, dyt, x5; /* x5: X in E5M2 (the E5M2 output's B) */
    float sx, sw, sg, sx5;
    float *isx, *isw, *isg, *isx5; /* device */
    float *bias;            /* OC values, bf16-rounded */
    uint16_t *d_bias;
} Layer;

static Layer layer_make(Rng *rng) {
    Layer L;
    float *x = rand_bf16_values(rng, (long)N * IC, 1.0), *w = rand_bf16_values(rng, (long)OC * IC, 0.05);
    float *dy = rand_bf16_values(rng, (long)N * OC, 1e-3);
    L.sx = fp8_max(FP8_E4M3) / max_abs(x, (long)N * IC);
    L.sw = fp8_max(FP8_E4M3) / max_abs(w, (long)OC * IC);
    L.sg = fp8_max(FP8_E5M2) / max_abs(dy, (long)N * OC);
    L.sx5 = fp8_max(FP8_E5M2) / max_abs(x, (long)N * IC);
    float *xt = transposed(x, N, IC), *wt = transposed(w, OC, IC), *dyt = transposed(dy, N, OC);
    L.x = fp8_tensor(x, (long)N * IC, L.sx, FP8_E4M3);
    L.w = fp8_tensor(w, (long)OC * IC, L.sw, FP8_E4M3);
    L.dy = fp8_tensor(dy, (long)N * OC, L.sg, FP8_E5M2);
    L.xt = fp8_tensor(xt, (long)N * IC, L.sx, FP8_E4M3);
    L.wt = fp8_tensor(wt, (long)OC * IC, L.sw, FP8_E4M3);
    L.dyt = fp8_tensor(dyt, (long)N * OC, L.sg, FP8_E5M2);
    L.x5 = fp8_tensor(x, (long)N * IC, L.sx5, FP8_E5M2);
    L.isx = dev_scalar(1.0f / L.sx), L.isw = dev_scalar(1.0f / L.sw), L.isg = dev_scalar(1.0f / L.sg);
    L.isx5 = dev_scalar(1.0f / L.sx5);
    L.bias = rand_bf16_values(rng, OC, 0.1);
    L.d_bias = dev_bf16(L.bias, OC);
    free(x), free(w), free(dy), free(xt), free(wt), free(dyt);
    return L;
}

static void layer_free(Layer *L) {
    Fp8Tensor *t[] = {&L->x, &L->w, &L->dy, &L->xt, &L->wt, &L->dyt, &L->x5};
    for (int i = 0; i < 7; i++) fp8_tensor_free(t[i]);
    cudaFree(L->isx), cudaFree(L->isw), cudaFree(L->isg), cudaFree(L->isx5), cudaFree(L->d_bias);
    free(L->bias);
}

/* The forward as the refusals' base: Y^T = W . X, bf16 out, the scales, no bias, alpha 1. */
static Lt forward_product(const Layer *L, void *y) {
    Lt p = tn(OC, N, IC, CUDA_R_8F_E4M3, L->w.dev, CUDA_R_8F_E4M3, L->x.dev, CUDA_R_16BF, y);
    p.sa = L->isw, p.sb = L->isx;
    return p;
}

/* Runs p, which must be accepted, and checks its bf16 or fp32 D (n values) against ref. */
static void run_and_check(const Lt *p, const char *accepted, const float *ref, long n, const char *what,
                          double limit) {
    const cublasStatus_t s = lt_run(p);
    check_true(accepted, s == CUBLAS_STATUS_SUCCESS);
    if (s != CUBLAS_STATUS_SUCCESS) return;
    float *got = p->dt == CUDA_R_16BF ? host_from_bf16(p->D, n) : host_from_f32(p->D, n);
    check(what, rel_max(got, ref, n), limit);
    free(got);
}

static void test_forward(const Layer *L) {
    printf("forward: Y^T (%d x %d) = 0.5 W . X + bias, E4M3 x E4M3, bf16 out, bf16 bias\n", OC, N);
    double *z = reference(&L->w, &L->x, OC, N, IC, 0.5 / L->sw / L->sx);
    float *ref = malloc((size_t)OC * N * sizeof *ref);
    for (int j = 0; j < N; j++)
        for (int i = 0; i < OC; i++) ref[(size_t)j * OC + i] = (float)(z[(size_t)j * OC + i] + L->bias[i]);
    uint16_t *d_y = dev_bf16(ref, (long)OC * N);
    for (int fast = 0; fast < 2; fast++) { /* FAST_ACCUM: accepted; k = 64 is too short to show its loss */
        Lt p = forward_product(L, d_y);
        p.alpha = 0.5f, p.bias = L->d_bias, p.fast_accum = (int8_t)fast;
        CHECK_CUDA(cudaMemset(d_y, 0xff, (size_t)OC * N * 2));
        run_and_check(&p, fast ? "accepted, FAST_ACCUM 1" : "accepted", ref, (long)OC * N,
                      fast ? "Y rel_max (fast accumulation)" : "Y rel_max", limit_for(8e-3, 4e-3));
    }
    cudaFree(d_y);
    free(z);
    free(ref);
}

static void test_dgrad(const Layer *L) {
    printf("dgrad: dX^T (%d x %d) = W^T-copy . dY, E4M3 x E5M2, bf16 out\n", IC, N);
    double *z = reference(&L->wt, &L->dy, IC, N, OC, 1.0 / L->sw / L->sg);
    float *ref = malloc((size_t)IC * N * sizeof *ref);
    for (long i = 0; i < (long)IC * N; i++) ref[i] = (float)z[i];
    uint16_t *d_dx = dev_bf16(ref, (long)IC * N);
    CHECK_CUDA(cudaMemset(d_dx, 0xff, (size_t)IC * N * 2));
    Lt p = tn(IC, N, OC, CUDA_R_8F_E4M3, L->wt.dev, CUDA_R_8F_E5M2, L->dy.dev, CUDA_R_16BF, d_dx);
    p.sa = L->isw, p.sb = L->isg;
    run_and_check(&p, "accepted", ref, (long)IC * N, "dX rel_max", limit_for(8e-3, 4e-3));
    cudaFree(d_dx);
    free(z);
    free(ref);
}

static void test_wgrad(const Layer *L, Rng *rng) {
    printf("wgrad: dW^T (%d x %d) += X^T-copy . dY^T-copy, E4M3 x E5M2, fp32 out, beta 1, in place\n", IC, OC);
    double *z = reference(&L->xt, &L->dyt, IC, OC, N, 1.0 / L->sx / L->sg);
    float *dw0 = rand_bf16_values(rng, (long)IC * OC, 1e-3), *ref = malloc((size_t)IC * OC * sizeof *ref);
    for (long i = 0; i < (long)IC * OC; i++) ref[i] = (float)(z[i] + dw0[i]);
    float *d_dw = dev_f32(dw0, (long)IC * OC);
    Lt p = tn(IC, OC, N, CUDA_R_8F_E4M3, L->xt.dev, CUDA_R_8F_E5M2, L->dyt.dev, CUDA_R_32F, d_dw);
    p.C = d_dw, p.beta = 1.0f, p.sa = L->isx, p.sb = L->isg;
    run_and_check(&p, "accepted", ref, (long)IC * OC, "dW rel_max", limit_for(1e-3, 1e-5));
    cudaFree(d_dw);
    free(z);
    free(dw0);
    free(ref);
}

/* The distance from code's magnitude to its neighbour above (below, at the largest finite value). */
static float code_step(uint8_t code, Fp8Format format) {
    const uint8_t c = code & 0x7f, top = format == FP8_E4M3 ? 0x7e : 0x7b;
    return c < top ? fp8_to_f32(c + 1, format) - fp8_to_f32(c, format) : fp8_to_f32(c, format) - fp8_to_f32(c - 1, format);
}

/* An FP8 D of format `format` from (A, B) with D's scale making the largest |value| 600 (past E4M3's 448: saturated
 * there), the amax asked for, and with_bias the layer's bias (inside the bracket: before D's scale, in the amax). */
static void check_fp8_output(const char *what, const Layer *L, const Fp8Tensor *A, const Fp8Tensor *B,
                             cudaDataType_t bt, double scale, Fp8Format format, int with_bias) {
    printf("%s\n", what);
    double *z = reference(A, B, OC, N, IC, scale), amax_ref = 0.0;
    for (int j = 0; j < N; j++)
        for (int i = 0; i < OC; i++) {
            if (with_bias) z[(size_t)j * OC + i] += L->bias[i];
            amax_ref = fmax(amax_ref, fabs(z[(size_t)j * OC + i]));
        }
    const float sd = (float)(600.0 / amax_ref);
    float *d_sd = dev_scalar(sd), *d_amax = dev_scalar(-1.0f);
    const float *zeros = calloc((size_t)OC * N, sizeof(float));
    uint16_t *d_c = dev_bf16(zeros, (long)OC * N); /* an FP8 D's C: bf16, apart from D, beta 0 */
    uint8_t *d_q;
    CHECK_CUDA(cudaMalloc((void **)&d_q, (size_t)OC * N));
    const cudaDataType_t dt = format == FP8_E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
    Lt p = tn(OC, N, IC, CUDA_R_8F_E4M3, A->dev, bt, B->dev, dt, d_q);
    p.ct = CUDA_R_16BF, p.C = d_c, p.sa = L->isw, p.sb = bt == CUDA_R_8F_E4M3 ? L->isx : L->isx5, p.sd = d_sd;
    p.amax = d_amax;
    if (with_bias) p.bias = L->d_bias;
    const cublasStatus_t s = lt_run(&p);
    check_true("accepted", s == CUBLAS_STATUS_SUCCESS);
    if (s == CUBLAS_STATUS_SUCCESS) {
        float amax;
        CHECK_CUDA(cudaMemcpy(&amax, d_amax, sizeof amax, cudaMemcpyDeviceToHost));
        check(with_bias ? "amax (bias in, D's scale not) rel err" : "amax (before D's scale) rel err",
              fabs(amax - amax_ref) / amax_ref, limit_for(1e-3, 1e-5));
        uint8_t *codes = malloc((size_t)OC * N);
        CHECK_CUDA(cudaMemcpy(codes, d_q, (size_t)OC * N, cudaMemcpyDeviceToHost));
        const float fmax_ = fp8_max(format);
        long exact = 0, off = 0, saturated = 0, unsaturated = 0;
        for (long i = 0; i < (long)OC * N; i++) {
            const float want_value = (float)(z[i] * sd);
            const uint8_t want = fp8_from_f32(want_value, format);
            exact += codes[i] == want;
            /* one code step at the value, plus the accumulation error of a product whose largest value is 600 */
            const float clamped = fminf(fmaxf(want_value, -fmax_), fmax_);
            if (!(fabsf(fp8_to_f32(codes[i], format) - clamped) <= code_step(want, format) + (float)limit_for(448.0 / 512, 0.0)))
                off++;
            if (fabsf(want_value) > fmax_ * 1.04f) {
                saturated++;
                if ((codes[i] & 0x7f) != (format == FP8_E4M3 ? 0x7e : 0x7b)) unsaturated++;
            }
        }
        printf("  %ld of %d codes exact, %ld saturated\n", exact, OC * N, saturated);
        check_true("every value within a code step of fp8.c's", off == 0);
        check_true("at least 99% of the codes exact", exact * 100 >= 99L * OC * N);
        if (format == FP8_E4M3) check_true("past 448: exactly +-448 (never NaN)", saturated > 0 && unsaturated == 0);
        free(codes);
    }
    cudaFree(d_sd), cudaFree(d_amax), cudaFree(d_c), cudaFree(d_q);
    free((void *)zeros);
    free(z);
}

/* What the emulator refuses: the forward with one thing changed each. */
static void test_refusals(const Layer *L) {
    printf("refusals: what the emulator refuses, a GPU must refuse (or the emulator is stricter)\n");
    /* room for every case's reads and writes: the largest A or D here is 72 x 48 (plus 8 bytes of offset) */
    enum { ROOM = 72 * 48 * 4 + 64 };
    uint8_t *big;
    CHECK_CUDA(cudaMalloc((void **)&big, ROOM));
    CHECK_CUDA(cudaMemset(big, 0, ROOM));
    float *f32 = dev_f32(NULL, ROOM / 4), *amax = dev_scalar(0.0f), *one = dev_scalar(1.0f);
    uint16_t *y = (uint16_t *)big; /* bf16 D, OC x N */
    const Lt base = forward_product(L, y);
    struct {
        const char *what;
        Lt p;
    } cases[20];
    int n = 0;
#define CASE(name, change)                                                                                     \
    do {                                                                                                       \
        cases[n].what = name;                                                                                  \
        cases[n].p = base;                                                                                     \
        Lt *p = &cases[n++].p;                                                                                 \
        change;                                                                                                \
    } while (0)
    CASE("NN layout (A not transposed)", (p->ta = 0, p->lda = OC, p->A = big));
    CASE("TT layout (B transposed)", (p->tb = 1, p->ldb = N, p->B = big));
    CASE("E5M2 x E5M2", (p->at = p->bt = CUDA_R_8F_E5M2));
    CASE("E4M3 x bf16", (p->bt = CUDA_R_16BF, p->B = big));
    CASE("E5M2 D from E4M3 x E4M3", (p->dt = CUDA_R_8F_E5M2, p->ct = CUDA_R_16BF, p->C = f32, p->D = big));
    CASE("fp32 C with a bf16 D", (p->ct = CUDA_R_32F, p->C = f32, p->beta = 1.0f));
    CASE("beta 1 with an E4M3 D", (p->dt = CUDA_R_8F_E4M3, p->ct = CUDA_R_16BF, p->C = f32, p->D = big,
                                   p->beta = 1.0f, p->sd = one));
    CASE("bf16 bias with an fp32 D", (p->dt = p->ct = CUDA_R_32F, p->D = f32, p->bias = L->d_bias));
    CASE("fp32 bias type", (p->bias = f32, p->bias_type = CUDA_R_32F));
    CASE("m = 40 (not a multiple of 16)", (p->m = 40));
    CASE("k = 56 (not a multiple of 16)", (p->k = 56));
    CASE("n = 28 (not a multiple of 8)", (p->n = 28));
    CASE("lda = 72 bytes (not a multiple of 16)", (p->lda = 72, p->A = big));
    CASE("A 8 bytes past 16-byte alignment", (p->A = big + 8));
    CASE("compute type 32F_FAST_TF32", (p->compute = CUBLAS_COMPUTE_32F_FAST_TF32));
    CASE("C's scale", (p->sc = one));
    CASE("D's scale with a bf16 D", (p->sd = one));
    CASE("amax with a bf16 D", (p->amax = amax));
    CASE("A's scale on a bf16 product", (p->at = p->bt = CUDA_R_16BF, p->A = big, p->B = big));
#undef CASE
    for (int i = 0; i < n; i++) {
        const cublasStatus_t st = lt_run(&cases[i].p);
        char what[128];
        snprintf(what, sizeof what, "%s: %s", cases[i].what, cublasLtGetStatusString(st));
        if (st == CUBLAS_STATUS_SUCCESS && !on_emulator) {
            printf("  %-44s accepted here: the emulator is stricter (allowed)\n", what);
            passed++;
        } else {
            check_true(what, st != CUBLAS_STATUS_SUCCESS);
        }
    }
    cudaFree(big), cudaFree(f32), cudaFree(amax), cudaFree(one);
}

/* A host pointer as A's scale: the emulator aborts, naming it (test_gpu_emu.sh expects the message). */
static int host_scale(void) {
    Rng rng;
    rng_seed(&rng, 3);
    Layer L = layer_make(&rng);
    uint16_t *y;
    CHECK_CUDA(cudaMalloc((void **)&y, (size_t)OC * N * 2));
    static float host = 1.0f;
    Lt p = forward_product(&L, y);
    p.sa = &host;
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
    Layer L = layer_make(&rng);
    test_forward(&L);
    test_dgrad(&L);
    test_wgrad(&L, &rng);
    check_fp8_output("FP8 output: E4M3 D (48 x 32) with a bf16 bias, D's scale and amax, saturating", &L, &L.w, &L.x,
                     CUDA_R_8F_E4M3, 1.0 / L.sw / L.sx, FP8_E4M3, 1);
    check_fp8_output("FP8 output: E5M2 D (48 x 32) from E4M3 x E5M2 (W . X in E5M2), D's scale and amax", &L, &L.w,
                     &L.x5, CUDA_R_8F_E5M2, 1.0 / L.sw / L.sx5, FP8_E5M2, 0);
    test_refusals(&L);
    layer_free(&L);
    cublasLtDestroy(lt);
    printf("\n%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
