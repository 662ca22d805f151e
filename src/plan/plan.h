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

#define PLAN_MAX_STAGES 256

/* One pipeline stage; every rank of the stage holds the same amount. */
typedef struct PlanStage {
    int first_layer[16], num_layers[16]; /* per virtual stage (vpp chunks), layer ranges */
    int num_chunks;
    bool embedding, final_norm, lm_head; /* lm_head: the untied head, or the tied copy on a last stage */
    double params;                        /* parameters held by one rank of this stage */
    double expert_params;                 /* of them, routed experts' (split over ep, and etp) */
    double weight_bytes, grad_bytes, optimizer_bytes, activation_bytes, logits_bytes;
    double in_flight;                     /* micro-batches whose activations the schedule keeps */
    double total_bytes;
} PlanStage;

typedef struct Plan {
    GridLayout grid;
    bool gpu;                       /* run.device: cuda (bf16 copy + fp32 master) */
    double total_params;            /* the model's parameter count (model_count_params) */
    double tokens_per_step;         /* global batch x seq_len (the largest global batch of the schedule) */
    double flops_per_step, flops_per_rank;
    double micro_batches;           /* per dp rank per step */
    PlanStage stages[PLAN_MAX_STAGES];
} Plan;

/* Fill `plan` for a validated recipe on `world` ranks. Returns 0, or -1 with err. */
int plan_compute(Plan *plan, const Recipe *recipe, int world, char *err, size_t errlen);

/* `megatrain plan ...` (argv after "plan"); returns the exit status. */
int plan_main(int argc, char **argv);

#endif
