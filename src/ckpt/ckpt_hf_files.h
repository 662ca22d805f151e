/* ckpt_hf_files.h: what the writer asks of a carried file's name (private
 * to src/ckpt; the type and the reading functions are in checkpoint.h). */
#ifndef MT_CKPT_CKPT_HF_FILES_H
#define MT_CKPT_CKPT_HF_FILES_H

#include <stdbool.h>

/* One of ckpt_hf_carried_names (checkpoint.h). */
bool ckpt_hf_file_name_ok(const char *name);

#endif
