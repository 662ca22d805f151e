/* fuzz_chat_template.c: libFuzzer harness for a model's own chat template as `data build --chat-template auto`
 * reads it (chat_template.jinja, any bytes): which of megatrain's templates it is by its marks
 * (src/data/sft_render.c) and the prose it writes beyond the published ones (src/data/sft_template_text.c). The
 * recognition is one of the four or none; the count of foreign pieces is never negative, the first of them is
 * terminated inside its buffer, and is empty exactly when there are none. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "data/sft_render.h"
#include "data/sft_template_text.h"
#include "fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    mt_log_enabled = 0;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *jinja = malloc(size + 1); /* as the file is read: its bytes, a NUL after them */
    memcpy(jinja, data, size);
    jinja[size] = '\0';
    const int which = sft_template_recognize(jinja);
    if (which != -1 && (which < SFT_TEMPLATE_LLAMA3 || which > SFT_TEMPLATE_LLAMA31)) fuzz_fail("recognized as %d", which);
    char first[64];
    memset(first, 'x', sizeof first);
    const int n = sft_template_foreign_text(jinja, first, sizeof first);
    if (n < 0) fuzz_fail("%d foreign pieces", n);
    if (!memchr(first, '\0', sizeof first)) fuzz_fail("the first foreign piece is not terminated");
    if ((n == 0) != (first[0] == '\0')) fuzz_fail("%d foreign pieces, the first '%s'", n, first);
    free(jinja);
    return 0;
}
