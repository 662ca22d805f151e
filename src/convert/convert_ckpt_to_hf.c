/* convert_ckpt_to_hf.c: megatrain checkpoint -> Hugging Face model directory
 * (config.json + safetensors, sharded with an index above the size limit,
 * the carried tokenizer files and generation_config.json byte for byte, or
 * a generation_config.json made from the token ids when none is carried).
 * The parameters are streamed from the checkpoint a block at a time
 * (ckpt_params_read) as each safetensors file is written, so no model is
 * held; --merge-lora merges each block with the adapters (held in memory,
 * a few MiB) as it streams; --drop-expert-bias leaves the routers' expert
 * biases out, having said what that changes (expert_bias_drop.h). Written into
 * DST.tmp.<host>.<pid> and renamed to DST when complete; on any failure the
 * temporary directory is removed (a killed convert's, by the next convert into DST: convert.c). */
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
#include "../model/model.h"
#include "ckpt_latest_dir.h"
#include "convert.h"
#include "expert_bias_drop.h"
#include "../core/progress.h"
#include "hf_config.h"
#include "hf_files.h"
#include "hf_names.h"
#include "lora_export.h"

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

/* Where a Hugging Face tensor streamed from a checkpoint lies: parameter `param`'s
 * plane `plane` (a stack of experts) or the whole parameter (plane -1). */
typedef struct Streamed {
    CkptParams *params;
    int param, plane;
    int ndim;         /* the HF tensor's: 1 or 2 */
    int64_t rows, cols;
    const LoraDelta *delta; /* --merge-lora: what merging adds to it, or NULL */
} Streamed;

/* StFillFn of a streamed tensor: elements [first, first + count) read from
 * the checkpoint as at most three boxes (the rest of a row, whole rows, the
 * start of a row), which reads each chunk once in a row of calls (the
 * reader keeps the last chunk it decoded), then merged with its adapters. */
static int fill_streamed(const void *ctx, int64_t first, int64_t count, float *out, char *err, size_t errlen) {
    const Streamed *s = ctx;
    for (int64_t pos = first, end = first + count; pos < end;) {
        const int64_t row = pos / s->cols, col = pos % s->cols, left = end - pos;
        const bool whole_rows = col == 0 && left >= s->cols;
        const int64_t rows = whole_rows ? left / s->cols : 1;
        const int64_t cols = whole_rows ? s->cols : (s->cols - col < left ? s->cols - col : left);
        int64_t start[3], shape[3];
        int d = 0;
        if (s->plane >= 0) start[d] = s->plane, shape[d++] = 1;
        if (s->ndim == 2) start[d] = row, shape[d++] = rows;
        start[d] = col, shape[d++] = cols;
        if (ckpt_params_read(s->params, s->param, start, shape, out + (pos - first), err, errlen) != 0) return -1;
        pos += rows * cols;
    }
    if (s->delta) lora_delta_add(s->delta, first, count, out);
    return 0;
}

/* The write list: every registry parameter (infos) under its HF name (a
 * stack of experts as one tensor per expert), in the order save_pretrained
 * shards (hf_name_position), a stack's experts marked as one storage where
 * transformers 5 holds them fused (so shards split where it splits them).
 * The data is streamed from checkpoint `from` (*streamed: the tensors'
 * contexts), parameter i merged with deltas[i] when deltas is not NULL;
 * the expert biases left out with drop_bias (--drop-expert-bias).
 * *names holds the strings; returns the number of tensors, or -1 with err. */
static int build_tensors(const ModelConfig *cfg, const ParamInfo *infos, int num_params, CkptParams *from,
                         const LoraDelta *deltas, bool drop_bias, StDtype dtype, StWriteTensor **out, HfPiece **names,
                         Streamed **streamed, char *err, size_t errlen) {
    const int experts = cfg->moe.num_experts > 1 ? cfg->moe.num_experts : 1;
    const int cap = num_params * experts;
    HfPiece *pieces = mt_malloc((size_t)(cap ? cap : 1) * sizeof *pieces);
    Ordered *ordered = mt_malloc((size_t)(cap ? cap : 1) * sizeof *ordered);
    Streamed *contexts = mt_calloc((size_t)(cap ? cap : 1), sizeof *contexts);
    int count = 0;
    for (int p = 0; p < num_params; p++) {
        const ParamInfo *info = &infos[p];
        if (drop_bias && model_is_expert_bias(info->name)) continue;
        int n = hf_pieces(cfg->family, info, cfg->moe.num_experts, pieces + count, cap - count);
        if (n < 0) {
            mt_set_error(err, errlen, "parameter %s has no Hugging Face name in the %s table", info->name,
                         model_family_name(cfg->family));
            free(contexts);
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
            const long plane_floats = piece->ndim == 2 ? piece->shape[0] * piece->shape[1] : piece->shape[0];
            contexts[count] = (Streamed){from, p, info->ndim == 3 ? (int)(piece->offset / plane_floats) : -1,
                                         piece->ndim, piece->ndim == 2 ? piece->shape[0] : 1,
                                         piece->ndim == 2 ? piece->shape[1] : piece->shape[0],
                                         deltas && deltas[p].A ? &deltas[p] : NULL};
            t->fill = fill_streamed;
            t->fill_ctx = &contexts[count];
        }
    }
    qsort(ordered, (size_t)count, sizeof *ordered, compare_positions);
    StWriteTensor *tensors = mt_malloc((size_t)(count ? count : 1) * sizeof *tensors);
    const bool fused = hf_saves_fused_experts(cfg->family);
    for (int i = 0; i < count; i++) {
        tensors[i] = ordered[i].tensor;
        /* a stack's experts, one after the other: one storage in transformers 5 */
        tensors[i].same_storage = fused && i > 0 && ordered[i].param == ordered[i - 1].param &&
                                  infos[ordered[i].param].ndim == 3;
    }
    free(ordered);
    *out = tensors;
    *names = pieces;
    *streamed = contexts;
    return count;
}

/* Write config.json, the carried files and the safetensors of the model
 * (registry `infos`, streamed from `from`, merged with `deltas`; num_floats
 * what is written of it) into dir. */
static int write_hf_dir(const char *dir, const ModelConfig *cfg, const ParamInfo *infos, int num_params,
                        long num_floats, CkptParams *from, const LoraDelta *deltas, const CkptHfFiles *carried,
                        const ConvertOptions *options, char *err, size_t errlen) {
    StWriteTensor *tensors = NULL;
    HfPiece *names = NULL;
    Streamed *streamed = NULL;
    const int count = build_tensors(cfg, infos, num_params, from, deltas, options->drop_expert_bias, options->dtype,
                                    &tensors, &names, &streamed, err, errlen);
    int status = count < 0 ? -1 : 0;
    if (status == 0) status = write_config(dir, cfg, options->dtype, err, errlen);
    if (status == 0) status = hf_files_write(dir, carried, cfg, err, errlen);
    if (status == 0) {
        Progress progress;
        uint64_t bytes = (uint64_t)num_floats * st_dtype_size(options->dtype);
        progress_start(&progress, options->progress, "convert", "writing", "tensors", count, bytes);
        status = st_write_model(dir, tensors, count, options->max_shard_bytes, num_floats, progress_callback,
                                &progress, err, errlen);
        progress_end(&progress);
    }
    free(streamed);
    free(names);
    free(tensors);
    return status;
}

/* The model to export, streamed from the checkpoint (*from, over the
 * whole model's registry *infos) so that exporting holds a few MiB whatever
 * the model's size. A LoRA checkpoint's (--merge-lora) is its base model
 * (cfg without peft; the frozen base read from where the checkpoint says),
 * each adapted projection merged with deltas[i] as it is streamed (the
 * adapters in memory). */
typedef struct Export {
    ModelConfig cfg;
    CkptParams *from;
    ParamInfo *infos;
    int num_params;
    long num_floats;
    CkptAdapters adapters;
    LoraDelta *deltas;
} Export;

static int open_export(const char *ckpt, Export *e, char *err, size_t errlen) {
    if (e->cfg.peft.type != PEFT_LORA) {
        const ModelPartition whole = model_partition_whole(&e->cfg);
        e->infos = model_registry_of(&e->cfg, &whole, &e->num_params, &e->num_floats);
        e->from = ckpt_params_open(ckpt, &e->cfg, e->infos, e->num_params, err, errlen);
        return e->from ? 0 : -1;
    }
    if (ckpt_adapters_read(ckpt, &e->cfg, &e->adapters, err, errlen) != 0) return -1;
    const LoraAdapters *view = &e->adapters.view;
    e->num_params = e->adapters.num_base;
    e->num_floats = view->first;
    e->deltas = mt_malloc((size_t)(e->num_params ? e->num_params : 1) * sizeof *e->deltas);
    if (lora_deltas(view, e->num_params, e->deltas, err, errlen) != 0) return -1;
    /* the base parameters lead the LoRA registry (model.h) */
    e->from = ckpt_params_open(ckpt, &e->cfg, view->infos, e->num_params, err, errlen); /* checks the LoRA model */
    e->cfg.peft.type = PEFT_NONE; /* after opening: config.json describes the merged model */
    return e->from ? 0 : -1;
}

static void close_export(Export *e) {
    ckpt_params_close(e->from);
    free(e->infos);
    free(e->deltas);
    ckpt_adapters_free(&e->adapters);
}

int convert_ckpt_to_hf(const char *src, const char *dst, const ConvertOptions *given, char *err, size_t errlen) {
    char ckpt[4096];
    if (ckpt_latest_dir(src, ckpt, sizeof ckpt, err, errlen) != 0) return -1;
    Export e = {0};
    if (ckpt_read_model_config(ckpt, &e.cfg, err, errlen) != 0) return -1;
    ConvertOptions chosen = *given, *options = &chosen;
    if (!given->dtype_given) { /* the dtype the model came in from Hugging Face (model.export_dtype) */
        static const StDtype of_export[] = {[EXPORT_AUTO] = ST_F32, [EXPORT_FP32] = ST_F32, [EXPORT_BF16] = ST_BF16,
                                            [EXPORT_FP16] = ST_F16};
        chosen.dtype = of_export[e.cfg.export_dtype];
    }
    const bool biased = model_family_is_moe(e.cfg.family) && e.cfg.moe.load_balancing == LB_EXPERT_BIAS;
    if (options->drop_expert_bias && !biased) { /* as --merge-lora without adapters: the option names another model */
        mt_set_error(err, errlen, "--drop-expert-bias: %s has no expert biases (its model.moe.load_balancing is not "
                     "expert_bias)", ckpt);
        return -1;
    }
    ModelConfig exported = e.cfg; /* with the option, the model without its biases is what must be exportable */
    if (options->drop_expert_bias) exported.moe.load_balancing = LB_NONE;
    char why[1024];
    if (hf_config_check_exportable(&exported, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "%s: %s", ckpt, why);
        return -1;
    }
    if (e.cfg.moe.num_experts > 0 && e.cfg.moe.capacity_factor > 0) /* the weights are the model's; the drops are not */
        mt_warn("%s: model.moe.capacity_factor %g: transformers drops no tokens, so the exported model computes what "
                "these weights compute in megatrain with capacity_factor: null", ckpt, e.cfg.moe.capacity_factor);
    if ((options->merge_lora || options->base_model) && e.cfg.peft.type != PEFT_LORA) {
        mt_set_error(err, errlen, "%s: %s has no LoRA adapters (its model.yaml has no peft: section)",
                     options->merge_lora ? "--merge-lora" : "--base-model", ckpt);
        return -1;
    }
    if (e.cfg.peft.type == PEFT_LORA && !options->merge_lora) /* the adapters alone (trained in fp32, as PEFT's) */
        return convert_lora_to_peft(ckpt, &e.cfg, given, dst, err, errlen);
    int status = open_export(ckpt, &e, err, errlen);
    const ParamInfo *infos = e.infos ? e.infos : e.adapters.view.infos;
    long written = e.num_floats; /* less the biases left out */
    for (int p = 0; status == 0 && options->drop_expert_bias && p < e.num_params; p++)
        if (model_is_expert_bias(infos[p].name)) written -= infos[p].numel;
    /* what dropping the biases changes, said before anything is written (a checkpoint that does not read stops here) */
    if (status == 0 && options->drop_expert_bias)
        status = expert_bias_drop_say(ckpt, &e.cfg, e.from, infos, e.num_params, err, errlen);
    CkptHfFiles carried = {0}; /* a damaged one is left out, with a warning */
    if (status == 0) status = ckpt_hf_files_read(ckpt, &carried, err, errlen);

    char tmp[4096];
    if (status == 0 && (mt_make_parent_dirs(dst, err, errlen) != 0 || mt_temp_name_host(tmp, sizeof tmp, dst) != 0))
        status = -1;
    if (status == 0 && mkdir(tmp, 0777) != 0) {
        mt_set_error(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
        status = -1;
    } else if (status == 0) {
        status = write_hf_dir(tmp, &e.cfg, infos, e.num_params, written, e.from, e.deltas, &carried, options, err,
                              errlen);
        if (status == 0) status = hf_dir_commit(tmp, dst, err, errlen);
        if (status != 0) {
            char ignored[256];
            ckpt_remove_tree(tmp, ignored, sizeof ignored);
        }
    }
    if (status == 0) {
        char names[512];
        hf_files_list(&carried, names, sizeof names);
        char merged[160] = "";
        if (options->merge_lora) /* (e.cfg.peft.type is none now: config.json describes the merged model) */
            snprintf(merged, sizeof merged, ", its LoRA adapters (rank %d, alpha %g) merged into the weights",
                     e.cfg.peft.rank, e.cfg.peft.alpha);
        if (options->drop_expert_bias)
            snprintf(merged, sizeof merged, ", without its expert biases (%ld parameters left out)",
                     e.num_floats - written);
        printf("converted megatrain checkpoint %s (%s, %d layers, %ld parameters; carried files: %s) to Hugging "
               "Face %s (%s)%s\n",
               ckpt, model_family_name(e.cfg.family), e.cfg.num_layers, written, names, dst,
               torch_dtype_name(options->dtype), merged);
    }
    ckpt_hf_files_free(&carried);
    close_export(&e);
    return status;
}
