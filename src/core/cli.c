/* cli.c: unknown options said with the nearest known one (cli.h). */
#include "cli.h"

#include <stdio.h>
#include <string.h>

#include "error.h"

int mt_edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    int row[64];
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diagonal = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int above = row[j];
            int best = diagonal + (a[i - 1] != b[j - 1]);
            if (above + 1 < best) best = above + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diagonal = above;
        }
    }
    return row[lb];
}

static int is_name_char(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; }

/* The option names of `text` (n bytes): each "--name" not inside a word, the nearest to `dashed` into buf. */
static void scan_options(const char *text, size_t n, const char *dashed, const char *given, int *best_d, char *buf,
                         int len) {
    for (size_t i = 0; i + 2 < n; i++) {
        if (text[i] != '-' || text[i + 1] != '-' || (i > 0 && is_name_char(text[i - 1]))) continue;
        size_t m = 2;
        while (i + m < n && is_name_char(text[i + m])) m++;
        if (m <= 2 || m >= 64) continue;
        char option[64];
        memcpy(option, text + i, m);
        option[m] = '\0';
        i += m - 1;
        const int d = strcmp(option, dashed) == 0 ? 0 : mt_edit_distance(dashed, option);
        const int longer = (int)strlen(dashed) - (int)m;
        if (d < *best_d && longer >= -2 && longer <= 2 && strcmp(option, given) != 0) {
            *best_d = d;
            snprintf(buf, (size_t)len, "%s", option);
        }
    }
}

const char *cli_suggest_option(const char *usage, const char *arg, char *buf, int len) {
    char given[64], dashed[66];
    const size_t n = strcspn(arg, "=");
    if (n >= sizeof given || len <= 0) return NULL;
    memcpy(given, arg, n);
    given[n] = '\0';
    char spelled[64]; /* '_' read as '-' */
    for (size_t i = 0; i <= n; i++) spelled[i] = given[i] == '_' ? '-' : given[i];
    /* one dash short: -resume-if-exists */
    snprintf(dashed, sizeof dashed, "%s%s", spelled[0] == '-' && spelled[1] != '-' ? "-" : "", spelled);
    int best_d = 3;
    buf[0] = '\0';
    /* the command's own options: those of its synopsis (up to the first empty line) and of its option table (a line
     * that starts with spaces and "--": its first column); not the examples' and the prose's, which name other
     * commands' options too */
    const char *blank = strstr(usage, "\n\n");
    const size_t synopsis = blank ? (size_t)(blank - usage) : strlen(usage);
    scan_options(usage, synopsis, dashed, given, &best_d, buf, len);
    for (const char *line = usage + synopsis; *line;) {
        const size_t line_len = strcspn(line, "\n");
        const size_t indent = strspn(line, " ");
        if (indent > 0 && indent + 2 < line_len && line[indent] == '-' && line[indent + 1] == '-') {
            const char *gap = strstr(line + indent, "  "); /* the column ends at two spaces */
            const size_t column = gap && (size_t)(gap - line) < line_len ? (size_t)(gap - line) : line_len;
            scan_options(line, column, dashed, given, &best_d, buf, len);
        }
        line += line_len + (line[line_len] == '\n');
    }
    return buf[0] ? buf : NULL;
}

void cli_unknown_option(const char *command, const char *arg, const char *usage) {
    char near[64], suggestion[96] = "";
    if (cli_suggest_option(usage, arg, near, sizeof near))
        snprintf(suggestion, sizeof suggestion, " (did you mean %s?)", near);
    const char *blank = strstr(usage, "\n\n");
    const int synopsis = blank ? (int)(blank - usage) : (int)strlen(usage);
    mt_error("%s: unknown option '%s'%s\n%.*s\nrun `megatrain %s --help` for the options", command, arg, suggestion,
             synopsis, usage, command);
}
