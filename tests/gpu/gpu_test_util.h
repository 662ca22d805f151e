/* gpu_test_util.h: helpers for the GPU tests (tests/gpu, `make test-gpu`):
 * bf16 rounding on the host, device copies of host arrays, and the error
 * measures the tests compare with.
 *
 * Tolerances: CUDA computes in bf16 (8 significant bits, a rounding of
 * 2^-9 = 0.2% relative) with fp32 accumulation, the CPU reference in fp32 on
 * the same bf16-rounded inputs. One rounded bf16 output is within 0.4% of
 * the reference; a chain of ops compounds it. The tests compare
 *   rel_l2  = ||gpu - ref||_2 / ||ref||_2   (whole tensor), and
 *   rel_max = max |gpu - ref| / max |ref|,
 * with limits stated per test; a wrong index, sign or scale shows errors of
 * 0.3 and above. */
#ifndef MT_TESTS_GPU_TEST_UTIL_H
#define MT_TESTS_GPU_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "core/rng.h"

#define CHECK_CUDA(call)                                                                                         \
    do {                                                                                                         \
        cudaError_t e_ = (call);                                                                                 \
        if (e_ != cudaSuccess) {                                                                                 \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));               \
            exit(1);                                                                                             \
        }                                                                                                        \
    } while (0)

static inline uint16_t to_bf16(float f) { /* round to nearest even, as __float2bfloat16_rn */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40); /* NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

static inline float from_bf16(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float round_bf16(float f) { return from_bf16(to_bf16(f)); }

/* n normal(0, scale) floats, already rounded to bf16 values. */
static inline float *rand_bf16_values(Rng *rng, long n, double scale) {
    float *a = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    for (long i = 0; i < n; i++) a[i] = round_bf16((float)(scale * rng_normal(rng)));
    return a;
}

/* Device copies. */
static inline uint16_t *dev_bf16(const float *host, long n) {
    uint16_t *tmp = malloc((size_t)(n > 0 ? n : 1) * sizeof *tmp), *dev;
    for (long i = 0; i < n; i++) tmp[i] = to_bf16(host[i]);
    CHECK_CUDA(cudaMalloc((void **)&dev, (size_t)(n > 0 ? n : 1) * sizeof *dev));
    CHECK_CUDA(cudaMemcpy(dev, tmp, (size_t)n * sizeof *dev, cudaMemcpyHostToDevice));
    free(tmp);
    return dev;
}

static inline float *dev_f32(const float *host, long n) {
    float *dev;
    CHECK_CUDA(cudaMalloc((void **)&dev, (size_t)(n > 0 ? n : 1) * sizeof *dev));
    if (host) CHECK_CUDA(cudaMemcpy(dev, host, (size_t)n * sizeof *dev, cudaMemcpyHostToDevice));
    else CHECK_CUDA(cudaMemset(dev, 0, (size_t)n * sizeof *dev));
    return dev;
}

static inline void *dev_copy(const void *host, size_t bytes) {
    void *dev;
    CHECK_CUDA(cudaMalloc(&dev, bytes ? bytes : 1));
    CHECK_CUDA(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
    return dev;
}

static inline float *host_from_bf16(const uint16_t *dev, long n) {
    uint16_t *tmp = malloc((size_t)(n > 0 ? n : 1) * sizeof *tmp);
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(tmp, dev, (size_t)n * sizeof *tmp, cudaMemcpyDeviceToHost));
    float *out = malloc((size_t)(n > 0 ? n : 1) * sizeof *out);
    for (long i = 0; i < n; i++) out[i] = from_bf16(tmp[i]);
    free(tmp);
    return out;
}

static inline float *host_from_f32(const float *dev, long n) {
    float *out = malloc((size_t)(n > 0 ? n : 1) * sizeof *out);
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaMemcpy(out, dev, (size_t)n * sizeof *out, cudaMemcpyDeviceToHost));
    return out;
}

static inline double rel_l2(const float *got, const float *ref, long n) {
    double num = 0.0, den = 0.0;
    for (long i = 0; i < n; i++) {
        double d = (double)got[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
    return isfinite(num) ? sqrt(num / den) : INFINITY;
}

static inline double rel_max(const float *got, const float *ref, long n) {
    double err = 0.0, scale = 0.0;
    for (long i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        if (!(d <= err)) err = d; /* NaN propagates */
        if (fabs(ref[i]) > scale) scale = fabs(ref[i]);
    }
    return scale > 0.0 ? err / scale : err;
}

/* Print one comparison and return whether it is within limit. */
static inline int report(const char *what, double err, double limit) {
    int ok = err <= limit;
    printf("  %-44s %.3e (limit %.0e) %s\n", what, err, limit, ok ? "ok" : "FAIL");
    return ok;
}

#endif
