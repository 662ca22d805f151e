/* whole_append.c: records appended whole or not at all, and written again after a full disk (whole_append.h). */
#include "whole_append.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/error.h"
#include "../core/fs.h"

WholeAppender whole_appender(int fd, const char *name, const char *records) {
    return (WholeAppender){.fd = fd, .name = name, .records = records, .gap_first = -1};
}

/* MEGATRAIN_TEST_FULL_DISK_STEPS=A-B: whether `step` is one of those the test's full disk refuses. */
static bool test_disk_full(long step) {
    const char *env = getenv("MEGATRAIN_TEST_FULL_DISK_STEPS");
    if (!env || !*env) return false;
    char *end;
    const long first = strtol(env, &end, 10);
    if (*end != '-') return false;
    const long last = strtol(end + 1, &end, 10);
    return *end == '\0' && step >= first && step <= last;
}

/* Write the record at the file's end: 0, or the errno of the failure (the file may hold part of the record). */
static int write_record(int fd, const void *data, size_t len, long step) {
    if (test_disk_full(step)) {
        if (mt_write_all(fd, data, len / 2) != 0) return errno ? errno : EIO;
        return ENOSPC;
    }
    return mt_write_all(fd, data, len) == 0 ? 0 : errno ? errno : EIO;
}

int whole_append(WholeAppender *w, const void *data, size_t len, long step) {
    if (w->fd < 0 || w->dead) {
        w->lost++;
        return -1;
    }
    struct stat st;
    const bool sized = fstat(w->fd, &st) == 0;
    errno = 0;
    const int failed = write_record(w->fd, data, len, step);
    if (failed == 0) {
        if (w->gap_first >= 0) {
            if (w->gap_first == w->gap_last)
                mt_warn("%s: writing again from step %ld; step %ld is missing", w->name, step, w->gap_first);
            else
                mt_warn("%s: writing again from step %ld; steps %ld-%ld are missing", w->name, step, w->gap_first,
                        w->gap_last);
            w->gap_first = -1;
        }
        return 0;
    }
    w->lost++;
    const bool cut = sized && ftruncate(w->fd, st.st_size) == 0; /* the part of the record that was written */
    if (!cut) {
        w->dead = true;
        mt_warn("%s: cannot write step %ld: %s; no more %s (the file could not be cut back to its last whole one)",
                w->name, step, strerror(failed), w->records);
    } else if (w->gap_first < 0) {
        mt_warn("%s: cannot write step %ld: %s; trying again at each logged step", w->name, step, strerror(failed));
    }
    if (w->gap_first < 0) w->gap_first = step;
    w->gap_last = step;
    return -1;
}
