/* cpu_embedding.c: token embedding lookup (forward) and its scatter-add
 * gradient (backward) on the CPU.
 *
 * The backward is parallel over channel blocks: each thread owns a block of
 * columns of dwte and adds the rows of dout into it in token order, so a
 * token that occurs many times is summed in the same order for any thread
 * count (no atomics, deterministic bits).
 */
#include <string.h>

#include "cpu_ops.h"

void cpu_embedding_forward(float *out, const int32_t *tokens, const float *wte, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        memcpy(out + (size_t)n * C, wte + (size_t)tokens[n] * C, (size_t)C * sizeof(float));
    }
}

void cpu_embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int N, int C) {
    int num_blocks = (C + CPU_CHANNEL_BLOCK - 1) / CPU_CHANNEL_BLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < num_blocks; blk++) {
        int c0 = blk * CPU_CHANNEL_BLOCK;
        int c1 = c0 + CPU_CHANNEL_BLOCK < C ? c0 + CPU_CHANNEL_BLOCK : C;
        for (int n = 0; n < N; n++) {
            float *drow = dwte + (size_t)tokens[n] * C;
            const float *grow = dout + (size_t)n * C;
            for (int c = c0; c < c1; c++) drow[c] += grow[c];
        }
    }
}
