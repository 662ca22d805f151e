/* ckpt_fs.c: file-system helpers for writing and reading checkpoints. */
#include "ckpt_fs.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../core/error.h"
#include "../core/fs.h"
#include "../core/timer.h"

int ckpt_write_file(const char *path, const void *data, size_t n, char *err, size_t errlen) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        mt_set_error(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        return -1;
    }
    if (mt_write_all(fd, data, n) != 0) {
        mt_set_error(err, errlen, "%s: write failed: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (mt_sync_close(fd) != 0) {
        mt_set_error(err, errlen, "%s: fsync failed: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)ftw;
    int rc = (flag == FTW_DP) ? rmdir(path) : unlink(path);
    return (rc != 0 && errno != ENOENT) ? -1 : 0;
}

int ckpt_remove_tree(const char *path, char *err, size_t errlen) {
    struct stat st;
    if (lstat(path, &st) != 0) return 0;
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) {
        mt_set_error(err, errlen, "%s: cannot remove: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

int ckpt_read_file(const char *path, size_t max_bytes, unsigned char **data, size_t *len, char *err, size_t errlen) {
    *data = NULL;
    *len = 0;
    uint64_t size = 0;
    int fd = mt_open_regular(path, NULL, &size, err, errlen); /* a FIFO is refused, not waited on */
    if (fd < 0) return -1;
    if (size > max_bytes) {
        mt_set_error(err, errlen, "%s: larger than expected", path);
        close(fd);
        return -1;
    }
    size_t n = (size_t)size;
    unsigned char *buf = mt_malloc(n ? n : 1);
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r < 0) mt_env_error_note(errno);
            mt_set_error(err, errlen, "%s: read failed: %s", path, r < 0 ? strerror(errno) : "file shrank");
            free(buf);
            close(fd);
            return -1;
        }
        got += (size_t)r;
    }
    close(fd);
    *data = buf;
    *len = n;
    return 0;
}

void ckpt_test_slow_point(void) { mt_test_delay("MEGATRAIN_TEST_SLOW_SAVE_MS"); }
