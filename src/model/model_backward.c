/* model_backward.c: the backward pass of the dense transformer, the mirror of
 * model_forward.c read bottom-up. Backend backwards accumulate (+=), so every
 * activation-gradient buffer is zeroed before the op that fills it, while
 * parameter gradients accumulate into model->grads across calls. dlogits are
 * computed in place in the logits buffer. */
#include <string.h>

#include "../core/error.h"
#include "model_internal.h"

static void zero(float *buf, long n) { memset(buf, 0, (size_t)n * sizeof(float)); }

/* One block. On entry s->d_resid holds dL/d(block output) (N, C); on exit it
 * holds dL/d(block input). */
static void block_backward(Model *model, int l, int B, int T) {
    const BackendOps *ops = model->ops;
    const ModelConfig *c = &model->cfg;
    ModelPriv *pr = model->priv;
    const LayerWeights *w = &pr->weights[l];
    const LayerWeights *dw = &pr->weight_grads[l];
    const LayerActs *a = &pr->acts[l];
    GradScratch *s = &pr->scratch;
    const int N = B * T, C = c->hidden_size, I = c->intermediate_size, D = c->head_dim;
    const int H = c->num_attention_heads, KVH = c->num_key_value_heads;
    const int HD = H * D, KVD = KVH * D;

    /* MLP half: out = resid_mid + down(act); d_resid flows to resid_mid unchanged. */
    zero(s->d_act, (long)N * I);
    ops->matmul_backward(s->d_act, dw->down_weight, NULL, s->d_resid, a->act, w->down_weight, N, I, C);
    zero(s->d_gate, (long)N * I);
    zero(s->d_up, (long)N * I);
    ops->swiglu_backward(s->d_gate, s->d_up, s->d_act, a->gate, a->up, (long)N * I);
    zero(s->d_normed, (long)N * C);
    ops->matmul_backward(s->d_normed, dw->gate_weight, NULL, s->d_gate, a->mlp_normed, w->gate_weight, N, C, I);
    ops->matmul_backward(s->d_normed, dw->up_weight, NULL, s->d_up, a->mlp_normed, w->up_weight, N, C, I);
    ops->rmsnorm_backward(s->d_resid, dw->mlp_norm, s->d_normed, a->resid_mid, w->mlp_norm, a->mlp_rstd, N, C);
    /* d_resid is now dL/d(resid_mid) (N, C) */

    /* attention half: resid_mid = resid_in + o_proj(attn_out) */
    zero(s->d_attn_out, (long)N * HD);
    ops->matmul_backward(s->d_attn_out, dw->o_weight, NULL, s->d_resid, a->attn_out, w->o_weight, N, HD, C);
    zero(s->d_q, (long)N * HD);
    zero(s->d_k, (long)N * KVD);
    zero(s->d_v, (long)N * KVD);
    ops->attention_backward(s->d_q, s->d_k, s->d_v, s->d_attn_out, a->probs, a->q, a->k, a->v, B, T, H, KVH, D);
    /* through rope: d_q -> d_q2 (gradient of q before rope), same for k */
    zero(s->d_q2, (long)N * HD);
    zero(s->d_k2, (long)N * KVD);
    ops->rope_backward(s->d_q2, s->d_q, pr->rope_cos, pr->rope_sin, B, T, H, D);
    ops->rope_backward(s->d_k2, s->d_k, pr->rope_cos, pr->rope_sin, B, T, KVH, D);
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
    ops->matmul_backward(s->d_normed, dw->q_weight, dw->q_bias, d_q_proj, a->attn_normed, w->q_weight, N, C, HD);
    ops->matmul_backward(s->d_normed, dw->k_weight, dw->k_bias, d_k_proj, a->attn_normed, w->k_weight, N, C, KVD);
    ops->matmul_backward(s->d_normed, dw->v_weight, dw->v_bias, s->d_v, a->attn_normed, w->v_weight, N, C, KVD);
    ops->rmsnorm_backward(s->d_resid, dw->attn_norm, s->d_normed, a->resid_in, w->attn_norm, a->attn_rstd, N, C);
    /* d_resid is now dL/d(resid_in) */
}

void model_backward(Model *model, float loss_scale) {
    const BackendOps *ops = model->ops;
    const ModelConfig *c = &model->cfg;
    ModelPriv *pr = model->priv;
    if (!pr->backward_ready)
        mt_die(MT_EXIT_FAILURE, "model_backward: needs a model_forward with targets first (and only one "
                                "backward per forward: backward overwrites the logits)");
    pr->backward_ready = 0;
    const int B = pr->B, T = pr->T, N = B * T, C = c->hidden_size, V = c->vocab_size;
    GradScratch *s = &pr->scratch;

    /* loss = loss_scale * mean over counted tokens, so each token's dloss is loss_scale / count. */
    float dloss = pr->num_targets > 0 ? (float)((double)loss_scale / (double)pr->num_targets) : 0.0f;
    ops->cross_entropy_backward(pr->logits, pr->logits, pr->targets, dloss, N, V); /* (N, V), in place */

    zero(s->d_normed, (long)N * C);
    ops->matmul_backward(s->d_normed, pr->d_lm_head, NULL, pr->logits, pr->final_normed, pr->lm_head, N, C, V);
    zero(s->d_resid, (long)N * C);
    ops->rmsnorm_backward(s->d_resid, pr->d_final_norm, s->d_normed, pr->final_resid, pr->final_norm,
                          pr->final_rstd, N, C);
    for (int l = c->num_layers - 1; l >= 0; l--) block_backward(model, l, B, T);
    ops->embedding_backward(pr->d_embed, s->d_resid, pr->inputs, N, C);
}
