/* cpu_swiglu.c: the SwiGLU gate of the MLP on the CPU.
 *
 *   forward:  out = silu(gate) * up, silu(g) = g * sigmoid(g) (rounded to fp32
 *             before the product, as transformers' act_fn(gate) * up does)
 *   backward: dgate += dout * up * sigmoid(g) * (1 + g * (1 - sigmoid(g)))
 *             dup   += dout * silu(g)
 */
#include <math.h>

#include "cpu_ops.h"

static inline double sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

void cpu_swiglu_forward(float *out, const float *gate, const float *up, long n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        double g = gate[i];
        float silu = (float)(g * sigmoid(g));
        out[i] = silu * up[i];
    }
}

void cpu_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate, const float *up, long n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        double g = gate[i];
        double s = sigmoid(g);
        double dy = dout[i];
        dgate[i] += (float)(dy * up[i] * s * (1.0 + g * (1.0 - s)));
        dup[i] += (float)(dy * (g * s));
    }
}
