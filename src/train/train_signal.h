/* train_signal.h: SIGTERM and SIGUSR1 ask the training loop to stop cleanly:
 * it finishes the step it is in, saves a checkpoint and exits 0 (what a
 * cluster's preemption notice or `scancel --signal=USR1` expects). So do
 * SIGHUP (the terminal the run was started from closed) and SIGPIPE (what
 * reads its output went away: `run ... | tee log` with tee killed), which
 * would otherwise end it at once, losing the steps since the last
 * checkpoint; the lines it prints after SIGPIPE go nowhere (metrics.jsonl
 * still has them). */
#ifndef MT_TRAIN_TRAIN_SIGNAL_H
#define MT_TRAIN_TRAIN_SIGNAL_H

/* Install the handlers (they only record the signal). They stay until the
 * process ends: a second signal in the final save or the teardown (a
 * scheduler's to every rank and mpirun's forwarded copy) is recorded, not
 * fatal; SIGKILL still ends a process that does not. */
void train_signals_install(void);

/* Stops the recipe asks for, beside the signals (train.exit_interval, train.exit_duration_mins: Megatron's
 * --exit-interval and --exit-duration-in-mins). */
enum { TRAIN_STOP_INTERVAL = -1, TRAIN_STOP_DURATION = -2 };

/* The signal received since install (SIGTERM, SIGUSR1, SIGHUP or SIGPIPE), else this rank's
 * own reason to stop (`local`, a TRAIN_STOP_ value, or 0); on a multi-rank
 * run the same answer on every rank, the first rank's in rank order that has
 * one (a collective, once per step). */
int train_stop_requested(int local);

/* What stopped the run, for the log: "SIGTERM", "SIGUSR1", "SIGHUP", "SIGPIPE", "train.exit_interval", ... */
const char *train_stop_name(int reason);

#endif
