/* cuda_model_moe.c: the mixture-of-experts MLP of the CUDA model, the GPU
 * form of src/model/moe_layer.c (the math is in its header) and, under
 * expert parallel, of src/model/moe_dispatch.c. Under tensor parallel every
 * tp rank routes all N rows (gathered under sequence parallel): with etp 1
 * it computes whole experts and keeps its rows of the output, with etp = tp
 * a slice of each expert's intermediate, whose partial outputs are summed
 * over tp like the dense MLP's. Under context parallel the balancing counts
 * are summed over the cp ranks of each sequence.
 *
 * Forward of layer l (x = the MLP input, bf16 (N, C)):
 *   x32     = fp32(x); logits = x32 @ Wr^T          fp32 router (cuBLAS, no TF32)
 *   route   scores, lse, top-k (+ expert_bias), raw, weights       kernels/moe.cu
 *   sort    assignments -> rows, expert-major (counting sort on the device);
 *           with a capacity: sorted once with all, the drops marked, sorted again
 *   stats   assignments and probability sums per (row group, expert); they,
 *           the offsets and the lse come to the host (one wait per layer),
 *           which computes the load-balancing loss and z-loss as the CPU does
 *           and enqueues the experts' products
 *   gather  xin[r] = x[token of r]: rows grouped by global expert, so by the
 *           rank that holds it
 *   ep > 1  dispatch: the rows per (rank, local expert) exchanged on the host
 *           (an all-to-all of ep x E/ep counts), the rows all-to-all (NCCL, or
 *           staged through the host), reordered expert-major (expert j: rows
 *           from rank 0, then rank 1, ...: moe_dispatch.c's order); the
 *           experts' outputs go back the same way into y, in xin's order
 *   experts gate|up, SwiGLU and down of every expert over its rows
 *           (cuda_model_experts.c)
 *   shared  the shared expert as a dense MLP over every token (cuBLASLt)
 *   combine out = resid + shared + sum_j weight * y[row of (n, j)]
 * Backward mirrors it: combine backward (d_rows, d_w), (ep > 1: d_rows to the
 * experts' ranks and the input gradients back), the experts' data and
 * weight gradients (fp32, accumulated), the shared expert, the router's
 * d_logits (renormalisation, balancing loss, z-loss), dWr and the router's
 * fp32 input gradient, and the scatter of the rows' gradients to tokens.
 * Statistics go to the host Model's MoeStep, so model_moe_step_end (the
 * expert-bias update, the logged figures) is the CPU's.
 * train.recompute: full keeps a MoE layer's host record (offsets, the
 * balancing loss's counts and scales, the ep exchange's row counts) per
 * layer and its device buffers in one working set (m->moe_work); the
 * backward reruns the layer's forward into it (m->recomputing: the same
 * routing, the ep exchanges again on every rank alike, no statistics). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../core/error.h"
#include "../moe_layer.h"
#include "cuda_model_internal.h"

/* What one MoE layer's forward keeps for its backward (one per activation set). */
typedef struct MoeSaved {
    float *logits, *scores;          /* (N, E) */
    float *lse, *score_sum;          /* (N) */
    int32_t *selected, *position;    /* (A) */
    int32_t *d_offsets;              /* (E + 1) the rows of each expert (a copy on the host: offsets) */
    float *raw, *weight;             /* (A) */
    bf16_t *xin, *gate_up, *act, *y; /* rows: (A, C), (A, 2 Ie), (A, Ie), (A, C) */
    bf16_t *s_gate_up, *s_act;       /* the shared expert's (N, 2 Is), (N, Is) */
    /* expert parallel (ep > 1): the rows this rank's experts compute, expert-major, of up to RA rows
     * (expert_rows: every rank's rows to this rank's experts; gate_up and act hold RA rows then); for each, its row in
     * the received order (ex_order) and back (ex_inverse); the local experts' offsets */
    bf16_t *ex_x;                    /* (RA, C) */
    int32_t *ex_order, *ex_inverse;  /* (RA) */
    /* ep > 1: RA is the arena's room (room_rows: a quarter more than a balanced routing's rows); a layer given more
     * takes its expert side (ex_x, gate_up, act, ex_order, ex_inverse) for all its rows from `spill`, a stream-ordered
     * allocation freed once its backward has used it (or at the layer's next forward), and `room` keeps the arena's */
    void *spill;
    struct { bf16_t *ex_x, *gate_up, *act; int32_t *ex_order, *ex_inverse; } room;
    int32_t *d_ex_offsets;           /* (El + 1) */
    /* host: the rows per expert, and what the balancing loss's gradient needs (moe_layer.c's MoeBalance) */
    int32_t *offsets;                /* (E + 1) */
    float *aux_counts;               /* (aux_rows, E): the counts the balancing loss weighs p with (its backward
                                      * copies them to the GPU from here: kept until the layer's next forward) */
    int aux_rows, aux_span, N;
    double aux_scale, z_scale;
    int32_t *ex_offsets;             /* ep > 1: (El + 1) the local experts' rows */
    long *send_rows, *recv_rows;     /* ep > 1: (ep) rows to and from each rank of the group */
} MoeSaved;

/* The expert side's scratch: d_act (rows, Ie) and d_gate_up (rows, 2 Ie); ep > 1, (rows, C): the rows in the
 * received order (recv), the experts' outputs (forward) or their gradients (backward), expert-major (ex_rows), and
 * d of ex_x; with `spill` a layer's own, for more rows than the arena's room. */
typedef struct ExpertScratch {
    bf16_t *d_act, *d_gate_up;
    bf16_t *recv, *ex_rows, *d_ex_x;
    void *spill;
} ExpertScratch;

/* Scratch every MoE layer and activation set shares (the stream runs one layer at a time). */
typedef struct MoeScratch {
    float *x32, *router_dx;          /* (N, C) */
    float *d_logits;                 /* (N, E) */
    float *d_w;                      /* (A) */
    float *aux_coef;                 /* (B, E) */
    int32_t *tile_hist, *token, *row_slot, *counts;
    uint8_t *keep;
    double *psum;                    /* (B, E) */
    bf16_t *s_out;                   /* (N, C) the shared expert's output */
    bf16_t *tp_out;                  /* tp > 1: (N, C) the MLP's output over all N rows (with etp > 1 a partial) */
    bf16_t *d_rows, *d_xin;          /* (A, C) */
    ExpertScratch side;              /* the expert side's, of RA rows (ep > 1: spilled as MoeSaved's) */
    bf16_t *d_s_act, *d_s_gate_up;   /* (N, Is), (N, 2 Is) */
    int32_t *h_counts;               /* host staging */
    int64_t *h_send, *h_recv;        /* ep > 1: (ep x El) rows per (rank, local expert) */
    int32_t *h_order;                /* ep > 1: (2 RA) ex_order and ex_inverse */
    double *h_psum;
    float *h_lse;
} MoeScratch;

static const MoeConfig *moe_cfg(const CudaModel *m) { return &m->cfg.moe; }

/* The most rows this rank's experts compute in a layer, for micro-batches of up to max_B x max_T tokens
 * (moe_layer.h). */
static size_t expert_rows_max(const CudaModel *m) {
    return (size_t)moe_expert_rows_max(&m->cfg.moe, m->ep, (long)m->max_B * m->max_T);
}

/* The rows the arena holds for them: a quarter more than a balanced routing's (moe_expert_rows_room). Under ep,
 * MEGATRAIN_MOE_EP_ROOM (a test hook: a fraction of it, above 0 and below 1) makes it smaller, so that layers
 * spill. */
static size_t room_rows(const CudaModel *m) {
    size_t rows = (size_t)moe_expert_rows_room(&m->cfg.moe, m->ep, (long)m->max_B * m->max_T);
    const char *hook = m->ep > 1 ? getenv("MEGATRAIN_MOE_EP_ROOM") : NULL;
    const double f = hook ? atof(hook) : 1.0;
    if (f > 0.0 && f < 1.0) rows = (size_t)((double)rows * f);
    return rows;
}

/* The most assignment-count rows of the balancing statistics: the micro-batch's sequences for seq_aux_loss, else 1. */
static int max_aux_rows(const CudaModel *m) {
    return moe_cfg(m)->load_balancing == LB_SEQ_AUX_LOSS ? m->max_B : 1;
}

/* A MoeSaved's device buffers: carved (work NULL), or those of the full-recompute working set `work` (every MoE
 * layer's forward is rerun into them before its backward). */
#define MOE_PIECE(field, count)                                                                             \
    do {                                                                                                    \
        if (work) v->field = work->field;                                                                   \
        else CARVE(c, v->field, (count));                                                                   \
    } while (0)
static void layout_moe_buffers(CudaModel *m, Carver *c, MoeSaved *v, const MoeSaved *work) {
    const MoeConfig *mc = moe_cfg(m);
    const size_t N = (size_t)m->max_B * m->max_T, E = mc->num_experts, A = N * mc->num_experts_per_tok;
    const size_t C = m->shape.C, Ie = cuda_moe_expert_I(m), Is = cuda_moe_shared_I(m);
    const size_t RA = room_rows(m), El = E / (size_t)m->ep;
    MOE_PIECE(logits, N * E);
    MOE_PIECE(scores, N * E);
    MOE_PIECE(lse, N);
    MOE_PIECE(score_sum, N);
    MOE_PIECE(selected, A);
    MOE_PIECE(position, A);
    MOE_PIECE(d_offsets, E + 1);
    MOE_PIECE(raw, A);
    MOE_PIECE(weight, A);
    MOE_PIECE(xin, A * C);
    MOE_PIECE(gate_up, RA * 2 * Ie);
    MOE_PIECE(act, RA * Ie);
    MOE_PIECE(y, A * C);
    if (m->ep > 1) {
        MOE_PIECE(ex_x, RA * C);
        MOE_PIECE(ex_order, RA);
        MOE_PIECE(ex_inverse, RA);
        MOE_PIECE(d_ex_offsets, El + 1);
    }
    if (Is > 0) {
        MOE_PIECE(s_gate_up, N * 2 * Is);
        MOE_PIECE(s_act, N * Is);
    }
    v->room.ex_x = v->ex_x;
    v->room.gate_up = v->gate_up;
    v->room.act = v->act;
    v->room.ex_order = v->ex_order;
    v->room.ex_inverse = v->ex_inverse;
}
#undef MOE_PIECE

/* A layer's expert side for `rows` rows: ex_x, gate_up, act, ex_order and ex_inverse, carved from c. */
static void layout_expert_side(const CudaModel *m, Carver *c, MoeSaved *v, size_t rows) {
    const size_t C = m->shape.C, Ie = cuda_moe_expert_I(m);
    CARVE(c, v->ex_x, rows * C);
    CARVE(c, v->gate_up, rows * 2 * Ie);
    CARVE(c, v->act, rows * Ie);
    CARVE(c, v->ex_order, rows);
    CARVE(c, v->ex_inverse, rows);
}

/* The expert side's scratch for `rows` rows, carved from c. */
static void layout_expert_scratch(const CudaModel *m, Carver *c, ExpertScratch *x, size_t rows) {
    const size_t C = m->shape.C, Ie = cuda_moe_expert_I(m);
    CARVE(c, x->d_act, rows * Ie);
    CARVE(c, x->d_gate_up, rows * 2 * Ie);
    if (m->ep > 1) {
        CARVE(c, x->recv, rows * C);
        CARVE(c, x->ex_rows, rows * C);
        CARVE(c, x->d_ex_x, rows * C);
    }
}

/* A stream-ordered allocation of `bytes` for `rows` rows of a layer (what: its expert side or scratch). Where the
 * device is out of memory the pool's cached memory goes back to the driver once (cudaMemPoolTrimTo: the spills the
 * pool keeps, cuda_context.c) and it is tried again; a failure then ends the run naming the rows. */
static void *spill_alloc(CudaModel *m, size_t bytes, long rows, const char *what) {
    void *p = NULL;
    cudaError_t status = cudaMallocAsync(&p, bytes, m->ctx.stream);
    if (status == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* clear it */
        cudaMemPool_t pool;
        CUDA_CHECK(cudaStreamSynchronize(m->ctx.stream));
        if (cudaDeviceGetDefaultMemPool(&pool, m->ctx.device) == cudaSuccess) cudaMemPoolTrimTo(pool, 0);
        status = cudaMallocAsync(&p, bytes, m->ctx.stream);
    }
    if (status != cudaSuccess)
        mt_die(MT_EXIT_FAILURE, "moe: no GPU memory for %s of the %ld rows routed to this rank's experts (%zu bytes; "
               "the arena holds %zu rows, a quarter more than a balanced routing's): %s", what, rows, bytes,
               room_rows(m), cudaGetErrorString(status));
    return p;
}

/* Layer v's expert side back in the arena's room, its spill (if any) freed in the stream's order. */
static void release_spill(CudaModel *m, MoeSaved *v) {
    if (!v->spill) return;
    CUDA_CHECK(cudaFreeAsync(v->spill, m->ctx.stream));
    v->spill = NULL;
    v->ex_x = v->room.ex_x;
    v->gate_up = v->room.gate_up;
    v->act = v->room.act;
    v->ex_order = v->room.ex_order;
    v->ex_inverse = v->room.ex_inverse;
}

/* Layer v's expert side for `rows` rows, more than the arena's room: a spill of their own. */
static void spill_saved(CudaModel *m, MoeSaved *v, long rows) {
    Carver c = {NULL, 0};
    layout_expert_side(m, &c, v, (size_t)rows);
    c.base = spill_alloc(m, c.used, rows, "the expert side");
    v->spill = c.base;
    c.used = 0;
    layout_expert_side(m, &c, v, (size_t)rows);
}

/* The expert side's scratch for a layer of `rows` rows: the arena's, or for more rows a spill (free it with
 * scratch_done). */
static ExpertScratch expert_scratch(CudaModel *m, long rows) {
    if ((size_t)rows <= room_rows(m)) return m->moe->side;
    ExpertScratch x = {0};
    Carver c = {NULL, 0};
    layout_expert_scratch(m, &c, &x, (size_t)rows);
    c.base = spill_alloc(m, c.used, rows, "the scratch");
    x.spill = c.base;
    c.used = 0;
    layout_expert_scratch(m, &c, &x, (size_t)rows);
    return x;
}

static void scratch_done(CudaModel *m, ExpertScratch *x) {
    if (x->spill) CUDA_CHECK(cudaFreeAsync(x->spill, m->ctx.stream));
    x->spill = NULL;
}

void cuda_moe_layout_work(CudaModel *m, Carver *c) {
    if (!m->moe_work) m->moe_work = mt_calloc(1, sizeof *m->moe_work); /* device buffers only */
    layout_moe_buffers(m, c, m->moe_work, NULL);
}

void cuda_moe_layout_saved(CudaModel *m, Carver *c, int l) {
    const MoeConfig *mc = moe_cfg(m);
    const size_t E = mc->num_experts, El = E / (size_t)m->ep;
    LayerSaved *s = &m->saved[l];
    if (!s->moe) { /* the first pass over a fresh set: the host side, kept per layer in every recompute mode */
        s->moe = mt_calloc(1, sizeof *s->moe);
        s->moe->offsets = mt_calloc(E + 1, sizeof(int32_t));
        s->moe->aux_counts = mt_calloc((size_t)max_aux_rows(m) * E, sizeof(float));
        s->moe->ex_offsets = mt_calloc(El + 1, sizeof(int32_t));
        s->moe->send_rows = mt_calloc((size_t)m->ep, sizeof(long));
        s->moe->recv_rows = mt_calloc((size_t)m->ep, sizeof(long));
    }
    layout_moe_buffers(m, c, s->moe, m->recompute == RECOMPUTE_FULL ? m->moe_work : NULL);
}

void cuda_moe_layout_shared(CudaModel *m, Carver *c) {
    const MoeConfig *mc = moe_cfg(m);
    const size_t N = (size_t)m->max_B * m->max_T, E = mc->num_experts, A = N * mc->num_experts_per_tok;
    const size_t C = m->shape.C, Is = cuda_moe_shared_I(m);
    const size_t tiles = (A + MT_MOE_TILE - 1) / MT_MOE_TILE, rows = (size_t)max_aux_rows(m);
    const size_t RA = room_rows(m);
    if (!m->moe) {
        m->moe = mt_calloc(1, sizeof *m->moe);
        m->moe->h_send = mt_calloc(E, sizeof(int64_t)); /* ep x El = E */
        m->moe->h_recv = mt_calloc(E, sizeof(int64_t));
        m->moe->h_order = mt_calloc(m->ep > 1 ? 2 * expert_rows_max(m) : 1, sizeof(int32_t));
        m->moe->h_counts = mt_calloc(rows * E, sizeof(int32_t));
        m->moe->h_psum = mt_calloc(rows * E, sizeof(double));
        m->moe->h_lse = mt_calloc(N, sizeof(float));
    }
    MoeScratch *s = m->moe;
    CARVE(c, s->x32, N * C);
    CARVE(c, s->router_dx, N * C);
    CARVE(c, s->d_logits, N * E);
    CARVE(c, s->d_w, A);
    CARVE(c, s->aux_coef, rows * E);
    CARVE(c, s->tile_hist, (tiles > 0 ? tiles : 1) * E);
    CARVE(c, s->token, A);
    CARVE(c, s->row_slot, A);
    CARVE(c, s->counts, rows * E);
    CARVE(c, s->keep, A);
    CARVE(c, s->psum, rows * E);
    CARVE(c, s->d_rows, A * C);
    CARVE(c, s->d_xin, A * C);
    layout_expert_scratch(m, c, &s->side, RA);
    if (m->shape.tp > 1) CARVE(c, s->tp_out, N * C);
    if (Is > 0) {
        CARVE(c, s->s_out, N * C);
        CARVE(c, s->d_s_act, N * Is);
        CARVE(c, s->d_s_gate_up, N * 2 * Is);
    }
}

void cuda_moe_free_saved(CudaModel *m) {
    for (int l = 0; m->saved && l < m->shape.L; l++) {
        MoeSaved *v = m->saved[l].moe;
        if (!v) continue;
        if (v->spill) cudaFree(v->spill); /* after the device's work */
        free(v->offsets);
        free(v->aux_counts);
        free(v->ex_offsets);
        free(v->send_rows);
        free(v->recv_rows);
        free(v);
        m->saved[l].moe = NULL;
    }
}

void cuda_moe_free_shared(CudaModel *m) {
    free(m->moe_work);
    m->moe_work = NULL;
    if (!m->moe) return;
    free(m->moe->h_counts);
    free(m->moe->h_send);
    free(m->moe->h_recv);
    free(m->moe->h_order);
    free(m->moe->h_psum);
    free(m->moe->h_lse);
    free(m->moe);
    m->moe = NULL;
}

/* Every assignment's row; with a capacity, the drops (weight 0, no row). */
static void sort_assignments(CudaModel *m, MoeSaved *v, int N) {
    const MoeConfig *mc = moe_cfg(m);
    MoeScratch *s = m->moe;
    cudaStream_t st = m->ctx.stream;
    const int E = mc->num_experts, k = mc->num_experts_per_tok, A = N * k;
    CUDA_CHECK(cuda_moe_sort(v->selected, NULL, s->tile_hist, v->d_offsets, v->position, s->token, s->row_slot, A, k, E,
                             st));
    if (!(mc->capacity_factor > 0)) return;
    const long capacity = (long)ceil(mc->capacity_factor * (double)N * k / E);
    CUDA_CHECK(cuda_moe_capacity(v->raw, s->row_slot, v->d_offsets, s->keep, v->weight, E, capacity, st));
    CUDA_CHECK(cuda_moe_sort(v->selected, s->keep, s->tile_hist, v->d_offsets, v->position, s->token, s->row_slot, A, k,
                             E, st));
}

/* The load-balancing loss and z-loss of the last routing (moe_layer.c's balance_loss and z-loss, from the
 * statistics in m->moe's host staging), into v and the step's record. */
static void balance(CudaModel *m, int l, MoeSaved *v, int B, int T) {
    const MoeConfig *mc = moe_cfg(m);
    const MoeScratch *s = m->moe;
    MoeStep *step = m->moe_step;
    const int N = B * T, E = mc->num_experts, k = mc->num_experts_per_tok;
    const bool seq = mc->load_balancing == LB_SEQ_AUX_LOSS;
    const int rows = seq ? B : 1;
    double *counts = mt_calloc((size_t)E + 1, sizeof(double)); /* the micro-batch's, and its tokens */
    for (int r = 0; r < rows; r++)
        for (int e = 0; e < E; e++) counts[e] += s->h_counts[(size_t)r * E + e];
    counts[E] = N;
    for (int e = 0; e < E; e++) step->counts[(size_t)l * E + e] += counts[e];
    v->aux_scale = 0.0;
    v->aux_rows = rows;
    v->aux_span = seq ? T : N;
    double aux = 0.0;
    const bool aux_on = (mc->load_balancing == LB_AUX_LOSS || mc->load_balancing == LB_SEQ_AUX_LOSS ||
                         mc->load_balancing == LB_GLOBAL_AUX_LOSS) && mc->aux_loss_coeff > 0;
    /* context parallel: a sequence's tokens are on the cp ranks; the counts are summed over them, N and T count
     * them all, and each rank's loss is its tokens' share (moe_layer.c's balance_loss) */
    const double Nall = (double)N * m->shape.cp, Tall = (double)T * m->shape.cp;
    if (aux_on && seq) {
        double *all = mt_malloc((size_t)B * E * sizeof(double)); /* per sequence, over cp */
        for (size_t i = 0; i < (size_t)B * E; i++) all[i] = s->h_counts[i];
        if (m->cp_comm) device_comm_sum_doubles(m->cp_comm, all, (size_t)B * E);
        for (int r = 0; r < B; r++) {
            double sum = 0.0;
            for (int e = 0; e < E; e++) {
                v->aux_counts[(size_t)r * E + e] = (float)all[(size_t)r * E + e];
                sum += s->h_psum[(size_t)r * E + e] * all[(size_t)r * E + e];
            }
            aux += mc->aux_loss_coeff * E / ((double)k * Tall * Tall) * sum;
        }
        free(all);
        aux /= B;
        v->aux_scale = mc->aux_loss_coeff * E / ((double)k * Tall * Tall * B);
    } else if (aux_on) {
        double tokens = Nall;
        if (mc->load_balancing == LB_GLOBAL_AUX_LOSS) { /* running counts over the step, the dp and cp ranks */
            if (m->dp_host) comm_all_reduce_sum_double(m->dp_host, counts, (size_t)E + 1);
            if (m->cp_comm) device_comm_sum_doubles(m->cp_comm, counts, (size_t)E + 1);
            double *global = step->global_counts + (size_t)l * E;
            for (int e = 0; e < E; e++) global[e] += counts[e];
            step->global_tokens[l] += counts[E];
            for (int e = 0; e < E; e++) v->aux_counts[e] = (float)global[e];
            tokens = step->global_tokens[l];
        } else {
            if (m->cp_comm) device_comm_sum_doubles(m->cp_comm, counts, (size_t)E);
            for (int e = 0; e < E; e++) v->aux_counts[e] = (float)counts[e];
        }
        double sum = 0.0; /* counts are whole numbers: exact in float */
        for (int e = 0; e < E; e++) sum += s->h_psum[e] * v->aux_counts[e];
        v->aux_scale = mc->aux_loss_coeff * E / ((double)k * Nall * tokens);
        aux = v->aux_scale * sum;
    }
    free(counts);
    v->z_scale = mc->z_loss_coeff / Nall; /* the mean over the whole micro-batch */
    double z = 0.0;
    if (mc->z_loss_coeff > 0) {
        for (int n = 0; n < N; n++) z += (double)s->h_lse[n] * s->h_lse[n];
        z *= v->z_scale;
    }
    step->aux_sum += aux;
    step->z_sum += z;
    step->dropped += (long)N * k - v->offsets[E];
    step->assignments += (long)N * k;
}

/* ---- expert parallel: the rows to and from the ranks holding their experts (moe_dispatch.c's order) ---- */

/* Layer v's exchange: the rows per (rank, local expert) from the offsets (rows grouped by global expert), swapped
 * over the group on the host; the received rows' expert-major order and its inverse to the GPU, and the local
 * experts' offsets (host and device). */
static void dispatch_plan(CudaModel *m, MoeSaved *v) {
    MoeScratch *s = m->moe;
    const MoeConfig *mc = moe_cfg(m);
    const int ep = m->ep, El = mc->num_experts / ep;
    for (int r = 0; r < ep; r++) {
        v->send_rows[r] = v->offsets[(r + 1) * El] - v->offsets[r * El];
        for (int j = 0; j < El; j++) s->h_send[r * El + j] = v->offsets[r * El + j + 1] - v->offsets[r * El + j];
    }
    device_comm_host_all_to_all(m->ep_comm, s->h_send, s->h_recv, (size_t)El * sizeof(int64_t));
    long rows = 0;
    for (int r = 0; r < ep; r++) {
        v->recv_rows[r] = 0;
        for (int j = 0; j < El; j++) v->recv_rows[r] += s->h_recv[r * El + j];
        rows += v->recv_rows[r];
    }
    const size_t most = expert_rows_max(m);
    if (rows < 0 || (size_t)rows > most)
        mt_die(MT_EXIT_FAILURE, "moe: %ld rows routed to this rank's experts (at most %zu can be)", rows, most);
    const bool spills = (size_t)rows > room_rows(m);
    if (spills) spill_saved(m, v, rows);
    if (!m->recomputing) { /* the step's spill rate (a rerun spills as its first forward did) */
        m->moe_step->dispatches++;
        m->moe_step->spills += spills;
    }
    /* expert j: the rows from rank 0, then rank 1, ... (each rank's rows for its experts in expert order) */
    int32_t *order = s->h_order, *inverse = s->h_order + rows;
    int pos = 0;
    for (int j = 0; j < El; j++) {
        v->ex_offsets[j] = pos;
        long base = 0;
        for (int r = 0; r < ep; r++) {
            long within = 0;
            for (int i = 0; i < j; i++) within += s->h_recv[r * El + i];
            for (long t = 0; t < s->h_recv[r * El + j]; t++) order[pos++] = (int32_t)(base + within + t);
            base += v->recv_rows[r];
        }
    }
    v->ex_offsets[El] = pos;
    for (int i = 0; i < pos; i++) inverse[order[i]] = i;
    cudaStream_t st = m->ctx.stream; /* pageable sources: each copy has read its source when it returns */
    if (pos > 0) {
        CUDA_CHECK(cudaMemcpyAsync(v->ex_order, order, (size_t)pos * sizeof(int32_t), cudaMemcpyHostToDevice, st));
        CUDA_CHECK(cudaMemcpyAsync(v->ex_inverse, inverse, (size_t)pos * sizeof(int32_t), cudaMemcpyHostToDevice, st));
    }
    CUDA_CHECK(cudaMemcpyAsync(v->d_ex_offsets, v->ex_offsets, (size_t)(El + 1) * sizeof(int32_t),
                               cudaMemcpyHostToDevice, st));
}

/* Rows of C channels over the group: send_rows[r] of `send` to rank r and recv_rows[r] from it into `recv`;
 * back: the other way. */
static void exchange(CudaModel *m, const MoeSaved *v, const bf16_t *send, bf16_t *recv, bool back) {
    long sc[MT_MAX_EP], rc[MT_MAX_EP];
    const long C = m->shape.C;
    for (int r = 0; r < m->ep; r++) {
        sc[r] = (back ? v->recv_rows[r] : v->send_rows[r]) * C;
        rc[r] = (back ? v->send_rows[r] : v->recv_rows[r]) * C;
    }
    TIMED(m, PROF_MOE_A2A, device_all_to_all_v(m->ep_comm, send, sc, recv, rc, NCCL_DTYPE_BF16, m->ctx.stream));
}

/* y (xin's order) = this layer's experts, wherever they are, applied to xin. */
static void experts_forward_ep(CudaModel *m, const LayerOffsets *o, MoeSaved *v) {
    cudaStream_t st = m->ctx.stream;
    const int C = m->shape.C, El = moe_cfg(m)->num_experts / m->ep;
    dispatch_plan(m, v);
    const int rows = v->ex_offsets[El];
    ExpertScratch x = expert_scratch(m, rows);
    exchange(m, v, v->xin, x.recv, false);
    TIMED(m, PROF_MOE_PERMUTE, CUDA_CHECK(cuda_moe_gather(v->ex_x, x.recv, v->ex_order, rows, C, st)));
    const CudaExpertRows rows_of = {.experts = El, .offsets = v->ex_offsets, .d_offsets = v->d_ex_offsets};
    TIMED(m, PROF_MOE_EXPERTS, cuda_moe_experts_forward(m, o, &rows_of, v->ex_x, v->gate_up, v->act, x.ex_rows));
    TIMED(m, PROF_MOE_PERMUTE, CUDA_CHECK(cuda_moe_gather(x.recv, x.ex_rows, v->ex_inverse, rows, C, st)));
    exchange(m, v, x.recv, v->y, true);
    scratch_done(m, &x);
}

/* Its backward: s->d_xin (xin's order) from s->d_rows (y's gradient); the local experts' weight gradients
 * accumulate over the rows of every rank. */
static void experts_backward_ep(CudaModel *m, const LayerOffsets *o, const MoeSaved *v) {
    MoeScratch *s = m->moe;
    cudaStream_t st = m->ctx.stream;
    const int C = m->shape.C, El = moe_cfg(m)->num_experts / m->ep, rows = v->ex_offsets[El];
    ExpertScratch x = expert_scratch(m, rows);
    exchange(m, v, s->d_rows, x.recv, false);
    TIMED(m, PROF_MOE_PERMUTE, CUDA_CHECK(cuda_moe_gather(x.ex_rows, x.recv, v->ex_order, rows, C, st)));
    const CudaExpertRows rows_of = {.experts = El, .offsets = v->ex_offsets, .d_offsets = v->d_ex_offsets};
    TIMED(m, PROF_MOE_EXPERTS, cuda_moe_experts_backward(m, o, &rows_of, v->ex_x, v->gate_up, v->act, x.ex_rows,
                                                         x.d_act, x.d_gate_up, x.d_ex_x));
    TIMED(m, PROF_MOE_PERMUTE, CUDA_CHECK(cuda_moe_gather(x.recv, x.d_ex_x, v->ex_inverse, rows, C, st)));
    exchange(m, v, x.recv, s->d_xin, true);
    scratch_done(m, &x);
}

void cuda_moe_forward(CudaModel *m, int l, const bf16_t *x, const bf16_t *resid, bf16_t *out, int B, int T) {
    const MoeConfig *mc = moe_cfg(m);
    const LayerOffsets *o = &m->layers[l];
    MoeSaved *v = m->saved[l].moe;
    MoeScratch *s = m->moe;
    CudaContext *ctx = &m->ctx;
    cudaStream_t st = ctx->stream;
    const int N = B * T, C = m->shape.C, E = mc->num_experts, k = mc->num_experts_per_tok;
    const int Is = cuda_moe_shared_I(m);
    const int sigmoid = mc->score_function == SCORE_SIGMOID;
    v->N = N;
    release_spill(m, v); /* a forward with no backward after it (an evaluation's) leaves one */

    TIMED(m, PROF_MOE_ROUTER, {
        CUDA_CHECK(cuda_cast_bf16_to_fp32(s->x32, x, (size_t)N * C, st));
        cuda_sgemm_forward(ctx, v->logits, s->x32, cuda_model_f32(m, o->router), N, C, E);
        CUDA_CHECK(cuda_moe_route(v->logits, o->expert_bias >= 0 ? cuda_model_f32(m, o->expert_bias) : NULL, v->scores,
                                  v->lse, v->score_sum, v->selected, v->raw, v->weight, N, E, k, sigmoid,
                                  mc->norm_topk_prob, st));
    });
    TIMED(m, PROF_MOE_PERMUTE, sort_assignments(m, v, N));
    /* the rows per expert to the host and, once per micro-batch (not in full recompute's rerun, which routes the
     * same way and keeps the first forward's record: v's aux_counts and scales, the step's figures, and skips the
     * dp / cp sums of the counts on every rank alike), the statistics: counts and probability sums, the lse */
    const bool seq = mc->load_balancing == LB_SEQ_AUX_LOSS;
    const int span = seq ? T : N, rows = N / span;
    CUDA_CHECK(cudaMemcpyAsync(v->offsets, v->d_offsets, (size_t)(E + 1) * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
    if (!m->recomputing) {
        CUDA_CHECK(cuda_moe_balance_stats(s->counts, s->psum, v->selected, v->scores, v->score_sum, N, E, k, span, 1,
                                          sigmoid, st));
        CUDA_CHECK(cudaMemcpyAsync(s->h_counts, s->counts, (size_t)rows * E * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                   st));
        CUDA_CHECK(cudaMemcpyAsync(s->h_psum, s->psum, (size_t)rows * E * sizeof(double), cudaMemcpyDeviceToHost, st));
        if (mc->z_loss_coeff > 0)
            CUDA_CHECK(cudaMemcpyAsync(s->h_lse, v->lse, (size_t)N * sizeof(float), cudaMemcpyDeviceToHost, st));
    }
    cuda_model_synchronize(m); /* polling where NCCL is in flight (a pipeline's receive may be just before) */
    if (!m->recomputing) balance(m, l, v, B, T);

    const int R = v->offsets[E];
    TIMED(m, PROF_MOE_PERMUTE, CUDA_CHECK(cuda_moe_gather(v->xin, x, s->token, R, C, st)));
    if (m->ep > 1) {
        experts_forward_ep(m, o, v);
        /* full recompute reruns this forward before the backward: the first one's expert side is not kept */
        if (m->recompute == RECOMPUTE_FULL && !m->recomputing) release_spill(m, v);
    } else {
        const CudaExpertRows rows_of = {.experts = E, .offsets = v->offsets, .d_offsets = v->d_offsets};
        TIMED(m, PROF_MOE_EXPERTS, cuda_moe_experts_forward(m, o, &rows_of, v->xin, v->gate_up, v->act, v->y));
    }
    const bf16_t *shared = NULL;
    if (Is > 0) { /* gate and up adjacent in the registry: one product */
        cuda_linear_forward(m, v->s_gate_up, 2 * Is, x, o->s_gate, -1, NULL, N, C, 2 * Is);
        TIMED(m, PROF_SWIGLU, CUDA_CHECK(cuda_swiglu_forward(v->s_act, v->s_gate_up, N, Is, st)));
        cuda_linear_forward(m, s->s_out, C, v->s_act, o->s_down, -1, NULL, N, Is, C);
        shared = s->s_out;
    }
    if (m->shape.tp == 1) { /* the residual added in the combine */
        TIMED(m, PROF_MOE_PERMUTE,
              CUDA_CHECK(cuda_moe_combine(out, resid, shared, v->y, v->position, v->weight, N, k, C, st)));
        return;
    }
    /* tensor parallel: every tp rank routes the same N rows; with etp > 1 its outputs are partial sums (its
     * slice of each expert's intermediate, and of the shared expert's), summed over tp as the dense MLP's; with
     * etp 1 they are whole, and the rank keeps its rows */
    TIMED(m, PROF_MOE_PERMUTE,
          CUDA_CHECK(cuda_moe_combine(s->tp_out, NULL, shared, v->y, v->position, v->weight, N, k, C, st)));
    if (m->etp > 1) {
        cuda_tp_sum_partial_residual(m, out, resid, s->tp_out, N, C);
    } else {
        const size_t first = (size_t)model_shape_row_offset(&m->shape, N) * C;
        TIMED(m, PROF_NORM, CUDA_CHECK(cuda_add_bf16(out, resid, s->tp_out + first,
                                                     (size_t)model_shape_rows(&m->shape, N) * C, st)));
    }
}

const bf16_t *cuda_moe_backward(CudaModel *m, int l, const bf16_t *x, const bf16_t *dy, float loss_scale) {
    const MoeConfig *mc = moe_cfg(m);
    const LayerOffsets *o = &m->layers[l];
    const LayerSaved *sv = &m->saved[l];
    MoeSaved *v = sv->moe;
    MoeScratch *s = m->moe;
    CudaContext *ctx = &m->ctx;
    cudaStream_t st = ctx->stream;
    const int N = v->N, C = m->shape.C, E = mc->num_experts, k = mc->num_experts_per_tok, A = N * k;
    const int Is = cuda_moe_shared_I(m);
    const int sigmoid = mc->score_function == SCORE_SIGMOID;

    TIMED(m, PROF_MOE_PERMUTE,
          CUDA_CHECK(cuda_moe_combine_backward(s->d_rows, s->d_w, dy, v->y, v->position, v->weight, A, k, C, st)));
    if (m->etp > 1) /* each tp rank has a slice of the outputs: the whole dot products are their sum */
        TIMED(m, PROF_TP_COMM, device_all_reduce(m->tp_comm, s->d_w, (size_t)A, NCCL_DTYPE_FLOAT, false, st));
    if (m->ep > 1) {
        experts_backward_ep(m, o, v);
        release_spill(m, v); /* the expert side is used */
    } else {
        const CudaExpertRows rows_of = {.experts = E, .offsets = v->offsets, .d_offsets = v->d_offsets};
        TIMED(m, PROF_MOE_EXPERTS, cuda_moe_experts_backward(m, o, &rows_of, v->xin, v->gate_up, v->act, s->d_rows,
                                                             s->side.d_act, s->side.d_gate_up, s->d_xin));
    }
    if (Is > 0) { /* the shared expert's input gradient starts d_normed */
        cuda_linear_backward(m, s->d_s_act, dy, C, v->s_act, o->s_down, -1, N, Is, C, 0);
        TIMED(m, PROF_SWIGLU, CUDA_CHECK(cuda_swiglu_backward(s->d_s_gate_up, s->d_s_act, v->s_gate_up, N, Is, st)));
        cuda_linear_backward(m, m->d_normed, s->d_s_gate_up, 2 * Is, x, o->s_gate, -1, N, C, 2 * Is, 0);
    } else {
        CUDA_CHECK(cudaMemsetAsync(m->d_normed, 0, (size_t)N * C * sizeof(bf16_t), st));
    }

    /* the router: d_logits from the combine weights' gradients and the auxiliary losses */
    const float *coef = NULL;
    if (v->aux_scale != 0.0) { /* v->aux_counts stays as it is until this layer's next forward, which waits */
        CUDA_CHECK(cudaMemcpyAsync(s->aux_coef, v->aux_counts, (size_t)v->aux_rows * E * sizeof(float),
                                   cudaMemcpyHostToDevice, st));
        coef = s->aux_coef;
    }
    const float aux_mult = (float)(loss_scale * v->aux_scale);
    const float z_mult = mc->z_loss_coeff > 0 ? (float)(loss_scale * v->z_scale * 2.0) : 0.0f;
    TIMED(m, PROF_MOE_ROUTER, {
        CUDA_CHECK(cuda_moe_router_backward(s->d_logits, s->d_w, v->logits, v->scores, v->score_sum, v->lse,
                                            v->selected, v->raw, v->weight, coef, v->aux_span, aux_mult, z_mult, N,
                                            E, k, sigmoid, mc->norm_topk_prob, st));
        CUDA_CHECK(cuda_cast_bf16_to_fp32(s->x32, x, (size_t)N * C, st));
        cuda_sgemm_backward(ctx, s->router_dx, g32(m, o->router), s->d_logits, s->x32, cuda_model_f32(m, o->router),
                            N, C, E);
    });
    /* the router is whole on every tp rank: with etp > 1 the input gradient is summed over tp below, so only tp
     * rank 0 adds the router's part */
    const float *router_dx = m->etp == 1 || m->shape.tp_rank == 0 ? s->router_dx : NULL;
    TIMED(m, PROF_MOE_PERMUTE,
          CUDA_CHECK(cuda_moe_scatter(m->d_normed, s->d_xin, v->position, router_dx, N, k, C, st)));
    if (m->shape.tp > 1 && m->etp == 1) /* computed whole on every tp rank: this rank's rows */
        return m->d_normed + (size_t)model_shape_row_offset(&m->shape, N) * C;
    return cuda_tp_enter_backward(m, m->d_normed, N, C);
}

bool cuda_model_download_routing(CudaModel *m, int l, int32_t *selected) {
    if (l < 0 || l >= m->shape.L || !m->layers[l].moe) return false;
    const MoeSaved *v = m->saved[l].moe;
    const size_t bytes = (size_t)v->N * moe_cfg(m)->num_experts_per_tok * sizeof(int32_t);
    CUDA_CHECK(cudaMemcpyAsync(selected, v->selected, bytes, cudaMemcpyDeviceToHost, m->ctx.stream));
    CUDA_CHECK(cudaStreamSynchronize(m->ctx.stream));
    return true;
}

void cuda_model_upload_expert_biases(CudaModel *m, const float *host_params) {
    for (int l = 0; l < m->shape.L; l++) {
        const long offset = m->layers[l].expert_bias;
        if (offset >= 0) cuda_model_upload_range(m, offset, moe_cfg(m)->num_experts, host_params + offset);
    }
}
