/* metrics.h: the per-step log line on stdout and run.dir/metrics.jsonl. */
#ifndef MT_TRAIN_METRICS_H
#define MT_TRAIN_METRICS_H

#include <stdio.h>

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
} StepMetrics;

typedef struct MetricsWriter {
    FILE *jsonl;
} MetricsWriter;

/* Open (append) run_dir/metrics.jsonl. Returns 0 or -1 with err. */
int metrics_open(MetricsWriter *w, const char *run_dir, char *err, size_t errlen);
void metrics_write(MetricsWriter *w, const StepMetrics *m);  /* one JSON line, flushed */
void metrics_print(const StepMetrics *m);                     /* the stdout line */
void metrics_close(MetricsWriter *w);

#endif
