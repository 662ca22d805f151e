/* error.c: fatal errors, warnings, log lines and checked allocation. */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mt_log_enabled = 1;
int mt_lead_rank = 1;

/* Each message is formatted whole and written with one call under its stream's lock (flockfile): a line of the
 * checkpoint writer thread never lands inside one of the main thread's, nor (stderr being unbuffered, where each
 * fputs was a write of its own) one of another rank's inside this one's. */
static void print_line(FILE *f, const char *prefix, const char *fmt, va_list ap) {
    char stack[2048], *line = stack;
    const size_t plen = strlen(prefix);
    va_list copy;
    va_copy(copy, ap);
    const int n = vsnprintf(NULL, 0, fmt, copy);
    va_end(copy);
    size_t len = plen + (n > 0 ? (size_t)n : 0) + 1;
    if (len + 1 > sizeof stack && !(line = malloc(len + 1))) { /* no memory: the message cut to the stack's size */
        line = stack;
        len = sizeof stack - 1;
    }
    memcpy(line, prefix, plen);
    vsnprintf(line + plen, len - plen, fmt, ap);
    line[len - 1] = '\n';
    fflush(stdout);
    flockfile(f);
    fwrite(line, 1, len, f);
    fflush(f);
    funlockfile(f);
    if (line != stack) free(line);
}

static void print_error(const char *fmt, va_list ap) { print_line(stderr, "megatrain: error: ", fmt, ap); }

void mt_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    print_error(fmt, ap);
    va_end(ap);
}

void mt_die(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    print_error(fmt, ap);
    va_end(ap);
    exit(status);
}

void mt_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    print_line(stderr, "megatrain: warning: ", fmt, ap);
    va_end(ap);
}

void mt_log_warn(const char *fmt, ...) {
    if (!mt_lead_rank) return;
    va_list ap;
    va_start(ap, fmt);
    print_line(stderr, "megatrain: warning: ", fmt, ap);
    va_end(ap);
}

void mt_log(const char *fmt, ...) {
    if (!mt_log_enabled) return;
    va_list ap;
    va_start(ap, fmt);
    print_line(stdout, "", fmt, ap);
    va_end(ap);
}

void *mt_malloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) mt_die(MT_EXIT_FAILURE, "out of memory allocating %zu bytes", bytes);
    return p;
}

void *mt_calloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (!p) mt_die(MT_EXIT_FAILURE, "out of memory allocating %zu x %zu bytes", count, size);
    return p;
}

void *mt_realloc(void *ptr, size_t bytes) {
    void *p = realloc(ptr, bytes ? bytes : 1);
    if (!p) mt_die(MT_EXIT_FAILURE, "out of memory allocating %zu bytes", bytes);
    return p;
}

void *mt_grow(void *buf, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return buf;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    *cap = c;
    return mt_realloc(buf, c * size);
}

char *mt_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = mt_malloc(n);
    memcpy(p, s, n);
    return p;
}

void mt_set_error(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}
