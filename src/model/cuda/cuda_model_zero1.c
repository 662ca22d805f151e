/* cuda_model_zero1.c: the distributed optimizer (ZeRO-1, Megatron's
 * --use-distributed-optimizer) on the GPU, over the host's split
 * (src/dist/zero1.h): the flat arrays cut into buckets of DP_BUCKET_BYTES,
 * each into dp equal parts (the routed experts' under expert parallel into
 * edp parts), rank r owning part r of every bucket. The same split as the
 * CPU's, so the host's AdamW shard, the checkpoints (each rank writes its
 * parts of the moments) and a resume on any layout or device are shared.
 *
 * Per step, on the model's comm stream:
 *   backward   each bucket is reduce-scattered (summed, then scaled by
 *              1 / dp; the experts' by expert_scale / edp) as soon as every
 *              float in it is final: on the last micro-batch, after layer
 *              l's backward, the buckets inside [layer l, the last layer)
 *              go (the layers run top down, so the ones above are done);
 *              the rest (the embedding, the final norm and the lm_head,
 *              the experts' region) after the stage's last backward op.
 *              A tied embedding shared by two pipeline stages is summed over
 *              them first, so the buckets touching it are held back until
 *              cuda_model_zero1_reduce_held. The compute stream goes on
 *              with the layers below meanwhile.
 *   norm       the sum of squares of this rank's parts (of the parameters it
 *              counts under tp), summed over dp (the experts' parts are
 *              disjoint over ep and edp, so dp covers them once).
 *   update     AdamW on this rank's parts only: the fp32 master and both
 *              moments are shards of `owned` floats (CudaModel.params,
 *              exp_avg, exp_avg_sq; CudaAdamWChunk.state: the parts one after
 *              another, the host's order), the bf16 copy of the updated
 *              parts written in place in the whole bf16 weights.
 *   gather     the bf16 weights all-gathered bucket by bucket (the buckets
 *              holding routed experts first: the expert region at ep > 1, at
 *              ep 1 the end of the one region, where the registry puts them
 *              after every layer; then the flat order, which is the
 *              forward's); an event per bucket, and the forward of layer l
 *              waits only for the bucket holding its last float, and a MoE
 *              layer also for its experts' last bucket (Megatron's
 *              overlap-param-gather): the first layers compute while the
 *              last ones are still being gathered. Before them, the few
 *              weights the GPU reads in fp32 (the MoE routers and their
 *              expert_bias) are made whole again in a replica of their own:
 *              each rank writes its parts, zeros elsewhere, summed over dp
 *              (exact: one value and zeros).
 * So a rank holds, of its fp32 master and moments, 1/dp (12 bytes a
 * parameter with fp32 states, 8 with bf16, down to 1/dp), and whole the bf16
 * weights and the fp32 gradients, as Megatron's distributed optimizer does.
 * The host's copy of the weights (checkpoints, replica checks) is each
 * rank's parts downloaded and all-gathered over dp on the host
 * (model_device_cuda.c); an upload casts the host's whole fp32 array to bf16
 * through a staging buffer of one bucket and keeps this rank's parts.
 *
 * A bucket whose size is not a multiple of the group goes through the padded
 * staging buffer (the last of each region); the others are reduced and
 * gathered in place (NCCL's in-place forms: a rank's part at its offset in
 * the bucket). */
#include <stdlib.h>
#include <string.h>

#include "../../core/error.h"
#include "cuda_model_internal.h"

/* A run of floats the GPU reads in fp32 (a router, an expert_bias): [at, at + n) of the flat array, kept whole at
 * replica + copy; and a piece of this rank's parts in it: shard [from, from + n) -> replica [to, to + n). */
typedef struct Fp32Run {
    long at, n, copy;
} Fp32Run;
typedef struct Fp32Piece {
    size_t from, to, n;
} Fp32Piece;

struct CudaZero1 {
    Zero1Bucket *buckets;
    size_t *shard_at;     /* per bucket: where this rank's part of it starts in the shard */
    int num_buckets;
    int size[2], rank[2]; /* each region's group (0: dp, 1: edp) */
    float scale[2];
    bool *issued;         /* this step's reduce-scatter is enqueued */
    long hold_begin, hold_end; /* a tied embedding's range: its buckets wait for cuda_model_zero1_reduce_held */
    float *pad;           /* device staging: a ragged bucket padded, an upload's bucket (pad_floats) */
    size_t pad_floats;
    Fp32Run *runs;        /* the fp32-read weights (MoE routers and expert_bias) */
    int num_runs;
    Fp32Piece *pieces;
    int num_pieces;
    float *replica;       /* device: their whole fp32 values (replica_floats) */
    size_t replica_floats;
    cudaEvent_t *gathered; /* per bucket: its bf16 weights are whole again */
    cudaEvent_t updated;  /* the update ran (the gathers wait for it) */
    int *layer_bucket;    /* per layer: the bucket holding its last float; the embedding's before the layers */
    int *expert_bucket;   /* per MoE layer: the bucket holding the last float of its routed experts (-1: none) */
    bool *experts_first;  /* per bucket: gathered before the rest (it holds routed experts, which every region's
                           * layout puts after the layers: at ep 1 in region 0, else region 1) */
    int embed_bucket;     /* -1: nothing before the layers */
    bool gather_pending;  /* a gather has been enqueued (before the first update there is none to wait for) */
};

/* ---- the split ----------------------------------------------------------- */

/* The floats rank `rank` of the bucket's group owns in bucket b: [*begin, *end) of the flat array. */
static void owned_part(const Zero1Bucket *b, int rank, size_t *begin, size_t *end) {
    size_t lo = (size_t)rank * b->share, hi = lo + b->share;
    if (lo > b->n) lo = b->n;
    if (hi > b->n) hi = b->n;
    *begin = b->at + lo;
    *end = b->at + hi;
}

/* The weights the GPU reads in fp32 (each MoE layer's router and expert_bias) and the pieces of this rank's parts in
 * them. */
static void find_fp32_runs(CudaZero1 *z, const CudaModel *m, const Zero1 *split) {
    const int E = m->cfg.moe.num_experts, C = m->cfg.hidden_size;
    z->runs = mt_malloc((size_t)(2 * m->shape.L + 1) * sizeof *z->runs);
    for (int l = 0; l < m->shape.L; l++) {
        const LayerOffsets *o = &m->layers[l];
        if (!o->moe) continue;
        z->runs[z->num_runs++] = (Fp32Run){o->router, (long)E * C, (long)z->replica_floats};
        z->replica_floats += (size_t)E * C;
        if (o->expert_bias >= 0) {
            z->runs[z->num_runs++] = (Fp32Run){o->expert_bias, E, (long)z->replica_floats};
            z->replica_floats += (size_t)E;
        }
    }
    int cap = 8;
    z->pieces = mt_malloc((size_t)cap * sizeof *z->pieces);
    for (int k = 0; k < z->num_runs; k++) {
        const Fp32Run *r = &z->runs[k];
        size_t shard = 0;
        for (int i = 0; i < split->num_ranges; i++) {
            const size_t b = split->begin[i] > (size_t)r->at ? split->begin[i] : (size_t)r->at;
            const size_t e = split->end[i] < (size_t)(r->at + r->n) ? split->end[i] : (size_t)(r->at + r->n);
            if (b < e) {
                if (z->num_pieces == cap) z->pieces = mt_realloc(z->pieces, (size_t)(cap *= 2) * sizeof *z->pieces);
                z->pieces[z->num_pieces++] = (Fp32Piece){shard + (b - split->begin[i]),
                                                         (size_t)r->copy + (b - (size_t)r->at), e - b};
            }
            shard += split->end[i] - split->begin[i];
        }
    }
}

/* The bucket of region `region` (-1: any) holding float `index`, or -1. */
static int bucket_in(const CudaZero1 *z, int region, size_t index) {
    for (int i = 0; i < z->num_buckets; i++)
        if ((region < 0 || z->buckets[i].region == region) && index >= z->buckets[i].at &&
            index < z->buckets[i].at + z->buckets[i].n)
            return i;
    return -1;
}

static int bucket_of(const CudaZero1 *z, size_t index) { return bucket_in(z, 0, index); }

/* One past the last float of the parameter that starts at float `offset`. */
static size_t param_end(const CudaModel *m, long offset) {
    for (int p = 0; p < m->num_params; p++)
        if ((long)m->info[p].offset == offset) return m->info[p].offset + (size_t)m->info[p].numel;
    return (size_t)offset + 1;
}

/* Which buckets hold routed experts (gathered first) and, per MoE layer, the bucket of its experts' last float:
 * the registry puts every layer's experts after all layers, so at ep 1 (one region) they are region 0's last
 * buckets, and a MoE layer's forward must wait for them besides its own last dense float's bucket. */
static void find_expert_buckets(CudaZero1 *z, const CudaModel *m) {
    const int L = m->shape.L;
    z->expert_bucket = mt_malloc((size_t)(L > 0 ? L : 1) * sizeof(int));
    z->experts_first = mt_calloc((size_t)(z->num_buckets > 0 ? z->num_buckets : 1), sizeof(bool));
    for (int i = 0; i < z->num_buckets; i++) z->experts_first[i] = z->buckets[i].region == 1;
    for (int l = 0; l < L; l++) {
        const LayerOffsets *o = &m->layers[l];
        z->expert_bucket[l] = -1;
        if (!o->moe) continue;
        const long starts[3] = {o->e_gate, o->e_up, o->e_down};
        size_t last = 0;
        for (int k = 0; k < 3; k++) {
            const size_t begin = (size_t)starts[k], end = param_end(m, starts[k]);
            if (end > last) last = end;
            for (int i = 0; i < z->num_buckets; i++) /* every bucket overlapping [begin, end) */
                if (z->buckets[i].at < end && begin < z->buckets[i].at + z->buckets[i].n) z->experts_first[i] = true;
        }
        z->expert_bucket[l] = last > 0 ? bucket_in(z, -1, last - 1) : -1;
    }
}

CudaZero1 *cuda_zero1_create(const CudaModel *m, const Zero1 *split, char *err, size_t errlen) {
    if ((long)split->count != m->num_floats) {
        mt_set_error(err, errlen, "the distributed optimizer's split covers %zu floats, the CUDA model has %ld",
                     split->count, m->num_floats);
        return NULL;
    }
    CudaZero1 *z = mt_calloc(1, sizeof *z);
    z->num_buckets = zero1_num_buckets(split);
    z->buckets = mt_malloc((size_t)(z->num_buckets > 0 ? z->num_buckets : 1) * sizeof *z->buckets);
    for (int r = 0; r < 2; r++) {
        const Comm *g = zero1_region_group(split, r);
        z->size[r] = g ? g->size : 1;
        z->rank[r] = g ? g->rank : 0;
        z->scale[r] = zero1_region_scale(split, r);
    }
    z->shard_at = mt_malloc((size_t)(z->num_buckets > 0 ? z->num_buckets : 1) * sizeof *z->shard_at);
    size_t shard = 0;
    for (int i = 0; i < z->num_buckets; i++) {
        z->buckets[i] = zero1_bucket(split, i);
        const Zero1Bucket *b = &z->buckets[i];
        const size_t padded = b->share * (size_t)z->size[b->region];
        if (padded > z->pad_floats) z->pad_floats = padded; /* the staging holds a whole bucket, padded */
        size_t begin, end;
        owned_part(b, z->rank[b->region], &begin, &end);
        z->shard_at[i] = shard;
        shard += end - begin;
    }
    if (shard != split->owned) {
        mt_set_error(err, errlen, "the distributed optimizer's buckets hold %zu floats of this rank, its split %zu",
                     shard, split->owned);
        cuda_zero1_free(z);
        return NULL;
    }
    find_fp32_runs(z, m, split);
    z->issued = mt_calloc((size_t)(z->num_buckets > 0 ? z->num_buckets : 1), sizeof *z->issued);
    z->hold_begin = z->hold_end = -1;
    z->layer_bucket = mt_malloc((size_t)(m->shape.L > 0 ? m->shape.L : 1) * sizeof(int));
    for (int l = 0; l < m->shape.L; l++) z->layer_bucket[l] = bucket_of(z, (size_t)m->layer_end[l] - 1);
    z->embed_bucket = m->shape.L > 0 && m->layer_begin[0] > 0 ? bucket_of(z, (size_t)m->layer_begin[0] - 1) : -1;
    find_expert_buckets(z, m);
    return z;
}

void cuda_zero1_layout(CudaModel *m, Carver *c) {
    if (!m->z1) return;
    if (m->z1->pad_floats) CARVE(c, m->z1->pad, m->z1->pad_floats);
    if (m->z1->replica_floats) CARVE(c, m->z1->replica, m->z1->replica_floats);
}

void cuda_zero1_start(CudaModel *m) { /* after the arena: the events */
    CudaZero1 *z = m->z1;
    z->gathered = mt_malloc((size_t)(z->num_buckets > 0 ? z->num_buckets : 1) * sizeof *z->gathered);
    for (int i = 0; i < z->num_buckets; i++)
        CUDA_CHECK(cudaEventCreateWithFlags(&z->gathered[i], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&z->updated, cudaEventDisableTiming));
}

void cuda_zero1_free(CudaZero1 *z) {
    if (!z) return;
    if (z->gathered) {
        for (int i = 0; i < z->num_buckets; i++) cudaEventDestroy(z->gathered[i]);
        cudaEventDestroy(z->updated);
    }
    free(z->gathered);
    free(z->buckets);
    free(z->shard_at);
    free(z->runs);
    free(z->pieces);
    free(z->issued);
    free(z->layer_bucket);
    free(z->expert_bucket);
    free(z->experts_first);
    free(z);
}

/* The AdamW chunks of this rank's parts (every trained parameter's floats in them; with norm_only, those of the
 * parameters this rank counts in the grad norm): at most MT_ADAMW_CHUNK floats each, inside one parameter, their
 * moments at their place in the shard (the parts one after another). */
CudaAdamWChunk *cuda_zero1_chunks(const Model *host, const Zero1 *split, bool norm_only, int *count) {
    int n = 0, cap = 64;
    CudaAdamWChunk *chunks = mt_malloc((size_t)cap * sizeof *chunks);
    for (int i = 0; i < host->num_params; i++) {
        const ParamInfo *p = &host->param_info[i];
        if (norm_only && !p->norm_owner) continue;
        const size_t begin = p->offset, end = p->offset + (size_t)p->numel;
        size_t shard = 0; /* the shard's place of range r's first float */
        for (int r = 0; r < split->num_ranges; r++) {
            const size_t b = split->begin[r] > begin ? split->begin[r] : begin;
            const size_t e = split->end[r] < end ? split->end[r] : end;
            for (size_t at = b; at < e; at += MT_ADAMW_CHUNK) {
                if (n == cap) chunks = mt_realloc(chunks, (size_t)(cap *= 2) * sizeof *chunks);
                const size_t len = e - at < MT_ADAMW_CHUNK ? e - at : MT_ADAMW_CHUNK;
                chunks[n++] = (CudaAdamWChunk){.offset = at, .length = (unsigned)len, .decay = !p->no_decay,
                                               .state = shard + (at - split->begin[r])};
            }
            shard += split->end[r] - split->begin[r];
        }
    }
    *count = n;
    return chunks;
}

void cuda_model_zero1_hold(CudaModel *m, long offset, long count) {
    if (!m->z1) return;
    m->z1->hold_begin = offset;
    m->z1->hold_end = offset + count;
}

/* ---- the gradients --------------------------------------------------------- */

static DeviceComm *group_of(const CudaModel *m, int region) { return region == 0 ? m->grad_sync : m->edp_comm; }

/* Bucket i's gradients: this rank's part becomes the group's sum times the region's scale (comm stream). */
static void reduce_bucket(CudaModel *m, int i) {
    CudaZero1 *z = m->z1;
    const Zero1Bucket *b = &z->buckets[i];
    const int size = z->size[b->region], rank = z->rank[b->region];
    cudaStream_t st = m->comm_stream;
    size_t begin, end;
    owned_part(b, rank, &begin, &end);
    z->issued[i] = true;
    if (size > 1) {
        DeviceComm *c = group_of(m, b->region);
        float *at = m->grads + b->at;
        if (b->share * (size_t)size == b->n) { /* in place: this rank's part at its place */
            device_reduce_scatter_sum(c, at, at + (size_t)rank * b->share, b->share, NCCL_DTYPE_FLOAT, st);
        } else {
            const size_t padded = b->share * (size_t)size;
            CUDA_CHECK(cudaMemcpyAsync(z->pad, at, b->n * sizeof(float), cudaMemcpyDeviceToDevice, st));
            CUDA_CHECK(cudaMemsetAsync(z->pad + b->n, 0, (padded - b->n) * sizeof(float), st));
            float *mine = z->pad + (size_t)rank * b->share;
            device_reduce_scatter_sum(c, z->pad, mine, b->share, NCCL_DTYPE_FLOAT, st);
            if (end > begin)
                CUDA_CHECK(cudaMemcpyAsync(m->grads + begin, mine, (end - begin) * sizeof(float),
                                           cudaMemcpyDeviceToDevice, st));
        }
    }
    if (end > begin) CUDA_CHECK(cuda_scale_f32(m->grads + begin, z->scale[b->region], end - begin, st));
}

static bool held(const CudaZero1 *z, const Zero1Bucket *b) {
    return z->hold_end > z->hold_begin && (long)b->at < z->hold_end && (long)(b->at + b->n) > z->hold_begin;
}

void cuda_zero1_layer_done(CudaModel *m, int l) {
    CudaZero1 *z = m->z1;
    const long lo = m->layer_begin[l], hi = m->layer_end[m->shape.L - 1];
    bool any = false;
    for (int i = 0; i < z->num_buckets; i++) {
        const Zero1Bucket *b = &z->buckets[i];
        if (z->issued[i] || b->region != 0 || (long)b->at < lo || (long)(b->at + b->n) > hi || held(z, b)) continue;
        if (!any) { /* the comm stream starts once the compute stream has reached here */
            CUDA_CHECK(cudaEventRecord(m->layer_done[l], m->ctx.stream));
            CUDA_CHECK(cudaStreamWaitEvent(m->comm_stream, m->layer_done[l], 0));
            any = true;
        }
        reduce_bucket(m, i);
    }
}

void cuda_zero1_finish(CudaModel *m) {
    CudaZero1 *z = m->z1;
    CUDA_CHECK(cudaEventRecord(m->layer_done[m->shape.L], m->ctx.stream));
    CUDA_CHECK(cudaStreamWaitEvent(m->comm_stream, m->layer_done[m->shape.L], 0));
    for (int i = 0; i < z->num_buckets; i++)
        if (!z->issued[i] && !held(z, &z->buckets[i])) reduce_bucket(m, i);
    CUDA_CHECK(cudaEventRecord(m->comm_done, m->comm_stream));
}

void cuda_model_zero1_reduce_held(CudaModel *m) {
    CudaZero1 *z = m->z1;
    if (!z) return;
    CUDA_CHECK(cudaEventRecord(m->layer_done[m->shape.L], m->ctx.stream));
    CUDA_CHECK(cudaStreamWaitEvent(m->comm_stream, m->layer_done[m->shape.L], 0));
    for (int i = 0; i < z->num_buckets; i++)
        if (!z->issued[i]) reduce_bucket(m, i);
    CUDA_CHECK(cudaEventRecord(m->comm_done, m->comm_stream));
    CUDA_CHECK(cudaStreamWaitEvent(m->ctx.stream, m->comm_done, 0));
}

void cuda_zero1_step_begin(CudaModel *m) {
    if (m->z1) memset(m->z1->issued, 0, (size_t)m->z1->num_buckets * sizeof *m->z1->issued);
}

/* ---- the parameters -------------------------------------------------------- */

/* Bucket i's bf16 weights from their owners (comm stream): each rank's part was written by its update. */
static void gather_bucket(CudaModel *m, int i) {
    CudaZero1 *z = m->z1;
    const Zero1Bucket *b = &z->buckets[i];
    const int size = z->size[b->region], rank = z->rank[b->region];
    cudaStream_t st = m->comm_stream;
    bf16_t *at = m->params16 + b->at;
    if (size > 1) {
        DeviceComm *c = group_of(m, b->region);
        if (b->share * (size_t)size == b->n) {
            device_all_gather(c, at + (size_t)rank * b->share, at, b->share, NCCL_DTYPE_BF16, st);
        } else {
            size_t begin, end;
            owned_part(b, rank, &begin, &end);
            bf16_t *pad = (bf16_t *)z->pad, *mine = pad + (size_t)rank * b->share;
            if (end > begin)
                CUDA_CHECK(cudaMemcpyAsync(mine, m->params16 + begin, (end - begin) * sizeof(bf16_t),
                                           cudaMemcpyDeviceToDevice, st));
            if (b->share > end - begin)
                CUDA_CHECK(cudaMemsetAsync(mine + (end - begin), 0, (b->share - (end - begin)) * sizeof(bf16_t), st));
            device_all_gather(c, mine, pad, b->share, NCCL_DTYPE_BF16, st);
            CUDA_CHECK(cudaMemcpyAsync(at, pad, b->n * sizeof(bf16_t), cudaMemcpyDeviceToDevice, st));
        }
    }
    CUDA_CHECK(cudaEventRecord(z->gathered[i], st));
}

/* The fp32 replica of the routers and expert biases from every rank's parts of the master (comm stream): each
 * writes its own, zeros elsewhere, and the sum over dp is every value exactly. */
static void refresh_replica(CudaModel *m) {
    CudaZero1 *z = m->z1;
    if (!z->replica_floats) return;
    cudaStream_t st = m->comm_stream;
    CUDA_CHECK(cudaMemsetAsync(z->replica, 0, z->replica_floats * sizeof(float), st));
    for (int k = 0; k < z->num_pieces; k++)
        CUDA_CHECK(cudaMemcpyAsync(z->replica + z->pieces[k].to, m->params + z->pieces[k].from,
                                   z->pieces[k].n * sizeof(float), cudaMemcpyDeviceToDevice, st));
    if (z->size[0] > 1) device_all_reduce(m->grad_sync, z->replica, z->replica_floats, NCCL_DTYPE_FLOAT, false, st);
}

void cuda_zero1_gather(CudaModel *m) {
    CudaZero1 *z = m->z1;
    CUDA_CHECK(cudaEventRecord(z->updated, m->ctx.stream));
    CUDA_CHECK(cudaStreamWaitEvent(m->comm_stream, z->updated, 0));
    refresh_replica(m); /* first: any MoE layer's router reads it */
    for (int pass = 1; pass >= 0; pass--) /* the experts' buckets first: any layer may need its experts */
        for (int i = 0; i < z->num_buckets; i++)
            if (z->experts_first[i] == (pass == 1)) gather_bucket(m, i);
    CUDA_CHECK(cudaEventRecord(m->comm_done, m->comm_stream));
    z->gather_pending = true;
}

const float *cuda_model_f32(CudaModel *m, long offset) {
    if (!m->z1) return m->params + offset;
    const CudaZero1 *z = m->z1;
    for (int k = 0; k < z->num_runs; k++)
        if (offset >= z->runs[k].at && offset < z->runs[k].at + z->runs[k].n)
            return z->replica + z->runs[k].copy + (offset - z->runs[k].at);
    mt_die(MT_EXIT_FAILURE, "CUDA model: the fp32 weights at float %ld are not kept whole under the distributed "
           "optimizer (only the MoE routers and expert biases are)", offset);
}

/* ---- the host's copy ---------------------------------------------------------- */

/* host[offset, offset + count) (the flat array's fp32 values) into the model: the bf16 copy of them (cast through
 * the staging buffer), this rank's parts of them into the master and those in the fp32 replica; on the compute
 * stream, done on return. */
void cuda_zero1_upload(CudaModel *m, long offset, long count, const float *host) {
    CudaZero1 *z = m->z1;
    cudaStream_t st = m->ctx.stream;
    for (long at = offset; at < offset + count;) { /* the bf16 copy, a staging buffer at a time */
        const long n = offset + count - at < (long)z->pad_floats ? offset + count - at : (long)z->pad_floats;
        CUDA_CHECK(cudaMemcpyAsync(z->pad, host + (at - offset), (size_t)n * sizeof(float), cudaMemcpyHostToDevice,
                                   st));
        CUDA_CHECK(cuda_cast_fp32_to_bf16(m->params16 + at, z->pad, (size_t)n, st));
        CUDA_CHECK(cudaStreamSynchronize(st)); /* the staging buffer is reused */
        at += n;
    }
    for (int i = 0; i < z->num_buckets; i++) { /* this rank's parts */
        size_t begin, end;
        owned_part(&z->buckets[i], z->rank[z->buckets[i].region], &begin, &end);
        const size_t b = begin > (size_t)offset ? begin : (size_t)offset;
        const size_t e = end < (size_t)(offset + count) ? end : (size_t)(offset + count);
        if (b < e)
            CUDA_CHECK(cudaMemcpyAsync(m->params + z->shard_at[i] + (b - begin), host + (b - (size_t)offset),
                                       (e - b) * sizeof(float), cudaMemcpyHostToDevice, st));
    }
    for (int k = 0; k < z->num_runs; k++) { /* the fp32 replica */
        const Fp32Run *r = &z->runs[k];
        const long b = r->at > offset ? r->at : offset, e = r->at + r->n < offset + count ? r->at + r->n : offset + count;
        if (b < e)
            CUDA_CHECK(cudaMemcpyAsync(z->replica + r->copy + (b - r->at), host + (b - offset),
                                       (size_t)(e - b) * sizeof(float), cudaMemcpyHostToDevice, st));
    }
    CUDA_CHECK(cudaStreamSynchronize(st));
}

/* This rank's parts of the master into host (the flat array; the rest left as it was). */
void cuda_zero1_download(CudaModel *m, float *host) {
    CudaZero1 *z = m->z1;
    for (int i = 0; i < z->num_buckets; i++) {
        size_t begin, end;
        owned_part(&z->buckets[i], z->rank[z->buckets[i].region], &begin, &end);
        if (end > begin)
            CUDA_CHECK(cudaMemcpyAsync(host + begin, m->params + z->shard_at[i], (end - begin) * sizeof(float),
                                       cudaMemcpyDeviceToHost, m->ctx.stream));
    }
    CUDA_CHECK(cudaStreamSynchronize(m->ctx.stream));
}

/* The compute stream waits for the parameters the next op reads: layer l's (l >= 0), the embedding's (-1) or all
 * (-2: the head, and before the host reads or writes them). */
void cuda_zero1_wait(CudaModel *m, int l) {
    CudaZero1 *z = m->z1;
    if (!z || !z->gather_pending) return;
    const int i = l >= 0 ? z->layer_bucket[l] : l == -1 ? z->embed_bucket : -1;
    if (l == -1 && i < 0) return; /* nothing before the layers */
    if (i < 0) {
        CUDA_CHECK(cudaStreamWaitEvent(m->ctx.stream, m->comm_done, 0));
        return;
    }
    CUDA_CHECK(cudaStreamWaitEvent(m->ctx.stream, z->gathered[i], 0));
    /* a MoE layer also reads its routed experts: gathered earlier, but maybe in a bucket after its own last float's
     * (the bucket shared with the last layer's floats, at ep 1) */
    if (l >= 0 && z->expert_bucket[l] >= 0 && z->expert_bucket[l] != i)
        CUDA_CHECK(cudaStreamWaitEvent(m->ctx.stream, z->gathered[z->expert_bucket[l]], 0));
}
