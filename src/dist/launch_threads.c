/* launch_threads.c: the OpenMP threads of a rank that shares its host with
 * other ranks (launch_threads.h).
 *
 * Without OMP_NUM_THREADS every OpenMP runtime starts one thread per CPU
 * it may use, in every process: four ranks on a host of two CPUs run eight
 * busy threads, and the spinning threads of a rank waiting in a collective
 * take the CPUs from the ones computing (measured 100x slower than one
 * thread a rank on 2 CPUs). torchrun sets OMP_NUM_THREADS=1 for the same
 * reason. Here a rank takes the CPUs it may use (its affinity: the host's,
 * or a container's or job's cpuset) divided by the ranks on the host, at
 * least 1. OMP_NUM_THREADS, when set, is obeyed; it is only said when it
 * asks for more than one thread a rank and more threads than those CPUs. */
#include "launch_threads.h"

#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include "launch_env.h"

/* The CPUs this process may run on (its affinity), 0 when unknown. */
static int affinity_cpus(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return 0;
    return CPU_COUNT(&set);
}

int launch_share_cpus(char *note, size_t len) {
    note[0] = '\0';
    const int ranks = launch_local_size();
    if (ranks <= 1) return 0;
    const int cpus = affinity_cpus(); /* what this process may use: the host's, a container's or a job's share */
    if (cpus <= 0) return 0;
    const char *set = getenv("OMP_NUM_THREADS");
    if (set && *set) {
        const int threads = omp_get_max_threads();
        if (threads > 1 && (long)threads * ranks > cpus)
            snprintf(note, len, "OMP_NUM_THREADS=%s: each of the %d ranks on this host runs %d OpenMP threads, %d in "
                     "all, and a rank may use %d CPU%s (its affinity: the host's, or what the launcher binds it to); "
                     "oversubscribed threads wait on one another (OMP_NUM_THREADS=%d fits)", set, ranks, threads,
                     threads * ranks, cpus, cpus == 1 ? "" : "s", cpus / ranks > 0 ? cpus / ranks : 1);
        return note[0] ? 1 : 0;
    }
    /* the CPUs this rank may use, over the ranks on the host: exact when they share one set (a host, a container,
     * a job's cpuset); a rank bound to its own core gets 1; ranks bound to a socket each get a share of it, fewer
     * threads than it could run, never more */
    const int threads = cpus / ranks > 0 ? cpus / ranks : 1;
    omp_set_num_threads(threads);
    snprintf(note, len, "OMP_NUM_THREADS is unset: each of the %d ranks on this host runs %d OpenMP thread%s (the "
             "%d CPU%s a rank may use over the ranks); set OMP_NUM_THREADS to choose", ranks, threads,
             threads == 1 ? "" : "s", cpus, cpus == 1 ? "" : "s");
    return 0;
}
