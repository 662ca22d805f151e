/* model_device.c: choosing and creating a ModelDevice (model_device.h), and
 * what every implementation shares: the host Model, the AdamW state and the
 * distributed optimizer's split. In a build without CUDA the cuda device
 * says how to get one. */
#include "model_device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend/backend.h"
#include "../core/error.h"

/* The devices, in the order the error message lists them. */
static const struct {
    const char *name;
    ModelDevice *(*create)(const ModelDeviceSetup *s, char *err, size_t errlen);
    int (*check)(const ModelDeviceSetup *s, char *err, size_t errlen); /* NULL: the device runs every recipe */
} devices[] = {
    {"cpu", model_device_cpu_create, NULL},
    {"cuda", model_device_cuda_create, model_device_cuda_check},
};
enum { NUM_DEVICES = sizeof devices / sizeof devices[0] };

static int find_device(const char *name) {
    for (int i = 0; i < NUM_DEVICES; i++)
        if (strcmp(devices[i].name, name) == 0) return i;
    return -1;
}

bool model_device_exists(const char *name) { return find_device(name) >= 0; }

int model_device_check(const ModelDeviceSetup *s, char *err, size_t errlen) {
    const int i = find_device(s->device);
    if (i < 0) {
        mt_set_error(err, errlen, "run.device: '%s' is not a device; expected %s or %s", s->device, devices[0].name,
                     devices[1].name);
        return MT_EXIT_USAGE;
    }
    return devices[i].check ? devices[i].check(s, err, errlen) : 0;
}

ModelDevice *model_device_create(const ModelDeviceSetup *s, char *err, size_t errlen) {
    if (model_device_check(s, err, errlen) != 0) return NULL;
    return devices[find_device(s->device)].create(s, err, errlen);
}

ModelDevice *model_device_new(const ModelDeviceSetup *s, const ModelDeviceOps *ops, bool host_computes) {
    ModelDevice *d = mt_calloc(1, sizeof *d);
    d->ops = ops;
    d->grid = s->grid;
    d->host_current = host_computes;
    /* a device that computes elsewhere keeps only the weights here: no activations */
    const int B = host_computes ? s->micro_batch_size : 0, T = host_computes ? s->seq_len : 0;
    Model *m = model_create_recompute(s->cfg, s->part, &cpu_backend, B, T, host_computes ? s->recompute : RECOMPUTE_NONE);
    d->host = m;
    if (host_computes && s->precision == DTYPE_FP8) model_set_fp8(m, s->fp8);
    /* ZeRO-1 over dp: each rank keeps the moments of its part of every bucket only */
    const Comm *dp = &s->grid->groups[GROUP_DP];
    d->zero1_on = s->distributed_optimizer && dp->size > 1;
    /* over the gradients: the trainable parameters (LoRA: the adapters; the frozen base has no state) */
    const size_t trained = (size_t)m->num_grad_floats;
    if (d->zero1_on && s->part->ep > 1) { /* the experts (the end of the flat array) shard over edp */
        size_t dense = trained;
        for (int i = 0; i < m->num_params; i++) {
            const ParamInfo *p = &m->param_info[i];
            if (p->expert && !p->frozen && (size_t)(model_grad_of(m, p) - m->grads) < dense)
                dense = (size_t)(model_grad_of(m, p) - m->grads);
        }
        zero1_init_split(&d->zero1, dp, dense, &s->grid->groups[GROUP_EDP], trained, 1.0f / (float)s->part->ep);
    } else if (d->zero1_on) {
        zero1_init(&d->zero1, dp, trained);
    }
    adamw_init_dtype(&d->optimizer, d->zero1_on ? (long)d->zero1.owned : (long)trained, s->state_dtype);
    return d;
}

void model_device_free(ModelDevice *d) {
    if (!d) return;
    d->ops->destroy(d);
    model_free(d->host);
    adamw_free(&d->optimizer);
    if (d->zero1_on) zero1_free(&d->zero1);
    free(d);
}

#ifndef MT_CUDA
int model_device_cuda_check(const ModelDeviceSetup *s, char *err, size_t errlen) {
    /* what the recipe asks of a GPU that no build runs yet comes first: a CUDA build would refuse it too */
    const int refused = model_device_cuda_limits(s, err, errlen);
    if (refused > 0) {
        const size_t used = err ? strlen(err) : errlen;
        if (used < errlen)
            snprintf(err + used, errlen - used, "%s(and this build is CPU only: make CUDA=1 builds the GPU backend)",
                     refused > 1 ? "\n  " : " ");
        return MT_EXIT_USAGE;
    }
    mt_set_error(err, errlen,
                 "run.device: 'cuda' needs a build with the CUDA backend (make CUDA=1, then build/megatrain); "
                 "this one is CPU only");
    return MT_EXIT_FAILURE;
}

ModelDevice *model_device_cuda_create(const ModelDeviceSetup *s, char *err, size_t errlen) {
    model_device_cuda_check(s, err, errlen);
    return NULL;
}
#endif
