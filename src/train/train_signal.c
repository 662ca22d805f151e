/* train_signal.c: handlers that record SIGTERM / SIGUSR1 for the loop to see
 * between steps. SA_RESTART keeps interrupted writes going. */
#include "train_signal.h"

#include <signal.h>
#include <string.h>

static volatile sig_atomic_t received_signal;
static struct sigaction previous_term, previous_usr1;
static int installed;

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
    sigaction(SIGTERM, &sa, &previous_term);
    sigaction(SIGUSR1, &sa, &previous_usr1);
    installed = 1;
}

void train_signals_restore(void) {
    if (!installed) return;
    sigaction(SIGTERM, &previous_term, NULL);
    sigaction(SIGUSR1, &previous_usr1, NULL);
    installed = 0;
}

int train_signal_received(void) { return received_signal; }
