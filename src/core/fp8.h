/* fp8.h: the two 8-bit float formats of Hopper's FP8 matrix products (OCP
 * FP8, as CUDA's __nv_fp8_e4m3 / __nv_fp8_e5m2 and ml_dtypes'
 * float8_e4m3fn / float8_e5m2 define them), converted exactly as the GPU's
 * saturating cast (__NV_SATFINITE) converts: the CPU emulation of
 * precision: fp8 and the GPU's casts give the same bits.
 *
 *   E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinity;
 *         largest 448, smallest normal 2^-6, smallest subnormal 2^-9;
 *         NaN is S.1111.111.
 *   E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits; largest 57344,
 *         smallest normal 2^-14, smallest subnormal 2^-16; +-inf and NaNs
 *         as IEEE.
 *
 * fp32 -> fp8 rounds to nearest, ties to even; a magnitude beyond the
 * largest finite value (infinity included) saturates to it, keeping the
 * sign; zero keeps its sign. fp8 -> fp32 is exact; a NaN code gives the quiet
 * fp32 NaN with the code's sign (0x7fc00000 / 0xffc00000).
 *
 * NaN -> fp8 keeps the input's sign and gives the canonical quiet NaN of the
 * format, as ml_dtypes does (tests/fixtures/fp8, docs/fp8.md): E4M3 0x7f /
 * 0xff, E5M2 0x7e / 0xfe, whatever the payload. CUDA's cast drops the sign
 * and gives 0x7f in both formats (__nv_cvt_float_to_fp8 in cuda_fp8.hpp makes
 * the input the canonical NaN first): CPU and GPU agree bit for bit on every
 * input but NaN, where both give a NaN (a GPU test compares NaNs as NaNs).
 */
#ifndef MT_CORE_FP8_H
#define MT_CORE_FP8_H

#include <stdint.h>

typedef enum { FP8_E4M3, FP8_E5M2 } Fp8Format;

/* The largest finite value: 448 (E4M3), 57344 (E5M2). */
float fp8_max(Fp8Format format);
uint8_t fp8_from_f32(float x, Fp8Format format);
float fp8_to_f32(uint8_t bits, Fp8Format format);

/* out[i] = the fp8 value of x[i] * scale (the fp32 product rounded as
 * fp8_from_f32), as an fp32 number: what an FP8 product reads. out may
 * equal x. */
void fp8_quantize(float *out, const float *x, long n, float scale, Fp8Format format);

/* max |x[i]| over the n values that are not NaN (0 for none), as Transformer Engine's amax kernels compute it
 * (fmaxf skips NaNs): a NaN never reaches a scale or an amax history. */
float fp8_amax(const float *x, long n);

#endif
