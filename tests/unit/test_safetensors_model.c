/* test_safetensors_model.c: models over several safetensors files
 * (src/convert/safetensors_model.c, st_write_model): shards filled in order
 * under the size limit, tensors sharing a storage kept together, the index file exactly as transformers writes it,
 * one file and no index when the model fits, reading the shards back as one
 * set of tensors, and every disagreement between index and files rejected
 * with a message that names the tensor or file. */
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "convert/safetensors.h"

#include "test_work_dir.h"

static float values[200];

/* a 40 B, b 80 B, c 20 B, d 400 B, e 12 B (F32), in this order. */
static void five_tensors(StWriteTensor *t) {
    for (int i = 0; i < 200; i++) values[i] = (float)i * 0.25f - 3.0f;
    t[0] = (StWriteTensor){"a", ST_F32, 1, {10}, values, false, NULL, NULL};
    t[1] = (StWriteTensor){"b", ST_F32, 2, {4, 5}, values + 10, false, NULL, NULL};
    t[2] = (StWriteTensor){"c", ST_F32, 1, {5}, values + 30, false, NULL, NULL};
    t[3] = (StWriteTensor){"d", ST_F32, 2, {10, 10}, values + 35, false, NULL, NULL};
    t[4] = (StWriteTensor){"e", ST_F32, 1, {3}, values + 140, false, NULL, NULL};
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = calloc(1, (size_t)n + 1);
    assert_int_equal(fread(text, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    return text;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int exists(const char *dir, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static void make_sharded(const char *dir) {
    StWriteTensor t[5];
    five_tensors(t);
    mkdir(dir, 0777);
    char err[512];
    if (st_write_model(dir, t, 5, 100, 138, NULL, NULL, err, sizeof err) != 0) fail_msg("%s", err);
}

static void test_sharded_model(void **state) {
    (void)state;
    char dir[512], path[600], err[512];
    snprintf(dir, sizeof dir, "%s/sharded", work_dir);
    make_sharded(dir);
    /* limit 100 B, huggingface_hub's rule: [a] closes when b comes; d (over the
     * limit) is a shard of its own at once, numbered before the open [b c]; [e] */
    assert_false(exists(dir, "model.safetensors"));
    assert_true(exists(dir, "model-00004-of-00004.safetensors"));
    assert_false(exists(dir, "model-00005-of-00005.safetensors"));
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    char *index = slurp(path);
    assert_non_null(index);
    assert_string_equal(index, "{\n"
                               "  \"metadata\": {\n"
                               "    \"total_parameters\": 138,\n"
                               "    \"total_size\": 552\n"
                               "  },\n"
                               "  \"weight_map\": {\n"
                               "    \"a\": \"model-00001-of-00004.safetensors\",\n"
                               "    \"b\": \"model-00003-of-00004.safetensors\",\n"
                               "    \"c\": \"model-00003-of-00004.safetensors\",\n"
                               "    \"d\": \"model-00002-of-00004.safetensors\",\n"
                               "    \"e\": \"model-00004-of-00004.safetensors\"\n"
                               "  }\n"
                               "}\n");
    free(index);

    StModel *model = st_model_open(dir, err, sizeof err);
    if (!model) fail_msg("%s", err);
    assert_int_equal(model->num_files, 4);
    assert_int_equal(model->num_tensors, 5);
    StWriteTensor t[5];
    five_tensors(t);
    for (int i = 0; i < 5; i++) {
        int at = st_model_find(model, t[i].name);
        assert_true(at >= 0);
        const StTensor *got = model->tensors[at];
        assert_int_equal(got->numel, (int64_t)(st_write_tensor_bytes(&t[i]) / 4));
        assert_memory_equal(got->data, t[i].data, got->nbytes);
        const char *expected_file[] = {"00001", "00003", "00003", "00002", "00004"};
        assert_non_null(strstr(st_model_file_of(model, at), expected_file[i]));
    }
    assert_int_equal(st_model_find(model, "zzz"), -1);
    st_model_close(model);

    /* A limit the model fits under: one model.safetensors, no index. */
    snprintf(dir, sizeof dir, "%s/single", work_dir);
    mkdir(dir, 0777);
    assert_int_equal(st_write_model(dir, t, 5, 552, 138, NULL, NULL, err, sizeof err), 0);
    assert_true(exists(dir, "model.safetensors"));
    assert_false(exists(dir, "model.safetensors.index.json"));
    model = st_model_open(dir, err, sizeof err);
    assert_non_null(model);
    assert_int_equal(model->num_files, 1);
    assert_int_equal(model->num_tensors, 5);
    st_model_close(model);

    /* A sharded save and then a single-file save into the same directory (save_pretrained leaves the index and
     * shards): model.safetensors is read, as transformers reads it; the stale index is not (its shards gone). */
    snprintf(dir, sizeof dir, "%s/resaved", work_dir);
    make_sharded(dir);
    for (int i = 1; i <= 4; i++) {
        snprintf(path, sizeof path, "%s/model-%05d-of-00004.safetensors", dir, i);
        remove(path);
    }
    assert_int_equal(st_write_model(dir, t, 5, 552, 138, NULL, NULL, err, sizeof err), 0);
    assert_true(exists(dir, "model.safetensors") && exists(dir, "model.safetensors.index.json"));
    model = st_model_open(dir, err, sizeof err);
    if (!model) fail_msg("%s", err);
    assert_int_equal(model->num_files, 1);
    assert_non_null(strstr(st_model_file_of(model, 0), "/model.safetensors"));
    st_model_close(model);
}

/* Tensors that share a storage (transformers 5's expert slices) go into the
 * shard of the first, which counts the whole storage: x 20 B, y 40 B, z 40 B
 * of one storage (100 B) are over a 90 B limit together and get a shard of
 * their own, though x and y alone would fit one; e (12 B) follows. Without
 * the shared storage the same tensors split [x y] [z e]. */
static void test_shared_storage(void **state) {
    (void)state;
    for (int i = 0; i < 200; i++) values[i] = (float)i;
    for (int shared = 0; shared < 2; shared++) {
        StWriteTensor t[4] = {
            {"x", ST_F32, 1, {5}, values, false, NULL, NULL},
            {"y", ST_F32, 1, {10}, values + 5, shared, NULL, NULL},
            {"z", ST_F32, 1, {10}, values + 15, shared, NULL, NULL},
            {"e", ST_F32, 1, {3}, values + 25, false, NULL, NULL},
        };
        char dir[512], path[600], err[512];
        snprintf(dir, sizeof dir, "%s/shared%d", work_dir, shared);
        mkdir(dir, 0777);
        if (st_write_model(dir, t, 4, 90, 28, NULL, NULL, err, sizeof err) != 0) fail_msg("%s", err);
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        char *index = slurp(path);
        assert_non_null(index);
        const char *want = shared ? "    \"e\": \"model-00002-of-00002.safetensors\",\n"
                                    "    \"x\": \"model-00001-of-00002.safetensors\",\n"
                                    "    \"y\": \"model-00001-of-00002.safetensors\",\n"
                                    "    \"z\": \"model-00001-of-00002.safetensors\"\n"
                                  : "    \"e\": \"model-00002-of-00002.safetensors\",\n"
                                    "    \"x\": \"model-00001-of-00002.safetensors\",\n"
                                    "    \"y\": \"model-00001-of-00002.safetensors\",\n"
                                    "    \"z\": \"model-00002-of-00002.safetensors\"\n";
        if (!strstr(index, want)) fail_msg("shared %d: index\n%s\nlacks\n%s", shared, index, want);
        assert_non_null(strstr(index, "\"total_size\": 112\n"));
        free(index);
    }
}

/* Replace the index of a fresh sharded copy with `index` and expect `message`. */
static void expect_index_error(const char *name, const char *index, const char *message) {
    char dir[512], path[600], err[1024] = "";
    snprintf(dir, sizeof dir, "%s/%s", work_dir, name);
    make_sharded(dir);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    write_text(path, index);
    StModel *model = st_model_open(dir, err, sizeof err);
    if (model) fail_msg("%s: accepted", name);
    if (!strstr(err, message)) fail_msg("%s: message '%s' lacks '%s'", name, err, message);
}

#define MAP_BCDE                                                                                   \
    "\"b\": \"model-00003-of-00004.safetensors\", \"c\": \"model-00003-of-00004.safetensors\", "  \
    "\"d\": \"model-00002-of-00004.safetensors\", \"e\": \"model-00004-of-00004.safetensors\""

static void test_index_errors(void **state) {
    (void)state;
    expect_index_error("wrong_file", "{\"weight_map\": {\"a\": \"model-00003-of-00004.safetensors\", " MAP_BCDE "}}",
                       "the index puts tensor 'a' in model-00003-of-00004.safetensors, but that file does not hold it");
    expect_index_error("unlisted",
                       "{\"weight_map\": {\"a\": \"model-00001-of-00004.safetensors\", \"b\": "
                       "\"model-00003-of-00004.safetensors\", \"d\": \"model-00002-of-00004.safetensors\", "
                       "\"e\": \"model-00004-of-00004.safetensors\"}}",
                       "model-00003-of-00004.safetensors holds tensor 'c', which");
    expect_index_error("missing_shard", "{\"weight_map\": {\"a\": \"model-00009-of-00009.safetensors\", " MAP_BCDE "}}",
                       "model-00009-of-00009.safetensors: cannot open");
    expect_index_error("path_in_name", "{\"weight_map\": {\"a\": \"../x.safetensors\", " MAP_BCDE "}}",
                       "weight_map.a: expected a file name");
    expect_index_error("not_json", "{\"weight_map\": {\"a\": }", "model.safetensors.index.json: line 1, column 22");
    expect_index_error("no_map", "{\"metadata\": {}}", "\"weight_map\"");

    /* The same tensor in two shards. */
    char dir[512], path[600], err[1024];
    snprintf(dir, sizeof dir, "%s/duplicate", work_dir);
    mkdir(dir, 0777);
    StWriteTensor t[5];
    five_tensors(t);
    snprintf(path, sizeof path, "%s/one.safetensors", dir);
    assert_int_equal(st_write_file(path, t, 2, NULL, 0, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/two.safetensors", dir);
    assert_int_equal(st_write_file(path, t + 1, 1, NULL, 0, err, sizeof err), 0);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    write_text(path, "{\"weight_map\": {\"a\": \"one.safetensors\", \"b\": \"two.safetensors\"}}");
    assert_null(st_model_open(dir, err, sizeof err));
    assert_non_null(strstr(err, "tensor 'b' is in both"));

    /* No weights at all, or only PyTorch ones. */
    snprintf(dir, sizeof dir, "%s/empty", work_dir);
    mkdir(dir, 0777);
    assert_null(st_model_open(dir, err, sizeof err));
    assert_non_null(strstr(err, "missing model.safetensors"));
    snprintf(path, sizeof path, "%s/pytorch_model.bin", dir);
    write_text(path, "x");
    assert_null(st_model_open(dir, err, sizeof err));
    assert_non_null(strstr(err, "only safetensors weights are supported"));
    snprintf(dir, sizeof dir, "%s/not_there", work_dir);
    assert_null(st_model_open(dir, err, sizeof err));
    assert_non_null(strstr(err, "not_there: not a directory"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sharded_model),
        cmocka_unit_test(test_shared_storage),
        cmocka_unit_test(test_index_errors),
    };
    return cmocka_run_group_tests(tests, work_dir_setup, work_dir_teardown);
}
