// adamw.cu: the fused AdamW update over every parameter of a model in one
// launch, with weight decay per parameter (a chunk list, as apex's
// multi-tensor apply) and the bf16 copy of the updated parameters written in
// the same pass. The moments are fp32, or bf16 (optimizer.state_dtype: bf16):
// widened exactly, updated in fp32, the parameter moved by the unrounded new
// moments, then stored rounded to nearest-even, as train/optimizer.c's
// adamw_update_bf16 (which computes in double) and Transformer Engine's
// precision-aware optimizer do.
// Formula and argument meaning: src/backend/cuda/cuda_kernels.h.
#include <cuda_bf16.h>
#include <math.h>

#include "../src/backend/cuda/cuda_kernels.h"
#include "launch.cuh"

// A moment's load (widened to fp32) and store (rounded to the state's type).
__device__ __forceinline__ float state_load(const float *s, size_t i) { return s[i]; }
__device__ __forceinline__ float state_load(const __nv_bfloat16 *s, size_t i) { return __bfloat162float(s[i]); }
__device__ __forceinline__ void state_store(float *s, size_t i, float x) { s[i] = x; }
__device__ __forceinline__ void state_store(__nv_bfloat16 *s, size_t i, float x) { s[i] = __float2bfloat16_rn(x); }

// Element i: moments, decayed parameter, update, and its bf16 copy.
// Element i of the flat array (its gradient and bf16 copy), its moments at j (i, or its place in a shard of them),
// its fp32 master at p (i, or j when the master is a shard too).
template <typename State>
__device__ __forceinline__ void adamw_update(float *__restrict__ params, const float *__restrict__ grads,
                                             State *__restrict__ exp_avg, State *__restrict__ exp_avg_sq,
                                             __nv_bfloat16 *__restrict__ params_bf16, size_t i, size_t j, size_t pi,
                                             float decay_factor, const CudaAdamWArgs &args) {
    const float g = grads[i] * args.grad_scale;
    const float m = args.beta1 * state_load(exp_avg, j) + (1.0f - args.beta1) * g;
    const float v = args.beta2 * state_load(exp_avg_sq, j) + (1.0f - args.beta2) * g * g;
    state_store(exp_avg, j, m);
    state_store(exp_avg_sq, j, v);
    float p = params[pi] * decay_factor;
    p -= args.lr / args.bias_correction1 * m / (sqrtf(v) * rsqrtf(args.bias_correction2) + args.eps);
    params[pi] = p;
    if (params_bf16) params_bf16[i] = __float2bfloat16_rn(p);
}

extern "C" void cuda_adamw_set_step(CudaAdamWArgs *args, long step) {
    args->bias_correction1 = (float)(1.0 - pow((double)args->beta1, (double)step));
    args->bias_correction2 = (float)(1.0 - pow((double)args->beta2, (double)step));
}

// One block per chunk; a chunk lies inside one parameter, so it has one decay flag.
template <typename State>
__global__ void adamw_chunks_kernel(float *__restrict__ params, const float *__restrict__ grads,
                                    State *__restrict__ exp_avg, State *__restrict__ exp_avg_sq,
                                    __nv_bfloat16 *__restrict__ params_bf16, const CudaAdamWChunk *__restrict__ chunks,
                                    int params_sharded, CudaAdamWArgs args) {
    const CudaAdamWChunk chunk = chunks[blockIdx.x];
    const float decay_factor = chunk.decay ? 1.0f - args.lr * args.weight_decay : 1.0f;
    const size_t master = params_sharded ? chunk.state : chunk.offset;
    for (size_t k = threadIdx.x; k < chunk.length; k += blockDim.x)
        adamw_update(params, grads, exp_avg, exp_avg_sq, params_bf16, chunk.offset + k, chunk.state + k, master + k,
                     decay_factor, args);
}

extern "C" cudaError_t cuda_adamw_step_chunks(float *params, int params_sharded, const float *grads, void *exp_avg,
                                              void *exp_avg_sq, int bf16_states, uint16_t *params_bf16,
                                              const CudaAdamWChunk *chunks, int num_chunks, const CudaAdamWArgs *args,
                                              cudaStream_t stream) {
    if (num_chunks == 0) return cudaSuccess;
    if (num_chunks < 0 || !args || !(args->bias_correction1 > 0.0f) || !(args->bias_correction2 > 0.0f))
        return cudaErrorInvalidValue;
    __nv_bfloat16 *copy = reinterpret_cast<__nv_bfloat16 *>(params_bf16);
    if (bf16_states)
        adamw_chunks_kernel<__nv_bfloat16><<<num_chunks, 512, 0, stream>>>(
            params, grads, static_cast<__nv_bfloat16 *>(exp_avg), static_cast<__nv_bfloat16 *>(exp_avg_sq), copy,
            chunks, params_sharded, *args);
    else
        adamw_chunks_kernel<float><<<num_chunks, 512, 0, stream>>>(
            params, grads, static_cast<float *>(exp_avg), static_cast<float *>(exp_avg_sq), copy, chunks,
            params_sharded, *args);
    return cudaGetLastError();
}
