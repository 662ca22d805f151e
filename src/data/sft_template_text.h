/* sft_template_text.h: the text a model's own chat template writes that none of the published templates megatrain
 * renders writes: a default system prompt or instructions of its own, which megatrain's rendering of the published
 * template would leave out. */
#ifndef MT_DATA_SFT_TEMPLATE_TEXT_H
#define MT_DATA_SFT_TEMPLATE_TEXT_H

#include <stddef.h>

/* How many pieces of prose (a string literal or text outside tags, of three words or more once special tokens and
 * tags are set aside) Jinja template `jinja` writes that no published template megatrain renders writes (compared
 * with whitespace and special tokens set aside); the first, shortened to fit, into first[len]. */
int sft_template_foreign_text(const char *jinja, char *first, size_t len);

#endif
