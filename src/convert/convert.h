/* convert.h: `megatrain convert SRC DST`: Hugging Face model directory <->
 * megatrain checkpoint (direction from SRC: a directory with config.json is
 * Hugging Face; anything else must be a megatrain checkpoint).
 *
 * HF -> megatrain reads config.json and the safetensors (one file or
 * sharded), maps names and shapes through the family's table and writes a
 * checkpoint holding the model config and fp32 weights. megatrain -> HF
 * writes config.json and safetensors (sharded above --max-shard-size, with
 * model.safetensors.index.json) in the checkpoint's fp32 or --dtype.
 * Nothing is written unless every tensor checks out; DST appears only when
 * complete (written under a temporary name, then renamed). A checkpoint of a
 * LoRA run (peft) becomes PEFT's adapter directory, or with --merge-lora the
 * merged Hugging Face model (lora_export.h); PEFT's adapter directory
 * with its base model becomes a LoRA checkpoint (convert_peft_to_ckpt). A
 * model trained with expert-bias routing, which transformers lacks, is
 * exported only with --drop-expert-bias, which says what that changes
 * (expert_bias_drop.h).
 */
#ifndef MT_CONVERT_CONVERT_H
#define MT_CONVERT_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "../model/model.h"
#include "lora_export.h"
#include "peft_tensors.h"
#include "safetensors.h"

typedef struct ConvertOptions {
    StDtype dtype;            /* megatrain -> HF: stored dtype (default: the model's export_dtype; PEFT adapters F32) */
    bool dtype_given;
    uint64_t max_shard_bytes; /* megatrain -> HF: default 5 GB */
    bool progress;            /* a progress line on stderr (when it is a terminal) */
    bool merge_lora;          /* megatrain (LoRA) -> HF: the merged model, not the PEFT adapters (lora_export.h) */
    const char *base_model;   /* megatrain (LoRA) -> PEFT: adapter_config.json's base_model_name_or_path, or NULL */
    bool drop_expert_bias;    /* megatrain -> HF: leave the routers' expert biases out (expert_bias_drop.h) */
} ConvertOptions;

/* The command: argv[0] is the first argument after "convert". Returns the exit status. */
int convert_main(int argc, char **argv);

/* The two directions. Return 0, or -1 with err set and nothing at dst. */
int convert_hf_to_ckpt(const char *src, const char *dst, const ConvertOptions *options, char *err, size_t errlen);
int convert_ckpt_to_hf(const char *src, const char *dst, const ConvertOptions *options, char *err, size_t errlen);
/* PEFT's adapter directory (adapter_config.json, adapter_model.safetensors) on its base -> a LoRA checkpoint:
 * with a Hugging Face base directory holding both, with a megatrain checkpoint as the base the adapters alone,
 * referencing it (convert_peft.c; peft_config.h says which adapters are read). */
int convert_peft_to_ckpt(const char *adapter_dir, const char *base, const char *dst, const ConvertOptions *options,
                         char *err, size_t errlen);

/* Hugging Face directory src (its config.json read into *cfg, which the caller has checked model.yaml can hold:
 * ckpt_model_config_check; a LoRA model's adapters from `adapters` when given) -> checkpoint dst; `what` names
 * what was converted in the closing line. convert_hf_to_ckpt.c. */
int convert_hf_model_to_ckpt(const char *src, ModelConfig *cfg, const PeftTensors *adapters, const char *what,
                             const char *dst, const ConvertOptions *options, char *err, size_t errlen);

/* A LoRA checkpoint's adapters, read into memory (a few MiB whatever the
 * base's size; the base is not opened): `view` describes them, over the
 * whole LoRA model's registry (its first num_base parameters the base's,
 * then the adapters). view.cfg points at cfg: keep the struct where
 * ckpt_adapters_read filled it (do not copy it). convert_lora.c. */
typedef struct CkptAdapters {
    LoraAdapters view;
    ModelConfig cfg;
    ParamInfo *infos;
    int num_base;
    long num_floats; /* the whole LoRA model's, base included */
    float *values;
} CkptAdapters;
int ckpt_adapters_read(const char *ckpt, const ModelConfig *cfg, CkptAdapters *out, char *err, size_t errlen);
void ckpt_adapters_free(CkptAdapters *adapters);

/* The adapters of LoRA checkpoint ckpt (model config cfg) as PEFT's
 * directory dst (written into a temporary directory, then renamed).
 * convert_lora.c. */
/* Whether --base-model names a path that is not there (what only a path looks like: /..., ./..., ../..., ~..., two
 * slashes or more; ORG/NAME is a Hub id) or a file, with err saying so: a usage error, as every missing path of the
 * command line. */
bool convert_base_model_missing(const char *base, char *err, size_t errlen);
int convert_lora_to_peft(const char *ckpt, const ModelConfig *cfg, const ConvertOptions *options, const char *dst,
                         char *err, size_t errlen);

#endif
