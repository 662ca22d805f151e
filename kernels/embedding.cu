// embedding.cu: token embedding lookup (bf16 table -> bf16 rows) and its
// backward, which adds each row's fp32 gradient into the fp32 table gradient
// (atomicAdd: tokens repeat within a batch).
#include "../src/backend/cuda/cuda_kernels.h"
#include "bf16.cuh"
#include "launch.cuh"

__global__ void embedding_forward_kernel(bf16 *__restrict__ out, const int32_t *__restrict__ tokens,
                                         const bf16 *__restrict__ table, int N, int C) {
    const size_t total = (size_t)N * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t n = i / C, c = i % C;
        out[i] = table[(size_t)tokens[n] * C + c];
    }
}

__global__ void embedding_backward_kernel(float *__restrict__ dtable, const float *__restrict__ dout,
                                          const int32_t *__restrict__ tokens, int N, int C) {
    const size_t total = (size_t)N * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t n = i / C, c = i % C;
        atomicAdd(&dtable[(size_t)tokens[n] * C + c], dout[i]);
    }
}

extern "C" cudaError_t cuda_embedding_forward(uint16_t *out, const int32_t *tokens, const uint16_t *table, int N,
                                              int C, cudaStream_t stream) {
    const size_t total = (size_t)N * C;
    if (total == 0) return cudaSuccess;
    embedding_forward_kernel<<<elementwise_blocks(total), kElementwiseThreads, 0, stream>>>(as_bf16(out), tokens,
                                                                                           as_bf16(table), N, C);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_embedding_backward(float *dtable, const float *dout, const int32_t *tokens, int N, int C,
                                               cudaStream_t stream) {
    const size_t total = (size_t)N * C;
    if (total == 0) return cudaSuccess;
    embedding_backward_kernel<<<elementwise_blocks(total), kElementwiseThreads, 0, stream>>>(dtable, dout, tokens, N,
                                                                                            C);
    return cudaGetLastError();
}
