/* test_zero1.c: the distributed optimizer's split (src/dist/zero1.h) as its
 * buckets describe it, which the GPU's ZeRO-1 (src/model/cuda/
 * cuda_model_zero1.c) runs its collectives over: for flat arrays of several
 * sizes (one float, a bucket exactly, a bucket and one, several buckets and
 * a ragged tail) on groups of 1 to 5 ranks, with and without an expert
 * region over a smaller group:
 *   - the buckets tile [0, count) in flat order, region 0's before region
 *     1's, none larger than the bucket size, each share ceil(n / ranks);
 *   - the parts rank r owns by the buckets are exactly zero1_init's ranges
 *     (begin/end, in order) and their total is `owned`;
 *   - over the ranks of a group, the parts cover every float once;
 *   - the regions' groups and scales (1 / dp; expert_scale / edp). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dist/dp_sync.h"
#include "dist/zero1.h"

static const size_t BUCKET = DP_BUCKET_BYTES / sizeof(float);

/* Rank `rank` of a dp group of dp_size, an expert region [dense, count) over an edp group of edp_size (0: none). */
static void check_split(size_t count, size_t dense, int dp_size, int edp_size, int rank, unsigned char *covered) {
    Comm dp = {NULL, rank, dp_size}, edp = {NULL, edp_size ? rank % edp_size : 0, edp_size};
    Zero1 z;
    if (edp_size)
        zero1_init_split(&z, &dp, dense, &edp, count, 0.5f);
    else
        zero1_init(&z, &dp, count);
    const int nb = zero1_num_buckets(&z);
    size_t next = 0, owned = 0;
    int range = 0, last_region = 0;
    for (int i = 0; i < nb; i++) {
        const Zero1Bucket b = zero1_bucket(&z, i);
        assert_int_equal(b.at, next); /* the buckets tile the array in order */
        assert_true(b.n > 0 && b.n <= BUCKET);
        assert_true(b.region >= last_region);
        last_region = b.region;
        const Comm *g = zero1_region_group(&z, b.region);
        assert_ptr_equal(g, b.region == 0 ? &dp : &edp);
        assert_int_equal(b.share, (b.n + (size_t)g->size - 1) / (size_t)g->size);
        if (edp_size && count > dense) assert_int_equal(b.region, b.at >= dense); /* the experts' region */
        size_t begin = (size_t)g->rank * b.share, end = begin + b.share;
        if (begin > b.n) begin = b.n;
        if (end > b.n) end = b.n;
        if (end > begin) { /* this rank's part: the next of zero1_init's ranges */
            assert_true(range < z.num_ranges);
            assert_int_equal(z.begin[range], b.at + begin);
            assert_int_equal(z.end[range], b.at + end);
            range++;
            owned += end - begin;
            for (size_t k = b.at + begin; k < b.at + end; k++) covered[k]++;
        }
        next = b.at + b.n;
    }
    assert_int_equal(next, count);
    assert_int_equal(range, z.num_ranges);
    assert_int_equal(owned, z.owned);
    assert_true(zero1_region_scale(&z, 0) == 1.0f / (float)dp_size);
    if (edp_size && count > dense) assert_true(zero1_region_scale(&z, 1) == 0.5f / (float)edp_size);
    zero1_free(&z);
}

static void test_buckets_are_the_split(void **state) {
    (void)state;
    const size_t sizes[] = {1, 7, BUCKET, BUCKET + 1, 3 * BUCKET + 12345};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
        for (int dp = 1; dp <= 5; dp++) {
            const size_t count = sizes[s];
            unsigned char *covered = calloc(count, 1);
            for (int r = 0; r < dp; r++) check_split(count, count, dp, 0, r, covered);
            for (size_t k = 0; k < count; k++) assert_int_equal(covered[k], 1); /* every float once over dp */
            free(covered);
        }
}

static void test_expert_region(void **state) {
    (void)state;
    /* dp 4 = ep 2 x edp 2: the dense region over the 4, the experts over 2 (each edp group covers them once) */
    const size_t dense = BUCKET + 999, count = dense + 2 * BUCKET + 3;
    unsigned char *covered = calloc(count, 1);
    for (int r = 0; r < 2; r++) check_split(count, dense, 4, 2, r, covered); /* edp ranks 0, 1 */
    for (int r = 2; r < 4; r++) { /* the dense region's other two owners */
        unsigned char *other = calloc(count, 1);
        check_split(count, dense, 4, 2, r, other);
        for (size_t k = 0; k < dense; k++) covered[k] += other[k];
        free(other);
    }
    for (size_t k = 0; k < count; k++) assert_int_equal(covered[k], 1);
    free(covered);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets_are_the_split),
        cmocka_unit_test(test_expert_region),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
