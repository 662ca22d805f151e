/* cpu_ops.h: the CPU implementations of the BackendOps table (backend.h),
 * one family per cpu_*.c file; cpu_backend.c gathers them into cpu_backend.
 *
 * Determinism: no op uses atomics or unordered float reductions. Every sum
 * runs in a fixed order that does not depend on the OpenMP thread count, so
 * the non-BLAS ops give the same bits for any number of threads.
 */
#ifndef MT_BACKEND_CPU_CPU_OPS_H
#define MT_BACKEND_CPU_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

void cpu_embedding_forward(float *out, const int32_t *tokens, const float *wte, int N, int C);
void cpu_embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int N, int C);

void cpu_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C, float eps);
void cpu_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp, const float *weight,
                          const float *rstd, int N, int C);

void cpu_matmul_forward(float *out, const float *inp, const float *weight, const float *bias, int N, int IC, int OC);
void cpu_matmul_backward(float *dinp, float *dweight, float *dbias, const float *dout, const float *inp,
                         const float *weight, int N, int IC, int OC);

void cpu_lora_up_forward(float *out, int ld_out, const float *h, const float *B, float scale, int N, int R, int OC);
void cpu_lora_up_backward(float *dh, float *dB, const float *dout, int ld_out, const float *h, const float *B,
                          float scale, int N, int R, int OC);

void cpu_rope_forward(float *out, const float *inp, const float *cos, const float *sin, int B, int T, int NH, int D);
void cpu_rope_backward(float *dinp, const float *dout, const float *cos, const float *sin, int B, int T, int NH,
                       int D);

void cpu_attention_forward(float *out, float *probs, const float *q, const float *k, const float *v, int B, int T,
                           int H, int KVH, int D);
void cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *probs, const float *q,
                            const float *k, const float *v, int B, int T, int H, int KVH, int D);
/* q_pos == NULL means identity positions (then Tq must equal Tk): the plain ops above */
void cpu_attention_forward_at(float *out, float *probs, const float *q, const float *k, const float *v,
                              const int32_t *q_pos, int B, int Tq, int Tk, int H, int KVH, int D);
void cpu_attention_backward_at(float *dq, float *dk, float *dv, const float *dout, const float *probs,
                               const float *q, const float *k, const float *v, const int32_t *q_pos, int B, int Tq,
                               int Tk, int H, int KVH, int D);
void cpu_attention_forward_doc(float *out, float *probs, const float *q, const float *k, const float *v,
                               const int32_t *q_pos, const int32_t *doc_pos, int B, int Tq, int Tk, int H, int KVH,
                               int D);
void cpu_attention_backward_doc(float *dq, float *dk, float *dv, const float *dout, const float *probs,
                                const float *q, const float *k, const float *v, const int32_t *q_pos,
                                const int32_t *doc_pos, int B, int Tq, int Tk, int H, int KVH, int D);

void cpu_swiglu_forward(float *out, const float *gate, const float *up, long n);
void cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, long n);

double cpu_cross_entropy_forward(float *losses, const float *logits, const int32_t *targets, int N, int V);
void cpu_cross_entropy_backward(float *dlogits, const float *logits, const int32_t *targets, float dloss, int N,
                                int V);

void cpu_add(float *out, const float *a, const float *b, long n);

/* Width of the channel blocks that reductions over rows are split into
 * (each block is owned by one thread and summed over rows in row order). */
#define CPU_CHANNEL_BLOCK 64

#endif
