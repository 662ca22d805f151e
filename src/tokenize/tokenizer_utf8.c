/* tokenizer_utf8.c: UTF-8 checks and repair (Python's decode(errors="replace")),
 * the GPT-2 byte-to-unicode map of ByteLevel, and the id list. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "tokenizer_internal.h"

void tok_reserve(char **buf, size_t *cap, size_t n) { *buf = mt_grow(*buf, cap, n, 1); }

void token_ids_push(TokenIds *t, int32_t id) {
    if (t->count == t->cap) t->ids = mt_grow(t->ids, &t->cap, t->count + 1, sizeof *t->ids);
    t->ids[t->count++] = id;
}

void token_text_append(TokenText *t, const char *s, size_t n) {
    t->data = mt_grow(t->data, &t->cap, t->len + n + 1, 1);
    if (n) memcpy(t->data + t->len, s, n);
    t->len += n;
    t->data[t->len] = '\0';
}

void token_ids_free(TokenIds *t) {
    free(t->ids);
    memset(t, 0, sizeof *t);
}

/* The Unicode "maximal subpart" rules (Table 3-7 of the standard): a lead
 * byte's sequence length and the range of its second byte; 0 for a byte that
 * cannot start a sequence of two or more. */
static size_t lead_byte(unsigned c, unsigned *lo, unsigned *hi) {
    *lo = 0x80, *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) {
        if (c == 0xE0) *lo = 0xA0;
        if (c == 0xED) *hi = 0x9F;
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (c == 0xF0) *lo = 0x90;
        if (c == 0xF4) *hi = 0x8F;
        return 4;
    }
    return 0;
}

size_t utf8_char_len(const unsigned char *s, size_t n) {
    if (s[0] < 0x80) return 1;
    unsigned lo, hi;
    const size_t need = lead_byte(s[0], &lo, &hi);
    if (need == 0 || n < need) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < need; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return need;
}

uint32_t utf8_code_point(const unsigned char *s, size_t k) {
    if (k == 1) return s[0];
    uint32_t c = s[0] & (0xFFu >> (k + 1));
    for (size_t i = 1; i < k; i++) c = (c << 6) | (s[i] & 0x3F);
    return c;
}

/* Bytes of the maximal subpart starting at an invalid position (at least 1). */
static size_t invalid_run(const unsigned char *s, size_t n) {
    unsigned lo, hi;
    const size_t need = lead_byte(s[0], &lo, &hi);
    if (need == 0) return 1;
    size_t i = 1;
    if (i < n && s[i] >= lo && s[i] <= hi) {
        i++;
        while (i < need && i < n && s[i] >= 0x80 && s[i] <= 0xBF) i++;
    }
    return i;
}

size_t utf8_sanitize(const char *text, size_t len, char **out, size_t *cap) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < len) {
        if (s[i] < 0x80) { i++; continue; }
        size_t k = utf8_char_len(s + i, len - i);
        if (!k) break;
        i += k;
    }
    if (i == len) return 0;
    tok_reserve(out, cap, len * 3 + 1);
    memcpy(*out, text, i);
    size_t o = i;
    while (i < len) {
        size_t k = utf8_char_len(s + i, len - i);
        if (k) {
            memcpy(*out + o, text + i, k);
            o += k;
            i += k;
        } else {
            memcpy(*out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += invalid_run(s + i, len - i);
        }
    }
    return o;
}

void token_text_from_bytes(TokenText *out, const char *bytes, size_t n) {
    char *clean = NULL;
    size_t cap = 0, len = utf8_sanitize(bytes, n, &clean, &cap);
    out->len = 0;
    token_text_append(out, len ? clean : bytes, len ? len : n);
    free(clean);
}

static char byte_chars[256][3];
static unsigned char byte_char_lens[256];
static pthread_once_t byte_chars_once = PTHREAD_ONCE_INIT;

static void build_byte_chars(void) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        unsigned cp = printable ? (unsigned)b : 256u + (unsigned)n++;
        if (cp < 0x80) {
            byte_chars[b][0] = (char)cp;
            byte_char_lens[b] = 1;
        } else {
            byte_chars[b][0] = (char)(0xC0 | (cp >> 6));
            byte_chars[b][1] = (char)(0x80 | (cp & 0x3F));
            byte_char_lens[b] = 2;
        }
    }
}

void byte_level_map_build(void) { pthread_once(&byte_chars_once, build_byte_chars); }

const char *byte_level_char(unsigned char b, size_t *len) {
    *len = byte_char_lens[b];
    return byte_chars[b];
}
