/* launch_threads.h: how many OpenMP threads a rank runs when several ranks
 * share a host (launch_threads.c says why). */
#ifndef MT_DIST_LAUNCH_THREADS_H
#define MT_DIST_LAUNCH_THREADS_H

#include <stddef.h>

/* With several ranks on this host (launch_local_size): without
 * OMP_NUM_THREADS, set this process's OpenMP threads to its share of the
 * CPUs and say so in note; with it, leave it, and say in note when the ranks'
 * threads oversubscribe the host. note is "" when there is nothing to say.
 * Returns 1 when note is a warning, 0 otherwise. Call before the first
 * OpenMP region. */
int launch_share_cpus(char *note, size_t len);

#endif
