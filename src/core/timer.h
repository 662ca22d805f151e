/* timer.h: time in seconds: monotonic (for durations) and the calendar's (Unix time, for records). */
#ifndef MT_CORE_TIMER_H
#define MT_CORE_TIMER_H

/* Monotonic seconds from an unspecified start: durations. */
double mt_now(void);

/* Seconds since the Unix epoch (CLOCK_REALTIME): the wall-clock time records carry. */
double mt_unix_time(void);

#endif
