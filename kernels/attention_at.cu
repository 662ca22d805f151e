// attention_at.cu: causal grouped-query attention for queries at given
// positions against the keys of the whole sequence (context parallel: a rank
// holds two chunks of the queries, the keys and values are all-gathered).
// Semantics: cuda_kernels.h and the CPU reference cpu_attention_forward_at /
// _backward_at (src/backend/cpu/cpu_attention.c): query row t at position
// q_pos[t] sees keys 0..q_pos[t]. The simple form, a stepping stone next to
// the tensor-core kernels of attention.cu: one block per (query row, head,
// batch), 128 threads, one key per thread per tile, an online softmax in
// fp32; the T x T scores are never stored. The backward recomputes the
// probabilities from the forward's lse and adds dk and dv into fp32
// accumulators with atomics (several query rows and heads share a key).
#include <math.h>

#include "../src/backend/cuda/cuda_kernels.h"
#include "bf16.cuh"
#include "launch.cuh"

static const int kAtThreads = 128;  // >= D (at most 128)

// Max of `value` over the block (as block_sum in launch.cuh); scratch: 32 floats of shared memory.
__device__ __forceinline__ float block_max(float value, float *scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int offset = 16; offset > 0; offset >>= 1) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
    __syncthreads();
    if (lane == 0) scratch[warp] = value;
    __syncthreads();
    value = lane < (int)(blockDim.x >> 5) ? scratch[lane] : -INFINITY;
    for (int offset = 16; offset > 0; offset >>= 1) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
    return value;
}

// scale * dot(x (fp32, shared), row (bf16)) over D.
__device__ __forceinline__ float dot_row(const float *x, const bf16 *row, int D) {
    float s = 0.0f;
    for (int d = 0; d < D; d++) s += x[d] * __bfloat162float(row[d]);
    return s;
}

__global__ void attention_at_forward_kernel(bf16 *__restrict__ out, float *__restrict__ lse,
                                            const bf16 *__restrict__ q, const bf16 *__restrict__ k,
                                            const bf16 *__restrict__ v, const int32_t *__restrict__ q_pos, int Tq,
                                            int Tk, int H, int KVH, int D, float scale) {
    __shared__ float qs[kAtThreads], ps[kAtThreads], scratch[32];
    const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
    const int kvh = h / (H / KVH), pos = q_pos[t];
    const size_t row = ((size_t)b * Tq + t) * H + h;
    if (tid < D) qs[tid] = __bfloat162float(q[row * D + tid]);
    __syncthreads();
    float m = -INFINITY, l = 0.0f, acc = 0.0f;  // acc: output column tid
    for (int u0 = 0; u0 <= pos; u0 += kAtThreads) {
        const int u = u0 + tid;
        const float s = u <= pos ? scale * dot_row(qs, k + (((size_t)b * Tk + u) * KVH + kvh) * D, D) : -INFINITY;
        const float m_new = fmaxf(m, block_max(s, scratch));
        const float p = u <= pos ? __expf(s - m_new) : 0.0f;
        ps[tid] = p;
        const float alpha = __expf(m - m_new);
        l = l * alpha + block_sum(p, scratch);  // its barriers also publish ps
        if (tid < D) {
            const int n = min(kAtThreads, pos - u0 + 1);
            float a = 0.0f;
            for (int j = 0; j < n; j++) a += ps[j] * __bfloat162float(v[(((size_t)b * Tk + u0 + j) * KVH + kvh) * D + tid]);
            acc = acc * alpha + a;
        }
        m = m_new;
        __syncthreads();  // ps is read before the next tile overwrites it
    }
    if (tid < D) out[row * D + tid] = __float2bfloat16_rn(acc / l);
    if (tid == 0) lse[((size_t)b * H + h) * Tq + t] = m + logf(l);
}

__global__ void attention_at_backward_kernel(bf16 *__restrict__ dq, float *__restrict__ dk, float *__restrict__ dv,
                                             const bf16 *__restrict__ dout, const bf16 *__restrict__ out,
                                             const float *__restrict__ lse, const bf16 *__restrict__ q,
                                             const bf16 *__restrict__ k, const bf16 *__restrict__ v,
                                             const int32_t *__restrict__ q_pos, int Tq, int Tk, int H, int KVH,
                                             int D, float scale) {
    __shared__ float qs[kAtThreads], dos[kAtThreads], dss[kAtThreads], scratch[32];
    const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
    const int kvh = h / (H / KVH), pos = q_pos[t];
    const size_t row = ((size_t)b * Tq + t) * H + h;
    float od = 0.0f;
    if (tid < D) {
        qs[tid] = __bfloat162float(q[row * D + tid]);
        dos[tid] = __bfloat162float(dout[row * D + tid]);
        od = dos[tid] * __bfloat162float(out[row * D + tid]);
    }
    const float delta = block_sum(od, scratch);  // sum_u p dp = dout . out; its barriers publish qs, dos
    const float row_lse = lse[((size_t)b * H + h) * Tq + t];
    float dq_acc = 0.0f;  // dq column tid
    for (int u0 = 0; u0 <= pos; u0 += kAtThreads) {
        const int u = u0 + tid;
        float ds = 0.0f;
        if (u <= pos) {
            const size_t kv = ((size_t)b * Tk + u) * KVH + kvh;
            const float p = __expf(scale * dot_row(qs, k + kv * D, D) - row_lse);
            ds = p * (dot_row(dos, v + kv * D, D) - delta);
            for (int d = 0; d < D; d++) {
                atomicAdd(&dv[kv * D + d], p * dos[d]);
                atomicAdd(&dk[kv * D + d], scale * ds * qs[d]);
            }
        }
        dss[tid] = ds;
        __syncthreads();
        if (tid < D) {
            const int n = min(kAtThreads, pos - u0 + 1);
            for (int j = 0; j < n; j++) dq_acc += dss[j] * __bfloat162float(k[(((size_t)b * Tk + u0 + j) * KVH + kvh) * D + tid]);
        }
        __syncthreads();
    }
    if (tid < D) dq[row * D + tid] = __float2bfloat16_rn(scale * dq_acc);
}

static bool at_shape_ok(int B, int Tq, int Tk, int H, int KVH, int D) {
    return B > 0 && Tq > 0 && Tk > 0 && KVH > 0 && H % KVH == 0 && D > 0 && D <= kAtThreads;
}

extern "C" cudaError_t cuda_attention_forward_at(uint16_t *out, float *lse, const uint16_t *q, const uint16_t *k,
                                                 const uint16_t *v, const int32_t *q_pos, int B, int Tq, int Tk,
                                                 int H, int KVH, int D, cudaStream_t stream) {
    if (!at_shape_ok(B, Tq, Tk, H, KVH, D)) return cudaErrorInvalidValue;
    const float scale = (float)(1.0 / sqrt((double)D));
    attention_at_forward_kernel<<<dim3((unsigned)Tq, (unsigned)H, (unsigned)B), kAtThreads, 0, stream>>>(
        as_bf16(out), lse, as_bf16(q), as_bf16(k), as_bf16(v), q_pos, Tq, Tk, H, KVH, D, scale);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_attention_backward_at(uint16_t *dq, float *dk, float *dv, const uint16_t *dout,
                                                  const uint16_t *out, const float *lse, const uint16_t *q,
                                                  const uint16_t *k, const uint16_t *v, const int32_t *q_pos, int B,
                                                  int Tq, int Tk, int H, int KVH, int D, cudaStream_t stream) {
    if (!at_shape_ok(B, Tq, Tk, H, KVH, D)) return cudaErrorInvalidValue;
    const float scale = (float)(1.0 / sqrt((double)D));
    attention_at_backward_kernel<<<dim3((unsigned)Tq, (unsigned)H, (unsigned)B), kAtThreads, 0, stream>>>(
        as_bf16(dq), dk, dv, as_bf16(dout), as_bf16(out), lse, as_bf16(q), as_bf16(k), as_bf16(v), q_pos, Tq, Tk, H,
        KVH, D, scale);
    return cudaGetLastError();
}
