/* sft_render.h: one supervised fine-tuning record -> text segments, each
 * either counted in the loss (assistant / completion text and its
 * end-of-turn token) or masked (system, user, prompt and template text).
 *
 * Records (one JSON object per JSONL line):
 *   {"prompt": "...", "completion": "..."}   (and an optional "system": "...")
 *   {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
 *   {"prompt": [messages...], "completion": [messages...]}   (TRL's conversational
 *       prompt-completion: rendered as one conversation, only the completion's
 *       assistant messages counted)
 * (an assistant message's "reasoning_content" string is read by qwen3)
 *
 * Chat templates, written in C after what the published Jinja templates
 * render for plain text messages (no tools, no images; arbitrary Jinja is
 * not evaluated):
 *   llama3  Meta-Llama-3-8B-Instruct: "<|begin_of_text|>", then per message
 *           "<|start_header_id|>ROLE<|end_header_id|>\n\n" + content|trim +
 *           "<|eot_id|>". Counted: an assistant message's trimmed content
 *           and its "<|eot_id|>".
 *   llama3.1 Llama 3.1 / 3.2 / 3.3 Instruct: llama3 with a system turn
 *           always, "Cutting Knowledge Date: December 2023\nToday Date: 26
 *           Jul 2024\n\n" + the first message's content|trim when it is a
 *           system message (the template's date when none is given). Counted
 *           as llama3.
 *   chatml  Qwen2.5 Instruct: "<|im_start|>system\nYou are Qwen, created by
 *           Alibaba Cloud. You are a helpful assistant.<|im_end|>\n" when the
 *           first message is not a system message, then per message
 *           "<|im_start|>ROLE\n" + content + "<|im_end|>\n". Counted: an
 *           assistant message's content and its "<|im_end|>" (not the "\n").
 *   qwen3   Qwen3: chatml without a default system message, and an
 *           assistant message's reasoning (its "reasoning_content", else
 *           what its content holds before "</think>") kept only after the
 *           last user message: there "<think>\n" + reasoning + "\n</think>\n\n"
 *           comes before the content (always for the last message; an empty
 *           block is what the prompt holds with enable_thinking=False), and
 *           earlier replies lose theirs. Counted: the content, "<|im_end|>"
 *           and a non-empty think block; an empty one is masked.
 * A prompt/completion record under a template is a user message and an
 * assistant message, after its "system" as a system message. Without a
 * template (SFT_TEMPLATE_NONE) only prompt/completion records without
 * "system" are accepted: the prompt's text is masked, the
 * completion's counted, and the caller appends the end-of-document token
 * (counted).
 */
#ifndef MT_DATA_SFT_RENDER_H
#define MT_DATA_SFT_RENDER_H

#include <stdbool.h>
#include <stddef.h>

#include "../core/json.h"

typedef enum {
    SFT_TEMPLATE_NONE = 0,
    SFT_TEMPLATE_LLAMA3,
    SFT_TEMPLATE_CHATML,
    SFT_TEMPLATE_QWEN3,
    SFT_TEMPLATE_LLAMA31,
} SftTemplate;

/* "llama3" / "llama3.1" / "chatml" / "qwen3" -> the template; -1 for another name. */
int sft_template_from_name(const char *name);
const char *sft_template_name(SftTemplate t);
/* "llama3, llama3.1, chatml, qwen3": the names sft_template_from_name accepts. */
const char *sft_template_names(void);
/* Which of these templates a model's own chat_template (Jinja text) is, by what only it writes: Qwen3's
 * enable_thinking switch, Qwen2.5's default system prompt, Llama 3.1's "Cutting Knowledge Date", Llama 3's
 * header tokens; -1 for another (Qwen3-2507's, Mistral's, a custom one without those marks; one with them and
 * prose of its own: sft_template_text.h). */
int sft_template_recognize(const char *jinja);
/* The special tokens template t writes (*count of them; none for SFT_TEMPLATE_NONE): each must be one token of
 * the tokenizer the records are tokenized with. */
const char *const *sft_template_special_tokens(SftTemplate t, int *count);

typedef struct SftSegment {
    size_t start, len;  /* into SftRendered.text */
    bool counted;       /* in the loss */
} SftSegment;

typedef struct SftRendered {
    char *text;
    size_t len, cap;
    SftSegment *segments;
    size_t nsegments, segments_cap;
    size_t empty_replies; /* trained assistant messages (completions) whose content is empty or whitespace only
                           * (and, under qwen3, without reasoning): only their end of turn is trained */
} SftRendered;

/* Render record under template t into out (cleared first). 0, or -1 with
 * why saying what is wrong with the record ("no \"completion\" field",
 * "messages[2]: unknown role \"tool\" (expected system, user or assistant)").
 */
int sft_render(const JsonValue *record, SftTemplate t, SftRendered *out, char *why, size_t whylen);
void sft_rendered_free(SftRendered *r);

#endif
