/* tokenizer.h: Hugging Face tokenizer.json tokenizers (BPE), encoding text to
 * the ids `tokenizers` gives with add_special_tokens=False.
 *
 * Supported: the byte-level BPE of Llama 3 / 3.1 / 3.2 and Qwen2 / 2.5 / 3
 * (Split regex pre-tokenizer, ByteLevel, NFC) and the SentencePiece-style BPE
 * of Llama 2 / Mistral (Prepend + Replace normalizer or Metaspace, byte
 * fallback, unk). Added tokens are matched before the model, as `tokenizers`
 * does. Anything else a file asks for is refused at load with an error naming
 * the file and the JSON key (docs/data.md lists what is refused). The
 * post-processor is not applied (no bos): data build appends its own
 * end-of-document token.
 *
 * Text that is not valid UTF-8 is read as Python's bytes.decode("utf-8",
 * "replace") reads it: each maximal invalid subpart becomes U+FFFD.
 *
 * Threads: a loaded Tokenizer is read-only. Each thread encodes through its
 * own TokenEncoder (buffers, regex match data and a cache of encoded words);
 * tokenizer_encode uses one the Tokenizer keeps, so one thread at a time.
 * tokenizer_decode only reads the Tokenizer.
 */
#ifndef MT_TOKENIZE_TOKENIZER_H
#define MT_TOKENIZE_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct Tokenizer Tokenizer;
typedef struct TokenEncoder TokenEncoder;

/* A growable list of token ids. */
typedef struct TokenIds {
    int32_t *ids;
    size_t count, cap;
} TokenIds;

void token_ids_push(TokenIds *t, int32_t id);
void token_ids_free(TokenIds *t);

/* Load PATH: a tokenizer.json file, or a directory holding one. Returns NULL
 * with err naming the file and the JSON key on a refused or malformed file. */
Tokenizer *tokenizer_load(const char *path, char *err, size_t errlen);

/* The same from text already in memory; `name` is used in errors and to find
 * tokenizer_config.json (NULL: none is looked for). */
Tokenizer *tokenizer_load_json(const char *text, size_t len, const char *name, char *err, size_t errlen);

void tokenizer_free(Tokenizer *tok);

/* Append the ids of text[0..len) to out (nothing else: no bos, no eos),
 * through the tokenizer's own encoder. */
void tokenizer_encode(Tokenizer *tok, const char *text, size_t len, TokenIds *out);

/* An encoder for one thread; tok must outlive it. */
TokenEncoder *token_encoder_new(const Tokenizer *tok);
void token_encoder_free(TokenEncoder *enc);
/* As tokenizer_encode. */
void token_encoder_encode(TokenEncoder *enc, const char *text, size_t len, TokenIds *out);

/* A growable byte string. */
typedef struct TokenText {
    char *data;
    size_t len, cap;
} TokenText;

void token_text_free(TokenText *t);
/* Append s[0..n) (out stays NUL-terminated). */
void token_text_append(TokenText *t, const char *s, size_t n);

/* out = bytes[0..n) read as UTF-8 as Python's decode("utf-8", "replace")
 * reads them (each maximal invalid subpart becomes U+FFFD), NUL-terminated. */
void token_text_from_bytes(TokenText *out, const char *bytes, size_t n);

/* Append the text of ids[0..n) to out as `tokenizers` decodes them
 * (Tokenizer.decode(ids, skip_special_tokens)): each id's token (an added
 * token's content, else the model vocabulary's entry; unknown ids are
 * dropped), through the file's decoder (ByteLevel, Metaspace, Replace of a
 * string, ByteFallback, Fuse, Strip, Sequence), the bytes read as UTF-8
 * with U+FFFD for invalid sequences. Without a decoder the tokens are joined
 * with spaces. Returns 0, or -1 with err when the file's decoder is one
 * megatrain does not implement (encoding is not affected). */
int tokenizer_decode(const Tokenizer *tok, const int32_t *ids, size_t n, bool skip_special, TokenText *out,
                     char *err, size_t errlen);

/* One more than the largest id of the vocabulary and added tokens. */
int64_t tokenizer_vocab_size(const Tokenizer *tok);

/* The id of a token by its text (an added token's content or a model
 * vocabulary entry), or -1. */
int32_t tokenizer_token_id(const Tokenizer *tok, const char *text);

/* The end-of-document token: `eod_text` when given, else the eos_token of a
 * tokenizer_config.json beside the file, else the last special token of the
 * post-processor's single template after $A, else the first of
 * <|end_of_text|>, <|endoftext|>, </s>, <eos> that is a special added token.
 * Returns its id and sets *name (owned by tok), or -1 with err. */
int32_t tokenizer_eod(const Tokenizer *tok, const char *eod_text, const char **name, char *err, size_t errlen);

/* The beginning-of-sequence token its post-processor puts before a sequence
 * (the first special token before $A in the single template: Llama 3's
 * <|begin_of_text|>), what transformers' encode with add_special_tokens adds
 * in front. Returns its id and sets *name (owned by tok), or -1 with err when
 * the post-processor adds none (Qwen's) or it is no token. */
int32_t tokenizer_bos(const Tokenizer *tok, const char **name, char *err, size_t errlen);

/* The file the tokenizer came from (for messages). */
const char *tokenizer_path(const Tokenizer *tok);

#endif
