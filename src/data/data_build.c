/* data_build.c: `megatrain data build`: plain text or JSONL -> a Megatron
 * indexed dataset (PREFIX.bin + PREFIX.idx), tokenized by a Hugging Face
 * tokenizer.json (src/tokenize) or the byte-level tokenizer.
 *
 * Plain text: every non-blank line is one document. JSONL (name ending in
 * .jsonl or .json, or a first non-blank line starting with '{'): one JSON
 * object per line whose --json-key field (default "text") is the document.
 * --tokenizer byte: token = byte value (vocab 256); each document ends with
 * '\n' (10). --tokenizer PATH (tokenizer.json or a directory holding it): the
 * ids `tokenizers` gives with add_special_tokens=False, then the tokenizer's
 * end-of-document token (tokenizer_eod: --eod-token, else tokenizer_config's
 * eos_token, else the post-processor's, else a known special token), like
 * Megatron's --append-eod. Token dtype as Megatron picks it: uint16 for a
 * vocabulary under 65500 ids, int32 otherwise.
 *
 * The input streams through in batches of whole lines, tokenized on
 * --workers threads and written in input order (build_pipeline.c): memory
 * stays bounded for an input of any size, and the output is the same bytes
 * for any number of workers. A line longer than --max-line-mib is an error
 * naming the file and the line. Progress goes to stderr (build_progress.c),
 * the summary to stdout.
 *
 * --format sft (supervised fine-tuning): each JSONL line is a
 * {"prompt", "completion"} or {"messages": [...]} record, rendered with
 * --chat-template llama3|llama3.1|chatml|qwen3 (sft_render.c) and tokenized segment by
 * segment; beside PREFIX.{bin,idx} a second indexed dataset
 * PREFIX_mask.{bin,idx} (uint8, the same documents and lengths) holds each
 * token's loss mask: 1 for assistant / completion tokens and their end of
 * turn, 0 for system, user, prompt and template tokens.
 *
 * An existing PREFIX.bin, PREFIX.idx or PREFIX_mask.{bin,idx} is refused
 * unless --overwrite. The files are written under temporary names, sealed
 * (fsynced, the indexes written) and only then renamed into place, the
 * tokens' .idx last (place_outputs; indexed_dataset_writer.c): a failed or
 * interrupted (SIGINT, SIGTERM, SIGHUP) build removes its temporary files
 * and leaves the old dataset as it was, and one killed outright leaves at
 * most a PREFIX.bin.tmp.HOST.PID, never a PREFIX.idx (the next build into
 * PREFIX on that host removes it), and never new tokens or a new mask beside
 * the old dataset's.
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

#include "../core/cli.h"
#include "../core/error.h"
#include "../core/timer.h"
#include "../core/fs.h"
#include "../tokenize/tokenizer.h"
#include "build_internal.h"
#include "dataset_tokenizer.h"
#include "indexed_dataset.h"
#include "indexed_dataset_format.h"
#include "indexed_dataset_writer.h"
#include "loss_mask.h"
#include "sft_template_text.h"

#define MAX_WORKERS 256
#define MAX_LINE_MIB 1024        /* so that a document's token count fits int32 */

static const char *const build_usage_text =
    "usage: megatrain data build --input FILE --output PREFIX [--tokenizer PATH|byte] [--eod-token TEXT]\n"
    "                             [--json-key KEY] [--add-bos] [--workers N] [--max-line-mib N] [--overwrite]\n"
    "                             [--format text|jsonl|sft [--chat-template auto|llama3|llama3.1|chatml|qwen3]]\n"
    "\n"
    "Tokenize FILE into the Megatron indexed dataset PREFIX.bin + PREFIX.idx.\n"
    "\n"
    "  --input FILE         plain text (each non-blank line is one document) or JSONL\n"
    "                       (FILE ends in .jsonl/.json or its first line starts with '{';\n"
    "                       one JSON object per line), unless --format says which\n"
    "  --output PREFIX      writes PREFIX.bin and PREFIX.idx (directories are created)\n"
    "  --tokenizer PATH     a Hugging Face tokenizer.json, or a model directory holding one: the BPE of\n"
    "                       Llama 3 / 3.1 / 3.2, Qwen2 / 2.5 / 3 (byte-level) and Llama 2 / Mistral\n"
    "                       (SentencePiece-style); ids as `tokenizers` gives them without special\n"
    "                       tokens (no bos), then the end-of-document token (below); what a file asks\n"
    "                       for that megatrain does not implement is refused (docs/data.md)\n"
    "  --tokenizer byte     byte-level tokens (vocab 256) with '\\n' (10) ending each document (default)\n"
    "  --eod-token TEXT     the token appended to every document (an added token's content or a\n"
    "                       vocabulary entry); default: eos_token of tokenizer_config.json beside the\n"
    "                       file, else the special token after $A in the post-processor's template,\n"
    "                       else the first of <|end_of_text|>, <|endoftext|>, </s>, <eos> among the\n"
    "                       special added tokens; when none applies the build stops and asks for it\n"
    "  --add-bos            put the beginning-of-sequence token of --tokenizer's post-processor before\n"
    "                       each document (Llama 3's <|begin_of_text|>; Qwen's adds none): the ids of\n"
    "                       transformers' tokenizer(text) with its special tokens, as Megatron's\n"
    "                       preprocess_data.py writes them with a Hugging Face tokenizer; with\n"
    "                       --format sft and no --chat-template, before each prompt (masked)\n"
    "  --json-key KEY       the JSONL field holding the document (default: text)\n"
    "  --format text|jsonl  FILE's format, whatever its name and first line say\n"
    "  --format sft         supervised fine-tuning records, one JSON object per line:\n"
    "                       {\"prompt\": ..., \"completion\": ...} (and an optional \"system\"),\n"
    "                       {\"messages\": [{\"role\": system|user|assistant, \"content\": ...}...]}, or\n"
    "                       {\"prompt\": [messages], \"completion\": [messages]} (TRL's conversational\n"
    "                       form: the completion's assistant messages trained);\n"
    "                       writes PREFIX_mask.{bin,idx} too: a uint8\n"
    "                       dataset with the same documents, 1 where a token counts in the loss\n"
    "                       (assistant / completion tokens and their end of turn), 0 elsewhere\n"
    "  --chat-template NAME llama3 (Llama 3 Instruct), llama3.1 (Llama 3.1 / 3.2 / 3.3 Instruct: the\n"
    "                       dated system header), chatml (Qwen2.5 Instruct) or qwen3 (Qwen3: its think\n"
    "                       blocks), written in C after the published templates for plain text\n"
    "                       messages (Jinja is not evaluated); auto: the model's own (chat_template.jinja\n"
    "                       or tokenizer_config.json beside --tokenizer) when it is one of these, and a\n"
    "                       named template that is not the model's own (or beside an own one that\n"
    "                       is none of these) is warned of;\n"
    "                       without it a prompt/completion record is prompt + completion + the\n"
    "                       end-of-document token, and messages records are refused; with it no\n"
    "                       end of document is appended, and each of the template's special tokens\n"
    "                       must be one token of --tokenizer\n"
    "  --workers N          threads that tokenize (default: the CPUs this process may use); the output\n"
    "                       is the same bytes for any N\n"
    "  --max-line-mib N     the longest line (one document) read, in MiB (default 64, at most 1024); a\n"
    "                       longer line is an error naming the file and line, so that memory stays\n"
    "                       bounded (about (2N + 2) x (1 MiB + the longest line))\n"
    "  --overwrite          replace an existing PREFIX.bin / PREFIX.idx and PREFIX_mask.{bin,idx} (without\n"
    "                       it they are refused; a build without a mask removes the old one); the old\n"
    "                       dataset stays intact until the new one is complete\n"
    "\n"
    "The input streams through in bounded memory whatever its size. Progress (documents, MB/s,\n"
    "tokens/s) goes to stderr: redrawn on a terminal, a line a minute otherwise. Tokens are written as\n"
    "uint16 when the vocabulary has under 65500 ids, int32 otherwise (as Megatron does): 65500 ids and\n"
    "more (Llama 3, Qwen) need 4 bytes a token.\n";

typedef struct BuildOptions {
    const char *input, *output, *tokenizer, *json_key, *eod_token, *workers_text, *max_line_text;
    const char *format, *chat_template_name;
    int workers, max_line_mib;
    bool sft;
    InputFormat input_format; /* --format text or jsonl; FORMAT_UNKNOWN: detected (sft: JSONL) */
    SftTemplate chat_template;
    bool chat_template_auto; /* --chat-template auto: the tokenizer's own, recognized (sft_template_recognize) */
    bool overwrite;
    bool add_bos;            /* --add-bos: the post-processor's beginning-of-sequence token before each document */
} BuildOptions;

/* A whole number in [lo, hi] from text; 0, or -1 after reporting. */
static int parse_count(const char *name, const char *text, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < lo || v > hi) {
        mt_error("data build: %s %s: expected a whole number from %d to %d", name, text, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* Whether `a` is one of the `count` options with a value (as --name or --name=...), --overwrite or --help: what
 * follows an option missing its value. */
static bool is_option(const char *a, const char *const *names, int count) {
    if (strcmp(a, "--overwrite") == 0 || strcmp(a, "--add-bos") == 0 || strcmp(a, "--help") == 0 ||
        strcmp(a, "-h") == 0)
        return true;
    for (int k = 0; k < count; k++) {
        const size_t n = strlen(names[k]);
        if (strncmp(a, names[k], n) == 0 && (a[n] == '\0' || a[n] == '=')) return true;
    }
    return false;
}

/* Returns 0 to go on, 1 after --help, 2 on a usage error (reported). */
static int parse_options(int argc, char **argv, BuildOptions *opt) {
    opt->input = opt->output = opt->eod_token = opt->workers_text = opt->max_line_text = NULL;
    opt->format = opt->chat_template_name = NULL;
    opt->tokenizer = "byte";
    opt->json_key = NULL; /* "text" unless given (below) */
    opt->overwrite = false;
    opt->add_bos = false;
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
        if (strcmp(a, "--add-bos") == 0) {
            opt->add_bos = true;
            continue;
        }
        static const char *const names[] = {"--input",     "--output",  "--tokenizer",    "--json-key", "--eod-token",
                                            "--workers",   "--max-line-mib", "--format", "--chat-template"};
        const char **slots[] = {&opt->input,        &opt->output,        &opt->tokenizer, &opt->json_key,
                                &opt->eod_token,    &opt->workers_text,  &opt->max_line_text, &opt->format,
                                &opt->chat_template_name};
        int matched = 0;
        for (int k = 0; k < 9 && !matched; k++) {
            size_t n = strlen(names[k]);
            if (strncmp(a, names[k], n) != 0 || (a[n] != '\0' && a[n] != '=')) continue;
            matched = 1;
            if (a[n] == '=') {
                *slots[k] = a + n + 1;
            } else if (i + 1 < argc && !is_option(argv[i + 1], names, 9)) {
                *slots[k] = argv[++i];
            } else {
                mt_error("data build: %s needs a value%s%s%s\n%s", names[k], i + 1 < argc ? " (found the option " : "",
                         i + 1 < argc ? argv[i + 1] : "", i + 1 < argc ? " after it)" : "", build_usage_text);
                return 2;
            }
        }
        if (!matched) {
            /* Megatron's tools/preprocess_data.py spells some of these otherwise */
            static const char *const megatron[][2] = {
                {"--output-prefix", "--output PREFIX"},
                {"--json-keys", "--json-key KEY (one key)"},
                {"--tokenizer-model", "--tokenizer PATH (a tokenizer.json or its directory)"},
                {"--tokenizer-type", "--tokenizer PATH (a tokenizer.json or its directory)"},
                {"--append-eod", "nothing: an end-of-document token ends every document unless a chat template "
                                 "ends it (--eod-token names another)"},
            };
            const char *hint = NULL;
            for (size_t k = 0; k < sizeof megatron / sizeof megatron[0] && !hint; k++) {
                const size_t n = strlen(megatron[k][0]);
                if (strncmp(a, megatron[k][0], n) == 0 && (a[n] == '\0' || a[n] == '=')) hint = megatron[k][1];
            }
            if (hint)
                mt_error("data build: unknown option '%s' (Megatron's preprocess_data.py's; here: %s)\n%s", a, hint,
                         build_usage_text);
            else if (a[0] != '-' && opt->input && i > 0 && strcmp(argv[i - 1], opt->input) == 0)
                mt_error("data build: unexpected argument '%s': --input takes one file (several: concatenate them, "
                         "or build each and blend the datasets in data.train)\n%s", a, build_usage_text);
            else if (a[0] == '-' && a[1])
                cli_unknown_option("data build", a, build_usage_text);
            else
                mt_error("data build: unexpected argument '%s'\n%s", a, build_usage_text);
            return 2;
        }
    }
    if (!opt->input || !opt->input[0] || !opt->output || !opt->output[0]) {
        mt_error("data build: %s is required\n%s", !opt->input || !opt->input[0] ? "--input FILE" : "--output PREFIX",
                     build_usage_text);
        return 2;
    }
    const size_t out_len = strlen(opt->output);
    if (opt->output[out_len - 1] == '/' || (out_len >= 2 && !strcmp(opt->output + out_len - 2, "/.")) ||
        !strcmp(opt->output, ".") || !strcmp(opt->output, "..") ||
        (out_len >= 3 && !strcmp(opt->output + out_len - 3, "/.."))) {
        mt_error("data build: --output %s: expected a file prefix such as data/corpus (PREFIX.bin and PREFIX.idx are "
                 "written), found a directory", opt->output);
        return 2;
    }
    if (!opt->tokenizer[0]) {
        mt_error("data build: --tokenizer needs a path to tokenizer.json (or a model directory) or 'byte'");
        return 2;
    }
    if (opt->eod_token && (!opt->eod_token[0] || strcmp(opt->tokenizer, "byte") == 0)) {
        mt_error("data build: --eod-token %s", opt->eod_token[0] ? "needs --tokenizer PATH (the byte tokenizer's end "
                 "of document is always '\\n')" : "must not be empty");
        return 2;
    }
    if (opt->json_key && !opt->json_key[0]) {
        mt_error("data build: --json-key must not be empty");
        return 2;
    }
    opt->sft = false;
    opt->chat_template = SFT_TEMPLATE_NONE;
    opt->input_format = FORMAT_UNKNOWN;
    if (opt->format && strcmp(opt->format, "text") == 0) {
        opt->input_format = FORMAT_TEXT;
    } else if (opt->format && strcmp(opt->format, "jsonl") == 0) {
        opt->input_format = FORMAT_JSONL;
    } else if (opt->format && strcmp(opt->format, "sft") != 0) {
        mt_error("data build: --format %s: unknown format (expected text, jsonl or sft; without it text and JSONL "
                 "are told apart by the file's name and first line)", opt->format);
        return 2;
    }
    opt->sft = opt->format != NULL && strcmp(opt->format, "sft") == 0;
    if (opt->json_key && (opt->sft || opt->input_format == FORMAT_TEXT)) {
        mt_error("data build: --json-key has no use with --format %s (%s)", opt->format,
                 opt->sft ? "its records are {\"prompt\", \"completion\"} or {\"messages\": [...]}"
                          : "a line of text is a document");
        return 2;
    }
    if (!opt->json_key) opt->json_key = "text";
    if (opt->chat_template_name) {
        opt->chat_template_auto = strcmp(opt->chat_template_name, "auto") == 0;
        int t = opt->chat_template_auto ? SFT_TEMPLATE_NONE : sft_template_from_name(opt->chat_template_name);
        if (!opt->sft || t < 0) {
            if (t < 0) mt_error("data build: --chat-template %s: no such template (expected auto or one of: %s)",
                                opt->chat_template_name, sft_template_names());
            else mt_error("data build: --chat-template needs --format sft");
            return 2;
        }
        opt->chat_template = (SftTemplate)t;
        if (opt->eod_token) {
            mt_error("data build: --eod-token has no use with --chat-template: no end-of-document token is appended, "
                     "the template ends each turn with its own token");
            return 2;
        }
    }
    opt->workers = build_default_workers();
    opt->max_line_mib = BUILD_DEFAULT_MAX_LINE_MIB;
    if ((opt->workers_text && parse_count("--workers", opt->workers_text, 1, MAX_WORKERS, &opt->workers) != 0) ||
        (opt->max_line_text &&
         parse_count("--max-line-mib", opt->max_line_text, 1, MAX_LINE_MIB, &opt->max_line_mib) != 0))
        return 2;
    if (opt->workers > MAX_WORKERS) opt->workers = MAX_WORKERS;
    return 0;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* The command's state, seen by the sink that writes each batch. */
typedef struct BuildState {
    const BuildOptions *opt;
    IndexedDatasetWriter *writer;
    IndexedDatasetWriter *mask_writer; /* --format sft: PREFIX_mask */
    int64_t counted_tokens;
    int32_t *mask_row;   /* one document's mask as the writer takes it */
    size_t mask_row_cap;
    BuildReader reader;
    BuildProgress progress;
    Tokenizer *tok;      /* NULL: the byte tokenizer */
    int32_t eod_id;
    const char *eod_name;
    int32_t bos_id;      /* --add-bos: the token before each document; -1: none */
    const char *bos_name;
    int dtype;
    int64_t blank_lines, empty_texts;
    int64_t empty_reply_records, first_empty_reply; /* SFT: records with an empty reply, the first one's line */
    InputFormat format;
} BuildState;

/* The pipeline's sink: one tokenized batch, in input order, into the dataset. */
static int write_batch(void *ctx, BuildBatch *b) {
    BuildState *st = ctx;
    const int32_t *tokens = b->tokens;
    for (size_t d = 0; d < b->ndocs; d++) {
        if (indexed_dataset_writer_add_document(st->writer, tokens, b->doc_tokens[d]) != 0) {
            mt_error("%s", indexed_dataset_writer_error(st->writer));
            return -1;
        }
        if (st->mask_writer) {
            const uint8_t *mask = b->mask + (tokens - b->tokens);
            st->mask_row = mt_grow(st->mask_row, &st->mask_row_cap, (size_t)b->doc_tokens[d], sizeof *st->mask_row);
            for (int32_t i = 0; i < b->doc_tokens[d]; i++) st->mask_row[i] = mask[i];
            if (indexed_dataset_writer_add_document(st->mask_writer, st->mask_row, b->doc_tokens[d]) != 0) {
                mt_error("%s", indexed_dataset_writer_error(st->mask_writer));
                return -1;
            }
        }
        tokens += b->doc_tokens[d];
    }
    st->counted_tokens += b->counted_tokens;
    st->blank_lines += b->blank_lines;
    st->empty_texts += b->empty_texts;
    if (b->empty_reply_records && !st->empty_reply_records) st->first_empty_reply = b->first_empty_reply;
    st->empty_reply_records += b->empty_reply_records;
    if (b->format != FORMAT_UNKNOWN) st->format = b->format;
    if (b->error_line) {
        mt_error("%s", b->error);
        return -1;
    }
    return 0;
}

static void show_progress(void *ctx) {
    BuildState *st = ctx;
    build_progress_update(&st->progress, indexed_dataset_writer_documents(st->writer), st->reader.bytes,
                          indexed_dataset_writer_tokens(st->writer));
}

/* Without --overwrite, an existing PREFIX.bin or PREFIX.idx is refused
 * (naming them). Returns 0, or -1 after reporting. */
static int refuse_existing(const BuildOptions *opt, const char *prefix) {
    char bin[1100], idx[1100];
    snprintf(bin, sizeof(bin), "%s.bin", prefix);
    snprintf(idx, sizeof(idx), "%s.idx", prefix);
    struct stat sb;
    bool has_bin = lstat(bin, &sb) == 0, has_idx = lstat(idx, &sb) == 0;
    if (opt->overwrite || (!has_bin && !has_idx)) return 0;
    char tokens[1100];
    snprintf(tokens, sizeof tokens, "%s.idx", opt->output);
    const bool lone_mask = strcmp(prefix, opt->output) != 0 && lstat(tokens, &sb) != 0;
    mt_error("data build: --output %s: %s%s%s already exist%s%s; pass --overwrite to replace %s (or choose another "
             "prefix)", prefix, has_bin ? bin : "", has_bin && has_idx ? " and " : "", has_idx ? idx : "",
             has_bin && has_idx ? "" : "s",
             lone_mask ? ", a loss mask without its dataset (left by a build killed as it finished?)" : "",
             has_bin && has_idx ? "them" : "it");
    return -1;
}

/* --input one of the files the build writes (PREFIX.bin given as the input of PREFIX, with --overwrite) would
 * be replaced by its own tokens: refused, naming it. */
static bool input_is_an_output(const BuildOptions *opt, const char *mask_prefix) {
    static const char *const suffixes[] = {".bin", ".idx", ".build.json"};
    for (int m = 0; m < 2; m++)
        for (int i = 0; i < 3; i++) {
            if (m == 1 && i == 2) break; /* the mask has no build record */
            char path[1200];
            snprintf(path, sizeof path, "%s%s", m ? mask_prefix : opt->output, suffixes[i]);
            if (mt_same_file(opt->input, path)) {
                mt_error("data build: --input %s is %s, one of the files this build writes: choose another "
                         "--output", opt->input, path);
                return true;
            }
        }
    return false;
}

/* Remove PREFIX.idx, then PREFIX.bin (a prefix without its .idx is an incomplete dataset). 0, or -1 with err. */
static int remove_dataset(const char *prefix, char *err, size_t errlen) {
    char path[1200];
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s%s", prefix, i == 0 ? ".idx" : ".bin");
        if (unlink(path) != 0 && errno != ENOENT) {
            mt_set_error(err, errlen, "%s: cannot remove: %s", path, strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* Put the sealed dataset, and its loss mask, in place as one unit: everything that can fail slowly (writing,
 * fsync, the indexes, a full disk) is done (sealed) before this, so the old dataset is untouched by a build that
 * fails or is killed before it. Here, with --overwrite, the old tokens' .idx goes first (from then on PREFIX is an
 * incomplete dataset that every reader refuses, never old tokens beside a new mask), with the old build record;
 * then the mask (a build without one removes the old dataset's: it would mask these tokens), the tokens' .bin and
 * their .idx last. Frees both writers; 0, or -1 with err (nothing of the new dataset left under PREFIX). */
static int place_outputs(const BuildOptions *opt, const char *mask_prefix, IndexedDatasetWriter *writer,
                         IndexedDatasetWriter *mask_writer, char *err, size_t errlen) {
    char idx[1200], dir[1200], mask_idx[1200];
    snprintf(idx, sizeof idx, "%s.idx", opt->output);
    snprintf(mask_idx, sizeof mask_idx, "%s.idx", mask_prefix);
    mt_parent_dir(idx, dir, sizeof dir);
    struct stat sb;
    const bool old_mask = lstat(mask_idx, &sb) == 0;
    int failed = 0;
    if (opt->overwrite) {
        if (unlink(idx) != 0 && errno != ENOENT) {
            mt_set_error(err, errlen, "%s: cannot remove the old index: %s", idx, strerror(errno));
            failed = 1;
        } else {
            failed = mt_sync_dir(dir, err, errlen) != 0;
        }
    }
    if (!failed) dataset_tokenizer_remove(opt->output); /* the old dataset's, if any: it goes with the old index */
    if (!failed && mask_writer) {
        failed = indexed_dataset_writer_place(mask_writer, err, errlen) != 0; /* aborted it when it failed */
        mask_writer = NULL;
    } else if (!failed && old_mask) { /* --overwrite: refused before without it */
        failed = remove_dataset(mask_prefix, err, errlen) != 0;
        if (!failed)
            mt_log("data build: removed %s.{bin,idx}, the loss mask of the dataset replaced (this build has none)",
                   mask_prefix);
    }
    if (failed) {
        indexed_dataset_writer_abort(writer);
        if (mask_writer) indexed_dataset_writer_abort(mask_writer);
        return -1;
    }
    if (indexed_dataset_writer_place(writer, err, errlen) != 0) {
        char ignored[1300];
        if (opt->sft) remove_dataset(mask_prefix, ignored, sizeof ignored); /* ours, without its tokens */
        return -1;
    }
    return 0;
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
    printf("data build: %s (%s%s) -> %s.{bin,idx}\n", opt->input,
           opt->sft ? "sft" : st->format == FORMAT_JSONL ? "jsonl" : "text",
           st->reader.bom_skipped ? "; its UTF-8 byte-order mark skipped" : "", opt->output);
    printf("  documents: %lld", documents);
    if (st->blank_lines || st->empty_texts)
        printf(" (skipped %lld blank lines, %lld empty texts)", (long long)st->blank_lines,
               (long long)st->empty_texts);
    char eod[320]; /* a chat template appends none: its turns end with its own token */
    if (opt->chat_template != SFT_TEMPLATE_NONE) snprintf(eod, sizeof eod, "no end of document: the template ends turns");
    else if (st->tok && st->bos_id >= 0)
        snprintf(eod, sizeof eod, "begin of document = %s = %d, end of document = %s = %d", st->bos_name, st->bos_id,
                 st->eod_name, st->eod_id);
    else if (st->tok) snprintf(eod, sizeof eod, "end of document = %s = %d", st->eod_name, st->eod_id);
    else snprintf(eod, sizeof eod, "end of document = 10");
    if (st->tok)
        printf("\n  tokens:    %lld (%s; %s, vocab %lld, %s)\n", tokens, indexed_dtype_name(st->dtype),
               tokenizer_path(st->tok), (long long)tokenizer_vocab_size(st->tok), eod);
    else
        printf("\n  tokens:    %lld (uint16; byte tokenizer, vocab 256, %s)\n", tokens, eod);
    if (opt->sft)
        printf("  sft:       chat template %s; %lld of %lld tokens counted in the loss (%.1f%% masked), mask in "
               "%s_mask.{bin,idx}\n", sft_template_name(opt->chat_template), (long long)st->counted_tokens, tokens,
               tokens ? 100.0 * (double)(tokens - st->counted_tokens) / (double)tokens : 0.0, opt->output);
    printf("  wrote:     %s (%lld bytes), %s (%lld bytes) in %.2f s; %s.build.json records the tokenizer\n", bin,
           file_size(bin), idx, file_size(idx), seconds, opt->output);
    double s = seconds > 1e-9 ? seconds : 1e-9;
    printf("  speed:     %.1f MB/s read, %.2f M tokens/s, %d worker%s\n", (double)st->reader.bytes / 1e6 / s,
           (double)tokens / 1e6 / s, opt->workers, opt->workers == 1 ? "" : "s");
}

static const char *signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP"; }

/* Each special token of the chat template is one token of the tokenizer (else the template would be stored as
 * ordinary text pieces: a Llama 3 template on a Qwen tokenizer). 0, or -1 (reported). */
static int check_template_tokens(Tokenizer *tok, SftTemplate t) {
    int count = 0;
    const char *const *specials = sft_template_special_tokens(t, &count);
    TokenIds ids = {0};
    for (int i = 0; i < count; i++) {
        ids.count = 0;
        tokenizer_encode(tok, specials[i], strlen(specials[i]), &ids);
        if (ids.count != 1) {
            mt_error("data build: --chat-template %s: %s has no token %s (it would become %zu ordinary tokens): the "
                     "template is another tokenizer's (llama3 is Llama 3's, chatml Qwen2.5's, qwen3 Qwen3's)", sft_template_name(t),
                     tokenizer_path(tok), specials[i], ids.count);
            token_ids_free(&ids);
            return -1;
        }
    }
    token_ids_free(&ids);
    return 0;
}

/* The model's own chat template beside tokenizer.json: chat_template.jinja (transformers 4.47 and later), else
 * tokenizer_config.json's chat_template (a string, or a list of {name, template}: the "default" one). Malloc'd text,
 * with *from the file's name, or NULL when there is none (or it cannot be read); `names` gets the names of a list
 * without a "default" one ("" otherwise). */
static char *model_chat_template(const Tokenizer *tok, char *from, size_t fromlen, char *names, size_t nameslen) {
    char dir[4096], path[4200], err[512];
    mt_parent_dir(tokenizer_path(tok), dir, sizeof dir);
    size_t len = 0;
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    char *text = access(path, R_OK) == 0 ? mt_read_file(path, (size_t)1 << 22, &len, err, sizeof err) : NULL;
    if (text) {
        snprintf(from, fromlen, "%s", path);
        return text;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    JsonValue *root = access(path, R_OK) == 0 ? json_parse_file(path, (size_t)1 << 26, err, sizeof err) : NULL;
    const JsonValue *t = root ? json_get(root, "chat_template") : NULL;
    if (t && t->type == JSON_ARRAY) { /* named templates: the default one */
        const JsonValue *pick = NULL;
        size_t at = 0;
        for (size_t i = 0; i < t->count && !pick; i++) {
            const JsonValue *name = json_get(t->items[i], "name");
            if (name && name->type == JSON_STRING && strcmp(name->string, "default") == 0)
                pick = json_get(t->items[i], "template");
            else if (name && name->type == JSON_STRING && at < nameslen)
                at += (size_t)snprintf(names + at, nameslen - at, "%s%s", at ? ", " : "", name->string);
        }
        t = pick;
    }
    if (t && t->type == JSON_STRING) {
        text = mt_strdup(t->string);
        snprintf(from, fromlen, "%s (chat_template)", path);
    }
    json_free(root);
    return text;
}

/* How to train on a template megatrain does not render: records whose ids are the template's (the completion stops
 * before the end-of-turn token, which data build appends as the end-of-document token: written in the completion too
 * it would be trained twice). docs/data.md says the same. */
#define RENDER_IT_YOURSELF                                                                                             \
    "render each conversation with it yourself into a prompt/completion record: \"prompt\" is transformers' "        \
    "apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True), \"completion\" the rest of "     \
    "apply_chat_template(messages, tokenize=False) after it, cut before its last end-of-turn token (data build "      \
    "appends the end-of-document token: --eod-token END_OF_TURN unless the tokenizer's eos_token is it; no --add-bos)"

/* --chat-template auto: the model's own template, which must be one of ours; a template given by name that is not
 * the model's own (chatml for a Qwen3) is said, as the data would not be what the model sees at inference.
 * 0, or -1 (reported). */
static int resolve_template(BuildOptions *opt, const Tokenizer *tok) {
    char from[4300] = "", names[512] = "";
    char *jinja = model_chat_template(tok, from, sizeof from, names, sizeof names);
    const bool found = jinja != NULL;
    const int own = found ? sft_template_recognize(jinja) : -1;
    /* the model's own template, rendered as the published one: prose of its own would be left out */
    char extra[160];
    const bool own_rendered = own >= 0 && (opt->chat_template_auto || own == (int)opt->chat_template);
    const int foreign = own_rendered ? sft_template_foreign_text(jinja, extra, sizeof extra) : 0;
    free(jinja);
    if (foreign > 0)
        mt_warn("data build: the model's chat template (%s) is %s's by its marks, but writes text the published "
                "template does not (%d piece%s, the first: \"%s\"): megatrain renders the published %s template, "
                "without it, so if the model was tuned with that text the data will not look like what it sees at "
                "inference (to keep that text, " RENDER_IT_YOURSELF ")", from, sft_template_name((SftTemplate)own),
                foreign, foreign == 1 ? "" : "s", extra, sft_template_name((SftTemplate)own));
    if (opt->chat_template_auto) {
        if (own < 0) {
            if (found) /* another model's template: rendering it with one of ours would not be what it sees */
                mt_error("data build: --chat-template auto: the model's chat template (%s) is none of those megatrain "
                         "renders (%s), and arbitrary Jinja templates are not evaluated: " RENDER_IT_YOURSELF,
                         from, sft_template_names());
            else if (names[0])
                mt_error("data build: --chat-template auto: tokenizer_config.json beside the tokenizer has named chat "
                         "templates (%s) but none named \"default\": give --chat-template NAME (%s)", names,
                         sft_template_names());
            else {
                mt_parent_dir(tokenizer_path(tok), from, sizeof from); /* the directory searched */
                mt_error("data build: --chat-template auto: no chat template beside the tokenizer in %s "
                         "(chat_template.jinja, or chat_template in tokenizer_config.json): give --chat-template NAME "
                         "(%s)", from, sft_template_names());
            }
            return -1;
        }
        opt->chat_template = (SftTemplate)own;
        printf("data build: --chat-template auto: %s, from %s\n", sft_template_name(opt->chat_template), from);
        return 0;
    }
    if (own >= 0 && opt->chat_template != SFT_TEMPLATE_NONE && own != (int)opt->chat_template)
        mt_warn("data build: --chat-template %s, but the model's own template (%s) is %s's: the data will not look like "
                "what the model sees at inference (--chat-template %s, or auto)", sft_template_name(opt->chat_template),
                from, sft_template_name((SftTemplate)own), sft_template_name((SftTemplate)own));
    else if (found && own < 0 && opt->chat_template != SFT_TEMPLATE_NONE)
        mt_warn("data build: --chat-template %s, but the model's own template (%s) is none of those megatrain "
                "recognizes (%s): the data may not look like what the model sees at inference (a system prompt or "
                "markup of its own); `data inspect` shows what was built. To train on its rendering, "
                RENDER_IT_YOURSELF, sft_template_name(opt->chat_template), from, sft_template_names());
    return 0;
}

/* What PREFIX.build.json records of tokenizer `tok` (its tokenizer.json's bytes); -1 (reported) unreadable. */
static int tokenizer_identity(const Tokenizer *tok, int32_t eod, DatasetTokenizer *out) {
    char err[1200];
    size_t len = 0;
    char *json = mt_read_file(tokenizer_path(tok), (size_t)1 << 31, &len, err, sizeof err);
    if (!json) {
        mt_error("data build: --tokenizer: %s", err);
        return -1;
    }
    *out = dataset_tokenizer_of_json(json, len, tokenizer_vocab_size(tok), eod);
    free(json);
    return 0;
}

int data_build_token_dtype(int64_t num_ids) { return num_ids < 65500 ? IDX_DTYPE_UINT16 : IDX_DTYPE_INT32; }

int data_build_main(int argc, char **argv) {
    BuildOptions opt;
    int rc = parse_options(argc, argv, &opt);
    if (rc == 1) return MT_EXIT_OK;
    if (rc != 0) return MT_EXIT_USAGE;
    struct stat sb;
    if (stat(opt.input, &sb) != 0) { /* not there: usage; there but not to be read (no permission): a failure */
        const int e = errno;
        mt_error("data build: --input %s: %s", opt.input, strerror(e));
        return mt_path_stat_status(e);
    }
    if (S_ISDIR(sb.st_mode)) {
        mt_error("data build: --input %s: is a directory (expected a text or JSONL file)", opt.input);
        return MT_EXIT_USAGE;
    }
    char mask_prefix[1100];
    loss_mask_prefix(opt.output, mask_prefix, sizeof mask_prefix);
    if (input_is_an_output(&opt, mask_prefix)) return MT_EXIT_USAGE;
    /* a mask without --format sft is refused as well: it would be applied to the new tokens (--overwrite removes it) */
    if (refuse_existing(&opt, opt.output) != 0 || refuse_existing(&opt, mask_prefix) != 0)
        return MT_EXIT_USAGE;
    char err[2400];
    BuildState st = {.opt = &opt, .dtype = IDX_DTYPE_UINT16, .eod_id = BUILD_BYTE_EOD_TOKEN, .bos_id = -1};
    /* --format sft without --chat-template renders prompt + completion as they are: --add-bos puts the token before
     * (masked), as transformers' tokenizer(prompt) and TRL do for a base model */
    const bool templated = opt.chat_template != SFT_TEMPLATE_NONE || opt.chat_template_auto;
    if (opt.add_bos && ((opt.sft && templated) || strcmp(opt.tokenizer, "byte") == 0)) {
        mt_error("data build: --add-bos %s", opt.sft && templated ? "has no use with --chat-template: a chat template "
                 "writes its own beginning-of-text token" : "needs --tokenizer PATH: the byte tokenizer has no "
                 "beginning-of-sequence token");
        return MT_EXIT_USAGE;
    }
    if (opt.chat_template_auto && strcmp(opt.tokenizer, "byte") == 0) {
        mt_error("data build: --chat-template auto reads the model's template beside --tokenizer PATH; the byte "
                 "tokenizer has none: give --chat-template NAME (%s)", sft_template_names());
        return MT_EXIT_USAGE;
    }
    if (strcmp(opt.tokenizer, "byte") != 0) {
        if (!(st.tok = tokenizer_load(opt.tokenizer, err, sizeof(err))) ||
            (st.eod_id = tokenizer_eod(st.tok, opt.eod_token, &st.eod_name, err, sizeof(err))) < 0) {
            mt_error("data build: --tokenizer: %s", err);
            tokenizer_free(st.tok);
            return MT_EXIT_USAGE;
        }
        if (opt.add_bos && (st.bos_id = tokenizer_bos(st.tok, &st.bos_name, err, sizeof err)) < 0) {
            mt_error("data build: --add-bos: %s", err);
            tokenizer_free(st.tok);
            return MT_EXIT_USAGE;
        }
        st.dtype = data_build_token_dtype(tokenizer_vocab_size(st.tok));
        if ((opt.sft && resolve_template(&opt, st.tok) != 0) || check_template_tokens(st.tok, opt.chat_template) != 0) {
            tokenizer_free(st.tok);
            return MT_EXIT_USAGE;
        }
    }
    DatasetTokenizer made_by = {.byte = true, .vocab_size = 256, .eod = BUILD_BYTE_EOD_TOKEN};
    if (st.tok && tokenizer_identity(st.tok, st.eod_id, &made_by) != 0) {
        tokenizer_free(st.tok);
        return MT_EXIT_FAILURE;
    }
    if (opt.chat_template != SFT_TEMPLATE_NONE) made_by.eod = -1; /* the template ends turns: no end of document */
    catch_stop_signals();
    InputFormat format = opt.input_format != FORMAT_UNKNOWN ? opt.input_format
                         : (opt.sft || ends_with(opt.input, ".jsonl") || ends_with(opt.input, ".json")) ? FORMAT_JSONL
                                                                                                         : FORMAT_UNKNOWN;
    if (build_reader_open(&st.reader, opt.input, (size_t)opt.max_line_mib << 20, format, &stop_signal, err,
                          sizeof err) != 0) {
        mt_error("%s", err);
        tokenizer_free(st.tok);
        return MT_EXIT_FAILURE;
    }
    IndexedDatasetWriter *writer = NULL;
    if (mt_make_parent_dirs(opt.output, err, sizeof(err)) != 0 ||
        !(writer = indexed_dataset_writer_open(opt.output, st.dtype, err, sizeof(err)))) {
        mt_error("data build: %s", err);
        build_reader_close(&st.reader);
        tokenizer_free(st.tok);
        return MT_EXIT_FAILURE;
    }
    indexed_dataset_writer_set_overwrite(writer, opt.overwrite);
    st.writer = writer;
    if (opt.sft) {
        if (!(st.mask_writer = indexed_dataset_writer_open(mask_prefix, IDX_DTYPE_UINT8, err, sizeof err))) {
            mt_error("data build: %s", err);
            indexed_dataset_writer_abort(writer);
            build_reader_close(&st.reader);
            tokenizer_free(st.tok);
            return MT_EXIT_FAILURE;
        }
        indexed_dataset_writer_set_overwrite(st.mask_writer, opt.overwrite);
    }
    st.format = format;
    BuildSpec spec = {.input = opt.input, .json_key = opt.json_key, .tok = st.tok, .eod_id = st.eod_id,
                      .bos_id = st.bos_id, .sft = opt.sft, .chat_template = opt.chat_template};
    build_progress_start(&st.progress, S_ISREG(sb.st_mode) ? (int64_t)sb.st_size : -1);
    double start = mt_now();
    int status = build_pipeline_run(&st.reader, &spec, opt.workers, write_batch, show_progress, &st, err, sizeof err);
    build_progress_end(&st.progress);
    rc = status == PIPELINE_DONE ? MT_EXIT_OK : MT_EXIT_FAILURE;
    const int stopped_by = status == PIPELINE_STOPPED_BY_SIGNAL ? stop_signal : 0;
    if (stopped_by)
        mt_error("data build: stopped by %s at line %lld of %s; nothing written under %s", signal_name(stopped_by),
                 (long long)st.reader.lines, opt.input, opt.output);
    else if (status == PIPELINE_READ_ERROR)
        mt_error("%s", err);
    long long documents = indexed_dataset_writer_documents(writer);
    long long tokens = indexed_dataset_writer_tokens(writer);
    if (rc == MT_EXIT_OK && documents == 0) {
        mt_error("%s: no documents (%lld lines, all blank or with empty text)", opt.input, (long long)st.reader.lines);
        rc = MT_EXIT_FAILURE;
    }
    if (rc != MT_EXIT_OK) {
        indexed_dataset_writer_abort(writer);
        if (st.mask_writer) indexed_dataset_writer_abort(st.mask_writer);
    } else if (indexed_dataset_writer_seal(writer, err, sizeof err) != 0) { /* aborted it */
        if (st.mask_writer) indexed_dataset_writer_abort(st.mask_writer);
        mt_error("data build: %s", err);
        rc = MT_EXIT_FAILURE;
    } else if (st.mask_writer && indexed_dataset_writer_seal(st.mask_writer, err, sizeof err) != 0) {
        indexed_dataset_writer_abort(writer);
        mt_error("data build: %s", err);
        rc = MT_EXIT_FAILURE;
    } else if (place_outputs(&opt, mask_prefix, writer, st.mask_writer, err, sizeof err) != 0) {
        mt_error("data build: %s", err);
        rc = MT_EXIT_FAILURE;
    } else {
        if (dataset_tokenizer_write(opt.output, &made_by, opt.input, documents, tokens, err, sizeof err) != 0)
            mt_log_warn("data build: %s (the dataset is complete; a run cannot check its tokenizer)", err);
        print_summary(&st, documents, tokens, mt_now() - start);
        if (st.empty_reply_records > 0) /* what transformers' template and TRL would train too, but rarely meant */
            mt_warn("data build: %lld record%s of %s hold%s an empty assistant reply (content \"\" or whitespace only; "
                    "the first: %s:%lld): only its %s token is trained, which teaches the model to answer with "
                    "nothing; fix or drop them if that is not meant", (long long)st.empty_reply_records,
                    st.empty_reply_records == 1 ? "" : "s", opt.input, st.empty_reply_records == 1 ? "s" : "",
                    opt.input, (long long)st.first_empty_reply,
                    opt.chat_template == SFT_TEMPLATE_NONE ? "end-of-document" : "end-of-turn");
    }
    build_reader_close(&st.reader);
    tokenizer_free(st.tok);
    free(st.mask_row);
    if (stopped_by) { /* cleaned up: end as the signal would have */
        signal(stopped_by, SIG_DFL);
        raise(stopped_by);
    }
    return rc;
}
