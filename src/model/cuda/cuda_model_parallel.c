/* cuda_model_parallel.c: tensor, sequence and context parallel inside the CUDA model
 * (Megatron's layout, as src/model/model_parallel.c on the CPU): q/k/v and
 * gate/up are column-parallel, o_proj and down_proj row-parallel, their
 * outputs partial sums over the tp group. Without sequence parallel the
 * residual stream is whole on every rank: entering the parallel region is
 * the identity (backward: an all-reduce), leaving it an all-reduce. Under
 * sequence parallel the residual stream holds R = N/tp rows of each rank:
 * entering is an all-gather (backward: reduce-scatter), leaving a
 * reduce-scatter (backward: all-gather). The gathered norm outputs are not
 * kept: the backward gathers them again for the weight gradients (Megatron's
 * sequence parallel), so a layer keeps R rows of each. Activations travel in bf16 (as
 * Megatron's); the fp32 residual gradient only for the embedding's backward.
 * The embedding and the cross entropy are vocab-parallel: the full logits
 * are never gathered. Context parallel (as src/model on the CPU): each rank
 * holds two load-balanced chunks of every sequence; keys and values are
 * all-gathered into sequence order for attention at the rank's query
 * positions, their gradients reduce-scattered back; every gradient is
 * summed over cp on the last micro-batch. */
#include <limits.h>

#include "cuda_model_internal.h"

static bool tp_on(const CudaModel *m) { return m->shape.tp > 1; }

/* The residual stream's rows of C channels (a shard of N rows under sequence parallel). */
static size_t shard(const CudaModel *m, int N, int C) { return (size_t)model_shape_rows(&m->shape, N) * C; }

static DeviceComm *tp_comm(CudaModel *m) {
    if (!m->tp_comm)
        mt_die(MT_EXIT_FAILURE, "CUDA model: tensor parallel %d needs its communicator (cuda_model_set_tp_comm)",
               m->shape.tp);
    return m->tp_comm;
}

const bf16_t *cuda_tp_enter(CudaModel *m, const bf16_t *x, int N, int C) {
    if (!m->shape.sp) return x;
    TIMED(m, PROF_TP_COMM, device_all_gather(tp_comm(m), x, m->sp_in, shard(m, N, C), NCCL_DTYPE_BF16, m->ctx.stream));
    return m->sp_in;
}

const bf16_t *cuda_tp_enter_backward(CudaModel *m, bf16_t *d_full, int N, int C) {
    if (!tp_on(m)) return d_full;
    if (!m->shape.sp) {
        TIMED(m, PROF_TP_COMM,
              device_all_reduce(tp_comm(m), d_full, (size_t)N * C, NCCL_DTYPE_BF16, false, m->ctx.stream));
        return d_full;
    }
    TIMED(m, PROF_TP_COMM, device_reduce_scatter_sum(tp_comm(m), d_full, m->d_normed_shard, shard(m, N, C),
                                                     NCCL_DTYPE_BF16, m->ctx.stream));
    return m->d_normed_shard;
}

void cuda_tp_row_parallel_residual(CudaModel *m, bf16_t *out, const bf16_t *residual, const bf16_t *inp, long w,
                                   int N, int IC, int C) {
    if (!tp_on(m)) { /* the residual add in the product's epilogue */
        cuda_linear_forward(m, out, C, inp, w, -1, residual, N, IC, C);
        return;
    }
    bf16_t *partial = m->shape.sp ? m->tp_rows : out;
    cuda_linear_forward(m, partial, C, inp, w, -1, NULL, N, IC, C);
    cuda_tp_sum_partial_residual(m, out, residual, partial, N, C);
}

void cuda_tp_sum_partial_residual(CudaModel *m, bf16_t *out, const bf16_t *residual, bf16_t *partial, int N, int C) {
    cudaStream_t st = m->ctx.stream;
    if (!m->shape.sp) { /* the partials summed, then the residual added: it is rounded once, not at every hop */
        TIMED(m, PROF_TP_COMM, device_all_reduce(tp_comm(m), partial, (size_t)N * C, NCCL_DTYPE_BF16, false, st));
        TIMED(m, PROF_NORM, CUDA_CHECK(cuda_add_bf16(out, partial, residual, (size_t)N * C, st)));
        return;
    }
    TIMED(m, PROF_TP_COMM, device_reduce_scatter_sum(tp_comm(m), partial, out, shard(m, N, C), NCCL_DTYPE_BF16, st));
    TIMED(m, PROF_NORM, CUDA_CHECK(cuda_add_bf16(out, out, residual, shard(m, N, C), st)));
}

const bf16_t *cuda_tp_leave_backward(CudaModel *m, int N, int C) {
    if (!m->shape.sp) return m->d_resid16;
    TIMED(m, PROF_TP_COMM,
          device_all_gather(tp_comm(m), m->d_resid16, m->d_full16, shard(m, N, C), NCCL_DTYPE_BF16, m->ctx.stream));
    return m->d_full16;
}

void cuda_tp_embedding_forward(CudaModel *m, bf16_t *resid, int N, int C) {
    cudaStream_t st = m->ctx.stream;
    if (!tp_on(m)) {
        TIMED(m, PROF_EMBED, CUDA_CHECK(cuda_embedding_forward(resid, m->inputs, w16(m, m->embed), N, C, st)));
        return;
    }
    /* this rank's vocabulary rows, zeros elsewhere: the tp sum adds exactly one non-zero row */
    bf16_t *rows = m->shape.sp ? m->tp_rows : resid;
    TIMED(m, PROF_EMBED, CUDA_CHECK(cuda_embedding_forward_rows(rows, m->inputs, w16(m, m->embed),
                                                                m->shape.vocab_start, m->shape.V, N, C, st)));
    if (m->shape.sp)
        TIMED(m, PROF_TP_COMM, device_reduce_scatter_sum(tp_comm(m), rows, resid, shard(m, N, C), NCCL_DTYPE_BF16, st));
    else
        TIMED(m, PROF_TP_COMM, device_all_reduce(tp_comm(m), resid, (size_t)N * C, NCCL_DTYPE_BF16, false, st));
}

void cuda_tp_embedding_backward(CudaModel *m, int N, int C) {
    cudaStream_t st = m->ctx.stream;
    const float *d = m->d_resid;
    if (m->shape.sp) {
        TIMED(m, PROF_TP_COMM,
              device_all_gather(tp_comm(m), m->d_resid, m->d_full32, shard(m, N, C), NCCL_DTYPE_FLOAT, st));
        d = m->d_full32;
    }
    TIMED(m, PROF_EMBED, CUDA_CHECK(cuda_embedding_backward_rows(g32(m, m->embed), d, m->inputs,
                                                                 tp_on(m) ? m->shape.vocab_start : 0,
                                                                 tp_on(m) ? m->shape.V : INT_MAX, N, C, st)));
}

void cuda_tp_cross_entropy_forward(CudaModel *m, int N) {
    cudaStream_t st = m->ctx.stream;
    const int V = m->shape.V;
    if (!tp_on(m)) {
        TIMED(m, PROF_LOSS,
              CUDA_CHECK(cuda_cross_entropy_forward(m->losses, m->ce_lse, m->logits, m->targets, N, V, st)));
        return;
    }
    TIMED(m, PROF_LOSS, CUDA_CHECK(cuda_cross_entropy_stats(m->ce_stats, m->logits, m->targets, m->shape.vocab_start, N,
                                                            V, st)));
    TIMED(m, PROF_TP_COMM,
          device_all_gather(tp_comm(m), m->ce_stats, m->ce_gathered, (size_t)N * 3, NCCL_DTYPE_FLOAT, st));
    TIMED(m, PROF_LOSS, CUDA_CHECK(cuda_cross_entropy_combine(m->losses, m->ce_lse, m->ce_gathered, m->targets, N,
                                                              m->shape.tp, st)));
}

static DeviceComm *cp_comm(CudaModel *m) {
    if (!m->cp_comm)
        mt_die(MT_EXIT_FAILURE, "CUDA model: context parallel %d needs its communicator (cuda_model_set_cp_comm)",
               m->shape.cp);
    return m->cp_comm;
}

/* grads[begin, end) summed over cp (each cp rank holds its tokens' share). */
static void cp_sum_grads(CudaModel *m, long begin, long end) {
    if (end > begin)
        TIMED(m, PROF_TP_COMM, device_all_reduce(cp_comm(m), m->grads + begin, (size_t)(end - begin),
                                                 NCCL_DTYPE_FLOAT, false, m->ctx.stream));
}

void cuda_parallel_reduce_grads(CudaModel *m, int layer) {
    for (int i = 0; i < m->num_tp_partial; i++) {
        const TpPartialGrad *p = &m->tp_partial[i];
        if (p->layer == layer)
            TIMED(m, PROF_TP_COMM, device_all_reduce(tp_comm(m), m->grads + p->offset, (size_t)p->numel,
                                                     NCCL_DTYPE_FLOAT, p->average, m->ctx.stream));
    }
    if (m->shape.cp == 1) return;
    const int L = m->shape.L;
    if (layer >= 0) {
        cp_sum_grads(m, m->layer_begin[layer], m->layer_end[layer]);
    } else { /* the embedding before the layers, the final norm and lm_head after */
        cp_sum_grads(m, 0, m->layer_begin[0]);
        cp_sum_grads(m, m->layer_end[L - 1], m->num_floats);
    }
}

/* ---- context parallel: keys and values all-gathered (Megatron's all-gather variant, not ring attention) ---- */

/* all (B, Tall, KVD) in sequence order from every cp rank's local (B, T, KVD). */
static void gather_sequence(CudaModel *m, bf16_t *all, const bf16_t *local, int B, int T, int KVD) {
    TIMED(m, PROF_TP_COMM, device_all_gather(cp_comm(m), local, m->kv_blocks, (size_t)B * T * KVD, NCCL_DTYPE_BF16,
                                             m->ctx.stream));
    TIMED(m, PROF_ATTN_FWD, CUDA_CHECK(cuda_cp_to_sequence(all, m->kv_blocks, m->seq_pos, m->shape.cp, B, T, KVD,
                                                           m->ctx.stream)));
}

/* d_local (bf16, B x T x KVD) = the cp sum of d_all (fp32, B x Tall x KVD) at this rank's positions. */
static void scatter_sequence_grad(CudaModel *m, bf16_t *d_local, const float *d_all, int B, int T, int KVD) {
    const size_t n = (size_t)B * T * KVD;
    TIMED(m, PROF_ATTN_BWD, CUDA_CHECK(cuda_cp_from_sequence(m->dkv_blocks, d_all, m->seq_pos, m->shape.cp, B, T, KVD,
                                                             m->ctx.stream)));
    TIMED(m, PROF_TP_COMM, device_reduce_scatter_sum(cp_comm(m), m->dkv_blocks, m->dkv_mine, n, NCCL_DTYPE_FLOAT,
                                                     m->ctx.stream));
    CUDA_CHECK(cuda_cast_fp32_to_bf16(d_local, m->dkv_mine, n, m->ctx.stream));
}

void cuda_cp_attention_forward(CudaModel *m, LayerSaved *s, int B, int T, bool gather_kv) {
    const int H = m->shape.H, KVH = m->shape.KVH, D = m->shape.D, cp = m->shape.cp;
    cudaStream_t st = m->ctx.stream;
    if (cp == 1) {
        TIMED(m, PROF_ATTN_FWD,
              CUDA_CHECK(cuda_attention_forward(s->attn_out, s->lse, s->q, s->k, s->v, B, T, H, KVH, D, st)));
        return;
    }
    if (gather_kv) {
        gather_sequence(m, s->k_all, s->k, B, T, KVH * D);
        gather_sequence(m, s->v_all, s->v, B, T, KVH * D);
    }
    TIMED(m, PROF_ATTN_FWD, CUDA_CHECK(cuda_attention_forward_at(s->attn_out, s->lse, s->q, s->k_all, s->v_all,
                                                                 m->positions, B, T, T * cp, H, KVH, D, st)));
}

void cuda_cp_attention_backward(CudaModel *m, const LayerSaved *s, int B, int T) {
    const int H = m->shape.H, KVH = m->shape.KVH, D = m->shape.D, Tall = T * m->shape.cp;
    cudaStream_t st = m->ctx.stream;
    if (m->shape.cp == 1) {
        TIMED(m, PROF_ATTN_BWD,
              CUDA_CHECK(cuda_attention_backward(m->dq, m->dk, m->dv, m->d_attn_out, s->attn_out, s->lse, s->q, s->k,
                                                 s->v, B, T, H, KVH, D, m->attn_workspace, st)));
        return;
    }
    TIMED(m, PROF_ATTN_BWD, CUDA_CHECK(cuda_attention_backward_at(m->dq, m->dk_all, m->dv_all, m->d_attn_out,
                                                                  s->attn_out, s->lse, s->q, s->k_all, s->v_all,
                                                                  m->positions, B, T, Tall, H, KVH, D,
                                                                  m->attn_workspace, st)));
    scatter_sequence_grad(m, m->dk, m->dk_all, B, T, KVH * D);
    scatter_sequence_grad(m, m->dv, m->dv_all, B, T, KVH * D);
}
