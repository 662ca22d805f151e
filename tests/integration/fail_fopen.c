/* fail_fopen.c: an LD_PRELOAD for tests: fopen of a path containing $FAIL_FOPEN_MATCH fails with EACCES (a file
 * the process may not create, found only when it opens it); every other fopen is the real one. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether path is the one to fail (errno set). */
static int refused(const char *path) {
    const char *match = getenv("FAIL_FOPEN_MATCH");
    if (!match || !*match || !strstr(path, match)) return 0;
    errno = EACCES;
    return 1;
}

FILE *fopen(const char *path, const char *mode) {
    if (refused(path)) return NULL;
    FILE *(*real)(const char *, const char *) = (FILE * (*)(const char *, const char *)) dlsym(RTLD_NEXT, "fopen");
    return real(path, mode);
}

FILE *fopen64(const char *path, const char *mode) {
    if (refused(path)) return NULL;
    FILE *(*real)(const char *, const char *) = (FILE * (*)(const char *, const char *)) dlsym(RTLD_NEXT, "fopen64");
    return real(path, mode);
}
