/* tb_writer.h: a TensorBoard event file,
 * run.dir/tensorboard/events.out.tfevents.<unix time>.<host>.megatrain,
 * with scalars appended and flushed step by step. */
#ifndef MT_OBS_TB_WRITER_H
#define MT_OBS_TB_WRITER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct TbWriter {
    FILE *file;
    int failed;   /* a write failed (reported once); later writes are dropped */
} TbWriter;

/* Create run_dir/tensorboard and a new event file starting with the
 * file_version event and a session start at first_step (the first step
 * this process logs: 1, or a resumed checkpoint's step + 1), which makes
 * TensorBoard drop what earlier event files hold of first_step and later
 * (the steps a resumed run trains again; an earlier run's that died before
 * its first checkpoint). Returns 0, or -1 with err set. */
int tb_open(TbWriter *w, const char *run_dir, int64_t first_step, char *err, size_t errlen);

/* Append one scalar event (wall time now). No-op when not open. */
void tb_scalar(TbWriter *w, const char *tag, int64_t step, double value);

void tb_flush(TbWriter *w);
void tb_close(TbWriter *w);

#endif
