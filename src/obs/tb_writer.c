/* tb_writer.c: the TensorBoard event file of a run (see tb_writer.h): one
 * TFRecord per Event, each scalar in its own Event, the way TensorBoard's
 * own EventFileWriter writes them. A logged step's records are gathered and
 * appended together by tb_flush; a write that fails is cut back off the file
 * and the next step's flush tries again (whole_append.h); training goes on. */
#include "tb_writer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../config/recipe.h"
#include "../core/error.h"
#include "../core/fs.h"
#include "../core/timer.h"
#include "tb_encode.h"

/* Frame one event and add it to the pending records. */
static void add_event(TbWriter *w, const uint8_t *event, size_t len, int64_t step) {
    if (!w->file || len == 0) return;
    uint8_t record[1024];
    const size_t n = tb_frame_record(record, sizeof record, event, len);
    if (n == 0) {
        if (!w->oversize_said) mt_warn("tensorboard: an event of step %lld is too large to write; dropped", (long long)step);
        w->oversize_said = true;
        return;
    }
    if (w->len + n > w->cap) {
        w->cap = (w->len + n) * 2;
        w->pending = mt_realloc(w->pending, w->cap);
    }
    memcpy(w->pending + w->len, record, n);
    w->len += n;
    w->step = step;
}

int tb_open(TbWriter *w, const char *run_dir, int64_t first_step, char *err, size_t errlen) {
    *w = (TbWriter){0};
    char dir[MT_PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/tensorboard", run_dir);
    if (mt_make_dirs(dir, err, errlen) != 0) return -1;
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    char path[MT_PATH_MAX + 400];
    snprintf(path, sizeof path, "%s/events.out.tfevents.%lld.%s.megatrain", dir, (long long)time(NULL), host);
    w->file = fopen(path, "ab");
    if (!w->file) {
        mt_set_error(err, errlen, "%s: cannot create the tensorboard event file: %s", path, strerror(errno));
        return -1;
    }
    w->out = whole_appender(fileno(w->file), "tensorboard event file", "events");
    uint8_t event[64];
    const double now = mt_unix_time();
    add_event(w, event, tb_encode_file_version_event(event, sizeof event, now), first_step);
    add_event(w, event, tb_encode_session_start_event(event, sizeof event, now, first_step), first_step);
    w->keep = w->len; /* a file without them reads as another run's: they go out with the first flush that succeeds */
    tb_flush(w);
    return 0;
}

void tb_scalar(TbWriter *w, const char *tag, int64_t step, double value) {
    if (!w || !w->file) return;
    uint8_t event[512];
    add_event(w, event, tb_encode_scalar_event(event, sizeof event, mt_unix_time(), step, tag, (float)value), step);
}

void tb_flush(TbWriter *w) {
    if (!w || !w->file || w->len == 0) return;
    const bool written = whole_append(&w->out, w->pending, w->len, (long)w->step) == 0;
    w->len = written ? 0 : w->keep; /* a step's scalars that could not be written are dropped */
    if (written) w->keep = 0;
}

void tb_close(TbWriter *w) {
    if (w && w->file) {
        fclose(w->file);
        w->file = NULL;
    }
    if (w) {
        free(w->pending);
        w->pending = NULL;
        w->len = w->cap = w->keep = 0;
    }
}
