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
/* ---- Grouped expert products (the MoE layer's experts; src/model/cuda/cuda_model_experts.c) ----
 * Rows grouped by expert: group e's rows are offsets[e] .. offsets[e+1] of row-major activations (offsets on the
 * host, d_offsets the same on the device; max_rows >= offsets[groups], a bound the kernel sizes its grid by).
 * Group e's weight is [W0_e; W1_e] ((OC0 + OC1) x IC, bf16): W0_e = w0 + e * OC0 * IC and W1_e = w1 + e * OC1 * IC
 * (two stacks contiguous over the groups, as gate and up; w1 NULL: one stack, OC1 0); its fp32 gradient the same
 * rows of the stacks g0, g1. Products, for every group with rows (none for a group without):
 *   forward:         out_e (n_e x OC0+OC1, row stride ldo) = inp_e (n_e x IC, row stride ld_inp) @ [W0_e; W1_e]^T
 *   backward input:  dinp_e (n_e x IC, row stride ld_dinp) = dout_e (row stride ld_dout) @ [W0_e; W1_e]
 *                    (+= when accumulate)
 *   backward weight: [dW0_e; dW1_e] (fp32) += dout_e^T @ inp_e
 * How (MEGATRAIN_MOE_GEMM, docs/moe.md):
 *   cublas          one cublasGemmEx per group and stack (host counts; 2 x groups calls for gate|up)
 *   cublas_grouped  cublasGemmGroupedBatchedEx: one call per product and stack set (the backward input two:
 *                   W0's product then W1's accumulated), its pointer arrays copied to the device first; the weight
 *                   gradient falls back to the loop if cuBLAS refuses bf16 inputs with fp32 output
 *   kernel          kernels/moe_gemm.cu: one launch per product reading d_offsets; shapes it does not take
 *                   (a dimension or leading dimension not a multiple of 8, a pointer not 16-byte aligned) use
 *                   the loop. */
typedef enum CudaMoeGemm { CUDA_MOE_GEMM_CUBLAS = 0, CUDA_MOE_GEMM_CUBLAS_GROUPED, CUDA_MOE_GEMM_KERNEL } CudaMoeGemm;
typedef struct CudaGroupedRows {
    int groups;
    const int32_t *offsets, *d_offsets;
    int max_rows;
} CudaGroupedRows;

/* The choice of MEGATRAIN_MOE_GEMM (cublas, cublas_grouped or kernel; unset or empty: cublas_grouped, the fastest
 * on an H200 for both MoE shapes of tests/bench, 2026-11-28: docs/moe.md), read once per process; another value
 * ends the program (usage error). */
CudaMoeGemm cuda_moe_gemm_choice(void);
/* Its name ("cublas", "cublas_grouped", "kernel"). */
const char *cuda_moe_gemm_name(CudaMoeGemm how);

void cuda_grouped_forward(CudaContext *ctx, CudaMoeGemm how, const CudaGroupedRows *g, uint16_t *out, int ldo,
                          const uint16_t *inp, int ld_inp, const uint16_t *w0, const uint16_t *w1, int IC, int OC0,
                          int OC1);
void cuda_grouped_backward_input(CudaContext *ctx, CudaMoeGemm how, const CudaGroupedRows *g, uint16_t *dinp,
                                 int ld_dinp, const uint16_t *dout, int ld_dout, const uint16_t *w0,
                                 const uint16_t *w1, int IC, int OC0, int OC1, int accumulate);
void cuda_grouped_backward_weight(CudaContext *ctx, CudaMoeGemm how, const CudaGroupedRows *g, float *g0, float *g1,
                                  const uint16_t *dout, int ld_dout, const uint16_t *inp, int ld_inp, int IC, int OC0,
                                  int OC1);
/* Whether cublas_grouped's weight gradients went through one grouped call (1), fell back to the loop because
 * cuBLAS refused fp32 output (0), or have not run yet (-1). */
int cuda_grouped_weight_fp32_state(void);

/* Drop the cached algorithms (cuda_context_destroy's companion). */
void cuda_gemm_cache_clear(void);

#endif
