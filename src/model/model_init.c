/* model_init.c: model_init_weights, the deterministic parameter init.
 *
 * Every parameter is cut into blocks of INIT_BLOCK elements; block j of
 * parameter i draws from its own generator seeded from (seed, i, j). The bits
 * therefore depend only on the seed and the registry, never on the order the
 * blocks are visited or on the number of OpenMP threads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../core/rng.h"
#include "model_internal.h"

#define INIT_BLOCK (1L << 20)

/* Generator seed for block `block` of parameter `index` (a 64-bit mix; rng_seed
 * scrambles it again through splitmix64). */
static uint64_t block_seed(uint64_t seed, long index, long block) {
    uint64_t x = seed ^ (0x9e3779b97f4a7c15ULL * (uint64_t)(index + 1));
    x ^= x >> 31;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= 0xd1b54a32d192ed03ULL * (uint64_t)(block + 1);
    x ^= x >> 29;
    return x;
}

static void init_block(const ParamInfo *p, float *data, uint64_t seed, long index, long block) {
    long begin = block * INIT_BLOCK;
    long end = begin + INIT_BLOCK < p->numel ? begin + INIT_BLOCK : p->numel;
    switch (p->init) {
    case INIT_ZEROS:
        memset(data + begin, 0, (size_t)(end - begin) * sizeof(float));
        break;
    case INIT_ONES:
        for (long k = begin; k < end; k++) data[k] = 1.0f;
        break;
    case INIT_NORMAL: {
        Rng rng;
        rng_seed(&rng, block_seed(seed, index, block));
        double std = p->init_std;
        for (long k = begin; k < end; k++) data[k] = (float)(std * rng_normal(&rng));
        break;
    }
    }
}

void model_init_weights(Model *model, uint64_t seed) {
    /* A flat list of (parameter, block) jobs so big and small parameters share the threads. */
    long num_jobs = 0;
    for (int i = 0; i < model->num_params; i++)
        num_jobs += (model->param_info[i].numel + INIT_BLOCK - 1) / INIT_BLOCK;
    long *job_param = mt_malloc((size_t)num_jobs * sizeof *job_param);
    long *job_block = mt_malloc((size_t)num_jobs * sizeof *job_block);
    long j = 0;
    for (int i = 0; i < model->num_params; i++) {
        long blocks = (model->param_info[i].numel + INIT_BLOCK - 1) / INIT_BLOCK;
        for (long b = 0; b < blocks; b++, j++) {
            job_param[j] = i;
            job_block[j] = b;
        }
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (long job = 0; job < num_jobs; job++) {
        const ParamInfo *p = &model->param_info[job_param[job]];
        init_block(p, model->params + p->offset, seed, job_param[job], job_block[job]);
    }
    free(job_param);
    free(job_block);
}
