/* sft_render.c: chat templates for supervised fine-tuning records, in C
 * (sft_render.h says what each renders and what counts in the loss). */
#include "sft_render.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "../core/error.h"

#define QWEN_DEFAULT_SYSTEM "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
#define LLAMA3_BEGIN "<|begin_of_text|>"
#define LLAMA3_HEADER_START "<|start_header_id|>"
#define LLAMA3_HEADER_END "<|end_header_id|>"
#define LLAMA3_END_OF_TURN "<|eot_id|>"
/* Llama 3.1's template's dates; "26 Jul 2024" is its date_string when none is given (transformers passes today's
 * through strftime_now to Llama 3.2's: a fixed one keeps a build's bytes the same every day) */
#define LLAMA31_DATES "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
#define CHATML_START "<|im_start|>"
#define CHATML_END "<|im_end|>"
#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"
#define TOOL_RESPONSE_OPEN "<tool_response>"
#define TOOL_RESPONSE_CLOSE "</tool_response>"

static const char *const llama3_specials[] = {LLAMA3_BEGIN, LLAMA3_HEADER_START, LLAMA3_HEADER_END, LLAMA3_END_OF_TURN};
static const char *const chatml_specials[] = {CHATML_START, CHATML_END};
static const char *const qwen3_specials[] = {CHATML_START, CHATML_END, THINK_OPEN, THINK_CLOSE};

const char *const *sft_template_special_tokens(SftTemplate t, int *count) {
    if (t == SFT_TEMPLATE_LLAMA3 || t == SFT_TEMPLATE_LLAMA31) return *count = 4, llama3_specials;
    if (t == SFT_TEMPLATE_CHATML) return *count = 2, chatml_specials;
    if (t == SFT_TEMPLATE_QWEN3) return *count = 4, qwen3_specials;
    *count = 0;
    return NULL;
}

static const char *const template_names[] = {"none", "llama3", "chatml", "qwen3", "llama3.1"};

int sft_template_from_name(const char *name) {
    if (strcmp(name, "llama3") == 0) return SFT_TEMPLATE_LLAMA3;
    if (strcmp(name, "chatml") == 0) return SFT_TEMPLATE_CHATML;
    if (strcmp(name, "qwen3") == 0) return SFT_TEMPLATE_QWEN3;
    if (strcmp(name, "llama3.1") == 0) return SFT_TEMPLATE_LLAMA31;
    return -1;
}

const char *sft_template_name(SftTemplate t) { return template_names[t]; }

int sft_template_recognize(const char *jinja) {
    if (strstr(jinja, "<|im_start|>") && strstr(jinja, "enable_thinking")) return SFT_TEMPLATE_QWEN3;
    if (strstr(jinja, "<|im_start|>") && strstr(jinja, "You are Qwen, created by Alibaba Cloud")) return SFT_TEMPLATE_CHATML;
    if (strstr(jinja, "<|start_header_id|>") && strstr(jinja, "Cutting Knowledge Date")) return SFT_TEMPLATE_LLAMA31;
    if (strstr(jinja, "<|start_header_id|>") && strstr(jinja, "<|eot_id|>")) return SFT_TEMPLATE_LLAMA3;
    return -1;
}

const char *sft_template_names(void) { return "llama3, llama3.1, chatml, qwen3"; }

void sft_rendered_free(SftRendered *r) {
    free(r->text);
    free(r->segments);
    memset(r, 0, sizeof *r);
}

/* Append n bytes as a segment (merged with the previous one when both are
 * counted or both masked). */
static void emit(SftRendered *r, const char *s, size_t n, bool counted) {
    if (n == 0) return;
    r->text = mt_grow(r->text, &r->cap, r->len + n + 1, 1);
    memcpy(r->text + r->len, s, n);
    if (r->nsegments && r->segments[r->nsegments - 1].counted == counted) {
        r->segments[r->nsegments - 1].len += n;
    } else {
        r->segments = mt_grow(r->segments, &r->segments_cap, r->nsegments + 1, sizeof *r->segments);
        r->segments[r->nsegments++] = (SftSegment){.start = r->len, .len = n, .counted = counted};
    }
    r->len += n;
    r->text[r->len] = '\0';
}

static void emit_str(SftRendered *r, const char *s, bool counted) { emit(r, s, strlen(s), counted); }

typedef enum { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT } Role;
static const char *const role_names[] = {"system", "user", "assistant"};

typedef struct Message {
    Role role;
    const char *content;
    size_t len;
    const char *reasoning; /* an assistant message's "reasoning_content" string, else NULL (read by qwen3 only) */
    size_t reasoning_len;
    bool trained; /* an assistant message counts in the loss (not one of a conversational prompt's) */
} Message;

static bool counted(const Message *m) { return m->role == ROLE_ASSISTANT && m->trained; }

/* Python's str.isspace of one code point, what Jinja's trim (str.strip) removes: bidirectional class WS, B or S,
 * or category Zs (CPython's makeunicodedata.py). Tab to carriage return, U+001C..U+001F, space, U+0085, U+00A0,
 * U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000; not NUL, U+200B or U+FEFF. */
static bool python_space(utf8proc_int32_t c) {
    const utf8proc_property_t *p = utf8proc_get_property(c);
    return p->category == UTF8PROC_CATEGORY_ZS || p->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
           p->bidi_class == UTF8PROC_BIDI_CLASS_B || p->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

/* The length of the code point that ends s[0..n) when it is whitespace, else 0 (also for bytes that are not
 * UTF-8, which Python would not have read). */
static size_t space_at_end(const char *s, size_t n) {
    size_t start = n - 1;
    while (start > 0 && n - start < 4 && ((unsigned char)s[start] & 0xC0) == 0x80) start--;
    utf8proc_int32_t c;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + start, (utf8proc_ssize_t)(n - start), &c);
    return k == (utf8proc_ssize_t)(n - start) && python_space(c) ? (size_t)k : 0;
}

/* Jinja's trim: leading and trailing whitespace removed as Python's str.strip() removes it. */
static void trim(const char **s, size_t *n) {
    while (*n) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)*s, (utf8proc_ssize_t)*n, &c);
        if (k <= 0 || !python_space(c)) break;
        *s += k;
        *n -= (size_t)k;
    }
    for (size_t k; *n && (k = space_at_end(*s, *n)) > 0;) *n -= k;
}

/* llama3, and llama3.1 (Llama 3.1 / 3.2 / 3.3 Instruct): its system header always, with the knowledge and
 * today's dates before the first message's text when that is a system message, which it takes. */
static void render_llama3(const Message *m, size_t n, bool dated, SftRendered *r) {
    emit_str(r, LLAMA3_BEGIN, false);
    size_t first = 0;
    if (dated) {
        emit_str(r, LLAMA3_HEADER_START "system" LLAMA3_HEADER_END "\n\n" LLAMA31_DATES, false);
        if (n > 0 && m[0].role == ROLE_SYSTEM) {
            const char *c = m[0].content;
            size_t len = m[0].len;
            trim(&c, &len);
            emit(r, c, len, false);
            first = 1;
        }
        emit_str(r, LLAMA3_END_OF_TURN, false);
    }
    for (size_t i = first; i < n; i++) {
        const char *c = m[i].content;
        size_t len = m[i].len;
        trim(&c, &len);
        const bool count = counted(&m[i]);
        emit_str(r, LLAMA3_HEADER_START, false);
        emit_str(r, role_names[m[i].role], false);
        emit_str(r, LLAMA3_HEADER_END "\n\n", false);
        emit(r, c, len, count);
        emit_str(r, LLAMA3_END_OF_TURN, count);
    }
}

static void render_chatml(const Message *m, size_t n, SftRendered *r) {
    if (n == 0 || m[0].role != ROLE_SYSTEM) emit_str(r, CHATML_START "system\n" QWEN_DEFAULT_SYSTEM CHATML_END "\n", false);
    for (size_t i = 0; i < n; i++) {
        const bool count = counted(&m[i]);
        emit_str(r, CHATML_START, false);
        emit_str(r, role_names[m[i].role], false);
        emit_str(r, "\n", false);
        emit(r, m[i].content, m[i].len, count);
        emit_str(r, CHATML_END, count);
        emit_str(r, "\n", false);
    }
}

/* qwen3 (Qwen3's chat_template for plain messages). Python's str methods on byte ranges: the markers and '\n'
 * are ASCII, so they never match inside a UTF-8 sequence. */
static bool starts_with(const char *s, size_t n, const char *prefix) {
    return n >= strlen(prefix) && memcmp(s, prefix, strlen(prefix)) == 0;
}
static bool ends_with(const char *s, size_t n, const char *suffix) {
    return n >= strlen(suffix) && memcmp(s + n - strlen(suffix), suffix, strlen(suffix)) == 0;
}
static const char *find(const char *s, size_t n, const char *needle) { return memmem(s, n, needle, strlen(needle)); }
static const char *find_last(const char *s, size_t n, const char *needle) {
    const char *last = NULL;
    for (const char *p = s; (p = find(p, n - (size_t)(p - s), needle)); p++) last = p;
    return last;
}
static void lstrip_newlines(const char **s, size_t *n) {
    while (*n && **s == '\n') (*s)++, (*n)--;
}
static void rstrip_newlines(const char *s, size_t *n) {
    while (*n && s[*n - 1] == '\n') (*n)--;
}

/* The user message a reply answers: the last one that is not a tool response (<tool_response>...</tool_response>,
 * which the template treats as a tool's turn); the last message when there is none. */
static size_t last_query(const Message *m, size_t n) {
    for (size_t i = n; i-- > 0;)
        if (m[i].role == ROLE_USER && !(starts_with(m[i].content, m[i].len, TOOL_RESPONSE_OPEN) &&
                                        ends_with(m[i].content, m[i].len, TOOL_RESPONSE_CLOSE)))
            return i;
    return n - 1;
}

static void render_qwen3(const Message *m, size_t n, SftRendered *r) {
    const size_t query = last_query(m, n);
    for (size_t i = 0; i < n; i++) {
        const char *c = m[i].content;
        size_t len = m[i].len;
        if (m[i].role != ROLE_ASSISTANT) {
            emit_str(r, CHATML_START, false);
            emit_str(r, role_names[m[i].role], false);
            emit_str(r, "\n", false);
            emit(r, c, len, false);
            emit_str(r, CHATML_END "\n", false);
            continue;
        }
        /* reasoning: the message's reasoning_content, else what its content holds before </think> */
        const char *reasoning = m[i].reasoning ? m[i].reasoning : "";
        size_t reasoning_len = m[i].reasoning ? m[i].reasoning_len : 0;
        const char *close = m[i].reasoning ? NULL : find(c, len, THINK_CLOSE);
        if (close) {
            reasoning = c;
            reasoning_len = (size_t)(close - c); /* content.split('</think>')[0] */
            rstrip_newlines(reasoning, &reasoning_len);
            const char *open = find_last(reasoning, reasoning_len, THINK_OPEN); /* .split('<think>')[-1] */
            if (open) {
                reasoning_len -= (size_t)(open + strlen(THINK_OPEN) - reasoning);
                reasoning = open + strlen(THINK_OPEN);
            }
            lstrip_newlines(&reasoning, &reasoning_len);
            const char *after = find_last(c, len, THINK_CLOSE) + strlen(THINK_CLOSE); /* content.split('</think>')[-1] */
            len -= (size_t)(after - c);
            c = after;
            lstrip_newlines(&c, &len);
        }
        emit_str(r, CHATML_START "assistant\n", false);
        if (i > query && (i == n - 1 || reasoning_len > 0)) {
            /* a reply to the last query shows its reasoning; an empty block is what the prompt holds with
             * enable_thinking=False (masked), a non-empty one what the model writes (counted) */
            lstrip_newlines(&reasoning, &reasoning_len);
            rstrip_newlines(reasoning, &reasoning_len);
            const bool thought = reasoning_len > 0 && m[i].trained;
            emit_str(r, THINK_OPEN "\n", thought);
            emit(r, reasoning, reasoning_len, thought);
            emit_str(r, "\n" THINK_CLOSE "\n\n", thought);
            lstrip_newlines(&c, &len);
        }
        emit(r, c, len, m[i].trained);
        emit_str(r, CHATML_END, m[i].trained);
        emit_str(r, "\n", false);
    }
}

/* A string member of obj; NULL with why set when absent or not a string. */
static const JsonValue *string_member(const JsonValue *obj, const char *key, const char *where, char *why,
                                      size_t whylen) {
    const JsonValue *v = json_get(obj, key);
    if (!v) {
        snprintf(why, whylen, "%sno \"%s\" field", where, key);
        return NULL;
    }
    if (v->type != JSON_STRING) {
        snprintf(why, whylen, "%s\"%s\" is %s (expected a string)", where, key, json_type_name(v->type));
        return NULL;
    }
    return v;
}

/* The messages of array `list` (the record's field `key`) into m[at...], each `trained` or not (a prompt's
 * are not, as TRL trains on a conversational prompt-completion record's completion only); counts the assistant
 * messages into *assistants. 0, or -1 with why ("messages[2]: unknown role \"tool\" ..."). */
static int read_message_list(const JsonValue *list, const char *key, bool trained, Message *m, size_t *at,
                             int *assistants, char *why, size_t whylen) {
    for (size_t i = 0; i < list->count; i++) {
        const JsonValue *msg = list->items[i];
        char where[64];
        snprintf(where, sizeof where, "%s[%zu]: ", key, i);
        const JsonValue *role, *content;
        if (msg->type != JSON_OBJECT) {
            snprintf(why, whylen, "%sis %s (expected {\"role\", \"content\"})", where, json_type_name(msg->type));
            return -1;
        }
        if (!(role = string_member(msg, "role", where, why, whylen)) ||
            !(content = string_member(msg, "content", where, why, whylen)))
            return -1;
        int r = -1;
        for (int k = 0; k < 3; k++)
            if (role->string_len == strlen(role_names[k]) && memcmp(role->string, role_names[k], role->string_len) == 0)
                r = k;
        if (r < 0) {
            /* the role as JSON would write it (a NUL or a control character inside would otherwise cut it short) */
            char shown[200];
            size_t n = 0;
            for (size_t k = 0; k < role->string_len && k < 40 && n + 8 < sizeof shown; k++) {
                const unsigned char c = (unsigned char)role->string[k];
                n += (size_t)snprintf(shown + n, sizeof shown - n, c < 0x20 || c == '"' || c == '\\' ? "\\u%04x" : "%c", c);
            }
            /* ShareGPT's roles (human, gpt) */
            const bool sharegpt = strcmp(shown, "human") == 0 || strcmp(shown, "gpt") == 0;
            snprintf(why, whylen, "%sunknown role \"%s%s\" (expected system, user or assistant%s)", where, shown,
                     role->string_len > 40 ? "..." : "",
                     sharegpt ? "; ShareGPT's human and gpt: rewrite them as user and assistant" : "");
            return -1;
        }
        Message *out = &m[(*at)++];
        *out = (Message){.role = (Role)r, .content = content->string, .len = content->string_len, .trained = trained};
        const JsonValue *reasoning = json_get(msg, "reasoning_content"); /* used when a string, as the template does */
        if (r == ROLE_ASSISTANT && reasoning && reasoning->type == JSON_STRING) {
            out->reasoning = reasoning->string;
            out->reasoning_len = reasoning->string_len;
        }
        *assistants += r == ROLE_ASSISTANT && trained;
    }
    return 0;
}

/* A non-empty array field `key` of the record; NULL with why when it is something else. */
static const JsonValue *message_array(const JsonValue *record, const char *key, char *why, size_t whylen) {
    const JsonValue *v = json_get(record, key);
    if (v && v->type == JSON_ARRAY && v->count > 0) return v;
    snprintf(why, whylen, "\"%s\" is %s (expected a non-empty array of {\"role\", \"content\"})", key,
             !v ? "missing" : v->type == JSON_ARRAY ? "an empty array" : json_type_name(v->type));
    return NULL;
}

/* The messages of a conversational prompt (NULL: none; not trained) and of the list `trained` (the record's field
 * `key`) into *out (malloc'd, *n of them); -1 with why when one is malformed, or `none` when no trained assistant
 * message is there. */
static int read_lists(const JsonValue *prompt, const JsonValue *trained, const char *key, const char *none,
                      Message **out, size_t *n, char *why, size_t whylen) {
    Message *m = mt_calloc((prompt ? prompt->count : 0) + trained->count, sizeof *m);
    size_t k = 0;
    int assistants = 0;
    int rc = (prompt && read_message_list(prompt, "prompt", false, m, &k, &assistants, why, whylen) != 0) ||
                     read_message_list(trained, key, true, m, &k, &assistants, why, whylen) != 0
                 ? -1 : 0;
    if (rc == 0 && assistants == 0) {
        snprintf(why, whylen, "%s", none);
        rc = -1;
    }
    if (rc != 0) {
        free(m);
        return -1;
    }
    *out = m;
    *n = k;
    return 0;
}

/* The record's field `key`, NULL when absent or null (columnar exports, pandas and Hugging Face `datasets`,
 * write null for a column a row lacks). */
static const JsonValue *field(const JsonValue *record, const char *key) {
    const JsonValue *v = json_get(record, key);
    return v && v->type != JSON_NULL ? v : NULL;
}

/* {"prompt": [...], "completion": [...]}: TRL's conversational prompt-completion, the completion's assistant
 * messages trained and nothing of the prompt. */
/* what a record that needs a template is told to give */
#define AUTO_HINT "auto, the model's own read beside --tokenizer, or one of "

static int read_conversational(const JsonValue *record, SftTemplate t, Message **out, size_t *n, char *why,
                               size_t whylen) {
    if (t == SFT_TEMPLATE_NONE) {
        snprintf(why, whylen, "a conversational \"prompt\" (a list of messages) needs a chat template "
                 "(--chat-template %s%s)", AUTO_HINT, sft_template_names());
        return -1;
    }
    if (field(record, "system")) {
        snprintf(why, whylen, "\"system\" beside a conversational \"prompt\": give it as the prompt's first "
                 "message, {\"role\": \"system\", ...}");
        return -1;
    }
    const JsonValue *prompt = message_array(record, "prompt", why, whylen);
    const JsonValue *completion = prompt ? message_array(record, "completion", why, whylen) : NULL;
    if (!completion) return -1;
    return read_lists(prompt, completion, "completion", "no assistant message in \"completion\" (nothing to train on)",
                      out, n, why, whylen);
}

/* The record's messages into *out (malloc'd, *n of them). 0, or -1 with why. */
static int read_messages(const JsonValue *record, SftTemplate t, Message **out, size_t *n, char *why,
                         size_t whylen) {
    *out = NULL;
    *n = 0;
    const JsonValue *messages = field(record, "messages");
    if (messages && (field(record, "prompt") || field(record, "completion"))) {
        snprintf(why, whylen, "both \"messages\" and \"%s\" (expected one form: {\"prompt\", \"completion\"} or "
                 "{\"messages\": [...]})", field(record, "prompt") ? "prompt" : "completion");
        return -1;
    }
    if (!messages) {
        const JsonValue *given = field(record, "prompt");
        if (given && given->type == JSON_ARRAY) return read_conversational(record, t, out, n, why, whylen);
        const JsonValue *prompt = string_member(record, "prompt", "", why, whylen);
        if (!prompt) {
            if (!given)
                snprintf(why, whylen, "no \"prompt\" or \"messages\" field (expected {\"prompt\", \"completion\"} "
                         "or {\"messages\": [{\"role\", \"content\"}...]})%s",
                         field(record, "conversations") ? "; ShareGPT's \"conversations\" of {\"from\", \"value\"} "
                         "are not read: rewrite them as \"messages\" of {\"role\", \"content\"}, human as user and "
                         "gpt as assistant" : "");
            return -1;
        }
        const JsonValue *completion = string_member(record, "completion", "", why, whylen);
        if (!completion) return -1;
        /* an optional "system": the conversation's system message */
        const JsonValue *system = field(record, "system");
        if (system && !(system = string_member(record, "system", "", why, whylen))) return -1;
        if (system && t == SFT_TEMPLATE_NONE) {
            snprintf(why, whylen, "a \"system\" field needs a chat template (--chat-template %s%s)", AUTO_HINT,
                     sft_template_names());
            return -1;
        }
        Message *m = mt_calloc(3, sizeof *m);
        size_t k = 0;
        if (system) m[k++] = (Message){.role = ROLE_SYSTEM, .content = system->string, .len = system->string_len};
        m[k++] = (Message){.role = ROLE_USER, .content = prompt->string, .len = prompt->string_len};
        m[k++] = (Message){.role = ROLE_ASSISTANT, .content = completion->string, .len = completion->string_len,
                           .trained = true};
        *out = m;
        *n = k;
        return 0;
    }
    if (t == SFT_TEMPLATE_NONE) {
        snprintf(why, whylen, "a \"messages\" record needs a chat template (--chat-template %s%s)", AUTO_HINT,
                 sft_template_names());
        return -1;
    }
    if (!message_array(record, "messages", why, whylen)) return -1;
    return read_lists(NULL, messages, "messages", "no assistant message (nothing to train on)", out, n, why, whylen);
}

int sft_render(const JsonValue *record, SftTemplate t, SftRendered *out, char *why, size_t whylen) {
    out->len = out->nsegments = 0;
    if (out->text) out->text[0] = '\0';
    if (record->type != JSON_OBJECT) {
        snprintf(why, whylen, "the line is %s (expected a JSON object)", json_type_name(record->type));
        return -1;
    }
    Message *m;
    size_t n;
    if (read_messages(record, t, &m, &n, why, whylen) != 0) return -1;
    out->empty_replies = 0;
    for (size_t i = 0; i < n; i++) {
        const char *c = m[i].content;
        size_t len = m[i].len;
        trim(&c, &len);
        out->empty_replies += counted(&m[i]) && len == 0 && !(t == SFT_TEMPLATE_QWEN3 && m[i].reasoning_len > 0);
    }
    if (t == SFT_TEMPLATE_LLAMA3 || t == SFT_TEMPLATE_LLAMA31) render_llama3(m, n, t == SFT_TEMPLATE_LLAMA31, out);
    else if (t == SFT_TEMPLATE_CHATML) render_chatml(m, n, out);
    else if (t == SFT_TEMPLATE_QWEN3) render_qwen3(m, n, out);
    else {
        emit(out, m[0].content, m[0].len, false);
        emit(out, m[1].content, m[1].len, true);
    }
    free(m);
    return 0;
}
