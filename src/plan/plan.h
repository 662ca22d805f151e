/* plan.h: what a recipe's parallel layout puts on each rank, computed from
 * the recipe alone (nothing is allocated): the grid, the layers and shards of
 * each pipeline stage, parameters per rank, estimated memory per rank
 * (weights, gradients, optimizer states, activations for the pipeline
 * schedule) and FLOPs per step. `megatrain plan` prints it (plan_main.c). */
#ifndef MT_PLAN_PLAN_H
#define MT_PLAN_PLAN_H

#include <stdbool.h>

#include "../config/recipe.h"
#include "../dist/grid.h"
#include "../model/model.h"

#define PLAN_MAX_STAGES 256

/* One pipeline stage; every rank of the stage holds the same amount. */
typedef struct PlanStage {
    int first_layer[16], num_layers[16]; /* per virtual stage (vpp chunks), layer ranges */
    int num_chunks;
    bool embedding, final_norm, lm_head; /* lm_head: the untied head, or the tied copy on a last stage */
    double params;                        /* parameters held by one rank of this stage */
    double expert_params;                 /* of them, routed experts' (split over ep, and etp) */
    double group_params[PARAM_KINDS];     /* of them, each kind's (ParamInfo.kind) */
    double trainable_params;              /* of them, those with gradients and AdamW states (LoRA: the adapters) */
    double router_params;                 /* of them, the MoE routers' weights and expert biases */
    double weight_bytes, grad_bytes, optimizer_bytes, activation_bytes, logits_bytes;
    double in_flight;                     /* micro-batches whose activations the schedule keeps */
    double recompute_bytes;               /* train.recompute's working set (in activation_bytes, counted once) */
    double scratch_bytes;                 /* the backward's scratch and tables (in activation_bytes): once on a
                                           * GPU, in every activation set on the CPU */
    double total_bytes;
    double moe_spill_bytes;               /* GPU, ep > 1: the most beyond total_bytes that a step's routing can take
                                           * as it goes (every MoE layer's expert side at its most rows, past the
                                           * arena's room for a balanced routing's) */
} PlanStage;

typedef struct Plan {
    GridLayout grid;
    bool gpu;                       /* run.device: cuda (bf16 copy + fp32 master) */
    double total_params;            /* the model's parameter count (model_count_params) */
    double trainable_total;         /* of them, those trained (LoRA: the adapters; else all) */
    long global_batch;              /* the largest global batch of the schedule, in samples */
    double tokens_per_step;         /* global_batch x seq_len */
    double flops_per_step, flops_per_rank;
    double micro_batches;           /* per dp rank per step */
    PlanStage stages[PLAN_MAX_STAGES];
} Plan;

/* Fill `plan` for a validated recipe on `world` ranks. Returns 0, or -1 with err. */
int plan_compute(Plan *plan, const Recipe *recipe, int world, char *err, size_t errlen);

/* The stage with the largest estimate. */
int plan_worst_stage(const Plan *plan);
/* bytes as "45.4 GiB", or "5.7 MiB" under a GiB, with `decimals` decimals; returns out. */
const char *plan_size_text(double bytes, int decimals, char *out, size_t len);

/* Into `what`: the part most of stage `stage`'s bytes go to, with the recipe
 * keys that size it ("the MLP weights (model.intermediate_size = 2000000000)").
 * Returns the main key ("model.intermediate_size"). */
const char *plan_stage_driver(const Plan *plan, const Recipe *recipe, int stage, char *what, size_t len);

/* The memory one rank has, in bytes: for run.device cuda GPU 0's (0 in a
 * CPU build or when it cannot be read), else the host's RAM plus swap. */
double plan_rank_memory(const Recipe *recipe);

/* A change of one recipe setting, on the same ranks, and the largest stage's
 * estimate with it (bytes per rank). */
typedef struct PlanLever {
    char setting[64]; /* "train.recompute: full" */
    double total_bytes;
} PlanLever;

/* The levers that lower the largest stage's estimate without more ranks
 * (recompute, bf16 AdamW states, the distributed optimizer where dp > 1,
 * sequence parallel where tp > 1, half the micro-batch), each computed with
 * plan_compute on the changed recipe: at most max into out, the lowest
 * estimate first. Returns how many. */
int plan_levers(const Plan *plan, const Recipe *recipe, PlanLever *out, int max);

/* NULL when the largest stage's estimate fits in `available` bytes of
 * `memory` ("the device's memory"); else the recipe key most of it comes
 * from, with msg saying how much is needed, what for and what to change:
 * plan_levers' settings with their estimates, then the ranks to raise. */
const char *plan_check_fit(const Plan *plan, const Recipe *recipe, double available, const char *memory, char *msg,
                           size_t len);

/* Before anything is allocated: refuse a recipe whose largest stage needs
 * more than plan_rank_memory per rank, naming the key most of it comes from
 * (per rank: ranks sharing a host or a GPU are not added up, so only what
 * cannot fit at all is refused). Returns 0, or -1 with err. */
int plan_check_memory(const Recipe *recipe, int world, char *err, size_t errlen);

/* What a GPU needs beside plan's estimate: the CUDA context, cuBLASLt's workspace, NCCL and the allocator's
 * rounding (0.57 to 0.66 GiB above the estimate on an H200, docs/parallel.md). With less to spare a plan fits only
 * barely; plan_fit's layouts leave it free. */
#define PLAN_GPU_RESERVE_BYTES 1073741824.0

/* plan_fit's space of layouts: tp a power of two up to a node's 8 GPUs (up to PLAN_FIT_MAX_TP only where nothing
 * fits within a node), cp a power of two up to PLAN_FIT_MAX_CP, pp a divisor of num_layers up to PLAN_FIT_MAX_PP
 * (or the recipe's own pp), dp any the global batch allows, ep (MoE) a divisor of dp; tp x cp x pp x dp at most
 * PLAN_FIT_MAX_WORLD ranks. What each layout may be is recipe_validate_layout's to say. */
#define PLAN_FIT_NODE_TP 8
#define PLAN_FIT_MAX_TP 64
#define PLAN_FIT_MAX_CP 32
#define PLAN_FIT_MAX_PP 32
#define PLAN_FIT_MAX_WORLD 4096

/* A layout of plan_fit's search. */
typedef struct PlanFit {
    bool found;           /* a layout fits: the fields below are it; else the layout that came nearest */
    int world, tp, cp, pp, dp, ep, etp, vpp;
    double total_bytes;   /* its largest stage's estimate (bytes per rank) */
    int max_tp;           /* the largest tp of the layouts searched (beyond a node only where nothing fit within) */
    int layouts;          /* how many layouts plan_compute estimated */
} PlanFit;

/* Into alt (a copy of r: only its parallel section is rewritten, so one copy serves many calls): r's layout with
 * tp, cp, pp, ep and dp data-parallel ranks, etp following tp where r splits the experts over tp, r's vpp and
 * pp_layers kept at r's own pp (one 1F1B chunk and an even split at another), every other setting r's; checked as
 * recipe_load checks a layout, and on run.device: cuda refused where `run` refuses more of it than of r. Returns
 * its world (tp x cp x pp x dp), or 0 with why. */
int plan_fit_layout(const Recipe *r, Recipe *alt, int tp, int cp, int pp, int dp, int ep, char *why, size_t len);

/* The fewest ranks on which r's largest stage fits `available` bytes a rank (on a GPU with PLAN_GPU_RESERVE_BYTES
 * to spare beside it), by plan_compute's estimate of each layout of the space above in order of world; among the
 * layouts of that many ranks, the one with the most to spare. Returns fit->found. */
bool plan_fit(const Recipe *r, double available, PlanFit *fit);

/* "tp 8 x pp 2 x dp 2" (cp where > 1, "with ep 4" where > 1); returns out. */
const char *plan_fit_text(const PlanFit *fit, char *out, size_t len);

/* `megatrain plan ...` (argv after "plan"); returns the exit status. */
int plan_main(int argc, char **argv);

#endif
