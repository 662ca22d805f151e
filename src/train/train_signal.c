/* train_signal.c: handlers that record SIGTERM / SIGUSR1 / SIGHUP / SIGPIPE for the loop to see
 * between steps, and the ranks' agreement on a stop, a signal's or the
 * recipe's exit limits'. SA_RESTART keeps interrupted writes going. */
#include "train_signal.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../dist/comm.h"

static volatile sig_atomic_t received_signal;

static void record_signal(int sig) {
    if (!received_signal) received_signal = sig;
}

void train_signals_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = record_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    received_signal = 0;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGPIPE, &sa, NULL); /* the write that raised it fails with EPIPE; the loop saves and stops */
}

/* With several ranks all must stop after the same step: the first rank (in
 * rank order) that saw a signal decides for all. A collective: every rank
 * calls it once per step. */
int train_stop_requested(int local) {
    const Comm *world = comm_world();
    int sig = received_signal ? received_signal : local;
    if (world->size <= 1) return sig;
    int *all = mt_malloc((size_t)world->size * sizeof(int));
    comm_all_gather(world, &sig, all, 1, COMM_INT32);
    sig = 0;
    for (int r = 0; r < world->size && !sig; r++) sig = all[r];
    free(all);
    return sig;
}

const char *train_stop_name(int reason) {
    switch (reason) {
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    case SIGHUP: return "SIGHUP";
    case SIGPIPE: return "SIGPIPE";
    case TRAIN_STOP_INTERVAL: return "train.exit_interval";
    case TRAIN_STOP_DURATION: return "train.exit_duration_mins";
    }
    return "a signal";
}
