/* grid.h: the process grid world = tp x cp x dp x pp, ranks ordered tp
 * fastest, then cp, dp, pp (Megatron's order):
 *   rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank)).
 * grid_layout / grid_coords / grid_group_members are pure (no MPI) so they can
 * be tested alone; grid_create makes one Comm per group. */
#ifndef MT_DIST_GRID_H
#define MT_DIST_GRID_H

#include "comm.h"

/* GROUP_EP and GROUP_EDP split the dp group for the MoE experts: ep
 * consecutive dp ranks share a token dispatch (experts split over them),
 * and the ranks at the same place in each such block hold the same experts. */
typedef enum GridGroup { GROUP_TP, GROUP_CP, GROUP_DP, GROUP_PP, GROUP_EMBEDDING, GROUP_EP, GROUP_EDP, GRID_NUM_GROUPS } GridGroup;

typedef struct GridLayout {
    int tp, cp, dp, pp;
    int world; /* tp * cp * dp * pp */
    int ep;    /* expert parallel, a divisor of dp (1 unless set after grid_layout) */
} GridLayout;

typedef struct GridCoords {
    int tp, cp, dp, pp;
} GridCoords;

/* Layout for a world with the given tp, cp, pp (dp = world / (tp*cp*pp)).
 * Returns 0, or -1 with err set when the sizes do not divide the world. */
int grid_layout(int world, int tp, int cp, int pp, GridLayout *out, char *err, size_t errlen);
GridCoords grid_coords(const GridLayout *g, int rank);
int grid_rank_of(const GridLayout *g, GridCoords c);
/* The world ranks of `rank`'s group, ascending, into members (room for
 * g->world); returns how many. The embedding group is the first and the last
 * pipeline stage of rank's pipeline (one rank when pp == 1); a middle stage
 * is in no embedding group and gets just itself. */
int grid_group_members(const GridLayout *g, int rank, GridGroup group, int *members);

/* This rank's place in the grid and one Comm per group. */
typedef struct Grid {
    GridLayout layout;
    GridCoords coords;
    int rank;
    Comm groups[GRID_NUM_GROUPS];
    int in_embedding; /* 1 when this rank belongs to an embedding group of 2+ */
} Grid;

/* Collective over the world: split it into the groups of `layout`. */
void grid_create(Grid *grid, const GridLayout *layout, const Comm *world);
void grid_free(Grid *grid);

#endif
