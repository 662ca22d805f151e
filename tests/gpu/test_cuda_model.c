/* test_cuda_model.c: the whole CUDA model against the CPU model with the
 * same weights (rounded to bf16, the values the GPU's bf16 copy holds) on the
 * same micro-batch: loss, logits, every parameter's gradient, the grad norm,
 * and one AdamW step. Families: llama (GQA, llama3 rope scaling, untied and
 * tied), qwen2 (q/k/v biases: the unfused q/k/v products), qwen3 (qk-norm),
 * at head dims 16, 64 and 128. Limits (bf16 activations through 2 layers):
 * loss 1%, logits 3% of max, each gradient 5% in L2; the whole vector of
 * parameters after one AdamW step from the same gradients 1e-6 (fp32 against
 * the CPU's double arithmetic).
 * Run by `make test-gpu`; needs a GPU. Ends with "N passed, N failed". */
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_device.h"
#include "model/cuda/cuda_model.h"
#include "gpu_test_util.h"
#include "model/model.h"
#include "model_case.h"
#include "model/optimizer.h"

static int passed, failed;

static void check(const char *what, double err, double limit) {
    if (report(what, err, limit)) passed++;
    else failed++;
}

static void run_case(const char *name, ModelConfig cfg, int B, int T) {
    printf("%s: C=%d H=%d KVH=%d D=%d, B=%d T=%d%s%s\n", name, cfg.hidden_size, cfg.num_attention_heads,
           cfg.num_key_value_heads, cfg.head_dim, B, T, cfg.tie_word_embeddings ? ", tied" : "",
           cfg.rope_scaling.enabled ? ", llama3 rope" : "");
    Rng rng;
    rng_seed(&rng, 11);
    Model *cpu = cpu_case_model(&cfg, B, T, &rng);
    const int N = B * T, V = cfg.vocab_size;
    int32_t *inputs = malloc((size_t)N * sizeof(int32_t)), *targets = malloc((size_t)N * sizeof(int32_t));
    case_tokens(N, V, &rng, inputs, targets);
    char err[512];
    CudaModel *gpu = cuda_model_create(cpu, 0, B, T, err, sizeof err);
    if (!gpu) {
        printf("  cannot create the CUDA model: %s\n", err);
        failed++;
        model_free(cpu);
        return;
    }
    const float loss_cpu = model_forward(cpu, inputs, targets, B, T);
    const float loss_gpu = cuda_model_forward(gpu, inputs, targets, B, T);
    float *logits = malloc((size_t)N * V * sizeof(float));
    cuda_model_download_logits(gpu, logits);
    printf("  loss cpu %.5f gpu %.5f\n", loss_cpu, loss_gpu);
    check("loss", fabs(loss_gpu - loss_cpu) / loss_cpu, 1e-2);
    check("logits", rel_max(logits, model_logits(cpu), (long)N * V), 3e-2);

    model_zero_grad(cpu);
    cuda_model_zero_grad(gpu);
    model_backward(cpu, 1.0f);
    cuda_model_backward(gpu, 1.0f, 0);
    float *grads = malloc((size_t)cpu->num_floats * sizeof(float));
    cuda_model_download_grads(gpu, grads);
    double worst = 0.0;
    for (int i = 0; i < cpu->num_params; i++) {
        const ParamInfo *p = &cpu->param_info[i];
        double e = rel_l2(grads + p->offset, cpu->grads + p->offset, p->numel);
        if (!(e <= 5e-2) || i < 3 || strstr(p->name, "layers.0.") == p->name) {
            char what[160];
            snprintf(what, sizeof what, "grad %s", p->name);
            check(what, e, 5e-2);
        } else {
            passed++;
        }
        if (!(e <= worst)) worst = e;
    }
    printf("  worst gradient error %.3e over %d parameters\n", worst, cpu->num_params);
    const double norm_cpu = grad_global_norm(cpu->grads, cpu->num_floats);
    const double norm_gpu = cuda_model_grad_norm(gpu);
    check("grad norm", fabs(norm_gpu - norm_cpu) / norm_cpu, 2e-2);

    /* One AdamW step from the CPU's gradients on both sides. */
    OptimizerConfig opt = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    AdamW adam;
    adamw_init(&adam, cpu->num_floats);
    float *before = malloc((size_t)cpu->num_floats * sizeof(float));
    memcpy(before, cpu->params, (size_t)cpu->num_floats * sizeof(float));
    adamw_step(&adam, cpu, &opt, opt.lr, 0.5f);
    float *gpu_params = malloc((size_t)cpu->num_floats * sizeof(float));
    cuda_model_upload(gpu, before, NULL, NULL);
    cuda_model_upload_grads(gpu, cpu->grads);
    CudaAdamWStep step = {.lr = opt.lr, .beta1 = opt.beta1, .beta2 = opt.beta2, .eps = opt.eps,
                          .weight_decay = opt.weight_decay, .grad_scale = 0.5, .step = 1};
    cuda_model_adamw(gpu, &step);
    cuda_model_download(gpu, gpu_params, NULL, NULL);
    if (!report("params after one AdamW step (same grads)", rel_max(gpu_params, cpu->params, cpu->num_floats), 1e-6)) {
        failed++;
        long worst_i = 0;
        for (long i = 0; i < cpu->num_floats; i++)
            if (fabsf(gpu_params[i] - cpu->params[i]) > fabsf(gpu_params[worst_i] - cpu->params[worst_i])) worst_i = i;
        const char *where = "?";
        for (int i = 0; i < cpu->num_params; i++)
            if ((long)cpu->param_info[i].offset <= worst_i) where = cpu->param_info[i].name;
        printf("  worst at float %ld (%s): before %.9g grad %.9g cpu %.9g gpu %.9g\n", worst_i, where, before[worst_i],
               cpu->grads[worst_i], cpu->params[worst_i], gpu_params[worst_i]);
    } else {
        passed++;
    }

    adamw_free(&adam);
    cuda_model_free(gpu);
    model_free(cpu);
    free(inputs); free(targets); free(logits); free(grads); free(before); free(gpu_params);
}

int main(void) {
    if (cuda_device_count() == 0) {
        printf("skip: no GPU\n");
        return 77;
    }
    ModelConfig llama = tiny(FAMILY_LLAMA, 64, 4, 2, 16);
    run_case("llama (GQA, D=16)", llama, 2, 33);
    ModelConfig llama_big = tiny(FAMILY_LLAMA, 256, 4, 1, 64);
    llama_big.tie_word_embeddings = true;
    llama_big.rope_scaling = (RopeScaling){.enabled = true, .factor = 8.0, .low_freq_factor = 1.0,
                                           .high_freq_factor = 4.0, .original_max_position_embeddings = 64};
    run_case("llama (tied, llama3 rope, D=64)", llama_big, 2, 130);
    run_case("qwen2 (q/k/v biases)", tiny(FAMILY_QWEN2, 128, 4, 2, 32), 1, 77);
    run_case("qwen3 (qk-norm, D=128)", tiny(FAMILY_QWEN3, 256, 4, 2, 128), 2, 70);
    /* A larger model (about a 1.3 GB arena): its initial zeroing takes long
     * enough that copies not ordered after it were erased (the AdamW chunk
     * table, then no parameter moved); the AdamW check catches that. */
    ModelConfig wide = tiny(FAMILY_LLAMA, 1024, 16, 4, 64);
    wide.vocab_size = 32000;
    run_case("llama (wide: a large arena)", wide, 2, 512);
    printf("\n%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
