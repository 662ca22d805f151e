// cross_entropy.cu: fused softmax cross-entropy over bf16 logits. Nothing of
// vocabulary size is kept in fp32: the forward keeps one logsumexp per row,
// the backward turns the logits into their gradient in place (bf16).
//   forward:  lse[n] = logsumexp(logits[n,:]), losses[n] = lse[n] - logits[n, t]
//             (0, and lse 0, where targets[n] < 0: ignored)
//   backward: logits[n,:] <- (exp(logits[n,:] - lse[n]) - onehot(t)) * dloss
// Vocab-parallel (tensor parallel): each rank holds the columns
// [vocab_start, vocab_start + V) of the logits; the stats kernel gives each
// row's (max, sum of exp(x - max), target logit) of this rank's columns, the
// ranks all-gather them, and the combine kernel merges them in rank order
// into the same lse and loss on every rank; the backward takes vocab_start.
#include <math.h>

#include "../src/backend/cuda/cuda_kernels.h"
#include "bf16.cuh"
#include "launch.cuh"

static const int kRowThreads = 512;  // one block per row: at most, fewer for a short row (ce_threads)

// A row's threads: one per 16-byte load (8 logits) when V allows them (row_max_sumexp, the backward), else one
// per logit, up to kRowThreads.
static unsigned int ce_threads(int V) { return row_threads(V % 8 == 0 ? (size_t)V / 8 : (size_t)V, kRowThreads); }

// Merge two (max, sum of exp(x - max)) pairs.
__device__ __forceinline__ void merge_lse(float &m, float &s, float m2, float s2) {
    const float mm = fmaxf(m, m2);
    if (mm == -INFINITY) return;
    s = s * __expf(m - mm) + s2 * __expf(m2 - mm);
    m = mm;
}

// (max, sum of exp(x - max)) of the row x (V bf16) over the block: valid in
// thread 0 (the others return partial values). shared_m/s hold 32 floats each.
__device__ void row_max_sumexp(const bf16 *__restrict__ x, int V, float *shared_m, float *shared_s, float &out_m,
                               float &out_s) {
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
    out_m = shared_m[0];
    out_s = shared_s[0];
    if (threadIdx.x == 0)
        for (int w = 1; w < (int)(blockDim.x >> 5); w++) merge_lse(out_m, out_s, shared_m[w], shared_s[w]);
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
    float m, s;
    row_max_sumexp(x, V, shared_m, shared_s, m, s);
    if (threadIdx.x == 0) {
        const float lse = m + logf(s);
        lse_out[row] = lse;
        losses[row] = target < V ? lse - __bfloat162float(x[target]) : NAN;
    }
}

// stats[row] = (max, sum of exp(x - max), logit of the target when this rank holds its column, else 0).
__global__ void cross_entropy_stats_kernel(float *__restrict__ stats, const bf16 *__restrict__ logits,
                                           const int32_t *__restrict__ targets, int vocab_start, int V) {
    __shared__ float shared_m[32], shared_s[32];
    const size_t row = blockIdx.x;
    const int target = targets[row];
    if (target < 0) {  // ignored row: nothing to add
        if (threadIdx.x == 0) {
            stats[row * 3] = -INFINITY;
            stats[row * 3 + 1] = 0.0f;
            stats[row * 3 + 2] = 0.0f;
        }
        return;
    }
    const bf16 *x = logits + row * V;
    float m, s;
    row_max_sumexp(x, V, shared_m, shared_s, m, s);
    if (threadIdx.x == 0) {
        const long t = (long)target - vocab_start;
        stats[row * 3] = m;
        stats[row * 3 + 1] = s;
        stats[row * 3 + 2] = t >= 0 && t < V ? __bfloat162float(x[t]) : 0.0f;
    }
}

// gathered (ranks, N, 3): every rank's stats, merged in rank order (the same bits on every rank).
__global__ void cross_entropy_combine_kernel(float *__restrict__ losses, float *__restrict__ lse_out,
                                             const float *__restrict__ gathered, const int32_t *__restrict__ targets,
                                             int N, int ranks) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= N) return;
    if (targets[row] < 0) {
        losses[row] = lse_out[row] = 0.0f;
        return;
    }
    float m = -INFINITY, s = 0.0f, target_logit = 0.0f;
    for (int r = 0; r < ranks; r++) {
        const float *st = gathered + ((size_t)r * N + row) * 3;
        merge_lse(m, s, st[0], st[1]);
        target_logit += st[2];
    }
    const float lse = m + logf(s);
    lse_out[row] = lse;
    losses[row] = lse - target_logit;
}

__global__ void cross_entropy_backward_kernel(bf16 *__restrict__ logits, const float *__restrict__ lse,
                                              const int32_t *__restrict__ targets, int vocab_start, float dloss,
                                              int V) {
    const size_t row = blockIdx.x;
    const int ignored = targets[row] < 0;
    const long target = ignored ? -1 : (long)targets[row] - vocab_start;  // this rank's column, or outside [0, V)
    bf16 *x = logits + row * V;
    const float l = lse[row];
    if (V % 8 == 0) {
        for (int i = threadIdx.x * 8; i < V; i += blockDim.x * 8) {
            float v[8];
            load8(x + i, v);
#pragma unroll
            for (int e = 0; e < 8; e++)
                v[e] = ignored ? 0.0f : (__expf(v[e] - l) - (i + e == target ? 1.0f : 0.0f)) * dloss;
            store8(x + i, v);
        }
        return;
    }
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float g = 0.0f;
        if (!ignored) g = (__expf(__bfloat162float(x[i]) - l) - (i == target ? 1.0f : 0.0f)) * dloss;
        x[i] = __float2bfloat16_rn(g);
    }
}

extern "C" cudaError_t cuda_cross_entropy_forward(float *losses, float *lse, const uint16_t *logits,
                                                  const int32_t *targets, int N, int V, cudaStream_t stream) {
    if (N < 0 || V <= 0) return cudaErrorInvalidValue;
    if (N == 0) return cudaSuccess;
    cross_entropy_forward_kernel<<<N, ce_threads(V), 0, stream>>>(losses, lse, as_bf16(logits), targets, V);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_cross_entropy_stats(float *stats, const uint16_t *logits, const int32_t *targets,
                                                int vocab_start, int N, int V, cudaStream_t stream) {
    if (N < 0 || V <= 0) return cudaErrorInvalidValue;
    if (N == 0) return cudaSuccess;
    cross_entropy_stats_kernel<<<N, ce_threads(V), 0, stream>>>(stats, as_bf16(logits), targets, vocab_start, V);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_cross_entropy_combine(float *losses, float *lse, const float *gathered,
                                                  const int32_t *targets, int N, int ranks, cudaStream_t stream) {
    if (N < 0 || ranks <= 0) return cudaErrorInvalidValue;
    if (N == 0) return cudaSuccess;
    cross_entropy_combine_kernel<<<(N + 255) / 256, 256, 0, stream>>>(losses, lse, gathered, targets, N, ranks);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_cross_entropy_backward_columns(uint16_t *logits, const float *lse, const int32_t *targets,
                                                           int vocab_start, float dloss, int N, int V,
                                                           cudaStream_t stream) {
    if (N < 0 || V <= 0) return cudaErrorInvalidValue;
    if (N == 0) return cudaSuccess;
    cross_entropy_backward_kernel<<<N, ce_threads(V), 0, stream>>>(as_bf16(logits), lse, targets, vocab_start, dloss,
                                                                   V);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_cross_entropy_backward(uint16_t *logits, const float *lse, const int32_t *targets,
                                                   float dloss, int N, int V, cudaStream_t stream) {
    return cuda_cross_entropy_backward_columns(logits, lse, targets, 0, dloss, N, V, stream);
}
