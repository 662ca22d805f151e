/* checkpoint.h: sharded, zstd-compressed, crash-safe checkpoints (the contract).
 *
 * A checkpoint is a directory (e.g. run.dir/checkpoints/iter_0000050/) holding
 * a metadata file and one file of zstd frames per writing rank. Every tensor is
 * stored as a GLOBAL tensor cut into chunks; the metadata lists, per tensor,
 * its global shape, dtype and the chunks that hold it (file, byte offset,
 * compressed size, global offsets, shape, checksum). Any layout can therefore
 * read any other. A checkpoint becomes visible only when complete.
 *
 * Tensor names: model parameters by their registry names (model.h);
 * optimizer moments as "optimizer.m.<name>" and "optimizer.v.<name>", for
 * the trainable parameters (a LoRA run's frozen base weights are stored
 * once, without moments, or not at all: the checkpoint then references the
 * checkpoint that holds them, record BASE, and every load below takes them
 * from there after checking it).
 * The metadata also carries the model config, the resolved recipe (when the
 * checkpoint comes from a run), and the training state (when it comes from a
 * run): a plain CkptState that the training loop fills (src/train/train_ckpt.h);
 * nothing here knows the loop.
 */
#ifndef MT_CKPT_CHECKPOINT_H
#define MT_CKPT_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>

#include "../config/recipe.h"
#include "../model/model.h"
#include "ckpt_format.h"

/* The optimizer's state as a checkpoint holds it: AdamW's two moments, laid
 * out like the model's gradients (num_floats each: the model's
 * num_grad_floats, the trainable parameters, or this rank's packed ranges of
 * them under the distributed optimizer, ckpt_async.h), of
 * dtype fp32 (float) or bf16 (uint16_t bits), and the number of updates
 * applied. They are written in their dtype; a load converts what the
 * checkpoint holds into `dtype` (bf16 -> fp32 exactly, fp32 -> bf16 rounded
 * to nearest even), so a run resumes into either. */
typedef struct CkptMoments {
    long num_floats;
    CkptDType dtype; /* of m and v */
    void *m, *v;
    long step;
} CkptMoments;

/* Files a checkpoint carries for the Hugging Face export (the tokenizer
 * files and generation_config.json that `convert` took from a Hugging Face
 * directory): opaque bytes under their own names in the checkpoint
 * directory, listed in the metadata (role hf) with their size and CRC-32C,
 * written and committed with the rest. The names are those of
 * ckpt_hf_carried_names (which src/convert/hf_files.c looks for in a Hugging
 * Face directory): a checkpoint listing another is refused at the write and
 * the file left out, with a warning, at the read (a crafted
 * model.safetensors.index.json or config.json would steer the export and
 * the import of its output). */
#define CKPT_MAX_HF_FILES 16
/* What Hugging Face model directories hold besides the weights and config.json, to tokenize and to generate:
 * tokenizer.json (the fast tokenizer: Llama 3, Qwen2/3, Mistral), tokenizer_config.json (special tokens, chat
 * template before transformers 4.47), special_tokens_map.json (transformers 4), added_tokens.json,
 * tokenizer.model (SentencePiece: Llama 2, Mistral), vocab.json and merges.txt (Qwen's slow BPE tokenizer),
 * chat_template.jinja (transformers 4.47 and later) and generation_config.json; NULL-terminated. */
extern const char *const ckpt_hf_carried_names[];
#define CKPT_MAX_HF_FILE_BYTES ((size_t)256 << 20)
typedef struct CkptHfFile {
    char name[64];
    unsigned char *data;
    size_t size;
} CkptHfFile;
typedef struct CkptHfFiles {
    int count;
    CkptHfFile files[CKPT_MAX_HF_FILES];
} CkptHfFiles;

/* The hf files of checkpoint `dir` into *out (owned: ckpt_hf_files_free).
 * Each is checked against its recorded size and CRC; a missing, truncated
 * or corrupt one is left out with a warning naming it and what is wrong
 * (the weights do not depend on it). Returns 0, or -1 with err when the
 * checkpoint's metadata cannot be read. */
int ckpt_hf_files_read(const char *dir, CkptHfFiles *out, char *err, size_t errlen);
void ckpt_hf_files_free(CkptHfFiles *files);

/* Add a copy of `size` bytes as file `name` (replacing one of that name).
 * Returns 0, or -1 with err (a bad name, too many or too large files). */
int ckpt_hf_files_add(CkptHfFiles *files, const char *name, const void *data, size_t size, char *err, size_t errlen);

/* The file called `name`, or NULL. */
const CkptHfFile *ckpt_hf_files_find(const CkptHfFiles *files, const char *name);

/* What to write. recipe, moments, state and hf_files may be NULL (e.g.
 * `convert` writes weights, the model config and the hf files only). */
typedef struct CheckpointWrite {
    const ModelConfig *model_config;
    const Model *model;
    const Recipe *recipe;       /* nullable */
    const CkptMoments *moments; /* nullable */
    const CkptState *state;     /* nullable: the step, data position, RNG and schedule after the last step */
    const CkptHfFiles *hf_files; /* nullable: files carried for the Hugging Face export */
    int compression_level;      /* zstd level, 1..22 */
} CheckpointWrite;

/* Write a complete checkpoint at `dir` (which must not exist yet): written
 * under a temporary name, fsynced, renamed. Returns 0, or -1 with err set and
 * nothing left at `dir`. */
int ckpt_write_dir(const char *dir, const CheckpointWrite *what, char *err, size_t errlen);

/* Read the model config stored in checkpoint `dir`. */
int ckpt_read_model_config(const char *dir, ModelConfig *model_config, char *err, size_t errlen);

/* Load every parameter of `model` (created from a compatible config) from
 * `dir`, verifying checksums; frozen parameters that `dir` lacks come from
 * the base it references (record BASE), on any layout, once that base's
 * metadata.mtck has the recorded CRC (ckpt_check_base). Returns 0, or -1
 * with err naming the tensor, or the base and what is wrong with it. */
int ckpt_load_model(const char *dir, Model *model, char *err, size_t errlen);

/* The same for the frozen parameters only (LoRA's base weights: the
 * adapters keep what they hold, e.g. their initialisation): `init_from` a
 * converted Hugging Face checkpoint, which has no adapters. */
int ckpt_load_frozen(const char *dir, Model *model, char *err, size_t errlen);

/* ckpt_load_model (or, frozen_only, ckpt_load_frozen) for `init_from`, where
 * the recipe may add expert-bias balancing to a model trained without it: an
 * expert bias `dir` lacks starts at zero (as Megatron's). */
int ckpt_load_init(const char *dir, Model *model, bool frozen_only, char *err, size_t errlen);

/* The same for the trainable parameters only (LoRA's adapters; the frozen
 * ones keep what they hold): what the PEFT export needs, which therefore
 * works without the base a checkpoint references. */
int ckpt_load_trainable(const char *dir, Model *model, char *err, size_t errlen);

/* ---- a checkpoint's parameters read a region at a time (convert's export streams them) ---- */

typedef struct CkptParams CkptParams;
/* Open checkpoint `dir` for reading the parameters of registry `infos` (the
 * whole model of `cfg`, model_registry_of) without loading them: each one
 * checked present with its whole shape, and none of another model held.
 * A frozen parameter that a LoRA checkpoint does not store is read from the
 * base it references (opened, and checked as ckpt_load_model checks it,
 * only when `infos` holds such a parameter: the adapters alone need no
 * base). NULL with err. */
CkptParams *ckpt_params_open(const char *dir, const ModelConfig *cfg, const ParamInfo *infos, int num_params,
                             char *err, size_t errlen);
/* The box [start, start + shape) of parameter `param` (an index into the
 * registry given to ckpt_params_open) as fp32 into dst (the box's shape,
 * row-major), verifying each chunk it touches. 0, or -1 with err. */
int ckpt_params_read(CkptParams *cp, int param, const int64_t *start, const int64_t *shape, float *dst, char *err,
                     size_t errlen);
void ckpt_params_close(CkptParams *cp);

/* The DATA record of checkpoint `dir` (the datasets its run trained on) into a malloc'ed array (*datasets; NULL
 * and *count 0 when it has none: weights-only checkpoints and those written before 2026-11-30). Returns 0; 1 when
 * it has a DATA record this megatrain cannot decode (a later version's; *count 0); or -1 with err (unreadable
 * metadata). */
int ckpt_read_datasets(const char *dir, CkptDataset **datasets, int *count, char *err, size_t errlen);

/* ---- the frozen base a LoRA checkpoint references (checkpoint.frozen_base: reference) ---- */

/* The BASE record of checkpoint `dir` into *base (base->present false when
 * it stores what it holds). Returns 0, or -1 with err (unreadable metadata). */
int ckpt_read_base_ref(const char *dir, CkptBaseRef *base, char *err, size_t errlen);

/* The base that a run started from checkpoint `dir` (its init_from)
 * records: dir's own BASE record when it references one (one level: the
 * checkpoint that holds the weights), else dir itself, as an absolute path
 * with symlinks resolved, and the CRC-32C of its metadata.mtck. Returns 0,
 * or -1 with err. */
int ckpt_base_ref_of(const char *dir, CkptBaseRef *base, char *err, size_t errlen);

/* Whether checkpoint directory `dir` is one of a run's checkpoints
 * (.../checkpoints/iter_NNNNNNN), which that run's retention may delete. */
bool ckpt_is_run_checkpoint(const char *dir);

/* ---- additions for resume, inspect and the training loop ---- */

/* What the load functions below return besides 0. */
#define CKPT_ERR_UNREADABLE (-1) /* missing, incomplete or corrupt: err names the file, the tensor and the chunk */
#define CKPT_ERR_MISMATCH (-2)   /* intact, but does not fit (tensor names or shapes, no training state) */
#define CKPT_ERR_BASE (-3)       /* intact, but the frozen base it references is missing, changed or unreadable: err
                                  * names the checkpoint, the base, what is wrong and how to fix it */

/* When checkpoint `dir` references a frozen base: that the base directory
 * exists, its metadata.mtck has the recorded CRC-32C and it opens. Returns
 * 0 (also when there is no reference), CKPT_ERR_BASE, or CKPT_ERR_UNREADABLE
 * (dir's own metadata), with err set. Nothing is modified. */
int ckpt_check_base(const char *dir, char *err, size_t errlen);

/* Load what a resumed run needs from `dir`, verifying every checksum: all
 * parameters of `model`; when `moments` is not NULL the optimizer's moments
 * (into m and v, laid out like the model's params, converted to
 * moments->dtype) and step (else the caller keeps a fresh optimizer); when
 * `state` is not NULL the training state
 * (step, consumed samples and tokens, RNG, ...). Frozen parameters come
 * from the referenced base as for ckpt_load_model. Returns 0,
 * CKPT_ERR_UNREADABLE, CKPT_ERR_MISMATCH or CKPT_ERR_BASE (anything wrong
 * with the base, its tensors included: the checkpoint itself is fine), with
 * err set. */
int ckpt_load_training(const char *dir, Model *model, CkptMoments *moments, CkptState *state, char *err,
                       size_t errlen);

/* The step a checkpoint was written at (its training state), read from its
 * metadata alone. Returns 0, or CKPT_ERR_UNREADABLE / CKPT_ERR_MISMATCH
 * (no training state: e.g. written by convert) with err set. */
int ckpt_read_step(const char *dir, long *step, char *err, size_t errlen);

#endif
