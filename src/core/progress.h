/* progress.h: a one-line progress display ("\rconvert: writing 120/291
 * tensors (41%)") for long work that is not training: convert, checkpoint
 * loads. Shown only when stderr is a terminal and the work is big enough to
 * wait for; logs that are not a terminal stay quiet. */
#ifndef MT_CORE_PROGRESS_H
#define MT_CORE_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

#define PROGRESS_MIN_BYTES (256ull << 20) /* smaller work finishes too fast to need it */

typedef struct Progress {
    bool enabled;
    const char *label;   /* "convert", "checkpoint" */
    const char *what;    /* "reading", "writing", "loading" */
    const char *unit;    /* "tensors" */
    int total;
    int last_percent;
} Progress;

/* Enabled when `wanted`, stderr is a terminal and bytes >= PROGRESS_MIN_BYTES. */
void progress_start(Progress *p, bool wanted, const char *label, const char *what, const char *unit, int total,
                    uint64_t bytes);
void progress_update(Progress *p, int done);
void progress_end(Progress *p);
/* A (ctx, done, total) callback adapter (ctx is a Progress). */
void progress_callback(void *ctx, int done, int total);

#endif
