/* cpu_rope.c: rotary position embedding on the CPU, Hugging Face's
 * "rotate_half" convention (backend.h). x is (B, T, NH, D); cos and sin are
 * (T, D/2) tables from rope_tables_init (src/model/rope_tables.h).
 *
 *   forward:  out[i] = x[i] c - x[i+D/2] s,   out[i+D/2] = x[i+D/2] c + x[i] s
 *   backward (the transposed rotation, accumulated):
 *             dinp[i] += dout[i] c + dout[i+D/2] s,
 *             dinp[i+D/2] += dout[i+D/2] c - dout[i] s
 * Both read a pair before writing it, so out may equal inp.
 */
#include "cpu_ops.h"

void cpu_rope_forward(float *out, const float *inp, const float *cos, const float *sin, int B, int T, int NH,
                      int D) {
    int half = D / 2;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const float *c = cos + (size_t)t * half;
            const float *s = sin + (size_t)t * half;
            for (int h = 0; h < NH; h++) {
                size_t base = (((size_t)b * T + t) * NH + h) * D;
                const float *x = inp + base;
                float *y = out + base;
                for (int i = 0; i < half; i++) {
                    float x1 = x[i], x2 = x[i + half];
                    y[i] = x1 * c[i] - x2 * s[i];
                    y[i + half] = x2 * c[i] + x1 * s[i];
                }
            }
        }
    }
}

void cpu_rope_backward(float *dinp, const float *dout, const float *cos, const float *sin, int B, int T, int NH,
                       int D) {
    int half = D / 2;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            const float *c = cos + (size_t)t * half;
            const float *s = sin + (size_t)t * half;
            for (int h = 0; h < NH; h++) {
                size_t base = (((size_t)b * T + t) * NH + h) * D;
                const float *dy = dout + base;
                float *dx = dinp + base;
                for (int i = 0; i < half; i++) {
                    float g1 = dy[i], g2 = dy[i + half];
                    dx[i] += g1 * c[i] + g2 * s[i];
                    dx[i + half] += g2 * c[i] - g1 * s[i];
                }
            }
        }
    }
}
