/* test_grid.c: rank <-> coordinates and group members of the process grid
 * (Megatron order: tp fastest, then cp, dp, pp), checked without MPI against
 * group lists written out by hand from Megatron's initialize_model_parallel. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "dist/grid.h"

static void expect_members(const GridLayout *g, int rank, GridGroup group, const int *want, int n) {
    int got[64];
    int count = grid_group_members(g, rank, group, got);
    assert_int_equal(count, n);
    for (int i = 0; i < n; i++) assert_int_equal(got[i], want[i]);
}

/* tp2 cp1 dp2 pp2 on 8 ranks (Megatron's docstring example shape). */
static void test_tp2_dp2_pp2(void **state) {
    (void)state;
    GridLayout g;
    char err[256];
    assert_int_equal(grid_layout(8, 2, 1, 2, &g, err, sizeof err), 0);
    assert_int_equal(g.dp, 2);
    GridCoords c = grid_coords(&g, 5);
    assert_int_equal(c.tp, 1);
    assert_int_equal(c.cp, 0);
    assert_int_equal(c.dp, 0);
    assert_int_equal(c.pp, 1);
    /* Megatron: tp groups [0,1] [2,3] [4,5] [6,7]; dp groups [0,2] [1,3]
     * [4,6] [5,7]; pp groups [0,4] [1,5] [2,6] [3,7]; embedding = pp ends. */
    expect_members(&g, 5, GROUP_TP, (int[]){4, 5}, 2);
    expect_members(&g, 5, GROUP_DP, (int[]){5, 7}, 2);
    expect_members(&g, 5, GROUP_PP, (int[]){1, 5}, 2);
    expect_members(&g, 5, GROUP_CP, (int[]){5}, 1);
    expect_members(&g, 5, GROUP_EMBEDDING, (int[]){1, 5}, 2);
    expect_members(&g, 2, GROUP_DP, (int[]){0, 2}, 2);
    expect_members(&g, 3, GROUP_PP, (int[]){3, 7}, 2);
}

/* tp2 pp4 on 16 ranks (dp 2), Megatron's docstring: pipeline groups
 * [g0,g4,g8,g12] ..., embedding groups [g0,g12] .... */
static void test_tp2_pp4(void **state) {
    (void)state;
    GridLayout g;
    char err[256];
    assert_int_equal(grid_layout(16, 2, 1, 4, &g, err, sizeof err), 0);
    assert_int_equal(g.dp, 2);
    expect_members(&g, 8, GROUP_PP, (int[]){0, 4, 8, 12}, 4);
    expect_members(&g, 12, GROUP_EMBEDDING, (int[]){0, 12}, 2);
    expect_members(&g, 13, GROUP_EMBEDDING, (int[]){1, 13}, 2);
    expect_members(&g, 5, GROUP_EMBEDDING, (int[]){5}, 1); /* middle stage */
    expect_members(&g, 6, GROUP_DP, (int[]){4, 6}, 2);
    expect_members(&g, 6, GROUP_TP, (int[]){6, 7}, 2);
}

/* cp between tp and dp: tp2 cp2 dp2 pp1 on 8 ranks. */
static void test_cp_order(void **state) {
    (void)state;
    GridLayout g;
    char err[256];
    assert_int_equal(grid_layout(8, 2, 2, 1, &g, err, sizeof err), 0);
    GridCoords c = grid_coords(&g, 6);
    assert_int_equal(c.tp, 0);
    assert_int_equal(c.cp, 1);
    assert_int_equal(c.dp, 1);
    assert_int_equal(c.pp, 0);
    expect_members(&g, 6, GROUP_CP, (int[]){4, 6}, 2);
    expect_members(&g, 6, GROUP_DP, (int[]){2, 6}, 2);
    expect_members(&g, 6, GROUP_EMBEDDING, (int[]){6}, 1);
}

/* Every rank maps back to itself, and each group holds the rank itself. */
static void test_roundtrip(void **state) {
    (void)state;
    const int layouts[][4] = {{1, 1, 1, 1}, {4, 1, 1, 1}, {24, 2, 3, 2}, {12, 1, 2, 3}, {16, 4, 1, 4}};
    for (size_t l = 0; l < sizeof layouts / sizeof layouts[0]; l++) {
        GridLayout g;
        char err[256];
        assert_int_equal(grid_layout(layouts[l][0], layouts[l][1], layouts[l][2], layouts[l][3], &g, err, sizeof err), 0);
        for (int r = 0; r < g.world; r++) {
            assert_int_equal(grid_rank_of(&g, grid_coords(&g, r)), r);
            for (int grp = 0; grp < GRID_NUM_GROUPS; grp++) {
                int members[64];
                int n = grid_group_members(&g, r, (GridGroup)grp, members);
                int found = 0;
                for (int i = 0; i < n; i++) found |= members[i] == r;
                assert_true(found);
            }
        }
    }
}

static void test_bad_layout(void **state) {
    (void)state;
    GridLayout g;
    char err[256] = "";
    assert_int_equal(grid_layout(6, 4, 1, 1, &g, err, sizeof err), -1);
    assert_non_null(strstr(err, "does not divide the world size 6"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp2_dp2_pp2), cmocka_unit_test(test_tp2_pp4), cmocka_unit_test(test_cp_order),
        cmocka_unit_test(test_roundtrip),   cmocka_unit_test(test_bad_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
