/* test_work_dir.h: a temporary work directory for cmocka group fixtures.
 * Include once per test program; use work_dir_setup / work_dir_teardown as
 * the group setup and teardown, and the path in work_dir. */
#ifndef MT_TEST_WORK_DIR_H
#define MT_TEST_WORK_DIR_H

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

static char work_dir[256];

static int work_dir_remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static int work_dir_setup(void **state) {
    (void)state;
    snprintf(work_dir, sizeof work_dir, "/tmp/megatrain_test.XXXXXX");
    return mkdtemp(work_dir) ? 0 : -1;
}

static int work_dir_teardown(void **state) {
    (void)state;
    return nftw(work_dir, work_dir_remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

#endif
