/* data_inspect.c: `megatrain data inspect PREFIX`: what a Megatron indexed
 * dataset (PREFIX.bin + PREFIX.idx) holds: documents, sequences, tokens,
 * the token dtype, the smallest and largest id (against the tokenizer's
 * vocabulary when one is given), how many documents end with the
 * end-of-document token, the document lengths (min, mean, median, p95, max:
 * nearest-rank), and the first documents' ids and text, decoded with the
 * tokenizer (tokenizer_decode) or, without one, as bytes (ids above 255
 * shown as <id:N>). --json prints the same as one JSON object.
 *
 * An SFT dataset's loss mask (PREFIX_mask.{bin,idx}, loss_mask.h) is
 * checked against the tokens and its counted and masked tokens shown; with
 * --show-mask the shown documents mark the spans it counts in [[ ]].
 *
 * The whole .bin is read once for the ids (mmapped: about as fast as the
 * disk). A missing or corrupt dataset is an error naming the file and what
 * is wrong (indexed_dataset_open checks every header field and sequence).
 */
#include "data_inspect.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/cli.h"
#include "../core/error.h"
#include "../core/fs.h"
#include "../core/json.h"
#include "../tokenize/tokenizer.h"
#include "dataset_tokenizer.h"
#include "indexed_dataset.h"
#include "indexed_dataset_format.h"
#include "loss_mask.h"

#define DEFAULT_DOCS 3
#define MAX_DOCS 1000000
#define TEXT_SHOWN_BYTES 2000 /* of each document in the text output */

static const char *const inspect_usage_text =
    "usage: megatrain data inspect PREFIX [--tokenizer PATH] [--docs N] [--show-mask] [--json]\n"
    "\n"
    "Summarize the Megatron indexed dataset PREFIX.bin + PREFIX.idx: documents, tokens, token dtype,\n"
    "the smallest and largest id, documents ending with the end-of-document token, document lengths\n"
    "(min / mean / median / p95 / max), and the first documents decoded.\n"
    "\n"
    "  --tokenizer PATH   tokenizer.json (or a model directory holding it) to decode with and to check\n"
    "                     the ids against (default: the byte tokenizer of `data build`)\n"
    "  --docs N           how many documents to show, from the first (default 3; 0 for none)\n"
    "  --show-mask        an SFT dataset's shown documents with the spans its loss mask counts in\n"
    "                     [[ ]] (each span the text its tokens have in the document's decode)\n"
    "  --json             one JSON object on stdout instead of text (every shown document's ids and\n"
    "                     whole text)\n";

typedef struct InspectOptions {
    const char *prefix, *tokenizer;
    long docs;
    bool json, show_mask;
} InspectOptions;

/* 0 to go on, 1 after --help, 2 on a usage error (reported). */
static int parse_options(int argc, char **argv, InspectOptions *opt) {
    memset(opt, 0, sizeof *opt);
    opt->docs = DEFAULT_DOCS;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(inspect_usage_text, stdout);
            return 1;
        }
        if (strcmp(a, "--json") == 0) {
            opt->json = true;
        } else if (strcmp(a, "--show-mask") == 0) {
            opt->show_mask = true;
        } else if (strcmp(a, "--tokenizer") == 0 || strcmp(a, "--docs") == 0) {
            if (i + 1 >= argc) {
                mt_error("data inspect: %s needs a value\n%s", a, inspect_usage_text);
                return 2;
            }
            const char *v = argv[++i];
            if (a[2] == 't') {
                opt->tokenizer = v;
                continue;
            }
            char *end;
            errno = 0;
            opt->docs = strtol(v, &end, 10);
            if (errno || end == v || *end || opt->docs < 0 || opt->docs > MAX_DOCS) {
                mt_error("data inspect: --docs %s: expected a whole number from 0 to %d", v, MAX_DOCS);
                return 2;
            }
        } else if (a[0] == '-' && a[1]) {
            cli_unknown_option("data inspect", a, inspect_usage_text);
            return 2;
        } else if (!opt->prefix) {
            opt->prefix = a;
        } else {
            mt_error("data inspect: one PREFIX only ('%s' and '%s')\n%s", opt->prefix, a, inspect_usage_text);
            return 2;
        }
    }
    if (!opt->prefix || !opt->prefix[0]) {
        mt_error("data inspect: PREFIX is required (the dataset is PREFIX.bin + PREFIX.idx)\n%s", inspect_usage_text);
        return 2;
    }
    return 0;
}

typedef struct Summary {
    int64_t documents, tokens;
    int32_t min_id, max_id;
    int64_t min_len, max_len, median_len, p95_len;
    double mean_len;
    int32_t eod_id;            /* -1: unknown */
    int64_t ending_with_eod;
} Summary;

/* The tokens of document d (its sequences one after the other) into *buf. */
static int64_t read_document(const IndexedDataset *ds, int64_t d, int32_t **buf, size_t *cap) {
    int64_t first = indexed_document(ds, d), last = indexed_document(ds, d + 1), n = 0;
    for (int64_t s = first; s < last; s++) n += indexed_length(ds, s);
    *buf = mt_grow(*buf, cap, (size_t)n + 1, sizeof **buf);
    int64_t at = 0;
    for (int64_t s = first; s < last; s++) {
        indexed_dataset_read(ds, s, 0, indexed_length(ds, s), *buf + at);
        at += indexed_length(ds, s);
    }
    return n;
}

static int compare_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static void summarize(const IndexedDataset *ds, int32_t eod_id, Summary *s) {
    memset(s, 0, sizeof *s);
    s->documents = ds->num_documents_plus_one - 1;
    s->eod_id = eod_id;
    s->min_id = INT32_MAX;
    s->max_id = INT32_MIN;
    int64_t *lengths = mt_malloc(((size_t)s->documents + 1) * sizeof *lengths);
    enum { CHUNK = 1 << 16 };
    int32_t *chunk = mt_malloc(CHUNK * sizeof *chunk);
    for (int64_t d = 0; d < s->documents; d++) {
        int64_t n = 0, last_token = -1;
        for (int64_t q = indexed_document(ds, d); q < indexed_document(ds, d + 1); q++) {
            int64_t len = indexed_length(ds, q);
            for (int64_t at = 0; at < len; at += CHUNK) {
                int64_t m = len - at < CHUNK ? len - at : CHUNK;
                indexed_dataset_read(ds, q, at, m, chunk);
                for (int64_t i = 0; i < m; i++) {
                    if (chunk[i] < s->min_id) s->min_id = chunk[i];
                    if (chunk[i] > s->max_id) s->max_id = chunk[i];
                }
                last_token = chunk[m - 1];
            }
            n += len;
        }
        lengths[d] = n;
        s->tokens += n;
        if (eod_id >= 0 && n > 0 && last_token == eod_id) s->ending_with_eod++;
    }
    if (s->documents > 0) {
        qsort(lengths, (size_t)s->documents, sizeof *lengths, compare_i64);
        s->min_len = lengths[0];
        s->max_len = lengths[s->documents - 1];
        s->median_len = lengths[(s->documents - 1) / 2];
        int64_t rank = (s->documents * 95 + 99) / 100; /* nearest rank: ceil(0.95 n) */
        s->p95_len = lengths[rank > 0 ? rank - 1 : 0];
        s->mean_len = (double)s->tokens / (double)s->documents;
    }
    if (s->tokens == 0) s->min_id = s->max_id = -1;
    free(chunk);
    free(lengths);
}

/* Text of ids: the tokenizer's decode, or bytes (ids > 255 as <id:N>) read as UTF-8. */
static int decode_ids(const Tokenizer *tok, const int32_t *ids, size_t n, TokenText *out, char *err, size_t errlen) {
    out->len = 0;
    if (tok) return tokenizer_decode(tok, ids, n, false, out, err, errlen);
    TokenText raw = {0};
    for (size_t i = 0; i < n; i++) {
        char piece[32];
        size_t k = 1;
        if (ids[i] >= 0 && ids[i] < 256) piece[0] = (char)ids[i];
        else k = (size_t)snprintf(piece, sizeof piece, "<id:%d>", ids[i]);
        token_text_append(&raw, piece, k);
    }
    token_text_from_bytes(out, raw.data, raw.len);
    free(raw.data);
    return 0;
}

/* A document's ids, the first 64 of them, for a document that is not decoded. */
static void print_ids(const int32_t *ids, int64_t n) {
    const int64_t shown = n < 64 ? n : 64;
    for (int64_t i = 0; i < shown; i++) printf("%s%d", i ? " " : "ids ", ids[i]);
    if (n > shown) printf(" ... (%lld more)", (long long)(n - shown));
}

/* text with control characters, '"' and '\\' escaped (C style), at most max bytes. */
static void print_escaped(const char *text, size_t len, size_t max) {
    size_t n = len < max ? len : max;
    while (n > 0 && n < len && ((unsigned char)text[n] & 0xC0) == 0x80) n--; /* a whole character */
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else putchar(c);
    }
    putchar('"');
    if (n < len) printf(" ... (%zu more bytes)", len - n);
}

/* The text tokens [at, end) of ids decode to inside the document: decoded after the tokens before them (from c on)
 * and that context's own text cut off, since decoders treat the first token apart (SentencePiece's decoders drop its
 * leading space: Metaspace's prepend_scheme, Strip after Fuse), so a span decoded alone lost the space it shows in
 * the whole document. The context starts 8 tokens back and widens while its text is empty or is not where the
 * longer text starts (a character cut at `at`); from the document's start it is exact, and where it is still not
 * a prefix the span is decoded alone. Into out; 0, or -1 with err. */
static int decode_in_context(const Tokenizer *tok, const int32_t *ids, size_t at, size_t end, TokenText *out,
                             char *err, size_t errlen) {
    if (at == 0) return decode_ids(tok, ids, end, out, err, errlen);
    TokenText context = {0};
    int rc = 0;
    for (size_t back = 8;; back *= 2) {
        const size_t c = back < at ? at - back : 0;
        rc = decode_ids(tok, ids + c, at - c, &context, err, errlen);
        if (rc == 0) rc = decode_ids(tok, ids + c, end - c, out, err, errlen);
        if (rc != 0) break;
        const bool prefix = context.len <= out->len && memcmp(out->data, context.data, context.len) == 0;
        if (prefix && (context.len > 0 || c == 0)) { /* the span's text is what follows its context's */
            if (context.len > 0) {
                memmove(out->data, out->data + context.len, out->len - context.len);
                out->len -= context.len;
                out->data[out->len] = '\0';
            }
            break;
        }
        if (c == 0) {
            rc = decode_ids(tok, ids + at, end - at, out, err, errlen);
            break;
        }
    }
    token_text_free(&context);
    return rc;
}

/* --show-mask: the text of ids with each run of tokens the mask counts between "[[" and "]]", each run (masked
 * ones too) the text its tokens have in the whole document's decode (decode_in_context): the marks removed, the
 * document decoded. 0, or -1 with err (a run decode_ids refused). */
static int decode_marked(const Tokenizer *tok, const int32_t *ids, const int32_t *mask, size_t n, TokenText *out,
                         char *err, size_t errlen) {
    TokenText run = {0};
    out->len = 0;
    int rc = 0;
    for (size_t at = 0, end; at < n && rc == 0; at = end) {
        for (end = at + 1; end < n && (mask[end] != 0) == (mask[at] != 0);) end++;
        rc = decode_in_context(tok, ids, at, end, &run, err, errlen);
        if (mask[at]) token_text_append(out, "[[", 2);
        if (rc == 0) token_text_append(out, run.data, run.len);
        if (mask[at]) token_text_append(out, "]]", 2);
    }
    token_text_free(&run);
    return rc;
}

/* Bytes of the .bin after the end of its last document: Megatron's format lets an .idx name less than its .bin
 * holds (an .idx of another, smaller dataset), and what is left over is read by no one. */
static uint64_t unindexed_bytes(const IndexedDataset *ds) {
    uint64_t end = 0;
    for (int64_t i = 0; i < ds->num_sequences; i++) {
        const uint64_t e = (uint64_t)indexed_offset(ds, i) + (uint64_t)indexed_length(ds, i) * ds->token_size;
        if (e > end) end = e;
    }
    return end < ds->bin_size ? ds->bin_size - end : 0;
}

/* none_recorded: the build record says no end-of-document token was appended (a chat template's data). */
static void print_text(const InspectOptions *opt, const IndexedDataset *ds, const char *tok_label, int64_t vocab,
                       const Summary *s, bool none_recorded) {
    printf("data inspect: %s.{bin,idx}\n", opt->prefix);
    printf("  documents: %lld", (long long)s->documents);
    if (ds->num_sequences != s->documents) printf(" (%lld sequences)", (long long)ds->num_sequences);
    printf("\n  tokens:    %lld (%s, %d bytes each; .bin %zu bytes)\n", (long long)s->tokens,
           indexed_dtype_name(ds->dtype_code), ds->token_size, ds->bin_size);
    const uint64_t unindexed = unindexed_bytes(ds);
    if (unindexed)
        printf("  unindexed: the .bin holds %llu bytes after the last document, which no document names (an .idx of "
               "another, smaller dataset beside this .bin?)\n", (unsigned long long)unindexed);
    if (s->tokens == 0)
        printf("  ids:       none (no tokens)\n");
    else
        printf("  ids:       %d .. %d; %s vocabulary %lld: %s\n", s->min_id, s->max_id, tok_label, (long long)vocab,
               s->min_id >= 0 && s->max_id < vocab ? "every id inside it" : "SOME IDS OUTSIDE IT (another tokenizer?)");
    if (none_recorded)
        printf("  end of document: none appended (its build record says so: a chat template ends each turn with "
               "its own end-of-turn token instead)\n");
    else if (s->eod_id >= 0)
        printf("  end of document (id %d) ends %lld of %lld documents\n", s->eod_id, (long long)s->ending_with_eod,
               (long long)s->documents);
    else
        printf("  end of document: unknown for this tokenizer\n");
    if (s->documents > 0)
        printf("  document tokens: min %lld, mean %.1f, median %lld, p95 %lld, max %lld\n", (long long)s->min_len,
               s->mean_len, (long long)s->median_len, (long long)s->p95_len, (long long)s->max_len);
}

/* What PREFIX.build.json says of the tokenizer that built the dataset, and whether --tokenizer's file is that one. */
typedef struct BuildRecord {
    int found;           /* 1: a record, 0: none, -1: unreadable (why) */
    DatasetTokenizer tok;
    int same;            /* --tokenizer's tokenizer.json is the recorded one: 1, 0; -1 without --tokenizer */
    bool stale;          /* its counts are not the dataset's: the files were replaced since (the record is not used) */
    char why[1200];
} BuildRecord;

static BuildRecord read_build_record(const char *prefix, const Tokenizer *given) {
    BuildRecord r = {.same = -1};
    r.found = dataset_tokenizer_read(prefix, &r.tok, r.why, sizeof r.why);
    r.stale = r.found == 1 && !dataset_tokenizer_current(&r.tok, prefix);
    if (r.found != 1 || !given) return r;
    size_t len = 0;
    char err[1200];
    char *json = mt_read_file(tokenizer_path(given), (size_t)1 << 31, &len, err, sizeof err);
    if (!json) return r;
    const DatasetTokenizer mine = dataset_tokenizer_of_json(json, len, 0, 0);
    r.same = !r.tok.byte && r.tok.bytes == mine.bytes && r.tok.crc32c == mine.crc32c;
    free(json);
    return r;
}

static void print_build_record(const char *prefix, const BuildRecord *r) {
    if (r->found == 0) {
        printf("  built by:  unknown (no %s.build.json: not made by megatrain data build, or by one before it "
               "recorded the tokenizer)\n", prefix);
        return;
    }
    if (r->found < 0) {
        printf("  built by:  unreadable record: %s\n", r->why);
        return;
    }
    if (r->tok.byte)
        printf("  built by:  megatrain data build with the byte-level tokenizer");
    else
        printf("  built by:  megatrain data build with a tokenizer.json of %llu bytes (CRC-32C %08x, vocabulary %lld)",
               (unsigned long long)r->tok.bytes, (unsigned)r->tok.crc32c, (long long)r->tok.vocab_size);
    printf("%s%s\n", r->same == 1 ? ": --tokenizer's" : r->same == 0 ? ": NOT --tokenizer's" : "",
           r->stale ? " (STALE: it counts other documents or tokens than the files hold, which were replaced since; "
                      "not used)" : "");
}

static void json_build_record(JsonWriter *w, const BuildRecord *r) {
    jw_key(w, "build_record");
    if (r->found != 1) {
        jw_null(w);
        if (r->found < 0) jw_key(w, "build_record_error"), jw_string(w, r->why);
        return;
    }
    char crc[16];
    snprintf(crc, sizeof crc, "%08x", (unsigned)r->tok.crc32c);
    jw_begin_object(w);
    jw_key(w, "tokenizer"), jw_string(w, r->tok.byte ? "byte" : "tokenizer.json");
    if (!r->tok.byte) jw_key(w, "bytes"), jw_uint(w, r->tok.bytes), jw_key(w, "crc32c"), jw_string(w, crc);
    jw_key(w, "vocab_size"), jw_int(w, r->tok.vocab_size);
    jw_key(w, "same_as_tokenizer_option");
    if (r->same < 0) jw_null(w);
    else jw_bool(w, r->same == 1);
    jw_end_object(w);
}

int data_inspect_main(int argc, char **argv) {
    InspectOptions opt;
    int rc = parse_options(argc, argv, &opt);
    if (rc == 1) return MT_EXIT_OK;
    if (rc != 0) return MT_EXIT_USAGE;
    char err[2400];
    Tokenizer *tok = NULL;
    if (opt.tokenizer && !(tok = tokenizer_load(opt.tokenizer, err, sizeof err))) {
        mt_error("data inspect: --tokenizer: %s", err);
        return MT_EXIT_USAGE;
    }
    IndexedDataset ds;
    if (indexed_dataset_open(&ds, opt.prefix, err, sizeof err) != 0) {
        char idx[1100];
        snprintf(idx, sizeof idx, "%s.idx", opt.prefix);
        struct stat sb;
        mt_error("data inspect: %s", err);
        tokenizer_free(tok);
        return stat(idx, &sb) != 0 ? mt_path_stat_status(errno) : MT_EXIT_FAILURE; /* not there: usage */
    }
    IndexedDataset mask;
    int has_mask = loss_mask_open(&mask, &ds, opt.prefix, err, sizeof err);
    if (has_mask < 0) {
        mt_error("data inspect: %s", err);
        indexed_dataset_close(&ds);
        tokenizer_free(tok);
        return MT_EXIT_FAILURE;
    }
    int64_t counted = has_mask ? loss_mask_counted(&mask) : 0; /* the mask stays open: --json lists it per token */
    const char *eod_name = NULL;
    char eod_err[1024] = "";
    int32_t eod_id = tok ? tokenizer_eod(tok, NULL, &eod_name, eod_err, sizeof eod_err) : 10;
    int64_t vocab = tok ? tokenizer_vocab_size(tok) : 256;
    const BuildRecord record = read_build_record(opt.prefix, tok);
    /* without --tokenizer, a dataset its build record says a tokenizer.json built: the record's vocabulary and
     * end-of-document id, and its documents not decoded (the byte tokenizer would make them look broken) */
    const bool recorded_tok = !tok && record.found == 1 && !record.tok.byte && !record.stale;
    if (recorded_tok) {
        vocab = record.tok.vocab_size;
        eod_id = record.tok.eod >= 0 ? (int32_t)record.tok.eod : eod_id;
    }
    const char *tok_label = tok            ? tokenizer_path(tok)
                            : recorded_tok ? "the recorded tokenizer.json's"
                                           : "byte tokenizer,";
    const bool none_appended = record.found == 1 && record.tok.eod < 0; /* a chat template's build: no id to count */
    if (none_appended) {
        eod_id = -1;
        snprintf(eod_err, sizeof eod_err, "none appended (its build record says so: a chat template ends each turn "
                 "with its own end-of-turn token instead)");
    }
    char tokens_of[1100];
    const bool mask_of_tokens = loss_mask_of(&ds, opt.prefix, tokens_of, sizeof tokens_of);
    Summary s;
    summarize(&ds, eod_id, &s);
    int64_t shown = opt.docs < s.documents ? opt.docs : s.documents;
    JsonWriter w;
    if (opt.json) {
        jw_init(&w, 0);
        jw_begin_object(&w);
        jw_key(&w, "prefix"), jw_string(&w, opt.prefix);
        jw_key(&w, "dtype"), jw_string(&w, indexed_dtype_name(ds.dtype_code));
        jw_key(&w, "documents"), jw_int(&w, s.documents);
        jw_key(&w, "sequences"), jw_int(&w, ds.num_sequences);
        jw_key(&w, "tokens"), jw_int(&w, s.tokens);
        jw_key(&w, "bin_bytes"), jw_int(&w, (int64_t)ds.bin_size);
        jw_key(&w, "unindexed_bytes"), jw_int(&w, (int64_t)unindexed_bytes(&ds));
        jw_key(&w, "min_id"), jw_int(&w, s.min_id);
        jw_key(&w, "max_id"), jw_int(&w, s.max_id);
        jw_key(&w, "tokenizer"),
            jw_string(&w, tok ? tokenizer_path(tok) : recorded_tok ? "recorded tokenizer.json" : "byte");
        jw_key(&w, "vocab_size"), jw_int(&w, vocab);
        jw_key(&w, "ids_inside_vocab"), jw_bool(&w, s.tokens == 0 || (s.min_id >= 0 && s.max_id < vocab));
        jw_key(&w, "end_of_document_id"), eod_id >= 0 ? jw_int(&w, eod_id) : jw_null(&w);
        jw_key(&w, "documents_ending_with_it"), eod_id >= 0 ? jw_int(&w, s.ending_with_eod) : jw_null(&w);
        jw_key(&w, "document_tokens");
        jw_begin_object(&w);
        jw_key(&w, "min"), jw_int(&w, s.min_len);
        jw_key(&w, "mean"), jw_double(&w, s.mean_len);
        jw_key(&w, "median"), jw_int(&w, s.median_len);
        jw_key(&w, "p95"), jw_int(&w, s.p95_len);
        jw_key(&w, "max"), jw_int(&w, s.max_len);
        jw_end_object(&w);
        jw_key(&w, "loss_mask_of"), mask_of_tokens ? jw_string(&w, tokens_of) : jw_null(&w);
        jw_key(&w, "loss_mask");
        if (has_mask) {
            jw_begin_object(&w);
            jw_key(&w, "counted_tokens"), jw_int(&w, counted);
            jw_key(&w, "masked_tokens"), jw_int(&w, s.tokens - counted);
            jw_key(&w, "masked_fraction"), jw_double(&w, s.tokens ? (double)(s.tokens - counted) / (double)s.tokens : 0);
            jw_end_object(&w);
        } else {
            jw_null(&w);
        }
        jw_key(&w, "first_documents");
        jw_begin_array(&w);
    } else {
        print_text(&opt, &ds, tok_label, vocab, &s, none_appended);
        if (mask_of_tokens)
            printf("  built by:  megatrain data build --format sft: this is the loss mask of %s (1 where a token "
                   "counts in the loss), not tokens; give %s as data, and its mask is read with it\n", tokens_of,
                   tokens_of);
        else
            print_build_record(opt.prefix, &record);
        if (has_mask)
            printf("  loss mask: %s_mask.{bin,idx}: %lld of %lld tokens counted, %lld masked (%.1f%% masked)%s\n",
                   opt.prefix, (long long)counted, (long long)s.tokens, (long long)(s.tokens - counted),
                   s.tokens ? 100.0 * (double)(s.tokens - counted) / (double)s.tokens : 0.0,
                   opt.show_mask ? "; counted spans in [[ ]] below" : "; --show-mask marks them in the documents");
        else if (opt.show_mask)
            printf("  loss mask: none (--show-mask: every token counts)\n");
        if (shown > 0 && recorded_tok)
            printf("  first %lld document%s (not decoded: --tokenizer with the tokenizer.json that built it decodes "
                   "them):\n", (long long)shown, shown == 1 ? "" : "s");
        else if (shown > 0)
            printf("  first %lld document%s, decoded with %s:\n", (long long)shown, shown == 1 ? "" : "s",
                   tok ? tokenizer_path(tok) : "the byte tokenizer");
    }
    int32_t *ids = NULL, *mask_of = NULL;
    size_t cap = 0, mask_cap = 0;
    TokenText text = {0};
    rc = MT_EXIT_OK;
    for (int64_t d = 0; d < shown; d++) {
        int64_t n = read_document(&ds, d, &ids, &cap);
        const bool marked = has_mask && opt.show_mask && !opt.json;
        if (marked || (has_mask && opt.json)) read_document(&mask, d, &mask_of, &mask_cap);
        int decoded = !recorded_tok && (marked ? decode_marked(tok, ids, mask_of, (size_t)n, &text, err, sizeof err)
                                               : decode_ids(tok, ids, (size_t)n, &text, err, sizeof err)) == 0;
        if (opt.json) {
            jw_begin_object(&w);
            jw_key(&w, "index"), jw_int(&w, d);
            jw_key(&w, "tokens"), jw_int(&w, n);
            jw_key(&w, "ids");
            jw_begin_array(&w);
            for (int64_t i = 0; i < n; i++) jw_int(&w, ids[i]);
            jw_end_array(&w);
            if (has_mask) { /* 1 where the token counts in the loss as a target: -100 elsewhere for transformers */
                jw_key(&w, "mask");
                jw_begin_array(&w);
                for (int64_t i = 0; i < n; i++) jw_int(&w, mask_of[i]);
                jw_end_array(&w);
            }
            jw_key(&w, "text");
            decoded ? jw_string_n(&w, text.data, text.len) : jw_null(&w);
            jw_end_object(&w);
        } else {
            printf("  [%lld] %lld tokens: ", (long long)d, (long long)n);
            if (decoded) print_escaped(text.data, text.len, TEXT_SHOWN_BYTES);
            else if (recorded_tok) print_ids(ids, n);
            else printf("(not decoded: %s)", err);
            putchar('\n');
        }
    }
    if (opt.json) {
        jw_end_array(&w);
        if (eod_id < 0) jw_key(&w, "end_of_document_note"), jw_string(&w, eod_err);
        json_build_record(&w, &record);
        jw_end_object(&w);
        fwrite(w.data, 1, w.len, stdout);
        putchar('\n');
        jw_free(&w);
    }
    free(ids);
    free(mask_of);
    token_text_free(&text);
    if (has_mask) indexed_dataset_close(&mask);
    indexed_dataset_close(&ds);
    tokenizer_free(tok);
    return rc;
}
