/* train_signal.h: SIGTERM and SIGUSR1 ask the training loop to stop cleanly:
 * it finishes the step it is in, saves a checkpoint and exits 0 (what a
 * cluster's preemption notice or `scancel --signal=USR1` expects). */
#ifndef MT_TRAIN_TRAIN_SIGNAL_H
#define MT_TRAIN_TRAIN_SIGNAL_H

/* Install the handlers (they only record the signal). They stay until the
 * process ends: a second signal in the final save or the teardown (a
 * scheduler's to every rank and mpirun's forwarded copy) is recorded, not
 * fatal; SIGKILL still ends a process that does not. */
void train_signals_install(void);

/* The signal received since install (SIGTERM or SIGUSR1), or 0; on a
 * multi-rank run the same answer on every rank (a collective, once per step). */
int train_signal_received(void);

#endif
