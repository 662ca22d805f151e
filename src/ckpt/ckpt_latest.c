/* ckpt_latest.c: naming and listing a run's checkpoints, the latest pointer
 * file, cleaning up after killed saves, and the whole of one run-level save. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/error.h"
#include "../core/fs.h"
#include "ckpt_fs.h"
#include "ckpt_run.h"

int ckpt_iter_path(char *out, size_t outlen, const char *checkpoints_dir, long step) {
    int n = snprintf(out, outlen, "%s/iter_%07ld", checkpoints_dir, step);
    return (n < 0 || (size_t)n >= outlen) ? -1 : 0;
}

long ckpt_parse_iter_name(const char *name) {
    if (strncmp(name, "iter_", 5) != 0) return -1;
    const char *digits = name + 5;
    size_t n = strlen(digits);
    if (n < 7 || n > 18) return -1;
    for (size_t i = 0; i < n; i++)
        if (!isdigit((unsigned char)digits[i])) return -1;
    return strtol(digits, NULL, 10);
}

static int compare_longs(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

/* The steps of the entries named iter_N: directories only, or any entry (any_entry). */
static int list_steps(const char *checkpoints_dir, bool any_entry, long **steps, char *err, size_t errlen) {
    *steps = NULL;
    DIR *d = opendir(checkpoints_dir);
    if (!d) {
        if (errno == ENOENT) return 0;
        mt_set_error(err, errlen, "%s: cannot list: %s", checkpoints_dir, strerror(errno));
        return -1;
    }
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long step = ckpt_parse_iter_name(e->d_name);
        if (step < 0) continue;
        char path[MT_PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", checkpoints_dir, e->d_name);
        struct stat st;
        if (!any_entry && (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))) continue;
        if (n == cap) *steps = mt_realloc(*steps, (size_t)(cap = cap ? cap * 2 : 16) * sizeof(long));
        (*steps)[n++] = step;
    }
    closedir(d);
    if (n > 1) qsort(*steps, (size_t)n, sizeof(long), compare_longs);
    return n;
}

int ckpt_list_steps(const char *checkpoints_dir, long **steps, char *err, size_t errlen) {
    return list_steps(checkpoints_dir, false, steps, err, errlen);
}

int ckpt_list_entries(const char *checkpoints_dir, long **steps, char *err, size_t errlen) {
    return list_steps(checkpoints_dir, true, steps, err, errlen);
}

int ckpt_entry_not_dir(const char *path, char *what, size_t whatlen) {
    struct stat st, target;
    if (stat(path, &target) == 0 && S_ISDIR(target.st_mode)) return 0;
    if (lstat(path, &st) != 0) {
        snprintf(what, whatlen, "not there any more (%s)", strerror(errno));
        return 1;
    }
    if (!S_ISLNK(st.st_mode)) {
        snprintf(what, whatlen, "%s", mt_file_kind((unsigned int)st.st_mode));
        return 1;
    }
    char to[MT_PATH_MAX];
    const ssize_t n = readlink(path, to, sizeof to - 1);
    to[n > 0 ? n : 0] = '\0';
    const int gone = stat(path, &target) != 0;
    snprintf(what, whatlen, "a symbolic link to '%s', %s", to,
             gone ? "which does not exist (a volume that is not mounted?)" : mt_file_kind((unsigned int)target.st_mode));
    return 2;
}

int ckpt_invalid_only(const char *checkpoints_dir, char *err, size_t errlen) {
    DIR *d = opendir(checkpoints_dir);
    int n = 0;
    char newest[256] = "";
    for (struct dirent *e; d && (e = readdir(d));) {
        if (strncmp(e->d_name, "iter_", 5) != 0 || !strstr(e->d_name, ".invalid")) continue;
        n++;
        if (strcmp(e->d_name, newest) > 0) snprintf(newest, sizeof newest, "%s", e->d_name);
    }
    if (d) closedir(d);
    if (n > 0)
        mt_set_error(err, errlen, "%s holds no valid checkpoint, only ones moved aside as incomplete or corrupt (%d, "
                     "the newest %s): the run cannot continue from them, and starting it afresh here would overwrite its "
                     "history; repair or remove them, or choose another run.dir", checkpoints_dir, n, newest);
    return n;
}

/* What a pointer file holds, for a message: 'text' (printable, at most 40
 * characters, others as \xNN), or "nothing" when empty. */
static void describe_text(const char *text, size_t n, bool more, char *out, size_t outlen) {
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r')) n--;
    if (n == 0 && !more) {
        snprintf(out, outlen, "nothing (an empty file)");
        return;
    }
    size_t used = (size_t)snprintf(out, outlen, "'");
    for (size_t i = 0; i < n && i < 40 && used + 8 < outlen; i++) {
        unsigned char c = (unsigned char)text[i];
        used += (size_t)snprintf(out + used, outlen - used, isprint(c) ? "%c" : "\\x%02x", c);
    }
    snprintf(out + used, outlen - used, "%s'", n > 40 || more ? "..." : "");
}

int ckpt_read_latest(const char *checkpoints_dir, long *step, char *found, size_t foundlen) {
    char path[MT_PATH_MAX + 64], text[64];
    snprintf(path, sizeof path, "%s/%s", checkpoints_dir, CKPT_LATEST_FILE);
    char why[MT_PATH_MAX + 128];
    FILE *f = mt_fopen_regular(path, NULL, NULL, why, sizeof why); /* a FIFO is refused, not waited on */
    if (!f) {
        struct stat st;
        if (stat(path, &st) != 0 || S_ISREG(st.st_mode)) return -1;
        snprintf(found, foundlen, "nothing readable (it is %s)", mt_file_kind((unsigned int)st.st_mode));
        return -2;
    }
    size_t n = fread(text, 1, sizeof text - 1, f);
    bool more = n == sizeof text - 1 && fgetc(f) != EOF;
    fclose(f);
    text[n] = '\0';
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    while (*end == '\n' || *end == ' ' || *end == '\r') end++;
    if (end == text || (size_t)(end - text) != n || more || errno == ERANGE || v < 0) {
        describe_text(text, n, more, found, foundlen);
        return -2;
    }
    *step = v;
    return 0;
}

int ckpt_write_latest(const char *checkpoints_dir, long step, char *err, size_t errlen) {
    char path[MT_PATH_MAX + 64], tmp[MT_PATH_MAX + 96], text[32];
    snprintf(path, sizeof path, "%s/%s", checkpoints_dir, CKPT_LATEST_FILE);
    if (mt_temp_name(tmp, sizeof tmp, path) != 0) {
        mt_set_error(err, errlen, "%s: path too long", path);
        return -1;
    }
    int n = snprintf(text, sizeof text, "%ld\n", step);
    unlink(tmp);
    if (ckpt_write_file(tmp, text, (size_t)n, err, errlen) != 0) {
        unlink(tmp);
        return -1;
    }
    if (rename(tmp, path) != 0) {
        mt_set_error(err, errlen, "%s: cannot replace: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }
    return mt_sync_dir(checkpoints_dir, err, errlen);
}

/* "iter_NNNNNNN.tmp.PID", "iter_NNNNNNN.deleting" and the pointer's temporary files. */
static bool is_leftover(const char *name) {
    if (strncmp(name, CKPT_LATEST_FILE ".tmp.", strlen(CKPT_LATEST_FILE) + 5) == 0) return true;
    if (strncmp(name, "iter_", 5) != 0) return false;
    const char *dot = strchr(name, '.');
    if (!dot) return false;
    return strncmp(dot, ".tmp.", 5) == 0 || strcmp(dot, ".deleting") == 0;
}

void ckpt_remove_leftovers(const char *checkpoints_dir) {
    DIR *d = opendir(checkpoints_dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!is_leftover(e->d_name)) continue;
        char path[MT_PATH_MAX + 300], err[512];
        snprintf(path, sizeof path, "%s/%s", checkpoints_dir, e->d_name);
        if (ckpt_remove_tree(path, err, sizeof err) != 0) mt_warn("checkpoint: %s", err);
    }
    closedir(d);
}

int ckpt_save_run(const char *checkpoints_dir, long step, const CkptPayload *payload,
                  CkptWriteStats *stats, char *err, size_t errlen) {
    struct stat st;
    if (stat(checkpoints_dir, &st) != 0) { /* the first save: make checkpoints/ itself durable */
        char parent[MT_PATH_MAX];
        mt_parent_dir(checkpoints_dir, parent, sizeof parent);
        if (mt_make_dirs(checkpoints_dir, err, errlen) != 0 || mt_sync_dir(parent, err, errlen) != 0) return -1;
    }
    ckpt_remove_leftovers(checkpoints_dir);
    char dir[MT_PATH_MAX + 32];
    if (ckpt_iter_path(dir, sizeof dir, checkpoints_dir, step) != 0) {
        mt_set_error(err, errlen, "%s: path too long", checkpoints_dir);
        return -1;
    }
    if (ckpt_write_payload(dir, payload, stats, err, errlen) != 0) return -1;
    ckpt_test_slow_point();
    return ckpt_write_latest(checkpoints_dir, step, err, errlen);
}
