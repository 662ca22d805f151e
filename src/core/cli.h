/* cli.h: what every command says of an argument it does not know: the
 * option named, the nearest of its own options (a typo's), its usage
 * synopsis and where --help is, rather than the whole help text after the
 * error (which buried it). The options are read from the usage text itself,
 * so no list repeats them. Also the edit distance the recipe's "did you
 * mean" uses. */
#ifndef MT_CORE_CLI_H
#define MT_CORE_CLI_H

/* Levenshtein distance of a and b (99 when either is longer than 63 bytes). */
int mt_edit_distance(const char *a, const char *b);

/* The option of `usage` (each "--name" in it) nearest to `arg` (its part before an '='): the same with '_' for '-',
 * or within edit distance 2 (lengths within 2); NULL for none. The name is written into buf (len bytes). */
const char *cli_suggest_option(const char *usage, const char *arg, char *buf, int len);

/* "megatrain: error: COMMAND: unknown option 'ARG' (did you mean '--x'?)", then usage's synopsis (its lines up to
 * the first empty one) and "run `megatrain COMMAND --help` for the options" on stderr. The caller exits 2. */
void cli_unknown_option(const char *command, const char *arg, const char *usage);

#endif
