/* test_micro_batch.c: micro_batch_load (src/data/micro_batch.c), the one
 * reader of a run's batches and `megatrain eval`'s. On a dataset with a
 * loss mask: inputs are a sample's first seq_len tokens, targets the next
 * token or -1 where the mask says 0, and micro_batch_counted counts the
 * mask's ones; without the mask every target is the next token; a cp cut
 * (positions) takes those positions of each sample; packed rows give the
 * loader's inputs, targets and places. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "data/data_loader.h"
#include "data/indexed_dataset.h"
#include "data/micro_batch.h"
#include "test_work_dir.h"

#define SEQ_LEN 8
#define STRIDE 1000
#define NUM_DOCS 30
#define B 3

/* Document d: 2 + (d * 5) % 13 tokens, token p = d * STRIDE + p, mask (p % 3 != 1) when with_mask. */
static void make_dataset(const char *name, bool with_mask, char *prefix, size_t len) {
    snprintf(prefix, len, "%s/%s", work_dir, name);
    char mask_prefix[600], err[512];
    snprintf(mask_prefix, sizeof mask_prefix, "%s_mask", prefix);
    IndexedDatasetWriter *w = indexed_dataset_writer_open(prefix, IDX_DTYPE_INT32, err, sizeof err);
    IndexedDatasetWriter *m = with_mask ? indexed_dataset_writer_open(mask_prefix, IDX_DTYPE_UINT8, err, sizeof err)
                                        : NULL;
    assert_non_null(w);
    assert_true(!with_mask || m);
    int32_t tokens[16], mask[16];
    for (int d = 0; d < NUM_DOCS; d++) {
        const int n = 2 + (d * 5) % 13;
        for (int p = 0; p < n; p++) tokens[p] = d * STRIDE + p, mask[p] = (p % 3) != 1;
        assert_int_equal(indexed_dataset_writer_add_document(w, tokens, n), 0);
        if (m) assert_int_equal(indexed_dataset_writer_add_document(m, mask, n), 0);
    }
    assert_int_equal(indexed_dataset_writer_finish(w, err, sizeof err), 0);
    if (m) assert_int_equal(indexed_dataset_writer_finish(m, err, sizeof err), 0);
}

static DataLoader *loader_of(const char *prefix, bool pack) {
    DataConfig data;
    memset(&data, 0, sizeof data);
    data.num_train = 1;
    snprintf(data.train[0].path, sizeof data.train[0].path, "%s", prefix);
    data.train[0].weight = 1.0;
    data.split[0] = 1.0;
    data.pack = pack;
    data.pack_overlong = PACK_OVERLONG_TRUNCATE;
    char err[1024];
    DataLoader *loader = data_loader_create(&data, SPLIT_TRAIN, SEQ_LEN, 11, 4 * B, err, sizeof err);
    if (!loader) fail_msg("%s", err);
    return loader;
}

/* Batches from sample `first` on, through a cut of `T` positions (NULL: all), against the loader's samples. */
static void check_plain(const DataLoader *loader, bool masked, const int32_t *cut, int T) {
    MicroBatch mb;
    micro_batch_init(&mb, B, SEQ_LEN, T);
    if (cut) memcpy(mb.positions, cut, (size_t)T * sizeof *cut);
    long masked_seen = 0;
    for (int64_t first = 0; first < 4 * B; first += B) {
        assert_null(micro_batch_load(&mb, loader, first));
        long counted = 0;
        for (int b = 0; b < B; b++) {
            int32_t sample[SEQ_LEN + 1];
            data_loader_get(loader, first + b, sample);
            for (int t = 0; t < T; t++) {
                const int p = cut ? cut[t] : t;
                const int32_t next = sample[p + 1];
                const bool counts = !masked || (next % STRIDE) % 3 != 1;
                assert_int_equal(mb.inputs[b * T + t], sample[p]);
                assert_int_equal(mb.targets[b * T + t], counts ? next : -1);
                counted += counts;
                masked_seen += !counts;
            }
        }
        assert_int_equal(micro_batch_counted(&mb), counted);
    }
    if (masked) assert_true(masked_seen > 0); /* the mask was really applied somewhere */
    micro_batch_free(&mb);
}

static void test_masked_and_plain(void **state) {
    char masked[512], plain[512];
    make_dataset("masked", true, masked, sizeof masked);
    make_dataset("plain", false, plain, sizeof plain);
    DataLoader *a = loader_of(masked, false), *b = loader_of(plain, false);
    assert_true(data_loader_has_mask(a));
    assert_false(data_loader_has_mask(b));
    check_plain(a, true, NULL, SEQ_LEN);
    check_plain(b, false, NULL, SEQ_LEN);
    const int32_t cut[] = {0, 1, 6, 7}; /* cp 2, rank 0: chunks 0 and 3 of 4 */
    check_plain(a, true, cut, 4);
    data_loader_free(a);
    data_loader_free(b);
}

static void test_packed(void **state) {
    char prefix[512];
    make_dataset("packed", true, prefix, sizeof prefix);
    DataLoader *loader = loader_of(prefix, true);
    assert_true(data_loader_packed(loader));
    MicroBatch mb;
    micro_batch_init(&mb, B, SEQ_LEN, SEQ_LEN);
    for (int64_t first = 0; first < 2 * B; first += B) {
        const int32_t *places = micro_batch_load(&mb, loader, first);
        assert_ptr_equal(places, mb.places);
        long counted = 0;
        for (int b = 0; b < B; b++) {
            int32_t in[SEQ_LEN], tg[SEQ_LEN], pos[SEQ_LEN];
            data_loader_get_packed(loader, first + b, in, tg, pos);
            assert_memory_equal(mb.inputs + b * SEQ_LEN, in, sizeof in);
            assert_memory_equal(mb.targets + b * SEQ_LEN, tg, sizeof tg);
            assert_memory_equal(places + b * SEQ_LEN, pos, sizeof pos);
            for (int t = 0; t < SEQ_LEN; t++) counted += tg[t] >= 0;
        }
        assert_int_equal(micro_batch_counted(&mb), counted);
        assert_true(counted < B * SEQ_LEN); /* masked targets and document ends are not counted */
    }
    micro_batch_free(&mb);
    data_loader_free(loader);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_masked_and_plain),
        cmocka_unit_test(test_packed),
    };
    return cmocka_run_group_tests(tests, work_dir_setup, work_dir_teardown);
}
