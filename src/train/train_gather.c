/* train_gather.c: gathering a parallel layout's parts into the whole model
 * on world rank 0 (train_gather.h). Rank 0 rebuilds each sender's registry
 * from its grid coordinates (no metadata travels) and copies every block to
 * its place in the whole tensor. */
#include "train_gather.h"

#include <stdlib.h>
#include <string.h>

#include "../backend/backend.h"
#include "../core/error.h"

#define GATHER_TAG 7001

/* Copy the blocks a rank holds (registry `infos`, floats at src laid out by
 * it) into `dst`, laid out like the whole model `whole`. */
static void place_blocks(const Model *whole, float *dst, const ParamInfo *infos, int count, const float *src) {
    for (int i = 0; i < count; i++) {
        const ParamInfo *p = &infos[i];
        const ParamInfo *w = &whole->param_info[p->global_index];
        const long cols = p->global_shape[1];
        for (long r = 0; r < p->shape[0]; r++)
            memcpy(dst + w->offset + (p->global_start[0] + r) * cols + p->global_start[1],
                   src + p->offset + r * p->shape[1], (size_t)p->shape[1] * sizeof(float));
    }
}

Model *train_gather_whole(const TrainContext *ctx, Model *whole, const AdamW *opt, AdamW *whole_opt) {
    const Comm *world = comm_world();
    const Model *mine = ctx->model;
    const int copies = opt ? 3 : 1;
    const GridCoords me = ctx->grid.coords;
    if (world->rank != 0) {
        if (me.dp != 0 || me.cp != 0) return NULL;
        const long n = mine->num_floats;
        float *buf = mt_malloc((size_t)(n * copies + 1) * sizeof(float));
        memcpy(buf, mine->params, (size_t)n * sizeof(float));
        if (opt) {
            memcpy(buf + n, opt->m, (size_t)n * sizeof(float));
            memcpy(buf + 2 * n, opt->v, (size_t)n * sizeof(float));
        }
        comm_send(world, buf, (size_t)(n * copies), COMM_FLOAT, 0, GATHER_TAG);
        free(buf);
        return NULL;
    }
    if (!whole) whole = model_create(&mine->cfg, &cpu_backend, 0, 0);
    if (opt) {
        adamw_init(whole_opt, whole->num_floats);
        whole_opt->step = opt->step;
    }
    float *dst[3] = {whole->params, opt ? whole_opt->m : NULL, opt ? whole_opt->v : NULL};
    const float *own[3] = {mine->params, opt ? opt->m : NULL, opt ? opt->v : NULL};
    for (int c = 0; c < copies; c++) place_blocks(whole, dst[c], mine->param_info, mine->num_params, own[c]);
    const GridLayout *g = &ctx->grid.layout;
    for (int r = 1; r < world->size; r++) {
        const GridCoords at = grid_coords(g, r);
        if (at.dp != 0 || at.cp != 0) continue;
        ModelPartition part = train_partition_of(&mine->cfg, &ctx->recipe->parallel, g, at);
        int count = 0;
        long n = 0;
        ParamInfo *infos = model_registry_of(&mine->cfg, &part, &count, &n);
        float *buf = mt_malloc((size_t)(n * copies + 1) * sizeof(float));
        comm_recv(world, buf, (size_t)(n * copies), COMM_FLOAT, r, GATHER_TAG);
        for (int c = 0; c < copies; c++) place_blocks(whole, dst[c], infos, count, buf + c * n);
        free(buf);
        free(infos);
    }
    return whole;
}
