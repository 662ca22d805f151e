/* fuzz_cli_option.c: libFuzzer harness for what a command says of an option
 * it does not know (src/core/cli.c): cli_suggest_option reads the option
 * names from a usage text (a copy of eval's, the longest list: linking
 * eval_options.o would bring the model and MPI in) and compares them with the argument by edit distance; cli_unknown_option says
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

/* A copy of eval_usage_text (src/eval/eval_options.c). */
static const char *const usage_text =
    "usage: megatrain eval CKPT [--data PREFIX] [--split TRAIN,VALID,TEST [--test]] [--batches N|all] [--seq-len T]\n"
    "                           [--micro-batch-size B] [--seed S] [--pack|--no-pack [--pack-overlong error|truncate]]\n"
    "                           [--loss per_micro_batch|per_token] [--device D] [--json]\n"
    "\n"
    "Print the mean next-token loss (6 decimals) of the model in checkpoint CKPT over\n"
    "N batches of B samples of T tokens from the Megatron dataset PREFIX (.bin/.idx),\n"
    "used whole and read as a run reads data.valid, or its validation share with\n"
    "--split. A run's checkpoint gives what the command line leaves out from the run's\n"
    "recipe (its seed, seq_len, micro_batch_size, eval_batches, data.pack, train.loss, and\n"
    "without --data its data.valid, or its data.train with data.split), so that\n"
    "`megatrain eval RUN_DIR` prints its eval_loss; a line on stderr says what was taken,\n"
    "and a note which options would give the run's eval_loss when those given do not.\n"
    "A dataset with a loss mask (data build --format sft: PREFIX_mask.{bin,idx}) is\n"
    "scored on its unmasked targets only. CKPT is a checkpoint directory, or a run (or\n"
    "checkpoints/) directory: its newest checkpoint. The defaults below are those of a\n"
    "checkpoint without a recipe (a conversion's).\n"
    "\n"
    "  --data PREFIX           the dataset (required without a run's recipe, and for a run that evaluated\n"
    "                          on a blend of datasets)\n"
    "  --split W               TRAIN,VALID,TEST weights (e.g. 98,2,0; a missing share is 0): score the documents that a run with\n"
    "                          data.train PREFIX and this data.split validates on (default: all of PREFIX,\n"
    "                          as data.valid)\n"
    "  --test                  with --split, score its test share instead: a run's test_loss\n"
    "  --batches N             batches to average over (default 8); all: every sample of the data once, in\n"
    "                          ceil(samples / B) batches, the last one's places past the data's end masked\n"
    "                          padding and its loss weighed by its samples (as train.eval_batches: all)\n"
    "  --seq-len T             tokens per sample (default 256; at most the model's\n"
    "                          max_position_embeddings)\n"
    "  --micro-batch-size B    samples per batch (default 4)\n"
    "  --seed S                the sampling seed (default 1234, as run.seed)\n"
    "  --pack                  a sample is a row of whole documents packed first-fit decreasing, each\n"
    "                          attending to itself only (as data.pack: true; cpu only); --no-pack: not\n"
    "  --pack-overlong P       with --pack, a document longer than T + 1 tokens: error (the default)\n"
    "                          or truncate to its first T + 1 (as data.pack_overlong)\n"
    "  --loss L                per_micro_batch (the default: the mean of the batches' mean losses) or\n"
    "                          per_token (the sum over every counted target of all batches over their\n"
    "                          number), as train.loss; per_token is cpu only\n"
    "  --device D              cpu (default; fp32) or cuda (one GPU, bf16 as a run computes there)\n"
    "  --json                  print one JSON object instead: checkpoint, step, loss, perplexity,\n"
    "                          batches, micro_batch_size, seq_len, tokens, samples, data, split, share, seed,\n"
    "                          device, loss_reduction, pack, masked, counted\n";

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
