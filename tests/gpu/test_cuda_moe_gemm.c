/* test_cuda_moe_gemm.c: the grouped expert products of the MoE layer
 * (cuda_gemm.h's cuda_grouped_*, each way MEGATRAIN_MOE_GEMM can pick:
 * cublas, cublas_grouped, kernel) against a CPU fp32 reference (OpenBLAS,
 * one product per expert) on random bf16-rounded inputs: the forward, the
 * input gradient with and without accumulate and the fp32 weight gradient
 * accumulated into existing values, with experts of 0 rows, 1 row, all the
 * rows, ragged counts, one weight stack (down) and two (gate|up, the split
 * inside a tile for the small shapes), Qwen3-30B-A3B's and Mixtral 8x7B's
 * expert shapes (on a GPU only), padded leading dimensions (the
 * padding and the rows past the last must stay as they were), and a shape
 * the kernel does not take (a dimension not a multiple of 8: the loop).
 * Then, printed and not checked, the time of each way on the Qwen3-30B-A3B
 * layer (128 experts, hidden 2048, expert intermediate 768, 4096 tokens x
 * top 8 = 32768 rows) with balanced, random top-8 (ragged), skewed and
 * collapsed routing, in
 * TFLOP/s per product (CUDA events), with the ways' outputs compared.
 * Needs a GPU (exit 77 without one). Ends with "N passed, N failed".
 * Arguments: --no-timing (the checks only), --timing-only. */
#include "backend/backend.h"
#include "backend/cuda/cuda_context.h"
#include "backend/cuda/cuda_gemm.h"
#include "backend/cuda/cuda_kernels.h"
#include "core/error.h"
#include "gpu_test_util.h"

static int passed, failed;
static CudaContext ctx;
static const CudaMoeGemm hows[3] = {CUDA_MOE_GEMM_CUBLAS, CUDA_MOE_GEMM_CUBLAS_GROUPED, CUDA_MOE_GEMM_KERNEL};
static const float kSentinel = 768.0f; /* exact in bf16; no product here comes near it */

static void check(const char *what, double err, double limit) {
    if (report(what, err, limit)) passed++;
    else failed++;
}

/* n uniform values in [-scale, scale), rounded to bf16 (xorshift64*: fast enough for the large cases). */
static void fill_uniform(float *a, size_t n, uint64_t *state, float scale) {
    uint64_t x = *state;
    for (size_t i = 0; i < n; i++) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        const uint64_t r = x * 0x2545F4914F6CDD1DULL;
        a[i] = round_bf16(scale * (float)((double)(r >> 11) * (2.0 / 9007199254740992.0) - 1.0));
    }
    *state = x;
}

static float *alloc_floats(size_t n) { return mt_malloc((n > 0 ? n : 1) * sizeof(float)); }

/* Rows row0 .. row0 + rows of each expert's (OC x IC) block of cat, as a device stack (bf16 or fp32). */
static uint16_t *stack_bf16(const float *cat, int E, int OC, int IC, int row0, int rows) {
    float *tmp = alloc_floats((size_t)E * rows * IC);
    for (int e = 0; e < E; e++)
        memcpy(tmp + (size_t)e * rows * IC, cat + ((size_t)e * OC + row0) * IC, (size_t)rows * IC * sizeof(float));
    uint16_t *d = dev_bf16(tmp, (long)E * rows * IC);
    free(tmp);
    return d;
}
static float *stack_f32(const float *cat, int E, int OC, int IC, int row0, int rows) {
    float *tmp = alloc_floats((size_t)E * rows * IC);
    for (int e = 0; e < E; e++)
        memcpy(tmp + (size_t)e * rows * IC, cat + ((size_t)e * OC + row0) * IC, (size_t)rows * IC * sizeof(float));
    float *d = dev_f32(tmp, (long)E * rows * IC);
    free(tmp);
    return d;
}
/* The device stack back into rows row0 .. row0 + rows of each expert's block of cat. */
static void unstack_f32(float *cat, const float *d, int E, int OC, int IC, int row0, int rows) {
    float *tmp = host_from_f32(d, (long)E * rows * IC);
    for (int e = 0; e < E; e++)
        memcpy(cat + ((size_t)e * OC + row0) * IC, tmp + (size_t)e * rows * IC, (size_t)rows * IC * sizeof(float));
    free(tmp);
}

/* A (rows_alloc x ld) bf16 matrix read back: the first R rows' first W columns into out (R x W), and whether every
 * other element still holds `outside` (the padding columns and the rows past R: nothing may write there). */
static int read_region(const uint16_t *d, int rows_alloc, int ld, int R, int W, float *out, const float *outside) {
    float *all = host_from_bf16(d, (long)rows_alloc * ld);
    int untouched = 1;
    for (int r = 0; r < rows_alloc; r++)
        for (int c = 0; c < ld; c++) {
            const float v = all[(size_t)r * ld + c];
            if (r < R && c < W) out[(size_t)r * W + c] = v;
            else if (v != outside[(size_t)r * ld + c]) untouched = 0;
        }
    free(all);
    return untouched;
}

/* One product family: E experts with counts[e] rows each, weights [W0_e; W1_e] of (OC0 + OC1) x IC (OC1 0: one
 * stack), leading dimensions padded by `pad`. Checks every way's three products. */
static void test_products(const char *name, int E, const int *counts, int IC, int OC0, int OC1, int pad,
                          uint64_t seed) {
    const int OC = OC0 + OC1, extra = 3;
    int32_t *offsets = mt_malloc((size_t)(E + 1) * sizeof *offsets);
    offsets[0] = 0;
    for (int e = 0; e < E; e++) offsets[e + 1] = offsets[e] + counts[e];
    const int R = offsets[E], Ra = R + extra;
    const int ld_in = IC + pad, ld_out = OC + pad, ld_din = IC + pad;
    printf("%s: E=%d rows=%d IC=%d OC=%d+%d pad=%d\n", name, E, R, IC, OC0, OC1, pad);
    uint64_t st = seed * 0x9E3779B97F4A7C15ULL + 1;
    const float ws = 1.0f / sqrtf((float)IC);
    float *inp = alloc_floats((size_t)Ra * ld_in), *dout = alloc_floats((size_t)Ra * ld_out);
    float *din0 = alloc_floats((size_t)Ra * ld_din), *wcat = alloc_floats((size_t)E * OC * IC);
    float *gcat = alloc_floats((size_t)E * OC * IC);
    fill_uniform(inp, (size_t)Ra * ld_in, &st, 1.0f); /* padding too: it must not reach the products */
    fill_uniform(dout, (size_t)Ra * ld_out, &st, 1.0f);
    fill_uniform(din0, (size_t)Ra * ld_din, &st, 1.0f);
    fill_uniform(wcat, (size_t)E * OC * IC, &st, ws);
    fill_uniform(gcat, (size_t)E * OC * IC, &st, 1.0f);
    /* the outputs' initial contents: the sentinel outside the products' region */
    float *out0 = alloc_floats((size_t)Ra * ld_out);
    for (size_t i = 0; i < (size_t)Ra * ld_out; i++) out0[i] = kSentinel;
    for (int r = 0; r < Ra; r++)
        for (int c = 0; c < ld_din; c++)
            if (r >= R || c >= IC) din0[(size_t)r * ld_din + c] = kSentinel;

    /* CPU reference on compact copies */
    float *inp_c = alloc_floats((size_t)R * IC), *dout_c = alloc_floats((size_t)R * OC);
    float *din0_c = alloc_floats((size_t)R * IC);
    for (int r = 0; r < R; r++) {
        memcpy(inp_c + (size_t)r * IC, inp + (size_t)r * ld_in, (size_t)IC * sizeof(float));
        memcpy(dout_c + (size_t)r * OC, dout + (size_t)r * ld_out, (size_t)OC * sizeof(float));
        memcpy(din0_c + (size_t)r * IC, din0 + (size_t)r * ld_din, (size_t)IC * sizeof(float));
    }
    float *out_ref = alloc_floats((size_t)R * OC), *din_ref = alloc_floats((size_t)R * IC);
    float *din_acc_ref = alloc_floats((size_t)R * IC), *dw_ref = alloc_floats((size_t)E * OC * IC);
    memset(din_ref, 0, (size_t)R * IC * sizeof(float));
    memcpy(dw_ref, gcat, (size_t)E * OC * IC * sizeof(float));
    for (int e = 0; e < E; e++) {
        const int f = offsets[e], n = counts[e];
        if (n == 0) continue;
        const float *w = wcat + (size_t)e * OC * IC;
        cpu_backend.matmul_forward(out_ref + (size_t)f * OC, inp_c + (size_t)f * IC, w, NULL, n, IC, OC);
        cpu_backend.matmul_backward(din_ref + (size_t)f * IC, dw_ref + (size_t)e * OC * IC, NULL,
                                    dout_c + (size_t)f * OC, inp_c + (size_t)f * IC, w, n, IC, OC);
    }
    for (size_t i = 0; i < (size_t)R * IC; i++) din_acc_ref[i] = din0_c[i] + din_ref[i];

    uint16_t *d_inp = dev_bf16(inp, (long)Ra * ld_in), *d_dout = dev_bf16(dout, (long)Ra * ld_out);
    uint16_t *d_w0 = stack_bf16(wcat, E, OC, IC, 0, OC0), *d_w1 = OC1 ? stack_bf16(wcat, E, OC, IC, OC0, OC1) : NULL;
    int32_t *d_offsets = dev_copy(offsets, (size_t)(E + 1) * sizeof *offsets);
    const CudaGroupedRows g = {.groups = E, .offsets = offsets, .d_offsets = d_offsets, .max_rows = R};
    float *got_out = alloc_floats((size_t)R * OC), *got_din = alloc_floats((size_t)R * IC);
    float *got_dw = alloc_floats((size_t)E * OC * IC);
    char what[128];
    for (int h = 0; h < 3; h++) {
        const char *hn = cuda_moe_gemm_name(hows[h]);
        uint16_t *d_out = dev_bf16(out0, (long)Ra * ld_out);
        cuda_grouped_forward(&ctx, hows[h], &g, d_out, ld_out, d_inp, ld_in, d_w0, d_w1, IC, OC0, OC1);
        int untouched = read_region(d_out, Ra, ld_out, R, OC, got_out, out0);
        snprintf(what, sizeof what, "%s forward", hn);
        check(what, rel_max(got_out, out_ref, (long)R * OC), 1e-2);
        snprintf(what, sizeof what, "%s forward: nothing written outside", hn);
        check(what, untouched ? 0.0 : 1.0, 0.0);
        for (int acc = 0; acc < 2; acc++) {
            uint16_t *d_din = dev_bf16(din0, (long)Ra * ld_din);
            cuda_grouped_backward_input(&ctx, hows[h], &g, d_din, ld_din, d_dout, ld_out, d_w0, d_w1, IC, OC0, OC1,
                                        acc);
            untouched = read_region(d_din, Ra, ld_din, R, IC, got_din, din0);
            snprintf(what, sizeof what, "%s backward input%s", hn, acc ? " (accumulate)" : "");
            check(what, rel_max(got_din, acc ? din_acc_ref : din_ref, (long)R * IC), 1e-2);
            snprintf(what, sizeof what, "%s backward input: nothing written outside", hn);
            check(what, untouched ? 0.0 : 1.0, 0.0);
            cudaFree(d_din);
        }
        float *d_g0 = stack_f32(gcat, E, OC, IC, 0, OC0), *d_g1 = OC1 ? stack_f32(gcat, E, OC, IC, OC0, OC1) : NULL;
        cuda_grouped_backward_weight(&ctx, hows[h], &g, d_g0, d_g1, d_dout, ld_out, d_inp, ld_in, IC, OC0, OC1);
        unstack_f32(got_dw, d_g0, E, OC, IC, 0, OC0);
        if (OC1) unstack_f32(got_dw, d_g1, E, OC, IC, OC0, OC1);
        snprintf(what, sizeof what, "%s backward weight (fp32, accumulate)", hn);
        check(what, rel_max(got_dw, dw_ref, (long)E * OC * IC), 1e-4);
        int same = 1; /* experts without rows: their gradients exactly as they were */
        for (int e = 0; e < E; e++)
            if (counts[e] == 0)
                same = same && memcmp(got_dw + (size_t)e * OC * IC, gcat + (size_t)e * OC * IC,
                                      (size_t)OC * IC * sizeof(float)) == 0;
        snprintf(what, sizeof what, "%s backward weight: empty experts unchanged", hn);
        check(what, same ? 0.0 : 1.0, 0.0);
        cudaFree(d_out);
        cudaFree(d_g0);
        if (d_g1) cudaFree(d_g1);
    }
    if (cuda_grouped_weight_fp32_state() == 0)
        printf("  (cublas_grouped: cuBLAS refused fp32 output, its weight gradients went through the loop)\n");
    cudaFree(d_inp);
    cudaFree(d_dout);
    cudaFree(d_w0);
    if (d_w1) cudaFree(d_w1);
    cudaFree(d_offsets);
    free(offsets); free(inp); free(dout); free(din0); free(wcat); free(gcat); free(out0); free(inp_c); free(dout_c);
    free(din0_c); free(out_ref); free(din_ref); free(din_acc_ref); free(dw_ref); free(got_out); free(got_din);
    free(got_dw);
}

/* Both families of an MoE layer's experts: gate|up (IC = C, two stacks of Ie) and down (IC = Ie, one of C). */
static void test_layer(const char *name, int E, const int *counts, int C, int Ie, int pad, uint64_t seed) {
    char buf[160];
    snprintf(buf, sizeof buf, "%s, gate|up", name);
    test_products(buf, E, counts, C, Ie, Ie, pad, seed);
    snprintf(buf, sizeof buf, "%s, down", name);
    test_products(buf, E, counts, Ie, C, 0, pad, seed + 1);
}

/* counts summing to R over E experts, skewed (Zipf weights 1 / (rank + 1)^s in a random expert order). */
static void skewed_counts(Rng *rng, int *counts, int E, int R, double s) {
    double *w = mt_malloc((size_t)E * sizeof *w), sum = 0.0;
    int64_t *order = mt_malloc((size_t)E * sizeof *order);
    for (int e = 0; e < E; e++) order[e] = e;
    rng_shuffle_i64(rng, order, E);
    for (int e = 0; e < E; e++) sum += w[e] = 1.0 / pow(e + 1.0, s);
    int left = R;
    for (int e = 0; e < E; e++) {
        const int c = (int)floor(R * w[e] / sum);
        counts[order[e]] = c;
        left -= c;
    }
    counts[order[0]] += left;
    free(w);
    free(order);
}

/* counts of `tokens` tokens each routed to k distinct experts of E drawn uniformly: an untrained router's
 * balance, whose counts are ragged (a few hundred rows an expert, not multiples of a tile). */
static void routed_counts(Rng *rng, int *counts, int E, int tokens, int k) {
    for (int e = 0; e < E; e++) counts[e] = 0;
    int *picked = mt_malloc((size_t)k * sizeof *picked);
    for (int t = 0; t < tokens; t++)
        for (int j = 0; j < k; j++) {
            int e, again;
            do {
                e = (int)rng_below(rng, (uint64_t)E);
                again = 0;
                for (int i = 0; i < j; i++) again |= picked[i] == e;
            } while (again);
            picked[j] = e;
            counts[e]++;
        }
    free(picked);
}

/* ---- timing on the Qwen3-30B-A3B layer --------------------------------------------------------------------- */

/* A device buffer of n bf16 (elem 2) or fp32 (elem 4) values in [-scale, scale): a random block of 1M values
 * repeated (timing does not need more). */
static void fill_device(void *d, size_t n, size_t elem, uint64_t *st, float scale) {
    const size_t block = (size_t)1 << 20;
    float *vals = alloc_floats(block);
    fill_uniform(vals, block, st, scale);
    void *host = mt_malloc(block * elem);
    for (size_t i = 0; i < block; i++) {
        if (elem == 2) ((uint16_t *)host)[i] = to_bf16(vals[i]);
        else ((float *)host)[i] = vals[i];
    }
    for (size_t at = 0; at < n; at += block) {
        const size_t cnt = n - at < block ? n - at : block;
        CHECK_CUDA(cudaMemcpy((char *)d + at * elem, host, cnt * elem, cudaMemcpyHostToDevice));
    }
    free(vals);
    free(host);
}

typedef struct LayerBufs {
    uint16_t *x, *gate_up, *act, *y, *d_y, *d_act, *d_gate_up, *d_x, *wg, *wu, *wd;
    float *gg, *gu, *gd;
} LayerBufs;

enum { P_FWD_GU, P_FWD_DOWN, P_BIN_DOWN, P_BIN_GU, P_BW_DOWN, P_BW_GU, NUM_PRODUCTS };
static const char *product_names[NUM_PRODUCTS] = {"fwd g|u", "fwd down", "din down", "din g|u", "dW down", "dW g|u"};

static void run_product(int p, CudaMoeGemm how, const CudaGroupedRows *g, const LayerBufs *b, int C, int Ie) {
    switch (p) {
    case P_FWD_GU: cuda_grouped_forward(&ctx, how, g, b->gate_up, 2 * Ie, b->x, C, b->wg, b->wu, C, Ie, Ie); break;
    case P_FWD_DOWN: cuda_grouped_forward(&ctx, how, g, b->y, C, b->act, Ie, b->wd, NULL, Ie, C, 0); break;
    case P_BIN_DOWN:
        cuda_grouped_backward_input(&ctx, how, g, b->d_act, Ie, b->d_y, C, b->wd, NULL, Ie, C, 0, 0);
        break;
    case P_BIN_GU:
        cuda_grouped_backward_input(&ctx, how, g, b->d_x, C, b->d_gate_up, 2 * Ie, b->wg, b->wu, C, Ie, Ie, 0);
        break;
    case P_BW_DOWN: cuda_grouped_backward_weight(&ctx, how, g, b->gd, NULL, b->d_y, C, b->act, Ie, Ie, C, 0); break;
    case P_BW_GU:
        cuda_grouped_backward_weight(&ctx, how, g, b->gg, b->gu, b->d_gate_up, 2 * Ie, b->x, C, C, Ie, Ie);
        break;
    }
}

static void time_layer(const char *dist, const int *counts, int E, int C, int Ie, const LayerBufs *b) {
    int32_t *offsets = mt_malloc((size_t)(E + 1) * sizeof *offsets);
    offsets[0] = 0;
    int busy = 0, most = 0;
    for (int e = 0; e < E; e++) {
        offsets[e + 1] = offsets[e] + counts[e];
        busy += counts[e] > 0;
        if (counts[e] > most) most = counts[e];
    }
    const int R = offsets[E];
    int32_t *d_offsets = dev_copy(offsets, (size_t)(E + 1) * sizeof *offsets);
    const CudaGroupedRows g = {.groups = E, .offsets = offsets, .d_offsets = d_offsets, .max_rows = R};
    const double flops = 2.0 * R * C * Ie; /* down's; gate|up's twice that */
    printf("timing %s routing: %d rows over %d of %d experts (most %d), C=%d Ie=%d; TFLOP/s per product, "
           "ms for the six\n", dist, R, busy, E, most, C, Ie);
    printf("  %-15s", "");
    for (int p = 0; p < NUM_PRODUCTS; p++) printf(" %9s", product_names[p]);
    printf(" %9s\n", "ms");
    cudaEvent_t start, stop;
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&stop));
    const int iters = 5;
    uint16_t *ref_gu = NULL, *ref_dx = NULL;
    const size_t gu_elems = (size_t)R * 2 * Ie, dx_elems = (size_t)R * C;
    for (int h = 0; h < 3; h++) {
        double total_ms = 0.0, tflops[NUM_PRODUCTS];
        for (int p = 0; p < NUM_PRODUCTS; p++) {
            run_product(p, hows[h], &g, b, C, Ie); /* warm up (cuBLAS's heuristics, the kernel's first launch) */
            CHECK_CUDA(cudaEventRecord(start, ctx.stream));
            for (int i = 0; i < iters; i++) run_product(p, hows[h], &g, b, C, Ie);
            CHECK_CUDA(cudaEventRecord(stop, ctx.stream));
            CHECK_CUDA(cudaEventSynchronize(stop));
            float ms = 0.0f;
            CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
            const double per = ms / iters;
            total_ms += per;
            const double f = (p == P_FWD_GU || p == P_BIN_GU || p == P_BW_GU) ? 2.0 * flops : flops;
            tflops[p] = f / (per * 1e-3) / 1e12;
        }
        printf("  %-15s", cuda_moe_gemm_name(hows[h]));
        for (int p = 0; p < NUM_PRODUCTS; p++) printf(" %9.1f", tflops[p]);
        printf(" %9.3f\n", total_ms);
        /* the ways agree: gate|up forward and d_x against the first way's */
        if (h == 0) {
            CHECK_CUDA(cudaMalloc((void **)&ref_gu, gu_elems * 2 + 2));
            CHECK_CUDA(cudaMalloc((void **)&ref_dx, dx_elems * 2 + 2));
            CHECK_CUDA(cudaMemcpy(ref_gu, b->gate_up, gu_elems * 2, cudaMemcpyDeviceToDevice));
            CHECK_CUDA(cudaMemcpy(ref_dx, b->d_x, dx_elems * 2, cudaMemcpyDeviceToDevice));
        } else {
            float *a = host_from_bf16(b->gate_up, (long)gu_elems), *r = host_from_bf16(ref_gu, (long)gu_elems);
            char what[128];
            snprintf(what, sizeof what, "%s = cublas: forward gate|up (%s)", cuda_moe_gemm_name(hows[h]), dist);
            check(what, rel_max(a, r, (long)gu_elems), 1e-2);
            free(a);
            free(r);
            a = host_from_bf16(b->d_x, (long)dx_elems);
            r = host_from_bf16(ref_dx, (long)dx_elems);
            snprintf(what, sizeof what, "%s = cublas: d_x (%s)", cuda_moe_gemm_name(hows[h]), dist);
            check(what, rel_max(a, r, (long)dx_elems), 1e-2);
            free(a);
            free(r);
        }
    }
    cudaFree(ref_gu);
    cudaFree(ref_dx);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaFree(d_offsets);
    free(offsets);
}

static void timing(Rng *rng) {
    const int E = 128, C = 2048, Ie = 768, R = 4096 * 8;
    LayerBufs b;
    const size_t w = (size_t)E * Ie * C;
    uint16_t **acts[] = {&b.x, &b.gate_up, &b.act, &b.y, &b.d_y, &b.d_act, &b.d_gate_up, &b.d_x};
    const size_t act_elems[] = {(size_t)R * C, (size_t)R * 2 * Ie, (size_t)R * Ie, (size_t)R * C,
                                (size_t)R * C, (size_t)R * Ie, (size_t)R * 2 * Ie, (size_t)R * C};
    uint64_t st = 12345;
    for (int i = 0; i < 8; i++) {
        CHECK_CUDA(cudaMalloc((void **)acts[i], act_elems[i] * 2));
        fill_device(*acts[i], act_elems[i], 2, &st, 1.0f);
    }
    uint16_t **ws[] = {&b.wg, &b.wu, &b.wd};
    float **gs[] = {&b.gg, &b.gu, &b.gd};
    for (int i = 0; i < 3; i++) {
        CHECK_CUDA(cudaMalloc((void **)ws[i], w * 2));
        fill_device(*ws[i], w, 2, &st, 0.05f);
        CHECK_CUDA(cudaMalloc((void **)gs[i], w * 4));
        CHECK_CUDA(cudaMemset(*gs[i], 0, w * 4));
    }
    int *counts = mt_malloc((size_t)E * sizeof *counts);
    for (int e = 0; e < E; e++) counts[e] = R / E;
    time_layer("balanced", counts, E, C, Ie, &b);
    routed_counts(rng, counts, E, R / 8, 8);
    time_layer("random top-8", counts, E, C, Ie, &b);
    skewed_counts(rng, counts, E, R, 1.0);
    time_layer("skewed (Zipf 1)", counts, E, C, Ie, &b);
    for (int e = 0; e < E; e++) counts[e] = e % 16 == 3 ? R / 8 : 0; /* every token to the same 8 experts */
    time_layer("collapsed", counts, E, C, Ie, &b);
    free(counts);
    for (int i = 0; i < 8; i++) cudaFree(*acts[i]);
    for (int i = 0; i < 3; i++) {
        cudaFree(*ws[i]);
        cudaFree(*gs[i]);
    }
}

/* Every way against the CPU on the shapes above. */
/* MT_GPU_TEST_QUICK=1 (the CPU emulator, tests/gpu/emu): the small shapes only. */
static int quick;

static void checks(Rng *rng) {
    /* the tiny models' shapes (tests/gpu/test_cuda_model.c: C 64, Ie 32; recipes/tiny: Ie 48) */
    const int c8[8] = {0, 1, 5, 0, 130, 17, 0, 3}; /* empty, one row, ragged, more than a 128-row tile */
    test_layer("tiny, ragged", 8, c8, 64, 32, 0, 1);
    test_layer("tiny, Ie 48 (gate|up split inside a tile), padded", 8, c8, 64, 48, 8, 2);
    const int c4[4] = {0, 0, 300, 0}; /* one expert has every row */
    test_layer("one expert has all rows", 4, c4, 64, 48, 0, 3);
    const int c1[1] = {1};
    test_layer("one expert, one row", 1, c1, 64, 32, 8, 4);
    const int c0[4] = {0, 0, 0, 0};
    test_layer("no rows at all", 4, c0, 64, 32, 0, 5);
    int c40[40];
    for (int e = 0; e < 40; e++) c40[e] = e % 7 == 0 ? 0 : (int)rng_below(rng, 300); /* more than 32 experts */
    c40[39] = 1;
    test_layer("40 experts, ragged", 40, c40, 128, 96, 0, 6);
    const int c3[3] = {5, 0, 9}; /* 36 and 20: not multiples of 8, the kernel's way falls back to the loop */
    test_products("a shape the kernel does not take (the loop)", 3, c3, 36, 20, 20, 0, 7);
    int c16[16];
    skewed_counts(rng, c16, 16, 2000, 1.0);
    c16[3] = 0;
    c16[9] = 1;
    test_layer("16 experts, skewed, C 256 Ie 160", 16, c16, 256, 160, 0, 8);
    if (quick) {
        printf("MT_GPU_TEST_QUICK=1: the Qwen3-30B-A3B shape and the timing left out\n");
        return;
    }
    /* the realistic shape: Qwen3-30B-A3B's experts, 8192 rows skewed, some empty, one of a single row */
    int *c128 = mt_malloc(128 * sizeof *c128);
    skewed_counts(rng, c128, 128, 8192, 1.2);
    int moved = c128[100] - 1, big = 0;
    c128[100] = 1;
    for (int e = 0; e < 128; e++) {
        if (e % 29 == 5) {
            moved += c128[e];
            c128[e] = 0;
        }
        if (e != 100 && c128[e] > c128[big]) big = e;
    }
    c128[big] += moved; /* the total stays 8192 */
    test_layer("Qwen3-30B-A3B experts, 8192 rows skewed", 128, c128, 2048, 768, 0, 9);
    free(c128);
    /* Mixtral 8x7B's expert shape (C 4096, Ie 14336: up to 224 tiles of N or M, up to 14336 of K), two of its
     * experts with ragged row counts, neither a multiple of the kernel's 128-row tile */
    const int c2[2] = {300, 213};
    test_layer("Mixtral 8x7B experts (two), 513 rows", 2, c2, 4096, 14336, 0, 10);
}

int main(int argc, char **argv) {
    char err[512];
    if (cuda_context_create(&ctx, 0, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 77;
    }
    /* --no-timing: the checks only; --timing-only: the timing (and its agreement checks) only */
    const int no_timing = argc > 1 && strcmp(argv[1], "--no-timing") == 0;
    const int timing_only = argc > 1 && strcmp(argv[1], "--timing-only") == 0;
    quick = getenv("MT_GPU_TEST_QUICK") && strcmp(getenv("MT_GPU_TEST_QUICK"), "1") == 0;
    Rng rng;
    rng_seed(&rng, 42);
    printf("MEGATRAIN_MOE_GEMM in this process: %s (the test runs every way)\n",
           cuda_moe_gemm_name(cuda_moe_gemm_choice()));

    if (!timing_only) checks(&rng);
    if (!no_timing && !quick) timing(&rng);
    cuda_gemm_cache_clear();
    cuda_context_destroy(&ctx);
    printf("\n%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
