// bf16.cuh: bf16 helpers shared by the kernels (included, never compiled on
// its own): the raw-bits <-> __nv_bfloat16 casts at the C interface and
// loads of 8 bf16 (16 bytes) as fp32.
#ifndef MT_KERNELS_BF16_CUH
#define MT_KERNELS_BF16_CUH

#include <cuda_bf16.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

__host__ __device__ __forceinline__ bf16 *as_bf16(uint16_t *p) { return reinterpret_cast<bf16 *>(p); }
__host__ __device__ __forceinline__ const bf16 *as_bf16(const uint16_t *p) {
    return reinterpret_cast<const bf16 *>(p);
}

// 8 bf16 at p (16-byte aligned) into out[0..7] as fp32.
__device__ __forceinline__ void load8(const bf16 *p, float out[8]) {
    uint4 raw = *reinterpret_cast<const uint4 *>(p);
    const __nv_bfloat162 *pairs = reinterpret_cast<const __nv_bfloat162 *>(&raw);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float2 f = __bfloat1622float2(pairs[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
    }
}

// in[0..7] rounded to bf16 and stored at p (16-byte aligned).
__device__ __forceinline__ void store8(bf16 *p, const float in[8]) {
    uint4 raw;
    __nv_bfloat162 *pairs = reinterpret_cast<__nv_bfloat162 *>(&raw);
#pragma unroll
    for (int i = 0; i < 4; i++) pairs[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
    *reinterpret_cast<uint4 *>(p) = raw;
}

#endif
