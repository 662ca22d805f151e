/* tokenizer_added.c: finds added tokens in text, leftmost-longest as the
 * Aho-Corasick matcher of `tokenizers` (AddedVocabulary) does: at the first
 * position where any token matches, the longest one. Tokens are grouped by
 * first byte, longest first, so most positions cost one table lookup. */
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "tokenizer_internal.h"

/* qsort_r's order of the indices a and b into tokens (ctx). */
static int by_first_byte_then_longest(const void *a, const void *b, void *ctx) {
    const AddedToken *tokens = ctx;
    const AddedToken *x = &tokens[*(const int32_t *)a], *y = &tokens[*(const int32_t *)b];
    unsigned char cx = (unsigned char)x->match[0], cy = (unsigned char)y->match[0];
    if (cx != cy) return cx < cy ? -1 : 1;
    if (x->match_len != y->match_len) return x->match_len > y->match_len ? -1 : 1;
    return *(const int32_t *)a - *(const int32_t *)b;
}

void added_matcher_build(AddedMatcher *m, const AddedToken *tokens, int count, bool normalized) {
    memset(m, 0, sizeof *m);
    m->tokens = tokens;
    m->order = mt_malloc(((size_t)count + 1) * sizeof *m->order);
    int n = 0;
    for (int i = 0; i < count; i++)
        if (tokens[i].normalized == normalized && tokens[i].match_len > 0) m->order[n++] = i;
    qsort_r(m->order, (size_t)n, sizeof *m->order, by_first_byte_then_longest, (void *)tokens);
    int k = 0;
    for (int b = 0; b < 256; b++) {
        m->start[b] = (uint32_t)k;
        while (k < n && (unsigned char)tokens[m->order[k]].match[0] == b) k++;
    }
    m->start[256] = (uint32_t)k;
}

void added_matcher_free(AddedMatcher *m) {
    free(m->order);
    m->order = NULL;
}

size_t added_matcher_find(const AddedMatcher *m, const char *text, size_t len, size_t from, int *tok_index,
                          size_t *match_len) {
    if (!m->order || m->start[256] == 0) return len;
    for (size_t pos = from; pos < len; pos++) {
        unsigned char c = (unsigned char)text[pos];
        for (uint32_t k = m->start[c]; k < m->start[c + 1]; k++) {
            const AddedToken *t = &m->tokens[m->order[k]];
            if (t->match_len <= len - pos && memcmp(text + pos, t->match, t->match_len) == 0) {
                *tok_index = m->order[k];
                *match_len = t->match_len;
                return pos;
            }
        }
    }
    return len;
}
