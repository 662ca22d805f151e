/* sft_template_text.c: the prose a model's own chat template writes beyond the published templates
 * (sft_template_text.h).
 *
 * `data build --chat-template auto` recognizes a template by its marks (sft_render.c: Llama 3's header tokens, Qwen3's
 * enable_thinking, ...) and renders the published template in C; Jinja is not evaluated. A fine-tune's template
 * that keeps those marks and adds text of its own (a default system prompt such as "You are a pirate.") would be
 * rendered without it, and the model trained on text it never sees at inference. This reads the template's string
 * literals (in {{ }} and {% %}, quotes' escapes decoded; raise_exception's argument, an error never written,
 * left out) and its text outside tags ({# #} comments skipped), keeps
 * those that read as prose (three words of two letters or more once special tokens <|...|> and tags <...> are set
 * aside) and names those that are none of `published` below: the prose of the four published templates
 * (tests/fixtures/chat_templates/templates; Llama 3.1's own adds none beyond Llama 3.2's), compared with special
 * tokens set aside and whitespace collapsed. A template that changes only structure (a block left out, another
 * order) is not seen: that would take evaluating it. */
#include "sft_template_text.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"

/* The published templates' prose, normalized as normalize() does. tests/unit/test_sft_template_text.c checks that
 * each published template has none outside this list. */
static const char *const published[] = {
    "# Tools You may call one or more functions to assist with the user query. You are provided with function "
    "signatures within <tools></tools> XML tags: <tools>",
    "</tools> For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags: <tool_call> {\"name\": <function-name>, \"arguments\": <args-json-object>} "
    "</tool_call>",
    "Cutting Knowledge Date: December 2023",
    "Do not use variables.",
    "Given the following functions, please respond with a JSON for a function call",
    "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.",
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "You have access to the following functions. To call a function, please respond with JSON for a function call.",
    "system You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
    "with its proper arguments that best answers the given prompt.",
    NULL,
};

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* s[0..n) with each special token <|...|> and each run of whitespace made one space, trimmed: into out (n + 1). */
static void normalize(const char *s, size_t n, char *out) {
    size_t o = 0;
    bool space = true; /* drops leading whitespace */
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '<' && i + 1 < n && s[i + 1] == '|') {
            const char *end = memchr(s + i + 2, '|', n - i - 2);
            if (end && (size_t)(end - s) + 1 < n && end[1] == '>') {
                i = (size_t)(end - s) + 1;
                if (!space) out[o++] = ' ', space = true;
                continue;
            }
        }
        if (is_space(s[i])) {
            if (!space) out[o++] = ' ', space = true;
            continue;
        }
        out[o++] = s[i];
        space = false;
    }
    while (o > 0 && out[o - 1] == ' ') o--;
    out[o] = '\0';
}

/* Whether normalized text reads as prose: three words of two letters or more outside tags <...> (no space inside). */
static bool prose(const char *t) {
    int words = 0;
    for (size_t i = 0; t[i];) {
        if (t[i] == '<') {
            size_t j = i + 1;
            while (t[j] && t[j] != '>' && t[j] != ' ') j++;
            if (t[j] == '>') {
                i = j + 1;
                continue;
            }
        }
        size_t letters = 0;
        while (is_letter(t[i + letters])) letters++;
        if (letters >= 2) words++;
        i += letters ? letters : 1;
    }
    return words >= 3;
}

typedef struct Found {
    int count;
    char *first;
    size_t len;
} Found;

/* One piece of the template's text: counted (and the first kept) when it is prose none of the published write. */
static void consider(const char *s, size_t n, Found *f) {
    char *t = mt_malloc(n + 1);
    normalize(s, n, t);
    bool known = !prose(t);
    for (int i = 0; !known && published[i]; i++) known = strcmp(t, published[i]) == 0;
    if (!known && f->count++ == 0 && f->len > 0) {
        if (strlen(t) < f->len) snprintf(f->first, f->len, "%s", t);
        else snprintf(f->first, f->len, "%.*s...", (int)(f->len > 4 ? f->len - 4 : 0), t);
    }
    free(t);
}

/* The string literal quoted at s[0] (its escapes decoded) into out; returns where it ends (past the closing quote,
 * or at the end of the text when it has none). */
static const char *literal(const char *s, char *out, size_t *out_len) {
    const char quote = *s++;
    size_t o = 0;
    while (*s && *s != quote) {
        if (*s == '\\' && s[1]) {
            const char e = s[1];
            out[o++] = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
            s += 2;
        } else {
            out[o++] = *s++;
        }
    }
    *out_len = o;
    return *s ? s + 1 : s;
}

/* Whether the literal quoted at q is raise_exception's argument: an error the template raises, never written. */
static bool raised(const char *jinja, const char *q) {
    static const char call[] = "raise_exception";
    while (q > jinja && (q[-1] == ' ' || q[-1] == '\t' || q[-1] == '\n')) q--;
    if (q == jinja || q[-1] != '(') return false;
    q--;
    while (q > jinja && (q[-1] == ' ' || q[-1] == '\t')) q--;
    const size_t n = sizeof call - 1;
    return (size_t)(q - jinja) >= n && strncmp(q - n, call, n) == 0;
}

int sft_template_foreign_text(const char *jinja, char *first, size_t len) {
    Found f = {.first = first, .len = len};
    if (len) first[0] = '\0';
    char *buf = mt_malloc(strlen(jinja) + 1);
    const char *p = jinja;
    while (*p) {
        if (p[0] == '{' && p[1] == '#') { /* a comment */
            const char *end = strstr(p + 2, "#}");
            p = end ? end + 2 : p + strlen(p);
        } else if (p[0] == '{' && (p[1] == '{' || p[1] == '%')) { /* a tag: its string literals */
            const char *close = p[1] == '{' ? "}}" : "%}";
            p += 2;
            while (*p && strncmp(p, close, 2) != 0) {
                if (*p == '"' || *p == '\'') {
                    size_t n = 0;
                    const bool error = raised(jinja, p);
                    p = literal(p, buf, &n);
                    if (!error) consider(buf, n, &f);
                } else {
                    p++;
                }
            }
            p += *p ? 2 : 0;
        } else { /* text outside tags, written as it is */
            const char *start = p;
            while (*p && !(p[0] == '{' && (p[1] == '{' || p[1] == '%' || p[1] == '#'))) p++;
            consider(start, (size_t)(p - start), &f);
        }
    }
    free(buf);
    return f.count;
}
