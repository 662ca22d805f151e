/* ckpt_base.h: the frozen base a checkpoint references (record BASE) as the
 * loaders of ckpt_api.c reach it: checked against its recorded
 * metadata.mtck CRC, then opened like any checkpoint. Private to src/ckpt;
 * the public side is in checkpoint.h (ckpt_base_ref_of, ckpt_check_base). */
#ifndef MT_CKPT_CKPT_BASE_H
#define MT_CKPT_CKPT_BASE_H

#include <stddef.h>

#include "ckpt_format.h"
#include "ckpt_reader.h"

/* Open the base `base` that checkpoint `ckpt` references, after checking that
 * its directory exists and its metadata.mtck has the recorded CRC-32C. Returns
 * the reader, or NULL with err naming ckpt, the base directory, what is wrong
 * (missing, its CRC differs, unreadable) and how to fix it. */
CkptReader *ckpt_base_open(const char *ckpt, const CkptBaseRef *base, char *err, size_t errlen);

/* The message of a base that opened but whose weights cannot be read (`why`: the tensor, the chunk), into err. */
void ckpt_base_unreadable(char *err, size_t errlen, const char *ckpt, const CkptBaseRef *base, const char *why);

#endif
