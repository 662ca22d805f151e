/* tokenizer_internal.h: the parts of a Tokenizer shared by its files:
 * the hash maps (tokenizer_map.c), the BPE model (tokenizer_bpe.c), the
 * normalizers and pre-tokenizers (tokenizer_pipeline.c), the added-token
 * matcher (tokenizer_added.c) and the loader (tokenizer_load.c). */
#ifndef MT_TOKENIZE_TOKENIZER_INTERNAL_H
#define MT_TOKENIZE_TOKENIZER_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

struct JsonValue;

/* ---- maps (tokenizer_map.c) ---- */

/* Byte string -> int32, open addressing. Each 32-byte entry holds the key's
 * hash and, up to 8 bytes, the key itself; longer keys are compared in the
 * arena where every key is copied (NUL-terminated). */
typedef struct StrEntry {
    uint64_t hash;     /* 0: empty */
    uint64_t small;    /* the key when key_len <= 8, zero-padded */
    uint32_t key_at, key_len;
    int32_t value, unused;
} StrEntry;

typedef struct StrMap {
    StrEntry *entries;
    size_t cap, count; /* cap: a power of two */
    char *arena;
    size_t arena_len, arena_cap;
} StrMap;

void strmap_init(StrMap *m, size_t expected);
void strmap_free(StrMap *m);
/* Insert or replace. Keys stay at their place in the arena only until the next put. */
void strmap_put(StrMap *m, const char *key, size_t len, int32_t value);
/* The value, or -1 when absent. */
int32_t strmap_get(const StrMap *m, const char *key, size_t len);
/* The key of an entry in use. */
static inline const char *strmap_key(const StrMap *m, const StrEntry *e) { return m->arena + e->key_at; }

/* (id, id) -> (rank, merged id): one 16-byte entry per slot, so a lookup
 * touches one cache line. */
typedef struct PairEntry {
    uint64_t key;     /* (a << 32 | b) + 1; 0 = empty */
    int32_t rank, merged;
} PairEntry;

typedef struct PairMap {
    PairEntry *entries;
    size_t cap, count;
} PairMap;

void pairmap_init(PairMap *m, size_t expected);
void pairmap_free(PairMap *m);
/* Insert or replace (a pair listed twice keeps its last rank, as the
 * HashMap `tokenizers` collects the merges into does). Returns 1 when new. */
int pairmap_put(PairMap *m, int32_t a, int32_t b, int32_t rank, int32_t merged);
/* 1 with rank and merged id, or 0. */
int pairmap_get(const PairMap *m, int32_t a, int32_t b, int32_t *rank, int32_t *merged);

uint64_t tok_hash(const char *s, size_t n);

/* ---- BPE model (tokenizer_bpe.c) ---- */

/* Read-only once loaded: shared by every TokenEncoder of the tokenizer. */
typedef struct Bpe {
    StrMap vocab;
    PairMap merges;
    int32_t unk_id;   /* -1: none */
    bool fuse_unk, byte_fallback, ignore_merges;
    int32_t byte_ids[256]; /* <0xNN> tokens (byte_fallback), -1 when absent */
    int32_t *char_ids;     /* code point < BPE_CHAR_TABLE -> its vocabulary id, -1 when absent */
} Bpe;

#define BPE_CHAR_TABLE 0x10000

/* Fill char_ids from the vocabulary (after loading it). */
void bpe_index_chars(Bpe *bpe);

void bpe_init(Bpe *bpe);
void bpe_free(Bpe *bpe);

/* Encoded words, keyed by the text that produced them. One 64-byte slot
 * (a cache line) per word holds the key and the ids when they are short
 * (WORD_INLINE_KEY bytes, WORD_INLINE_IDS ids: most words), else they go to
 * an arena; emptied when full. */
#define WORD_INLINE_KEY 32
#define WORD_INLINE_IDS 4

typedef struct WordCacheSlot {
    uint64_t hash;        /* 0: empty */
    uint16_t key_len, ids_count;
    uint32_t arena_at;    /* key, then ids (4-byte aligned), when not inline */
    char key[WORD_INLINE_KEY];
    int32_t ids[WORD_INLINE_IDS];
} WordCacheSlot;

typedef struct WordCache {
    WordCacheSlot *slots;
    size_t cap, count;    /* cap: a power of two */
    char *arena;
    size_t arena_len, arena_cap;
} WordCache;

/* The scratch of one BPE merge. */
typedef struct BpeWork {
    int32_t *sym_id, *sym_prev, *sym_next;
    struct BpeMerge *heap;
    size_t sym_cap, heap_cap;
} BpeWork;

void word_cache_free(WordCache *c);
void bpe_work_free(BpeWork *w);
/* The cached ids of `key` appended to out: 1, or 0 when not cached. */
int word_cache_get(WordCache *c, const char *key, size_t len, TokenIds *out);
/* Cache ids[0..n) under key (keys longer than WORD_CACHE_MAX_KEY are not kept). */
void word_cache_put(WordCache *c, const char *key, size_t len, const int32_t *ids, size_t n);
#define WORD_CACHE_MAX_KEY 256
/* Append the ids of one pre-tokenized word (valid UTF-8), without the cache. */
void bpe_merge_word(const Bpe *bpe, BpeWork *w, const char *word, size_t len, TokenIds *out);

/* ---- normalizers and pre-tokenizers (tokenizer_pipeline.c) ---- */

typedef enum { NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_PREPEND, NORM_REPLACE } NormKind;

typedef struct Normalizer {
    NormKind kind;
    char *text;       /* PREPEND: what to prepend; REPLACE: the pattern */
    size_t text_len;
    char *content;    /* REPLACE: the replacement */
    size_t content_len;
} Normalizer;

typedef enum { PRE_SPLIT, PRE_BYTE_LEVEL, PRE_METASPACE } PreKind;
typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } PrependScheme;

typedef struct PreTokenizer {
    PreKind kind;
    void *regex;          /* pcre2_code_8 *: SPLIT, and BYTE_LEVEL with use_regex */
    bool jit;             /* the regex is JIT-compiled (pcre2_jit_match) */
    bool add_prefix_space; /* BYTE_LEVEL */
    char replacement[8];  /* METASPACE: UTF-8 of the replacement character */
    size_t replacement_len;
    PrependScheme prepend;
    bool split;           /* METASPACE */
} PreTokenizer;

/* Compile a tokenizers (Oniguruma) regex with PCRE2 (UTF, UCP, JIT when
 * available). \s and \S are rewritten to Oniguruma's meaning. Returns 0, or
 * -1 with err. */
int pretok_compile_regex(PreTokenizer *p, const char *pattern, size_t len, char *err, size_t errlen);
/* A literal string as a regex (Split with {"String": ...}). */
int pretok_compile_literal(PreTokenizer *p, const char *literal, size_t len, char *err, size_t errlen);
void pretok_free(PreTokenizer *p);

/* Apply the normalizers to text[0..len); the result is in *out (a buffer of
 * the tokenizer) and its length returned. */
size_t normalize_text(const Normalizer *norms, int count, const char *text, size_t len, char **out,
                      size_t *out_cap, char **tmp, size_t *tmp_cap);

/* ---- added tokens (tokenizer_added.c) ---- */

typedef struct AddedToken {
    char *content;    /* as in the file */
    size_t content_len;
    char *match;      /* what is matched: the content, normalized when `normalized` */
    size_t match_len;
    int32_t id;
    bool special, normalized;
} AddedToken;

typedef struct AddedMatcher {
    int32_t *order;     /* token indices, by first byte then longest first */
    uint32_t start[257];
    const AddedToken *tokens;
} AddedMatcher;

/* Build the matcher over the tokens whose `normalized` equals `normalized`. */
void added_matcher_build(AddedMatcher *m, const AddedToken *tokens, int count, bool normalized);
void added_matcher_free(AddedMatcher *m);
/* The leftmost-longest match in text[from..len): its start, with *tok_index
 * and *match_len; or len when none. */
size_t added_matcher_find(const AddedMatcher *m, const char *text, size_t len, size_t from, int *tok_index,
                          size_t *match_len);

/* ---- the decoder (tokenizer_decode.c) ---- */

typedef enum { DEC_BYTE_LEVEL, DEC_METASPACE, DEC_REPLACE, DEC_BYTE_FALLBACK, DEC_FUSE, DEC_STRIP } DecoderKind;

typedef struct Decoder {
    DecoderKind kind;
    char *text;           /* REPLACE: the pattern; METASPACE: the replacement; STRIP: the content */
    size_t text_len;
    char *content;        /* REPLACE: the replacement */
    size_t content_len;
    bool prepend;         /* METASPACE: prepend_scheme is not "never" */
    int start, stop;      /* STRIP */
} Decoder;

/* Ids index a table (decode's id -> token), so they must be below this:
 * 2^24, far above the largest published vocabularies (about 262,000). */
#define TOK_ID_LIMIT (1 << 24)

#define TOK_MAX_DECODERS 8

/* Read the "decoder" section (NULL or null: none). What decode cannot do is
 * not an error for encoding: it is recorded in tok->decoder_error. */
void decoder_load(Tokenizer *tok, const struct JsonValue *v);
void decoder_free(Tokenizer *tok);

/* ---- the tokenizer ---- */

#define TOK_MAX_NORMALIZERS 8
#define TOK_MAX_PRETOKENIZERS 8

struct Tokenizer {
    char *path;
    char *config_eos;       /* eos_token of tokenizer_config.json, or NULL */
    char *template_eos;     /* last special token after $A in the post-processor, or NULL */
    char *template_bos;     /* first special token before $A in the post-processor, or NULL */
    Normalizer norms[TOK_MAX_NORMALIZERS];
    int norm_count;
    PreTokenizer pretoks[TOK_MAX_PRETOKENIZERS];
    int pretok_count;
    Bpe bpe;
    AddedToken *added;
    int added_count;
    int ids_reassigned;     /* added tokens whose "id" in the file differs from tokenizers' */
    AddedMatcher raw_matcher, normalized_matcher;
    int64_t vocab_size;
    Decoder decoders[TOK_MAX_DECODERS];
    int decoder_count;
    bool has_decoder;       /* false: decode joins the tokens with spaces, as `tokenizers` does */
    char *decoder_error;    /* why decode is refused, or NULL */
    const char **token_text; /* id -> its token for decode: the added token's content, else the model
                                vocabulary entry (NULL: none); vocab_size entries */
    uint32_t *token_len;
    bool *token_special;    /* id -> a special added token */
    TokenEncoder *encoder;  /* tokenizer_encode's, made on first use */
};

/* One thread's encoding state (buffers, PCRE2 match data, the word cache):
 * everything encoding writes, so that encoders share their Tokenizer. */
struct TokenEncoder {
    const Tokenizer *tok;
    char *clean, *norm_out, *norm_tmp;
    size_t clean_cap, norm_out_cap, norm_tmp_cap;
    void *match_data[TOK_MAX_PRETOKENIZERS]; /* pcre2_match_data_8 * of each regex step */
    char *step_buf[TOK_MAX_PRETOKENIZERS];   /* each step's output text */
    size_t step_buf_cap[TOK_MAX_PRETOKENIZERS];
    WordCache cache;
    BpeWork work;
};

/* Encode one pre-tokenizer input piece (after normalization and added-token
 * splitting): pre-tokenizers from step `step` on, then BPE. */
void pretok_run(TokenEncoder *e, int step, const char *s, size_t n, bool at_origin, TokenIds *out);
/* The match data for step `step`'s regex (made by token_encoder_new). */
void *pretok_match_data(const PreTokenizer *p);
void pretok_match_data_free(void *match_data);

/* UTF-8 helpers (tokenizer_utf8.c). */
/* Length of the valid UTF-8 character at s (n bytes left), or 0 when invalid. */
size_t utf8_char_len(const unsigned char *s, size_t n);
/* The code point of the valid UTF-8 character at s (k bytes, from utf8_char_len). */
uint32_t utf8_code_point(const unsigned char *s, size_t k);
/* Copy text replacing invalid sequences with U+FFFD (Python's "replace").
 * Returns 0 and leaves *out untouched when text is valid UTF-8, else the new
 * length (in *out). */
size_t utf8_sanitize(const char *text, size_t len, char **out, size_t *cap);
/* The GPT-2 byte-to-unicode map: the UTF-8 of byte b's character, from the
 * table byte_level_map_build made (once per process, under pthread_once;
 * tokenizer_load_json calls it before any thread encodes). */
void byte_level_map_build(void);
const char *byte_level_char(unsigned char b, size_t *len);
/* Make sure *buf holds at least n bytes. */
void tok_reserve(char **buf, size_t *cap, size_t n);

#endif
