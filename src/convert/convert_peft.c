/* convert_peft.c: `megatrain convert ADAPTER_DIR DST --base-model BASE`:
 * PEFT's adapter directory on its base model -> a megatrain LoRA
 * checkpoint. adapter_config.json gives the peft: section (peft_config.h),
 * adapter_model.safetensors the adapters (peft_tensors.h), and the base is
 *   - a Hugging Face directory (config.json): the checkpoint holds the base
 *     too, converted as any Hugging Face model (convert_hf_to_ckpt.c);
 *   - a megatrain checkpoint (one `convert` wrote of the base, or a full
 *     run's): the checkpoint holds the adapters alone and references the
 *     base's weights there (record BASE, as a LoRA run's checkpoints do with
 *     checkpoint.frozen_base: reference), which eval, init_from and convert
 *     read from it while its metadata.mtck is the one recorded. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <omp.h>

#include "../ckpt/checkpoint.h"
#include "../ckpt/ckpt_model_config.h"
#include "../ckpt/ckpt_writer.h"
#include "../core/error.h"
#include "../core/fs.h"
#include "ckpt_latest_dir.h"
#include "convert.h"
#include "hf_config.h"
#include "hf_families.h"
#include "lora_export.h"
#include "peft_config.h"

/* CkptFillFn of an adapter: elements [first, first + count) of its PEFT tensor, as fp32. */
static int fill_adapter(const CkptSource *source, int64_t first, int64_t count, void *out, char *err, size_t errlen) {
    (void)err, (void)errlen;
    st_tensor_range_to_f32(source->fill_ctx, first, count, out);
    return 0;
}

/* The adapters alone into checkpoint dst, referencing the base checkpoint base_dir for the frozen weights. */
static int adapters_on_checkpoint(const char *base_dir, const ModelConfig *cfg, const PeftTensors *adapters,
                                  const char *what, const char *dst, const ConvertOptions *options, char *err,
                                  size_t errlen) {
    int num_params = 0, count = 0, status = 0;
    long num_floats = 0;
    const ModelPartition whole = model_partition_whole(cfg);
    ParamInfo *infos = model_registry_of(cfg, &whole, &num_params, &num_floats);
    CkptSource *sources = mt_calloc((size_t)(num_params ? num_params : 1), sizeof *sources);
    for (int p = 0; p < num_params && status == 0; p++) {
        const ParamInfo *info = &infos[p];
        char peft_name[192];
        if (info->frozen) continue; /* the base's: referenced */
        const StTensor *t = NULL;
        if (lora_peft_name(cfg->family, info->name, peft_name, sizeof peft_name) != 0) {
            mt_set_error(err, errlen, "parameter %s is not a LoRA adapter of a %s model", info->name,
                         model_family_name(cfg->family));
            status = -1;
        } else if (!(t = peft_tensors_match(adapters, cfg, info, peft_name, err, errlen))) {
            status = -1;
        } else {
            CkptSource *s = &sources[count++];
            s->name = info->name;
            s->ndim = info->ndim;
            for (int d = 0; d < info->ndim; d++) s->global_shape[d] = s->shape[d] = info->shape[d];
            s->dtype = CKPT_DTYPE_FP32;
            s->fill = fill_adapter;
            s->fill_ctx = t;
        }
    }
    if (status == 0) status = peft_tensors_check_all_used(adapters, err, errlen);
    CkptBaseRef base = {0};
    char why[1024];
    if (status == 0 && ckpt_base_ref_of(base_dir, &base, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "--base-model %s: %s", base_dir, why);
        status = -1;
    }
    CkptHfFiles carried = {0};
    if (status == 0 && ckpt_hf_files_read(base_dir, &carried, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "--base-model %s: %s", base_dir, why);
        status = -1;
    }
    if (status == 0) status = mt_make_parent_dirs(dst, err, errlen);
    if (status == 0) {
        const CkptPayload payload = {.num_sources = count, .sources = sources, .model_config = cfg,
                                     .hf_files = &carried, .base = &base, .compression_level = 3,
                                     .filter = CKPT_FILTER_SHUFFLE4, .threads = omp_get_max_threads(),
                                     .progress = options->progress};
        status = ckpt_write_payload_host_temp(dst, &payload, NULL, err, errlen);
    }
    if (status == 0) {
        printf("converted %s to megatrain checkpoint %s: the adapters, which reference the base's weights in %s "
               "(keep it there: eval, init_from and convert read them from it)\n", what, dst, base.dir);
        if (ckpt_is_run_checkpoint(base.dir))
            mt_warn("the base %s is a checkpoint of a training run: if that run's retention (checkpoint.keep_last) "
                    "deletes it, %s cannot be read; convert the adapter onto a checkpoint outside a run's "
                    "checkpoints/ directory (megatrain convert of the base model) instead", base.dir, dst);
    }
    ckpt_hf_files_free(&carried);
    free(sources);
    free(infos);
    return status;
}

int convert_peft_to_ckpt(const char *adapter_dir, const char *base, const char *dst, const ConvertOptions *options,
                         char *err, size_t errlen) {
    char path[4096 + 32], base_name[1024], note[512], base_ckpt[4096], why[1536];
    struct stat st;
    snprintf(path, sizeof path, "%s/config.json", base);
    const bool hf_base = stat(path, &st) == 0;
    ModelConfig cfg;
    if (hf_base) {
        if (hf_config_read(path, &cfg, err, errlen) != 0) return -1;
        if (ckpt_model_config_check(&cfg, why, sizeof why) != 0) {
            mt_set_error(err, errlen, "%s: a value the checkpoint cannot hold (%s)", path, why);
            return -1;
        }
    } else {
        if (ckpt_latest_dir(base, base_ckpt, sizeof base_ckpt, why, sizeof why) != 0) {
            mt_set_error(err, errlen, "--base-model %s: neither a Hugging Face model directory (no config.json) nor a "
                         "megatrain checkpoint (%s)", base, why);
            return -1;
        }
        if (ckpt_read_model_config(base_ckpt, &cfg, err, errlen) != 0) return -1;
        if (cfg.peft.type != PEFT_NONE) {
            mt_set_error(err, errlen, "--base-model %s: a LoRA checkpoint (its model has adapters); give the model the "
                         "adapter was trained on (merge these first: megatrain convert %s OUT --merge-lora)",
                         base_ckpt, base_ckpt);
            return -1;
        }
    }
    snprintf(path, sizeof path, "%s/adapter_config.json", adapter_dir);
    if (peft_config_read(path, cfg.num_layers, &cfg.peft, base_name, sizeof base_name, note, sizeof note, err,
                         errlen) != 0)
        return -1;
    const char *moe = lora_moe_refusal(&cfg);
    if (moe) {
        mt_set_error(err, errlen, "%s: %s (Hugging Face %s)", path, moe, hf_model_type(cfg.family));
        return -1;
    }
    if (note[0]) mt_warn("%s: %s", path, note);
    if (ckpt_model_config_check(&cfg, why, sizeof why) != 0) { /* the base's values were checked alone before */
        mt_set_error(err, errlen, "%s: a value the checkpoint cannot hold (%s)", path, why);
        return -1;
    }
    PeftTensors adapters;
    if (peft_tensors_open(adapter_dir, &adapters, err, errlen) != 0) return -1;
    char what[2 * 4096 + 128];
    snprintf(what, sizeof what, "PEFT adapter %s (LoRA r %d, alpha %g) on base %s", adapter_dir, cfg.peft.rank,
             cfg.peft.alpha, hf_base ? base : base_ckpt);
    const int status = hf_base ? convert_hf_model_to_ckpt(base, &cfg, &adapters, what, dst, options, err, errlen)
                               : adapters_on_checkpoint(base_ckpt, &cfg, &adapters, what, dst, options, err, errlen);
    peft_tensors_close(&adapters);
    return status;
}
