/* test_ckpt_run.c: the checkpoints of a run: run-level saves update the
 * latest pointer, apply retention (keep_last, keep_every) and remove what
 * killed saves and deletions left; the async saver writes the state as it
 * was at save() while the caller changes it, and a failed write (sync or in
 * the background) is reported with the step and the path; a pointer that
 * holds no step number is told apart from a missing one, with what it holds. */
#include <fcntl.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "ckpt/checkpoint.h"
#include "ckpt/ckpt_fs.h"
#include "ckpt/ckpt_async.h"
#include "ckpt/ckpt_run.h"
#include "ckpt/ckpt_writer.h"
#include "core/fs.h"
#include "test_ckpt_util.h"

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

static void test_save_run_latest_retention_leftovers(void **state) {
    (void)state;
    Saved s;
    make_saved(&s, 7);
    char ck[512], path[700], err[2048];
    snprintf(ck, sizeof ck, "%s/run/checkpoints", work);
    assert_int_equal(mt_make_dirs(ck, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/iter_0000070.tmp.999", ck); /* a killed save */
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/iter_0000070.tmp.999/shard_00000.zst", ck);
    close(open(path, O_CREAT | O_WRONLY, 0644));
    snprintf(path, sizeof path, "%s/iter_0000005.deleting", ck); /* a killed deletion */
    mkdir(path, 0755);

    int num_sources;
    CkptSource *sources = ckpt_sources_from_model(s.model, s.model->params, s.opt.m, s.opt.v, &num_sources);
    for (long step = 10; step <= 60; step += 10) {
        s.state.step = step;
        CkptPayload p = {.num_sources = num_sources, .sources = sources, .model_config = &recipe.model,
                         .recipe = &recipe, .has_state = true, .state = train_ckpt_state(&s.state, step, &recipe),
                         .iteration = step, .compression_level = 1, .filter = CKPT_FILTER_SHUFFLE4, .threads = 1};
        assert_int_equal(ckpt_save_run(ck, step, &p, NULL, err, sizeof err), 0);
        assert_true(ckpt_apply_retention(ck, recipe.checkpoint.keep_last, recipe.checkpoint.keep_every, err,
                                         sizeof err) >= 0);
        long latest = -1;
        char found[128];
        assert_int_equal(ckpt_read_latest(ck, &latest, found, sizeof found), 0);
        assert_int_equal(latest, step);
    }
    long *steps = NULL;
    int n = ckpt_list_steps(ck, &steps, err, sizeof err);
    assert_int_equal(n, 3); /* keep_last 2 (50, 60) + keep_every 30 (30) */
    assert_int_equal(steps[0], 30);
    assert_int_equal(steps[1], 50);
    assert_int_equal(steps[2], 60);
    free(steps);
    snprintf(path, sizeof path, "%s/iter_0000070.tmp.999", ck);
    assert_false(exists(path));
    snprintf(path, sizeof path, "%s/iter_0000005.deleting", ck);
    assert_false(exists(path));
    free(sources);
    free_saved(&s);
}

static void test_async_saver_snapshots_state(void **state) {
    (void)state;
    Saved s;
    make_saved(&s, 8);
    Saved copy;
    make_saved(&copy, 8); /* the same bits, kept to compare */
    char ck[512], dir[600], err[2048];
    snprintf(ck, sizeof ck, "%s/async/checkpoints", work);
    CkptSaver *saver = ckpt_saver_create(ck, &recipe);
    assert_int_equal(saver_save(saver, &s, err, sizeof err), 0);
    /* The loop goes on changing everything while the writer works. */
    memset(s.model->params, 0, (size_t)s.model->num_floats * 4);
    memset(s.opt.m, 0, (size_t)s.model->num_floats * 4);
    s.opt.step++;
    s.state.step = 18;
    assert_int_equal(saver_save(saver, &s, err, sizeof err), 0);
    assert_int_equal(ckpt_saver_last_step(saver), 18);
    assert_int_equal(ckpt_saver_wait(saver, err, sizeof err), 0);
    ckpt_saver_free(saver);
    snprintf(dir, sizeof dir, "%s/iter_0000017", ck);
    expect_loads_equal(dir, &copy);
    long latest;
    char found[128];
    assert_int_equal(ckpt_read_latest(ck, &latest, found, sizeof found), 0);
    assert_int_equal(latest, 18);
    free_saved(&s);
    free_saved(&copy);
}

static void test_failed_save_reported(void **state) {
    (void)state;
    Saved s;
    make_saved(&s, 9);
    char blocker[512], ck[600], err[2048];
    snprintf(blocker, sizeof blocker, "%s/not_a_dir", work);
    close(open(blocker, O_CREAT | O_WRONLY, 0644));
    snprintf(ck, sizeof ck, "%s/checkpoints", blocker);
    for (int async = 0; async <= 1; async++) {
        recipe.checkpoint.async = async;
        CkptSaver *saver = ckpt_saver_create(ck, &recipe);
        err[0] = '\0';
        int rc = saver_save(saver, &s, err, sizeof err);
        if (async) {
            assert_int_equal(rc, 0); /* the failure comes from the background */
            assert_int_equal(ckpt_saver_wait(saver, err, sizeof err), -1);
            assert_int_equal(ckpt_saver_poll(saver, err + 1000, 1000), 0); /* reported once */
        } else {
            assert_int_equal(rc, -1);
        }
        if (!strstr(err, "checkpoint at step 17 failed") || !strstr(err, "not_a_dir"))
            fail_msg("unexpected error: %s", err);
        ckpt_saver_free(saver);
    }
    recipe.checkpoint.async = true;
    free_saved(&s);
}

/* The latest pointer: a step number (with a newline or not); anything else
 * is -2 with what it holds, escaped and shortened, for the warning. */
static void test_latest_pointer_contents(void **state) {
    (void)state;
    char ck[512], path[600], err[512], found[128];
    snprintf(ck, sizeof ck, "%s/pointer", work);
    assert_int_equal(mt_make_dirs(ck, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/%s", ck, CKPT_LATEST_FILE);
    long step = -1;
    assert_int_equal(ckpt_read_latest(ck, &step, found, sizeof found), -1); /* absent */
    static const struct {
        const char *text;
        size_t len;
        long step;           /* -1: not a step */
        const char *found;
    } cases[] = {
        {"40\n", 3, 40, NULL},
        {"7", 1, 7, NULL},
        {"twenty\n", 7, -1, "'twenty'"},
        {"40 41\n", 6, -1, "'40 41'"},
        {"-3\n", 3, -1, "'-3'"},
        {"", 0, -1, "nothing (an empty file)"},
        {"1\0\x01z", 4, -1, "'1\\x00\\x01z'"},
        {"99999999999999999999999\n", 24, -1, "'99999999999999999999999'"},
        {"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", 72, -1,
         "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(cases[i].text, 1, cases[i].len, f), cases[i].len);
        fclose(f);
        step = -1;
        found[0] = '\0';
        int rc = ckpt_read_latest(ck, &step, found, sizeof found);
        if (cases[i].step >= 0) {
            assert_int_equal(rc, 0);
            assert_int_equal(step, cases[i].step);
        } else {
            assert_int_equal(rc, -2);
            assert_int_equal(step, -1);
            assert_string_equal(found, cases[i].found);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_save_run_latest_retention_leftovers),
        cmocka_unit_test(test_async_saver_snapshots_state),
        cmocka_unit_test(test_failed_save_reported),
        cmocka_unit_test(test_latest_pointer_contents),
    };
    return cmocka_run_group_tests(tests, ckpt_test_setup, ckpt_test_teardown);
}
