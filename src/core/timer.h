/* timer.h: time in seconds: monotonic (for durations) and the calendar's (Unix time, for records). */
#ifndef MT_CORE_TIMER_H
#define MT_CORE_TIMER_H

/* Monotonic seconds from an unspecified start: durations. */
double mt_now(void);

/* Seconds since the Unix epoch (CLOCK_REALTIME): the wall-clock time records carry. */
double mt_unix_time(void);

/* main() marks when the process began (mt_now's clock); mt_process_start gives it (unmarked: its first call's time).
 * What train.exit_duration_mins counts from, setup included, as Megatron's --exit-duration-in-mins. */
void mt_mark_process_start(void);
double mt_process_start(void);

/* A test hook: sleeps the milliseconds the environment variable `name` gives (nothing when unset or not positive;
 * a signal does not cut it short). */
void mt_test_delay(const char *name);

#endif
