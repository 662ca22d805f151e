/* fuzz_recipe_yaml.c: libFuzzer harness for recipe YAML (src/config: libyaml
 * to the node tree, aliases, --set overrides, reading and validating every
 * key, `model: PATH` files). The input up to its first NUL byte is the
 * recipe file; each NUL-separated piece after it is a --set argument
 * ("key.path=value", at most 8). A recipe that loads must be written by
 * recipe_write to a file that loads back and writes the same bytes again
 * (after its first line, a comment naming the source). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config/recipe.h"
#include "core/error.h"
#include "fuzz_util.h"

#define MAX_SETS 8

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    mt_log_enabled = 0;
    return 0;
}

/* The bytes of file `path` (malloc'ed, *len set). */
static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fuzz_fail("cannot read back %s", path);
    char *buf = NULL;
    size_t cap = 0;
    *len = 0;
    for (;;) {
        if (*len == cap) buf = realloc(buf, cap = cap ? 2 * cap : 4096);
        size_t got = fread(buf + *len, 1, cap - *len, f);
        if (got == 0) break;
        *len += got;
    }
    fclose(f);
    return buf;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = '\0';
    size_t recipe_len = strlen(text);
    const char *sets[MAX_SETS];
    int num_sets = 0;
    for (const char *p = text + recipe_len + 1; p < text + size && num_sets < MAX_SETS; p += strlen(p) + 1)
        if (*p) sets[num_sets++] = p;

    static Recipe recipe; /* large: not on the stack */
    char err[4096] = "";
    char path[600], first[600], second[600];
    snprintf(path, sizeof path, "%s", fuzz_write("recipe.yaml", text, recipe_len));
    snprintf(first, sizeof first, "%s/resolved.yaml", fuzz_dir());
    snprintf(second, sizeof second, "%s/resolved2.yaml", fuzz_dir());
    if (recipe_load(&recipe, path, sets, num_sets, 0, err, sizeof err) != 0) {
        if (!err[0]) fuzz_fail("recipe_load failed without a message");
        free(text);
        return 0;
    }
    if (recipe_write(&recipe, first, err, sizeof err) != 0) fuzz_fail("recipe_write: %s", err);
    if (recipe_load(&recipe, first, NULL, 0, 0, err, sizeof err) != 0)
        fuzz_fail("the written recipe does not load back: %s", err);
    if (recipe_write(&recipe, second, err, sizeof err) != 0) fuzz_fail("recipe_write (again): %s", err);
    size_t len1, len2;
    char *a = slurp(first, &len1), *b = slurp(second, &len2);
    /* the first line is a comment naming the file it came from */
    const char *body1 = memchr(a, '\n', len1), *body2 = memchr(b, '\n', len2);
    if (!body1 || !body2 || len1 - (size_t)(body1 - a) != len2 - (size_t)(body2 - b) ||
        memcmp(body1, body2, len1 - (size_t)(body1 - a)) != 0)
        fuzz_fail("the written recipe loads back to another recipe:\n%.*s\n--- written again:\n%.*s", (int)len1, a,
                  (int)len2, b);
    free(a);
    free(b);
    free(text);
    return 0;
}
