/* cuda_kernels.h: the plain C launchers of the CUDA kernels (the .cu files in kernels/).
 *
 * Host code (C11) calls these; nvcc compiles the kernels as C++ and exports
 * exactly these symbols with C linkage, so no C++ reaches src/. Every
 * pointer is a device pointer; every launcher enqueues on `stream` and
 * returns the launch status (cudaGetLastError), not the kernel's completion.
 * bf16 values travel as their 16 raw bits (uint16_t) so this header needs
 * no C++ type.
 *
 * Semantics match the CPU reference (backend/backend.h, train/optimizer.c):
 * row-major (N, C) tensors, backward ops ACCUMULATE (+=) into gradients.
 */
#ifndef MT_BACKEND_CUDA_KERNELS_H
#define MT_BACKEND_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- kernels/adamw.cu -------------------------------------------------- */

/* Hyper-parameters of one AdamW update (decoupled weight decay, as
 * train/optimizer.c and torch.optim.AdamW):
 *   p *= 1 - lr * weight_decay
 *   m  = beta1 * m + (1 - beta1) * g          with g = grad * grad_scale
 *   v  = beta2 * v + (1 - beta2) * g^2
 *   p -= lr * (m / bias_correction1) / (sqrt(v / bias_correction2) + eps)
 * bias_correction{1,2} = 1 - beta{1,2}^step are computed on the host (in
 * double) so every element uses the same rounded value. */
typedef struct CudaAdamWArgs {
    float lr;
    float beta1, beta2;
    float eps;
    float weight_decay;      /* 0 for norms and biases */
    float grad_scale;        /* clipping coefficient min(1, clip / norm), or 1 */
    float bias_correction1;  /* 1 - beta1^step, step >= 1 */
    float bias_correction2;  /* 1 - beta2^step */
} CudaAdamWArgs;

/* A run of floats [offset, offset + length) inside one parameter; decay says
 * whether weight decay applies (0 for norms and biases); its moments are
 * exp_avg[state, state + length) (state == offset, unless the moments are
 * a shard: the distributed optimizer's, which hold this rank's parts of the
 * flat array one after another). */
typedef struct CudaAdamWChunk {
    size_t offset;
    unsigned int length;     /* at most MT_ADAMW_CHUNK */
    int decay;
    size_t state;
} CudaAdamWChunk;
#define MT_ADAMW_CHUNK 65536

/* One fused AdamW update of every chunk of `chunks` (a device array), one
 * launch: params (fp32 master, laid out as the flat array, or with
 * params_sharded as the moments: the distributed optimizer's shard) and
 * grads are fp32; exp_avg (m) and
 * exp_avg_sq (v) are fp32, or bf16 bits when bf16_states is not 0
 * (optimizer.state_dtype: bf16: read widened, the update in fp32 with the
 * unrounded new moments, then stored rounded to nearest-even). When
 * params_bf16 is not NULL it receives the updated params rounded to bf16
 * (nearest-even), the copy the bf16 forward reads (at the flat index). Grads are read, never
 * written. args->weight_decay applies to chunks with decay set. */
cudaError_t cuda_adamw_step_chunks(float *params, int params_sharded, const float *grads, void *exp_avg,
                                   void *exp_avg_sq, int bf16_states, uint16_t *params_bf16,
                                   const CudaAdamWChunk *chunks, int num_chunks, const CudaAdamWArgs *args,
                                   cudaStream_t stream);

/* bias_correction{1,2} for update number `step` (1-based) into args. */
void cuda_adamw_set_step(CudaAdamWArgs *args, long step);

/* ---- kernels/rmsnorm.cu ------------------------------------------------ */

/* out[n,:] = bf16(inp[n,:] * rstd[n] * weight); rstd[n] = 1/sqrt(mean(inp[n,:]^2) + eps), saved (fp32). */
cudaError_t cuda_rmsnorm_forward(uint16_t *out, float *rstd, const uint16_t *inp, const uint16_t *weight, int N, int C,
                                 float eps, cudaStream_t stream);

/* dinp (fp32) += d/dinp and, when dinp_bf16 != NULL, dinp_bf16 = bf16(dinp)
 * (the residual gradient mirrored for the next matrix product);
 * dweight (fp32) += sum over rows of dout * inp * rstd. */
cudaError_t cuda_rmsnorm_backward(float *dinp, uint16_t *dinp_bf16, float *dweight, const uint16_t *dout,
                                  const uint16_t *inp, const uint16_t *weight, const float *rstd, int N, int C,
                                  cudaStream_t stream);

/* ---- kernels/embedding.cu ---------------------------------------------- */

/* out[n,:] = table[tokens[n], :] (bf16). */
cudaError_t cuda_embedding_forward(uint16_t *out, const int32_t *tokens, const uint16_t *table, int N, int C,
                                   cudaStream_t stream);
/* dtable[tokens[n], :] += dout[n, :] (fp32, atomic). */
cudaError_t cuda_embedding_backward(float *dtable, const float *dout, const int32_t *tokens, int N, int C,
                                    cudaStream_t stream);

/* The same for one tensor-parallel rank's rows [vocab_start, vocab_start +
 * rows) of the table: other tokens give zero rows forward (the tp sum adds
 * the owner's) and add nothing backward. */
cudaError_t cuda_embedding_forward_rows(uint16_t *out, const int32_t *tokens, const uint16_t *table, int vocab_start,
                                        int rows, int N, int C, cudaStream_t stream);
cudaError_t cuda_embedding_backward_rows(float *dtable, const float *dout, const int32_t *tokens, int vocab_start,
                                         int rows, int N, int C, cudaStream_t stream);

/* ---- kernels/qkv_rope.cu ----------------------------------------------- */

/* qkv (N, H*D + 2*KVH*D): q heads | k heads | v heads of each token (position
 * n % T). q (N,H,D) and k (N,KVH,D) get the optional per-head RMSNorm
 * (q_norm/k_norm weights, both NULL or both set; rstd saved in q_rstd (N*H)
 * and k_rstd (N*KVH)) and then RoPE with cos/sin (T, D/2); v (N,KVH,D) is
 * copied. D even, at most 128. */
cudaError_t cuda_qkv_rope_forward(uint16_t *q, uint16_t *k, uint16_t *v, float *q_rstd, float *k_rstd,
                                  const uint16_t *qkv, const uint16_t *q_norm, const uint16_t *k_norm,
                                  const float *cos_table, const float *sin_table, int N, int T, int H, int KVH, int D,
                                  float eps, cudaStream_t stream);
/* The backward: d_qkv (N, H*D + 2*KVH*D) is OVERWRITTEN from dq, dk, dv;
 * with qk-norm, d_q_norm and d_k_norm (fp32, D) accumulate. */
cudaError_t cuda_qkv_rope_backward(uint16_t *d_qkv, float *d_q_norm, float *d_k_norm, const uint16_t *dq,
                                   const uint16_t *dk, const uint16_t *dv, const uint16_t *qkv, const uint16_t *q_norm,
                                   const uint16_t *k_norm, const float *q_rstd, const float *k_rstd,
                                   const float *cos_table, const float *sin_table, int N, int T, int H, int KVH, int D,
                                   cudaStream_t stream);

/* ---- kernels/swiglu.cu ------------------------------------------------- */

/* gate_up (N, 2I): gate in columns [0, I), up in [I, 2I).
 * act (N, I) = silu(gate) * up. */
cudaError_t cuda_swiglu_forward(uint16_t *act, const uint16_t *gate_up, int N, int I, cudaStream_t stream);
/* d_gate_up (N, 2I) OVERWRITTEN with the gradients of gate and up. */
cudaError_t cuda_swiglu_backward(uint16_t *d_gate_up, const uint16_t *d_act, const uint16_t *gate_up, int N, int I,
                                 cudaStream_t stream);

/* ---- kernels/cross_entropy.cu ------------------------------------------ */

/* losses[n] = lse[n] - logits[n, targets[n]], lse[n] = logsumexp(logits[n,:])
 * (both 0 where targets[n] < 0). logits are bf16 (N, V). */
cudaError_t cuda_cross_entropy_forward(float *losses, float *lse, const uint16_t *logits, const int32_t *targets,
                                       int N, int V, cudaStream_t stream);
/* In place: logits[n,:] = (softmax - onehot(targets[n])) * dloss, 0 on ignored rows. */
cudaError_t cuda_cross_entropy_backward(uint16_t *logits, const float *lse, const int32_t *targets, float dloss, int N,
                                        int V, cudaStream_t stream);

/* Vocab-parallel cross entropy (tensor parallel): logits (N, V) are this
 * rank's columns [vocab_start, vocab_start + V).
 * stats (N, 3): each row's max, sum of exp(logit - max) over these columns,
 * and the target's logit when this rank holds its column (else 0);
 * ignored rows give (-inf, 0, 0). */
cudaError_t cuda_cross_entropy_stats(float *stats, const uint16_t *logits, const int32_t *targets, int vocab_start,
                                     int N, int V, cudaStream_t stream);
/* gathered (ranks, N, 3): every rank's stats in rank order; losses and lse
 * as cuda_cross_entropy_forward gives for the whole vocabulary (merged in
 * rank order: the same bits on every rank). */
cudaError_t cuda_cross_entropy_combine(float *losses, float *lse, const float *gathered, const int32_t *targets,
                                       int N, int ranks, cudaStream_t stream);
/* cuda_cross_entropy_backward for the columns [vocab_start, vocab_start + V). */
cudaError_t cuda_cross_entropy_backward_columns(uint16_t *logits, const float *lse, const int32_t *targets,
                                                int vocab_start, float dloss, int N, int V, cudaStream_t stream);

/* ---- kernels/add.cu ---------------------------------------------------- */

/* out[i] = bf16(a[i] + b[i]) (fp32 sum); out may be a or b. */
cudaError_t cuda_add_bf16(uint16_t *out, const uint16_t *a, const uint16_t *b, size_t n, cudaStream_t stream);
/* x[i] *= scale (fp32, in place). */
cudaError_t cuda_scale_f32(float *x, float scale, size_t n, cudaStream_t stream);

/* ---- kernels/reduce.cu ------------------------------------------------- */

/* partial[b] = sum of x[i]^2 over the elements block b visits (num_partial
 * partials; fewer blocks run when fewer have elements, and the partials past
 * them are set to 0); the caller adds the partials (in double, in order). */
cudaError_t cuda_sum_squares(double *partial, int num_partial, const float *x, size_t n, cudaStream_t stream);
/* The same over the floats of chunks (a device array; their decay flags are
 * not read): the grad norm of the parameters a rank counts (tensor parallel
 * leaves out the copies another rank counts). */
cudaError_t cuda_sum_squares_chunks(double *partial, int num_partial, const float *x, const CudaAdamWChunk *chunks,
                                    int num_chunks, cudaStream_t stream);
/* out[c] += sum_n x[n * ld + c] for c < C (bf16 in, fp32 out; bias gradients). */
cudaError_t cuda_column_sum_accumulate(float *out, const uint16_t *x, int N, int C, int ld, cudaStream_t stream);

/* ---- kernels/cast.cu --------------------------------------------------- */

/* out[i] = bf16(inp[i]), round to nearest even (NaN stays NaN). */
cudaError_t cuda_cast_fp32_to_bf16(uint16_t *out, const float *inp, size_t n, cudaStream_t stream);
/* out[i] = float(inp[i]) (exact). */
cudaError_t cuda_cast_bf16_to_fp32(float *out, const uint16_t *inp, size_t n, cudaStream_t stream);


/* ---- kernels/moe.cu: the mixture-of-experts steps (src/model/moe_layer.c's) ----
 * A = N*k assignments (token n's j-th expert: assignment n*k + j); rows: the
 * assignments sorted expert by expert, ascending within an expert (the order
 * the expert products read); position[i] is assignment i's row (-1: dropped). */

/* Assignments a tile of cuda_moe_sort counts (its tile_hist holds ceil(A / MT_MOE_TILE) x E ints). */
#define MT_MOE_TILE 256

/* Per token (logits (N, E) fp32): scores (softmax, or sigmoid when sigmoid), lse[n] (logsumexp of the logits: the
 * z-loss), score_sum[n] (the sum of the scores), the k best experts by score + bias (bias NULL: none; ties to the
 * lower index) into selected (N, k), their scores into raw and the combine weights (raw / the k raws' sum when
 * renorm, else raw). E <= 1024. */
cudaError_t cuda_moe_route(const float *logits, const float *bias, float *scores, float *lse, float *score_sum,
                           int32_t *selected, float *raw, float *weight, int N, int E, int k, int sigmoid,
                           int renorm, cudaStream_t stream);
/* The stable counting sort of the A assignments (those with keep[i] != 0; keep NULL: all) into rows: offsets
 * (E + 1) each expert's first row, position (A), token (rows: its token) and row_slot (rows: its assignment).
 * tile_hist: scratch of ceil(A / MT_MOE_TILE) x E ints. */
cudaError_t cuda_moe_sort(const int32_t *selected, const uint8_t *keep, int32_t *tile_hist, int32_t *offsets,
                          int32_t *position, int32_t *token, int32_t *row_slot, int A, int k, int E,
                          cudaStream_t stream);
/* Capacity, from a sort that kept every assignment: keep[i] = whether assignment i is among its expert's
 * `capacity` highest raw scores (ties to the earlier assignment); dropped ones get weight 0. */
cudaError_t cuda_moe_capacity(const float *raw, const int32_t *row_slot, const int32_t *offsets, uint8_t *keep,
                              float *weight, int E, long capacity, cudaStream_t stream);
/* rows[r, :] = x[token[r], :] for r < R (bf16; C % 8 == 0). */
cudaError_t cuda_moe_gather(uint16_t *rows, const uint16_t *x, const int32_t *token, int R, int C,
                            cudaStream_t stream);
/* out[n] = bf16(resid[n] (+ shared[n]) + sum_j weight[n,j] * y[position[n,j]]), fp32 sums; resid or shared NULL:
 * none. */
cudaError_t cuda_moe_combine(uint16_t *out, const uint16_t *resid, const uint16_t *shared, const uint16_t *y,
                             const int32_t *position, const float *weight, int N, int k, int C, cudaStream_t stream);
/* Its backward for the A assignments: d_rows[position[i]] = weight[i] * dy[i / k] (bf16), d_w[i] = dy[i / k] .
 * y[position[i]] (fp32; 0 when dropped). */
cudaError_t cuda_moe_combine_backward(uint16_t *d_rows, float *d_w, const uint16_t *dy, const uint16_t *y,
                                      const int32_t *position, const float *weight, int A, int k, int C,
                                      cudaStream_t stream);
/* dx[n] = bf16(dx[n] (+ extra[n], fp32, NULL: none) + sum_j d_rows[position[n,j]]). */
cudaError_t cuda_moe_scatter(uint16_t *dx, const uint16_t *d_rows, const int32_t *position, const float *extra,
                             int N, int k, int C, cudaStream_t stream);
/* d_logits (N, E, overwritten) from d_w (the combine weights' gradients) through the renormalisation (renorm) and
 * the scores, plus the load-balancing loss (aux_coef (N / aux_span, E): d loss / d p[n, e] = aux_mult *
 * aux_coef[n / aux_span, e], p the scores, normalised per token for sigmoid; NULL: none) and the z-loss
 * (d / d lse[n] = z_mult * lse[n]; z_mult 0: none). */
cudaError_t cuda_moe_router_backward(float *d_logits, const float *d_w, const float *logits, const float *scores,
                                     const float *score_sum, const float *lse, const int32_t *selected,
                                     const float *raw, const float *weight, const float *aux_coef, int aux_span,
                                     float aux_mult, float z_mult, int N, int E, int k, int sigmoid, int renorm,
                                     cudaStream_t stream);
/* Per group of span tokens (N / span groups): counts (groups, E) of assignments per expert and, with want_psum,
 * psum (groups, E) the sums of p[n, e] (the scores; divided by their token's score_sum when sigmoid), in token
 * order, in double. */
cudaError_t cuda_moe_balance_stats(int32_t *counts, double *psum, const int32_t *selected, const float *scores,
                                   const float *score_sum, int N, int E, int k, int span, int want_psum, int sigmoid,
                                   cudaStream_t stream);

/* ---- kernels/moe_gemm.cu: grouped expert products (cuda_gemm.h's cuda_grouped_*, MEGATRAIN_MOE_GEMM=kernel) ----
 * Rows grouped by expert: group e's rows are offsets[e] .. offsets[e+1] (offsets: DEVICE, groups + 1 entries), of
 * row-major activations. Group e's weight is [W0_e; W1_e] ((OC0 + OC1) x IC, bf16): W0_e = w0 + e * OC0 * IC and
 * W1_e = w1 + e * OC1 * IC (two stacks, each contiguous over the groups; w1 NULL: one stack, OC1 ignored); the
 * fp32 gradient stacks g0, g1 the same. Each is one launch; max_rows >= offsets[groups] sizes the grid (blocks
 * past the last row tile return at once). Every dimension and leading dimension a multiple of 8 and every pointer
 * 16-byte aligned (cuda_gemm.c checks). */

/* out[rows of e, 0 : OC0 + OC1] (row stride ldo) = inp[rows of e, 0 : IC] (row stride ld_inp) @ [W0_e; W1_e]^T. */
cudaError_t cuda_moe_gemm_forward(uint16_t *out, int ldo, const uint16_t *inp, int ld_inp, const uint16_t *w0,
                                  const uint16_t *w1, const int32_t *offsets, int groups, int max_rows, int IC,
                                  int OC0, int OC1, cudaStream_t stream);
/* dinp[rows of e, 0 : IC] (row stride ld_dinp) = dout[rows of e, 0 : OC0 + OC1] (row stride ld_dout) @ [W0_e; W1_e]
 * (+ dinp when accumulate): the two stacks' products summed in fp32 and rounded once. */
cudaError_t cuda_moe_gemm_backward_input(uint16_t *dinp, int ld_dinp, const uint16_t *dout, int ld_dout,
                                         const uint16_t *w0, const uint16_t *w1, const int32_t *offsets, int groups,
                                         int max_rows, int IC, int OC0, int OC1, int accumulate,
                                         cudaStream_t stream);
/* [dW0_e; dW1_e] (fp32 stacks g0, g1) += dout[rows of e, 0 : OC0 + OC1]^T @ inp[rows of e, 0 : IC]; groups without
 * rows add nothing. */
cudaError_t cuda_moe_gemm_backward_weight(float *g0, float *g1, const uint16_t *dout, int ld_dout,
                                          const uint16_t *inp, int ld_inp, const int32_t *offsets, int groups, int IC,
                                          int OC0, int OC1, cudaStream_t stream);

/* ---- kernels/attention.cu ---------------------------------------------- */

/* Causal grouped-query attention in bf16 (fp32 softmax and accumulation),
 * flash-attention style: the T x T score matrix is never stored.
 *   q, out: (B, T, H, D); k, v: (B, T, KVH, D); query head h reads kv head
 *   h / (H / KVH); scale 1/sqrt(D). D is 16, 32, 64 or 128.
 * Forward writes out and lse (B, H, T): the natural-log logsumexp of each
 * query row's scaled, masked scores, which the backward reuses. */
cudaError_t cuda_attention_forward(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                                   const uint16_t *v, int B, int T, int H, int KVH, int D, cudaStream_t stream);

/* Bytes of fp32 scratch cuda_attention_backward needs for these shapes. */
size_t cuda_attention_workspace_bytes(int B, int T, int H, int KVH, int D);

/* Gradients of the forward above. dq, dk, dv are OVERWRITTEN (not
 * accumulated), in bf16. out and lse are the forward's. workspace holds
 * cuda_attention_workspace_bytes(...) bytes of device memory. */
cudaError_t cuda_attention_backward(uint16_t *dq, uint16_t *dk, uint16_t *dv, const uint16_t *dout,
                                    const uint16_t *out, const float *lse, const uint16_t *q, const uint16_t *k,
                                    const uint16_t *v, int B, int T, int H, int KVH, int D, void *workspace,
                                    cudaStream_t stream);

/* Queries at positions (context parallel, kernels/attention.cu too, the same
 * tiled tensor-core kernels): q (B, Tq, H, D), query row t at position
 * q_pos[t] (device, Tq int32, NON-DECREASING, each < Tk: a cp rank's two
 * chunks are) sees keys 0..q_pos[t] of k, v (B, Tk, KVH, D); out (B, Tq, H,
 * D), lse (B, H, Tq) as cuda_attention_forward; D 16, 32, 64 or 128. */
cudaError_t cuda_attention_forward_at(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                                      const uint16_t *v, const int32_t *q_pos, int B, int Tq, int Tk, int H, int KVH,
                                      int D, cudaStream_t stream);
/* Its gradients: dq (bf16, B x Tq x H x D) and dk, dv (fp32, B x Tk x KVH x
 * D, to be summed over the cp ranks) OVERWRITTEN; keys no query sees get 0.
 * workspace: cuda_attention_workspace_bytes(B, Tq, H, KVH, D) bytes. With
 * B or Tq 0 nothing is written (dk, dv included). */
cudaError_t cuda_attention_backward_at(uint16_t *dq, float *dk, float *dv, const uint16_t *dout, const uint16_t *out,
                                       const float *lse, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                       const int32_t *q_pos, int B, int Tq, int Tk, int H, int KVH, int D,
                                       void *workspace, cudaStream_t stream);

/* ---- kernels/cp_permute.cu --------------------------------------------- */

/* all (B, T * cp, W) in sequence order from blocks (cp, B, T, W): rank r's
 * row (b, t) goes to position seq_pos[r * T + t] (device, cp * T). bf16. */
cudaError_t cuda_cp_to_sequence(uint16_t *all, const uint16_t *blocks, const int32_t *seq_pos, int cp, int B, int T,
                                int W, cudaStream_t stream);
/* The way back, fp32 (gradients): blocks (cp, B, T, W) from all (B, T * cp, W). */
cudaError_t cuda_cp_from_sequence(float *blocks, const float *all, const int32_t *seq_pos, int cp, int B, int T, int W,
                                  cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
