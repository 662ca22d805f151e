/* build_batch.c: one batch of input lines -> documents, on a worker thread.
 *
 * Plain text: every non-blank line is one document. JSONL: the --json-key
 * string of the line's object is the document (an empty string is skipped
 * and counted). Each document is the tokenizer's ids (or the line's bytes
 * with the byte tokenizer) followed by the end-of-document id. A bad line
 * stops the batch with a message naming the file, the line and what is
 * wrong; the input's last line, when it has no line end and is not valid
 * JSON, is called truncated.
 *
 * --format sft: each JSONL line is a record that sft_render.c renders into
 * segments (with the chat template, if any); each segment is tokenized on
 * its own and its tokens get its loss mask (1: counted), so that b->mask
 * runs beside b->tokens. Without a chat template the end-of-document id
 * follows (counted); with one, the template's end-of-turn token ends it.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "build_internal.h"

void build_worker_init(BuildWorkerState *w, const BuildSpec *spec) {
    memset(w, 0, sizeof *w);
    if (spec->tok) w->encoder = token_encoder_new(spec->tok);
}

void build_worker_free(BuildWorkerState *w) {
    token_encoder_free(w->encoder);
    token_ids_free(&w->ids);
    json_buffer_free(&w->field);
    sft_rendered_free(&w->rendered);
    memset(w, 0, sizeof *w);
}

void build_batch_free(BuildBatch *b) {
    free(b->in.text);
    free(b->tokens);
    free(b->doc_tokens);
    free(b->mask);
    memset(b, 0, sizeof *b);
}

void build_batch_trim(BuildBatch *b) {
    if (b->in.cap > 4 * (size_t)BUILD_BATCH_BYTES) {
        free(b->in.text);
        b->in.text = NULL;
        b->in.cap = 0;
    }
    if (b->tokens_cap > (size_t)BUILD_BATCH_BYTES) {
        free(b->tokens);
        b->tokens = NULL;
        b->tokens_cap = 0;
        free(b->mask);
        b->mask = NULL;
        b->mask_cap = 0;
    }
}

static int is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n' && s[i] != '\f' && s[i] != '\v') return 0;
    return 1;
}

static void add_document(BuildBatch *b, const int32_t *ids, size_t n, int32_t eod) {
    b->tokens = mt_grow(b->tokens, &b->tokens_cap, b->ntokens + n + 1, sizeof *b->tokens);
    if (n) memcpy(b->tokens + b->ntokens, ids, n * sizeof *ids);
    b->tokens[b->ntokens + n] = eod;
    b->ntokens += n + 1;
    b->doc_tokens = mt_grow(b->doc_tokens, &b->docs_cap, b->ndocs + 1, sizeof *b->doc_tokens);
    b->doc_tokens[b->ndocs++] = (int32_t)(n + 1);
}

/* The bytes of text as tokens (the byte tokenizer). */
static void add_bytes_document(BuildWorkerState *w, BuildBatch *b, const char *text, size_t len) {
    w->ids.count = 0;
    for (size_t i = 0; i < len; i++) token_ids_push(&w->ids, (unsigned char)text[i]);
    add_document(b, w->ids.ids, w->ids.count, BUILD_BYTE_EOD_TOKEN);
}

static void fail_line(BuildBatch *b, int64_t line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail_line(BuildBatch *b, int64_t line, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b->error, sizeof b->error, fmt, ap);
    va_end(ap);
    b->error_line = line;
}

/* One line (its '\n' and '\r' removed) -> at most one document. 0, or -1
 * after recording the error. */
/* A JSON error inside one JSONL line: the parser's "line 1, column C: ..." with the line left out (the caller
 * names the file's line). */
static const char *in_line(const char *why) {
    static const char prefix[] = "line 1, ";
    return strncmp(why, prefix, sizeof prefix - 1) == 0 ? why + sizeof prefix - 1 : why;
}

/* What to add to a bad JSON line's error when the line opens a JSON array: a whole-file JSON list of records (as
 * many datasets ship), not JSON Lines. */
static const char *array_hint(const char *line, size_t len) {
    size_t i = 0;
    while (i < len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) i++;
    return i < len && line[i] == '['
               ? " (the line opens a JSON array: data build reads JSON Lines, one object a line; "
                 "`jq -c '.[]' FILE.json > FILE.jsonl` writes a list of records so)"
               : "";
}

/* What to add to a JSONL line's missing-field error when the object is a fine-tuning record (a "messages" list, or
 * "prompt" with "completion"): such records are built with --format sft, which the plain text/jsonl build is not.
 * Looks the fields up in w->field, which the caller no longer needs. */
static const char *sft_hint(BuildWorkerState *w, const char *line, size_t len) {
    char why[256];
    const bool messages = json_object_string_field(line, len, "messages", &w->field, why, sizeof why) ==
                          JSON_FIELD_NOT_STRING;
    const bool prompt =
        json_object_string_field(line, len, "prompt", &w->field, why, sizeof why) != JSON_FIELD_MISSING &&
        json_object_string_field(line, len, "completion", &w->field, why, sizeof why) != JSON_FIELD_MISSING;
    if (messages)
        return ": it is a chat record (\"messages\"): build fine-tuning data with --format sft --chat-template auto "
               "--tokenizer MODEL_DIR (docs/data.md#supervised-fine-tuning-data---format-sft)";
    if (prompt)
        return ": it is a prompt/completion record: build fine-tuning data with --format sft "
               "(docs/data.md#supervised-fine-tuning-data---format-sft)";
    return "";
}

static int run_line(const BuildSpec *spec, BuildWorkerState *w, BuildBatch *b, const char *line, size_t len,
                    int64_t number, bool truncated) {
    if (is_blank(line, len)) {
        b->blank_lines++;
        return 0;
    }
    const char *text = line;
    size_t text_len = len;
    if (b->format == FORMAT_JSONL) {
        char why[256];
        int status = json_object_string_field(line, len, spec->json_key, &w->field, why, sizeof why);
        if (status == JSON_SYNTAX_ERROR) {
            fail_line(b, number, "%s:%lld: bad JSON: %s%s%s", spec->input, (long long)number, in_line(why),
                      truncated ? " (the file ends inside this line: truncated?)" : "", array_hint(line, len));
            return -1;
        }
        if (status == JSON_FIELD_MISSING) {
            fail_line(b, number, "%s:%lld: the JSON object has no \"%s\" field (--json-key picks the field)%s",
                      spec->input, (long long)number, spec->json_key, sft_hint(w, line, len));
            return -1;
        }
        if (status == JSON_FIELD_NOT_STRING) {
            fail_line(b, number, "%s:%lld: field \"%s\" is not a string", spec->input, (long long)number,
                      spec->json_key);
            return -1;
        }
        text = w->field.data;
        text_len = w->field.len;
        if (text_len == 0) {
            b->empty_texts++;
            return 0;
        }
    }
    if (!spec->tok) {
        add_bytes_document(w, b, text, text_len);
        return 0;
    }
    w->ids.count = 0;
    if (spec->bos_id >= 0) token_ids_push(&w->ids, spec->bos_id);
    token_encoder_encode(w->encoder, text, text_len, &w->ids);
    add_document(b, w->ids.ids, w->ids.count, spec->eod_id);
    return 0;
}

/* Append n ids to the batch's current document, each with loss mask `counted`. */
static void append_tokens(BuildBatch *b, const int32_t *ids, size_t n, bool counted) {
    b->tokens = mt_grow(b->tokens, &b->tokens_cap, b->ntokens + n, sizeof *b->tokens);
    b->mask = mt_grow(b->mask, &b->mask_cap, b->ntokens + n, 1);
    if (n) memcpy(b->tokens + b->ntokens, ids, n * sizeof *ids);
    memset(b->mask + b->ntokens, counted ? 1 : 0, n);
    b->ntokens += n;
    if (counted) b->counted_tokens += (int64_t)n;
}

/* One SFT record -> one document with its mask. 0, or -1 after recording the error. */
static int run_sft_line(const BuildSpec *spec, BuildWorkerState *w, BuildBatch *b, const char *line, size_t len,
                        int64_t number, bool truncated) {
    char why[512];
    JsonValue *record = json_parse(line, len, why, sizeof why);
    if (!record) {
        fail_line(b, number, "%s:%lld: bad JSON: %s%s%s", spec->input, (long long)number, in_line(why),
                  truncated ? " (the file ends inside this line: truncated?)" : "", array_hint(line, len));
        return -1;
    }
    int rc = sft_render(record, spec->chat_template, &w->rendered, why, sizeof why);
    json_free(record);
    if (rc != 0) {
        fail_line(b, number, "%s:%lld: %s", spec->input, (long long)number, why);
        return -1;
    }
    if (w->rendered.empty_replies > 0 && b->empty_reply_records++ == 0) b->first_empty_reply = number;
    size_t first = b->ntokens;
    if (spec->bos_id >= 0) append_tokens(b, &spec->bos_id, 1, false); /* --add-bos, no template: masked */
    for (size_t k = 0; k < w->rendered.nsegments; k++) {
        const SftSegment *seg = &w->rendered.segments[k];
        const char *text = w->rendered.text + seg->start;
        w->ids.count = 0;
        if (spec->tok) {
            token_encoder_encode(w->encoder, text, seg->len, &w->ids);
        } else {
            for (size_t i = 0; i < seg->len; i++) token_ids_push(&w->ids, (unsigned char)text[i]);
        }
        append_tokens(b, w->ids.ids, w->ids.count, seg->counted);
    }
    if (spec->chat_template == SFT_TEMPLATE_NONE) append_tokens(b, &spec->eod_id, 1, true);
    b->doc_tokens = mt_grow(b->doc_tokens, &b->docs_cap, b->ndocs + 1, sizeof *b->doc_tokens);
    b->doc_tokens[b->ndocs++] = (int32_t)(b->ntokens - first);
    return 0;
}

void build_batch_run(const BuildSpec *spec, BuildWorkerState *w, BuildBatch *b) {
    b->ntokens = b->ndocs = 0;
    b->blank_lines = b->empty_texts = b->counted_tokens = b->empty_reply_records = b->first_empty_reply = 0;
    b->error_line = 0;
    b->error[0] = '\0';
    const char *p = b->in.text, *end = b->in.text + b->in.len;
    for (int64_t k = 0; k < b->in.lines; k++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *stop = nl ? nl : end;
        size_t len = (size_t)(stop - p);
        while (len > 0 && (p[len - 1] == '\r' || p[len - 1] == '\n')) len--;
        bool truncated = !nl && b->in.last_unterminated;
        int rc = spec->sft && !is_blank(p, len) ? run_sft_line(spec, w, b, p, len, b->in.first_line + k, truncated)
                                                : run_line(spec, w, b, p, len, b->in.first_line + k, truncated);
        if (rc != 0) return;
        p = nl ? nl + 1 : end;
    }
}
