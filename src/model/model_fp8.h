/* model_fp8.h: private to src/model: the products of the linear layers,
 * in fp32 or, with precision: fp8 (model_set_fp8), as an exact emulation of
 * Hopper's FP8 products (model_fp8.c says how). A group is the products the
 * GPU computes as one FP8 product: q|k|v, o, gate|up, down; its parts share
 * the input x. */
#ifndef MT_MODEL_MODEL_FP8_H
#define MT_MODEL_MODEL_FP8_H

#include "model_internal.h"

/* One product of a group: out (N, OC) = x W^T + b with W (OC, IC). */
typedef struct LinearPart {
    const float *weight;  /* (OC, IC) */
    const float *bias;    /* (OC) or NULL */
    float *out;           /* forward: (N, OC) */
    const float *dout;    /* backward: (N, OC), the gradient of out */
    float *dweight;       /* backward: += dL/dW (NULL: frozen) */
    float *dbias;         /* backward: += dL/db (NULL: none) */
    int OC;
} LinearPart;

/* out of every part from x (N, IC). */
void linear_group_forward(Model *m, int l, LinearGroup group, const float *x, int N, int IC, const LinearPart *parts,
                          int count);
/* dx (N, IC) += the parts' gradients of x; their weight and bias gradients +=. x is the forward's input (the
 * kept activation). */
void linear_group_backward(Model *m, int l, LinearGroup group, float *dx, const float *x, int N, int IC,
                           const LinearPart *parts, int count);

#endif
