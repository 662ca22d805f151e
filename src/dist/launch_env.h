/* launch_env.h: rank and world size as given by the launcher (mpirun, srun).
 *
 * Read from the environment before MPI is initialised, so a single-rank run
 * never needs MPI at all. */
#ifndef MT_DIST_LAUNCH_ENV_H
#define MT_DIST_LAUNCH_ENV_H

/* World size from OMPI_COMM_WORLD_SIZE, PMI_SIZE or SLURM_NTASKS; 1 when absent. */
int launch_world_size(void);
/* The variable launch_world_size read ("SLURM_NTASKS"...), NULL when none. */
const char *launch_world_size_name(void);
/* Rank from OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID; 0 when absent. */
int launch_rank(void);
/* Rank among the processes on this machine (OMPI_COMM_WORLD_LOCAL_RANK,
 * MPI_LOCALRANKID or SLURM_LOCALID); 0 when absent. Picks the GPU. */
int launch_local_rank(void);
/* Whether this process is one of several a launcher started: a world size above 1, and where it is Slurm's
 * SLURM_NTASKS, a task of an srun step of more than one (SLURM_STEP_NUM_TASKS, which srun sets): a batch script's
 * own shell has SLURM_NTASKS of its allocation too, and a command it runs is one process. */
int launch_started_several(void);
/* Processes on this machine (OMPI_COMM_WORLD_LOCAL_SIZE or MPI_LOCALNRANKS,
 * which mpirun sets); 1 when absent. */
int launch_local_size(void);

#endif
