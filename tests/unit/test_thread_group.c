/* test_thread_group.c: the collectives among threads of one process
 * (src/dist/thread_group.h) that the GPU tests of tensor parallel run on:
 * 1, 3 and 4 ranks, each operation several times in a row (the barriers keep
 * a later call from overwriting a buffer another rank still reads), sums in
 * rank order (the same bits on every rank), gathers and reduce-scatters in
 * rank-block order, all-to-all-v with uneven (and empty) blocks. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dist/thread_group.h"

enum { COUNT = 1000, ROUNDS = 5, MAX_RANKS = 4 };

typedef struct Rank {
    ThreadGroup *group;
    int rank, size;
    int errors;
} Rank;

/* A value of rank r at element i, round k, with a fractional part so that sums round. */
static float value(int r, size_t i, int k) { return (float)(r + 1) * 0.1f + (float)i * 1e-3f + (float)k / 7.0f; }

static void *rank_main(void *arg) {
    Rank *me = arg;
    const int n = me->size;
    float *buf = malloc(COUNT * sizeof(float)), *send = malloc((size_t)n * COUNT * sizeof(float));
    float *recv = malloc((size_t)n * COUNT * sizeof(float));
    for (int k = 0; k < ROUNDS; k++) {
        for (size_t i = 0; i < COUNT; i++) buf[i] = value(me->rank, i, k);
        thread_group_sum(me->group, me->rank, buf, COUNT, 0.5f);
        for (size_t i = 0; i < COUNT; i++) {
            float s = 0.0f;
            for (int r = 0; r < n; r++) s += value(r, i, k);
            if (buf[i] != s * 0.5f) me->errors++; /* bit-exact: the rank-order sum */
        }
        thread_group_all_gather(me->group, me->rank, buf, recv, COUNT * sizeof(float));
        for (int r = 0; r < n; r++)
            if (memcmp(recv + (size_t)r * COUNT, buf, COUNT * sizeof(float)) != 0) me->errors++;
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < COUNT; i++) send[(size_t)r * COUNT + i] = value(me->rank, i, k + r);
        thread_group_reduce_scatter(me->group, me->rank, send, recv, COUNT);
        for (size_t i = 0; i < COUNT; i++) {
            float s = 0.0f;
            for (int r = 0; r < n; r++) s += value(r, i, k + me->rank);
            if (recv[i] != s) me->errors++;
        }
        const double total = thread_group_sum_double(me->group, me->rank, (double)(me->rank + 1) * (k + 1));
        if (total != (double)n * (n + 1) / 2 * (k + 1)) me->errors++;
        /* all-to-all-v: rank s sends rank r (s + 2 r + k) % 5 floats valued value(s, r * 10 + j, k) (none for some) */
        long sb[MAX_RANKS], rb[MAX_RANKS];
        size_t at = 0;
        for (int r = 0; r < n; r++) {
            const long cnt = (me->rank + 2 * r + k) % 5;
            for (long j = 0; j < cnt; j++) send[at++] = value(me->rank, (size_t)(r * 10 + j), k);
            sb[r] = cnt * (long)sizeof(float);
            rb[r] = (long)((r + 2 * me->rank + k) % 5) * (long)sizeof(float);
        }
        thread_group_all_to_all_v(me->group, me->rank, send, sb, recv, rb);
        at = 0;
        for (int s = 0; s < n; s++)
            for (long j = 0; j < rb[s] / (long)sizeof(float); j++)
                if (recv[at++] != value(s, (size_t)(me->rank * 10 + j), k)) me->errors++;
    }
    free(buf);
    free(send);
    free(recv);
    return NULL;
}

static void run_group(int size) {
    ThreadGroup *g = thread_group_create(size);
    assert_int_equal(thread_group_size(g), size);
    pthread_t threads[MAX_RANKS];
    Rank ranks[MAX_RANKS];
    for (int r = 0; r < size; r++) {
        ranks[r] = (Rank){.group = g, .rank = r, .size = size};
        assert_int_equal(pthread_create(&threads[r], NULL, rank_main, &ranks[r]), 0);
    }
    for (int r = 0; r < size; r++) {
        pthread_join(threads[r], NULL);
        assert_int_equal(ranks[r].errors, 0);
    }
    thread_group_free(g);
}

static void test_one_rank(void **state) { run_group(1); }
static void test_three_ranks(void **state) { run_group(3); }
static void test_four_ranks(void **state) { run_group(4); }

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_rank),
        cmocka_unit_test(test_three_ranks),
        cmocka_unit_test(test_four_ranks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
