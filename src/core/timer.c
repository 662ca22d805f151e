/* timer.c: the monotonic and the calendar clock (timer.h). */
#define _POSIX_C_SOURCE 200809L
#include "timer.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

static double seconds_of(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double mt_now(void) { return seconds_of(CLOCK_MONOTONIC); }

double mt_unix_time(void) { return seconds_of(CLOCK_REALTIME); }

static double process_start = -1.0;

void mt_mark_process_start(void) { process_start = mt_now(); }

double mt_process_start(void) {
    if (process_start < 0.0) process_start = mt_now();
    return process_start;
}

void mt_test_delay(const char *name) {
    const char *ms = getenv(name);
    const long v = ms && *ms ? strtol(ms, NULL, 10) : 0;
    if (v <= 0) return;
    struct timespec ts = {v / 1000, (v % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}
