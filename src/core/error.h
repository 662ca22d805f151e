/* error.h: exit statuses, fatal errors and log lines shared by every module.
 *
 * A user error (bad recipe, bad command line) exits with MT_EXIT_USAGE (2);
 * anything else that stops the program exits with MT_EXIT_FAILURE (1).
 * Messages go to stderr prefixed with "megatrain: error: ".
 */
#ifndef MT_CORE_ERROR_H
#define MT_CORE_ERROR_H

#include <stddef.h>

#define MT_EXIT_OK 0
#define MT_EXIT_FAILURE 1
#define MT_EXIT_USAGE 2

/* Print "megatrain: error: <message>" to stderr and exit with `status`. */
void mt_die(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));

/* Print "megatrain: error: <message>" to stderr without exiting. */
void mt_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Print "megatrain: warning: <message>" to stderr. */
void mt_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Print "megatrain: warning: <message>" to stderr only when mt_lead_rank: a warning the job says once (rank 0),
 * where every rank would say the same (a dataset's flaw that every rank's loader finds). */
void mt_log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Print an informational line to stdout (only when mt_log_enabled). */
void mt_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* mt_log_enabled: informational lines go to stdout (0 on a run's other ranks, and in commands whose stdout is their
 * result alone); mt_lead_rank: this process speaks for the job (0 on a run's ranks but rank 0). Both start at 1. */
extern int mt_log_enabled;
extern int mt_lead_rank;

/* Allocation that never returns NULL: dies with MT_EXIT_FAILURE instead. */
void *mt_malloc(size_t bytes);
void *mt_calloc(size_t count, size_t size);
void *mt_realloc(void *ptr, size_t bytes);
char *mt_strdup(const char *s);
/* A growing array: buf (of *cap elements of `size` bytes) made to hold at
 * least `need` elements, doubling from 64 elements; returns the (moved)
 * array and updates *cap. */
void *mt_grow(void *buf, size_t *cap, size_t need, size_t size);

/* Write formatted text into a caller's error buffer (NULL-safe). */
void mt_set_error(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
