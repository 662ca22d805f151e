/* train_layout.c: the grid and this rank's ModelPartition from the recipe
 * (train_layout.h). Pipeline stage s holds virtual stages s, s + pp, ...
 * (one model chunk each); parallel_stage_layers says which layers each
 * virtual stage holds (recipe validation checked the split). */
#include "train_layout.h"

#include "../core/error.h"

ModelPartition train_partition_of(const ModelConfig *cfg, const ParallelConfig *par, const GridLayout *layout,
                                  GridCoords coords) {
    ModelPartition part = {
        .tp = layout->tp,
        .tp_rank = coords.tp,
        .sequence_parallel = par->sequence_parallel && layout->tp > 1,
        .cp = layout->cp,
        .cp_rank = coords.cp,
        .num_chunks = layout->pp > 1 ? par->vpp : 1,
        .ep = layout->ep > 0 ? layout->ep : 1,
        .ep_rank = coords.dp % (layout->ep > 0 ? layout->ep : 1),
        .etp = par->etp > 1 ? par->etp : 1,
        .has_embed = coords.pp == 0,
        .has_head = coords.pp == layout->pp - 1,
    };
    for (int v = 0; v < part.num_chunks; v++) {
        parallel_stage_layers(par, cfg->num_layers, v * layout->pp + coords.pp, &part.chunk_first[v],
                              &part.chunk_layers[v]);
        part.num_layers += part.chunk_layers[v];
    }
    return part;
}

int train_layout_create(const Recipe *recipe, Grid *grid, TrainLayout *layout, ModelPartition *part, char *err,
                        size_t errlen) {
    const ParallelConfig *par = &recipe->parallel;
    const Comm *world = comm_world();
    GridLayout g;
    char why[512];
    if (grid_layout(world->size, par->tp, par->cp, par->pp, &g, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "parallel: %s", why);
        return MT_EXIT_USAGE;
    }
    if (par->vpp > 1 && par->pp == 1) {
        mt_set_error(err, errlen, "parallel.vpp: expected 1 when pp is 1, found %d", par->vpp);
        return MT_EXIT_USAGE;
    }
    if (par->vpp > MT_MAX_CHUNKS) {
        mt_set_error(err, errlen, "parallel.vpp: at most %d, found %d", MT_MAX_CHUNKS, par->vpp);
        return MT_EXIT_USAGE;
    }
    /* (ep dividing dp, and etp 1 or tp, are the recipe's checks: recipe_validate.c) */
    if (par->ep > MT_MAX_EP) {
        mt_set_error(err, errlen, "parallel.ep: at most %d, found %d", MT_MAX_EP, par->ep);
        return MT_EXIT_USAGE;
    }
    g.ep = par->ep;
    grid_create(grid, &g, world);
    *layout = (TrainLayout){
        .world_size = world->size,
        .dp_size = g.dp,
        .dp_rank = grid->coords.dp,
        .tp = g.tp,
        .cp = g.cp,
        .pp = g.pp,
        .vpp = g.pp > 1 ? par->vpp : 1,
        .pp_rank = grid->coords.pp,
        .model_parallel = g.tp * g.cp * g.pp > 1,
    };
    ModelConfig resolved = recipe->model;
    *part = train_partition_of(&resolved, par, &g, grid->coords);
    part->tp_comm = &grid->groups[GROUP_TP];
    part->cp_comm = &grid->groups[GROUP_CP];
    part->dp_comm = &grid->groups[GROUP_DP];
    part->ep_comm = &grid->groups[GROUP_EP];
    if (model_partition_check(&recipe->model, part, recipe->train.seq_len, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "%s", why);
        return MT_EXIT_USAGE;
    }
    return 0;
}
