/* test_sft_template_text.c: the prose a model's own chat template writes beyond the published templates
 * (src/data/sft_template_text.c). The four published templates megatrain renders
 * (tests/fixtures/chat_templates/templates) write none, which keeps its list of their prose whole; Llama 3's with
 * a default system prompt added, as fine-tunes ship it, writes one piece, named; a comment, an error it raises,
 * special tokens, role names and one- or two-word strings are not prose; text outside tags and escaped quotes are
 * read. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/fs.h"
#include "data/sft_template_text.h"

static char *published(const char *name) {
    char path[256], err[256];
    snprintf(path, sizeof path, "tests/fixtures/chat_templates/templates/%s.jinja", name);
    size_t len = 0;
    char *jinja = mt_read_file(path, 1 << 20, &len, err, sizeof err);
    if (!jinja) fail_msg("%s", err);
    return jinja;
}

static void test_published_write_nothing_else(void **state) {
    (void)state;
    static const char *const names[] = {"llama3", "llama3.1", "chatml", "qwen3"};
    for (int i = 0; i < 4; i++) {
        char *jinja = published(names[i]);
        char first[200];
        const int n = sft_template_foreign_text(jinja, first, sizeof first);
        if (n != 0) fail_msg("%s: %d pieces of its own prose, the first: \"%s\"", names[i], n, first);
        free(jinja);
    }
}

/* Llama 3's template with a default system prompt when the conversation has none (a pirate fine-tune's) */
static void test_default_system_prompt(void **state) {
    (void)state;
    char *base = published("llama3");
    const char *prompt = "{%- if messages[0]['role'] != 'system' %}{{- '<|start_header_id|>system<|end_header_id|>"
                         "\\n\\nYou are a pirate. Always answer like one.<|eot_id|>' }}{%- endif %}";
    char *jinja = malloc(strlen(base) + strlen(prompt) + 1);
    snprintf(jinja, strlen(base) + strlen(prompt) + 1, "%s%s", prompt, base);
    char first[200];
    assert_int_equal(sft_template_foreign_text(jinja, first, sizeof first), 1);
    assert_string_equal(first, "system You are a pirate. Always answer like one.");
    char tiny[16]; /* shortened to fit */
    assert_int_equal(sft_template_foreign_text(jinja, tiny, sizeof tiny), 1);
    assert_string_equal(tiny, "system You a...");
    free(jinja);
    free(base);
}

static void test_what_is_read(void **state) {
    (void)state;
    char first[200];
    /* comments, special tokens, roles, short strings: nothing */
    assert_int_equal(sft_template_foreign_text("{# You are a pirate, a comment #}{{ '<|im_start|>' + message['role'] "
                                               "+ '\\n' }}{% if x == 'two words' %}{% endif %}", first, sizeof first), 0);
    /* text outside tags is written as it is */
    assert_int_equal(sft_template_foreign_text("{{ bos_token }}Answer in French please.{{ messages }}", first,
                                               sizeof first), 1);
    assert_string_equal(first, "Answer in French please.");
    /* an escaped quote inside a literal; published prose in another spacing is still the published one */
    assert_int_equal(sft_template_foreign_text("{{- \"Say \\\"arr\\\" a lot\" }}{{ 'Do   not use\\nvariables.' }}",
                                               first, sizeof first), 1);
    assert_string_equal(first, "Say \"arr\" a lot");
    /* an error the template raises is never written: a role check's message is no prose of the data */
    assert_int_equal(sft_template_foreign_text("{% if x %}{{ raise_exception( 'Conversation roles must alternate "
                                               "user/assistant' ) }}{% endif %}", first, sizeof first), 0);
    assert_int_equal(sft_template_foreign_text("{{ raise('Conversation roles must alternate') }}", first, sizeof first),
                     1);
    /* an unterminated tag or literal ends with the text */
    assert_int_equal(sft_template_foreign_text("{{ 'no end to this one", first, sizeof first), 1);
    assert_int_equal(sft_template_foreign_text("{{ x ", first, sizeof first), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_published_write_nothing_else),
        cmocka_unit_test(test_default_system_prompt),
        cmocka_unit_test(test_what_is_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
