/* peft_tensors.h: PEFT's adapter_model.safetensors as the adapters of a
 * LoRA model's registry: each adapter parameter's tensor under its PEFT
 * name (lora_export.h's lora_peft_name), its shape checked, and every
 * tensor of the file taken by one parameter (`megatrain convert` of a PEFT
 * adapter directory: convert_peft.c, convert_hf_to_ckpt.c). */
#ifndef MT_CONVERT_PEFT_TENSORS_H
#define MT_CONVERT_PEFT_TENSORS_H

#include <stdbool.h>
#include <stddef.h>

#include "../model/model.h"
#include "safetensors.h"

typedef struct PeftTensors {
    StFile *file;
    bool *used; /* which of file's tensors a parameter took */
} PeftTensors;

/* Open adapter_dir/adapter_model.safetensors (an adapter_model.bin alone is named as a pickle megatrain does not
 * read). 0, or -1 with err. */
int peft_tensors_open(const char *adapter_dir, PeftTensors *out, char *err, size_t errlen);
void peft_tensors_close(PeftTensors *tensors);

/* The tensor of adapter parameter `info` (PEFT's name `peft_name`) of a model of cfg, with info's shape, marked
 * used; NULL with err naming the file and tensor (missing, or misshapen: the wrong base, most likely). */
const StTensor *peft_tensors_match(const PeftTensors *tensors, const ModelConfig *cfg, const ParamInfo *info,
                                   const char *peft_name, char *err, size_t errlen);

/* 0 when every tensor of the file was taken; else -1 with err naming the first one left over. */
int peft_tensors_check_all_used(const PeftTensors *tensors, char *err, size_t errlen);

#endif
