/* test_batch_schedule.c: global_batch_at for step and token stages (at and
 * around every boundary), train_total_steps for step and token budgets,
 * train_schedule_samples (the samples the train loader must provide), and
 * train.rampup_batch_size's stages against Megatron's own batch ramp
 * (tests/fixtures/megatron/rampup.txt) and its refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "config/batch_schedule.h"
#include "config/recipe_schema.h"
#include "train/train_state.h"

static TrainConfig plain(long steps, double tokens, int seq_len, long gbs) {
    TrainConfig t = {0};
    t.steps = steps;
    t.tokens = tokens;
    t.seq_len = seq_len;
    t.micro_batch_size = 1;
    t.num_batch_stages = 1;
    t.batch_stages[0] = (BatchStage){.start = 0, .global_batch_size = gbs};
    return t;
}

static void add_stage(TrainConfig *t, double start, long gbs) {
    t->batch_stages[t->num_batch_stages++] = (BatchStage){.start = start, .global_batch_size = gbs};
}

static void test_single_stage(void **state) {
    (void)state;
    TrainConfig t = plain(100, 0, 64, 8);
    assert_int_equal(global_batch_at(&t, 0, 0), 8);
    assert_int_equal(global_batch_at(&t, 99, 1e12), 8);
}

static void test_step_stages(void **state) {
    (void)state;
    TrainConfig t = plain(100, 0, 64, 8);
    add_stage(&t, 20, 16);
    add_stage(&t, 50, 32);
    assert_int_equal(global_batch_at(&t, 0, 0), 8);
    assert_int_equal(global_batch_at(&t, 19, 0), 8);
    assert_int_equal(global_batch_at(&t, 20, 0), 16);
    assert_int_equal(global_batch_at(&t, 49, 0), 16);
    assert_int_equal(global_batch_at(&t, 50, 0), 32);
    assert_int_equal(global_batch_at(&t, 1000, 0), 32);
    /* step form ignores the tokens */
    assert_int_equal(global_batch_at(&t, 5, 9e9), 8);
}

/* Megatron's "0:16 2.4B:320 4.8B:624": thresholds in consumed tokens. */
static void test_token_stages(void **state) {
    (void)state;
    TrainConfig t = plain(0, 10e9, 4096, 16);
    t.batch_stages_in_tokens = true;
    add_stage(&t, 2.4e9, 320);
    add_stage(&t, 4.8e9, 624);
    assert_int_equal(global_batch_at(&t, 0, 0), 16);
    assert_int_equal(global_batch_at(&t, 1000000, 2.4e9 - 1), 16); /* the step does not matter */
    assert_int_equal(global_batch_at(&t, 3, 2.4e9), 320);
    assert_int_equal(global_batch_at(&t, 3, 4.8e9 - 4096), 320);
    assert_int_equal(global_batch_at(&t, 3, 4.8e9), 624);
    assert_int_equal(global_batch_at(&t, 3, 9e12), 624);
}

static void test_total_steps_from_steps(void **state) {
    (void)state;
    TrainConfig t = plain(123, 0, 64, 8);
    add_stage(&t, 10, 16);
    assert_int_equal(train_total_steps(&t), 123);
}

static void test_total_steps_from_tokens(void **state) {
    (void)state;
    /* 8 x 10 = 80 tokens a step: 960 tokens take exactly 12 steps, 961..1040 take 13 */
    TrainConfig t = plain(0, 960, 10, 8);
    assert_int_equal(train_total_steps(&t), 12);
    t.tokens = 961;
    assert_int_equal(train_total_steps(&t), 13);
    t.tokens = 1040;
    assert_int_equal(train_total_steps(&t), 13);
    t.tokens = 1;
    assert_int_equal(train_total_steps(&t), 1);
}

static void test_total_steps_with_token_stages(void **state) {
    (void)state;
    /* seq_len 10, "0:2 100:4", 300 tokens: five steps of 20 tokens reach 100,
     * then steps of 40 tokens: 140, 180, 220, 260, 300 -> 10 steps */
    TrainConfig t = plain(0, 300, 10, 2);
    t.batch_stages_in_tokens = true;
    add_stage(&t, 100, 4);
    assert_int_equal(train_total_steps(&t), 10);
    t.tokens = 301;
    assert_int_equal(train_total_steps(&t), 11);
}

static void test_total_steps_with_step_stages(void **state) {
    (void)state;
    /* seq_len 10, gbs 2 until step 3, then 4: 20, 40, 60, 100, 140 tokens */
    TrainConfig t = plain(0, 100, 10, 2);
    add_stage(&t, 3, 4);
    assert_int_equal(train_total_steps(&t), 4);
    t.tokens = 101;
    assert_int_equal(train_total_steps(&t), 5);
}

static void test_schedule_samples(void **state) {
    (void)state;
    TrainConfig t = plain(5, 0, 10, 2);
    add_stage(&t, 3, 4);
    assert_int_equal(train_schedule_samples(&t, 5), 2 + 2 + 2 + 4 + 4);
    TrainConfig tok = plain(0, 300, 10, 2);
    tok.batch_stages_in_tokens = true;
    add_stage(&tok, 100, 4);
    assert_int_equal(train_schedule_samples(&tok, train_total_steps(&tok)), 5 * 2 + 5 * 4);
}

/* The step-by-step walk the closed form replaced: the reference for every schedule below. */
static void walk_steps(const TrainConfig *t, long max_steps, long *steps, int64_t *samples) {
    double consumed = 0.0;
    *steps = 0;
    *samples = 0;
    while (*steps < max_steps && (t->tokens <= 0 || consumed < t->tokens)) {
        const long gbs = global_batch_at(t, *steps, consumed);
        consumed += (double)gbs * (double)t->seq_len;
        *samples += gbs;
        (*steps)++;
    }
}

/* Random schedules in both forms (starts on and between step boundaries, stages a step skips over, budgets
 * inside and past the last stage): train_total_steps and train_schedule_samples equal the step-by-step walk. */
static void test_runs_equal_steps(void **state) {
    (void)state;
    uint64_t x = 88172645463325252ULL;
    for (int trial = 0; trial < 2000; trial++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const bool tokens = x & 1;
        TrainConfig t = plain(0, 0, 1 + (int)((x >> 8) % 16), 1 + (long)((x >> 16) % 6));
        t.batch_stages_in_tokens = tokens;
        double start = 0;
        const int stages = (int)((x >> 24) % 5);
        for (int s = 0; s < stages; s++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            start += tokens ? 1 + (double)(x % 400) : 1 + (double)(x % 30);
            add_stage(&t, start, 1 + (long)((x >> 20) % 8));
        }
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        if (x & 1) t.tokens = 1 + (double)(x >> 4 & 4095);
        else t.steps = 1 + (long)(x >> 4 & 127);
        long want_steps;
        int64_t want_samples;
        walk_steps(&t, t.tokens > 0 ? 1L << 40 : t.steps, &want_steps, &want_samples);
        assert_int_equal(train_total_steps(&t), want_steps);
        assert_int_equal(train_schedule_samples(&t, want_steps), want_samples);
        const long half = want_steps / 2;
        walk_steps(&t, half, &want_steps, &want_samples);
        assert_int_equal(train_schedule_samples(&t, half), want_samples);
    }
}

/* The largest budgets the recipe allows take runs, not steps (a step at a time, 2^53 steps never ended). */
static void test_largest_budgets(void **state) {
    (void)state;
    TrainConfig t = plain(0, 0x1p53, 1, 1);
    assert_int_equal(train_total_steps(&t), 1L << 53);
    add_stage(&t, 1000, 2);
    t.batch_stages_in_tokens = true;
    assert_int_equal(train_total_steps(&t), 1000 + ((1L << 53) - 1000) / 2);
    TrainConfig s = plain(1L << 53, 0, 4096, 1024);
    add_stage(&s, 10, 2048);
    assert_int_equal(train_schedule_samples(&s, 1L << 53), INT64_MAX); /* about 2^64 samples: more than int64 */
    assert_int_equal(train_schedule_samples(&s, 1L << 40), 10 * 1024 + ((1L << 40) - 10) * 2048);
}

/* A resumed run counts on from its position with the schedule now in force: 100 steps of 8 (800 samples, 51200
 * tokens at seq 64) done, then 16 a step: a budget of 153600 tokens ends at step 200, and the loader holds the
 * 800 samples read plus 1600; the same schedule from step 0 would say 150 steps and 2400 samples. */
static void test_resumed_position(void **state) {
    (void)state;
    TrainConfig t = plain(0, 153600, 64, 16);
    assert_int_equal(train_total_steps(&t), 150);
    t.resumed_step = 100;
    t.resumed_tokens = 51200;
    t.resumed_samples = 800;
    assert_int_equal(train_total_steps(&t), 200);
    assert_int_equal(train_schedule_samples(&t, 200), 800 + 1600);
    assert_int_equal(train_schedule_samples(&t, 100), 800); /* nothing left to run */
    t.seq_len = 32;                                        /* 102400 tokens left at 512 a step */
    assert_int_equal(train_total_steps(&t), 300);
    /* a budget already spent: nothing more */
    t.resumed_tokens = 153600;
    assert_int_equal(train_total_steps(&t), 100);
}

#define RAMPUP_FIXTURE "tests/fixtures/megatron/rampup.txt"

/* Every step of every ramp megatron-core's RampupBatchsizeNumMicroBatchesCalculator ran (make_rampup_fixture.py):
 * the stages train.rampup_batch_size makes give each step Megatron's global batch, at two sequence lengths (the
 * stages count tokens, Megatron samples). */
static void test_rampup_equals_megatron(void **state) {
    (void)state;
    FILE *f = fopen(RAMPUP_FIXTURE, "r");
    if (!f) fail_msg("%s: cannot open (run the tests from the repository root)", RAMPUP_FIXTURE);
    char line[16384], name[128], err[512];
    long cases = 0, checked = 0;
    while (fgets(line, sizeof line, f)) {
        long start, increment, samples, gbs, steps;
        if (line[0] == '#') continue;
        assert_int_equal(sscanf(line, "case %127s %ld %ld %ld %ld %ld", name, &start, &increment, &samples, &gbs,
                                &steps), 6);
        assert_non_null(fgets(line, sizeof line, f));
        static const int seq_lens[] = {1, 4096};
        for (size_t q = 0; q < sizeof seq_lens / sizeof *seq_lens; q++) {
            TrainConfig t = plain(steps, 0, seq_lens[q], gbs);
            t.rampup[0] = start, t.rampup[1] = increment, t.rampup[2] = samples;
            if (train_resolve_rampup(&t, NULL, err, sizeof err) != 0) fail_msg("%s: %s", name, err);
            double consumed = 0;
            const char *p = line;
            for (long s = 0; s < steps; s++) {
                char *end;
                const long want = strtol(p, &end, 10);
                assert_true(end != p);
                p = end;
                const long got = global_batch_at(&t, s, consumed);
                if (got != want)
                    fail_msg("%s, seq_len %d: step %ld has global batch %ld, Megatron's %ld", name, seq_lens[q], s + 1,
                             got, want);
                consumed += (double)got * seq_lens[q];
                checked++;
            }
        }
        cases++;
    }
    fclose(f);
    assert_true(cases >= 8);
    print_message("rampup: %ld cases, %ld steps equal Megatron's\n", cases, checked);
}

/* What Megatron asserts is refused, and a ramp needs global_batch_size (its end) and no batch_schedule. */
static void test_rampup_refusals(void **state) {
    (void)state;
    char err[512];
    TrainConfig t = plain(10, 0, 64, 64);
    t.rampup[0] = 16, t.rampup[1] = 15, t.rampup[2] = 100; /* 15 does not divide 64 - 16 */
    assert_int_equal(train_resolve_rampup(&t, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "INCREMENT (15) to divide their difference (48)"));
    t.rampup[0] = 80, t.rampup[1] = 16; /* above the end */
    assert_int_equal(train_resolve_rampup(&t, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "START (80) at most train.global_batch_size (64)"));
    t.rampup[0] = 1, t.rampup[1] = 1; /* 63 increments: 64 stages, the most */
    assert_int_equal(train_resolve_rampup(&t, NULL, err, sizeof err), 0);
    assert_int_equal(t.num_batch_stages, 64);
    TrainConfig more = plain(10, 0, 64, 65);
    more.rampup[0] = 1, more.rampup[1] = 1, more.rampup[2] = 100;
    assert_int_equal(train_resolve_rampup(&more, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "makes 65 stages"));
    TrainConfig none = plain(10, 0, 64, 64);
    none.num_batch_stages = 0;
    none.rampup[0] = 16, none.rampup[1] = 16, none.rampup[2] = 100;
    assert_int_equal(train_resolve_rampup(&none, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "no train.global_batch_size"));
    TrainConfig schedule = plain(10, 0, 64, 16);
    add_stage(&schedule, 5, 64);
    schedule.rampup[0] = 16, schedule.rampup[1] = 16, schedule.rampup[2] = 100;
    assert_int_equal(train_resolve_rampup(&schedule, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "train.batch_schedule beside it"));
    /* a threshold past 2^53 tokens (as the token schedule's and train.tokens): run.dir/recipe.yaml could not be read
     * back */
    TrainConfig far = plain(10, 0, 16384, 64);
    far.rampup[0] = 16, far.rampup[1] = 16, far.rampup[2] = 1L << 40;
    assert_int_equal(train_resolve_rampup(&far, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "2^53"));
    TrainConfig near = plain(10, 0, 8192, 80); /* 2^40 samples of 8192: 2^53 tokens, the most */
    near.rampup[0] = 16, near.rampup[1] = 16, near.rampup[2] = 1L << 40;
    assert_int_equal(train_resolve_rampup(&near, NULL, err, sizeof err), 0);
    assert_true(near.batch_stages[4].start == 0x1p53);
    TrainConfig flat = plain(10, 0, 64, 64); /* start = end: no increment, one stage (Megatron divides by zero) */
    flat.rampup[0] = 64, flat.rampup[1] = 8, flat.rampup[2] = 100;
    assert_int_equal(train_resolve_rampup(&flat, NULL, err, sizeof err), 0);
    assert_int_equal(flat.num_batch_stages, 1);
    assert_int_equal(global_batch_at(&flat, 9, 1e9), 64);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_single_stage),
        cmocka_unit_test(test_step_stages),
        cmocka_unit_test(test_token_stages),
        cmocka_unit_test(test_total_steps_from_steps),
        cmocka_unit_test(test_total_steps_from_tokens),
        cmocka_unit_test(test_total_steps_with_token_stages),
        cmocka_unit_test(test_total_steps_with_step_stages),
        cmocka_unit_test(test_schedule_samples),
        cmocka_unit_test(test_runs_equal_steps),
        cmocka_unit_test(test_largest_budgets),
        cmocka_unit_test(test_resumed_position),
        cmocka_unit_test(test_rampup_equals_megatron),
        cmocka_unit_test(test_rampup_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
