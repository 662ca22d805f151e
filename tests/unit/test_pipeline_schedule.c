/* test_pipeline_schedule.c: the 1F1B and interleaved schedules, run through a
 * simulator of the pipeline (buffered sends, blocking receives) for many
 * shapes: every rank finishes (no deadlock), each micro-batch passes every
 * chunk forward once and backward once, forward before backward, and 1F1B
 * keeps at most pp - stage micro-batches in flight on stage `stage`;
 * forward-only (evaluation) keeps at most pp in flight and every rank busy
 * once the pipeline is full (counted in lockstep ticks). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dist/pipeline_schedule.h"

#define MAX_RANKS 8
#define MAX_OPS 512

/* message (direction, micro, virtual stage g) has arrived at g's rank */
static bool arrived[2][64][32];

/* Simulates all ranks; returns the largest number of micro-batches in flight
 * per rank into in_flight[]. Fails the test on deadlock or a wrong op. */
static void simulate(int pp, int vpp, int M, bool forward_only, int *in_flight) {
    PipeOp ops[MAX_RANKS][MAX_OPS];
    int n[MAX_RANKS], at[MAX_RANKS] = {0};
    int fwd_done[MAX_RANKS][64][8], bwd_done[MAX_RANKS][64][8];
    memset(arrived, 0, sizeof arrived);
    memset(fwd_done, 0, sizeof fwd_done);
    memset(bwd_done, 0, sizeof bwd_done);
    for (int s = 0; s < pp; s++) {
        n[s] = pipeline_schedule(pp, vpp, s, M, forward_only, ops[s]);
        assert_int_equal(n[s], (forward_only ? 1 : 2) * M * vpp);
        in_flight[s] = 0;
    }
    const int last = pp * vpp - 1;
    int live[MAX_RANKS] = {0};
    for (bool progress = true; progress;) {
        progress = false;
        for (int s = 0; s < pp; s++) {
            if (at[s] == n[s]) continue;
            const PipeOp op = ops[s][at[s]];
            assert_true(op.micro >= 0 && op.micro < M && op.chunk >= 0 && op.chunk < vpp);
            const int g = op.chunk * pp + s;
            if (op.forward) {
                if (g > 0 && !arrived[0][op.micro][g]) continue; /* blocked on a receive */
                assert_int_equal(fwd_done[s][op.micro][op.chunk]++, 0);
                if (op.chunk == 0) live[s]++;
                if (g < last) arrived[0][op.micro][g + 1] = true;
                if (forward_only && op.chunk == vpp - 1) live[s]--;
            } else {
                if (g < last && !arrived[1][op.micro][g]) continue;
                assert_int_equal(fwd_done[s][op.micro][op.chunk], 1); /* forward first */
                assert_int_equal(bwd_done[s][op.micro][op.chunk]++, 0);
                if (g > 0) arrived[1][op.micro][g - 1] = true;
                if (op.chunk == 0) live[s]--;
            }
            if (live[s] > in_flight[s]) in_flight[s] = live[s];
            at[s]++;
            progress = true;
        }
    }
    for (int s = 0; s < pp; s++) assert_int_equal(at[s], n[s]); /* else: deadlock */
}

static void test_one_f_one_b(void **state) {
    (void)state;
    int in_flight[MAX_RANKS];
    for (int pp = 1; pp <= 4; pp++)
        for (int M = 1; M <= 9; M++) {
            simulate(pp, 1, M, false, in_flight);
            for (int s = 0; s < pp; s++) assert_true(in_flight[s] <= (pp - s < M ? pp - s : M));
            simulate(pp, 1, M, true, in_flight);
        }
}

static void test_interleaved(void **state) {
    (void)state;
    int in_flight[MAX_RANKS];
    for (int pp = 2; pp <= 4; pp++)
        for (int vpp = 2; vpp <= 3; vpp++)
            for (int M = pp; M <= 4 * pp; M += pp) {
                simulate(pp, vpp, M, false, in_flight);
                simulate(pp, vpp, M, true, in_flight);
                for (int s = 0; s < pp; s++) assert_true(in_flight[s] <= pp); /* one group at a time */
            }
    /* forward-only takes any number of micro-batches */
    for (int M = 1; M <= 7; M++) simulate(3, 2, M, true, in_flight);
}

/* Forward-only in lockstep ticks (each rank runs at most one op a tick, on
 * what arrived in earlier ticks): how many ticks until every rank is done. */
static int forward_only_ticks(int pp, int vpp, int M) {
    PipeOp ops[MAX_RANKS][MAX_OPS];
    int n[MAX_RANKS], at[MAX_RANKS] = {0};
    static int arrival[64][32]; /* tick at which (micro, virtual stage g) can run at g's rank; -1: not sent */
    memset(arrival, -1, sizeof arrival);
    for (int s = 0; s < pp; s++) n[s] = pipeline_schedule(pp, vpp, s, M, true, ops[s]);
    int tick = 0;
    for (bool busy = true; busy; tick++) {
        busy = false;
        for (int s = 0; s < pp; s++) {
            if (at[s] == n[s]) continue;
            busy = true;
            const PipeOp op = ops[s][at[s]];
            const int g = op.chunk * pp + s;
            if (g > 0 && (arrival[op.micro][g] < 0 || arrival[op.micro][g] > tick)) continue;
            if (g < pp * vpp - 1) arrival[op.micro][g + 1] = tick + 1;
            at[s]++;
        }
        assert_true(tick < 100000); /* else: deadlock */
    }
    return tick - 1;
}

/* Evaluation's interleaved order keeps every rank busy once the pipeline is
 * full: M x vpp ops a rank plus the pp - 1 ticks of the fill, for whole
 * groups of pp (micro-batch after micro-batch would wait for each one's
 * trip round the ranks at every chunk); a smaller last group waits
 * pp - group ticks at each of its chunk changes. */
static void test_forward_only_keeps_ranks_busy(void **state) {
    (void)state;
    for (int pp = 1; pp <= 4; pp++)
        for (int vpp = 1; vpp <= 3; vpp++)
            for (int M = 1; M <= 3 * pp + 1; M++) {
                const int last_group = M % pp ? M % pp : pp;
                const int expect = M * vpp + pp - 1 + (vpp - 1) * (pp - last_group);
                const int got = forward_only_ticks(pp, vpp, M);
                if (got != expect) fail_msg("pp %d vpp %d M %d: %d ticks, expected %d", pp, vpp, M, got, expect);
            }
}

static void test_interleaved_needs_multiple_of_pp(void **state) {
    (void)state;
    PipeOp ops[64];
    assert_int_equal(pipeline_schedule(2, 2, 0, 3, false, ops), -1);
    assert_int_equal(pipeline_schedule(2, 2, 0, 4, false, ops), 16);
}

/* Stage 0 of pp 4 with 8 micro-batches: 3 warm-up forwards, then F/B pairs (PipeDream-flush). */
static void test_one_f_one_b_order(void **state) {
    (void)state;
    PipeOp ops[64];
    assert_int_equal(pipeline_schedule(4, 1, 0, 8, false, ops), 16);
    for (int i = 0; i < 3; i++) assert_true(ops[i].forward && ops[i].micro == i);
    assert_true(ops[3].forward && ops[3].micro == 3);
    assert_true(!ops[4].forward && ops[4].micro == 0);
    assert_true(!ops[15].forward && ops[15].micro == 7);
    /* the last stage has no warm-up: F0 B0 F1 B1 ... */
    assert_int_equal(pipeline_schedule(4, 1, 3, 8, false, ops), 16);
    for (int i = 0; i < 16; i++) assert_true(ops[i].forward == (i % 2 == 0) && ops[i].micro == i / 2);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_f_one_b),
        cmocka_unit_test(test_interleaved),
        cmocka_unit_test(test_interleaved_needs_multiple_of_pp),
        cmocka_unit_test(test_forward_only_keeps_ranks_busy),
        cmocka_unit_test(test_one_f_one_b_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
