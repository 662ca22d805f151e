/* convert_ckpt_to_hf.c: megatrain checkpoint -> Hugging Face model directory
 * (config.json + safetensors, sharded with an index above the size limit,
 * the carried tokenizer files and generation_config.json byte for byte, or
 * a generation_config.json made from the token ids when none is carried).
 * Written into DST.tmp.<pid> and renamed to DST when complete; on any
 * failure the temporary directory is removed. */
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../backend/backend.h"
#include "../ckpt/checkpoint.h"
#include "../core/error.h"
#include "../core/fs.h"
#include "../model/model.h"
#include "ckpt_latest_dir.h"
#include "convert.h"
#include "../core/progress.h"
#include "hf_config.h"
#include "hf_files.h"
#include "hf_names.h"
#include "lora_export.h"

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

static void remove_tree(const char *dir) { nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

static const char *torch_dtype_name(StDtype dtype) {
    return dtype == ST_F32 ? "float32" : dtype == ST_BF16 ? "bfloat16" : "float16";
}

static int write_config(const char *dir, const ModelConfig *cfg, StDtype dtype, char *err, size_t errlen) {
    char path[4096 + 16];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = hf_config_to_json(cfg, torch_dtype_name(dtype));
    FILE *out = fopen(path, "wb");
    bool failed = !out;
    if (out) {
        size_t len = strlen(text);
        failed = fwrite(text, 1, len, out) != len || fflush(out) != 0 || fsync(fileno(out)) != 0;
        if (fclose(out) != 0) failed = true;
    }
    free(text);
    if (failed) mt_set_error(err, errlen, "%s: cannot write: %s", path, strerror(errno));
    return failed ? -1 : 0;
}

typedef struct Ordered {
    long position;
    int param; /* the registry parameter it is (a part of) */
    StWriteTensor tensor;
} Ordered;

static int compare_positions(const void *a, const void *b) {
    long x = ((const Ordered *)a)->position, y = ((const Ordered *)b)->position;
    return x < y ? -1 : x > y;
}

/* The write list: every registry parameter under its HF name (a stack of
 * experts as one tensor per expert), in the order save_pretrained shards
 * (hf_name_position), a stack's experts marked as one storage where
 * transformers 5 holds them fused (so shards split where it splits them). *names holds the
 * strings; returns the number of tensors, or -1 with err. */
static int build_tensors(const Model *model, StDtype dtype, StWriteTensor **out, HfPiece **names, char *err,
                         size_t errlen) {
    const int experts = model->cfg.moe.num_experts > 1 ? model->cfg.moe.num_experts : 1;
    const int cap = model->num_params * experts;
    HfPiece *pieces = mt_malloc((size_t)cap * sizeof *pieces);
    Ordered *ordered = mt_malloc((size_t)cap * sizeof *ordered);
    int count = 0;
    for (int p = 0; p < model->num_params; p++) {
        const ParamInfo *info = &model->param_info[p];
        int n = hf_pieces(model->cfg.family, info, model->cfg.moe.num_experts, pieces + count, cap - count);
        if (n < 0) {
            mt_set_error(err, errlen, "parameter %s has no Hugging Face name in the %s table", info->name,
                         model_family_name(model->cfg.family));
            free(ordered);
            free(pieces);
            return -1;
        }
        for (int i = 0; i < n; i++, count++) {
            const HfPiece *piece = &pieces[count];
            ordered[count].position = piece->position;
            ordered[count].param = p;
            StWriteTensor *t = &ordered[count].tensor;
            memset(t, 0, sizeof *t);
            t->name = piece->name;
            t->dtype = dtype;
            t->ndim = piece->ndim;
            t->shape[0] = piece->shape[0];
            if (piece->ndim == 2) t->shape[1] = piece->shape[1];
            t->data = model->params + info->offset + piece->offset;
        }
    }
    qsort(ordered, (size_t)count, sizeof *ordered, compare_positions);
    StWriteTensor *tensors = mt_malloc((size_t)(count ? count : 1) * sizeof *tensors);
    const bool fused = hf_saves_fused_experts(model->cfg.family);
    for (int i = 0; i < count; i++) {
        tensors[i] = ordered[i].tensor;
        /* a stack's experts, one after the other: one storage in transformers 5 */
        tensors[i].same_storage = fused && i > 0 && ordered[i].param == ordered[i - 1].param &&
                                  model->param_info[ordered[i].param].ndim == 3;
    }
    free(ordered);
    *out = tensors;
    *names = pieces;
    return count;
}

static int write_hf_dir(const char *dir, const Model *model, const CkptHfFiles *carried,
                        const ConvertOptions *options, char *err, size_t errlen) {
    StWriteTensor *tensors = NULL;
    HfPiece *names = NULL;
    const int count = build_tensors(model, options->dtype, &tensors, &names, err, errlen);
    int status = count < 0 ? -1 : 0;
    if (status == 0) status = write_config(dir, &model->cfg, options->dtype, err, errlen);
    if (status == 0) status = hf_files_write(dir, carried, &model->cfg, err, errlen);
    if (status == 0) {
        Progress progress;
        uint64_t bytes = (uint64_t)model->num_floats * st_dtype_size(options->dtype);
        progress_start(&progress, options->progress, "convert", "writing", "tensors", count, bytes);
        status = st_write_model(dir, tensors, count, options->max_shard_bytes, model->num_floats,
                                progress_callback, &progress, err, errlen);
        progress_end(&progress);
    }
    free(names);
    free(tensors);
    return status;
}

int convert_ckpt_to_hf(const char *src, const char *dst, const ConvertOptions *options, char *err, size_t errlen) {
    char ckpt[4096];
    if (ckpt_latest_dir(src, ckpt, sizeof ckpt, err, errlen) != 0) return -1;
    ModelConfig cfg;
    if (ckpt_read_model_config(ckpt, &cfg, err, errlen) != 0) return -1;
    char why[512];
    if (hf_config_check_exportable(&cfg, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "%s: %s", ckpt, why);
        return -1;
    }
    if (options->merge_lora && cfg.peft.type != PEFT_LORA) {
        mt_set_error(err, errlen, "--merge-lora: %s has no LoRA adapters (its model.yaml has no peft: section)", ckpt);
        return -1;
    }
    Model *model = model_create(&cfg, &cpu_backend, 1, 1);
    if (cfg.peft.type == PEFT_LORA && !options->merge_lora) { /* the adapters alone: no need of the frozen base */
        int status = ckpt_load_trainable(ckpt, model, err, errlen);
        if (status == 0) status = convert_lora_to_peft(ckpt, model, dst, options, err, errlen);
        model_free(model);
        return status;
    }
    int status = ckpt_load_model(ckpt, model, err, errlen); /* the frozen base from where the checkpoint says */
    if (status == 0 && cfg.peft.type == PEFT_LORA) { /* the adapters merged into the base model */
        Model *merged = lora_merged_model(model, err, errlen);
        model_free(model);
        if (!merged) return -1;
        model = merged;
        cfg = model->cfg;
    }
    CkptHfFiles carried = {0}; /* a damaged one is left out, with a warning */
    if (status == 0) status = ckpt_hf_files_read(ckpt, &carried, err, errlen);

    char tmp[4096];
    if (status == 0 && (mt_make_parent_dirs(dst, err, errlen) != 0 || mt_temp_name(tmp, sizeof tmp, dst) != 0))
        status = -1;
    if (status == 0 && mkdir(tmp, 0777) != 0) {
        mt_set_error(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
        status = -1;
    } else if (status == 0) {
        status = write_hf_dir(tmp, model, &carried, options, err, errlen);
        if (status == 0 && rename(tmp, dst) != 0) {
            mt_set_error(err, errlen, "%s: cannot rename %s to it: %s", dst, tmp, strerror(errno));
            status = -1;
        }
        if (status != 0) remove_tree(tmp);
    }
    if (status == 0) {
        char names[512];
        hf_files_list(&carried, names, sizeof names);
        printf("converted megatrain checkpoint %s (%s, %d layers, %ld parameters; carried files: %s) to Hugging "
               "Face %s (%s)\n",
               ckpt, model_family_name(cfg.family), cfg.num_layers, model->num_floats, names, dst,
               torch_dtype_name(options->dtype));
    }
    ckpt_hf_files_free(&carried);
    model_free(model);
    return status;
}
