/* progress.c: the one-line progress display on a terminal (see progress.h). */
#include "progress.h"

#include <stdio.h>
#include <unistd.h>

void progress_start(Progress *p, bool wanted, const char *label, const char *what, const char *unit, int total,
                    uint64_t bytes) {
    p->enabled = wanted && bytes >= PROGRESS_MIN_BYTES && isatty(STDERR_FILENO);
    p->label = label;
    p->what = what;
    p->unit = unit;
    p->total = total;
    p->last_percent = -1;
}

void progress_update(Progress *p, int done) {
    if (!p->enabled || p->total <= 0) return;
    int percent = (int)(100.0 * done / p->total);
    if (percent == p->last_percent) return;
    p->last_percent = percent;
    fprintf(stderr, "\r%s: %s %d/%d %s (%d%%)", p->label, p->what, done, p->total, p->unit, percent);
    fflush(stderr);
}

void progress_end(Progress *p) {
    if (p->enabled && p->last_percent >= 0) fputc('\n', stderr);
    p->last_percent = -1;
}

void progress_callback(void *ctx, int done, int total) {
    Progress *p = ctx;
    p->total = total;
    progress_update(p, done);
}
