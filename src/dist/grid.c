/* grid.c: rank <-> (tp, cp, dp, pp) coordinates, the members of each group,
 * and the MPI communicators of a rank's groups (see grid.h for the order). */
#include "grid.h"

#include "../core/error.h"

int grid_layout(int world, int tp, int cp, int pp, GridLayout *out, char *err, size_t errlen) {
    if (world < 1 || tp < 1 || cp < 1 || pp < 1) {
        mt_set_error(err, errlen, "grid: sizes must be >= 1 (world %d, tp %d, cp %d, pp %d)", world, tp, cp, pp);
        return -1;
    }
    long model_parallel = (long)tp * cp * pp;
    if (world % model_parallel != 0) {
        mt_set_error(err, errlen, "grid: tp * cp * pp = %d * %d * %d = %ld does not divide the world size %d", tp, cp,
                     pp, model_parallel, world);
        return -1;
    }
    *out = (GridLayout){.tp = tp, .cp = cp, .dp = (int)(world / model_parallel), .pp = pp, .world = world, .ep = 1};
    return 0;
}

GridCoords grid_coords(const GridLayout *g, int rank) {
    GridCoords c;
    c.tp = rank % g->tp;
    rank /= g->tp;
    c.cp = rank % g->cp;
    rank /= g->cp;
    c.dp = rank % g->dp;
    c.pp = rank / g->dp;
    return c;
}

int grid_rank_of(const GridLayout *g, GridCoords c) {
    return c.tp + g->tp * (c.cp + g->cp * (c.dp + g->dp * c.pp));
}

int grid_group_members(const GridLayout *g, int rank, GridGroup group, int *members) {
    const GridCoords me = grid_coords(g, rank);
    int n = 0;
    GridCoords c = me;
    switch (group) {
    case GROUP_TP:
        for (c.tp = 0; c.tp < g->tp; c.tp++) members[n++] = grid_rank_of(g, c);
        break;
    case GROUP_CP:
        for (c.cp = 0; c.cp < g->cp; c.cp++) members[n++] = grid_rank_of(g, c);
        break;
    case GROUP_DP:
        for (c.dp = 0; c.dp < g->dp; c.dp++) members[n++] = grid_rank_of(g, c);
        break;
    case GROUP_PP:
        for (c.pp = 0; c.pp < g->pp; c.pp++) members[n++] = grid_rank_of(g, c);
        break;
    case GROUP_EP: { /* the ep consecutive dp ranks of rank's block */
        const int ep = g->ep > 0 ? g->ep : 1, first = me.dp / ep * ep;
        for (c.dp = first; c.dp < first + ep; c.dp++) members[n++] = grid_rank_of(g, c);
        break;
    }
    case GROUP_EDP: { /* the same place in every block */
        const int ep = g->ep > 0 ? g->ep : 1;
        for (c.dp = me.dp % ep; c.dp < g->dp; c.dp += ep) members[n++] = grid_rank_of(g, c);
        break;
    }
    case GROUP_EMBEDDING:
        if (me.pp != 0 && me.pp != g->pp - 1) { /* middle stage: in no embedding group */
            members[n++] = rank;
            break;
        }
        c.pp = 0;
        members[n++] = grid_rank_of(g, c);
        if (g->pp > 1) {
            c.pp = g->pp - 1;
            members[n++] = grid_rank_of(g, c);
        }
        break;
    default:
        break;
    }
    return n;
}

void grid_create(Grid *grid, const GridLayout *layout, const Comm *world) {
    grid->layout = *layout;
    grid->rank = world->rank;
    grid->coords = grid_coords(layout, world->rank);
    const GridCoords c = grid->coords;
    /* color = the coordinates that stay fixed within the group; key = rank. */
    comm_split(world, c.cp + layout->cp * (c.dp + layout->dp * c.pp), world->rank, &grid->groups[GROUP_TP]);
    comm_split(world, c.tp + layout->tp * (c.dp + layout->dp * c.pp), world->rank, &grid->groups[GROUP_CP]);
    comm_split(world, c.tp + layout->tp * (c.cp + layout->cp * c.pp), world->rank, &grid->groups[GROUP_DP]);
    const int ep = layout->ep > 0 ? layout->ep : 1;
    comm_split(&grid->groups[GROUP_DP], c.dp / ep, world->rank, &grid->groups[GROUP_EP]);
    comm_split(&grid->groups[GROUP_DP], c.dp % ep, world->rank, &grid->groups[GROUP_EDP]);
    comm_split(world, c.tp + layout->tp * (c.cp + layout->cp * c.dp), world->rank, &grid->groups[GROUP_PP]);
    /* Embedding: first and last stage of a pipeline share a color; the
     * middle stages each get a group of their own. */
    const int pipeline = c.tp + layout->tp * (c.cp + layout->cp * c.dp);
    const int per_stage = layout->tp * layout->cp * layout->dp;
    const int ends = c.pp == 0 || c.pp == layout->pp - 1;
    grid->in_embedding = ends && layout->pp > 1;
    comm_split(world, ends ? pipeline : per_stage + world->rank, world->rank, &grid->groups[GROUP_EMBEDDING]);
}

void grid_free(Grid *grid) {
    for (int i = 0; i < GRID_NUM_GROUPS; i++) comm_free(&grid->groups[i]);
}
