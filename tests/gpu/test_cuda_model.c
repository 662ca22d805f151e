/* test_cuda_model.c: the whole CUDA model against the CPU model with the
 * same weights (rounded to bf16, the values the GPU's bf16 copy holds) on the
 * same micro-batch: loss, logits, every parameter's gradient, the grad norm,
 * and one AdamW step. Families: llama (GQA, llama3 rope scaling, untied and
 * tied), qwen2 (q/k/v biases: the unfused q/k/v products), qwen3 (qk-norm),
 * at head dims 16, 64 and 128; mixtral and qwen3_moe (the MoE MLP of
 * cuda_model_moe.c: softmax and sigmoid routers, top 1, 2, 4 and 8,
 * renormalised or not, aux, seq_aux and global_aux losses, z-loss,
 * expert_bias, capacity drops, a shared expert, a dense layer among MoE
 * ones), where the GPU must also route every token as the CPU does (on a
 * micro-batch whose routing has no near-tie: routing_without_near_ties) and
 * compute the same auxiliary losses (1e-3). Limits (bf16 activations through 2 layers):
 * loss 1%, logits 3% of max, each gradient 5% in L2; the whole vector of
 * parameters after one AdamW step from the same gradients 1e-6 (fp32 against
 * the CPU's double arithmetic). On the first dense and the first MoE case,
 * bf16 AdamW states (optimizer.state_dtype: bf16) through a second CUDA model
 * (check_bf16_states), train.recompute (check_recompute) and the distributed
 * optimizer's moments held for this rank's parts only (check_zero1_bytes).
 * Run by `make test-gpu`; needs a GPU. MT_GPU_TEST_PART=dense or moe runs only
 * the dense or the MoE cases (the emulator's scripts run the halves side by
 * side). Ends with "N passed, N failed". */
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_device.h"
#include "model/cuda/cuda_model.h"
#include "gpu_test_util.h"
#include "model/model.h"
#include "model/model_internal.h"
#include "model/moe_layer.h"
#include "model_case.h"
#include "moe_case.h"
#include "model/optimizer.h"

static int passed, failed;

static void check(const char *what, double err, double limit) {
    if (report(what, err, limit)) passed++;
    else failed++;
}

/* One forward and backward of gpu on the micro-batch (a MoE model's routing recorded afresh); its loss, its
 * gradients into grads. */
static float forward_backward(Model *cpu, CudaModel *gpu, const int32_t *inputs, const int32_t *targets, int B, int T,
                              float *grads) {
    if (cpu->moe_step) model_moe_step_begin(cpu);
    const float loss = cuda_model_forward(gpu, inputs, targets, B, T);
    cuda_model_zero_grad(gpu);
    cuda_model_backward(gpu, 1.0f, 0);
    cuda_model_download_grads(gpu, grads);
    return loss;
}

/* train.recompute on the GPU (cuda_model_pass.c): a model built with selective and one with full recompute run the
 * same micro-batch as `plain` (no recompute; its loss and gradients given). The forward is the same code, so the
 * loss is the same bits; the backward recomputes the dropped buffers deterministically, so the gradients differ
 * from plain's only as two plain backwards do (fp32 atomics in the attention's and the embedding's backward): at
 * most 4 times that spread (relative L2 over all gradients), or 1e-5 where two backwards agree (the emulator, whose
 * atomics run in a fixed order: there they must be the same bits). Each allocates less than plain. A MoE model
 * takes both; its full recompute reruns each MoE layer's routing, which must leave the step's statistics (counts
 * per layer and expert, the auxiliary losses) as one forward left them: the same as plain's. */
static void check_recompute(Model *cpu, CudaModel *plain, const int32_t *inputs, const int32_t *targets, int B, int T,
                            float loss_plain, const float *grads_plain) {
    const long n = cpu->num_floats;
    float *again = malloc((size_t)n * sizeof(float)), *grads = malloc((size_t)n * sizeof(float));
    forward_backward(cpu, plain, inputs, targets, B, T, again);
    MoeStep plain_stats = {0}; /* a MoE model: the statistics of plain's forward (one micro-batch's) */
    if (cpu->moe_step) {
        const MoeStep *st = cpu->moe_step;
        plain_stats = *st;
        plain_stats.counts = malloc((size_t)st->num_layers * st->E * sizeof(double));
        memcpy(plain_stats.counts, st->counts, (size_t)st->num_layers * st->E * sizeof(double));
    }
    const double spread = rel_l2(again, grads_plain, n), limit = spread * 4 > 1e-5 ? spread * 4 : 1e-5;
    printf("  recompute: two plain backwards differ by %.3e (relative L2)\n", spread);
    for (int mode = RECOMPUTE_SELECTIVE; mode <= RECOMPUTE_FULL; mode++) {
        const char *name = mode == RECOMPUTE_FULL ? "full" : "selective";
        char err[512], what[96];
        CudaModel *gpu = cuda_model_create(cpu, 0, B, T, &(CudaModelOptions){.recompute = (Recompute)mode}, err,
                                           sizeof err);
        if (!gpu) {
            printf("  cannot create the CUDA model with recompute %s: %s\n", name, err);
            failed++;
            continue;
        }
        snprintf(what, sizeof what, "recompute %s: bytes over plain's", name);
        check(what, (double)cuda_model_bytes(gpu) / (double)cuda_model_bytes(plain), 1.0 - 1e-9);
        const float loss = forward_backward(cpu, gpu, inputs, targets, B, T, grads);
        snprintf(what, sizeof what, "recompute %s: loss (same bits)", name);
        check(what, fabs((double)loss - (double)loss_plain), 0.0);
        snprintf(what, sizeof what, "recompute %s: gradients (relative L2)", name);
        check(what, rel_l2(grads, grads_plain, n), limit);
        if (cpu->moe_step) { /* forward_backward began a fresh step: this run's statistics against plain's */
            const MoeStep *st = cpu->moe_step;
            const long cells = (long)st->num_layers * st->E;
            double worst = fabs(st->aux_sum - plain_stats.aux_sum) + fabs(st->z_sum - plain_stats.z_sum);
            for (long i = 0; i < cells; i++) worst += fabs(st->counts[i] - plain_stats.counts[i]);
            worst += labs(st->assignments - plain_stats.assignments) + labs(st->dropped - plain_stats.dropped);
            snprintf(what, sizeof what, "recompute %s: MoE statistics recorded once (as plain's)", name);
            check(what, worst, 0.0);
        }
        cuda_model_free(gpu);
    }
    free(plain_stats.counts);
    free(again), free(grads);
}

/* One bf16 moment against the CPU's: 0 equal, 1 one bf16 step apart (same sign), 2 further. */
static int moment_distance(uint16_t got, uint16_t ref) {
    if (got == ref || ((got | ref) & 0x7fff) == 0) return 0; /* +0 and -0 */
    if ((got ^ ref) & 0x8000) return 2;
    return abs((int)got - (int)ref) == 1 ? 1 : 2;
}

/* optimizer.state_dtype: bf16 through the CUDA model (a second one, its moments bf16 in the arena): the CPU's
 * bf16 AdamW (optimizer.c: double arithmetic, the moments stored bf16(float(.))) takes a first step from the CPU's
 * gradients; its parameters and bf16 moments go up to the GPU (cuda_model_upload with bf16 moments); both take the
 * second step; the GPU's parameters and moments come down into poisoned host arrays. The GPU computes in fp32, so
 * a moment near a rounding boundary may round the other way: every moment within one bf16 step of the CPU's and
 * at least 99.9% equal; the parameters as the fp32 states' step, 1e-6. */
static void check_bf16_states(Model *cpu, const float *before, int B, int T) {
    const long n = cpu->num_floats;
    char err[512];
    CudaModel *gpu = cuda_model_create(cpu, 0, B, T, &(CudaModelOptions){.state_dtype = DTYPE_BF16}, err, sizeof err);
    if (!gpu) {
        printf("  cannot create the CUDA model with bf16 AdamW states: %s\n", err);
        failed++;
        return;
    }
    OptimizerConfig opt = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    AdamW adam;
    adamw_init_dtype(&adam, n, DTYPE_BF16);
    memcpy(cpu->params, before, (size_t)n * sizeof(float));
    adamw_step(&adam, cpu, &opt, opt.lr, 0.5f);
    cuda_model_upload(gpu, cpu->params, adam.m_bf16, adam.v_bf16);
    cuda_model_upload_grads(gpu, cpu->grads);
    adamw_step(&adam, cpu, &opt, opt.lr, 0.5f);
    CudaAdamWStep step = {.lr = opt.lr, .beta1 = opt.beta1, .beta2 = opt.beta2, .eps = opt.eps,
                          .weight_decay = opt.weight_decay, .grad_scale = 0.5, .step = 2};
    cuda_model_adamw(gpu, &step);
    float *params = malloc((size_t)n * sizeof(float));
    uint16_t *m = malloc((size_t)n * sizeof(uint16_t)), *v = malloc((size_t)n * sizeof(uint16_t));
    memset(m, 0xff, (size_t)n * sizeof(uint16_t)); /* NaN bits: an element not written stays far off */
    memset(v, 0xff, (size_t)n * sizeof(uint16_t));
    cuda_model_download(gpu, params, m, v);
    check("bf16 states: params after the second AdamW step", rel_max(params, cpu->params, n), 1e-6);
    long equal = 0, one_step = 0, far = 0;
    for (long i = 0; i < 2 * n; i++) {
        const int d = i < n ? moment_distance(m[i], adam.m_bf16[i]) : moment_distance(v[i - n], adam.v_bf16[i - n]);
        equal += d == 0, one_step += d == 1, far += d == 2;
    }
    printf("  bf16 states: of %ld moments %ld equal, %ld one bf16 step apart, %ld further\n", 2 * n, equal, one_step,
           far);
    check("bf16 states: moments further than one bf16 step", (double)far, 0.0);
    check("bf16 states: share of moments not equal", (double)(one_step + far) / (double)(2 * n), 1e-3);
    adamw_free(&adam);
    cuda_model_free(gpu);
    free(params), free(m), free(v);
}

/* parallel.distributed_optimizer: a CUDA model holding rank 0 of dp 2's split (src/dist/zero1.h) allocates its fp32
 * master and AdamW moments for its parts only: the arena is smaller than plain's by those of the other rank's parts
 * (3 x 4 bytes a float), less its staging buffer (the largest bucket, padded) and the fp32 replica of the MoE
 * routers and expert biases, within the arena's alignment (256 bytes a buffer). The collectives and the update are
 * test_cuda_zero1.sh's and test_cuda_ops' part. */
static void check_zero1_bytes(Model *cpu, const CudaModel *plain, int B, int T) {
    const long n = cpu->num_floats;
    Comm dp = {NULL, 0, 2};
    Zero1 z;
    zero1_init(&z, &dp, (size_t)n);
    size_t pad = 0, replica = 0;
    for (int i = 0; i < zero1_num_buckets(&z); i++) {
        const Zero1Bucket b = zero1_bucket(&z, i);
        if (b.share * 2 > pad) pad = b.share * 2;
    }
    for (int i = 0; i < cpu->num_params; i++) {
        const char *name = cpu->param_info[i].name;
        if (strstr(name, ".mlp.router.weight") || strstr(name, ".mlp.router.expert_bias"))
            replica += (size_t)cpu->param_info[i].numel;
    }
    char err[512];
    CudaModel *gpu = cuda_model_create(cpu, 0, B, T, &(CudaModelOptions){.zero1 = &z}, err, sizeof err);
    if (!gpu) {
        printf("  cannot create the CUDA model with the distributed optimizer: %s\n", err);
        failed++;
        zero1_free(&z);
        return;
    }
    const double saved = (double)cuda_model_bytes(plain) - (double)cuda_model_bytes(gpu);
    const double expected = 3.0 * (double)((size_t)n - z.owned) * sizeof(float) - (double)(pad + replica) * sizeof(float);
    printf("  distributed optimizer (rank 0 of dp 2, %zu of %ld floats): %.0f bytes less, expected %.0f\n", z.owned, n,
           saved, expected);
    check("distributed optimizer: the master's and moments' bytes saved, less the expected (bytes)",
          fabs(saved - expected), 2048);
    cuda_model_free(gpu);
    zero1_free(&z);
}

/* MoE: the GPU's experts for every token and layer are the CPU's, and the auxiliary losses (load balancing and
 * z-loss, over the layers) agree. */
static void check_routing(Model *cpu, CudaModel *gpu, int N, double aux_cpu) {
    const ModelPriv *pr = cpu->priv;
    const int k = cpu->cfg.moe.num_experts_per_tok;
    int32_t *selected = malloc((size_t)N * k * sizeof(int32_t));
    long differ = 0, total = 0;
    for (int l = 0; l < cpu->part.num_layers; l++) {
        if (!pr->moe[l]) continue;
        if (!cuda_model_download_routing(gpu, l, selected)) {
            printf("  layer %d: the GPU has no MoE layer there\n", l);
            failed++;
            continue;
        }
        const MoeActs *a = pr->moe[l];
        const int E = cpu->cfg.moe.num_experts;
        for (int n = 0; n < N; n++) { /* the same set of experts (their order is the scores' order) */
            for (int j = 0; j < k; j++) {
                bool found = false;
                for (int q = 0; q < k; q++) found = found || selected[(size_t)n * k + j] == a->selected[(size_t)n * k + q];
                if (found) continue;
                differ++;
                /* the CPU's scores of the expert the GPU chose and of the CPU's k-th: a near-tie? */
                const float *sc = a->scores + (size_t)n * E;
                const int e_gpu = selected[(size_t)n * k + j], e_cpu = a->selected[(size_t)n * k + k - 1];
                printf("  layer %d token %d: gpu chose expert %d (cpu score %.6f), cpu's k-th is %d (%.6f)\n", l, n,
                       e_gpu, sc[e_gpu], e_cpu, sc[e_cpu]);
            }
        }
        total += (long)N * k;
    }
    free(selected);
    const double aux_gpu = cpu->moe_step->aux_sum + cpu->moe_step->z_sum;
    printf("  routing: %ld of %ld assignments differ; aux + z loss cpu %.6f gpu %.6f\n", differ, total, aux_cpu,
           aux_gpu);
    check("assignments routed differently", (double)differ, 0.0);
    check("aux + z loss", aux_cpu > 0 ? fabs(aux_gpu - aux_cpu) / aux_cpu : fabs(aux_gpu), 1e-3);
}

/* MoE cases compare every gradient, which a token routed to another expert changes: bf16 rounding of the
 * router's input (about 0.4%) can swap two experts whose scores nearly tie (seen: 0.14% and 0.75% apart). So the
 * micro-batch is drawn, on the CPU alone, until the CPU's routing has no gap under 1% (routing_margin); the GPU
 * must then route exactly as the CPU. */
static bool routing_without_near_ties(Model *cpu, int32_t *inputs, int32_t *targets, int B, int T) {
    Rng rng;
    for (int tries = 0; tries < 400; tries++) {
        rng_seed(&rng, 1000 + (uint64_t)tries);
        case_tokens(B * T, cpu->cfg.vocab_size, &rng, inputs, targets);
        model_moe_step_begin(cpu);
        model_forward(cpu, inputs, targets, B, T);
        const double margin = routing_margin(cpu, B * T);
        if (margin >= 1e-2) {
            printf("  micro-batch %d: the smallest routing gap is %.2f%%\n", tries, 100.0 * margin);
            return true;
        }
    }
    return false;
}

static void run_case(const char *name, ModelConfig cfg, int B, int T) {
    printf("%s: C=%d H=%d KVH=%d D=%d, B=%d T=%d%s%s\n", name, cfg.hidden_size, cfg.num_attention_heads,
           cfg.num_key_value_heads, cfg.head_dim, B, T, cfg.tie_word_embeddings ? ", tied" : "",
           cfg.rope_scaling.enabled ? ", llama3 rope" : "");
    Rng rng;
    rng_seed(&rng, 11);
    Model *cpu = cpu_case_model(&cfg, B, T, &rng);
    if (cpu->moe_step) sharpen_router(cpu);
    const int N = B * T, V = cfg.vocab_size;
    int32_t *inputs = malloc((size_t)N * sizeof(int32_t)), *targets = malloc((size_t)N * sizeof(int32_t));
    case_tokens(N, V, &rng, inputs, targets);
    if (cpu->moe_step && !routing_without_near_ties(cpu, inputs, targets, B, T)) {
        printf("  no micro-batch of 400 tried routes without a near-tie: choose another case\n");
        failed++;
        model_free(cpu);
        free(inputs);
        free(targets);
        return;
    }
    char err[512];
    CudaModel *gpu = cuda_model_create(cpu, 0, B, T, NULL, err, sizeof err);
    if (!gpu) {
        printf("  cannot create the CUDA model: %s\n", err);
        failed++;
        model_free(cpu);
        return;
    }
    const bool moe = cpu->moe_step != NULL;
    if (moe) model_moe_step_begin(cpu); /* the CPU and the GPU record their routing in the same MoeStep */
    const float loss_cpu = model_forward(cpu, inputs, targets, B, T);
    const double aux_cpu = moe ? cpu->moe_step->aux_sum + cpu->moe_step->z_sum : 0.0;
    if (moe) model_moe_step_begin(cpu);
    const float loss_gpu = cuda_model_forward(gpu, inputs, targets, B, T);
    if (moe) check_routing(cpu, gpu, N, aux_cpu);
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
    static bool recompute_checked[2]; /* the first dense case, the first MoE case */
    if (!recompute_checked[moe]) {
        recompute_checked[moe] = true;
        /* MT_GPU_TEST_RECOMPUTE=0 (the racecheck: its kernels are the plain backward's, at ThreadSanitizer's cost) */
        const char *rc = getenv("MT_GPU_TEST_RECOMPUTE");
        if (rc && strcmp(rc, "0") == 0) printf("  MT_GPU_TEST_RECOMPUTE=0: recompute left out\n");
        else check_recompute(cpu, gpu, inputs, targets, B, T, loss_gpu, grads);
        check_zero1_bytes(cpu, gpu, B, T);
    }

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
    static bool states_checked[2]; /* the first dense case, the first MoE case */
    if (!states_checked[moe]) {
        states_checked[moe] = true;
        check_bf16_states(cpu, before, B, T);
    }
    model_free(cpu);
    free(inputs); free(targets); free(logits); free(grads); free(before); free(gpu_params);
}

static void run_dense_cases(void) {
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
    /* MT_GPU_TEST_SMALL=1 (the racecheck build, whose ThreadSanitizer shadow makes its 1.8 GB of device memory
     * about 9 GB more): left out */
    if (getenv("MT_GPU_TEST_SMALL") && strcmp(getenv("MT_GPU_TEST_SMALL"), "1") == 0)
        printf("MT_GPU_TEST_SMALL=1: llama (wide: a large arena) left out\n");
    else
        run_case("llama (wide: a large arena)", wide, 2, 512);
}

static void run_moe_cases(void) {
    ModelConfig mixtral = moe_case(FAMILY_MIXTRAL, 8, 2, LB_AUX_LOSS);
    mixtral.moe.z_loss_coeff = 1e-3;
    run_case("mixtral (8 experts, top 2, aux loss, z-loss)", mixtral, 2, 32);
    ModelConfig qwen3_moe = moe_case(FAMILY_QWEN3_MOE, 16, 4, LB_SEQ_AUX_LOSS);
    qwen3_moe.moe.norm_topk_prob = false;
    qwen3_moe.moe.shared_expert_intermediate_size = 48;
    qwen3_moe.moe.layer_mask_given = true; /* layer 0 MoE, layer 1 dense */
    qwen3_moe.moe.layer_mask[0] = 1;
    qwen3_moe.moe.layer_mask[1] = 0;
    run_case("qwen3_moe (16 experts, top 4, seq aux, shared expert, a dense layer)", qwen3_moe, 2, 32);
    ModelConfig sigmoid = moe_case(FAMILY_MIXTRAL, 16, 1, LB_EXPERT_BIAS);
    sigmoid.moe.score_function = SCORE_SIGMOID;
    sigmoid.moe.z_loss_coeff = 1e-3;
    run_case("mixtral (sigmoid, top 1 of 16, expert_bias, z-loss)", sigmoid, 2, 16);
    ModelConfig all = moe_case(FAMILY_MIXTRAL, 8, 8, LB_GLOBAL_AUX_LOSS);
    run_case("mixtral (top 8 of 8: every expert every token, global aux)", all, 1, 32);
    ModelConfig capacity = moe_case(FAMILY_MIXTRAL, 4, 2, LB_AUX_LOSS);
    capacity.moe.capacity_factor = 0.5;
    run_case("mixtral (capacity 0.5: drops)", capacity, 2, 32);
}

int main(void) {
    const char *part = getenv("MT_GPU_TEST_PART");
    const bool all = !part || !*part, dense = all || strcmp(part, "dense") == 0, moe = all || strcmp(part, "moe") == 0;
    if (!dense && !moe) {
        fprintf(stderr, "MT_GPU_TEST_PART=%s: expected dense or moe\n", part);
        return 2;
    }
    if (cuda_device_count() == 0) {
        printf("skip: no GPU\n");
        return 77;
    }
    if (dense) run_dense_cases();
    if (moe) run_moe_cases();
    printf("\n%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

