/* test_ckpt_run.c: the checkpoints of a run: run-level saves update the
 * latest pointer, apply retention (keep_last, keep_every) and remove what
 * killed saves and deletions left; the async saver writes the state as it
 * was at save() while the caller changes it, and a failed write (sync or in
 * the background) is reported with the step and the path. */
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
        assert_int_equal(ckpt_save_run(ck, step, &p, &recipe.checkpoint, NULL, err, sizeof err), 0);
        long latest = -1;
        assert_int_equal(ckpt_read_latest(ck, &latest), 0);
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
    assert_int_equal(ckpt_read_latest(ck, &latest), 0);
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_save_run_latest_retention_leftovers),
        cmocka_unit_test(test_async_saver_snapshots_state),
        cmocka_unit_test(test_failed_save_reported),
    };
    return cmocka_run_group_tests(tests, ckpt_test_setup, ckpt_test_teardown);
}
