/* model_fp8.h: private to src/model: the products of the linear layers,
 * in fp32 or, with precision: fp8 (model_set_fp8), as an exact emulation of
 * Hopper's FP8 products (model_fp8.c says how). A group is the products the
 * GPU computes as one FP8 product: q|k|v, o, gate|up, down; its parts share
 * the input x. */
#ifndef MT_MODEL_MODEL_FP8_H
#define MT_MODEL_MODEL_FP8_H

#include "model_internal.h"

/* The operands of a group's FP8 product, each cast with its own scale. */
typedef enum { FP8_INPUT, FP8_WEIGHT, FP8_GRAD, FP8_OPERANDS } Fp8Operand;
#define FP8_LAYER_TENSORS (LINEAR_NUM_GROUPS * FP8_OPERANDS)

/* fp8.recipe: delayed (model_fp8_state.c): the state of this rank's layers' casts, shared with clones. */
Fp8State *fp8_state_create(const Model *m, int len);
void fp8_state_free(Fp8State *s);
/* The scale the casts of (layer l, group, operand) use this step, and the record of one cast's amax. */
float fp8_state_scale(const Model *m, int l, LinearGroup group, Fp8Operand operand);
void fp8_state_record(Model *m, int l, LinearGroup group, Fp8Operand operand, float amax);

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
