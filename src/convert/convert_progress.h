/* convert_progress.h: a one-line progress display for convert, shown only
 * when stderr is a terminal and the model is big enough to wait for. */
#ifndef MT_CONVERT_CONVERT_PROGRESS_H
#define MT_CONVERT_CONVERT_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

#define CONVERT_PROGRESS_MIN_BYTES (256ull << 20) /* smaller models finish too fast to need it */

typedef struct ConvertProgress {
    bool enabled;
    const char *what;
    int total;
    int last_percent;
} ConvertProgress;

/* Enabled when `wanted`, stderr is a terminal and bytes >= CONVERT_PROGRESS_MIN_BYTES. */
void convert_progress_start(ConvertProgress *p, bool wanted, const char *what, int total, uint64_t bytes);
void convert_progress_update(ConvertProgress *p, int done);
void convert_progress_end(ConvertProgress *p);
/* StProgressFn adapter (ctx is a ConvertProgress). */
void convert_progress_callback(void *ctx, int done, int total);

#endif
