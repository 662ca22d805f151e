/* metrics.h: the per-step log line on stdout, run.dir/metrics.jsonl and
 * the TensorBoard scalars (run.dir/tensorboard, when logging.tensorboard). */
#ifndef MT_TRAIN_METRICS_H
#define MT_TRAIN_METRICS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "../obs/tb_writer.h"
#include "../obs/whole_append.h"

typedef struct StepMetrics {
    long step;               /* 1-based: the step just completed */
    long total_steps;
    double loss;
    double lr;
    double weight_decay;     /* with optimizer.weight_decay_style linear or cosine; NAN (not written) when constant */
    long global_batch_size;
    double grad_norm;
    double tokens_per_s;
    double consumed_tokens;
    int64_t consumed_samples; /* train samples consumed by all data-parallel ranks (Megatron's consumed samples) */
    double elapsed_s;        /* since this process's training loop began (a resumed run's session starts again at 0) */
    double time;             /* when the line was made: Unix seconds (wall clock) */
    double eta_s;            /* the rest of the schedule's tokens at this interval's tok/s; NAN at the last step */
    double eval_loss;        /* NAN when not an eval step */
    double test_loss;        /* data.split's test share after the last step; NAN otherwise */
    double tflops;           /* model TFLOP/s per device (Megatron's count: 6N + attention) */
    double mfu;              /* tflops / the device's peak, in percent; NAN when the peak is unknown */
    double peak_mem_gib;     /* peak used GPU memory so far (all processes on it); the process's peak anonymous RSS on the CPU */
    double power_w;          /* mean GPU power over the interval (NVML); NAN when not measured */
    double tokens_per_joule; /* tokens per joule of GPU energy over the interval; NAN when not measured */
    double moe_aux_loss;     /* MoE: the step's load-balancing + z losses (with coefficients) per micro-batch; NAN for dense */
    double moe_lb_loss;      /* MoE: the load-balancing loss alone, without its coefficient, mean over the MoE layers
                              * (Megatron's load_balancing_loss); NAN without one */
    double moe_z_loss;       /* MoE: the router z-loss likewise; NAN without one */
    double moe_imbalance;    /* MoE: max / mean tokens per expert, averaged over the MoE layers; NAN for dense */
    double moe_drop_rate;    /* MoE: fraction of token-expert assignments dropped by the capacity; NAN for dense */
    double moe_spill_rate;   /* MoE on GPUs under ep: fraction of the layers' forwards whose expert side spilled past
                              * the arena's room into stream-ordered allocations (docs/moe.md); NAN where none can */
} StepMetrics;

typedef struct MetricsWriter {
    FILE *jsonl;             /* written through lines (write(2) on its descriptor, never stdio's buffer) */
    WholeAppender lines;     /* each line whole or not at all, written again after a full disk */
    TbWriter tb;             /* not open when logging.tensorboard is false */
} MetricsWriter;

/* Open (append) run_dir/metrics.jsonl and, when tensorboard, a new event
 * file in run_dir/tensorboard. Returns 0 or -1 with err. */
int metrics_open(MetricsWriter *w, const char *run_dir, bool tensorboard, long first_step, char *err, size_t errlen);
/* One JSON line and the step's TensorBoard scalars, both flushed. A line that
 * cannot be written whole (a full disk) is cut off the file again, so that
 * metrics.jsonl never ends inside a line, and the next step's line tries
 * again (src/obs/whole_append.h; the TensorBoard writer does the same). */
void metrics_write(MetricsWriter *w, const StepMetrics *m);
/* How many logged steps' lines metrics.jsonl lacks (writes that failed); 0 when not open. */
long metrics_lines_lost(const MetricsWriter *w);
/* Likewise the logged steps whose TensorBoard events the event file lacks; 0 when it is not open. */
long metrics_events_lost(const MetricsWriter *w);
void metrics_print(const StepMetrics *m);                     /* the stdout line */

/* Where the time of the steps went, summed since the last report. */
typedef struct StepTimers {
    double data, forward, backward, comm, optimizer, checkpoint; /* seconds */
    double pipeline;         /* pp > 1: the schedule's forwards, backwards, transfers, waits and data, interleaved */
    long steps;
    long first_step;         /* the first step in these sums */
} StepTimers;

/* One line "timers (ms per step, steps A-B, rank 0): data ... | forward ... | ..." on stdout; with a pipeline
 * "pipeline ..." in place of data, forward and backward, which interleave there. */
void metrics_print_timers(const StepTimers *t, long last_step);
void metrics_close(MetricsWriter *w);

#endif
