/* train_device.c: the run's GPU model (see train_device.h); the CUDA half is
 * compiled only with MT_CUDA (make CUDA=1). */
#include "train_device.h"

#include <stdio.h>
#include <stdlib.h>

#include "../core/error.h"

#ifdef MT_CUDA
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "../backend/cuda/cuda_device.h"
#include "../model/cuda/cuda_model.h"
#include "../dist/comm.h"
#include "../dist/device_comm.h"
#include "../dist/dp_sync.h"
#include "../dist/launch_env.h"
#include "../obs/energy.h"
#include "pipeline_cuda.h"

/* The device communicators of this process's groups. */
static DeviceComm dp_comm, tp_comm, cp_comm, embed_comm;

bool train_device_built(void) { return true; }

/* Test hook: MEGATRAIN_NCCL_SINGLE_RANK=1 averages gradients through NCCL
 * even on one rank (a group of one), so the overlapped path runs on a
 * machine with a single GPU. */
static bool dp_sync_wanted(const TrainContext *ctx) {
    const char *single = getenv("MEGATRAIN_NCCL_SINGLE_RANK");
    return ctx->layout.dp_size > 1 || (single && strcmp(single, "1") == 0);
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

/* The most micro-batches a step of the batch schedule has on this rank. */
static int max_micro_batches(const TrainContext *ctx) {
    const TrainConfig *train = &ctx->recipe->train;
    long most = 1;
    for (int i = 0; i < train->num_batch_stages; i++) {
        const long m = train->batch_stages[i].global_batch_size / ((long)train->micro_batch_size * ctx->layout.dp_size);
        if (m > most) most = m;
    }
    return (int)most;
}

int train_device_attach(TrainContext *ctx, char *err, size_t errlen) {
    const TrainConfig *train = &ctx->recipe->train;
    /* One GPU per process: the rank's index on its machine picks it. */
    const int count = cuda_device_count();
    const int device = count > 0 ? launch_local_rank() % count : 0;
    ctx->cuda = cuda_model_create(ctx->model, device, train->micro_batch_size, train->seq_len / ctx->layout.cp, err,
                                  errlen);
    if (!ctx->cuda) return -1;
    cuda_model_upload(ctx->cuda, NULL, ctx->optimizer.m, ctx->optimizer.v);
    mt_log("device: %s, %.2f GiB allocated for weights, gradients, AdamW states and activations",
           cuda_model_device_name(ctx->cuda), (double)cuda_model_bytes(ctx->cuda) / 1073741824.0);
    bool staged = false;
    const char *why = "";
    if (staged_wanted(ctx->cuda, &staged, &why, err, errlen) != 0) return -1;
    const bool tp = ctx->layout.tp > 1, cp = ctx->layout.cp > 1, dp = dp_sync_wanted(ctx);
    if ((tp || cp || dp) && staged)
        mt_log("device collectives: staged through the host over MPI (%s): slow, for checking layouts on fewer GPUs "
               "than ranks", why);
    /* every rank creates its tp communicator first, then cp, then dp: the same order everywhere */
    if (tp) {
        if (device_comm_create(&tp_comm, &ctx->grid.groups[GROUP_TP], staged, err, errlen) != 0) return -1;
        cuda_model_set_tp_comm(ctx->cuda, &tp_comm);
        mt_log("tensor parallel: %d GPUs%s, activations summed with %s", tp_comm.size,
               ctx->part.sequence_parallel ? " with sequence parallel" : "", staged ? "MPI" : "NCCL");
    }
    if (cp) {
        if (device_comm_create(&cp_comm, &ctx->grid.groups[GROUP_CP], staged, err, errlen) != 0) return -1;
        cuda_model_set_cp_comm(ctx->cuda, &cp_comm);
        mt_log("context parallel: %d GPUs, keys and values all-gathered with %s", cp_comm.size,
               staged ? "MPI" : "NCCL");
    }
    if (ctx->layout.pp > 1 && ctx->grid.in_embedding && ctx->model->cfg.tie_word_embeddings) {
        /* the tied embedding's gradient: the first stage's and the last stage's copy summed */
        if (device_comm_create(&embed_comm, &ctx->grid.groups[GROUP_EMBEDDING], staged, err, errlen) != 0) return -1;
    }
    if (dp) {
        if (device_comm_create(&dp_comm, &ctx->grid.groups[GROUP_DP], staged, err, errlen) != 0) return -1;
        cuda_model_set_grad_sync(ctx->cuda, &dp_comm);
        mt_log("data parallel: %d GPU(s), gradients averaged with %s layer by layer during the backward",
               dp_comm.size, staged ? "MPI" : "NCCL");
    }
    /* last: the pipeline's activation sets copy the model's communicators and its grad sync */
    if (ctx->layout.pp > 1) { /* the stages run the CUDA model; transfers go through the host */
        pipeline_free(&ctx->pipe);
        pipeline_init(&ctx->pipe, &ctx->grid.groups[GROUP_PP], ctx->layout.vpp, ctx->cuda, &pipeline_cuda_ops);
        /* the activations of every micro-batch a stage keeps in flight: allocated now, not mid-step */
        const int sets = pipeline_reserve(&ctx->pipe, max_micro_batches(ctx));
        mt_log("pipeline parallel: %d stages on GPUs, activations sent through the host (MPI); stage 0 keeps %d "
               "activation sets of %.2f GiB", ctx->layout.pp, sets, (double)cuda_model_activation_bytes(ctx->cuda) /
               1073741824.0);
    }
    return 0;
}

void train_device_detach(TrainContext *ctx) {
    if (ctx->layout.pp > 1) pipeline_free(&ctx->pipe); /* the activation clones before their base */
    cuda_model_free(ctx->cuda);
    ctx->cuda = NULL;
    device_comm_destroy(&dp_comm);
    device_comm_destroy(&tp_comm);
    device_comm_destroy(&cp_comm);
    device_comm_destroy(&embed_comm);
}

void train_device_sync_grads(TrainContext *ctx) {
    cuda_model_wait_grad_sync(ctx->cuda); /* a pipeline stage's dp averages, left in flight by its last backward */
    if (embed_comm.size > 1) {
        const ParamInfo *embed = model_embed_param(ctx->model);
        cuda_model_sum_grads(ctx->cuda, &embed_comm, (long)embed->offset, embed->numel);
        char err[512]; /* a peer that dies ends this rank too, as in cuda_model_synchronize */
        while (!cuda_model_idle(ctx->cuda))
            if (device_comm_check(&embed_comm, err, sizeof err) != 0 ||
                cuda_model_comms_failed(ctx->cuda, err, sizeof err) != 0)
                mt_die(MT_EXIT_FAILURE, "%s", err);
    }
    cuda_model_synchronize(ctx->cuda);
}

void train_device_backward(TrainContext *ctx, float loss_scale, bool last_micro_batch) {
    cuda_model_backward(ctx->cuda, loss_scale, last_micro_batch);
    cuda_model_synchronize(ctx->cuda); /* so the step timers see where the time goes */
}

double train_device_forward(TrainContext *ctx) {
    const TrainConfig *train = &ctx->recipe->train;
    return cuda_model_forward(ctx->cuda, ctx->inputs, ctx->targets, train->micro_batch_size,
                              train->seq_len / ctx->layout.cp);
}

void train_device_zero_grad(TrainContext *ctx) { cuda_model_zero_grad(ctx->cuda); }

double train_device_grad_norm(TrainContext *ctx) {
    const double sumsq = cuda_model_grad_sumsq(ctx->cuda); /* this stage's, summed over tp */
    return sqrt(dp_sum_double(&ctx->grid.groups[GROUP_PP], sumsq));
}

void train_device_adamw(TrainContext *ctx, double lr, double grad_scale) {
    const OptimizerConfig *opt = &ctx->recipe->optimizer;
    ctx->optimizer.step++;
    CudaAdamWStep step = {.lr = lr,
                          .beta1 = opt->beta1,
                          .beta2 = opt->beta2,
                          .eps = opt->eps,
                          .weight_decay = opt->weight_decay,
                          .grad_scale = grad_scale,
                          .step = ctx->optimizer.step};
    cuda_model_adamw(ctx->cuda, &step);
    cuda_model_synchronize(ctx->cuda);
}

void train_device_sync_to_host(TrainContext *ctx) {
    cuda_model_download(ctx->cuda, ctx->model->params, ctx->optimizer.m, ctx->optimizer.v);
}

void train_device_sync_grads_to_host(TrainContext *ctx) { cuda_model_download_grads(ctx->cuda, ctx->model->grads); }

double train_device_peak_bytes(TrainContext *ctx) { return (double)cuda_model_peak_bytes(ctx->cuda); }

double train_device_peak_tflops(TrainContext *ctx) {
    /* Dense bf16 tensor-core peaks from NVIDIA's datasheets, most specific name first. */
    static const struct {
        const char *name;
        double tflops;
    } peaks[] = {{"H100 PCIe", 756.0}, {"H100 NVL", 835.0}, {"GH200", 989.4}, {"H100", 989.4}, {"H200", 989.4},
                 {"H800", 989.4},      {"B200", 2250.0},    {"B100", 1750.0}, {"A100", 312.0}, {"A800", 312.0},
                 {"L40S", 362.0},      {"L40", 181.0},      {"A10G", 70.0},   {"L4", 121.0}};
    const char *name = cuda_model_device_name(ctx->cuda);
    for (size_t i = 0; i < sizeof peaks / sizeof peaks[0]; i++)
        if (strstr(name, peaks[i].name)) return peaks[i].tflops;
    return 0.0;
}

bool train_device_energy_open(TrainContext *ctx, char *why, int why_len) {
    char bus[64];
    cuda_model_pci_bus_id(ctx->cuda, bus, sizeof bus);
    return energy_meter_open(&ctx->energy, bus, why, why_len);
}

#else

bool train_device_built(void) { return false; }

int train_device_attach(TrainContext *ctx, char *err, size_t errlen) {
    mt_set_error(err, errlen,
                 "run.device: 'cuda' needs a build with the CUDA backend (make CUDA=1, then build/megatrain); "
                 "this one is CPU only");
    return -1;
}

__attribute__((noreturn)) static void unreachable(const char *what) {
    mt_die(MT_EXIT_FAILURE, "%s: this build has no CUDA backend", what);
}

void train_device_detach(TrainContext *ctx) { ctx->cuda = NULL; }
void train_device_backward(TrainContext *ctx, float loss_scale, bool last_micro_batch) { unreachable(__func__); }
double train_device_forward(TrainContext *ctx) { unreachable(__func__); }
void train_device_zero_grad(TrainContext *ctx) { unreachable(__func__); }
double train_device_grad_norm(TrainContext *ctx) { unreachable(__func__); }
void train_device_adamw(TrainContext *ctx, double lr, double grad_scale) { unreachable(__func__); }
void train_device_sync_to_host(TrainContext *ctx) { unreachable(__func__); }
void train_device_sync_grads_to_host(TrainContext *ctx) { unreachable(__func__); }
void train_device_sync_grads(TrainContext *ctx) { unreachable(__func__); }
double train_device_peak_bytes(TrainContext *ctx) { return 0.0; }
double train_device_peak_tflops(TrainContext *ctx) { return 0.0; }
bool train_device_energy_open(TrainContext *ctx, char *why, int why_len) {
    snprintf(why, (size_t)why_len, "no CUDA in this build");
    return false;
}

#endif
