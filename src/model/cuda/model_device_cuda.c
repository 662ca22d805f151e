/* model_device_cuda.c: the GPU as a ModelDevice (model_device.h). The CUDA
 * model (cuda_model.h) holds the fp32 master weights, gradients, AdamW
 * states (fp32 or bf16; with the distributed optimizer this rank's shard of
 * them, cuda_model_zero1.c) and activations and does every step; the host Model keeps the
 * registry and the weights for checkpoints, which come back from the GPU
 * before a checkpoint is written (to_host) and go to it after one is loaded
 * (from_host). One GPU per rank (its local rank picks it); data, tensor and
 * context parallel collectives through dist/device_comm.h (NCCL, or staged
 * through the host when ranks share a GPU); pipeline stages send through
 * the host. CUDA builds only (make CUDA=1; model_device.c stands in
 * otherwise). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../backend/cuda/cuda_device.h"
#include "../../core/error.h"
#include "../../dist/device_comm.h"
#include "../../dist/dp_sync.h"
#include "../../dist/launch_env.h"
#include "../model_device.h"
#include "cuda_model.h"

/* The implementation's state: the CUDA model and the device communicators of this rank's groups (the model keeps
 * pointers to them). */
typedef struct CudaDevice {
    CudaModel *model;
    DeviceComm dp_comm, tp_comm, cp_comm, pp_comm, embed_comm, ep_comm, edp_comm;
} CudaDevice;

static CudaDevice *impl(ModelDevice *d) { return d->impl; }
static CudaModel *gpu(ModelDevice *d) { return impl(d)->model; }

int model_device_cuda_check(const ModelDeviceSetup *s, char *err, size_t errlen) {
    return model_device_cuda_limits(s, err, errlen) > 0 ? MT_EXIT_USAGE : 0;
}

/* Test hook: MEGATRAIN_NCCL_SINGLE_RANK=1 averages gradients through NCCL
 * even on one rank (a group of one), so the overlapped path runs on a
 * machine with a single GPU. */
static bool dp_sync_wanted(const ModelDevice *d) {
    const char *single = getenv("MEGATRAIN_NCCL_SINGLE_RANK");
    return d->grid->groups[GROUP_DP].size > 1 || (single && strcmp(single, "1") == 0);
}

/* Whether two ranks of the job share a GPU (the same PCI bus id on the same
 * host), which NCCL refuses. A collective; every rank gets the same answer
 * from the same gathered records. */
static bool gpus_shared(const CudaModel *cuda) {
    const Comm *world = comm_world();
    if (world->size == 1) return false;
    enum { RECORD = 128 };
    char mine[RECORD] = {0};
    gethostname(mine, RECORD / 2 - 1);
    cuda_model_pci_bus_id(cuda, mine + RECORD / 2, RECORD / 2);
    char *all = mt_malloc((size_t)world->size * RECORD);
    comm_all_gather(world, mine, all, RECORD, COMM_BYTE);
    bool shared = false;
    for (int i = 0; i < world->size && !shared; i++)
        for (int j = i + 1; j < world->size && !shared; j++)
            shared = memcmp(all + (size_t)i * RECORD, all + (size_t)j * RECORD, RECORD) == 0;
    free(all);
    return shared;
}

/* Whether device collectives go through the host (device_comm.h): when
 * MEGATRAIN_DEVICE_COMM is "host", or when ranks share a GPU ("nccl" forces
 * NCCL); rank 0's choice for every rank (a launcher may not pass the
 * variable to other machines). *why says what chose it. 0, or -1 with err
 * set for an unknown value (on rank 0: the others follow). */
static int staged_wanted(const CudaModel *cuda, bool *staged, const char **why, char *err, size_t errlen) {
    const char *how = getenv("MEGATRAIN_DEVICE_COMM");
    const bool given = how && *how;
    const bool shared = gpus_shared(cuda); /* collectives: every rank calls both */
    int32_t choice = given && strcmp(how, "host") == 0 ? 1 : given && strcmp(how, "nccl") == 0 ? 0 : given ? -1
                                                                                                  : shared;
    comm_broadcast(comm_world(), &choice, 1, COMM_INT32, 0);
    if (choice < 0) {
        mt_set_error(err, errlen, "MEGATRAIN_DEVICE_COMM: expected host or nccl, found '%s'", given ? how : "");
        return -1;
    }
    *staged = choice == 1;
    *why = given ? "MEGATRAIN_DEVICE_COMM=host" : "ranks share a GPU";
    return 0;
}

/* The communicators of this rank's groups, every rank in the same order: tp, cp, pp (NCCL only), the tied
 * embedding's, dp, ep and edp.
 * 0, or -1 with err set. */
static int create_comms(ModelDevice *d, const ModelDeviceSetup *s, char *err, size_t errlen) {
    CudaDevice *c = impl(d);
    const Grid *grid = d->grid;
    bool staged = false;
    const char *why = "";
    if (staged_wanted(c->model, &staged, &why, err, errlen) != 0) return -1;
    const bool tp = s->part->tp > 1, cp = s->part->cp > 1, dp = dp_sync_wanted(d), ep = s->part->ep > 1;
    if ((tp || cp || dp || ep) && staged)
        mt_log("device collectives: staged through the host over MPI (%s): slow, for checking layouts on fewer GPUs "
               "than ranks", why);
    if (tp) {
        if (device_comm_create(&c->tp_comm, &grid->groups[GROUP_TP], staged, err, errlen) != 0) return -1;
        cuda_model_set_tp_comm(c->model, &c->tp_comm);
        mt_log("tensor parallel: %d GPUs%s, activations summed with %s", c->tp_comm.size,
               s->part->sequence_parallel ? " with sequence parallel" : "", staged ? "MPI" : "NCCL");
    }
    if (cp) {
        if (device_comm_create(&c->cp_comm, &grid->groups[GROUP_CP], staged, err, errlen) != 0) return -1;
        cuda_model_set_cp_comm(c->model, &c->cp_comm);
        mt_log("context parallel: %d GPUs, keys and values all-gathered with %s", c->cp_comm.size,
               staged ? "MPI" : "NCCL");
    }
    if (grid->layout.pp > 1 && !staged) { /* the pipeline's transfers GPU to GPU (a staged group: through the host) */
        if (device_comm_create(&c->pp_comm, &grid->groups[GROUP_PP], false, err, errlen) != 0) return -1;
        cuda_model_set_pp_comm(c->model, &c->pp_comm);
    }
    if (grid->layout.pp > 1 && grid->in_embedding && s->cfg->tie_word_embeddings) {
        /* the tied embedding's gradient: the first stage's and the last stage's copy summed */
        if (device_comm_create(&c->embed_comm, &grid->groups[GROUP_EMBEDDING], staged, err, errlen) != 0) return -1;
        const ParamInfo *embed = model_embed_param(d->host); /* summed over the stages before its reduce-scatter */
        if (d->zero1_on && embed) cuda_model_zero1_hold(c->model, (long)embed->offset, embed->numel);
    }
    if (dp) {
        if (device_comm_create(&c->dp_comm, &grid->groups[GROUP_DP], staged, err, errlen) != 0) return -1;
        cuda_model_set_grad_sync(c->model, &c->dp_comm);
        if (d->zero1_on)
            mt_log("data parallel: %d GPU(s) with the distributed optimizer: gradients reduce-scattered with %s in "
                   "%d buckets during the backward, AdamW on this rank's %zu of %zu floats, parameters all-gathered "
                   "bucket by bucket ahead of the next forward's layers", c->dp_comm.size, staged ? "MPI" : "NCCL",
                   zero1_num_buckets(&d->zero1), d->zero1.owned, d->zero1.count);
        else
            mt_log("data parallel: %d GPU(s), gradients averaged with %s layer by layer during the backward",
                   c->dp_comm.size, staged ? "MPI" : "NCCL");
    }
    if (ep) { /* the token dispatch over ep; the experts' gradients over the ranks that hold the same ones */
        const Comm *edp = &grid->groups[GROUP_EDP];
        if (device_comm_create(&c->ep_comm, &grid->groups[GROUP_EP], staged, err, errlen) != 0) return -1;
        if (edp->size > 1 && device_comm_create(&c->edp_comm, edp, staged, err, errlen) != 0) return -1;
        cuda_model_set_ep_comm(c->model, &c->ep_comm, edp->size > 1 ? &c->edp_comm : NULL);
        mt_log("expert parallel: %d GPUs with %d experts each, tokens dispatched with %s all-to-all", c->ep_comm.size,
               s->cfg->moe.num_experts / c->ep_comm.size, staged ? "MPI" : "NCCL");
    }
    const bool pp = grid->layout.pp > 1;
    if (!staged && dp && (tp || cp || ep || pp)) { /* two communicators in flight: see comm_nccl.c */
        const char *order = getenv("NCCL_LAUNCH_ORDER_IMPLICIT");
        if (order && atoi(order) == 1)
            mt_log("NCCL: each GPU runs its communicators' operations in launch order (NCCL_LAUNCH_ORDER_IMPLICIT=1)");
        else
            mt_log_warn("NCCL_LAUNCH_ORDER_IMPLICIT is %s, not 1 (NCCL older than 2.26, or set so): the dp "
                   "averages and the %s collectives in flight at once may hang", order ? order : "unset",
                   tp ? "tp" : cp ? "cp" : ep ? "ep" : "pipeline's");
    }
    return 0;
}

static void device_destroy(ModelDevice *d) {
    CudaDevice *c = impl(d);
    if (!c) return;
    cuda_model_free(c->model);
    device_comm_destroy(&c->dp_comm);
    device_comm_destroy(&c->tp_comm);
    device_comm_destroy(&c->cp_comm);
    device_comm_destroy(&c->pp_comm);
    device_comm_destroy(&c->embed_comm);
    device_comm_destroy(&c->ep_comm);
    device_comm_destroy(&c->edp_comm);
    free(c);
    d->impl = NULL;
}

static void device_from_host(ModelDevice *d) {
    cuda_model_upload(gpu(d), d->host->params, adamw_m(&d->optimizer), adamw_v(&d->optimizer));
}

static void device_to_host(ModelDevice *d) {
    cuda_model_download(gpu(d), d->host->params, adamw_m(&d->optimizer), adamw_v(&d->optimizer));
    /* the distributed optimizer: each rank downloaded its parts of the fp32 master; every rank gets all of them */
    if (d->zero1_on) zero1_all_gather(&d->zero1, d->host->params);
}

static void device_grads_to_host(ModelDevice *d) { cuda_model_download_grads(gpu(d), d->host->grads); }
static void device_zero_grad(ModelDevice *d) { cuda_model_zero_grad(gpu(d)); }

static double device_forward(ModelDevice *d, const int32_t *inputs, const int32_t *targets, int B, int T) {
    return cuda_model_forward(gpu(d), inputs, targets, B, T);
}

/* train.loss per_token: refused by model_device_cuda_check; 0 (each micro-batch's mean) is what the CUDA model
 * computes. */
static void device_set_loss_tokens(ModelDevice *d, double tokens) {
    (void)d;
    if (tokens != 0) mt_die(MT_EXIT_FAILURE, "train.loss: per_token is not implemented on GPUs yet");
}

/* data.pack: refused by model_device_cuda_check; NULL (plain rows) is what the CUDA model computes. */
static void device_set_positions(ModelDevice *d, const int32_t *positions, int B, int T) {
    (void)d, (void)B, (void)T;
    if (positions) mt_die(MT_EXIT_FAILURE, "data.pack: packed rows are not implemented on GPUs yet");
}

static void device_backward(ModelDevice *d, float loss_scale, bool last) {
    cuda_model_backward(gpu(d), loss_scale, last);
    cuda_model_synchronize(gpu(d)); /* so the step timers see where the time goes */
}

/* The tp partial sums and the dp averages ran in the last backward; what is left: waiting for a pipeline stage's
 * dp averages (left in flight by its last backward) and, with tied embeddings over pipeline stages, the first and
 * last stages' embedding gradients summed. Returns when the GPU is done. */
static void device_reduce_grads(ModelDevice *d) {
    CudaDevice *c = impl(d);
    cuda_model_wait_grad_sync(c->model);
    if (c->embed_comm.size > 1) {
        const ParamInfo *embed = model_embed_param(d->host);
        cuda_model_sum_grads(c->model, &c->embed_comm, (long)embed->offset, embed->numel);
        cuda_model_zero1_reduce_held(c->model); /* the distributed optimizer: the buckets held for this sum */
        char err[512]; /* a peer that dies ends this rank too, as in cuda_model_synchronize */
        while (!cuda_model_idle(c->model))
            if (device_comm_check(&c->embed_comm, err, sizeof err) != 0 ||
                cuda_model_comms_failed(c->model, err, sizeof err) != 0)
                mt_die(MT_EXIT_FAILURE, "%s", err);
    }
    cuda_model_synchronize(c->model);
}

static double device_grad_sumsq(ModelDevice *d) { return cuda_model_grad_sumsq(gpu(d)); } /* summed over tp */

static void device_optimizer_step(ModelDevice *d, const OptimizerConfig *cfg, double lr, double grad_scale) {
    d->optimizer.step++;
    const CudaAdamWStep step = {.lr = lr,
                                .beta1 = cfg->beta1,
                                .beta2 = cfg->beta2,
                                .eps = cfg->eps,
                                .weight_decay = cfg->weight_decay,
                                .grad_scale = grad_scale,
                                .step = d->optimizer.step};
    cuda_model_adamw(gpu(d), &step);
    cuda_model_synchronize(gpu(d));
}

static void device_step_begin(ModelDevice *d) { model_moe_step_begin(d->host); }

/* The CUDA model's MoE layers recorded the step's routing in the host Model's MoeStep: the CPU's step end (the
 * figures, the expert-bias update on the host's weights), then the updated biases to the GPU. */
static bool device_moe_step_end(ModelDevice *d, long num_micro, bool update_bias, MoeStepStats *out) {
    Model *host = d->host;
    if (!host->moe_step) return false;
    model_moe_step_end(host, &d->grid->groups[GROUP_DP], num_micro, update_bias, out);
    if (update_bias) cuda_model_upload_expert_biases(gpu(d), host->params);
    return true;
}
static void device_fp8_step_end(ModelDevice *d) {} /* precision: fp8 is refused on cuda (model_device_cuda_check) */

static int device_comms_check(ModelDevice *d, char *err, size_t errlen) {
    CudaDevice *c = impl(d);
    if (c->embed_comm.size > 1 && device_comm_check(&c->embed_comm, err, errlen) != 0) return -1;
    return cuda_model_comms_failed(c->model, err, errlen);
}

static double device_peak_tflops(ModelDevice *d) {
    /* Dense bf16 tensor-core peaks from NVIDIA's datasheets, most specific name first. */
    static const struct {
        const char *name;
        double tflops;
    } peaks[] = {{"H100 PCIe", 756.0}, {"H100 NVL", 835.0}, {"GH200", 989.4}, {"H100", 989.4}, {"H200", 989.4},
                 {"H800", 989.4},      {"B200", 2250.0},    {"B100", 1750.0}, {"A100", 312.0}, {"A800", 312.0},
                 {"L40S", 362.0},      {"L40", 181.0},      {"A10G", 70.0},   {"L4", 121.0}};
    const char *name = cuda_model_device_name(gpu(d));
    for (size_t i = 0; i < sizeof peaks / sizeof peaks[0]; i++)
        if (strstr(name, peaks[i].name)) return peaks[i].tflops;
    return 0.0;
}

static double device_peak_bytes(ModelDevice *d) { return (double)cuda_model_peak_bytes(gpu(d)); }

static bool device_pci_bus_id(ModelDevice *d, char *out, int len) {
    cuda_model_pci_bus_id(gpu(d), out, len);
    return true;
}

/* ---- as a pipeline stage ------------------------------------------------ */
/* Transfers go GPU to GPU with NCCL when each rank has its own GPU: a step's
 * sends and receives (the executor's paired groups,
 * src/dist/pipeline_transfers.h) recorded and posted as one NCCL group on the
 * compute stream (cuda_model_stage_send/_recv/_post). Where ranks share a GPU
 * (or MEGATRAIN_DEVICE_COMM=host) they are staged through the host: the
 * activations (bf16) or their gradients (fp32) copied out of the GPU, sent
 * with comm_send_copy (an MPI send that completes when matched), received and
 * copied in, at the price of two PCIe copies per transfer. */

static void *host_buffer; /* staging for one transfer (comm_send_copy copies it again) */
static size_t host_bytes;

static void *staging(size_t bytes) {
    if (bytes > host_bytes) {
        host_buffer = mt_realloc(host_buffer, bytes);
        host_bytes = bytes;
    }
    return host_buffer;
}

/* Transfers go as 4-byte words when they can (MPI counts are ints: bf16 activations of the hidden size always can). */
static CommType word_type(size_t bytes) { return bytes % 4 == 0 ? COMM_FLOAT : COMM_BYTE; }
static size_t words(size_t bytes) { return bytes % 4 == 0 ? bytes / 4 : bytes; }

static void *stage_clone(void *base) {
    char err[512];
    CudaModel *m = cuda_model_clone_activations(base, err, sizeof err);
    if (!m) mt_die(MT_EXIT_FAILURE, "pipeline: %s", err);
    return m;
}

static void stage_free_clone(void *slot) { cuda_model_free(slot); }

/* positions: data.pack, refused by model_device_cuda_check (device_set_positions) */
static void stage_forward_start(void *slot, const int32_t *inputs, const int32_t *positions, int B, int T) {
    if (positions) mt_die(MT_EXIT_FAILURE, "data.pack: packed rows are not implemented on GPUs yet");
    cuda_model_forward_start(slot, inputs, B, T);
}

static void stage_forward_layers(void *slot, int chunk) { cuda_model_forward_layers(slot, chunk); }
static double stage_forward_head(void *slot, const int32_t *targets) { return cuda_model_forward_head(slot, targets); }
static void stage_backward_head(void *slot, float loss_scale) { cuda_model_backward_head(slot, loss_scale); }

static void stage_backward_layers(void *slot, int chunk, float loss_scale, bool last) {
    cuda_model_set_loss_scale(slot, loss_scale); /* a stage without the head: its MoE auxiliary losses' scale */
    cuda_model_backward_layers(slot, chunk, last);
}

static void stage_backward_finish(void *slot, bool last) { cuda_model_backward_finish(slot, last); }

static void stage_send(void *slot, int chunk, bool backward, const Comm *group, int dest, int tag, int B, int T) {
    if (cuda_model_stage_direct(slot)) { /* NCCL: recorded, posted with the group by stage_post_transfers */
        cuda_model_stage_send(slot, chunk, backward, dest);
        return;
    }
    const size_t bytes = cuda_model_stage_bytes(slot, backward);
    void *buf = staging(bytes);
    cuda_model_stage_to_host(slot, chunk, backward, buf);
    comm_send_copy(group, buf, words(bytes), word_type(bytes), dest, tag);
}

static void stage_recv(void *slot, int chunk, bool backward, const Comm *group, int source, int tag, int B, int T) {
    if (cuda_model_stage_direct(slot)) {
        cuda_model_stage_recv(slot, chunk, backward, source);
        return;
    }
    const size_t bytes = cuda_model_stage_bytes(slot, backward);
    void *buf = staging(bytes);
    comm_recv(group, buf, words(bytes), word_type(bytes), source, tag);
    cuda_model_stage_from_host(slot, chunk, backward, buf);
}

static void stage_post_transfers(void *base) { cuda_model_stage_post(base); }
static const char *stage_transport(void *base) {
    return cuda_model_stage_direct(base) ? "NCCL, GPU to GPU" : "MPI through the host";
}

static size_t stage_slot_bytes(void *base) { return cuda_model_activation_bytes(base); }

static const PipelineStageOps cuda_stage_ops = MODEL_DEVICE_STAGE_OPS;
static const ModelDeviceOps cuda_ops = MODEL_DEVICE_OPS("cuda", &cuda_stage_ops);

ModelDevice *model_device_cuda_create(const ModelDeviceSetup *s, char *err, size_t errlen) {
    ModelDevice *d = model_device_new(s, &cuda_ops, false);
    CudaDevice *c = mt_calloc(1, sizeof *c);
    d->impl = c;
    /* One GPU per process: the rank's index on its machine picks it. */
    const int count = cuda_device_count();
    const int device = count > 0 ? launch_local_rank() % count : 0;
    const CudaModelOptions options = {.state_dtype = s->state_dtype, .recompute = s->recompute,
                                      .zero1 = d->zero1_on ? &d->zero1 : NULL};
    c->model = cuda_model_create(d->host, device, s->micro_batch_size, s->seq_len, &options, err, errlen);
    if (!c->model) {
        model_device_free(d);
        return NULL;
    }
    d->stage_base = c->model;
    /* global_aux_loss sums the routing counts over dp in every MoE forward: every dp rank runs as many */
    for (int l = 0; l < s->cfg->num_layers; l++) d->eval_lockstep = d->eval_lockstep || model_layer_is_moe(s->cfg, l);
    mt_log("device: %s, %.2f GiB allocated for weights, gradients, AdamW states%s and activations",
           cuda_model_device_name(c->model), (double)cuda_model_bytes(c->model) / 1073741824.0,
           d->zero1_on ? " (this rank's shard)" : "");
    if (create_comms(d, s, err, errlen) != 0) {
        model_device_free(d);
        return NULL;
    }
    return d;
}
