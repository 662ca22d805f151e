/* launch_env.c: rank and world size from the launcher's environment variables. */
#include "launch_env.h"

#include <stdlib.h>
#include <string.h>

/* The first of `names` set to a number in [0, 2^30) (its name in *which), else fallback (*which NULL). */
static int env_int_from(const char *const *names, int fallback, const char **which) {
    if (which) *which = NULL;
    for (int i = 0; names[i]; i++) {
        const char *v = getenv(names[i]);
        if (v && *v) {
            char *end;
            long x = strtol(v, &end, 10);
            if (*end == '\0' && x >= 0 && x < (1L << 30)) {
                if (which) *which = names[i];
                return (int)x;
            }
        }
    }
    return fallback;
}

static int env_int(const char *const *names, int fallback) { return env_int_from(names, fallback, NULL); }

static const char *const world_size_names[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", NULL};

int launch_world_size(void) { return env_int(world_size_names, 1); }

const char *launch_world_size_name(void) {
    const char *which;
    env_int_from(world_size_names, 1, &which);
    return which;
}

int launch_started_several(void) {
    const char *which = launch_world_size_name();
    if (launch_world_size() <= 1) return 0;
    const char *step = getenv("SLURM_STEP_NUM_TASKS"); /* srun's step: its own task count */
    return strcmp(which, "SLURM_NTASKS") != 0 || (step && atoi(step) > 1);
}

int launch_local_rank(void) {
    static const char *const names[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", NULL};
    return env_int(names, 0);
}

int launch_rank(void) {
    static const char *const names[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", NULL};
    return env_int(names, 0);
}


int launch_local_size(void) {
    /* not Slurm's SLURM_NTASKS_PER_NODE, set in a batch script's one process too (srun binds each task to its CPUs,
     * which OpenMP obeys) */
    static const char *const names[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", NULL};
    const int n = env_int(names, 1);
    return n > 0 ? n : 1;
}
