/* test_comm.c: comm_all_reduce_max_float (src/dist/comm.h) against a plain
 * reference, bit for bit. Run alone it checks the group of one rank (a no-op:
 * every bit kept, NaN payloads and -0 included); tests/integration/
 * test_comm_mpi.sh runs it under mpirun on 2, 3 and 4 ranks, where it checks
 * 10007 elements (a prime count) holding both signs, +-0, +-inf, subnormals,
 * NaN on one rank only (quiet, negative, signalling) and NaN on every rank
 * against the reference max (NaN wins as NAN, -0 below +0), the same on
 * every rank; then a second reduction of the result (the values come back
 * as they were), a split into even and odd ranks (one group of one rank
 * on 3 ranks), one element and no elements. Each test runs its collectives
 * before its checks, so a failure on one rank leaves the others in step. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/float16.h"
#include "dist/comm.h"

enum { COUNT = 10007, KINDS = 13 };

static uint32_t mix(uint32_t x) { /* lowbias32 */
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

/* A finite float of either sign from the whole range (never inf or NaN). */
static float any_finite(uint32_t seed) {
    uint32_t b = mix(seed);
    if ((b & 0x7f800000U) == 0x7f800000U) b &= ~0x00800000U;
    return bits_f32(b);
}

/* Rank r's element i in a group of n ranks. Element i's kind is i % KINDS; `who` = (i / KINDS) % n is the rank
 * that differs in the kinds where one rank does. */
static float value(int r, size_t i, int n) {
    const uint32_t seed = (uint32_t)i * 4099U + (uint32_t)r * 7U + 1U;
    const int who = (int)((i / KINDS) % (size_t)n), variant = (int)((i / KINDS) % 3);
    switch (i % KINDS) {
    case 0: /* NaN on one rank only: quiet, negative quiet, signalling */
        if (r != who) return any_finite(seed);
        return bits_f32(variant == 0 ? 0x7fc00000U : variant == 1 ? 0xffc00000U : 0x7f800001U);
    case 1: return -0.0f;                          /* -0 everywhere */
    case 2: return r == who ? 0.0f : -0.0f;        /* +0 on one rank */
    case 3: return r == who ? INFINITY : any_finite(seed);
    case 4: return -INFINITY;
    case 5: return bits_f32(mix(seed) & 0x807fffffU); /* subnormals (and zeros) of either sign */
    case 6: return bits_f32(0x7fc00000U | (mix(seed) & 0x803fffffU)); /* NaN on every rank, payloads differ */
    case 7: return r == who ? 1.5f : -1.5f;
    case 8: return 3.0f;                           /* equal on every rank */
    case 9: return -fabsf(any_finite(seed));           /* all negative */
    default: return any_finite(seed);
    }
}

/* a after b in the order the max documents: -0 below +0 (no NaN here). */
static int above(float a, float b) { return a > b || (a == b && !signbit(a) && signbit(b)); }

/* The max over ranks ranks[0..n) of element i (values of a group of `of` ranks): NAN if any is NaN. */
static float reference(const int *ranks, int n, size_t i, int of) {
    float m = value(ranks[0], i, of);
    for (int k = 0; k < n; k++) {
        const float v = value(ranks[k], i, of);
        if (isnan(v)) return NAN;
        if (above(v, m)) m = v;
    }
    return m;
}

/* Elements of buf that are not ref's bits (or, for a group of one rank, the rank's own values); prints the first. */
static int mismatches(const float *buf, size_t count, const int *ranks, int n, int rank, int of) {
    int bad = 0;
    for (size_t i = 0; i < count; i++) {
        const float want = n == 1 ? value(rank, i, of) : reference(ranks, n, i, of);
        if (f32_bits(buf[i]) == f32_bits(want)) continue;
        if (bad++ == 0)
            fprintf(stderr, "rank %d: element %zu (kind %zu): 0x%08x, expected 0x%08x\n", rank, i, i % KINDS,
                    (unsigned)f32_bits(buf[i]), (unsigned)f32_bits(want));
    }
    return bad;
}

static float *values_of(int rank, int of) {
    float *buf = malloc(COUNT * sizeof(float));
    for (size_t i = 0; i < COUNT; i++) buf[i] = value(rank, i, of);
    return buf;
}

static void test_max_world(void **state) {
    const Comm *w = comm_world();
    int *all = malloc((size_t)w->size * sizeof(int));
    for (int r = 0; r < w->size; r++) all[r] = r;
    float *buf = values_of(w->rank, w->size);
    comm_all_reduce_max_float(w, buf, COUNT);
    float *again = malloc(COUNT * sizeof(float));
    memcpy(again, buf, COUNT * sizeof(float));
    comm_all_reduce_max_float(w, again, COUNT); /* every rank holds the result: the same bits again */
    const int bad = mismatches(buf, COUNT, all, w->size, w->rank, w->size);
    const int bad_again = mismatches(again, COUNT, all, w->size, w->rank, w->size);
    free(again);
    free(buf);
    free(all);
    assert_int_equal(bad, 0);
    assert_int_equal(bad_again, 0);
}

/* Even and odd world ranks, each its own group; on 3 ranks the odd group is one rank (a no-op). */
static void test_max_split(void **state) {
    const Comm *w = comm_world();
    Comm sub;
    comm_split(w, w->rank % 2, w->rank, &sub);
    int *mine = malloc((size_t)w->size * sizeof(int)), n = 0;
    for (int r = w->rank % 2; r < w->size; r += 2) mine[n++] = r;
    float *buf = values_of(w->rank, w->size);
    comm_all_reduce_max_float(&sub, buf, COUNT);
    const int size = sub.size, bad = mismatches(buf, COUNT, mine, n, w->rank, w->size);
    comm_free(&sub);
    free(buf);
    free(mine);
    assert_int_equal(size, n);
    assert_int_equal(bad, 0);
}

/* One element, NaN on the last rank only; then no elements (buf untouched). */
static void test_max_one_and_none(void **state) {
    const Comm *w = comm_world();
    float one = w->rank == w->size - 1 && w->size > 1 ? bits_f32(0xff800123U) : (float)w->rank;
    comm_all_reduce_max_float(w, &one, 1);
    float none = 7.0f;
    comm_all_reduce_max_float(w, &none, 0);
    if (w->size > 1)
        assert_int_equal(f32_bits(one), f32_bits(NAN));
    else
        assert_true(one == 0.0f && !signbit(one));
    assert_true(none == 7.0f);
}

int main(int argc, char **argv) {
    dist_init(&argc, &argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_max_world),
        cmocka_unit_test(test_max_split),
        cmocka_unit_test(test_max_one_and_none),
    };
    const int failed = cmocka_run_group_tests(tests, NULL, NULL);
    return dist_finish(failed ? 1 : 0);
}
