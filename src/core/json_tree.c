/* json_tree.c: using a parsed JSON tree (json.h): freeing it, looking up
 * members, reading integers, naming types and locations for messages. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

void json_location(const char *text, size_t len, size_t offset, char *out, size_t outlen) {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < offset && i < len; i++) {
        if (text[i] == '\n') {
            line++;
            column = 1;
        } else {
            column++;
        }
    }
    snprintf(out, outlen, "line %zu, column %zu", line, column);
}

void json_free(JsonValue *value) {
    if (!value) return;
    for (size_t i = 0; i < value->count; i++) {
        if (value->type == JSON_ARRAY) {
            json_free(value->items[i]);
        } else if (value->type == JSON_OBJECT) {
            free(value->members[i].key);
            json_free(value->members[i].value);
        }
    }
    free(value->items);
    free(value->members);
    free(value->string);
    free(value);
}

const JsonValue *json_get(const JsonValue *object, const char *key) {
    if (!object || object->type != JSON_OBJECT) return NULL;
    size_t n = strlen(key);
    for (size_t i = object->count; i-- > 0;)
        if (object->members[i].key_len == n && memcmp(object->members[i].key, key, n) == 0)
            return object->members[i].value;
    return NULL;
}

int json_as_int64(const JsonValue *value, int64_t *out) {
    if (!value || value->type != JSON_NUMBER) return -1;
    if (value->is_integer) {
        *out = value->integer;
        return 0;
    }
    double d = value->number;
    if (isfinite(d) && d == floor(d) && fabs(d) <= 9007199254740992.0) {
        *out = (int64_t)d;
        return 0;
    }
    return -1;
}

const char *json_type_name(JsonType type) {
    switch (type) {
    case JSON_NULL: return "null";
    case JSON_BOOL: return "a boolean";
    case JSON_NUMBER: return "a number";
    case JSON_STRING: return "a string";
    case JSON_ARRAY: return "an array";
    case JSON_OBJECT: return "an object";
    }
    return "a value";
}
