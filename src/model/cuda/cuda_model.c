/* cuda_model.c: the CUDA model's creation (see cuda_model.h): one arena
 * for everything, the registry's offsets, the host copies, and the
 * optimizer's grad norm and AdamW; the passes are in cuda_model_pass.c and
 * tensor parallel in cuda_model_parallel.c (cuda_model_internal.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/timer.h"
#include "../../backend/backend.h"
#include "../model_device.h"
#include "../model_internal.h"
#include "cuda_model_internal.h"

static const char *const prof_names[PROF_COUNT] = {
    "matrix products (cuBLASLt)", "attention forward", "attention backward", "rmsnorm", "qk-norm + rope",
    "swiglu", "cross entropy", "embedding", "tensor-parallel collectives", "grad norm + AdamW", "moe router",
    "moe permute + combine", "moe expert products", "moe all-to-all (ep)"};

void cuda_prof_begin(CudaModel *m) {
    if (!m->prof_on) return;
    CUDA_CHECK(cudaStreamSynchronize(m->ctx.stream));
    m->prof_t0 = mt_now();
}

void cuda_prof_end(CudaModel *m, ProfKind kind) {
    if (!m->prof_on) return;
    CUDA_CHECK(cudaStreamSynchronize(m->ctx.stream));
    m->prof_s[kind] += mt_now() - m->prof_t0;
    m->prof_calls[kind]++;
}

static void prof_report(const CudaModel *m) {
    double total = 0.0;
    for (int k = 0; k < PROF_COUNT; k++) total += m->prof_s[k];
    if (!m->prof_on || total <= 0.0) return;
    mt_log("CUDA profile (MEGATRAIN_CUDA_PROFILE) over %d step(s): time in each kind of op, the stream synchronised "
           "around each", m->prof_steps);
    for (int k = 0; k < PROF_COUNT; k++)
        if (m->prof_calls[k])
            mt_log("  %-28s %9.1f ms %5.1f%%  (%ld calls, %.3f ms each)", prof_names[k], m->prof_s[k] * 1e3,
                   100.0 * m->prof_s[k] / total, m->prof_calls[k], m->prof_s[k] * 1e3 / m->prof_calls[k]);
}

/* ---- arena --------------------------------------------------------------- */

/* Carver and CARVE: cuda_model_internal.h */

/* The bytes of one AdamW moment: fp32, or bf16 with optimizer.state_dtype: bf16. */
static size_t state_bytes(const CudaModel *m) { return m->bf16_states ? sizeof(bf16_t) : sizeof(float); }

/* What train.recompute recomputes instead of keeping per layer (cuda_model_pass.c's layer_backward): selective
 * the attention core's output and the dense SwiGLU activation; full everything but the layer's input. */
typedef struct Recomputed {
    bool core, swiglu, all;
} Recomputed;

static Recomputed recomputed_of(Recompute mode) {
    return (Recomputed){.core = mode != RECOMPUTE_NONE, .swiglu = mode != RECOMPUTE_NONE, .all = mode == RECOMPUTE_FULL};
}

/* A layer's buffer of count elements: its own, or (recomputed) the working set's, m->work's. Carving the working
 * set itself (build, s = &m->work): only what the mode recomputes, the rest NULL. */
#define PIECE(c, field, count, recomputed)                                                                  \
    do {                                                                                                    \
        if (build) s->field = (recomputed) ? carve((c), (size_t)(count) * sizeof *s->field) : NULL;        \
        else if (recomputed) s->field = m->work.field;                                                      \
        else CARVE((c), s->field, (count));                                                                 \
    } while (0)

/* The buffers of one layer's forward (all but its input): into layer s (build false), or, build true, the
 * recompute working set's share of them (s = &m->work). */
static void layout_layer(CudaModel *m, Carver *c, int l, LayerSaved *s, bool build) {
    const ModelShape *sh = &m->shape;
    const size_t N = (size_t)m->max_B * m->max_T, R = (size_t)model_shape_rows(sh, (int)N); /* residual rows */
    const size_t C = sh->C, I = sh->I, H = sh->H, KVH = sh->KVH;
    const size_t HD = sh->HD, KVD = sh->KVD, QKV = HD + 2 * KVD, cp = (size_t)sh->cp;
    const Recomputed r = recomputed_of(m->recompute);
    PIECE(c, attn_normed, R * C, r.all);
    PIECE(c, qkv, N * QKV, r.all);
    PIECE(c, q, N * HD, r.all);
    PIECE(c, k, N * KVD, r.all);
    PIECE(c, v, N * KVD, r.all);
    PIECE(c, attn_out, N * HD, r.core);
    PIECE(c, resid_mid, R * C, r.all);
    PIECE(c, mlp_normed, R * C, r.all);
    if (!m->layers[l].moe) {
        PIECE(c, gate_up, N * 2 * I, r.all);
        PIECE(c, act, N * I, r.swiglu);
    } else if (!build) {
        cuda_moe_layout_saved(m, c, l); /* under full: the working set's device buffers (layout_work) */
    }
    PIECE(c, attn_rstd, R, r.all);
    PIECE(c, mlp_rstd, R, r.all);
    PIECE(c, lse, N * H, r.all);
    if (m->cfg.qk_norm) {
        PIECE(c, q_rstd, N * H, r.all);
        PIECE(c, k_rstd, N * KVH, r.all);
    }
    if (m->shape.cp > 1) {
        PIECE(c, k_all, N * cp * KVD, r.all);
        PIECE(c, v_all, N * cp * KVD, r.all);
    }
}
#undef PIECE

/* The recompute working set: one layer's recomputed buffers (a dense layer's MLP; selective recomputes the dense
 * SwiGLU only), and under full the recomputed layer's output and, with MoE layers, one MoE layer's device buffers
 * (cuda_moe_layout_work). */
static void layout_work(CudaModel *m, Carver *c) {
    if (m->recompute == RECOMPUTE_NONE) return;
    int dense = -1; /* a dense layer of this rank, whose MLP sizes the working set's */
    bool moe = false;
    for (int l = 0; l < m->shape.L; l++) {
        if (!m->layers[l].moe && dense < 0) dense = l;
        moe = moe || m->layers[l].moe;
    }
    m->work = (LayerSaved){0};
    layout_layer(m, c, dense >= 0 ? dense : 0, &m->work, true); /* a MoE layer: no MLP buffers */
    if (m->recompute == RECOMPUTE_FULL) {
        CARVE(c, m->recompute_out, (size_t)model_shape_rows(&m->shape, m->max_B * m->max_T) * m->shape.C);
        if (moe) cuda_moe_layout_work(m, c);
    }
}

/* What one micro-batch's forward keeps (a pipeline keeps one set per micro-batch in flight: clones). */
static void layout_activations(CudaModel *m, Carver *c) {
    const ModelShape *sh = &m->shape;
    const size_t N = (size_t)m->max_B * m->max_T, R = (size_t)model_shape_rows(sh, (int)N); /* residual rows */
    const size_t C = sh->C, V = sh->V;
    CARVE(c, m->inputs, N);
    CARVE(c, m->targets, N);
    for (int l = 0; l < m->shape.L; l++) {
        LayerSaved *s = &m->saved[l];
        if (l == 0) CARVE(c, s->resid_in, R * C); /* later layers read the previous layer's output */
        layout_layer(m, c, l, s, false);
        bf16_t *out;
        CARVE(c, out, R * C);
        if (l + 1 < m->shape.L) m->saved[l + 1].resid_in = out;
        else m->final_resid = out; /* the stage's output */
    }
    if (!m->shape.has_head) return;
    CARVE(c, m->final_normed, R * C);
    CARVE(c, m->final_rstd, R);
    CARVE(c, m->logits, N * V);
    CARVE(c, m->losses, N);
    CARVE(c, m->ce_lse, N);
}

/* Everything else: weights, gradients, AdamW states, tables, and the scratch of one op at a time (shared by a
 * pipeline's activation sets: the stream runs one micro-batch's op after another). */
static void layout_shared(CudaModel *m, Carver *c) {
    const ModelShape *sh = &m->shape;
    const size_t P = (size_t)m->num_floats, N = (size_t)m->max_B * m->max_T, R = (size_t)model_shape_rows(sh, (int)N);
    const size_t C = sh->C, I = sh->I, D = sh->D, H = sh->H, KVH = sh->KVH;
    const size_t HD = sh->HD, KVD = sh->KVD, QKV = HD + 2 * KVD, cp = (size_t)sh->cp;
    CARVE(c, m->params, m->z1 ? (size_t)m->state_floats : P); /* the distributed optimizer: the master's shard */
    CARVE(c, m->grads, P);
    m->exp_avg = carve(c, (size_t)m->state_floats * state_bytes(m));
    m->exp_avg_sq = carve(c, (size_t)m->state_floats * state_bytes(m));
    CARVE(c, m->params16, P);
    CARVE(c, m->rope_cos, (size_t)m->max_T * (D / 2));
    CARVE(c, m->rope_sin, (size_t)m->max_T * (D / 2));
    if (m->shape.cp > 1) {
        CARVE(c, m->positions, (size_t)m->max_T);
        CARVE(c, m->seq_pos, cp * m->max_T);
        CARVE(c, m->kv_blocks, cp * N * KVD);
        CARVE(c, m->dk_all, N * cp * KVD);
        CARVE(c, m->dv_all, N * cp * KVD);
        CARVE(c, m->dkv_blocks, cp * N * KVD);
        CARVE(c, m->dkv_mine, N * KVD);
    }
    if (m->shape.tp > 1) {
        CARVE(c, m->ce_stats, N * 3);
        CARVE(c, m->ce_gathered, (size_t)m->shape.tp * N * 3);
    }
    if (m->shape.sp) {
        CARVE(c, m->tp_rows, N * C);
        CARVE(c, m->d_full16, N * C);
        CARVE(c, m->d_full32, N * C);
        CARVE(c, m->d_normed_shard, R * C);
        CARVE(c, m->sp_in, N * C);
    }
    CARVE(c, m->d_resid, R * C);
    CARVE(c, m->d_resid16, R * C);
    CARVE(c, m->d_normed, N * C);
    bool dense = false, moe = false; /* which kinds of MLP this rank's layers have */
    for (int l = 0; l < sh->L; l++) {
        dense = dense || !m->layers[l].moe;
        moe = moe || m->layers[l].moe;
    }
    if (dense) {
        CARVE(c, m->d_act, N * I);
        CARVE(c, m->d_gate_up, N * 2 * I);
    }
    if (moe) cuda_moe_layout_shared(m, c);
    CARVE(c, m->d_attn_out, N * HD);
    CARVE(c, m->dq, N * HD);
    CARVE(c, m->dk, N * KVD);
    CARVE(c, m->dv, N * KVD);
    CARVE(c, m->d_qkv, N * QKV);
    /* the attention backward's (dq's fp32 sums, delta), for this rank's max_T query rows, cp or not */
    m->attn_workspace = carve(c, cuda_attention_workspace_bytes(m->max_B, m->max_T, (int)H, (int)KVH, (int)D));
    CARVE(c, m->chunks, m->num_chunks);
    CARVE(c, m->norm_chunks, m->num_norm_chunks);
    CARVE(c, m->norm_partial, NORM_PARTIALS);
    cuda_zero1_layout(m, c);
    layout_work(m, c);
}

static void layout(CudaModel *m, Carver *c) {
    layout_shared(m, c);
    layout_activations(m, c);
}

/* ---- host <-> device copies ------------------------------------------------ */

/* A copy ordered after everything already enqueued on the model's stream,
 * finished on return. (A plain cudaMemcpy runs on the legacy default stream,
 * which does not wait for our non-blocking stream: the arena's initial
 * memset could then land after, and erase, what was copied in.) */
static void copy_in_order(CudaModel *m, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, m->ctx.stream));
    CUDA_CHECK(cudaStreamSynchronize(m->ctx.stream));
}

/* ---- registry ------------------------------------------------------------ */

/* The flat offset of registry slot `slot` (-1: absent, and an error where required). */
static long slot_offset(const Model *host, int slot, bool required, const char *what, int layer) {
    if (slot < 0 && required) {
        if (layer >= 0) mt_die(MT_EXIT_FAILURE, "CUDA model: local layer %d has no %s in the registry", layer, what);
        mt_die(MT_EXIT_FAILURE, "CUDA model: no %s in the registry", what);
    }
    return slot < 0 ? -1 : (long)host->param_info[slot].offset;
}

/* Every offset from the registry's slots (model_registry_build, the ones the CPU model uses). */
static void find_offsets(CudaModel *m, const Model *host) {
    const ModelConfig *cfg = &m->cfg;
    const ModelSlots *slots = &((const ModelPriv *)host->priv)->slots;
    for (int l = 0; l < m->shape.L; l++) {
        LayerOffsets *o = &m->layers[l];
        const LayerSlots *s = &slots->layers[l];
        o->attn_norm = slot_offset(host, s->attn_norm, true, "attn_norm", l);
        o->q = slot_offset(host, s->q_weight, true, "q_proj", l);
        o->k = slot_offset(host, s->k_weight, true, "k_proj", l);
        o->v = slot_offset(host, s->v_weight, true, "v_proj", l);
        o->q_bias = slot_offset(host, s->q_bias, cfg->attention_bias, "q_proj bias", l);
        o->k_bias = slot_offset(host, s->k_bias, cfg->attention_bias, "k_proj bias", l);
        o->v_bias = slot_offset(host, s->v_bias, cfg->attention_bias, "v_proj bias", l);
        o->q_norm = slot_offset(host, s->q_norm, cfg->qk_norm, "q_norm", l);
        o->k_norm = slot_offset(host, s->k_norm, cfg->qk_norm, "k_norm", l);
        o->o = slot_offset(host, s->o_weight, true, "o_proj", l);
        o->mlp_norm = slot_offset(host, s->mlp_norm, true, "mlp_norm", l);
        o->moe = s->router >= 0;
        o->gate = slot_offset(host, s->gate_weight, !o->moe, "gate_proj", l);
        o->up = slot_offset(host, s->up_weight, !o->moe, "up_proj", l);
        o->down = slot_offset(host, s->down_weight, !o->moe, "down_proj", l);
        const long C = m->shape.C, I = m->shape.I, HD = m->shape.HD, KVD = m->shape.KVD;
        if (!o->moe && o->up != o->gate + I * C)
            mt_die(MT_EXIT_FAILURE, "CUDA model: layer %d: gate_proj and up_proj are not adjacent", l);
        long end = o->down + C * I; /* one past the layer's last parameter (a MoE layer's experts lie apart) */
        if (o->moe) {
            const MoeConfig *mc = &cfg->moe;
            const long E = mc->num_experts, Is = mc->shared_expert_intermediate_size / m->etp; /* this rank's */
            const bool shared = Is > 0;
            o->router = slot_offset(host, s->router, true, "mlp.router", l);
            o->expert_bias = slot_offset(host, s->expert_bias, mc->load_balancing == LB_EXPERT_BIAS,
                                         "mlp.router.expert_bias", l);
            o->e_gate = slot_offset(host, s->e_gate, true, "mlp.experts.gate_proj", l);
            o->e_up = slot_offset(host, s->e_up, true, "mlp.experts.up_proj", l);
            o->e_down = slot_offset(host, s->e_down, true, "mlp.experts.down_proj", l);
            o->s_gate = slot_offset(host, s->s_gate, shared, "mlp.shared_expert.gate_proj", l);
            o->s_up = slot_offset(host, s->s_up, shared, "mlp.shared_expert.up_proj", l);
            o->s_down = slot_offset(host, s->s_down, shared, "mlp.shared_expert.down_proj", l);
            if (shared && o->s_up != o->s_gate + Is * C)
                mt_die(MT_EXIT_FAILURE, "CUDA model: layer %d: the shared expert's gate and up are not adjacent", l);
            end = shared ? o->s_down + C * Is : o->expert_bias >= 0 ? o->expert_bias + E : o->router + E * C;
        } else {
            o->router = o->expert_bias = o->e_gate = o->e_up = o->e_down = o->s_gate = o->s_up = o->s_down = -1;
        }
        const int fused = o->k == o->q + HD * C && o->v == o->k + KVD * C && o->q_bias < 0;
        if (l == 0) m->qkv_fused = fused;
        else if (fused != m->qkv_fused) mt_die(MT_EXIT_FAILURE, "CUDA model: layers differ in q/k/v layout");
        /* A layer's parameters are contiguous in the registry: attn_norm first, its MLP's last (but the routed
         * experts, declared after every layer). */
        m->layer_begin[l] = o->attn_norm;
        m->layer_end[l] = end;
        if (l > 0 && m->layer_begin[l] != m->layer_end[l - 1])
            mt_die(MT_EXIT_FAILURE, "CUDA model: layer %d's parameters do not follow layer %d's", l, l - 1);
    }
    /* the first stage embeds; the last has the head (with tied embeddings, a copy of embed.weight) */
    const bool tied = cfg->tie_word_embeddings, embed = m->shape.has_embed, head = m->shape.has_head;
    m->embed = slot_offset(host, slots->embed, embed || (head && tied), "embedding", -1);
    m->final_norm = slot_offset(host, slots->final_norm, head, "final_norm", -1);
    m->lm_head = tied ? (head ? m->embed : -1) : slot_offset(host, slots->lm_head, head, "lm_head", -1);
}

/* Expert parallel: the routed experts' weights, which differ between the ep ranks, are one region at the end of
 * the flat arrays (model_registry.c declares them last): [expert_begin, num_floats). 0, or -1 with err set. */
static int find_expert_region(CudaModel *m, const Model *host, char *err, size_t errlen) {
    m->expert_begin = m->num_floats;
    if (m->ep == 1) return 0;
    for (int i = 0; i < host->num_params; i++)
        if (host->param_info[i].expert && (long)host->param_info[i].offset < m->expert_begin)
            m->expert_begin = (long)host->param_info[i].offset;
    for (int i = 0; i < host->num_params; i++) {
        const ParamInfo *p = &host->param_info[i];
        if (p->expert != ((long)p->offset >= m->expert_begin)) {
            mt_set_error(err, errlen, "the CUDA model under expert parallel: %s is %s the routed experts' region at "
                         "the end of the flat arrays", p->name, p->expert ? "outside" : "inside");
            return -1;
        }
    }
    return 0;
}

/* The gradients reduced over tp (TpPartialGrad): partial sums (ParamInfo.tp_partial_grad) and the
 * whole gradients of weights every tp rank holds whole (the same global shape). */
static void find_tp_partial(CudaModel *m, const Model *host) {
    m->tp_partial = mt_calloc((size_t)host->num_params + 1, sizeof *m->tp_partial);
    for (int i = 0; i < host->num_params && m->shape.tp > 1; i++) {
        const ParamInfo *p = &host->param_info[i];
        bool replicated = true;
        for (int d = 0; d < 3; d++) replicated = replicated && p->shape[d] == p->global_shape[d];
        if (!p->tp_partial_grad && !replicated) continue;
        int layer = -1;
        for (int l = 0; l < m->shape.L; l++)
            if ((long)p->offset >= m->layer_begin[l] && (long)p->offset < m->layer_end[l]) layer = l;
        m->tp_partial[m->num_tp_partial++] = (TpPartialGrad){.offset = (long)p->offset, .numel = p->numel,
                                                             .layer = layer, .average = !p->tp_partial_grad};
    }
}

/* Chunks: every parameter (only those this rank counts in the grad norm,
 * with owned_only) cut into runs of at most MT_ADAMW_CHUNK floats. */
static CudaAdamWChunk *build_chunks(const Model *host, bool owned_only, int *count) {
    int n = 0;
    for (int i = 0; i < host->num_params; i++)
        if (!owned_only || host->param_info[i].norm_owner)
            n += (int)((host->param_info[i].numel + MT_ADAMW_CHUNK - 1) / MT_ADAMW_CHUNK);
    CudaAdamWChunk *chunks = mt_malloc((size_t)(n > 0 ? n : 1) * sizeof *chunks);
    int k = 0;
    for (int i = 0; i < host->num_params; i++) {
        const ParamInfo *p = &host->param_info[i];
        if (owned_only && !p->norm_owner) continue;
        for (long start = 0; start < p->numel; start += MT_ADAMW_CHUNK) {
            long len = p->numel - start < MT_ADAMW_CHUNK ? p->numel - start : MT_ADAMW_CHUNK;
            chunks[k++] = (CudaAdamWChunk){.offset = p->offset + (size_t)start, .length = (unsigned)len,
                                           .decay = !p->no_decay, .state = p->offset + (size_t)start};
        }
    }
    *count = n;
    return chunks;
}

/* The RoPE rows of this rank's positions (model_rope_rows) and, under context parallel, its
 * positions and every cp rank's. */
static void upload_positions(CudaModel *m) {
    const int T = m->max_T, Tall = T * m->shape.cp;
    const size_t bytes = (size_t)T * (m->shape.D / 2) * sizeof(float);
    float *cos_table = mt_malloc(bytes), *sin_table = mt_malloc(bytes);
    int32_t *seq_pos = mt_malloc((size_t)Tall * sizeof(int32_t));
    model_rope_rows(&m->shape, &m->cfg, T, cos_table, sin_table, NULL);
    model_sequence_positions(&m->shape, T, seq_pos);
    copy_in_order(m, m->rope_cos, cos_table, bytes, cudaMemcpyHostToDevice);
    copy_in_order(m, m->rope_sin, sin_table, bytes, cudaMemcpyHostToDevice);
    if (m->shape.cp > 1) {
        const int32_t *mine = seq_pos + (size_t)m->shape.cp_rank * T;
        for (int t = 0; t < T; t++) /* the attention kernels' contract (cuda_attention_forward_at) */
            if (mine[t] < 0 || mine[t] >= Tall || (t > 0 && mine[t] < mine[t - 1]))
                mt_die(MT_EXIT_FAILURE, "CUDA model: context-parallel position %d of rank %d is %d: the attention "
                       "kernels need them non-decreasing in [0, %d)", t, m->shape.cp_rank, mine[t], Tall);
        copy_in_order(m, m->positions, mine, (size_t)T * sizeof(int32_t), cudaMemcpyHostToDevice);
        copy_in_order(m, m->seq_pos, seq_pos, (size_t)Tall * sizeof(int32_t), cudaMemcpyHostToDevice);
    }
    free(seq_pos);
    free(cos_table);
    free(sin_table);
}

/* ---- creation ------------------------------------------------------------ */

CudaModel *cuda_model_create(const Model *host, int device, int max_B, int max_T, const CudaModelOptions *options,
                             char *err, size_t errlen) {
    CudaModel *m = mt_calloc(1, sizeof *m);
    const CudaModelOptions opt = options ? *options : (CudaModelOptions){0};
    if (opt.state_dtype != DTYPE_FP32 && opt.state_dtype != DTYPE_BF16) {
        mt_set_error(err, errlen, "optimizer.state_dtype: '%s' on CUDA: expected fp32 or bf16",
                     dtype_name(opt.state_dtype));
        free(m);
        return NULL;
    }
    m->bf16_states = opt.state_dtype == DTYPE_BF16;
    m->recompute = opt.recompute;
    m->cfg = host->cfg;
    m->info = host->param_info;
    m->num_params = host->num_params;
    m->num_floats = host->num_floats;
    m->max_B = max_B;
    m->max_T = max_T;
    const char *profile = getenv("MEGATRAIN_CUDA_PROFILE");
    m->prof_on = profile && atoi(profile) > 0 ? atoi(profile) : 0;
    const int hd = m->cfg.head_dim;
    if (!model_cuda_head_dim_ok(hd)) {
        mt_set_error(err, errlen, "model.head_dim: %d is not supported on CUDA (16, 32, 64 or 128)", hd);
        free(m);
        return NULL;
    }
    const ModelPartition *part = &host->part;
    bool empty_chunk = false;
    for (int v = 0; v < part->num_chunks; v++) empty_chunk = empty_chunk || part->chunk_layers[v] < 1;
    if (empty_chunk || part->num_chunks > MT_MAX_CHUNKS || (part->cp > 1 && max_T % 2 != 0)) {
        mt_set_error(err, errlen, "the CUDA model holds chunks of at least one layer each (%d chunks, %d tokens per "
                     "rank: even under context parallel)", part->num_chunks, max_T);
        free(m);
        return NULL;
    }
    m->shape = model_shape_of(&m->cfg, part);
    m->ep = part->ep > 1 ? part->ep : 1;
    m->ep_rank = part->ep > 1 ? part->ep_rank : 0;
    m->etp = part->etp > 1 ? part->etp : 1;
    bool moe = false;
    for (int v = 0; v < part->num_chunks; v++)
        for (int i = 0; i < part->chunk_layers[v]; i++) moe = moe || model_layer_is_moe(&m->cfg, part->chunk_first[v] + i);
    if (moe) {
        const MoeConfig *mc = &m->cfg.moe;
        /* this rank's slices (expert tensor parallel cuts the intermediates) */
        const int Ie = mc->moe_intermediate_size / m->etp, Is = mc->shared_expert_intermediate_size / m->etp;
        const char *why = model_cuda_moe_limit(&m->cfg, m->etp);
        if (why) {
            mt_set_error(err, errlen, "the CUDA model's mixture of experts %s (%d experts, hidden %d, expert "
                         "intermediate %d, shared %d on this rank)", why, mc->num_experts, m->cfg.hidden_size, Ie, Is);
            free(m);
            return NULL;
        }
        m->moe_step = host->moe_step;
        m->dp_host = part->dp_comm && part->dp_comm->size > 1 ? part->dp_comm : NULL;
    }
    if (cuda_context_create(&m->ctx, device, err, errlen) != 0) {
        free(m);
        return NULL;
    }
    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    snprintf(m->device_name, sizeof m->device_name, "%s (sm_%d%d, %d SMs)", prop.name, prop.major, prop.minor,
             prop.multiProcessorCount);

    m->layers = mt_calloc((size_t)m->shape.L, sizeof *m->layers);
    m->saved = mt_calloc((size_t)m->shape.L, sizeof *m->saved);
    m->layer_begin = mt_malloc((size_t)m->shape.L * sizeof(long));
    m->layer_end = mt_malloc((size_t)m->shape.L * sizeof(long));
    find_offsets(m, host);
    if (find_expert_region(m, host, err, errlen) != 0) {
        cuda_model_free(m);
        return NULL;
    }
    find_tp_partial(m, host);
    m->state_floats = m->num_floats;
    CudaAdamWChunk *chunks, *norm_chunks;
    if (opt.zero1) { /* the distributed optimizer: this rank's parts, their moments a shard */
        if (!(m->z1 = cuda_zero1_create(m, opt.zero1, err, errlen))) {
            cuda_model_free(m);
            return NULL;
        }
        m->state_floats = (long)opt.zero1->owned;
        chunks = cuda_zero1_chunks(host, opt.zero1, false, &m->num_chunks);
        norm_chunks = cuda_zero1_chunks(host, opt.zero1, true, &m->num_norm_chunks);
        m->norm_expert_chunk = m->num_norm_chunks; /* summed over dp as one */
    } else {
        chunks = build_chunks(host, false, &m->num_chunks);
        /* tensor parallel: the replicated weights are counted in the grad norm by tp rank 0 only */
        bool all_owned = true;
        for (int i = 0; i < host->num_params; i++) all_owned = all_owned && host->param_info[i].norm_owner;
        norm_chunks = all_owned ? NULL : build_chunks(host, true, &m->num_norm_chunks);
        m->norm_expert_chunk = m->num_norm_chunks; /* the first norm chunk of the experts' region (ep > 1) */
        for (int i = m->num_norm_chunks - 1; i >= 0 && (long)norm_chunks[i].offset >= m->expert_begin; i--)
            m->norm_expert_chunk = i;
    }

    Carver counter = {NULL, 0};
    layout(m, &counter);
    m->arena_bytes = counter.used;
    cudaError_t status = cudaMalloc(&m->arena, m->arena_bytes);
    if (status != cudaSuccess) {
        size_t free_bytes = 0, total = 0;
        cudaMemGetInfo(&free_bytes, &total);
        mt_set_error(err, errlen,
                     "CUDA device %d: cannot allocate %.2f GiB for the model (weights, grads, AdamW states and "
                     "activations for micro-batches of %d x %d); %.2f GiB free of %.2f: lower "
                     "train.micro_batch_size or train.seq_len",
                     device, m->arena_bytes / 1073741824.0, max_B, max_T, free_bytes / 1073741824.0,
                     total / 1073741824.0);
        free(chunks);
        free(norm_chunks);
        cuda_model_free(m);
        return NULL;
    }
    Carver carver = {m->arena, 0};
    layout(m, &carver);
    CUDA_CHECK(cudaMemsetAsync(m->arena, 0, m->arena_bytes, m->ctx.stream));
    if (m->z1) cuda_zero1_start(m);

    upload_positions(m);
    copy_in_order(m, m->chunks, chunks, (size_t)m->num_chunks * sizeof *chunks, cudaMemcpyHostToDevice);
    free(chunks);
    if (norm_chunks)
        copy_in_order(m, m->norm_chunks, norm_chunks, (size_t)m->num_norm_chunks * sizeof *norm_chunks,
                      cudaMemcpyHostToDevice);
    free(norm_chunks);
    m->host_targets = mt_malloc((size_t)max_B * max_T * sizeof(int32_t));
    m->host_losses = mt_malloc((size_t)max_B * max_T * sizeof(float));
    m->host_norm_partial = mt_malloc(NORM_PARTIALS * sizeof(double));
    cuda_model_upload(m, host->params, NULL, NULL);
    cuda_model_peak_bytes(m);
    return m;
}

CudaModel *cuda_model_clone_activations(CudaModel *base, char *err, size_t errlen) {
    CudaModel *m = mt_malloc(sizeof *m);
    *m = *base; /* weights, gradients, scratch, tables, communicators: base's */
    m->base = base;
    m->saved = mt_calloc((size_t)m->shape.L, sizeof *m->saved);
    Carver counter = {NULL, 0};
    layout_activations(m, &counter);
    m->arena_bytes = counter.used;
    if (cudaMalloc(&m->arena, m->arena_bytes) != cudaSuccess) {
        mt_set_error(err, errlen, "CUDA device %d: no room for another micro-batch's activations (%.2f GiB) of the "
                     "pipeline: lower train.micro_batch_size or train.seq_len", m->ctx.device,
                     m->arena_bytes / 1073741824.0);
        free(m->saved);
        free(m);
        return NULL;
    }
    Carver carver = {m->arena, 0};
    layout_activations(m, &carver);
    CUDA_CHECK(cudaMemsetAsync(m->arena, 0, m->arena_bytes, m->ctx.stream));
    m->host_targets = mt_malloc((size_t)m->max_B * m->max_T * sizeof(int32_t));
    m->host_losses = mt_malloc((size_t)m->max_B * m->max_T * sizeof(float));
    m->backward_ready = 0;
    m->prof_on = 0; /* MEGATRAIN_CUDA_PROFILE times the base's ops only */
    return m;
}

void cuda_model_free(CudaModel *m) {
    if (!m) return;
    const bool owner = !m->base; /* a clone owns its activations and host buffers only */
    if (owner && m->prof_steps < m->prof_on) prof_report(m);
    if (owner && m->layer_done) {
        for (int l = 0; l <= m->shape.L; l++) cudaEventDestroy(m->layer_done[l]);
        cudaEventDestroy(m->comm_done);
        cudaStreamDestroy(m->comm_stream);
        free(m->layer_done);
    }
    if (m->arena) {
        cudaStreamSynchronize(m->ctx.stream);
        cudaFree(m->arena);
    }
    cuda_moe_free_saved(m);
    if (owner) cuda_moe_free_shared(m);
    free(m->saved);
    free(m->host_targets);
    free(m->host_losses);
    if (owner) {
        cuda_stage_direct_free(m);
        cuda_gemm_cache_clear();
        cuda_context_destroy(&m->ctx);
        free(m->layers);
        free(m->layer_begin);
        free(m->layer_end);
        free(m->tp_partial);
        cuda_zero1_free(m->z1);
        free(m->host_norm_partial);
    }
    free(m);
}

/* ---- host <-> device ----------------------------------------------------- */

void cuda_model_upload(CudaModel *m, const float *params, const void *exp_avg, const void *exp_avg_sq) {
    const size_t bytes = (size_t)m->num_floats * sizeof(float), moments = (size_t)m->state_floats * state_bytes(m);
    cuda_zero1_wait(m, -2); /* no gather left to land on what is copied in */
    if (params && m->z1) {
        cuda_zero1_upload(m, 0, m->num_floats, params); /* the bf16 copy, this rank's parts of the master */
    } else if (params) {
        copy_in_order(m, m->params, params, bytes, cudaMemcpyHostToDevice);
        CUDA_CHECK(cuda_cast_fp32_to_bf16(m->params16, m->params, (size_t)m->num_floats, m->ctx.stream));
    }
    if (exp_avg) copy_in_order(m, m->exp_avg, exp_avg, moments, cudaMemcpyHostToDevice);
    if (exp_avg_sq) copy_in_order(m, m->exp_avg_sq, exp_avg_sq, moments, cudaMemcpyHostToDevice);
    CUDA_CHECK(cudaStreamSynchronize(m->ctx.stream));
}

void cuda_model_upload_range(CudaModel *m, long offset, long count, const float *host) {
    if (offset < 0 || count <= 0 || offset + count > m->num_floats)
        mt_die(MT_EXIT_FAILURE, "cuda_model_upload_range: [%ld, %ld) is outside the %ld parameters", offset,
               offset + count, m->num_floats);
    cuda_zero1_wait(m, -2);
    if (m->z1) {
        cuda_zero1_upload(m, offset, count, host);
        return;
    }
    copy_in_order(m, m->params + offset, host, (size_t)count * sizeof(float), cudaMemcpyHostToDevice);
    CUDA_CHECK(cuda_cast_fp32_to_bf16(m->params16 + offset, m->params + offset, (size_t)count, m->ctx.stream));
}

void cuda_model_set_loss_scale(CudaModel *m, float loss_scale) { m->loss_scale = loss_scale; }

void cuda_model_download(CudaModel *m, float *params, void *exp_avg, void *exp_avg_sq) {
    const size_t bytes = (size_t)m->num_floats * sizeof(float), moments = (size_t)m->state_floats * state_bytes(m);
    cuda_zero1_wait(m, -2); /* the parameters whole again */
    CUDA_CHECK(cudaStreamSynchronize(m->ctx.stream));
    if (params && m->z1) cuda_zero1_download(m, params); /* this rank's parts (the caller gathers the rest) */
    else if (params) copy_in_order(m, params, m->params, bytes, cudaMemcpyDeviceToHost);
    if (exp_avg) copy_in_order(m, exp_avg, m->exp_avg, moments, cudaMemcpyDeviceToHost);
    if (exp_avg_sq) copy_in_order(m, exp_avg_sq, m->exp_avg_sq, moments, cudaMemcpyDeviceToHost);
}

void cuda_model_download_grads(CudaModel *m, float *grads) {
    CUDA_CHECK(cudaStreamSynchronize(m->ctx.stream));
    copy_in_order(m, grads, m->grads, (size_t)m->num_floats * sizeof(float), cudaMemcpyDeviceToHost);
}

void cuda_model_upload_grads(CudaModel *m, const float *grads) {
    copy_in_order(m, m->grads, grads, (size_t)m->num_floats * sizeof(float), cudaMemcpyHostToDevice);
}

void cuda_model_download_logits(CudaModel *m, float *logits) {
    const size_t n = (size_t)m->B * m->T * m->shape.V;
    bf16_t *raw = mt_malloc(n * sizeof *raw);
    CUDA_CHECK(cudaStreamSynchronize(m->ctx.stream));
    copy_in_order(m, raw, m->logits, n * sizeof *raw, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)raw[i] << 16;
        memcpy(&logits[i], &bits, sizeof bits);
    }
    free(raw);
}

void cuda_model_zero_grad(CudaModel *m) {
    cuda_zero1_step_begin(m);
    CUDA_CHECK(cudaMemsetAsync(m->grads, 0, (size_t)m->num_floats * sizeof(float), m->ctx.stream));
}

/* ---- optimizer ----------------------------------------------------------- */

/* The sum of squares of grads[begin, end): every float, or (tensor parallel: norm chunks) the floats of the norm
 * chunks in it (the chunks follow the flat order, so those of a region are a run of them). */
static double sum_squares(CudaModel *m, long begin, long end) {
    cudaStream_t st = m->ctx.stream;
    if (m->num_norm_chunks == 0) {
        TIMED(m, PROF_OPTIMIZER, CUDA_CHECK(cuda_sum_squares(m->norm_partial, NORM_PARTIALS, m->grads + begin,
                                                             (size_t)(end - begin), st)));
    } else {
        const int first = begin == 0 ? 0 : m->norm_expert_chunk, last = end == m->num_floats ? m->num_norm_chunks
                                                                                              : m->norm_expert_chunk;
        TIMED(m, PROF_OPTIMIZER, CUDA_CHECK(cuda_sum_squares_chunks(m->norm_partial, NORM_PARTIALS, m->grads,
                                                                    m->norm_chunks + first, last - first, st)));
    }
    CUDA_CHECK(cudaMemcpyAsync(m->host_norm_partial, m->norm_partial, NORM_PARTIALS * sizeof(double),
                               cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    double total = 0.0;
    for (int i = 0; i < NORM_PARTIALS; i++) total += m->host_norm_partial[i];
    return total;
}

/* As model_grad_sumsq on the CPU (grad_reduce.c): tensor parallel counts this rank's blocks and the replicas it owns,
 * summed over tp; expert parallel the dense weights' (the same on every ep rank) once and every ep rank's own
 * experts' (the end of the flat arrays), summed over ep. */
double cuda_model_grad_sumsq(CudaModel *m) {
    if (m->z1) { /* this rank's parts (the experts' among them), summed over dp */
        const double mine = m->num_norm_chunks > 0 ? sum_squares(m, 0, m->num_floats) : 0.0;
        const double total = device_comm_sum_double(m->grad_sync, mine);
        return m->shape.tp > 1 ? device_comm_sum_double(m->tp_comm, total) : total;
    }
    double total = sum_squares(m, 0, m->expert_begin);
    if (m->ep > 1) total += device_comm_sum_double(m->ep_comm, sum_squares(m, m->expert_begin, m->num_floats));
    return m->shape.tp > 1 ? device_comm_sum_double(m->tp_comm, total) : total;
}

double cuda_model_grad_norm(CudaModel *m) { return sqrt(cuda_model_grad_sumsq(m)); }

void cuda_model_adamw(CudaModel *m, const CudaAdamWStep *step) {
    CudaAdamWArgs args = {
        .lr = (float)step->lr,
        .beta1 = (float)step->beta1,
        .beta2 = (float)step->beta2,
        .eps = (float)step->eps,
        .weight_decay = (float)step->weight_decay,
        .grad_scale = (float)step->grad_scale,
    };
    cuda_adamw_set_step(&args, step->step);
    /* with the distributed optimizer the master is this rank's shard, and the gather brings the others' bf16 parts */
    TIMED(m, PROF_OPTIMIZER, CUDA_CHECK(cuda_adamw_step_chunks(m->params, m->z1 != NULL, m->grads, m->exp_avg,
                                                               m->exp_avg_sq, m->bf16_states, m->params16, m->chunks,
                                                               m->num_chunks, &args, m->ctx.stream)));
    if (m->z1) cuda_zero1_gather(m);
    if (m->prof_on && ++m->prof_steps == m->prof_on) prof_report(m);
}

void cuda_model_sum_grads(CudaModel *m, DeviceComm *comm, long offset, long count) {
    device_all_reduce(comm, m->grads + offset, (size_t)count, NCCL_DTYPE_FLOAT, false, m->ctx.stream);
}

void cuda_model_set_cp_comm(CudaModel *m, DeviceComm *comm) {
    if (comm->size != m->shape.cp)
        mt_die(MT_EXIT_FAILURE, "CUDA model: a cp communicator of %d ranks for context parallel %d", comm->size,
               m->shape.cp);
    m->cp_comm = comm;
}

void cuda_model_set_ep_comm(CudaModel *m, DeviceComm *ep, DeviceComm *edp) {
    if (!ep || ep->size != m->ep)
        mt_die(MT_EXIT_FAILURE, "CUDA model: an ep communicator of %d ranks for expert parallel %d", ep ? ep->size : 0,
               m->ep);
    if (ep->rank != m->ep_rank) /* the dispatch sends expert g to the group's rank g / (experts per rank) */
        mt_die(MT_EXIT_FAILURE, "CUDA model: rank %d of the ep communicator holds the experts of ep rank %d", ep->rank,
               m->ep_rank);
    m->ep_comm = ep;
    m->edp_comm = edp && edp->size > 1 ? edp : NULL;
}

void cuda_model_set_tp_comm(CudaModel *m, DeviceComm *comm) {
    if (comm->size != m->shape.tp)
        mt_die(MT_EXIT_FAILURE, "CUDA model: a tp communicator of %d ranks for tensor parallel %d", comm->size,
               m->shape.tp);
    m->tp_comm = comm;
}

/* ---- memory -------------------------------------------------------------- */

size_t cuda_model_bytes(const CudaModel *m) { return m->arena_bytes; }

size_t cuda_model_activation_bytes(const CudaModel *m) {
    CudaModel probe = *m;
    LayerSaved *saved = mt_calloc((size_t)m->shape.L, sizeof *saved);
    probe.saved = saved;
    Carver counter = {NULL, 0};
    layout_activations(&probe, &counter);
    cuda_moe_free_saved(&probe); /* the host records the MoE layers' layout made for the probe */
    free(saved);
    return counter.used;
}

size_t cuda_model_peak_bytes(CudaModel *m) {
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total) == cudaSuccess && total - free_bytes > m->peak_used)
        m->peak_used = total - free_bytes;
    return m->peak_used;
}

const char *cuda_model_device_name(const CudaModel *m) { return m->device_name; }

void cuda_model_pci_bus_id(const CudaModel *m, char *out, int len) {
    if (cudaDeviceGetPCIBusId(out, len, m->ctx.device) != cudaSuccess && len > 0) out[0] = '\0';
}
