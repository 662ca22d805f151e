/* fuzz_ckpt_meta.c: libFuzzer harness for checkpoint metadata
 * (metadata.mtck, src/ckpt/ckpt_format_decode.c). The input is decoded as
 * it is (magic, version, length, checksum), then again with its header's
 * length and CRC made to match the body, so mutations reach the records. A
 * decoded metadata must find every tensor by name and encode to bytes that
 * decode and encode to the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_format.h"
#include "fuzz_util.h"

static void check(const unsigned char *data, size_t size) {
    CkptMeta meta;
    char err[1024] = "";
    if (ckpt_meta_decode(data, size, &meta, err, sizeof err) != 0) {
        if (!err[0]) fuzz_fail("ckpt_meta_decode failed without a message");
        return;
    }
    for (int i = 0; i < meta.num_tensors; i++)
        if (ckpt_meta_find(&meta, meta.tensors[i].name) != &meta.tensors[i])
            fuzz_fail("ckpt_meta_find does not find '%s'", meta.tensors[i].name);
    unsigned char *once, *twice;
    size_t once_len, twice_len;
    if (ckpt_meta_encode(&meta, &once, &once_len, err, sizeof err) != 0)
        fuzz_fail("decoded metadata does not encode: %s", err);
    CkptMeta back;
    if (ckpt_meta_decode(once, once_len, &back, err, sizeof err) != 0)
        fuzz_fail("re-encoded metadata does not decode: %s", err);
    if (ckpt_meta_encode(&back, &twice, &twice_len, err, sizeof err) != 0)
        fuzz_fail("metadata decoded twice does not encode: %s", err);
    if (once_len != twice_len || memcmp(once, twice, once_len) != 0)
        fuzz_fail("metadata changes in an encode/decode round trip");
    free(once);
    free(twice);
    ckpt_meta_free(&back);
    ckpt_meta_free(&meta);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check(data, size);
    unsigned char *sealed = malloc(size + 1);
    memcpy(sealed, data, size);
    fuzz_reseal(sealed, size);
    check(sealed, size);
    free(sealed);
    return 0;
}
