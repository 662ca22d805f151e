/* fuzz_json.c: libFuzzer harness for the JSON reader (src/core/json.c), used
 * for safetensors headers, config.json and the safetensors index. A parsed
 * tree is walked: every object member is found again by json_get, every
 * number tried as an integer, every value's offset lies inside the text and
 * turns into a "line L, column C". */
#include <stdint.h>
#include <string.h>

#include "core/json.h"
#include "fuzz_util.h"

static void walk(const char *text, size_t len, const JsonValue *v, int depth) {
    if (depth > JSON_MAX_DEPTH + 1) fuzz_fail("tree deeper than JSON_MAX_DEPTH (%d)", JSON_MAX_DEPTH);
    if (v->offset >= len) fuzz_fail("value offset %zu outside the %zu-byte text", v->offset, len);
    char where[64];
    json_location(text, len, v->offset, where, sizeof where);
    if (strncmp(where, "line ", 5) != 0) fuzz_fail("json_location gave '%s'", where);
    (void)json_type_name(v->type);
    int64_t integer;
    switch (v->type) {
    case JSON_NUMBER:
        if (json_as_int64(v, &integer) == 0 && v->is_integer && integer != v->integer)
            fuzz_fail("json_as_int64 gave %lld for the integer %lld", (long long)integer, (long long)v->integer);
        break;
    case JSON_STRING:
        if (strlen(v->string) > v->string_len) fuzz_fail("string longer than its string_len");
        break;
    case JSON_ARRAY:
        for (size_t i = 0; i < v->count; i++) walk(text, len, v->items[i], depth + 1);
        break;
    case JSON_OBJECT:
        for (size_t i = 0; i < v->count; i++) {
            if (strlen(v->members[i].key) == v->members[i].key_len && !json_get(v, v->members[i].key))
                fuzz_fail("json_get does not find member '%s'", v->members[i].key);
            walk(text, len, v->members[i].value, depth + 1);
        }
        break;
    default:
        break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[512] = "";
    JsonValue *root = json_parse((const char *)data, size, err, sizeof err);
    if (!root) {
        if (strncmp(err, "line ", 5) != 0) fuzz_fail("error without a location: '%s'", err);
        return 0;
    }
    walk((const char *)data, size, root, 0);
    json_free(root);
    return 0;
}
