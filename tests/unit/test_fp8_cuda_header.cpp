// test_fp8_cuda_header.cpp: src/core/fp8.c's conversions against CUDA's own,
// bit for bit: the conversion functions of the CUDA toolkit's cuda_fp8.hpp
// (NVIDIA's software form of the GPU's cvt.rn.satfinite.{e4m3,e5m2}x2.f32,
// what those functions compute on the host and on GPUs older than sm_89).
// test_fp8.c checks fp8.c against ml_dtypes; this checks it against the
// header the GPU's cast kernels will call (__nv_cvt_float_to_fp8 with
// __NV_SATFINITE), so that "the CPU emulation and the GPU casts agree bit
// for bit" (issue 20) holds on the CPU side of the seam. The hardware
// instruction itself is checked on a GPU, by a cast kernel against fp8.c.
//
// Checks, for E4M3 and E5M2:
//   - fp32 -> fp8 on every sign, exponent and top-8 mantissa bits with 21
//     patterns of the low 15 bits (zero, one, the tie bit, just below and
//     above it, all ones, each single bit, two fixed random ones), and on
//     every 97th fp32 pattern (MT_FP8_STRIDE=1: all 2^32, about 50 s);
//     NaN inputs give a NaN code from both (fp8.c keeps the input's sign,
//     CUDA gives 0x7f: fp8.h says why);
//   - bf16 -> fp8 on all 65,536 bf16 patterns (__nv_cvt_bfloat16raw_to_fp8
//     against fp8.c on the bf16 value widened to fp32, as a kernel that
//     casts a bf16 tensor would be checked);
//   - fp8 -> fp32 on all 256 codes (__nv_cvt_fp8_to_halfraw, then the exact
//     fp16 -> fp32 widening) against fp8_to_f32;
//   - fp8_quantize (x times the scale, rounded once) against the header's
//     cast of the fp32 product, as a scaled cast kernel computes it.
// Exits 0 when all agree, 1 on a difference (the first ones printed), 77
// (skipped) when the build had no cuda_fp8.h (MT_NO_CUDA_FP8).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "core/fp8.h"
}

#ifdef MT_NO_CUDA_FP8
int main(void) {
    printf("skipped: no cuda_fp8.h (the CUDA toolkit's include directory) at build time\n");
    return 77;
}
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

namespace {

const Fp8Format kFormats[2] = {FP8_E4M3, FP8_E5M2};
const __nv_fp8_interpretation_t kCuda[2] = {__NV_E4M3, __NV_E5M2};
const char *const kNames[2] = {"E4M3", "E5M2"};

long wrong = 0;

float f32_of(uint32_t bits) {
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

bool is_nan_code(uint8_t c, int fmt) { return fmt == 0 ? (c & 0x7f) == 0x7f : (c & 0x7f) > 0x7c; }

void report(const char *what, int fmt, uint32_t input, unsigned ours, unsigned cuda) {
    if (wrong++ < 20)
        printf("  %s %s of 0x%08x (%g): fp8.c 0x%02x, cuda_fp8.hpp 0x%02x\n", kNames[fmt], what, input,
               (double)f32_of(input), ours, cuda);
}

// One fp32 pattern through both conversions; a NaN input needs a NaN code from each.
void check_encode(uint32_t x, int fmt) {
    const float f = f32_of(x);
    const uint8_t ours = fp8_from_f32(f, kFormats[fmt]);
    const uint8_t cuda = __nv_cvt_float_to_fp8(f, __NV_SATFINITE, kCuda[fmt]);
    const bool nan = (x & 0x7fffffffu) > 0x7f800000u;
    if (nan ? !(is_nan_code(ours, fmt) && is_nan_code(cuda, fmt)) : ours != cuda) report("encode", fmt, x, ours, cuda);
}

long encode_structured(int fmt) {
    static const uint32_t low[] = {0x0000, 0x0001, 0x4000, 0x3fff, 0x4001, 0x7fff, 0x2a5b, 0x51c3};
    long n = 0;
    for (uint32_t sign = 0; sign < 2; sign++)
        for (uint32_t exp = 0; exp < 256; exp++)
            for (uint32_t top = 0; top < 256; top++) {
                const uint32_t head = sign << 31 | exp << 23 | top << 15;
                for (uint32_t l : low) {
                    check_encode(head | l, fmt);
                    n++;
                }
                for (int b = 1; b < 14; b++) {  // bits 0 and 14 are in low[] already
                    check_encode(head | 1u << b, fmt);
                    n++;
                }
            }
    return n;
}

long encode_strided(int fmt, uint64_t stride) {
    long n = 0;
    for (uint64_t x = 0; x <= 0xffffffffull; x += stride, n++) check_encode((uint32_t)x, fmt);
    return n;
}

long encode_bf16(int fmt) {
    for (uint32_t b = 0; b < 65536; b++) {
        __nv_bfloat16_raw raw;
        raw.x = (unsigned short)b;
        const float widened = f32_of(b << 16);
        const uint8_t ours = fp8_from_f32(widened, kFormats[fmt]);
        const uint8_t cuda = __nv_cvt_bfloat16raw_to_fp8(raw, __NV_SATFINITE, kCuda[fmt]);
        const bool nan = (b & 0x7fffu) > 0x7f80u;
        if (nan ? !(is_nan_code(ours, fmt) && is_nan_code(cuda, fmt)) : ours != cuda)
            report("bf16 encode", fmt, b << 16, ours, cuda);
    }
    return 65536;
}

long decode_all(int fmt) {
    for (unsigned c = 0; c < 256; c++) {
        const float ours = fp8_to_f32((uint8_t)c, kFormats[fmt]);
        const __half h = __half(__nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, kCuda[fmt]));
        const float cuda = __half2float(h);
        const bool both_nan = ours != ours && cuda != cuda;
        if (!both_nan && bits_of(ours) != bits_of(cuda) && wrong++ < 20)
            printf("  %s decode of 0x%02x: fp8.c %a, cuda_fp8.hpp %a\n", kNames[fmt], c, (double)ours, (double)cuda);
    }
    return 256;
}

// fp8_quantize(x, scale) against the header's cast of the fp32 product, on values spread over the range.
long quantize(int fmt) {
    enum { N = 4096 };
    static float x[N], q[N];
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const uint32_t r = (uint32_t)(s >> 32);
        x[i] = f32_of((r & 0x80000000u) | (0x30000000u + (r & 0x0fffffffu)));  // |x| from 2^-31 to 2^1
    }
    const float scales[] = {1.0f, 448.0f / 1.5f, 57344.0f / 1.5f, 0.001f, 3.0e5f};
    long n = 0;
    for (float scale : scales) {
        fp8_quantize(q, x, N, scale, kFormats[fmt]);
        for (int i = 0; i < N; i++, n++) {
            const uint8_t cuda = __nv_cvt_float_to_fp8(x[i] * scale, __NV_SATFINITE, kCuda[fmt]);
            const float want = fp8_to_f32(cuda, kFormats[fmt]);
            if (bits_of(q[i]) != bits_of(want) && wrong++ < 20)
                printf("  %s quantize of %a times %g: fp8.c %a, cuda_fp8.hpp %a\n", kNames[fmt], (double)x[i],
                       (double)scale, (double)q[i], (double)want);
        }
    }
    return n;
}

}  // namespace

int main(void) {
    const char *env = getenv("MT_FP8_STRIDE");
    const uint64_t stride = env && *env ? strtoull(env, NULL, 10) : 97;
    if (stride == 0) {
        printf("MT_FP8_STRIDE=%s: expected a positive integer\n", env);
        return 1;
    }
    for (int fmt = 0; fmt < 2; fmt++) {
        const long before = wrong;
        const long a = encode_structured(fmt), b = encode_strided(fmt, stride), c = encode_bf16(fmt),
                   d = decode_all(fmt), e = quantize(fmt);
        printf("%s: %ld structured and %ld strided (every %llu) fp32 inputs, %ld bf16 inputs, %ld codes decoded, "
               "%ld scaled casts: %ld differ\n",
               kNames[fmt], a, b, (unsigned long long)stride, c, d, e, wrong - before);
    }
    if (wrong) {
        printf("FAILED: %ld conversions differ from cuda_fp8.hpp\n", wrong);
        return 1;
    }
    printf("fp8.c agrees with cuda_fp8.hpp bit for bit (NaN inputs: a NaN code from both)\n");
    return 0;
}
#endif
