/* test_pipeline_transfers.c: the pipeline's transfers paired into groups
 * (src/dist/pipeline_transfers.c) finish under rendezvous semantics, the
 * semantics of NCCL's grouped send/receive, for every shape the recipe
 * allows up to pp 16 and vpp 8, training and evaluation; every op of the
 * schedule is in the steps once, in order, with its receive and its send;
 * and the check is not vacuous: the same transfers one op per group
 * deadlock for interleaved shapes (what the steady state's forward and
 * backward pairing exists for), a swap of two receives is a mismatch, and
 * a group whose second receive waits on its first is caught (the CPU's
 * receives block in order, which NCCL's do not). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dist/pipeline_transfers.h"

#define MAX_PP 16
#define MAX_STEPS 1024

static PipeStep steps[MAX_PP][MAX_STEPS];

static int make(int pp, int vpp, int M, bool forward_only, int *n) {
    for (int s = 0; s < pp; s++) {
        n[s] = pipeline_steps(pp, vpp, s, M, forward_only, steps[s]);
        if (n[s] < 0) return -1;
        assert_true(n[s] <= MAX_STEPS);
    }
    return 0;
}

static int check(int pp, const int *n, char *why, size_t len) {
    PipeStep *per_rank[MAX_PP];
    for (int s = 0; s < pp; s++) per_rank[s] = steps[s];
    return pipeline_steps_check(pp, per_rank, n, why, len);
}

static void test_every_shape_finishes(void **state) {
    (void)state;
    int shapes = 0;
    char why[512];
    for (int pp = 2; pp <= MAX_PP; pp++)
        for (int vpp = 1; vpp <= 8; vpp++)
            for (int M = 1; M <= 4 * pp + 3; M++)
                for (int fo = 0; fo < 2; fo++) {
                    if (!fo && vpp > 1 && M % pp != 0) continue;
                    if (pipeline_transfers_check(pp, vpp, M, fo, why, sizeof why) != 0)
                        fail_msg("pp %d vpp %d M %d %s: %s", pp, vpp, M, fo ? "forward only" : "training", why);
                    shapes++;
                }
    assert_true(shapes > 3000);
}

/* The steps hold the schedule's ops in order; each op's receive is in its own step and its send in the next. */
static void test_steps_follow_the_schedule(void **state) {
    (void)state;
    const int shapes[][3] = {{2, 1, 5}, {4, 1, 8}, {2, 2, 4}, {4, 2, 8}, {3, 3, 6}, {4, 4, 4}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        const int pp = shapes[k][0], vpp = shapes[k][1], M = shapes[k][2];
        for (int s = 0; s < pp; s++) {
            PipeOp ops[MAX_STEPS];
            const int n_ops = pipeline_schedule(pp, vpp, s, M, false, ops);
            const int n = pipeline_steps(pp, vpp, s, M, false, steps[s]);
            int at = 0, paired = 0;
            for (int i = 0; i < n; i++) {
                const PipeStep *st = &steps[s][i];
                int recvs = 0, sends = 0;
                for (int j = 0; j < st->num_ops; j++, at++) {
                    const PipeOp op = st->ops[j];
                    assert_int_equal(op.forward, ops[at].forward);
                    assert_int_equal(op.micro, ops[at].micro);
                    assert_int_equal(op.chunk, ops[at].chunk);
                    const int g = op.chunk * pp + s;
                    const bool has_recv = op.forward ? g > 0 : g < pp * vpp - 1;
                    const bool has_send = op.forward ? g < pp * vpp - 1 : g > 0;
                    if (has_recv) {
                        const PipeXfer *x = &st->recvs[recvs++];
                        assert_int_equal(x->micro, op.micro);
                        assert_int_equal(x->chunk, op.chunk);
                        assert_int_equal(x->backward, !op.forward);
                        assert_int_equal(x->peer, op.forward ? (s - 1 + pp) % pp : (s + 1) % pp);
                    }
                    if (has_send) {
                        assert_true(i + 1 < n);
                        const PipeXfer *x = &steps[s][i + 1].sends[sends++];
                        assert_int_equal(x->micro, op.micro);
                        assert_int_equal(x->chunk, op.chunk);
                        assert_int_equal(x->peer, op.forward ? (s + 1) % pp : (s - 1 + pp) % pp);
                    }
                }
                assert_int_equal(recvs, st->num_recvs);
                assert_int_equal(sends, i + 1 < n ? steps[s][i + 1].num_sends : 0);
                if (st->num_ops == 2) {
                    paired++;
                    assert_true(st->ops[0].forward && !st->ops[1].forward);
                }
            }
            assert_int_equal(at, n_ops);
            assert_int_equal(steps[s][n - 1].num_ops, 0); /* the closing step */
            /* vpp 1 pairs nothing; interleaved pairs every steady-state forward with its backward */
            const int steady = M * vpp - pipeline_warmup(pp, vpp, s, M, false);
            assert_int_equal(paired, vpp == 1 ? 0 : steady);
        }
    }
}

/* Split every paired step in two (one op per group, the send of the forward posted before the backward's
 * receive): for interleaved shapes this waits forever, which the pairing prevents. */
static int split_pairs(int pp, int *n) {
    int split = 0;
    for (int s = 0; s < pp; s++) {
        PipeStep out[MAX_STEPS];
        int k = 0;
        for (int i = 0; i < n[s]; i++) {
            const PipeStep *st = &steps[s][i];
            if (st->num_ops < 2) {
                out[k++] = *st;
                continue;
            }
            split++;
            PipeStep a = *st, b;
            memset(&b, 0, sizeof b);
            a.num_ops = 1;
            a.num_recvs = 0;
            b.num_ops = 1;
            b.ops[0] = st->ops[1];
            for (int j = 0; j < st->num_recvs; j++) /* the receive of each op goes with it */
                if (st->recvs[j].backward) b.recvs[b.num_recvs++] = st->recvs[j];
                else a.recvs[a.num_recvs++] = st->recvs[j];
            /* the forward's send moves from the next step into b */
            if (i + 1 < n[s])
                for (int j = 0; j < steps[s][i + 1].num_sends; j++) {
                    const PipeXfer x = steps[s][i + 1].sends[j];
                    if (!x.backward) {
                        b.sends[b.num_sends++] = x;
                        steps[s][i + 1].sends[j] = steps[s][i + 1].sends[--steps[s][i + 1].num_sends];
                        j--;
                    }
                }
            out[k++] = a;
            out[k++] = b;
        }
        memcpy(steps[s], out, (size_t)k * sizeof *out);
        n[s] = k;
    }
    return split;
}

static void test_unpaired_interleaved_deadlocks(void **state) {
    (void)state;
    int n[MAX_PP];
    char why[512];
    assert_int_equal(make(2, 2, 4, false, n), 0);
    assert_int_equal(check(2, n, why, sizeof why), 0);
    assert_true(split_pairs(2, n) > 0);
    assert_int_not_equal(check(2, n, why, sizeof why), 0);
    assert_non_null(strstr(why, "waits forever"));
    /* vpp 1 pairs nothing, so it has nothing to split and finishes as it is */
    assert_int_equal(make(4, 1, 8, false, n), 0);
    assert_int_equal(split_pairs(4, n), 0);
    assert_int_equal(check(4, n, why, sizeof why), 0);
}

static void test_swapped_receives_mismatch(void **state) {
    (void)state;
    int n[MAX_PP];
    char why[512];
    assert_int_equal(make(4, 1, 8, false, n), 0);
    /* stage 1's first two forwards' receives, exchanged */
    PipeXfer tmp = steps[1][0].recvs[0];
    assert_int_equal(steps[1][0].num_recvs, 1);
    assert_int_equal(steps[1][1].num_recvs, 1);
    steps[1][0].recvs[0] = steps[1][1].recvs[0];
    steps[1][1].recvs[0] = tmp;
    assert_int_not_equal(check(4, n, why, sizeof why), 0);
    assert_non_null(strstr(why, "next receive"));
    /* and a receive that no one sends */
    assert_int_equal(make(4, 1, 8, false, n), 0);
    steps[2][0].num_recvs = 0;
    assert_int_not_equal(check(4, n, why, sizeof why), 0);
}

/* Three ranks, each transfer in order: A sends x to B, then q to C; B receives w from C, then x from A, in one
 * group; C receives q, then sends w. NCCL would finish this (B's two receives posted together), blocking MPI
 * receives do not: B waits for w, C for q, A for x. */
static void test_receives_block_in_order(void **state) {
    (void)state;
    PipeStep a[3], b[2], c[3];
    memset(a, 0, sizeof a);
    memset(b, 0, sizeof b);
    memset(c, 0, sizeof c);
    a[0].num_sends = 1;
    a[0].sends[0] = (PipeXfer){.peer = 1, .micro = 0};
    a[1].num_sends = 1;
    a[1].sends[0] = (PipeXfer){.peer = 2, .micro = 1};
    b[0].num_recvs = 2;
    b[0].recvs[0] = (PipeXfer){.peer = 2, .micro = 2};
    b[0].recvs[1] = (PipeXfer){.peer = 0, .micro = 0};
    c[0].num_recvs = 1;
    c[0].recvs[0] = (PipeXfer){.peer = 0, .micro = 1};
    c[1].num_sends = 1;
    c[1].sends[0] = (PipeXfer){.peer = 1, .micro = 2};
    PipeStep *per_rank[3] = {a, b, c};
    int n[3] = {2, 1, 2};
    char why[512];
    assert_int_not_equal(pipeline_steps_check(3, per_rank, n, why, sizeof why), 0);
    assert_non_null(strstr(why, "waits forever"));
    /* B receiving x first finishes */
    b[0].recvs[0] = (PipeXfer){.peer = 0, .micro = 0};
    b[0].recvs[1] = (PipeXfer){.peer = 2, .micro = 2};
    assert_int_equal(pipeline_steps_check(3, per_rank, n, why, sizeof why), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_shape_finishes),
        cmocka_unit_test(test_steps_follow_the_schedule),
        cmocka_unit_test(test_unpaired_interleaved_deadlocks),
        cmocka_unit_test(test_swapped_receives_mismatch),
        cmocka_unit_test(test_receives_block_in_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
