/* cuda_model_pass.c: forward and backward of the CUDA model (see
 * cuda_model.h), and the data-parallel gradient averaging that overlaps the
 * backward (with the distributed optimizer, the bucketed reduce-scatters of
 * cuda_model_zero1.c instead, and each layer's forward waits for its
 * parameters' all-gather).
 *
 * Per layer, forward (bf16 activations, fp32 statistics):
 *   attn_normed = rmsnorm(resid_in)
 *   qkv         = attn_normed @ [Wq; Wk; Wv]^T   one product when the three
 *                 weights are adjacent in the registry (no biases), else three
 *                 products with the bias epilogue into column slices of qkv
 *   q, k, v     = qkv_rope(qkv)                  qk-norm + RoPE + split, one kernel
 *   attn_out    = flash attention(q, k, v)       lse kept, never T x T
 *   resid_mid   = resid_in + attn_out @ Wo^T     residual add in the epilogue
 *   mlp_normed  = rmsnorm(resid_mid)
 *   gate_up     = mlp_normed @ [Wgate; Wup]^T    gate and up are adjacent: one product
 *   act         = silu(gate) * up
 *   out         = resid_mid + act @ Wdown^T      residual add in the epilogue
 * then final norm, logits (bf16) and the fused cross entropy, whose backward
 * overwrites the logits with their gradient. The residual stream's gradient
 * is accumulated in fp32 (d_resid) and mirrored in bf16 (d_resid16) for the
 * products; weight gradients accumulate in fp32 straight from cuBLASLt.
 * Under tensor parallel the cuda_tp_* steps (cuda_model_parallel.c) bracket
 * the products; with tp 1 they are the plain ops above. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_model_internal.h"

void cuda_linear_forward(CudaModel *m, bf16_t *out, int ldo, const bf16_t *inp, long w, long bias,
                         const bf16_t *residual, int N, int IC, int OC) {
    TIMED(m, PROF_GEMM, cuda_gemm_forward(&m->ctx, out, ldo, inp, w16(m, w), w16(m, bias), residual, N, IC, OC));
}

void cuda_linear_backward(CudaModel *m, bf16_t *dinp, const bf16_t *dout, int ld, const bf16_t *inp, long w,
                          long bias, int N, int IC, int OC, int accumulate) {
    CudaContext *ctx = &m->ctx;
    TIMED(m, PROF_GEMM, cuda_gemm_backward_input(ctx, dinp, dout, ld, w16(m, w), N, IC, OC, accumulate));
    TIMED(m, PROF_GEMM, cuda_gemm_backward_weight(ctx, g32(m, w), dout, ld, inp, N, IC, OC));
    if (bias >= 0)
        TIMED(m, PROF_GEMM, CUDA_CHECK(cuda_column_sum_accumulate(g32(m, bias), dout, N, OC, ld, ctx->stream)));
}

/* ---- forward ------------------------------------------------------------- */

static void layer_forward(CudaModel *m, int l, bf16_t *out, int B, int T) {
    const ModelConfig *c = &m->cfg;
    const LayerOffsets *o = &m->layers[l];
    LayerSaved *s = &m->saved[l];
    cudaStream_t st = m->ctx.stream;
    const ModelShape *sh = &m->shape;
    const int N = B * T, R = model_shape_rows(sh, N), C = sh->C, I = sh->I, D = sh->D;
    const int H = sh->H, KVH = sh->KVH, HD = sh->HD, KVD = sh->KVD, QKV = HD + 2 * KVD;
    const float eps = (float)c->rms_norm_eps;

    cuda_zero1_wait(m, l); /* the distributed optimizer: this layer's parameters gathered */
    TIMED(m, PROF_NORM, CUDA_CHECK(cuda_rmsnorm_forward(s->attn_normed, s->attn_rstd, s->resid_in,
                                                        w16(m, o->attn_norm), R, C, eps, st)));
    const bf16_t *x = cuda_tp_enter(m, s->attn_normed, N, C);
    if (m->qkv_fused) {
        cuda_linear_forward(m, s->qkv, QKV, x, o->q, -1, NULL, N, C, QKV);
    } else {
        cuda_linear_forward(m, s->qkv, QKV, x, o->q, o->q_bias, NULL, N, C, HD);
        cuda_linear_forward(m, s->qkv + HD, QKV, x, o->k, o->k_bias, NULL, N, C, KVD);
        cuda_linear_forward(m, s->qkv + HD + KVD, QKV, x, o->v, o->v_bias, NULL, N, C, KVD);
    }
    TIMED(m, PROF_ROPE, CUDA_CHECK(cuda_qkv_rope_forward(s->q, s->k, s->v, s->q_rstd, s->k_rstd, s->qkv,
                                                         w16(m, o->q_norm), w16(m, o->k_norm), m->rope_cos,
                                                         m->rope_sin, N, T, H, KVH, D, eps, st)));
    cuda_cp_attention_forward(m, s, B, T, true);
    cuda_tp_row_parallel_residual(m, s->resid_mid, s->resid_in, s->attn_out, o->o, N, HD, C);

    TIMED(m, PROF_NORM, CUDA_CHECK(cuda_rmsnorm_forward(s->mlp_normed, s->mlp_rstd, s->resid_mid,
                                                        w16(m, o->mlp_norm), R, C, eps, st)));
    x = cuda_tp_enter(m, s->mlp_normed, N, C); /* the layer's last gather: full recompute's backward reads it */
    if (o->moe) { /* the router, the experts, the combine and the residual (cuda_model_moe.c) */
        cuda_moe_forward(m, l, x, s->resid_mid, out, B, T);
        return;
    }
    cuda_linear_forward(m, s->gate_up, 2 * I, x, o->gate, -1, NULL, N, C, 2 * I);
    TIMED(m, PROF_SWIGLU, CUDA_CHECK(cuda_swiglu_forward(s->act, s->gate_up, N, I, st)));
    cuda_tp_row_parallel_residual(m, out, s->resid_mid, s->act, o->down, N, I, C);
}

void cuda_model_forward_start(CudaModel *m, const int32_t *inputs, int B, int T) {
    model_check_batch(&m->shape, "cuda_model_forward", B, T, m->max_B, m->max_T);
    const int N = B * T;
    if (m->shape.cp > 1 && T != m->max_T) /* its RoPE rows and positions are those of max_T tokens */
        mt_die(MT_EXIT_FAILURE, "cuda_model_forward: context parallel runs micro-batches of %d tokens per rank, "
               "found %d", m->max_T, T);
    if ((m->shape.tp > 1 && !m->tp_comm) || (m->shape.cp > 1 && !m->cp_comm) || (m->ep > 1 && !m->ep_comm))
        mt_die(MT_EXIT_FAILURE, "cuda_model_forward: tp %d / cp %d / ep %d need their communicators "
               "(cuda_model_set_tp_comm, cuda_model_set_cp_comm, cuda_model_set_ep_comm)", m->shape.tp, m->shape.cp,
               m->ep);
    m->B = B;
    m->T = T;
    m->backward_ready = 0;
    if (!m->shape.has_embed) return; /* the stage input arrives from the previous stage */
    model_check_tokens(&m->shape, inputs, N, false);
    CUDA_CHECK(cudaMemcpyAsync(m->inputs, inputs, (size_t)N * sizeof(int32_t), cudaMemcpyHostToDevice, m->ctx.stream));
    cuda_zero1_wait(m, -1);
    cuda_tp_embedding_forward(m, m->saved[0].resid_in, N, m->cfg.hidden_size);
}

/* The output of chunk v: the next chunk's input buffer (it is sent on, and the same buffer later receives the next
 * chunk's input for this micro-batch), or the stage's output after the last chunk. */
static bf16_t *chunk_output(CudaModel *m, int v) {
    return v + 1 < m->shape.num_chunks ? m->saved[m->shape.chunk_start[v + 1]].resid_in : m->final_resid;
}

void cuda_model_forward_layers(CudaModel *m, int chunk) {
    const int end = model_shape_chunk_end(&m->shape, chunk);
    for (int l = m->shape.chunk_start[chunk]; l < end; l++)
        layer_forward(m, l, l + 1 < end ? m->saved[l + 1].resid_in : chunk_output(m, chunk), m->B, m->T);
}

float cuda_model_forward_head(CudaModel *m, const int32_t *targets) {
    const ModelConfig *c = &m->cfg;
    cudaStream_t st = m->ctx.stream;
    const int N = m->B * m->T, R = model_shape_rows(&m->shape, N), C = c->hidden_size;
    if (!m->shape.has_head) mt_die(MT_EXIT_FAILURE, "cuda_model_forward_head: this pipeline stage has no head");
    cuda_zero1_wait(m, -2);
    TIMED(m, PROF_NORM, CUDA_CHECK(cuda_rmsnorm_forward(m->final_normed, m->final_rstd, m->final_resid,
                                                        w16(m, m->final_norm), R, C, (float)c->rms_norm_eps, st)));
    const bf16_t *x = cuda_tp_enter(m, m->final_normed, N, C);
    cuda_linear_forward(m, m->logits, m->shape.V, x, m->lm_head, -1, NULL, N, C, m->shape.V);
    if (!targets) {
        cuda_model_synchronize(m); /* polls: a failed peer ends the wait */
        return 0.0f;
    }
    model_check_tokens(&m->shape, targets, N, true);
    memcpy(m->host_targets, targets, (size_t)N * sizeof(int32_t)); /* the vocab-parallel loss reads them */
    CUDA_CHECK(cudaMemcpyAsync(m->targets, m->host_targets, (size_t)N * sizeof(int32_t), cudaMemcpyHostToDevice, st));
    cuda_tp_cross_entropy_forward(m, N);
    CUDA_CHECK(cudaMemcpyAsync(m->host_losses, m->losses, (size_t)N * sizeof(float), cudaMemcpyDeviceToHost, st));
    cuda_model_synchronize(m); /* polls: a failed peer ends the wait */
    double sum = 0.0;
    long count = 0;
    for (int i = 0; i < N; i++)
        if (targets[i] >= 0) {
            sum += m->host_losses[i];
            count++;
        }
    if (m->shape.cp > 1) { /* the mean over the whole sequences */
        sum = device_comm_sum_double(m->cp_comm, sum);
        count = (long)device_comm_sum_double(m->cp_comm, (double)count);
    }
    m->num_targets = count;
    m->backward_ready = 1;
    return count > 0 ? (float)(sum / (double)count) : 0.0f;
}

float cuda_model_forward(CudaModel *m, const int32_t *inputs, const int32_t *targets, int B, int T) {
    if (!m->shape.has_embed || !m->shape.has_head)
        mt_die(MT_EXIT_FAILURE, "cuda_model_forward: a pipeline stage runs through cuda_model_forward_start/_layers/_head");
    cuda_model_forward_start(m, inputs, B, T);
    for (int v = 0; v < m->shape.num_chunks; v++) /* each chunk's output is the next's input */
        cuda_model_forward_layers(m, v);
    return cuda_model_forward_head(m, targets);
}

/* ---- backward ------------------------------------------------------------ */

/* On entry d_resid / d_resid16 hold dL/d(layer output); on exit dL/d(layer input). train.recompute first
 * rebuilds what the forward did not keep (into the working set its LayerSaved points to; the forward is
 * deterministic, so the same values): full the whole layer from its kept input (its output into recompute_out, as
 * the next layer's input is kept), selective the SwiGLU before the MLP's backward and the attention core (attn_out
 * and lse from the kept q, k, v and, under cp, the kept k_all, v_all: no collective) before the attention's.
 * A recomputed MoE layer reruns its collectives (tp, cp gathers, the ep exchanges) on every rank of their group
 * alike, as src/model/model_backward.c's header argues for the CPU, and skips its statistics (cuda_model_moe.c). */
static void layer_backward(CudaModel *m, int l, int B, int T) {
    const LayerOffsets *o = &m->layers[l];
    LayerSaved *s = &m->saved[l];
    cudaStream_t st = m->ctx.stream;
    const ModelShape *sh = &m->shape;
    const int N = B * T, R = model_shape_rows(sh, N), C = sh->C, I = sh->I, D = sh->D;
    const int H = sh->H, KVH = sh->KVH, HD = sh->HD, KVD = sh->KVD, QKV = HD + 2 * KVD;
    const bool selective = m->recompute == RECOMPUTE_SELECTIVE;
    if (m->recompute == RECOMPUTE_FULL) { /* MoE: the same routing, no second record of its statistics */
        m->recomputing = true;
        layer_forward(m, l, m->recompute_out, B, T);
        m->recomputing = false;
    }

    /* MLP half: out = resid_mid + act @ Wdown^T (or + the MoE MLP). Its input under sequence parallel: gathered
     * again (full recompute's forward has just left it gathered) */
    const bf16_t *dy = cuda_tp_leave_backward(m, N, C), *g;
    const bf16_t *x = m->recompute == RECOMPUTE_FULL && sh->sp ? m->sp_in : cuda_tp_enter(m, s->mlp_normed, N, C);
    if (o->moe) {
        g = cuda_moe_backward(m, l, x, dy, m->loss_scale);
    } else {
        if (selective) TIMED(m, PROF_SWIGLU, CUDA_CHECK(cuda_swiglu_forward(s->act, s->gate_up, N, I, st)));
        cuda_linear_backward(m, m->d_act, dy, C, s->act, o->down, -1, N, I, C, 0);
        TIMED(m, PROF_SWIGLU, CUDA_CHECK(cuda_swiglu_backward(m->d_gate_up, m->d_act, s->gate_up, N, I, st)));
        cuda_linear_backward(m, m->d_normed, m->d_gate_up, 2 * I, x, o->gate, -1, N, C, 2 * I, 0);
        g = cuda_tp_enter_backward(m, m->d_normed, N, C);
    }
    TIMED(m, PROF_NORM, CUDA_CHECK(cuda_rmsnorm_backward(m->d_resid, m->d_resid16, g32(m, o->mlp_norm), g,
                                                         s->resid_mid, w16(m, o->mlp_norm), s->mlp_rstd, R, C, st)));

    /* attention half: resid_mid = resid_in + attn_out @ Wo^T */
    if (selective) cuda_cp_attention_forward(m, s, B, T, false);
    dy = cuda_tp_leave_backward(m, N, C);
    cuda_linear_backward(m, m->d_attn_out, dy, C, s->attn_out, o->o, -1, N, HD, C, 0);
    cuda_cp_attention_backward(m, s, B, T);
    TIMED(m, PROF_ROPE,
          CUDA_CHECK(cuda_qkv_rope_backward(m->d_qkv, g32(m, o->q_norm), g32(m, o->k_norm), m->dq, m->dk, m->dv,
                                            s->qkv, w16(m, o->q_norm), w16(m, o->k_norm), s->q_rstd, s->k_rstd,
                                            m->rope_cos, m->rope_sin, N, T, H, KVH, D, st)));
    x = cuda_tp_enter(m, s->attn_normed, N, C); /* q/k/v's input, gathered again under sequence parallel */
    if (m->qkv_fused) {
        cuda_linear_backward(m, m->d_normed, m->d_qkv, QKV, x, o->q, -1, N, C, QKV, 0);
    } else {
        cuda_linear_backward(m, m->d_normed, m->d_qkv, QKV, x, o->q, o->q_bias, N, C, HD, 0);
        cuda_linear_backward(m, m->d_normed, m->d_qkv + HD, QKV, x, o->k, o->k_bias, N, C, KVD, 1);
        cuda_linear_backward(m, m->d_normed, m->d_qkv + HD + KVD, QKV, x, o->v, o->v_bias, N, C, KVD, 1);
    }
    g = cuda_tp_enter_backward(m, m->d_normed, N, C);
    TIMED(m, PROF_NORM, CUDA_CHECK(cuda_rmsnorm_backward(m->d_resid, m->d_resid16, g32(m, o->attn_norm), g,
                                                         s->resid_in, w16(m, o->attn_norm), s->attn_rstd, R, C, st)));
}

void cuda_model_set_grad_sync(CudaModel *m, DeviceComm *comm) {
    const int L = m->shape.L;
    m->grad_sync = comm;
    CUDA_CHECK(cudaStreamCreateWithFlags(&m->comm_stream, cudaStreamNonBlocking));
    m->layer_done = mt_malloc((size_t)(L + 1) * sizeof *m->layer_done);
    for (int l = 0; l <= L; l++) CUDA_CHECK(cudaEventCreateWithFlags(&m->layer_done[l], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&m->comm_done, cudaEventDisableTiming));
}

/* Once the compute stream has reached `done`, average grads [begin, end) and
 * [begin2, end2) over the data-parallel group on the comm stream. */
static void sync_ranges(CudaModel *m, cudaEvent_t done, long begin, long end, long begin2, long end2) {
    CUDA_CHECK(cudaEventRecord(done, m->ctx.stream));
    CUDA_CHECK(cudaStreamWaitEvent(m->comm_stream, done, 0));
    device_all_reduce(m->grad_sync, m->grads + begin, (size_t)(end - begin), NCCL_DTYPE_FLOAT, true, m->comm_stream);
    device_all_reduce(m->grad_sync, m->grads + begin2, (size_t)(end2 - begin2), NCCL_DTYPE_FLOAT, true,
                      m->comm_stream);
}

void cuda_model_backward_head(CudaModel *m, float loss_scale) {
    if (!m->backward_ready)
        mt_die(MT_EXIT_FAILURE, "cuda_model_backward: needs a forward with targets first (one backward per forward)");
    m->backward_ready = 0;
    m->loss_scale = loss_scale;
    const ModelConfig *c = &m->cfg;
    cudaStream_t st = m->ctx.stream;
    const int N = m->B * m->T, R = model_shape_rows(&m->shape, N), C = c->hidden_size;
    const float dloss = m->num_targets > 0 ? (float)((double)loss_scale / (double)m->num_targets) : 0.0f;
    const int V = m->shape.V; /* vocab_start is 0 without tensor parallel */
    TIMED(m, PROF_LOSS, CUDA_CHECK(cuda_cross_entropy_backward_columns(m->logits, m->ce_lse, m->targets,
                                                                       m->shape.vocab_start, dloss, N, V, st)));
    const bf16_t *x = cuda_tp_enter(m, m->final_normed, N, C); /* lm_head's input, gathered again (sp) */
    cuda_linear_backward(m, m->d_normed, m->logits, V, x, m->lm_head, -1, N, C, V, 0);
    const bf16_t *g = cuda_tp_enter_backward(m, m->d_normed, N, C);
    CUDA_CHECK(cudaMemsetAsync(m->d_resid, 0, (size_t)R * C * sizeof(float), st));
    TIMED(m, PROF_NORM, CUDA_CHECK(cuda_rmsnorm_backward(m->d_resid, m->d_resid16, g32(m, m->final_norm), g,
                                                         m->final_resid, w16(m, m->final_norm), m->final_rstd, R, C,
                                                         st)));
}

/* On the last micro-batch, after the stage's last backward op: the parameters outside the layers (embedding
 * first, final norm and lm_head last) reduced over tp and cp and averaged over dp. With wait the compute stream
 * then waits for every average; without, cuda_model_wait_grad_sync does (a pipeline stage sends its gradient on
 * first, so the averages of the stages overlap). */
static void finish_reductions(CudaModel *m, bool last_micro_batch, bool wait) {
    if (!last_micro_batch) return;
    cuda_parallel_reduce_grads(m, -1);
    if (!m->grad_sync) return;
    if (m->z1) { /* the distributed optimizer: the buckets not yet reduce-scattered (cuda_model_zero1.c) */
        cuda_zero1_finish(m);
        if (wait) cuda_model_wait_grad_sync(m);
        return;
    }
    const int L = m->shape.L;
    /* expert parallel: the routed experts (the end of the flat arrays) summed over the ranks holding the same
     * experts, over dp: each expert saw the rows of the ep group's dp ranks (grad_reduce.c on the CPU) */
    const long dense_end = m->ep > 1 ? m->expert_begin : m->num_floats;
    sync_ranges(m, m->layer_done[L], 0, m->layer_begin[0], m->layer_end[L - 1], dense_end);
    if (m->ep > 1) {
        const size_t n = (size_t)(m->num_floats - m->expert_begin);
        if (m->edp_comm) /* the edp mean, then times edp / dp */
            device_all_reduce(m->edp_comm, m->grads + m->expert_begin, n, NCCL_DTYPE_FLOAT, true, m->comm_stream);
        CUDA_CHECK(cuda_scale_f32(m->grads + m->expert_begin, 1.0f / (float)m->ep, n, m->comm_stream));
    }
    CUDA_CHECK(cudaEventRecord(m->comm_done, m->comm_stream));
    if (wait) cuda_model_wait_grad_sync(m);
}

void cuda_model_wait_grad_sync(CudaModel *m) {
    if (m->grad_sync) CUDA_CHECK(cudaStreamWaitEvent(m->ctx.stream, m->comm_done, 0));
}

void cuda_model_backward_layers(CudaModel *m, int chunk, bool last_micro_batch) {
    const bool sync = last_micro_batch && m->grad_sync;
    for (int l = model_shape_chunk_end(&m->shape, chunk) - 1; l >= m->shape.chunk_start[chunk]; l--) {
        layer_backward(m, l, m->B, m->T);
        if (last_micro_batch) cuda_parallel_reduce_grads(m, l); /* before the dp average reads them */
        if (sync && m->z1) cuda_zero1_layer_done(m, l); /* the buckets now final, reduce-scattered */
        else if (sync) sync_ranges(m, m->layer_done[l], m->layer_begin[l], m->layer_end[l], 0, 0);
    }
    /* chunk 0 of the last micro-batch is this rank's last backward; the first stage then runs backward_finish */
    if (chunk == 0 && !m->shape.has_embed) finish_reductions(m, last_micro_batch, false);
}

void cuda_model_backward_finish(CudaModel *m, bool last_micro_batch) {
    cuda_tp_embedding_backward(m, m->B * m->T, m->cfg.hidden_size);
    finish_reductions(m, last_micro_batch, true);
}

void cuda_model_backward(CudaModel *m, float loss_scale, int last_micro_batch) {
    cuda_model_backward_head(m, loss_scale);
    for (int v = m->shape.num_chunks - 1; v >= 0; v--) cuda_model_backward_layers(m, v, last_micro_batch);
    cuda_model_backward_finish(m, last_micro_batch);
}

/* ---- pipeline stages: activations and their gradients to and from the host ---- */

size_t cuda_model_stage_bytes(const CudaModel *m, bool grad) {
    const size_t rows = (size_t)model_shape_rows(&m->shape, m->B * m->T) * m->cfg.hidden_size;
    return rows * (grad ? sizeof(float) : sizeof(bf16_t));
}

void cuda_model_stage_to_host(CudaModel *m, int chunk, bool grad, void *host) {
    /* forward: the chunk's output (bf16); backward: the gradient of its input (fp32) */
    const void *src = grad ? (const void *)m->d_resid : (const void *)chunk_output(m, chunk);
    CUDA_CHECK(cudaMemcpyAsync(host, src, cuda_model_stage_bytes(m, grad), cudaMemcpyDeviceToHost, m->ctx.stream));
    CUDA_CHECK(cudaStreamSynchronize(m->ctx.stream));
}

void cuda_model_stage_from_host(CudaModel *m, int chunk, bool grad, const void *host) {
    /* forward: the chunk's input (bf16); backward: the gradient of its output (fp32, mirrored in bf16) */
    void *dst = grad ? (void *)m->d_resid : (void *)m->saved[m->shape.chunk_start[chunk]].resid_in;
    const size_t bytes = cuda_model_stage_bytes(m, grad);
    CUDA_CHECK(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, m->ctx.stream));
    if (grad) CUDA_CHECK(cuda_cast_fp32_to_bf16(m->d_resid16, m->d_resid, bytes / sizeof(float), m->ctx.stream));
    CUDA_CHECK(cudaStreamSynchronize(m->ctx.stream)); /* the host buffer may be reused on return */
}

/* ---- pipeline stages: activations and their gradients GPU to GPU (NCCL) ---- */

/* What one step's group holds until cuda_model_stage_post: pipeline_transfers.h's steps send and receive at most
 * PIPE_STEP_MAX each; at most one gradient is sent a step (a steady-state step's two ops are a forward and a
 * backward), copied into grad_send. */
#define STAGE_GROUP_MAX 4
typedef struct CudaStageDirect {
    DeviceComm *comm;            /* the pipeline group, NCCL */
    NcclP2p ops[STAGE_GROUP_MAX];
    int n;
    bool grad_sent;
    size_t grad_received;        /* the floats of the gradient received in the group (0: none) */
    float *grad_send;            /* (residual rows of max_B x max_T, C): the gradient sent, copied from d_resid */
    bf16_t *act_send;            /* (the same rows, C): an activation sent from a buffer its group receives into */
} CudaStageDirect;

void cuda_model_set_pp_comm(CudaModel *m, DeviceComm *comm) {
    if (m->base) mt_die(MT_EXIT_FAILURE, "cuda_model_set_pp_comm: set it on the base, before its clones");
    if (comm->staged) mt_die(MT_EXIT_FAILURE, "cuda_model_set_pp_comm: a staged group sends through the host");
    CudaStageDirect *pp = mt_calloc(1, sizeof *pp);
    pp->comm = comm;
    const size_t rows = (size_t)model_shape_rows(&m->shape, m->max_B * m->max_T);
    CUDA_CHECK(cudaMalloc((void **)&pp->grad_send, rows * m->cfg.hidden_size * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&pp->act_send, rows * m->cfg.hidden_size * sizeof(bf16_t)));
    m->pp = pp;
}

bool cuda_model_stage_direct(const CudaModel *m) { return m->pp != NULL; }

void cuda_stage_direct_free(CudaModel *m) {
    if (!m->pp) return;
    cudaStreamSynchronize(m->ctx.stream);
    cudaFree(m->pp->grad_send);
    cudaFree(m->pp->act_send);
    free(m->pp);
    m->pp = NULL;
}

static CudaStageDirect *stage_direct(CudaModel *m) {
    if (!m->pp) mt_die(MT_EXIT_FAILURE, "cuda_model_stage_send/recv: no pipeline communicator (cuda_model_set_pp_comm)");
    return m->pp;
}

static void stage_record(CudaModel *m, void *buf, bool grad, int peer, bool send) {
    CudaStageDirect *pp = stage_direct(m);
    if (pp->n == STAGE_GROUP_MAX) mt_die(MT_EXIT_FAILURE, "pipeline: more than %d transfers in a group", STAGE_GROUP_MAX);
    const size_t bytes = cuda_model_stage_bytes(m, grad);
    pp->ops[pp->n++] = (NcclP2p){.buf = buf, .count = bytes / (grad ? sizeof(float) : sizeof(bf16_t)),
                                 .type = grad ? NCCL_DTYPE_FLOAT : NCCL_DTYPE_BF16, .peer = peer, .send = send};
}

void cuda_model_stage_send(CudaModel *m, int chunk, bool grad, int peer) {
    if (!grad) {
        stage_record(m, chunk_output(m, chunk), false, peer, true);
        return;
    }
    CudaStageDirect *pp = stage_direct(m);
    if (pp->grad_sent) mt_die(MT_EXIT_FAILURE, "pipeline: two gradients sent in one group");
    /* set aside: a receive of this group may land in d_resid */
    CUDA_CHECK(cudaMemcpyAsync(pp->grad_send, m->d_resid, cuda_model_stage_bytes(m, true), cudaMemcpyDeviceToDevice,
                               m->ctx.stream));
    stage_record(m, pp->grad_send, true, peer, true);
    pp->grad_sent = true;
}

void cuda_model_stage_recv(CudaModel *m, int chunk, bool grad, int peer) {
    stage_record(m, grad ? (void *)m->d_resid : (void *)m->saved[m->shape.chunk_start[chunk]].resid_in, grad, peer,
                 false);
    if (grad) {
        if (m->pp->grad_received) mt_die(MT_EXIT_FAILURE, "pipeline: two gradients received in one group");
        m->pp->grad_received = cuda_model_stage_bytes(m, true) / sizeof(float);
    }
}

static bool p2p_overlap(const NcclP2p *a, const NcclP2p *b) {
    const char *pa = a->buf, *pb = b->buf;
    const size_t na = a->count * (a->type == NCCL_DTYPE_FLOAT ? sizeof(float) : sizeof(bf16_t));
    const size_t nb = b->count * (b->type == NCCL_DTYPE_FLOAT ? sizeof(float) : sizeof(bf16_t));
    return pa < pb + nb && pb < pa + na;
}

/* An evaluation's interleaved group sends chunk v's output and receives chunk v + 1's input of the same micro-batch:
 * one buffer. What arrives was computed from what is sent, so the peer has it all before anything lands; but no
 * buffer is both read and written by one group (NCCL makes no promise of the order inside it): the send is set
 * aside first, as a gradient's always is. */
static void set_aside_overlapping_sends(CudaModel *m, CudaStageDirect *pp) {
    bool used = false;
    for (int i = 0; i < pp->n; i++) {
        NcclP2p *send = &pp->ops[i];
        if (!send->send || send->type != NCCL_DTYPE_BF16) continue;
        bool overlaps = false;
        for (int j = 0; j < pp->n; j++) overlaps = overlaps || (!pp->ops[j].send && p2p_overlap(send, &pp->ops[j]));
        if (!overlaps) continue;
        if (used) mt_die(MT_EXIT_FAILURE, "pipeline: two activations sent from buffers their group receives into");
        CUDA_CHECK(cudaMemcpyAsync(pp->act_send, send->buf, send->count * sizeof(bf16_t), cudaMemcpyDeviceToDevice,
                                   m->ctx.stream));
        send->buf = pp->act_send;
        used = true;
    }
}

void cuda_model_stage_post(CudaModel *m) {
    CudaStageDirect *pp = m->pp;
    if (!pp || pp->n == 0) return;
    set_aside_overlapping_sends(m, pp);
    device_p2p_group(pp->comm, pp->ops, pp->n, m->ctx.stream);
    if (pp->grad_received) /* the gradient of the stage's output: its bf16 mirror for the products */
        CUDA_CHECK(cuda_cast_fp32_to_bf16(m->d_resid16, m->d_resid, pp->grad_received, m->ctx.stream));
    pp->n = 0;
    pp->grad_sent = false;
    pp->grad_received = 0;
}

int cuda_model_comms_failed(CudaModel *m, char *err, size_t errlen) {
    if (m->grad_sync && device_comm_check(m->grad_sync, err, errlen) != 0) return -1;
    if (m->tp_comm && device_comm_check(m->tp_comm, err, errlen) != 0) return -1;
    if (m->cp_comm && device_comm_check(m->cp_comm, err, errlen) != 0) return -1;
    if (m->ep_comm && device_comm_check(m->ep_comm, err, errlen) != 0) return -1;
    if (m->edp_comm && device_comm_check(m->edp_comm, err, errlen) != 0) return -1;
    if (m->pp && device_comm_check(m->pp->comm, err, errlen) != 0) return -1; /* a dead stage: its group never ends */
    return 0;
}

bool cuda_model_idle(CudaModel *m) {
    const cudaError_t status = cudaStreamQuery(m->ctx.stream);
    if (status != cudaSuccess && status != cudaErrorNotReady) CUDA_CHECK(status);
    if (status == cudaSuccess) return true;
    sched_yield();
    return false;
}

void cuda_model_synchronize(CudaModel *m) {
    if (!m->grad_sync && !m->tp_comm && !m->cp_comm && !m->ep_comm && !m->pp) {
        CUDA_CHECK(cudaStreamSynchronize(m->ctx.stream));
        return;
    }
    /* With NCCL in flight, wait by polling so that a failed peer ends this rank too instead of a hang. */
    for (;;) {
        cudaError_t status = cudaStreamQuery(m->ctx.stream);
        if (status == cudaSuccess) return;
        if (status != cudaErrorNotReady) CUDA_CHECK(status);
        char err[512];
        if (cuda_model_comms_failed(m, err, sizeof err) != 0) mt_die(MT_EXIT_FAILURE, "%s", err);
        sched_yield();
    }
}
