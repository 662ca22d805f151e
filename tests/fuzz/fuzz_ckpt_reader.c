/* fuzz_ckpt_reader.c: libFuzzer harness for reading a checkpoint directory
 * (src/ckpt/ckpt_reader.c and ckpt_codec.c: the listed files, zstd frames,
 * filters, CRCs, regions of tensors). Input: a little-endian u32 L, L bytes
 * of metadata.mtck (resealed: see fuzz_ckpt_meta.c), then the bytes of the
 * files the metadata lists, in its order, each as long as it records (the
 * last ones shorter or missing when the input ends). Every file and tensor
 * of a checkpoint that opens is verified; every fp32 tensor is read whole
 * and as a region one element in from its start. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_reader.h"
#include "fuzz_util.h"

#define MAX_READ_ELEMENTS ((int64_t)1 << 22)

static void read_tensors(CkptReader *r) {
    char err[2048];
    for (int i = 0; i < r->meta.num_files; i++) (void)ckpt_reader_verify_file(r, i, err, sizeof err);
    for (int i = 0; i < r->meta.num_tensors; i++) {
        const CkptTensorMeta *t = &r->meta.tensors[i];
        if (ckpt_reader_verify_tensor(r, t, err, sizeof err) != 0 && !err[0])
            fuzz_fail("verify of '%s' failed without a message", t->name);
        int64_t numel = ckpt_numel(t->ndim, t->shape);
        if (numel < 1 || numel > MAX_READ_ELEMENTS) continue;
        float *dst = malloc((size_t)numel * sizeof(float));
        int64_t start[CKPT_MAX_DIMS] = {0}, shape[CKPT_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        (void)ckpt_reader_read(r, t, start, shape, dst, err, sizeof err);
        for (int d = 0; d < t->ndim; d++)
            if (shape[d] > 1) start[d] = 1, shape[d] -= 1;
        (void)ckpt_reader_read(r, t, start, shape, dst, err, sizeof err);
        free(dst);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4) return 0;
    size_t meta_len = fuzz_u32(data);
    if (meta_len > size - 4) meta_len = size - 4;
    unsigned char *meta_bytes = malloc(meta_len + 1);
    memcpy(meta_bytes, data + 4, meta_len);
    fuzz_reseal(meta_bytes, meta_len);
    fuzz_clear_dir();
    fuzz_write(CKPT_METADATA_FILE, meta_bytes, meta_len);
    CkptMeta meta;
    char err[2048] = "";
    if (ckpt_meta_decode(meta_bytes, meta_len, &meta, err, sizeof err) == 0) {
        /* carve the rest of the input into the files it lists */
        const uint8_t *p = data + 4 + meta_len, *end = data + size;
        for (int i = 0; i < meta.num_files && p < end; i++) {
            if (strcmp(meta.files[i].name, CKPT_METADATA_FILE) == 0) continue;
            size_t n = meta.files[i].size < (uint64_t)(end - p) ? (size_t)meta.files[i].size : (size_t)(end - p);
            fuzz_write(meta.files[i].name, p, n);
            p += n;
        }
        ckpt_meta_free(&meta);
    }
    free(meta_bytes);
    CkptReader *r = ckpt_reader_open(fuzz_dir(), err, sizeof err);
    if (!r) {
        if (!err[0]) fuzz_fail("ckpt_reader_open failed without a message");
        return 0;
    }
    read_tensors(r);
    ckpt_reader_close(r);
    return 0;
}
