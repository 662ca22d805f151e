/* ckpt_codec.c: filter + zstd for one chunk, and the checks on the way back. */
#include "ckpt_codec.h"

#include <string.h>

#include "../core/error.h"
#include "../core/crc32c.h"

size_t ckpt_chunk_bound(size_t raw_bytes) { return ZSTD_compressBound(raw_bytes); }

void ckpt_shuffle4(const unsigned char *in, unsigned char *out, size_t n) {
    const size_t words = n / 4;
    for (size_t i = 0; i < words; i++) {
        out[i] = in[4 * i];
        out[words + i] = in[4 * i + 1];
        out[2 * words + i] = in[4 * i + 2];
        out[3 * words + i] = in[4 * i + 3];
    }
}

void ckpt_unshuffle4(const unsigned char *in, unsigned char *out, size_t n) {
    const size_t words = n / 4;
    for (size_t i = 0; i < words; i++) {
        out[4 * i] = in[i];
        out[4 * i + 1] = in[words + i];
        out[4 * i + 2] = in[2 * words + i];
        out[4 * i + 3] = in[3 * words + i];
    }
}

int ckpt_chunk_encode(ZSTD_CCtx *cctx, int level, CkptFilter filter, const void *raw, size_t raw_bytes, void *scratch,
                      void *dst, size_t *stored_bytes, uint32_t *crc, char *err, size_t errlen) {
    *crc = crc32c(0, raw, raw_bytes);
    const void *src = raw;
    if (filter == CKPT_FILTER_SHUFFLE4) {
        ckpt_shuffle4(raw, scratch, raw_bytes);
        src = scratch;
    }
    size_t n = ZSTD_compressCCtx(cctx, dst, ckpt_chunk_bound(raw_bytes), src, raw_bytes, level);
    if (ZSTD_isError(n)) {
        mt_set_error(err, errlen, "zstd compression failed: %s", ZSTD_getErrorName(n));
        return -1;
    }
    *stored_bytes = n;
    return 0;
}

int ckpt_chunk_decode(ZSTD_DCtx *dctx, const CkptChunk *chunk, const void *stored, void *raw, void *scratch,
                      char *err, size_t errlen) {
    void *dst = chunk->filter == CKPT_FILTER_SHUFFLE4 ? scratch : raw;
    size_t n = ZSTD_decompressDCtx(dctx, dst, chunk->raw_bytes, stored, chunk->stored_bytes);
    if (ZSTD_isError(n)) {
        mt_set_error(err, errlen, "zstd frame does not decode (%s)", ZSTD_getErrorName(n));
        return -1;
    }
    if (n != chunk->raw_bytes) {
        mt_set_error(err, errlen, "zstd frame holds %zu bytes, %llu expected", n, (unsigned long long)chunk->raw_bytes);
        return -1;
    }
    if (chunk->filter == CKPT_FILTER_SHUFFLE4) ckpt_unshuffle4(scratch, raw, n);
    uint32_t crc = crc32c(0, raw, n);
    if (crc != chunk->crc32c) {
        mt_set_error(err, errlen, "checksum mismatch (stored %08x, computed %08x)", chunk->crc32c, crc);
        return -1;
    }
    return 0;
}
