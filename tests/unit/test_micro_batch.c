/* test_micro_batch.c: micro_batch_load (src/data/micro_batch.c), the one
 * reader of a run's batches and `megatrain eval`'s. On a dataset with a
 * loss mask: inputs are a sample's first seq_len tokens, targets the next
 * token or -1 where the mask says 0, and micro_batch_counted counts the
 * mask's ones; without the mask every target is the next token; a cp cut
 * (positions) takes those positions of each sample; packed rows give the
 * loader's inputs, targets and places. A token outside the vocabulary past
 * the reach of data_loader_check_vocab (its max_tokens, 2^24 in a run,
 * lowered here) is caught when its sample is read, plain or packed: the
 * sample is refused (inputs 0, targets -1) with the check's message naming
 * the dataset, the token, its sequence and place; the other samples are
 * untouched. micro_batch_load_part (an evaluation's last, partial batch)
 * reads its samples as micro_batch_load and pads the rest with masked
 * samples. */
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

/* Where write_dataset puts its bad token: the tokens before it lie in every vocabulary above 30000. */
#define BAD_DOC 20
#define BAD_POS 3
#define VOCAB 30000

/* Document d: 2 + (d * 5) % 13 tokens, token p = d * STRIDE + p, mask (p % 3 != 1) when with_mask; token
 * bad_pos of document BAD_DOC is `bad` unless that is 0. */
static void write_dataset(const char *name, bool with_mask, int32_t bad, int bad_pos, char *prefix, size_t len) {
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
        if (bad && d == BAD_DOC) tokens[bad_pos] = bad;
        assert_int_equal(indexed_dataset_writer_add_document(w, tokens, n), 0);
        if (m) assert_int_equal(indexed_dataset_writer_add_document(m, mask, n), 0);
    }
    assert_int_equal(indexed_dataset_writer_finish(w, err, sizeof err), 0);
    if (m) assert_int_equal(indexed_dataset_writer_finish(m, err, sizeof err), 0);
}

static void make_dataset(const char *name, bool with_mask, char *prefix, size_t len) {
    write_dataset(name, with_mask, 0, 0, prefix, len);
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

/* micro_batch_load_part (an evaluation's last partial batch): the first `count` samples as micro_batch_load reads
 * them, the places after them padding that counts nothing (every target -1; inputs and places of sample `first`,
 * which the batch read already); `empty` says of the counted samples only. Plain, masked and packed. */
static void test_partial_batch(void **state) {
    char masked[512], plain[512];
    make_dataset("part_masked", true, masked, sizeof masked);
    make_dataset("part_plain", false, plain, sizeof plain);
    for (int kind = 0; kind < 3; kind++) {
        DataLoader *loader = loader_of(kind == 1 ? plain : masked, kind == 2);
        MicroBatch whole, part;
        micro_batch_init(&whole, B, SEQ_LEN, SEQ_LEN);
        micro_batch_init(&part, B, SEQ_LEN, SEQ_LEN);
        for (int count = 1; count <= B; count++) {
            const int64_t first = 5;
            micro_batch_load(&whole, loader, first);
            const int32_t *places = micro_batch_load_part(&part, loader, first, count);
            assert_true((places != NULL) == (kind == 2));
            const size_t row = SEQ_LEN * sizeof(int32_t);
            assert_memory_equal(part.inputs, whole.inputs, (size_t)count * row);
            assert_memory_equal(part.targets, whole.targets, (size_t)count * row);
            long counted = 0;
            for (long i = 0; i < (long)count * SEQ_LEN; i++) counted += whole.targets[i] >= 0;
            assert_int_equal(micro_batch_counted(&part), counted);
            for (int b = count; b < B; b++) {
                assert_memory_equal(part.inputs + b * SEQ_LEN, whole.inputs, row);
                if (kind == 2) assert_memory_equal(part.places + b * SEQ_LEN, whole.places, row);
                for (int t = 0; t < SEQ_LEN; t++) assert_int_equal(part.targets[b * SEQ_LEN + t], -1);
            }
            assert_false(part.empty);
            if (count == B) assert_memory_equal(part.targets, whole.targets, (size_t)B * row);
        }
        micro_batch_free(&whole);
        micro_batch_free(&part);
        data_loader_free(loader);
    }
}

/* Tokens of documents 0 .. BAD_DOC - 1: the bad token is the first after them. */
static int64_t tokens_before_bad(void) {
    int64_t n = 0;
    for (int d = 0; d < BAD_DOC; d++) n += 2 + (d * 5) % 13;
    return n;
}

/* Whether the sample or row of loader `index` holds token `bad` (read without a vocabulary: nothing refused): a
 * packed row holds document BAD_DOC whole, with its first token (BAD_DOC * STRIDE) among the inputs. */
static bool holds(const DataLoader *plain, int64_t index, int32_t bad) {
    int32_t a[SEQ_LEN + 1], b[SEQ_LEN], c[SEQ_LEN];
    if (data_loader_packed(plain)) {
        assert_int_equal(data_loader_get_packed(plain, index, a, b, c), 0);
        for (int t = 0; t < SEQ_LEN; t++)
            if (a[t] == BAD_DOC * STRIDE) return true;
        return false;
    }
    assert_int_equal(data_loader_get(plain, index, a), 0);
    for (int t = 0; t <= SEQ_LEN; t++)
        if (a[t] == bad) return true;
    return false;
}

/* The dataset with token `bad` at position `pos` of document BAD_DOC (> 0), plain or packed:
 * data_loader_check_vocab passes while its limit stops short of the token, and names it once it reaches it;
 * every micro-batch of a loader told the vocabulary refuses exactly the samples holding it (inputs 0, targets -1,
 * the check's message kept), the others as without the check. */
static void check_refusal(int32_t bad, bool pack, int pos) {
    char prefix[512], name[64], err[3072];
    snprintf(name, sizeof name, "bad%d-%d%s", (int)bad, pos, pack ? "-packed" : "");
    write_dataset(name, true, bad, pos, prefix, sizeof prefix);
    DataLoader *loader = loader_of(prefix, pack), *plain = loader_of(prefix, pack);
    assert_int_equal(data_loader_check_vocab(loader, VOCAB, tokens_before_bad() + pos, err, sizeof err), 0);
    assert_int_equal(data_loader_check_vocab(loader, VOCAB, tokens_before_bad() + pos + 1, err, sizeof err), -1);
    char expected[3072];
    snprintf(expected, sizeof expected, "%s: token %d (token %d of sequence %d) is outside the model's vocabulary "
             "[0, %d): was the dataset built with another tokenizer than the model's? (`megatrain data inspect %s "
             "--tokenizer MODEL_DIR` shows its ids)", prefix, (int)bad, pos, BAD_DOC, VOCAB, prefix);
    assert_string_equal(err, expected);
    data_loader_set_vocab(loader, VOCAB);
    const int64_t n = data_loader_num_samples(loader);
    MicroBatch mb, ref;
    micro_batch_init(&mb, 1, SEQ_LEN, SEQ_LEN);
    micro_batch_init(&ref, 1, SEQ_LEN, SEQ_LEN);
    int64_t a_refused = -1, a_clean = -1;
    for (int64_t i = 0; i < n; i++) {
        mb.refused[0] = '\0';
        micro_batch_load(&mb, loader, i);
        micro_batch_load(&ref, plain, i);
        assert_string_equal(ref.refused, "");
        if (!holds(plain, i, bad)) {
            a_clean = i;
            assert_string_equal(mb.refused, "");
            assert_memory_equal(mb.inputs, ref.inputs, SEQ_LEN * sizeof(int32_t));
            assert_memory_equal(mb.targets, ref.targets, SEQ_LEN * sizeof(int32_t));
            continue;
        }
        a_refused = i;
        assert_string_equal(mb.refused, expected);
        assert_int_equal(data_loader_check_sample(loader, i, err, sizeof err), -1);
        assert_string_equal(err, expected);
        for (int t = 0; t < SEQ_LEN; t++) {
            assert_int_equal(mb.inputs[t], 0);
            assert_int_equal(mb.targets[t], -1);
        }
        assert_int_equal(micro_batch_counted(&mb), 0);
    }
    assert_true(a_refused >= 0 && a_clean >= 0);
    /* a refusal is kept over later loads */
    mb.refused[0] = '\0';
    micro_batch_load(&mb, loader, a_refused);
    micro_batch_load(&mb, loader, a_clean);
    assert_string_equal(mb.refused, expected);
    micro_batch_free(&mb);
    micro_batch_free(&ref);
    data_loader_free(loader);
    data_loader_free(plain);
}

static void test_refused_token(void **state) {
    const int last = SEQ_LEN; /* the last token of document BAD_DOC (11 tokens) a packed row keeps (truncated to
                               * SEQ_LEN + 1): a target only, where -1 reads as a masked one */
    check_refusal(VOCAB, false, BAD_POS);      /* the first id past the vocabulary */
    check_refusal(-7, false, BAD_POS);         /* a negative id (int32 data) */
    check_refusal(VOCAB + 123, true, BAD_POS); /* a packed row */
    check_refusal(-7, true, BAD_POS);
    check_refusal(-1, true, last);
    check_refusal(-1, false, last);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_masked_and_plain),
        cmocka_unit_test(test_packed),
        cmocka_unit_test(test_refused_token),
        cmocka_unit_test(test_partial_batch),
    };
    return cmocka_run_group_tests(tests, work_dir_setup, work_dir_teardown);
}
