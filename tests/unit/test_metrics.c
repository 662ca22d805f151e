/* test_metrics.c: the per-step log line (src/train/metrics.c metrics_print):
 * its columns, the token count's suffixes and the ETA's units, read back from
 * stdout redirected to a temporary file. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "train/metrics.h"

/* metrics_print's line, captured. */
static void printed_line(const StepMetrics *m, char *out, size_t len) {
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    fflush(stdout);
    const int saved = dup(STDOUT_FILENO);
    assert_true(saved >= 0);
    assert_true(dup2(fileno(tmp), STDOUT_FILENO) >= 0);
    metrics_print(m);
    fflush(stdout);
    assert_true(dup2(saved, STDOUT_FILENO) >= 0);
    close(saved);
    rewind(tmp);
    size_t n = fread(out, 1, len - 1, tmp);
    out[n] = '\0';
    fclose(tmp);
}

static StepMetrics plain_step(void) {
    return (StepMetrics){
        .step = 12, .total_steps = 200, .loss = 3.41725, .lr = 2.4e-3, .weight_decay = NAN, .global_batch_size = 8,
        .grad_norm = 1.2344, .tokens_per_s = 12345.4, .consumed_tokens = 24576, .elapsed_s = 3.24,
        .eta_s = NAN, .eval_loss = NAN, .test_loss = NAN, .tflops = NAN, .mfu = NAN, .peak_mem_gib = NAN, .power_w = NAN,
        .tokens_per_joule = NAN, .moe_aux_loss = NAN, .moe_lb_loss = NAN, .moe_z_loss = NAN, .moe_imbalance = NAN, .moe_drop_rate = NAN,
        .moe_spill_rate = NAN,
    };
}

static void test_plain_line(void **state) {
    (void)state;
    char line[512];
    StepMetrics m = plain_step();
    printed_line(&m, line, sizeof line);
    assert_string_equal(line, "step   12/200 | loss 3.4173 | lr 2.400e-03 | gbs 8 | grad_norm 1.234 | tok/s 12345 | "
                              "tokens 24.6K | elapsed 3.2s\n");
}

/* The MoE columns: dropped and spilled only when some were (the spill rate is NAN where no layer can spill: the
 * CPU, ep 1), after the imbalance. */
static void test_moe_columns(void **state) {
    (void)state;
    char line[512];
    StepMetrics m = plain_step();
    m.moe_imbalance = 1.5;
    m.moe_drop_rate = 0.0;
    m.moe_spill_rate = 0.0;
    printed_line(&m, line, sizeof line);
    assert_non_null(strstr(line, "elapsed 3.2s | imbalance 1.50\n"));
    m.moe_drop_rate = 0.125;
    m.moe_spill_rate = 0.25;
    printed_line(&m, line, sizeof line);
    assert_non_null(strstr(line, "elapsed 3.2s | imbalance 1.50 | dropped 12.5% | spilled 25.0%\n"));
    m.moe_spill_rate = NAN;
    printed_line(&m, line, sizeof line);
    assert_non_null(strstr(line, "| dropped 12.5%\n"));
}

/* The ETA in the unit a person reads: seconds, minutes and seconds, hours and minutes, days and hours. */
static void test_eta_units(void **state) {
    (void)state;
    static const struct {
        double seconds;
        const char *text;
    } cases[] = {
        {0.2, "eta 0s |"},      {42.4, "eta 42s |"},     {59.6, "eta 1m00s |"}, {725.0, "eta 12m05s |"},
        {3599.4, "eta 59m59s |"}, {11520.0, "eta 3h12m |"}, {86399.0, "eta 23h59m |"}, {183600.0, "eta 2d03h |"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char line[512];
        StepMetrics m = plain_step();
        m.eta_s = cases[i].seconds;
        m.tflops = 1.5; /* a column after it, so each case ends in " |" */
        printed_line(&m, line, sizeof line);
        const char *eta = strstr(line, "elapsed 3.2s | eta ");
        assert_non_null(eta);
        if (strncmp(eta + strlen("elapsed 3.2s | "), cases[i].text, strlen(cases[i].text)) != 0)
            fail_msg("eta %.1f s: got '%s', expected '%s'", cases[i].seconds, line, cases[i].text);
    }
}

/* An unknown ETA (the last step, no throughput yet) prints nothing; the later columns follow as before. */
static void test_no_eta_at_the_end(void **state) {
    (void)state;
    char line[512];
    StepMetrics m = plain_step();
    m.step = m.total_steps;
    m.eval_loss = 3.21;
    printed_line(&m, line, sizeof line);
    assert_null(strstr(line, "eta"));
    assert_non_null(strstr(line, "elapsed 3.2s | eval_loss 3.2100\n"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_line),
        cmocka_unit_test(test_moe_columns),
        cmocka_unit_test(test_eta_units),
        cmocka_unit_test(test_no_eta_at_the_end),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
