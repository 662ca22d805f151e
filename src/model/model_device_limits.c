/* model_device_limits.c: what run.device: cuda does not run yet, read off
 * the recipe's settings alone (host code, in every build): so that `run`,
 * `eval` and `plan` name every such setting at once, before any GPU work,
 * whether or not this build has the CUDA backend, instead of one refusal a
 * run. Each limit is one row of the table below: the key, whether the
 * recipe meets it, and what to set instead. The CUDA model's own guards
 * (src/model/cuda/cuda_model.c) ask the same predicates. */
#include <stdio.h>
#include <string.h>

#include "../core/error.h"
#include "model_device.h"

bool model_cuda_head_dim_ok(int head_dim) {
    /* the attention kernels' tiles (kernels/attention.cu) */
    return head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128;
}

const char *model_cuda_moe_limit(const ModelConfig *cfg, int etp) {
    const MoeConfig *mc = &cfg->moe;
    if (etp < 1) etp = 1;
    if (mc->num_experts > 1024) return "routes among at most 1024 experts";
    if (cfg->hidden_size % 8 || (mc->moe_intermediate_size / etp) % 8 || (mc->shared_expert_intermediate_size / etp) % 8)
        return "needs hidden and (per rank) expert intermediate sizes that are multiples of 8";
    return NULL;
}

/* One limit: writes what is wrong and what to do into msg and returns true when the setup hits it. */
typedef bool (*LimitCheck)(const ModelDeviceSetup *s, char *msg, size_t len);

static bool fp8(const ModelDeviceSetup *s, char *msg, size_t len) {
    if (s->precision != DTYPE_FP8) return false;
    snprintf(msg, len, "precision: fp8 runs as the exact CPU emulation only for now (run.device: cpu); the GPU's FP8 "
             "products are not written yet: set precision: bf16 for run.device: cuda");
    return true;
}

static bool precision(const ModelDeviceSetup *s, char *msg, size_t len) {
    if (s->precision == DTYPE_BF16 || s->precision == DTYPE_FP8) return false;
    snprintf(msg, len, "precision: '%s' is not available with run.device: cuda (the GPU computes in bf16 with fp32 "
             "master weights, gradients and AdamW states); set precision: bf16", dtype_name(s->precision));
    return true;
}

static bool lora(const ModelDeviceSetup *s, char *msg, size_t len) {
    if (s->cfg->peft.type == PEFT_NONE) return false;
    snprintf(msg, len, "peft: LoRA is not implemented on GPUs yet (the CPU trains it: run.device: cpu; the CUDA model "
             "has no adapters and no frozen weights); remove the peft: section for full training on the GPU");
    return true;
}

static bool packing(const ModelDeviceSetup *s, char *msg, size_t len) {
    if (!s->packed) return false;
    snprintf(msg, len, "data.pack: packed rows (attention restricted to each sample) are not implemented on GPUs yet "
             "(the CPU runs them); set data.pack: false for run.device: cuda");
    return true;
}

static bool per_token(const ModelDeviceSetup *s, char *msg, size_t len) {
    if (s->loss != LOSS_PER_TOKEN) return false;
    snprintf(msg, len, "train.loss: per_token is not implemented on GPUs yet (the CPU runs it); set train.loss: "
             "per_micro_batch for run.device: cuda");
    return true;
}

static bool head_dim(const ModelDeviceSetup *s, char *msg, size_t len) {
    if (model_cuda_head_dim_ok(s->cfg->head_dim)) return false;
    snprintf(msg, len, "model.head_dim: %d is not supported on GPUs (the attention kernels take 16, 32, 64 or 128)",
             s->cfg->head_dim);
    return true;
}

static bool empty_stage(const ModelDeviceSetup *s, char *msg, size_t len) {
    const ParallelConfig *par = s->parallel;
    const int stages = par->pp > 1 ? par->pp * par->vpp : 1;
    for (int g = 0; g < stages; g++) {
        int first, count;
        parallel_stage_layers(par, s->cfg->num_layers, g, &first, &count);
        if (count == 0) {
            snprintf(msg, len, "parallel.pp_layers: virtual stage %d has no layers: on GPUs every pipeline stage "
                     "(chunk) holds at least one (a stage of none runs on the CPU only)", g);
            return true;
        }
    }
    return false;
}

static bool moe(const ModelDeviceSetup *s, char *msg, size_t len) {
    if (!model_family_is_moe(s->cfg->family)) return false;
    const int etp = s->parallel->etp > 1 ? s->parallel->etp : 1;
    const char *why = model_cuda_moe_limit(s->cfg, etp);
    if (!why) return false;
    snprintf(msg, len, "model.moe: the CUDA model's mixture of experts %s (%d experts, hidden %d, expert intermediate "
             "%d, shared %d, over etp %d)", why, s->cfg->moe.num_experts, s->cfg->hidden_size,
             s->cfg->moe.moe_intermediate_size, s->cfg->moe.shared_expert_intermediate_size, etp);
    return true;
}

static const LimitCheck limits[] = {fp8, precision, lora, packing, per_token, head_dim, empty_stage, moe};
enum { NUM_LIMITS = sizeof limits / sizeof limits[0] };

int model_device_cuda_limits(const ModelDeviceSetup *s, char *err, size_t errlen) {
    char msg[NUM_LIMITS][512];
    int hit = 0;
    for (int i = 0; i < NUM_LIMITS; i++)
        if (limits[i](s, msg[hit], sizeof msg[hit])) hit++;
    if (hit == 1) mt_set_error(err, errlen, "%s", msg[0]);
    if (hit > 1) {
        size_t used = (size_t)snprintf(err, errlen, "run.device: cuda does not run %d of this recipe's settings yet "
                                       "(the CPU runs them all):", hit);
        for (int i = 0; i < hit && used < errlen; i++)
            used += (size_t)snprintf(err + used, errlen - used, "\n  %s", msg[i]);
    }
    return hit;
}
