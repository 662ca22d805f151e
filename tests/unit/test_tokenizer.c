/* test_tokenizer.c: src/tokenize against Hugging Face `tokenizers`.
 *
 * Every case of tests/fixtures/tokenizers/NAME/expected.json (made by
 * make_fixtures.py with `tokenizers`: Llama 3, Qwen2, GPT-2 style byte-level
 * BPE, Llama 2 and Metaspace SentencePiece-style BPE) must give exactly the
 * recorded ids, and decoding those ids must give exactly the text
 * `tokenizers` decodes them to (so decode(encode(x)) == x wherever it is so
 * in `tokenizers`). Encoders on several threads sharing one Tokenizer give
 * the same ids. Then the rules around them: the vocabulary size, the
 * end-of-document choice, decoders that are refused, and malformed or
 * unsupported tokenizer.json files refused with the file and the JSON key in
 * the message.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/json.h"
#include "tokenize/tokenizer.h"

#define FIXTURES "tests/fixtures/tokenizers"

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    *len = fread(text, 1, (size_t)n, f);
    text[*len] = '\0';
    fclose(f);
    return text;
}

static size_t unhex(const char *hex, char *out) {
    size_t n = strlen(hex) / 2;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        out[i] = (char)v;
    }
    return n;
}

/* decode(ids) must be `decoded` exactly. Returns 1 when it is also the
 * input text (a round trip). */
static int check_decode(const Tokenizer *tok, const char *name, const char *case_name, const TokenIds *ids,
                        const char *decoded_hex, const char *raw, size_t raw_len) {
    char err[1024];
    char *want = malloc(strlen(decoded_hex) / 2 + 1);
    size_t want_len = unhex(decoded_hex, want);
    TokenText text = {0};
    if (tokenizer_decode(tok, ids->ids, ids->count, false, &text, err, sizeof err) != 0) fail_msg("%s", err);
    if (text.len != want_len || memcmp(text.data, want, want_len) != 0)
        fail_msg("%s, case \"%s\": decoded to %zu bytes \"%.60s\", tokenizers decodes to %zu bytes \"%.60s\"", name,
                 case_name, text.len, text.data ? text.data : "", want_len, want);
    int round_trip = want_len == raw_len && memcmp(want, raw, raw_len) == 0;
    token_text_free(&text);
    free(want);
    return round_trip;
}

/* Every case of FIXTURES/name/expected.json gives its ids with tok, and
 * those ids decode as `tokenizers` decodes them. Returns the number of cases
 * checked; fails on the first mismatch. */
static int check_cases(Tokenizer *tok, const char *name) {
    char path[512], err[1024];
    snprintf(path, sizeof path, FIXTURES "/%s/expected.json", name);
    size_t len = 0;
    char *text = slurp(path, &len);
    assert_non_null(text);
    JsonValue *root = json_parse(text, len, err, sizeof err);
    assert_non_null(root);
    const JsonValue *cases = json_get(root, "cases");
    assert_non_null(cases);
    assert_true(cases->count >= 20);
    int round_trips = 0;
    for (size_t c = 0; c < cases->count; c++) {
        const JsonValue *item = cases->items[c], *hex = json_get(item, "hex"), *ids = json_get(item, "ids");
        const char *case_name = json_get(item, "name")->string;
        char *raw = malloc(hex->string_len / 2 + 1);
        size_t n = unhex(hex->string, raw);
        TokenIds got = {0};
        tokenizer_encode(tok, raw, n, &got);
        int same = got.count == ids->count;
        for (size_t i = 0; same && i < got.count; i++) same = got.ids[i] == (int32_t)ids->items[i]->integer;
        if (!same) {
            size_t i = 0;
            while (i < got.count && i < ids->count && got.ids[i] == (int32_t)ids->items[i]->integer) i++;
            fail_msg("%s, case \"%s\": %zu ids, expected %zu; first difference at %zu: got %d, expected %lld", name,
                     case_name, got.count, ids->count, i, i < got.count ? got.ids[i] : -1,
                     i < ids->count ? (long long)ids->items[i]->integer : -1LL);
        }
        /* again: the word cache must give the same ids */
        got.count = 0;
        tokenizer_encode(tok, raw, n, &got);
        assert_int_equal(got.count, ids->count);
        for (size_t i = 0; i < got.count; i++) assert_int_equal(got.ids[i], ids->items[i]->integer);
        round_trips += check_decode(tok, name, case_name, &got, json_get(item, "decoded")->string, raw, n);
        token_ids_free(&got);
        free(raw);
    }
    /* decode(encode(x)) == x for most strings: all but those a normalizer
     * changes, <unk> and invalid UTF-8 (counted in make_fixtures.py's output) */
    static const struct { const char *name; int round_trips; } expected_round_trips[] = {
        {"llama3", 40}, {"qwen2", 35}, {"qwen2_bigid", 35}, {"gpt2", 40}, {"llama2", 37}, {"metaspace", 11}};
    for (size_t k = 0; k < sizeof expected_round_trips / sizeof expected_round_trips[0]; k++)
        if (strcmp(expected_round_trips[k].name, name) == 0) assert_int_equal(round_trips, expected_round_trips[k].round_trips);
    int count = (int)cases->count;
    json_free(root);
    free(text);
    return count;
}

static int check_fixture(const char *name) {
    char path[512], err[1024];
    snprintf(path, sizeof path, FIXTURES "/%s/tokenizer.json", name);
    Tokenizer *tok = tokenizer_load(path, err, sizeof err);
    if (!tok) fail_msg("%s", err);
    int count = check_cases(tok, name);
    tokenizer_free(tok);
    return count;
}

#define BIG_VOCAB 70000

/* qwen2/tokenizer.json with model.vocab padded by "<fN>" entries up to
 * BIG_VOCAB ids, as make_fixtures.py makes qwen2_bigid (too big to commit). */
static Tokenizer *load_qwen2_big(void) {
    char err[1024];
    size_t len = 0;
    char *text = slurp(FIXTURES "/qwen2/tokenizer.json", &len);
    assert_non_null(text);
    Tokenizer *small = tokenizer_load(FIXTURES "/qwen2/tokenizer.json", err, sizeof err);
    assert_non_null(small);
    int32_t count = tokenizer_token_id(small, "<|endoftext|>"); /* the first added token: the vocab's size */
    tokenizer_free(small);
    const char *at = strstr(text, "\"vocab\":{");
    assert_non_null(at);
    size_t head = (size_t)(at - text) + 9, cap = len + 20 * BIG_VOCAB, o = head;
    char *big = malloc(cap);
    memcpy(big, text, head);
    for (int32_t id = count; id < BIG_VOCAB; id++) o += (size_t)sprintf(big + o, "\"<f%d>\":%d,", id, id);
    memcpy(big + o, text + head, len - head);
    o += len - head;
    Tokenizer *tok = tokenizer_load_json(big, o, "qwen2_big", err, sizeof err);
    if (!tok) fail_msg("%s", err);
    free(big);
    free(text);
    return tok;
}

static void test_llama3(void **state) { (void)state; assert_true(check_fixture("llama3") > 0); }
static void test_qwen2(void **state) { (void)state; assert_true(check_fixture("qwen2") > 0); }
static void test_qwen2_bigid(void **state) {
    (void)state;
    Tokenizer *tok = load_qwen2_big();
    assert_true(check_cases(tok, "qwen2_bigid") > 0);
    tokenizer_free(tok);
}
static void test_gpt2(void **state) { (void)state; assert_true(check_fixture("gpt2") > 0); }
static void test_llama2(void **state) { (void)state; assert_true(check_fixture("llama2") > 0); }
static void test_metaspace(void **state) { (void)state; assert_true(check_fixture("metaspace") > 0); }

static Tokenizer *load_fixture(const char *name);

/* Encoders on THREADS threads share one Tokenizer: each encodes every case
 * of the fixture ROUNDS times (its word cache filling up, then hit) and must
 * get the recorded ids every time. */
#define THREADS 4
#define ROUNDS 20

typedef struct SharedCase {
    char *raw;
    size_t len;
    int32_t *ids;
    size_t count;
} SharedCase;

typedef struct SharedWork {
    const Tokenizer *tok;
    const SharedCase *cases;
    size_t ncases;
    int mismatches;
} SharedWork;

static void *encode_on_thread(void *arg) {
    SharedWork *w = arg;
    TokenEncoder *enc = token_encoder_new(w->tok);
    TokenIds got = {0};
    for (int r = 0; r < ROUNDS; r++)
        for (size_t c = 0; c < w->ncases; c++) {
            got.count = 0;
            token_encoder_encode(enc, w->cases[c].raw, w->cases[c].len, &got);
            if (got.count != w->cases[c].count ||
                (got.count && memcmp(got.ids, w->cases[c].ids, got.count * sizeof *got.ids) != 0))
                w->mismatches++;
        }
    token_ids_free(&got);
    token_encoder_free(enc);
    return NULL;
}

static void check_threads(const char *name) {
    char path[512], err[1024];
    Tokenizer *tok = load_fixture(name);
    snprintf(path, sizeof path, FIXTURES "/%s/expected.json", name);
    size_t len = 0;
    char *text = slurp(path, &len);
    JsonValue *root = json_parse(text, len, err, sizeof err);
    const JsonValue *cases = json_get(root, "cases");
    SharedCase *sc = calloc(cases->count, sizeof *sc);
    for (size_t c = 0; c < cases->count; c++) {
        const JsonValue *hex = json_get(cases->items[c], "hex"), *ids = json_get(cases->items[c], "ids");
        sc[c].raw = malloc(hex->string_len / 2 + 1);
        sc[c].len = unhex(hex->string, sc[c].raw);
        sc[c].count = ids->count;
        sc[c].ids = malloc((ids->count + 1) * sizeof *sc[c].ids);
        for (size_t i = 0; i < ids->count; i++) sc[c].ids[i] = (int32_t)ids->items[i]->integer;
    }
    pthread_t threads[THREADS];
    SharedWork work[THREADS];
    for (int t = 0; t < THREADS; t++) {
        work[t] = (SharedWork){tok, sc, cases->count, 0};
        assert_int_equal(pthread_create(&threads[t], NULL, encode_on_thread, &work[t]), 0);
    }
    for (int t = 0; t < THREADS; t++) {
        pthread_join(threads[t], NULL);
        if (work[t].mismatches) fail_msg("%s: thread %d got other ids %d times", name, t, work[t].mismatches);
    }
    for (size_t c = 0; c < cases->count; c++) {
        free(sc[c].raw);
        free(sc[c].ids);
    }
    free(sc);
    json_free(root);
    free(text);
    tokenizer_free(tok);
}

static void test_threads(void **state) {
    (void)state;
    static const char *const names[] = {"llama3", "qwen2", "gpt2", "llama2", "metaspace"};
    for (int i = 0; i < 5; i++) check_threads(names[i]);
}

/* Decoders (expected texts from `tokenizers` 0.23.3 with the same files):
 * skip_special drops special tokens; no decoder joins tokens with spaces; a decoder megatrain does not implement refuses decoding (naming
 * the file and key) but not loading or encoding; ByteFallback's invalid
 * bytes become one U+FFFD each, Strip and Metaspace as `tokenizers` does. */
static void test_decode_rules(void **state) {
    (void)state;
    char err[1024];
    Tokenizer *tok = load_fixture("llama3");
    TokenIds ids = {0};
    tokenizer_encode(tok, "<|begin_of_text|>Hi<|end_of_text|>", 34, &ids);
    TokenText text = {0};
    assert_int_equal(tokenizer_decode(tok, ids.ids, ids.count, true, &text, err, sizeof err), 0);
    assert_string_equal(text.data, "Hi");
    text.len = 0;
    int32_t unknown[] = {-5, 1 << 30};
    assert_int_equal(tokenizer_decode(tok, unknown, 2, false, &text, err, sizeof err), 0);
    assert_int_equal(text.len, 0);
    token_text_free(&text);
    token_ids_free(&ids);
    tokenizer_free(tok);

    static const struct { const char *decoder; int32_t ids[6]; size_t n; const char *want; } cases[] = {
        {"null", {0, 1, 2}, 3, "\u2581a b  \u2581c"},
        {"{\"type\": \"Metaspace\", \"replacement\": \"\u2581\", \"prepend_scheme\": \"first\", \"split\": false}",
         {0, 2, 0}, 3, "a c a"},
        {"{\"type\": \"Metaspace\", \"replacement\": \"\u2581\", \"prepend_scheme\": \"never\"}", {0, 1}, 2, " ab "},
        {"{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}]}",
         {3, 4, 1, 5, 4, 6}, 6, "\xc3\xa9" "b " "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"\u2581\"}, "
         "\"content\": \" \"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 1}]}",
         {0, 1, 2}, 3, "ab  c"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[1024];
        snprintf(json, sizeof json, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\u2581a\": 0, \"b \": 1, "
                 "\"\u2581c\": 2, \"<0xC3>\": 3, \"<0xA9>\": 4, \"<0x+F>\": 5, \"<0x41>\": 6}, \"merges\": []}, "
                 "\"decoder\": %s}", cases[i].decoder);
        tok = tokenizer_load_json(json, strlen(json), "dec.json", err, sizeof err);
        if (!tok) fail_msg("case %zu: %s", i, err);
        TokenText out = {0};
        assert_int_equal(tokenizer_decode(tok, cases[i].ids, cases[i].n, false, &out, err, sizeof err), 0);
        if (strcmp(out.data, cases[i].want) != 0) fail_msg("case %zu: \"%s\", expected \"%s\"", i, out.data, cases[i].want);
        token_text_free(&out);
        tokenizer_free(tok);
    }

    const char *wordpiece = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
                            "\"decoder\": {\"type\": \"WordPiece\", \"prefix\": \"##\", \"cleanup\": true}}";
    tok = tokenizer_load_json(wordpiece, strlen(wordpiece), "wp.json", err, sizeof err);
    if (!tok) fail_msg("%s", err);
    ids = (TokenIds){0};
    tokenizer_encode(tok, "aa", 2, &ids);
    assert_int_equal(ids.count, 2);
    TokenText out = {0};
    assert_int_equal(tokenizer_decode(tok, ids.ids, ids.count, false, &out, err, sizeof err), -1);
    if (!strstr(err, "wp.json: decoder: ") || !strstr(err, "\"WordPiece\" is not supported"))
        fail_msg("error \"%s\" lacks the file, key or decoder", err);
    token_ids_free(&ids);
    tokenizer_free(tok);
}

static Tokenizer *load_fixture(const char *name) {
    char path[512], err[1024];
    snprintf(path, sizeof path, FIXTURES "/%s", name); /* a directory holding tokenizer.json */
    Tokenizer *tok = tokenizer_load(path, err, sizeof err);
    if (!tok) fail_msg("%s", err);
    return tok;
}

static void test_vocab_size_and_eod(void **state) {
    (void)state;
    char err[1024];
    const char *name = NULL;
    Tokenizer *tok = load_qwen2_big();
    assert_int_equal(tokenizer_vocab_size(tok), 70006); /* added tokens 70000..70005 */
    assert_int_equal(tokenizer_eod(tok, NULL, &name, err, sizeof err), 70000);
    assert_string_equal(name, "<|endoftext|>");
    assert_int_equal(tokenizer_eod(tok, "<|im_end|>", &name, err, sizeof err), 70002);
    assert_int_equal(tokenizer_eod(tok, "<nope>", &name, err, sizeof err), -1);
    assert_non_null(strstr(err, "\"<nope>\""));
    tokenizer_free(tok);

    tok = load_fixture("llama3");
    int32_t end_of_text = tokenizer_token_id(tok, "<|end_of_text|>");
    assert_true(end_of_text > 0);
    assert_int_equal(tokenizer_eod(tok, NULL, &name, err, sizeof err), end_of_text);
    assert_int_equal(tokenizer_vocab_size(tok), tokenizer_token_id(tok, "<|python_tag|>") + 1);
    assert_true(tokenizer_token_id(tok, "Ġthe") > 255); /* a model vocabulary entry */
    tokenizer_free(tok);

    tok = load_fixture("llama2");
    assert_int_equal(tokenizer_eod(tok, NULL, &name, err, sizeof err), 2);
    assert_string_equal(name, "</s>");
    tokenizer_free(tok);
}

/* A tokenizer_config.json beside the file names the eos. */
static void test_eod_from_config(void **state) {
    (void)state;
    char dir[] = "/tmp/mt_tok_XXXXXX", path[256], cmd[512], err[1024];
    assert_non_null(mkdtemp(dir));
    snprintf(cmd, sizeof cmd, "cp " FIXTURES "/qwen2/tokenizer.json %s/", dir);
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"eos_token\": {\"content\": \"<|im_end|>\", \"special\": true}, \"model_max_length\": 32768}", f);
    fclose(f);
    Tokenizer *tok = tokenizer_load(dir, err, sizeof err);
    if (!tok) fail_msg("%s", err);
    const char *name;
    assert_int_equal(tokenizer_eod(tok, NULL, &name, err, sizeof err), tokenizer_token_id(tok, "<|im_end|>"));
    tokenizer_free(tok);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* A tokenizer with nothing that looks like an end of document needs --eod-token. */
static void test_eod_missing(void **state) {
    (void)state;
    const char *json = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}}";
    char err[1024];
    Tokenizer *tok = tokenizer_load_json(json, strlen(json), "t.json", err, sizeof err);
    if (!tok) fail_msg("%s", err);
    const char *name;
    assert_int_equal(tokenizer_eod(tok, NULL, &name, err, sizeof err), -1);
    assert_non_null(strstr(err, "--eod-token"));
    TokenIds ids = {0};
    tokenizer_encode(tok, "abba", 4, &ids);
    assert_int_equal(ids.count, 3); /* ab b a */
    assert_int_equal(ids.ids[0], 2);
    assert_int_equal(ids.ids[1], 1);
    assert_int_equal(ids.ids[2], 0);
    token_ids_free(&ids);
    tokenizer_free(tok);
}

/* Each bad file is refused, the error naming the file and these words. */
static void test_refused(void **state) {
    (void)state;
    static const struct { const char *json, *words[2]; } bad[] = {
        {"{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}", {"model.type", "Unigram"}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", {"model.merges", "expected an array"}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a c\"]}}", {"model.merges[0]", "not in model.vocab"}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a\"]}}", {"model.merges[0]", "expected"}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}, \"merges\": []}}", {"model.vocab[\"a\"]", "expected an id"}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 16777216}, \"merges\": []}}", {"model.vocab[\"a\"]", "0..16777215"}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": [], \"dropout\": 0.1}}", {"model.dropout", "not supported"}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": [], \"continuing_subword_prefix\": \"##\"}}", {"model.continuing_subword_prefix", "null"}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": [], \"unk_token\": \"<unk>\"}}", {"model.unk_token", "not in model.vocab"}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": [], \"colour\": 1}}", {"model", "\"colour\""}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, \"normalizer\": {\"type\": \"Lowercase\"}}", {"normalizer.type", "Lowercase"}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"StripAccents\"}]}}", {"normalizer.normalizers[1].type", "StripAccents"}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, \"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"Regex\": \" +\"}, \"content\": \" \"}}", {"normalizer.pattern", "Regex"}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Whitespace\"}}", {"pre_tokenizer.type", "Whitespace"}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Removed\", \"invert\": false}]}}", {"pre_tokenizer.pretokenizers[0].behavior", "Removed"}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\", \"invert\": false}}", {"pre_tokenizer.pattern", "does not compile"}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Isolated\", \"invert\": true}}", {"pre_tokenizer.invert", "true"}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"_\", \"prepend_scheme\": \"sometimes\"}}", {"pre_tokenizer.prepend_scheme", "sometimes"}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, \"added_tokens\": [{\"id\": 0, \"content\": \"<x>\", \"lstrip\": true, \"special\": true}]}", {"added_tokens[0].lstrip", "<x>"}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, \"added_tokens\": [{\"content\": \"<x>\"}]}", {"added_tokens[0].id", "expected an id"}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, \"added_tokens\": [{\"id\": 1111111111, \"content\": \"<x>\"}]}", {"added_tokens[0].id", "0..16777215"}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, \"truncation\": {\"max_length\": 512}}", {"truncation", "must be null"}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}, \"extra\": 1}", {"(top level)", "\"extra\""}},
        {"{\"version\": \"1.0\"}", {"model", "missing"}},
        {"[1, 2]", {"(top level)", "expected an object"}},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a a\"", {"line 1", "expected"}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char err[1024] = "";
        Tokenizer *tok = tokenizer_load_json(bad[i].json, strlen(bad[i].json), "bad.json", err, sizeof err);
        if (tok) fail_msg("case %zu loaded: %s", i, bad[i].json);
        if (strncmp(err, "bad.json: ", 10) != 0 || !strstr(err, bad[i].words[0]) || !strstr(err, bad[i].words[1]))
            fail_msg("case %zu: error \"%s\" lacks the file, \"%s\" or \"%s\"", i, err, bad[i].words[0],
                     bad[i].words[1]);
    }
    char err[1024];
    /* the largest id taken: decode finds it */
    static const char top[] = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 16777215}, \"merges\": []}}";
    Tokenizer *tok = tokenizer_load_json(top, strlen(top), "top.json", err, sizeof err);
    if (!tok) fail_msg("%s", err);
    assert_int_equal(tokenizer_vocab_size(tok), 16777216);
    TokenText text = {0};
    assert_int_equal(tokenizer_decode(tok, &(int32_t){16777215}, 1, false, &text, err, sizeof err), 0);
    assert_string_equal(text.data, "a");
    token_text_free(&text);
    tokenizer_free(tok);
    assert_null(tokenizer_load("/nonexistent/tokenizer.json", err, sizeof err));
    assert_non_null(strstr(err, "/nonexistent/tokenizer.json"));
    assert_null(tokenizer_load("tests/unit", err, sizeof err));
    assert_non_null(strstr(err, "without tokenizer.json"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama3),        cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_qwen2_bigid),   cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_llama2),        cmocka_unit_test(test_metaspace),
        cmocka_unit_test(test_vocab_size_and_eod), cmocka_unit_test(test_eod_from_config),
        cmocka_unit_test(test_eod_missing),   cmocka_unit_test(test_refused),
        cmocka_unit_test(test_threads),       cmocka_unit_test(test_decode_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
