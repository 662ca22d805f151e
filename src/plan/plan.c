/* plan.c: the per-rank estimates of `megatrain plan` (see plan.h).
 *
 * Shards follow Megatron: q/k/v and gate/up column-parallel, o_proj and
 * down_proj row-parallel, biases with their columns, the embedding and the
 * untied lm_head vocab-parallel (each tp rank V/tp rows), norms replicated.
 * Layers follow parallel_stage_layers (parallel.pp_layers, or an even
 * split: virtual stage v of pipeline stage s holds layers (v * pp + s) *
 * L/(pp*vpp) onwards). With tied embeddings and pp > 1 the
 * last stage holds a copy of the embedding shard for the head.
 *
 * Parameters per rank come from the model's registry for that rank's part
 * (tensor, expert and expert tensor parallel blocks, its stage's layers).
 * Bytes per parameter: on a GPU a bf16 copy (2) and an fp32 master (4), fp32
 * gradients (4) and AdamW's two fp32 moments (8); on the CPU fp32 weights
 * (4), gradients (4) and moments (8). With optimizer.state_dtype: bf16 the
 * moments take 4 (both devices). distributed_optimizer shards the
 * master and the moments over dp (ZeRO-1), the routed experts' over edp
 * (on a GPU, src/model/cuda/cuda_model_zero1.c; the CPU's weights are its
 * master: whole on every rank).
 * With LoRA (peft) only the adapters have gradients, moments (and a master
 * copy): the frozen base weights count their weight bytes alone; each
 * adapter keeps A x (rank floats per token and layer) for its backward.
 *
 * Activations per token and layer are the buffers the backward keeps
 * (src/model/cuda/cuda_model.c's layout; on the CPU also the (H, T)
 * attention probabilities per token), hidden-sized ones split over tp only
 * with sequence_parallel, over cp always. Stage s keeps one set of
 * activations (all of its chunks' layers, and on the last stage its logits,
 * V/tp columns) per micro-batch in flight, the schedule's peak
 * (pipeline_peak_in_flight): min(pp - s, micro-batches) with 1F1B; with
 * vpp > 1 more than Megatron, whose buffers are per chunk.
 * train.recompute: selective keeps no attention core (output, CPU
 * probabilities) and no dense SwiGLU activation per layer, full only each
 * layer's input; what is recomputed goes into one working set per stage
 * (one layer's worth, plus the recomputed layer's output for full),
 * counted once beside the sets in flight, as src/model/model_create.c
 * and src/model/cuda/cuda_model.c allocate it (a MoE layer's buffers once
 * under full). The backward's scratch and the RoPE tables (scratch_bytes,
 * in activation_bytes) are counted once per stage on a GPU (the activation
 * sets share them) and in every set on the CPU. Every buffer is counted as
 * the models lay it out: tests/unit/test_plan.c (the CPU model) and
 * tests/gpu/test_cuda_plan.c (the CUDA model's arena) hold the estimate to
 * within 0.03% of what they allocate (never above). The CUDA context, cuBLASLt's workspace,
 * NCCL and the allocator are not counted: leave a GiB or more.
 *
 * plan_check_memory turns the estimate into run's and resume's refusal of a
 * model that cannot fit, naming the key most of it comes from (the kind of
 * parameter that holds the most bytes, or the activations or logits). */
#include "plan.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>

#ifdef MT_CUDA
#include <cuda_runtime_api.h>
#endif

#include "../core/error.h"
#include "../model/model.h"
#include "../model/model_device.h"
#include "../model/moe_layer.h"
#include "../dist/dp_sync.h"
#include "../dist/pipeline_schedule.h"

/* The parameters one rank of a stage holds (tp rank 0, ep rank 0), split
 * into dense ones and routed experts, and by kind into st->group_params,
 * counted from the registry; *trained_dense and *trained_experts: of them
 * the trainable ones (all, or LoRA's adapters), into st->trainable_params. */
static void stage_params(const ModelConfig *m, const ParallelConfig *par, int tp, int cp, PlanStage *st,
                         bool first, bool last, double *dense, double *experts, double *trained_dense,
                         double *trained_experts) {
    ModelPartition part = {.tp = tp, .cp = cp, .ep = par->ep > 1 ? par->ep : 1, .etp = par->etp > 1 ? par->etp : 1,
                           .sequence_parallel = par->sequence_parallel && tp > 1, .num_chunks = st->num_chunks,
                           .has_embed = first, .has_head = last};
    for (int v = 0; v < st->num_chunks; v++) {
        part.chunk_first[v] = st->first_layer[v];
        part.chunk_layers[v] = st->num_layers[v];
        part.num_layers += st->num_layers[v];
    }
    int count = 0;
    long total = 0;
    ParamInfo *infos = model_registry_of(m, &part, &count, &total);
    *dense = *experts = *trained_dense = *trained_experts = 0;
    for (int i = 0; i < count; i++) {
        *(infos[i].expert ? experts : dense) += (double)infos[i].numel;
        if (!infos[i].frozen) *(infos[i].expert ? trained_experts : trained_dense) += (double)infos[i].numel;
        st->group_params[infos[i].kind] += (double)infos[i].numel;
        if (strstr(infos[i].name, ".mlp.router.")) st->router_params += (double)infos[i].numel;
    }
    st->trainable_params = *trained_dense + *trained_experts;
    free(infos);
}

/* The floats of the largest bucket of a region of `floats` sharded over `ranks` (src/dist/zero1.c): a bucket of
 * DP_BUCKET_BYTES, or the whole region if smaller, padded to a multiple of the ranks. */
static double zero1_largest_bucket(double floats, double ranks) {
    const double bucket = DP_BUCKET_BYTES / 4.0, n = floats < bucket ? floats : bucket;
    return ceil(n / ranks) * ranks;
}

static double lora_targets_of(const ModelConfig *m, int target) { return lora_targets(&m->peft, (LoraTarget)target); }

/* The model's parameter count and of them those trained (all, or LoRA's adapters): the same on every layout. */
static void model_counts(const ModelConfig *m, double *total_params, double *trainable_total) {
    *total_params = (double)model_count_params(m);
    *trainable_total = 0;
    const ModelPartition whole = model_partition_whole(m);
    int count = 0;
    long total = 0;
    ParamInfo *infos = model_registry_of(m, &whole, &count, &total);
    for (int i = 0; i < count; i++)
        if (!infos[i].frozen) *trainable_total += (double)infos[i].numel;
    free(infos);
}

/* plan_compute with the model's counts (model_counts) given: plan_fit takes them once for all its layouts (the
 * registries of the whole model were most of a layout's time). */
static int plan_compute_counted(Plan *p, const Recipe *r, int world, double total_params, double trainable_total,
                                char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    const ParallelConfig *par = &r->parallel;
    if (grid_layout(world, par->tp, par->cp, par->pp, &p->grid, err, errlen) != 0) return -1;
    if (par->pp > PLAN_MAX_STAGES) {
        mt_set_error(err, errlen, "parallel.pp: at most %d stages, found %d", PLAN_MAX_STAGES, par->pp);
        return -1;
    }
    const ModelConfig *m = &r->model;
    const TrainConfig *t = &r->train;
    const int tp = par->tp, pp = par->pp, cp = par->cp, dp = p->grid.dp, vpp = par->vpp > 1 ? par->vpp : 1;
    if (vpp > 16) {
        mt_set_error(err, errlen, "parallel.vpp: at most 16 virtual stages, found %d", vpp);
        return -1;
    }
    const double C = m->hidden_size, I = m->intermediate_size, V = m->vocab_size, T = t->seq_len;
    const double H = m->num_attention_heads;
    const double KVH = m->num_key_value_heads > 0 ? m->num_key_value_heads : H;
    const double D = m->head_dim > 0 ? m->head_dim : C / H;
    const double HD = H * D, KVD = KVH * D;
    p->gpu = strcmp(r->run.device, "cuda") == 0;
    p->total_params = total_params;
    p->trainable_total = trainable_total;

    /* the step: the largest global batch of the schedule */
    long gbs = 0;
    for (int i = 0; i < t->num_batch_stages; i++)
        if (t->batch_stages[i].global_batch_size > gbs) gbs = t->batch_stages[i].global_batch_size;
    p->global_batch = gbs;
    p->tokens_per_step = (double)gbs * T;
    p->flops_per_step = model_flops_per_token(m, t->seq_len) * p->tokens_per_step;
    p->flops_per_rank = p->flops_per_step / world;
    p->micro_batches = (double)gbs / ((double)t->micro_batch_size * dp);

    /* Bytes per token of this rank (micro_batch_size x seq_len / cp tokens a micro-batch), as src/model/
     * model_create.c (the CPU, fp32) and src/model/cuda/cuda_model.c (a GPU, bf16 activations) lay them out. What
     * a layer keeps for its backward, without its MLP: its input, normed input, mid residual and normed mid (R
     * rows: split over tp under sequence parallel), under sequence parallel on the CPU the gathered normed inputs
     * too (a GPU gathers them again in the backward, into one buffer of its scratch, as Megatron does); q, k
     * and v (the GPU also their fused product, the CPU with qk_norm q and k before the norm); the attention core
     * (the output; on the CPU the probabilities and the keys and values gathered over cp, which the GPU keeps
     * outside the core); in fp32 the norms' rstd, the GPU's lse and the qk-norms' rstd; LoRA's A x. The core is
     * what selective recompute recomputes. */
    const bool sp = par->sequence_parallel && tp > 1;
    const double elem = p->gpu ? 2.0 : 4.0, hidden_split = sp ? tp : 1;
    const double QKV = (HD + 2 * KVD) / tp, kv_all = cp > 1 ? 2.0 * cp * KVD / tp * elem : 0.0;
    double core = HD / tp * elem;
    if (!p->gpu) core += H / tp * T * 4.0 + kv_all;
    /* LoRA keeps each adapter's A x, rank floats per token (gathered over tp; fp32 on the CPU) */
    double lora_targets = 0;
    for (int tgt = 0; tgt < LORA_NUM_TARGETS; tgt++) lora_targets += lora_targets_of(m, tgt);
    const double lora_rank = m->peft.type == PEFT_LORA ? m->peft.rank : 0.0;
    const bool sp_keeps_gathered = sp && !p->gpu; /* the CPU keeps the gathered normed inputs */
    const double per_token_layer =
        (4 * C / hidden_split + (sp_keeps_gathered ? 2 * C : 0) + QKV) * elem + core +
        (p->gpu ? QKV * elem + kv_all + H / tp * 4.0 : m->qk_norm ? (HD + KVD) / tp * 4.0 : 0.0) +
        (2 / hidden_split + (m->qk_norm ? (H + KVH) / tp : 0)) * 4.0;
    const double lora_kept = lora_targets * lora_rank * 4.0; /* in every recompute mode */
    /* Once per activation set beside its layers: the token ids and targets, the first layer's input (the CPU:
     * the stage's output, and each further chunk's), the CPU's row lse, output projection and reduce-scatter
     * rows; on the last stage the final norm's output, rstd and under sequence parallel on the CPU its gathered
     * rows, and the per-token losses (the GPU also their lse); the logits are logits_bytes. */
    const double chunks = vpp;
    const double per_token_set = 8.0 + C / hidden_split * elem +
                                 (p->gpu ? 0.0 : 8.0 + (chunks - 1) * C / hidden_split * 4.0 + C * 4.0 +
                                                     C / hidden_split * 4.0);
    const double per_token_head = (C / hidden_split + (sp_keeps_gathered ? C : 0)) * elem + 4.0 / hidden_split + 4.0 +
                                  (p->gpu ? 4.0 : 0.0);
    /* The backward's scratch: once per stage on a GPU (one op at a time: a pipeline's activation sets share
     * it), in every activation set on the CPU. GPU: the residual gradient in fp32 and bf16, the normed input's,
     * the dense MLP's, the attention's (output, q, k, v and their fused product) and its fp32 dq sums and
     * delta; vocab parallel the loss's row statistics; sequence parallel the gathered rows, normed input and
     * gradients; cp the gathered keys and values and their fp32 gradients. CPU: the same in fp32, q and k twice,
     * LoRA's. */
    const double I_tp = I / tp;
    double scratch;
    if (p->gpu)
        scratch = C / hidden_split * 6.0 + C * 2.0 + (HD / tp * 2 + 2 * KVD / tp + QKV) * 2.0 +
                  (HD / tp + H / tp) * 4.0 + (tp > 1 ? (3.0 + 3.0 * tp) * 4.0 : 0.0) +
                  (sp ? C * 10.0 + C / tp * 2.0 : 0.0) + (cp > 1 ? cp * KVD / tp * (2.0 + 12.0) + KVD / tp * 4.0 : 0.0);
    else
        scratch = (C / hidden_split + C + HD / tp * 3 + KVD / tp * 3 + 3 * I_tp) * 4.0 +
                  (cp > 1 ? 2.0 * cp * KVD / tp * 4.0 : 0.0) + (sp ? C * 4.0 : 0.0) +
                  lora_rank * (1.0 + 2.0 / tp) * 4.0;
    const double dense_scratch = p->gpu ? 3 * I_tp * 2.0 : 0.0; /* the GPU's, with a dense layer on the stage */
    /* the MLP's: dense gate/up/act; MoE: router logits and scores, and per chosen
     * expert the row sent, the row back, gate/up/act of this rank's slice */
    const double etp = par->etp > 1 ? par->etp : 1, ep = par->ep > 1 ? par->ep : 1;
    const MoeConfig *moe = &m->moe;
    const double swiglu = I / tp * elem; /* the dense SwiGLU activation (selective recomputes it) */
    const double dense_mlp = 3 * I / tp * elem;
    const double E = moe->num_experts, k = moe->num_experts_per_tok, Ie = moe->moe_intermediate_size / etp;
    const double Is = moe->shared_expert_intermediate_size / etp;
    /* the GPU's MoE layer (cuda_model_moe.c): logits, scores, lse and score sums; per assignment its expert, row,
     * raw score and weight (4 bytes each), the row sent and the row back; the expert side's gate|up and
     * activation for the rows the arena holds (moe_expert_rows_room: a balanced routing's), and under ep their
     * input rows and order both ways; the shared expert's gate|up and activation. Under ep a layer given more rows
     * takes an expert side of its own for all of them as it goes, at most ex_most rows (moe_expert_rows_max), the
     * arena's left unused: moe_spill_bytes. */
    const double tokens = (double)t->micro_batch_size * T / cp; /* a micro-batch's on this rank */
    const double ex_rows = tokens > 0 ? (double)moe_expert_rows_room(moe, (int)ep, (long)tokens) / tokens : 0.0;
    const double ex_most = tokens > 0 ? (double)moe_expert_rows_max(moe, (int)ep, (long)tokens) / tokens : 0.0;
    const double ep_side = ep > 1 ? ex_rows * (C * elem + 8.0) : 0.0; /* ex_rows, ex_most: per token */
    /* per row of a spilled layer: kept (the received row, its order both ways, gate|up, activation), and scratch
     * (the received order, the experts' rows, their gradient, d gate|up and d activation) */
    const double spill_kept = C * elem + 8.0 + 3.0 * Ie * elem, spill_scratch = 3.0 * C * elem + 3.0 * Ie * elem;
    double moe_mlp = 2.0 * E * 4.0 + 2 * 4.0 + k * (16.0 + 2 * C * elem) + ex_rows * 3.0 * Ie * elem + ep_side +
                     3.0 * Is * elem;
    /* and its scratch, once per stage: the router's fp32 input and input gradient, d_logits, per assignment the
     * combine weights' gradients, row bookkeeping, the rows' gradients and the expert side's (worst case), under
     * ep the all-to-all's rows, the experts' outputs and their input gradients; the shared expert's output and
     * gradients */
    const double moe_scratch = 8.0 * C + 4.0 * E + k * (13.0 + 2 * C * elem) + ex_rows * 3.0 * Ie * elem +
                               (ep > 1 ? ex_rows * 3.0 * C * elem : 0.0) + (Is > 0 ? C + 3.0 * Is : 0.0) * elem +
                               (tp > 1 ? C * elem : 0.0); /* tp: the output over all rows before the tp sum */
    if (!p->gpu) /* the CPU's MoE layer (moe_layer.c) also keeps its backward's buffers and routing per layer, and
                  * its expert side starts with room for a quarter more rows than its own */
        moe_mlp = 4.0 * E * 4.0 + k * (5 * 4.0 + 8.0) + 4 * k * C * 4.0 + 6.0 * Is * 4.0 +
                  1.25 * k * (4.0 + (5 * C + 6 * Ie) * 4.0);

    /* distributed optimizer: the dense weights' master and moments over dp, the routed experts' over edp */
    const double edp = dp / ep;
    const bool zero1 = par->distributed_optimizer;
    const double master_dense = zero1 ? 4.0 / dp : 4.0, master_experts = zero1 ? 4.0 / edp : 4.0;
    const double moments = r->optimizer.state_dtype == DTYPE_BF16 ? 4.0 : 8.0; /* m and v, per parameter */
    const double moments_dense = zero1 ? moments / dp : moments, moments_experts = zero1 ? moments / edp : moments;
    for (int s = 0; s < pp; s++) {
        PlanStage *st = &p->stages[s];
        st->num_chunks = vpp;
        int layers = 0;
        for (int v = 0; v < vpp; v++) {
            parallel_stage_layers(par, m->num_layers, v * pp + s, &st->first_layer[v], &st->num_layers[v]);
            layers += st->num_layers[v];
        }
        st->embedding = s == 0;
        st->final_norm = s == pp - 1;
        st->lm_head = s == pp - 1 && (!m->tie_word_embeddings || pp > 1);
        /* the parameters of the stage's first rank, from the registry itself */
        double dense = 0, experts = 0, trained_dense = 0, trained_experts = 0;
        stage_params(m, par, p->grid.tp, cp, st, s == 0, s == pp - 1, &dense, &experts, &trained_dense,
                     &trained_experts);
        st->params = dense + experts;
        st->expert_params = experts;
        /* gradients, moments (and on a GPU the fp32 master) only for the trainable parameters */
        st->weight_bytes = p->gpu ? 2.0 * st->params + master_dense * trained_dense + master_experts * trained_experts
                                  : 4.0 * st->params;
        if (p->gpu && zero1 && dp > 1) { /* the GPU's distributed optimizer: the staging of its largest bucket
                                          * (its uploads and ragged buckets) and a fp32 replica of the routers and
                                          * biases; under ep the experts are a region of their own, over edp */
            const double staging =
                ep > 1 ? fmax(zero1_largest_bucket(trained_dense, dp), zero1_largest_bucket(trained_experts, edp))
                       : zero1_largest_bucket(trained_dense + trained_experts, dp);
            st->weight_bytes += 4.0 * staging + 4.0 * st->router_params;
        }
        st->grad_bytes = st->trainable_params * 4.0;
        st->optimizer_bytes = moments_dense * trained_dense + moments_experts * trained_experts;
        int moe_layers = 0;
        for (int v = 0; v < vpp; v++)
            for (int l = st->first_layer[v]; l < st->first_layer[v] + st->num_layers[v]; l++)
                moe_layers += model_layer_is_moe(m, l);
        const int dense_layers = layers - moe_layers;
        const double per_token = per_token_layer + (layers > 0 ? (dense_layers * dense_mlp +
                                                                  moe_layers * moe_mlp) / layers : 0.0);
        /* kept per layer and token in each activation set, and the working set the backward recomputes
         * into (once per stage, shared by the micro-batches in flight) */
        double kept = per_token + lora_kept, working = 0.0;
        if (t->recompute == RECOMPUTE_SELECTIVE && layers > 0) {
            kept = per_token + lora_kept - core - swiglu * dense_layers / layers;
            working = core + (dense_layers > 0 ? swiglu : 0.0);
        } else if (t->recompute == RECOMPUTE_FULL && layers > 0) {
            kept = C / hidden_split * elem + lora_kept; /* the layer's input */
            /* one layer of either kind (but its input) and the recomputed layer's output */
            working = per_token_layer + (dense_layers > 0 ? dense_mlp : 0.0) + (moe_layers > 0 ? moe_mlp : 0.0);
        }
        /* one activation set (all of the stage's chunks, its logits on the last stage) per micro-batch in flight */
        st->in_flight = pp > 1 ? pipeline_peak_in_flight(pp, vpp, s, (int)p->micro_batches) : 1;
        st->recompute_bytes = tokens * working;
        const bool head = s == pp - 1;
        const double per_set = tokens * (layers * kept + per_token_set + (head ? per_token_head : 0.0));
        if (p->gpu) /* once: the scratch, its dense and MoE parts as the stage's layers need them, the RoPE and
                     * cp position tables */
            st->scratch_bytes = tokens * (scratch + (dense_layers > 0 ? dense_scratch : 0.0) +
                                          (moe_layers > 0 ? moe_scratch : 0.0)) +
                                T / cp * (D * 4.0 + (cp > 1 ? 4.0 * (1 + cp) : 0.0));
        else
            st->scratch_bytes = st->in_flight * tokens * scratch;
        st->activation_bytes = st->in_flight * per_set + st->recompute_bytes + st->scratch_bytes;
        st->logits_bytes = s == pp - 1 ? st->in_flight * tokens * V / tp * elem : 0.0;
        st->total_bytes = st->weight_bytes + st->grad_bytes + st->optimizer_bytes + st->activation_bytes +
                          st->logits_bytes;
        if (p->gpu && ep > 1 && moe_layers > 0) { /* the sets in flight keep it until their backward; full
                                                   * recompute keeps it only in the layer it reruns */
            const double sets_layers = t->recompute == RECOMPUTE_FULL ? 1.0 : st->in_flight * moe_layers;
            if (ex_most > ex_rows) st->moe_spill_bytes = tokens * ex_most * (sets_layers * spill_kept + spill_scratch);
        }
    }
    return 0;
}

int plan_compute(Plan *p, const Recipe *r, int world, char *err, size_t errlen) {
    double total_params, trainable_total;
    model_counts(&r->model, &total_params, &trainable_total);
    return plan_compute_counted(p, r, world, total_params, trainable_total, err, errlen);
}

int plan_worst_stage(const Plan *p) {
    int worst = 0;
    for (int s = 1; s < p->grid.pp; s++)
        if (p->stages[s].total_bytes > p->stages[worst].total_bytes) worst = s;
    return worst;
}

const char *plan_stage_driver(const Plan *p, const Recipe *r, int stage, char *what, size_t len) {
    const PlanStage *st = &p->stages[stage];
    const ModelConfig *m = &r->model;
    const TrainConfig *t = &r->train;
    /* weights, gradients and optimizer states follow the parameters */
    const double per_param = st->params > 0 ? (st->weight_bytes + st->grad_bytes + st->optimizer_bytes) / st->params : 0;
    int best = 0;
    for (int g = 1; g < PARAM_KINDS; g++)
        if (st->group_params[g] > st->group_params[best]) best = g;
    const double params_bytes = st->group_params[best] * per_param;
    if (st->activation_bytes >= params_bytes && st->activation_bytes >= st->logits_bytes) {
        snprintf(what, len, "the activations (micro-batches of train.micro_batch_size = %d x train.seq_len = %d "
                 "tokens)", t->micro_batch_size, t->seq_len);
        return "train.micro_batch_size";
    }
    if (st->logits_bytes >= params_bytes) {
        snprintf(what, len, "the logits (model.vocab_size = %d per token of micro-batches of %d x %d)", m->vocab_size,
                 t->micro_batch_size, t->seq_len);
        return "model.vocab_size";
    }
    switch ((ParamKind)best) {
    case PARAM_EMBEDDING:
        snprintf(what, len, "the embedding (model.vocab_size = %d x model.hidden_size = %d)", m->vocab_size,
                 m->hidden_size);
        return "model.vocab_size";
    case PARAM_MLP:
        snprintf(what, len, "the MLP weights (model.intermediate_size = %d)", m->intermediate_size);
        return "model.intermediate_size";
    case PARAM_EXPERTS:
        snprintf(what, len, "the experts' weights (model.moe.num_experts = %d x model.moe.moe_intermediate_size = %d)",
                 m->moe.num_experts, m->moe.moe_intermediate_size);
        return "model.moe.moe_intermediate_size";
    case PARAM_SHARED_EXPERT:
        snprintf(what, len, "the shared expert's weights (model.moe.shared_expert_intermediate_size = %d)",
                 m->moe.shared_expert_intermediate_size);
        return "model.moe.shared_expert_intermediate_size";
    default:
        snprintf(what, len, "the attention weights (model.hidden_size = %d, model.num_attention_heads = %d)",
                 m->hidden_size, m->num_attention_heads);
        return "model.hidden_size";
    }
}

double plan_rank_memory(const Recipe *r) {
    if (strcmp(r->run.device, "cuda") == 0) {
#ifdef MT_CUDA
        struct cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) return (double)prop.totalGlobalMem;
        (void)cudaGetLastError();
#endif
        return 0.0;
    }
    struct sysinfo si;
    if (sysinfo(&si) != 0) return 0.0;
    return ((double)si.totalram + (double)si.totalswap) * (double)si.mem_unit;
}

/* One candidate lever: a single setting changed in *r (a copy), or false where it does not apply. */
static bool apply_lever(Recipe *r, int grid_dp, int which, char *setting, size_t len) {
    TrainConfig *t = &r->train;
    ParallelConfig *par = &r->parallel;
    switch (which) {
    case 0:
        if (t->recompute != RECOMPUTE_NONE) return false;
        t->recompute = RECOMPUTE_SELECTIVE;
        snprintf(setting, len, "train.recompute: selective");
        return true;
    case 1:
        if (t->recompute == RECOMPUTE_FULL) return false;
        t->recompute = RECOMPUTE_FULL;
        snprintf(setting, len, "train.recompute: full");
        return true;
    case 2:
        if (r->optimizer.state_dtype == DTYPE_BF16) return false;
        r->optimizer.state_dtype = DTYPE_BF16;
        snprintf(setting, len, "optimizer.state_dtype: bf16");
        return true;
    case 3: /* ZeRO-1 shards over dp: nothing to gain on one dp rank */
        if (par->distributed_optimizer || grid_dp < 2) return false;
        par->distributed_optimizer = true;
        snprintf(setting, len, "parallel.distributed_optimizer: true");
        return true;
    case 4:
        if (par->sequence_parallel || par->tp < 2) return false;
        par->sequence_parallel = true;
        snprintf(setting, len, "parallel.sequence_parallel: true");
        return true;
    case 5:
        if (t->micro_batch_size < 2) return false;
        t->micro_batch_size /= 2;
        snprintf(setting, len, "train.micro_batch_size: %d", t->micro_batch_size);
        return true;
    case 6: /* more ep: fewer experts a rank (a GPU's expert side holds a balanced routing's rows at any ep; less ep
             * saves nothing: more experts a rank, the same rows) */
        if (r->model.moe.num_experts == 0 || grid_dp % (2 * par->ep) != 0 || r->model.moe.num_experts % (2 * par->ep))
            return false;
        par->ep *= 2;
        snprintf(setting, len, "parallel.ep: %d", par->ep);
        return true;
    default:
        return false;
    }
}
enum { NUM_LEVERS = 7 };

int plan_levers(const Plan *p, const Recipe *r, PlanLever *out, int max) {
    Recipe *alt = mt_malloc(sizeof *alt);
    Plan *q = mt_malloc(sizeof *q);
    const double now = p->stages[plan_worst_stage(p)].total_bytes;
    char err[512];
    int n = 0;
    for (int which = 0; which < NUM_LEVERS && n < max; which++) {
        *alt = *r;
        if (!apply_lever(alt, p->grid.dp, which, out[n].setting, sizeof out[n].setting)) continue;
        if (plan_compute(q, alt, p->grid.world, err, sizeof err) != 0) continue;
        out[n].total_bytes = q->stages[plan_worst_stage(q)].total_bytes;
        if (out[n].total_bytes < 0.995 * now) n++; /* a lever that saves something */
    }
    free(q);
    free(alt);
    for (int i = 1; i < n; i++) /* the largest saving first */
        for (int j = i; j > 0 && out[j].total_bytes < out[j - 1].total_bytes; j--) {
            const PlanLever t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    return n;
}

const char *plan_size_text(double bytes, int decimals, char *out, size_t len) {
    const double GiB = 1073741824.0, MiB = 1048576.0;
    if (bytes < GiB) snprintf(out, len, "%.*f MiB", decimals, bytes / MiB);
    else snprintf(out, len, "%.*f GiB", decimals, bytes / GiB);
    return out;
}

/* Into msg (appended): the levers without more ranks, each with the estimate it gives, then those with more. */
static void levers_text(const Plan *p, const Recipe *r, const char *key, char *msg, size_t len) {
    PlanLever lv[NUM_LEVERS];
    const int n = plan_levers(p, r, lv, NUM_LEVERS);
    size_t used = strlen(msg);
    char size[32];
    for (int i = 0; i < n && used < len; i++)
        used += (size_t)snprintf(msg + used, len - used, "%s%s (%s)", i ? ", " : "; on the same ranks: ",
                                 lv[i].setting, plan_size_text(lv[i].total_bytes, 1, size, sizeof size));
    const bool activations = !strcmp(key, "train.micro_batch_size") || !strcmp(key, "model.vocab_size");
    /* ep is raised only while a rank holds more than one expert (ep divides num_experts): at ep = num_experts
     * (Mixtral 8x7B at ep 8) more ranks can split the experts only with tp or pp */
    const bool experts = !strcmp(key, "model.moe.moe_intermediate_size") && r->parallel.ep < r->model.moe.num_experts;
    if (used < len)
        snprintf(msg + used, len - used, "; with more ranks: raise %s", activations
                 ? "parallel.cp (splits the sequence), parallel.tp or parallel.pp"
                 : experts ? "parallel.ep, parallel.tp or parallel.pp" : "parallel.tp or parallel.pp");
}

const char *plan_check_fit(const Plan *p, const Recipe *r, double available, const char *memory, char *msg,
                           size_t len) {
    const int s = plan_worst_stage(p);
    const double need = p->stages[s].total_bytes;
    if (need <= available) return NULL;
    char what[256], need_text[32], available_text[32];
    const char *key = plan_stage_driver(p, r, s, what, sizeof what);
    snprintf(msg, len, "stage %d needs about %s per rank, more than %s (%s); most of it is %s", s,
             plan_size_text(need, 1, need_text, sizeof need_text), memory,
             plan_size_text(available, 1, available_text, sizeof available_text), what);
    levers_text(p, r, key, msg, len);
    return key;
}

int plan_check_memory(const Recipe *r, int world, char *err, size_t errlen) {
    const double available = plan_rank_memory(r);
    if (!(available > 0)) return 0; /* unknown: the allocation itself says */
    Plan *p = mt_malloc(sizeof *p);
    char msg[1024];
    const char *key = NULL;
    /* a plan_compute failure is one of plan's own table limits (the layout itself was checked): no estimate */
    if (plan_compute(p, r, world, msg, sizeof msg) == 0) key = plan_check_fit(p, r, available, p->gpu ? "the device's memory" : "this host's memory and swap",
                                                              msg, sizeof msg);
    if (key) { /* and the fewest ranks that fit, as plan's fit: line names them */
        PlanFit fit;
        char layout[128], fits[256] = "";
        if (plan_fit(r, available, &fit))
            snprintf(fits, sizeof fits, "; it fits on %d rank%s as %s", fit.world, fit.world == 1 ? "" : "s",
                     plan_fit_text(&fit, layout, sizeof layout));
        mt_set_error(err, errlen, "%s: the model does not fit: %s%s (`megatrain plan RECIPE --fit` shows the estimate "
                     "and the settings)", key, msg, fits);
    }
    free(p);
    return key ? -1 : 0;
}

/* run.device: cuda: how many of the recipe's settings `run` refuses on GPUs (0 on the CPU) */
static int cuda_refusals(const Recipe *r) {
    if (strcmp(r->run.device, "cuda") != 0) return 0;
    const ModelDeviceSetup setup = {.device = r->run.device, .cfg = &r->model, .parallel = &r->parallel,
                                    .precision = r->precision, .loss = r->train.loss, .packed = r->data.pack};
    char why[4096];
    return model_device_cuda_limits(&setup, why, sizeof why);
}

int plan_fit_layout(const Recipe *r, Recipe *alt, int tp, int cp, int pp, int dp, int ep, char *why, size_t len) {
    ParallelConfig *par = &alt->parallel;
    *par = r->parallel;
    par->tp = tp;
    par->cp = cp;
    par->ep = ep;
    if (r->parallel.etp > 1) par->etp = tp; /* etp is 1 or tp (recipe_validate.c): the recipe's choice, kept */
    if (pp != r->parallel.pp) {             /* r's vpp and pp_layers are for its own pp */
        par->pp = pp;
        par->vpp = 1;
        par->num_pp_layers = 0;
    }
    if (pp > PLAN_MAX_STAGES || (long)tp * cp * pp * dp > PLAN_FIT_MAX_WORLD) {
        mt_set_error(why, len, "outside plan's search (pp at most %d, at most %d ranks)", PLAN_MAX_STAGES,
                     PLAN_FIT_MAX_WORLD);
        return 0;
    }
    const int world = tp * cp * pp * dp;
    if (recipe_validate_layout(alt, world, why, len) != 0) return 0;
    if (cuda_refusals(alt) > cuda_refusals(r)) {
        mt_set_error(why, len, "run.device: cuda refuses this layout (`megatrain plan` with it lists why)");
        return 0;
    }
    return world;
}

typedef struct FitLayout {
    int world, order, tp, cp, pp, dp, ep;
} FitLayout;

static int fit_layout_cmp(const void *a, const void *b) {
    const FitLayout *x = a, *y = b;
    if (x->world != y->world) return x->world < y->world ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* Into *out (grown as needed): the layouts of the space with tp in [tp_lo, tp_hi] that the recipe allows, in order of
 * world; *max_tp: the largest tp among them, if larger. */
static int fit_layouts(const Recipe *r, Recipe *alt, int tp_lo, int tp_hi, FitLayout **out, int *cap, int *max_tp) {
    const int layers = r->model.num_layers, mbs = r->train.micro_batch_size;
    const long batch = r->train.batch_stages[0].global_batch_size; /* a bound: validation checks every stage */
    const bool moe = r->model.moe.num_experts > 0;
    char why[512];
    int n = 0;
    for (int tp = tp_lo; tp <= tp_hi; tp *= 2)
        for (int cp = 1; cp <= PLAN_FIT_MAX_CP; cp *= 2)
            for (int pp = 1; pp <= layers && pp <= PLAN_MAX_STAGES; pp++) {
                if (pp != r->parallel.pp && (pp > PLAN_FIT_MAX_PP || layers % pp != 0)) continue;
                for (int dp = 1; (long)tp * cp * pp * dp <= PLAN_FIT_MAX_WORLD; dp++) {
                    if (batch % ((long)mbs * dp) != 0) continue;
                    for (int ep = 1; ep <= (moe ? dp : 1); ep++) {
                        if (dp % ep != 0) continue;
                        const int world = plan_fit_layout(r, alt, tp, cp, pp, dp, ep, why, sizeof why);
                        if (world == 0) continue;
                        if (n == *cap) {
                            *cap = *cap ? 2 * *cap : 1024;
                            *out = mt_realloc(*out, (size_t)*cap * sizeof **out);
                        }
                        (*out)[n] = (FitLayout){world, n, tp, cp, pp, dp, ep};
                        n++;
                        if (tp > *max_tp) *max_tp = tp;
                    }
                }
            }
    qsort(*out, (size_t)n, sizeof **out, fit_layout_cmp);
    return n;
}

bool plan_fit(const Recipe *r, double available, PlanFit *fit) {
    memset(fit, 0, sizeof *fit);
    Recipe *alt = mt_malloc(sizeof *alt);
    Plan *q = mt_malloc(sizeof *q);
    *alt = *r;
    const double spare = strcmp(r->run.device, "cuda") == 0 ? PLAN_GPU_RESERVE_BYTES : 0.0;
    FitLayout *layouts = NULL;
    int cap = 0;
    double nearest = INFINITY, total_params, trainable_total;
    int max_tp = 0;
    model_counts(&r->model, &total_params, &trainable_total);
    char err[512];
    /* within a node first: tp beyond it only where no layout of tp up to a node fits */
    for (int pass = 0; pass < 2 && !fit->found; pass++) {
        const int tp_lo = pass ? 2 * PLAN_FIT_NODE_TP : 1, tp_hi = pass ? PLAN_FIT_MAX_TP : PLAN_FIT_NODE_TP;
        const int n = fit_layouts(r, alt, tp_lo, tp_hi, &layouts, &cap, &max_tp);
        for (int i = 0; i < n; i++) {
            const FitLayout *c = &layouts[i];
            if (fit->found && c->world > fit->world) break; /* in order of world: the fewest ranks are done */
            plan_fit_layout(r, alt, c->tp, c->cp, c->pp, c->dp, c->ep, err, sizeof err);
            if (plan_compute_counted(q, alt, c->world, total_params, trainable_total, err, sizeof err) != 0)
                continue; /* plan's own table limits */
            fit->layouts++;
            const double need = q->stages[plan_worst_stage(q)].total_bytes;
            const bool fits = need + spare <= available;
            if (fits ? fit->found && need >= fit->total_bytes : fit->found || need >= nearest) continue;
            if (!fits) nearest = need;
            *fit = (PlanFit){.found = fits, .world = c->world, .tp = c->tp, .cp = c->cp, .pp = c->pp, .dp = c->dp,
                             .ep = c->ep, .etp = alt->parallel.etp, .vpp = alt->parallel.vpp, .total_bytes = need,
                             .layouts = fit->layouts};
        }
    }
    fit->max_tp = max_tp;
    free(layouts);
    free(q);
    free(alt);
    return fit->found;
}

const char *plan_fit_text(const PlanFit *f, char *out, size_t len) {
    char cp[32] = "", ep[32] = "";
    if (f->cp > 1) snprintf(cp, sizeof cp, " x cp %d", f->cp);
    if (f->ep > 1) snprintf(ep, sizeof ep, " with ep %d", f->ep);
    snprintf(out, len, "tp %d%s x pp %d x dp %d%s", f->tp, cp, f->pp, f->dp, ep);
    return out;
}
