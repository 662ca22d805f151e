/* hf_files.h: the files of a Hugging Face model directory that are neither
 * weights nor config.json but that a user needs to run the model: the
 * tokenizer files and generation_config.json. `convert` carries them
 * through a megatrain checkpoint as opaque bytes (checkpoint.h,
 * CkptHfFiles): HF -> megatrain takes those present, megatrain -> HF writes
 * them back byte for byte. None is parsed. */
#ifndef MT_CONVERT_HF_FILES_H
#define MT_CONVERT_HF_FILES_H

#include <stddef.h>

#include "../ckpt/checkpoint.h"
#include "../config/recipe.h"

/* Read the carried files present in Hugging Face directory `dir` into *out
 * (each one of hf_files.c's table that exists, symlinks followed, as the
 * Hub's cache holds them). Returns 0, or -1 with err naming a file that
 * exists but cannot be read (out is then empty). */
int hf_files_collect(const char *dir, CkptHfFiles *out, char *err, size_t errlen);

/* Write `files` into directory `dir`, and a generation_config.json made
 * from cfg's token ids when files has none (as transformers writes one for
 * a model that has none). Returns 0, or -1 with err naming the file. */
int hf_files_write(const char *dir, const CkptHfFiles *files, const ModelConfig *cfg, char *err, size_t errlen);

/* Write each of `files` into directory `dir`, and nothing else. 0, or -1 with err naming the file. */
int hf_files_write_each(const char *dir, const CkptHfFiles *files, char *err, size_t errlen);

/* A Hugging Face directory written whole into `tmp` made `dst`: tmp's names synced, renamed (never replacing: a
 * DST made meanwhile is kept, an error), the parent synced, so that after a power loss DST is whole or absent.
 * 0, or -1 with err (tmp is then the caller's to remove; a DST whose parent could not be synced is removed). */
int hf_dir_commit(const char *tmp, const char *dst, char *err, size_t errlen);

/* The tokenizer's files among `files`: all but generation_config.json, which describes the model (what a PEFT
 * adapter directory carries beside the adapters). A view: its data are files' (not to be freed). */
CkptHfFiles hf_files_tokenizer(const CkptHfFiles *files);

/* "tokenizer.json, generation_config.json" (the names of files) into out; "none" when empty. */
void hf_files_list(const CkptHfFiles *files, char *out, size_t outlen);

#endif
