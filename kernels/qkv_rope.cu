// qkv_rope.cu: from the fused q|k|v projection to attention's inputs, and
// back. Row n of qkv (N, H*D + 2*KVH*D) holds q heads, then k heads, then v
// heads, D values each (token n is position n % T of its sequence).
//   forward, per q and k head: optional per-head RMSNorm (qwen3's q_norm /
//   k_norm, rstd saved), then RoPE in Hugging Face's rotate_half convention
//   with the (T, D/2) cos/sin tables; v is copied. Outputs are contiguous
//   q (N, H, D), k (N, KVH, D), v (N, KVH, D) in bf16; the math runs in fp32
//   and is rounded once.
//   backward: the transpose: RoPE's inverse rotation, the RMSNorm backward
//   (its weight gradient accumulated in fp32), written into d_qkv (overwritten).
// One warp per (token, head); lane l owns the pairs (i, i + D/2), i = l, l + 32.
#include "../src/backend/cuda/cuda_kernels.h"
#include "bf16.cuh"
#include "launch.cuh"

static const int kWarpsPerBlock = 8;
static const int kMaxPairsPerLane = 2;  // D <= 128

struct QkvShape {
    int N, T, H, KVH, D;
    int heads() const { return H + 2 * KVH; }
    __device__ int width() const { return (H + 2 * KVH) * D; }
};

// Where head j of token n lives: column offset in qkv, the output tensor and its head count.
__device__ __forceinline__ int head_column(const QkvShape &s, int j) { return j * s.D; }

__global__ void qkv_rope_forward_kernel(bf16 *__restrict__ q, bf16 *__restrict__ k, bf16 *__restrict__ v,
                                        float *__restrict__ q_rstd, float *__restrict__ k_rstd,
                                        const bf16 *__restrict__ qkv, const bf16 *__restrict__ q_norm,
                                        const bf16 *__restrict__ k_norm, const float *__restrict__ cos_table,
                                        const float *__restrict__ sin_table, QkvShape s, float eps) {
    const int lane = threadIdx.x & 31;
    const int heads = s.H + 2 * s.KVH, half = s.D / 2;
    const long rows = (long)s.N * heads;
    for (long r = (long)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5); r < rows;
         r += (long)gridDim.x * kWarpsPerBlock) {
        const int n = (int)(r / heads), j = (int)(r % heads), t = n % s.T;
        const bf16 *x = qkv + (size_t)n * s.width() + head_column(s, j);
        if (j >= s.H + s.KVH) {  // v head: copy
            bf16 *out = v + ((size_t)n * s.KVH + (j - s.H - s.KVH)) * s.D;
            for (int c = lane; c < s.D; c += 32) out[c] = x[c];
            continue;
        }
        const bool is_q = j < s.H;
        const bf16 *norm = is_q ? q_norm : k_norm;
        bf16 *out = is_q ? q + ((size_t)n * s.H + j) * s.D : k + ((size_t)n * s.KVH + (j - s.H)) * s.D;
        float lo[kMaxPairsPerLane], hi[kMaxPairsPerLane];
        float sum_sq = 0.0f;
#pragma unroll
        for (int p = 0; p < kMaxPairsPerLane; p++) {
            const int i = lane + 32 * p;
            lo[p] = i < half ? __bfloat162float(x[i]) : 0.0f;
            hi[p] = i < half ? __bfloat162float(x[i + half]) : 0.0f;
            sum_sq += lo[p] * lo[p] + hi[p] * hi[p];
        }
        if (norm) {
            sum_sq = warp_sum(sum_sq);
            const float rs = rsqrtf(sum_sq / (float)s.D + eps);
            if (lane == 0) (is_q ? q_rstd[(size_t)n * s.H + j] : k_rstd[(size_t)n * s.KVH + (j - s.H)]) = rs;
#pragma unroll
            for (int p = 0; p < kMaxPairsPerLane; p++) {
                const int i = lane + 32 * p;
                if (i < half) {
                    lo[p] = lo[p] * rs * __bfloat162float(norm[i]);
                    hi[p] = hi[p] * rs * __bfloat162float(norm[i + half]);
                }
            }
        }
#pragma unroll
        for (int p = 0; p < kMaxPairsPerLane; p++) {
            const int i = lane + 32 * p;
            if (i < half) {
                const float c = cos_table[(size_t)t * half + i], sn = sin_table[(size_t)t * half + i];
                out[i] = __float2bfloat16_rn(lo[p] * c - hi[p] * sn);
                out[i + half] = __float2bfloat16_rn(hi[p] * c + lo[p] * sn);
            }
        }
    }
}

__global__ void qkv_rope_backward_kernel(bf16 *__restrict__ d_qkv, float *__restrict__ d_q_norm,
                                         float *__restrict__ d_k_norm, const bf16 *__restrict__ dq,
                                         const bf16 *__restrict__ dk, const bf16 *__restrict__ dv,
                                         const bf16 *__restrict__ qkv, const bf16 *__restrict__ q_norm,
                                         const bf16 *__restrict__ k_norm, const float *__restrict__ q_rstd,
                                         const float *__restrict__ k_rstd, const float *__restrict__ cos_table,
                                         const float *__restrict__ sin_table, QkvShape s) {
    __shared__ float block_dnorm[2][128];  // q_norm and k_norm weight gradients of this block
    for (int i = threadIdx.x; i < 2 * 128; i += blockDim.x) (&block_dnorm[0][0])[i] = 0.0f;
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const int heads = s.H + 2 * s.KVH, half = s.D / 2;
    const long rows = (long)s.N * heads;
    float acc_lo[2][kMaxPairsPerLane] = {}, acc_hi[2][kMaxPairsPerLane] = {};  // [q|k][pair]
    for (long r = (long)blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5); r < rows;
         r += (long)gridDim.x * kWarpsPerBlock) {
        const int n = (int)(r / heads), j = (int)(r % heads), t = n % s.T;
        bf16 *dx = d_qkv + (size_t)n * s.width() + head_column(s, j);
        if (j >= s.H + s.KVH) {
            const bf16 *g = dv + ((size_t)n * s.KVH + (j - s.H - s.KVH)) * s.D;
            for (int c = lane; c < s.D; c += 32) dx[c] = g[c];
            continue;
        }
        const bool is_q = j < s.H;
        const bf16 *norm = is_q ? q_norm : k_norm;
        const bf16 *g = is_q ? dq + ((size_t)n * s.H + j) * s.D : dk + ((size_t)n * s.KVH + (j - s.H)) * s.D;
        float dlo[kMaxPairsPerLane], dhi[kMaxPairsPerLane];
#pragma unroll
        for (int p = 0; p < kMaxPairsPerLane; p++) {  // inverse rotation
            const int i = lane + 32 * p;
            dlo[p] = dhi[p] = 0.0f;
            if (i < half) {
                const float c = cos_table[(size_t)t * half + i], sn = sin_table[(size_t)t * half + i];
                const float glo = __bfloat162float(g[i]), ghi = __bfloat162float(g[i + half]);
                dlo[p] = glo * c + ghi * sn;
                dhi[p] = ghi * c - glo * sn;
            }
        }
        if (norm) {
            const bf16 *x = qkv + (size_t)n * s.width() + head_column(s, j);
            const float rs = is_q ? q_rstd[(size_t)n * s.H + j] : k_rstd[(size_t)n * s.KVH + (j - s.H)];
            float xlo[kMaxPairsPerLane], xhi[kMaxPairsPerLane], dot = 0.0f;
#pragma unroll
            for (int p = 0; p < kMaxPairsPerLane; p++) {
                const int i = lane + 32 * p;
                xlo[p] = i < half ? __bfloat162float(x[i]) : 0.0f;
                xhi[p] = i < half ? __bfloat162float(x[i + half]) : 0.0f;
                if (i < half)
                    dot += __bfloat162float(norm[i]) * dlo[p] * xlo[p] +
                           __bfloat162float(norm[i + half]) * dhi[p] * xhi[p];
            }
            dot = warp_sum(dot);
            const float coeff = rs * rs * rs * dot / (float)s.D;
            const int which = is_q ? 0 : 1;
#pragma unroll
            for (int p = 0; p < kMaxPairsPerLane; p++) {
                const int i = lane + 32 * p;
                if (i < half) {
                    acc_lo[which][p] += dlo[p] * xlo[p] * rs;
                    acc_hi[which][p] += dhi[p] * xhi[p] * rs;
                    dlo[p] = rs * __bfloat162float(norm[i]) * dlo[p] - coeff * xlo[p];
                    dhi[p] = rs * __bfloat162float(norm[i + half]) * dhi[p] - coeff * xhi[p];
                }
            }
        }
#pragma unroll
        for (int p = 0; p < kMaxPairsPerLane; p++) {
            const int i = lane + 32 * p;
            if (i < half) {
                dx[i] = __float2bfloat16_rn(dlo[p]);
                dx[i + half] = __float2bfloat16_rn(dhi[p]);
            }
        }
    }
    if (!d_q_norm) return;  // no qk-norm: nothing to reduce (uniform over the grid)
#pragma unroll
    for (int which = 0; which < 2; which++)
#pragma unroll
        for (int p = 0; p < kMaxPairsPerLane; p++) {
            const int i = lane + 32 * p;
            if (i < half) {
                atomicAdd(&block_dnorm[which][i], acc_lo[which][p]);
                atomicAdd(&block_dnorm[which][i + half], acc_hi[which][p]);
            }
        }
    __syncthreads();
    for (int i = threadIdx.x; i < s.D; i += blockDim.x) {
        atomicAdd(&d_q_norm[i], block_dnorm[0][i]);
        atomicAdd(&d_k_norm[i], block_dnorm[1][i]);
    }
}

static unsigned int row_blocks(long rows) {
    long blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
    return (unsigned int)(blocks > 1056 ? 1056 : blocks < 1 ? 1 : blocks);
}

static bool shape_ok(int N, int T, int H, int KVH, int D) {
    return N > 0 && T > 0 && H > 0 && KVH > 0 && D > 0 && D % 2 == 0 && D <= 2 * 32 * kMaxPairsPerLane;
}

extern "C" cudaError_t cuda_qkv_rope_forward(uint16_t *q, uint16_t *k, uint16_t *v, float *q_rstd, float *k_rstd,
                                             const uint16_t *qkv, const uint16_t *q_norm, const uint16_t *k_norm,
                                             const float *cos_table, const float *sin_table, int N, int T, int H,
                                             int KVH, int D, float eps, cudaStream_t stream) {
    if (!shape_ok(N, T, H, KVH, D) || (q_norm == NULL) != (k_norm == NULL)) return cudaErrorInvalidValue;
    const QkvShape s = {N, T, H, KVH, D};
    qkv_rope_forward_kernel<<<row_blocks((long)N * s.heads()), 32 * kWarpsPerBlock, 0, stream>>>(
        as_bf16(q), as_bf16(k), as_bf16(v), q_rstd, k_rstd, as_bf16(qkv), as_bf16(q_norm), as_bf16(k_norm), cos_table,
        sin_table, s, eps);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_qkv_rope_backward(uint16_t *d_qkv, float *d_q_norm, float *d_k_norm, const uint16_t *dq,
                                              const uint16_t *dk, const uint16_t *dv, const uint16_t *qkv,
                                              const uint16_t *q_norm, const uint16_t *k_norm, const float *q_rstd,
                                              const float *k_rstd, const float *cos_table, const float *sin_table,
                                              int N, int T, int H, int KVH, int D, cudaStream_t stream) {
    if (!shape_ok(N, T, H, KVH, D) || (q_norm == NULL) != (d_q_norm == NULL)) return cudaErrorInvalidValue;
    const QkvShape s = {N, T, H, KVH, D};
    qkv_rope_backward_kernel<<<row_blocks((long)N * s.heads()), 32 * kWarpsPerBlock, 0, stream>>>(
        as_bf16(d_qkv), d_q_norm, d_k_norm, as_bf16(dq), as_bf16(dk), as_bf16(dv), as_bf16(qkv), as_bf16(q_norm),
        as_bf16(k_norm), q_rstd, k_rstd, cos_table, sin_table, s);
    return cudaGetLastError();
}
