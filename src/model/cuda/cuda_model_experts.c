/* cuda_model_experts.c: the routed experts' products of one MoE layer on the
 * GPU (cuda_model_moe.c routes and permutes; this file computes): over rows
 * already grouped expert by expert (local expert j's rows are
 * offsets[j] .. offsets[j+1]), for every local expert j with rows
 *   gate|up_j = x_j @ [Wg_j; Wu_j]^T     (rows, 2 Ie): the halves of gate_up
 *   act       = swiglu(gate, up)         (all rows, one launch)
 *   y_j       = act_j @ Wd_j^T           (rows, C)
 * and backward, the data gradients (bf16) and the weight gradients
 * accumulated in fp32 (they sum over micro-batches):
 *   d_act_j = d_y_j @ Wd_j,   dWd_j += d_y_j^T act_j
 *   d_gate|up = swiglu backward
 *   d_x_j = d_gate_j @ Wg_j + d_up_j @ Wu_j,  dWg_j += d_gate_j^T x_j,  dWu_j += d_up_j^T x_j
 * Each product is one grouped call of cuda_gemm.h (cuda_grouped_*) over all
 * local experts, gate and up together as the two stacks of one product;
 * MEGATRAIN_MOE_GEMM picks how (one cuBLAS call per expert; cuBLAS's
 * grouped GEMM, the default; or kernels/moe_gemm.cu, which reads `d_offsets`,
 * the row offsets on the device). Expert j's weights are layer o's stacks
 * e_gate / e_up / e_down at j (the rank's local experts). */
#include "cuda_model_internal.h"

static CudaGroupedRows grouped_rows(const CudaExpertRows *r) {
    return (CudaGroupedRows){.groups = r->experts, .offsets = r->offsets, .d_offsets = r->d_offsets,
                             .max_rows = r->offsets[r->experts]};
}

void cuda_moe_experts_forward(CudaModel *m, const LayerOffsets *o, const CudaExpertRows *r, const bf16_t *x,
                              bf16_t *gate_up, bf16_t *act, bf16_t *y) {
    CudaContext *ctx = &m->ctx;
    const CudaMoeGemm how = cuda_moe_gemm_choice();
    const int C = m->shape.C, Ie = cuda_moe_expert_I(m), R = r->offsets[r->experts];
    const CudaGroupedRows g = grouped_rows(r);
    cuda_grouped_forward(ctx, how, &g, gate_up, 2 * Ie, x, C, w16(m, o->e_gate), w16(m, o->e_up), C, Ie, Ie);
    CUDA_CHECK(cuda_swiglu_forward(act, gate_up, R, Ie, ctx->stream));
    cuda_grouped_forward(ctx, how, &g, y, C, act, Ie, w16(m, o->e_down), NULL, Ie, C, 0);
}

void cuda_moe_experts_backward(CudaModel *m, const LayerOffsets *o, const CudaExpertRows *r, const bf16_t *x,
                               const bf16_t *gate_up, const bf16_t *act, const bf16_t *d_y, bf16_t *d_act,
                               bf16_t *d_gate_up, bf16_t *d_x) {
    CudaContext *ctx = &m->ctx;
    const CudaMoeGemm how = cuda_moe_gemm_choice();
    const int C = m->shape.C, Ie = cuda_moe_expert_I(m), R = r->offsets[r->experts];
    const CudaGroupedRows g = grouped_rows(r);
    cuda_grouped_backward_input(ctx, how, &g, d_act, Ie, d_y, C, w16(m, o->e_down), NULL, Ie, C, 0, 0);
    cuda_grouped_backward_weight(ctx, how, &g, g32(m, o->e_down), NULL, d_y, C, act, Ie, Ie, C, 0);
    CUDA_CHECK(cuda_swiglu_backward(d_gate_up, d_act, gate_up, R, Ie, ctx->stream));
    cuda_grouped_backward_input(ctx, how, &g, d_x, C, d_gate_up, 2 * Ie, w16(m, o->e_gate), w16(m, o->e_up), C, Ie,
                                Ie, 0);
    cuda_grouped_backward_weight(ctx, how, &g, g32(m, o->e_gate), g32(m, o->e_up), d_gate_up, 2 * Ie, x, C, C, Ie,
                                 Ie);
}
