/* moe_dispatch.h: private to src/model: the routed experts of one MoE layer
 * over the expert-parallel group. Rows (token copies, grouped by global
 * expert) go to the rank holding their expert (all-to-all), are computed
 * there expert by expert, and come back in the order they left; the
 * backward is the mirror. With ep = 1 every exchange is a local copy.
 * With precision: fp8 each expert's products are FP8 products with their
 * own scales (moe_dispatch.c). */
#ifndef MT_MODEL_MOE_DISPATCH_H
#define MT_MODEL_MOE_DISPATCH_H

#include <stdint.h>

#include "model_internal.h"

typedef struct MoeExperts {
    int cap;                    /* rows the expert-side buffers hold (grown as needed) */
    long *send_rows, *recv_rows;          /* (ep) rows to / from each rank of the group */
    int64_t *send_counts, *recv_counts;   /* (ep * local experts) rows per (rank, local expert) */
    int rows;                   /* rows received by this rank's experts */
    int32_t *order;             /* (cap) expert-major row -> its row in the received order */
    int32_t *offsets;           /* (local experts + 1) expert-major blocks */
    float *recv;                /* (cap, C) rows in the received order (staging, both ways) */
    float *x, *gate, *up, *act, *y;       /* expert-major: (cap, C), (cap, I) x 3, (cap, C) */
    float *d_y, *d_act, *d_gate, *d_up, *d_x; /* their gradients */
    /* precision: fp8 (moe_dispatch.c): each local expert's scales of its two products (EXPERT_GATE_UP,
     * EXPERT_DOWN): the input's and the weights' of the last forward, the output gradient's of the last
     * backward; and room for the amaxes of the local experts' products (2 per expert) */
    float (*fp8_scales)[2][3];
    float *fp8_amax;
} MoeExperts;

/* An expert's two products, each one FP8 group (model_fp8.h): gate|up (sharing its input rows), down. */
enum { EXPERT_GATE_UP, EXPERT_DOWN };

void moe_experts_init(MoeExperts *x, const ModelConfig *cfg, int ep, int etp, int max_rows);
void moe_experts_free(MoeExperts *x);

/* out_rows = the experts of local layer l applied to in_rows: rows grouped
 * by global expert, offsets (E + 1) into them (this rank's tokens). */
void moe_experts_forward(Model *model, int l, MoeExperts *x, const float *in_rows, const int32_t *offsets,
                         float *out_rows);
/* d_in_rows (same order, overwritten) from d_out_rows; this rank's expert
 * weights' gradients accumulate (from every rank's rows routed to them). */
void moe_experts_backward(Model *model, int l, MoeExperts *x, const float *d_out_rows, float *d_in_rows);

#endif
