// rmsnorm.cu: RMSNorm forward and backward in fp32, the same semantics as
// the CPU reference (backend/backend.h): rstd is saved by the forward, the
// backward accumulates (+=) into dinp and dweight.
//   forward:  y = x * r * w,  r = 1 / sqrt(mean(x^2) + eps)
//   backward: dx = r * (w * dy) - r^3 / C * x * sum_j(w_j * dy_j * x_j)
//             dw = sum over rows of dy * x * r
#include "../src/backend/cuda/cuda_kernels.h"
#include "launch.cuh"

static const int kRowThreads = 256;  // one block per row (N rows of C)

__global__ void rmsnorm_forward_kernel(float *__restrict__ out, float *__restrict__ rstd,
                                       const float *__restrict__ inp, const float *__restrict__ weight, int C,
                                       float eps) {
    __shared__ float scratch[32];
    const size_t row = blockIdx.x;
    const float *x = inp + row * C;
    float *y = out + row * C;
    float sum_sq = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) sum_sq += x[c] * x[c];
    sum_sq = block_sum(sum_sq, scratch);
    const float r = rsqrtf(sum_sq / (float)C + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x) y[c] = x[c] * r * weight[c];
    if (threadIdx.x == 0) rstd[row] = r;
}

__global__ void rmsnorm_backward_input_kernel(float *__restrict__ dinp, const float *__restrict__ dout,
                                              const float *__restrict__ inp, const float *__restrict__ weight,
                                              const float *__restrict__ rstd, int C) {
    __shared__ float scratch[32];
    const size_t row = blockIdx.x;
    const float *x = inp + row * C, *dy = dout + row * C;
    float *dx = dinp + row * C;
    float dot = 0.0f;  // sum_j w_j * dy_j * x_j
    for (int c = threadIdx.x; c < C; c += blockDim.x) dot += weight[c] * dy[c] * x[c];
    dot = block_sum(dot, scratch);
    const float r = rstd[row];
    const float coeff = r * r * r * dot / (float)C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dx[c] += r * weight[c] * dy[c] - coeff * x[c];
}

// dweight: a block owns 32 adjacent columns (one warp-wide, coalesced slice
// of a row); its blockDim.y row lanes each sum every blockDim.y-th row, then
// the lanes are added in a fixed order. No atomics, so results are the same
// bits on every run.
static const int kColumnsPerBlock = 32, kRowLanes = 16;

__global__ void rmsnorm_backward_weight_kernel(float *__restrict__ dweight, const float *__restrict__ dout,
                                               const float *__restrict__ inp, const float *__restrict__ rstd,
                                               int N, int C) {
    __shared__ float partial[kRowLanes][kColumnsPerBlock];
    const int c = blockIdx.x * kColumnsPerBlock + threadIdx.x;
    float sum = 0.0f;
    if (c < C)
        for (int n = threadIdx.y; n < N; n += kRowLanes) {
            const size_t at = (size_t)n * C + c;
            sum += dout[at] * inp[at] * rstd[n];
        }
    partial[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float total = 0.0f;
        for (int lane = 0; lane < kRowLanes; lane++) total += partial[lane][threadIdx.x];
        dweight[c] += total;
    }
}

extern "C" cudaError_t cuda_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *weight, int N,
                                            int C, float eps, cudaStream_t stream) {
    if (N < 0 || C <= 0) return cudaErrorInvalidValue;
    if (N == 0) return cudaSuccess;
    rmsnorm_forward_kernel<<<N, kRowThreads, 0, stream>>>(out, rstd, inp, weight, C, eps);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_rmsnorm_backward(float *dinp, float *dweight, const float *dout, const float *inp,
                                             const float *weight, const float *rstd, int N, int C,
                                             cudaStream_t stream) {
    if (N < 0 || C <= 0) return cudaErrorInvalidValue;
    if (N == 0) return cudaSuccess;
    rmsnorm_backward_input_kernel<<<N, kRowThreads, 0, stream>>>(dinp, dout, inp, weight, rstd, C);
    cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) return status;
    const dim3 block(kColumnsPerBlock, kRowLanes);
    const unsigned int blocks = (unsigned int)((C + kColumnsPerBlock - 1) / kColumnsPerBlock);
    rmsnorm_backward_weight_kernel<<<blocks, block, 0, stream>>>(dweight, dout, inp, rstd, N, C);
    return cudaGetLastError();
}
