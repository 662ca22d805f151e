/* tokenizer_decode.c: ids -> text as `tokenizers` decodes them
 * (TokenizerImpl::decode): each id becomes its token (an added token's
 * content first, else the model vocabulary entry; unknown ids are dropped,
 * special tokens too when asked), and the token list goes through the
 * decoder chain; the result is the pieces joined. Without a decoder the
 * tokens are joined with one space.
 *
 * The decoders, each a list of pieces -> a list of pieces, as in
 * tokenizers/src/decoders and pre_tokenizers (decode_chain):
 *   ByteLevel     every piece's characters back to the bytes they stand for
 *                 (a piece with a character outside the byte map keeps its
 *                 own bytes), all joined into one piece read as UTF-8 with
 *                 U+FFFD for invalid sequences (from_utf8_lossy);
 *   Metaspace     the replacement character -> ' ', except in the first
 *                 piece where it is removed when prepend_scheme is not never;
 *   Replace       a string pattern -> its content, in each piece;
 *   ByteFallback  runs of <0xNN> pieces -> their bytes as one piece when
 *                 valid UTF-8, else one U+FFFD piece per byte;
 *   Fuse          all pieces joined into one;
 *   Strip         up to `start` leading and `stop` trailing characters equal
 *                 to `content` removed from each piece;
 *   Sequence      the decoders in order.
 * Anything else (and a Replace with a regex) makes tokenizer_decode refuse,
 * naming the file and the key: encoding never needs the decoder.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../core/json.h"
#include "tokenizer_internal.h"

void token_text_free(TokenText *t) {
    free(t->data);
    memset(t, 0, sizeof *t);
}

/* ---- loading ---- */

static void decoder_refuse(Tokenizer *tok, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void decoder_refuse(Tokenizer *tok, const char *key, const char *fmt, ...) {
    if (tok->decoder_error) return;
    char what[512], msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(msg, sizeof msg, "%s: %s: %s (decoding is not supported for this file; encoding is not affected)",
             tok->path, key, what);
    tok->decoder_error = mt_strdup(msg);
}

static char *copy_string(const JsonValue *v, size_t *len) {
    *len = v->string_len;
    char *s = mt_malloc(v->string_len + 1);
    memcpy(s, v->string, v->string_len + 1);
    return s;
}

/* Every member of obj is in `allowed` (NULL-terminated); else refused. */
static int known_keys(Tokenizer *tok, const JsonValue *obj, const char *where, const char *const *allowed) {
    for (size_t i = 0; i < obj->count; i++) {
        int known = 0;
        for (const char *const *a = allowed; *a && !known; a++) known = strcmp(obj->members[i].key, *a) == 0;
        if (!known) {
            decoder_refuse(tok, where, "key \"%s\" is not supported", obj->members[i].key);
            return 0;
        }
    }
    return 1;
}

/* A one-character string member (Metaspace's replacement, Strip's content). */
static int one_char(Tokenizer *tok, const JsonValue *obj, const char *key, const char *where, Decoder *d) {
    const JsonValue *v = json_get(obj, key);
    if (!v || v->type != JSON_STRING || v->string_len == 0 ||
        utf8_char_len((const unsigned char *)v->string, v->string_len) != v->string_len) {
        decoder_refuse(tok, where, "\"%s\": expected one character", key);
        return 0;
    }
    d->text = copy_string(v, &d->text_len);
    return 1;
}

static int small_count(Tokenizer *tok, const JsonValue *obj, const char *key, const char *where, int *out) {
    int64_t n;
    if (json_as_int64(json_get(obj, key), &n) != 0 || n < 0 || n > 1000000) {
        decoder_refuse(tok, where, "\"%s\": expected a count", key);
        return 0;
    }
    *out = (int)n;
    return 1;
}

static void load_one(Tokenizer *tok, const JsonValue *v, const char *where) {
    if (!v || v->type != JSON_OBJECT) {
        decoder_refuse(tok, where, "expected an object");
        return;
    }
    const JsonValue *t = json_get(v, "type");
    if (!t || t->type != JSON_STRING) {
        decoder_refuse(tok, where, "no \"type\"");
        return;
    }
    const char *type = t->string;
    if (strcmp(type, "Sequence") == 0) {
        static const char *const keys[] = {"type", "decoders", NULL};
        const JsonValue *list = json_get(v, "decoders");
        if (!known_keys(tok, v, where, keys)) return;
        if (!list || list->type != JSON_ARRAY) {
            decoder_refuse(tok, where, "\"decoders\": expected an array");
            return;
        }
        for (size_t i = 0; i < list->count; i++) {
            char item[256];
            snprintf(item, sizeof item, "%s.decoders[%zu]", where, i);
            load_one(tok, list->items[i], item);
        }
        return;
    }
    if (tok->decoder_count == TOK_MAX_DECODERS) {
        decoder_refuse(tok, where, "more than %d decoders", TOK_MAX_DECODERS);
        return;
    }
    Decoder *d = &tok->decoders[tok->decoder_count];
    memset(d, 0, sizeof *d);
    if (strcmp(type, "ByteLevel") == 0) {
        static const char *const keys[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
        if (!known_keys(tok, v, where, keys)) return;
        d->kind = DEC_BYTE_LEVEL;
    } else if (strcmp(type, "Metaspace") == 0) {
        static const char *const keys[] = {"type", "replacement", "prepend_scheme", "split", "add_prefix_space",
                                           "str_rep", NULL};
        if (!known_keys(tok, v, where, keys) || !one_char(tok, v, "replacement", where, d)) return;
        const JsonValue *scheme = json_get(v, "prepend_scheme"), *add = json_get(v, "add_prefix_space");
        d->prepend = !(add && add->type == JSON_BOOL && !add->boolean);
        if (scheme && scheme->type == JSON_STRING) d->prepend = strcmp(scheme->string, "never") != 0;
        d->kind = DEC_METASPACE;
    } else if (strcmp(type, "Replace") == 0) {
        static const char *const keys[] = {"type", "pattern", "content", NULL};
        const JsonValue *pattern = json_get(v, "pattern"), *literal, *content = json_get(v, "content");
        if (!known_keys(tok, v, where, keys)) return;
        if (!pattern || pattern->type != JSON_OBJECT || pattern->count != 1 ||
            !(literal = json_get(pattern, "String")) || literal->type != JSON_STRING || literal->string_len == 0 ||
            !content || content->type != JSON_STRING) {
            decoder_refuse(tok, where, "only a Replace of a {\"String\": ...} pattern by a string is supported");
            return;
        }
        d->text = copy_string(literal, &d->text_len);
        d->content = copy_string(content, &d->content_len);
        d->kind = DEC_REPLACE;
    } else if (strcmp(type, "ByteFallback") == 0 || strcmp(type, "Fuse") == 0) {
        static const char *const keys[] = {"type", NULL};
        if (!known_keys(tok, v, where, keys)) return;
        d->kind = type[0] == 'B' ? DEC_BYTE_FALLBACK : DEC_FUSE;
    } else if (strcmp(type, "Strip") == 0) {
        static const char *const keys[] = {"type", "content", "start", "stop", NULL};
        if (!known_keys(tok, v, where, keys) || !one_char(tok, v, "content", where, d) ||
            !small_count(tok, v, "start", where, &d->start) || !small_count(tok, v, "stop", where, &d->stop))
            return;
        d->kind = DEC_STRIP;
    } else {
        decoder_refuse(tok, where, "decoder \"%s\" is not supported (supported: ByteLevel, Metaspace, Replace, "
                       "ByteFallback, Fuse, Strip, Sequence)", type);
        return;
    }
    tok->decoder_count++;
}

static void build_byte_of_char(void);
static pthread_once_t byte_of_char_once = PTHREAD_ONCE_INIT;

void decoder_load(Tokenizer *tok, const JsonValue *v) {
    pthread_once(&byte_of_char_once, build_byte_of_char); /* at load, before any thread decodes */
    tok->has_decoder = v && v->type != JSON_NULL;
    if (tok->has_decoder) load_one(tok, v, "decoder");
}

void decoder_free(Tokenizer *tok) {
    for (int i = 0; i < tok->decoder_count; i++) {
        free(tok->decoders[i].text);
        free(tok->decoders[i].content);
    }
    tok->decoder_count = 0;
    free(tok->decoder_error);
    tok->decoder_error = NULL;
}

/* ---- decoding ---- */

/* A list of pieces: their bytes one after the other in `bytes`. */
typedef struct Pieces {
    TokenText bytes;
    size_t *end; /* piece i is bytes[end[i-1] .. end[i]) */
    size_t count, cap;
} Pieces;

static void end_piece(Pieces *p) {
    p->end = mt_grow(p->end, &p->cap, p->count + 1, sizeof *p->end);
    p->end[p->count++] = p->bytes.len;
}

static void clear_pieces(Pieces *p) {
    p->bytes.len = 0;
    p->count = 0;
}

static const char *piece(const Pieces *p, size_t i, size_t *len) {
    size_t start = i ? p->end[i - 1] : 0;
    *len = p->end[i] - start;
    return p->bytes.data + start;
}

static int16_t byte_of_char_table[512];

static void build_byte_of_char(void) {
    for (int i = 0; i < 512; i++) byte_of_char_table[i] = -1;
    for (int b = 0; b < 256; b++) {
        size_t k;
        const unsigned char *s = (const unsigned char *)byte_level_char((unsigned char)b, &k);
        uint32_t cp = k == 1 ? s[0] : ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
        byte_of_char_table[cp] = (int16_t)b;
    }
}

/* The byte a ByteLevel character stands for, or -1 (c: a code point). */
static int byte_of_char(uint32_t c) {
    return c < 512 ? byte_of_char_table[c] : -1;
}

static void byte_level(const Pieces *in, Pieces *out) {
    TokenText raw = {0};
    for (size_t i = 0; i < in->count; i++) {
        size_t n, at = raw.len;
        const unsigned char *s = (const unsigned char *)piece(in, i, &n);
        int mapped = 1;
        for (size_t j = 0; j < n && mapped;) {
            size_t k = utf8_char_len(s + j, n - j);
            int b = k ? byte_of_char(utf8_code_point(s + j, k)) : -1;
            if (b < 0) {
                mapped = 0;
                break;
            }
            char c = (char)b;
            token_text_append(&raw, &c, 1);
            j += k;
        }
        if (!mapped) {
            raw.len = at;
            token_text_append(&raw, (const char *)s, n);
        }
    }
    char *clean = NULL;
    size_t cap = 0, len = raw.len ? utf8_sanitize(raw.data, raw.len, &clean, &cap) : 0;
    if (len) token_text_append(&out->bytes, clean, len);
    else if (raw.len) token_text_append(&out->bytes, raw.data, raw.len);
    end_piece(out);
    free(clean);
    token_text_free(&raw);
}

static void metaspace(const Decoder *d, const Pieces *in, Pieces *out) {
    for (size_t i = 0; i < in->count; i++) {
        size_t n;
        const char *s = piece(in, i, &n);
        for (size_t j = 0; j < n;) {
            if (j + d->text_len <= n && memcmp(s + j, d->text, d->text_len) == 0) {
                if (!(i == 0 && d->prepend)) token_text_append(&out->bytes, " ", 1);
                j += d->text_len;
            } else {
                token_text_append(&out->bytes, s + j, 1);
                j++;
            }
        }
        end_piece(out);
    }
}

static void replace(const Decoder *d, const Pieces *in, Pieces *out) {
    for (size_t i = 0; i < in->count; i++) {
        size_t n;
        const char *s = piece(in, i, &n);
        for (size_t j = 0; j < n;) {
            if (j + d->text_len <= n && memcmp(s + j, d->text, d->text_len) == 0) {
                token_text_append(&out->bytes, d->content, d->content_len);
                j += d->text_len;
            } else {
                token_text_append(&out->bytes, s + j, 1);
                j++;
            }
        }
        end_piece(out);
    }
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* The byte of a "<0xNN>" piece (as Rust's u8::from_str_radix(NN, 16) reads
 * NN: two hex digits, or '+' and one), or -1. */
static int fallback_byte(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int hi = hex_digit(s[3]), lo = hex_digit(s[4]);
    if (s[3] == '+' && lo >= 0) return lo;
    return hi >= 0 && lo >= 0 ? hi * 16 + lo : -1;
}

static void flush_bytes(TokenText *run, Pieces *out) {
    if (!run->len) return;
    size_t valid = 0;
    while (valid < run->len) {
        size_t k = utf8_char_len((const unsigned char *)run->data + valid, run->len - valid);
        if (!k) break;
        valid += k;
    }
    if (valid == run->len) {
        token_text_append(&out->bytes, run->data, run->len);
        end_piece(out);
    } else {
        for (size_t i = 0; i < run->len; i++) {
            token_text_append(&out->bytes, "\xEF\xBF\xBD", 3);
            end_piece(out);
        }
    }
    run->len = 0;
}

static void byte_fallback(const Pieces *in, Pieces *out) {
    TokenText run = {0};
    for (size_t i = 0; i < in->count; i++) {
        size_t n;
        const char *s = piece(in, i, &n);
        int b = fallback_byte(s, n);
        if (b >= 0) {
            char c = (char)b;
            token_text_append(&run, &c, 1);
            continue;
        }
        flush_bytes(&run, out);
        token_text_append(&out->bytes, s, n);
        end_piece(out);
    }
    flush_bytes(&run, out);
    token_text_free(&run);
}

static void fuse(const Pieces *in, Pieces *out) {
    if (in->count) token_text_append(&out->bytes, in->bytes.data, in->bytes.len);
    end_piece(out);
}

static void strip(const Decoder *d, const Pieces *in, Pieces *out) {
    for (size_t i = 0; i < in->count; i++) {
        size_t n;
        const char *s = piece(in, i, &n);
        size_t from = 0, to = n;
        for (int k = 0; k < d->start && from + d->text_len <= n && memcmp(s + from, d->text, d->text_len) == 0; k++)
            from += d->text_len;
        for (int k = 0; k < d->stop && to >= from + d->text_len && memcmp(s + to - d->text_len, d->text,
                                                                             d->text_len) == 0; k++)
            to -= d->text_len;
        token_text_append(&out->bytes, s + from, to - from);
        end_piece(out);
    }
}

int tokenizer_decode(const Tokenizer *tok, const int32_t *ids, size_t n, bool skip_special, TokenText *out,
                     char *err, size_t errlen) {
    if (tok->decoder_error) {
        mt_set_error(err, errlen, "%s", tok->decoder_error);
        return -1;
    }
    Pieces a = {0}, b = {0};
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= tok->vocab_size || !tok->token_text[id]) continue;
        if (skip_special && tok->token_special[id]) continue;
        if (!tok->has_decoder && a.count) token_text_append(&a.bytes, " ", 1);
        token_text_append(&a.bytes, tok->token_text[id], tok->token_len[id]);
        end_piece(&a);
    }
    Pieces *cur = &a, *next = &b;
    for (int k = 0; k < tok->decoder_count; k++) {
        const Decoder *d = &tok->decoders[k];
        clear_pieces(next);
        switch (d->kind) {
        case DEC_BYTE_LEVEL: byte_level(cur, next); break;
        case DEC_METASPACE: metaspace(d, cur, next); break;
        case DEC_REPLACE: replace(d, cur, next); break;
        case DEC_BYTE_FALLBACK: byte_fallback(cur, next); break;
        case DEC_FUSE: fuse(cur, next); break;
        case DEC_STRIP: strip(d, cur, next); break;
        }
        Pieces *swap = cur;
        cur = next;
        next = swap;
    }
    if (cur->bytes.len) token_text_append(out, cur->bytes.data, cur->bytes.len);
    else token_text_append(out, "", 0);
    token_text_free(&a.bytes);
    token_text_free(&b.bytes);
    free(a.end);
    free(b.end);
    return 0;
}
