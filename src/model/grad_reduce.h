/* grad_reduce.h: the CPU model's gradients after a step's backward, over the
 * groups of the parallel layout (tensor, context, data and expert parallel,
 * and the tied embedding's two pipeline stages), and the sum of squares the
 * grad norm is made of. The CPU side of ModelDevice (model_device_cpu.c);
 * the CUDA model does the same on the GPU. */
#ifndef MT_MODEL_GRAD_REDUCE_H
#define MT_MODEL_GRAD_REDUCE_H

#include "../dist/grid.h"
#include "../dist/zero1.h"
#include "model.h"

/* Collective: this rank's gradients become its part of the single-rank
 * gradient: partial sums over tp (shared q/k norms; norms under sequence
 * parallel) summed, the tied embedding's two copies (first and last stage)
 * summed, the cp ranks' contributions summed, then the dp mean (with the
 * distributed optimizer `zero1`, reduce-scattered: this rank's parts only;
 * the experts of expert parallel: over the ranks holding the same experts). */
void model_reduce_grads(Model *m, const Grid *grid, const Zero1 *zero1);

/* Collective: the sum of squares of the whole pipeline stage's gradient:
 * every parameter counted once (ParamInfo.norm_owner), summed over tp (and
 * over the dp parts with the distributed optimizer, over ep for the
 * experts). The same bits on every rank of the stage; the caller sums the
 * stages. */
double model_grad_sumsq(const Model *m, const Grid *grid, const Zero1 *zero1);

#endif
