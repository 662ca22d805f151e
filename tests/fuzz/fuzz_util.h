/* fuzz_util.h: helpers shared by the libFuzzer harnesses (header-only): a
 * scratch directory for parsers that read files, writing and clearing it,
 * resealing checkpoint metadata, and stopping on a broken invariant. */
#ifndef MT_FUZZ_UTIL_H
#define MT_FUZZ_UTIL_H

#include <dirent.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt_format.h"
#include "core/crc32c.h"

/* A harness's own check failed: print why and abort, which libFuzzer
 * records as a crash with the input that caused it. */
static void fuzz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fuzz_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("fuzz harness: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

static char fuzz_dir_path[256];

/* Remove the plain files of the scratch directory (it holds nothing else). */
static inline void fuzz_clear_dir(void) {
    DIR *dir = opendir(fuzz_dir_path);
    if (!dir) return;
    char path[600];
    for (struct dirent *e; (e = readdir(dir));) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", fuzz_dir_path, e->d_name);
        unlink(path);
    }
    closedir(dir);
}

static inline void fuzz_remove_dir(void) {
    fuzz_clear_dir();
    rmdir(fuzz_dir_path);
}

/* The scratch directory, made on first use in /dev/shm (else $TMPDIR or
 * /tmp) and removed when the process exits normally. */
static inline const char *fuzz_dir(void) {
    if (fuzz_dir_path[0]) return fuzz_dir_path;
    const char *base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/megatrain-fuzz-XXXXXX", base);
    if (!mkdtemp(fuzz_dir_path)) fuzz_fail("cannot make a scratch directory in %s", base);
    atexit(fuzz_remove_dir);
    return fuzz_dir_path;
}

/* Write len bytes to `name` in the scratch directory; returns its path (static). */
static inline const char *fuzz_write(const char *name, const void *data, size_t len) {
    static char path[600];
    snprintf(path, sizeof path, "%s/%s", fuzz_dir(), name);
    FILE *f = fopen(path, "wb");
    if (!f || (len && fwrite(data, 1, len, f) != len) || fclose(f) != 0) fuzz_fail("cannot write %s", path);
    return path;
}

/* Give checkpoint metadata the body length and CRC of its body, so that a
 * mutated body is judged by its content, not rejected by its checksum. */
static inline void fuzz_reseal(unsigned char *data, size_t len) {
    if (len < CKPT_HEADER_BYTES) return;
    uint32_t crc = crc32c(0, data + CKPT_HEADER_BYTES, len - CKPT_HEADER_BYTES);
    for (int i = 0; i < 4; i++) data[12 + i] = (unsigned char)(crc >> (8 * i));
    uint64_t body = len - CKPT_HEADER_BYTES;
    for (int i = 0; i < 8; i++) data[16 + i] = (unsigned char)(body >> (8 * i));
}

/* Little-endian u32 at p. */
static inline uint32_t fuzz_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#endif
