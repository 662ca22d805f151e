/* model_forward.c: the forward pass of the dense transformer, op by op
 * through the backend table, keeping in ModelPriv what backward needs.
 *
 *   x = embed[tokens]                                              (B, T, C)
 *   per layer:
 *     h = attn_norm(x)                                             (B, T, C)
 *     q, k, v = q_proj(h), k_proj(h), v_proj(h)   (B,T,H,D) (B,T,KVH,D) (+ bias: qwen2)
 *     (with LoRA, model_lora.c, each targeted P(h) is P(h) + (alpha/r) B_P(A_P h))
 *     q, k = q_norm(q), k_norm(k)   per head, before rope             (qwen3)
 *     q, k = rope(q), rope(k)
 *     x = x + o_proj(attention(q, k, v))                           (B, T, C)
 *     h = mlp_norm(x)
 *     x = x + down_proj(silu(gate_proj(h)) * up_proj(h))           (B, T, C)
 *   logits = lm_head(final_norm(x))                                (B, T, V)
 *   loss = mean over targets >= 0 of cross_entropy(logits, targets)
 *          (train.loss per_token: their sum / loss_tokens, model_set_loss_tokens)
 *
 * On a rank of a parallel layout (model.h, ModelPartition) the same runs on
 * this rank's heads, intermediate rows, vocabulary rows and tokens, with the
 * collectives of model_parallel.h where the math needs the other ranks. */
#include <string.h>

#include "../core/error.h"
#include "model_parallel.h"
#include "model_fp8.h"
#include "moe_layer.h"
#include "rope_tables.h"

/* Context parallel: pr->positions and the RoPE rows for micro-batches of T
 * tokens (this rank's positions depend on T: rows of the sequence's tables). */
static void cp_rows_for(Model *model, int T) {
    ModelPriv *pr = model->priv;
    if (pr->shape.cp == 1 || pr->rope_T == T) return;
    model_rope_rows(&pr->shape, &model->cfg, T, pr->rope_cos, pr->rope_sin, pr->positions);
    pr->rope_T = T;
}

void model_rope_tables(Model *model, int B, int T, const float **cos, const float **sin, int *rB, int *rT) {
    ModelPriv *pr = model->priv;
    if (pr->packed) {
        if (pr->packed_B != B || pr->packed_T != T)
            mt_die(MT_EXIT_FAILURE, "model: packed positions were set for %d x %d tokens, the micro-batch has %d x %d",
                   pr->packed_B, pr->packed_T, B, T);
        *cos = pr->packed_cos;
        *sin = pr->packed_sin;
        *rB = 1;
        *rT = B * T;
        return;
    }
    *rB = B;
    *rT = T;
    cp_rows_for(model, T);
    *cos = pr->rope_cos;
    *sin = pr->rope_sin;
}

void model_attention_core(Model *model, int l, int B, int T) {
    const BackendOps *ops = model->ops;
    ModelPriv *pr = model->priv;
    LayerActs *a = &pr->acts[l];
    const ModelShape *sh = &pr->shape;
    if (sh->cp == 1) { /* (N, H*D); packed: each token sees its own sample only */
        if (pr->packed)
            ops->attention_forward_doc(a->attn_out, a->probs, a->q, a->k, a->v, NULL, pr->packed_pos, B, T, T, sh->H,
                                       sh->KVH, sh->D);
        else
            ops->attention_forward(a->attn_out, a->probs, a->q, a->k, a->v, B, T, sh->H, sh->KVH, sh->D);
        return;
    }
    /* keys and values of the whole sequence, queries of this rank's positions */
    cp_gather_kv(model, a->k_all, a->k, B, T, sh->KVD);
    cp_gather_kv(model, a->v_all, a->v, B, T, sh->KVD);
    if (pr->packed)
        ops->attention_forward_doc(a->attn_out, a->probs, a->q, a->k_all, a->v_all, pr->positions, pr->packed_pos, B,
                                   T, T * sh->cp, sh->H, sh->KVH, sh->D);
    else
        ops->attention_forward_at(a->attn_out, a->probs, a->q, a->k_all, a->v_all, pr->positions, B, T, T * sh->cp,
                                  sh->H, sh->KVH, sh->D);
}

/* One transformer block (local layer l): a->resid_in -> out (residual rows, C). */
void model_block_forward(Model *model, int l, float *out, int B, int T) {
    const BackendOps *ops = model->ops;
    const ModelConfig *c = &model->cfg;
    ModelPriv *pr = model->priv;
    const LayerWeights *w = &pr->weights[l];
    LayerActs *a = &pr->acts[l];
    const ModelShape *sh = &pr->shape;
    const int N = B * T, R = model_shape_rows(sh, N), C = sh->C, D = sh->D;
    const int I = sh->I, H = sh->H, KVH = sh->KVH, HD = sh->HD, KVD = sh->KVD;
    const float eps = (float)c->rms_norm_eps;
    const float *cos, *sin;
    int rB, rT;
    model_rope_tables(model, B, T, &cos, &sin, &rB, &rT);

    /* attention half */
    ops->rmsnorm_forward(a->attn_normed, a->attn_rstd, a->resid_in, w->attn_norm, R, C, eps);
    const float *x = tp_enter(model, a->attn_in, a->attn_normed, N, C); /* (N, C) */
    float *q = c->qk_norm ? a->q_pre : a->q, *k = c->qk_norm ? a->k_pre : a->k; /* the projections' outputs */
    const LinearPart qkv[3] = {{.weight = w->q_weight, .bias = w->q_bias, .out = q, .OC = HD}, /* (N, H*D) */
                               {.weight = w->k_weight, .bias = w->k_bias, .out = k, .OC = KVD},
                               {.weight = w->v_weight, .bias = w->v_bias, .out = a->v, .OC = KVD}};
    linear_group_forward(model, l, LINEAR_QKV, x, N, C, qkv, 3);
    lora_forward(model, l, LORA_Q, q, x, N);
    lora_forward(model, l, LORA_K, k, x, N);
    lora_forward(model, l, LORA_V, a->v, x, N);
    if (c->qk_norm) { /* per-head RMSNorm over D: rows are (token, head) pairs */
        ops->rmsnorm_forward(a->q, a->q_rstd, a->q_pre, w->q_norm, N * H, D, eps);
        ops->rmsnorm_forward(a->k, a->k_rstd, a->k_pre, w->k_norm, N * KVH, D, eps);
    }
    ops->rope_forward(a->q, a->q, cos, sin, rB, rT, H, D); /* in place */
    ops->rope_forward(a->k, a->k, cos, sin, rB, rT, KVH, D);
    model_attention_core(model, l, B, T);
    const LinearPart o = {.weight = w->o_weight, .out = pr->proj_out, .OC = C};
    linear_group_forward(model, l, LINEAR_O, a->attn_out, N, HD, &o, 1);
    lora_forward(model, l, LORA_O, pr->proj_out, a->attn_out, N); /* before the tp sum: the partial output */
    ops->add(a->resid_mid, a->resid_in, tp_leave(model, pr->proj_out, pr->shard, N, C), (long)R * C);

    /* MLP half */
    ops->rmsnorm_forward(a->mlp_normed, a->mlp_rstd, a->resid_mid, w->mlp_norm, R, C, eps);
    x = tp_enter(model, a->mlp_in, a->mlp_normed, N, C);
    if (pr->moe[l]) { /* mixture of experts on all N rows */
        moe_forward(model, l, pr->moe[l], x, pr->proj_out, B, T);
        if (model->part.etp > 1) /* each tp rank's slice of the experts: partial sums, as the dense MLP */
            ops->add(out, a->resid_mid, tp_leave(model, pr->proj_out, pr->shard, N, C), (long)R * C);
        else /* whole on every tp rank (etp 1) */
            ops->add(out, a->resid_mid, pr->proj_out + (size_t)model_shape_row_offset(sh, N) * C, (long)R * C);
        return;
    }
    const LinearPart gate_up[2] = {{.weight = w->gate_weight, .out = a->gate, .OC = I}, /* (N, I) */
                                   {.weight = w->up_weight, .out = a->up, .OC = I}};
    linear_group_forward(model, l, LINEAR_GATE_UP, x, N, C, gate_up, 2);
    lora_forward(model, l, LORA_GATE, a->gate, x, N);
    lora_forward(model, l, LORA_UP, a->up, x, N);
    ops->swiglu_forward(a->act, a->gate, a->up, (long)N * I);
    const LinearPart down = {.weight = w->down_weight, .out = pr->proj_out, .OC = C};
    linear_group_forward(model, l, LINEAR_DOWN, a->act, N, I, &down, 1);
    lora_forward(model, l, LORA_DOWN, pr->proj_out, a->act, N);
    ops->add(out, a->resid_mid, tp_leave(model, pr->proj_out, pr->shard, N, C), (long)R * C);
}

/* Where local layer l writes its output: the next layer's input, or its chunk's output. */
static float *layer_output(const Model *model, int chunk, int l) {
    const ModelPriv *pr = model->priv;
    return l + 1 < model_shape_chunk_end(&pr->shape, chunk) ? pr->acts[l + 1].resid_in : pr->chunk_out[chunk];
}

float *model_stage_input(Model *model, int chunk) {
    ModelPriv *pr = model->priv;
    /* a chunk of no layers passes its input straight through */
    return pr->shape.chunk_len[chunk] > 0 ? pr->acts[pr->shape.chunk_start[chunk]].resid_in : pr->chunk_out[chunk];
}

float *model_stage_output(Model *model, int chunk) { return ((ModelPriv *)model->priv)->chunk_out[chunk]; }

void model_forward_start(Model *model, const int32_t *inputs, int B, int T) {
    ModelPriv *pr = model->priv;
    model_check_batch(&pr->shape, "model_forward", B, T, model->max_B, model->max_T);
    pr->B = B;
    pr->T = T;
    pr->backward_ready = 0;
    const int N = B * T;
    if (inputs) {
        model_check_tokens(&pr->shape, inputs, N, false);
        memcpy(pr->inputs, inputs, (size_t)N * sizeof *inputs);
    }
    if (model->part.has_embed) /* (N, C) */
        vocab_embedding_forward(model, model_stage_input(model, 0), pr->proj_out, pr->inputs, N);
}

void model_forward_layers(Model *model, int chunk) {
    ModelPriv *pr = model->priv;
    for (int l = pr->shape.chunk_start[chunk]; l < model_shape_chunk_end(&pr->shape, chunk); l++)
        model_block_forward(model, l, layer_output(model, chunk, l), pr->B, pr->T);
}

float model_forward_head(Model *model, const int32_t *targets) {
    const BackendOps *ops = model->ops;
    const ModelConfig *c = &model->cfg;
    ModelPriv *pr = model->priv;
    const int N = pr->B * pr->T, R = model_shape_rows(&pr->shape, N), C = c->hidden_size;
    ops->rmsnorm_forward(pr->final_normed, pr->final_rstd, pr->final_resid, pr->final_norm, R, C,
                         (float)c->rms_norm_eps);
    const float *x = tp_enter(model, pr->final_in, pr->final_normed, N, C);
    ops->matmul_forward(pr->logits, x, pr->lm_head, NULL, N, C, pr->shape.V); /* (N, V/tp) */

    if (!targets) return 0.0f;
    model_check_tokens(&pr->shape, targets, N, true);
    memcpy(pr->targets, targets, (size_t)N * sizeof *targets);
    long count = 0;
    for (int i = 0; i < N; i++) count += targets[i] >= 0;
    double sum = vocab_cross_entropy_forward(model, pr->losses, pr->row_lse, pr->logits, targets, N);
    if (pr->shape.cp > 1) { /* the mean over the whole sequences */
        sum = cp_sum(model, sum);
        count = (long)cp_sum(model, (double)count);
    }
    pr->num_targets = count;
    pr->backward_ready = 1;
    const double divisor = *model->loss_tokens > 0 ? *model->loss_tokens : (double)count;
    model->last_loss = count > 0 ? (float)(sum / divisor) : 0.0f;
    return model->last_loss;
}

void model_set_packed_positions(Model *model, const int32_t *positions, int B, int T) {
    ModelPriv *pr = model->priv;
    if (!positions) {
        pr->packed = false;
        return;
    }
    model_check_batch(&pr->shape, "model_set_packed_positions", B, T, model->max_B, model->max_T);
    const int Tall = T * pr->shape.cp;
    const size_t n = (size_t)B * Tall, half = (size_t)model->cfg.head_dim / 2;
    pr->packed_pos = mt_grow(pr->packed_pos, &pr->packed_cap, n, sizeof *pr->packed_pos);
    bool padded = false;
    for (size_t i = 0; i < n; i++) { /* the places, padding's (-1 - place) decoded */
        padded |= positions[i] < 0;
        pr->packed_pos[i] = positions[i] < 0 ? -1 - positions[i] : positions[i];
    }
    for (int b = 0; b < B; b++)
        for (int t = 0; t < Tall; t++) {
            const int p = pr->packed_pos[(size_t)b * Tall + t], before = t ? pr->packed_pos[(size_t)b * Tall + t - 1] : -1;
            if (p != 0 && p != before + 1)
                mt_die(MT_EXIT_FAILURE, "model: packed row %d, token %d at sample position %d (expected 0 or %d)", b,
                       t, p, before + 1);
        }
    pr->has_pad = padded;
    if (padded) pr->token_pad = mt_grow(pr->token_pad, &pr->token_pad_cap, (size_t)B * T, 1);
    /* the tables' row p is place p: this rank's rows under cp 1 (rows 0..max_T-1), else the sequence's */
    const float *tab_cos = pr->rope_cos, *tab_sin = pr->rope_sin;
    if (pr->shape.cp > 1) {
        cp_rows_for(model, T);
        if (pr->seq_T != Tall) {
            pr->seq_cos = mt_realloc(pr->seq_cos, (size_t)Tall * half * sizeof(float));
            pr->seq_sin = mt_realloc(pr->seq_sin, (size_t)Tall * half * sizeof(float));
            rope_tables_init(pr->seq_cos, pr->seq_sin, Tall, model->cfg.head_dim, model->cfg.rope_theta,
                             &model->cfg.rope_scaling);
            pr->seq_T = Tall;
        }
        tab_cos = pr->seq_cos;
        tab_sin = pr->seq_sin;
    }
    const size_t mine = (size_t)B * T;
    size_t cap = pr->packed_rope_cap;
    pr->packed_cos = mt_grow(pr->packed_cos, &cap, mine * half, sizeof(float));
    cap = pr->packed_rope_cap;
    pr->packed_sin = mt_grow(pr->packed_sin, &cap, mine * half, sizeof(float));
    pr->packed_rope_cap = cap;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) { /* this rank's token t is at position pr->positions[t] of the row (cp) */
            const size_t at = pr->shape.cp > 1 ? (size_t)pr->positions[t] : (size_t)t;
            const size_t place = (size_t)pr->packed_pos[(size_t)b * Tall + at], row = (size_t)b * T + t;
            if (padded) pr->token_pad[row] = positions[(size_t)b * Tall + at] < 0;
            memcpy(pr->packed_cos + row * half, tab_cos + place * half, half * sizeof(float));
            memcpy(pr->packed_sin + row * half, tab_sin + place * half, half * sizeof(float));
        }
    pr->packed = true;
    pr->packed_B = B;
    pr->packed_T = T;
}

void model_set_loss_tokens(Model *model, double tokens) { *model->loss_tokens = tokens > 0 ? tokens : 0.0; }

float model_forward(Model *model, const int32_t *inputs, const int32_t *targets, int B, int T) {
    if (!model->part.has_embed || !model->part.has_head)
        mt_die(MT_EXIT_FAILURE, "model_forward: a pipeline stage runs through model_forward_start/_layers/_head");
    model_forward_start(model, inputs, B, T);
    for (int v = 0; v < model->part.num_chunks; v++) {
        if (v > 0) /* consecutive chunks on one rank (no pipeline): the output is the next input */
            memcpy(model_stage_input(model, v), model_stage_output(model, v - 1),
                   (size_t)model_stage_floats(model, B, T) * sizeof(float));
        model_forward_layers(model, v);
    }
    return model_forward_head(model, targets);
}
