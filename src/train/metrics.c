/* metrics.c: the per-step log line on stdout and one JSON object per logged
 * step in run.dir/metrics.jsonl.
 *
 * stdout:  step   12/200 | loss 3.4172 | lr 2.400e-03 | gbs 8 | grad_norm 1.234 |
 *          tok/s 12345 | tokens 24.6K | elapsed 3.2s | eta 1m05s [| eval_loss 3.2100]
 * jsonl:   {"step":12,"loss":...,"lr":...,"global_batch_size":8,"grad_norm":...,
 *           "tokens_per_s":...,"consumed_tokens":...,"consumed_samples":...,"elapsed_s":...,
 *           "time":1767225600.123[,"eval_loss":...][,"weight_decay":...]}
 * (weight_decay only where it moves: optimizer.weight_decay_style linear or cosine)
 * Doubles in JSON are written with %.9g; NaN and infinities become null.
 * TensorBoard: train/loss, train/lr, [train/weight_decay,] train/grad_norm, train/global_batch_size,
 * train/tokens_per_s, eval/loss (eval steps) and test/loss (after the last step) as float32 scalars. */
#include "metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../config/recipe.h"
#include "../core/error.h"
#include "../core/fs.h"

int metrics_open(MetricsWriter *w, const char *run_dir, bool tensorboard, long first_step, char *err, size_t errlen) {
    char path[MT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    w->jsonl = mt_fopen_output(path, true, err, errlen);
    if (!w->jsonl) return -1;
    w->lines = whole_appender(fileno(w->jsonl), "metrics.jsonl", "lines");
    if (tensorboard && tb_open(&w->tb, run_dir, first_step, err, errlen) != 0) {
        metrics_close(w);
        return -1;
    }
    return 0;
}

/* A JSON number, or null for NaN and infinities (JSON has no words for them). */
static void json_double(FILE *f, const char *key, double value) {
    if (isfinite(value)) fprintf(f, ",\"%s\":%.9g", key, value);
    else fprintf(f, ",\"%s\":null", key);
}

void metrics_write(MetricsWriter *w, const StepMetrics *m) {
    if (!w || !w->jsonl) return;
    char *text = NULL;
    size_t text_len = 0;
    FILE *f = open_memstream(&text, &text_len);
    if (!f) mt_die(MT_EXIT_FAILURE, "out of memory writing metrics.jsonl");
    fprintf(f, "{\"step\":%ld", m->step);
    json_double(f, "loss", m->loss);
    json_double(f, "lr", m->lr);
    fprintf(f, ",\"global_batch_size\":%ld", m->global_batch_size);
    json_double(f, "grad_norm", m->grad_norm);
    json_double(f, "tokens_per_s", m->tokens_per_s);
    json_double(f, "consumed_tokens", m->consumed_tokens);
    fprintf(f, ",\"consumed_samples\":%lld", (long long)m->consumed_samples);
    json_double(f, "elapsed_s", m->elapsed_s);
    fprintf(f, ",\"time\":%.3f", m->time); /* to the millisecond: %.9g would round it to 10 s */
    if (!isnan(m->eval_loss)) json_double(f, "eval_loss", m->eval_loss);
    if (!isnan(m->test_loss)) json_double(f, "test_loss", m->test_loss);
    if (!isnan(m->weight_decay)) json_double(f, "weight_decay", m->weight_decay);
    if (!isnan(m->tflops)) json_double(f, "tflops", m->tflops);
    if (!isnan(m->mfu)) json_double(f, "mfu", m->mfu);
    if (!isnan(m->peak_mem_gib)) json_double(f, "peak_mem_gib", m->peak_mem_gib);
    if (!isnan(m->power_w)) json_double(f, "power_w", m->power_w);
    if (!isnan(m->tokens_per_joule)) json_double(f, "tokens_per_joule", m->tokens_per_joule);
    if (!isnan(m->moe_aux_loss)) json_double(f, "moe_aux_loss", m->moe_aux_loss);
    if (!isnan(m->moe_lb_loss)) json_double(f, "moe_load_balancing_loss", m->moe_lb_loss);
    if (!isnan(m->moe_z_loss)) json_double(f, "moe_z_loss", m->moe_z_loss);
    if (!isnan(m->moe_imbalance)) json_double(f, "moe_imbalance", m->moe_imbalance);
    if (!isnan(m->moe_drop_rate)) json_double(f, "moe_drop_rate", m->moe_drop_rate);
    if (!isnan(m->moe_spill_rate)) json_double(f, "moe_spill_rate", m->moe_spill_rate);
    fputs("}\n", f);
    fclose(f);
    whole_append(&w->lines, text, text_len, m->step);
    free(text);

    TbWriter *tb = &w->tb;
    tb_scalar(tb, "train/loss", m->step, m->loss);
    tb_scalar(tb, "train/lr", m->step, m->lr);
    if (!isnan(m->weight_decay)) tb_scalar(tb, "train/weight_decay", m->step, m->weight_decay);
    tb_scalar(tb, "train/grad_norm", m->step, m->grad_norm);
    tb_scalar(tb, "train/global_batch_size", m->step, (double)m->global_batch_size);
    tb_scalar(tb, "train/tokens_per_s", m->step, m->tokens_per_s);
    if (!isnan(m->eval_loss)) tb_scalar(tb, "eval/loss", m->step, m->eval_loss);
    if (!isnan(m->test_loss)) tb_scalar(tb, "test/loss", m->step, m->test_loss);
    if (!isnan(m->tflops)) tb_scalar(tb, "perf/tflops_per_device", m->step, m->tflops);
    if (!isnan(m->mfu)) tb_scalar(tb, "perf/mfu_percent", m->step, m->mfu);
    if (!isnan(m->peak_mem_gib)) tb_scalar(tb, "perf/peak_mem_gib", m->step, m->peak_mem_gib);
    if (!isnan(m->power_w)) tb_scalar(tb, "energy/power_w", m->step, m->power_w);
    if (!isnan(m->tokens_per_joule)) tb_scalar(tb, "energy/tokens_per_joule", m->step, m->tokens_per_joule);
    if (!isnan(m->moe_aux_loss)) tb_scalar(tb, "moe/aux_loss", m->step, m->moe_aux_loss);
    if (!isnan(m->moe_imbalance)) tb_scalar(tb, "moe/expert_imbalance", m->step, m->moe_imbalance);
    if (!isnan(m->moe_drop_rate)) tb_scalar(tb, "moe/drop_rate", m->step, m->moe_drop_rate);
    if (!isnan(m->moe_spill_rate)) tb_scalar(tb, "moe/spill_rate", m->step, m->moe_spill_rate);
    if (!isnan(m->moe_lb_loss)) tb_scalar(tb, "moe/load_balancing_loss", m->step, m->moe_lb_loss);
    if (!isnan(m->moe_z_loss)) tb_scalar(tb, "moe/z_loss", m->step, m->moe_z_loss);
    tb_flush(tb);
}

/* 24576 -> "24.6K"; below a thousand the plain count. */
static void format_count(char *out, size_t len, double count) {
    static const char suffixes[] = {'K', 'M', 'B', 'T'};
    if (!(fabs(count) >= 1000.0)) {
        snprintf(out, len, "%.0f", count);
        return;
    }
    double value = count;
    int unit = -1;
    while (fabs(value) >= 1000.0 && unit < 3) {
        value /= 1000.0;
        unit++;
    }
    snprintf(out, len, "%.1f%c", value, suffixes[unit]);
}

/* A duration as a person reads it: 42s, 12m05s, 3h12m, 2d03h. */
static void format_duration(char *out, size_t len, double seconds) {
    const long s = seconds < 0 ? 0 : seconds > 1e9 ? 1000000000L : (long)(seconds + 0.5);
    if (s < 60) snprintf(out, len, "%lds", s);
    else if (s < 3600) snprintf(out, len, "%ldm%02lds", s / 60, s % 60);
    else if (s < 86400) snprintf(out, len, "%ldh%02ldm", s / 3600, s % 3600 / 60);
    else snprintf(out, len, "%ldd%02ldh", s / 86400, s % 86400 / 3600);
}

static int decimal_digits(long n) {
    int digits = 1;
    while (n >= 10) {
        n /= 10;
        digits++;
    }
    return digits;
}

void metrics_print(const StepMetrics *m) {
    char tokens[32];
    format_count(tokens, sizeof tokens, m->consumed_tokens);
    int width = decimal_digits(m->total_steps > 0 ? m->total_steps : m->step);
    flockfile(stdout); /* one line: a log line of the background save's thread (mt_log) waits for it */
    printf("step %*ld/%ld | loss %.4f | lr %.3e | gbs %ld | grad_norm %.3f | tok/s %.0f | tokens %s | "
           "elapsed %.1fs",
           width + 1, m->step, m->total_steps, m->loss, m->lr, m->global_batch_size, m->grad_norm,
           m->tokens_per_s, tokens, m->elapsed_s);
    if (isfinite(m->eta_s)) {
        char eta[32];
        format_duration(eta, sizeof eta, m->eta_s);
        printf(" | eta %s", eta);
    }
    if (!isnan(m->tflops)) printf(" | TFLOP/s %.*f", m->tflops < 10.0 ? 3 : 1, m->tflops);
    if (!isnan(m->mfu)) printf(" | MFU %.1f%%", m->mfu);
    if (!isnan(m->peak_mem_gib)) printf(" | mem %.*f GiB", m->peak_mem_gib < 10.0 ? 2 : 1, m->peak_mem_gib);
    if (!isnan(m->power_w)) printf(" | %.0f W | tok/J %.0f", m->power_w, m->tokens_per_joule);
    if (!isnan(m->moe_aux_loss)) printf(" | aux %.4f", m->moe_aux_loss);
    if (!isnan(m->moe_lb_loss)) printf(" | lb %.3f", m->moe_lb_loss);
    if (!isnan(m->moe_z_loss)) printf(" | z %.3f", m->moe_z_loss);
    if (!isnan(m->moe_imbalance)) printf(" | imbalance %.2f", m->moe_imbalance); /* NaN: no MoE layer */
    if (!isnan(m->moe_drop_rate) && m->moe_drop_rate > 0) printf(" | dropped %.1f%%", 100.0 * m->moe_drop_rate);
    if (!isnan(m->moe_spill_rate) && m->moe_spill_rate > 0) printf(" | spilled %.1f%%", 100.0 * m->moe_spill_rate);
    if (!isnan(m->eval_loss)) printf(" | eval_loss %.4f", m->eval_loss);
    if (!isnan(m->test_loss)) printf(" | test_loss %.4f", m->test_loss);
    putchar('\n');
    fflush(stdout);
    funlockfile(stdout);
}

long metrics_lines_lost(const MetricsWriter *w) { return w && w->jsonl ? w->lines.lost : 0; }

long metrics_events_lost(const MetricsWriter *w) { return w && w->tb.file ? w->tb.out.lost : 0; }

void metrics_close(MetricsWriter *w) {
    if (w) tb_close(&w->tb);
    if (w && w->jsonl) {
        fclose(w->jsonl);
        w->jsonl = NULL;
    }
}

void metrics_print_timers(const StepTimers *t, long last_step) {
    if (t->steps <= 0) return;
    const double per = 1e3 / (double)t->steps;
    printf("timers (ms per step, steps %ld-%ld, rank 0): ", t->first_step, last_step);
    if (t->pipeline > 0) /* stage 0's schedule: its passes, its sends and receives, its waits for the other stages */
        printf("pipeline %.1f (forward, backward, transfers, bubble and data, not told apart)", t->pipeline * per);
    else
        printf("data %.1f | forward %.1f | backward %.1f", t->data * per, t->forward * per, t->backward * per);
    printf(" | comm %.1f | optimizer %.1f | checkpoint %.1f\n", t->comm * per, t->optimizer * per,
           t->checkpoint * per);
    fflush(stdout);
}
