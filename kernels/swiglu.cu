// swiglu.cu: SwiGLU over the fused gate|up projection. Row n of gate_up
// (N, 2I) holds gate in columns [0, I) and up in [I, 2I):
//   forward:  act[n,i] = silu(gate) * up,   silu(g) = g * sigmoid(g)
//   backward: dgate = dact * up * sigmoid(g) * (1 + g * (1 - sigmoid(g))),
//             dup = dact * silu(g); both OVERWRITE d_gate_up.
#include "../src/backend/cuda/cuda_kernels.h"
#include "bf16.cuh"
#include "launch.cuh"

__global__ void swiglu_forward_kernel(bf16 *__restrict__ act, const bf16 *__restrict__ gate_up, int N, int I) {
    const size_t total = (size_t)N * I;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t n = i / I, j = i % I;
        const float g = __bfloat162float(gate_up[n * 2 * I + j]);
        const float u = __bfloat162float(gate_up[n * 2 * I + I + j]);
        act[i] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
    }
}

__global__ void swiglu_backward_kernel(bf16 *__restrict__ d_gate_up, const bf16 *__restrict__ d_act,
                                       const bf16 *__restrict__ gate_up, int N, int I) {
    const size_t total = (size_t)N * I;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t n = i / I, j = i % I;
        const float g = __bfloat162float(gate_up[n * 2 * I + j]);
        const float u = __bfloat162float(gate_up[n * 2 * I + I + j]);
        const float da = __bfloat162float(d_act[i]);
        const float sig = 1.0f / (1.0f + expf(-g));
        d_gate_up[n * 2 * I + j] = __float2bfloat16_rn(da * u * sig * (1.0f + g * (1.0f - sig)));
        d_gate_up[n * 2 * I + I + j] = __float2bfloat16_rn(da * g * sig);
    }
}

// 8 columns per thread with 16-byte loads (I % 8 == 0, the usual case).
__global__ void swiglu_forward_vec8_kernel(bf16 *__restrict__ act, const bf16 *__restrict__ gate_up, int N, int I) {
    const int per_row = I / 8;
    const size_t total = (size_t)N * per_row;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t n = i / per_row, j = (i % per_row) * 8;
        float g[8], u[8], a[8];
        load8(gate_up + n * 2 * I + j, g);
        load8(gate_up + n * 2 * I + I + j, u);
#pragma unroll
        for (int e = 0; e < 8; e++) a[e] = g[e] / (1.0f + __expf(-g[e])) * u[e];
        store8(act + n * I + j, a);
    }
}

__global__ void swiglu_backward_vec8_kernel(bf16 *__restrict__ d_gate_up, const bf16 *__restrict__ d_act,
                                            const bf16 *__restrict__ gate_up, int N, int I) {
    const int per_row = I / 8;
    const size_t total = (size_t)N * per_row;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
        const size_t n = i / per_row, j = (i % per_row) * 8;
        float g[8], u[8], da[8], dg[8], du[8];
        load8(gate_up + n * 2 * I + j, g);
        load8(gate_up + n * 2 * I + I + j, u);
        load8(d_act + n * I + j, da);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const float sig = 1.0f / (1.0f + __expf(-g[e]));
            dg[e] = da[e] * u[e] * sig * (1.0f + g[e] * (1.0f - sig));
            du[e] = da[e] * g[e] * sig;
        }
        store8(d_gate_up + n * 2 * I + j, dg);
        store8(d_gate_up + n * 2 * I + I + j, du);
    }
}

extern "C" cudaError_t cuda_swiglu_forward(uint16_t *act, const uint16_t *gate_up, int N, int I, cudaStream_t stream) {
    const size_t total = (size_t)N * I;
    if (total == 0) return cudaSuccess;
    if (I % 8 == 0) {
        swiglu_forward_vec8_kernel<<<elementwise_blocks(total / 8), kElementwiseThreads, 0, stream>>>(
            as_bf16(act), as_bf16(gate_up), N, I);
        return cudaGetLastError();
    }
    swiglu_forward_kernel<<<elementwise_blocks(total), kElementwiseThreads, 0, stream>>>(as_bf16(act),
                                                                                        as_bf16(gate_up), N, I);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_swiglu_backward(uint16_t *d_gate_up, const uint16_t *d_act, const uint16_t *gate_up, int N,
                                            int I, cudaStream_t stream) {
    const size_t total = (size_t)N * I;
    if (total == 0) return cudaSuccess;
    if (I % 8 == 0) {
        swiglu_backward_vec8_kernel<<<elementwise_blocks(total / 8), kElementwiseThreads, 0, stream>>>(
            as_bf16(d_gate_up), as_bf16(d_act), as_bf16(gate_up), N, I);
        return cudaGetLastError();
    }
    swiglu_backward_kernel<<<elementwise_blocks(total), kElementwiseThreads, 0, stream>>>(
        as_bf16(d_gate_up), as_bf16(d_act), as_bf16(gate_up), N, I);
    return cudaGetLastError();
}
