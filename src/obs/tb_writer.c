/* tb_writer.c: the TensorBoard event file of a run (see tb_writer.h): one
 * TFRecord per Event, each scalar in its own Event, the way TensorBoard's
 * own EventFileWriter writes them. A failed write is reported once on
 * stderr and ends the event file; training goes on. */
#include "tb_writer.h"

#include <errno.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../config/recipe.h"
#include "../core/error.h"
#include "../core/fs.h"
#include "../core/timer.h"
#include "tb_encode.h"

static void write_event(TbWriter *w, const uint8_t *event, size_t len) {
    if (!w->file || w->failed || len == 0) return;
    uint8_t record[1024];
    size_t n = tb_frame_record(record, sizeof record, event, len);
    if (n == 0 || fwrite(record, 1, n, w->file) != n) {
        fprintf(stderr, "megatrain: warning: tensorboard: cannot write the event file: %s; no more events\n",
                n == 0 ? "event too large" : strerror(errno));
        w->failed = 1;
    }
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
    uint8_t event[64];
    const double now = mt_unix_time();
    write_event(w, event, tb_encode_file_version_event(event, sizeof event, now));
    write_event(w, event, tb_encode_session_start_event(event, sizeof event, now, first_step));
    tb_flush(w);
    return 0;
}

void tb_scalar(TbWriter *w, const char *tag, int64_t step, double value) {
    if (!w || !w->file) return;
    uint8_t event[512];
    write_event(w, event, tb_encode_scalar_event(event, sizeof event, mt_unix_time(), step, tag, (float)value));
}

void tb_flush(TbWriter *w) {
    if (w && w->file && !w->failed && fflush(w->file) != 0) {
        fprintf(stderr, "megatrain: warning: tensorboard: cannot write the event file: %s; no more events\n",
                strerror(errno));
        w->failed = 1;
    }
}

void tb_close(TbWriter *w) {
    if (w && w->file) {
        fclose(w->file);
        w->file = NULL;
    }
}
