/* json.c: the JSON reader of json.h: a recursive-descent parser into a tree
 * of JsonValue, strict RFC 8259 plus Python's NaN / Infinity, bounded depth,
 * never reading past the given length. */
#include "json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "fs.h"

#define DEPTH_TEXT2(n) #n
#define DEPTH_TEXT(n) DEPTH_TEXT2(n)

typedef struct Parser {
    const char *text;
    size_t pos, len;
    char *err;
    size_t errlen;
    int failed;
} Parser;

/* Growable byte buffer for decoded strings. */
typedef struct Bytes {
    char *data;
    size_t len, cap;
} Bytes;

static void bytes_put(Bytes *b, const char *src, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 32;
        while (cap < b->len + n + 1) cap *= 2;
        b->data = mt_realloc(b->data, cap);
        b->cap = cap;
    }
    memcpy(b->data + b->len, src, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static void fail_at(Parser *ps, size_t at, const char *expected) {
    if (ps->failed) return;
    ps->failed = 1;
    char where[64], found[32];
    json_location(ps->text, ps->len, at, where, sizeof where);
    if (at >= ps->len) snprintf(found, sizeof found, "the end of the text");
    else {
        unsigned char c = (unsigned char)ps->text[at];
        if (c >= 0x20 && c < 0x7f) snprintf(found, sizeof found, "'%c'", c);
        else snprintf(found, sizeof found, "byte 0x%02x", c);
    }
    mt_set_error(ps->err, ps->errlen, "%s: expected %s, found %s", where, expected, found);
}

static void fail(Parser *ps, const char *expected) { fail_at(ps, ps->pos, expected); }

static void skip_space(Parser *ps) {
    while (ps->pos < ps->len) {
        char c = ps->text[ps->pos];
        if (c != ' ' && c != '\t' && c != '\r' && c != '\n') break;
        ps->pos++;
    }
}

static bool match_word(Parser *ps, const char *word) {
    size_t n = strlen(word);
    if (ps->len - ps->pos < n || memcmp(ps->text + ps->pos, word, n) != 0) return false;
    ps->pos += n;
    return true;
}

static void put_utf8(Bytes *b, uint32_t cp) {
    char s[4];
    size_t n;
    if (cp < 0x80) {
        s[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        s[0] = (char)(0xC0 | (cp >> 6));
        s[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        s[0] = (char)(0xE0 | (cp >> 12));
        s[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        s[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        s[0] = (char)(0xF0 | (cp >> 18));
        s[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        s[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        s[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    bytes_put(b, s, n);
}

/* Length of the valid UTF-8 sequence at s[0..avail) (no overlongs, no
 * surrogates, at most U+10FFFF), or 0 when invalid. */
static size_t utf8_sequence(const unsigned char *s, size_t avail) {
    unsigned char c = s[0];
    size_t n;
    uint32_t cp, min;
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) { n = 2; cp = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { n = 3; cp = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { n = 4; cp = c & 0x07; min = 0x10000; }
    else return 0;
    if (avail < n) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return n;
}

bool utf8_valid(const char *s, size_t n) {
    for (size_t i = 0, k; i < n; i += k)
        if ((k = utf8_sequence((const unsigned char *)s + i, n - i)) == 0) return false;
    return true;
}

static int32_t read_hex4(Parser *ps) {
    if (ps->len - ps->pos < 4) return -1;
    int32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = ps->text[ps->pos + i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    ps->pos += 4;
    return v;
}

/* A string at the opening quote; its decoded bytes into out. Returns 0 or -1. */
static int parse_string(Parser *ps, Bytes *out) {
    if (ps->pos >= ps->len || ps->text[ps->pos] != '"') {
        fail(ps, "'\"'");
        return -1;
    }
    ps->pos++;
    bytes_put(out, "", 0);
    for (;;) {
        if (ps->pos >= ps->len) {
            fail(ps, "the closing '\"' of a string");
            return -1;
        }
        unsigned char c = (unsigned char)ps->text[ps->pos];
        if (c == '"') {
            ps->pos++;
            return 0;
        }
        if (c < 0x20) {
            fail(ps, "a character (control characters must be escaped in strings)");
            return -1;
        }
        if (c != '\\') {
            size_t n = utf8_sequence((const unsigned char *)ps->text + ps->pos, ps->len - ps->pos);
            if (n == 0) {
                fail(ps, "valid UTF-8 in a string");
                return -1;
            }
            bytes_put(out, ps->text + ps->pos, n);
            ps->pos += n;
            continue;
        }
        size_t escape_at = ps->pos;
        ps->pos++;
        if (ps->pos >= ps->len) {
            fail(ps, "an escape character after '\\'");
            return -1;
        }
        char e = ps->text[ps->pos++];
        const char *simple = NULL;
        switch (e) {
        case '"': simple = "\""; break;
        case '\\': simple = "\\"; break;
        case '/': simple = "/"; break;
        case 'b': simple = "\b"; break;
        case 'f': simple = "\f"; break;
        case 'n': simple = "\n"; break;
        case 'r': simple = "\r"; break;
        case 't': simple = "\t"; break;
        case 'u': break;
        default: fail_at(ps, escape_at, "a valid escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)"); return -1;
        }
        if (simple) {
            bytes_put(out, simple, 1);
            continue;
        }
        int32_t cp = read_hex4(ps);
        if (cp < 0) {
            fail_at(ps, escape_at, "four hex digits after \\u");
            return -1;
        }
        if (cp >= 0xD800 && cp <= 0xDBFF && ps->len - ps->pos >= 6 && ps->text[ps->pos] == '\\' &&
            ps->text[ps->pos + 1] == 'u') {
            size_t save = ps->pos;
            ps->pos += 2;
            int32_t low = read_hex4(ps);
            if (low >= 0xDC00 && low <= 0xDFFF) cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            else ps->pos = save; /* not a pair: the high surrogate stands alone */
        }
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD; /* lone surrogate */
        put_utf8(out, (uint32_t)cp);
    }
}

static JsonValue *new_value(JsonType type, size_t offset) {
    JsonValue *v = mt_calloc(1, sizeof *v);
    v->type = type;
    v->offset = offset;
    return v;
}

static JsonValue *parse_number(Parser *ps) {
    size_t start = ps->pos;
    const char *t = ps->text;
    bool negative = false;
    if (ps->pos < ps->len && t[ps->pos] == '-') {
        negative = true;
        ps->pos++;
    }
    if (match_word(ps, "Infinity")) {
        JsonValue *v = new_value(JSON_NUMBER, start);
        v->number = negative ? -INFINITY : INFINITY;
        return v;
    }
    bool integral = true;
    if (ps->pos < ps->len && t[ps->pos] == '0') {
        ps->pos++;
    } else if (ps->pos < ps->len && t[ps->pos] >= '1' && t[ps->pos] <= '9') {
        while (ps->pos < ps->len && t[ps->pos] >= '0' && t[ps->pos] <= '9') ps->pos++;
    } else {
        fail(ps, negative ? "a digit after '-'" : "a JSON value");
        return NULL;
    }
    if (ps->pos < ps->len && t[ps->pos] == '.') {
        integral = false;
        ps->pos++;
        if (ps->pos >= ps->len || t[ps->pos] < '0' || t[ps->pos] > '9') {
            fail(ps, "a digit after the decimal point");
            return NULL;
        }
        while (ps->pos < ps->len && t[ps->pos] >= '0' && t[ps->pos] <= '9') ps->pos++;
    }
    if (ps->pos < ps->len && (t[ps->pos] == 'e' || t[ps->pos] == 'E')) {
        integral = false;
        ps->pos++;
        if (ps->pos < ps->len && (t[ps->pos] == '+' || t[ps->pos] == '-')) ps->pos++;
        if (ps->pos >= ps->len || t[ps->pos] < '0' || t[ps->pos] > '9') {
            fail(ps, "a digit in the exponent");
            return NULL;
        }
        while (ps->pos < ps->len && t[ps->pos] >= '0' && t[ps->pos] <= '9') ps->pos++;
    }
    size_t n = ps->pos - start;
    char small[64];
    char *copy = n < sizeof small ? small : mt_malloc(n + 1);
    memcpy(copy, t + start, n);
    copy[n] = '\0';
    JsonValue *v = new_value(JSON_NUMBER, start);
    v->number = strtod(copy, NULL); /* the grammar was checked above; overflow gives +-inf, as in Python */
    if (integral) {
        errno = 0;
        long long value = strtoll(copy, NULL, 10);
        if (errno == 0) {
            v->is_integer = true;
            v->integer = value;
        }
    }
    if (copy != small) free(copy);
    return v;
}

static JsonValue *parse_value(Parser *ps, int depth);

static JsonValue *parse_array(Parser *ps, int depth) {
    JsonValue *v = new_value(JSON_ARRAY, ps->pos);
    size_t cap = 0;
    ps->pos++; /* '[' */
    skip_space(ps);
    if (ps->pos < ps->len && ps->text[ps->pos] == ']') {
        ps->pos++;
        return v;
    }
    for (;;) {
        JsonValue *item = parse_value(ps, depth + 1);
        if (!item) break;
        if (v->count == cap) {
            cap = cap ? 2 * cap : 4;
            v->items = mt_realloc(v->items, cap * sizeof *v->items);
        }
        v->items[v->count++] = item;
        skip_space(ps);
        if (ps->pos < ps->len && ps->text[ps->pos] == ',') {
            ps->pos++;
            continue;
        }
        if (ps->pos < ps->len && ps->text[ps->pos] == ']') {
            ps->pos++;
            return v;
        }
        fail(ps, "',' or ']' in an array");
        break;
    }
    json_free(v);
    return NULL;
}

static JsonValue *parse_object(Parser *ps, int depth) {
    JsonValue *v = new_value(JSON_OBJECT, ps->pos);
    size_t cap = 0;
    ps->pos++; /* '{' */
    skip_space(ps);
    if (ps->pos < ps->len && ps->text[ps->pos] == '}') {
        ps->pos++;
        return v;
    }
    for (;;) {
        skip_space(ps);
        if (ps->pos >= ps->len || ps->text[ps->pos] != '"') {
            fail(ps, "a '\"'-quoted member name in an object");
            break;
        }
        Bytes key = {0};
        if (parse_string(ps, &key) != 0) {
            free(key.data);
            break;
        }
        skip_space(ps);
        if (ps->pos >= ps->len || ps->text[ps->pos] != ':') {
            fail(ps, "':' after a member name");
            free(key.data);
            break;
        }
        ps->pos++;
        JsonValue *value = parse_value(ps, depth + 1);
        if (!value) {
            free(key.data);
            break;
        }
        if (v->count == cap) {
            cap = cap ? 2 * cap : 8;
            v->members = mt_realloc(v->members, cap * sizeof *v->members);
        }
        v->members[v->count++] = (JsonMember){key.data, key.len, value};
        skip_space(ps);
        if (ps->pos < ps->len && ps->text[ps->pos] == ',') {
            ps->pos++;
            continue;
        }
        if (ps->pos < ps->len && ps->text[ps->pos] == '}') {
            ps->pos++;
            return v;
        }
        fail(ps, "',' or '}' in an object");
        break;
    }
    json_free(v);
    return NULL;
}

static JsonValue *parse_value(Parser *ps, int depth) {
    skip_space(ps);
    if (depth > JSON_MAX_DEPTH) {
        fail(ps, "at most " DEPTH_TEXT(JSON_MAX_DEPTH) " levels of nesting");
        return NULL;
    }
    if (ps->pos >= ps->len) {
        fail(ps, "a JSON value");
        return NULL;
    }
    size_t start = ps->pos;
    char c = ps->text[ps->pos];
    if (c == '{') return parse_object(ps, depth);
    if (c == '[') return parse_array(ps, depth);
    if (c == '"') {
        Bytes s = {0};
        if (parse_string(ps, &s) != 0) {
            free(s.data);
            return NULL;
        }
        JsonValue *v = new_value(JSON_STRING, start);
        v->string = s.data;
        v->string_len = s.len;
        return v;
    }
    if (match_word(ps, "true") || match_word(ps, "false")) {
        JsonValue *v = new_value(JSON_BOOL, start);
        v->boolean = c == 't';
        return v;
    }
    if (match_word(ps, "null")) return new_value(JSON_NULL, start);
    if (match_word(ps, "NaN")) {
        JsonValue *v = new_value(JSON_NUMBER, start);
        v->number = NAN;
        return v;
    }
    if (c == '-' || (c >= '0' && c <= '9') || c == 'I') return parse_number(ps);
    fail(ps, "a JSON value");
    return NULL;
}

JsonValue *json_parse(const char *text, size_t len, char *err, size_t errlen) {
    Parser ps = {text, 0, len, err, errlen, 0};
    if (!text) {
        mt_set_error(err, errlen, "no text to parse");
        return NULL;
    }
    JsonValue *root = parse_value(&ps, 1);
    if (!root) return NULL;
    skip_space(&ps);
    if (ps.pos != ps.len) {
        fail(&ps, "the end of the text after the JSON value");
        json_free(root);
        return NULL;
    }
    return root;
}

JsonValue *json_parse_file(const char *path, size_t max_bytes, char *err, size_t errlen) {
    size_t len;
    char *text = mt_read_file(path, max_bytes, &len, err, errlen);
    if (!text) return NULL;
    char why[256];
    JsonValue *root = json_parse(text, len, why, sizeof why);
    free(text);
    if (!root) mt_set_error(err, errlen, "%s: %s", path, why);
    return root;
}
