/* test_megatron_data.c: megatrain's data against megatron-core 0.16.1's own code (tests/fixtures/megatron,
 * made by make_data_fixture.py; README.md there).
 *
 * - indexed.txt: every dataset under tests/fixtures/megatron/indexed as megatron-core's IndexedDataset reads it;
 *   megatrain's reader must give the same dtype, sequence lengths and pointers, document indices and tokens.
 *   The mc_* datasets were written by megatron-core's IndexedDatasetBuilder (int32, uint16, empty documents,
 *   documents of several sequences, a merge by add_index); the mt_* ones by `megatrain data build`
 *   (test_megatron_data.sh checks that data build still writes those bytes). Also DType.optimal_dtype against
 *   data_build_token_dtype.
 * - split_blend.txt: the shares megatron-core gives a --split string (its builder's rounding of the cumulative
 *   bounds) against gpt_split_bounds, which rounds as Megatron's legacy get_train_valid_test_split_ does: the
 *   difference docs/megatron.md describes, at most one document at a boundary; normalize() of blend weights,
 *   bit for bit; helpers.build_blending_indices' dataset of every sample against blend_index_build; and the
 *   samples each dataset is asked for (megatrain's never fewer than the blend draws).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "data/blend.h"
#include "data/data_build.h"
#include "data/gpt_sampling.h"
#include "data/indexed_dataset.h"

#define DIR "tests/fixtures/megatron/"
#define REMAKE "python tests/fixtures/megatron/make_data_fixture.py"

static FILE *open_fixture(const char *name) {
    FILE *f = fopen(name, "r");
    if (!f) fail_msg("%s: cannot open (run from the repository root; `%s` remakes it)", name, REMAKE);
    char line[256];
    if (!fgets(line, sizeof line, f) || !strstr(line, "megatron-core 0.16.1"))
        fail_msg("%s: the first line does not name megatron-core 0.16.1: %s", name, line);
    return f;
}

/* Reads the next line of f into *line (grown as needed); 0 at the end. */
static int next_line(FILE *f, char **line, size_t *cap) { return getline(line, cap, f) > 0; }

/* The numbers after the first word of line (strtod: integers, exact below 2^53, and hex floats) into out;
 * returns how many. */
static int64_t numbers_after_word(const char *line, double *out, int64_t max) {
    const char *p = strchr(line, ' ');
    int64_t n = 0;
    while (p && *p && *p != '\n') {
        char *end;
        double v = strtod(p, &end);
        if (end == p) break;
        if (n >= max) fail_msg("more than %lld numbers: %.80s", (long long)max, line);
        out[n++] = v;
        p = end;
    }
    return n;
}

static void test_indexed_datasets(void **state) {
    (void)state;
    FILE *f = open_fixture(DIR "indexed.txt");
    char *line = NULL;
    size_t cap = 0;
    int datasets = 0, dtypes = 0;
    enum { MAXN = 4096 };
    double *v = malloc(MAXN * sizeof *v);
    IndexedDataset ds;
    int open = 0;
    char name[128] = "";
    while (next_line(f, &line, &cap)) {
        if (line[0] == '#') continue;
        long long a, b, c;
        if (sscanf(line, "dtype %lld %lld", &a, &b) == 2) {
            if (data_build_token_dtype(a) != b)
                fail_msg("%lld ids: megatrain writes dtype %d, megatron-core's optimal_dtype %lld", a,
                         data_build_token_dtype(a), b);
            dtypes++;
            continue;
        }
        if (sscanf(line, "dataset %127s dtype=%lld sequences=%lld documents=%lld", name, &a, &b, &c) == 4) {
            if (open) indexed_dataset_close(&ds);
            char prefix[256], err[512];
            snprintf(prefix, sizeof prefix, DIR "indexed/%s", name);
            if (indexed_dataset_open(&ds, prefix, err, sizeof err) != 0) fail_msg("%s: %s", name, err);
            open = 1;
            datasets++;
            if (ds.dtype_code != a || ds.num_sequences != b || ds.num_documents_plus_one - 1 != c)
                fail_msg("%s: megatrain reads dtype %d, %lld sequences, %lld documents; megatron-core %lld, %lld, %lld",
                         name, ds.dtype_code, (long long)ds.num_sequences, (long long)ds.num_documents_plus_one - 1,
                         a, b, c);
            continue;
        }
        assert_true(open);
        const int64_t n = numbers_after_word(line, v, MAXN);
        if (strncmp(line, "lengths", 7) == 0 || strncmp(line, "pointers", 8) == 0) {
            const int lengths = line[0] == 'l';
            assert_int_equal(n, ds.num_sequences);
            for (int64_t i = 0; i < n; i++) {
                const int64_t got = lengths ? indexed_length(&ds, i) : indexed_offset(&ds, i);
                if (got != v[i])
                    fail_msg("%s: sequence %lld: megatrain reads %s %lld, megatron-core %lld", name, (long long)i,
                             lengths ? "length" : "pointer", (long long)got, (long long)v[i]);
            }
        } else if (strncmp(line, "document_indices", 16) == 0) {
            assert_int_equal(n, ds.num_documents_plus_one);
            for (int64_t j = 0; j < n; j++)
                if (indexed_document(&ds, j) != v[j])
                    fail_msg("%s: document index %lld: megatrain %lld, megatron-core %lld", name, (long long)j,
                             (long long)indexed_document(&ds, j), (long long)v[j]);
        } else if (strncmp(line, "seq ", 4) == 0) {
            const int64_t s = (int64_t)v[0], len = n - 1;
            assert_true(s >= 0 && s < ds.num_sequences);
            if (indexed_length(&ds, s) != len)
                fail_msg("%s: sequence %lld: %lld tokens, megatron-core %lld", name, (long long)s,
                         (long long)indexed_length(&ds, s), (long long)len);
            int32_t tokens[MAXN];
            indexed_dataset_read(&ds, s, 0, len, tokens);
            for (int64_t t = 0; t < len; t++)
                if (tokens[t] != v[1 + t])
                    fail_msg("%s: sequence %lld token %lld: megatrain %d, megatron-core %lld", name, (long long)s,
                             (long long)t, tokens[t], (long long)v[1 + t]);
        } else {
            fail_msg("indexed.txt: unexpected line %.80s", line);
        }
    }
    if (open) indexed_dataset_close(&ds);
    assert_int_equal(datasets, 7);
    assert_true(dtypes >= 10);
    free(v);
    free(line);
    fclose(f);
}

/* A share of split_blend.txt: "B:E", "empty" (built, no sequences) or "-" (not built): [*b, *e), empty as 0:0. */
static void parse_share(const char *word, int64_t *b, int64_t *e) {
    long long x, y;
    if (sscanf(word, "%lld:%lld", &x, &y) == 2) {
        *b = x;
        *e = y;
    } else {
        assert_true(strcmp(word, "empty") == 0 || strcmp(word, "-") == 0);
        *b = *e = 0;
    }
}

static void test_split_shares(void **state) {
    (void)state;
    FILE *f = open_fixture(DIR "split_blend.txt");
    char *line = NULL;
    size_t cap = 0;
    int cases = 0, differ = 0, example = 0;
    while (next_line(f, &line, &cap)) {
        if (strncmp(line, "split ", 6) != 0) continue;
        char split[64], hex[3][40], share[3][40];
        long long n;
        if (sscanf(line, "split %63s %lld %39s %39s %39s %39s %39s %39s", split, &n, hex[0], hex[1], hex[2], share[0],
                   share[1], share[2]) != 8)
            fail_msg("split_blend.txt: bad line %.80s", line);
        /* the string's numbers as Megatron reads them (its regex [.0-9]+), the shares left out 0 */
        double w[3] = {0, 0, 0};
        int k = 0;
        for (char *p = split; *p && k < 3; k++) {
            w[k] = strtod(p, &p);
            if (*p == ',') p++;
        }
        int64_t bounds[4];
        gpt_split_bounds(w, n, bounds);
        double sum = w[0] + w[1] + w[2];
        int same = 1;
        for (int i = 0; i < 3; i++) {
            const double expected = strtod(hex[i], NULL);
            if (w[i] / sum != expected) fail_msg("%s: share %d is %a, megatron-core's %a", split, i, w[i] / sum, expected);
            int64_t b, e;
            parse_share(share[i], &b, &e);
            const int64_t mb = bounds[i], me = bounds[i + 1];
            if (me - mb != e - b || (e > b && mb != b)) same = 0;
            /* a boundary one document apart at most (docs/megatron.md, "The split") */
            if (e > b && (llabs(mb - b) > 1 || llabs(me - e) > 1))
                fail_msg("%s of %lld: share %d is [%lld, %lld) in megatrain, [%lld, %lld) in megatron-core", split, n, i,
                         (long long)mb, (long long)me, (long long)b, (long long)e);
            if (e == b && llabs(me - mb) > 1)
                fail_msg("%s of %lld: share %d has %lld documents in megatrain, none in megatron-core", split, n, i,
                         (long long)(me - mb));
        }
        if (strcmp(split, "969,30,1") == 0 && n == 180) { /* the example of docs/megatron.md */
            example = 1;
            assert_true(bounds[1] == 175 && bounds[2] == 180 && bounds[3] == 180);
            assert_string_equal(share[0], "0:174");
            assert_string_equal(share[1], "174:180");
        }
        cases++;
        differ += !same;
    }
    assert_true(example);
    assert_true(cases > 300);
    print_message("split: %d cases, megatrain's shares are megatron-core's in %d, one document apart in %d\n", cases,
                  cases - differ, differ);
    free(line);
    fclose(f);
}

static const char DIGITS[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";

static void test_blends(void **state) {
    (void)state;
    FILE *f = open_fixture(DIR "split_blend.txt");
    char *line = NULL;
    size_t cap = 0;
    int cases = 0, asks_same = 0, normalized = 0;
    while (next_line(f, &line, &cap)) {
        int n;
        long long size;
        if (sscanf(line, "weights %d", &n) == 1) { /* normalize() alone, up to 256 datasets */
            double raw[256], expected[256];
            assert_true(n >= 1 && n <= 256);
            assert_int_equal(numbers_after_word(strchr(line, ' ') + 1, raw, 256), n);
            assert_true(next_line(f, &line, &cap) && strncmp(line, "normalized ", 11) == 0);
            assert_int_equal(numbers_after_word(line, expected, 256), n);
            blend_normalize(raw, n);
            for (int d = 0; d < n; d++)
                if (raw[d] != expected[d])
                    fail_msg("%d weights: weight %d normalised to %a, megatron-core's %a", n, d, raw[d], expected[d]);
            normalized++;
            continue;
        }
        if (sscanf(line, "blend %d %lld", &n, &size) != 2) continue;
        assert_true(n >= 1 && n <= 62);
        double raw[64], weights[64], expected[64];
        double asks[64], draws[64];
        /* the raw weights follow "blend N SIZE" */
        const char *p = strchr(strchr(line, ' ') + 1, ' ') + 1; /* "SIZE W1 ..." */
        assert_int_equal(numbers_after_word(p, raw, 64), n);
        memcpy(weights, raw, sizeof(double) * (size_t)n);
        blend_normalize(weights, n);
        assert_true(next_line(f, &line, &cap) && strncmp(line, "normalized ", 11) == 0);
        assert_int_equal(numbers_after_word(line, expected, 64), n);
        for (int d = 0; d < n; d++)
            if (weights[d] != expected[d])
                fail_msg("blend %d of %d datasets (%lld samples): weight %d normalised to %a, megatron-core's %a",
                         cases, n, size, d, weights[d], expected[d]);
        assert_true(next_line(f, &line, &cap) && strncmp(line, "asks ", 5) == 0);
        assert_int_equal(numbers_after_word(line, asks, 64), n);
        assert_true(next_line(f, &line, &cap) && strncmp(line, "draws ", 6) == 0);
        assert_int_equal(numbers_after_word(line, draws, 64), n);
        assert_true(next_line(f, &line, &cap) && strncmp(line, "index ", 6) == 0);
        assert_true((long long)strlen(line + 6) >= size);
        BlendIndex b;
        blend_index_build(&b, weights, n, size);
        int64_t count[64] = {0};
        for (int64_t i = 0; i < size; i++) {
            const int want = (int)(strchr(DIGITS, line[6 + i]) - DIGITS);
            int64_t in_dataset;
            const int got = blend_index_get(&b, i, &in_dataset);
            if (got != want)
                fail_msg("blend %d of %d datasets: sample %lld goes to dataset %d, megatron-core's %d", cases, n,
                         (long long)i, got, want);
            assert_int_equal(in_dataset, count[got]); /* megatron-core's dataset_sample_index */
            count[got]++;
        }
        int same = 1;
        for (int d = 0; d < n; d++) {
            assert_int_equal(count[d], draws[d]);
            /* megatrain asks ceil(w * size * 1.005) (Megatron's legacy rule), megatron-core
             * ceil(ceil(w * size) * 1.005): at most one fewer, and never fewer than the blend draws */
            const int64_t mine = blend_samples_per_dataset(weights[d], size);
            if (mine < draws[d] || mine > asks[d] || mine < asks[d] - 1)
                fail_msg("blend %d: dataset %d: megatrain asks %lld samples, megatron-core %lld, the blend draws %lld",
                         cases, d, (long long)mine, (long long)asks[d], (long long)draws[d]);
            same &= mine == asks[d];
        }
        asks_same += same;
        blend_index_free(&b);
        cases++;
    }
    assert_true(cases >= 30 && normalized >= 3);
    print_message("blend: %d cases: every sample's dataset is megatron-core's; the samples asked of each dataset "
                  "are megatron-core's in %d\n", cases, asks_same);
    free(line);
    fclose(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_indexed_datasets),
        cmocka_unit_test(test_split_shares),
        cmocka_unit_test(test_blends),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
