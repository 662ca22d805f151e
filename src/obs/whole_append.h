/* whole_append.h: a run's record files (metrics.jsonl's lines, a logged step's TensorBoard events) appended one
 * record at a time, whole or not at all, through a transient full disk.
 *
 * A record whose write fails (ENOSPC, EFBIG, EIO) is cut back off the file, so that the file always ends after a
 * whole record and later ones do not join a torn one; the first failure of a gap is warned about once, each later
 * record tries again, and the first one written after a gap says so with the steps that are missing:
 *
 *   megatrain: warning: metrics.jsonl: cannot write step 40: No space left on device; trying again at each logged step
 *   megatrain: warning: metrics.jsonl: writing again from step 60; steps 40-50 are missing
 *
 * A file that cannot be cut back (its end is then unknown) takes no more records.
 *
 * For tests, MEGATRAIN_TEST_FULL_DISK_STEPS=A-B makes the write of every record of steps A to B fail as a full disk
 * does midway: half the record is written, then ENOSPC. */
#ifndef MT_OBS_WHOLE_APPEND_H
#define MT_OBS_WHOLE_APPEND_H

#include <stdbool.h>
#include <stddef.h>

typedef struct WholeAppender {
    int fd;                /* opened for appending (O_APPEND) by the owner, which closes it */
    const char *name;      /* in the messages: "metrics.jsonl" */
    const char *records;   /* what a record is, in the last message: "lines", "events" */
    bool dead;             /* could not be cut back: no more records */
    long gap_first, gap_last; /* the steps whose records were lost since the last one written; gap_first -1: none */
    long lost;             /* records lost in all */
} WholeAppender;

/* An appender of `fd`; name and records must outlive it. */
WholeAppender whole_appender(int fd, const char *name, const char *records);

/* Append the `len` bytes of step `step`'s record. 0 when written, -1 when not (said as above). */
int whole_append(WholeAppender *w, const void *data, size_t len, long step);

#endif
