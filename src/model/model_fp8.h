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
#define FP8_EXPERT_TENSORS (2 * FP8_OPERANDS) /* a routed expert's gate|up and down */

/* fp8.recipe: delayed (model_fp8_state.c): the state of this rank's layers' casts, shared with clones. */
Fp8State *fp8_state_create(const Model *m, int len);
void fp8_state_free(Fp8State *s);
/* The scale the casts of (layer l, group, operand) use this step, and the record of one cast's amax. */
float fp8_state_scale(const Model *m, int l, LinearGroup group, Fp8Operand operand);
void fp8_state_record(Model *m, int l, LinearGroup group, Fp8Operand operand, float amax);
/* The same for routed expert `expert` (its index in the whole model)'s product (0 gate|up, 1 down). */
float fp8_state_expert_scale(const Model *m, int l, int expert, int product, Fp8Operand operand);
void fp8_state_expert_record(Model *m, int l, int expert, int product, Fp8Operand operand, float amax);
/* With delayed scaling, the divisor of a rank's output gradients for its casts: dp (a dp rank's gradients are dp
 * times one rank's, each rank's loss being its micro-batches' mean, the dp average after); 1 otherwise. */
float fp8_grad_divisor(const Model *m);

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

/* The pieces of a group, for products whose scales are found elsewhere: the MoE experts (moe_dispatch.c),
 * one product per expert, each with its own scales (TE's GroupedLinear). */

/* The parts' out from x with the scales given: sx of x, sw of the weights (E4M3). Without fp8 the backend's
 * matmuls (the scales unused). */
void linear_group_product_forward(Model *m, const float *x, int N, int IC, const LinearPart *parts, int count,
                                  float sx, float sw);
/* Its backward (as linear_group_backward): sx and sw the forward's, sg the output gradients' (fp8.grad_format). */
void linear_group_product_backward(Model *m, float *dx, const float *x, int N, int IC, const LinearPart *parts,
                                   int count, float sx, float sw, float sg);
/* This rank's amax of the parts' weights, and of their output gradients (N rows): the max over the parts, NaN if
 * one is NaN, 0 for no values. */
float linear_group_weight_amax(const LinearPart *parts, int count, int IC);
float linear_group_grad_amax(const LinearPart *parts, int count, int N);
/* amax[0..n) = each one's max over the cp group and, with over_tp, the tp group (NaN wins): what every rank of
 * those groups casts with. One collective per group for the n values (comm_all_reduce_max_float). */
void model_fp8_amax_reduce(const Model *m, float *amax, int n, bool over_tp);
/* The cast scale of an amax in format (fp8_scaling.h; fp8.margin; 1 where the amax is 0 or not finite). */
float model_fp8_scale(const Model *m, float amax, Fp8Format format);

#endif
