/* tb_writer.h: a TensorBoard event file,
 * run.dir/tensorboard/events.out.tfevents.<unix time>.<host>.megatrain,
 * with scalars appended and flushed step by step. */
#ifndef MT_OBS_TB_WRITER_H
#define MT_OBS_TB_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "whole_append.h"

typedef struct TbWriter {
    FILE *file;           /* written through out (write(2) on its descriptor, never stdio's buffer) */
    WholeAppender out;    /* a step's events whole or not at all, written again after a full disk */
    uint8_t *pending;     /* the framed records since the last flush */
    size_t len, cap;
    size_t keep;          /* the file's first two events, kept in pending until they are written */
    int64_t step;         /* of the pending records */
    bool oversize_said;   /* an event too large to frame was warned about */
} TbWriter;

/* Create run_dir/tensorboard and a new event file starting with the
 * file_version event and a session start at first_step (the first step
 * this process logs: 1, or a resumed checkpoint's step + 1), which makes
 * TensorBoard drop what earlier event files hold of first_step and later
 * (the steps a resumed run trains again; an earlier run's that died before
 * its first checkpoint). Returns 0, or -1 with err set. */
int tb_open(TbWriter *w, const char *run_dir, int64_t first_step, char *err, size_t errlen);

/* Add one scalar event (wall time now) to the step's pending records. No-op when not open. */
void tb_scalar(TbWriter *w, const char *tag, int64_t step, double value);

/* Append the pending records to the file, all of them or none (whole_append.h: a full disk loses that step's
 * events, warned about, and the next step's flush tries again; the file never ends inside a record). */
void tb_flush(TbWriter *w);
void tb_close(TbWriter *w);

#endif
