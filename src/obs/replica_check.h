/* replica_check.h: data-parallel replicas must hold the same parameters.
 * Every train.replica_check_interval steps each rank takes a CRC-32C of its
 * parameter bytes, the ranks exchange them, and any rank that differs from
 * rank 0 is named; the run then stops (exit 1) on every rank before a
 * checkpoint can be written from the diverged state (Megatron's
 * --check-weight-hash-across-dp-replicas-interval). */
#ifndef MT_OBS_REPLICA_CHECK_H
#define MT_OBS_REPLICA_CHECK_H

#include <stddef.h>

#include "../dist/comm.h"

/* Collective over `group`: 0 when every rank's n floats hash the same, else
 * -1 with err naming the step, the differing ranks and their checksums. */
int replica_check(const Comm *group, const float *params, size_t n, long step, char *err, size_t errlen);

/* Test hook: MEGATRAIN_TEST_FLIP_PARAM=RANK:STEP flips the lowest bit of
 * params[0] on rank RANK after step STEP. */
void replica_check_test_flip(int rank, long step, float *params);

#endif
