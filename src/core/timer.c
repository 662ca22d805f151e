/* timer.c: the monotonic and the calendar clock (timer.h). */
#define _POSIX_C_SOURCE 200809L
#include "timer.h"

#include <time.h>

static double seconds_of(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double mt_now(void) { return seconds_of(CLOCK_MONOTONIC); }

double mt_unix_time(void) { return seconds_of(CLOCK_REALTIME); }
