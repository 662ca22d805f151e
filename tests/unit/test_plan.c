/* test_plan.c: `megatrain plan`'s estimates (src/plan/plan.c) against counts
 * that can be made another way: every parameter held exactly once over the
 * stages and tp ranks (norms on every tp rank; the tied head's copy on the
 * last stage), every layer on exactly one (virtual) stage, the 1F1B
 * in-flight counts, ZeRO-1's sharding of the optimizer states, bf16
 * optimizer states (4 bytes of moments per parameter instead of 8, on both
 * devices, with and without ZeRO-1), LoRA's frozen base (gradients and
 * moments of the adapters only), and FLOPs per step = Megatron's FLOPs
 * per token x tokens per step; and plan_fit's fewest ranks against a
 * brute-force walk of its space. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "config/recipe.h"
#include "backend/backend.h"
#include "model/model.h"
#include "plan/plan.h"
#include "dist/dp_sync.h"
#include "dist/pipeline_schedule.h"
#include "test_work_dir.h"

/* A recipe on configs/ARCH (tests run from the repository's root) with the
 * given layout; `zero1` turns the distributed optimizer on. */
static void load(Recipe *r, const char *arch, int tp, int pp, int vpp, int world, int zero1) {
    char path[512], text[2048], err[1024];
    snprintf(path, sizeof path, "%s/plan.yaml", work_dir);
    snprintf(text, sizeof text,
             "run: {name: p, device: cuda}\nmodel: configs/%s.yaml\n"
             "parallel: {tp: %d, pp: %d, vpp: %d, distributed_optimizer: %s}\n"
             "train: {steps: 10, seq_len: 512, micro_batch_size: 2, global_batch_size: 64}\n"
             "data: {train: [{path: x, weight: 1.0}]}\n",
             arch, tp, pp, vpp, zero1 ? "true" : "false");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    if (recipe_load(r, path, NULL, 0, world, err, sizeof err) != 0) fail_msg("%s", err);
}

/* Parameters on every tp rank of a stage: the norms (and the final norm). */
static double replicated(const ModelConfig *m, int layers, int final_norm) {
    const double D = m->head_dim > 0 ? m->head_dim : (double)m->hidden_size / m->num_attention_heads;
    return layers * (2.0 * m->hidden_size + (m->qk_norm ? 2.0 * D : 0.0)) + (final_norm ? m->hidden_size : 0);
}

/* MoE: every expert is held by one ep rank of each stage, the rest by every one. */
static void test_moe_params_once(void **state) {
    (void)state;
    static Recipe r;
    static Plan p;
    char path[512], err[1024];
    snprintf(path, sizeof path, "%s/moe.yaml", work_dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("run: {name: p, device: cpu}\nmodel: configs/mixtral-8x7b.yaml\n"
          "parallel: {pp: 4, ep: 4}\n"
          "train: {steps: 10, seq_len: 512, micro_batch_size: 1, global_batch_size: 64}\n"
          "data: {train: [{path: x, weight: 1.0}]}\n", f);
    fclose(f);
    if (recipe_load(&r, path, NULL, 0, 16, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(plan_compute(&p, &r, 16, err, sizeof err), 0);
    double sum = 0.0;
    for (int s = 0; s < 4; s++) sum += (p.stages[s].params - p.stages[s].expert_params) + 4 * p.stages[s].expert_params;
    printf("  mixtral-8x7b   pp 4 ep 4: %.0f parameters over the ranks, expected %.0f\n", sum, p.total_params);
    assert_true(sum == p.total_params);
    assert_true(p.stages[1].expert_params > 0.8 * p.stages[1].params); /* the experts dominate */
}

static void check_params_once(const char *arch, int tp, int pp, int vpp) {
    static Recipe r;
    static Plan p;
    char err[512];
    load(&r, arch, tp, pp, vpp, tp * pp, 0);
    assert_int_equal(plan_compute(&p, &r, tp * pp, err, sizeof err), 0);
    const ModelConfig *m = &r.model;
    double sum = 0.0;
    int layers_seen[512] = {0};
    for (int s = 0; s < pp; s++) {
        const PlanStage *st = &p.stages[s];
        int layers = 0;
        for (int v = 0; v < st->num_chunks; v++)
            for (int l = st->first_layer[v]; l < st->first_layer[v] + st->num_layers[v]; l++, layers++) layers_seen[l]++;
        const double rep = replicated(m, layers, st->final_norm);
        sum += (st->params - rep) * tp + rep; /* tp shards of the rest */
    }
    for (int l = 0; l < m->num_layers; l++) assert_int_equal(layers_seen[l], 1);
    double expect = (double)model_count_params(m);
    if (m->tie_word_embeddings && pp > 1) expect += (double)m->vocab_size * m->hidden_size; /* the head's copy */
    printf("  %-14s tp %d pp %d vpp %d: %.0f parameters over the ranks, expected %.0f\n", arch, tp, pp, vpp, sum,
           expect);
    assert_true(fabs(sum - expect) < 0.5);
}

static void test_every_parameter_once(void **state) {
    (void)state;
    check_params_once("llama3-8b", 1, 1, 1);
    check_params_once("llama3-8b", 2, 2, 1);
    check_params_once("llama3-8b", 4, 4, 2);
    check_params_once("llama3.2-1b", 2, 4, 1);  /* tied: the last stage's copy */
    check_params_once("qwen2.5-7b", 2, 2, 1);   /* biases */
    check_params_once("qwen3-8b", 2, 2, 3);     /* qk-norm; 36 layers over 2 x 3 virtual stages */
}

static void test_schedule_and_sharding(void **state) {
    (void)state;
    static Recipe r;
    static Plan p, zero1;
    char err[512];
    load(&r, "llama3-8b", 2, 4, 1, 32, 0);
    assert_int_equal(plan_compute(&p, &r, 32, err, sizeof err), 0);
    assert_int_equal(p.grid.dp, 4);
    assert_true(fabs(p.micro_batches - 64.0 / (2 * 4)) < 1e-9);
    for (int s = 0; s < 4; s++) assert_true(fabs(p.stages[s].in_flight - (4 - s)) < 1e-9); /* 1F1B: pp - s */
    const double tokens = 64.0 * 512;
    assert_true(fabs(p.flops_per_step - model_flops_per_token(&r.model, 512) * tokens) < 1.0);
    assert_true(fabs(p.flops_per_rank * 32 - p.flops_per_step) < 1.0);
    load(&r, "llama3-8b", 2, 4, 1, 32, 1);
    assert_int_equal(plan_compute(&zero1, &r, 32, err, sizeof err), 0);
    for (int s = 0; s < 4; s++) {
        assert_true(fabs(zero1.stages[s].optimizer_bytes * 4 - p.stages[s].optimizer_bytes) < 1.0);
        assert_true(zero1.stages[s].weight_bytes < p.stages[s].weight_bytes); /* the GPU's fp32 master sharded */
        assert_true(fabs(zero1.stages[s].activation_bytes - p.stages[s].activation_bytes) < 1.0);
    }
    /* interleaved: one activation set of all the stage's chunks per micro-batch in flight, the schedule's peak
     * (on stage 0 of pp 4, vpp 2: more than 1F1B's 4), and as many sets of logits on the last stage */
    static Plan vpp;
    load(&r, "llama3-8b", 2, 4, 2, 32, 0);
    assert_int_equal(plan_compute(&vpp, &r, 32, err, sizeof err), 0);
    for (int s = 0; s < 4; s++) {
        assert_true(fabs(vpp.stages[s].in_flight - pipeline_peak_in_flight(4, 2, s, 8)) < 1e-9);
        /* the same layers per set (the scratch once per stage on a GPU) */
        assert_true(fabs(vpp.stages[s].scratch_bytes - p.stages[s].scratch_bytes) < 1.0);
        assert_true(fabs((vpp.stages[s].activation_bytes - vpp.stages[s].scratch_bytes) / vpp.stages[s].in_flight -
                         (p.stages[s].activation_bytes - p.stages[s].scratch_bytes) / p.stages[s].in_flight) < 1.0);
    }
    assert_true(vpp.stages[0].in_flight > 4);
    assert_true(fabs(vpp.stages[3].logits_bytes / vpp.stages[3].in_flight - p.stages[3].logits_bytes) < 1.0);
}

/* The memory check names the key most of the estimate comes from, and passes what fits. */
/* optimizer.state_dtype: bf16 halves the moments (8 -> 4 bytes per parameter) and nothing else, on both devices,
 * sharded over dp by the distributed optimizer as fp32 states are. */
static void test_bf16_states(void **state) {
    (void)state;
    static Recipe r;
    static Plan fp32, bf16;
    char err[512];
    for (int device = 0; device < 2; device++)
        for (int zero1 = 0; zero1 < 2; zero1++) {
            load(&r, "llama3-8b", 2, 4, 1, 32, zero1); /* dp 4 */
            snprintf(r.run.device, sizeof r.run.device, "%s", device ? "cuda" : "cpu");
            assert_int_equal(r.optimizer.state_dtype, DTYPE_FP32);
            assert_int_equal(plan_compute(&fp32, &r, 32, err, sizeof err), 0);
            r.optimizer.state_dtype = DTYPE_BF16;
            assert_int_equal(plan_compute(&bf16, &r, 32, err, sizeof err), 0);
            const double dp = zero1 ? 4.0 : 1.0;
            for (int s = 0; s < 4; s++) {
                const PlanStage *a = &fp32.stages[s], *b = &bf16.stages[s];
                assert_true(a->params > 0 && fabs(a->params - b->params) < 0.5);
                assert_true(fabs(a->optimizer_bytes - 8.0 * a->params / dp) < 1.0);
                assert_true(fabs(b->optimizer_bytes - 4.0 * b->params / dp) < 1.0);
                assert_true(fabs(a->weight_bytes - b->weight_bytes) < 1.0);
                assert_true(fabs(a->grad_bytes - b->grad_bytes) < 1.0);
                assert_true(fabs(a->activation_bytes - b->activation_bytes) < 1.0);
                assert_true(fabs((a->total_bytes - b->total_bytes) - 4.0 * a->params / dp) < 1.0);
            }
        }
}

/* The distributed optimizer with expert parallel: the dense parameters' moments (and on a GPU the fp32 master)
 * shard over dp, the routed experts' over the expert-data-parallel group, dp / ep (the ep ranks already split the
 * experts): Mixtral 8x7B on 32 ranks, pp 4, ep 4 (dp 8, edp 2), on both devices. */
static void test_zero1_experts(void **state) {
    (void)state;
    static Recipe r;
    static Plan p;
    char err[512];
    for (int device = 0; device < 2; device++) {
        load(&r, "mixtral-8x7b", 1, 4, 1, 32, 1);
        snprintf(r.run.device, sizeof r.run.device, "%s", device ? "cuda" : "cpu");
        r.parallel.ep = 4;
        assert_int_equal(plan_compute(&p, &r, 32, err, sizeof err), 0);
        assert_int_equal(p.grid.dp, 8);
        for (int s = 0; s < 4; s++) {
            const PlanStage *st = &p.stages[s];
            const double dense = st->params - st->expert_params, experts = st->expert_params;
            assert_true(experts > dense);
            assert_true(fabs(st->optimizer_bytes - (8.0 * dense / 8 + 8.0 * experts / 2)) < 1.0);
            if (device) { /* bf16 copies of all, the fp32 master sharded like the moments, the staging bucket */
                const double master = 4.0 * dense / 8 + 4.0 * experts / 2;
                assert_true(fabs(st->weight_bytes - (2.0 * st->params + master + (double)DP_BUCKET_BYTES +
                                                     4.0 * st->router_params)) < 1.0);
            }
        }
    }
}

static void test_memory_driver(void **state) {
    (void)state;
    static Recipe r;
    static Plan p;
    char err[1024], msg[1024];
    const double GiB = 1073741824.0;
    load(&r, "llama3-8b", 1, 1, 1, 1, 0);
    assert_int_equal(plan_compute(&p, &r, 1, err, sizeof err), 0);
    assert_null(plan_check_fit(&p, &r, 1e6 * GiB, "the device's memory", msg, sizeof msg));
    const char *key = plan_check_fit(&p, &r, 16 * GiB, "the device's memory", msg, sizeof msg);
    assert_non_null(key);
    assert_string_equal(key, "model.intermediate_size"); /* 3 x 4096 x 14336 x 32 of the 8B parameters */
    if (!strstr(msg, "stage 0 needs about ") || !strstr(msg, "more than the device's memory (16.0 GiB)") ||
        !strstr(msg, "most of it is the MLP weights (model.intermediate_size = 14336)"))
        fail_msg("%s", msg);
    r.model.vocab_size = 4000000; /* embedding and lm_head: 2 x 4M x 4096 */
    assert_int_equal(plan_compute(&p, &r, 1, err, sizeof err), 0);
    assert_string_equal(plan_check_fit(&p, &r, 16 * GiB, "the device's memory", msg, sizeof msg), "model.vocab_size");
    assert_non_null(strstr(msg, "the embedding (model.vocab_size = 4000000 x model.hidden_size = 4096)"));
    r.model.vocab_size = 128256;
    r.train.micro_batch_size = 256; /* 256 x 512 tokens of activations */
    assert_int_equal(plan_compute(&p, &r, 1, err, sizeof err), 0);
    assert_string_equal(plan_check_fit(&p, &r, 16 * GiB, "the device's memory", msg, sizeof msg),
                        "train.micro_batch_size");
    /* on the CPU the check is against this host's memory and swap, before anything is allocated */
    r.train.micro_batch_size = 2;
    r.model.intermediate_size = 2000000000;
    snprintf(r.run.device, sizeof r.run.device, "cpu");
    assert_int_equal(plan_check_memory(&r, 1, err, sizeof err), -1);
    const char *start = "model.intermediate_size: the model does not fit: stage 0 needs about ";
    if (strncmp(err, start, strlen(start)) != 0 ||
        !strstr(err, "more than this host's memory and swap ("))
        fail_msg("%s", err);
    r.model.num_layers = 2; /* a tiny model fits any host */
    r.model.hidden_size = 64;
    r.model.num_attention_heads = 4;
    r.model.num_key_value_heads = 2;
    r.model.head_dim = 16;
    r.model.intermediate_size = 192;
    r.model.vocab_size = 256;
    assert_int_equal(plan_check_memory(&r, 1, err, sizeof err), 0);
}

/* The largest stage's estimate of r on world ranks. */
static double worst_total(const Recipe *r, int world) {
    static Plan q;
    char err[512];
    if (plan_compute(&q, r, world, err, sizeof err) != 0) fail_msg("%s", err);
    return q.stages[plan_worst_stage(&q)].total_bytes;
}

/* plan_levers: each lever's estimate is plan_compute's on the recipe with that one setting changed; only levers
 * that apply and save are offered (ZeRO-1 not at dp 1, sequence parallel not at tp 1, nothing already set), the
 * lowest estimate first; plan_check_fit's advice lists them, then the ranks to raise for what drives the stage. */
static void test_levers(void **state) {
    (void)state;
    static Recipe r, alt;
    static Plan p;
    char err[512], msg[2048];
    PlanLever lv[8];
    const double GiB = 1073741824.0;
    load(&r, "llama3-8b", 2, 2, 1, 8, 0); /* dp 2: the distributed optimizer applies */
    r.train.seq_len = 4096;
    r.train.micro_batch_size = 4;
    assert_int_equal(plan_compute(&p, &r, 8, err, sizeof err), 0);
    const int n = plan_levers(&p, &r, lv, 8);
    const char *want[] = {"train.recompute: selective", "train.recompute: full", "optimizer.state_dtype: bf16",
                          "parallel.distributed_optimizer: true", "parallel.sequence_parallel: true",
                          "train.micro_batch_size: 2"};
    const double now = p.stages[plan_worst_stage(&p)].total_bytes;
    int offered = 0;
    for (int w = 0; w < 6; w++) {
        int found = -1;
        for (int i = 0; i < n; i++)
            if (!strcmp(lv[i].setting, want[w])) found = i;
        alt = r;
        if (w == 0) alt.train.recompute = RECOMPUTE_SELECTIVE;
        if (w == 1) alt.train.recompute = RECOMPUTE_FULL;
        if (w == 2) alt.optimizer.state_dtype = DTYPE_BF16;
        if (w == 3) alt.parallel.distributed_optimizer = true;
        if (w == 4) alt.parallel.sequence_parallel = true;
        if (w == 5) alt.train.micro_batch_size = 2;
        const double with = worst_total(&alt, 8);
        printf("  %-38s %.2f GiB (now %.2f)%s\n", want[w], with / GiB, now / GiB, found < 0 ? ": not offered" : "");
        if (found < 0) { /* offered exactly when it saves */
            assert_true(with >= 0.995 * now);
            continue;
        }
        offered++;
        assert_true(lv[found].total_bytes == with);
        assert_true(with < 0.995 * now);
    }
    /* all six save here, sequence parallel too: the GPU keeps 1 / tp of the normed rows and gathers them again
     * for the backward (before 2026-11-29 it kept them gathered, and sp at tp 2 saved nothing) */
    assert_int_equal(offered, n);
    assert_int_equal(n, 6);
    for (int i = 1; i < n; i++) assert_true(lv[i - 1].total_bytes <= lv[i].total_bytes);
    /* the advice names them, the largest saving first, then the ranks */
    assert_non_null(plan_check_fit(&p, &r, 8 * GiB, "the device's memory", msg, sizeof msg));
    char first[128];
    snprintf(first, sizeof first, "; on the same ranks: %s (", lv[0].setting);
    if (!strstr(msg, first) || !strstr(msg, "; with more ranks: raise ")) fail_msg("%s", msg);
    /* at dp 1 and tp 1, with full recompute, bf16 states and micro-batches of 1 already: no lever is left but
     * more ranks */
    load(&r, "llama3-8b", 1, 1, 1, 1, 0);
    r.train.recompute = RECOMPUTE_FULL;
    r.optimizer.state_dtype = DTYPE_BF16;
    r.train.micro_batch_size = 1;
    assert_int_equal(plan_compute(&p, &r, 1, err, sizeof err), 0);
    assert_int_equal(plan_levers(&p, &r, lv, 8), 0);
    assert_non_null(plan_check_fit(&p, &r, 8 * GiB, "the device's memory", msg, sizeof msg));
    if (strstr(msg, "on the same ranks") || strstr(msg, "distributed_optimizer") ||
        !strstr(msg, "; with more ranks: raise parallel.tp or parallel.pp"))
        fail_msg("%s", msg);
    /* activations drive a long sequence: cp is the first of the ranks to raise */
    r.train.seq_len = 8192;
    r.train.micro_batch_size = 16;
    r.train.recompute = RECOMPUTE_NONE;
    assert_int_equal(plan_compute(&p, &r, 1, err, sizeof err), 0);
    assert_string_equal(plan_check_fit(&p, &r, 80 * GiB, "the device's memory", msg, sizeof msg),
                        "train.micro_batch_size");
    if (!strstr(msg, "train.recompute: full (") || !strstr(msg, "raise parallel.cp (splits the sequence)"))
        fail_msg("%s", msg);
}

/* parallel.ep as a lever of a MoE model on GPUs: more ep holds fewer experts a rank, and a GPU's expert side holds
 * a balanced routing's rows at any ep (moe_expert_rows_room), so doubling ep is offered wherever dp and the experts
 * allow it, with plan_compute's estimate, and halving it never (before 2026-12-01 the expert side held ep times a
 * rank's rows, past some ep the activations grew faster than the experts shrank, and halving was a lever). */
static void test_ep_levers(void **state) {
    (void)state;
    static Recipe r, alt;
    static Plan p;
    char err[512], msg[2048];
    PlanLever lv[8];
    const double GiB = 1073741824.0;
    load(&r, "qwen3-235b-a22b", 1, 2, 1, 32, 1); /* dp 16 */
    r.train.micro_batch_size = 1;
    r.train.seq_len = 2048;
    double before = 0;
    for (int ep = 1; ep <= 16; ep *= 2) {
        r.parallel.ep = ep;
        assert_int_equal(plan_compute(&p, &r, 32, err, sizeof err), 0);
        const int n = plan_levers(&p, &r, lv, 8);
        const double now = p.stages[plan_worst_stage(&p)].total_bytes;
        if (ep > 1) assert_true(now < before); /* each doubling saves */
        before = now;
        for (int other = ep / 2; other <= 2 * ep; other += other ? other : 1) {
            if (other == ep || other == 0 || other > 32) continue;
            char want[64];
            snprintf(want, sizeof want, "parallel.ep: %d", other);
            int found = -1;
            for (int i = 0; i < n; i++)
                if (!strcmp(lv[i].setting, want)) found = i;
            double with = -1;
            if (other <= 16) {
                alt = r;
                alt.parallel.ep = other;
                with = worst_total(&alt, 32);
            }
            printf("  ep %2d -> %-18s %.1f GiB (now %.1f)%s\n", ep, want, with / GiB, now / GiB,
                   found < 0 ? ": not offered" : "");
            if (other < ep || other > 16) assert_true(found < 0); /* less ep, or more than dp 16 allows */
            else assert_true(found >= 0 && lv[found].total_bytes == with && with < 0.995 * now);
        }
    }
    /* at ep 16 the experts drive the stage (the activations did, before): more ranks for more ep, not less ep */
    assert_string_equal(plan_check_fit(&p, &r, 141 * GiB, "the device's memory", msg, sizeof msg),
                        "model.moe.moe_intermediate_size");
    if (strstr(msg, "parallel.ep: 8 (") || !strstr(msg, "raise parallel.ep")) fail_msg("%s", msg);
    /* Mixtral 8x7B at ep 8 holds one expert a rank: ep cannot go higher (it divides num_experts), so the ranks to
     * raise are tp and pp alone (before, the advice said "raise parallel.ep" there too) */
    load(&r, "mixtral-8x7b", 1, 1, 1, 8, 0);
    r.parallel.ep = 8;
    assert_int_equal(plan_compute(&p, &r, 8, err, sizeof err), 0);
    assert_string_equal(plan_check_fit(&p, &r, 80 * GiB, "the device's memory", msg, sizeof msg),
                        "model.moe.moe_intermediate_size");
    if (strstr(msg, "parallel.ep") || !strstr(msg, "; with more ranks: raise parallel.tp or parallel.pp"))
        fail_msg("%s", msg);
}

/* train.recompute on the CPU: plan counts what the model allocates. For a
 * qwen3 and a qwen3 MoE model at seq 256, none > selective > full in both,
 * and what selective and full save against none in plan is within 5% of
 * what they save in the model's own count (model_activation_bytes;
 * test_counts_cpu compares the totals). */
static void test_recompute_memory(void **state) {
    (void)state;
    static Recipe r;
    char err[512];
    const char *archs[] = {"qwen3-0.6b", "qwen3-30b-a3b"};
    for (int a = 0; a < 2; a++) {
        load(&r, archs[a], 1, 1, 1, 1, 0);
        snprintf(r.run.device, sizeof r.run.device, "cpu");
        r.model.num_layers = 2; /* the activations per layer are what is compared */
        r.model.moe.layer_freq = 1;
        r.train.seq_len = 256;
        r.train.micro_batch_size = 1;
        double before_plan = 0, before_model = 0, none_plan = 0, none_model = 0;
        for (Recompute mode = RECOMPUTE_NONE; mode <= RECOMPUTE_FULL; mode++) {
            static Plan p;
            r.train.recompute = mode;
            assert_int_equal(plan_compute(&p, &r, 1, err, sizeof err), 0);
            const double planned = p.stages[0].activation_bytes + p.stages[0].logits_bytes;
            ModelPartition whole = model_partition_whole(&r.model);
            Model *m = model_create_recompute(&r.model, &whole, &cpu_backend, 1, 256, mode);
            const ModelActivationBytes b = model_activation_bytes(m);
            const double counted = (double)(b.per_set + b.working_set);
            model_free(m);
            printf("  %s recompute %d: plan %.1f MiB, model %.1f MiB (working set %.1f MiB planned, %.1f allocated)\n",
                   archs[a], mode, planned / 1048576.0, counted / 1048576.0, p.stages[0].recompute_bytes / 1048576.0,
                   b.working_set / 1048576.0);
            if (mode == RECOMPUTE_NONE) {
                none_plan = planned;
                none_model = counted;
            }
            assert_true(fabs((none_plan - planned) - (none_model - counted)) <= 0.05 * (none_model - counted));
            assert_true(mode == RECOMPUTE_NONE ? p.stages[0].recompute_bytes == 0 : p.stages[0].recompute_bytes > 0);
            if (mode != RECOMPUTE_NONE) {
                assert_true(planned < before_plan);
                assert_true(counted < before_model);
            }
            before_plan = planned;
            before_model = counted;
        }
    }
}

/* plan's activations on the CPU are what the Model allocates (model_activation_bytes: its layers' buffers, the
 * per-set buffers and logits, the backward's scratch, the MoE layers' own, the recompute working set): never more,
 * and less by at most 0.01% (the pieces' 64-byte alignment; measured: 0.0013% at most),
 * for dense and MoE models, each recompute mode, tensor parallel with and without sequence parallel, context
 * parallel, LoRA and the first stage of pp 2 (with vpp 2: its chunks' outputs), its activation sets in flight
 * (tp rank 0, cp rank 0; 2 layers a virtual stage at seq 256, micro-batches of 2). */
typedef struct CountCase {
    const char *arch;
    int tp, cp;
    bool sp, lora;
    Recompute mode;
    int pp, vpp; /* 0: 1; stage 0 is compared (its activation sets in flight) */
} CountCase;

static const CountCase count_cases[] = {
    {"qwen3-0.6b", 1, 1, false, false, RECOMPUTE_NONE, 0, 0},
    {"qwen3-0.6b", 1, 1, false, false, RECOMPUTE_SELECTIVE, 0, 0},
    {"qwen3-0.6b", 1, 1, false, false, RECOMPUTE_FULL, 0, 0},
    {"llama3.2-1b", 2, 1, false, false, RECOMPUTE_NONE, 0, 0},
    {"llama3.2-1b", 2, 1, true, false, RECOMPUTE_NONE, 0, 0},
    {"llama3.2-1b", 1, 2, false, false, RECOMPUTE_NONE, 0, 0},
    {"llama3.2-1b", 2, 2, true, false, RECOMPUTE_SELECTIVE, 0, 0},
    {"llama3.2-1b", 1, 1, false, true, RECOMPUTE_NONE, 0, 0},
    {"llama3.2-1b", 2, 1, false, true, RECOMPUTE_FULL, 0, 0},
    {"llama3.2-1b", 1, 1, false, true, RECOMPUTE_SELECTIVE, 0, 0}, /* LoRA's A x kept in every mode */
    {"qwen3-30b-a3b", 1, 1, false, false, RECOMPUTE_NONE, 0, 0},
    {"qwen3-30b-a3b", 1, 1, false, false, RECOMPUTE_FULL, 0, 0},
    {"mixtral-8x7b", 2, 1, true, false, RECOMPUTE_NONE, 0, 0},
    {"llama3.2-1b", 1, 1, false, false, RECOMPUTE_NONE, 2, 2},
    {"qwen3-0.6b", 2, 1, true, false, RECOMPUTE_FULL, 2, 1},
};

/* The recipe of a count case: ARCH cut to 2 layers a virtual stage and a vocabulary of 4096 (the counts per token
 * are compared), 4 micro-batches a step; its model part for tp rank 0, cp rank 0 and pipeline stage 0. */
static void count_case_recipe(Recipe *r, const CountCase *c, const char *device, ModelPartition *part) {
    const int pp = c->pp > 1 ? c->pp : 1, vpp = c->vpp > 1 ? c->vpp : 1;
    load(r, c->arch, c->tp, pp, vpp, c->tp * c->cp * pp, 0);
    snprintf(r->run.device, sizeof r->run.device, "%s", device);
    r->model.num_layers = 2 * pp * vpp;
    r->model.vocab_size = 4096;
    r->model.moe.layer_freq = 1;
    r->parallel.cp = c->cp;
    r->parallel.sequence_parallel = c->sp;
    r->train.seq_len = 256;
    r->train.micro_batch_size = 2;
    r->train.batch_stages[0].global_batch_size = 8;
    r->train.recompute = c->mode;
    if (c->lora) r->model.peft = (PeftConfig){.type = PEFT_LORA, .rank = 16, .alpha = 32, .targets = LORA_ALL_TARGETS};
    *part = model_partition_whole(&r->model);
    part->tp = c->tp;
    part->sequence_parallel = c->sp;
    part->cp = c->cp;
    part->num_chunks = vpp;
    part->num_layers = 0;
    for (int v = 0; v < vpp; v++) {
        parallel_stage_layers(&r->parallel, r->model.num_layers, v * pp, &part->chunk_first[v], &part->chunk_layers[v]);
        part->num_layers += part->chunk_layers[v];
    }
    part->has_head = pp == 1;
}

static void test_counts_cpu(void **state) {
    (void)state;
    static Recipe r;
    static Plan p;
    char err[512];
    for (size_t i = 0; i < sizeof count_cases / sizeof count_cases[0]; i++) {
        const CountCase *c = &count_cases[i];
        ModelPartition part;
        count_case_recipe(&r, c, "cpu", &part);
        const int pp = c->pp > 1 ? c->pp : 1;
        assert_int_equal(plan_compute(&p, &r, c->tp * c->cp * pp, err, sizeof err), 0);
        const double planned = p.stages[0].activation_bytes + p.stages[0].logits_bytes;
        Model *m = model_create_recompute(&r.model, &part, &cpu_backend, 2, 256 / c->cp, c->mode);
        const ModelActivationBytes b = model_activation_bytes(m);
        const double counted = p.stages[0].in_flight * (double)b.per_set + (double)b.working_set;
        model_free(m);
        printf("  cpu %-13s tp %d%s cp %d pp %d vpp %d recompute %d%s: plan %.3f MiB, the model %.3f MiB (%g sets; "
               "%+.4f%%)\n", c->arch, c->tp, c->sp ? " sp" : "", c->cp, pp, part.num_chunks, c->mode,
               c->lora ? " lora" : "", planned / 1048576.0, counted / 1048576.0, p.stages[0].in_flight,
               100.0 * (planned - counted) / counted);
        /* plan leaves out only the pieces' alignment: never above the model, below by at most 1e-4 */
        assert_true(planned <= counted * (1 + 1e-9) && counted - planned <= 1e-4 * counted);
    }
}

/* LoRA (peft, CPU): the adapters are the only trainable parameters: plan's
 * trainable count is rank * (in + out) per targeted projection and layer
 * (written out here), the count a Model allocates gradients for; gradients
 * take 4 bytes and AdamW 8 per trainable parameter (halved by ZeRO-1 over dp
 * 2), the weights 4 per parameter, so the total falls against full
 * training. The activations grow by each adapter's A x (rank floats per
 * token and layer) and the backward's scratch for them (3 x tokens x rank
 * floats on one rank), what the model allocates for them. */
static void test_lora_memory(void **state) {
    (void)state;
    static Recipe r;
    static Plan full, lora, zero1;
    char err[512];
    load(&r, "llama3.2-1b", 1, 1, 1, 1, 0);
    snprintf(r.run.device, sizeof r.run.device, "cpu");
    r.model.num_layers = 4;
    r.train.seq_len = 256;
    r.train.micro_batch_size = 1;
    assert_int_equal(plan_compute(&full, &r, 1, err, sizeof err), 0);
    const PeftConfig peft = {.type = PEFT_LORA, .rank = 16, .alpha = 32, .targets = LORA_ALL_TARGETS};
    r.model.peft = peft;
    assert_int_equal(plan_compute(&lora, &r, 1, err, sizeof err), 0);
    const ModelConfig *m = &r.model;
    const double C = m->hidden_size, I = m->intermediate_size, HD = (double)m->num_attention_heads * m->head_dim;
    const double KVD = (double)m->num_key_value_heads * m->head_dim;
    const double adapters = m->num_layers * 16.0 * ((C + HD) + 2 * (C + KVD) + (HD + C) + 2 * (C + I) + (I + C));
    const PlanStage *a = &full.stages[0], *b = &lora.stages[0];
    printf("  llama3.2-1b x 4 layers, LoRA rank 16: %.0f trainable of %.0f; GiB weights %.3f/%.3f grads %.3f/%.3f "
           "AdamW %.3f/%.3f total %.3f/%.3f (full/LoRA)\n", b->trainable_params, b->params, a->weight_bytes / 1073741824.0,
           b->weight_bytes / 1073741824.0, a->grad_bytes / 1073741824.0, b->grad_bytes / 1073741824.0,
           a->optimizer_bytes / 1073741824.0, b->optimizer_bytes / 1073741824.0, a->total_bytes / 1073741824.0,
           b->total_bytes / 1073741824.0);
    assert_true(b->trainable_params == adapters);
    assert_true(a->trainable_params == a->params);
    assert_true(b->params == a->params + adapters);
    assert_true(b->grad_bytes == 4.0 * adapters);
    assert_true(b->optimizer_bytes == 8.0 * adapters);
    assert_true(b->weight_bytes == 4.0 * b->params);
    assert_true(b->total_bytes < 0.5 * a->total_bytes); /* grads and moments of 1.2B parameters gone */
    ModelPartition whole = model_partition_whole(&r.model);
    Model *model = model_create_part(&r.model, &whole, &cpu_backend, 1, 256);
    assert_true((double)model->num_grad_floats == b->trainable_params);
    const double lora_acts = (double)(model_activation_bytes(model).per_set);
    model_free(model);
    r.model.peft.type = PEFT_NONE;
    model = model_create_part(&r.model, &whole, &cpu_backend, 1, 256);
    assert_true(model->num_grad_floats == model->num_floats);
    const double full_acts = (double)(model_activation_bytes(model).per_set);
    model_free(model);
    const double planned = b->activation_bytes - a->activation_bytes, allocated = lora_acts - full_acts;
    const double scratch = 3.0 * 256 * 16 * 4; /* lora_dh, lora_dh_part, lora_part */
    printf("  LoRA activations: plan %.0f bytes more, the model %.0f more (of which scratch %.0f)\n", planned,
           allocated, scratch);
    assert_true(planned == 4 * 7 * 256 * 16 * 4.0 + scratch); /* layers x targets x tokens x rank x 4 bytes */
    assert_true(fabs(allocated - planned) <= 3 * 64); /* the pieces' 64-byte alignment */
    /* ZeRO-1 over dp 2 halves the adapters' moments */
    r.model.peft = peft;
    r.parallel.distributed_optimizer = true;
    assert_int_equal(plan_compute(&zero1, &r, 2, err, sizeof err), 0);
    assert_true(zero1.stages[0].optimizer_bytes == 4.0 * adapters);
}

/* plan_fit's space (plan.h) walked by brute force, without its shortcuts (every dp up to the world, not only those
 * the batch allows; no order of world; every layout estimated): of the layouts plan_fit_layout allows with tp up to
 * max_tp and at most PLAN_FIT_MAX_WORLD ranks, how many fit `available` (a GPU's with PLAN_GPU_RESERVE_BYTES to
 * spare) on fewer than `world` ranks; into *at_world the lowest estimate of those of `world` ranks exactly, into
 * *least the lowest of all (INFINITY where none). */
static int brute_fit(const Recipe *r, double available, int max_tp, int world, double *at_world, double *least) {
    static Recipe alt;
    static Plan q;
    char err[512];
    alt = *r;
    const double spare = !strcmp(r->run.device, "cuda") ? PLAN_GPU_RESERVE_BYTES : 0.0;
    const int layers = r->model.num_layers;
    int fits = 0;
    *at_world = *least = INFINITY;
    for (int tp = 1; tp <= max_tp; tp *= 2)
        for (int cp = 1; cp <= PLAN_FIT_MAX_CP; cp *= 2)
            for (int pp = 1; pp <= layers; pp++) {
                if (pp != r->parallel.pp && (pp > PLAN_FIT_MAX_PP || layers % pp)) continue;
                for (int dp = 1; tp * cp * pp * dp <= PLAN_FIT_MAX_WORLD; dp++)
                    for (int ep = 1; ep <= (r->model.moe.num_experts ? dp : 1); ep++) {
                        if (dp % ep) continue;
                        const int w = plan_fit_layout(r, &alt, tp, cp, pp, dp, ep, err, sizeof err);
                        if (w == 0 || w > world) continue;
                        assert_int_equal(w, tp * cp * pp * dp);
                        assert_int_equal(plan_compute(&q, &alt, w, err, sizeof err), 0);
                        const double need = q.stages[plan_worst_stage(&q)].total_bytes;
                        *least = fmin(*least, need);
                        if (w == world) *at_world = fmin(*at_world, need);
                        else if (need + spare <= available) {
                            printf("  fits on fewer ranks: %d = tp %d x cp %d x pp %d x dp %d, ep %d: %.2f GiB\n", w,
                                   tp, cp, pp, dp, ep, need / 1073741824.0);
                            fits++;
                        }
                    }
            }
    return fits;
}

/* What plan_fit found: plan_fit_layout allows it, plan_compute's estimate of it is fit->total_bytes and fits, no
 * layout of the space on fewer ranks fits (brute_fit) and none of as many has more to spare. */
static void check_fit(const Recipe *r, double available, const PlanFit *fit, int max_tp) {
    static Recipe alt;
    static Plan q;
    char err[512], text[128];
    alt = *r;
    printf("  fits on %d ranks: %s (%.2f GiB of %.0f; %d layouts estimated)\n", fit->world,
           plan_fit_text(fit, text, sizeof text), fit->total_bytes / 1073741824.0, available / 1073741824.0,
           fit->layouts);
    assert_true(fit->found);
    assert_int_equal(plan_fit_layout(r, &alt, fit->tp, fit->cp, fit->pp, fit->dp, fit->ep, err, sizeof err),
                     fit->world);
    assert_int_equal(fit->world, fit->tp * fit->cp * fit->pp * fit->dp);
    assert_int_equal(fit->dp % fit->ep, 0);
    assert_int_equal(plan_compute(&q, &alt, fit->world, err, sizeof err), 0);
    assert_true(q.stages[plan_worst_stage(&q)].total_bytes == fit->total_bytes);
    const double spare = !strcmp(r->run.device, "cuda") ? PLAN_GPU_RESERVE_BYTES : 0.0;
    assert_true(fit->total_bytes + spare <= available);
    double at_world, least;
    assert_int_equal(brute_fit(r, available, max_tp, fit->world, &at_world, &least), 0);
    assert_true(at_world == fit->total_bytes); /* of the fewest ranks, the most to spare */
}

/* plan_fit: the fewest ranks that fit, by plan_compute's estimate, over the space plan.h names; a layout beyond a
 * node's tp only where none within fits; none found, it says so with the layout nearest to fitting. */
static void test_fit(void **state) {
    (void)state;
    static Recipe r;
    static Plan p;
    char err[512];
    PlanFit fit;
    const double GiB = 1073741824.0;
    /* Llama 3 70B at seq 4096 does not fit one 80 GB GPU (1275 GiB): the fewest ranks that do */
    load(&r, "llama3-70b", 1, 1, 1, 1, 0);
    r.train.seq_len = 4096;
    r.train.micro_batch_size = 1;
    assert_int_equal(plan_compute(&p, &r, 1, err, sizeof err), 0);
    assert_true(p.stages[0].total_bytes > 80 * GiB);
    assert_true(plan_fit(&r, 80 * GiB, &fit));
    check_fit(&r, 80 * GiB, &fit, PLAN_FIT_NODE_TP);
    assert_true(fit.world > 1 && fit.tp <= PLAN_FIT_NODE_TP);
    /* MoE with the distributed optimizer: ep and dp shard the experts and the states; dp within the batch's
     * (64 / micro-batches of 2: 32 at most) */
    load(&r, "qwen3-30b-a3b", 1, 1, 1, 1, 1);
    assert_true(plan_fit(&r, 24 * GiB, &fit));
    check_fit(&r, 24 * GiB, &fit, PLAN_FIT_NODE_TP);
    assert_true(fit.ep > 1 && 64 % (2 * fit.dp) == 0);
    /* beyond a node's tp only where nothing within fits: Llama 3 8B with 32 kv heads and a vocabulary of 4M, whose
     * embedding and head only tp splits (tp 8: 34 GiB a rank), at 30 GiB */
    load(&r, "llama3-8b", 1, 1, 1, 1, 0);
    r.model.num_key_value_heads = 32;
    r.model.vocab_size = 4000000;
    double at_world, least;
    assert_int_equal(brute_fit(&r, 30 * GiB, PLAN_FIT_NODE_TP, PLAN_FIT_MAX_WORLD, &at_world, &least), 0);
    assert_true(plan_fit(&r, 30 * GiB, &fit));
    check_fit(&r, 30 * GiB, &fit, PLAN_FIT_MAX_TP);
    assert_true(fit.tp > PLAN_FIT_NODE_TP && fit.max_tp > PLAN_FIT_NODE_TP);
    /* ... and with 40 GiB a layout within a node fits: taken, though tp 16 x pp 2 would take fewer ranks */
    assert_true(plan_fit(&r, 40 * GiB, &fit));
    check_fit(&r, 40 * GiB, &fit, PLAN_FIT_NODE_TP);
    assert_true(fit.tp <= PLAN_FIT_NODE_TP && fit.max_tp == PLAN_FIT_NODE_TP);
    /* nowhere: Llama 3.2 1B on the CPU in 64 MiB a rank; no layout of the space fits (brute force), and the
     * nearest plan_fit names is the least of them all */
    load(&r, "llama3.2-1b", 1, 1, 1, 1, 0);
    snprintf(r.run.device, sizeof r.run.device, "cpu");
    assert_false(plan_fit(&r, 64 << 20, &fit));
    char text[128];
    printf("  none fits in 64 MiB: the nearest %s on %d ranks, %.2f GiB (%d layouts)\n",
           plan_fit_text(&fit, text, sizeof text), fit.world, fit.total_bytes / GiB, fit.layouts);
    assert_int_equal(brute_fit(&r, 64 << 20, PLAN_FIT_MAX_TP, PLAN_FIT_MAX_WORLD, &at_world, &least), 0);
    assert_true(fit.layouts > 0 && fit.total_bytes == least && least > 64 << 20);
    assert_int_equal(fit.max_tp, PLAN_FIT_NODE_TP); /* 8 kv heads: no tp beyond a node */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_parameter_once),
        cmocka_unit_test(test_schedule_and_sharding),
        cmocka_unit_test(test_moe_params_once),
        cmocka_unit_test(test_bf16_states),
        cmocka_unit_test(test_zero1_experts),
        cmocka_unit_test(test_memory_driver),
        cmocka_unit_test(test_ep_levers),
        cmocka_unit_test(test_levers),
        cmocka_unit_test(test_fit),
        cmocka_unit_test(test_recompute_memory),
        cmocka_unit_test(test_lora_memory),
        cmocka_unit_test(test_counts_cpu),
    };
    return cmocka_run_group_tests(tests, work_dir_setup, work_dir_teardown);
}
