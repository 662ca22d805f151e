/* tokenizer_encode.c: text -> ids, in the order of `tokenizers`
 * (TokenizerImpl::encode_single_sequence with add_special_tokens=False):
 * 1. added tokens with normalized=false are cut out of the raw text;
 * 2. each piece between them is normalized, and added tokens with
 *    normalized=true cut out of the normalized text;
 * 3. each remaining piece goes through the pre-tokenizers and BPE.
 * Encoders (one per thread) hold everything encoding writes. Also the
 * lookups by token text and the end-of-document rule. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "tokenizer_internal.h"

TokenEncoder *token_encoder_new(const Tokenizer *tok) {
    TokenEncoder *e = mt_calloc(1, sizeof *e);
    e->tok = tok;
    for (int i = 0; i < tok->pretok_count; i++) e->match_data[i] = pretok_match_data(&tok->pretoks[i]);
    return e;
}

void token_encoder_free(TokenEncoder *e) {
    if (!e) return;
    for (int i = 0; i < TOK_MAX_PRETOKENIZERS; i++) {
        pretok_match_data_free(e->match_data[i]);
        free(e->step_buf[i]);
    }
    word_cache_free(&e->cache);
    bpe_work_free(&e->work);
    free(e->clean);
    free(e->norm_out);
    free(e->norm_tmp);
    free(e);
}

static void encode_normalized_piece(TokenEncoder *e, const char *s, size_t n, bool at_origin, TokenIds *out) {
    const Tokenizer *tok = e->tok;
    size_t pos = 0;
    while (pos < n) {
        int index;
        size_t match_len, at = added_matcher_find(&tok->normalized_matcher, s, n, pos, &index, &match_len);
        if (at > pos) pretok_run(e, 0, s + pos, at - pos, at_origin && pos == 0, out);
        if (at == n) break;
        token_ids_push(out, tok->added[index].id);
        pos = at + match_len;
    }
}

static void encode_raw_piece(TokenEncoder *e, const char *s, size_t n, bool at_origin, TokenIds *out) {
    const Tokenizer *tok = e->tok;
    if (tok->norm_count == 0) {
        encode_normalized_piece(e, s, n, at_origin, out);
        return;
    }
    size_t len = normalize_text(tok->norms, tok->norm_count, s, n, &e->norm_out, &e->norm_out_cap, &e->norm_tmp,
                                &e->norm_tmp_cap);
    /* pieces are encoded one after the other: norm_out is free again afterwards */
    encode_normalized_piece(e, e->norm_out, len, at_origin, out);
}

void token_encoder_encode(TokenEncoder *e, const char *text, size_t len, TokenIds *out) {
    size_t clean_len = utf8_sanitize(text, len, &e->clean, &e->clean_cap);
    if (clean_len) text = e->clean, len = clean_len;
    size_t pos = 0;
    while (pos < len) {
        int index;
        size_t match_len, at = added_matcher_find(&e->tok->raw_matcher, text, len, pos, &index, &match_len);
        if (at > pos) encode_raw_piece(e, text + pos, at - pos, pos == 0, out);
        if (at == len) break;
        token_ids_push(out, e->tok->added[index].id);
        pos = at + match_len;
    }
}

void tokenizer_encode(Tokenizer *tok, const char *text, size_t len, TokenIds *out) {
    if (!tok->encoder) tok->encoder = token_encoder_new(tok);
    token_encoder_encode(tok->encoder, text, len, out);
}

int64_t tokenizer_vocab_size(const Tokenizer *tok) { return tok->vocab_size; }

const char *tokenizer_path(const Tokenizer *tok) { return tok->path; }

static const AddedToken *find_added(const Tokenizer *tok, const char *text) {
    size_t n = strlen(text);
    for (int i = 0; i < tok->added_count; i++)
        if (tok->added[i].content_len == n && memcmp(tok->added[i].content, text, n) == 0) return &tok->added[i];
    return NULL;
}

int32_t tokenizer_token_id(const Tokenizer *tok, const char *text) {
    const AddedToken *a = find_added(tok, text);
    return a ? a->id : strmap_get(&tok->bpe.vocab, text, strlen(text));
}

int32_t tokenizer_eod(const Tokenizer *tok, const char *eod_text, const char **name, char *err, size_t errlen) {
    const char *pick = eod_text, *from = "--eod-token";
    if (!pick && tok->config_eos) pick = tok->config_eos, from = "eos_token of tokenizer_config.json";
    if (!pick && tok->template_eos) pick = tok->template_eos, from = "the post-processor's template";
    if (!pick) {
        static const char *const known[] = {"<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>"};
        for (int i = 0; i < 4 && !pick; i++) {
            const AddedToken *a = find_added(tok, known[i]);
            if (a && a->special) pick = a->content;
        }
        from = "the special added tokens";
    }
    if (!pick) {
        mt_set_error(err, errlen, "%s: no end-of-document token found (no tokenizer_config.json eos_token, no "
                     "special token after $A in the post-processor, none of <|end_of_text|>, <|endoftext|>, </s>, "
                     "<eos> among the special added tokens); name one with --eod-token TEXT", tok->path);
        return -1;
    }
    int32_t id = tokenizer_token_id(tok, pick);
    if (id < 0) {
        mt_set_error(err, errlen, "%s: end-of-document token \"%s\" (from %s) is neither an added token nor in "
                     "model.vocab", tok->path, pick, from);
        return -1;
    }
    *name = pick;
    return id;
}

int32_t tokenizer_bos(const Tokenizer *tok, const char **name, char *err, size_t errlen) {
    if (!tok->template_bos) {
        mt_set_error(err, errlen, "%s: its post-processor puts no special token before a sequence (no SpecialToken "
                     "before $A in a TemplateProcessing single template): there is no beginning-of-sequence token "
                     "to add", tok->path);
        return -1;
    }
    const int32_t id = tokenizer_token_id(tok, tok->template_bos);
    if (id < 0) {
        mt_set_error(err, errlen, "%s: the post-processor's beginning-of-sequence token \"%s\" is neither an added "
                     "token nor in model.vocab", tok->path, tok->template_bos);
        return -1;
    }
    *name = tok->template_bos;
    return id;
}
