/* fail_fsync.c: an LD_PRELOAD for tests: fsync fails with ENOSPC (a full disk found at the last moment) on a file
 * whose path contains $FAIL_FSYNC_MATCH; every other fsync is the real one. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int fsync(int fd) {
    const char *match = getenv("FAIL_FSYNC_MATCH");
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (match && n > 0) {
        path[n] = '\0';
        if (strstr(path, match)) {
            errno = ENOSPC;
            return -1;
        }
    }
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return real(fd);
}
