/* backend.h: the table of operations every device implements.
 *
 * The CPU implementation (backend/cpu) is the reference and the only one:
 * the CPU model (src/model) calls it through this table. The CUDA model
 * (src/model/cuda) does not: it calls the kernels of src/backend/cuda
 * (cuda_kernels.h), several CPU ops fused into one where cuda_model.c says,
 * and each kernel is tested against the CPU op here (tests/gpu/test_cuda_ops.c).
 * Forward and backward are written by hand, op by op.
 *
 * Conventions (all tensors row-major, fp32 on the CPU):
 *   N = number of token rows (B*T), C = channels, V = vocab,
 *   B = batch, T = sequence, H = query heads, KVH = key/value heads, D = head dim.
 *   q is (B, T, H, D); k and v are (B, T, KVH, D); H % KVH == 0 and query head
 *   h reads kv head h / (H / KVH) (grouped-query attention).
 *   Every backward ACCUMULATES (+=) into every gradient it writes, activation
 *   gradients included, so residual branches and gradient accumulation over
 *   micro-batches need no extra copies. Callers zero buffers when needed.
 *   Inputs and outputs of a forward never alias unless the op says so.
 */
#ifndef MT_BACKEND_BACKEND_H
#define MT_BACKEND_BACKEND_H

#include <stdint.h>

typedef struct BackendOps {
    const char *name;

    /* out[N,C] = wte[tokens[n], :] */
    void (*embedding_forward)(float *out, const int32_t *tokens, const float *wte, int N, int C);
    /* dwte[tokens[n], :] += dout[n, :] */
    void (*embedding_backward)(float *dwte, const float *dout, const int32_t *tokens, int N, int C);

    /* out[n,:] = inp[n,:] * rstd[n] * weight; rstd[n] = 1/sqrt(mean(inp[n,:]^2) + eps) (saved) */
    void (*rmsnorm_forward)(float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                            float eps);
    /* dweight may be NULL (a frozen weight: no gradient wanted). */
    void (*rmsnorm_backward)(float *dinp, float *dweight, const float *dout, const float *inp,
                             const float *weight, const float *rstd, int N, int C);

    /* out[N,OC] = inp[N,IC] @ weight[OC,IC]^T (+ bias[OC] when bias != NULL); out is overwritten */
    void (*matmul_forward)(float *out, const float *inp, const float *weight, const float *bias, int N,
                           int IC, int OC);
    /* dinp += dout @ weight; dweight += dout^T @ inp; dbias += sum_n dout (when dbias != NULL).
     * dinp may be NULL (no input gradient wanted), dweight too (a frozen weight). */
    void (*matmul_backward)(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                            const float *weight, int N, int IC, int OC);

    /* LoRA's up-projection (src/model/model_lora.c), accumulating into a strided output:
     *   out[n, j] += scale * sum_r h[n, r] * B[j, r]      out (N, OC) with rows ld_out floats apart
     * h is (N, R) = inp @ A^T (a matmul_forward), B is (OC, R). Backward (dout strided like out):
     *   dh += scale * dout @ B;  dB += scale * dout^T @ h */
    void (*lora_up_forward)(float *out, int ld_out, const float *h, const float *B, float scale, int N, int R,
                            int OC);
    void (*lora_up_backward)(float *dh, float *dB, const float *dout, int ld_out, const float *h, const float *B,
                             float scale, int N, int R, int OC);

    /* Rotary embedding, Hugging Face "rotate_half" convention: for i < D/2,
     *   out[i]       = x[i] * cos[t,i] - x[i+D/2] * sin[t,i]
     *   out[i + D/2] = x[i+D/2] * cos[t,i] + x[i] * sin[t,i]
     * x is (B, T, NH, D); cos and sin are (T, D/2) (src/model/rope_tables.h). out may equal inp. */
    void (*rope_forward)(float *out, const float *inp, const float *cos, const float *sin, int B, int T,
                         int NH, int D);
    void (*rope_backward)(float *dinp, const float *dout, const float *cos, const float *sin, int B, int T,
                          int NH, int D);

    /* Causal grouped-query attention with softmax scale 1/sqrt(D).
     * probs (B, H, T, T) is saved for the backward (entries above the diagonal are 0). */
    void (*attention_forward)(float *out, float *probs, const float *q, const float *k, const float *v, int B,
                              int T, int H, int KVH, int D);
    void (*attention_backward)(float *dq, float *dk, float *dv, const float *dout, const float *probs,
                               const float *q, const float *k, const float *v, int B, int T, int H, int KVH,
                               int D);
    /* Causal attention of Tq queries at global positions q_pos[0..Tq) (any order, each in [0, Tk))
     * against Tk keys/values at positions 0..Tk-1: key u is visible to query t iff u <= q_pos[t].
     * q is (B, Tq, H, D), k and v are (B, Tk, KVH, D), out (B, Tq, H, D); probs (B, H, Tq, Tk) is saved
     * (0 for invisible keys). With Tq == Tk and q_pos[t] == t it is attention_forward, bit for bit. */
    void (*attention_forward_at)(float *out, float *probs, const float *q, const float *k, const float *v,
                                 const int32_t *q_pos, int B, int Tq, int Tk, int H, int KVH, int D);
    void (*attention_backward_at)(float *dq, float *dk, float *dv, const float *dout, const float *probs,
                                  const float *q, const float *k, const float *v, const int32_t *q_pos, int B,
                                  int Tq, int Tk, int H, int KVH, int D);
    /* Packed rows: causal attention restricted to each sample, of Tq queries at positions q_pos (NULL: 0..Tq-1,
     * then Tq == Tk; context parallel: this rank's positions, as attention_forward_at) against Tk keys.
     * doc_pos (B, Tk) is each position's place in its sample (0 where a sample starts, then +1 per position):
     * key u is visible to the query at position p of row b iff p - doc_pos[b,p] <= u <= p. No mask is built;
     * probs (B, H, Tq, Tk) is 0 outside the sample. A row of one sample (doc_pos[b,p] == p) is
     * attention_forward_at, bit for bit. */
    void (*attention_forward_doc)(float *out, float *probs, const float *q, const float *k, const float *v,
                                  const int32_t *q_pos, const int32_t *doc_pos, int B, int Tq, int Tk, int H, int KVH,
                                  int D);
    void (*attention_backward_doc)(float *dq, float *dk, float *dv, const float *dout, const float *probs,
                                   const float *q, const float *k, const float *v, const int32_t *q_pos,
                                   const int32_t *doc_pos, int B, int Tq, int Tk, int H, int KVH, int D);

    /* out[i] = silu(gate[i]) * up[i] over n elements */
    void (*swiglu_forward)(float *out, const float *gate, const float *up, long n);
    void (*swiglu_backward)(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                            long n);

    /* losses[n] = logsumexp(logits[n,:]) - logits[n, targets[n]]; 0 where targets[n] < 0 (ignored).
     * Returns the sum of losses over non-ignored rows. */
    double (*cross_entropy_forward)(float *losses, const float *logits, const int32_t *targets, int N, int V);
    /* dlogits[n,:] = (softmax(logits[n,:]) - onehot(targets[n])) * dloss, 0 for ignored rows.
     * Fused: dlogits MAY equal logits (computed in place, nothing else kept).
     * This op OVERWRITES dlogits (the one exception to accumulation). */
    void (*cross_entropy_backward)(float *dlogits, const float *logits, const int32_t *targets, float dloss,
                                   int N, int V);

    /* out[i] = a[i] + b[i] (out may equal a) */
    void (*add)(float *out, const float *a, const float *b, long n);
} BackendOps;

extern const BackendOps cpu_backend;

#endif
