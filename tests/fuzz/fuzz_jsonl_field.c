/* fuzz_jsonl_field.c: libFuzzer harness for the JSONL reader of `data build`
 * (src/data/json_text.c): one line of input, its "text" field pulled out.
 * A found field's bytes are all readable; a syntax error says where. */
#include <stdint.h>
#include <string.h>

#include "data/json_text.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    JsonBuffer out = {0};
    char why[256] = "";
    int rc = json_object_string_field((const char *)data, size, "text", &out, why, sizeof why);
    if (rc == JSON_FIELD_FOUND) {
        volatile unsigned char last = 0; /* read every byte: ASan checks that the buffer holds out.len */
        for (size_t i = 0; i < out.len; i++) last = (unsigned char)out.data[i];
        (void)last;
    } else if (rc == JSON_SYNTAX_ERROR && !why[0]) {
        fuzz_fail("syntax error without saying where");
    } else if (rc != JSON_FIELD_MISSING && rc != JSON_FIELD_NOT_STRING && rc != JSON_SYNTAX_ERROR) {
        fuzz_fail("json_object_string_field returned %d", rc);
    }
    json_buffer_free(&out);
    return 0;
}
