/* cpu_elementwise.c: elementwise ops on the CPU: out = a + b (out may alias a or b). */
#include "cpu_ops.h"

void cpu_add(float *out, const float *a, const float *b, long n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) out[i] = a[i] + b[i];
}
