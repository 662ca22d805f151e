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

const char *cli_suggest_option(const char *usage, const char *arg, char *buf, int len) {
    char given[64];
    const size_t n = strcspn(arg, "=");
    if (n >= sizeof given || len <= 0) return NULL;
    memcpy(given, arg, n);
    given[n] = '\0';
    char dashed[64];
    snprintf(dashed, sizeof dashed, "%s", given);
    for (char *c = dashed; *c; c++) *c = *c == '_' ? '-' : *c;
    if (strncmp(dashed, "--", 2) != 0 && dashed[0] == '-') { /* -resume-if-exists: one dash short */
        memmove(dashed + 1, dashed, strlen(dashed) + 1);
        dashed[0] = '-';
    }
    int best_d = 3;
    buf[0] = '\0';
    for (const char *p = strstr(usage, "--"); p; p = strstr(p + 2, "--")) {
        if (p > usage && is_name_char(p[-1])) continue; /* inside a word */
        size_t m = 2;
        while (is_name_char(p[m])) m++;
        if (m <= 2 || m >= 64) continue;
        char option[64];
        memcpy(option, p, m);
        option[m] = '\0';
        const int d = strcmp(option, dashed) == 0 ? 0 : mt_edit_distance(dashed, option);
        const int longer = (int)strlen(dashed) - (int)m;
        if (d < best_d && longer >= -2 && longer <= 2 && strcmp(option, given) != 0) {
            best_d = d;
            snprintf(buf, (size_t)len, "%s", option);
        }
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
