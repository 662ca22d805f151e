/* model_device_cpu.c: the CPU as a ModelDevice (model_device.h). The host
 * Model computes (src/model/model_forward.c, model_backward.c, in fp32 on
 * the CPU op table); its gradients are reduced over MPI (grad_reduce.c);
 * AdamW runs on the host (optimizer.c), on this rank's share only under the
 * distributed optimizer (ZeRO-1: reduce-scatter, update, all-gather). As a
 * pipeline stage: clones for the activation sets and buffered sends of fp32
 * activations and gradients over MPI. */
#include <stdio.h>
#include <sys/resource.h>

#include "../dist/grid.h"
#include "grad_reduce.h"
#include "model_device.h"

static Model *host(ModelDevice *d) { return d->host; }

static void device_destroy(ModelDevice *d) {}
/* the host model is the one that computes: nothing to copy */
static void device_from_host(ModelDevice *d) {}
static void device_to_host(ModelDevice *d) {}
static void device_grads_to_host(ModelDevice *d) {}
static void device_zero_grad(ModelDevice *d) { model_zero_grad(host(d)); }

static double device_forward(ModelDevice *d, const int32_t *inputs, const int32_t *targets, int B, int T) {
    return (double)model_forward(host(d), inputs, targets, B, T);
}

static void device_backward(ModelDevice *d, float loss_scale, bool last) { model_backward(host(d), loss_scale); }
static void device_set_loss_tokens(ModelDevice *d, double tokens) { model_set_loss_tokens(host(d), tokens); }
static void device_set_positions(ModelDevice *d, const int32_t *positions, int B, int T) {
    model_set_packed_positions(host(d), positions, B, T);
}

static const Zero1 *zero1_of(const ModelDevice *d) { return d->zero1_on ? &d->zero1 : NULL; }

static void device_reduce_grads(ModelDevice *d) { model_reduce_grads(host(d), d->grid, zero1_of(d)); }
static double device_grad_sumsq(ModelDevice *d) { return model_grad_sumsq(host(d), d->grid, zero1_of(d)); }

static void device_optimizer_step(ModelDevice *d, const OptimizerConfig *cfg, double lr, double grad_scale) {
    if (d->zero1_on) { /* update this rank's parts, then every rank gets every part */
        adamw_step_shard(&d->optimizer, host(d), cfg, lr, (float)grad_scale, &d->zero1);
        zero1_all_gather(&d->zero1, host(d)->params + host(d)->trainable_offset); /* the trained region */
    } else {
        adamw_step(&d->optimizer, host(d), cfg, lr, (float)grad_scale);
    }
}

static void device_step_begin(ModelDevice *d) {
    model_moe_step_begin(host(d));
    model_fp8_step_begin(host(d));
}

static bool device_moe_step_end(ModelDevice *d, long num_micro, bool update_bias, MoeStepStats *out) {
    if (!host(d)->moe_step) return false;
    model_moe_step_end(host(d), &d->grid->groups[GROUP_DP], num_micro, update_bias, out);
    return true;
}

static void device_fp8_step_end(ModelDevice *d) { model_fp8_step_end(host(d), &d->grid->groups[GROUP_DP]); }

static int device_comms_check(ModelDevice *d, char *err, size_t errlen) { return 0; } /* MPI ends the job itself */
static double device_peak_tflops(ModelDevice *d) { return 0.0; }                      /* logging.peak_tflops says */

/* The process's peak anonymous resident memory, sampled at each call (a step's end): what it allocated. The peak
 * RSS (ru_maxrss) counted the pages of the mapped data files too, which the page cache shares between the ranks and
 * which grew step after step as the samples touched them, like a leak. Where /proc is missing, the peak RSS. */
static double device_peak_bytes(ModelDevice *d) {
    static double peak = 0.0;
    FILE *f = fopen("/proc/self/status", "r");
    double anon = -1.0;
    if (f) {
        char line[256];
        long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "RssAnon: %ld kB", &kb) == 1) anon = (double)kb * 1024.0;
        fclose(f);
    }
    if (anon < 0) {
        struct rusage usage;
        return getrusage(RUSAGE_SELF, &usage) == 0 ? (double)usage.ru_maxrss * 1024.0 : 0.0;
    }
    if (anon > peak) peak = anon;
    return peak;
}

static bool device_pci_bus_id(ModelDevice *d, char *out, int len) { return false; }

/* ---- as a pipeline stage ------------------------------------------------ */

static void *stage_clone(void *base) { return model_clone_activations(base); }
static void stage_free_clone(void *slot) { model_free(slot); }

static void stage_forward_start(void *slot, const int32_t *inputs, const int32_t *positions, int B, int T) {
    model_set_packed_positions(slot, positions, B, T);
    model_forward_start(slot, inputs, B, T);
}

static void stage_forward_layers(void *slot, int chunk) { model_forward_layers(slot, chunk); }
static double stage_forward_head(void *slot, const int32_t *targets) { return model_forward_head(slot, targets); }
static void stage_backward_head(void *slot, float loss_scale) { model_backward_head(slot, loss_scale); }

static void stage_backward_layers(void *slot, int chunk, float loss_scale, bool last) {
    model_set_backward_scale(slot, loss_scale);
    model_backward_layers(slot, chunk);
}

static void stage_backward_finish(void *slot, bool last) { model_backward_finish(slot); }

static void stage_send(void *slot, int chunk, bool backward, const Comm *group, int dest, int tag, int B, int T) {
    Model *m = slot;
    comm_send_copy(group, backward ? model_stage_grad(m) : model_stage_output(m, chunk),
                   (size_t)model_stage_floats(m, B, T), COMM_FLOAT, dest, tag);
}

static void stage_recv(void *slot, int chunk, bool backward, const Comm *group, int source, int tag, int B, int T) {
    Model *m = slot;
    comm_recv(group, backward ? model_stage_grad(m) : model_stage_input(m, chunk), (size_t)model_stage_floats(m, B, T),
              COMM_FLOAT, source, tag);
}

/* MPI: each send and receive was posted at once */
static void stage_post_transfers(void *base) { (void)base; }
static const char *stage_transport(void *base) {
    (void)base;
    return "MPI";
}

/* a clone's own buffers: the recompute working set is the base's, shared */
static size_t stage_slot_bytes(void *base) { return model_activation_bytes(base).per_set; }

static const PipelineStageOps cpu_stage_ops = MODEL_DEVICE_STAGE_OPS;
static const ModelDeviceOps cpu_ops = MODEL_DEVICE_OPS("cpu", &cpu_stage_ops);

ModelDevice *model_device_cpu_create(const ModelDeviceSetup *s, char *err, size_t errlen) {
    ModelDevice *d = model_device_new(s, &cpu_ops, true);
    d->stage_base = d->host;
    /* a MoE forward has collectives over dp (expert parallel's token dispatch, the load counts): every dp rank
     * runs the same number of them */
    for (int l = 0; l < s->cfg->num_layers; l++) d->eval_lockstep = d->eval_lockstep || model_layer_is_moe(s->cfg, l);
    return d;
}
