/* test_pipeline_executor.c: the pipeline executor (src/train/pipeline.c)
 * driving a fake stage (PipelineStageOps that record what they are asked),
 * one stage at a time, for 1F1B and interleaved shapes. What the GPU stage
 * relies on:
 *   - the `last` flag is set on exactly one backward per chunk, that of the
 *     step's last micro-batch, and the stage's final op is that micro-batch's
 *     backward of chunk 0 (the GPU runs the reductions outside the layers there);
 *   - backward_finish runs on the first virtual stage only, once per micro-batch;
 *   - pipeline_reserve makes as many activation sets as a step then uses: no
 *     clone is made inside the step (the GPU allocates them at start);
 *   - every forward of a chunk precedes its backward, per micro-batch;
 *   - post_transfers follows every group of sends and receives before any op
 *     computes (the GPU's NCCL transfers are only recorded until then), and
 *     none is left unposted at the step's end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "train/pipeline.h"

#define MAX_SLOTS 64

typedef struct FakeStage {
    int clones;              /* made so far */
    int last_flags;          /* backward ops with last set */
    int finishes, last_finishes;
    int last_op_micro, last_op_chunk;
    bool last_op_forward;
    int micro_of_last_flag[16];
    int fwd[64][8], bwd[64][8]; /* per micro-batch and chunk */
    int order_errors;
    int current_micro;       /* from the load callback: which micro-batch the next forward_start is for */
    int pending, unposted_ops, transfers; /* sends and receives not yet posted; ops run with some pending */
} FakeStage;

typedef struct Slot {
    FakeStage *stage;
    int micro;
} Slot;

static FakeStage *the_stage;
static Slot slots[MAX_SLOTS];
static int next_slot;

static void *fake_clone(void *base) {
    the_stage->clones++;
    Slot *s = &slots[next_slot++];
    s->stage = the_stage;
    return s;
}
static void fake_free(void *slot) {}
static void fake_start(void *slot, const int32_t *inputs, const int32_t *positions, int B, int T) {
    ((Slot *)slot)->micro = the_stage->current_micro;
}
static void record(void *slot, int chunk, bool forward, bool last) {
    FakeStage *st = the_stage;
    const int m = ((Slot *)slot)->micro;
    if (st->pending) st->unposted_ops++;
    if (forward) st->fwd[m][chunk]++;
    else {
        if (st->fwd[m][chunk] != 1) st->order_errors++; /* a backward before its forward */
        st->bwd[m][chunk]++;
        if (last) st->micro_of_last_flag[st->last_flags++ % 16] = m;
    }
    st->last_op_micro = m;
    st->last_op_chunk = chunk;
    st->last_op_forward = forward;
}
static void fake_layers(void *slot, int chunk) { record(slot, chunk, true, false); }
static double fake_head(void *slot, const int32_t *targets) { return 1.0; }
static void fake_head_backward(void *slot, float scale) {}
static void fake_backward_layers(void *slot, int chunk, float scale, bool last) { record(slot, chunk, false, last); }
static void fake_finish(void *slot, bool last) {
    the_stage->finishes++;
    the_stage->last_finishes += last;
}
static void fake_send(void *slot, int chunk, bool backward, const Comm *g, int dest, int tag, int B, int T) {
    the_stage->pending++, the_stage->transfers++;
}
static void fake_recv(void *slot, int chunk, bool backward, const Comm *g, int src, int tag, int B, int T) {
    the_stage->pending++, the_stage->transfers++;
}
static void fake_post(void *base) { the_stage->pending = 0; }
static const char *fake_transport(void *base) { return "fake"; }

static const PipelineStageOps fake_ops = {
    .clone = fake_clone, .free_clone = fake_free, .forward_start = fake_start, .forward_layers = fake_layers,
    .forward_head = fake_head, .backward_head = fake_head_backward, .backward_layers = fake_backward_layers,
    .backward_finish = fake_finish, .send = fake_send, .recv = fake_recv, .post_transfers = fake_post,
    .transport = fake_transport,
};

static double fake_load(void *arg, int micro, const int32_t **inputs, const int32_t **targets,
                        const int32_t **positions) {
    the_stage->current_micro = micro;
    *inputs = *targets = *positions = NULL;
    return 1.0 + micro; /* fake_head's loss 1 of micro-batch m weighs m + 1 */
}

static void run_stage(int pp, int vpp, int stage, int M) {
    FakeStage st;
    memset(&st, 0, sizeof st);
    the_stage = &st;
    next_slot = 1;
    slots[0].stage = &st;
    const Comm group = {.handle = NULL, .rank = stage, .size = pp};
    Pipeline p;
    pipeline_init(&p, &group, vpp, &slots[0], &fake_ops);
    const int sets = pipeline_reserve(&p, M);
    const int clones_before = st.clones;
    assert_int_equal(sets, clones_before + 1);
    const double sum = pipeline_run(&p, M, false, 1.0f, 1, 1, fake_load, NULL);
    /* the last stage's sum: each micro-batch's loss times its weight; 0 on the others */
    assert_true(sum == (stage == pp - 1 ? M * (M + 1) / 2.0 : 0.0));
    assert_int_equal(st.clones, clones_before); /* reserve made every set the step needs */
    assert_int_equal(st.order_errors, 0);
    assert_int_equal(st.unposted_ops, 0);
    assert_int_equal(st.pending, 0);
    assert_true(st.transfers > 0); /* pp >= 2: every stage sends or receives */
    for (int m = 0; m < M; m++)
        for (int v = 0; v < vpp; v++) {
            assert_int_equal(st.fwd[m][v], 1);
            assert_int_equal(st.bwd[m][v], 1);
        }
    assert_int_equal(st.last_flags, vpp); /* one per chunk */
    for (int i = 0; i < vpp; i++) assert_int_equal(st.micro_of_last_flag[i], M - 1);
    assert_false(st.last_op_forward);
    assert_int_equal(st.last_op_micro, M - 1);
    assert_int_equal(st.last_op_chunk, 0);
    assert_int_equal(st.finishes, stage == 0 ? M : 0);
    assert_int_equal(st.last_finishes, stage == 0 ? 1 : 0);
    /* a second step makes no more sets either; eval (forward only) needs none */
    memset(st.fwd, 0, sizeof st.fwd);
    memset(st.bwd, 0, sizeof st.bwd);
    pipeline_run(&p, M, true, 1.0f, 1, 1, fake_load, NULL);
    assert_int_equal(st.clones, clones_before);
    pipeline_free(&p);
}

static void test_one_f_one_b(void **state) {
    for (int pp = 2; pp <= 4; pp++)
        for (int s = 0; s < pp; s++)
            for (int M = 1; M <= 9; M++) run_stage(pp, 1, s, M);
}

static void test_interleaved(void **state) {
    for (int pp = 2; pp <= 4; pp++)
        for (int vpp = 2; vpp <= 3; vpp++)
            for (int s = 0; s < pp; s++)
                for (int M = pp; M <= 3 * pp; M += pp) run_stage(pp, vpp, s, M);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_f_one_b),
        cmocka_unit_test(test_interleaved),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
