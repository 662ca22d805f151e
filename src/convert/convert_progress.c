/* convert_progress.c: "\rconvert: writing 120/291 tensors (41%)" on a terminal. */
#include "convert_progress.h"

#include <stdio.h>
#include <unistd.h>

void convert_progress_start(ConvertProgress *p, bool wanted, const char *what, int total, uint64_t bytes) {
    p->enabled = wanted && bytes >= CONVERT_PROGRESS_MIN_BYTES && isatty(STDERR_FILENO);
    p->what = what;
    p->total = total;
    p->last_percent = -1;
}

void convert_progress_update(ConvertProgress *p, int done) {
    if (!p->enabled || p->total <= 0) return;
    int percent = (int)(100.0 * done / p->total);
    if (percent == p->last_percent) return;
    p->last_percent = percent;
    fprintf(stderr, "\rconvert: %s %d/%d tensors (%d%%)", p->what, done, p->total, percent);
    fflush(stderr);
}

void convert_progress_end(ConvertProgress *p) {
    if (p->enabled && p->last_percent >= 0) fputc('\n', stderr);
    p->last_percent = -1;
}

void convert_progress_callback(void *ctx, int done, int total) {
    ConvertProgress *p = ctx;
    p->total = total;
    convert_progress_update(p, done);
}
