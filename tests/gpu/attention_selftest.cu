// attention_selftest.cu: standalone check of kernels/attention.cu against a
// straightforward fp64 CPU reference (explicit softmax probabilities, O(T^2)),
// computed from the same bf16-rounded inputs, then a timing section (the
// dense kernels, and the context-parallel form at a rank's positions).
//
// Build and run (needs a GPU):
//   nvcc -O3 -std=c++17 -arch=sm_90 tests/gpu/attention_selftest.cu kernels/attention.cu -o build/attention_selftest
//   build/attention_selftest            (exit 1 on any FAIL; --no-timing skips the timing)
//
// Tolerance per tensor: max |gpu - ref| <= 2e-2 * max |ref| + 1e-3 (bf16
// inputs and outputs, bf16 probabilities in the products, fp32 accumulation).
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "../../src/backend/cuda/cuda_kernels.h"

#define CHECK_CUDA(call)                                                                                   \
    do {                                                                                                   \
        cudaError_t e_ = (call);                                                                           \
        if (e_ != cudaSuccess) {                                                                           \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));         \
            exit(1);                                                                                       \
        }                                                                                                  \
    } while (0)

static const double kTolRel = 2e-2, kTolAbs = 1e-3;

// ---- host bf16 --------------------------------------------------------------

static uint16_t to_bf16(float f) {  // round to nearest even, as __float2bfloat16_rn
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

static float from_bf16(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double rand_uniform(void) {  // [0, 1), xorshift64*
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545f4914f6cdd1dull) >> 11) * (1.0 / 9007199254740992.0);
}

// n bf16 values uniform in [-amp, amp): raw bits and their float values.
static void rand_bf16(uint16_t *bits, float *vals, size_t n, double amp) {
    for (size_t i = 0; i < n; i++) {
        bits[i] = to_bf16((float)((2.0 * rand_uniform() - 1.0) * amp));
        vals[i] = from_bf16(bits[i]);
    }
}

// ---- fp64 reference ---------------------------------------------------------

struct Shape {
    int B, T, H, KVH, D;
};

// out (B,T,H,D), lse (B,H,T), dq (B,T,H,D), dk, dv (B,T,KVH,D)
static void reference(const Shape &s, const float *q, const float *k, const float *v, const float *dout, double *out,
                      double *lse, double *dq, double *dk, double *dv) {
    const int B = s.B, T = s.T, H = s.H, KVH = s.KVH, D = s.D, group = H / KVH;
    const double scale = (double)(float)(1.0 / sqrt((double)D));  // the kernels' fp32 scale
    const size_t nq = (size_t)B * T * H * D, nkv = (size_t)B * T * KVH * D;
    memset(dq, 0, nq * sizeof(double));
    memset(dk, 0, nkv * sizeof(double));
    memset(dv, 0, nkv * sizeof(double));
    double *p = (double *)malloc((size_t)T * T * sizeof(double));   // probs of one (b, h)
    double *dp = (double *)malloc((size_t)T * sizeof(double));
#define QI(b, t, h) ((((size_t)(b) * T + (t)) * H + (h)) * D)
#define KI(b, t, g) ((((size_t)(b) * T + (t)) * KVH + (g)) * D)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < H; h++) {
            const int g = h / group;
            for (int t = 0; t < T; t++) {
                double *prow = p + (size_t)t * T, mx = -INFINITY;
                for (int u = 0; u <= t; u++) {
                    double dot = 0.0;
                    for (int d = 0; d < D; d++) dot += (double)q[QI(b, t, h) + d] * k[KI(b, u, g) + d];
                    prow[u] = dot * scale;
                    if (prow[u] > mx) mx = prow[u];
                }
                double sum = 0.0;
                for (int u = 0; u <= t; u++) sum += (prow[u] = exp(prow[u] - mx));
                lse[((size_t)b * H + h) * T + t] = mx + log(sum);
                for (int u = 0; u <= t; u++) prow[u] /= sum;
                for (int d = 0; d < D; d++) {
                    double acc = 0.0;
                    for (int u = 0; u <= t; u++) acc += prow[u] * v[KI(b, u, g) + d];
                    out[QI(b, t, h) + d] = acc;
                }
                // backward of this row
                double rowsum = 0.0;
                for (int u = 0; u <= t; u++) {
                    double dot = 0.0;
                    for (int d = 0; d < D; d++) dot += (double)dout[QI(b, t, h) + d] * v[KI(b, u, g) + d];
                    dp[u] = dot;
                    rowsum += prow[u] * dot;
                }
                for (int u = 0; u <= t; u++) {
                    const double ds = prow[u] * (dp[u] - rowsum);
                    for (int d = 0; d < D; d++) {
                        dq[QI(b, t, h) + d] += scale * ds * k[KI(b, u, g) + d];
                        dk[KI(b, u, g) + d] += scale * ds * q[QI(b, t, h) + d];
                        dv[KI(b, u, g) + d] += prow[u] * dout[QI(b, t, h) + d];
                    }
                }
            }
        }
    }
#undef QI
#undef KI
    free(p);
    free(dp);
}

// ---- comparison ---------------------------------------------------------------

static bool compare(const char *name, const float *got, const double *ref, size_t n) {
    double err = 0.0, ref_max = 0.0;
    bool finite = true;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) finite = false;
        const double e = fabs((double)got[i] - ref[i]);
        if (e > err) err = e;
        if (fabs(ref[i]) > ref_max) ref_max = fabs(ref[i]);
    }
    const double limit = kTolRel * ref_max + kTolAbs;
    const bool ok = finite && err <= limit;
    printf("    %-4s max|err| %.3e  max|ref| %.3e  err/max|ref| %.3e  limit %.3e  %s%s\n", name, err, ref_max,
           ref_max > 0 ? err / ref_max : err, limit, ok ? "PASS" : "FAIL", finite ? "" : " (non-finite values)");
    return ok;
}

template <typename T>
static T *dev_alloc(size_t n) {
    T *p = nullptr;
    CHECK_CUDA(cudaMalloc((void **)&p, (n ? n : 1) * sizeof(T)));
    return p;
}

static bool check_shape(const Shape &s) {
    const size_t nq = (size_t)s.B * s.T * s.H * s.D, nkv = (size_t)s.B * s.T * s.KVH * s.D;
    const size_t nl = (size_t)s.B * s.H * s.T;
    printf("  B=%d T=%d H=%d KVH=%d D=%d\n", s.B, s.T, s.H, s.KVH, s.D);

    uint16_t *hq = (uint16_t *)malloc(nq * 2), *hk = (uint16_t *)malloc(nkv * 2), *hv = (uint16_t *)malloc(nkv * 2),
             *hdo = (uint16_t *)malloc(nq * 2);
    float *fq = (float *)malloc(nq * 4), *fk = (float *)malloc(nkv * 4), *fv = (float *)malloc(nkv * 4),
          *fdo = (float *)malloc(nq * 4);
    rand_bf16(hq, fq, nq, 2.0);  // scores with a spread of a few units: a peaked, not flat, softmax
    rand_bf16(hk, fk, nkv, 2.0);
    rand_bf16(hv, fv, nkv, 1.0);
    rand_bf16(hdo, fdo, nq, 1.0);

    uint16_t *q = dev_alloc<uint16_t>(nq), *k = dev_alloc<uint16_t>(nkv), *v = dev_alloc<uint16_t>(nkv),
             *dout = dev_alloc<uint16_t>(nq), *out = dev_alloc<uint16_t>(nq), *dq = dev_alloc<uint16_t>(nq),
             *dk = dev_alloc<uint16_t>(nkv), *dv = dev_alloc<uint16_t>(nkv);
    float *lse = dev_alloc<float>(nl);
    const size_t ws_bytes = cuda_attention_workspace_bytes(s.B, s.T, s.H, s.KVH, s.D);
    void *ws = nullptr;
    CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
    CHECK_CUDA(cudaMemcpy(q, hq, nq * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(k, hk, nkv * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(v, hv, nkv * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dout, hdo, nq * 2, cudaMemcpyHostToDevice));
    // poison every output and the workspace (0xff bytes: bf16 and fp32 NaN):
    // everything must be overwritten, nothing may rely on zeroed memory
    CHECK_CUDA(cudaMemset(out, 0xff, nq * 2));
    CHECK_CUDA(cudaMemset(lse, 0xff, nl * 4));
    CHECK_CUDA(cudaMemset(dq, 0xff, nq * 2));
    CHECK_CUDA(cudaMemset(dk, 0xff, nkv * 2));
    CHECK_CUDA(cudaMemset(dv, 0xff, nkv * 2));
    CHECK_CUDA(cudaMemset(ws, 0xff, ws_bytes));

    CHECK_CUDA(cuda_attention_forward(out, lse, q, k, v, s.B, s.T, s.H, s.KVH, s.D, 0));
    CHECK_CUDA(cuda_attention_backward(dq, dk, dv, dout, out, lse, q, k, v, s.B, s.T, s.H, s.KVH, s.D, ws, 0));
    CHECK_CUDA(cudaDeviceSynchronize());

    auto fetch_bf16 = [](const uint16_t *dev, size_t n) {
        uint16_t *tmp = (uint16_t *)malloc(n * 2);
        CHECK_CUDA(cudaMemcpy(tmp, dev, n * 2, cudaMemcpyDeviceToHost));
        float *f = (float *)malloc(n * 4);
        for (size_t i = 0; i < n; i++) f[i] = from_bf16(tmp[i]);
        free(tmp);
        return f;
    };
    float *g_out = fetch_bf16(out, nq), *g_dq = fetch_bf16(dq, nq), *g_dk = fetch_bf16(dk, nkv),
          *g_dv = fetch_bf16(dv, nkv);
    float *g_lse = (float *)malloc(nl * 4);
    CHECK_CUDA(cudaMemcpy(g_lse, lse, nl * 4, cudaMemcpyDeviceToHost));

    double *r_out = (double *)malloc(nq * 8), *r_lse = (double *)malloc(nl * 8), *r_dq = (double *)malloc(nq * 8),
           *r_dk = (double *)malloc(nkv * 8), *r_dv = (double *)malloc(nkv * 8);
    reference(s, fq, fk, fv, fdo, r_out, r_lse, r_dq, r_dk, r_dv);

    bool ok = true;
    ok &= compare("out", g_out, r_out, nq);
    ok &= compare("lse", g_lse, r_lse, nl);
    ok &= compare("dq", g_dq, r_dq, nq);
    ok &= compare("dk", g_dk, r_dk, nkv);
    ok &= compare("dv", g_dv, r_dv, nkv);

    free(hq), free(hk), free(hv), free(hdo), free(fq), free(fk), free(fv), free(fdo);
    free(g_out), free(g_dq), free(g_dk), free(g_dv), free(g_lse);
    free(r_out), free(r_lse), free(r_dq), free(r_dk), free(r_dv);
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(dout), cudaFree(out), cudaFree(dq), cudaFree(dk), cudaFree(dv);
    cudaFree(lse), cudaFree(ws);
    return ok;
}

// The launchers refuse what they do not support.
static bool check_rejects(void) {
    bool ok = true;
    uint16_t *buf = dev_alloc<uint16_t>(4096);
    float *lse = dev_alloc<float>(64);
    ok &= cuda_attention_forward(buf, lse, buf, buf, buf, 1, 4, 2, 1, 48, 0) == cudaErrorInvalidValue;  // D
    ok &= cuda_attention_forward(buf, lse, buf, buf, buf, 1, 4, 3, 2, 16, 0) == cudaErrorInvalidValue;  // H % KVH
    ok &= cuda_attention_backward(buf, buf, buf, buf, buf, lse, buf, buf, buf, 1, 4, 2, 1, 256, buf, 0) ==
          cudaErrorInvalidValue;
    cudaGetLastError();
    cudaFree(buf), cudaFree(lse);
    printf("  invalid D / H %% KVH rejected with cudaErrorInvalidValue: %s\n", ok ? "PASS" : "FAIL");
    return ok;
}

// cp == 1: the dense kernels on s; cp > 1: rank `rank`'s attention at its
// positions (two load-balanced chunks of s.T / cp / 2 rows, as
// model_cp_positions) against the s.T keys, the context-parallel form.
static void time_shape(const Shape &s, int cp = 1, int rank = 0) {
    const int Tq = s.T / cp, Tk = s.T;
    const size_t nq = (size_t)s.B * Tq * s.H * s.D, nkv = (size_t)s.B * Tk * s.KVH * s.D;
    const size_t nl = (size_t)s.B * s.H * Tq;
    uint16_t *host = (uint16_t *)malloc((nq > nkv ? nq : nkv) * 2);
    float *scratch = (float *)malloc((nq > nkv ? nq : nkv) * 4);
    uint16_t *q = dev_alloc<uint16_t>(nq), *k = dev_alloc<uint16_t>(nkv), *v = dev_alloc<uint16_t>(nkv),
             *dout = dev_alloc<uint16_t>(nq), *out = dev_alloc<uint16_t>(nq), *dq = dev_alloc<uint16_t>(nq),
             *dk = dev_alloc<uint16_t>(nkv), *dv = dev_alloc<uint16_t>(nkv);
    float *dk32 = cp > 1 ? dev_alloc<float>(nkv) : nullptr, *dv32 = cp > 1 ? dev_alloc<float>(nkv) : nullptr;
    uint16_t *fill[4] = {q, k, v, dout};
    const size_t sizes[4] = {nq, nkv, nkv, nq};
    for (int i = 0; i < 4; i++) {
        rand_bf16(host, scratch, sizes[i], i < 2 ? 2.0 : 1.0);
        CHECK_CUDA(cudaMemcpy(fill[i], host, sizes[i] * 2, cudaMemcpyHostToDevice));
    }
    // the rank's positions and the (query, key) pairs they see
    int32_t *pos = (int32_t *)malloc((size_t)Tq * sizeof(int32_t));
    double pairs = 0.0;
    for (int t = 0; t < Tq; t++) {
        const int half = Tq / 2;
        pos[t] = cp == 1 ? t : t < half ? rank * half + t : (2 * cp - 1 - rank) * half + (t - half);
        pairs += pos[t] + 1;
    }
    int32_t *d_pos = dev_alloc<int32_t>(Tq);
    CHECK_CUDA(cudaMemcpy(d_pos, pos, (size_t)Tq * sizeof(int32_t), cudaMemcpyHostToDevice));
    float *lse = dev_alloc<float>(nl);
    void *ws = nullptr;
    CHECK_CUDA(cudaMalloc(&ws, cuda_attention_workspace_bytes(s.B, Tq, s.H, s.KVH, s.D)));

    cudaEvent_t start, stop;
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));
    const int warmup = 3, iters = 10;
    float fwd_ms = 0.0f, bwd_ms = 0.0f;
    for (int pass = 0; pass < 2; pass++) {  // 0: forward, 1: backward
        for (int i = 0; i < warmup + iters; i++) {
            if (i == warmup) CHECK_CUDA(cudaEventRecord(start, 0));
            if (pass == 0 && cp == 1)
                CHECK_CUDA(cuda_attention_forward(out, lse, q, k, v, s.B, s.T, s.H, s.KVH, s.D, 0));
            else if (pass == 0)
                CHECK_CUDA(cuda_attention_forward_at(out, lse, q, k, v, d_pos, s.B, Tq, Tk, s.H, s.KVH, s.D, 0));
            else if (cp == 1)
                CHECK_CUDA(cuda_attention_backward(dq, dk, dv, dout, out, lse, q, k, v, s.B, s.T, s.H, s.KVH, s.D,
                                                   ws, 0));
            else
                CHECK_CUDA(cuda_attention_backward_at(dq, dk32, dv32, dout, out, lse, q, k, v, d_pos, s.B, Tq, Tk, s.H,
                                                      s.KVH, s.D, ws, 0));
        }
        CHECK_CUDA(cudaEventRecord(stop, 0));
        CHECK_CUDA(cudaEventSynchronize(stop));
        float ms = 0.0f;
        CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
        (pass == 0 ? fwd_ms : bwd_ms) = ms / iters;
    }
    // causal FLOPs: forward 2 matmuls of 2*D per visible (query, key) pair (T^2/2 of them without cp), backward 2.5x
    const double fwd_flops = 2.0 * 2.0 * s.B * s.H * pairs * s.D, bwd_flops = 2.5 * fwd_flops;
    char what[32] = "";
    if (cp > 1) snprintf(what, sizeof what, " cp %d rank %d", cp, rank);
    printf("  B=%d T=%d H=%d KVH=%d D=%-3d%-12s forward %8.3f ms %7.1f TFLOP/s   backward %8.3f ms %7.1f TFLOP/s\n",
           s.B, s.T, s.H, s.KVH, s.D, what, fwd_ms, fwd_flops / (fwd_ms * 1e-3) / 1e12, bwd_ms,
           bwd_flops / (bwd_ms * 1e-3) / 1e12);

    cudaEventDestroy(start), cudaEventDestroy(stop);
    free(host), free(scratch), free(pos);
    cudaFree(q), cudaFree(k), cudaFree(v), cudaFree(dout), cudaFree(out), cudaFree(dq), cudaFree(dk), cudaFree(dv);
    cudaFree(dk32), cudaFree(dv32), cudaFree(d_pos), cudaFree(lse), cudaFree(ws);
}

int main(int argc, char **argv) {
    bool timing = !(argc > 1 && strcmp(argv[1], "--no-timing") == 0);
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    printf("attention self-test on %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
    printf("tolerance per tensor: max|gpu - ref| <= %.0e * max|ref| + %.0e (ref: fp64 on the bf16 inputs)\n", kTolRel,
           kTolAbs);

    const Shape shapes[] = {
        {2, 77, 4, 2, 16}, {1, 256, 8, 2, 64}, {1, 130, 4, 4, 128}, {1, 1000, 2, 1, 32},
        {1, 1, 2, 1, 64},  // a single position
        {2, 64, 3, 1, 32},  // exactly one tile, a group of 3
        {1, 200, 4, 1, 128},  // a group of 4 at D = 128, partial last tile
    };
    bool ok = true;
    for (const Shape &s : shapes) ok &= check_shape(s);
    ok &= check_rejects();
    printf("correctness: %s\n", ok ? "PASS" : "FAIL");

    if (timing) {
        printf("timing (warm-up 3, mean of 10):\n");
        time_shape({1, 4096, 32, 8, 64});
        time_shape({1, 4096, 16, 8, 128});
        time_shape({2, 4096, 32, 8, 64});  // the training step's shape (Llama 3.2 1B, micro-batch 2)
        // context parallel (issue 18, item 6): a rank's half of a sequence of 8192 against all of its keys, the
        // same TFLOP/s as the dense kernel expected (the pairs counted exactly; ranks 0 and 1 see as many)
        time_shape({1, 8192, 32, 8, 64}, 1, 0);
        time_shape({1, 8192, 32, 8, 64}, 2, 0);
        time_shape({1, 8192, 32, 8, 64}, 2, 1);
        time_shape({1, 8192, 16, 8, 128}, 4, 0);
    }
    return ok ? 0 : 1;
}
