/* cuda_gemm.h: the matrix products of the CUDA backend, through cuBLASLt,
 * stated row-major the way the model reads them (as backend.h's matmul):
 * bf16 inputs, fp32 accumulation, bf16 or fp32 output. Each call picks its
 * algorithm once per shape (cuBLASLt's heuristic, cached) and enqueues on
 * the context's stream. Leading dimensions (ld*) are row strides in elements,
 * so a product can read or write a column slice of a wider matrix. */
#ifndef MT_BACKEND_CUDA_GEMM_H
#define MT_BACKEND_CUDA_GEMM_H

#include <stdint.h>

#include "cuda_context.h"

/* out[N,OC] (bf16, row stride ldo) = inp[N,IC] @ weight[OC,IC]^T
 *   (+ bias[OC] when bias != NULL) (+ residual[N,OC] (row stride ldo) when residual != NULL).
 * out may equal residual. */
void cuda_gemm_forward(CudaContext *ctx, uint16_t *out, int ldo, const uint16_t *inp, const uint16_t *weight,
                       const uint16_t *bias, const uint16_t *residual, int N, int IC, int OC);

/* dinp[N,IC] (bf16) = dout[N,OC] (row stride ld_dout) @ weight[OC,IC], or += when accumulate. */
void cuda_gemm_backward_input(CudaContext *ctx, uint16_t *dinp, const uint16_t *dout, int ld_dout,
                              const uint16_t *weight, int N, int IC, int OC, int accumulate);

/* dweight[OC,IC] (fp32) += dout[N,OC]^T (row stride ld_dout) @ inp[N,IC]. */
void cuda_gemm_backward_weight(CudaContext *ctx, float *dweight, const uint16_t *dout, int ld_dout,
                               const uint16_t *inp, int N, int IC, int OC);

/* The same three products for a row count N that changes every call (each
 * expert's rows: cuBLAS picks the algorithm per call, nothing is cached);
 * inp has row stride ld_inp. */
void cuda_gemm_rows_forward(CudaContext *ctx, uint16_t *out, int ldo, const uint16_t *inp, int ld_inp,
                            const uint16_t *weight, int N, int IC, int OC);
void cuda_gemm_rows_backward_input(CudaContext *ctx, uint16_t *dinp, const uint16_t *dout, int ld_dout,
                                   const uint16_t *weight, int N, int IC, int OC, int accumulate);
void cuda_gemm_rows_backward_weight(CudaContext *ctx, float *dweight, const uint16_t *dout, int ld_dout,
                                    const uint16_t *inp, int ld_inp, int N, int IC, int OC);
/* fp32 throughout (the MoE router: fp32 inputs, weights and logits; no TF32):
 * out[N,OC] = inp[N,IC] @ weight[OC,IC]^T; dinp[N,IC] = dout @ weight; dweight += dout^T @ inp. */
void cuda_sgemm_forward(CudaContext *ctx, float *out, const float *inp, const float *weight, int N, int IC, int OC);
void cuda_sgemm_backward(CudaContext *ctx, float *dinp, float *dweight, const float *dout, const float *inp,
                         const float *weight, int N, int IC, int OC);
/* Drop the cached algorithms (cuda_context_destroy's companion). */
void cuda_gemm_cache_clear(void);

#endif
