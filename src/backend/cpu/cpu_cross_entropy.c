/* cpu_cross_entropy.c: softmax cross entropy over the vocabulary on the CPU.
 *
 *   forward:  losses[n] = logsumexp(logits[n,:]) - logits[n, targets[n]]
 *             (0 where targets[n] < 0: ignored); returns the sum over the
 *             non-ignored rows, summed in row order in double.
 *   backward: dlogits[n,:] = (softmax(logits[n,:]) - onehot(targets[n])) * dloss,
 *             0 on ignored rows. OVERWRITES dlogits, which may equal logits:
 *             each row's max and sum are taken before any element is written.
 * A target >= V is a caller bug; its row gets a NaN loss and NaN gradients
 * instead of a read out of bounds.
 */
#include <math.h>
#include <stdlib.h>

#include "cpu_ops.h"
#include "../../core/error.h"

/* log(sum(exp(row))) in double, with the max subtracted first */
static double row_logsumexp(const float *row, int V, double *max_out) {
    double max_logit = -INFINITY;
    for (int i = 0; i < V; i++)
        if (row[i] > max_logit) max_logit = row[i];
    double sum = 0.0;
    for (int i = 0; i < V; i++) sum += exp((double)row[i] - max_logit);
    *max_out = max_logit;
    return max_logit + log(sum);
}

double cpu_cross_entropy_forward(float *losses, const float *logits, const int32_t *targets, int N, int V) {
    double *row_loss = mt_malloc((size_t)(N > 0 ? N : 1) * sizeof(double));
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        int32_t target = targets[n];
        if (target < 0) {
            row_loss[n] = 0.0;
        } else if (target >= V) {
            row_loss[n] = NAN;
        } else {
            const float *row = logits + (size_t)n * V;
            double max_logit;
            row_loss[n] = row_logsumexp(row, V, &max_logit) - (double)row[target];
        }
        losses[n] = (float)row_loss[n];
    }
    double total = 0.0;
    for (int n = 0; n < N; n++)
        if (targets[n] >= 0) total += row_loss[n];
    free(row_loss);
    return total;
}

void cpu_cross_entropy_backward(float *dlogits, const float *logits, const int32_t *targets, float dloss, int N,
                                int V) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        int32_t target = targets[n];
        const float *row = logits + (size_t)n * V;
        float *drow = dlogits + (size_t)n * V;
        if (target < 0) {
            for (int i = 0; i < V; i++) drow[i] = 0.0f;
            continue;
        }
        if (target >= V) {
            for (int i = 0; i < V; i++) drow[i] = NAN;
            continue;
        }
        double max_logit;
        double lse = row_logsumexp(row, V, &max_logit);
        for (int i = 0; i < V; i++) {
            double p = exp((double)row[i] - lse);
            drow[i] = (float)((p - (i == target ? 1.0 : 0.0)) * dloss);
        }
    }
}
