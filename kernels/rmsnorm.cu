// rmsnorm.cu: RMSNorm forward and backward over bf16 activations, with fp32
// statistics and gradient accumulators (the same math as the CPU reference,
// backend/backend.h):
//   forward:  y = x * r * w,  r = 1 / sqrt(mean(x^2) + eps)   (r saved)
//   backward: dx = r * (w * dy) - r^3 / C * x * sum_j(w_j * dy_j * x_j)
//             dw = sum over rows of dy * x * r
// The residual stream's gradient is kept in fp32 (dinp accumulates there)
// and mirrored in bf16 for the next matrix product.
#include "../src/backend/cuda/cuda_kernels.h"
#include "bf16.cuh"
#include "launch.cuh"

static const int kRowThreads = 256;  // one block per row (N rows of C): at most, row_threads(C) for a short row

__global__ void rmsnorm_forward_kernel(bf16 *__restrict__ out, float *__restrict__ rstd, const bf16 *__restrict__ inp,
                                       const bf16 *__restrict__ weight, int C, float eps) {
    __shared__ float scratch[32];
    const size_t row = blockIdx.x;
    const bf16 *x = inp + row * C;
    bf16 *y = out + row * C;
    float sum_sq = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const float v = __bfloat162float(x[c]);
        sum_sq += v * v;
    }
    sum_sq = block_sum(sum_sq, scratch);
    const float r = rsqrtf(sum_sq / (float)C + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        y[c] = __float2bfloat16_rn(__bfloat162float(x[c]) * r * __bfloat162float(weight[c]));
    if (threadIdx.x == 0) rstd[row] = r;
}

__global__ void rmsnorm_backward_input_kernel(float *__restrict__ dinp, bf16 *__restrict__ dinp_bf16,
                                              const bf16 *__restrict__ dout, const bf16 *__restrict__ inp,
                                              const bf16 *__restrict__ weight, const float *__restrict__ rstd,
                                              int C) {
    __shared__ float scratch[32];
    const size_t row = blockIdx.x;
    const bf16 *x = inp + row * C, *dy = dout + row * C;
    float dot = 0.0f;  // sum_j w_j * dy_j * x_j
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dot += __bfloat162float(weight[c]) * __bfloat162float(dy[c]) * __bfloat162float(x[c]);
    dot = block_sum(dot, scratch);
    const float r = rstd[row];
    const float coeff = r * r * r * dot / (float)C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const size_t at = row * C + c;
        const float g = dinp[at] + r * __bfloat162float(weight[c]) * __bfloat162float(dy[c]) -
                        coeff * __bfloat162float(x[c]);
        dinp[at] = g;
        if (dinp_bf16) dinp_bf16[at] = __float2bfloat16_rn(g);
    }
}

// dweight: block (x, y) owns 32 adjacent columns and rows y, y + gridDim.y *
// kRowLanes, ...; its kRowLanes row lanes are added in shared memory, then
// one atomicAdd per column and block.
static const int kColumnsPerBlock = 32, kRowLanes = 8, kRowChunks = 32;

__global__ void rmsnorm_backward_weight_kernel(float *__restrict__ dweight, const bf16 *__restrict__ dout,
                                               const bf16 *__restrict__ inp, const float *__restrict__ rstd, int N,
                                               int C) {
    __shared__ float partial[kRowLanes][kColumnsPerBlock];
    const int c = blockIdx.x * kColumnsPerBlock + threadIdx.x;
    float sum = 0.0f;
    if (c < C)
        for (int n = blockIdx.y * kRowLanes + threadIdx.y; n < N; n += kRowLanes * gridDim.y) {
            const size_t at = (size_t)n * C + c;
            sum += __bfloat162float(dout[at]) * __bfloat162float(inp[at]) * rstd[n];
        }
    partial[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float total = 0.0f;
        for (int lane = 0; lane < kRowLanes; lane++) total += partial[lane][threadIdx.x];
        atomicAdd(&dweight[c], total);
    }
}

extern "C" cudaError_t cuda_rmsnorm_forward(uint16_t *out, float *rstd, const uint16_t *inp, const uint16_t *weight,
                                            int N, int C, float eps, cudaStream_t stream) {
    if (N < 0 || C <= 0) return cudaErrorInvalidValue;
    if (N == 0) return cudaSuccess;
    rmsnorm_forward_kernel<<<N, row_threads(C, kRowThreads), 0, stream>>>(as_bf16(out), rstd, as_bf16(inp), as_bf16(weight), C, eps);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_rmsnorm_backward(float *dinp, uint16_t *dinp_bf16, float *dweight, const uint16_t *dout,
                                             const uint16_t *inp, const uint16_t *weight, const float *rstd, int N,
                                             int C, cudaStream_t stream) {
    if (N < 0 || C <= 0) return cudaErrorInvalidValue;
    if (N == 0) return cudaSuccess;
    rmsnorm_backward_input_kernel<<<N, row_threads(C, kRowThreads), 0, stream>>>(dinp, as_bf16(dinp_bf16), as_bf16(dout),
                                                                 as_bf16(inp), as_bf16(weight), rstd, C);
    cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
    const int chunks = (N + kRowLanes - 1) / kRowLanes < kRowChunks ? (N + kRowLanes - 1) / kRowLanes : kRowChunks;
    const dim3 grid((unsigned)((C + kColumnsPerBlock - 1) / kColumnsPerBlock), (unsigned)chunks);
    rmsnorm_backward_weight_kernel<<<grid, dim3(kColumnsPerBlock, kRowLanes), 0, stream>>>(
        dweight, as_bf16(dout), as_bf16(inp), rstd, N, C);
    return cudaGetLastError();
}
