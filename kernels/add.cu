// add.cu: elementwise sum of two bf16 arrays (the residual add where it
// cannot ride in a product's epilogue: after a sequence-parallel
// reduce-scatter), and an fp32 array scaled in place (the routed experts'
// gradients under expert parallel: their edp mean times edp / dp).
#include "../src/backend/cuda/cuda_kernels.h"
#include "bf16.cuh"
#include "launch.cuh"

__global__ void add_bf16_kernel(bf16 *out, const bf16 *a, const bf16 *b, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

extern "C" cudaError_t cuda_add_bf16(uint16_t *out, const uint16_t *a, const uint16_t *b, size_t n,
                                     cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    add_bf16_kernel<<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(as_bf16(out), as_bf16(a), as_bf16(b), n);
    return cudaGetLastError();
}

__global__ void scale_f32_kernel(float *x, float scale, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] *= scale;
}

extern "C" cudaError_t cuda_scale_f32(float *x, float scale, size_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    scale_f32_kernel<<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(x, scale, n);
    return cudaGetLastError();
}
