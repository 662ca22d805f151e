/* test_cuda_plan.c: `megatrain plan`'s estimate for run.device cuda against
 * what the CUDA model allocates. A stage's total (src/plan/plan.c: weights,
 * gradients, AdamW states, the activation sets in flight, the recompute
 * working set, the backward's scratch and tables, the logits) against the
 * model's arena (cuda_model_bytes) and a pipeline's further activation sets
 * (cuda_model_activation_bytes each): everything megatrain allocates on the
 * GPU but cuBLASLt's workspace (and the CUDA context, NCCL's buffers), which
 * plan leaves to the user's margin. Never above it, and below by at most
 * 0.03% (the buffers' 256-byte alignment; 0.015% at most measured) for dense and MoE models, each
 * recompute mode, bf16 AdamW states, tensor parallel with and without
 * sequence parallel, context parallel, expert parallel, the distributed
 * optimizer at dp 2 and the first stage of pp 2 (with vpp 2): tp, cp, ep, dp
 * rank 0 of the layout, small shapes, seq 256, micro-batches of 2. Nothing
 * runs on the device but the arena's zeroing and the weights' upload, so the
 * emulator checks it as a GPU does. Then that sequence parallel keeps 1 / tp
 * of what it splits: at tp 2 an activation set with it is smaller than one
 * without by at least each layer's four hidden-sized rows' other half (the
 * gathered norm outputs are not kept; before 2026-11-29 they were, and sp
 * saved nothing at tp 2). And that under ep the arena holds a balanced
 * routing's rows for the rank's experts, not the worst case's (a layer given
 * more takes the rest as it goes: cuda_model_moe.c). Ends with "N passed, N
 * failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "config/recipe.h"
#include "config/recipe_schema.h"
#include "dist/zero1.h"
#include "model/cuda/cuda_model.h"
#include "model/model.h"
#include "plan/plan.h"

typedef struct Case {
    const char *arch;
    int tp, cp;
    bool sp;
    Recompute mode;
    DType states;
    bool zero1; /* dp 2 */
    int ep;     /* expert parallel over dp (ep ranks: dp ep) */
    int pp, vpp; /* 0: 1; stage 0 is compared, with its activation sets in flight */
    double capacity; /* MoE: the capacity_factor (0: dropless) */
} Case;

static const Case cases[] = {
    {"qwen3-0.6b", 1, 1, false, RECOMPUTE_NONE, DTYPE_FP32, false, 0, 0, 0, 0},
    {"qwen3-0.6b", 1, 1, false, RECOMPUTE_SELECTIVE, DTYPE_FP32, false, 0, 0, 0, 0},
    {"qwen3-0.6b", 1, 1, false, RECOMPUTE_FULL, DTYPE_BF16, false, 0, 0, 0, 0},
    {"qwen3-0.6b", 1, 1, false, RECOMPUTE_NONE, DTYPE_FP32, true, 0, 0, 0, 0},
    {"qwen2.5-0.5b", 2, 1, false, RECOMPUTE_NONE, DTYPE_FP32, false, 0, 0, 0, 0},
    {"qwen2.5-0.5b", 2, 1, true, RECOMPUTE_SELECTIVE, DTYPE_FP32, false, 0, 0, 0, 0},
    {"qwen2.5-0.5b", 1, 2, false, RECOMPUTE_NONE, DTYPE_FP32, false, 0, 0, 0, 0},
    {"qwen2.5-0.5b", 2, 2, true, RECOMPUTE_FULL, DTYPE_FP32, false, 0, 0, 0, 0},
    {"qwen3-30b-a3b", 1, 1, false, RECOMPUTE_NONE, DTYPE_FP32, false, 0, 0, 0, 0},
    {"qwen3-30b-a3b", 1, 1, false, RECOMPUTE_FULL, DTYPE_FP32, true, 0, 0, 0, 0},
    {"mixtral-8x7b", 2, 1, true, RECOMPUTE_NONE, DTYPE_BF16, false, 0, 0, 0, 0},
    {"mixtral-8x7b", 1, 1, false, RECOMPUTE_SELECTIVE, DTYPE_FP32, false, 2, 0, 0, 0},
    {"qwen3-30b-a3b", 1, 1, false, RECOMPUTE_FULL, DTYPE_FP32, true, 2, 0, 0, 0},
    {"qwen3-0.6b", 1, 1, false, RECOMPUTE_NONE, DTYPE_FP32, false, 0, 2, 2, 0},
    {"qwen2.5-0.5b", 2, 1, true, RECOMPUTE_SELECTIVE, DTYPE_BF16, false, 0, 2, 1, 0},
    /* MoE full recompute: the one working set of a MoE layer's device buffers under pp x vpp, tp + sp, ep x pp, cp */
    {"qwen3-30b-a3b", 1, 1, false, RECOMPUTE_FULL, DTYPE_FP32, false, 0, 2, 2, 0},
    {"mixtral-8x7b", 2, 1, true, RECOMPUTE_FULL, DTYPE_BF16, false, 0, 0, 0, 0},
    {"mixtral-8x7b", 1, 1, false, RECOMPUTE_FULL, DTYPE_FP32, false, 2, 2, 1, 0},
    {"mixtral-8x7b", 1, 2, false, RECOMPUTE_FULL, DTYPE_FP32, false, 0, 0, 0, 0},
    /* a capacity at ep 2: its rows at most a balanced routing's (capacity 1) or more (1.25: the room the same) */
    {"mixtral-8x7b", 1, 1, false, RECOMPUTE_NONE, DTYPE_FP32, false, 2, 0, 0, 1.0},
    {"qwen3-30b-a3b", 1, 1, false, RECOMPUTE_FULL, DTYPE_FP32, true, 2, 2, 1, 1.25},
    /* the distributed optimizer's staging: both regions under ep smaller than a bucket */
    {"mixtral-8x7b", 1, 1, false, RECOMPUTE_NONE, DTYPE_FP32, true, 2, 2, 1, 0},
};

static int passed, failed;

static int ep_of(const Case *c) { return c->ep > 1 ? c->ep : 1; }
static int dp_of(const Case *c) { return c->zero1 || c->ep > 1 ? 2 : 1; }
static int pp_of(const Case *c) { return c->pp > 1 ? c->pp : 1; }
static int vpp_of(const Case *c) { return c->vpp > 1 ? c->vpp : 1; }
static int world_of(const Case *c) { return c->tp * c->cp * dp_of(c) * pp_of(c); }

/* The recipe of a case: ARCH's family (its norms, biases, router) cut to 2 layers of hidden size 512 (8 heads of
 * 64, 2 kv heads), intermediate 1024, a vocabulary of 4096 and (MoE) 8 experts of intermediate 256, so that the
 * weights' upload (a kernel on the emulator) is short; 4 micro-batches a step; its model part for tp rank 0, cp
 * rank 0 and pipeline stage 0. */
static int case_recipe(Recipe *r, const Case *c, const char *dir, ModelPartition *part) {
    char path[512], text[1024], err[1024];
    snprintf(path, sizeof path, "%s/plan.yaml", dir);
    snprintf(text, sizeof text,
             "run: {name: p, device: cuda}\nmodel: configs/%s.yaml\n"
             "parallel: {tp: %d, cp: %d, ep: %d, pp: %d, vpp: %d, sequence_parallel: %s,\n"
             "           distributed_optimizer: %s}\n"
             "train: {steps: 10, seq_len: 256, micro_batch_size: 2, global_batch_size: %d, recompute: %s}\n"
             "optimizer: {state_dtype: %s}\n"
             "data: {train: [{path: x, weight: 1.0}]}\n",
             c->arch, c->tp, c->cp, ep_of(c), pp_of(c), vpp_of(c), c->sp ? "true" : "false",
             c->zero1 ? "true" : "false", 8 * dp_of(c), recompute_names[c->mode],
             c->states == DTYPE_BF16 ? "bf16" : "fp32");
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fputs(text, f);
    fclose(f);
    if (recipe_load(r, path, NULL, 0, world_of(c), err, sizeof err) != 0) {
        printf("  %s: %s\n", c->arch, err);
        return -1;
    }
    r->model.num_layers = 2 * pp_of(c) * vpp_of(c);
    r->model.vocab_size = 4096;
    r->model.hidden_size = 512;
    r->model.num_attention_heads = 8;
    r->model.num_key_value_heads = 2;
    r->model.head_dim = 64;
    r->model.intermediate_size = 1024;
    if (r->model.moe.num_experts > 0) {
        r->model.moe.num_experts = 8;
        r->model.moe.moe_intermediate_size = 256;
        r->model.moe.layer_freq = 1;
        if (r->model.moe.num_experts_per_tok > 4) r->model.moe.num_experts_per_tok = 4;
        r->model.moe.capacity_factor = c->capacity;
    }
    *part = model_partition_whole(&r->model);
    part->tp = c->tp;
    part->sequence_parallel = c->sp;
    part->cp = c->cp;
    part->ep = ep_of(c);
    part->num_chunks = vpp_of(c);
    part->num_layers = 0;
    for (int v = 0; v < vpp_of(c); v++) {
        parallel_stage_layers(&r->parallel, r->model.num_layers, v * pp_of(c), &part->chunk_first[v],
                              &part->chunk_layers[v]);
        part->num_layers += part->chunk_layers[v];
    }
    part->has_head = pp_of(c) == 1;
    return 0;
}

static void check_case(const Case *c, const char *dir) {
    static Recipe r;
    static Plan p;
    char err[1024];
    ModelPartition part;
    if (case_recipe(&r, c, dir, &part) != 0 || plan_compute(&p, &r, world_of(c), err, sizeof err) != 0) {
        printf("  %s: no plan\n", c->arch);
        failed++;
        return;
    }
    Model *host = model_create_recompute(&r.model, &part, &cpu_backend, 0, 0, RECOMPUTE_NONE); /* the registry */
    /* dp rank 0's split, as model_device.c makes it: under ep the routed experts (the flat array's end) over edp */
    Comm dp = {NULL, 0, 2}, edp = {NULL, 0, 2 / ep_of(c)};
    Zero1 z;
    size_t dense = (size_t)host->num_floats;
    for (int i = 0; i < host->num_params; i++)
        if (host->param_info[i].expert && host->param_info[i].offset < dense) dense = host->param_info[i].offset;
    if (c->zero1) zero1_init_split(&z, &dp, dense, &edp, (size_t)host->num_floats, 1.0f / (float)ep_of(c));
    const CudaModelOptions options = {.state_dtype = c->states, .recompute = c->mode, .zero1 = c->zero1 ? &z : NULL};
    CudaModel *gpu = cuda_model_create(host, 0, 2, 256 / c->cp, &options, err, sizeof err);
    if (!gpu) {
        printf("  %s: cannot create the CUDA model: %s\n", c->arch, err);
        failed++;
    } else {
        const PlanStage *st = &p.stages[0];
        /* the base's arena, and each further set in flight a clone's activations (pipeline.c's slots) */
        const double allocated = (double)cuda_model_bytes(gpu) +
                                 (st->in_flight - 1) * (double)cuda_model_activation_bytes(gpu);
        const double planned = st->total_bytes, off = (planned - allocated) / allocated;
        const bool ok = off <= 1e-9 && off >= -3e-4; /* plan leaves out only the buffers' alignment */
        printf("  %-13s tp %d%s cp %d ep %d dp %d pp %d vpp %d recompute %-9s states %s%s: plan %.3f MiB (weights "
               "%.3f, grads %.3f, AdamW %.3f, activations %.3f: %g sets, scratch %.3f; logits %.3f), allocated %.3f "
               "MiB (%+.4f%%) %s\n", c->arch, c->tp, c->sp ? " sp" : "", c->cp, ep_of(c), dp_of(c), pp_of(c),
               vpp_of(c), recompute_names[c->mode], dtype_name(c->states), c->zero1 ? " zero1" : "",
               planned / 1048576.0, st->weight_bytes / 1048576.0, st->grad_bytes / 1048576.0,
               st->optimizer_bytes / 1048576.0, st->activation_bytes / 1048576.0, st->in_flight,
               st->scratch_bytes / 1048576.0, st->logits_bytes / 1048576.0, allocated / 1048576.0, 100.0 * off,
               ok ? "ok" : "FAILED");
        if (ok) passed++;
        else failed++;
        cuda_model_free(gpu);
    }
    if (c->zero1) zero1_free(&z);
    model_free(host);
}

/* The activation set of case c's shape (one clone's arena: cuda_model_activation_bytes), micro-batches of 2 x 256;
 * the recipe it was made from into *made (NULL where the recipe could not be read). Returns -1 on failure. */
static double activation_set_bytes(const Case *c, const char *dir, const Recipe **made) {
    static Recipe r;
    char err[1024];
    ModelPartition part;
    *made = NULL;
    if (case_recipe(&r, c, dir, &part) != 0) return -1;
    Model *host = model_create_recompute(&r.model, &part, &cpu_backend, 0, 0, RECOMPUTE_NONE);
    const CudaModelOptions options = {.state_dtype = DTYPE_FP32, .recompute = RECOMPUTE_NONE};
    CudaModel *gpu = cuda_model_create(host, 0, 2, 256, &options, err, sizeof err);
    double bytes = -1;
    if (gpu) bytes = (double)cuda_model_activation_bytes(gpu);
    else printf("  cannot create the CUDA model: %s\n", err);
    *made = &r;
    cuda_model_free(gpu);
    model_free(host);
    return bytes;
}

static void check_sequence_parallel_saves(const char *dir) {
    /* qwen2.5-0.5b's case shape at tp 2, dense, without recompute, with or without sp */
    const Case without = {"qwen2.5-0.5b", 2, 1, false, RECOMPUTE_NONE, DTYPE_FP32, false, 0, 0, 0, 0},
               with = {"qwen2.5-0.5b", 2, 1, true, RECOMPUTE_NONE, DTYPE_FP32, false, 0, 0, 0, 0};
    const Recipe *r;
    const double plain = activation_set_bytes(&without, dir, &r), sp = activation_set_bytes(&with, dir, &r);
    if (!r) {
        failed++;
        return;
    }
    const double L = r->model.num_layers, N = 2.0 * 256, C = r->model.hidden_size;
    /* a layer's input, normed input, mid residual and normed mid: half of each in bf16 */
    const double expected = L * N * 4 * C / 2 * 2.0;
    const bool ok = plain > 0 && sp > 0 && plain - sp >= expected;
    printf("  tp 2: an activation set %.3f MiB, with sequence parallel %.3f MiB: %.3f MiB less (at least %.3f "
           "expected) %s\n", plain / 1048576.0, sp / 1048576.0, (plain - sp) / 1048576.0, expected / 1048576.0,
           ok ? "ok" : "FAILED");
    if (ok) passed++;
    else failed++;
}

/* Under ep the arena holds a quarter more than a balanced routing's rows for the rank's experts (at ep 1 it holds
 * N k, all of its rows), and keeps for each the received row and its order both ways besides: 4 experts of top 2
 * at ep 2 are given room for 1.25 N k rows, not for every token's two rows from both ranks, 2 N k (before
 * 2026-12-01 they were). */
static void check_expert_room(const char *dir) {
    /* mixtral's case shape at dp 2, dropless, without recompute: ep 1 (dp 2 from ZeRO-1) and ep 2 */
    const Case one = {"mixtral-8x7b", 1, 1, false, RECOMPUTE_NONE, DTYPE_FP32, true, 0, 0, 0, 0},
               two = {"mixtral-8x7b", 1, 1, false, RECOMPUTE_NONE, DTYPE_FP32, false, 2, 0, 0, 0};
    const Recipe *r;
    const double ep1 = activation_set_bytes(&one, dir, &r), ep2 = activation_set_bytes(&two, dir, &r);
    if (!r) {
        failed++;
        return;
    }
    const double N = 2.0 * 256, layers = r->model.num_layers, k = r->model.moe.num_experts_per_tok;
    const double room = 1.25 * N * k, Ie = r->model.moe.moe_intermediate_size;
    /* per layer: the room's received rows and order, and its gate|up and activation past ep 1's N k rows */
    const double expected = layers * (room * (r->model.hidden_size * 2.0 + 8.0) + (room - N * k) * 3.0 * Ie * 2.0);
    const bool ok = ep1 > 0 && ep2 > 0 && fabs((ep2 - ep1) - expected) <= layers * 4 * 512.0;
    printf("  an activation set at ep 1 %.3f MiB, at ep 2 %.3f MiB: %.3f MiB more (%.3f expected: room for 1.25 N k "
           "rows) %s\n", ep1 / 1048576.0, ep2 / 1048576.0, (ep2 - ep1) / 1048576.0, expected / 1048576.0,
           ok ? "ok" : "FAILED");
    if (ok) passed++;
    else failed++;
}

int main(void) {
    char dir[] = "/tmp/test_cuda_plan.XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    printf("plan's estimate against the CUDA model's arena:\n");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(&cases[i], dir);
    printf("sequence parallel's activations:\n");
    check_sequence_parallel_saves(dir);
    printf("the expert side's room under ep:\n");
    check_expert_room(dir);
    char path[600];
    snprintf(path, sizeof path, "%s/plan.yaml", dir);
    unlink(path);
    rmdir(dir);
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
