/* convert_lora.c: `megatrain convert` of a LoRA run's checkpoint: its
 * adapters read into memory without the base (which the PEFT directory
 * leaves out and --merge-lora streams, convert_ckpt_to_hf.c), and written
 * as PEFT's directory (the default). DST appears complete or not at all,
 * as for every conversion. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../ckpt/checkpoint.h"
#include "../ckpt/ckpt_fs.h"
#include "../core/error.h"
#include "../core/fs.h"
#include "ckpt_latest_dir.h"
#include "convert.h"
#include "hf_config.h"
#include "hf_files.h"
#include "lora_export.h"

int ckpt_adapters_read(const char *ckpt, const ModelConfig *cfg, CkptAdapters *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    out->cfg = *cfg;
    const ModelPartition whole = model_partition_whole(cfg);
    int num_params = 0;
    long num_floats = 0;
    out->infos = model_registry_of(cfg, &whole, &num_params, &num_floats);
    const long first = registry_trainable_offset(out->infos, num_params, num_floats);
    out->num_floats = num_floats;
    int first_adapter = 0; /* the registry's base parameters, then its adapters (model.h) */
    while (first_adapter < num_params && out->infos[first_adapter].frozen) first_adapter++;
    out->num_base = first_adapter;
    CkptParams *from = ckpt_params_open(ckpt, cfg, out->infos + first_adapter, num_params - first_adapter, err, errlen);
    if (!from) {
        ckpt_adapters_free(out);
        return -1;
    }
    out->values = mt_malloc((size_t)(num_floats - first + 1) * sizeof(float));
    int rc = 0;
    for (int i = first_adapter; i < num_params && rc == 0; i++) {
        const ParamInfo *info = &out->infos[i];
        int64_t start[3] = {0}, shape[3] = {0};
        for (int d = 0; d < info->ndim; d++) shape[d] = info->global_shape[d];
        rc = ckpt_params_read(from, i - first_adapter, start, shape, out->values + (info->offset - first), err,
                              errlen);
    }
    ckpt_params_close(from);
    if (rc != 0) {
        ckpt_adapters_free(out);
        return -1;
    }
    out->view = (LoraAdapters){&out->cfg, out->infos, num_params, out->values, first};
    return 0;
}

void ckpt_adapters_free(CkptAdapters *adapters) {
    free(adapters->infos);
    free(adapters->values);
    memset(adapters, 0, sizeof *adapters);
}

/* "X is a in the checkpoint but b in the recipe" with `label` for "the recipe" */
static void name_other(char *why, size_t whylen, const char *label) {
    char *at = strstr(why, " in the recipe");
    if (!at) return;
    char rest[1024];
    snprintf(rest, sizeof rest, "%s", at + strlen(" in the recipe"));
    snprintf(at, whylen - (size_t)(at - why), " in %s%s", label, rest);
}

bool convert_base_model_missing(const char *base, char *err, size_t errlen) {
    struct stat st;
    if (stat(base, &st) != 0) {
        /* no such path: a Hub id (ORG/NAME, one slash at most) is written as is; what only a path looks like
         * (/..., ./..., ../..., ~..., two slashes or more) is a directory that is not there, which PEFT would not
         * find either */
        const char *slash = strchr(base, '/');
        const bool path_like = base[0] == '/' || base[0] == '~' || strncmp(base, "./", 2) == 0 ||
                               strncmp(base, "../", 3) == 0 || (slash && strchr(slash + 1, '/'));
        if (!path_like) return false;
        mt_set_error(err, errlen, "--base-model %s: %s; expected the Hugging Face directory of the model the "
                     "adapters were trained on (the one init_from was converted from), or a Hub name ORG/NAME", base,
                     strerror(errno));
        return true;
    }
    if (!S_ISDIR(st.st_mode)) {
        mt_set_error(err, errlen, "--base-model %s: a file, not a directory; expected the Hugging Face directory of "
                     "the model the adapters were trained on (the directory holding its config.json), or a Hub name "
                     "ORG/NAME", base);
        return true;
    }
    return false;
}

/* --base-model, when it is a directory here: PEFT loads the base from it (AutoPeftModelForCausalLM), so it must be a
 * Hugging Face directory of the model the adapters were trained on. A megatrain checkpoint, or a model of another
 * shape, is refused (PEFT would fail to load it: no model_type, or a size mismatch); a model of the same shape that
 * computes otherwise (rope_theta, say) is warned of. A name that is no directory here (a Hub id) is written as is;
 * a missing path or a file was refused before (convert_base_model_missing, a usage error). */
static int check_base_model(const char *base, const ModelConfig *cfg, char *err, size_t errlen) {
    struct stat st;
    if (!base) return 0;
    if (convert_base_model_missing(base, err, errlen)) return -1;
    if (stat(base, &st) != 0) return 0; /* a Hub id */
    char path[4096 + 32], ckpt[4096], why[1024];
    snprintf(path, sizeof path, "%s/config.json", base);
    if (stat(path, &st) != 0) {
        if (ckpt_latest_dir(base, ckpt, sizeof ckpt, why, sizeof why) == 0)
            mt_set_error(err, errlen, "--base-model %s: a megatrain checkpoint; PEFT loads the base from a Hugging "
                         "Face directory (or Hub name): give the one it was converted from, or make one with "
                         "megatrain convert %s HF_DIR", base, base);
        else
            mt_set_error(err, errlen, "--base-model %s: no config.json there (expected the Hugging Face directory, or "
                         "Hub name, of the model the adapters were trained on)", base);
        return -1;
    }
    ModelConfig hf;
    if (hf_config_read(path, &hf, err, errlen) != 0) return -1;
    ModelConfig mine = *cfg;
    mine.peft = hf.peft; /* the base has no adapters */
    if (model_config_difference(&mine, &hf, MODEL_MATCH_WEIGHTS, why, sizeof why) != 0) {
        name_other(why, sizeof why, path);
        mt_set_error(err, errlen, "--base-model %s: not the model the adapters were trained on (%s): PEFT could not "
                     "load them onto it", base, why);
        return -1;
    }
    if (model_config_difference(&mine, &hf, MODEL_MATCH_FUNCTION, why, sizeof why) != 0) {
        name_other(why, sizeof why, path);
        mt_warn("--base-model %s: the same shapes as the adapters' model, but it computes otherwise (%s)", base, why);
    }
    return 0;
}

int convert_lora_to_peft(const char *ckpt, const ModelConfig *cfg, const ConvertOptions *options, const char *dst,
                         char *err, size_t errlen) {
    if (check_base_model(options->base_model, cfg, err, errlen) != 0) return -1;
    CkptAdapters adapters;
    if (ckpt_adapters_read(ckpt, cfg, &adapters, err, errlen) != 0) return -1;
    CkptHfFiles carried = {0}; /* its tokenizer's files go beside the adapters (a damaged one is left out) */
    char tmp[4096];
    int status = ckpt_hf_files_read(ckpt, &carried, err, errlen);
    const CkptHfFiles tokenizer = hf_files_tokenizer(&carried);
    if (status == 0 && (mt_make_parent_dirs(dst, err, errlen) != 0 || mt_temp_name_host(tmp, sizeof tmp, dst) != 0)) {
        status = -1;
    } else if (status == 0 && mkdir(tmp, 0777) != 0) {
        mt_set_error(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
        status = -1;
    } else if (status == 0) {
        status = lora_write_peft(&adapters.view, tmp, options->dtype, options->base_model, err, errlen);
        if (status == 0) status = hf_files_write_each(tmp, &tokenizer, err, errlen);
        if (status == 0) status = hf_dir_commit(tmp, dst, err, errlen);
        if (status != 0) {
            char ignored[256];
            ckpt_remove_tree(tmp, ignored, sizeof ignored);
        }
    }
    if (status == 0) {
        const PeftConfig *peft = &cfg->peft;
        char names[512];
        hf_files_list(&tokenizer, names, sizeof names);
        char load[5200];
        if (options->base_model)
            snprintf(load, sizeof load, "peft.AutoPeftModelForCausalLM.from_pretrained(\"%s\"), which loads the base "
                     "%s", dst, options->base_model);
        else
            snprintf(load, sizeof load, "peft.PeftModel.from_pretrained(base_model, \"%s\")", dst);
        printf("converted the LoRA adapters of megatrain checkpoint %s (%s, rank %d, alpha %g, %ld parameters) to "
               "PEFT %s (adapter_config.json, adapter_model.safetensors; the tokenizer's files: %s); load them with "
               "%s\n",
               ckpt, model_family_name(cfg->family), peft->rank, peft->alpha,
               adapters.num_floats - adapters.view.first, dst, names, load);
    }
    ckpt_hf_files_free(&carried);
    ckpt_adapters_free(&adapters);
    return status;
}
