/* timer.h: wall-clock time in seconds (monotonic). */
#ifndef MT_CORE_TIMER_H
#define MT_CORE_TIMER_H

double mt_now(void);

#endif
