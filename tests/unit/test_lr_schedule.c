/* test_lr_schedule.c: lr_at and weight_decay_at against Megatron-LM's own
 * OptimizerParamScheduler (tests/fixtures/megatron/schedule.txt, every step of
 * 17 schedules made by megatron-core: warmup from lr_warmup_init, every decay
 * style, the weight decay's increment styles), against Hugging Face
 * transformers' schedulers as the Trainer builds them (tests/fixtures/hf/
 * lr_schedule.txt: linear, cosine, constant_with_warmup, cosine_with_min_lr,
 * with min_lr 0 or min_lr_rate x lr), and against Megatron's formulas
 * worked out here at chosen steps (0-based steps; step s uses Megatron's
 * num_steps = s). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "train/lr_schedule.h"

#define MAX_LR 3.0e-3
#define MIN_LR 3.0e-4
#define TOTAL 100

static OptimizerConfig config(LrDecay decay) {
    OptimizerConfig opt = {0};
    opt.lr = MAX_LR;
    opt.min_lr = MIN_LR;
    opt.warmup_steps = 10;
    opt.decay = decay;
    opt.decay_steps = 0; /* = total steps */
    opt.wsd_decay_steps = 20;
    opt.wsd_decay_style = WSD_LINEAR;
    return opt;
}

static void assert_close(double actual, double expected) {
    double tol = 1e-12 * fmax(fabs(expected), 1e-300);
    if (fabs(actual - expected) > tol) fail_msg("lr %.17g, expected %.17g", actual, expected);
}

/* lr for a decay coefficient: min + coeff * (max - min). */
static double with_coeff(double coeff) { return MIN_LR + coeff * (MAX_LR - MIN_LR); }

static void test_warmup_is_linear_from_zero(void **state) {
    (void)state;
    const LrDecay decays[] = {DECAY_CONSTANT, DECAY_LINEAR, DECAY_COSINE, DECAY_INVERSE_SQRT, DECAY_WSD};
    for (size_t i = 0; i < sizeof decays / sizeof decays[0]; i++) {
        OptimizerConfig opt = config(decays[i]);
        assert_true(lr_at(&opt, 0, TOTAL) == 0.0);          /* Megatron: first update at num_steps 0 */
        assert_close(lr_at(&opt, 1, TOTAL), MAX_LR * 0.1);
        assert_close(lr_at(&opt, 5, TOTAL), MAX_LR * 0.5);
        assert_close(lr_at(&opt, 9, TOTAL), MAX_LR * 0.9);
        assert_close(lr_at(&opt, 10, TOTAL), MAX_LR);       /* the end of warmup reaches the peak */
    }
}

static void test_no_warmup_starts_at_peak(void **state) {
    (void)state;
    OptimizerConfig opt = config(DECAY_COSINE);
    opt.warmup_steps = 0;
    assert_close(lr_at(&opt, 0, TOTAL), MAX_LR);
    assert_close(lr_at(&opt, 50, TOTAL), with_coeff(0.5)); /* r = 50/100 */
}

/* warmup_fraction: warmup over that fraction of the decay steps, not rounded (Megatron's lr_warmup_steps =
 * lr_warmup_fraction * lr_decay_steps, a float): 0.1 of 100 is warmup_steps 10 bit for bit; 0.015 of 100 is 1.5
 * steps, and of decay_steps 200 when given (not of train.steps). */
static void test_warmup_fraction(void **state) {
    (void)state;
    OptimizerConfig steps = config(DECAY_COSINE), fraction = config(DECAY_COSINE);
    fraction.warmup_steps = 0;
    fraction.warmup_fraction = 0.1;
    for (long s = 0; s <= TOTAL + 5; s++) assert_true(lr_at(&fraction, s, TOTAL) == lr_at(&steps, s, TOTAL));
    fraction.warmup_fraction = 0.015;
    assert_true(lr_at(&fraction, 0, TOTAL) == 0.0);
    assert_close(lr_at(&fraction, 1, TOTAL), MAX_LR / 1.5);
    assert_close(lr_at(&fraction, 2, TOTAL), with_coeff(0.5 * (cos(M_PI * (2 - 1.5) / (100 - 1.5)) + 1)));
    fraction.decay_steps = 200;
    assert_close(lr_at(&fraction, 2, TOTAL), MAX_LR * 2 / 3.0);
    assert_close(lr_at(&fraction, 50, TOTAL), with_coeff(0.5 * (cos(M_PI * (50 - 3.0) / (200 - 3.0)) + 1)));
}

static void test_constant(void **state) {
    (void)state;
    OptimizerConfig opt = config(DECAY_CONSTANT);
    assert_close(lr_at(&opt, 11, TOTAL), MAX_LR);
    assert_close(lr_at(&opt, 99, TOTAL), MAX_LR);
    assert_close(lr_at(&opt, 500, TOTAL), MAX_LR); /* Megatron: constant ignores decay_steps */
}

static void test_linear(void **state) {
    (void)state;
    OptimizerConfig opt = config(DECAY_LINEAR);
    assert_close(lr_at(&opt, 40, TOTAL), with_coeff(1.0 - 30.0 / 90.0));
    assert_close(lr_at(&opt, 55, TOTAL), with_coeff(0.5));
    assert_close(lr_at(&opt, 91, TOTAL), with_coeff(1.0 - 81.0 / 90.0));
    assert_close(lr_at(&opt, 100, TOTAL), MIN_LR);
    assert_close(lr_at(&opt, 101, TOTAL), MIN_LR);
}

static void test_cosine(void **state) {
    (void)state;
    OptimizerConfig opt = config(DECAY_COSINE);
    const double pi = 3.14159265358979323846;
    assert_close(lr_at(&opt, 25, TOTAL), with_coeff(0.5 * (cos(pi / 6.0) + 1.0))); /* r = 15/90 */
    assert_close(lr_at(&opt, 55, TOTAL), with_coeff(0.5));                        /* r = 1/2 */
    assert_close(lr_at(&opt, 85, TOTAL), with_coeff(0.5 * (cos(pi * 75.0 / 90.0) + 1.0)));
    assert_close(lr_at(&opt, 100, TOTAL), MIN_LR);
    assert_close(lr_at(&opt, 250, TOTAL), MIN_LR);
}

static void test_explicit_decay_steps(void **state) {
    (void)state;
    OptimizerConfig opt = config(DECAY_COSINE);
    opt.decay_steps = 50; /* shorter than the run: min_lr afterwards */
    assert_close(lr_at(&opt, 30, TOTAL), with_coeff(0.5)); /* r = 20/40 */
    assert_close(lr_at(&opt, 50, TOTAL), MIN_LR);
    assert_close(lr_at(&opt, 51, TOTAL), MIN_LR);
    assert_close(lr_at(&opt, 99, TOTAL), MIN_LR);
    opt.decay = DECAY_LINEAR;
    assert_close(lr_at(&opt, 20, TOTAL), with_coeff(0.75)); /* r = 10/40 */
}

static void test_inverse_sqrt(void **state) {
    (void)state;
    OptimizerConfig opt = config(DECAY_INVERSE_SQRT);
    const long total = 10000;
    assert_close(lr_at(&opt, 40, total), MAX_LR * 0.5);   /* sqrt(10) / sqrt(40) */
    assert_close(lr_at(&opt, 250, total), MAX_LR * 0.2);  /* sqrt(10) / sqrt(250) */
    assert_close(lr_at(&opt, 4000, total), MIN_LR);       /* 0.05 * max = 1.5e-4 < min_lr */
    assert_close(lr_at(&opt, total + 1, total), MIN_LR);  /* past decay_steps */
    opt.warmup_steps = 0;                                  /* Megatron: max(warmup, 1), max(step, 1) */
    assert_close(lr_at(&opt, 0, total), MAX_LR);
    assert_close(lr_at(&opt, 4, total), MAX_LR * 0.5);
}

static void test_wsd_stable_phase(void **state) {
    (void)state;
    OptimizerConfig opt = config(DECAY_WSD);
    assert_close(lr_at(&opt, 11, TOTAL), MAX_LR);
    assert_close(lr_at(&opt, 60, TOTAL), MAX_LR);
    assert_close(lr_at(&opt, 80, TOTAL), MAX_LR); /* anneal starts after decay_steps - wsd_decay_steps */
    assert_close(lr_at(&opt, 101, TOTAL), MIN_LR);
}

static void test_wsd_decay_styles(void **state) {
    (void)state;
    const double pi = 3.14159265358979323846;
    OptimizerConfig opt = config(DECAY_WSD);
    /* anneal from step 80 over 20 steps: step 85 is q = 1/4, step 90 is q = 1/2 */
    opt.wsd_decay_style = WSD_LINEAR;
    assert_close(lr_at(&opt, 85, TOTAL), with_coeff(0.75));
    assert_close(lr_at(&opt, 90, TOTAL), with_coeff(0.5));
    opt.wsd_decay_style = WSD_COSINE;
    assert_close(lr_at(&opt, 85, TOTAL), with_coeff(0.5 * (cos(pi / 4.0) + 1.0)));
    assert_close(lr_at(&opt, 90, TOTAL), with_coeff(0.5));
    opt.wsd_decay_style = WSD_EXPONENTIAL;
    assert_close(lr_at(&opt, 85, TOTAL), with_coeff(2.0 * pow(0.5, 0.25) - 1.0));
    assert_close(lr_at(&opt, 90, TOTAL), with_coeff(sqrt(2.0) - 1.0));
    opt.wsd_decay_style = WSD_MINUS_SQRT;
    assert_close(lr_at(&opt, 85, TOTAL), with_coeff(0.5));
    assert_close(lr_at(&opt, 90, TOTAL), with_coeff(1.0 - sqrt(0.5)));
    /* every style ends at min_lr at decay_steps and stays there */
    const WsdDecayStyle styles[] = {WSD_LINEAR, WSD_COSINE, WSD_EXPONENTIAL, WSD_MINUS_SQRT};
    for (size_t i = 0; i < 4; i++) {
        opt.wsd_decay_style = styles[i];
        assert_true(fabs(lr_at(&opt, 100, TOTAL) - MIN_LR) <= 1e-15);
        assert_close(lr_at(&opt, 120, TOTAL), MIN_LR);
    }
}

/* warmup_init: the warmup rises from it (Megatron's init_lr + (max_lr - init_lr) * s / w); the decay is unchanged */
static void test_warmup_init(void **state) {
    (void)state;
    OptimizerConfig opt = config(DECAY_COSINE), from_zero = config(DECAY_COSINE);
    opt.warmup_init = 1e-4;
    assert_true(lr_at(&opt, 0, TOTAL) == 1e-4);
    assert_close(lr_at(&opt, 5, TOTAL), 1e-4 + (MAX_LR - 1e-4) * 0.5);
    assert_close(lr_at(&opt, 10, TOTAL), MAX_LR);
    for (long s = 11; s <= TOTAL + 3; s++) assert_true(lr_at(&opt, s, TOTAL) == lr_at(&from_zero, s, TOTAL));
}

/* weight_decay_at: constant whatever the step; linear and cosine from weight_decay at step 0 to weight_decay_end at
 * total_steps, and the end past it */
static void test_weight_decay_styles(void **state) {
    (void)state;
    OptimizerConfig opt = config(DECAY_COSINE);
    opt.weight_decay = 0.02;
    opt.weight_decay_end = 0.1;
    for (long s = 0; s <= TOTAL + 2; s++) assert_true(weight_decay_at(&opt, s, TOTAL) == 0.02); /* constant */
    opt.weight_decay_style = WD_LINEAR;
    assert_true(weight_decay_at(&opt, 0, TOTAL) == 0.02);
    assert_close(weight_decay_at(&opt, 25, TOTAL), 0.02 + 0.25 * 0.08);
    assert_close(weight_decay_at(&opt, TOTAL, TOTAL), 0.1);
    assert_true(weight_decay_at(&opt, TOTAL + 1, TOTAL) == 0.1);
    opt.weight_decay_style = WD_COSINE; /* 0.5 (cos(pi (1 - r)) + 1): slow first */
    assert_close(weight_decay_at(&opt, 50, TOTAL), 0.06);
    assert_close(weight_decay_at(&opt, 25, TOTAL), 0.02 + 0.5 * (cos(M_PI * 0.75) + 1.0) * 0.08);
    assert_true(weight_decay_at(&opt, 25, TOTAL) < 0.02 + 0.25 * 0.08);
    assert_true(weight_decay_at(&opt, TOTAL + 7, TOTAL) == 0.1);
}

#define MEGATRON_FIXTURE "tests/fixtures/megatron/schedule.txt"
#define HF_FIXTURE "tests/fixtures/hf/lr_schedule.txt"

/* A fixture case's settings as megatrain's OptimizerConfig (Megatron's style names; its decay_steps equal to the
 * run's length becomes megatrain's default, null). */
static OptimizerConfig fixture_config(const char *path, const char *line, char *name, long *total) {
    OptimizerConfig opt = {0};
    char decay[32], wsd_style[32], wd_style[32];
    long decay_steps, wsd_steps, warmup;
    if (sscanf(line, "case %63s total=%ld init_lr=%lf max_lr=%lf min_lr=%lf warmup=%ld warmup_fraction=%lf "
               "decay_steps=%ld decay=%31s wsd_steps=%ld wsd_style=%31s start_wd=%lf end_wd=%lf wd_style=%31s",
               name, total, &opt.warmup_init, &opt.lr, &opt.min_lr, &warmup, &opt.warmup_fraction, &decay_steps,
               decay, &wsd_steps, wsd_style, &opt.weight_decay, &opt.weight_decay_end, wd_style) != 14)
        fail_msg("%s: cannot read the case line '%s'", path, line);
    opt.warmup_steps = warmup;
    opt.decay_steps = decay_steps == *total ? 0 : decay_steps;
    opt.wsd_decay_steps = wsd_steps;
    const struct { const char *megatron; LrDecay ours; } decays[] = {
        {"constant", DECAY_CONSTANT}, {"linear", DECAY_LINEAR}, {"cosine", DECAY_COSINE},
        {"inverse-square-root", DECAY_INVERSE_SQRT}, {"WSD", DECAY_WSD}};
    bool found = false;
    for (size_t i = 0; i < sizeof decays / sizeof decays[0]; i++)
        if (strcmp(decay, decays[i].megatron) == 0) opt.decay = decays[i].ours, found = true;
    if (!found) fail_msg("%s: case %s: unknown decay '%s'", path, name, decay);
    const char *const wsd_names[] = {"exponential", "linear", "cosine", "minus_sqrt"};
    for (int i = 0; i < 4; i++)
        if (strcmp(wsd_style, wsd_names[i]) == 0) opt.wsd_decay_style = (WsdDecayStyle)i;
    const char *const wd_names[] = {"constant", "linear", "cosine"};
    found = false;
    for (int i = 0; i < 3; i++)
        if (strcmp(wd_style, wd_names[i]) == 0) opt.weight_decay_style = (WeightDecayStyle)i, found = true;
    if (!found) fail_msg("%s: case %s: unknown weight decay style '%s'", path, name, wd_style);
    return opt;
}

/* Within 4 ulps of `scale`: the formulas are Megatron's term by term, so only libm's cos/pow/sqrt could part them
 * (scale: the value); transformers' compute lr x (1 - r) where megatrain computes min_lr + (1 - r)(lr - min_lr),
 * which rounds apart by a few ulps of lr near the end (scale: the peak lr). */
static bool near(double ours, double theirs, double scale) {
    return fabs(ours - theirs) <= 4 * 2.2204460492503131e-16 * fabs(scale);
}

/* Every step of every case of fixture `path` (and some past the run's end): the lr and the weight decay the other
 * implementation sets for that update; the number of cases and of steps read. */
static void check_fixture(const char *path, const char *maker, bool of_peak, long *cases, long *steps) {
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("%s: cannot open (run from the repository root; made by %s)", path, maker);
    char line[512], name[64] = "";
    OptimizerConfig opt = {0};
    long total = 0, expected_step = 0;
    bool in_case = false;
    *cases = *steps = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        if (strncmp(line, "case ", 5) == 0) {
            opt = fixture_config(path, line, name, &total);
            in_case = true;
            expected_step = 0;
            (*cases)++;
            continue;
        }
        long step;
        double lr, wd;
        if (!in_case || sscanf(line, "%ld %lf %lf", &step, &lr, &wd) != 3 || step != expected_step)
            fail_msg("%s: unexpected line '%s'", path, line);
        expected_step++;
        const double our_lr = lr_at(&opt, step, total), our_wd = weight_decay_at(&opt, step, total);
        if (!near(our_lr, lr, of_peak ? opt.lr : lr)) fail_msg("%s: case %s step %ld: lr %.17g, theirs %.17g", path, name, step, our_lr, lr);
        if (!near(our_wd, wd, wd))
            fail_msg("%s: case %s step %ld: weight decay %.17g, theirs %.17g", path, name, step, our_wd, wd);
        (*steps)++;
    }
    fclose(f);
}

static void test_megatron_scheduler_fixture(void **state) {
    (void)state;
    long cases, steps;
    check_fixture(MEGATRON_FIXTURE, "tests/fixtures/megatron/make_schedule_fixture.py", false, &cases, &steps);
    assert_int_equal(cases, 17);
    assert_true(steps >= 17 * 49);
}

/* The Trainer's schedulers: megatrain's with min_lr 0 (or min_lr_rate x lr) and the same whole warmup steps */
static void test_hf_scheduler_fixture(void **state) {
    (void)state;
    long cases, steps;
    check_fixture(HF_FIXTURE, "tests/fixtures/hf/make_lr_schedule_fixture.py", true, &cases, &steps);
    assert_int_equal(cases, 5);
    assert_int_equal(steps, 5 * 61);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_megatron_scheduler_fixture),
        cmocka_unit_test(test_hf_scheduler_fixture),
        cmocka_unit_test(test_warmup_init),
        cmocka_unit_test(test_weight_decay_styles),
        cmocka_unit_test(test_warmup_is_linear_from_zero),
        cmocka_unit_test(test_no_warmup_starts_at_peak),
        cmocka_unit_test(test_warmup_fraction),
        cmocka_unit_test(test_constant),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_cosine),
        cmocka_unit_test(test_explicit_decay_steps),
        cmocka_unit_test(test_inverse_sqrt),
        cmocka_unit_test(test_wsd_stable_phase),
        cmocka_unit_test(test_wsd_decay_styles),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
