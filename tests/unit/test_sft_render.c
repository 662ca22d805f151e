/* test_sft_render.c: the chat templates of `data build --format sft`
 * (src/data/sft_render.c) against what transformers' apply_chat_template
 * renders with the published Jinja templates (tests/fixtures/chat_templates,
 * made by its make_fixtures.py): every record's text byte for byte,
 * including Jinja's trim at Unicode whitespace and not at NUL or zero-width
 * characters. The segments tile the text, alternate between masked and
 * counted, and the counted ones are exactly each assistant message's
 * content (trimmed under llama3 and llama3.1; under qwen3 with its reasoning, unless
 * that is empty) and its end-of-turn token. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/fs.h"
#include "core/json.h"
#include "data/sft_render.h"

#define EXPECTED "tests/fixtures/chat_templates/expected.json"

static char *from_hex(const char *hex, size_t *len) {
    *len = strlen(hex) / 2;
    char *out = malloc(*len + 1);
    for (size_t i = 0; i < *len; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        out[i] = (char)v;
    }
    out[*len] = '\0';
    return out;
}

static SftTemplate template_of(const char *name) {
    int t = sft_template_from_name(name);
    if (t < 0) fail_msg("fixture template %s unknown", name);
    return (SftTemplate)t;
}

/* The segments start at 0, follow each other without a gap and end at the text's end; neighbours differ in
 * counted (emit merges equal ones); some text is counted. */
static void check_segments(const SftRendered *r, const char *name) {
    size_t at = 0, counted = 0;
    for (size_t i = 0; i < r->nsegments; i++) {
        const SftSegment *s = &r->segments[i];
        if (s->start != at || s->len == 0) fail_msg("%s: segment %zu starts at %zu (expected %zu), %zu bytes", name, i,
                                                     s->start, at, s->len);
        if (i && s->counted == r->segments[i - 1].counted) fail_msg("%s: segments %zu and %zu not merged", name, i - 1, i);
        at += s->len;
        if (s->counted) counted += s->len;
    }
    if (at != r->len) fail_msg("%s: segments cover %zu of %zu bytes", name, at, r->len);
    if (counted == 0) fail_msg("%s: nothing counted", name);
}

/* The counted text, concatenated, against each assistant message's (or the completion's) content trimmed as the
 * rendered text has it, followed by the end-of-turn token: found in the rendered text after the assistant header. */
static void check_counted(const SftRendered *r, SftTemplate t, size_t untrained, const char *name) {
    const bool llama = t == SFT_TEMPLATE_LLAMA3 || t == SFT_TEMPLATE_LLAMA31;
    const char *header = llama ? "<|start_header_id|>assistant<|end_header_id|>\n\n" : "<|im_start|>assistant\n";
    const char *eot = llama ? "<|eot_id|>" : "<|im_end|>";
    char *want = calloc(r->len + 1, 1), *got = calloc(r->len + 1, 1);
    size_t nwant = 0, ngot = 0;
    for (const char *p = r->text; (p = memmem(p, r->len - (size_t)(p - r->text), header, strlen(header))); ) {
        p += strlen(header);
        const char *end = memmem(p, r->len - (size_t)(p - r->text), eot, strlen(eot));
        if (!end) fail_msg("%s: no %s after an assistant header", name, eot);
        end += strlen(eot);
        if (untrained > 0) { /* a conversational prompt's assistant turn: not counted */
            untrained--;
            p = end;
            continue;
        }
        /* qwen3: an empty think block is the enable_thinking=False prompt's, masked; a non-empty one is counted */
        const char *empty_think = "<think>\n\n</think>\n\n";
        if (t == SFT_TEMPLATE_QWEN3 && !strncmp(p, empty_think, strlen(empty_think))) p += strlen(empty_think);
        memcpy(want + nwant, p, (size_t)(end - p));
        nwant += (size_t)(end - p);
        p = end;
    }
    for (size_t i = 0; i < r->nsegments; i++)
        if (r->segments[i].counted) {
            memcpy(got + ngot, r->text + r->segments[i].start, r->segments[i].len);
            ngot += r->segments[i].len;
        }
    if (nwant != ngot || memcmp(want, got, ngot) != 0) fail_msg("%s: counted text differs from the assistant turns", name);
    free(want);
    free(got);
}

static void test_transformers_renderings(void **state) {
    (void)state;
    char err[512];
    size_t len = 0;
    char *text = mt_read_file(EXPECTED, 1 << 22, &len, err, sizeof err);
    if (!text) fail_msg("%s", err);
    JsonValue *root = json_parse(text, len, err, sizeof err);
    if (!root) fail_msg(EXPECTED ": %s", err);
    const JsonValue *cases = json_get(root, "cases");
    assert_non_null(cases);
    assert_true(cases->count >= 120);
    SftRendered r = {0};
    for (size_t c = 0; c < cases->count; c++) {
        const JsonValue *k = cases->items[c];
        char name[128];
        snprintf(name, sizeof name, "%s/%s", json_get(k, "template")->string, json_get(k, "name")->string);
        SftTemplate t = template_of(json_get(k, "template")->string);
        const JsonValue *line = json_get(k, "record");
        JsonValue *record = json_parse(line->string, line->string_len, err, sizeof err);
        if (!record) fail_msg("%s: %s", name, err);
        char why[256] = "";
        if (sft_render(record, t, &r, why, sizeof why) != 0) fail_msg("%s: refused: %s", name, why);
        size_t want_len;
        char *want = from_hex(json_get(k, "text_hex")->string, &want_len);
        if (r.len != want_len || memcmp(r.text, want, want_len) != 0)
            fail_msg("%s: rendered %zu bytes \"%s\", transformers %zu bytes \"%s\"", name, r.len, r.text, want_len, want);
        check_segments(&r, name);
        /* TRL's conversational prompt-completion: the prompt's assistant messages are not trained */
        size_t untrained = 0;
        const JsonValue *prompt = json_get(record, "prompt");
        for (size_t i = 0; prompt && prompt->type == JSON_ARRAY && i < prompt->count; i++)
            untrained += !strcmp(json_get(prompt->items[i], "role")->string, "assistant");
        check_counted(&r, t, untrained, name);
        free(want);
        json_free(record);
    }
    sft_rendered_free(&r);
    json_free(root);
    free(text);
}

/* A role is matched by its whole string: one with a NUL inside is no role the templates know. */
static void test_role_with_nul_refused(void **state) {
    (void)state;
    const char *line = "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, "
                       "{\"role\": \"assistant\\u0000x\", \"content\": \"a\"}]}";
    char err[256], why[256] = "";
    JsonValue *record = json_parse(line, strlen(line), err, sizeof err);
    assert_non_null(record);
    SftRendered r = {0};
    assert_int_equal(sft_render(record, SFT_TEMPLATE_CHATML, &r, why, sizeof why), -1);
    assert_non_null(strstr(why, "messages[1]: unknown role"));
    sft_rendered_free(&r);
    json_free(record);
}

/* The published templates (tests/fixtures/chat_templates/templates, by make_fixtures.py) are each recognized as
 * the template that imitates them; a text with none of their marks is none. */
static void test_recognize_published(void **state) {
    (void)state;
    static const char *const names[] = {"llama3", "llama3.1", "chatml", "qwen3"};
    for (int i = 0; i < 4; i++) {
        char path[256], err[256];
        snprintf(path, sizeof path, "tests/fixtures/chat_templates/templates/%s.jinja", names[i]);
        size_t len = 0;
        char *jinja = mt_read_file(path, 1 << 20, &len, err, sizeof err);
        if (!jinja) fail_msg("%s", err);
        const int got = sft_template_recognize(jinja);
        if (got != sft_template_from_name(names[i]))
            fail_msg("%s recognized as %s", path, got < 0 ? "none" : sft_template_name((SftTemplate)got));
        free(jinja);
    }
    assert_int_equal(sft_template_recognize("{{ messages }}<|im_start|>You are a helpful assistant"), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transformers_renderings),
        cmocka_unit_test(test_role_with_nul_refused),
        cmocka_unit_test(test_recognize_published),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
