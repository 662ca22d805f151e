/* dataset_tokenizer.c: PREFIX.build.json, the tokenizer that made a dataset,
 * and a run's check of it against the model's tokenizer
 * (dataset_tokenizer.h). */
#include "dataset_tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/crc32c.h"
#include "../core/error.h"
#include "../core/fs.h"
#include "../core/json.h"
#include "indexed_dataset.h"

#define RECORD_SUFFIX ".build.json"
#define RECORD_MAX_BYTES (1 << 20)
#define BUILT_BY "megatrain data build"

DatasetTokenizer dataset_tokenizer_of_json(const void *json, size_t len, int64_t vocab_size, int64_t eod) {
    return (DatasetTokenizer){.byte = false, .bytes = len, .crc32c = crc32c(0, json, len), .vocab_size = vocab_size,
                              .eod = eod};
}

void dataset_tokenizer_record_path(const char *prefix, char *path, size_t pathlen) {
    snprintf(path, pathlen, "%s" RECORD_SUFFIX, prefix);
}

static char *record_json(const DatasetTokenizer *tok, const char *input, int64_t documents, int64_t tokens) {
    JsonWriter w;
    jw_init(&w, 2);
    jw_begin_object(&w);
    jw_key(&w, "built_by");
    jw_string(&w, BUILT_BY);
    jw_key(&w, "input");
    jw_string(&w, input);
    jw_key(&w, "tokenizer");
    jw_begin_object(&w);
    jw_key(&w, "kind");
    jw_string(&w, tok->byte ? "byte" : "tokenizer.json");
    if (!tok->byte) {
        char crc[16];
        snprintf(crc, sizeof crc, "%08x", (unsigned)tok->crc32c);
        jw_key(&w, "bytes");
        jw_uint(&w, tok->bytes);
        jw_key(&w, "crc32c");
        jw_string(&w, crc);
    }
    jw_key(&w, "vocab_size");
    jw_int(&w, tok->vocab_size);
    jw_key(&w, "eod");
    if (tok->eod >= 0) jw_int(&w, tok->eod);
    else jw_null(&w); /* a chat template's data: no end of document */
    jw_end_object(&w);
    jw_key(&w, "documents");
    jw_int(&w, documents);
    jw_key(&w, "tokens");
    jw_int(&w, tokens);
    jw_end_object(&w);
    jw_raw(&w, "\n", 1);
    return w.data; /* the writer's buffer now belongs to the caller */
}

int dataset_tokenizer_write(const char *prefix, const DatasetTokenizer *tok, const char *input, int64_t documents,
                            int64_t tokens, char *err, size_t errlen) {
    char path[4200], tmp[4300], dir[4200];
    dataset_tokenizer_record_path(prefix, path, sizeof path);
    char first[64];
    mt_remove_stale_temps(path, first, sizeof first); /* a killed build's, as for the dataset's own files */
    if (mt_temp_name_host(tmp, sizeof tmp, path) != 0) {
        mt_set_error(err, errlen, "%s: the path is too long", path);
        return -1;
    }
    char *text = record_json(tok, input, documents, tokens);
    const size_t len = strlen(text);
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int rc = fd < 0 || mt_write_all(fd, text, len) != 0 ? -1 : 0;
    if (fd >= 0 && mt_sync_close(fd) != 0) rc = -1;
    if (rc == 0 && rename(tmp, path) != 0) rc = -1;
    if (rc != 0) {
        mt_set_error(err, errlen, "%s: cannot write: %s", path, strerror(errno));
        unlink(tmp);
    }
    free(text);
    mt_parent_dir(path, dir, sizeof dir);
    if (rc == 0 && mt_sync_dir(dir, err, errlen) != 0) rc = -1;
    return rc;
}

void dataset_tokenizer_remove(const char *prefix) {
    char path[4200];
    dataset_tokenizer_record_path(prefix, path, sizeof path);
    unlink(path);
}

/* A string of exactly 8 hexadecimal digits into *crc; -1 otherwise. */
static int parse_crc(const JsonValue *v, uint32_t *crc) {
    if (!v || v->type != JSON_STRING || v->string_len != 8) return -1;
    uint32_t value = 0;
    for (int i = 0; i < 8; i++) {
        const char c = v->string[i];
        const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (digit < 0) return -1;
        value = value << 4 | (uint32_t)digit;
    }
    *crc = value;
    return 0;
}

/* Member `key` of object `o` (the record, or its "tokenizer") as an integer in [0, max]; -1 with err naming the
 * file and key. */
static int get_count(const JsonValue *o, const char *key, int64_t max, const char *path, int64_t *out, char *err,
                     size_t errlen) {
    const JsonValue *v = json_get(o, key);
    if (!v || v->type != JSON_NUMBER || json_as_int64(v, out) != 0 || *out < 0 || *out > max) {
        const bool top = !strcmp(key, "documents") || !strcmp(key, "tokens");
        mt_set_error(err, errlen, "%s: %s%s: expected an integer in [0, %lld], found %s", path, top ? "" : "tokenizer.",
                     key, (long long)max, v ? json_type_name(v->type) : "nothing");
        return -1;
    }
    return 0;
}

int dataset_tokenizer_parse(const char *text, size_t len, const char *path, DatasetTokenizer *tok, char *err,
                            size_t errlen) {
    char why[512];
    JsonValue *root = json_parse(text, len, why, sizeof why);
    if (!root) {
        mt_set_error(err, errlen, "%s: %s", path, why);
        return -1;
    }
    memset(tok, 0, sizeof *tok);
    const JsonValue *by = json_get(root, "built_by"), *t = json_get(root, "tokenizer");
    const JsonValue *kind = json_get(t, "kind"), *crc = json_get(t, "crc32c");
    int rc = 0;
    if (!by || by->type != JSON_STRING || strcmp(by->string, BUILT_BY) != 0 || !t || t->type != JSON_OBJECT) {
        mt_set_error(err, errlen, "%s: expected an object with \"built_by\": \"" BUILT_BY "\" and a \"tokenizer\" "
                     "object (the record `megatrain data build` writes beside PREFIX.bin and PREFIX.idx)", path);
        rc = -1;
    } else if (!kind || kind->type != JSON_STRING ||
               (strcmp(kind->string, "byte") != 0 && strcmp(kind->string, "tokenizer.json") != 0)) {
        mt_set_error(err, errlen, "%s: tokenizer.kind: expected \"byte\" or \"tokenizer.json\"", path);
        rc = -1;
    } else {
        tok->byte = strcmp(kind->string, "byte") == 0;
        int64_t bytes = 0;
        rc = get_count(t, "vocab_size", INT32_MAX, path, &tok->vocab_size, err, errlen);
        const JsonValue *eod = json_get(t, "eod");
        tok->eod = -1;
        if (rc == 0 && eod && eod->type != JSON_NULL) rc = get_count(t, "eod", INT32_MAX, path, &tok->eod, err, errlen);
        if (rc == 0 && !tok->byte) rc = get_count(t, "bytes", INT64_MAX, path, &bytes, err, errlen);
        tok->bytes = (uint64_t)bytes;
        if (rc == 0 && !tok->byte && parse_crc(crc, &tok->crc32c) != 0) {
            mt_set_error(err, errlen, "%s: tokenizer.crc32c: expected 8 hexadecimal digits", path);
            rc = -1;
        }
        if (rc == 0) rc = get_count(root, "documents", INT64_MAX, path, &tok->documents, err, errlen);
        if (rc == 0) rc = get_count(root, "tokens", INT64_MAX, path, &tok->tokens, err, errlen);
    }
    json_free(root);
    return rc;
}

int dataset_tokenizer_read(const char *prefix, DatasetTokenizer *tok, char *err, size_t errlen) {
    char path[4200];
    dataset_tokenizer_record_path(prefix, path, sizeof path);
    struct stat st;
    if (lstat(path, &st) != 0 && errno == ENOENT) return 0;
    size_t len = 0;
    char *text = mt_read_file(path, RECORD_MAX_BYTES, &len, err, errlen);
    if (!text) return -1;
    const int rc = dataset_tokenizer_parse(text, len, path, tok, err, errlen);
    free(text);
    return rc == 0 ? 1 : -1;
}

/* The documents and tokens of dataset `prefix`; -1 when it cannot be opened. */
static int dataset_counts(const char *prefix, int64_t *documents, int64_t *tokens) {
    IndexedDataset ds;
    char err[1200];
    if (indexed_dataset_open(&ds, prefix, err, sizeof err) != 0) return -1;
    *documents = ds.num_sequences;
    *tokens = 0;
    for (int64_t i = 0; i < ds.num_sequences; i++) *tokens += indexed_length(&ds, i);
    indexed_dataset_close(&ds);
    return 0;
}

bool dataset_tokenizer_current(const DatasetTokenizer *tok, const char *prefix) {
    int64_t documents = 0, tokens = 0;
    return dataset_counts(prefix, &documents, &tokens) == 0 && documents == tok->documents && tokens == tok->tokens;
}

int dataset_tokenizer_check(const char *prefix, const char *what, const void *json, size_t len,
                            const char *model_source, char *err, size_t errlen) {
    if (!json) return 0;
    DatasetTokenizer data;
    char why[2048];
    const int found = dataset_tokenizer_read(prefix, &data, why, sizeof why);
    if (found < 0) {
        mt_set_error(err, errlen, "%s: %s", what, why);
        return -1;
    }
    if (found == 0) return 0;
    char record[4200];
    dataset_tokenizer_record_path(prefix, record, sizeof record);
    int64_t documents = 0, tokens = 0;
    if (dataset_counts(prefix, &documents, &tokens) != 0) return 0; /* unreadable: the data loader says why */
    if (documents != data.documents || tokens != data.tokens) {
        mt_set_error(err, errlen, "%s: %s records %lld documents and %lld tokens but %s holds %lld and %lld (its "
                     "files were replaced since `data build` made them): the record is ignored and the dataset's "
                     "tokenizer not checked", what, record, (long long)data.documents, (long long)data.tokens, prefix,
                     (long long)documents, (long long)tokens);
        return 1;
    }
    const DatasetTokenizer model = dataset_tokenizer_of_json(json, len, 0, 0);
    if (!data.byte && data.bytes == model.bytes && data.crc32c == model.crc32c) return 0;
    char made[160];
    if (data.byte)
        snprintf(made, sizeof made, "the byte-level tokenizer (ids are byte values)");
    else
        snprintf(made, sizeof made, "another tokenizer.json (%llu bytes, CRC-32C %08x; %lld ids)",
                 (unsigned long long)data.bytes, (unsigned)data.crc32c, (long long)data.vocab_size);
    mt_set_error(err, errlen, "%s: %s was built with %s, not the model's tokenizer (%s: tokenizer.json of %llu bytes, "
                 "CRC-32C %08x), so its ids mean other text to the model (%s says so); rebuild it with `megatrain "
                 "data build --tokenizer MODEL_DIR`, or delete %s to use it regardless", what, prefix, made,
                 model_source, (unsigned long long)model.bytes, (unsigned)model.crc32c, record, record);
    return -1;
}
