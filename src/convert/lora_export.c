/* lora_export.c: a LoRA model's adapters in PEFT's format, and the merged
 * model (lora_export.h). */
#include "lora_export.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../core/error.h"
#include "hf_names.h"
#include "peft_config.h"

#define PEFT_PREFIX "base_model.model."

/* "layers.3.attn.q_proj.lora_A.weight" -> "layers.3.attn.q_proj.weight" and "lora_A"; -1 when not an adapter. */
static int split_adapter_name(const char *ours, char *base, size_t baselen, char *which, size_t whichlen) {
    const char *at = strstr(ours, ".lora_");
    if (!at || (strcmp(at, ".lora_A.weight") != 0 && strcmp(at, ".lora_B.weight") != 0)) return -1;
    const size_t stem = (size_t)(at - ours);
    if (stem + sizeof ".weight" > baselen) return -1;
    memcpy(base, ours, stem);
    memcpy(base + stem, ".weight", sizeof ".weight");
    snprintf(which, whichlen, "%.6s", at + 1);
    return 0;
}

int lora_peft_name(ModelFamily family, const char *ours, char *out, size_t outlen) {
    char base[160], which[8], hf[192];
    if (split_adapter_name(ours, base, sizeof base, which, sizeof which) != 0) return -1;
    if (hf_name_from_ours(family, base, hf, sizeof hf) != 0) return -1;
    const size_t len = strlen(hf) - strlen(".weight"); /* the module: model.layers.3.self_attn.q_proj */
    const int n = snprintf(out, outlen, PEFT_PREFIX "%.*s.%s.weight", (int)len, hf, which);
    return n > 0 && (size_t)n < outlen ? 0 : -1;
}

static int write_text(const char *path, const char *text, char *err, size_t errlen) {
    FILE *out = fopen(path, "wb");
    bool failed = !out;
    if (out) {
        const size_t len = strlen(text);
        failed = fwrite(text, 1, len, out) != len || fflush(out) != 0 || fsync(fileno(out)) != 0;
        if (fclose(out) != 0) failed = true;
    }
    if (failed) mt_set_error(err, errlen, "%s: cannot write: %s", path, strerror(errno));
    return failed ? -1 : 0;
}

LoraAdapters lora_adapters_of(const Model *model) {
    return (LoraAdapters){&model->cfg, model->param_info, model->num_params, model->params + model->trainable_offset,
                          model->trainable_offset};
}

int lora_write_peft(const LoraAdapters *adapters, const char *dir, StDtype dtype, const char *base_model, char *err,
                    size_t errlen) {
    const ModelConfig *cfg = adapters->cfg;
    if (cfg->peft.type != PEFT_LORA) {
        mt_set_error(err, errlen, "the model has no LoRA adapters (no peft: section)");
        return -1;
    }
    const int num_params = adapters->num_params;
    StWriteTensor *tensors = mt_calloc((size_t)(num_params ? num_params : 1), sizeof *tensors);
    char (*names)[192] = mt_calloc((size_t)(num_params ? num_params : 1), sizeof *names);
    int count = 0, status = 0;
    for (int i = 0; i < num_params && status == 0; i++) {
        const ParamInfo *p = &adapters->infos[i];
        if (p->frozen) continue; /* the base: the user has it (the model the run started from) */
        if (p->numel != p->global_shape[0] * p->global_shape[1] || p->ndim != 2 ||
            lora_peft_name(cfg->family, p->name, names[count], sizeof names[count]) != 0) {
            mt_set_error(err, errlen, "parameter %s is not a whole LoRA adapter of a %s model", p->name,
                         model_family_name(cfg->family));
            status = -1;
            break;
        }
        tensors[count] = (StWriteTensor){.name = names[count], .dtype = dtype, .ndim = 2,
                                         .shape = {p->shape[0], p->shape[1]},
                                         .data = adapters->values + (p->offset - adapters->first)};
        count++;
    }
    char path[4096 + 64];
    if (status == 0) {
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
        char key[] = "format", value[] = "pt";
        const StMetadataEntry metadata = {key, value};
        status = st_write_file(path, tensors, count, &metadata, 1, err, errlen);
    }
    if (status == 0) {
        char *json = peft_config_to_json(&cfg->peft, base_model);
        snprintf(path, sizeof path, "%s/adapter_config.json", dir);
        status = write_text(path, json, err, errlen);
        free(json);
    }
    free(names);
    free(tensors);
    return status;
}

static const ParamInfo *find_param(const LoraAdapters *adapters, int count, const char *name) {
    for (int i = 0; i < count; i++)
        if (strcmp(adapters->infos[i].name, name) == 0) return &adapters->infos[i];
    return NULL;
}

int lora_deltas(const LoraAdapters *adapters, int num_base, LoraDelta *deltas, char *err, size_t errlen) {
    const PeftConfig *peft = &adapters->cfg->peft;
    if (peft->type != PEFT_LORA) {
        mt_set_error(err, errlen, "the model has no LoRA adapters to merge (no peft: section)");
        return -1;
    }
    memset(deltas, 0, (size_t)num_base * sizeof *deltas);
    const long r = peft->rank;
    for (int i = 0; i < adapters->num_params; i++) {
        const ParamInfo *a = &adapters->infos[i];
        char base[160], which[8], b_name[192];
        if (a->frozen || split_adapter_name(a->name, base, sizeof base, which, sizeof which) != 0 ||
            strcmp(which, "lora_A") != 0)
            continue;
        snprintf(b_name, sizeof b_name, "%.*s.lora_B.weight", (int)(strlen(base) - strlen(".weight")), base);
        const ParamInfo *b = find_param(adapters, adapters->num_params, b_name);
        const ParamInfo *w = find_param(adapters, num_base, base);
        if (!b || !w || w->ndim != 2 || b->frozen || w->shape[0] != b->shape[0] || w->shape[1] != a->shape[1] ||
            a->shape[0] != r || b->shape[1] != r) {
            mt_set_error(err, errlen, "merging LoRA: %s has no matching %s and %s", a->name, b_name, base);
            return -1;
        }
        deltas[w - adapters->infos] = (LoraDelta){adapters->values + (a->offset - adapters->first),
                                                  adapters->values + (b->offset - adapters->first), r, w->shape[1],
                                                  peft->alpha / peft->rank};
    }
    return 0;
}

void lora_delta_add(const LoraDelta *delta, int64_t first, int64_t count, float *w) {
    const float *A = delta->A, *B = delta->B;
    const long r = delta->rank, in = delta->in;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; i++) {
        const int64_t o = (first + i) / in, k = (first + i) % in;
        double sum = 0.0;
        for (long j = 0; j < r; j++) sum += (double)B[o * r + j] * (double)A[j * in + k];
        w[i] = (float)((double)w[i] + delta->scale * sum);
    }
}

int lora_merge(const Model *lora, Model *merged, char *err, size_t errlen) {
    if (lora->cfg.peft.type != PEFT_LORA) {
        mt_set_error(err, errlen, "the model has no LoRA adapters to merge (no peft: section)");
        return -1;
    }
    if (merged->cfg.peft.type != PEFT_NONE || merged->trainable_offset != 0 ||
        merged->num_floats != lora->trainable_offset || merged->part.tp != 1 || lora->part.tp != 1 ||
        merged->part.num_layers != lora->cfg.num_layers || lora->part.num_layers != lora->cfg.num_layers) {
        mt_set_error(err, errlen, "lora_merge: expected two whole models, the second the first's base");
        return -1;
    }
    /* the base parameters: the same registry entries at the same offsets (the adapters come after them) */
    for (int i = 0; i < merged->num_params; i++)
        if (strcmp(merged->param_info[i].name, lora->param_info[i].name) != 0 ||
            merged->param_info[i].offset != lora->param_info[i].offset) {
            mt_set_error(err, errlen, "lora_merge: parameter %d is %s in the base model but %s in the LoRA model", i,
                         merged->param_info[i].name, lora->param_info[i].name);
            return -1;
        }
    memcpy(merged->params, lora->params, (size_t)merged->num_floats * sizeof(float));
    const LoraAdapters adapters = lora_adapters_of(lora);
    LoraDelta *deltas = mt_malloc((size_t)(merged->num_params ? merged->num_params : 1) * sizeof *deltas);
    const int rc = lora_deltas(&adapters, merged->num_params, deltas, err, errlen);
    for (int i = 0; rc == 0 && i < merged->num_params; i++)
        if (deltas[i].A)
            lora_delta_add(&deltas[i], 0, merged->param_info[i].numel, merged->params + merged->param_info[i].offset);
    free(deltas);
    return rc;
}
