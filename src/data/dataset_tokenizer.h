/* dataset_tokenizer.h: which tokenizer made a dataset, recorded by `data
 * build` beside it (PREFIX.build.json), and the check that a run reads the
 * dataset with its model's own tokenizer.
 *
 * A Megatron dataset (PREFIX.bin + PREFIX.idx) holds token ids and nothing
 * of the tokenizer that made them, so data tokenized by another tokenizer
 * trains without a word as long as its ids are below the vocabulary size
 * (byte-level data, ids < 256, under any real model). `data build` therefore
 * writes PREFIX.build.json:
 *
 *   {"built_by": "megatrain data build", "input": "corpus.jsonl",
 *    "tokenizer": {"kind": "tokenizer.json", "bytes": 9085657,
 *                  "crc32c": "0a1b2c3d", "vocab_size": 128256, "eod": 128001},
 *    "documents": 1000, "tokens": 523411}
 *
 * ("kind": "byte" for the byte-level tokenizer, without bytes and crc32c;
 * "eod": null for a chat template's data, whose turns end with its token).
 * A run whose model carries a tokenizer.json (from init_from or the resumed
 * checkpoint, as convert carries it from Hugging Face) refuses a dataset
 * whose record names another tokenizer: a different tokenizer.json (size
 * or CRC-32C) or the byte-level one. A dataset without the record (built
 * by Megatron's tools, or by a megatrain before it) is not checked, and
 * neither is a model that carries no tokenizer.json; deleting the record
 * opts a dataset out. A record whose documents and tokens are not the
 * dataset's (its files replaced by another tool since) is ignored with a
 * warning. */
#ifndef MT_DATA_DATASET_TOKENIZER_H
#define MT_DATA_DATASET_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct DatasetTokenizer {
    bool byte;           /* the byte-level tokenizer (no tokenizer.json: bytes and crc32c 0) */
    uint64_t bytes;      /* tokenizer.json's size */
    uint32_t crc32c;     /* tokenizer.json's CRC-32C */
    int64_t vocab_size;
    int64_t eod;         /* the end-of-document id appended to every document; -1: none (a chat template's) */
    int64_t documents;   /* read from a record: the dataset's documents and tokens as it was built (a record */
    int64_t tokens;      /* whose counts the dataset does not have is stale: another tool replaced the files) */
} DatasetTokenizer;

/* tok's identity from tokenizer.json's bytes. */
DatasetTokenizer dataset_tokenizer_of_json(const void *json, size_t len, int64_t vocab_size, int64_t eod);

/* PREFIX.build.json into path (a prefix of up to 4 KiB). */
void dataset_tokenizer_record_path(const char *prefix, char *path, size_t pathlen);

/* Write PREFIX.build.json (under a temporary name, fsynced, renamed) for a
 * dataset of `documents` documents and `tokens` tokens made from `input`.
 * Returns 0, or -1 with err. */
int dataset_tokenizer_write(const char *prefix, const DatasetTokenizer *tok, const char *input, int64_t documents,
                            int64_t tokens, char *err, size_t errlen);

/* Remove PREFIX.build.json if there is one (a rebuild's old record). */
void dataset_tokenizer_remove(const char *prefix);

/* The record of dataset `prefix` into *tok: 1 when it has one, 0 when it has
 * none, -1 with err when it is unreadable or not a record (naming the file
 * and what is wrong). */
int dataset_tokenizer_read(const char *prefix, DatasetTokenizer *tok, char *err, size_t errlen);
/* Whether a record read from PREFIX.build.json still describes dataset `prefix`: its documents and tokens are the
 * dataset's (else its files were replaced since `data build` made them, and the record is stale); false when the
 * dataset cannot be read. */
bool dataset_tokenizer_current(const DatasetTokenizer *tok, const char *prefix);

/* The record's text (`len` bytes, from file `path`, named in messages)
 * into *tok. Returns 0, or -1 with err naming path and what is wrong. */
int dataset_tokenizer_parse(const char *text, size_t len, const char *path, DatasetTokenizer *tok, char *err,
                            size_t errlen);

/* The check of a run: dataset `prefix` (`what`: the recipe key naming it,
 * e.g. "data.train[0]") against the model's tokenizer.json (`json`, `len`
 * bytes; NULL: the model carries none, nothing is checked) that came from
 * `model_source` (e.g. "init_from /ckpt/llama"). Returns 0 when it agrees or
 * there is nothing to compare; 1 when the record does not describe the
 * dataset beside it (other documents or tokens: the files were replaced
 * since), err holding a warning that it is ignored; -1 with err saying
 * which tokenizer made the data, that it is not the model's, and how to
 * rebuild it (or opt out). */
int dataset_tokenizer_check(const char *prefix, const char *what, const void *json, size_t len,
                            const char *model_source, char *err, size_t errlen);

#endif
