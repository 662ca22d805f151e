/* test_cuda_ops.c: every CUDA op against the CPU reference (backend/backend.h)
 * on random inputs rounded to bf16, so both sides see the same values; the
 * GPU computes in bf16 with fp32 accumulation (limits: gpu_test_util.h).
 * Run by `make test-gpu`; needs a GPU. Ends with "N passed, N failed". */
#include "backend/backend.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_kernels.h"
#include "gpu_test_util.h"
#include "model/model.h"
#include "model/rope_tables.h"

static int passed, failed;
static CudaContext ctx;

static void check(const char *what, double err, double limit) {
    if (report(what, err, limit)) passed++;
    else failed++;
}

static void test_gemm(Rng *rng, int N, int IC, int OC, int with_bias) {
    printf("gemm N=%d IC=%d OC=%d%s\n", N, IC, OC, with_bias ? " bias" : "");
    float *inp = rand_bf16_values(rng, (long)N * IC, 1.0), *w = rand_bf16_values(rng, (long)OC * IC, 0.1);
    float *bias = rand_bf16_values(rng, OC, 1.0), *resid = rand_bf16_values(rng, (long)N * OC, 1.0);
    float *dout = rand_bf16_values(rng, (long)N * OC, 1.0), *dinp0 = rand_bf16_values(rng, (long)N * IC, 1.0);
    float *dw0 = rand_bf16_values(rng, (long)OC * IC, 1.0);
    /* CPU: out = inp @ w^T + bias + resid; dinp = dinp0 + dout @ w; dw = dw0 + dout^T @ inp */
    float *out = calloc((size_t)N * OC, sizeof(float));
    cpu_backend.matmul_forward(out, inp, w, with_bias ? bias : NULL, N, IC, OC);
    for (long i = 0; i < (long)N * OC; i++) out[i] += resid[i];
    float *dinp = malloc((size_t)N * IC * sizeof(float)), *dw = malloc((size_t)OC * IC * sizeof(float));
    memcpy(dinp, dinp0, (size_t)N * IC * sizeof(float));
    memcpy(dw, dw0, (size_t)OC * IC * sizeof(float));
    cpu_backend.matmul_backward(dinp, dw, NULL, dout, inp, w, N, IC, OC);

    uint16_t *d_inp = dev_bf16(inp, (long)N * IC), *d_w = dev_bf16(w, (long)OC * IC), *d_bias = dev_bf16(bias, OC);
    uint16_t *d_out = dev_bf16(resid, (long)N * OC), *d_dout = dev_bf16(dout, (long)N * OC);
    uint16_t *d_dinp = dev_bf16(dinp0, (long)N * IC);
    float *d_dw = dev_f32(dw0, (long)OC * IC);
    cuda_gemm_forward(&ctx, d_out, OC, d_inp, d_w, with_bias ? d_bias : NULL, d_out, N, IC, OC);
    cuda_gemm_backward_input(&ctx, d_dinp, d_dout, OC, d_w, N, IC, OC, 1);
    cuda_gemm_backward_weight(&ctx, d_dw, d_dout, OC, d_inp, N, IC, OC);
    float *g_out = host_from_bf16(d_out, (long)N * OC), *g_dinp = host_from_bf16(d_dinp, (long)N * IC);
    float *g_dw = host_from_f32(d_dw, (long)OC * IC);
    check("forward (+bias +residual, in place)", rel_max(g_out, out, (long)N * OC), 1e-2);
    check("backward input (accumulate)", rel_max(g_dinp, dinp, (long)N * IC), 1e-2);
    check("backward weight (fp32 accumulate)", rel_max(g_dw, dw, (long)OC * IC), 1e-4);
    cudaFree(d_inp); cudaFree(d_w); cudaFree(d_bias); cudaFree(d_out); cudaFree(d_dout); cudaFree(d_dinp); cudaFree(d_dw);
    free(inp); free(w); free(bias); free(resid); free(dout); free(dinp0); free(dw0); free(out); free(dinp); free(dw);
    free(g_out); free(g_dinp); free(g_dw);
}

static void test_rmsnorm(Rng *rng, int N, int C) {
    printf("rmsnorm N=%d C=%d\n", N, C);
    const float eps = 1e-5f;
    float *x = rand_bf16_values(rng, (long)N * C, 2.0), *w = rand_bf16_values(rng, C, 1.0);
    float *dy = rand_bf16_values(rng, (long)N * C, 1.0), *dx0 = rand_bf16_values(rng, (long)N * C, 1.0);
    float *dw0 = rand_bf16_values(rng, C, 1.0);
    float *y = malloc((size_t)N * C * sizeof(float)), *rstd = malloc((size_t)N * sizeof(float));
    cpu_backend.rmsnorm_forward(y, rstd, x, w, N, C, eps);
    float *dx = malloc((size_t)N * C * sizeof(float)), *dw = malloc((size_t)C * sizeof(float));
    memcpy(dx, dx0, (size_t)N * C * sizeof(float));
    memcpy(dw, dw0, (size_t)C * sizeof(float));
    cpu_backend.rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C);

    uint16_t *d_x = dev_bf16(x, (long)N * C), *d_w = dev_bf16(w, C), *d_y = dev_bf16(x, (long)N * C);
    uint16_t *d_dy = dev_bf16(dy, (long)N * C), *d_dx16 = dev_bf16(dx0, (long)N * C);
    float *d_rstd = dev_f32(NULL, N), *d_dx = dev_f32(dx0, (long)N * C), *d_dw = dev_f32(dw0, C);
    CHECK_CUDA(cuda_rmsnorm_forward(d_y, d_rstd, d_x, d_w, N, C, eps, 0));
    CHECK_CUDA(cuda_rmsnorm_backward(d_dx, d_dx16, d_dw, d_dy, d_x, d_w, d_rstd, N, C, 0));
    float *g_y = host_from_bf16(d_y, (long)N * C), *g_rstd = host_from_f32(d_rstd, N);
    float *g_dx = host_from_f32(d_dx, (long)N * C), *g_dx16 = host_from_bf16(d_dx16, (long)N * C);
    float *g_dw = host_from_f32(d_dw, C);
    check("forward", rel_max(g_y, y, (long)N * C), 8e-3);
    check("rstd (fp32)", rel_max(g_rstd, rstd, N), 1e-5);
    check("backward input (fp32, accumulate)", rel_max(g_dx, dx, (long)N * C), 1e-5);
    check("backward input, bf16 mirror", rel_max(g_dx16, dx, (long)N * C), 8e-3);
    check("backward weight", rel_max(g_dw, dw, C), 1e-5);
    cudaFree(d_x); cudaFree(d_w); cudaFree(d_y); cudaFree(d_dy); cudaFree(d_dx16); cudaFree(d_rstd); cudaFree(d_dx); cudaFree(d_dw);
    free(x); free(w); free(dy); free(dx0); free(dw0); free(y); free(rstd); free(dx); free(dw);
    free(g_y); free(g_rstd); free(g_dx); free(g_dx16); free(g_dw);
}

/* qkv_rope against the CPU composition: per-head rmsnorm (qk_norm), rope; v copied. */
static void test_qkv_rope(Rng *rng, int B, int T, int H, int KVH, int D, int qk_norm) {
    printf("qkv_rope B=%d T=%d H=%d KVH=%d D=%d%s\n", B, T, H, KVH, D, qk_norm ? " qk_norm" : "");
    const int N = B * T, HD = H * D, KVD = KVH * D, QKV = HD + 2 * KVD, half = D / 2;
    const float eps = 1e-6f;
    float *qkv = rand_bf16_values(rng, (long)N * QKV, 1.0), *qn = rand_bf16_values(rng, D, 1.0);
    float *kn = rand_bf16_values(rng, D, 1.0);
    float *dq = rand_bf16_values(rng, (long)N * HD, 1.0), *dk = rand_bf16_values(rng, (long)N * KVD, 1.0);
    float *dv = rand_bf16_values(rng, (long)N * KVD, 1.0);
    float *cos_t = malloc((size_t)T * half * sizeof(float)), *sin_t = malloc((size_t)T * half * sizeof(float));
    rope_tables_init(cos_t, sin_t, T, D, 10000.0, NULL);
    /* CPU reference */
    float *q = malloc((size_t)N * HD * sizeof(float)), *k = malloc((size_t)N * KVD * sizeof(float));
    float *v = malloc((size_t)N * KVD * sizeof(float));
    float *qpre = malloc((size_t)N * HD * sizeof(float)), *kpre = malloc((size_t)N * KVD * sizeof(float));
    float *qr = malloc((size_t)N * H * sizeof(float)), *kr = malloc((size_t)N * KVH * sizeof(float));
    for (int n = 0; n < N; n++) {
        memcpy(qpre + (size_t)n * HD, qkv + (size_t)n * QKV, (size_t)HD * sizeof(float));
        memcpy(kpre + (size_t)n * KVD, qkv + (size_t)n * QKV + HD, (size_t)KVD * sizeof(float));
        memcpy(v + (size_t)n * KVD, qkv + (size_t)n * QKV + HD + KVD, (size_t)KVD * sizeof(float));
    }
    if (qk_norm) {
        cpu_backend.rmsnorm_forward(q, qr, qpre, qn, N * H, D, eps);
        cpu_backend.rmsnorm_forward(k, kr, kpre, kn, N * KVH, D, eps);
    } else {
        memcpy(q, qpre, (size_t)N * HD * sizeof(float));
        memcpy(k, kpre, (size_t)N * KVD * sizeof(float));
    }
    cpu_backend.rope_forward(q, q, cos_t, sin_t, B, T, H, D);
    cpu_backend.rope_forward(k, k, cos_t, sin_t, B, T, KVH, D);
    float *dq2 = calloc((size_t)N * HD, sizeof(float)), *dk2 = calloc((size_t)N * KVD, sizeof(float));
    cpu_backend.rope_backward(dq2, dq, cos_t, sin_t, B, T, H, D);
    cpu_backend.rope_backward(dk2, dk, cos_t, sin_t, B, T, KVH, D);
    float *dqn = calloc(D, sizeof(float)), *dkn = calloc(D, sizeof(float));
    float *dqp = dq2, *dkp = dk2;
    if (qk_norm) {
        dqp = calloc((size_t)N * HD, sizeof(float));
        dkp = calloc((size_t)N * KVD, sizeof(float));
        cpu_backend.rmsnorm_backward(dqp, dqn, dq2, qpre, qn, qr, N * H, D);
        cpu_backend.rmsnorm_backward(dkp, dkn, dk2, kpre, kn, kr, N * KVH, D);
    }
    float *dqkv = malloc((size_t)N * QKV * sizeof(float));
    for (int n = 0; n < N; n++) {
        memcpy(dqkv + (size_t)n * QKV, dqp + (size_t)n * HD, (size_t)HD * sizeof(float));
        memcpy(dqkv + (size_t)n * QKV + HD, dkp + (size_t)n * KVD, (size_t)KVD * sizeof(float));
        memcpy(dqkv + (size_t)n * QKV + HD + KVD, dv + (size_t)n * KVD, (size_t)KVD * sizeof(float));
    }
    /* GPU */
    uint16_t *d_qkv = dev_bf16(qkv, (long)N * QKV), *d_qn = dev_bf16(qn, D), *d_kn = dev_bf16(kn, D);
    uint16_t *d_q = dev_bf16(q, (long)N * HD), *d_k = dev_bf16(k, (long)N * KVD), *d_v = dev_bf16(v, (long)N * KVD);
    uint16_t *d_dq = dev_bf16(dq, (long)N * HD), *d_dk = dev_bf16(dk, (long)N * KVD), *d_dv = dev_bf16(dv, (long)N * KVD);
    uint16_t *d_dqkv = dev_bf16(qkv, (long)N * QKV);
    float *d_qr = dev_f32(NULL, (long)N * H), *d_kr = dev_f32(NULL, (long)N * KVH), *d_dqn = dev_f32(NULL, D);
    float *d_dkn = dev_f32(NULL, D), *d_cos = dev_f32(cos_t, (long)T * half), *d_sin = dev_f32(sin_t, (long)T * half);
    CHECK_CUDA(cuda_qkv_rope_forward(d_q, d_k, d_v, d_qr, d_kr, d_qkv, qk_norm ? d_qn : NULL, qk_norm ? d_kn : NULL,
                                     d_cos, d_sin, N, T, H, KVH, D, eps, 0));
    CHECK_CUDA(cuda_qkv_rope_backward(d_dqkv, qk_norm ? d_dqn : NULL, qk_norm ? d_dkn : NULL, d_dq, d_dk, d_dv, d_qkv,
                                      qk_norm ? d_qn : NULL, qk_norm ? d_kn : NULL, d_qr, d_kr, d_cos, d_sin, N, T, H,
                                      KVH, D, 0));
    float *g_q = host_from_bf16(d_q, (long)N * HD), *g_k = host_from_bf16(d_k, (long)N * KVD);
    float *g_v = host_from_bf16(d_v, (long)N * KVD), *g_dqkv = host_from_bf16(d_dqkv, (long)N * QKV);
    check("forward q", rel_max(g_q, q, (long)N * HD), 8e-3);
    check("forward k", rel_max(g_k, k, (long)N * KVD), 8e-3);
    check("forward v (copy)", rel_max(g_v, v, (long)N * KVD), 0.0);
    check("backward d_qkv", rel_max(g_dqkv, dqkv, (long)N * QKV), 8e-3);
    if (qk_norm) {
        float *g_dqn = host_from_f32(d_dqn, D), *g_dkn = host_from_f32(d_dkn, D);
        check("backward q_norm weight", rel_max(g_dqn, dqn, D), 1e-4);
        check("backward k_norm weight", rel_max(g_dkn, dkn, D), 1e-4);
        free(g_dqn); free(g_dkn);
        free(dqp); free(dkp);
    }
    cudaFree(d_qkv); cudaFree(d_qn); cudaFree(d_kn); cudaFree(d_q); cudaFree(d_k); cudaFree(d_v); cudaFree(d_dq);
    cudaFree(d_dk); cudaFree(d_dv); cudaFree(d_dqkv); cudaFree(d_qr); cudaFree(d_kr); cudaFree(d_dqn); cudaFree(d_dkn);
    cudaFree(d_cos); cudaFree(d_sin);
    free(qkv); free(qn); free(kn); free(dq); free(dk); free(dv); free(cos_t); free(sin_t); free(q); free(k); free(v);
    free(qpre); free(kpre); free(qr); free(kr); free(dq2); free(dk2); free(dqn); free(dkn); free(dqkv);
    free(g_q); free(g_k); free(g_v); free(g_dqkv);
}

static void test_swiglu(Rng *rng, int N, int I) {
    printf("swiglu N=%d I=%d\n", N, I);
    float *gu = rand_bf16_values(rng, (long)N * 2 * I, 2.0), *da = rand_bf16_values(rng, (long)N * I, 1.0);
    float *gate = malloc((size_t)N * I * sizeof(float)), *up = malloc((size_t)N * I * sizeof(float));
    for (int n = 0; n < N; n++)
        for (int i = 0; i < I; i++) {
            gate[(size_t)n * I + i] = gu[(size_t)n * 2 * I + i];
            up[(size_t)n * I + i] = gu[(size_t)n * 2 * I + I + i];
        }
    float *act = malloc((size_t)N * I * sizeof(float));
    float *dg = calloc((size_t)N * I, sizeof(float)), *du = calloc((size_t)N * I, sizeof(float));
    cpu_backend.swiglu_forward(act, gate, up, (long)N * I);
    cpu_backend.swiglu_backward(dg, du, da, gate, up, (long)N * I);
    float *dgu = malloc((size_t)N * 2 * I * sizeof(float));
    for (int n = 0; n < N; n++)
        for (int i = 0; i < I; i++) {
            dgu[(size_t)n * 2 * I + i] = dg[(size_t)n * I + i];
            dgu[(size_t)n * 2 * I + I + i] = du[(size_t)n * I + i];
        }
    uint16_t *d_gu = dev_bf16(gu, (long)N * 2 * I), *d_da = dev_bf16(da, (long)N * I), *d_act = dev_bf16(da, (long)N * I);
    uint16_t *d_dgu = dev_bf16(gu, (long)N * 2 * I);
    CHECK_CUDA(cuda_swiglu_forward(d_act, d_gu, N, I, 0));
    CHECK_CUDA(cuda_swiglu_backward(d_dgu, d_da, d_gu, N, I, 0));
    float *g_act = host_from_bf16(d_act, (long)N * I), *g_dgu = host_from_bf16(d_dgu, (long)N * 2 * I);
    check("forward", rel_max(g_act, act, (long)N * I), 8e-3);
    check("backward (gate | up)", rel_max(g_dgu, dgu, (long)N * 2 * I), 8e-3);
    cudaFree(d_gu); cudaFree(d_da); cudaFree(d_act); cudaFree(d_dgu);
    free(gu); free(da); free(gate); free(up); free(act); free(dg); free(du); free(dgu); free(g_act); free(g_dgu);
}

/* Random bf16 logits (N, V), targets (every 5th ignored), and the CPU's losses and gradient for dloss. */
static void cross_entropy_case(Rng *rng, int N, int V, float dloss, float **logits, int32_t **targets, float **losses,
                               float **dl) {
    *logits = rand_bf16_values(rng, (long)N * V, 3.0);
    *targets = malloc((size_t)N * sizeof(int32_t));
    for (int n = 0; n < N; n++) (*targets)[n] = n % 5 == 3 ? -1 : (int32_t)rng_below(rng, (uint64_t)V);
    *losses = malloc((size_t)N * sizeof(float));
    *dl = malloc((size_t)N * V * sizeof(float));
    cpu_backend.cross_entropy_forward(*losses, *logits, *targets, N, V);
    cpu_backend.cross_entropy_backward(*dl, *logits, *targets, dloss, N, V);
}

static void test_cross_entropy(Rng *rng, int N, int V) {
    printf("cross_entropy N=%d V=%d\n", N, V);
    float *logits, *losses, *dl;
    int32_t *targets;
    const float dloss = 0.37f;
    cross_entropy_case(rng, N, V, dloss, &logits, &targets, &losses, &dl);
    uint16_t *d_logits = dev_bf16(logits, (long)N * V);
    int32_t *d_targets = dev_copy(targets, (size_t)N * sizeof(int32_t));
    float *d_losses = dev_f32(NULL, N), *d_lse = dev_f32(NULL, N);
    CHECK_CUDA(cuda_cross_entropy_forward(d_losses, d_lse, d_logits, d_targets, N, V, 0));
    CHECK_CUDA(cuda_cross_entropy_backward(d_logits, d_lse, d_targets, dloss, N, V, 0));
    float *g_losses = host_from_f32(d_losses, N), *g_dl = host_from_bf16(d_logits, (long)N * V);
    check("forward losses (fp32 from bf16 logits)", rel_max(g_losses, losses, N), 1e-5);
    check("backward in place", rel_max(g_dl, dl, (long)N * V), 8e-3);
    cudaFree(d_logits); cudaFree(d_targets); cudaFree(d_losses); cudaFree(d_lse);
    free(logits); free(targets); free(losses); free(dl); free(g_losses); free(g_dl);
}

static void test_attention(Rng *rng, int B, int T, int H, int KVH, int D) {
    printf("attention B=%d T=%d H=%d KVH=%d D=%d\n", B, T, H, KVH, D);
    const long nq = (long)B * T * H * D, nk = (long)B * T * KVH * D;
    float *q = rand_bf16_values(rng, nq, 1.0), *k = rand_bf16_values(rng, nk, 1.0), *v = rand_bf16_values(rng, nk, 1.0);
    float *dout = rand_bf16_values(rng, nq, 1.0);
    float *out = malloc((size_t)nq * sizeof(float)), *probs = malloc((size_t)B * H * T * T * sizeof(float));
    cpu_backend.attention_forward(out, probs, q, k, v, B, T, H, KVH, D);
    float *dq = calloc((size_t)nq, sizeof(float)), *dk = calloc((size_t)nk, sizeof(float));
    float *dv = calloc((size_t)nk, sizeof(float));
    cpu_backend.attention_backward(dq, dk, dv, dout, probs, q, k, v, B, T, H, KVH, D);
    uint16_t *d_q = dev_bf16(q, nq), *d_k = dev_bf16(k, nk), *d_v = dev_bf16(v, nk), *d_dout = dev_bf16(dout, nq);
    uint16_t *d_out = dev_bf16(dout, nq), *d_dq = dev_bf16(dout, nq), *d_dk = dev_bf16(k, nk), *d_dv = dev_bf16(v, nk);
    float *d_lse = dev_f32(NULL, (long)B * H * T);
    void *ws;
    CHECK_CUDA(cudaMalloc(&ws, cuda_attention_workspace_bytes(B, T, H, KVH, D)));
    CHECK_CUDA(cuda_attention_forward(d_out, d_lse, d_q, d_k, d_v, B, T, H, KVH, D, 0));
    CHECK_CUDA(cuda_attention_backward(d_dq, d_dk, d_dv, d_dout, d_out, d_lse, d_q, d_k, d_v, B, T, H, KVH, D, ws, 0));
    float *g_out = host_from_bf16(d_out, nq), *g_dq = host_from_bf16(d_dq, nq), *g_dk = host_from_bf16(d_dk, nk);
    float *g_dv = host_from_bf16(d_dv, nk);
    check("forward", rel_max(g_out, out, nq), 1e-2);
    check("backward dq", rel_l2(g_dq, dq, nq), 2e-2);
    check("backward dk", rel_l2(g_dk, dk, nk), 2e-2);
    check("backward dv", rel_l2(g_dv, dv, nk), 2e-2);
    cudaFree(d_q); cudaFree(d_k); cudaFree(d_v); cudaFree(d_dout); cudaFree(d_out); cudaFree(d_dq); cudaFree(d_dk);
    cudaFree(d_dv); cudaFree(d_lse); cudaFree(ws);
    free(q); free(k); free(v); free(dout); free(out); free(probs); free(dq); free(dk); free(dv);
    free(g_out); free(g_dq); free(g_dk); free(g_dv);
}

static void test_embedding(Rng *rng, int N, int V, int C) {
    printf("embedding N=%d V=%d C=%d\n", N, V, C);
    float *table = rand_bf16_values(rng, (long)V * C, 1.0), *dout = rand_bf16_values(rng, (long)N * C, 1.0);
    float *dtable0 = rand_bf16_values(rng, (long)V * C, 1.0);
    int32_t *tokens = malloc((size_t)N * sizeof(int32_t));
    for (int n = 0; n < N; n++) tokens[n] = (int32_t)rng_below(rng, (uint64_t)(V / 2)); /* repeats */
    float *out = malloc((size_t)N * C * sizeof(float)), *dtable = malloc((size_t)V * C * sizeof(float));
    memcpy(dtable, dtable0, (size_t)V * C * sizeof(float));
    cpu_backend.embedding_forward(out, tokens, table, N, C);
    cpu_backend.embedding_backward(dtable, dout, tokens, N, C);
    uint16_t *d_table = dev_bf16(table, (long)V * C), *d_out = dev_bf16(dout, (long)N * C);
    float *d_dout = dev_f32(dout, (long)N * C), *d_dtable = dev_f32(dtable0, (long)V * C);
    int32_t *d_tokens = dev_copy(tokens, (size_t)N * sizeof(int32_t));
    CHECK_CUDA(cuda_embedding_forward(d_out, d_tokens, d_table, N, C, 0));
    CHECK_CUDA(cuda_embedding_backward(d_dtable, d_dout, d_tokens, N, C, 0));
    float *g_out = host_from_bf16(d_out, (long)N * C), *g_dtable = host_from_f32(d_dtable, (long)V * C);
    check("forward (exact)", rel_max(g_out, out, (long)N * C), 0.0);
    check("backward (fp32 atomics)", rel_max(g_dtable, dtable, (long)V * C), 1e-6);
    cudaFree(d_table); cudaFree(d_out); cudaFree(d_dout); cudaFree(d_dtable); cudaFree(d_tokens);
    free(table); free(dout); free(dtable0); free(tokens); free(out); free(dtable); free(g_out); free(g_dtable);
}

/* AdamW over chunks against the same formula in double (train/optimizer.c), one decayed and one not; the moments
 * fp32, or bf16 (optimizer.state_dtype: bf16: the reference rounds the new moments bf16(float(.)) as
 * optimizer.c's adamw_update_bf16, and moves the parameter by the unrounded ones). The kernel computes in fp32, so a
 * bf16 moment at a rounding boundary may land one bf16 step from the reference's: none further, at most 0.1%.
 * sharded: the distributed optimizer's form: every other chunk only (this rank's parts), their moments and fp32
 * master one after another in a shard (CudaAdamWChunk.state, params_sharded), the bf16 copy written at the flat
 * index; the other parameters' bf16 copy must be left as it was. */
static void test_adamw(Rng *rng, long n, bool bf16_states, bool sharded) {
    printf("adamw n=%ld (2 parameters, chunked), %s moments%s\n", n, bf16_states ? "bf16" : "fp32",
           sharded ? ", every other chunk with its moments and master in a shard" : "");
    /* fp32 gradients, as the backward gives (bf16 ones would put the new bf16 moments on exact rounding ties
     * often: (9 m + g) / 10 of two 8-bit significands) */
    float *p = rand_bf16_values(rng, n, 1.0), *g = malloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) g[i] = (float)(0.1 * rng_normal(rng));
    float *m = rand_bf16_values(rng, n, 0.01), *v = malloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) v[i] = round_bf16(fabsf(g[i]) * 0.01f);
    const long split = n / 3;
    CudaAdamWArgs args = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f, .grad_scale = 0.5f};
    cuda_adamw_set_step(&args, 7);
    int nchunks = 0, all = 0;
    CudaAdamWChunk chunks[64];
    long *idx = malloc((size_t)n * sizeof(long)), S = 0; /* shard place -> flat index */
    bool *owned = calloc((size_t)n, sizeof(bool));
    for (long start = 0; start < n; all++) {
        const long end = start < split ? split : n, len = end - start < MT_ADAMW_CHUNK ? end - start : MT_ADAMW_CHUNK;
        if (!sharded || all % 2 == 0) {
            chunks[nchunks++] = (CudaAdamWChunk){.offset = (size_t)start, .length = (unsigned)len,
                                                 .decay = start >= split, .state = sharded ? (size_t)S : (size_t)start};
            for (long i = start; i < start + len; i++) idx[S++] = i, owned[i] = true;
        }
        start += len;
    }
    float *rp = malloc((size_t)n * sizeof(float)), *rm = malloc((size_t)n * sizeof(float));
    float *rv = malloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) {
        double decay = i < split ? 1.0 : 1.0 - 1e-3 * 0.1, gi = g[i] * 0.5;
        double mi = 0.9 * m[i] + 0.1 * gi, vi = 0.95 * v[i] + 0.05 * gi * gi;
        double bc1 = 1.0 - pow(0.9, 7), bc2 = 1.0 - pow(0.95, 7);
        rp[i] = owned[i] ? (float)(p[i] * decay - 1e-3 * (mi / bc1) / (sqrt(vi / bc2) + 1e-8)) : p[i];
        rm[i] = bf16_states ? round_bf16((float)mi) : (float)mi;
        rv[i] = bf16_states ? round_bf16((float)vi) : (float)vi;
    }
    /* the moments as the kernel holds them: shard place j is flat index idx[j] */
    float *m_in = malloc((size_t)S * sizeof(float)), *v_in = malloc((size_t)S * sizeof(float));
    float *p_in = malloc((size_t)n * sizeof(float)); /* the master: the flat array, or the shard */
    for (long j = 0; j < S; j++) m_in[j] = m[idx[j]], v_in[j] = v[idx[j]];
    for (long i = 0; i < (sharded ? S : n); i++) p_in[i] = sharded ? p[idx[i]] : p[i];
    float *d_p = dev_f32(p_in, sharded ? S : n), *d_g = dev_f32(g, n);
    void *d_m = bf16_states ? (void *)dev_bf16(m_in, S) : (void *)dev_f32(m_in, S);
    void *d_v = bf16_states ? (void *)dev_bf16(v_in, S) : (void *)dev_f32(v_in, S);
    uint16_t *d_p16 = dev_bf16(p, n);
    CudaAdamWChunk *d_chunks = dev_copy(chunks, (size_t)nchunks * sizeof *chunks);
    CHECK_CUDA(cuda_adamw_step_chunks(d_p, sharded, d_g, d_m, d_v, bf16_states, d_p16, d_chunks, nchunks, &args, 0));
    float *g_p = malloc((size_t)n * sizeof(float)), *g_p16 = host_from_bf16(d_p16, n);
    float *g_master = host_from_f32(d_p, sharded ? S : n);
    for (long i = 0; i < n; i++) g_p[i] = sharded ? p[i] : g_master[i]; /* the master back at the flat index */
    for (long j = 0; sharded && j < S; j++) g_p[idx[j]] = g_master[j];
    float *g_m = bf16_states ? host_from_bf16(d_m, S) : host_from_f32(d_m, S);
    float *g_v = bf16_states ? host_from_bf16(d_v, S) : host_from_f32(d_v, S);
    check("params (fp32)", rel_max(g_p, rp, n), 1e-6);
    check("params bf16 copy", rel_max(g_p16, rp, n), 4e-3);
    if (sharded) {
        long touched = 0;
        for (long i = 0; i < n; i++) touched += !owned[i] && g_p16[i] != round_bf16(p[i]);
        check("bf16 copies outside the chunks changed", (double)touched, 0.0);
    }
    /* the updates alone (relative L2): the step taken with the rounded new moments instead of the unrounded ones
     * would be about 2^-10 off */
    float *got_step = malloc((size_t)S * sizeof(float)), *ref_step = malloc((size_t)S * sizeof(float));
    for (long j = 0; j < S; j++) got_step[j] = g_p[idx[j]] - p[idx[j]], ref_step[j] = rp[idx[j]] - p[idx[j]];
    check("the updates (relative L2)", rel_l2(got_step, ref_step, S), 1e-4);
    free(got_step), free(ref_step);
    float *want_m = malloc((size_t)S * sizeof(float)), *want_v = malloc((size_t)S * sizeof(float));
    for (long j = 0; j < S; j++) want_m[j] = rm[idx[j]], want_v[j] = rv[idx[j]];
    if (bf16_states) {
        long off = 0, far = 0;
        for (long i = 0; i < 2 * S; i++) {
            const long j = i % S, k = idx[j];
            const float got = i < S ? g_m[j] : g_v[j], ref = i < S ? want_m[j] : want_v[j];
            const double gk = 0.5 * g[k]; /* fp32 arithmetic's error: the terms' size times 1e-6 (beta1 and 1 - beta1
                                            * in fp32 are 2.4e-7 off, and three roundings), which matters where m's
                                            * two terms nearly cancel */
            const double terms = i < S ? 0.9 * fabs(m[k]) + 0.1 * fabs(gk) : 0.95 * v[k] + 0.05 * gk * gk;
            off += got != ref;
            far += !(fabs((double)got - ref) <= fabs(ref) * 0x1p-7 + 1e-6 * terms); /* a bf16 step: 2^-7 of it or less */
        }
        printf("  bf16 moments: %ld of %ld not equal, %ld further than one bf16 step and fp32's error\n", off, 2 * S, far);
        check("moments further than one bf16 step (+ fp32's error)", (double)far, 0.0);
        check("share of moments not equal", (double)off / (double)(2 * S), 1e-3);
    } else {
        check("m (fp32)", rel_max(g_m, want_m, S), 1e-6);
        check("v (fp32)", rel_max(g_v, want_v, S), 1e-6);
    }
    cudaFree(d_p); cudaFree(d_g); cudaFree(d_m); cudaFree(d_v); cudaFree(d_p16); cudaFree(d_chunks);
    free(p); free(g); free(m); free(v); free(rp); free(rm); free(rv); free(g_p); free(g_p16); free(g_m); free(g_v);
    free(idx); free(owned); free(m_in); free(v_in); free(p_in); free(g_master); free(want_m); free(want_v);
}

static void test_sum_squares(Rng *rng, long n) {
    printf("sum_squares n=%ld\n", n);
    float *x = rand_bf16_values(rng, n, 1.0);
    double ref = 0.0;
    for (long i = 0; i < n; i++) ref += (double)x[i] * x[i];
    float *d_x = dev_f32(x, n);
    double *d_part, part[256], got = 0.0;
    CHECK_CUDA(cudaMalloc((void **)&d_part, sizeof part));
    CHECK_CUDA(cudaMemset(d_part, 0xff, sizeof part)); /* NaN: every partial must be written, those of no block 0 */
    CHECK_CUDA(cuda_sum_squares(d_part, 256, d_x, (size_t)n, 0));
    CHECK_CUDA(cudaMemcpy(part, d_part, sizeof part, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 256; i++) got += part[i];
    check("sum of squares", fabs(got - ref) / ref, 1e-6);
    cudaFree(d_x); cudaFree(d_part); free(x);
}

/* Vocab-parallel cross entropy (tensor parallel) on one GPU: the logits cut
 * into `ranks` column blocks, each block's stats, the gathered stats merged:
 * the same losses as the whole vocabulary's, and each block's backward equal
 * to those columns of the whole backward. */
static void test_cross_entropy_columns(Rng *rng, int N, int V, int ranks) {
    printf("cross_entropy vocab-parallel N=%d V=%d ranks=%d\n", N, V, ranks);
    const int Vr = V / ranks;
    float *logits, *losses, *dl;
    int32_t *targets;
    const float dloss = 0.37f;
    cross_entropy_case(rng, N, V, dloss, &logits, &targets, &losses, &dl);
    float *block = malloc((size_t)N * Vr * sizeof(float)), *dl_block = malloc((size_t)N * Vr * sizeof(float));
    int32_t *d_targets = dev_copy(targets, (size_t)N * sizeof(int32_t));
    float *d_gathered = dev_f32(NULL, (long)ranks * N * 3), *d_losses = dev_f32(NULL, N), *d_lse = dev_f32(NULL, N);
    uint16_t **d_blocks = malloc((size_t)ranks * sizeof *d_blocks);
    for (int r = 0; r < ranks; r++) {
        for (int n = 0; n < N; n++) memcpy(block + (size_t)n * Vr, logits + (size_t)n * V + (size_t)r * Vr, (size_t)Vr * sizeof(float));
        d_blocks[r] = dev_bf16(block, (long)N * Vr);
        CHECK_CUDA(cuda_cross_entropy_stats(d_gathered + (size_t)r * N * 3, d_blocks[r], d_targets, r * Vr, N, Vr, 0));
    }
    CHECK_CUDA(cuda_cross_entropy_combine(d_losses, d_lse, d_gathered, d_targets, N, ranks, 0));
    float *g_losses = host_from_f32(d_losses, N);
    check("forward losses merged over the blocks", rel_max(g_losses, losses, N), 1e-5);
    double worst = 0.0;
    for (int r = 0; r < ranks; r++) {
        CHECK_CUDA(cuda_cross_entropy_backward_columns(d_blocks[r], d_lse, d_targets, r * Vr, dloss, N, Vr, 0));
        float *g_dl = host_from_bf16(d_blocks[r], (long)N * Vr);
        for (int n = 0; n < N; n++) memcpy(dl_block + (size_t)n * Vr, dl + (size_t)n * V + (size_t)r * Vr, (size_t)Vr * sizeof(float));
        const double e = rel_max(g_dl, dl_block, (long)N * Vr);
        if (!(e <= worst)) worst = e;
        free(g_dl);
        cudaFree(d_blocks[r]);
    }
    check("backward of every block's columns", worst, 8e-3);
    cudaFree(d_targets); cudaFree(d_gathered); cudaFree(d_losses); cudaFree(d_lse);
    free(d_blocks); free(logits); free(targets); free(losses); free(dl); free(block); free(dl_block); free(g_losses);
}

/* The vocab-parallel embedding: the ranks' row blocks, their outputs summed, give the whole lookup;
 * each block's backward adds exactly its rows of the whole backward. */
static void test_embedding_rows(Rng *rng, int N, int V, int C, int ranks) {
    printf("embedding vocab-parallel N=%d V=%d C=%d ranks=%d\n", N, V, C, ranks);
    const int Vr = V / ranks;
    float *table = rand_bf16_values(rng, (long)V * C, 1.0), *dout = rand_bf16_values(rng, (long)N * C, 1.0);
    int32_t *tokens = malloc((size_t)N * sizeof(int32_t));
    for (int n = 0; n < N; n++) tokens[n] = (int32_t)rng_below(rng, (uint64_t)V);
    float *out = malloc((size_t)N * C * sizeof(float)), *dtable = calloc((size_t)V * C, sizeof(float));
    cpu_backend.embedding_forward(out, tokens, table, N, C);
    cpu_backend.embedding_backward(dtable, dout, tokens, N, C);
    float *sum = calloc((size_t)N * C, sizeof(float)), *got_dtable = malloc((size_t)V * C * sizeof(float));
    float *d_dout = dev_f32(dout, (long)N * C);
    int32_t *d_tokens = dev_copy(tokens, (size_t)N * sizeof(int32_t));
    uint16_t *d_out = dev_bf16(out, (long)N * C);
    for (int r = 0; r < ranks; r++) {
        uint16_t *d_table = dev_bf16(table + (size_t)r * Vr * C, (long)Vr * C);
        float *d_dtable = dev_f32(NULL, (long)Vr * C);
        CHECK_CUDA(cuda_embedding_forward_rows(d_out, d_tokens, d_table, r * Vr, Vr, N, C, 0));
        CHECK_CUDA(cuda_embedding_backward_rows(d_dtable, d_dout, d_tokens, r * Vr, Vr, N, C, 0));
        float *g_out = host_from_bf16(d_out, (long)N * C), *g_dt = host_from_f32(d_dtable, (long)Vr * C);
        for (long i = 0; i < (long)N * C; i++) sum[i] += g_out[i]; /* one block holds each token: exact */
        memcpy(got_dtable + (size_t)r * Vr * C, g_dt, (size_t)Vr * C * sizeof(float));
        free(g_out); free(g_dt);
        cudaFree(d_table); cudaFree(d_dtable);
    }
    check("forward: the blocks' rows summed (exact)", rel_max(sum, out, (long)N * C), 0.0);
    check("backward: each block its rows (fp32 atomics)", rel_max(got_dtable, dtable, (long)V * C), 1e-6);
    cudaFree(d_dout); cudaFree(d_tokens); cudaFree(d_out);
    free(table); free(dout); free(tokens); free(out); free(dtable); free(sum); free(got_dtable);
}

/* The sum of squares over a chunk list (the grad norm of the parameters a tp rank counts). */
static void test_sum_squares_chunks(Rng *rng, long n) {
    printf("sum_squares over chunks n=%ld\n", n);
    float *x = rand_bf16_values(rng, n, 1.0);
    CudaAdamWChunk chunks[64];
    int nchunks = 0;
    double ref = 0.0;
    for (long start = 0; start < n && nchunks < 64; start += 3 * (long)MT_ADAMW_CHUNK / 2) { /* every other half-gap */
        const long len = n - start < MT_ADAMW_CHUNK ? n - start : MT_ADAMW_CHUNK;
        chunks[nchunks++] = (CudaAdamWChunk){(size_t)start, (unsigned)len, 1, (size_t)start};
        for (long i = start; i < start + len; i++) ref += (double)x[i] * x[i];
    }
    float *d_x = dev_f32(x, n);
    CudaAdamWChunk *d_chunks = dev_copy(chunks, (size_t)nchunks * sizeof *chunks);
    double *d_part, part[256], got = 0.0;
    CHECK_CUDA(cudaMalloc((void **)&d_part, sizeof part));
    CHECK_CUDA(cudaMemset(d_part, 0xff, sizeof part)); /* NaN: a block a chunk, the partials past them 0 */
    CHECK_CUDA(cuda_sum_squares_chunks(d_part, 256, d_x, d_chunks, nchunks, 0));
    CHECK_CUDA(cudaMemcpy(part, d_part, sizeof part, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 256; i++) got += part[i];
    check("sum of squares of the chunks only", fabs(got - ref) / ref, 1e-6);
    cudaFree(d_x); cudaFree(d_chunks); cudaFree(d_part); free(x);
}

static void test_add(Rng *rng, long n) {
    printf("add_bf16 n=%ld\n", n);
    float *a = rand_bf16_values(rng, n, 1.0), *b = rand_bf16_values(rng, n, 1.0), *ref = malloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) ref[i] = round_bf16(a[i] + b[i]);
    uint16_t *d_a = dev_bf16(a, n), *d_b = dev_bf16(b, n);
    CHECK_CUDA(cuda_add_bf16(d_a, d_a, d_b, (size_t)n, 0)); /* in place, as the model calls it */
    float *got = host_from_bf16(d_a, n);
    check("a + b rounded once (exact)", rel_max(got, ref, n), 0.0);
    cudaFree(d_a); cudaFree(d_b); free(a); free(b); free(ref); free(got);
}

static void test_scale(Rng *rng, long n) {
    printf("scale_f32 n=%ld\n", n);
    float *x = rand_bf16_values(rng, n, 1.0), *ref = malloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) ref[i] = x[i] * 0.25f;
    float *d_x = dev_f32(x, n);
    CHECK_CUDA(cuda_scale_f32(d_x, 0.25f, (size_t)n, 0)); /* the experts' gradients under ep: times 1 / ep */
    float *got = host_from_f32(d_x, n);
    check("x * 0.25 in place (exact)", rel_max(got, ref, n), 0.0);
    cudaFree(d_x); free(x); free(ref); free(got);
}

/* Attention at query positions against its CPU reference: Tq rows at pos (non-decreasing, < Tk) against Tk keys. */
static void check_attention_at(Rng *rng, int B, int Tq, int Tk, const int32_t *pos, int H, int KVH, int D) {
    const long nq = (long)B * Tq * H * D, nk = (long)B * Tk * KVH * D;
    float *q = rand_bf16_values(rng, nq, 1.0), *k = rand_bf16_values(rng, nk, 1.0), *v = rand_bf16_values(rng, nk, 1.0);
    float *dout = rand_bf16_values(rng, nq, 1.0);
    float *out = malloc((size_t)nq * sizeof(float)), *probs = malloc((size_t)B * H * Tq * Tk * sizeof(float));
    cpu_backend.attention_forward_at(out, probs, q, k, v, pos, B, Tq, Tk, H, KVH, D);
    float *dq = calloc((size_t)nq, sizeof(float)), *dk = calloc((size_t)nk, sizeof(float));
    float *dv = calloc((size_t)nk, sizeof(float));
    cpu_backend.attention_backward_at(dq, dk, dv, dout, probs, q, k, v, pos, B, Tq, Tk, H, KVH, D);
    uint16_t *d_q = dev_bf16(q, nq), *d_k = dev_bf16(k, nk), *d_v = dev_bf16(v, nk), *d_dout = dev_bf16(dout, nq);
    uint16_t *d_out = dev_bf16(dout, nq), *d_dq = dev_bf16(dout, nq);
    /* dk, dv start as garbage: the kernel overwrites every key, seen or not */
    float *junk = malloc((size_t)nk * sizeof(float));
    for (long i = 0; i < nk; i++) junk[i] = 7.0f;
    float *d_lse = dev_f32(NULL, (long)B * H * Tq), *d_dk = dev_f32(junk, nk), *d_dv = dev_f32(junk, nk);
    free(junk);
    int32_t *d_pos = dev_copy(pos, (size_t)Tq * sizeof(int32_t));
    void *d_ws = NULL;
    CHECK_CUDA(cudaMalloc(&d_ws, cuda_attention_workspace_bytes(B, Tq, H, KVH, D)));
    CHECK_CUDA(cuda_attention_forward_at(d_out, d_lse, d_q, d_k, d_v, d_pos, B, Tq, Tk, H, KVH, D, 0));
    CHECK_CUDA(cuda_attention_backward_at(d_dq, d_dk, d_dv, d_dout, d_out, d_lse, d_q, d_k, d_v, d_pos, B, Tq, Tk, H,
                                          KVH, D, d_ws, 0));
    float *g_out = host_from_bf16(d_out, nq), *g_dq = host_from_bf16(d_dq, nq), *g_dk = host_from_f32(d_dk, nk);
    float *g_dv = host_from_f32(d_dv, nk);
    check("forward", rel_max(g_out, out, nq), 1e-2);
    check("backward dq", rel_l2(g_dq, dq, nq), 2e-2);
    check("backward dk (fp32)", rel_l2(g_dk, dk, nk), 2e-2);
    check("backward dv (fp32)", rel_l2(g_dv, dv, nk), 2e-2);
    cudaFree(d_q); cudaFree(d_k); cudaFree(d_v); cudaFree(d_dout); cudaFree(d_out); cudaFree(d_dq); cudaFree(d_dk);
    cudaFree(d_dv); cudaFree(d_lse); cudaFree(d_pos); cudaFree(d_ws);
    free(q); free(k); free(v); free(dout); free(out); free(probs); free(dq); free(dk); free(dv);
    free(g_out); free(g_dq); free(g_dk); free(g_dv);
}

/* Context parallel: rank cp_rank's positions of a sequence of Tq * cp tokens against the keys of the whole
 * sequence. */
static void test_attention_at(Rng *rng, int B, int Tq, int cp, int cp_rank, int H, int KVH, int D) {
    const int Tk = Tq * cp;
    printf("attention at positions B=%d Tq=%d Tk=%d (cp %d, rank %d) H=%d KVH=%d D=%d\n", B, Tq, Tk, cp, cp_rank, H,
           KVH, D);
    int32_t *pos = malloc((size_t)Tq * sizeof(int32_t));
    model_cp_positions(Tq, cp, cp_rank, pos);
    check_attention_at(rng, B, Tq, Tk, pos, H, KVH, D);
    free(pos);
}

/* Positions with gaps and repeats (the kernel's contract: non-decreasing), the last keys seen by no query. */
static void test_attention_at_gaps(Rng *rng, int Tq, int Tk, int H, int KVH, int D) {
    printf("attention at sorted positions with repeats Tq=%d Tk=%d H=%d KVH=%d D=%d\n", Tq, Tk, H, KVH, D);
    int32_t *pos = malloc((size_t)Tq * sizeof(int32_t));
    int p = 0;
    for (int t = 0; t < Tq; t++) {
        pos[t] = p;
        p += (int)rng_below(rng, 4); /* 0: a repeat */
        if (p > Tk - 20) p = Tk - 20;
    }
    check_attention_at(rng, 1, Tq, Tk, pos, H, KVH, D);
    free(pos);
}

/* Positions 0..T-1 against the dense kernel: the same tiles in the same order, so the forward is bit-identical and
 * dK, dV (fp32 here) round to the dense kernel's bf16. */
static void test_attention_at_identity(Rng *rng, int B, int T, int H, int KVH, int D) {
    printf("attention at positions 0..T-1 against the dense kernel B=%d T=%d H=%d KVH=%d D=%d\n", B, T, H, KVH, D);
    const long nq = (long)B * T * H * D, nk = (long)B * T * KVH * D;
    float *q = rand_bf16_values(rng, nq, 1.0), *k = rand_bf16_values(rng, nk, 1.0), *v = rand_bf16_values(rng, nk, 1.0);
    float *dout = rand_bf16_values(rng, nq, 1.0);
    int32_t *pos = malloc((size_t)T * sizeof(int32_t));
    for (int t = 0; t < T; t++) pos[t] = t;
    uint16_t *d_q = dev_bf16(q, nq), *d_k = dev_bf16(k, nk), *d_v = dev_bf16(v, nk), *d_dout = dev_bf16(dout, nq);
    uint16_t *d_out = dev_bf16(dout, nq), *d_out_at = dev_bf16(dout, nq), *d_dq = dev_bf16(dout, nq);
    uint16_t *d_dk16 = dev_bf16(k, nk), *d_dv16 = dev_bf16(v, nk);
    float *d_lse = dev_f32(NULL, (long)B * H * T), *d_lse_at = dev_f32(NULL, (long)B * H * T);
    float *d_dk = dev_f32(NULL, nk), *d_dv = dev_f32(NULL, nk);
    int32_t *d_pos = dev_copy(pos, (size_t)T * sizeof(int32_t));
    void *d_ws = NULL;
    CHECK_CUDA(cudaMalloc(&d_ws, cuda_attention_workspace_bytes(B, T, H, KVH, D)));
    CHECK_CUDA(cuda_attention_forward(d_out, d_lse, d_q, d_k, d_v, B, T, H, KVH, D, 0));
    CHECK_CUDA(cuda_attention_forward_at(d_out_at, d_lse_at, d_q, d_k, d_v, d_pos, B, T, T, H, KVH, D, 0));
    CHECK_CUDA(cuda_attention_backward(d_dq, d_dk16, d_dv16, d_dout, d_out, d_lse, d_q, d_k, d_v, B, T, H, KVH, D, d_ws,
                                       0));
    CHECK_CUDA(cuda_attention_backward_at(d_dq, d_dk, d_dv, d_dout, d_out, d_lse, d_q, d_k, d_v, d_pos, B, T, T, H, KVH,
                                          D, d_ws, 0));
    float *out = host_from_bf16(d_out, nq), *out_at = host_from_bf16(d_out_at, nq);
    float *lse = host_from_f32(d_lse, (long)B * H * T), *lse_at = host_from_f32(d_lse_at, (long)B * H * T);
    float *dk16 = host_from_bf16(d_dk16, nk), *dv16 = host_from_bf16(d_dv16, nk);
    float *dk = host_from_f32(d_dk, nk), *dv = host_from_f32(d_dv, nk);
    for (long i = 0; i < nk; i++) dk[i] = round_bf16(dk[i]), dv[i] = round_bf16(dv[i]);
    check("forward out identical", rel_max(out_at, out, nq), 0.0);
    check("forward lse identical", rel_max(lse_at, lse, (long)B * H * T), 0.0);
    check("dk rounded to bf16 identical", rel_max(dk, dk16, nk), 0.0);
    check("dv rounded to bf16 identical", rel_max(dv, dv16, nk), 0.0);
    cudaFree(d_q); cudaFree(d_k); cudaFree(d_v); cudaFree(d_dout); cudaFree(d_out); cudaFree(d_out_at); cudaFree(d_dq);
    cudaFree(d_dk16); cudaFree(d_dv16); cudaFree(d_lse); cudaFree(d_lse_at); cudaFree(d_dk); cudaFree(d_dv);
    cudaFree(d_pos); cudaFree(d_ws);
    free(q); free(k); free(v); free(dout); free(pos); free(out); free(out_at); free(lse); free(lse_at); free(dk16);
    free(dv16); free(dk); free(dv);
}

/* The cp reordering: blocks -> sequence order -> blocks is the identity; sequence order puts rank r's row t at
 * its position. */
static void test_cp_permute(int cp, int B, int T, int W) {
    printf("cp reorder cp=%d B=%d T=%d W=%d\n", cp, B, T, W);
    const long n = (long)cp * B * T * W;
    int32_t *seq_pos = malloc((size_t)cp * T * sizeof(int32_t));
    for (int r = 0; r < cp; r++) model_cp_positions(T, cp, r, seq_pos + (size_t)r * T);
    float *blocks = malloc((size_t)n * sizeof(float)), *want = malloc((size_t)n * sizeof(float));
    for (long i = 0; i < n; i++) blocks[i] = (float)(i % 251); /* exact in bf16 */
    for (int r = 0; r < cp; r++)
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int e = 0; e < W; e++)
                    want[((size_t)b * T * cp + seq_pos[r * T + t]) * W + e] = blocks[(((size_t)r * B + b) * T + t) * W + e];
    uint16_t *d_blocks = dev_bf16(blocks, n), *d_all = dev_bf16(blocks, n);
    int32_t *d_pos = dev_copy(seq_pos, (size_t)cp * T * sizeof(int32_t));
    CHECK_CUDA(cuda_cp_to_sequence(d_all, d_blocks, d_pos, cp, B, T, W, 0));
    float *all = host_from_bf16(d_all, n);
    check("to sequence order (exact)", rel_max(all, want, n), 0.0);
    float *d_all32 = dev_f32(all, n), *d_back = dev_f32(NULL, n);
    CHECK_CUDA(cuda_cp_from_sequence(d_back, d_all32, d_pos, cp, B, T, W, 0));
    float *back = host_from_f32(d_back, n);
    check("back to the blocks (exact)", rel_max(back, blocks, n), 0.0);
    cudaFree(d_blocks); cudaFree(d_all); cudaFree(d_pos); cudaFree(d_all32); cudaFree(d_back);
    free(seq_pos); free(blocks); free(want); free(all); free(back);
}

int main(void) {
    char err[512];
    if (cuda_context_create(&ctx, 0, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 77;
    }
    Rng rng;
    rng_seed(&rng, 42);
    test_gemm(&rng, 37, 64, 48, 0);
    test_gemm(&rng, 129, 256, 96, 1);
    test_rmsnorm(&rng, 33, 96);
    test_rmsnorm(&rng, 9, 40); /* a short row: 2 warps, some lanes with no column */
    test_rmsnorm(&rng, 8, 2048);
    test_qkv_rope(&rng, 2, 9, 4, 2, 32, 0);
    test_qkv_rope(&rng, 2, 9, 4, 2, 128, 1);
    test_qkv_rope(&rng, 1, 5, 2, 1, 16, 1);
    test_swiglu(&rng, 17, 100);   /* scalar path */
    test_swiglu(&rng, 9, 256);    /* 8-wide path */
    test_cross_entropy(&rng, 23, 1000);
    test_cross_entropy(&rng, 7, 1001); /* scalar path */
    test_cross_entropy(&rng, 6, 40);   /* a short row: one warp */
    test_cross_entropy(&rng, 4, 151936);
    test_attention(&rng, 2, 37, 4, 2, 16);
    test_attention(&rng, 1, 130, 4, 1, 64);
    test_attention(&rng, 1, 70, 2, 2, 128);
    test_attention(&rng, 1, 300, 2, 1, 32);
    test_embedding(&rng, 100, 64, 48);
    test_adamw(&rng, 300000, false, false);
    test_adamw(&rng, 300000, true, false);
    test_adamw(&rng, 300000, false, true);
    test_adamw(&rng, 300000, true, true);
    test_sum_squares(&rng, 1000003);
    test_sum_squares(&rng, 5000); /* 10 blocks of the 256 partials */
    test_cross_entropy_columns(&rng, 23, 1000, 2);
    test_cross_entropy_columns(&rng, 9, 1024, 4);   /* 8-wide path */
    test_cross_entropy_columns(&rng, 5, 151936, 2);
    test_embedding_rows(&rng, 100, 64, 48, 2);
    test_embedding_rows(&rng, 77, 128, 64, 4);
    test_sum_squares_chunks(&rng, 1000003);
    test_add(&rng, 100003);
    test_scale(&rng, 100003);
    test_attention_at(&rng, 2, 32, 2, 0, 4, 2, 16);
    test_attention_at(&rng, 1, 40, 2, 1, 4, 1, 64);
    test_attention_at(&rng, 2, 24, 4, 2, 2, 2, 128);
    test_attention_at(&rng, 1, 150, 2, 1, 2, 1, 32); /* more than one key tile; tiles across the chunks' seam */
    test_attention_at(&rng, 1, 256, 2, 0, 4, 2, 64);  /* several query tiles of each chunk */
    test_attention_at(&rng, 1, 200, 2, 1, 2, 1, 128);
    test_attention_at(&rng, 1, 96, 4, 3, 2, 2, 64);    /* rank 3 of 4: chunks 3 and 4 of 8 */
    test_attention_at_gaps(&rng, 150, 420, 4, 2, 32);
    test_attention_at_gaps(&rng, 70, 300, 2, 1, 128);
    test_attention_at_identity(&rng, 1, 130, 4, 2, 64);
    test_attention_at_identity(&rng, 2, 70, 2, 1, 128);
    test_cp_permute(2, 2, 8, 48);
    test_cp_permute(4, 1, 6, 32);
    cuda_gemm_cache_clear();
    cuda_context_destroy(&ctx);
    printf("\n%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
