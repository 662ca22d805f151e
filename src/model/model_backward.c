/* model_backward.c: the backward pass of the dense transformer, the mirror of
 * model_forward.c read bottom-up. Backend backwards accumulate (+=), so every
 * activation-gradient buffer is zeroed before the op that fills it, while
 * parameter gradients accumulate into model->grads across calls (none for a
 * frozen parameter: its gradient view is NULL, model_lora.c). dlogits are
 * computed in place in the logits buffer. The collectives of a parallel
 * layout (model_parallel.h) run in the reverse order of the forward's.
 *
 * Recompute (Model.recompute, train.recompute; the buffers in model_create.c):
 *   selective  before the MLP's backward swiglu(gate, up) -> act, before the
 *              attention's the attention core (model_attention_core: under cp
 *              the key/value all-gathers, then probs and attn_out) from the
 *              kept q, k, v; both into the one working set.
 *   full       first the layer's whole forward (model_block_forward) from its
 *              kept input into the working set, its output into recompute_out
 *              (discarded: the next layer's input is kept), then the backward.
 * The CPU ops are deterministic, so the recomputed buffers equal the
 * forward's bit for bit and so do the gradients. A MoE layer's recomputed
 * forward (ModelPriv.recomputing) routes the same way (the weights and
 * expert_bias change only at the step's end) and skips its statistics and
 * their collectives (the dp/cp sums of balance_loss): its MoeBalance of the
 * first forward is kept per layer and per activation set.
 * Why the recomputed collectives cannot deadlock: every collective a
 * recompute reruns (tp/sp all-gathers and reductions, cp key/value gathers,
 * ep all-to-alls) is over a group whose ranks all hold the same layers and
 * run the same schedule of micro-batches (the pipeline schedule is a
 * function of the stage only, and tp/cp/ep groups lie within one stage),
 * and the recompute mode is one recipe key for all ranks. So every rank of
 * the group reaches the same recompute of the same layer at the same point
 * of its call sequence, issuing the same collectives in the same order as
 * its peers; no rank skips one (the skipped MoE statistics are skipped on
 * every rank alike), and none is issued from inside another. */
#include <string.h>

#include "../core/error.h"
#include "model_fp8.h"
#include "model_parallel.h"
#include "moe_layer.h"

static void zero(float *buf, long n) { memset(buf, 0, (size_t)n * sizeof(float)); }

/* One block (local layer l). On entry s->d_resid holds dL/d(block output)
 * (residual rows, C); on exit it holds dL/d(block input). */
static void block_backward(Model *model, int l, int B, int T, float loss_scale) {
    const BackendOps *ops = model->ops;
    const ModelConfig *c = &model->cfg;
    ModelPriv *pr = model->priv;
    const LayerWeights *w = &pr->weights[l];
    const LayerWeights *dw = &pr->weight_grads[l];
    const LayerActs *a = &pr->acts[l];
    GradScratch *s = &pr->scratch;
    const ModelShape *sh = &pr->shape;
    const int N = B * T, R = model_shape_rows(sh, N), C = sh->C, D = sh->D;
    const int I = sh->I, H = sh->H, KVH = sh->KVH, HD = sh->HD, KVD = sh->KVD;
    const float *cos, *sin;
    int rB, rT;
    model_rope_tables(model, B, T, &cos, &sin, &rB, &rT);
    if (model->recompute == RECOMPUTE_FULL) { /* the layer's forward again, from its kept input */
        pr->recomputing = true;
        model_block_forward(model, l, pr->recompute_out, B, T);
        pr->recomputing = false;
    }

    /* MLP half: out = resid_mid + down(act); d_resid flows to resid_mid unchanged. */
    const float *dy = tp_leave_backward(model, s->d_full, s->d_resid, N, C); /* (N, C) */
    const float *g;
    if (pr->moe[l]) {
        zero(s->d_normed, (long)N * C);
        moe_backward(model, l, pr->moe[l], a->mlp_in, dy, s->d_normed, loss_scale);
        /* etp > 1: a tp partial, summed as the dense MLP's; etp 1: computed whole on every tp rank */
        g = model->part.etp > 1 ? tp_enter_backward(model, s->d_normed, pr->shard, N, C)
                                : s->d_normed + (size_t)model_shape_row_offset(sh, N) * C;
        ops->rmsnorm_backward(s->d_resid, dw->mlp_norm, g, a->resid_mid, w->mlp_norm, a->mlp_rstd, R, C);
        goto attention;
    }
    if (model->recompute == RECOMPUTE_SELECTIVE) ops->swiglu_forward(a->act, a->gate, a->up, (long)N * I);
    zero(s->d_act, (long)N * I);
    const LinearPart down = {.weight = w->down_weight, .dout = dy, .dweight = dw->down_weight, .OC = C};
    linear_group_backward(model, l, LINEAR_DOWN, s->d_act, a->act, N, I, &down, 1);
    lora_backward(model, l, LORA_DOWN, s->d_act, dy, a->act, N);
    zero(s->d_gate, (long)N * I);
    zero(s->d_up, (long)N * I);
    ops->swiglu_backward(s->d_gate, s->d_up, s->d_act, a->gate, a->up, (long)N * I);
    zero(s->d_normed, (long)N * C);
    const LinearPart gate_up[2] = {{.weight = w->gate_weight, .dout = s->d_gate, .dweight = dw->gate_weight, .OC = I},
                                   {.weight = w->up_weight, .dout = s->d_up, .dweight = dw->up_weight, .OC = I}};
    linear_group_backward(model, l, LINEAR_GATE_UP, s->d_normed, a->mlp_in, N, C, gate_up, 2);
    lora_backward(model, l, LORA_GATE, s->d_normed, s->d_gate, a->mlp_in, N);
    lora_backward(model, l, LORA_UP, s->d_normed, s->d_up, a->mlp_in, N);
    g = tp_enter_backward(model, s->d_normed, pr->shard, N, C); /* residual rows */
    ops->rmsnorm_backward(s->d_resid, dw->mlp_norm, g, a->resid_mid, w->mlp_norm, a->mlp_rstd, R, C);
    /* d_resid is now dL/d(resid_mid) */
attention:

    /* attention half: resid_mid = resid_in + o_proj(attn_out) */
    if (model->recompute == RECOMPUTE_SELECTIVE) model_attention_core(model, l, B, T);
    dy = tp_leave_backward(model, s->d_full, s->d_resid, N, C);
    zero(s->d_attn_out, (long)N * HD);
    const LinearPart o = {.weight = w->o_weight, .dout = dy, .dweight = dw->o_weight, .OC = C};
    linear_group_backward(model, l, LINEAR_O, s->d_attn_out, a->attn_out, N, HD, &o, 1);
    lora_backward(model, l, LORA_O, s->d_attn_out, dy, a->attn_out, N);
    zero(s->d_q, (long)N * HD);
    zero(s->d_k, (long)N * KVD);
    zero(s->d_v, (long)N * KVD);
    if (sh->cp == 1 && pr->packed) {
        ops->attention_backward_doc(s->d_q, s->d_k, s->d_v, s->d_attn_out, a->probs, a->q, a->k, a->v, NULL,
                                    pr->packed_pos, B, T, T, H, KVH, D);
    } else if (sh->cp == 1) {
        ops->attention_backward(s->d_q, s->d_k, s->d_v, s->d_attn_out, a->probs, a->q, a->k, a->v, B, T, H, KVH, D);
    } else { /* gradients of the whole sequence's keys and values go back to the ranks holding them */
        const int Tall = T * sh->cp;
        zero(s->d_k_all, (long)B * Tall * KVD);
        zero(s->d_v_all, (long)B * Tall * KVD);
        if (pr->packed)
            ops->attention_backward_doc(s->d_q, s->d_k_all, s->d_v_all, s->d_attn_out, a->probs, a->q, a->k_all,
                                        a->v_all, pr->positions, pr->packed_pos, B, T, Tall, H, KVH, D);
        else
            ops->attention_backward_at(s->d_q, s->d_k_all, s->d_v_all, s->d_attn_out, a->probs, a->q, a->k_all,
                                       a->v_all, pr->positions, B, T, Tall, H, KVH, D);
        cp_scatter_kv_grad(model, s->d_k, s->d_k_all, B, T, KVD);
        cp_scatter_kv_grad(model, s->d_v, s->d_v_all, B, T, KVD);
    }
    /* through rope: d_q -> d_q2 (gradient of q before rope), same for k */
    zero(s->d_q2, (long)N * HD);
    zero(s->d_k2, (long)N * KVD);
    ops->rope_backward(s->d_q2, s->d_q, cos, sin, rB, rT, H, D);
    ops->rope_backward(s->d_k2, s->d_k, cos, sin, rB, rT, KVH, D);
    float *d_q_proj = s->d_q2, *d_k_proj = s->d_k2;
    if (c->qk_norm) {
        /* through the per-head norms: d_q2 -> d_q (gradient of q_proj's output) */
        zero(s->d_q, (long)N * HD);
        zero(s->d_k, (long)N * KVD);
        ops->rmsnorm_backward(s->d_q, dw->q_norm, s->d_q2, a->q_pre, w->q_norm, a->q_rstd, N * H, D);
        ops->rmsnorm_backward(s->d_k, dw->k_norm, s->d_k2, a->k_pre, w->k_norm, a->k_rstd, N * KVH, D);
        d_q_proj = s->d_q;
        d_k_proj = s->d_k;
    }
    zero(s->d_normed, (long)N * C);
    const LinearPart qkv[3] = {
        {.weight = w->q_weight, .dout = d_q_proj, .dweight = dw->q_weight, .dbias = dw->q_bias, .OC = HD},
        {.weight = w->k_weight, .dout = d_k_proj, .dweight = dw->k_weight, .dbias = dw->k_bias, .OC = KVD},
        {.weight = w->v_weight, .dout = s->d_v, .dweight = dw->v_weight, .dbias = dw->v_bias, .OC = KVD}};
    linear_group_backward(model, l, LINEAR_QKV, s->d_normed, a->attn_in, N, C, qkv, 3);
    lora_backward(model, l, LORA_Q, s->d_normed, d_q_proj, a->attn_in, N);
    lora_backward(model, l, LORA_K, s->d_normed, d_k_proj, a->attn_in, N);
    lora_backward(model, l, LORA_V, s->d_normed, s->d_v, a->attn_in, N);
    g = tp_enter_backward(model, s->d_normed, pr->shard, N, C);
    ops->rmsnorm_backward(s->d_resid, dw->attn_norm, g, a->resid_in, w->attn_norm, a->attn_rstd, R, C);
    /* d_resid is now dL/d(resid_in) */
}

float *model_stage_grad(Model *model) { return ((ModelPriv *)model->priv)->scratch.d_resid; }

void model_backward_head(Model *model, float loss_scale) {
    const BackendOps *ops = model->ops;
    const ModelConfig *c = &model->cfg;
    ModelPriv *pr = model->priv;
    if (!pr->backward_ready)
        mt_die(MT_EXIT_FAILURE, "model_backward: needs a model_forward with targets first (and only one "
                                "backward per forward: backward overwrites the logits)");
    pr->backward_ready = 0;
    const int N = pr->B * pr->T, R = model_shape_rows(&pr->shape, N), C = c->hidden_size;
    GradScratch *s = &pr->scratch;

    pr->loss_scale = loss_scale; /* the MoE layers' auxiliary losses take it too */
    /* loss = loss_scale * mean over counted tokens, so each token's dloss is loss_scale / count (per_token:
     * loss_scale * sum / loss_tokens, so loss_scale / loss_tokens). */
    const double divisor = *model->loss_tokens > 0 ? *model->loss_tokens : (double)pr->num_targets;
    float dloss = pr->num_targets > 0 ? (float)((double)loss_scale / divisor) : 0.0f;
    vocab_cross_entropy_backward(model, pr->logits, pr->row_lse, pr->targets, dloss, N); /* (N, V/tp), in place */

    zero(s->d_normed, (long)N * C);
    ops->matmul_backward(s->d_normed, pr->d_lm_head, NULL, pr->logits, pr->final_in, pr->lm_head, N, C, pr->shape.V);
    const float *g = tp_enter_backward(model, s->d_normed, pr->shard, N, C);
    zero(s->d_resid, (long)R * C);
    ops->rmsnorm_backward(s->d_resid, pr->d_final_norm, g, pr->final_resid, pr->final_norm, pr->final_rstd, R, C);
}

void model_backward_layers(Model *model, int chunk) {
    ModelPriv *pr = model->priv;
    for (int l = model_shape_chunk_end(&pr->shape, chunk) - 1; l >= pr->shape.chunk_start[chunk]; l--)
        block_backward(model, l, pr->B, pr->T, pr->loss_scale);
}

void model_backward_finish(Model *model) {
    ModelPriv *pr = model->priv;
    if (model->part.has_embed && pr->d_embed) /* none when the embedding is frozen (LoRA) */
        vocab_embedding_backward(model, pr->scratch.d_full, pr->scratch.d_resid, pr->inputs, pr->B * pr->T);
}

void model_backward(Model *model, float loss_scale) {
    model_backward_head(model, loss_scale);
    for (int v = model->part.num_chunks - 1; v >= 0; v--) model_backward_layers(model, v);
    model_backward_finish(model);
}
