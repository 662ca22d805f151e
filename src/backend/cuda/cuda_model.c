/* cuda_model.c: the dense transformer on one GPU (see cuda_model.h).
 *
 * Per layer, forward (bf16 activations, fp32 statistics):
 *   attn_normed = rmsnorm(resid_in)
 *   qkv         = attn_normed @ [Wq; Wk; Wv]^T   one product when the three
 *                 weights are adjacent in the registry (no biases), else three
 *                 products with the bias epilogue into column slices of qkv
 *   q, k, v     = qkv_rope(qkv)                  qk-norm + RoPE + split, one kernel
 *   attn_out    = flash attention(q, k, v)       lse kept, never T x T
 *   resid_mid   = resid_in + attn_out @ Wo^T     residual add in the epilogue
 *   mlp_normed  = rmsnorm(resid_mid)
 *   gate_up     = mlp_normed @ [Wgate; Wup]^T    gate and up are adjacent: one product
 *   act         = silu(gate) * up
 *   out         = resid_mid + act @ Wdown^T      residual add in the epilogue
 * then final norm, logits (bf16) and the fused cross entropy, whose backward
 * overwrites the logits with their gradient. The residual stream's gradient
 * is accumulated in fp32 (d_resid) and mirrored in bf16 (d_resid16) for the
 * products; weight gradients accumulate in fp32 straight from cuBLASLt. */
#include "cuda_model.h"

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/timer.h"
#include "../backend.h"
#include "cuda_check.h"
#include "cuda_context.h"
#include "cuda_gemm.h"
#include "cuda_kernels.h"
#include "../../dist/comm_nccl.h"

typedef uint16_t bf16_t;

/* MEGATRAIN_CUDA_PROFILE=N: every op is timed (the stream is synchronised
 * around it, so the run is slower) and the totals per kind of op are printed
 * after the first N optimizer steps (the first step included: it holds the
 * one-time choices of cuBLASLt algorithms). */
typedef enum {
    PROF_GEMM, PROF_ATTN_FWD, PROF_ATTN_BWD, PROF_NORM, PROF_ROPE, PROF_SWIGLU, PROF_LOSS, PROF_EMBED,
    PROF_OPTIMIZER, PROF_COUNT
} ProfKind;
static const char *const prof_names[PROF_COUNT] = {
    "matrix products (cuBLASLt)", "attention forward", "attention backward", "rmsnorm", "qk-norm + rope",
    "swiglu", "cross entropy", "embedding", "grad norm + AdamW"};

/* Offsets (in floats) of one layer's parameters in the flat layout; -1 when absent. */
typedef struct LayerOffsets {
    long attn_norm, q, q_bias, k, k_bias, v, v_bias, q_norm, k_norm, o, mlp_norm, gate, up, down;
} LayerOffsets;

/* What forward keeps of one layer. */
typedef struct LayerSaved {
    bf16_t *resid_in, *attn_normed, *qkv, *q, *k, *v, *attn_out, *resid_mid, *mlp_normed, *gate_up, *act;
    float *attn_rstd, *q_rstd, *k_rstd, *lse, *mlp_rstd;
} LayerSaved;

struct CudaModel {
    ModelConfig cfg;
    const ParamInfo *info;     /* the host model's registry */
    int num_params;
    long num_floats;
    int max_B, max_T, B, T;
    CudaContext ctx;
    char device_name[320];

    void *arena;               /* the one allocation */
    size_t arena_bytes, peak_used;
    float *params, *grads, *exp_avg, *exp_avg_sq;
    bf16_t *params16;
    LayerOffsets *layers;
    long embed, final_norm, lm_head;
    int qkv_fused;             /* q, k, v weights adjacent (no biases): one product */

    float *rope_cos, *rope_sin;
    int32_t *inputs, *targets; /* device, max_B * max_T */
    int32_t *host_targets;
    LayerSaved *saved;
    bf16_t *final_resid, *final_normed, *logits;
    float *final_rstd, *losses, *ce_lse;
    float *host_losses;
    long num_targets;
    int backward_ready;

    /* backward scratch */
    float *d_resid;
    bf16_t *d_resid16, *d_normed, *d_act, *d_gate_up, *d_attn_out, *dq, *dk, *dv, *d_qkv;
    void *attn_workspace;

    /* data-parallel gradient averaging (cuda_model_set_grad_sync) */
    NcclComm *grad_sync;
    cudaStream_t comm_stream;
    cudaEvent_t *layer_done;   /* num_layers + 1: one per layer, one for the rest */
    cudaEvent_t comm_done;
    long *layer_begin, *layer_end; /* each layer's [begin, end) in the flat layout */

    int prof_on, prof_steps;
    double prof_t0, prof_s[PROF_COUNT];
    long prof_calls[PROF_COUNT];

    CudaAdamWChunk *chunks;    /* device */
    int num_chunks;
    double *norm_partial, *host_norm_partial;
};

enum { NORM_PARTIALS = 1024 };

/* Run a statement (an op's launch) and, when profiling, time it as `kind`. */
#define TIMED(m, kind, ...)      \
    do {                         \
        prof_begin(m);           \
        __VA_ARGS__;             \
        prof_end(m, kind);       \
    } while (0)

static void prof_begin(CudaModel *m) {
    if (!m->prof_on) return;
    CUDA_CHECK(cudaStreamSynchronize(m->ctx.stream));
    m->prof_t0 = mt_now();
}

static void prof_end(CudaModel *m, ProfKind kind) {
    if (!m->prof_on) return;
    CUDA_CHECK(cudaStreamSynchronize(m->ctx.stream));
    m->prof_s[kind] += mt_now() - m->prof_t0;
    m->prof_calls[kind]++;
}

static void prof_report(const CudaModel *m) {
    double total = 0.0;
    for (int k = 0; k < PROF_COUNT; k++) total += m->prof_s[k];
    if (!m->prof_on || total <= 0.0) return;
    mt_log("CUDA profile (MEGATRAIN_CUDA_PROFILE) over %d step(s): time in each kind of op, the stream synchronised "
           "around each", m->prof_steps);
    for (int k = 0; k < PROF_COUNT; k++)
        if (m->prof_calls[k])
            mt_log("  %-28s %9.1f ms %5.1f%%  (%ld calls, %.3f ms each)", prof_names[k], m->prof_s[k] * 1e3,
                   100.0 * m->prof_s[k] / total, m->prof_calls[k], m->prof_s[k] * 1e3 / m->prof_calls[k]);
}

/* ---- arena --------------------------------------------------------------- */

/* Two passes over the same layout: the first (base NULL) counts bytes, the second hands out pointers. */
typedef struct Carver {
    char *base;
    size_t used;
} Carver;

static void *carve(Carver *c, size_t bytes) {
    c->used = (c->used + 255) & ~(size_t)255; /* 256-byte alignment for cuBLASLt and vector loads */
    void *p = c->base ? c->base + c->used : NULL;
    c->used += bytes;
    return p;
}

#define CARVE(c, ptr, count) ((ptr) = carve((c), (size_t)(count) * sizeof *(ptr)))

static void layout(CudaModel *m, Carver *c) {
    const ModelConfig *cfg = &m->cfg;
    const size_t P = (size_t)m->num_floats, N = (size_t)m->max_B * m->max_T;
    const size_t C = cfg->hidden_size, I = cfg->intermediate_size, D = cfg->head_dim;
    const size_t H = cfg->num_attention_heads, KVH = cfg->num_key_value_heads, V = cfg->vocab_size;
    const size_t HD = H * D, KVD = KVH * D, QKV = HD + 2 * KVD;
    CARVE(c, m->params, P);
    CARVE(c, m->grads, P);
    CARVE(c, m->exp_avg, P);
    CARVE(c, m->exp_avg_sq, P);
    CARVE(c, m->params16, P);
    CARVE(c, m->rope_cos, (size_t)m->max_T * (D / 2));
    CARVE(c, m->rope_sin, (size_t)m->max_T * (D / 2));
    CARVE(c, m->inputs, N);
    CARVE(c, m->targets, N);
    for (int l = 0; l < cfg->num_layers; l++) {
        LayerSaved *s = &m->saved[l];
        if (l == 0) CARVE(c, s->resid_in, N * C); /* later layers read the previous layer's output */
        CARVE(c, s->attn_normed, N * C);
        CARVE(c, s->qkv, N * QKV);
        CARVE(c, s->q, N * HD);
        CARVE(c, s->k, N * KVD);
        CARVE(c, s->v, N * KVD);
        CARVE(c, s->attn_out, N * HD);
        CARVE(c, s->resid_mid, N * C);
        CARVE(c, s->mlp_normed, N * C);
        CARVE(c, s->gate_up, N * 2 * I);
        CARVE(c, s->act, N * I);
        CARVE(c, s->attn_rstd, N);
        CARVE(c, s->mlp_rstd, N);
        CARVE(c, s->lse, N * H);
        if (cfg->qk_norm) {
            CARVE(c, s->q_rstd, N * H);
            CARVE(c, s->k_rstd, N * KVH);
        }
        bf16_t *out;
        CARVE(c, out, N * C);
        if (l + 1 < cfg->num_layers) m->saved[l + 1].resid_in = out;
        else m->final_resid = out;
    }
    CARVE(c, m->final_normed, N * C);
    CARVE(c, m->final_rstd, N);
    CARVE(c, m->logits, N * V);
    CARVE(c, m->losses, N);
    CARVE(c, m->ce_lse, N);
    CARVE(c, m->d_resid, N * C);
    CARVE(c, m->d_resid16, N * C);
    CARVE(c, m->d_normed, N * C);
    CARVE(c, m->d_act, N * I);
    CARVE(c, m->d_gate_up, N * 2 * I);
    CARVE(c, m->d_attn_out, N * HD);
    CARVE(c, m->dq, N * HD);
    CARVE(c, m->dk, N * KVD);
    CARVE(c, m->dv, N * KVD);
    CARVE(c, m->d_qkv, N * QKV);
    m->attn_workspace = carve(c, cuda_attention_workspace_bytes(m->max_B, m->max_T, (int)H, (int)KVH, (int)D));
    CARVE(c, m->chunks, m->num_chunks);
    CARVE(c, m->norm_partial, NORM_PARTIALS);
}

/* ---- host <-> device copies ------------------------------------------------ */

/* A copy ordered after everything already enqueued on the model's stream,
 * finished on return. (A plain cudaMemcpy runs on the legacy default stream,
 * which does not wait for our non-blocking stream: the arena's initial
 * memset could then land after, and erase, what was copied in.) */
static void copy_in_order(CudaModel *m, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, m->ctx.stream));
    CUDA_CHECK(cudaStreamSynchronize(m->ctx.stream));
}

/* ---- registry ------------------------------------------------------------ */

static long offset_of(const Model *host, const char *fmt, int layer, int required) {
    char name[128];
    snprintf(name, sizeof name, fmt, layer);
    const ParamInfo *p = model_find_param(host, name);
    if (!p && required) mt_die(MT_EXIT_FAILURE, "CUDA model: parameter %s is missing from the registry", name);
    return p ? (long)p->offset : -1;
}

static void find_offsets(CudaModel *m, const Model *host) {
    const ModelConfig *cfg = &m->cfg;
    for (int l = 0; l < cfg->num_layers; l++) {
        LayerOffsets *o = &m->layers[l];
        o->attn_norm = offset_of(host, "layers.%d.attn_norm.weight", l, 1);
        o->q = offset_of(host, "layers.%d.attn.q_proj.weight", l, 1);
        o->k = offset_of(host, "layers.%d.attn.k_proj.weight", l, 1);
        o->v = offset_of(host, "layers.%d.attn.v_proj.weight", l, 1);
        o->q_bias = offset_of(host, "layers.%d.attn.q_proj.bias", l, cfg->attention_bias);
        o->k_bias = offset_of(host, "layers.%d.attn.k_proj.bias", l, cfg->attention_bias);
        o->v_bias = offset_of(host, "layers.%d.attn.v_proj.bias", l, cfg->attention_bias);
        o->q_norm = offset_of(host, "layers.%d.attn.q_norm.weight", l, cfg->qk_norm);
        o->k_norm = offset_of(host, "layers.%d.attn.k_norm.weight", l, cfg->qk_norm);
        o->o = offset_of(host, "layers.%d.attn.o_proj.weight", l, 1);
        o->mlp_norm = offset_of(host, "layers.%d.mlp_norm.weight", l, 1);
        o->gate = offset_of(host, "layers.%d.mlp.gate_proj.weight", l, 1);
        o->up = offset_of(host, "layers.%d.mlp.up_proj.weight", l, 1);
        o->down = offset_of(host, "layers.%d.mlp.down_proj.weight", l, 1);
        const long C = cfg->hidden_size, I = cfg->intermediate_size;
        const long HD = (long)cfg->num_attention_heads * cfg->head_dim;
        const long KVD = (long)cfg->num_key_value_heads * cfg->head_dim;
        if (o->up != o->gate + I * C)
            mt_die(MT_EXIT_FAILURE, "CUDA model: layer %d: gate_proj and up_proj are not adjacent", l);
        const int fused = o->k == o->q + HD * C && o->v == o->k + KVD * C && o->q_bias < 0;
        if (l == 0) m->qkv_fused = fused;
        else if (fused != m->qkv_fused) mt_die(MT_EXIT_FAILURE, "CUDA model: layers differ in q/k/v layout");
    }
    m->embed = offset_of(host, "embed.weight", 0, 1);
    m->final_norm = offset_of(host, "final_norm.weight", 0, 1);
    m->lm_head = cfg->tie_word_embeddings ? m->embed : offset_of(host, "lm_head.weight", 0, 1);
}

/* AdamW chunks: every parameter cut into runs of at most MT_ADAMW_CHUNK floats. */
static CudaAdamWChunk *build_chunks(const Model *host, int *count) {
    int n = 0;
    for (int i = 0; i < host->num_params; i++) n += (int)((host->param_info[i].numel + MT_ADAMW_CHUNK - 1) / MT_ADAMW_CHUNK);
    CudaAdamWChunk *chunks = mt_malloc((size_t)n * sizeof *chunks);
    int k = 0;
    for (int i = 0; i < host->num_params; i++) {
        const ParamInfo *p = &host->param_info[i];
        for (long start = 0; start < p->numel; start += MT_ADAMW_CHUNK) {
            long len = p->numel - start < MT_ADAMW_CHUNK ? p->numel - start : MT_ADAMW_CHUNK;
            chunks[k++] = (CudaAdamWChunk){.offset = p->offset + (size_t)start, .length = (unsigned)len,
                                           .decay = !p->no_decay};
        }
    }
    *count = n;
    return chunks;
}

/* ---- creation ------------------------------------------------------------ */

CudaModel *cuda_model_create(const Model *host, int device, int max_B, int max_T, char *err, size_t errlen) {
    CudaModel *m = mt_calloc(1, sizeof *m);
    m->cfg = host->cfg;
    m->info = host->param_info;
    m->num_params = host->num_params;
    m->num_floats = host->num_floats;
    m->max_B = max_B;
    m->max_T = max_T;
    const char *profile = getenv("MEGATRAIN_CUDA_PROFILE");
    m->prof_on = profile && atoi(profile) > 0 ? atoi(profile) : 0;
    if (m->cfg.head_dim > 128 || m->cfg.head_dim % 16 != 0) {
        mt_set_error(err, errlen, "model.head_dim: %d is not supported on CUDA (a multiple of 16, at most 128)",
                     m->cfg.head_dim);
        free(m);
        return NULL;
    }
    if (cuda_context_create(&m->ctx, device, err, errlen) != 0) {
        free(m);
        return NULL;
    }
    struct cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    snprintf(m->device_name, sizeof m->device_name, "%s (sm_%d%d, %d SMs)", prop.name, prop.major, prop.minor,
             prop.multiProcessorCount);

    m->layers = mt_calloc((size_t)m->cfg.num_layers, sizeof *m->layers);
    m->saved = mt_calloc((size_t)m->cfg.num_layers, sizeof *m->saved);
    find_offsets(m, host);
    CudaAdamWChunk *chunks = build_chunks(host, &m->num_chunks);

    Carver counter = {NULL, 0};
    layout(m, &counter);
    m->arena_bytes = counter.used;
    cudaError_t status = cudaMalloc(&m->arena, m->arena_bytes);
    if (status != cudaSuccess) {
        size_t free_bytes = 0, total = 0;
        cudaMemGetInfo(&free_bytes, &total);
        mt_set_error(err, errlen,
                     "CUDA device %d: cannot allocate %.2f GiB for the model (weights, grads, AdamW states and "
                     "activations for micro-batches of %d x %d); %.2f GiB free of %.2f: lower "
                     "train.micro_batch_size or train.seq_len",
                     device, m->arena_bytes / 1073741824.0, max_B, max_T, free_bytes / 1073741824.0,
                     total / 1073741824.0);
        free(chunks);
        cuda_model_free(m);
        return NULL;
    }
    Carver carver = {m->arena, 0};
    layout(m, &carver);
    CUDA_CHECK(cudaMemsetAsync(m->arena, 0, m->arena_bytes, m->ctx.stream));

    const int half = m->cfg.head_dim / 2;
    float *cos_table = mt_malloc((size_t)max_T * half * sizeof(float));
    float *sin_table = mt_malloc((size_t)max_T * half * sizeof(float));
    rope_tables_init(cos_table, sin_table, max_T, m->cfg.head_dim, m->cfg.rope_theta, &m->cfg.rope_scaling);
    copy_in_order(m, m->rope_cos, cos_table, (size_t)max_T * half * sizeof(float), cudaMemcpyHostToDevice);
    copy_in_order(m, m->rope_sin, sin_table, (size_t)max_T * half * sizeof(float), cudaMemcpyHostToDevice);
    free(cos_table);
    free(sin_table);
    copy_in_order(m, m->chunks, chunks, (size_t)m->num_chunks * sizeof *chunks, cudaMemcpyHostToDevice);
    free(chunks);
    m->host_targets = mt_malloc((size_t)max_B * max_T * sizeof(int32_t));
    m->host_losses = mt_malloc((size_t)max_B * max_T * sizeof(float));
    m->host_norm_partial = mt_malloc(NORM_PARTIALS * sizeof(double));
    cuda_model_upload(m, host->params, NULL, NULL);
    cuda_model_peak_bytes(m);
    return m;
}

void cuda_model_free(CudaModel *m) {
    if (!m) return;
    if (m->prof_steps < m->prof_on) prof_report(m);
    if (m->layer_done) {
        for (int l = 0; l <= m->cfg.num_layers; l++) cudaEventDestroy(m->layer_done[l]);
        cudaEventDestroy(m->comm_done);
        cudaStreamDestroy(m->comm_stream);
        free(m->layer_done);
        free(m->layer_begin);
        free(m->layer_end);
    }
    if (m->arena) {
        cudaStreamSynchronize(m->ctx.stream);
        cudaFree(m->arena);
    }
    cuda_gemm_cache_clear();
    cuda_context_destroy(&m->ctx);
    free(m->layers);
    free(m->saved);
    free(m->host_targets);
    free(m->host_losses);
    free(m->host_norm_partial);
    free(m);
}

/* ---- host <-> device ----------------------------------------------------- */

void cuda_model_upload(CudaModel *m, const float *params, const float *exp_avg, const float *exp_avg_sq) {
    const size_t bytes = (size_t)m->num_floats * sizeof(float);
    if (params) {
        copy_in_order(m, m->params, params, bytes, cudaMemcpyHostToDevice);
        CUDA_CHECK(cuda_cast_fp32_to_bf16(m->params16, m->params, (size_t)m->num_floats, m->ctx.stream));
    }
    if (exp_avg) copy_in_order(m, m->exp_avg, exp_avg, bytes, cudaMemcpyHostToDevice);
    if (exp_avg_sq) copy_in_order(m, m->exp_avg_sq, exp_avg_sq, bytes, cudaMemcpyHostToDevice);
    CUDA_CHECK(cudaStreamSynchronize(m->ctx.stream));
}

void cuda_model_download(CudaModel *m, float *params, float *exp_avg, float *exp_avg_sq) {
    const size_t bytes = (size_t)m->num_floats * sizeof(float);
    CUDA_CHECK(cudaStreamSynchronize(m->ctx.stream));
    if (params) copy_in_order(m, params, m->params, bytes, cudaMemcpyDeviceToHost);
    if (exp_avg) copy_in_order(m, exp_avg, m->exp_avg, bytes, cudaMemcpyDeviceToHost);
    if (exp_avg_sq) copy_in_order(m, exp_avg_sq, m->exp_avg_sq, bytes, cudaMemcpyDeviceToHost);
}

void cuda_model_download_grads(CudaModel *m, float *grads) {
    CUDA_CHECK(cudaStreamSynchronize(m->ctx.stream));
    copy_in_order(m, grads, m->grads, (size_t)m->num_floats * sizeof(float), cudaMemcpyDeviceToHost);
}

void cuda_model_upload_grads(CudaModel *m, const float *grads) {
    copy_in_order(m, m->grads, grads, (size_t)m->num_floats * sizeof(float), cudaMemcpyHostToDevice);
}

void cuda_model_download_logits(CudaModel *m, float *logits) {
    const size_t n = (size_t)m->B * m->T * m->cfg.vocab_size;
    bf16_t *raw = mt_malloc(n * sizeof *raw);
    CUDA_CHECK(cudaStreamSynchronize(m->ctx.stream));
    copy_in_order(m, raw, m->logits, n * sizeof *raw, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)raw[i] << 16;
        memcpy(&logits[i], &bits, sizeof bits);
    }
    free(raw);
}

/* ---- forward ------------------------------------------------------------- */

static bf16_t *w16(CudaModel *m, long offset) { return offset < 0 ? NULL : m->params16 + offset; }
static float *g32(CudaModel *m, long offset) { return offset < 0 ? NULL : m->grads + offset; }

/* out[N,OC] (row stride ldo) = inp[N,IC] @ W^T (+ bias) (+ residual), W = the weight at offset w. */
static void linear_forward(CudaModel *m, bf16_t *out, int ldo, const bf16_t *inp, long w, long bias,
                           const bf16_t *residual, int N, int IC, int OC) {
    TIMED(m, PROF_GEMM, cuda_gemm_forward(&m->ctx, out, ldo, inp, w16(m, w), w16(m, bias), residual, N, IC, OC));
}

/* dinp = dout @ W (+= when accumulate), dW += dout^T @ inp (fp32), and dbias
 * += column sums of dout when the layer has a bias. dout has row stride ld. */
static void linear_backward(CudaModel *m, bf16_t *dinp, const bf16_t *dout, int ld, const bf16_t *inp, long w,
                            long bias, int N, int IC, int OC, int accumulate) {
    CudaContext *ctx = &m->ctx;
    TIMED(m, PROF_GEMM, cuda_gemm_backward_input(ctx, dinp, dout, ld, w16(m, w), N, IC, OC, accumulate));
    TIMED(m, PROF_GEMM, cuda_gemm_backward_weight(ctx, g32(m, w), dout, ld, inp, N, IC, OC));
    if (bias >= 0)
        TIMED(m, PROF_GEMM, CUDA_CHECK(cuda_column_sum_accumulate(g32(m, bias), dout, N, OC, ld, ctx->stream)));
}

static void layer_forward(CudaModel *m, int l, bf16_t *out, int B, int T) {
    const ModelConfig *c = &m->cfg;
    const LayerOffsets *o = &m->layers[l];
    LayerSaved *s = &m->saved[l];
    cudaStream_t st = m->ctx.stream;
    const int N = B * T, C = c->hidden_size, I = c->intermediate_size, D = c->head_dim;
    const int H = c->num_attention_heads, KVH = c->num_key_value_heads, HD = H * D, KVD = KVH * D;
    const int QKV = HD + 2 * KVD;
    const float eps = (float)c->rms_norm_eps;

    TIMED(m, PROF_NORM, CUDA_CHECK(cuda_rmsnorm_forward(s->attn_normed, s->attn_rstd, s->resid_in,
                                                        w16(m, o->attn_norm), N, C, eps, st)));
    if (m->qkv_fused) {
        linear_forward(m, s->qkv, QKV, s->attn_normed, o->q, -1, NULL, N, C, QKV);
    } else {
        linear_forward(m, s->qkv, QKV, s->attn_normed, o->q, o->q_bias, NULL, N, C, HD);
        linear_forward(m, s->qkv + HD, QKV, s->attn_normed, o->k, o->k_bias, NULL, N, C, KVD);
        linear_forward(m, s->qkv + HD + KVD, QKV, s->attn_normed, o->v, o->v_bias, NULL, N, C, KVD);
    }
    TIMED(m, PROF_ROPE, CUDA_CHECK(cuda_qkv_rope_forward(s->q, s->k, s->v, s->q_rstd, s->k_rstd, s->qkv,
                                                         w16(m, o->q_norm), w16(m, o->k_norm), m->rope_cos,
                                                         m->rope_sin, N, T, H, KVH, D, eps, st)));
    TIMED(m, PROF_ATTN_FWD,
          CUDA_CHECK(cuda_attention_forward(s->attn_out, s->lse, s->q, s->k, s->v, B, T, H, KVH, D, st)));
    linear_forward(m, s->resid_mid, C, s->attn_out, o->o, -1, s->resid_in, N, HD, C);

    TIMED(m, PROF_NORM, CUDA_CHECK(cuda_rmsnorm_forward(s->mlp_normed, s->mlp_rstd, s->resid_mid,
                                                        w16(m, o->mlp_norm), N, C, eps, st)));
    linear_forward(m, s->gate_up, 2 * I, s->mlp_normed, o->gate, -1, NULL, N, C, 2 * I);
    TIMED(m, PROF_SWIGLU, CUDA_CHECK(cuda_swiglu_forward(s->act, s->gate_up, N, I, st)));
    linear_forward(m, out, C, s->act, o->down, -1, s->resid_mid, N, I, C);
}

float cuda_model_forward(CudaModel *m, const int32_t *inputs, const int32_t *targets, int B, int T) {
    const ModelConfig *c = &m->cfg;
    if (B <= 0 || T <= 0 || B > m->max_B || T > m->max_T)
        mt_die(MT_EXIT_FAILURE, "cuda_model_forward: micro-batch %d x %d does not fit the buffers (%d x %d)", B, T,
               m->max_B, m->max_T);
    const int N = B * T, C = c->hidden_size, V = c->vocab_size;
    for (int i = 0; i < N; i++) {
        if (inputs[i] < 0 || inputs[i] >= V)
            mt_die(MT_EXIT_USAGE, "model_forward: input token %d at position %d is outside the vocabulary [0, %d)",
                   inputs[i], i, V);
        if (targets && targets[i] >= V)
            mt_die(MT_EXIT_USAGE, "model_forward: target token %d at position %d is outside the vocabulary [0, %d)",
                   targets[i], i, V);
    }
    cudaStream_t st = m->ctx.stream;
    m->B = B;
    m->T = T;
    CUDA_CHECK(cudaMemcpyAsync(m->inputs, inputs, (size_t)N * sizeof(int32_t), cudaMemcpyHostToDevice, st));
    TIMED(m, PROF_EMBED, CUDA_CHECK(cuda_embedding_forward(m->saved[0].resid_in, m->inputs, w16(m, m->embed), N, C, st)));
    for (int l = 0; l < c->num_layers; l++)
        layer_forward(m, l, l + 1 < c->num_layers ? m->saved[l + 1].resid_in : m->final_resid, B, T);
    TIMED(m, PROF_NORM, CUDA_CHECK(cuda_rmsnorm_forward(m->final_normed, m->final_rstd, m->final_resid,
                                                        w16(m, m->final_norm), N, C, (float)c->rms_norm_eps, st)));
    linear_forward(m, m->logits, V, m->final_normed, m->lm_head, -1, NULL, N, C, V);
    if (!targets) {
        m->backward_ready = 0;
        CUDA_CHECK(cudaStreamSynchronize(st));
        return 0.0f;
    }
    memcpy(m->host_targets, targets, (size_t)N * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpyAsync(m->targets, m->host_targets, (size_t)N * sizeof(int32_t), cudaMemcpyHostToDevice, st));
    TIMED(m, PROF_LOSS, CUDA_CHECK(cuda_cross_entropy_forward(m->losses, m->ce_lse, m->logits, m->targets, N, V, st)));
    CUDA_CHECK(cudaMemcpyAsync(m->host_losses, m->losses, (size_t)N * sizeof(float), cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    double sum = 0.0;
    long count = 0;
    for (int i = 0; i < N; i++)
        if (targets[i] >= 0) {
            sum += m->host_losses[i];
            count++;
        }
    m->num_targets = count;
    m->backward_ready = 1;
    return count > 0 ? (float)(sum / (double)count) : 0.0f;
}

/* ---- backward ------------------------------------------------------------ */

/* On entry d_resid / d_resid16 hold dL/d(layer output); on exit dL/d(layer input). */
static void layer_backward(CudaModel *m, int l, int B, int T) {
    const ModelConfig *c = &m->cfg;
    const LayerOffsets *o = &m->layers[l];
    const LayerSaved *s = &m->saved[l];
    cudaStream_t st = m->ctx.stream;
    const int N = B * T, C = c->hidden_size, I = c->intermediate_size, D = c->head_dim;
    const int H = c->num_attention_heads, KVH = c->num_key_value_heads, HD = H * D, KVD = KVH * D;
    const int QKV = HD + 2 * KVD;

    /* MLP half: out = resid_mid + act @ Wdown^T */
    linear_backward(m, m->d_act, m->d_resid16, C, s->act, o->down, -1, N, I, C, 0);
    TIMED(m, PROF_SWIGLU, CUDA_CHECK(cuda_swiglu_backward(m->d_gate_up, m->d_act, s->gate_up, N, I, st)));
    linear_backward(m, m->d_normed, m->d_gate_up, 2 * I, s->mlp_normed, o->gate, -1, N, C, 2 * I, 0);
    TIMED(m, PROF_NORM, CUDA_CHECK(cuda_rmsnorm_backward(m->d_resid, m->d_resid16, g32(m, o->mlp_norm), m->d_normed,
                                                         s->resid_mid, w16(m, o->mlp_norm), s->mlp_rstd, N, C, st)));

    /* attention half: resid_mid = resid_in + attn_out @ Wo^T */
    linear_backward(m, m->d_attn_out, m->d_resid16, C, s->attn_out, o->o, -1, N, HD, C, 0);
    TIMED(m, PROF_ATTN_BWD,
          CUDA_CHECK(cuda_attention_backward(m->dq, m->dk, m->dv, m->d_attn_out, s->attn_out, s->lse, s->q, s->k,
                                             s->v, B, T, H, KVH, D, m->attn_workspace, st)));
    TIMED(m, PROF_ROPE,
          CUDA_CHECK(cuda_qkv_rope_backward(m->d_qkv, g32(m, o->q_norm), g32(m, o->k_norm), m->dq, m->dk, m->dv,
                                            s->qkv, w16(m, o->q_norm), w16(m, o->k_norm), s->q_rstd, s->k_rstd,
                                            m->rope_cos, m->rope_sin, N, T, H, KVH, D, st)));
    if (m->qkv_fused) {
        linear_backward(m, m->d_normed, m->d_qkv, QKV, s->attn_normed, o->q, -1, N, C, QKV, 0);
    } else {
        linear_backward(m, m->d_normed, m->d_qkv, QKV, s->attn_normed, o->q, o->q_bias, N, C, HD, 0);
        linear_backward(m, m->d_normed, m->d_qkv + HD, QKV, s->attn_normed, o->k, o->k_bias, N, C, KVD, 1);
        linear_backward(m, m->d_normed, m->d_qkv + HD + KVD, QKV, s->attn_normed, o->v, o->v_bias, N, C, KVD, 1);
    }
    TIMED(m, PROF_NORM, CUDA_CHECK(cuda_rmsnorm_backward(m->d_resid, m->d_resid16, g32(m, o->attn_norm), m->d_normed,
                                                         s->resid_in, w16(m, o->attn_norm), s->attn_rstd, N, C, st)));
}

void cuda_model_set_grad_sync(CudaModel *m, NcclComm *comm) {
    const int L = m->cfg.num_layers;
    m->grad_sync = comm;
    CUDA_CHECK(cudaStreamCreateWithFlags(&m->comm_stream, cudaStreamNonBlocking));
    m->layer_done = mt_malloc((size_t)(L + 1) * sizeof *m->layer_done);
    for (int l = 0; l <= L; l++) CUDA_CHECK(cudaEventCreateWithFlags(&m->layer_done[l], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&m->comm_done, cudaEventDisableTiming));
    /* A layer's parameters are contiguous in the registry: attn_norm first, down_proj last. */
    m->layer_begin = mt_malloc((size_t)L * sizeof(long));
    m->layer_end = mt_malloc((size_t)L * sizeof(long));
    for (int l = 0; l < L; l++) {
        m->layer_begin[l] = m->layers[l].attn_norm;
        m->layer_end[l] = m->layers[l].down + (long)m->cfg.hidden_size * m->cfg.intermediate_size;
        if (l > 0 && m->layer_begin[l] != m->layer_end[l - 1])
            mt_die(MT_EXIT_FAILURE, "CUDA model: layer %d's parameters do not follow layer %d's", l, l - 1);
    }
}

/* Once the compute stream has reached `done`, average grads [begin, end) and
 * [begin2, end2) over the data-parallel group on the comm stream. */
static void sync_ranges(CudaModel *m, cudaEvent_t done, long begin, long end, long begin2, long end2) {
    CUDA_CHECK(cudaEventRecord(done, m->ctx.stream));
    CUDA_CHECK(cudaStreamWaitEvent(m->comm_stream, done, 0));
    nccl_all_reduce_avg_float(m->grad_sync, m->grads + begin, (size_t)(end - begin), m->comm_stream);
    nccl_all_reduce_avg_float(m->grad_sync, m->grads + begin2, (size_t)(end2 - begin2), m->comm_stream);
}

void cuda_model_backward(CudaModel *m, float loss_scale, int sync_grads) {
    if (!m->backward_ready)
        mt_die(MT_EXIT_FAILURE, "cuda_model_backward: needs a forward with targets first (one backward per forward)");
    m->backward_ready = 0;
    const ModelConfig *c = &m->cfg;
    cudaStream_t st = m->ctx.stream;
    const int B = m->B, T = m->T, N = B * T, C = c->hidden_size, V = c->vocab_size, L = c->num_layers;
    const float dloss = m->num_targets > 0 ? (float)((double)loss_scale / (double)m->num_targets) : 0.0f;

    TIMED(m, PROF_LOSS, CUDA_CHECK(cuda_cross_entropy_backward(m->logits, m->ce_lse, m->targets, dloss, N, V, st)));
    linear_backward(m, m->d_normed, m->logits, V, m->final_normed, m->lm_head, -1, N, C, V, 0);
    CUDA_CHECK(cudaMemsetAsync(m->d_resid, 0, (size_t)N * C * sizeof(float), st));
    TIMED(m, PROF_NORM, CUDA_CHECK(cuda_rmsnorm_backward(m->d_resid, m->d_resid16, g32(m, m->final_norm), m->d_normed,
                                                         m->final_resid, w16(m, m->final_norm), m->final_rstd, N, C,
                                                         st)));
    const int sync = sync_grads && m->grad_sync;
    for (int l = L - 1; l >= 0; l--) {
        layer_backward(m, l, B, T);
        if (sync) sync_ranges(m, m->layer_done[l], m->layer_begin[l], m->layer_end[l], 0, 0);
    }
    TIMED(m, PROF_EMBED, CUDA_CHECK(cuda_embedding_backward(g32(m, m->embed), m->d_resid, m->inputs, N, C, st)));
    if (sync) { /* the parameters outside the layers: embedding (first), final norm and lm_head (last) */
        sync_ranges(m, m->layer_done[L], 0, m->layer_begin[0], m->layer_end[L - 1], m->num_floats);
        CUDA_CHECK(cudaEventRecord(m->comm_done, m->comm_stream));
        CUDA_CHECK(cudaStreamWaitEvent(st, m->comm_done, 0));
    }
}

void cuda_model_synchronize(CudaModel *m) {
    if (!m->grad_sync) {
        CUDA_CHECK(cudaStreamSynchronize(m->ctx.stream));
        return;
    }
    /* With NCCL in flight, wait by polling so that a failed peer ends this rank too instead of a hang. */
    for (;;) {
        cudaError_t status = cudaStreamQuery(m->ctx.stream);
        if (status == cudaSuccess) return;
        if (status != cudaErrorNotReady) CUDA_CHECK(status);
        char err[512];
        if (nccl_check_async_error(m->grad_sync, err, sizeof err) != 0) mt_die(MT_EXIT_FAILURE, "%s", err);
        sched_yield();
    }
}

void cuda_model_zero_grad(CudaModel *m) {
    CUDA_CHECK(cudaMemsetAsync(m->grads, 0, (size_t)m->num_floats * sizeof(float), m->ctx.stream));
}

/* ---- optimizer ----------------------------------------------------------- */

double cuda_model_grad_norm(CudaModel *m) {
    cudaStream_t st = m->ctx.stream;
    TIMED(m, PROF_OPTIMIZER,
          CUDA_CHECK(cuda_sum_squares(m->norm_partial, NORM_PARTIALS, m->grads, (size_t)m->num_floats, st)));
    CUDA_CHECK(cudaMemcpyAsync(m->host_norm_partial, m->norm_partial, NORM_PARTIALS * sizeof(double),
                               cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    double total = 0.0;
    for (int i = 0; i < NORM_PARTIALS; i++) total += m->host_norm_partial[i];
    return sqrt(total);
}

void cuda_model_adamw(CudaModel *m, const CudaAdamWStep *step) {
    CudaAdamWArgs args = {
        .lr = (float)step->lr,
        .beta1 = (float)step->beta1,
        .beta2 = (float)step->beta2,
        .eps = (float)step->eps,
        .weight_decay = (float)step->weight_decay,
        .grad_scale = (float)step->grad_scale,
    };
    cuda_adamw_set_step(&args, step->step);
    TIMED(m, PROF_OPTIMIZER, CUDA_CHECK(cuda_adamw_step_chunks(m->params, m->grads, m->exp_avg, m->exp_avg_sq,
                                                               m->params16, m->chunks, m->num_chunks, &args,
                                                               m->ctx.stream)));
    if (m->prof_on && ++m->prof_steps == m->prof_on) prof_report(m);
}

/* ---- memory -------------------------------------------------------------- */

size_t cuda_model_bytes(const CudaModel *m) { return m->arena_bytes; }

size_t cuda_model_peak_bytes(CudaModel *m) {
    size_t free_bytes = 0, total = 0;
    if (cudaMemGetInfo(&free_bytes, &total) == cudaSuccess && total - free_bytes > m->peak_used)
        m->peak_used = total - free_bytes;
    return m->peak_used;
}

const char *cuda_model_device_name(const CudaModel *m) { return m->device_name; }

void cuda_model_pci_bus_id(const CudaModel *m, char *out, int len) {
    if (cudaDeviceGetPCIBusId(out, len, m->ctx.device) != cudaSuccess && len > 0) out[0] = '\0';
}
