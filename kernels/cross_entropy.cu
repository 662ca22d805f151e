// cross_entropy.cu: fused softmax cross-entropy over bf16 logits. Nothing of
// vocabulary size is kept in fp32: the forward keeps one logsumexp per row,
// the backward turns the logits into their gradient in place (bf16).
//   forward:  lse[n] = logsumexp(logits[n,:]), losses[n] = lse[n] - logits[n, t]
//             (0, and lse 0, where targets[n] < 0: ignored)
//   backward: logits[n,:] <- (exp(logits[n,:] - lse[n]) - onehot(t)) * dloss
#include <math.h>

#include "../src/backend/cuda/cuda_kernels.h"
#include "bf16.cuh"
#include "launch.cuh"

static const int kRowThreads = 512;

// Merge two (max, sum of exp(x - max)) pairs.
__device__ __forceinline__ void merge_lse(float &m, float &s, float m2, float s2) {
    const float mm = fmaxf(m, m2);
    if (mm == -INFINITY) return;
    s = s * __expf(m - mm) + s2 * __expf(m2 - mm);
    m = mm;
}

__global__ void cross_entropy_forward_kernel(float *__restrict__ losses, float *__restrict__ lse_out,
                                             const bf16 *__restrict__ logits, const int32_t *__restrict__ targets,
                                             int V) {
    __shared__ float shared_m[32], shared_s[32];
    const size_t row = blockIdx.x;
    const int target = targets[row];
    if (target < 0) {  // ignored row: the whole block agrees, no barrier is reached
        if (threadIdx.x == 0) losses[row] = lse_out[row] = 0.0f;
        return;
    }
    const bf16 *x = logits + row * V;
    float m = -INFINITY, s = 0.0f;
    if (V % 8 == 0) {  // 16-byte loads: every row starts 16-byte aligned
        for (int i = threadIdx.x * 8; i < V; i += blockDim.x * 8) {
            float v[8];
            load8(x + i, v);
            float vm = v[0];
#pragma unroll
            for (int e = 1; e < 8; e++) vm = fmaxf(vm, v[e]);
            const float mm = fmaxf(m, vm);
            s *= __expf(m - mm);
#pragma unroll
            for (int e = 0; e < 8; e++) s += __expf(v[e] - mm);
            m = mm;
        }
    } else {
        for (int i = threadIdx.x; i < V; i += blockDim.x) {
            const float v = __bfloat162float(x[i]);
            if (v > m) {
                s = s * __expf(m - v) + 1.0f;
                m = v;
            } else {
                s += __expf(v - m);
            }
        }
    }
    for (int offset = 16; offset > 0; offset >>= 1)
        merge_lse(m, s, __shfl_xor_sync(0xffffffffu, m, offset), __shfl_xor_sync(0xffffffffu, s, offset));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        shared_m[warp] = m;
        shared_s[warp] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float bm = shared_m[0], bs = shared_s[0];
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) merge_lse(bm, bs, shared_m[w], shared_s[w]);
        const float lse = bm + logf(bs);
        lse_out[row] = lse;
        losses[row] = target < V ? lse - __bfloat162float(x[target]) : NAN;
    }
}

__global__ void cross_entropy_backward_kernel(bf16 *__restrict__ logits, const float *__restrict__ lse,
                                              const int32_t *__restrict__ targets, float dloss, int V) {
    const size_t row = blockIdx.x;
    const int target = targets[row];
    bf16 *x = logits + row * V;
    const float l = lse[row];
    if (V % 8 == 0) {
        for (int i = threadIdx.x * 8; i < V; i += blockDim.x * 8) {
            float v[8];
            load8(x + i, v);
#pragma unroll
            for (int e = 0; e < 8; e++)
                v[e] = target >= 0 ? (__expf(v[e] - l) - (i + e == target ? 1.0f : 0.0f)) * dloss : 0.0f;
            store8(x + i, v);
        }
        return;
    }
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float g = 0.0f;
        if (target >= 0) g = (__expf(__bfloat162float(x[i]) - l) - (i == target ? 1.0f : 0.0f)) * dloss;
        x[i] = __float2bfloat16_rn(g);
    }
}

extern "C" cudaError_t cuda_cross_entropy_forward(float *losses, float *lse, const uint16_t *logits,
                                                  const int32_t *targets, int N, int V, cudaStream_t stream) {
    if (N < 0 || V <= 0) return cudaErrorInvalidValue;
    if (N == 0) return cudaSuccess;
    cross_entropy_forward_kernel<<<N, kRowThreads, 0, stream>>>(losses, lse, as_bf16(logits), targets, V);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_cross_entropy_backward(uint16_t *logits, const float *lse, const int32_t *targets,
                                                   float dloss, int N, int V, cudaStream_t stream) {
    if (N < 0 || V <= 0) return cudaErrorInvalidValue;
    if (N == 0) return cudaSuccess;
    cross_entropy_backward_kernel<<<N, kRowThreads, 0, stream>>>(as_bf16(logits), lse, targets, dloss, V);
    return cudaGetLastError();
}
