/* test_cuda_hf_parity.c: the CUDA model against Hugging Face transformers on
 * the parity fixtures (tests/fixtures/hf, docs/parity.md): the fp32 weights
 * transformers used, the same batch, our bf16 GPU forward and backward.
 * Limits are bf16's (tests/gpu/gpu_test_util.h): logits 3% of max, loss 1%,
 * each gradient 5% in L2. The CPU passes the same checks at 1e-5 and 1e-4
 * (tests/unit/test_hf_parity.c). Fixtures with head_dim 8 (llama_tied,
 * qwen2_bias) are skipped: the CUDA attention takes multiples of 16.
 * Run by `make test-gpu`. */
#include "../unit/hf_fixture.h"
#include "backend/cuda/cuda_device.h"
#include "model/cuda/cuda_model.h"
#include "gpu_test_util.h"

#define GPU_LOGITS_TOL 3e-2
#define GPU_LOSS_TOL 1e-2
#define GPU_GRAD_TOL 5e-2

static void check_case(const char *name) {
    Case c = case_open(name);
    if (c.cfg.head_dim % 16 != 0) { /* the attention kernels take head_dim 16, 32, 64, 128 */
        printf("  %-16s head_dim %d: not supported on CUDA; its tied / bias paths are covered by test_cuda_model\n",
               name, c.cfg.head_dim);
        case_close(&c);
        skip();
    }
    const long N = (long)c.B * c.T, V = c.cfg.vocab_size;
    char err[512];
    CudaModel *gpu = cuda_model_create(c.model, 0, c.B, c.T, err, sizeof err);
    if (!gpu) fail_msg("%s: %s", name, err);
    float loss = cuda_model_forward(gpu, c.inputs, c.targets, c.B, c.T);
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
    cuda_model_download_grads(gpu, grads);
    double worst = 0.0;
    const char *worst_name = "";
    for (int k = 0; k < c.model->num_params; k++) {
        const ParamInfo *info = &c.model->param_info[k];
        char hf[160], key[200];
        assert_int_equal(hf_name_from_ours(c.cfg.family, info->name, hf, sizeof hf), 0);
        snprintf(key, sizeof key, "grad.%s", hf);
        long n;
        float *ref_grad = ref_f32(&c.ref, key, &n);
        assert_int_equal(n, info->numel);
        double e = rel_l2(grads + info->offset, ref_grad, n);
        free(ref_grad);
        if (!(e < GPU_GRAD_TOL)) fail_msg("%s: gradient of %s: error %.3e >= %.0e", name, info->name, e, GPU_GRAD_TOL);
        if (e > worst) worst = e, worst_name = info->name;
    }
    printf("  %-16s worst gradient %s: %.2e\n", name, worst_name, worst);
    free(logits); free(ref_logits); free(ref_loss); free(grads);
    cuda_model_free(gpu);
    case_close(&c);
}

static void test_llama_gqa_rope3(void **state) { (void)state; check_case("llama_gqa_rope3"); }
static void test_llama_tied(void **state) { (void)state; check_case("llama_tied"); }
static void test_qwen2_bias(void **state) { (void)state; check_case("qwen2_bias"); }
static void test_qwen3_qknorm(void **state) { (void)state; check_case("qwen3_qknorm"); }

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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
