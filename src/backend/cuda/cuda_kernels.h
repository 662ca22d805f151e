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

/* One fused AdamW update of n contiguous floats: params (fp32 master),
 * grads, exp_avg (m) and exp_avg_sq (v) are fp32; when params_bf16 is not
 * NULL it receives the updated params rounded to bf16 (nearest-even), the
 * copy the bf16 forward reads. Grads are read, never written. */
cudaError_t cuda_adamw_step(float *params, const float *grads, float *exp_avg, float *exp_avg_sq,
                            uint16_t *params_bf16, size_t n, const CudaAdamWArgs *args, cudaStream_t stream);

/* bias_correction{1,2} for update number `step` (1-based) into args. */
void cuda_adamw_set_step(CudaAdamWArgs *args, long step);

/* ---- kernels/rmsnorm.cu ------------------------------------------------ */

/* out[n,:] = inp[n,:] * rstd[n] * weight; rstd[n] = 1/sqrt(mean(inp[n,:]^2) + eps), saved. */
cudaError_t cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N, int C,
                                 float eps, cudaStream_t stream);

/* dinp += d/dinp, dweight += sum over rows of dout * inp * rstd.
 * dweight is summed in a fixed order (no atomics): bit-identical run to run. */
cudaError_t cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                  const float *weight, const float *rstd, int N, int C, cudaStream_t stream);

/* ---- kernels/cast.cu --------------------------------------------------- */

/* out[i] = bf16(inp[i]), round to nearest even (NaN stays NaN). */
cudaError_t cuda_cast_fp32_to_bf16(uint16_t *out, const float *inp, size_t n, cudaStream_t stream);
/* out[i] = float(inp[i]) (exact). */
cudaError_t cuda_cast_bf16_to_fp32(float *out, const uint16_t *inp, size_t n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
