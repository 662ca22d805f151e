/* ckpt_codec.h: one chunk's bytes to and from its stored form: an optional
 * byte-plane filter (shuffle4, which groups the 1st, 2nd, 3rd and 4th bytes
 * of every 4-byte word so that fp32 exponents sit together and compress),
 * then one zstd frame. The CRC-32C is taken over the raw bytes. */
#ifndef MT_CKPT_CKPT_CODEC_H
#define MT_CKPT_CKPT_CODEC_H

#include <stddef.h>
#include <stdint.h>
#include <zstd.h>

#include "ckpt_format.h"

/* Bytes the stored form of `raw_bytes` raw bytes may need. */
size_t ckpt_chunk_bound(size_t raw_bytes);

/* Encode raw[0..raw_bytes) into dst (capacity ckpt_chunk_bound). `scratch`
 * holds raw_bytes (used by the filter). Sets *stored_bytes and *crc.
 * Returns 0, or -1 with err set. */
int ckpt_chunk_encode(ZSTD_CCtx *cctx, int level, CkptFilter filter, const void *raw, size_t raw_bytes, void *scratch,
                      void *dst, size_t *stored_bytes, uint32_t *crc, char *err, size_t errlen);

/* Decode `stored` (the chunk's frame) into raw (chunk->raw_bytes) and check
 * its size and CRC. `scratch` holds raw_bytes. Returns 0, or -1 with err
 * saying what is wrong ("checksum mismatch ...", "zstd: ..."). */
int ckpt_chunk_decode(ZSTD_DCtx *dctx, const CkptChunk *chunk, const void *stored, void *raw, void *scratch,
                      char *err, size_t errlen);

/* The shuffle4 filter and its inverse (n a multiple of 4). */
void ckpt_shuffle4(const unsigned char *in, unsigned char *out, size_t n);
void ckpt_unshuffle4(const unsigned char *in, unsigned char *out, size_t n);

#endif
