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
 * Today one cuBLAS product per expert and product (cuda_gemm.h's
 * cuda_gemm_rows_*): the row counts change every step, so they come from
 * the host (`offsets`); `d_offsets` holds the same on the device for
 * products that read them there. Expert j's weights are layer o's stacks
 * e_gate / e_up / e_down at j (the rank's local experts). */
#include "cuda_model_internal.h"

void cuda_moe_experts_forward(CudaModel *m, const LayerOffsets *o, const CudaExpertRows *r, const bf16_t *x,
                              bf16_t *gate_up, bf16_t *act, bf16_t *y) {
    CudaContext *ctx = &m->ctx;
    const int C = m->shape.C, Ie = cuda_moe_expert_I(m), R = r->offsets[r->experts];
    for (int e = 0; e < r->experts; e++) {
        const int first = r->offsets[e], n = r->offsets[e + 1] - first;
        if (n == 0) continue;
        const bf16_t *xe = x + (size_t)first * C;
        bf16_t *gu = gate_up + (size_t)first * 2 * Ie;
        cuda_gemm_rows_forward(ctx, gu, 2 * Ie, xe, C, w16(m, o->e_gate + (long)e * Ie * C), n, C, Ie);
        cuda_gemm_rows_forward(ctx, gu + Ie, 2 * Ie, xe, C, w16(m, o->e_up + (long)e * Ie * C), n, C, Ie);
    }
    CUDA_CHECK(cuda_swiglu_forward(act, gate_up, R, Ie, ctx->stream));
    for (int e = 0; e < r->experts; e++) {
        const int first = r->offsets[e], n = r->offsets[e + 1] - first;
        if (n == 0) continue;
        cuda_gemm_rows_forward(ctx, y + (size_t)first * C, C, act + (size_t)first * Ie, Ie,
                               w16(m, o->e_down + (long)e * C * Ie), n, Ie, C);
    }
}

void cuda_moe_experts_backward(CudaModel *m, const LayerOffsets *o, const CudaExpertRows *r, const bf16_t *x,
                               const bf16_t *gate_up, const bf16_t *act, const bf16_t *d_y, bf16_t *d_act,
                               bf16_t *d_gate_up, bf16_t *d_x) {
    CudaContext *ctx = &m->ctx;
    const int C = m->shape.C, Ie = cuda_moe_expert_I(m), R = r->offsets[r->experts];
    for (int e = 0; e < r->experts; e++) {
        const int first = r->offsets[e], n = r->offsets[e + 1] - first;
        if (n == 0) continue;
        const long wd = o->e_down + (long)e * C * Ie;
        const bf16_t *dr = d_y + (size_t)first * C;
        cuda_gemm_rows_backward_input(ctx, d_act + (size_t)first * Ie, dr, C, w16(m, wd), n, Ie, C, 0);
        cuda_gemm_rows_backward_weight(ctx, g32(m, wd), dr, C, act + (size_t)first * Ie, Ie, n, Ie, C);
    }
    CUDA_CHECK(cuda_swiglu_backward(d_gate_up, d_act, gate_up, R, Ie, ctx->stream));
    for (int e = 0; e < r->experts; e++) {
        const int first = r->offsets[e], n = r->offsets[e + 1] - first;
        if (n == 0) continue;
        const long wg = o->e_gate + (long)e * Ie * C, wu = o->e_up + (long)e * Ie * C;
        const bf16_t *xe = x + (size_t)first * C, *dgu = d_gate_up + (size_t)first * 2 * Ie;
        bf16_t *dx = d_x + (size_t)first * C;
        cuda_gemm_rows_backward_input(ctx, dx, dgu, 2 * Ie, w16(m, wg), n, C, Ie, 0);
        cuda_gemm_rows_backward_input(ctx, dx, dgu + Ie, 2 * Ie, w16(m, wu), n, C, Ie, 1);
        cuda_gemm_rows_backward_weight(ctx, g32(m, wg), dgu, 2 * Ie, xe, C, n, C, Ie);
        cuda_gemm_rows_backward_weight(ctx, g32(m, wu), dgu + Ie, 2 * Ie, xe, C, n, C, Ie);
    }
}
