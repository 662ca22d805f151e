/* build_internal.h: the parts of `megatrain data build` shared by its files:
 * the input read into batches of whole lines (build_reader.c), a batch
 * turned into documents by one worker (build_batch.c), the worker threads
 * that tokenize batches in parallel and hand them back in input order
 * (build_pipeline.c), the progress line (build_progress.c), and the command
 * itself (data_build.c).
 *
 * Memory is bounded whatever the input's size: a batch holds about
 * BUILD_BATCH_BYTES of whole lines (more only for a longer line, up to the
 * line limit), at most 2 x workers + 2 batches exist at once, and the
 * dataset writer keeps 4 bytes per document.
 */
#ifndef MT_DATA_BUILD_INTERNAL_H
#define MT_DATA_BUILD_INTERNAL_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../tokenize/tokenizer.h"
#include "../core/json.h"
#include "json_text.h"
#include "sft_render.h"

#define BUILD_BATCH_BYTES (1u << 20)   /* text per batch */
#define BUILD_READ_CHUNK (1u << 20)    /* bytes per read() */
#define BUILD_DEFAULT_MAX_LINE_MIB 64  /* --max-line-mib */
#define BUILD_BYTE_EOD_TOKEN 10

typedef enum { FORMAT_UNKNOWN, FORMAT_TEXT, FORMAT_JSONL } InputFormat;

/* ---- reading (build_reader.c) ---- */

/* Whole lines of the input, in order: text[0..len) starts at line
 * first_line (1-based) and holds `lines` lines, each ending in '\n' but the
 * input's last one when it has none (last_unterminated). */
typedef struct BuildText {
    char *text;
    size_t len, cap;
    int64_t first_line, lines;
    bool last_unterminated;
} BuildText;

typedef struct BuildReader {
    const char *path;
    int fd;
    size_t max_line;             /* bytes, the '\n' excluded */
    char *carry;                 /* the start of a line that did not fit the last batch */
    size_t carry_len, carry_cap;
    int64_t lines;               /* lines handed out (or, after a stop, '\n' read so far) */
    int64_t bytes;               /* bytes read */
    bool eof;
    bool bom_skipped;            /* the file began with a UTF-8 byte-order mark, left out of its first line */
    InputFormat format;          /* FORMAT_UNKNOWN until a non-blank line is seen */
    volatile sig_atomic_t *stop; /* non-zero: a signal asked to stop */
} BuildReader;

enum { READ_OK = 0, READ_END = 1, READ_STOPPED = 2, READ_ERROR = -1 };

/* Open path (a regular file, a FIFO, /dev/stdin...). 0, or -1 with err. */
int build_reader_open(BuildReader *r, const char *path, size_t max_line, InputFormat format,
                      volatile sig_atomic_t *stop, char *err, size_t errlen);
void build_reader_close(BuildReader *r);
/* Fill out with the next whole lines, about `target` bytes of them.
 * READ_OK; READ_END when nothing is left (out empty); READ_STOPPED when a
 * signal interrupted the read; READ_ERROR with err (a read failure, or a
 * line longer than max_line, naming the file and the line). Also detects
 * the format on the first non-blank line when it is FORMAT_UNKNOWN. */
int build_reader_fill(BuildReader *r, BuildText *out, size_t target, char *err, size_t errlen);

/* ---- one batch -> documents (build_batch.c) ---- */

/* What every worker needs to turn lines into documents (read-only). */
typedef struct BuildSpec {
    const char *input;       /* for messages */
    const char *json_key;
    const Tokenizer *tok;    /* NULL: the byte tokenizer */
    int32_t eod_id;          /* appended to every document (not with an SFT chat template) */
    int32_t bos_id;          /* --add-bos: put before every document; -1: none */
    bool sft;                /* --format sft: records rendered by sft_render, with a loss mask */
    SftTemplate chat_template;
} BuildSpec;

/* A batch: its lines, and once tokenized, its documents. */
typedef struct BuildBatch {
    BuildText in;
    InputFormat format;
    int32_t *tokens;         /* every document's tokens, one after the other */
    size_t ntokens, tokens_cap;
    uint8_t *mask;           /* SFT: 1 where the token counts in the loss, one per token */
    size_t mask_cap;
    int64_t counted_tokens;  /* SFT: tokens with mask 1 */
    int32_t *doc_tokens;     /* tokens of each document (its end-of-document token included) */
    size_t ndocs, docs_cap;
    int64_t blank_lines, empty_texts;
    int64_t empty_reply_records;   /* SFT: records with an empty assistant reply (SftRendered.empty_replies) */
    int64_t first_empty_reply;     /* the line of the batch's first of them, 0 when none */
    int64_t error_line;      /* 0: no error; else the line the message is about */
    char error[768];
} BuildBatch;

/* A worker's own state: its encoder and the decoded JSON field. */
typedef struct BuildWorkerState {
    TokenEncoder *encoder;   /* NULL with the byte tokenizer */
    TokenIds ids;
    JsonBuffer field;
    SftRendered rendered;    /* SFT: the record's text and segments */
} BuildWorkerState;

void build_worker_init(BuildWorkerState *w, const BuildSpec *spec);
void build_worker_free(BuildWorkerState *w);
/* Tokenize every line of b into its documents. Stops at the first bad line
 * (b->error_line and b->error say which and why). */
void build_batch_run(const BuildSpec *spec, BuildWorkerState *w, BuildBatch *b);
void build_batch_free(BuildBatch *b);
/* Give back memory a batch grew for an unusually long line. */
void build_batch_trim(BuildBatch *b);

/* ---- the threads (build_pipeline.c) ---- */

/* Called on the calling thread with each tokenized batch, in input order;
 * returns 0 to go on, non-zero to stop. */
typedef int (*BuildSink)(void *ctx, BuildBatch *b);

enum { PIPELINE_DONE = 0, PIPELINE_STOPPED_BY_SINK = 1, PIPELINE_STOPPED_BY_SIGNAL = 2, PIPELINE_READ_ERROR = -1 };

/* Read every batch from r, tokenize them on `workers` threads, hand them to
 * sink in order. Calls tick(ctx) at least every 0.25 s (progress). Returns a
 * PIPELINE_ status; READ_ERROR with err. */
int build_pipeline_run(BuildReader *r, const BuildSpec *spec, int workers, BuildSink sink, void (*tick)(void *),
                       void *ctx, char *err, size_t errlen);

/* The number of CPUs this process may run on (sched_getaffinity), at least 1. */
int build_default_workers(void);

/* ---- progress (build_progress.c) ---- */

typedef struct BuildProgress {
    bool tty;                /* stderr is a terminal: one line redrawn */
    double start, last;      /* mt_now() */
    int64_t total_bytes;     /* the input's size, or -1 (a pipe) */
    bool shown;
} BuildProgress;

#define PROGRESS_TTY_INTERVAL 0.25  /* seconds between redraws on a terminal */
#define PROGRESS_LOG_INTERVAL 60.0  /* seconds between lines when stderr is not a terminal */

void build_progress_start(BuildProgress *p, int64_t total_bytes);
/* Show documents, bytes read, tokens and their rates when the interval has passed. */
void build_progress_update(BuildProgress *p, int64_t documents, int64_t bytes, int64_t tokens);
/* End the redrawn line (when one was drawn). */
void build_progress_end(BuildProgress *p);

#endif
