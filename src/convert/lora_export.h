/* lora_export.h: a LoRA run's adapters for Hugging Face PEFT
 * (`megatrain convert CKPT OUT`, CKPT with peft: adapter_config.json and
 * adapter_model.safetensors, as PeftModel.save_pretrained writes them) and
 * merged into the base model (`--merge-lora`: the model
 * PeftModel.merge_and_unload gives, written as a plain Hugging Face model).
 *
 * PEFT's names: the adapter of the projection whose Hugging Face name is
 * model.layers.L.self_attn.q_proj.weight is
 *   base_model.model.model.layers.L.self_attn.q_proj.lora_A.weight  (rank, in)
 *   base_model.model.model.layers.L.self_attn.q_proj.lora_B.weight  (out, rank)
 * (PeftModelForCausalLM's state dict with the adapter name removed). */
#ifndef MT_CONVERT_LORA_EXPORT_H
#define MT_CONVERT_LORA_EXPORT_H

#include <stddef.h>
#include <stdint.h>

#include "../model/model.h"
#include "safetensors.h"

/* PEFT's name of registry parameter `ours` (an adapter, e.g.
 * "layers.0.attn.q_proj.lora_A.weight") for a model of `family`. Returns 0,
 * or -1 when it is not an adapter of a projection the family has. */
int lora_peft_name(ModelFamily family, const char *ours, char *out, size_t outlen);

/* A LoRA model's adapters where they are held: a Model's parameters
 * (lora_adapters_of) or what convert read of a checkpoint. Every parameter
 * of the whole model's registry `infos` that is not frozen is an adapter,
 * its values at `values + infos[i].offset - first`; the frozen ones (the
 * base) come before them and are not needed. */
typedef struct LoraAdapters {
    const ModelConfig *cfg; /* the LoRA model's (peft: lora) */
    const ParamInfo *infos;
    int num_params;
    const float *values;
    long first; /* the first adapter's offset: every base parameter lies below it */
} LoraAdapters;

/* The adapters of `model` (a whole LoRA model) as held in its parameters. */
LoraAdapters lora_adapters_of(const Model *model);

/* Write the adapters into directory `dir` (which exists): adapter_config.json
 * (base_model_name_or_path: `base_model`, null when NULL) and
 * adapter_model.safetensors, the tensors stored as `dtype`. Returns 0, or -1
 * with err. */
int lora_write_peft(const LoraAdapters *adapters, const char *dir, StDtype dtype, const char *base_model, char *err,
                    size_t errlen);

/* What merging adds to one projection W (out, in): (alpha / rank) B A. */
typedef struct LoraDelta {
    const float *A, *B; /* (rank, in) and (out, rank); A NULL: W has no adapters */
    long rank, in;
    double scale; /* alpha / rank */
} LoraDelta;

/* The LoraDelta of each of the first `num_base` parameters of the registry
 * (the base ones; deltas[i].A NULL where parameter i has no adapters),
 * pointing into adapters->values. Returns 0, or -1 with err when an
 * adapter's pair or projection is missing or misshapen. */
int lora_deltas(const LoraAdapters *adapters, int num_base, LoraDelta *deltas, char *err, size_t errlen);

/* w holds elements [first, first + count) of W, row-major: each becomes
 * W + scale * (B A) at its place, the product summed in double, stored as
 * fp32 (PEFT's merge_and_unload within fp32 rounding). The same bits
 * whichever blocks W is merged in. */
void lora_delta_add(const LoraDelta *delta, int64_t first, int64_t count, float *w);

/* Fill `merged` (a whole model of lora's config without peft, created by
 * the caller, with or without activations) with the merged weights: each
 * adapted projection merged by lora_delta_add, every other weight the LoRA
 * model's. Returns 0, or -1 with err when `lora` has no adapters or
 * `merged` is not its base model. */
int lora_merge(const Model *lora, Model *merged, char *err, size_t errlen);

#endif
