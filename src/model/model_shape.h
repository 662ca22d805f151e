/* model_shape.h: what the CPU model (model_*.c) and the CUDA model
 * (cuda/cuda_model*.c) share that is not arithmetic, written once for both:
 *   - ModelShape: this rank's sizes under a ModelPartition (heads, kv heads,
 *     intermediate and vocabulary rows split over tp, the residual stream's
 *     rows under sequence parallel, the tp and cp ranks, the local layers of
 *     each model chunk), computed once at creation by model_shape_of;
 *   - the checks of a micro-batch (it fits the buffers; context parallel's
 *     even token count; sequence parallel's multiple of tp) and of its tokens;
 *   - this rank's positions under context parallel and their RoPE rows.
 * The CPU model keeps its ModelShape in ModelPriv.shape, the CUDA model in
 * CudaModel.shape; both read every size from it.
 *
 * Not here, and why:
 *   - The activation buffers. The two models keep different sets in
 *     different element types: the CPU keeps q and k before qk-norm, the
 *     attention probabilities, gate and up apart, one buffer per chunk
 *     output, all fp32; the CUDA model keeps the fused qkv and gate_up
 *     products, the attention's lse instead of its probabilities, bf16
 *     activations beside fp32 gradients, and lets a chunk write straight
 *     into the next chunk's input. One table of both would be a union with
 *     a flag per entry, so each model lays out its own buffers
 *     (model_create.c and cuda_model.c: layout_activations) with the rows
 *     (N, model_shape_rows) and widths (C, HD, KVD, I, V) from here.
 *   - The collectives of the tp/cp seams: host comm_* on the CPU, device_*
 *     on a stream on the GPU. Which seam runs follows .tp, .sp and .cp. */
#ifndef MT_MODEL_MODEL_SHAPE_H
#define MT_MODEL_MODEL_SHAPE_H

#include <stdbool.h>
#include <stdint.h>

#include "model.h"

typedef struct ModelShape {
    int C, D;                 /* hidden size, head dim (whole on every rank) */
    int H, KVH, I, V;         /* this rank's heads, kv heads, intermediate and vocabulary rows (tp splits them) */
    int HD, KVD;              /* H*D and KVH*D: the widths of q and of k (v) */
    int vocab;                /* the whole vocabulary: tokens lie in [0, vocab) */
    int vocab_start;          /* the first of the V vocabulary rows this rank holds */
    int tp, tp_rank;          /* 1 and 0 without tensor parallel */
    bool sp;                  /* sequence parallel (tp > 1 only): the residual stream holds N/tp rows */
    int cp, cp_rank;          /* 1 and 0 without context parallel; T counts this rank's tokens, T*cp the sequence's */
    int L;                    /* this rank's layers: its chunks' layers, chunk after chunk */
    int num_chunks;           /* model chunks: 1, or vpp with the interleaved pipeline schedule */
    int chunk_start[MT_MAX_CHUNKS], chunk_len[MT_MAX_CHUNKS]; /* each chunk's first local layer and layers */
    bool has_embed, has_head; /* the first and the last pipeline stage */
} ModelShape;

/* The shape of the rank `part` describes, for a resolved config. */
ModelShape model_shape_of(const ModelConfig *cfg, const ModelPartition *part);

/* Rows of the residual stream (and of the norms) for N rows of tokens: N/tp under sequence parallel, else N. */
static inline int model_shape_rows(const ModelShape *s, int N) { return s->sp ? N / s->tp : N; }
/* The first of the N rows that this rank's residual stream holds (its shard under sequence parallel). */
static inline int model_shape_row_offset(const ModelShape *s, int N) { return s->sp ? N / s->tp * s->tp_rank : 0; }
/* One past the last local layer of chunk `chunk`. */
static inline int model_shape_chunk_end(const ModelShape *s, int chunk) {
    return s->chunk_start[chunk] + s->chunk_len[chunk];
}

/* Dies (MT_EXIT_FAILURE, the message starting with `who`) unless a B x T
 * micro-batch fits buffers of max_B x max_T, has an even T under context
 * parallel and B*T a multiple of tp under sequence parallel. */
void model_check_batch(const ModelShape *s, const char *who, int B, int T, int max_B, int max_T);
/* Dies (MT_EXIT_USAGE) on a token outside [0, vocab): n inputs, or n
 * targets when `targets` (a target < 0 is ignored: no loss). */
void model_check_tokens(const ModelShape *s, const int32_t *tokens, long n, bool targets);

/* Every cp rank's T positions in the sequence of T*cp tokens, rank after rank
 * (model_cp_positions; 0..T-1 without context parallel): T*cp entries. */
void model_sequence_positions(const ModelShape *s, int T, int32_t *seq_pos);
/* cos and sin (T, D/2): the RoPE rows of this rank's T positions (rows of the
 * whole sequence's tables, rope_tables_init), and the positions (T; NULL: not wanted). */
void model_rope_rows(const ModelShape *s, const ModelConfig *cfg, int T, float *cos, float *sin, int32_t *positions);

#endif
