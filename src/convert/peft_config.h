/* peft_config.h: Hugging Face PEFT's adapter_config.json <-> PeftConfig.
 *
 * Writing gives the LoraConfig fields PeftModel.from_pretrained reads (what
 * `megatrain convert` of a LoRA checkpoint writes beside
 * adapter_model.safetensors). Reading takes what PEFT's save_pretrained
 * wrote for a plain LoRA adapter (`megatrain convert ADAPTER_DIR DST
 * --base-model BASE`): peft_type LORA, r, lora_alpha and target_modules
 * (the seven projections by name, e.g. q_proj, or by path as PEFT saves
 * "all-linear" expanded, model.layers.0.self_attn.q_proj, each projection in
 * every layer or none; or the string "all-linear"). Every other key must be
 * one known not to change what the adapters compute, or be at a default
 * that changes nothing (null or false; {} or [] only where PEFT's default is
 * that); anything else is refused naming the key: rsLoRA, DoRA, biases,
 * per-module ranks or alphas, a subset of the layers, modules saved whole,
 * regular expressions, initialisations that rewrite the base (PiSSA, OLoRA,
 * ...), activated LoRA, and keys this reader does not know. lora_dropout is a training setting that megatrain's LoRA
 * does not implement: it is read as 0 and said in `note`.
 */
#ifndef MT_CONVERT_PEFT_CONFIG_H
#define MT_CONVERT_PEFT_CONFIG_H

#include <stddef.h>

#include "../config/recipe.h"

/* Parse adapter_config.json text; `label` (the path) prefixes messages; num_layers: the base model's (0:
 * unknown, and target paths and layers_to_transform are not checked against it: read again with the base's).
 * Fills *out (type lora) and, when given, base_model with base_model_name_or_path ("" when null or absent) and note
 * with what was read differently from the file ("" when nothing). Returns 0, or -1 with err set. */
int peft_config_parse(const char *text, size_t len, const char *label, int num_layers, PeftConfig *out,
                      char *base_model, size_t base_model_len, char *note, size_t notelen, char *err, size_t errlen);

/* Read and parse the file at `path`. */
int peft_config_read(const char *path, int num_layers, PeftConfig *out, char *base_model, size_t base_model_len,
                     char *note, size_t notelen, char *err, size_t errlen);

/* adapter_config.json text for peft (malloc'd, NUL-terminated, ends with a newline): base_model_name_or_path
 * `base_model`, null when NULL; PEFT's defaults for what megatrain does not use, keys sorted as PEFT writes them. */
char *peft_config_to_json(const PeftConfig *peft, const char *base_model);

#endif
