/* model_parallel.h: private to src/model: the collectives of tensor,
 * sequence and context parallel inside forward and backward, the
 * vocab-parallel embedding and cross entropy (model_parallel.c). N is the
 * rows of the full (gathered) activations of this rank; with sequence
 * parallel the residual stream holds N/tp of them (model_shape_rows). */
#ifndef MT_MODEL_MODEL_PARALLEL_H
#define MT_MODEL_MODEL_PARALLEL_H

#include "model_internal.h"

/* Into the tensor-parallel region: the (N, C) input of a column-parallel
 * product from the residual-stream rows x (all-gathered into `full` under
 * sequence parallel; x itself otherwise). */
const float *tp_enter(const Model *m, float *full, const float *x, int N, int C);
/* Its backward: the gradient of x (residual rows): the tp sum of d_full (N, C),
 * in d_full itself, or reduce-scattered into `shard` under sequence parallel. */
const float *tp_enter_backward(const Model *m, float *d_full, float *shard, int N, int C);
/* Out of the region: the residual-row tp sum of a row-parallel product's
 * partial output (N, C): in partial itself, or in `shard` under sequence parallel. */
const float *tp_leave(const Model *m, float *partial, float *shard, int N, int C);
/* Its backward: the (N, C) gradient of the partial output from d_out (residual rows). */
const float *tp_leave_backward(const Model *m, float *d_full, const float *d_out, int N, int C);

/* v = its sum over the tp group, in rank order (the same bits on every rank). */
void tp_sum_doubles(const Model *m, double *v, size_t n);

/* Embedding of this rank's vocabulary rows, summed over tp into out (residual rows); scratch (N, C). */
void vocab_embedding_forward(const Model *m, float *out, float *scratch, const int32_t *tokens, int N);
/* d_embed += rows of d_out (residual rows; gathered through d_full (N, C)) for this rank's tokens. */
void vocab_embedding_backward(const Model *m, float *d_full, const float *d_out, const int32_t *tokens, int N);
/* Cross entropy over logits (N, V/tp) of this rank's vocabulary columns; row_lse (N) keeps each row's
 * logsumexp for the backward. Returns the sum over non-ignored rows (the same on every tp rank). */
double vocab_cross_entropy_forward(const Model *m, float *losses, double *row_lse, const float *logits,
                                   const int32_t *targets, int N);
/* dlogits (in place over the logits) = (softmax - onehot) * dloss for this rank's columns. */
void vocab_cross_entropy_backward(const Model *m, float *dlogits, const double *row_lse, const int32_t *targets,
                                  float dloss, int N);

/* Context parallel: all (B, T*cp, KVD) in sequence order from every rank's local (B, T, KVD). */
void cp_gather_kv(const Model *m, float *all, const float *local, int B, int T, int KVD);
/* d_local (B, T, KVD) += the cp sum of d_all at this rank's positions. */
void cp_scatter_kv_grad(const Model *m, float *d_local, const float *d_all, int B, int T, int KVD);
/* The sum of value over the cp group. */
double cp_sum(const Model *m, double value);

#endif
