/* json_text.c: a strict little JSON parser that extracts one string member
 * of a one-line object and decodes it to UTF-8 (see json_text.h). */
#include "json_text.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"

#define JSON_MAX_DEPTH 256

typedef struct Parser {
    const char *start, *p, *end;
    char *why;
    size_t whylen;
    int failed;
} Parser;

static void fail(Parser *ps, const char *expected) {
    if (ps->failed) return;
    ps->failed = 1;
    if (ps->p >= ps->end)
        mt_set_error(ps->why, ps->whylen, "column %zu: unexpected end of line, expected %s",
                     (size_t)(ps->p - ps->start) + 1, expected);
    else if ((unsigned char)*ps->p >= 0x20 && (unsigned char)*ps->p < 0x7f)
        mt_set_error(ps->why, ps->whylen, "column %zu: expected %s, found '%c'", (size_t)(ps->p - ps->start) + 1,
                     expected, *ps->p);
    else /* a control byte (NUL would end the message) or a UTF-8 byte: by value */
        mt_set_error(ps->why, ps->whylen, "column %zu: expected %s, found byte 0x%02x", (size_t)(ps->p - ps->start) + 1,
                     expected, (unsigned char)*ps->p);
}

static void skip_space(Parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\r' || *ps->p == '\n')) ps->p++;
}

static void put_byte(JsonBuffer *b, char c) {
    if (!b) return;
    if (b->len + 1 > b->cap) {
        b->cap = b->cap ? 2 * b->cap : 256;
        b->data = mt_realloc(b->data, b->cap);
    }
    b->data[b->len++] = c;
}

static void put_bytes(JsonBuffer *b, const char *s, size_t n) {
    if (!b || !n) return;
    b->data = mt_grow(b->data, &b->cap, b->len + n, 1);
    memcpy(b->data + b->len, s, n);
    b->len += n;
}

static void put_utf8(JsonBuffer *b, uint32_t cp) {
    if (cp < 0x80) {
        put_byte(b, (char)cp);
    } else if (cp < 0x800) {
        put_byte(b, (char)(0xC0 | (cp >> 6)));
        put_byte(b, (char)(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        put_byte(b, (char)(0xE0 | (cp >> 12)));
        put_byte(b, (char)(0x80 | ((cp >> 6) & 0x3F)));
        put_byte(b, (char)(0x80 | (cp & 0x3F)));
    } else {
        put_byte(b, (char)(0xF0 | (cp >> 18)));
        put_byte(b, (char)(0x80 | ((cp >> 12) & 0x3F)));
        put_byte(b, (char)(0x80 | ((cp >> 6) & 0x3F)));
        put_byte(b, (char)(0x80 | (cp & 0x3F)));
    }
}

/* Four hex digits after "\u" (ps->p on the first digit); -1 when malformed. */
static int32_t read_hex4(Parser *ps) {
    if (ps->end - ps->p < 4) return -1;
    int32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = ps->p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    ps->p += 4;
    return v;
}

/* A string starting at the opening quote; decoded into out (NULL: checked only). */
static void parse_string(Parser *ps, JsonBuffer *out) {
    if (ps->p >= ps->end || *ps->p != '"') { fail(ps, "'\"'"); return; }
    ps->p++;
    while (ps->p < ps->end) {
        unsigned char c = (unsigned char)*ps->p;
        if (c == '"') {
            ps->p++;
            return;
        }
        if (c < 0x20) { fail(ps, "no raw control character inside a string (use an escape)"); return; }
        if (c != '\\') { /* a run of plain bytes, copied at once */
            const char *run = ps->p;
            while (ps->p < ps->end && *ps->p != '"' && *ps->p != '\\' && (unsigned char)*ps->p >= 0x20) ps->p++;
            put_bytes(out, run, (size_t)(ps->p - run));
            continue;
        }
        ps->p++;
        if (ps->p >= ps->end) break;
        char e = *ps->p++;
        switch (e) {
        case '"': put_byte(out, '"'); break;
        case '\\': put_byte(out, '\\'); break;
        case '/': put_byte(out, '/'); break;
        case 'b': put_byte(out, '\b'); break;
        case 'f': put_byte(out, '\f'); break;
        case 'n': put_byte(out, '\n'); break;
        case 'r': put_byte(out, '\r'); break;
        case 't': put_byte(out, '\t'); break;
        case 'u': {
            int32_t cp = read_hex4(ps);
            if (cp < 0) { fail(ps, "four hex digits after \\u"); return; }
            if (cp >= 0xD800 && cp <= 0xDBFF && ps->end - ps->p >= 6 && ps->p[0] == '\\' && ps->p[1] == 'u') {
                const char *save = ps->p;
                ps->p += 2;
                int32_t low = read_hex4(ps);
                if (low >= 0xDC00 && low <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                } else {
                    ps->p = save; /* not a pair: the high surrogate stands alone */
                    cp = 0xFFFD;
                }
            } else if (cp >= 0xD800 && cp <= 0xDFFF) {
                cp = 0xFFFD;
            }
            put_utf8(out, (uint32_t)cp);
            break;
        }
        default: ps->p--; { fail(ps, "an escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)"); return; }
        }
    }
    fail(ps, "'\"' closing the string");
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

static void parse_number(Parser *ps) {
    if (ps->p < ps->end && *ps->p == '-') ps->p++;
    if (ps->p >= ps->end || !is_digit(*ps->p)) { fail(ps, "a digit"); return; }
    if (*ps->p == '0') {
        ps->p++;
    } else {
        while (ps->p < ps->end && is_digit(*ps->p)) ps->p++;
    }
    if (ps->p < ps->end && *ps->p == '.') {
        ps->p++;
        if (ps->p >= ps->end || !is_digit(*ps->p)) { fail(ps, "a digit after '.'"); return; }
        while (ps->p < ps->end && is_digit(*ps->p)) ps->p++;
    }
    if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
        ps->p++;
        if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-')) ps->p++;
        if (ps->p >= ps->end || !is_digit(*ps->p)) { fail(ps, "a digit in the exponent"); return; }
        while (ps->p < ps->end && is_digit(*ps->p)) ps->p++;
    }
}

static void parse_literal(Parser *ps, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) { fail(ps, "a JSON value"); return; }
    ps->p += n;
}

static void skip_value(Parser *ps, int depth);

/* Object (ps->p on '{'). With key != NULL (top level), the member `key`'s
 * string value goes to out and *status says what was found. */
static void parse_object(Parser *ps, int depth, const char *key, JsonBuffer *out, int *status) {
    JsonBuffer name = {0};
    ps->p++;
    skip_space(ps);
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
        return;
    }
    while (!ps->failed) {
        skip_space(ps);
        name.len = 0;
        parse_string(ps, key ? &name : NULL);
        if (ps->failed) break;
        skip_space(ps);
        if (ps->p >= ps->end || *ps->p != ':') {
            fail(ps, "':'");
            break;
        }
        ps->p++;
        skip_space(ps);
        int match = key && name.len == strlen(key) && memcmp(name.data, key, name.len) == 0;
        if (match && ps->p < ps->end && *ps->p == '"') {
            out->len = 0;
            parse_string(ps, out);
            *status = JSON_FIELD_FOUND;
        } else {
            if (match) *status = JSON_FIELD_NOT_STRING;
            skip_value(ps, depth + 1);
        }
        if (ps->failed) break;
        skip_space(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == '}') {
            ps->p++;
            break;
        }
        fail(ps, "',' or '}'");
    }
    json_buffer_free(&name);
}

static void skip_value(Parser *ps, int depth) {
    if (depth > JSON_MAX_DEPTH) { fail(ps, "less deeply nested values"); return; }
    skip_space(ps);
    if (ps->p >= ps->end) { fail(ps, "a JSON value"); return; }
    char c = *ps->p;
    if (c == '"') { parse_string(ps, NULL); return; }
    if (c == '{') { parse_object(ps, depth, NULL, NULL, NULL); return; }
    if (c == '[') {
        ps->p++;
        skip_space(ps);
        if (ps->p < ps->end && *ps->p == ']') {
            ps->p++;
            return;
        }
        while (!ps->failed) {
            skip_value(ps, depth + 1);
            skip_space(ps);
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                continue;
            }
            if (ps->p < ps->end && *ps->p == ']') {
                ps->p++;
                return;
            }
            fail(ps, "',' or ']'");
        }
        return;
    }
    if (c == 't') { parse_literal(ps, "true"); return; }
    if (c == 'f') { parse_literal(ps, "false"); return; }
    if (c == 'n') { parse_literal(ps, "null"); return; }
    /* Python's json.dumps writes NaN, Infinity and -Infinity for a float field; json.loads (Megatron's
     * preprocess_data.py) and megatrain's own parser (src/core/json.c) take them */
    if (c == 'N') { parse_literal(ps, "NaN"); return; }
    if (c == 'I') { parse_literal(ps, "Infinity"); return; }
    if (c == '-' && ps->end - ps->p > 1 && ps->p[1] == 'I') {
        ps->p++;
        parse_literal(ps, "Infinity");
        return;
    }
    parse_number(ps);
}

int json_object_string_field(const char *text, size_t n, const char *key, JsonBuffer *out, char *why,
                             size_t whylen) {
    Parser ps = {text, text, text + n, why, whylen, 0};
    int status = JSON_FIELD_MISSING;
    skip_space(&ps);
    if (ps.p >= ps.end || *ps.p != '{') {
        fail(&ps, "'{' (each line must be one JSON object)");
        return JSON_SYNTAX_ERROR;
    }
    parse_object(&ps, 0, key, out, &status);
    if (!ps.failed) {
        skip_space(&ps);
        if (ps.p < ps.end) fail(&ps, "the end of the line after the object");
    }
    return ps.failed ? JSON_SYNTAX_ERROR : status;
}

void json_buffer_free(JsonBuffer *b) {
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}
