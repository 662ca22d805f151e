/* fuzz_sft_record.c: libFuzzer harness for the SFT records of `data build
 * --format sft` (src/data/sft_render.c): the first byte picks the template
 * (none, llama3, chatml, qwen3, llama3.1), the rest is one JSONL line, parsed and rendered.
 * A rendered record's segments tile its text without a gap, neighbours
 * differ in counted, and something is counted; a refused one says why. */
#include <stdint.h>
#include <string.h>

#include "core/json.h"
#include "data/sft_render.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const SftTemplate t = (SftTemplate)(data[0] % 5);
    char err[256] = "", why[256] = "";
    JsonValue *record = json_parse((const char *)data + 1, size - 1, err, sizeof err);
    if (!record) return 0;
    SftRendered r = {0};
    if (sft_render(record, t, &r, why, sizeof why) != 0) {
        if (!why[0]) fuzz_fail("a refused record without a reason");
    } else {
        size_t at = 0, counted = 0;
        for (size_t i = 0; i < r.nsegments; i++) {
            if (r.segments[i].start != at || r.segments[i].len == 0) fuzz_fail("segment %zu: a gap or empty", i);
            if (i && r.segments[i].counted == r.segments[i - 1].counted) fuzz_fail("segment %zu: not merged", i);
            at += r.segments[i].len;
            counted += r.segments[i].counted ? r.segments[i].len : 0;
        }
        if (at != r.len || (r.text && r.text[r.len] != '\0')) fuzz_fail("segments cover %zu of %zu bytes", at, r.len);
        if (counted == 0 && t != SFT_TEMPLATE_NONE) fuzz_fail("a template rendered nothing counted");
    }
    sft_rendered_free(&r);
    json_free(record);
    return 0;
}
