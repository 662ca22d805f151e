/* fs.c: mkdir -p, temporary names beside a file, fsync-then-close, opening an input file
 * without blocking on a FIFO, and reading a whole file. */
#include "fs.h"

#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"

int mt_make_dirs_made(const char *dir, char *made, size_t madelen, char *err, size_t errlen) {
    char path[4096];
    size_t n = strlen(dir);
    if (made && madelen > 0) made[0] = '\0';
    if (n == 0) return 0;
    if (n >= sizeof(path)) {
        mt_set_error(err, errlen, "%s: path too long", dir);
        return -1;
    }
    memcpy(path, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if ((path[i] != '/' && path[i] != '\0') || path[i - 1] == '/') continue; /* "a//b", "a/": one component */
        char saved = path[i];
        path[i] = '\0';
        if (mkdir(path, 0777) == 0) {
            if (made && madelen > 0 && !made[0]) snprintf(made, madelen, "%s", path);
        } else if (errno == EEXIST) {
            if (made && madelen > 0) made[0] = '\0'; /* there already (another process's): not ours, nor above */
        } else {
            mt_set_error(err, errlen, "%s: cannot create directory: %s", path, strerror(errno));
            return -1;
        }
        path[i] = saved;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        mt_set_error(err, errlen, "%s: exists and is not a directory", dir);
        return -1;
    }
    return 0;
}

int mt_make_dirs(const char *dir, char *err, size_t errlen) {
    return mt_make_dirs_made(dir, NULL, 0, err, errlen);
}

void mt_remove_made_dirs(const char *dir, const char *made) {
    char path[4096];
    const size_t top = strlen(made);
    size_t n = strlen(dir);
    if (top == 0 || n >= sizeof path || strncmp(dir, made, top) != 0) return;
    memcpy(path, dir, n + 1);
    for (;;) {
        while (n > 1 && path[n - 1] == '/') path[--n] = '\0';
        /* (one not there: the making failed before it, e.g. a name too long; its parents made on the way still go) */
        if (n < top || (rmdir(path) != 0 && errno != ENOENT && errno != ENAMETOOLONG) || n == top) return;
        while (n > 0 && path[n - 1] != '/') n--; /* up to the parent */
        path[n] = '\0';
    }
}

int mt_make_parent_dirs(const char *path, char *err, size_t errlen) {
    char dir[4096];
    size_t n = strlen(path);
    if (n >= sizeof(dir)) {
        mt_set_error(err, errlen, "%s: path too long", path);
        return -1;
    }
    memcpy(dir, path, n + 1);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return 0;
    *slash = '\0';
    return mt_make_dirs(dir, err, errlen);
}

int mt_temp_name(char *out, size_t outlen, const char *path) {
    int n = snprintf(out, outlen, "%s.tmp.%ld", path, (long)getpid());
    return (n < 0 || (size_t)n >= outlen) ? -1 : 0;
}

/* This machine's name as it appears in temporary names. */
static void host_tag(char *out, size_t outlen) {
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0 || !host[0]) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    size_t n = 0;
    for (const char *c = host; *c && n + 1 < outlen && n < 64; c++, n++)
        out[n] = ((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-')
                     ? *c : '_';
    out[n] = '\0';
}

int mt_temp_name_host(char *out, size_t outlen, const char *path) {
    char host[80];
    host_tag(host, sizeof host);
    int n = snprintf(out, outlen, "%s.tmp.%s.%ld", path, host, (long)getpid());
    return (n < 0 || (size_t)n >= outlen) ? -1 : 0;
}

static int unlink_path(const char *path) { return unlink(path); }

int mt_remove_stale_temps(const char *path, char *first, size_t firstlen) {
    return mt_remove_stale_temps_with(path, unlink_path, first, firstlen);
}

int mt_remove_stale_temps_with(const char *path, int (*remove_one)(const char *path), char *first, size_t firstlen) {
    char dir[4096], host[80], prefix[4400];
    mt_parent_dir(path, dir, sizeof dir);
    host_tag(host, sizeof host);
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    const int plen = snprintf(prefix, sizeof prefix, "%s.tmp.%s.", base, host);
    if (plen < 0 || (size_t)plen >= sizeof prefix) return 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int removed = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, (size_t)plen) != 0) continue;
        const char *digits = e->d_name + plen;
        char *end;
        errno = 0;
        const long pid = strtol(digits, &end, 10);
        if (end == digits || *end || errno || pid <= 0 || (pid_t)pid == getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue; /* alive, or not ours to judge */
        char full[8600];
        snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
        if (remove_one(full) != 0) continue;
        if (removed++ == 0 && first) snprintf(first, firstlen, "%s", full);
    }
    closedir(d);
    return removed;
}

int mt_sync_close(int fd) {
    int rc = fsync(fd);
    int saved = errno;
    if (close(fd) != 0 && rc == 0) return -1;
    errno = saved;
    return rc;
}

int mt_fclose_sync(FILE *f) {
    int rc = fflush(f) == 0 && !ferror(f) && fsync(fileno(f)) == 0 ? 0 : -1;
    const int saved = errno;
    if (fclose(f) != 0 && rc == 0) return -1;
    errno = saved;
    return rc;
}

int mt_sync_dir(const char *dir, char *err, size_t errlen) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || mt_sync_close(fd) != 0) {
        mt_set_error(err, errlen, "%s: cannot fsync the directory: %s", dir, strerror(errno));
        return -1;
    }
    return 0;
}

void mt_parent_dir(const char *path, char *out, size_t outlen) {
    snprintf(out, outlen, "%s", path);
    size_t n = strlen(out);
    while (n > 1 && out[n - 1] == '/') out[--n] = '\0';
    char *slash = strrchr(out, '/');
    if (!slash) snprintf(out, outlen, ".");
    else if (slash == out) out[1] = '\0';
    else *slash = '\0';
}

int mt_rename_noreplace(const char *from, const char *to) {
#ifdef RENAME_NOREPLACE
    if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS) return -1;
#endif
    /* File systems without RENAME_NOREPLACE: check, then rename (rename
     * would replace an empty directory, never a checkpoint's full one). */
    struct stat st;
    if (lstat(to, &st) == 0) {
        errno = EEXIST;
        return -1;
    }
    return rename(from, to);
}

int mt_write_all(int fd, const void *data, size_t n) {
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (w == 0) {
            errno = EIO;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

const char *mt_file_kind(unsigned int mode) {
    switch (mode & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFIFO: return "a FIFO";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFSOCK: return "a socket";
    case S_IFLNK: return "a symbolic link";
    default: return "an unknown kind of file";
    }
}

static _Atomic int env_error;

void mt_env_error_note(int e) {
    switch (e) {
    case EMFILE: case ENFILE: case ENOMEM: case ENOBUFS: case EAGAIN: case EACCES: case EPERM:
        atomic_store(&env_error, e);
        break;
    default: break;
    }
}

int mt_env_error(void) { return atomic_load(&env_error); }
void mt_env_error_clear(void) { atomic_store(&env_error, 0); }

int mt_open_regular(const char *path, const char *expected, uint64_t *size, char *err, size_t errlen) {
    int fd;
    do fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        mt_env_error_note(errno);
        mt_set_error(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        mt_env_error_note(errno);
        mt_set_error(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        const char *kind = mt_file_kind((unsigned int)st.st_mode);
        mt_set_error(err, errlen, "%s: is %s, expected %s", path, kind, expected ? expected : "a regular file");
        close(fd);
        return -1;
    }
    const int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        mt_set_error(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    if (size) *size = (uint64_t)st.st_size;
    return fd;
}

FILE *mt_fopen_regular(const char *path, const char *expected, uint64_t *size, char *err, size_t errlen) {
    const int fd = mt_open_regular(path, expected, size, err, errlen);
    if (fd < 0) return NULL;
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        mt_env_error_note(errno);
        mt_set_error(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

FILE *mt_fopen_output(const char *path, bool append, char *err, size_t errlen) {
    int fd;
    do fd = open(path, O_WRONLY | O_CREAT | O_NONBLOCK | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0666);
    while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        if (errno == ENXIO) mt_set_error(err, errlen, "%s: is a FIFO, expected a regular file to write", path);
        else mt_set_error(err, errlen, "%s: cannot open for writing: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    const int flags = fcntl(fd, F_GETFL);
    FILE *f = NULL;
    if (fstat(fd, &st) != 0)
        mt_set_error(err, errlen, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(st.st_mode))
        mt_set_error(err, errlen, "%s: is %s, expected a regular file", path, mt_file_kind((unsigned int)st.st_mode));
    else if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0 || !(f = fdopen(fd, append ? "a" : "w")))
        mt_set_error(err, errlen, "%s: cannot open for writing: %s", path, strerror(errno));
    if (!f) close(fd);
    return f;
}

char *mt_read_file(const char *path, size_t max_bytes, size_t *len, char *err, size_t errlen) {
    uint64_t size = 0;
    FILE *f = mt_fopen_regular(path, NULL, &size, err, errlen);
    if (!f) return NULL;
    if (size > max_bytes) {
        mt_set_error(err, errlen, "%s: larger than %zu bytes (%llu)", path, max_bytes, (unsigned long long)size);
        fclose(f);
        return NULL;
    }
    char *text = mt_malloc((size_t)size + 1);
    *len = fread(text, 1, (size_t)size, f);
    const int read_errno = ferror(f) ? errno : 0;
    const bool failed = read_errno != 0 || *len != (size_t)size;
    fclose(f);
    if (failed) {
        mt_set_error(err, errlen, "%s: cannot read: %s", path, read_errno ? strerror(read_errno) : "the file changed size");
        free(text);
        return NULL;
    }
    text[*len] = '\0';
    return text;
}

int mt_lock_file(const char *path, char *holder, size_t holderlen) {
    static int held = -1; /* the one file this process locks (a run's directory's), whatever path names it */
    struct stat mine, asked;
    if (held >= 0 && fstat(held, &mine) == 0 && stat(path, &asked) == 0 && mine.st_dev == asked.st_dev &&
        mine.st_ino == asked.st_ino)
        return 0;
    if (holderlen) holder[0] = '\0';
    const int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        const int why = errno;
        if (why == EWOULDBLOCK && holderlen) {
            const ssize_t n = read(fd, holder, holderlen - 1);
            holder[n > 0 ? n : 0] = '\0';
            holder[strcspn(holder, "\n")] = '\0';
        }
        close(fd);
        errno = why;
        return why == EWOULDBLOCK ? 1 : -1;
    }
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "?");
    char line[320];
    const int n = snprintf(line, sizeof line, "pid %ld on %s\n", (long)getpid(), host);
    if (ftruncate(fd, 0) != 0 || mt_write_all(fd, line, (size_t)n) != 0) { /* the lock holds without the line */ }
    held = fd;
    return 0; /* fd stays open: the lock lasts until the process ends */
}

bool mt_same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return a[0] && b[0] && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int mt_path_stat_status(int e) {
    return e == ENOENT || e == ENOTDIR ? MT_EXIT_USAGE : MT_EXIT_FAILURE;
}
