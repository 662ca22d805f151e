/* data_build.c: `megatrain data build`: plain text or JSONL -> a Megatron
 * indexed dataset (PREFIX.bin + PREFIX.idx) with the byte-level tokenizer.
 *
 * Plain text: every non-blank line is one document. JSONL (name ending in
 * .jsonl or .json, or a first non-blank line starting with '{'): one JSON
 * object per line whose --json-key field (default "text") is the document.
 * Token = byte value (vocab 256); each document ends with '\n' (10) as its
 * end-of-document token, like Megatron's --append-eod; dtype uint16, as
 * Megatron picks for a vocabulary under 65500.
 *
 * An existing PREFIX.bin or PREFIX.idx is refused unless --overwrite. The
 * files are written under temporary names and renamed into place at the end
 * (indexed_dataset_writer.c); a failed or interrupted (SIGINT, SIGTERM,
 * SIGHUP) build removes its temporary files, and one killed outright leaves
 * at most a PREFIX.bin.tmp.PID, never a PREFIX.idx.
 */
#include "data_build.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/error.h"
#include "../core/timer.h"
#include "../core/fs.h"
#include "indexed_dataset.h"
#include "indexed_dataset_writer.h"
#include "json_text.h"

#define BYTE_EOD_TOKEN 10

static const char *const build_usage_text =
    "usage: megatrain data build --input FILE --output PREFIX [--tokenizer byte] [--json-key text] [--overwrite]\n"
    "\n"
    "Tokenize FILE into the Megatron indexed dataset PREFIX.bin + PREFIX.idx.\n"
    "\n"
    "  --input FILE         plain text (each non-blank line is one document) or JSONL\n"
    "                       (FILE ends in .jsonl/.json or its first line starts with '{';\n"
    "                       one JSON object per line)\n"
    "  --output PREFIX      writes PREFIX.bin and PREFIX.idx (directories are created)\n"
    "  --tokenizer byte     byte-level tokens (vocab 256) with '\\n' (10) ending each document;\n"
    "                       the only tokenizer so far\n"
    "  --json-key KEY       the JSONL field holding the document (default: text)\n"
    "  --overwrite          replace an existing PREFIX.bin / PREFIX.idx (without it they are refused);\n"
    "                       the old dataset stays intact until the new one is complete\n";

typedef struct BuildOptions {
    const char *input, *output, *tokenizer, *json_key;
    bool overwrite;
} BuildOptions;

typedef enum { FORMAT_UNKNOWN, FORMAT_TEXT, FORMAT_JSONL } InputFormat;

/* Returns 0 to go on, 1 after --help, 2 on a usage error (reported). */
static int parse_options(int argc, char **argv, BuildOptions *opt) {
    opt->input = opt->output = NULL;
    opt->tokenizer = "byte";
    opt->json_key = "text";
    opt->overwrite = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(build_usage_text, stdout);
            return 1;
        }
        if (strcmp(a, "--overwrite") == 0) {
            opt->overwrite = true;
            continue;
        }
        static const char *const names[] = {"--input", "--output", "--tokenizer", "--json-key"};
        const char **slots[] = {&opt->input, &opt->output, &opt->tokenizer, &opt->json_key};
        int matched = 0;
        for (int k = 0; k < 4 && !matched; k++) {
            size_t n = strlen(names[k]);
            if (strncmp(a, names[k], n) != 0 || (a[n] != '\0' && a[n] != '=')) continue;
            matched = 1;
            if (a[n] == '=') {
                *slots[k] = a + n + 1;
            } else if (i + 1 < argc) {
                *slots[k] = argv[++i];
            } else {
                mt_error("data build: %s needs a value\n%s", names[k], build_usage_text);
                return 2;
            }
        }
        if (!matched) {
            mt_error("data build: unexpected argument '%s'\n%s", a, build_usage_text);
            return 2;
        }
    }
    if (!opt->input || !opt->input[0] || !opt->output || !opt->output[0]) {
        mt_error("data build: %s is required\n%s", !opt->input || !opt->input[0] ? "--input FILE" : "--output PREFIX",
                     build_usage_text);
        return 2;
    }
    if (strcmp(opt->tokenizer, "byte") != 0) {
        mt_error("data build: --tokenizer %s: only 'byte' is supported so far (tokenizer.json support comes later)",
                     opt->tokenizer);
        return 2;
    }
    if (!opt->json_key[0]) {
        mt_error("data build: --json-key must not be empty");
        return 2;
    }
    return 0;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n' && s[i] != '\f' && s[i] != '\v') return 0;
    return 1;
}

typedef struct BuildState {
    const BuildOptions *opt;
    IndexedDatasetWriter *writer;
    InputFormat format;
    int32_t *tokens;
    size_t token_capacity;
    JsonBuffer json_text;
    long long line_number, blank_lines, empty_texts;
} BuildState;

/* One input line -> at most one document. Returns 0, or -1 after reporting. */
static int build_line(BuildState *st, const char *line, size_t len) {
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
    if (is_blank(line, len)) {
        st->blank_lines++;
        return 0;
    }
    if (st->format == FORMAT_UNKNOWN) {
        size_t i = 0;
        while (i < len && is_blank(line + i, 1)) i++;
        st->format = line[i] == '{' ? FORMAT_JSONL : FORMAT_TEXT;
    }
    const char *text = line;
    size_t text_len = len;
    if (st->format == FORMAT_JSONL) {
        char why[256];
        int status = json_object_string_field(line, len, st->opt->json_key, &st->json_text, why, sizeof(why));
        if (status == JSON_SYNTAX_ERROR) {
            mt_error("%s:%lld: bad JSON: %s", st->opt->input, st->line_number, why);
            return -1;
        }
        if (status == JSON_FIELD_MISSING) {
            mt_error("%s:%lld: the JSON object has no \"%s\" field (--json-key picks the field)", st->opt->input,
                         st->line_number, st->opt->json_key);
            return -1;
        }
        if (status == JSON_FIELD_NOT_STRING) {
            mt_error("%s:%lld: field \"%s\" is not a string", st->opt->input, st->line_number, st->opt->json_key);
            return -1;
        }
        text = st->json_text.data;
        text_len = st->json_text.len;
        if (text_len == 0) {
            st->empty_texts++;
            return 0;
        }
    }
    if (text_len + 1 > st->token_capacity) {
        st->token_capacity = 2 * (text_len + 1);
        st->tokens = mt_realloc(st->tokens, st->token_capacity * sizeof(*st->tokens));
    }
    for (size_t i = 0; i < text_len; i++) st->tokens[i] = (unsigned char)text[i];
    st->tokens[text_len] = BYTE_EOD_TOKEN;
    if (indexed_dataset_writer_add_document(st->writer, st->tokens, (int64_t)text_len + 1) != 0) {
        mt_error("%s", indexed_dataset_writer_error(st->writer));
        return -1;
    }
    return 0;
}

/* Without --overwrite, an existing PREFIX.bin or PREFIX.idx is refused
 * (naming them). Returns 0, or -1 after reporting. */
static int refuse_existing(const BuildOptions *opt) {
    char bin[1100], idx[1100];
    snprintf(bin, sizeof(bin), "%s.bin", opt->output);
    snprintf(idx, sizeof(idx), "%s.idx", opt->output);
    struct stat sb;
    bool has_bin = lstat(bin, &sb) == 0, has_idx = lstat(idx, &sb) == 0;
    if (opt->overwrite || (!has_bin && !has_idx)) return 0;
    mt_error("data build: --output %s: %s%s%s already exist%s; pass --overwrite to replace %s (or choose another "
             "prefix)", opt->output, has_bin ? bin : "", has_bin && has_idx ? " and " : "", has_idx ? idx : "",
             has_bin && has_idx ? "" : "s", has_bin && has_idx ? "them" : "it");
    return -1;
}

/* SIGINT, SIGTERM, SIGHUP: recorded, and (without SA_RESTART) they end a
 * read that waits, so the build stops and removes its temporary files. */
static volatile sig_atomic_t stop_signal;

static void record_stop(int sig) {
    if (!stop_signal) stop_signal = sig;
}

static void catch_stop_signals(void) {
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = record_stop;
    sigemptyset(&sa.sa_mask);
    stop_signal = 0;
    for (int i = 0; i < 3; i++) sigaction(sigs[i], &sa, NULL);
}

static long long file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? (long long)sb.st_size : -1;
}

static void print_summary(const BuildState *st, long long documents, long long tokens, double seconds) {
    const BuildOptions *opt = st->opt;
    char bin[1100], idx[1100];
    snprintf(bin, sizeof(bin), "%s.bin", opt->output);
    snprintf(idx, sizeof(idx), "%s.idx", opt->output);
    printf("data build: %s (%s) -> %s.{bin,idx}\n", opt->input, st->format == FORMAT_JSONL ? "jsonl" : "text",
           opt->output);
    printf("  documents: %lld", documents);
    if (st->blank_lines || st->empty_texts)
        printf(" (skipped %lld blank lines, %lld empty texts)", st->blank_lines, st->empty_texts);
    printf("\n  tokens:    %lld (uint16; byte tokenizer, vocab 256, end of document = 10)\n", tokens);
    printf("  wrote:     %s (%lld bytes), %s (%lld bytes) in %.2f s\n", bin, file_size(bin), idx, file_size(idx),
           seconds);
}

int data_build_main(int argc, char **argv) {
    BuildOptions opt;
    int rc = parse_options(argc, argv, &opt);
    if (rc == 1) return MT_EXIT_OK;
    if (rc != 0) return MT_EXIT_USAGE;
    struct stat sb;
    if (stat(opt.input, &sb) != 0) {
        mt_error("data build: --input %s: %s", opt.input, strerror(errno));
        return MT_EXIT_USAGE;
    }
    if (S_ISDIR(sb.st_mode)) {
        mt_error("data build: --input %s: is a directory (expected a text or JSONL file)", opt.input);
        return MT_EXIT_USAGE;
    }
    if (refuse_existing(&opt) != 0) return MT_EXIT_USAGE;
    catch_stop_signals();
    FILE *in = fopen(opt.input, "rb");
    if (!in) {
        mt_error("data build: --input %s: cannot read: %s", opt.input, strerror(errno));
        return MT_EXIT_FAILURE;
    }
    char err[2400];
    IndexedDatasetWriter *writer = NULL;
    if (mt_make_parent_dirs(opt.output, err, sizeof(err)) != 0 ||
        !(writer = indexed_dataset_writer_open(opt.output, IDX_DTYPE_UINT16, err, sizeof(err)))) {
        mt_error("data build: %s", err);
        fclose(in);
        return MT_EXIT_FAILURE;
    }
    indexed_dataset_writer_set_overwrite(writer, opt.overwrite);
    BuildState st = {.opt = &opt, .writer = writer};
    st.format = (ends_with(opt.input, ".jsonl") || ends_with(opt.input, ".json")) ? FORMAT_JSONL : FORMAT_UNKNOWN;
    int progress = isatty(STDOUT_FILENO);
    double start = mt_now(), last_report = start;
    char *line = NULL;
    size_t line_capacity = 0;
    ssize_t got;
    rc = MT_EXIT_OK;
    while (!stop_signal && (got = getline(&line, &line_capacity, in)) >= 0) {
        st.line_number++;
        if (build_line(&st, line, (size_t)got) != 0) {
            rc = MT_EXIT_FAILURE;
            break;
        }
        if (progress && (st.line_number & 1023) == 0 && mt_now() - last_report >= 1.0) {
            last_report = mt_now();
            printf("\r  %lld documents, %lld tokens ...", (long long)indexed_dataset_writer_documents(writer),
                   (long long)indexed_dataset_writer_tokens(writer));
            fflush(stdout);
        }
    }
    if (progress && last_report > start) printf("\n");
    const int stopped_by = stop_signal; /* one arriving later lets the build finish */
    if (stopped_by) {
        mt_error("data build: stopped by %s at line %lld of %s; nothing written under %s",
                 stopped_by == SIGINT ? "SIGINT" : stopped_by == SIGTERM ? "SIGTERM" : "SIGHUP", st.line_number,
                 opt.input, opt.output);
        rc = MT_EXIT_FAILURE;
    } else if (rc == MT_EXIT_OK && ferror(in)) {
        mt_error("%s: read failed: %s", opt.input, strerror(errno));
        rc = MT_EXIT_FAILURE;
    }
    long long documents = indexed_dataset_writer_documents(writer);
    long long tokens = indexed_dataset_writer_tokens(writer);
    if (rc == MT_EXIT_OK && documents == 0) {
        mt_error("%s: no documents (%lld lines, all blank or with empty text)", opt.input, st.line_number);
        rc = MT_EXIT_FAILURE;
    }
    if (rc != MT_EXIT_OK) {
        indexed_dataset_writer_abort(writer);
    } else if (indexed_dataset_writer_finish(writer, err, sizeof(err)) != 0) {
        mt_error("data build: %s", err);
        rc = MT_EXIT_FAILURE;
    } else {
        print_summary(&st, documents, tokens, mt_now() - start);
    }
    free(line);
    free(st.tokens);
    json_buffer_free(&st.json_text);
    fclose(in);
    if (stopped_by) { /* cleaned up: end as the signal would have */
        signal(stopped_by, SIG_DFL);
        raise(stopped_by);
    }
    return rc;
}
