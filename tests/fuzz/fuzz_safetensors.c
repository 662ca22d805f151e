/* fuzz_safetensors.c: libFuzzer harness for safetensors files
 * (src/convert/safetensors.c, st_parse): the u64 header length, the JSON
 * header, dtypes, shapes and data offsets, and the data itself: every
 * tensor of a file that parses lies inside the input, is found by name and
 * is converted to fp32. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "convert/safetensors.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[1024] = "";
    StFile *file = st_parse(data, size, "fuzz.safetensors", err, sizeof err);
    if (!file) {
        if (!err[0]) fuzz_fail("st_parse failed without a message");
        return 0;
    }
    for (int i = 0; i < file->num_tensors; i++) {
        const StTensor *t = &file->tensors[i];
        if (t->data < data || t->nbytes > size || t->data > data + size - t->nbytes)
            fuzz_fail("tensor '%s' lies outside the input", t->name);
        if ((uint64_t)t->numel * st_dtype_size(t->dtype) != t->nbytes)
            fuzz_fail("tensor '%s': %lld elements in %zu bytes", t->name, (long long)t->numel, t->nbytes);
        if (st_find(file, t->name) != t) fuzz_fail("st_find does not find '%s'", t->name);
        float *out = malloc((size_t)t->numel * sizeof(float) + 1);
        st_tensor_to_f32(t, out);
        free(out);
    }
    for (int i = 0; i < file->num_metadata; i++)
        if (!st_metadata_get(file, file->metadata[i].key)) fuzz_fail("metadata '%s' not found", file->metadata[i].key);
    st_close(file);
    return 0;
}
