/* ckpt_api.c: the functions of checkpoint.h on top of the writer and the
 * reader: write a directory from a model (+ optimizer, state, recipe), read
 * the model config, and load parameters (the frozen ones a checkpoint lacks
 * from the base it references, ckpt_base.c), optimizer moments and the
 * training state. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../core/progress.h"
#include "checkpoint.h"
#include "ckpt_base.h"
#include "ckpt_reader.h"
#include "ckpt_writer.h"

int ckpt_write_dir(const char *dir, const CheckpointWrite *what, char *err, size_t errlen) {
    const CkptMoments *opt = what->moments;
    if (opt && opt->num_floats != what->model->num_grad_floats) {
        mt_set_error(err, errlen, "%s: the optimizer holds %ld floats, the model trains %ld", dir, opt->num_floats,
                     what->model->num_grad_floats);
        return -1;
    }
    int num_sources = 0;
    CkptSource *sources = ckpt_sources_of_kinds(what->model, what->model->params, model_extra_state(what->model).data,
                                                opt ? opt->m : NULL, opt ? opt->v : NULL,
                                                opt ? opt->dtype : CKPT_DTYPE_FP32, true, true, true, &num_sources);
    CkptPayload payload = {
        .num_sources = num_sources,
        .sources = sources,
        .model_config = what->model_config ? what->model_config : &what->model->cfg,
        .recipe = what->recipe,
        .hf_files = what->hf_files,
        .compression_level = what->compression_level > 0 ? what->compression_level : 3,
        .filter = CKPT_FILTER_SHUFFLE4,
        .threads = omp_get_max_threads(),
        .progress = true,
    };
    if (what->state) {
        payload.has_state = true;
        payload.state = *what->state;
        payload.iteration = what->state->step;
    }
    int rc = ckpt_write_payload(dir, &payload, NULL, err, errlen);
    free(sources);
    return rc;
}

int ckpt_read_model_config(const char *dir, ModelConfig *model_config, char *err, size_t errlen) {
    CkptReader *r = ckpt_reader_open(dir, err, errlen); /* verifies model.yaml's CRC */
    if (!r) return -1;
    ckpt_reader_close(r);
    char path[MT_PATH_MAX + 32];
    ckpt_file_path(path, sizeof path, dir, CKPT_MODEL_FILE);
    return model_config_load(model_config, path, err, errlen);
}

static void shape_text(char *out, size_t len, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(out, len, "[");
    for (int d = 0; d < ndim && n < len; d++) n += (size_t)snprintf(out + n, len - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < len) snprintf(out + n, len - n, "]");
}

/* The tensor `name` of r's checkpoint, of the whole shape of `info`; NULL with err (CKPT_ERR_MISMATCH). */
static const CkptTensorMeta *find_param(CkptReader *r, const char *name, const ParamInfo *info, char *err,
                                        size_t errlen) {
    const CkptTensorMeta *t = ckpt_meta_find(&r->meta, name);
    if (!t && model_is_expert_bias(name)) {
        mt_set_error(err, errlen, "%s: has no tensor '%s': its routers were trained without expert biases, which the "
                     "recipe's model.moe.load_balancing: expert_bias adds; a run cannot be resumed with them added (a "
                     "new run with init_from: this checkpoint starts them at zero)", r->dir, name);
        return NULL;
    }
    if (!t) {
        mt_set_error(err, errlen, "%s: has no tensor '%s' (the model needs it)", r->dir, name);
        return NULL;
    }
    int64_t whole[CKPT_MAX_DIMS] = {0};
    for (int d = 0; d < info->ndim; d++) whole[d] = info->global_shape[d];
    bool same = t->ndim == info->ndim;
    for (int d = 0; same && d < info->ndim; d++) same = t->shape[d] == whole[d];
    if (!same) {
        char have[96], want[96];
        shape_text(have, sizeof have, t->ndim, t->shape);
        shape_text(want, sizeof want, info->ndim, whole);
        mt_set_error(err, errlen, "%s: tensor '%s' is %s, the model needs %s", r->dir, name, have, want);
        return NULL;
    }
    return t;
}

/* Load tensor `name` (shaped like `info`) into dst, as `dtype`. */
static int load_param(CkptReader *r, const char *name, const ParamInfo *info, CkptDType dtype, void *dst, char *err,
                      size_t errlen) {
    const CkptTensorMeta *t = find_param(r, name, info, err, errlen);
    if (!t) return CKPT_ERR_MISMATCH;
    /* this rank's block of the whole tensor (all of it unless tensor parallel cuts it) */
    int64_t shape[CKPT_MAX_DIMS] = {0}, start[CKPT_MAX_DIMS] = {0};
    for (int d = 0; d < info->ndim; d++) {
        shape[d] = info->shape[d];
        start[d] = info->global_start[d];
    }
    return ckpt_reader_read_as(r, t, start, shape, dtype, dst, err, errlen) == 0 ? 0 : CKPT_ERR_UNREADABLE;
}

/* Whether parameter `info` is read from the frozen base r's checkpoint references (record BASE): frozen, and
 * not stored in r's checkpoint itself. */
static bool in_base(const CkptReader *r, const ParamInfo *info) {
    return info->frozen && r->meta.base.present && !ckpt_meta_find(&r->meta, info->name);
}

/* Which parameters load_weights reads. */
typedef enum { LOAD_ALL, LOAD_TRAINABLE, LOAD_FROZEN } LoadWhich;

/* The weights of every parameter of `which` into model->params. A frozen one
 * that r's checkpoint lacks comes from the base it references (record BASE),
 * opened and checked at the first such parameter: any failure there is
 * CKPT_ERR_BASE. With zeroed non-NULL, an expert bias the checkpoint lacks is
 * set to zero and counted there instead of refused. `progress` counts tensors
 * on from *done. */
static int load_weights(CkptReader *r, Model *model, LoadWhich which, int *zeroed, Progress *progress, int *done,
                        char *err, size_t errlen) {
    CkptReader *base = NULL;
    int rc = 0;
    for (int i = 0; i < model->num_params && rc == 0; i++) {
        const ParamInfo *info = &model->param_info[i];
        if ((which == LOAD_TRAINABLE && info->frozen) || (which == LOAD_FROZEN && !info->frozen)) continue;
        if (zeroed && model_is_expert_bias(info->name) && !ckpt_meta_find(&r->meta, info->name)) {
            memset(model->params + info->offset, 0, (size_t)info->numel * sizeof(float));
            ++*zeroed;
            progress_update(progress, ++*done);
            continue;
        }
        CkptReader *from = r;
        if (in_base(r, info)) {
            if (!base && !(base = ckpt_base_open(r->dir, &r->meta.base, err, errlen))) return CKPT_ERR_BASE;
            from = base;
        }
        char why[2048];
        rc = load_param(from, info->name, info, CKPT_DTYPE_FP32, model->params + info->offset, why, sizeof why);
        if (rc != 0 && from == base) {
            ckpt_base_unreadable(err, errlen, r->dir, &r->meta.base, why);
            rc = CKPT_ERR_BASE;
        } else if (rc != 0) {
            mt_set_error(err, errlen, "%s", why);
        } else {
            progress_update(progress, ++*done);
        }
    }
    ckpt_reader_close(base);
    return rc;
}

/* The AdamW moments `prefix`<name> of every trainable parameter into moments (of dtype, laid out like the
 * gradients: at its offset in the trainable region). */
static int load_moments(CkptReader *r, const Model *model, const char *prefix, CkptDType dtype, void *moments,
                        Progress *progress, int *done, char *err, size_t errlen) {
    for (int i = 0; i < model->num_params; i++) {
        const ParamInfo *info = &model->param_info[i];
        if (info->frozen) continue;
        char name[CKPT_NAME_MAX];
        snprintf(name, sizeof name, "%s%s", prefix, info->name);
        const size_t at = info->offset - (size_t)model->trainable_offset;
        int rc = load_param(r, name, info, dtype, (char *)moments + at * ckpt_dtype_size(dtype), err, errlen);
        if (rc != 0) return rc;
        progress_update(progress, ++*done);
    }
    return 0;
}

/* "checkpoint: loading 120/291 tensors (41%)" on a terminal, for `passes` copies of the model's tensors. */
static void start_load_progress(Progress *progress, const Model *model, int passes) {
    progress_start(progress, true, "checkpoint", "loading", "tensors", model->num_params * passes,
                   (uint64_t)model->num_floats * sizeof(float) * (uint64_t)passes);
}

static bool has_name(const ParamInfo *infos, int count, const char *name) {
    for (int i = 0; i < count; i++)
        if (strcmp(infos[i].name, name) == 0) return true;
    return false;
}

/* Parameters the checkpoint holds that the whole model lacks mean another
 * model (a rank of a parallel layout checks against the whole registry). */
static int check_no_extra_params(CkptReader *r, const ModelConfig *cfg, char *err, size_t errlen) {
    int count = 0;
    long total = 0;
    ModelPartition whole = model_partition_whole(cfg);
    ParamInfo *infos = model_registry_of(cfg, &whole, &count, &total);
    int rc = 0;
    for (int i = 0; i < r->meta.num_tensors && rc == 0; i++) {
        const char *name = r->meta.tensors[i].name;
        if (strncmp(name, "optimizer.", 10) == 0 || model_is_extra_state(name)) continue; /* a run's, any model's */
        if (!has_name(infos, count, name) && model_is_expert_bias(name)) {
            mt_set_error(err, errlen, "%s: tensor '%s' is an expert bias: its routers choose with them "
                         "(model.moe.load_balancing: expert_bias), which the recipe's load_balancing drops", r->dir,
                         name);
            rc = CKPT_ERR_MISMATCH;
        } else if (!has_name(infos, count, name)) {
            mt_set_error(err, errlen, "%s: tensor '%s' has no place in the model (a different model shape?)", r->dir,
                         name);
            rc = CKPT_ERR_MISMATCH;
        }
    }
    free(infos);
    return rc;
}

static int load_model(const char *dir, Model *model, LoadWhich which, int *zeroed, char *err, size_t errlen) {
    CkptReader *r = ckpt_reader_open(dir, err, errlen);
    if (!r) return -1;
    int rc = check_no_extra_params(r, &model->cfg, err, errlen);
    Progress progress;
    int done = 0;
    start_load_progress(&progress, model, 1);
    if (rc == 0) rc = load_weights(r, model, which, zeroed, &progress, &done, err, errlen);
    progress_end(&progress);
    ckpt_reader_close(r);
    return rc == 0 ? 0 : -1;
}

int ckpt_load_model(const char *dir, Model *model, char *err, size_t errlen) {
    return load_model(dir, model, LOAD_ALL, NULL, err, errlen);
}

int ckpt_load_frozen(const char *dir, Model *model, char *err, size_t errlen) {
    return load_model(dir, model, LOAD_FROZEN, NULL, err, errlen);
}

int ckpt_load_trainable(const char *dir, Model *model, char *err, size_t errlen) {
    return load_model(dir, model, LOAD_TRAINABLE, NULL, err, errlen);
}

int ckpt_load_init(const char *dir, Model *model, bool frozen_only, char *err, size_t errlen) {
    int zeroed = 0;
    return load_model(dir, model, frozen_only ? LOAD_FROZEN : LOAD_ALL, &zeroed, err, errlen);
}

/* The model's extra state (FP8 amax histories) from the checkpoint when it holds it (written by a run with the
 * same fp8.recipe delayed); otherwise the model keeps its fresh state and says so. */
static int load_extra_state(CkptReader *r, Model *model, char *err, size_t errlen) {
    const ModelExtraState extra = model_extra_state(model);
    if (extra.count == 0) return 0;
    if (!ckpt_meta_find(&r->meta, extra.info[0].name)) {
        mt_log("resume: %s holds no FP8 amax histories (fp8.recipe was not delayed): delayed scaling starts afresh",
               r->dir);
        return 0;
    }
    for (int i = 0; i < extra.count; i++) {
        const ParamInfo *info = &extra.info[i];
        const CkptTensorMeta *t = ckpt_meta_find(&r->meta, info->name);
        if (t && info->ndim == 2 && t->ndim == 2 && t->shape[1] != info->shape[1]) {
            mt_set_error(err, errlen, "%s: its FP8 amax histories hold %lld amaxes, fp8.amax_history_len is %ld: resume "
                         "with --set fp8.amax_history_len=%lld", r->dir, (long long)t->shape[1], info->shape[1],
                         (long long)t->shape[1]);
            return CKPT_ERR_MISMATCH;
        }
        int rc = load_param(r, info->name, info, CKPT_DTYPE_FP32, extra.data + info->offset, err, errlen);
        if (rc != 0) return rc;
    }
    return 0;
}

int ckpt_load_training(const char *dir, Model *model, CkptMoments *optimizer, CkptState *state, char *err,
                       size_t errlen) {
    CkptReader *r = ckpt_reader_open(dir, err, errlen);
    if (!r) return CKPT_ERR_UNREADABLE;
    int rc = 0;
    if ((state || optimizer) && !r->meta.has_state) {
        mt_set_error(err, errlen, "%s: holds no training state (it was not written by a run: use it to initialise a "
                     "new run instead)", dir);
        rc = CKPT_ERR_MISMATCH;
    }
    if (rc == 0) rc = check_no_extra_params(r, &model->cfg, err, errlen);
    Progress progress;
    int done = 0;
    start_load_progress(&progress, model, optimizer ? 3 : 1);
    if (rc == 0) rc = load_weights(r, model, LOAD_ALL, NULL, &progress, &done, err, errlen);
    if (rc == 0 && state) rc = load_extra_state(r, model, err, errlen);
    if (rc == 0 && optimizer) {
        const ParamInfo *trained = NULL; /* the first parameter with moments */
        for (int i = 0; i < model->num_params && !trained; i++)
            if (!model->param_info[i].frozen) trained = &model->param_info[i];
        char first[CKPT_NAME_MAX];
        snprintf(first, sizeof first, "optimizer.m.%s", trained ? trained->name : "");
        if (trained && !ckpt_meta_find(&r->meta, first)) {
            mt_set_error(err, errlen, "%s: holds no optimizer state; set checkpoint.load_optimizer: false to start "
                         "the optimizer afresh", dir);
            rc = CKPT_ERR_MISMATCH;
        }
        if (rc == 0)
            rc = load_moments(r, model, "optimizer.m.", optimizer->dtype, optimizer->m, &progress, &done, err, errlen);
        if (rc == 0)
            rc = load_moments(r, model, "optimizer.v.", optimizer->dtype, optimizer->v, &progress, &done, err, errlen);
        if (rc == 0) optimizer->step = (long)r->meta.state.optimizer_step;
    }
    progress_end(&progress);
    if (rc == 0 && state) *state = r->meta.state;
    ckpt_reader_close(r);
    return rc;
}

int ckpt_read_step(const char *dir, long *step, char *err, size_t errlen) {
    CkptReader *r = ckpt_reader_open(dir, err, errlen);
    if (!r) return CKPT_ERR_UNREADABLE;
    int rc = 0;
    if (!r->meta.has_state) {
        mt_set_error(err, errlen, "%s: holds no training state", dir);
        rc = CKPT_ERR_MISMATCH;
    } else {
        *step = (long)r->meta.state.step;
    }
    ckpt_reader_close(r);
    return rc;
}

struct CkptParams {
    CkptReader *reader;
    CkptReader *base;               /* the frozen base the checkpoint references, opened when a parameter is there */
    CkptReader **from;              /* per parameter of the caller's registry: reader or base */
    const CkptTensorMeta **tensors; /* per parameter, in its reader */
};

/* Parameter `info` in cp's checkpoint or, frozen and not stored there, in
 * the base it references (opened and checked at the first such parameter,
 * as load_weights does). 0, or -1 with err. */
static int locate_param(CkptParams *cp, int i, const ParamInfo *info, char *err, size_t errlen) {
    CkptReader *r = cp->reader;
    if (!in_base(r, info)) {
        cp->from[i] = r;
        return (cp->tensors[i] = find_param(r, info->name, info, err, errlen)) ? 0 : -1;
    }
    if (!cp->base && !(cp->base = ckpt_base_open(r->dir, &r->meta.base, err, errlen))) return -1;
    char why[2048];
    cp->from[i] = cp->base;
    if ((cp->tensors[i] = find_param(cp->base, info->name, info, why, sizeof why))) return 0;
    ckpt_base_unreadable(err, errlen, r->dir, &r->meta.base, why);
    return -1;
}

CkptParams *ckpt_params_open(const char *dir, const ModelConfig *cfg, const ParamInfo *infos, int num_params,
                             char *err, size_t errlen) {
    CkptReader *r = ckpt_reader_open(dir, err, errlen);
    if (!r) return NULL;
    CkptParams *cp = mt_calloc(1, sizeof *cp);
    cp->reader = r;
    cp->from = mt_calloc((size_t)(num_params ? num_params : 1), sizeof *cp->from);
    cp->tensors = mt_calloc((size_t)(num_params ? num_params : 1), sizeof *cp->tensors);
    int rc = check_no_extra_params(r, cfg, err, errlen);
    for (int i = 0; i < num_params && rc == 0; i++) rc = locate_param(cp, i, &infos[i], err, errlen);
    if (rc != 0) {
        ckpt_params_close(cp);
        return NULL;
    }
    return cp;
}

int ckpt_params_read(CkptParams *cp, int param, const int64_t *start, const int64_t *shape, float *dst, char *err,
                     size_t errlen) {
    if (cp->from[param] == cp->reader)
        return ckpt_reader_read(cp->reader, cp->tensors[param], start, shape, dst, err, errlen);
    char why[2048];
    if (ckpt_reader_read(cp->base, cp->tensors[param], start, shape, dst, why, sizeof why) == 0) return 0;
    ckpt_base_unreadable(err, errlen, cp->reader->dir, &cp->reader->meta.base, why);
    return -1;
}

void ckpt_params_close(CkptParams *cp) {
    if (!cp) return;
    ckpt_reader_close(cp->base);
    ckpt_reader_close(cp->reader);
    free(cp->tensors);
    free(cp->from);
    free(cp);
}

int ckpt_read_datasets(const char *dir, CkptDataset **datasets, int *count, char *err, size_t errlen) {
    *datasets = NULL;
    *count = 0;
    CkptReader *r = ckpt_reader_open_metadata(dir, err, errlen);
    if (!r) return -1;
    const int unreadable = r->meta.datasets_unreadable ? 1 : 0;
    if (r->meta.num_datasets > 0) {
        *datasets = mt_malloc((size_t)r->meta.num_datasets * sizeof **datasets);
        memcpy(*datasets, r->meta.datasets, (size_t)r->meta.num_datasets * sizeof **datasets);
        *count = r->meta.num_datasets;
    }
    ckpt_reader_close(r);
    return unreadable;
}
