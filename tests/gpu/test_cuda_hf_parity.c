/* test_cuda_hf_parity.c: the CUDA model against Hugging Face transformers on
 * the parity fixtures (tests/fixtures/hf, docs/parity.md): the fp32 weights
 * transformers used, the same batch, our bf16 GPU forward and backward.
 * Limits are bf16's (tests/gpu/gpu_test_util.h): logits 3% of max, loss 1%,
 * each gradient 5% in L2 (per registry parameter: a MoE layer's experts are
 * one stacked tensor, as in test_cuda_model). The CPU passes the same checks
 * at 1e-5 and 1e-4 (tests/unit/test_hf_parity.c). Fixtures with head_dim 8
 * (llama_tied, qwen2_bias, mixtral_moe) are skipped: the CUDA attention
 * takes multiples of 16 (mixtral_hd16 is mixtral_moe with head_dim 16).
 *
 * MoE fixtures (mixtral_hd16, qwen3_moe, qwen3_moe_nonorm), as the CPU test:
 * the gradients are the cross entropy's (aux_loss_coeff 0). Besides, every
 * token's experts must be transformers' top-k of its router logits: the
 * router reads bf16 activations, which move the gap between a token's k-th
 * and (k+1)-th logit by 0.02 to 0.04 (rms, emulated in torch), so
 * mixtral_hd16 and qwen3_moe_nonorm were made with no gap under 0.1
 * (make_fixtures.py); qwen3_moe has one of 0.022, and a token routed
 * elsewhere at a gap under NEAR_TIE skips the rest of its case rather than
 * failing it. And a second GPU model with aux_loss (coefficient 1) must give
 * the per-layer load-balancing losses of that routing: the sum over layers
 * of E / (k N^2) sum_e (sum_n p[n,e]) count[e], p the softmax of
 * transformers' router logits, within 1% (the GPU's p come from bf16
 * activations: 1.2e-3 on qwen3_moe in the torch emulation); the same sums
 * pooled over the layers must give transformers' own aux_loss (1e-5: the
 * reference is read right). The gradient of transformers' pooled aux loss
 * needs the per-layer constants replaced (test_hf_parity.c's
 * check_moe_aux), which the CUDA model keeps private: not compared here.
 * Run by `make test-gpu`. */
#include "../unit/hf_fixture.h"
#include "backend/cuda/cuda_device.h"
#include "model/cuda/cuda_model.h"
#include "gpu_test_util.h"
#include "model/moe_layer.h"

#define GPU_LOGITS_TOL 3e-2
#define GPU_LOSS_TOL 1e-2
#define GPU_GRAD_TOL 5e-2
#define GPU_AUX_TOL 1e-2
#define REF_AUX_TOL 1e-5
#define NEAR_TIE 0.05

/* MoE: transformers' routing of the fixture's batch, from its router logits (router_logits.<l>, (N, E)): the k
 * experts of highest softmax probability (= highest logit; ties to the lower index, as moe_layer.c route) into
 * chosen (N, k), the probabilities (double) into p (N, E); returns the smallest gap between a token's k-th and
 * (k+1)-th logit. */
static double ref_routing(const float *logits, int N, int E, int k, int32_t *chosen, double *p) {
    double min_gap = INFINITY;
    for (int n = 0; n < N; n++) {
        const float *l = logits + (size_t)n * E;
        double mx = -INFINITY, sum = 0.0;
        for (int e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
        for (int e = 0; e < E; e++) sum += exp((double)l[e] - mx);
        for (int e = 0; e < E; e++) p[(size_t)n * E + e] = exp((double)l[e] - mx) / sum;
        int32_t *sel = chosen + (size_t)n * k;
        for (int j = 0; j <= k && j < E; j++) { /* the k best, then the (k+1)-th for the gap */
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int q = 0; q < j; q++) taken = taken || sel[q] == e;
                if (!taken && (best < 0 || l[e] > l[best])) best = e;
            }
            if (j < k) sel[j] = best;
            else min_gap = fmin(min_gap, (double)l[sel[k - 1]] - l[best]);
        }
    }
    return min_gap;
}

/* The GPU routed every token of every MoE layer to transformers' experts (as sets: their order is the scores').
 * A token routed elsewhere, where its logits nearly tie (the expert the GPU took within NEAR_TIE of transformers'
 * k-th), is bf16 rounding, not a bug: then this returns true, and the caller skips the rest of the case, which
 * that token changes. */
static bool check_moe_routing(Case *c, CudaModel *gpu) {
    const int N = c->B * c->T, E = c->cfg.moe.num_experts, k = c->cfg.moe.num_experts_per_tok;
    int32_t *got = malloc((size_t)N * k * sizeof(int32_t)), *want = malloc((size_t)N * k * sizeof(int32_t));
    double *p = malloc((size_t)N * E * sizeof(double));
    long differ = 0, near_ties = 0, total = 0;
    double min_gap = INFINITY;
    for (int l = 0; l < c->cfg.num_layers; l++) {
        char key[64];
        snprintf(key, sizeof key, "router_logits.%d", l);
        long n;
        float *logits = ref_f32(&c->ref, key, &n);
        assert_int_equal(n, (long)N * E);
        min_gap = fmin(min_gap, ref_routing(logits, N, E, k, want, p));
        if (!cuda_model_download_routing(gpu, l, got)) fail_msg("%s: layer %d: the GPU has no MoE layer", c->name, l);
        for (int t = 0; t < N; t++)
            for (int j = 0; j < k; j++) {
                const int e = got[(size_t)t * k + j];
                bool found = false;
                for (int q = 0; q < k; q++) found = found || e == want[(size_t)t * k + q];
                if (found) continue;
                const double gap = e >= 0 && e < E ? (double)logits[(size_t)t * E + want[(size_t)t * k + k - 1]] -
                                                         logits[(size_t)t * E + e]
                                                   : INFINITY;
                differ++;
                near_ties += gap < NEAR_TIE;
                printf("  layer %d token %d: the GPU chose expert %d, not among transformers' top %d (its logit is "
                       "%.4f below transformers' k-th)\n", l, t, e, k, gap);
            }
        free(logits);
        total += (long)N * k;
    }
    printf("  %-16s routing: %ld of %ld assignments differ from transformers' (smallest k-th logit gap %.3f)\n",
           c->name, differ, total, min_gap);
    free(got); free(want); free(p);
    if (differ > near_ties) fail_msg("%s: %ld assignments routed differently from transformers", c->name, differ);
    if (differ)
        printf("  %-16s every difference is a near-tie (< %.2f): bf16 rounding; the rest of this case is skipped "
               "(mixtral_hd16 and qwen3_moe_nonorm have no gap under 0.1)\n", c->name, NEAR_TIE);
    return differ > 0;
}

/* The load-balancing loss: a GPU model with aux_loss (coefficient 1) records the sum over layers of each layer's
 * loss in the host's MoeStep; the same from transformers' router logits; and, pooled over the layers, transformers'
 * own aux_loss. */
static void check_moe_aux(Case *c) {
    const int N = c->B * c->T, E = c->cfg.moe.num_experts, k = c->cfg.moe.num_experts_per_tok, L = c->cfg.num_layers;
    c->model->cfg.moe.load_balancing = LB_AUX_LOSS;
    c->model->cfg.moe.aux_loss_coeff = 1.0;
    c->model->cfg.moe.z_loss_coeff = 0.0;
    char err[512];
    CudaModel *gpu = cuda_model_create(c->model, 0, c->B, c->T, NULL, err, sizeof err);
    if (!gpu) fail_msg("%s: %s", c->name, err);
    model_moe_step_begin(c->model);
    cuda_model_forward(gpu, c->inputs, c->targets, c->B, c->T);
    const double aux_gpu = c->model->moe_step->aux_sum;
    cuda_model_free(gpu);

    int32_t *chosen = malloc((size_t)N * k * sizeof(int32_t));
    double *p = malloc((size_t)N * E * sizeof(double)), *count = malloc((size_t)E * sizeof(double));
    double *psum = malloc((size_t)E * sizeof(double));
    double *pooled_count = calloc((size_t)E, sizeof(double)), *pooled_psum = calloc((size_t)E, sizeof(double));
    double aux_layers = 0.0;
    for (int l = 0; l < L; l++) {
        char key[64];
        snprintf(key, sizeof key, "router_logits.%d", l);
        float *logits = ref_f32(&c->ref, key, NULL);
        ref_routing(logits, N, E, k, chosen, p);
        free(logits);
        memset(count, 0, (size_t)E * sizeof(double));
        memset(psum, 0, (size_t)E * sizeof(double));
        for (int i = 0; i < N * k; i++) count[chosen[i]] += 1.0;
        for (int i = 0; i < N * E; i++) psum[i % E] += p[i];
        double sum = 0.0;
        for (int e = 0; e < E; e++) {
            sum += psum[e] * count[e];
            pooled_count[e] += count[e];
            pooled_psum[e] += psum[e];
        }
        aux_layers += E / ((double)k * N * N) * sum; /* moe_layer.c balance_loss, aux_loss_coeff 1 */
    }
    double pooled = 0.0; /* transformers' load_balancing_loss_func */
    for (int e = 0; e < E; e++) pooled += (pooled_count[e] / ((double)L * N)) * (pooled_psum[e] / ((double)L * N));
    pooled *= E;
    float *ref_aux_f = ref_f32(&c->ref, "aux_loss", NULL);
    const double ref_aux = ref_aux_f[0];
    free(ref_aux_f);
    const double gpu_err = fabs(aux_gpu - aux_layers) / aux_layers;
    const double ref_err = fabs(pooled - ref_aux) / fabs(ref_aux);
    printf("  %-16s aux loss (per layer, summed): gpu %.6f, from transformers' router logits %.6f (%.2e); "
           "pooled %.6f vs transformers' aux_loss %.6f (%.2e)\n", c->name, aux_gpu, aux_layers, gpu_err, pooled,
           ref_aux, ref_err);
    free(chosen); free(p); free(count); free(psum); free(pooled_count); free(pooled_psum);
    if (!(ref_err < REF_AUX_TOL)) fail_msg("%s: pooled aux loss %.8f vs transformers' %.8f", c->name, pooled, ref_aux);
    if (!(gpu_err < GPU_AUX_TOL)) fail_msg("%s: aux loss gpu %.8f vs %.8f", c->name, aux_gpu, aux_layers);
}

static void check_case(const char *name) {
    Case c = case_open(name);
    if (c.cfg.head_dim % 16 != 0) { /* the attention kernels take head_dim 16, 32, 64, 128 */
        printf("  %-16s head_dim %d: not supported on CUDA; %s\n", name, c.cfg.head_dim,
               c.model->moe_step ? "mixtral_hd16 is this case with head_dim 16"
                                 : "its tied / bias paths are covered by test_cuda_model");
        case_close(&c);
        skip();
    }
    const long N = (long)c.B * c.T, V = c.cfg.vocab_size;
    const bool moe = c.model->moe_step != NULL;
    if (moe) { /* the gradients of the cross entropy alone ("grad."), as the CPU test */
        c.model->cfg.moe.aux_loss_coeff = 0.0;
        model_moe_step_begin(c.model);
    }
    char err[512];
    CudaModel *gpu = cuda_model_create(c.model, 0, c.B, c.T, NULL, err, sizeof err);
    if (!gpu) fail_msg("%s: %s", name, err);
    float loss = cuda_model_forward(gpu, c.inputs, c.targets, c.B, c.T);
    if (moe && check_moe_routing(&c, gpu)) { /* first: a token routed elsewhere explains any difference below */
        cuda_model_free(gpu);
        case_close(&c);
        skip();
    }
    float *logits = malloc((size_t)N * V * sizeof(float));
    cuda_model_download_logits(gpu, logits);
    float *ref_logits = ref_f32(&c.ref, "logits", NULL), *ref_loss = ref_f32(&c.ref, "loss", NULL);
    double logits_err = rel_max(logits, ref_logits, N * V);
    double loss_err = fabs((double)loss - ref_loss[0]) / fabs((double)ref_loss[0]);
    printf("  %-16s logits %.2e, loss %.6f vs %.6f (%.2e)\n", name, logits_err, loss, ref_loss[0], loss_err);
    if (!(logits_err < GPU_LOGITS_TOL)) fail_msg("%s: logits error %.3e >= %.0e", name, logits_err, GPU_LOGITS_TOL);
    if (!(loss_err < GPU_LOSS_TOL)) fail_msg("%s: loss error %.3e >= %.0e", name, loss_err, GPU_LOSS_TOL);

    cuda_model_zero_grad(gpu);
    cuda_model_backward(gpu, 1.0f, 0);
    float *grads = malloc((size_t)c.model->num_floats * sizeof(float));
    float *ref_grads = malloc((size_t)c.model->num_floats * sizeof(float));
    cuda_model_download_grads(gpu, grads);
    double worst = 0.0, worst_piece = 0.0;
    const char *worst_name = "";
    char worst_piece_name[160] = "";
    HfPiece pieces[HF_FIXTURE_MAX_EXPERTS];
    for (int k = 0; k < c.model->num_params; k++) {
        const ParamInfo *info = &c.model->param_info[k];
        /* the HF gradient tensors of this parameter (one, or one per expert of a stack) in its registry layout */
        const int n_pieces = hf_pieces(c.cfg.family, info, c.cfg.moe.num_experts, pieces, HF_FIXTURE_MAX_EXPERTS);
        assert_true(n_pieces >= 1);
        long total = 0;
        for (int p = 0; p < n_pieces; p++) {
            char key[200];
            snprintf(key, sizeof key, "grad.%.160s", pieces[p].name);
            long n;
            float *ref_grad = ref_f32(&c.ref, key, &n);
            assert_int_equal(n, pieces[p].shape[0] * (pieces[p].ndim == 2 ? pieces[p].shape[1] : 1));
            assert_true(pieces[p].offset + n <= info->numel);
            memcpy(ref_grads + info->offset + pieces[p].offset, ref_grad, (size_t)n * sizeof(float));
            total += n;
            if (n_pieces > 1) { /* one expert's gradient (printed, not judged: an expert sees a few tokens) */
                const double e = rel_l2(grads + info->offset + pieces[p].offset, ref_grad, n);
                if (!(e <= worst_piece))
                    worst_piece = e, snprintf(worst_piece_name, sizeof worst_piece_name, "%.150s", pieces[p].name);
            }
            free(ref_grad);
        }
        assert_int_equal(total, info->numel);
        double e = rel_l2(grads + info->offset, ref_grads + info->offset, info->numel);
        if (!(e < GPU_GRAD_TOL)) fail_msg("%s: gradient of %s: error %.3e >= %.0e", name, info->name, e, GPU_GRAD_TOL);
        if (e > worst) worst = e, worst_name = info->name;
    }
    printf("  %-16s worst gradient %s: %.2e\n", name, worst_name, worst);
    if (worst_piece_name[0]) printf("  %-16s worst single expert %s: %.2e\n", name, worst_piece_name, worst_piece);
    free(logits); free(ref_logits); free(ref_loss); free(grads); free(ref_grads);
    cuda_model_free(gpu);
    if (moe) check_moe_aux(&c);
    case_close(&c);
}

static void test_llama_gqa_rope3(void **state) { (void)state; check_case("llama_gqa_rope3"); }
static void test_llama_tied(void **state) { (void)state; check_case("llama_tied"); }
static void test_qwen2_bias(void **state) { (void)state; check_case("qwen2_bias"); }
static void test_qwen3_qknorm(void **state) { (void)state; check_case("qwen3_qknorm"); }
static void test_mixtral_moe(void **state) { (void)state; check_case("mixtral_moe"); }
static void test_mixtral_hd16(void **state) { (void)state; check_case("mixtral_hd16"); }
static void test_qwen3_moe(void **state) { (void)state; check_case("qwen3_moe"); }
static void test_qwen3_moe_nonorm(void **state) { (void)state; check_case("qwen3_moe_nonorm"); }

int main(void) {
    if (cuda_device_count() == 0) {
        printf("skip: no GPU\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_gqa_rope3),
        cmocka_unit_test(test_llama_tied),
        cmocka_unit_test(test_qwen2_bias),
        cmocka_unit_test(test_qwen3_qknorm),
        cmocka_unit_test(test_mixtral_moe),
        cmocka_unit_test(test_mixtral_hd16),
        cmocka_unit_test(test_qwen3_moe),
        cmocka_unit_test(test_qwen3_moe_nonorm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
