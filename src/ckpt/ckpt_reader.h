/* ckpt_reader.h: reading a checkpoint directory: its metadata, any region of
 * any stored tensor (the intersection of the region with the stored chunks,
 * so one layout can load another's checkpoint), and checksum verification. */
#ifndef MT_CKPT_CKPT_READER_H
#define MT_CKPT_CKPT_READER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <zstd.h>

#include "../config/recipe.h"
#include "ckpt_format.h"

#define CKPT_MAX_METADATA_BYTES ((size_t)1 << 30) /* a larger metadata.mtck is refused unread */

/* What reading one chunk needs: a zstd context and buffers. */
typedef struct CkptChunkBuffers {
    ZSTD_DCtx *dctx;                        /* created on first use */
    unsigned char *stored, *raw, *scratch; /* buffers for one chunk */
    unsigned char *converted;               /* a chunk converted to another dtype */
    size_t stored_cap, raw_cap, scratch_cap, converted_cap;
} CkptChunkBuffers;

typedef struct CkptReader {
    char dir[MT_PATH_MAX];
    CkptMeta meta;
    int *fds;                    /* per listed file, opened on first use (-1 before) */
    CkptChunkBuffers buf;        /* reads of one chunk; buf.raw keeps the last (raw_tensor, raw_chunk) */
    const CkptTensorMeta *raw_tensor;       /* buf.raw holds chunk raw_chunk of it, verified (NULL: nothing) */
    int raw_chunk;
    CkptChunkBuffers *workers;   /* a read across several chunks decodes them on the OpenMP threads, one set each */
    int num_workers;
} CkptReader;

/* Open checkpoint `dir`: decode metadata.mtck, check that every listed file
 * exists with its recorded size, and verify the CRC of the small files
 * (model.yaml, recipe.yaml); the hf files are checked when read
 * (ckpt_hf_files_read). Returns the reader, or NULL with err saying
 * what is missing or corrupt (prefixed with the directory). */
CkptReader *ckpt_reader_open(const char *dir, char *err, size_t errlen);

/* Like ckpt_reader_open without checking the listed files (inspect checks
 * them one by one and still lists the tensors of a damaged checkpoint). */
CkptReader *ckpt_reader_open_metadata(const char *dir, char *err, size_t errlen);

/* Check listed file `index`: present, of its recorded size, and (when
 * with_crc) its CRC. Returns 0 or -1 with err. */
int ckpt_reader_check_file(CkptReader *r, int index, bool with_crc, char *err, size_t errlen);
void ckpt_reader_close(CkptReader *r);

/* Read the region [start, start + shape) of tensor t into dst (row-major,
 * the region's shape, fp32), verifying each chunk it touches (several at
 * once on the OpenMP threads when it touches several). Returns 0, or -1
 * with err naming the file, the tensor and the first chunk that failed. */
int ckpt_reader_read(CkptReader *r, const CkptTensorMeta *t, const int64_t *start, const int64_t *shape, float *dst,
                     char *err, size_t errlen);
/* The same into dst of `dtype` (fp32: float, bf16: uint16_t bits), whatever
 * t's dtype: bf16 -> fp32 widens exactly, fp32 -> bf16 rounds to nearest,
 * ties to even (src/core/float16.h). */
int ckpt_reader_read_as(CkptReader *r, const CkptTensorMeta *t, const int64_t *start, const int64_t *shape,
                        CkptDType dtype, void *dst, char *err, size_t errlen);

/* Decode every chunk of tensor t and check its CRC. Returns 0 or -1 with err. */
int ckpt_reader_verify_tensor(CkptReader *r, const CkptTensorMeta *t, char *err, size_t errlen);

/* Verify the CRC of the whole of listed file `index`. Returns 0 or -1 with err. */
int ckpt_reader_verify_file(CkptReader *r, int index, char *err, size_t errlen);

/* Sum of the stored / raw bytes of a tensor's chunks. */
uint64_t ckpt_tensor_stored_bytes(const CkptTensorMeta *t);
uint64_t ckpt_tensor_raw_bytes(const CkptTensorMeta *t);

/* Path of a listed file of `dir` into out. */
void ckpt_file_path(char *out, size_t outlen, const char *dir, const char *name);

#endif
