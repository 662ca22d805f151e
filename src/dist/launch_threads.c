/* launch_threads.c: the OpenMP threads of a rank that shares its host with
 * other ranks (launch_threads.h).
 *
 * Without OMP_NUM_THREADS every OpenMP runtime starts one thread per CPU
 * it may use, in every process: four ranks on a host of two CPUs run eight
 * busy threads, and the spinning threads of a rank waiting in a collective
 * take the CPUs from the ones computing (measured 100x slower than one
 * thread a rank on 2 CPUs). torchrun sets OMP_NUM_THREADS=1 for the same
 * reason. Here a rank that is not bound to a subset of the CPUs (its
 * affinity is the whole host) takes the host's CPUs divided by the ranks on
 * it, at least 1; a rank the launcher bound (mpirun --bind-to core) keeps
 * the CPUs it was given. OMP_NUM_THREADS, when set, is obeyed; it is only
 * said when it asks for more threads than the host has CPUs for. */
#include "launch_threads.h"

#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

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
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    const int mine = affinity_cpus();
    if (online <= 0 || mine <= 0) return 0;
    const char *set = getenv("OMP_NUM_THREADS");
    if (set && *set) {
        const int threads = omp_get_max_threads();
        if ((long)threads * ranks > online)
            snprintf(note, len, "OMP_NUM_THREADS=%s: the %d ranks on this host run %d OpenMP threads each, %d in "
                     "all on %ld CPUs; oversubscribed threads wait on one another (OMP_NUM_THREADS=%ld fits)", set,
                     ranks, threads, threads * ranks, online, online / ranks > 0 ? online / ranks : 1);
        return note[0] ? 1 : 0;
    }
    const int threads = mine < online ? mine : (int)(online / ranks > 0 ? online / ranks : 1);
    omp_set_num_threads(threads);
    snprintf(note, len, "OMP_NUM_THREADS is unset: each of the %d ranks on this host runs %d OpenMP thread%s (%s); "
             "set OMP_NUM_THREADS to choose", ranks, threads, threads == 1 ? "" : "s",
             mine < online ? "the CPUs the launcher bound it to" : "the host's CPUs over its ranks");
    return 0;
}
