/* build_reader.c: `data build`'s input, read in chunks into batches of whole
 * lines (see build_internal.h). A batch ends at the first line end after
 * `target` bytes; the start of the next line is carried over to the next
 * batch. No line may be longer than max_line bytes: reading stops there
 * with an error naming the file and the line, so that a file without line
 * ends (or one enormous JSON line) costs max_line of memory, not its size.
 * The input's last line may lack its '\n'.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/error.h"
#include "build_internal.h"

int build_reader_open(BuildReader *r, const char *path, size_t max_line, InputFormat format,
                      volatile sig_atomic_t *stop, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    r->path = path;
    r->max_line = max_line;
    r->format = format;
    r->stop = stop;
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0) {
        mt_set_error(err, errlen, "data build: --input %s: cannot read: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

void build_reader_close(BuildReader *r) {
    if (r->fd >= 0) close(r->fd);
    r->fd = -1;
    free(r->carry);
    r->carry = NULL;
    r->carry_len = r->carry_cap = 0;
}

static int blank_char(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v'; }

/* The format from the first non-blank line of text, if any. */
static InputFormat detect_format(const char *text, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (!blank_char(text[i])) return text[i] == '{' ? FORMAT_JSONL : FORMAT_TEXT;
    return FORMAT_UNKNOWN;
}

static int line_too_long(const BuildReader *r, int64_t line, char *err, size_t errlen) {
    mt_set_error(err, errlen, "%s:%lld: line longer than %zu bytes (--max-line-mib %zu): each line must be one "
                 "document of plain text or one JSON object, and a file without line ends cannot be read; a longer "
                 "document needs a larger --max-line-mib (at most 1024)", r->path, (long long)line, r->max_line,
                 r->max_line >> 20);
    return READ_ERROR;
}

int build_reader_fill(BuildReader *r, BuildText *out, size_t target, char *err, size_t errlen) {
    out->len = 0;
    out->lines = 0;
    out->last_unterminated = false;
    out->first_line = r->lines + 1;
    out->text = mt_grow(out->text, &out->cap, r->carry_len + BUILD_READ_CHUNK, 1);
    if (r->carry_len) memcpy(out->text, r->carry, r->carry_len);
    out->len = r->carry_len;
    r->carry_len = 0;
    size_t line_start = 0, scanned = 0; /* the current, unfinished line starts at line_start */
    int64_t newlines = 0;
    for (;;) {
        while (scanned < out->len) {
            const char *nl = memchr(out->text + scanned, '\n', out->len - scanned);
            if (!nl) {
                scanned = out->len;
                break;
            }
            size_t at = (size_t)(nl - out->text);
            if (at - line_start > r->max_line) return line_too_long(r, r->lines + newlines + 1, err, errlen);
            newlines++;
            line_start = scanned = at + 1;
        }
        if (out->len - line_start > r->max_line) return line_too_long(r, r->lines + newlines + 1, err, errlen);
        if (line_start >= target || r->eof) break;
        out->text = mt_grow(out->text, &out->cap, out->len + BUILD_READ_CHUNK, 1);
        ssize_t got = read(r->fd, out->text + out->len, BUILD_READ_CHUNK);
        if (got < 0) {
            if (errno != EINTR) {
                mt_set_error(err, errlen, "%s: read failed: %s", r->path, strerror(errno));
                return READ_ERROR;
            }
            if (*r->stop) {
                r->lines += newlines;
                return READ_STOPPED;
            }
            continue;
        }
        if (got == 0) r->eof = true;
        /* a UTF-8 byte-order mark (Windows editors, utf-8-sig exports) marks the encoding: it is not text, and it
         * would hide the first line's '{' from detect_format and from the JSON parser */
        size_t kept = (size_t)got;
        if (r->bytes == 0 && got >= 3 && memcmp(out->text + out->len, "\xEF\xBB\xBF", 3) == 0) {
            memmove(out->text + out->len, out->text + out->len + 3, kept - 3);
            kept -= 3;
            r->bom_skipped = true;
        }
        out->len += kept;
        r->bytes += got;
    }
    if (!r->eof) { /* carry the unfinished line over */
        size_t rest = out->len - line_start;
        r->carry = mt_grow(r->carry, &r->carry_cap, rest + 1, 1);
        if (rest) memcpy(r->carry, out->text + line_start, rest);
        r->carry_len = rest;
        out->len = line_start;
    } else if (line_start < out->len) {
        out->last_unterminated = true;
        newlines++;
    }
    out->lines = newlines;
    r->lines += newlines;
    if (out->len == 0) return READ_END;
    if (r->format == FORMAT_UNKNOWN) r->format = detect_format(out->text, out->len);
    return READ_OK;
}
