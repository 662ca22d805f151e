// cast.cu: elementwise fp32 <-> bf16 conversion (bf16 as raw uint16_t bits
// at the C interface; round to nearest even on the way down).
#include <cuda_bf16.h>

#include "../src/backend/cuda/cuda_kernels.h"
#include "launch.cuh"

__global__ void fp32_to_bf16_kernel(__nv_bfloat16 *__restrict__ out, const float *__restrict__ inp, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16_rn(inp[i]);
}

__global__ void bf16_to_fp32_kernel(float *__restrict__ out, const __nv_bfloat16 *__restrict__ inp, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = __bfloat162float(inp[i]);
}

extern "C" cudaError_t cuda_cast_fp32_to_bf16(uint16_t *out, const float *inp, size_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    fp32_to_bf16_kernel<<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(
        reinterpret_cast<__nv_bfloat16 *>(out), inp, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_cast_bf16_to_fp32(float *out, const uint16_t *inp, size_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    bf16_to_fp32_kernel<<<elementwise_blocks(n), kElementwiseThreads, 0, stream>>>(
        out, reinterpret_cast<const __nv_bfloat16 *>(inp), n);
    return cudaGetLastError();
}
