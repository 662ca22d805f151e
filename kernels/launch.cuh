// launch.cuh: launch-shape helpers shared by the kernels in this directory
// (included, never compiled on its own).
#ifndef MT_KERNELS_LAUNCH_CUH
#define MT_KERNELS_LAUNCH_CUH

#include <stddef.h>

// Threads per block of the elementwise kernels.
static const int kElementwiseThreads = 256;

// Blocks for a grid-stride loop over n elements: enough to fill the GPU,
// never more than one per kElementwiseThreads elements, at least 1. The CPU
// emulator (tests/gpu/emu) asks for at most EMU_ELEMENTWISE_BLOCKS: it runs
// each CUDA thread as a fibre, so one element a thread costs a fibre's start
// and switch an element; fewer threads looping over more elements compute
// the same values (the loops are written for any grid) at a fraction of that.
static inline unsigned int elementwise_blocks(size_t n) {
#ifdef EMU_ELEMENTWISE_BLOCKS
    const size_t max_blocks = EMU_ELEMENTWISE_BLOCKS;
#else
    const size_t max_blocks = 65535u * 8u;
#endif
    size_t blocks = (n + kElementwiseThreads - 1) / kElementwiseThreads;
    if (blocks > max_blocks) blocks = max_blocks;
    return blocks == 0 ? 1u : (unsigned int)blocks;
}

// Threads for a block-per-row kernel whose threads stride over `items` of a
// row: one item a thread up to `max_threads`, a whole number of warps (at
// least one). A short row (the tests' small models) then leaves no warp idle
// at the row's barriers; rows of `max_threads` items or more get max_threads.
static inline unsigned int row_threads(size_t items, unsigned int max_threads) {
    const size_t warps = (items + 31) / 32;
    const size_t threads = (warps > 0 ? warps : 1) * 32;
    return threads < max_threads ? (unsigned int)threads : max_threads;
}

// Sum of `value` over the warp; every lane gets the result.
__device__ __forceinline__ float warp_sum(float value) {
    for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
    return value;
}

// Sum of `value` over the block (blockDim.x a multiple of 32, at most 1024);
// every thread gets the result. `scratch` holds 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float value, float *scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int num_warps = blockDim.x >> 5;
    value = warp_sum(value);
    __syncthreads();  // scratch may still be read by a previous block_sum
    if (lane == 0) scratch[warp] = value;
    __syncthreads();
    value = lane < num_warps ? scratch[lane] : 0.0f;
    return warp_sum(value);
}

#endif
