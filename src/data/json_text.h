/* json_text.h: pull one string field out of a one-line JSON object (JSONL).
 *
 * A small strict JSON parser (RFC 8259 grammar plus NaN, Infinity and -Infinity, as
 * Python's json.loads reads and json.dumps writes them):
 * the whole line must be one object; other members are checked and skipped.
 * The string is decoded to UTF-8, including \uXXXX escapes and surrogate
 * pairs (a lone surrogate becomes U+FFFD). With a repeated key the last wins.
 */
#ifndef MT_DATA_JSON_TEXT_H
#define MT_DATA_JSON_TEXT_H

#include <stddef.h>

typedef struct JsonBuffer {
    char *data;
    size_t len, cap;
} JsonBuffer;

enum { JSON_FIELD_FOUND = 0, JSON_FIELD_MISSING = 1, JSON_FIELD_NOT_STRING = 2, JSON_SYNTAX_ERROR = -1 };

/* Look up member `key` of the object in text[0..n). Returns JSON_FIELD_FOUND
 * (out holds the decoded bytes), JSON_FIELD_MISSING, JSON_FIELD_NOT_STRING,
 * or JSON_SYNTAX_ERROR with `why` saying where ("column 12: expected ':'"). */
int json_object_string_field(const char *text, size_t n, const char *key, JsonBuffer *out, char *why,
                             size_t whylen);

void json_buffer_free(JsonBuffer *b);

#endif
