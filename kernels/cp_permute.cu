// cp_permute.cu: context parallel's reordering between the ranks' blocks and
// sequence order. An all-gather over the cp group gives (cp, B, T, W): rank
// r's B x T rows of width W, its rows at the positions seq_pos[r * T + t]
// (model_cp_positions); attention wants (B, T * cp, W) in sequence order.
// The gradients go back the other way (then a reduce-scatter).
#include "../src/backend/cuda/cuda_kernels.h"
#include "bf16.cuh"
#include "launch.cuh"

__global__ void cp_to_sequence_kernel(bf16 *__restrict__ all, const bf16 *__restrict__ blocks,
                                      const int32_t *__restrict__ seq_pos, int cp, int B, int T, int W) {
    const size_t total = (size_t)cp * B * T * W, Tall = (size_t)T * cp;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t e = i % W, rbt = i / W, t = rbt % T, rb = rbt / T, b = rb % B, r = rb / B;
        all[(b * Tall + (size_t)seq_pos[r * T + t]) * W + e] = blocks[i];
    }
}

__global__ void cp_from_sequence_kernel(float *__restrict__ blocks, const float *__restrict__ all,
                                        const int32_t *__restrict__ seq_pos, int cp, int B, int T, int W) {
    const size_t total = (size_t)cp * B * T * W, Tall = (size_t)T * cp;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t e = i % W, rbt = i / W, t = rbt % T, rb = rbt / T, b = rb % B, r = rb / B;
        blocks[i] = all[(b * Tall + (size_t)seq_pos[r * T + t]) * W + e];
    }
}

extern "C" cudaError_t cuda_cp_to_sequence(uint16_t *all, const uint16_t *blocks, const int32_t *seq_pos, int cp,
                                           int B, int T, int W, cudaStream_t stream) {
    const size_t total = (size_t)cp * B * T * W;
    if (total == 0) return cudaSuccess;
    cp_to_sequence_kernel<<<elementwise_blocks(total), kElementwiseThreads, 0, stream>>>(as_bf16(all),
                                                                                       as_bf16(blocks), seq_pos, cp,
                                                                                       B, T, W);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_cp_from_sequence(float *blocks, const float *all, const int32_t *seq_pos, int cp, int B,
                                             int T, int W, cudaStream_t stream) {
    const size_t total = (size_t)cp * B * T * W;
    if (total == 0) return cudaSuccess;
    cp_from_sequence_kernel<<<elementwise_blocks(total), kElementwiseThreads, 0, stream>>>(blocks, all, seq_pos, cp,
                                                                                         B, T, W);
    return cudaGetLastError();
}
