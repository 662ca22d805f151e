/* replica_check.c: the cross-replica parameter checksum (see replica_check.h). */
#include "replica_check.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/crc32c.h"
#include "../core/error.h"

int replica_check(const Comm *group, const float *params, size_t n, long step, char *err, size_t errlen) {
    if (group->size <= 1) return 0;
    int64_t mine = (int64_t)crc32c(0, params, n * sizeof(float));
    int64_t *all = mt_malloc((size_t)group->size * sizeof *all);
    comm_all_gather(group, &mine, all, 1, COMM_INT64);
    char ranks[512] = "";
    size_t used = 0;
    int differing = 0;
    for (int r = 1; r < group->size; r++) {
        if (all[r] == all[0]) continue;
        differing++;
        if (used < sizeof ranks - 32)
            used += (size_t)snprintf(ranks + used, sizeof ranks - used, "%s%d (%08llx)", differing > 1 ? ", " : "",
                                     r, (unsigned long long)all[r]);
    }
    if (differing)
        mt_set_error(err, errlen,
                     "step %ld: the parameters differ across data-parallel replicas: rank(s) %s against rank 0 "
                     "(%08llx); stopping before any checkpoint is written from this state",
                     step, ranks, (unsigned long long)all[0]);
    free(all);
    return differing ? -1 : 0;
}

void replica_check_test_flip(int rank, long step, float *params) {
    const char *spec = getenv("MEGATRAIN_TEST_FLIP_PARAM");
    int want_rank;
    long want_step;
    if (!spec || sscanf(spec, "%d:%ld", &want_rank, &want_step) != 2) return;
    if (rank != want_rank || step != want_step) return;
    uint32_t bits;
    memcpy(&bits, &params[0], sizeof bits);
    bits ^= 1u;
    memcpy(&params[0], &bits, sizeof bits);
}
