/* plan_main.c: `megatrain plan RECIPE [--world N] [--device-memory GiB] [--fit] [--set k=v ...]`:
 * prints the layout plan.h computes and warns about stages that would not
 * fit the device memory (given, or read off GPU 0 in a CUDA build); where
 * they do not (or with --fit), the fewest ranks that fit (plan_fit). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../config/batch_schedule.h"
#include "../config/recipe.h"
#include "../config/recipe_schema.h"
#include "../core/cli.h"
#include "../core/error.h"
#include "../model/model_device.h"
#include "plan.h"

#define MAX_PLAN_OVERRIDES 64

static const char *const plan_usage =
    "usage: megatrain plan RECIPE.yaml [--world N] [--device-memory GiB] [--fit] [--set key.path=value ...]\n"
    "\n"
    "Print the parallel layout of RECIPE.yaml on N ranks (default tp * cp * pp * ep, i.e. dp = ep):\n"
    "the grid, the layers and shards of each pipeline stage, parameters per rank, estimated\n"
    "memory per rank (weights, gradients, AdamW states, activations for the pipeline schedule\n"
    "with the backward's scratch, logits: the buffers megatrain allocates, counted as it lays\n"
    "them out) and FLOPs per step. Nothing is allocated. The last line says whether the largest\n"
    "stage fits a rank's memory; where it does not, a warning names what most of it is and the\n"
    "settings that would lower it, each with its estimate, and a line before it gives the fewest\n"
    "ranks that fit (as --fit). With run.device: cuda it also lists what `run` refuses on GPUs\n"
    "for now.\n"
    "\n"
    "  --world N             ranks (default tp * cp * pp * ep: dp = ep, 1 for a dense model); dp is what\n"
    "                        the layout leaves\n"
    "  --device-memory GiB   a rank's memory to check against (default: GPU 0's in a CUDA build\n"
    "                        with a GPU and run.device: cuda; otherwise nothing is checked)\n"
    "  --fit                 also when the recipe fits: search the layouts (tp a power of two up to a\n"
    "                        node's 8, then to 64; pp a divisor of num_layers up to 32; cp a power of two\n"
    "                        up to 32; dp as the global batch allows; ep a divisor of dp) for the fewest\n"
    "                        ranks, up to 4096, whose largest stage fits a rank's memory (a GPU's with a\n"
    "                        GiB to spare), every other setting the recipe's, and print them with the\n"
    "                        --world and --set settings that give them (of the fewest, the most to spare)\n"
    "  --set key.path=value  override one recipe key, as `megatrain run` does\n"
    "\n"
    "example: megatrain plan recipes/bench/gpu.yaml --set model=configs/llama3-8b.yaml \\\n"
    "           --set train.seq_len=8192 --set train.recompute=full --device-memory 80\n";

static const double GiB = 1073741824.0;
static const double MiB = 1048576.0;

/* 1234567 -> "1.23M" */
static const char *count_text(double n, char *buf, size_t len) {
    if (n >= 1e9) snprintf(buf, len, "%.2fB", n / 1e9);
    else if (n >= 1e6) snprintf(buf, len, "%.2fM", n / 1e6);
    else if (n >= 1e3) snprintf(buf, len, "%.2fK", n / 1e3);
    else snprintf(buf, len, "%.0f", n);
    return buf;
}

/* 6.734e13 -> "67.34 TFLOP" */
static const char *flop_text(double f, char *buf, size_t len) {
    static const char *const units[] = {"FLOP", "KFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP"};
    int u = 0;
    while (f >= 1000.0 && u < 6) {
        f /= 1000.0;
        u++;
    }
    snprintf(buf, len, "%.4g %s", f, units[u]);
    return buf;
}

static void print_stage_layers(const PlanStage *st) {
    if (st->embedding) printf("embedding, ");
    if (st->num_chunks == 1 && st->num_layers[0] == 0) printf("no layers");
    else printf("layers");
    for (int v = 0; v < st->num_chunks && !(st->num_chunks == 1 && st->num_layers[0] == 0); v++) {
        const int first = st->first_layer[v], n = st->num_layers[v];
        if (n == 0) printf("%s none", v ? "," : ""); /* a pp_layers stage (or chunk) of 0 */
        else if (n == 1) printf("%s %d", v ? "," : "", first);
        else printf("%s %d-%d", v ? "," : "", first, first + n - 1);
    }
    if (st->final_norm) printf(", final norm");
    if (st->lm_head) printf(", lm_head");
}

/* A checkpoint's size before zstd, and what the run keeps on disk: the fp32 weights (a LoRA run's frozen base
 * only where its checkpoints store it: no init_from, or checkpoint.frozen_base store) and AdamW's m and v of the
 * trained parameters (2 bytes each with bf16 states); checkpoint.keep_last of them, plus one being written. */
static void print_checkpoint_size(const Plan *plan, const Recipe *r) {
    const CheckpointConfig *ck = &r->checkpoint;
    const bool lora = r->model.peft.type == PEFT_LORA;
    const bool base_stored = !lora || !r->init_from[0] || ck->frozen_base == FROZEN_BASE_STORE;
    const double state = r->optimizer.state_dtype == DTYPE_BF16 ? 2.0 : 4.0;
    const double weights = base_stored ? plan->total_params : plan->trainable_total;
    const double bytes = 4.0 * weights + 2.0 * state * plan->trainable_total;
    const long steps = train_total_steps(&r->train);
    const long saves = (ck->interval > 0 ? steps / ck->interval : 0) + (ck->interval <= 0 || steps % ck->interval != 0);
    const long kept = ck->keep_last > 0 && ck->keep_last < saves ? ck->keep_last : saves;
    char one[32], all[32];
    plan_size_text(bytes, 2, one, sizeof one);
    plan_size_text(bytes * (double)(kept + (kept < saves)), 2, all, sizeof all);
    printf("checkpoint: %s each before zstd (fp32 weights%s, AdamW m and v in %s); at most %s on disk (%ld kept%s%s)\n",
           one, lora && !base_stored ? " of the adapters: the frozen base referenced" : "",
           state == 2.0 ? "bf16" : "fp32", all, kept, kept < saves ? " and one being written" : "",
           ck->keep_every > 0 ? ", plus those keep_every keeps" : "");
}

/* The last line: whether the largest stage fits `device_gib` (0: unknown), and if not what would make it. Returns
 * false when it does not fit (plan's exit status 1: a job script can gate on it). */
static bool print_memory_verdict(const Plan *plan, const Recipe *recipe, double device_gib) {
    const int worst = plan_worst_stage(plan);
    const double need = plan->stages[worst].total_bytes / GiB;
    char need_text[32], device_text[32], spare_text[32];
    plan_size_text(need * GiB, 2, need_text, sizeof need_text);
    plan_size_text(device_gib * GiB, 2, device_text, sizeof device_text);
    plan_size_text((device_gib - need) * GiB, 2, spare_text, sizeof spare_text);
    if (device_gib <= 0.0) {
        printf("memory: not checked (--device-memory GiB checks the largest stage against a rank's memory%s)\n",
               plan->gpu ? "; a CUDA build reads GPU 0's" : "");
        return true;
    }
    char advice[2048];
    if (plan_check_fit(plan, recipe, device_gib * GiB, "the device's memory", advice, sizeof advice)) {
        printf("memory: does NOT fit: stage %d needs %s per rank of %s\n", worst, need_text, device_text);
        fflush(stdout);
        fprintf(stderr, "megatrain: warning: %s\n", advice);
        return false;
    } else if (plan->gpu && (device_gib - need) * GiB < PLAN_GPU_RESERVE_BYTES) {
        printf("memory: fits only barely: stage %d needs %s per rank of %s, less than the GiB the CUDA context and "
               "libraries take beside it\n", worst, need_text, device_text);
    } else {
        printf("memory: fits: stage %d needs %s per rank of %s (%s to spare)\n", worst, need_text, device_text,
               spare_text);
    }
    return true;
}

/* The `fit:` line: plan_fit's fewest ranks with `device_gib` GiB a rank, and the --world and --set settings that
 * give them from the recipe (those it changes); or how far the search went and the layout that came nearest. */
static void print_fit(const Recipe *r, double device_gib) {
    PlanFit fit;
    char layout[128], need[32];
    const bool found = plan_fit(r, device_gib * GiB, &fit);
    plan_fit_text(&fit, layout, sizeof layout);
    plan_size_text(fit.total_bytes, 1, need, sizeof need);
    const char *spare = !strcmp(r->run.device, "cuda") ? " less the GiB the CUDA context and libraries take" : "";
    if (!found) {
        char device[32];
        printf("fit: no layout of up to %d ranks fits %s a rank%s (tp up to %d, pp a divisor of the %d layers up to "
               "%d, cp up to %d, dp as the global batch allows%s; %d layouts estimated)", PLAN_FIT_MAX_WORLD,
               plan_size_text(device_gib * GiB, 1, device, sizeof device), spare, fit.max_tp, r->model.num_layers,
               PLAN_FIT_MAX_PP, PLAN_FIT_MAX_CP, r->model.moe.num_experts > 0 ? ", ep a divisor of dp" : "",
               fit.layouts);
        if (fit.layouts > 0) printf("; the nearest: %d ranks, %s (%s per rank)", fit.world, layout, need);
        putchar('\n');
        return;
    }
    const ParallelConfig *par = &r->parallel;
    char settings[512];
    int used = snprintf(settings, sizeof settings, "--world %d", fit.world);
    const struct { const char *key; int was, now; } keys[] = {
        {"tp", par->tp, fit.tp}, {"pp", par->pp, fit.pp}, {"vpp", par->vpp, fit.vpp}, {"cp", par->cp, fit.cp},
        {"ep", par->ep, fit.ep}, {"etp", par->etp, fit.etp}};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
        if (keys[k].was != keys[k].now && used < (int)sizeof settings)
            used += snprintf(settings + used, sizeof settings - (size_t)used, " --set parallel.%s=%d", keys[k].key,
                             keys[k].now);
    if (par->num_pp_layers > 0 && fit.pp != par->pp && used < (int)sizeof settings)
        snprintf(settings + used, sizeof settings - (size_t)used, " --set parallel.pp_layers=null");
    char left[32], device[32];
    plan_size_text(device_gib * GiB - fit.total_bytes, 1, left, sizeof left);
    printf("fit: fits on %d rank%s: %s (%s of %s per rank, %s to spare); %s\n", fit.world, fit.world == 1 ? "" : "s",
           layout, need, plan_size_text(device_gib * GiB, 1, device, sizeof device), left, settings);
}

int plan_main(int argc, char **argv) {
    const char *path = NULL, *overrides[MAX_PLAN_OVERRIDES];
    int num_overrides = 0, world = 0;
    double device_gib = 0.0;
    bool fit_asked = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(plan_usage, stdout);
            return MT_EXIT_OK;
        } else if (!strcmp(a, "--fit")) {
            fit_asked = true;
        } else if (!strcmp(a, "--set") || !strcmp(a, "--world") || !strcmp(a, "--device-memory")) {
            if (i + 1 >= argc) mt_die(MT_EXIT_USAGE, "%s needs a value\n%s", a, plan_usage);
            const char *v = argv[++i];
            char *end;
            if (!strcmp(a, "--set")) {
                if (!strchr(v, '=')) mt_die(MT_EXIT_USAGE, "--set %s: expected key.path=value", v);
                if (num_overrides >= MAX_PLAN_OVERRIDES) mt_die(MT_EXIT_USAGE, "too many --set options");
                overrides[num_overrides++] = v;
            } else if (!strcmp(a, "--world")) {
                long n = strtol(v, &end, 10);
                if (*end || n < 1 || n > 1 << 20) mt_die(MT_EXIT_USAGE, "--world: expected a rank count, found '%s'", v);
                world = (int)n;
            } else {
                device_gib = strtod(v, &end);
                if (*end || !(device_gib > 0) || !(device_gib <= 1048576))
                    mt_die(MT_EXIT_USAGE, "--device-memory: expected GiB, more than 0 and at most 1048576 (1 PiB), "
                           "found '%s'", v);
            }
        } else if (a[0] == '-' && a[1]) {
            cli_unknown_option("plan", a, plan_usage);
            exit(MT_EXIT_USAGE);
        } else if (path) {
            mt_die(MT_EXIT_USAGE, "unexpected argument '%s' (recipe already given as '%s')", a, path);
        } else {
            path = a;
        }
    }
    if (!path) mt_die(MT_EXIT_USAGE, "missing RECIPE.yaml\n%s", plan_usage);

    static Recipe recipe;
    char err[2048];
    /* world 0: tp * pp * cp * ep ranks (dp = ep) */
    if (recipe_load(&recipe, path, overrides, num_overrides, world, err, sizeof err) != 0)
        mt_die(MT_EXIT_USAGE, "%s", err);
    const bool world_given = world > 0;
    if (world == 0) world = recipe_smallest_world(&recipe);
    static Plan plan;
    if (plan_compute(&plan, &recipe, world, err, sizeof err) != 0) mt_die(MT_EXIT_USAGE, "%s", err);
    /* the host's memory is not a plan's question (it runs anywhere): only a device's */
    if (device_gib == 0.0 && plan.gpu) device_gib = plan_rank_memory(&recipe) / GiB;
    if (fit_asked && device_gib <= 0.0)
        mt_die(MT_EXIT_USAGE, "--fit: no memory to fit: give --device-memory GiB (a CUDA build with a GPU reads GPU "
               "0's for run.device: cuda)");

    const GridLayout *g = &plan.grid;
    const ModelConfig *m = &recipe.model;
    const ParallelConfig *par = &recipe.parallel;
    char a[32], b[32];
    const char *states = dtype_name(recipe.optimizer.state_dtype == DTYPE_BF16 ? DTYPE_BF16 : DTYPE_FP32);
    printf("plan: %s: %s, %s params, %d layers; device %s (%s, %s AdamW states)\n", path,
           model_family_name(m->family), count_text(plan.total_params, a, sizeof a), m->num_layers, recipe.run.device,
           plan.gpu ? "bf16 copy + fp32 master weights, fp32 grads" : "fp32 weights and grads", states);
    char experts[96] = ""; /* how the routed experts are split: ep over dp, etp over tp */
    if (m->moe.num_experts > 0)
        snprintf(experts, sizeof experts, "; %d experts over ep %d x etp %d", m->moe.num_experts, par->ep, par->etp);
    printf("grid: world %d = tp %d x cp %d x dp %d x pp %d (rank = tp + %d*cp + %d*dp + %d*pp)%s%s%s%s\n", g->world,
           g->tp, g->cp, g->dp, g->pp, g->tp, g->tp * g->cp, g->tp * g->cp * g->dp,
           par->vpp > 1 ? "; interleaved, vpp " : "", par->vpp > 1 ? count_text(par->vpp, b, sizeof b) : "",
           par->sequence_parallel ? "; sequence parallel" : "", experts);
    char f1[32], f2[32];
    /* with a batch schedule, its largest batch: where the step's memory and FLOPs peak */
    printf("step: %s tokens (global batch %ld x seq_len %d%s), %.4g micro-batch%s of %d per dp rank; "
           "%s per step (%s + attention), %s per rank\n",
           count_text(plan.tokens_per_step, a, sizeof a), plan.global_batch, recipe.train.seq_len,
           recipe.train.num_batch_stages > 1 ? "; the largest of train.batch_schedule" : "", plan.micro_batches,
           plan.micro_batches == 1 ? "" : "es", recipe.train.micro_batch_size,
           flop_text(plan.flops_per_step, f1, sizeof f1), m->peft.type == PEFT_LORA ? "4N frozen + 6N adapters" : "6N",
           flop_text(plan.flops_per_rank, f2, sizeof f2));
    /* the table's unit: GiB, or MiB where every stage is under a GiB (a tiny recipe's figures would all be 0.00) */
    double largest = 0;
    for (int s = 0; s < g->pp; s++) largest = fmax(largest, plan.stages[s].total_bytes);
    const double unit = largest < GiB ? MiB : GiB;
    const char *unit_name = largest < GiB ? "MiB" : "GiB";
    char total_head[16];
    snprintf(total_head, sizeof total_head, "total %s", unit_name);
    printf("%-6s %-12s %-9s %9s %9s %9s %9s %18s %9s %10s  holds\n", "stage", "ranks", "params", "weights", "grads",
           "AdamW", "dist-opt", "activations", "logits", total_head);
    const int per_stage = g->tp * g->cp * g->dp;
    /* the distributed optimizer shards the AdamW states over dp: at dp 1 there is nothing to shard them over */
    const char *dist_opt = !par->distributed_optimizer ? "no" : g->dp > 1 ? "yes" : "unsharded";
    for (int s = 0; s < g->pp; s++) {
        const PlanStage *st = &plan.stages[s];
        char ranks[32], acts[40];
        if (per_stage == 1) snprintf(ranks, sizeof ranks, "%d", s);
        else snprintf(ranks, sizeof ranks, "%d-%d", s * per_stage, (s + 1) * per_stage - 1);
        snprintf(acts, sizeof acts, "%.2f (%.3g in flight)", st->activation_bytes / unit, st->in_flight);
        printf("%-6d %-12s %-9s %9.2f %9.2f %9.2f %9s %18s %9.2f %10.2f  ", s, ranks,
               count_text(st->params, a, sizeof a), st->weight_bytes / unit, st->grad_bytes / unit,
               st->optimizer_bytes / unit, dist_opt, acts, st->logits_bytes / unit,
               st->total_bytes / unit);
        print_stage_layers(st);
        putchar('\n');
    }
    if (plan.gpu)
        printf("(estimates of what megatrain allocates; the CUDA context, cuBLASLt, NCCL and the allocator's rounding "
               "are not counted: leave a GiB or more)\n");
    else
        printf("(estimates of what megatrain allocates)\n");
    if (par->distributed_optimizer && g->dp == 1)
        printf("dist-opt: parallel.distributed_optimizer shards the AdamW states over the data-parallel ranks: at dp 1 "
               "it shards nothing%s\n", world_given ? "" : " (without --world, plan takes the layout's smallest world, "
               "tp x cp x pp x ep; --world N plans the launch's N ranks)");
    if (m->peft.type == PEFT_LORA) {
        const PlanStage *st = &plan.stages[plan_worst_stage(&plan)];
        int targets = 0;
        for (int t = 0; t < LORA_NUM_TARGETS; t++) targets += lora_targets(&m->peft, (LoraTarget)t);
        printf("peft: LoRA rank %d, alpha %g on %d linear layer(s) per layer: %s trainable of %s params on stage "
               "%d's ranks; the frozen base has no gradients or AdamW states%s\n", m->peft.rank, m->peft.alpha,
               targets, count_text(st->trainable_params, a, sizeof a), count_text(st->params, b, sizeof b),
               plan_worst_stage(&plan), "");
    }
    const Recompute rc = recipe.train.recompute;
    if (rc != RECOMPUTE_NONE)
        printf("recompute: %s (activations: %s kept per layer, a working set of %.2f %s per stage once)\n",
               recompute_names[rc], rc == RECOMPUTE_FULL ? "each layer's input" : "no attention core or SwiGLU",
               plan.stages[plan_worst_stage(&plan)].recompute_bytes / unit, unit_name);
    double spill = 0;
    int spill_stage = 0;
    for (int s = 0; s < g->pp; s++)
        if (plan.stages[s].moe_spill_bytes > spill) spill = plan.stages[s].moe_spill_bytes, spill_stage = s;
    if (spill > 0)
        printf("moe: each rank's experts have room for a quarter more than a balanced routing's rows (a micro-batch's "
               "tokens x %d x 1.25); a layer routed more to one rank takes its expert side as it goes, at most %.2f %s "
               "more per rank (stage %d, every token to one rank's experts), which the totals leave out\n",
               m->moe.num_experts_per_tok, spill / unit, unit_name, spill_stage);
    print_checkpoint_size(&plan, &recipe);
    if (plan.gpu) { /* what `run` refuses on GPUs, all of it, as run says it */
        const ModelDeviceSetup setup = {.device = recipe.run.device, .cfg = m, .parallel = par,
                                        .precision = recipe.precision, .loss = recipe.train.loss,
                                        .packed = recipe.data.pack};
        char refused[4096];
        if (model_device_cuda_limits(&setup, refused, sizeof refused) > 0)
            printf("refused by `run` (exit 2): %s\n", refused);
    }
    /* the fewest ranks that fit, before the verdict (the last line) */
    if (device_gib > 0.0 && (fit_asked || plan.stages[plan_worst_stage(&plan)].total_bytes > device_gib * GiB))
        print_fit(&recipe, device_gib);
    return print_memory_verdict(&plan, &recipe, device_gib) ? MT_EXIT_OK : MT_EXIT_FAILURE;
}
