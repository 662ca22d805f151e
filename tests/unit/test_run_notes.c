/* test_run_notes.c: the start-of-run notes (src/train/run_notes.c): a prefix listed twice in data.train or
 * data.valid (by its text or its resolved files), data.valid that is training data or unread, a warmup, WSD decay
 * or batch stage past the last step, and the banner's lr line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "train/run_notes.h"

/* 40 steps of gbs 4, warmup 5, cosine from 1e-3 to 1e-4; one dataset, evaluation on. */
static Recipe base(void) {
    Recipe r;
    memset(&r, 0, sizeof r);
    r.train.steps = 40;
    r.train.seq_len = 32;
    r.train.micro_batch_size = 2;
    r.train.num_batch_stages = 1;
    r.train.batch_stages[0] = (BatchStage){.start = 0, .global_batch_size = 4};
    r.train.eval_interval = 10;
    r.train.eval_batches = 2;
    r.optimizer.lr = 1e-3;
    r.optimizer.min_lr = 1e-4;
    r.optimizer.warmup_steps = 5;
    r.optimizer.decay = DECAY_COSINE;
    r.optimizer.wsd_decay_style = WSD_MINUS_SQRT;
    r.data.num_train = 1;
    snprintf(r.data.train[0].path, sizeof r.data.train[0].path, "/d/english");
    return r;
}

static void add_source(DataSource *sources, int *count, const char *path, double weight) {
    snprintf(sources[*count].path, sizeof sources[*count].path, "%s", path);
    sources[(*count)++].weight = weight;
}

static RunNotes notes_of(const Recipe *r) {
    RunNotes notes = {0};
    run_notes_data(r, &notes);
    run_notes_schedule(r, r->train.steps, &notes);
    return notes;
}

/* The one note, which must contain each of the NULL-ended texts. */
static void expect_one(const RunNotes *notes, const char *first, ...) {
    if (notes->count != 1) fail_msg("expected 1 note, found %d: %s", notes->count, notes->count ? notes->text[0] : "");
    va_list ap;
    va_start(ap, first);
    for (const char *want = first; want; want = va_arg(ap, const char *))
        if (!strstr(notes->text[0], want)) fail_msg("'%s' not in: %s", want, notes->text[0]);
    va_end(ap);
}

static void test_plain_run_has_none(void **state) {
    (void)state;
    const Recipe r = base();
    assert_int_equal(notes_of(&r).count, 0);
}

static void test_prefix_twice(void **state) {
    (void)state;
    Recipe r = base();
    r.data.train[0].weight = 0.5;
    add_source(r.data.train, &r.data.num_train, "/d/greek", 0.25);
    add_source(r.data.train, &r.data.num_train, "/d/english", 0.25);
    RunNotes notes = notes_of(&r);
    expect_one(&notes, "data.train lists /d/english twice (items 0, 2)", "each sample is used twice back to back",
               "list it once with the weights summed (0.75)", NULL);
    /* without weights (each weighed by its tokens); and in data.valid, said on its own */
    r = base();
    add_source(r.data.train, &r.data.num_train, "/d/english", 0);
    notes = notes_of(&r);
    expect_one(&notes, "items 0, 1", "list it once (weighed by its tokens", NULL);
    r = base();
    add_source(r.data.valid, &r.data.num_valid, "/d/v", 0);
    add_source(r.data.valid, &r.data.num_valid, "/d/v", 0);
    notes = notes_of(&r);
    expect_one(&notes, "data.valid lists /d/v twice", NULL);
    /* three times: said once */
    r = base();
    add_source(r.data.train, &r.data.num_train, "/d/english", 0);
    add_source(r.data.train, &r.data.num_train, "/d/english", 0);
    notes = notes_of(&r);
    expect_one(&notes, "/d/english 3 times (items 0, 1, 2)", "used 3 times back to back", NULL);
}

/* Two spellings of one dataset (a link to its .idx's directory) are one prefix. */
static void test_prefix_twice_through_a_link(void **state) {
    (void)state;
    char dir[] = "/tmp/mt_run_notes_XXXXXX", path[256], link_dir[256];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/real", dir);
    assert_int_equal(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/real/a.idx", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(link_dir, sizeof link_dir, "%s/link", dir);
    snprintf(path, sizeof path, "%s/real", dir);
    assert_int_equal(symlink(path, link_dir), 0);
    Recipe r = base();
    r.data.num_train = 0;
    snprintf(path, sizeof path, "%s/real/a", dir);
    add_source(r.data.train, &r.data.num_train, path, 0);
    snprintf(path, sizeof path, "%s/link/a", dir);
    add_source(r.data.train, &r.data.num_train, path, 0);
    add_source(r.data.train, &r.data.num_train, "/d/missing", 0); /* no files: by its text */
    RunNotes notes = notes_of(&r);
    expect_one(&notes, "twice (items 0, 1)", NULL);
    snprintf(path, sizeof path, "rm -rf '%s'", dir);
    assert_int_equal(system(path), 0);
}

static void test_valid_is_train_or_unread(void **state) {
    (void)state;
    Recipe r = base();
    add_source(r.data.train, &r.data.num_train, "/d/greek", 0);
    add_source(r.data.valid, &r.data.num_valid, "/d/greek", 0);
    RunNotes notes = notes_of(&r);
    expect_one(&notes, "data.valid[0] is data.train[1] (/d/greek): evaluation scores documents this run trains on",
               NULL);
    r = base();
    add_source(r.data.valid, &r.data.num_valid, "/d/held_out", 0);
    r.train.eval_interval = 0;
    notes = notes_of(&r);
    expect_one(&notes, "data.valid is given but evaluation is off (train.eval_interval is 0), so it is not read",
               NULL);
}

static void test_schedule_past_the_end(void **state) {
    (void)state;
    /* the report's WSD run: decay from step 90 of 100 in a 40-step run */
    Recipe r = base();
    r.optimizer.decay = DECAY_WSD;
    r.optimizer.decay_steps = 100;
    r.optimizer.wsd_decay_steps = 10;
    RunNotes notes = notes_of(&r);
    expect_one(&notes, "the wsd decay starts after step 90 (decay_steps 100 - wsd_decay_steps 10), past this run's "
               "last step (40): the run ends at the peak lr 0.001", NULL);
    char line[RUN_NOTE_LEN];
    run_notes_lr_line(&r, 40, line, sizeof line);
    assert_string_equal(line, "lr schedule: warmup 5 steps to 0.001, constant to step 90, then minus_sqrt decay to "
                              "0.0001 at step 100 (optimizer.schedule.decay_steps); this run's last step, 40, uses "
                              "lr 0.001");
    /* the decay reached within the run: no warning */
    r.optimizer.decay_steps = 45;
    assert_int_equal(notes_of(&r).count, 0);
    /* a warmup that outlasts the run (allowed with decay_steps given) */
    r = base();
    r.optimizer.decay_steps = 100;
    r.optimizer.warmup_steps = 50;
    notes = notes_of(&r);
    expect_one(&notes, "the warmup (50 steps) ends after this run's last step (40), which uses lr 0.00078, below "
               "optimizer.lr 0.001", NULL);
    /* a cosine decay past the end is only summed up */
    r.optimizer.warmup_steps = 5;
    assert_int_equal(notes_of(&r).count, 0);
    r = base();
    run_notes_lr_line(&r, 40, line, sizeof line);
    assert_string_equal(line, "lr schedule: warmup 5 steps to 0.001, then cosine decay to 0.0001 at step 40 "
                              "(train.steps); this run's last step, 40, uses lr 0.0001018");
}

static void test_batch_stage_past_the_end(void **state) {
    (void)state;
    Recipe r = base();
    r.train.num_batch_stages = 3;
    r.train.batch_stages[1] = (BatchStage){.start = 39, .global_batch_size = 8};  /* the last step's */
    r.train.batch_stages[2] = (BatchStage){.start = 40, .global_batch_size = 16}; /* after it */
    RunNotes notes = notes_of(&r);
    expect_one(&notes, "train.batch_schedule[2] (step 40, global batch size 16) starts after this run's last step "
               "(40; a stage at step N applies from the logged step N + 1): it never applies", NULL);
    assert_true(notes.line[0]); /* a line, not a warning: a short run of a longer recipe is no mistake */
    /* token form: 39 steps of 4 x 32 tokens come before the last step */
    r.train.batch_stages_in_tokens = true;
    r.train.batch_stages[1].start = 39 * 128;
    r.train.batch_stages[2].start = 39 * 128 + 1;
    notes = notes_of(&r);
    expect_one(&notes, "stage 2 (from 4993 tokens, global batch size 16) starts after the 4992 tokens", NULL);
    /* stages train.rampup_batch_size made (the recipe has no batch_schedule): the ramp's key, in one note however many
     * of its stages lie past the end */
    r = base();
    r.train.rampup[0] = 4, r.train.rampup[1] = 4, r.train.rampup[2] = 100000;
    r.train.batch_stages_in_tokens = true;
    r.train.num_batch_stages = 20;
    for (int k = 0; k < 20; k++) r.train.batch_stages[k] = (BatchStage){k * 5000.0 * 32, 4 + 4 * k};
    r.train.batch_stages[1].start = 10 * 128; /* reached within the run's 40 steps */
    notes = notes_of(&r);
    expect_one(&notes, "train.rampup_batch_size: stages 2 to 19 (global batch size 12 to 80, from 320000 tokens) "
               "start after the", "never apply", NULL);
    assert_true(notes.line[0]);
}

/* A capacity_factor of at least E / k drops nothing (each expert's capacity holds all the tokens): said as a line;
 * below it, and for a dense model, nothing. */
static void test_capacity_that_drops_nothing(void **state) {
    (void)state;
    Recipe r = base();
    r.model.family = FAMILY_QWEN3_MOE;
    r.model.moe.num_experts = 8;
    r.model.moe.num_experts_per_tok = 2;
    r.model.moe.capacity_factor = 4.0;
    RunNotes notes = {0};
    run_notes_model(&r, &notes);
    expect_one(&notes, "model.moe.capacity_factor 4 is at least num_experts / num_experts_per_tok (8 / 2)",
               "no token is dropped", NULL);
    assert_true(notes.line[0]);
    r.model.moe.capacity_factor = 3.99;
    notes = (RunNotes){0};
    run_notes_model(&r, &notes);
    assert_int_equal(notes.count, 0);
    r.model.moe.capacity_factor = 4.0;
    r.model.family = FAMILY_LLAMA;
    run_notes_model(&r, &notes);
    assert_int_equal(notes.count, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_run_has_none),
        cmocka_unit_test(test_prefix_twice),
        cmocka_unit_test(test_prefix_twice_through_a_link),
        cmocka_unit_test(test_valid_is_train_or_unread),
        cmocka_unit_test(test_schedule_past_the_end),
        cmocka_unit_test(test_batch_stage_past_the_end),
        cmocka_unit_test(test_capacity_that_drops_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
