/* fuzz_cli_option.c: libFuzzer harness for what a command says of an option
 * it does not know (src/core/cli.c): cli_suggest_option reads the option
 * names from a usage text (its synopsis and option table, not the prose and
 * examples that name other commands' options: FOREIGN below) and compares
 * them with the argument by edit distance; cli_unknown_option says
 * it all on stderr (caught here in a memory stream). The argument is the
 * input up to the first NUL byte, as argv holds it (any bytes, any length,
 * '=' anywhere). A suggestion is an option of the usage text ("--" and name
 * characters, a whole word there), shorter than 64 bytes, other than the
 * argument's own name and within edit distance 2 of it ('_' read as '-', one
 * dash added to a single one); the message names the argument whole and the
 * suggestion. Also the edit distance itself on the two sides of the first
 * '=': symmetric, 0 exactly for equal strings, at most the longer length. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cli.h"
#include "fuzz_util.h"

/* A usage text as the commands write theirs: a synopsis, prose and examples that name other commands' options, and
 * an option table whose descriptions name more. Only the synopsis's and the table's first column are this command's
 * (FOREIGN are not and must never be suggested). */
static const char *const usage_text =
    "usage: megatrain eval CKPT [--data PREFIX] [--split W [--test]] [--batches N|all] [--seq-len T]\n"
    "                           [--micro-batch-size B] [--pack|--no-pack [--pack-overlong error|truncate]] [--json]\n"
    "\n"
    "Prose that names other commands' options: a dataset of data build --format sft, a layout\n"
    "of plan --world 8 --fit.\n"
    "\n"
    "  --data PREFIX           the dataset (a run's --set data.valid=PREFIX)\n"
    "  --seed S                the sampling seed (as --seed-file elsewhere)\n"
    "  --device D              cpu or cuda (see --device-memory in plan)\n"
    "\n"
    "examples:\n"
    "  megatrain plan my.yaml --world 8 --device-memory 80 --fitting\n";
static const char *const foreign[] = {"--format", "--world", "--fit", "--set", "--seed-file", "--device-memory",
                                      "--fitting", NULL};

static int name_char(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; }

/* Is `option` a whole "--name" word of usage? */
static int in_usage(const char *usage, const char *option) {
    const size_t m = strlen(option);
    for (const char *p = strstr(usage, option); p; p = strstr(p + 1, option))
        if ((p == usage || !name_char(p[-1])) && !name_char(p[m])) return 1;
    return 0;
}

static void check_suggestion(const char *usage, const char *arg, const char *got, const char *buf, size_t len) {
    const size_t n = strcspn(arg, "=");
    if (!got) return;
    if (got != buf) fuzz_fail("cli_suggest_option returned a pointer other than its buffer");
    if (n >= 64) fuzz_fail("a suggestion for a name of %zu bytes", n);
    const size_t m = strnlen(got, len);
    if (m >= len) fuzz_fail("suggestion not terminated in its %zu-byte buffer", len);
    if (len < 64) return; /* cut to the buffer: not a whole option */
    if (m < 3 || m >= 64 || strncmp(got, "--", 2) != 0) fuzz_fail("suggestion '%s' is no option name", got);
    for (size_t i = 2; i < m; i++)
        if (!name_char(got[i])) fuzz_fail("suggestion '%s' is no option name", got);
    if (!in_usage(usage, got)) fuzz_fail("suggestion '%s' is not an option of the usage text", got);
    for (const char *const *f = foreign; *f; f++)
        if (!strcmp(got, *f)) fuzz_fail("suggestion '%s' is another command's (the prose's or an example's)", got);
    if (strlen(got) == n && strncmp(got, arg, n) == 0) fuzz_fail("suggested the argument's own name '%s'", got);
    char dashed[72] = "";
    size_t k = 0;
    for (size_t i = 0; i < n; i++) dashed[k++] = arg[i] == '_' ? '-' : arg[i];
    dashed[k] = '\0';
    if (dashed[0] == '-' && dashed[1] != '-') { /* one dash short */
        memmove(dashed + 1, dashed, k + 1);
        dashed[0] = '-';
    }
    if (mt_edit_distance(dashed, got) > 2)
        fuzz_fail("suggestion '%s' is %d edits from '%s'", got, mt_edit_distance(dashed, got), dashed);
}

static void check_message(const char *usage, const char *arg, const char *near) {
    char *text = NULL;
    size_t size = 0;
    FILE *stream = open_memstream(&text, &size);
    if (!stream) fuzz_fail("open_memstream failed");
    FILE *saved = stderr;
    stderr = stream;
    cli_unknown_option("eval", arg, usage);
    stderr = saved;
    if (fclose(stream) != 0) fuzz_fail("the message stream failed");
    char head[128];
    snprintf(head, sizeof head, "megatrain: error: eval: unknown option '");
    if (strncmp(text, head, strlen(head)) != 0) fuzz_fail("message starts otherwise: %.80s", text);
    const size_t a = strlen(arg);
    if (size < strlen(head) + a || memcmp(text + strlen(head), arg, a) != 0 || text[strlen(head) + a] != '\'')
        fuzz_fail("message does not name the argument whole");
    if (near) {
        char mean[96];
        snprintf(mean, sizeof mean, " (did you mean %s?)", near);
        if (strncmp(text + strlen(head) + a + 1, mean, strlen(mean)) != 0)
            fuzz_fail("message does not suggest %s", near);
    }
    const char *tail = "run `megatrain eval --help` for the options\n";
    if (size < strlen(tail) || strcmp(text + size - strlen(tail), tail) != 0)
        fuzz_fail("message ends otherwise");
    free(text);
}

static void check_distance(const char *arg) {
    const char *eq = strchr(arg, '=');
    if (!eq) return;
    char *left = strndup(arg, (size_t)(eq - arg));
    const char *right = eq + 1;
    const int d = mt_edit_distance(left, right), back = mt_edit_distance(right, left);
    const size_t ll = strlen(left), lr = strlen(right);
    if (d != back) fuzz_fail("edit distance %d one way, %d the other", d, back);
    if (ll > 63 || lr > 63) {
        if (d != 99) fuzz_fail("edit distance %d for a string over 63 bytes", d);
    } else {
        const size_t longer = ll > lr ? ll : lr, diff = ll > lr ? ll - lr : lr - ll;
        if ((d == 0) != (strcmp(left, right) == 0)) fuzz_fail("edit distance 0 exactly for equal strings, got %d", d);
        if (d < 0 || (size_t)d > longer || (size_t)d < diff) fuzz_fail("edit distance %d of %zu and %zu bytes", d, ll, lr);
    }
    free(left);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *arg = strndup((const char *)data, size); /* up to the first NUL, as argv holds it */
    if (!arg) return 0;
    const char *usage = usage_text;
    char near[64];
    const char *got = cli_suggest_option(usage, arg, near, sizeof near);
    check_suggestion(usage, arg, got, near, sizeof near);
    char *small = malloc(8); /* a short buffer: the name cut to it, never past it */
    const char *cut = cli_suggest_option(usage, arg, small, 8);
    check_suggestion(usage, arg, cut, small, 8);
    if ((got == NULL) != (cut == NULL) || (got && strncmp(got, cut, 7) != 0))
        fuzz_fail("a short buffer changed the suggestion");
    free(small);
    check_message(usage, arg, got);
    check_distance(arg);
    free(arg);
    return 0;
}
