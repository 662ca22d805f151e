/* cuda_model_parallel.c: tensor and sequence parallel inside the CUDA model
 * (Megatron's layout, as src/model/model_parallel.c on the CPU): q/k/v and
 * gate/up are column-parallel, o_proj and down_proj row-parallel, their
 * outputs partial sums over the tp group. Without sequence parallel the
 * residual stream is whole on every rank: entering the parallel region is
 * the identity (backward: an all-reduce), leaving it an all-reduce. Under
 * sequence parallel the residual stream holds R = N/tp rows of each rank:
 * entering is an all-gather (backward: reduce-scatter), leaving a
 * reduce-scatter (backward: all-gather). Activations travel in bf16 (as
 * Megatron's); the fp32 residual gradient only for the embedding's backward.
 * The embedding and the cross entropy are vocab-parallel: the full logits
 * are never gathered. */
#include <limits.h>

#include "cuda_model_internal.h"

static bool tp_on(const CudaModel *m) { return m->tp > 1; }

static DeviceComm *tp_comm(CudaModel *m) {
    if (!m->tp_comm)
        mt_die(MT_EXIT_FAILURE, "CUDA model: tensor parallel %d needs its communicator (cuda_model_set_tp_comm)",
               m->tp);
    return m->tp_comm;
}

const bf16_t *cuda_tp_enter(CudaModel *m, bf16_t *full, const bf16_t *x, int N, int C) {
    if (!tp_on(m) || !m->sp) return x;
    const size_t shard = (size_t)cuda_residual_rows(m, N) * C;
    TIMED(m, PROF_TP_COMM, device_all_gather(tp_comm(m), x, full, shard, NCCL_DTYPE_BF16, m->ctx.stream));
    return full;
}

const bf16_t *cuda_tp_enter_backward(CudaModel *m, bf16_t *d_full, int N, int C) {
    if (!tp_on(m)) return d_full;
    if (!m->sp) {
        TIMED(m, PROF_TP_COMM,
              device_all_reduce(tp_comm(m), d_full, (size_t)N * C, NCCL_DTYPE_BF16, false, m->ctx.stream));
        return d_full;
    }
    const size_t shard = (size_t)cuda_residual_rows(m, N) * C;
    TIMED(m, PROF_TP_COMM,
          device_reduce_scatter_sum(tp_comm(m), d_full, m->d_normed_shard, shard, NCCL_DTYPE_BF16, m->ctx.stream));
    return m->d_normed_shard;
}

void cuda_tp_row_parallel_residual(CudaModel *m, bf16_t *out, const bf16_t *residual, const bf16_t *inp, long w,
                                   int N, int IC, int C) {
    if (!tp_on(m)) { /* the residual add in the product's epilogue */
        cuda_linear_forward(m, out, C, inp, w, -1, residual, N, IC, C);
        return;
    }
    cudaStream_t st = m->ctx.stream;
    if (!m->sp) { /* the partials summed, then the residual added: it is rounded once, not at every hop */
        cuda_linear_forward(m, out, C, inp, w, -1, NULL, N, IC, C);
        TIMED(m, PROF_TP_COMM, device_all_reduce(tp_comm(m), out, (size_t)N * C, NCCL_DTYPE_BF16, false, st));
        TIMED(m, PROF_NORM, CUDA_CHECK(cuda_add_bf16(out, out, residual, (size_t)N * C, st)));
        return;
    }
    const size_t shard = (size_t)cuda_residual_rows(m, N) * C;
    cuda_linear_forward(m, m->tp_rows, C, inp, w, -1, NULL, N, IC, C);
    TIMED(m, PROF_TP_COMM, device_reduce_scatter_sum(tp_comm(m), m->tp_rows, out, shard, NCCL_DTYPE_BF16, st));
    TIMED(m, PROF_NORM, CUDA_CHECK(cuda_add_bf16(out, out, residual, shard, st)));
}

const bf16_t *cuda_tp_leave_backward(CudaModel *m, int N, int C) {
    if (!tp_on(m) || !m->sp) return m->d_resid16;
    const size_t shard = (size_t)cuda_residual_rows(m, N) * C;
    TIMED(m, PROF_TP_COMM,
          device_all_gather(tp_comm(m), m->d_resid16, m->d_full16, shard, NCCL_DTYPE_BF16, m->ctx.stream));
    return m->d_full16;
}

void cuda_tp_embedding_forward(CudaModel *m, bf16_t *resid, int N, int C) {
    cudaStream_t st = m->ctx.stream;
    if (!tp_on(m)) {
        TIMED(m, PROF_EMBED, CUDA_CHECK(cuda_embedding_forward(resid, m->inputs, w16(m, m->embed), N, C, st)));
        return;
    }
    /* this rank's vocabulary rows, zeros elsewhere: the tp sum adds exactly one non-zero row */
    bf16_t *rows = m->sp ? m->tp_rows : resid;
    TIMED(m, PROF_EMBED, CUDA_CHECK(cuda_embedding_forward_rows(rows, m->inputs, w16(m, m->embed), m->vocab_start,
                                                                m->V, N, C, st)));
    if (m->sp)
        TIMED(m, PROF_TP_COMM, device_reduce_scatter_sum(tp_comm(m), rows, resid,
                                                         (size_t)cuda_residual_rows(m, N) * C, NCCL_DTYPE_BF16, st));
    else
        TIMED(m, PROF_TP_COMM, device_all_reduce(tp_comm(m), resid, (size_t)N * C, NCCL_DTYPE_BF16, false, st));
}

void cuda_tp_embedding_backward(CudaModel *m, int N, int C) {
    cudaStream_t st = m->ctx.stream;
    const float *d = m->d_resid;
    if (tp_on(m) && m->sp) {
        TIMED(m, PROF_TP_COMM, device_all_gather(tp_comm(m), m->d_resid, m->d_full32,
                                                 (size_t)cuda_residual_rows(m, N) * C, NCCL_DTYPE_FLOAT, st));
        d = m->d_full32;
    }
    TIMED(m, PROF_EMBED, CUDA_CHECK(cuda_embedding_backward_rows(g32(m, m->embed), d, m->inputs,
                                                                 tp_on(m) ? m->vocab_start : 0,
                                                                 tp_on(m) ? m->V : INT_MAX, N, C, st)));
}

void cuda_tp_cross_entropy_forward(CudaModel *m, int N) {
    cudaStream_t st = m->ctx.stream;
    if (!tp_on(m)) {
        TIMED(m, PROF_LOSS,
              CUDA_CHECK(cuda_cross_entropy_forward(m->losses, m->ce_lse, m->logits, m->targets, N, m->V, st)));
        return;
    }
    TIMED(m, PROF_LOSS, CUDA_CHECK(cuda_cross_entropy_stats(m->ce_stats, m->logits, m->targets, m->vocab_start, N,
                                                            m->V, st)));
    TIMED(m, PROF_TP_COMM,
          device_all_gather(tp_comm(m), m->ce_stats, m->ce_gathered, (size_t)N * 3, NCCL_DTYPE_FLOAT, st));
    TIMED(m, PROF_LOSS, CUDA_CHECK(cuda_cross_entropy_combine(m->losses, m->ce_lse, m->ce_gathered, m->targets, N,
                                                              m->tp, st)));
}

void cuda_tp_sum_partial_grads(CudaModel *m, int layer) {
    for (int i = 0; i < m->num_tp_partial; i++) {
        const TpPartialGrad *p = &m->tp_partial[i];
        if (p->layer == layer)
            TIMED(m, PROF_TP_COMM, device_all_reduce(tp_comm(m), m->grads + p->offset, (size_t)p->numel,
                                                     NCCL_DTYPE_FLOAT, p->average, m->ctx.stream));
    }
}
