// adamw.cu: the fused AdamW update over every parameter of a model in one
// launch, with weight decay per parameter (a chunk list, as apex's
// multi-tensor apply) and the bf16 copy of the updated parameters written in
// the same pass.
// Formula and argument meaning: src/backend/cuda/cuda_kernels.h.
#include <cuda_bf16.h>
#include <math.h>

#include "../src/backend/cuda/cuda_kernels.h"
#include "launch.cuh"

// Element i: moments, decayed parameter, update, and its bf16 copy.
__device__ __forceinline__ void adamw_update(float *__restrict__ params, const float *__restrict__ grads,
                                             float *__restrict__ exp_avg, float *__restrict__ exp_avg_sq,
                                             __nv_bfloat16 *__restrict__ params_bf16, size_t i, float decay_factor,
                                             const CudaAdamWArgs &args) {
    const float g = grads[i] * args.grad_scale;
    const float m = args.beta1 * exp_avg[i] + (1.0f - args.beta1) * g;
    const float v = args.beta2 * exp_avg_sq[i] + (1.0f - args.beta2) * g * g;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    float p = params[i] * decay_factor;
    p -= args.lr / args.bias_correction1 * m / (sqrtf(v) * rsqrtf(args.bias_correction2) + args.eps);
    params[i] = p;
    if (params_bf16) params_bf16[i] = __float2bfloat16_rn(p);
}

extern "C" void cuda_adamw_set_step(CudaAdamWArgs *args, long step) {
    args->bias_correction1 = (float)(1.0 - pow((double)args->beta1, (double)step));
    args->bias_correction2 = (float)(1.0 - pow((double)args->beta2, (double)step));
}

// One block per chunk; a chunk lies inside one parameter, so it has one decay flag.
__global__ void adamw_chunks_kernel(float *__restrict__ params, const float *__restrict__ grads,
                                    float *__restrict__ exp_avg, float *__restrict__ exp_avg_sq,
                                    __nv_bfloat16 *__restrict__ params_bf16, const CudaAdamWChunk *__restrict__ chunks,
                                    CudaAdamWArgs args) {
    const CudaAdamWChunk chunk = chunks[blockIdx.x];
    const float decay_factor = chunk.decay ? 1.0f - args.lr * args.weight_decay : 1.0f;
    for (size_t i = chunk.offset + threadIdx.x; i < chunk.offset + chunk.length; i += blockDim.x)
        adamw_update(params, grads, exp_avg, exp_avg_sq, params_bf16, i, decay_factor, args);
}

extern "C" cudaError_t cuda_adamw_step_chunks(float *params, const float *grads, float *exp_avg, float *exp_avg_sq,
                                              uint16_t *params_bf16, const CudaAdamWChunk *chunks, int num_chunks,
                                              const CudaAdamWArgs *args, cudaStream_t stream) {
    if (num_chunks == 0) return cudaSuccess;
    if (num_chunks < 0 || !args || !(args->bias_correction1 > 0.0f) || !(args->bias_correction2 > 0.0f))
        return cudaErrorInvalidValue;
    adamw_chunks_kernel<<<num_chunks, 512, 0, stream>>>(params, grads, exp_avg, exp_avg_sq,
                                                        reinterpret_cast<__nv_bfloat16 *>(params_bf16), chunks, *args);
    return cudaGetLastError();
}
