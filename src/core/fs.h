/* fs.h: small file-system helpers (data, checkpoints, runs)
 * (mkdir -p, whole-file atomic replacement, temporary names). */
#ifndef MT_CORE_FS_H
#define MT_CORE_FS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Open the input file `path` for reading without ever blocking on it: the
 * open is O_RDONLY | O_NONBLOCK | O_CLOEXEC, so that a FIFO (named pipe) with
 * no writer does not hang the process; anything but a regular file (a FIFO,
 * a directory, a device, a socket) is then refused, and the descriptor is
 * returned in blocking mode. `expected` words the refusal ("<path>: is a FIFO,
 * expected <expected>"; NULL: "a regular file"). On success *size (when not
 * NULL) is the file's size. Returns the fd, or -1 with err naming the file
 * ("<path>: cannot open: <why>", "<path>: is a FIFO, expected a regular file"). */
int mt_open_regular(const char *path, const char *expected, uint64_t *size, char *err, size_t errlen);

/* mt_open_regular as a FILE* opened "rb" (NULL with err). */
FILE *mt_fopen_regular(const char *path, const char *expected, uint64_t *size, char *err, size_t errlen);

/* A file to write, created if missing (mode 0666 less the umask), appended to or truncated, as fopen's "a" / "w";
 * never blocks on a FIFO: anything but a regular file is refused, naming it (NULL with err). */
FILE *mt_fopen_output(const char *path, bool append, char *err, size_t errlen);

/* write(2) all n bytes (in chunks of at most 1 GiB, retrying on EINTR). 0, or -1 with errno set. */
int mt_write_all(int fd, const void *data, size_t n);

/* "a FIFO", "a directory", "a character device"...: what a stat mode is, in words. */
const char *mt_file_kind(unsigned int mode);

/* Read the whole regular file `path` (at most max_bytes) into a NUL-terminated
 * buffer the caller frees; *len excludes the NUL. NULL with err naming the file
 * ("cannot open: ...", "is a FIFO, expected a regular file", "larger than N bytes",
 * "cannot read"); never blocks on a FIFO (mt_open_regular). */
char *mt_read_file(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen);

/* Create `dir` and any missing parents (like mkdir -p). Returns 0 or -1 with err. */
int mt_make_dirs(const char *dir, char *err, size_t errlen);

/* mt_make_dirs that says which directories it made, for mt_remove_made_dirs: *made gets the shallowest of them
 * ("" when it made none: dir was there), every directory below it on the way to dir made by this call too (one found
 * there meanwhile, another process's, starts the record again below it). *made is set also when it fails. */
int mt_make_dirs_made(const char *dir, char *made, size_t madelen, char *err, size_t errlen);

/* Undo mt_make_dirs_made(dir, made): rmdir dir, then each parent up to and including `made`, stopping at the first
 * that cannot be removed (not empty: anything in it is kept); one not there (the making failed before it) is passed
 * over. Nothing when made is "": no directory that was there before is ever removed. */
void mt_remove_made_dirs(const char *dir, const char *made);

/* Create the parent directories of the file `path`. Returns 0 or -1 with err. */
int mt_make_parent_dirs(const char *path, char *err, size_t errlen);

/* "<path>.tmp.<pid>": a temporary name beside `path`. Returns 0, or -1 when it does not fit. */
int mt_temp_name(char *out, size_t outlen, const char *path);

/* "<path>.tmp.<host>.<pid>": a temporary name that says which process of
 * which machine writes it (the host name's characters other than letters,
 * digits and '-' become '_'), so that a later process can tell a dead
 * writer's file from a live one's (mt_remove_stale_temps). */
int mt_temp_name_host(char *out, size_t outlen, const char *path);

/* Remove the files "<path>.tmp.<host>.<pid>" that this machine's processes
 * left and that no running process owns (the writer was killed outright).
 * Files of other hosts (a shared file system) and of live processes are
 * kept. Returns how many were removed; the first one's name in first. */
int mt_remove_stale_temps(const char *path, char *first, size_t firstlen);
/* The same with another way of removing each (a directory's tree): remove_one returns 0 when it is gone. */
int mt_remove_stale_temps_with(const char *path, int (*remove_one)(const char *path), char *first, size_t firstlen);

/* Opens, stats and reads of files that fail for a reason of this machine rather than of the file (too many open
 * files, out of memory, no permission: EMFILE, ENFILE, ENOMEM, ENOBUFS, EAGAIN, EACCES, EPERM) are noted, from any
 * thread; mt_env_error gives the errno of the last one since mt_env_error_clear (0: none). A checkpoint that could
 * not be read for such a reason is not corrupt (resume leaves it where it is). mt_env_error_note(e) notes e when it
 * is such an errno. */
void mt_env_error_note(int e);
int mt_env_error(void);
void mt_env_error_clear(void);

/* Flush `fd` to disk and close it. Returns 0 or -1 (errno set). */
int mt_sync_close(int fd);

/* Flush `f` and its file to disk, then fclose it: for a file about to be renamed over another (without it a power
 * loss after the rename can leave the new name empty). Returns 0, or -1 (errno set) when any of it failed. */
int mt_fclose_sync(FILE *f);

/* fsync a directory (so the names in it are durable). Returns 0 or -1 with err. */
int mt_sync_dir(const char *dir, char *err, size_t errlen);

/* The directory part of `path` ("." when none) into out. */
void mt_parent_dir(const char *path, char *out, size_t outlen);

/* rename(from, to) that fails with EEXIST instead of replacing `to`
 * (renameat2 RENAME_NOREPLACE, with a checked fallback). Returns 0 or -1 (errno). */
int mt_rename_noreplace(const char *from, const char *to);

/* Lock `path` (created when missing) for the rest of this process's life: an exclusive flock(2) that the
 * kernel drops when the process ends, however it ends; the file then holds "pid P on HOST". Returns 0 (held;
 * again 0 for the path this process already holds), 1 when another process holds it (*holder: its line from
 * the file, "" when unreadable), or -1 with errno (the file cannot be created, or the file system has no
 * locks: ENOLCK, EOPNOTSUPP, ENOSYS). */
int mt_lock_file(const char *path, char *holder, size_t holderlen);

/* The exit status of a path named on the command line that stat(2) could not read, errno e: MT_EXIT_USAGE (2) when
 * it is not there (ENOENT, ENOTDIR: the command line names no such path), MT_EXIT_FAILURE (1) for any other reason
 * (no permission, a loop of symbolic links, an I/O error: the path may well be there; say strerror(e)). */
int mt_path_stat_status(int e);

/* Whether paths a and b both exist and name the same file or directory (device and inode). */
bool mt_same_file(const char *a, const char *b);

#endif
