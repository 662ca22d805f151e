// reduce.cu: reductions the trainer needs: the sum of squares of a large
// fp32 array, whole or over a list of chunks (global grad norm; per-block
// partial sums in double, added on the host in a fixed order) and column sums of a bf16 matrix into fp32
// (bias gradients).
#include "../src/backend/cuda/cuda_kernels.h"
#include "bf16.cuh"
#include "launch.cuh"

static const int kSumSqThreads = 512;

// partial[blockIdx.x] = the sum of every thread's `sum` (kSumSqThreads threads), in a fixed order.
__device__ __forceinline__ void store_block_sum(double *partial, double sum) {
    __shared__ double scratch[kSumSqThreads / 32];
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) scratch[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        for (int w = 0; w < kSumSqThreads / 32; w++) total += scratch[w];
        partial[blockIdx.x] = total;
    }
}

__global__ void sum_squares_kernel(double *__restrict__ partial, const float *__restrict__ x, size_t n) {
    double sum = 0.0;  // squares in double: no overflow where the CPU's double norm has none
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        sum += (double)x[i] * (double)x[i];
    store_block_sum(partial, sum);
}

// The same over chunks: block b visits chunks b, b + gridDim.x, ...
__global__ void sum_squares_chunks_kernel(double *__restrict__ partial, const float *__restrict__ x,
                                          const CudaAdamWChunk *__restrict__ chunks, int num_chunks) {
    double sum = 0.0;
    for (int c = blockIdx.x; c < num_chunks; c += gridDim.x) {
        const float *p = x + chunks[c].offset;
        for (unsigned i = threadIdx.x; i < chunks[c].length; i += blockDim.x) sum += (double)p[i] * (double)p[i];
    }
    store_block_sum(partial, sum);
}

// Of num_partial partial sums, the first `blocks` come from blocks that have work (a block with none would add
// zeros); the rest are set to zero, so the caller adds num_partial of them whatever the size.
static cudaError_t zero_rest(double *partial, int blocks, int num_partial, cudaStream_t stream) {
    if (blocks >= num_partial) return cudaSuccess;
    return cudaMemsetAsync(partial + blocks, 0, (size_t)(num_partial - blocks) * sizeof(double), stream);
}

extern "C" cudaError_t cuda_sum_squares_chunks(double *partial, int num_partial, const float *x,
                                               const CudaAdamWChunk *chunks, int num_chunks, cudaStream_t stream) {
    if (num_partial <= 0 || num_chunks < 0) return cudaErrorInvalidValue;
    const int blocks = num_chunks < 1 ? 1 : num_chunks < num_partial ? num_chunks : num_partial;
    sum_squares_chunks_kernel<<<blocks, kSumSqThreads, 0, stream>>>(partial, x, chunks, num_chunks);
    cudaError_t status = cudaGetLastError();
    return status != cudaSuccess ? status : zero_rest(partial, blocks, num_partial, stream);
}

extern "C" cudaError_t cuda_sum_squares(double *partial, int num_partial, const float *x, size_t n,
                                        cudaStream_t stream) {
    if (num_partial <= 0) return cudaErrorInvalidValue;
    const size_t needed = (n + kSumSqThreads - 1) / kSumSqThreads;
    const int blocks = needed < 1 ? 1 : needed < (size_t)num_partial ? (int)needed : num_partial;
    sum_squares_kernel<<<blocks, kSumSqThreads, 0, stream>>>(partial, x, n);
    cudaError_t status = cudaGetLastError();
    return status != cudaSuccess ? status : zero_rest(partial, blocks, num_partial, stream);
}

// out[c] += sum over rows of x[n, c] (x has row stride ld); block per 32 columns x row chunk.
__global__ void column_sum_kernel(float *__restrict__ out, const bf16 *__restrict__ x, int N, int C, int ld) {
    __shared__ float partial[8][32];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float sum = 0.0f;
    if (c < C)
        for (int n = blockIdx.y * 8 + threadIdx.y; n < N; n += 8 * gridDim.y) sum += __bfloat162float(x[(size_t)n * ld + c]);
    partial[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float total = 0.0f;
        for (int r = 0; r < 8; r++) total += partial[r][threadIdx.x];
        atomicAdd(&out[c], total);
    }
}

extern "C" cudaError_t cuda_column_sum_accumulate(float *out, const uint16_t *x, int N, int C, int ld,
                                                  cudaStream_t stream) {
    if (N <= 0 || C <= 0) return N == 0 ? cudaSuccess : cudaErrorInvalidValue;
    const int chunks = (N + 7) / 8 < 64 ? (N + 7) / 8 : 64;
    column_sum_kernel<<<dim3((unsigned)((C + 31) / 32), (unsigned)chunks), dim3(32, 8), 0, stream>>>(out, as_bf16(x),
                                                                                                  N, C, ld);
    return cudaGetLastError();
}
