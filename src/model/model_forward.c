/* model_forward.c: the forward pass of the dense transformer, op by op
 * through the backend table, keeping in ModelPriv what backward needs.
 *
 *   x = embed[tokens]                                              (B, T, C)
 *   per layer:
 *     h = attn_norm(x)                                             (B, T, C)
 *     q, k, v = q_proj(h), k_proj(h), v_proj(h)   (B,T,H,D) (B,T,KVH,D) (+ bias: qwen2)
 *     q, k = q_norm(q), k_norm(k)   per head, before rope             (qwen3)
 *     q, k = rope(q), rope(k)
 *     x = x + o_proj(attention(q, k, v))                           (B, T, C)
 *     h = mlp_norm(x)
 *     x = x + down_proj(silu(gate_proj(h)) * up_proj(h))           (B, T, C)
 *   logits = lm_head(final_norm(x))                                (B, T, V)
 *   loss = mean over targets >= 0 of cross_entropy(logits, targets)
 */
#include <string.h>

#include "../core/error.h"
#include "model_internal.h"

static void check_tokens(const int32_t *tokens, long n, int V, const char *what, int allow_ignored) {
    for (long i = 0; i < n; i++) {
        int32_t t = tokens[i];
        if (t >= V || (t < 0 && !allow_ignored))
            mt_die(MT_EXIT_USAGE, "model_forward: %s token %d at position %ld is outside the vocabulary [0, %d)",
                   what, t, i, V);
    }
}

/* One transformer block: a->resid_in (N, C) -> out (N, C). */
static void block_forward(Model *model, int l, float *out, int B, int T) {
    const BackendOps *ops = model->ops;
    const ModelConfig *c = &model->cfg;
    ModelPriv *pr = model->priv;
    const LayerWeights *w = &pr->weights[l];
    LayerActs *a = &pr->acts[l];
    const int N = B * T, C = c->hidden_size, I = c->intermediate_size, D = c->head_dim;
    const int H = c->num_attention_heads, KVH = c->num_key_value_heads;
    const int HD = H * D, KVD = KVH * D;
    const float eps = (float)c->rms_norm_eps;

    /* attention half */
    ops->rmsnorm_forward(a->attn_normed, a->attn_rstd, a->resid_in, w->attn_norm, N, C, eps);
    if (c->qk_norm) {
        ops->matmul_forward(a->q_pre, a->attn_normed, w->q_weight, w->q_bias, N, C, HD); /* (N, H*D) */
        ops->matmul_forward(a->k_pre, a->attn_normed, w->k_weight, w->k_bias, N, C, KVD);
        /* per-head RMSNorm over D: rows are (token, head) pairs */
        ops->rmsnorm_forward(a->q, a->q_rstd, a->q_pre, w->q_norm, N * H, D, eps);
        ops->rmsnorm_forward(a->k, a->k_rstd, a->k_pre, w->k_norm, N * KVH, D, eps);
    } else {
        ops->matmul_forward(a->q, a->attn_normed, w->q_weight, w->q_bias, N, C, HD);
        ops->matmul_forward(a->k, a->attn_normed, w->k_weight, w->k_bias, N, C, KVD);
    }
    ops->matmul_forward(a->v, a->attn_normed, w->v_weight, w->v_bias, N, C, KVD);
    ops->rope_forward(a->q, a->q, pr->rope_cos, pr->rope_sin, B, T, H, D); /* in place */
    ops->rope_forward(a->k, a->k, pr->rope_cos, pr->rope_sin, B, T, KVH, D);
    ops->attention_forward(a->attn_out, a->probs, a->q, a->k, a->v, B, T, H, KVH, D); /* (N, H*D) */
    ops->matmul_forward(pr->proj_out, a->attn_out, w->o_weight, NULL, N, HD, C);
    ops->add(a->resid_mid, a->resid_in, pr->proj_out, (long)N * C);

    /* MLP half */
    ops->rmsnorm_forward(a->mlp_normed, a->mlp_rstd, a->resid_mid, w->mlp_norm, N, C, eps);
    ops->matmul_forward(a->gate, a->mlp_normed, w->gate_weight, NULL, N, C, I); /* (N, I) */
    ops->matmul_forward(a->up, a->mlp_normed, w->up_weight, NULL, N, C, I);
    ops->swiglu_forward(a->act, a->gate, a->up, (long)N * I);
    ops->matmul_forward(pr->proj_out, a->act, w->down_weight, NULL, N, I, C);
    ops->add(out, a->resid_mid, pr->proj_out, (long)N * C);
}

float model_forward(Model *model, const int32_t *inputs, const int32_t *targets, int B, int T) {
    const BackendOps *ops = model->ops;
    const ModelConfig *c = &model->cfg;
    ModelPriv *pr = model->priv;
    if (B <= 0 || T <= 0 || B > model->max_B || T > model->max_T)
        mt_die(MT_EXIT_FAILURE, "model_forward: micro-batch %d x %d does not fit the buffers (%d x %d)", B, T,
               model->max_B, model->max_T);
    const int N = B * T, C = c->hidden_size, V = c->vocab_size, L = c->num_layers;
    check_tokens(inputs, N, V, "input", 0);
    memcpy(pr->inputs, inputs, (size_t)N * sizeof *inputs);
    pr->B = B;
    pr->T = T;

    ops->embedding_forward(pr->acts[0].resid_in, inputs, pr->embed, N, C); /* (N, C) */
    for (int l = 0; l < L; l++) {
        float *out = l + 1 < L ? pr->acts[l + 1].resid_in : pr->final_resid;
        block_forward(model, l, out, B, T);
    }
    ops->rmsnorm_forward(pr->final_normed, pr->final_rstd, pr->final_resid, pr->final_norm, N, C,
                         (float)c->rms_norm_eps);
    ops->matmul_forward(pr->logits, pr->final_normed, pr->lm_head, NULL, N, C, V); /* (N, V) */

    if (!targets) {
        pr->backward_ready = 0;
        return 0.0f;
    }
    check_tokens(targets, N, V, "target", 1);
    memcpy(pr->targets, targets, (size_t)N * sizeof *targets);
    long count = 0;
    for (int i = 0; i < N; i++) count += targets[i] >= 0;
    double sum = ops->cross_entropy_forward(pr->losses, pr->logits, targets, N, V);
    pr->num_targets = count;
    pr->backward_ready = 1;
    model->last_loss = count > 0 ? (float)(sum / (double)count) : 0.0f;
    return model->last_loss;
}
