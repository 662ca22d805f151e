/* model_shape.c: this rank's sizes, the micro-batch and token checks, and
 * the positions and RoPE rows of a context-parallel rank, for both the CPU
 * and the CUDA model (model_shape.h). */
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "model_shape.h"
#include "rope_tables.h"

ModelShape model_shape_of(const ModelConfig *cfg, const ModelPartition *part) {
    ModelShape s = {.C = cfg->hidden_size, .D = cfg->head_dim, .vocab = cfg->vocab_size};
    s.tp = part->tp > 1 ? part->tp : 1;
    s.tp_rank = s.tp > 1 ? part->tp_rank : 0;
    s.sp = s.tp > 1 && part->sequence_parallel;
    s.cp = part->cp > 1 ? part->cp : 1;
    s.cp_rank = s.cp > 1 ? part->cp_rank : 0;
    s.H = cfg->num_attention_heads / s.tp;
    s.KVH = cfg->num_key_value_heads / s.tp;
    s.I = cfg->intermediate_size / s.tp;
    s.V = cfg->vocab_size / s.tp;
    s.HD = s.H * s.D;
    s.KVD = s.KVH * s.D;
    s.vocab_start = s.V * s.tp_rank;
    s.L = part->num_layers;
    s.num_chunks = part->num_chunks;
    for (int v = 0, l = 0; v < part->num_chunks && v < MT_MAX_CHUNKS; v++) {
        s.chunk_start[v] = l;
        s.chunk_len[v] = part->chunk_layers[v];
        l += part->chunk_layers[v];
    }
    s.has_embed = part->has_embed;
    s.has_head = part->has_head;
    return s;
}

void model_check_batch(const ModelShape *s, const char *who, int B, int T, int max_B, int max_T) {
    if (B <= 0 || T <= 0 || B > max_B || T > max_T)
        mt_die(MT_EXIT_FAILURE, "%s: micro-batch %d x %d does not fit the buffers (%d x %d)", who, B, T, max_B, max_T);
    if (s->cp > 1 && T % 2 != 0)
        mt_die(MT_EXIT_FAILURE, "%s: context parallel needs an even number of tokens per rank, found %d", who, T);
    if (s->sp && (B * T) % s->tp != 0)
        mt_die(MT_EXIT_FAILURE, "%s: sequence parallel needs B*T (%d) to be a multiple of tp (%d)", who, B * T, s->tp);
}

void model_check_tokens(const ModelShape *s, const int32_t *tokens, long n, bool targets) {
    for (long i = 0; i < n; i++)
        if (tokens[i] >= s->vocab || (tokens[i] < 0 && !targets))
            mt_die(MT_EXIT_USAGE, "model_forward: %s token %d at position %ld is outside the vocabulary [0, %d)",
                   targets ? "target" : "input", tokens[i], i, s->vocab);
}

void model_sequence_positions(const ModelShape *s, int T, int32_t *seq_pos) {
    for (int r = 0; r < s->cp; r++) model_cp_positions(T, s->cp, r, seq_pos + (size_t)r * T);
}

void model_rope_rows(const ModelShape *s, const ModelConfig *cfg, int T, float *cos, float *sin, int32_t *positions) {
    if (T <= 0) return;
    const int half = cfg->head_dim / 2, Tall = T * s->cp;
    float *cos_all = mt_malloc((size_t)Tall * half * sizeof(float) + 1);
    float *sin_all = mt_malloc((size_t)Tall * half * sizeof(float) + 1);
    int32_t *mine = mt_malloc((size_t)T * sizeof(int32_t));
    rope_tables_init(cos_all, sin_all, Tall, cfg->head_dim, cfg->rope_theta, &cfg->rope_scaling);
    model_cp_positions(T, s->cp, s->cp_rank, mine);
    for (int t = 0; t < T; t++) {
        memcpy(cos + (size_t)t * half, cos_all + (size_t)mine[t] * half, (size_t)half * sizeof(float));
        memcpy(sin + (size_t)t * half, sin_all + (size_t)mine[t] * half, (size_t)half * sizeof(float));
    }
    if (positions) memcpy(positions, mine, (size_t)T * sizeof(int32_t));
    free(cos_all);
    free(sin_all);
    free(mine);
}
