/* convert_hf_to_ckpt.c: Hugging Face model directory -> megatrain checkpoint.
 * config.json becomes the ModelConfig; every registry parameter is taken
 * from the safetensors under its HF name (shape checked); a missing tensor,
 * a wrong shape or an unexpected extra tensor stops the conversion before
 * anything is written. No model is allocated: the checkpoint writer converts
 * each chunk to fp32 straight from the mapped safetensors as it compresses
 * it (CkptSource.fill), so the memory held is the chunks in flight (a few
 * MiB a thread) plus the mapped files' pages, which the kernel can drop, for
 * any size of model. The tokenizer files and generation_config.json go into
 * the checkpoint as they are (hf_files.h).
 *
 * With PEFT's adapters (convert_peft.c) the model is a LoRA model: the
 * registry's adapters come from adapter_model.safetensors under PEFT's names
 * (peft_tensors.h), the base from the Hugging Face directory; the checkpoint
 * holds both, as a LoRA run that stores its base writes it. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <omp.h>

#include "../ckpt/checkpoint.h"
#include "../ckpt/ckpt_model_config.h"
#include "../ckpt/ckpt_writer.h"
#include "../core/error.h"
#include "../core/fs.h"
#include "../model/model.h"
#include "convert.h"
#include "hf_config.h"
#include "hf_files.h"
#include "hf_names.h"
#include "lora_export.h"

/* Where a registry parameter's floats come from: its Hugging Face tensors
 * (one, or one per expert of a stack), each a contiguous range of it. */
typedef struct Feed {
    int count;
    const StTensor **tensors;
    long *offsets; /* in floats, into the parameter */
} Feed;

/* CkptFillFn of a parameter: elements [first, first + count) converted from its tensors. */
static int fill_param(const CkptSource *source, int64_t first, int64_t count, void *out, char *err, size_t errlen) {
    (void)err, (void)errlen;
    const Feed *feed = source->fill_ctx;
    float *dst = out;
    for (int i = 0; i < feed->count; i++) {
        const int64_t begin = feed->offsets[i], end = begin + feed->tensors[i]->numel;
        const int64_t lo = first > begin ? first : begin, hi = first + count < end ? first + count : end;
        if (lo < hi) st_tensor_range_to_f32(feed->tensors[i], lo - begin, hi - lo, dst + (lo - first));
    }
    return 0;
}

/* Hub tensor `hub` from transformers 5's fused experts (its in-memory model, what save_file(model.state_dict())
 * writes: mlp.experts.gate_up_proj [E, 2I, C], mlp.experts.down_proj [E, C, I]; Mixtral's router as mlp.gate) when
 * `weights` holds them: a view of its rows (st_model_add_view). Its index, -1 when there is no such tensor, or -2
 * with err when the fused tensor's shape cannot hold it. */
static int fused_view(const ModelConfig *cfg, StModel *weights, const char *hub, char *err,
                      size_t errlen) {
    char fused[192];
    long expert;
    int part, parts;
    if (hf_fused_source(hub, fused, sizeof fused, &expert, &part, &parts) != 0) return -1;
    const int at = st_model_find(weights, fused);
    if (at < 0) return -1;
    const StTensor *t = weights->tensors[at];
    if (expert < 0) return st_model_add_view(weights, at, hub, t->ndim, t->shape, 0); /* renamed, whole */
    if (t->ndim != 3 || t->shape[0] != cfg->moe.num_experts || t->shape[1] % parts != 0) {
        char found[128];
        st_format_shape(found, sizeof found, t->ndim, t->shape);
        mt_set_error(err, errlen, "%s: tensor '%s' (transformers' fused experts) has shape %s, but config.json makes it "
                     "[%d, %d x rows, columns]", st_model_file_of(weights, at), fused, found, cfg->moe.num_experts,
                     parts);
        return -2;
    }
    const int64_t rows = t->shape[1] / parts, dims[2] = {rows, t->shape[2]};
    const int view = st_model_add_view(weights, at, hub, 2, dims, (expert * t->shape[1] + part * rows) * t->shape[2]);
    if (view < 0) {
        mt_set_error(err, errlen, "%s: tensor '%s' (transformers' fused experts) cannot hold expert %ld's '%s'",
                     st_model_file_of(weights, at), fused, expert, hub);
        return -2;
    }
    return view;
}

/* Match every registry parameter (infos, the whole model's) with its tensors in `weights` (a stack of experts
 * with one tensor per expert), checking names and shapes, and mark them used; feeds[p] says where parameter p
 * comes from (its arrays one allocation, in *storage: free() it). *embed_shape is the embedding's (for the
 * leftover check of a tied lm_head). 0, or -1 with err naming the tensor. */
static int match_params(const ModelConfig *cfg, const ParamInfo *infos, int num_params, StModel *weights,
                        const PeftTensors *adapters, const char *src, Feed *feeds, void **storage, char *err,
                        size_t errlen) {
    const int max = cfg->moe.num_experts > 1 ? cfg->moe.num_experts : 1;
    HfPiece *pieces = mt_malloc((size_t)max * sizeof *pieces);
    char *block = mt_malloc((size_t)num_params * max * (sizeof(const StTensor *) + sizeof(long)));
    const StTensor **tensors = (const StTensor **)block;
    long *offsets = (long *)(block + (size_t)num_params * max * sizeof(const StTensor *));
    *storage = block;
    int status = 0;
    for (int p = 0; p < num_params && status == 0; p++) {
        const ParamInfo *info = &infos[p];
        feeds[p] = (Feed){0, tensors + (size_t)p * max, offsets + (size_t)p * max};
        char peft_name[192];
        if (adapters && lora_peft_name(cfg->family, info->name, peft_name, sizeof peft_name) == 0) {
            const StTensor *t = peft_tensors_match(adapters, cfg, info, peft_name, err, errlen);
            if (!t) status = -1;
            else feeds[p].tensors[0] = t, feeds[p].offsets[0] = 0, feeds[p].count = 1;
            continue;
        }
        int n = hf_pieces(cfg->family, info, cfg->moe.num_experts, pieces, max);
        if (n < 0) {
            mt_set_error(err, errlen, "%s: parameter %s has no Hugging Face name in the %s table", src, info->name,
                         model_family_name(cfg->family));
            status = -1;
        }
        for (int i = 0; i < n && status == 0; i++) {
            const HfPiece *piece = &pieces[i];
            int at = st_model_find(weights, piece->name);
            if (at < 0 && cfg->tie_word_embeddings && strcmp(piece->name, "model.embed_tokens.weight") == 0)
                at = st_model_find(weights, "lm_head.weight"); /* tied, stored under the head's name */
            if (at < 0) at = fused_view(cfg, weights, piece->name, err, errlen);
            if (at == -2) {
                status = -1;
                break;
            }
            if (at < 0) {
                mt_set_error(err, errlen, "%s: missing tensor '%s' (needed by config.json; megatrain's %s)", src,
                             piece->name, info->name);
                status = -1;
                break;
            }
            const StTensor *t = weights->tensors[at];
            const int64_t want[2] = {piece->shape[0], piece->shape[1]};
            bool same = t->ndim == piece->ndim;
            for (int d = 0; same && d < piece->ndim; d++) same = t->shape[d] == want[d];
            if (!same) {
                char found[128], expected[128];
                st_format_shape(found, sizeof found, t->ndim, t->shape);
                st_format_shape(expected, sizeof expected, piece->ndim, want);
                mt_set_error(err, errlen, "%s: tensor '%s' has shape %s, but config.json makes it %s",
                             st_model_file_of(weights, at), piece->name, found, expected);
                status = -1;
                break;
            }
            feeds[p].tensors[feeds[p].count] = t;
            feeds[p].offsets[feeds[p].count++] = piece->offset;
            weights->used[at] = true;
        }
    }
    free(pieces);
    return status;
}

/* Whether tensors a and b hold the same values (as fp32), compared a block at a time. */
static bool same_values(const StTensor *a, const StTensor *b) {
    if (a->ndim != b->ndim || a->numel != b->numel) return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return false;
    const int64_t block = (int64_t)1 << 20;
    float *x = mt_malloc((size_t)block * sizeof(float)), *y = mt_malloc((size_t)block * sizeof(float));
    bool same = true;
    for (int64_t first = 0; same && first < a->numel; first += block) {
        const int64_t n = a->numel - first < block ? a->numel - first : block;
        st_tensor_range_to_f32(a, first, n, x);
        st_tensor_range_to_f32(b, first, n, y);
        same = memcmp(x, y, (size_t)n * sizeof(float)) == 0;
    }
    free(x);
    free(y);
    return same;
}

/* tie_word_embeddings as transformers 5 applies it when loading
 * (PreTrainedModel.tie_weights in modeling_utils.py, 5.23): with both
 * model.embed_tokens.weight and lm_head.weight stored and different, it does
 * NOT tie them (it warns and uses both), so the model is untied; equal ones
 * are tied (the copy is dropped). With only lm_head.weight, that is the
 * tied tensor (load_params takes it for the embedding). */
static void apply_transformers5_tying(ModelConfig *cfg, const StModel *weights, const char *src) {
    if (!cfg->tie_word_embeddings) return;
    const int embed = st_model_find(weights, "model.embed_tokens.weight");
    const int head = st_model_find(weights, "lm_head.weight");
    if (embed < 0 || head < 0 || same_values(weights->tensors[embed], weights->tensors[head])) return;
    cfg->tie_word_embeddings = false;
    mt_warn("%s: lm_head.weight differs from model.embed_tokens.weight although config.json says "
            "tie_word_embeddings: true; as transformers 5 does, both are kept and not tied (the checkpoint's model "
            "has tie_word_embeddings: false)",
            src);
}

/* Tensors nobody took: transformers' non-persistent RoPE buffers are
 * skipped, a tied lm_head.weight equal to the embedding is dropped (a
 * different one made the model untied, apply_transformers5_tying),
 * anything else is an error. */
static int check_leftovers(const ModelConfig *cfg, StModel *weights, char *err, size_t errlen) {
    for (int i = 0; i < weights->num_tensors; i++) {
        if (weights->used[i]) continue;
        const StTensor *t = weights->tensors[i];
        const char *name = t->name;
        size_t len = strlen(name);
        const char *inv_freq = ".rotary_emb.inv_freq";
        if (len >= strlen(inv_freq) && strcmp(name + len - strlen(inv_freq), inv_freq) == 0) continue;
        if (cfg->tie_word_embeddings && strcmp(name, "lm_head.weight") == 0) {
            const int embed = st_model_find(weights, "model.embed_tokens.weight");
            const StTensor *e = embed < 0 ? NULL : weights->tensors[embed];
            bool same = e && e->ndim == t->ndim;
            for (int d = 0; same && d < t->ndim; d++) same = e->shape[d] == t->shape[d];
            if (!same) {
                mt_set_error(err, errlen, "%s: tensor 'lm_head.weight' does not have the shape of the tied embedding",
                             st_model_file_of(weights, i));
                return -1;
            }
            continue; /* equal to the embedding (apply_transformers5_tying compared them) */
        }
        mt_set_error(err, errlen, "%s: unexpected tensor '%s' (no parameter of this %s config has that name)",
                     st_model_file_of(weights, i), name, model_family_name(cfg->family));
        return -1;
    }
    return 0;
}

/* The checkpoint's sources: every parameter whole, made chunk by chunk from its tensors (feeds) while the
 * writer compresses, so that no more than the chunks in flight is ever held. One allocation: free() it. */
static CkptSource *param_sources(const ParamInfo *infos, int num_params, const Feed *feeds) {
    CkptSource *sources = mt_calloc((size_t)(num_params ? num_params : 1), sizeof *sources);
    for (int p = 0; p < num_params; p++) {
        CkptSource *s = &sources[p];
        s->name = infos[p].name;
        s->ndim = infos[p].ndim;
        for (int d = 0; d < infos[p].ndim; d++) s->global_shape[d] = s->shape[d] = infos[p].shape[d];
        s->dtype = CKPT_DTYPE_FP32;
        s->fill = fill_param;
        s->fill_ctx = &feeds[p];
    }
    return sources;
}

int convert_hf_model_to_ckpt(const char *src, ModelConfig *cfg, const PeftTensors *adapters, const char *what,
                             const char *dst, const ConvertOptions *options, char *err, size_t errlen) {
    StModel *weights = st_model_open(src, err, errlen);
    if (!weights) return -1;
    apply_transformers5_tying(cfg, weights, src);
    int num_params = 0;
    long num_floats = 0;
    const ModelPartition whole = model_partition_whole(cfg);
    ParamInfo *infos = model_registry_of(cfg, &whole, &num_params, &num_floats);
    Feed *feeds = mt_calloc((size_t)(num_params ? num_params : 1), sizeof *feeds);
    void *feed_storage = NULL;
    int status = match_params(cfg, infos, num_params, weights, adapters, src, feeds, &feed_storage, err, errlen);
    if (status == 0) status = check_leftovers(cfg, weights, err, errlen);
    if (status == 0 && adapters) status = peft_tensors_check_all_used(adapters, err, errlen);
    CkptHfFiles carried = {0};
    if (status == 0) status = hf_files_collect(src, &carried, err, errlen);
    if (status == 0) status = mt_make_parent_dirs(dst, err, errlen);
    if (status == 0) {
        if (options->progress) fprintf(stderr, "convert: writing the checkpoint %s\n", dst);
        CkptSource *sources = param_sources(infos, num_params, feeds);
        CkptPayload payload = {.num_sources = num_params, .sources = sources, .model_config = cfg,
                               .hf_files = &carried, .compression_level = 3, .filter = CKPT_FILTER_SHUFFLE4,
                               .threads = omp_get_max_threads(), .progress = options->progress};
        status = ckpt_write_payload_host_temp(dst, &payload, NULL, err, errlen);
        free(sources);
    }
    if (status == 0) {
        char names[512];
        hf_files_list(&carried, names, sizeof names);
        printf("converted %s (Hugging Face %s, %d layers, %ld parameters; carried files: %s) to megatrain "
               "checkpoint %s\n",
               what, hf_model_type(cfg->family), cfg->num_layers, num_floats, names, dst);
    }
    ckpt_hf_files_free(&carried);
    st_model_close(weights);
    free(feed_storage);
    free(feeds);
    free(infos);
    return status;
}

int convert_hf_to_ckpt(const char *src, const char *dst, const ConvertOptions *options, char *err, size_t errlen) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", src);
    ModelConfig cfg;
    if (hf_config_read(path, &cfg, err, errlen) != 0) return -1;
    char why[1536];
    if (ckpt_model_config_check(&cfg, why, sizeof why) != 0) { /* values the checkpoint's model.yaml cannot hold */
        mt_set_error(err, errlen, "%s: a value the checkpoint cannot hold (%s)", path, why);
        return -1;
    }
    return convert_hf_model_to_ckpt(src, &cfg, NULL, src, dst, options, err, errlen);
}
