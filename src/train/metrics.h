/* metrics.h: the per-step log line on stdout, run.dir/metrics.jsonl and
 * the TensorBoard scalars (run.dir/tensorboard, when logging.tensorboard). */
#ifndef MT_TRAIN_METRICS_H
#define MT_TRAIN_METRICS_H

#include <stdbool.h>
#include <stdio.h>

#include "../obs/tb_writer.h"

typedef struct StepMetrics {
    long step;               /* 1-based: the step just completed */
    long total_steps;
    double loss;
    double lr;
    long global_batch_size;
    double grad_norm;
    double tokens_per_s;
    double consumed_tokens;
    double elapsed_s;
    double eval_loss;        /* NAN when not an eval step */
    double tflops;           /* model TFLOP/s of this device (Megatron's count); NAN when not shown */
    double peak_mem_gib;     /* peak device memory so far; NAN on the CPU */
} StepMetrics;

typedef struct MetricsWriter {
    FILE *jsonl;
    TbWriter tb;             /* not open when logging.tensorboard is false */
} MetricsWriter;

/* Open (append) run_dir/metrics.jsonl and, when tensorboard, a new event
 * file in run_dir/tensorboard. Returns 0 or -1 with err. */
int metrics_open(MetricsWriter *w, const char *run_dir, bool tensorboard, char *err, size_t errlen);
/* One JSON line and the step's TensorBoard scalars, both flushed. */
void metrics_write(MetricsWriter *w, const StepMetrics *m);
void metrics_print(const StepMetrics *m);                     /* the stdout line */
void metrics_close(MetricsWriter *w);

#endif
