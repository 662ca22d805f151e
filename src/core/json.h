/* json.h: a small JSON reader (into a tree) and writer, for the safetensors
 * header, Hugging Face config.json and model.safetensors.index.json.
 *
 * The reader follows RFC 8259 strictly (like Python's json.loads, whose
 * NaN / Infinity / -Infinity extension it also accepts, since Python writes
 * them): one value, nothing but whitespace after it, valid UTF-8 in strings,
 * escapes decoded (a lone surrogate becomes U+FFFD), nesting at most
 * JSON_MAX_DEPTH deep. It never reads past `len` and never crashes on bad
 * input: errors say "line L, column C: expected X, found Y".
 *
 * The writer emits compact JSON (serde_json style, as safetensors headers
 * are) or JSON indented like Python's json.dumps(indent=N) (config.json);
 * doubles in the shortest form that reads back exactly, spelled as Python's
 * repr spells them (10000.0, 1e-05).
 */
#ifndef MT_CORE_JSON_H
#define MT_CORE_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JSON_MAX_DEPTH 256

typedef enum { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } JsonType;

typedef struct JsonValue JsonValue;

typedef struct JsonMember {
    char *key;          /* decoded, NUL-terminated (may hold NULs: see key_len) */
    size_t key_len;
    JsonValue *value;
} JsonMember;

struct JsonValue {
    JsonType type;
    bool boolean;        /* JSON_BOOL */
    double number;       /* JSON_NUMBER (always set) */
    bool is_integer;     /* JSON_NUMBER written without fraction or exponent and fitting int64 */
    int64_t integer;     /* valid when is_integer */
    char *string;        /* JSON_STRING: decoded UTF-8, NUL-terminated */
    size_t string_len;
    size_t count;        /* items of an array, members of an object */
    JsonValue **items;   /* JSON_ARRAY */
    JsonMember *members; /* JSON_OBJECT, in document order (duplicates kept) */
    size_t offset;       /* byte offset of the value in the parsed text */
};

/* Parse text[0..len). Returns the tree (free with json_free), or NULL with
 * err holding "line L, column C: ...". */
JsonValue *json_parse(const char *text, size_t len, char *err, size_t errlen);
void json_free(JsonValue *value);

/* json_parse of the whole file `path` (at most max_bytes); NULL with err
 * naming the file and, for bad JSON, the line and column. */
JsonValue *json_parse_file(const char *path, size_t max_bytes, char *err, size_t errlen);

/* Member `key` of an object (the last one when repeated, as Python does);
 * NULL when absent or when `object` is not an object. */
const JsonValue *json_get(const JsonValue *object, const char *key);

/* An integral number (an integer literal, or a float with no fraction within
 * +-2^53) into *out; -1 otherwise. */
int json_as_int64(const JsonValue *value, int64_t *out);

/* "null", "a boolean", "a number", "a string", "an array", "an object". */
const char *json_type_name(JsonType type);

/* "line L, column C" of byte `offset` in text. */
void json_location(const char *text, size_t len, size_t offset, char *out, size_t outlen);

/* Whether s[0..n) is valid UTF-8 (no overlongs, no surrogates, at most U+10FFFF): what JSON and YAML text may hold;
 * a path written into a recipe, a checkpoint's files or adapter_config.json must be. */
bool utf8_valid(const char *s, size_t n);

/* ---- writer ---- */

#define JSON_WRITER_MAX_DEPTH 64

typedef struct JsonWriter {
    char *data;
    size_t len, cap;
    int indent;                 /* 0: compact */
    int depth;
    size_t items[JSON_WRITER_MAX_DEPTH]; /* values written at each open level */
    bool after_key;
} JsonWriter;

void jw_init(JsonWriter *w, int indent);
void jw_free(JsonWriter *w);
void jw_begin_object(JsonWriter *w);
void jw_end_object(JsonWriter *w);
void jw_begin_array(JsonWriter *w);
void jw_end_array(JsonWriter *w);
void jw_key(JsonWriter *w, const char *key);
void jw_string(JsonWriter *w, const char *text);
/* A string of n bytes (NUL bytes included, written as \u0000). */
void jw_string_n(JsonWriter *w, const char *text, size_t n);
void jw_int(JsonWriter *w, int64_t value);
void jw_uint(JsonWriter *w, uint64_t value);
void jw_double(JsonWriter *w, double value); /* non-finite values are written as null */
void jw_bool(JsonWriter *w, bool value);
void jw_null(JsonWriter *w);
/* Append raw bytes (e.g. padding); the caller keeps the JSON valid. */
void jw_raw(JsonWriter *w, const char *bytes, size_t len);

/* The shortest text that reads back as `value`, spelled like Python's repr
 * ("10000.0", "1e-05", "0.02"). out needs 32 bytes. */
void json_format_double(char *out, size_t outlen, double value);

#endif
