// embedding.cu: token embedding lookup (bf16 table -> bf16 rows) and its
// backward, which adds each row's fp32 gradient into the fp32 table gradient
// (atomicAdd: tokens repeat within a batch). The table may be one tensor-
// parallel rank's rows [vocab_start, vocab_start + rows) of the vocabulary:
// other tokens give zero rows forward and nothing backward.
#include <limits.h>

#include "../src/backend/cuda/cuda_kernels.h"
#include "bf16.cuh"
#include "launch.cuh"

__global__ void embedding_forward_kernel(bf16 *__restrict__ out, const int32_t *__restrict__ tokens,
                                         const bf16 *__restrict__ table, int vocab_start, int rows, int N, int C) {
    const size_t total = (size_t)N * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t n = i / C, c = i % C;
        const long v = (long)tokens[n] - vocab_start;
        out[i] = v >= 0 && v < rows ? table[(size_t)v * C + c] : __float2bfloat16_rn(0.0f);
    }
}

__global__ void embedding_backward_kernel(float *__restrict__ dtable, const float *__restrict__ dout,
                                          const int32_t *__restrict__ tokens, int vocab_start, int rows, int N,
                                          int C) {
    const size_t total = (size_t)N * C;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t n = i / C, c = i % C;
        const long v = (long)tokens[n] - vocab_start;
        if (v >= 0 && v < rows) atomicAdd(&dtable[(size_t)v * C + c], dout[i]);
    }
}

extern "C" cudaError_t cuda_embedding_forward_rows(uint16_t *out, const int32_t *tokens, const uint16_t *table,
                                                   int vocab_start, int rows, int N, int C, cudaStream_t stream) {
    const size_t total = (size_t)N * C;
    if (total == 0) return cudaSuccess;
    embedding_forward_kernel<<<elementwise_blocks(total), kElementwiseThreads, 0, stream>>>(
        as_bf16(out), tokens, as_bf16(table), vocab_start, rows, N, C);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_embedding_backward_rows(float *dtable, const float *dout, const int32_t *tokens,
                                                    int vocab_start, int rows, int N, int C, cudaStream_t stream) {
    const size_t total = (size_t)N * C;
    if (total == 0) return cudaSuccess;
    embedding_backward_kernel<<<elementwise_blocks(total), kElementwiseThreads, 0, stream>>>(dtable, dout, tokens,
                                                                                            vocab_start, rows, N, C);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_embedding_forward(uint16_t *out, const int32_t *tokens, const uint16_t *table, int N,
                                              int C, cudaStream_t stream) {
    return cuda_embedding_forward_rows(out, tokens, table, 0, INT_MAX, N, C, stream);
}

extern "C" cudaError_t cuda_embedding_backward(float *dtable, const float *dout, const int32_t *tokens, int N, int C,
                                               cudaStream_t stream) {
    return cuda_embedding_backward_rows(dtable, dout, tokens, 0, INT_MAX, N, C, stream);
}
