/* peft_tensors.c: PEFT's adapter_model.safetensors matched to a LoRA
 * model's adapter parameters (peft_tensors.h). */
#include "peft_tensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/error.h"

int peft_tensors_open(const char *adapter_dir, PeftTensors *out, char *err, size_t errlen) {
    char path[4096 + 32], pickled[4096 + 32];
    struct stat st;
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", adapter_dir);
    snprintf(pickled, sizeof pickled, "%s/adapter_model.bin", adapter_dir);
    if (stat(path, &st) != 0 && stat(pickled, &st) == 0) {
        mt_set_error(err, errlen, "%s holds adapter_model.bin (a pickle, which megatrain does not read) and no "
                     "adapter_model.safetensors: save the adapter again with PEFT's save_pretrained(..., "
                     "safe_serialization=True)", adapter_dir);
        return -1;
    }
    out->file = st_open(path, err, errlen);
    if (!out->file) return -1;
    out->used = mt_calloc((size_t)(out->file->num_tensors ? out->file->num_tensors : 1), sizeof(bool));
    return 0;
}

void peft_tensors_close(PeftTensors *tensors) {
    st_close(tensors->file);
    free(tensors->used);
    *tensors = (PeftTensors){0};
}

const StTensor *peft_tensors_match(const PeftTensors *tensors, const ModelConfig *cfg, const ParamInfo *info,
                                   const char *peft_name, char *err, size_t errlen) {
    const StTensor *t = st_find(tensors->file, peft_name);
    if (!t) {
        mt_set_error(err, errlen, "%s: missing tensor '%s' (adapter_config.json's target_modules adapt this "
                     "projection in every layer; megatrain's %s)", tensors->file->path, peft_name, info->name);
        return NULL;
    }
    if (t->ndim != 2 || t->shape[0] != info->shape[0] || t->shape[1] != info->shape[1]) {
        char found[128], expected[128];
        st_format_shape(found, sizeof found, t->ndim, t->shape);
        st_format_shape(expected, sizeof expected, info->ndim, info->shape);
        mt_set_error(err, errlen, "%s: tensor '%s' has shape %s, but r = %d and the base's config make it %s (is the "
                     "base model the one the adapter was trained on?)", tensors->file->path, peft_name, found,
                     cfg->peft.rank, expected);
        return NULL;
    }
    tensors->used[t - tensors->file->tensors] = true;
    return t;
}

int peft_tensors_check_all_used(const PeftTensors *tensors, char *err, size_t errlen) {
    for (int i = 0; i < tensors->file->num_tensors; i++) {
        if (tensors->used[i]) continue;
        const char *name = tensors->file->tensors[i].name;
        const bool whole = !strstr(name, ".lora_") && (strstr(name, "embed_tokens") || strstr(name, "lm_head"));
        mt_set_error(err, errlen, "%s: unexpected tensor '%s' (%s)", tensors->file->path, name,
                     whole ? "an embedding saved whole, as save_embedding_layers or a resized vocabulary saves it: "
                             "megatrain reads adapters of the projections only"
                           : "not a LoRA adapter of the target_modules adapter_config.json lists, in a layer of the "
                             "base model");
        return -1;
    }
    return 0;
}
