/* test_sft_packing.c: data.pack (src/data/sft_packing.c). First-fit
 * decreasing on known sizes gives the known rows, and on random sizes never
 * overfills a row and stays within FFD's 11/9 OPT + 1 bound; the loader's
 * packed rows hold every document of two tokens or more exactly once, whole
 * and contiguous, with positions restarting at 0, targets the next token
 * (-1 where the loss mask says 0, at a document's end and in the padding);
 * an overlong document is an error naming it, or truncated when asked.
 * Alone, a dataset's rows are packed_rows_build's with the split's seed. A
 * 3:1 blend of two packed datasets (one with a loss mask, one without)
 * gives each dataset the share of rows blend_index_build says, and every
 * row equals the row of the dataset-alone loader it comes from; an overlong
 * document of the second names data.train[1]. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "data/blend.h"
#include "data/data_loader.h"
#include "data/indexed_dataset.h"
#include "data/sft_packing.h"
#include "test_work_dir.h"

#define SEQ_LEN 16
#define STRIDE 1000
#define NUM_DOCS 40

static void test_ffd_known(void **state) {
    const int64_t sizes[] = {5, 9, 3, 7, 2, 6};
    int64_t row_of[6];
    assert_int_equal(pack_first_fit_decreasing(sizes, 6, 10, row_of), 4);
    const int64_t want[] = {3, 0, 1, 1, 2, 2}; /* 9 | 7 3 | 6 2 | 5 */
    assert_memory_equal(row_of, want, sizeof want);
}

static void test_ffd_random(void **state) {
    enum { N = 500, CAP = 64 };
    int64_t sizes[N], row_of[N], fill[N] = {0}, sum = 0;
    uint64_t s = 3;
    for (int i = 0; i < N; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        sizes[i] = 1 + (int64_t)((s >> 33) % CAP);
        sum += sizes[i];
    }
    int64_t rows = pack_first_fit_decreasing(sizes, N, CAP, row_of);
    for (int i = 0; i < N; i++) {
        assert_true(row_of[i] >= 0 && row_of[i] < rows);
        fill[row_of[i]] += sizes[i];
    }
    for (int64_t r = 0; r < rows; r++) assert_true(fill[r] > 0 && fill[r] <= CAP);
    const int64_t lower = (sum + CAP - 1) / CAP;
    assert_true(rows * 9 <= 11 * lower + 9);
}

/* Document d: 1 + (d * 7) % 17 tokens (1..17), token p = d * STRIDE + p; extra: one more of `extra` tokens. */
static int doc_length(int d) { return 1 + (d * 7) % 17; }

/* The second dataset of the blend: 2 + (d * 5) % 11 tokens (2..12), token p = OTHER_BASE + d * STRIDE + p. */
#define OTHER_BASE 100000
static int other_length(int d) { return 2 + (d * 5) % 11; }

/* NUM_DOCS documents (+ one of `extra` tokens); other: the second dataset's, without a loss mask. */
static void write_sft_dataset(const char *name, int extra, int other, char *prefix, size_t len) {
    snprintf(prefix, len, "%s/%s", work_dir, name);
    char mask_prefix[600], err[512];
    snprintf(mask_prefix, sizeof mask_prefix, "%s_mask", prefix);
    IndexedDatasetWriter *w = indexed_dataset_writer_open(prefix, IDX_DTYPE_INT32, err, sizeof err);
    IndexedDatasetWriter *m = other ? NULL : indexed_dataset_writer_open(mask_prefix, IDX_DTYPE_UINT8, err, sizeof err);
    assert_non_null(w);
    assert_true(other || m);
    int32_t tokens[64], mask[64];
    for (int d = 0; d < NUM_DOCS + (extra > 0); d++) {
        int n = d < NUM_DOCS ? (other ? other_length(d) : doc_length(d)) : extra;
        for (int p = 0; p < n; p++) tokens[p] = (other ? OTHER_BASE : 0) + d * STRIDE + p, mask[p] = (p % 3) != 1;
        assert_int_equal(indexed_dataset_writer_add_document(w, tokens, n), 0);
        if (m) assert_int_equal(indexed_dataset_writer_add_document(m, mask, n), 0);
    }
    assert_int_equal(indexed_dataset_writer_finish(w, err, sizeof err), 0);
    if (m) assert_int_equal(indexed_dataset_writer_finish(m, err, sizeof err), 0);
}

static void make_sft_dataset(const char *name, int extra, char *prefix, size_t len) {
    write_sft_dataset(name, extra, 0, prefix, len);
}

/* data.train: the prefixes with their weights, packed, all of each in the train split, seed 7. */
static DataLoader *packed_blend(int n, const char *const *prefixes, const double *weights, PackOverlong overlong,
                                int64_t num_samples, char *err, size_t errlen) {
    DataConfig data;
    memset(&data, 0, sizeof data);
    data.num_train = n;
    for (int i = 0; i < n; i++) {
        snprintf(data.train[i].path, sizeof data.train[i].path, "%s", prefixes[i]);
        data.train[i].weight = weights[i];
    }
    data.split[0] = 1.0;
    data.pack = true;
    data.pack_overlong = overlong;
    return data_loader_create(&data, SPLIT_TRAIN, SEQ_LEN, 7, num_samples, err, errlen);
}

static DataLoader *packed_loader(const char *prefix, PackOverlong overlong, char *err, size_t errlen) {
    const double one = 1.0;
    return packed_blend(1, &prefix, &one, overlong, 1, err, errlen);
}

/* Every row of the loader: documents whole, once, in order inside; max_len: the longest kept. */
static void check_rows(DataLoader *loader, int extra_doc, int extra_kept) {
    int seen[NUM_DOCS + 1] = {0};
    const int64_t rows = data_loader_num_samples(loader);
    for (int64_t r = 0; r < rows; r++) {
        int32_t in[SEQ_LEN], tg[SEQ_LEN], pos[SEQ_LEN];
        data_loader_get_packed(loader, r, in, tg, pos);
        for (int t = 0; t < SEQ_LEN;) {
            if (pos[t] < 0) { /* padding to the end: places -1, -2, ... (-1 - place) */
                for (int u = t; u < SEQ_LEN; u++) assert_true(in[u] == 0 && tg[u] == -1 && pos[u] == -1 - (u - t));
                break;
            }
            const int d = in[t] / STRIDE;
            const int n = d < NUM_DOCS ? doc_length(d) : extra_kept;
            assert_int_equal(in[t] % STRIDE, 0);
            seen[d]++;
            for (int p = 0; p + 1 < n; p++) {
                assert_int_equal(in[t + p], d * STRIDE + p);
                assert_int_equal(pos[t + p], p);
                assert_int_equal(tg[t + p], ((p + 1) % 3) != 1 ? d * STRIDE + p + 1 : -1);
            }
            t += n - 1;
        }
    }
    for (int d = 0; d < NUM_DOCS; d++) assert_int_equal(seen[d], doc_length(d) >= 2 ? 1 : 0);
    if (extra_doc) assert_int_equal(seen[NUM_DOCS], 1);
}

static void test_packed_rows(void **state) {
    char prefix[512], err[1024];
    make_sft_dataset("plain", 0, prefix, sizeof prefix);
    DataLoader *loader = packed_loader(prefix, PACK_OVERLONG_ERROR, err, sizeof err);
    assert_non_null(loader);
    assert_true(data_loader_packed(loader));
    assert_true(data_loader_has_mask(loader));
    check_rows(loader, 0, 0);
    data_loader_free(loader);
}

static void test_overlong(void **state) {
    char prefix[512], err[1024];
    make_sft_dataset("long", SEQ_LEN + 5, prefix, sizeof prefix);
    assert_null(packed_loader(prefix, PACK_OVERLONG_ERROR, err, sizeof err));
    if (!strstr(err, "1 document is longer than train.seq_len + 1 = 17 tokens (the first, document 40; the longest 21 "
                     "tokens): packed samples are never split; raise train.seq_len to 20 for all of them"))
        fail_msg("%s", err);
    assert_non_null(strstr(err, "data.pack_overlong: truncate"));
    DataLoader *loader = packed_loader(prefix, PACK_OVERLONG_TRUNCATE, err, sizeof err);
    assert_non_null(loader);
    check_rows(loader, 1, SEQ_LEN + 1);
    data_loader_free(loader);
}

/* Alone, the loader's rows are packed_rows_build's over the whole dataset
 * with the train split's seed 7 ^ 0x9e3779b97f4a7c15, read in its order,
 * which is shuffled (most rows away from their packing place). */
static void test_one_dataset_rows(void **state) {
    char prefix[512], err[1024];
    make_sft_dataset("alone", 0, prefix, sizeof prefix);
    DataLoader *loader = packed_loader(prefix, PACK_OVERLONG_ERROR, err, sizeof err);
    assert_non_null(loader);
    IndexedDataset ds, mask;
    char mask_prefix[600];
    snprintf(mask_prefix, sizeof mask_prefix, "%s_mask", prefix);
    assert_int_equal(indexed_dataset_open(&ds, prefix, err, sizeof err), 0);
    assert_int_equal(indexed_dataset_open(&mask, mask_prefix, err, sizeof err), 0);
    PackedRows rows;
    assert_int_equal(packed_rows_build(&rows, &ds, "data.train", 0, NUM_DOCS, SEQ_LEN, PACK_OVERLONG_ERROR,
                                       7 ^ 0x9e3779b97f4a7c15ULL, err, sizeof err), 0);
    assert_int_equal(data_loader_num_samples(loader), rows.num_rows);
    /* the rows are read shuffled, not in first-fit-decreasing order (the longest documents' rows first) */
    int64_t in_place = 0;
    for (int64_t i = 0; i < rows.num_rows; i++) in_place += rows.order[i] == i;
    assert_true(rows.num_rows >= 8 && in_place < rows.num_rows / 2);
    int32_t in[2][SEQ_LEN], tg[2][SEQ_LEN], pos[2][SEQ_LEN], scratch[SEQ_LEN + 1];
    for (int64_t i = 0; i < 2 * rows.num_rows; i++) { /* twice: the order repeats */
        data_loader_get_packed(loader, i, in[0], tg[0], pos[0]);
        packed_rows_read(&rows, &ds, &mask, i, in[1], tg[1], pos[1], scratch);
        assert_memory_equal(in[0], in[1], sizeof in[0]);
        assert_memory_equal(tg[0], tg[1], sizeof tg[0]);
        assert_memory_equal(pos[0], pos[1], sizeof pos[0]);
    }
    packed_rows_free(&rows);
    indexed_dataset_close(&mask);
    indexed_dataset_close(&ds);
    data_loader_free(loader);
}

/* Targets inside a document that are -1 in a row: not at a document's last
 * position (the next restarts at 0), nor in the padding (input 0, a token
 * no kept document has here: the only document starting with 0 has one token). */
static int masked_inside(const int32_t *in, const int32_t *tg, const int32_t *pos) {
    int masked = 0;
    for (int t = 0; t + 1 < SEQ_LEN; t++) masked += in[t] != 0 && pos[t + 1] == pos[t] + 1 && tg[t] == -1;
    return masked;
}

static void test_blend_3_to_1(void **state) {
    enum { N = 200 }; /* more than either dataset's rows: both wrap */
    char a[512], b[512], err[1024];
    write_sft_dataset("blend_masked", 0, 0, a, sizeof a);
    write_sft_dataset("blend_plain", 0, 1, b, sizeof b);
    const char *const prefixes[] = {a, b};
    const double weights[] = {3.0, 1.0};
    DataLoader *blend = packed_blend(2, prefixes, weights, PACK_OVERLONG_ERROR, N, err, sizeof err);
    assert_non_null(blend);
    assert_true(data_loader_packed(blend));
    assert_true(data_loader_has_mask(blend));
    assert_int_equal(data_loader_num_samples(blend), N);
    DataLoader *alone[2];
    for (int d = 0; d < 2; d++) {
        alone[d] = packed_loader(prefixes[d], PACK_OVERLONG_ERROR, err, sizeof err);
        assert_non_null(alone[d]);
        assert_true(data_loader_num_samples(alone[d]) < N / 4);
    }
    assert_false(data_loader_has_mask(alone[1]));

    const double normalised[] = {0.75, 0.25};
    BlendIndex blend_index;
    blend_index_build(&blend_index, normalised, 2, N);
    int count[2] = {0, 0}, masked[2] = {0, 0};
    for (int64_t i = 0; i < 2 * N; i++) { /* the second pass: sample i + N is sample i */
        int32_t in[2][SEQ_LEN], tg[2][SEQ_LEN], pos[2][SEQ_LEN];
        int64_t in_dataset;
        const int d = blend_index_get(&blend_index, i % N, &in_dataset);
        data_loader_get_packed(blend, i, in[0], tg[0], pos[0]);
        data_loader_get_packed(alone[d], in_dataset, in[1], tg[1], pos[1]);
        assert_memory_equal(in[0], in[1], sizeof in[0]);
        assert_memory_equal(tg[0], tg[1], sizeof tg[0]);
        assert_memory_equal(pos[0], pos[1], sizeof pos[0]);
        assert_int_equal(in[0][0] >= OTHER_BASE, d); /* the row is of dataset d */
        if (i < N) count[d]++, masked[d] += masked_inside(in[0], tg[0], pos[0]);
    }
    assert_int_equal(count[0], 150); /* 3:1 of 200 rows, as the greedy rule gives it */
    assert_int_equal(count[1], 50);
    for (int n = 1; n <= N; n++) { /* and within one of the weights over every prefix of the samples */
        int first = 0;
        for (int i = 0; i < n; i++) first += blend_index.dataset[i] == 0;
        assert_true(first >= 0.75 * n - 1 && first <= 0.75 * n + 1);
    }
    assert_true(masked[0] > 0);      /* the first dataset's loss mask applies to its rows */
    assert_int_equal(masked[1], 0); /* the second has none: every target inside a document counts */
    blend_index_free(&blend_index);
    for (int d = 0; d < 2; d++) data_loader_free(alone[d]);
    data_loader_free(blend);
}

static void test_blend_overlong(void **state) {
    char a[512], b[512], err[1024];
    write_sft_dataset("over_a", 0, 0, a, sizeof a);
    write_sft_dataset("over_b", SEQ_LEN + 5, 1, b, sizeof b);
    const char *const prefixes[] = {a, b};
    const double weights[] = {1.0, 1.0};
    assert_null(packed_blend(2, prefixes, weights, PACK_OVERLONG_ERROR, 10, err, sizeof err));
    char want[700];
    snprintf(want, sizeof want, "data.train[1] %s: 1 document is longer than train.seq_len + 1 = 17 tokens (the first, "
             "document 40", b);
    assert_non_null(strstr(err, want));
    DataLoader *loader = packed_blend(2, prefixes, weights, PACK_OVERLONG_TRUNCATE, 10, err, sizeof err);
    assert_non_null(loader);
    data_loader_free(loader);
}

/* A packed blend without weights weighs each dataset by its rows (Megatron weighs a --data-path without weights by
 * each dataset's length, here its rows), not by its raw tokens: a long document truncated to seq_len + 1 counts
 * what is kept. */
static void test_blend_by_rows(void **state) {
    (void)state;
    char a[512], b[512], err[1024];
    write_sft_dataset("rows_a", 0, 0, a, sizeof a);
    write_sft_dataset("rows_b", 60, 1, b, sizeof b); /* its document 40 of 60 tokens keeps 17 */
    const double none[] = {0.0, 0.0}, one = 1.0;
    int64_t rows[2];
    const char *const prefixes[] = {a, b};
    for (int d = 0; d < 2; d++) {
        DataLoader *alone = packed_blend(1, &prefixes[d], &one, PACK_OVERLONG_TRUNCATE, 1, err, sizeof err);
        assert_non_null(alone);
        rows[d] = data_loader_num_samples(alone);
        data_loader_free(alone);
    }
    enum { N = 2000 };
    DataLoader *blend = packed_blend(2, prefixes, none, PACK_OVERLONG_TRUNCATE, N, err, sizeof err);
    if (!blend) fail_msg("%s", err);
    int count_b = 0;
    for (int64_t i = 0; i < N; i++) {
        int32_t in[SEQ_LEN], tg[SEQ_LEN], pos[SEQ_LEN];
        data_loader_get_packed(blend, i, in, tg, pos);
        count_b += in[0] >= OTHER_BASE;
    }
    const double share = (double)rows[1] / (double)(rows[0] + rows[1]);
    if (!(count_b >= share * N - 1 && count_b <= share * N + 1))
        fail_msg("dataset b: %d of %d rows, its rows' share %.4f (%lld and %lld rows)", count_b, N, share,
                 (long long)rows[0], (long long)rows[1]);
    data_loader_free(blend);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ffd_known),
        cmocka_unit_test(test_ffd_random),
        cmocka_unit_test(test_packed_rows),
        cmocka_unit_test(test_overlong),
        cmocka_unit_test(test_one_dataset_rows),
        cmocka_unit_test(test_blend_3_to_1),
        cmocka_unit_test(test_blend_overlong),
        cmocka_unit_test(test_blend_by_rows),
    };
    return cmocka_run_group_tests(tests, work_dir_setup, work_dir_teardown);
}
