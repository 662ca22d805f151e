/* tokenizer_load.c: tokenizer.json -> Tokenizer. Every section is checked
 * against what tokenizer_pipeline.c and tokenizer_bpe.c implement; a type,
 * key or value they do not implement is refused with the file and the JSON
 * key ("tokenizer.json: pre_tokenizer.pretokenizers[0].behavior: ..."),
 * never ignored. The post-processor is read only for its end-of-sequence
 * token (encoding for data build does not apply it). The decoder is read by
 * tokenizer_decode.c: one it does not implement refuses decoding only.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/error.h"
#include "../core/fs.h"
#include "../core/json.h"
#include "tokenizer_internal.h"

#define MAX_TOKENIZER_FILE (1u << 30)

typedef struct Loader {
    Tokenizer *tok;
    const char *name;
    char *err;
    size_t errlen;
} Loader;

static int refuse(Loader *ld, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int refuse(Loader *ld, const char *key, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    mt_set_error(ld->err, ld->errlen, "%s: %s: %s", ld->name, key, what);
    return -1;
}

/* Every member of obj must be in `allowed` (NULL-terminated). */
static int check_keys(Loader *ld, const JsonValue *obj, const char *where, const char *const *allowed) {
    for (size_t i = 0; i < obj->count; i++) {
        int known = 0;
        for (const char *const *a = allowed; *a && !known; a++) known = strcmp(obj->members[i].key, *a) == 0;
        if (known) continue;
        char list[512] = "";
        for (const char *const *a = allowed; *a; a++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", a == allowed ? "" : ", ", *a);
        return refuse(ld, where, "key \"%s\" is not supported (known keys: %s)", obj->members[i].key, list);
    }
    return 0;
}

static int want_object(Loader *ld, const JsonValue *v, const char *key) {
    if (!v || v->type != JSON_OBJECT)
        return refuse(ld, key, "expected an object, found %s", v ? json_type_name(v->type) : "nothing");
    return 0;
}

/* The string member `key` of obj (required), or NULL after refusing. */
static const JsonValue *get_string(Loader *ld, const JsonValue *obj, const char *key, const char *where) {
    const JsonValue *v = json_get(obj, key);
    if (!v || v->type != JSON_STRING) {
        char at[256];
        snprintf(at, sizeof at, "%s.%s", where, key);
        refuse(ld, at, "expected a string, found %s", v ? json_type_name(v->type) : "nothing");
        return NULL;
    }
    return v;
}

/* An optional boolean member: absent or null gives `fallback`. */
static int get_bool(Loader *ld, const JsonValue *obj, const char *key, const char *where, bool fallback, bool *out) {
    const JsonValue *v = json_get(obj, key);
    *out = fallback;
    if (!v || v->type == JSON_NULL) return 0;
    if (v->type != JSON_BOOL) {
        char at[256];
        snprintf(at, sizeof at, "%s.%s", where, key);
        return refuse(ld, at, "expected true or false, found %s", json_type_name(v->type));
    }
    *out = v->boolean;
    return 0;
}

static const char *type_of(Loader *ld, const JsonValue *obj, const char *where) {
    const JsonValue *t = get_string(ld, obj, "type", where);
    return t ? t->string : NULL;
}

/* ---- normalizer ---- */

static int load_normalizer(Loader *ld, const JsonValue *v, const char *where) {
    if (want_object(ld, v, where) != 0) return -1;
    const char *type = type_of(ld, v, where);
    if (!type) return -1;
    Tokenizer *tok = ld->tok;
    char at[256];
    snprintf(at, sizeof at, "%s.type", where);
    if (strcmp(type, "Sequence") == 0) {
        static const char *const keys[] = {"type", "normalizers", NULL};
        if (check_keys(ld, v, where, keys) != 0) return -1;
        const JsonValue *list = json_get(v, "normalizers");
        snprintf(at, sizeof at, "%s.normalizers", where);
        if (!list || list->type != JSON_ARRAY) return refuse(ld, at, "expected an array");
        for (size_t i = 0; i < list->count; i++) {
            char item[256];
            snprintf(item, sizeof item, "%s.normalizers[%zu]", where, i);
            if (load_normalizer(ld, list->items[i], item) != 0) return -1;
        }
        return 0;
    }
    if (tok->norm_count == TOK_MAX_NORMALIZERS) return refuse(ld, where, "more than %d normalizers", TOK_MAX_NORMALIZERS);
    Normalizer *nm = &tok->norms[tok->norm_count];
    static const char *const forms[] = {"NFC", "NFD", "NFKC", "NFKD"};
    for (int f = 0; f < 4; f++) {
        if (strcmp(type, forms[f]) != 0) continue;
        static const char *const keys[] = {"type", NULL};
        if (check_keys(ld, v, where, keys) != 0) return -1;
        nm->kind = (NormKind)(NORM_NFC + f);
        tok->norm_count++;
        return 0;
    }
    if (strcmp(type, "Prepend") == 0) {
        static const char *const keys[] = {"type", "prepend", NULL};
        const JsonValue *s;
        if (check_keys(ld, v, where, keys) != 0 || !(s = get_string(ld, v, "prepend", where))) return -1;
        nm->kind = NORM_PREPEND;
        nm->text = mt_malloc(s->string_len + 1);
        memcpy(nm->text, s->string, s->string_len + 1);
        nm->text_len = s->string_len;
        tok->norm_count++;
        return 0;
    }
    if (strcmp(type, "Replace") == 0) {
        static const char *const keys[] = {"type", "pattern", "content", NULL};
        if (check_keys(ld, v, where, keys) != 0) return -1;
        const JsonValue *pattern = json_get(v, "pattern"), *content, *literal;
        snprintf(at, sizeof at, "%s.pattern", where);
        if (want_object(ld, pattern, at) != 0) return -1;
        if (!(literal = json_get(pattern, "String")) || literal->type != JSON_STRING || pattern->count != 1)
            return refuse(ld, at, "only {\"String\": ...} patterns are supported (a Regex replace is not)");
        if (literal->string_len == 0) return refuse(ld, at, "the pattern is empty");
        if (!(content = get_string(ld, v, "content", where))) return -1;
        nm->kind = NORM_REPLACE;
        nm->text = mt_malloc(literal->string_len + 1);
        memcpy(nm->text, literal->string, literal->string_len + 1);
        nm->text_len = literal->string_len;
        nm->content = mt_malloc(content->string_len + 1);
        memcpy(nm->content, content->string, content->string_len + 1);
        nm->content_len = content->string_len;
        tok->norm_count++;
        return 0;
    }
    return refuse(ld, at, "normalizer \"%s\" is not supported (supported: NFC, NFD, NFKC, NFKD, Prepend, Replace, "
                  "Sequence)", type);
}

/* ---- pre-tokenizer ---- */

/* GPT-2's pattern, used by ByteLevel with use_regex (as `tokenizers` spells it). */
static const char gpt2_pattern[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int load_pretokenizer(Loader *ld, const JsonValue *v, const char *where) {
    if (want_object(ld, v, where) != 0) return -1;
    const char *type = type_of(ld, v, where);
    if (!type) return -1;
    Tokenizer *tok = ld->tok;
    char at[256], why[256];
    if (strcmp(type, "Sequence") == 0) {
        static const char *const keys[] = {"type", "pretokenizers", NULL};
        if (check_keys(ld, v, where, keys) != 0) return -1;
        const JsonValue *list = json_get(v, "pretokenizers");
        snprintf(at, sizeof at, "%s.pretokenizers", where);
        if (!list || list->type != JSON_ARRAY) return refuse(ld, at, "expected an array");
        for (size_t i = 0; i < list->count; i++) {
            char item[256];
            snprintf(item, sizeof item, "%s.pretokenizers[%zu]", where, i);
            if (load_pretokenizer(ld, list->items[i], item) != 0) return -1;
        }
        return 0;
    }
    if (tok->pretok_count == TOK_MAX_PRETOKENIZERS)
        return refuse(ld, where, "more than %d pre-tokenizers", TOK_MAX_PRETOKENIZERS);
    PreTokenizer *p = &tok->pretoks[tok->pretok_count];
    if (strcmp(type, "Split") == 0) {
        static const char *const keys[] = {"type", "pattern", "behavior", "invert", NULL};
        if (check_keys(ld, v, where, keys) != 0) return -1;
        const JsonValue *behavior = get_string(ld, v, "behavior", where), *pattern = json_get(v, "pattern"), *re;
        bool invert;
        if (!behavior || get_bool(ld, v, "invert", where, false, &invert) != 0) return -1;
        snprintf(at, sizeof at, "%s.behavior", where);
        if (strcmp(behavior->string, "Isolated") != 0)
            return refuse(ld, at, "\"%s\" is not supported (only Isolated)", behavior->string);
        snprintf(at, sizeof at, "%s.invert", where);
        if (invert) return refuse(ld, at, "true is not supported");
        snprintf(at, sizeof at, "%s.pattern", where);
        if (want_object(ld, pattern, at) != 0) return -1;
        p->kind = PRE_SPLIT;
        tok->pretok_count++;
        if (pattern->count == 1 && (re = json_get(pattern, "Regex")) && re->type == JSON_STRING) {
            if (pretok_compile_regex(p, re->string, re->string_len, why, sizeof why) != 0)
                return refuse(ld, at, "%s", why);
        } else if (pattern->count == 1 && (re = json_get(pattern, "String")) && re->type == JSON_STRING &&
                   re->string_len > 0) {
            if (pretok_compile_literal(p, re->string, re->string_len, why, sizeof why) != 0)
                return refuse(ld, at, "%s", why);
        } else {
            return refuse(ld, at, "expected {\"Regex\": \"...\"} or {\"String\": \"...\"}");
        }
        return 0;
    }
    if (strcmp(type, "ByteLevel") == 0) {
        static const char *const keys[] = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
        bool trim, use_regex;
        if (check_keys(ld, v, where, keys) != 0 ||
            get_bool(ld, v, "add_prefix_space", where, true, &p->add_prefix_space) != 0 ||
            get_bool(ld, v, "trim_offsets", where, true, &trim) != 0 ||
            get_bool(ld, v, "use_regex", where, true, &use_regex) != 0)
            return -1;
        p->kind = PRE_BYTE_LEVEL;
        tok->pretok_count++;
        if (use_regex && pretok_compile_regex(p, gpt2_pattern, sizeof gpt2_pattern - 1, why, sizeof why) != 0)
            return refuse(ld, where, "%s", why);
        return 0;
    }
    if (strcmp(type, "Metaspace") == 0) {
        static const char *const keys[] = {"type", "replacement", "prepend_scheme", "split", "add_prefix_space",
                                           "str_rep", NULL};
        const JsonValue *r = get_string(ld, v, "replacement", where), *scheme = json_get(v, "prepend_scheme");
        bool add_prefix;
        if (check_keys(ld, v, where, keys) != 0 || !r || get_bool(ld, v, "split", where, true, &p->split) != 0 ||
            get_bool(ld, v, "add_prefix_space", where, true, &add_prefix) != 0)
            return -1;
        snprintf(at, sizeof at, "%s.replacement", where);
        if (r->string_len == 0 || r->string_len > 4 ||
            utf8_char_len((const unsigned char *)r->string, r->string_len) != r->string_len)
            return refuse(ld, at, "expected one character");
        memcpy(p->replacement, r->string, r->string_len);
        p->replacement_len = r->string_len;
        p->prepend = add_prefix ? PREPEND_ALWAYS : PREPEND_NEVER;
        snprintf(at, sizeof at, "%s.prepend_scheme", where);
        if (scheme && scheme->type != JSON_NULL) {
            if (scheme->type != JSON_STRING) return refuse(ld, at, "expected \"always\", \"first\" or \"never\"");
            if (strcmp(scheme->string, "always") == 0) p->prepend = PREPEND_ALWAYS;
            else if (strcmp(scheme->string, "first") == 0) p->prepend = PREPEND_FIRST;
            else if (strcmp(scheme->string, "never") == 0) p->prepend = PREPEND_NEVER;
            else return refuse(ld, at, "\"%s\": expected \"always\", \"first\" or \"never\"", scheme->string);
        }
        p->kind = PRE_METASPACE;
        tok->pretok_count++;
        return 0;
    }
    snprintf(at, sizeof at, "%s.type", where);
    return refuse(ld, at, "pre-tokenizer \"%s\" is not supported (supported: Split, ByteLevel, Metaspace, Sequence)",
                  type);
}

/* ---- model ---- */

static int load_merge(Loader *ld, const JsonValue *m, size_t rank) {
    char at[64];
    snprintf(at, sizeof at, "model.merges[%zu]", rank);
    const char *a, *b;
    size_t alen, blen;
    const char *space;
    if (m->type == JSON_STRING && (space = memchr(m->string, ' ', m->string_len))) {
        a = m->string, alen = (size_t)(space - m->string);
        b = space + 1, blen = m->string_len - alen - 1;
        if (memchr(b, ' ', blen)) return refuse(ld, at, "\"%s\": expected two tokens separated by one space", m->string);
    } else if (m->type == JSON_ARRAY && m->count == 2 && m->items[0]->type == JSON_STRING &&
               m->items[1]->type == JSON_STRING) {
        a = m->items[0]->string, alen = m->items[0]->string_len;
        b = m->items[1]->string, blen = m->items[1]->string_len;
    } else {
        return refuse(ld, at, "expected \"A B\" or [\"A\", \"B\"]");
    }
    Bpe *bpe = &ld->tok->bpe;
    int32_t ia = strmap_get(&bpe->vocab, a, alen), ib = strmap_get(&bpe->vocab, b, blen);
    char *joined = mt_malloc(alen + blen + 1);
    memcpy(joined, a, alen);
    memcpy(joined + alen, b, blen);
    int32_t merged = strmap_get(&bpe->vocab, joined, alen + blen);
    free(joined);
    if (ia < 0 || ib < 0 || merged < 0)
        return refuse(ld, at, "%s of the merge \"%.*s\" + \"%.*s\" is not in model.vocab",
                      ia < 0 ? "the first token" : ib < 0 ? "the second token" : "the result", (int)alen, a,
                      (int)blen, b);
    pairmap_put(&bpe->merges, ia, ib, (int32_t)rank, merged);
    return 0;
}

static int optional_empty_string(Loader *ld, const JsonValue *model, const char *key) {
    const JsonValue *v = json_get(model, key);
    if (!v || v->type == JSON_NULL || (v->type == JSON_STRING && v->string_len == 0)) return 0;
    char at[64];
    snprintf(at, sizeof at, "model.%s", key);
    return refuse(ld, at, "only null or \"\" is supported");
}

static int load_model(Loader *ld, const JsonValue *model) {
    if (want_object(ld, model, "model") != 0) return -1;
    const JsonValue *type = json_get(model, "type");
    if (type && (type->type != JSON_STRING || strcmp(type->string, "BPE") != 0))
        return refuse(ld, "model.type", "%s%s%s is not supported (only BPE)", type->type == JSON_STRING ? "\"" : "",
                      type->type == JSON_STRING ? type->string : json_type_name(type->type),
                      type->type == JSON_STRING ? "\"" : "");
    static const char *const keys[] = {"type", "dropout", "unk_token", "continuing_subword_prefix",
                                       "end_of_word_suffix", "fuse_unk", "byte_fallback", "ignore_merges",
                                       "vocab", "merges", NULL};
    if (check_keys(ld, model, "model", keys) != 0) return -1;
    if (!type && !json_get(model, "merges")) return refuse(ld, "model.type", "missing (and no merges: not BPE)");
    Bpe *bpe = &ld->tok->bpe;
    const JsonValue *dropout = json_get(model, "dropout");
    if (dropout && dropout->type != JSON_NULL && !(dropout->type == JSON_NUMBER && dropout->number == 0.0))
        return refuse(ld, "model.dropout", "BPE dropout is not supported (only null)");
    if (optional_empty_string(ld, model, "continuing_subword_prefix") != 0 ||
        optional_empty_string(ld, model, "end_of_word_suffix") != 0 ||
        get_bool(ld, model, "fuse_unk", "model", false, &bpe->fuse_unk) != 0 ||
        get_bool(ld, model, "byte_fallback", "model", false, &bpe->byte_fallback) != 0 ||
        get_bool(ld, model, "ignore_merges", "model", false, &bpe->ignore_merges) != 0)
        return -1;
    const JsonValue *vocab = json_get(model, "vocab"), *merges = json_get(model, "merges");
    if (!vocab || vocab->type != JSON_OBJECT)
        return refuse(ld, "model.vocab", "expected an object of token -> id, found %s",
                      vocab ? json_type_name(vocab->type) : "nothing");
    if (!merges || merges->type != JSON_ARRAY)
        return refuse(ld, "model.merges", "expected an array, found %s", merges ? json_type_name(merges->type) : "nothing");
    strmap_init(&bpe->vocab, vocab->count);
    for (size_t i = 0; i < vocab->count; i++) {
        const JsonMember *m = &vocab->members[i];
        int64_t id;
        if (json_as_int64(m->value, &id) != 0 || id < 0 || id >= TOK_ID_LIMIT) {
            char at[96];
            snprintf(at, sizeof at, "model.vocab[\"%.40s\"]", m->key);
            return refuse(ld, at, "expected an id in 0..%d", TOK_ID_LIMIT - 1);
        }
        strmap_put(&bpe->vocab, m->key, m->key_len, (int32_t)id);
        if (id + 1 > ld->tok->vocab_size) ld->tok->vocab_size = id + 1;
    }
    pairmap_init(&bpe->merges, merges->count);
    for (size_t i = 0; i < merges->count; i++)
        if (load_merge(ld, merges->items[i], i) != 0) return -1;
    const JsonValue *unk = json_get(model, "unk_token");
    if (unk && unk->type != JSON_NULL) {
        if (unk->type != JSON_STRING) return refuse(ld, "model.unk_token", "expected a string or null");
        bpe->unk_id = strmap_get(&bpe->vocab, unk->string, unk->string_len);
        if (bpe->unk_id < 0) return refuse(ld, "model.unk_token", "\"%s\" is not in model.vocab", unk->string);
    }
    bpe_index_chars(bpe);
    if (bpe->byte_fallback)
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            bpe->byte_ids[b] = strmap_get(&bpe->vocab, name, strlen(name));
        }
    return 0;
}

/* ---- added tokens ---- */

/* The id `tokenizers` gives an added token (AddedVocabulary::add_tokens): the
 * id of the same content added before, else its model vocabulary id, else the
 * next free one (the model's entry count, or one past the largest added id
 * when that is at least the count). The "id" in the file is not used: a file
 * whose ids differ gets `tokenizers`' ids, with a warning at load. */
static int32_t added_token_id(const Tokenizer *tok, const char *content, size_t len) {
    int32_t max_added = -1;
    for (int i = 0; i < tok->added_count; i++) {
        const AddedToken *a = &tok->added[i];
        if (a->content_len == len && memcmp(a->content, content, len) == 0) return a->id;
        if (a->id > max_added) max_added = a->id;
    }
    int32_t id = strmap_get(&tok->bpe.vocab, content, len);
    if (id >= 0) return id;
    int32_t count = (int32_t)tok->bpe.vocab.count;
    if (max_added < 0) return count;
    return max_added >= count || count == 0 ? max_added + 1 : count;
}

static int load_added_tokens(Loader *ld, const JsonValue *list) {
    if (!list || list->type == JSON_NULL) return 0;
    if (list->type != JSON_ARRAY) return refuse(ld, "added_tokens", "expected an array");
    Tokenizer *tok = ld->tok;
    tok->added = mt_calloc(list->count + 1, sizeof *tok->added);
    for (size_t i = 0; i < list->count; i++) {
        char where[64];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        const JsonValue *t = list->items[i], *content;
        if (want_object(ld, t, where) != 0) return -1;
        static const char *const keys[] = {"id", "content", "single_word", "lstrip", "rstrip", "normalized",
                                           "special", NULL};
        if (check_keys(ld, t, where, keys) != 0 || !(content = get_string(ld, t, "content", where))) return -1;
        AddedToken *a = &tok->added[tok->added_count];
        int64_t id;
        if (json_as_int64(json_get(t, "id"), &id) != 0 || id < 0 || id >= TOK_ID_LIMIT) {
            char at[80];
            snprintf(at, sizeof at, "%s.id", where);
            return refuse(ld, at, "expected an id in 0..%d", TOK_ID_LIMIT - 1);
        }
        if (content->string_len == 0) {
            char at[80];
            snprintf(at, sizeof at, "%s.content", where);
            return refuse(ld, at, "is empty");
        }
        static const char *const flags[] = {"single_word", "lstrip", "rstrip"};
        for (int f = 0; f < 3; f++) {
            bool set;
            if (get_bool(ld, t, flags[f], where, false, &set) != 0) return -1;
            char at[80];
            snprintf(at, sizeof at, "%s.%s", where, flags[f]);
            if (set) return refuse(ld, at, "true is not supported (token \"%s\")", content->string);
        }
        bool special;
        if (get_bool(ld, t, "special", where, false, &special) != 0 ||
            get_bool(ld, t, "normalized", where, !special, &a->normalized) != 0)
            return -1;
        a->special = special;
        a->id = added_token_id(tok, content->string, content->string_len);
        if (a->id != (int32_t)id) tok->ids_reassigned++;
        a->content = mt_malloc(content->string_len + 1);
        memcpy(a->content, content->string, content->string_len + 1);
        a->content_len = content->string_len;
        tok->added_count++;
        if (a->id + 1 > tok->vocab_size) tok->vocab_size = a->id + 1;
    }
    return 0;
}

/* What each added token matches: normalized ones through the normalizers. */
static void prepare_added_matches(Tokenizer *tok) {
    char *norm_out = NULL, *norm_tmp = NULL;
    size_t norm_out_cap = 0, norm_tmp_cap = 0;
    for (int i = 0; i < tok->added_count; i++) {
        AddedToken *a = &tok->added[i];
        size_t n = a->content_len;
        const char *src = a->content;
        if (a->normalized && tok->norm_count)
            n = normalize_text(tok->norms, tok->norm_count, a->content, a->content_len, &norm_out, &norm_out_cap,
                               &norm_tmp, &norm_tmp_cap),
            src = norm_out;
        a->match = mt_malloc(n + 1);
        memcpy(a->match, src, n);
        a->match[n] = '\0';
        a->match_len = n;
    }
    free(norm_out);
    free(norm_tmp);
    added_matcher_build(&tok->raw_matcher, tok->added, tok->added_count, false);
    added_matcher_build(&tok->normalized_matcher, tok->added, tok->added_count, true);
}

/* id -> its token, for decoding: an added token's content (a normalized one's
 * as the normalizers make it, "magic" -> "\u2581magic" under Llama 2's
 * Prepend: `tokenizers` 0.23 decodes that, so the space before it comes back),
 * else the model vocabulary entry (the map's keys stay where they are). */
static void index_tokens(Tokenizer *tok) {
    const StrMap *v = &tok->bpe.vocab;
    size_t n = (size_t)tok->vocab_size;
    tok->token_text = mt_calloc(n + 1, sizeof *tok->token_text);
    tok->token_len = mt_calloc(n + 1, sizeof *tok->token_len);
    tok->token_special = mt_calloc(n + 1, sizeof *tok->token_special);
    for (size_t i = 0; v->entries && i < v->cap; i++) {
        const StrEntry *e = &v->entries[i];
        if (!e->hash || (size_t)e->value >= n) continue;
        tok->token_text[e->value] = strmap_key(v, e);
        tok->token_len[e->value] = e->key_len;
    }
    for (int i = 0; i < tok->added_count; i++) {
        const AddedToken *a = &tok->added[i];
        tok->token_text[a->id] = a->match;
        tok->token_len[a->id] = (uint32_t)a->match_len;
        tok->token_special[a->id] = a->special;
    }
}

/* The last SpecialToken after the $A sequence of a TemplateProcessing
 * "single" template (found inside a Sequence too), and the first before it. */
static void find_template_specials(Tokenizer *tok, const JsonValue *pp) {
    if (!pp || pp->type != JSON_OBJECT) return;
    const JsonValue *type = json_get(pp, "type");
    if (!type || type->type != JSON_STRING) return;
    if (strcmp(type->string, "Sequence") == 0) {
        const JsonValue *list = json_get(pp, "processors");
        if (list && list->type == JSON_ARRAY)
            for (size_t i = 0; i < list->count; i++) find_template_specials(tok, list->items[i]);
        return;
    }
    const JsonValue *single = json_get(pp, "single");
    if (strcmp(type->string, "TemplateProcessing") != 0 || !single || single->type != JSON_ARRAY) return;
    int after_a = 0;
    for (size_t i = 0; i < single->count; i++) {
        const JsonValue *piece = single->items[i], *special = json_get(piece, "SpecialToken"), *id;
        if (json_get(piece, "Sequence")) after_a = 1;
        if (!special || !(id = json_get(special, "id")) || id->type != JSON_STRING) continue;
        if (after_a) {
            free(tok->template_eos);
            tok->template_eos = mt_strdup(id->string);
        } else if (!tok->template_bos) {
            tok->template_bos = mt_strdup(id->string);
        }
    }
}

static int load_root(Loader *ld, const JsonValue *root) {
    if (!root || root->type != JSON_OBJECT) return refuse(ld, "(top level)", "expected an object");
    static const char *const keys[] = {"version", "truncation", "padding", "added_tokens", "normalizer",
                                       "pre_tokenizer", "post_processor", "decoder", "model", NULL};
    if (check_keys(ld, root, "(top level)", keys) != 0) return -1;
    static const char *const unset[] = {"truncation", "padding"};
    for (int i = 0; i < 2; i++) {
        const JsonValue *v = json_get(root, unset[i]);
        if (v && v->type != JSON_NULL) return refuse(ld, unset[i], "must be null (megatrain encodes whole documents)");
    }
    const JsonValue *model = json_get(root, "model"), *v;
    if (!model) return refuse(ld, "model", "missing");
    if (load_model(ld, model) != 0 || load_added_tokens(ld, json_get(root, "added_tokens")) != 0) return -1;
    if ((v = json_get(root, "normalizer")) && v->type != JSON_NULL && load_normalizer(ld, v, "normalizer") != 0)
        return -1;
    if ((v = json_get(root, "pre_tokenizer")) && v->type != JSON_NULL &&
        load_pretokenizer(ld, v, "pre_tokenizer") != 0)
        return -1;
    find_template_specials(ld->tok, json_get(root, "post_processor"));
    prepare_added_matches(ld->tok);
    index_tokens(ld->tok);
    decoder_load(ld->tok, json_get(root, "decoder"));
    return 0;
}

/* ---- files ---- */

/* eos_token of tokenizer_config.json in dir (a string or {"content": ...}):
 * 0 with *out (NULL when the file or key is absent), or -1 with err. */
static int read_config_eos(const char *dir, char **out, char *err, size_t errlen) {
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) return 0;
    JsonValue *root = json_parse_file(path, MAX_TOKENIZER_FILE, err, errlen);
    if (!root) return -1;
    const JsonValue *eos = json_get(root, "eos_token");
    if (eos && eos->type == JSON_OBJECT) eos = json_get(eos, "content");
    if (eos && eos->type == JSON_STRING && eos->string_len) *out = mt_strdup(eos->string);
    else if (eos && eos->type != JSON_NULL) /* a number, an empty string...: said, not passed over */
        mt_warn("%s: eos_token is %s, not a token's text: not used for the end of document", path,
                eos->type == JSON_STRING ? "an empty string" : "not a string");
    json_free(root);
    return 0;
}

Tokenizer *tokenizer_load_json(const char *text, size_t len, const char *name, char *err, size_t errlen) {
    byte_level_map_build(); /* before any thread encodes */
    char why[256];
    JsonValue *root = json_parse(text, len, why, sizeof why);
    if (!root) {
        mt_set_error(err, errlen, "%s: %s", name ? name : "tokenizer.json", why);
        return NULL;
    }
    Tokenizer *tok = mt_calloc(1, sizeof *tok);
    bpe_init(&tok->bpe);
    tok->path = mt_strdup(name ? name : "tokenizer.json");
    Loader ld = {tok, tok->path, err, errlen};
    int rc = load_root(&ld, root);
    json_free(root);
    if (rc != 0) {
        tokenizer_free(tok);
        return NULL;
    }
    return tok;
}

Tokenizer *tokenizer_load(const char *path, char *err, size_t errlen) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        mt_set_error(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    char file[4200], dir[4096];
    if (strlen(path) >= sizeof dir) {
        mt_set_error(err, errlen, "%.100s...: path too long", path);
        return NULL;
    }
    if (S_ISDIR(sb.st_mode)) {
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
        snprintf(dir, sizeof dir, "%s", path);
        if (stat(file, &sb) != 0) {
            mt_set_error(err, errlen, "%s: a directory without tokenizer.json", path);
            return NULL;
        }
    } else {
        snprintf(file, sizeof file, "%s", path);
        const char *slash = strrchr(path, '/');
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    }
    size_t len;
    char *text = mt_read_file(file, MAX_TOKENIZER_FILE, &len, err, errlen);
    if (!text) return NULL;
    Tokenizer *tok = tokenizer_load_json(text, len, file, err, errlen);
    free(text);
    if (tok && tok->ids_reassigned)
        mt_warn("%s: %d added token(s) have an \"id\" other than the one Hugging Face tokenizers gives them "
                "(the model vocabulary's id, else the next free one); using tokenizers' ids", file,
                tok->ids_reassigned);
    if (tok && read_config_eos(dir, &tok->config_eos, err, errlen) != 0) {
        tokenizer_free(tok);
        return NULL;
    }
    return tok;
}

void tokenizer_free(Tokenizer *tok) {
    if (!tok) return;
    for (int i = 0; i < tok->norm_count; i++) {
        free(tok->norms[i].text);
        free(tok->norms[i].content);
    }
    for (int i = 0; i < TOK_MAX_PRETOKENIZERS; i++) pretok_free(&tok->pretoks[i]);
    bpe_free(&tok->bpe);
    for (int i = 0; i < tok->added_count; i++) {
        free(tok->added[i].content);
        free(tok->added[i].match);
    }
    free(tok->added);
    added_matcher_free(&tok->raw_matcher);
    added_matcher_free(&tok->normalized_matcher);
    token_encoder_free(tok->encoder);
    decoder_free(tok);
    free(tok->token_text);
    free(tok->token_len);
    free(tok->token_special);
    free(tok->config_eos);
    free(tok->template_eos);
    free(tok->template_bos);
    free(tok->path);
    free(tok);
}
