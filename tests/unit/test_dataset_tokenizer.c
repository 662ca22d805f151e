/* test_dataset_tokenizer.c: PREFIX.build.json (src/data/dataset_tokenizer.h):
 * a record written reads back the same (tokenizer.json or byte-level, an
 * end of document or none); a prefix without one reads as none; damaged or
 * foreign records are refused naming the file and the field; the run's
 * check passes the model's own tokenizer, passes when the model or the
 * dataset has nothing to compare, and refuses the byte-level tokenizer and
 * a tokenizer.json that differs in one byte, saying how to rebuild or opt
 * out; a record whose counts are not its dataset's is ignored with a
 * warning. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "data/dataset_tokenizer.h"
#include "data/indexed_dataset.h"

#include "test_work_dir.h"

static const char model_json[] = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}}}";

static void prefix_of(const char *name, char *out, size_t len) { snprintf(out, len, "%s/%s", work_dir, name); }

/* A dataset of 3 documents, 9 tokens at `prefix` (what a record's counts describe). */
static void make_dataset(const char *prefix) {
    char err[512];
    IndexedDatasetWriter *w = indexed_dataset_writer_open(prefix, IDX_DTYPE_UINT16, err, sizeof err);
    if (!w) fail_msg("%s", err);
    const int32_t tokens[] = {1, 0, 1, 1, 0, 1, 0, 0, 1};
    assert_int_equal(indexed_dataset_writer_add_document(w, tokens, 2), 0);
    assert_int_equal(indexed_dataset_writer_add_document(w, tokens + 2, 3), 0);
    assert_int_equal(indexed_dataset_writer_add_document(w, tokens + 5, 4), 0);
    if (indexed_dataset_writer_finish(w, err, sizeof err) != 0) fail_msg("%s", err);
}

static void write_record_text(const char *prefix, const char *text) {
    char path[4200];
    dataset_tokenizer_record_path(prefix, path, sizeof path);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_round_trip(void **state) {
    (void)state;
    char prefix[1024], err[1024];
    prefix_of("json", prefix, sizeof prefix);
    const DatasetTokenizer made = dataset_tokenizer_of_json(model_json, strlen(model_json), 128256, 128001);
    assert_int_equal(dataset_tokenizer_write(prefix, &made, "corpus \"1\".jsonl", 12, 3456, err, sizeof err), 0);
    DatasetTokenizer back;
    assert_int_equal(dataset_tokenizer_read(prefix, &back, err, sizeof err), 1);
    assert_false(back.byte);
    assert_true(back.bytes == strlen(model_json) && back.crc32c == made.crc32c && made.crc32c != 0);
    assert_true(back.vocab_size == 128256 && back.eod == 128001 && back.documents == 12 && back.tokens == 3456);

    prefix_of("byte", prefix, sizeof prefix);
    const DatasetTokenizer byte = {.byte = true, .vocab_size = 256, .eod = -1};
    assert_int_equal(dataset_tokenizer_write(prefix, &byte, "x.txt", 1, 2, err, sizeof err), 0);
    assert_int_equal(dataset_tokenizer_read(prefix, &back, err, sizeof err), 1);
    assert_true(back.byte && back.vocab_size == 256 && back.eod == -1 && back.bytes == 0);
    dataset_tokenizer_remove(prefix);
    assert_int_equal(dataset_tokenizer_read(prefix, &back, err, sizeof err), 0);

    prefix_of("never_built", prefix, sizeof prefix);
    assert_int_equal(dataset_tokenizer_read(prefix, &back, err, sizeof err), 0);
}

static void test_damaged_records(void **state) {
    (void)state;
    static const struct {
        const char *text, *message;
    } cases[] = {
        {"{\"built_by\": \"megatrain data build\", \"tokenizer\": ", "line 1"},
        {"[]", "expected an object with \"built_by\""},
        {"{\"built_by\": \"something else\", \"tokenizer\": {}}", "expected an object with \"built_by\""},
        {"{\"built_by\": \"megatrain data build\", \"tokenizer\": {\"kind\": \"sentencepiece\"}}", "tokenizer.kind"},
        {"{\"built_by\": \"megatrain data build\", \"tokenizer\": {\"kind\": \"byte\", \"vocab_size\": -1}}",
         "tokenizer.vocab_size: expected an integer"},
        {"{\"built_by\": \"megatrain data build\", \"tokenizer\": {\"kind\": \"byte\", \"vocab_size\": 256, "
         "\"eod\": 1.5}}", "tokenizer.eod"},
        {"{\"built_by\": \"megatrain data build\", \"tokenizer\": {\"kind\": \"tokenizer.json\", \"vocab_size\": 9, "
         "\"bytes\": 10}}", "tokenizer.crc32c: expected 8 hexadecimal digits"},
        {"{\"built_by\": \"megatrain data build\", \"tokenizer\": {\"kind\": \"tokenizer.json\", \"vocab_size\": 9, "
         "\"bytes\": 10, \"crc32c\": \"-1234567\"}}", "tokenizer.crc32c"},
        {"{\"built_by\": \"megatrain data build\", \"tokenizer\": {\"kind\": \"tokenizer.json\", \"vocab_size\": 9, "
         "\"bytes\": 10, \"crc32c\": \"0000zz00\"}}", "tokenizer.crc32c"},
        {"{\"built_by\": \"megatrain data build\", \"tokenizer\": {\"kind\": \"tokenizer.json\", \"vocab_size\": 9, "
         "\"crc32c\": \"00000000\"}}", "tokenizer.bytes"},
        {"{\"built_by\": \"megatrain data build\", \"tokenizer\": {\"kind\": \"byte\", \"vocab_size\": 256}, "
         "\"tokens\": 5}", ": documents: expected an integer"},
        {"{\"built_by\": \"megatrain data build\", \"tokenizer\": {\"kind\": \"byte\", \"vocab_size\": 256}, "
         "\"documents\": 1, \"tokens\": -5}", ": tokens: expected an integer"},
    };
    char prefix[1024], err[1024];
    prefix_of("damaged", prefix, sizeof prefix);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_record_text(prefix, cases[i].text);
        DatasetTokenizer tok;
        err[0] = '\0';
        assert_int_equal(dataset_tokenizer_read(prefix, &tok, err, sizeof err), -1);
        if (!strstr(err, "damaged.build.json") || !strstr(err, cases[i].message))
            fail_msg("case %zu: expected the file and '%s' in: %s", i, cases[i].message, err);
        /* the run's check refuses it too, naming the key */
        assert_int_equal(dataset_tokenizer_check(prefix, "data.valid[1]", model_json, strlen(model_json), "init_from M",
                                                 err, sizeof err), -1);
        assert_non_null(strstr(err, "data.valid[1]: "));
    }
}

static void test_check(void **state) {
    (void)state;
    char prefix[1024], err[2048];
    const size_t len = strlen(model_json);
    prefix_of("mine", prefix, sizeof prefix);
    make_dataset(prefix);
    const DatasetTokenizer mine = dataset_tokenizer_of_json(model_json, len, 2, 1);
    assert_int_equal(dataset_tokenizer_write(prefix, &mine, "in", 3, 9, err, sizeof err), 0);
    assert_int_equal(dataset_tokenizer_check(prefix, "data.train[0]", model_json, len, "init_from M", err, sizeof err),
                     0);
    /* one byte differs (same size): refused */
    char other[sizeof model_json];
    memcpy(other, model_json, sizeof other);
    other[len - 3] = '2';
    assert_int_equal(dataset_tokenizer_check(prefix, "data.train[2]", other, len, "init_from /ckpt/m", err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "data.train[2]: "));
    assert_non_null(strstr(err, "was built with another tokenizer.json"));
    assert_non_null(strstr(err, "not the model's tokenizer (init_from /ckpt/m: tokenizer.json of"));
    assert_non_null(strstr(err, "megatrain data build --tokenizer MODEL_DIR"));
    assert_non_null(strstr(err, "mine.build.json to use it regardless"));
    /* a model without a tokenizer, a dataset without a record: nothing to compare */
    assert_int_equal(dataset_tokenizer_check(prefix, "data.train[0]", NULL, 0, "init_from M", err, sizeof err), 0);
    prefix_of("unrecorded", prefix, sizeof prefix);
    make_dataset(prefix);
    assert_int_equal(dataset_tokenizer_check(prefix, "data.train[0]", model_json, len, "M", err, sizeof err), 0);
    /* byte-level data under a model with a tokenizer */
    prefix_of("bytes", prefix, sizeof prefix);
    make_dataset(prefix);
    const DatasetTokenizer byte = {.byte = true, .vocab_size = 256, .eod = 10};
    assert_int_equal(dataset_tokenizer_write(prefix, &byte, "in", 3, 9, err, sizeof err), 0);
    assert_int_equal(dataset_tokenizer_check(prefix, "--data", model_json, len, "the checkpoint C", err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "--data: "));
    assert_non_null(strstr(err, "was built with the byte-level tokenizer"));
    /* a record of other counts than its dataset's (the files replaced since): ignored, with a warning */
    assert_int_equal(dataset_tokenizer_write(prefix, &byte, "in", 3, 10, err, sizeof err), 0);
    assert_int_equal(dataset_tokenizer_check(prefix, "--data", model_json, len, "the checkpoint C", err, sizeof err),
                     1);
    assert_non_null(strstr(err, "bytes.build.json records 3 documents and 10 tokens but"));
    assert_non_null(strstr(err, "holds 3 and 9"));
    assert_non_null(strstr(err, "the record is ignored"));
    assert_int_equal(dataset_tokenizer_write(prefix, &byte, "in", 4, 9, err, sizeof err), 0);
    assert_int_equal(dataset_tokenizer_check(prefix, "--data", model_json, len, "the checkpoint C", err, sizeof err),
                     1);
    /* a record without a dataset beside it: nothing to compare (the loader says the dataset is missing) */
    prefix_of("gone", prefix, sizeof prefix);
    assert_int_equal(dataset_tokenizer_write(prefix, &byte, "in", 3, 9, err, sizeof err), 0);
    assert_int_equal(dataset_tokenizer_check(prefix, "--data", model_json, len, "the checkpoint C", err, sizeof err),
                     0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_damaged_records),
        cmocka_unit_test(test_check),
    };
    return cmocka_run_group_tests(tests, work_dir_setup, work_dir_teardown);
}
