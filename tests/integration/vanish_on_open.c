/* vanish_on_open.c: an LD_PRELOAD for tests: the first open() of a path containing $VANISH_MATCH first removes
 * the directory $VANISH_DIR (rm -r, as a run's checkpoint retention does) and then opens as usual (so it fails
 * with ENOENT): a checkpoint deleted while a reader is at it. Every other open is the real one. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

static int done;

int open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    const mode_t mode = (flags & (O_CREAT | O_TMPFILE)) ? va_arg(ap, mode_t) : 0;
    va_end(ap);
    const char *match = getenv("VANISH_MATCH"), *dir = getenv("VANISH_DIR");
    if (!done && match && dir && strstr(path, match)) {
        done = 1;
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) return -1;
    }
    int (*real)(const char *, int, ...) = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
    return real(path, flags, mode);
}
