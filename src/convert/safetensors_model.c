/* safetensors_model.c: opening the weights of a Hugging Face model directory
 * (model.safetensors, or model.safetensors.index.json and its shards) as one
 * set of named tensors, and parsing shard sizes like "5GB". */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../core/error.h"
#include "../core/json.h"
#include "safetensors.h"

#define MAX_INDEX_FILE ((size_t)1 << 30) /* model.safetensors.index.json: a few MB for the largest models */

static bool file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

void st_model_close(StModel *model) {
    if (!model) return;
    for (int i = 0; i < model->num_files; i++) st_close(model->files[i]);
    free(model->files);
    free(model->tensors);
    free(model->file_index);
    free(model->used);
    for (int i = 0; i < model->num_views; i++) {
        free(model->views[i]->name);
        free(model->views[i]);
    }
    free(model->views);
    free(model);
}

int st_model_add_view(StModel *model, int of, const char *name, int ndim, const int64_t *dims, int64_t first) {
    const StTensor *t = model->tensors[of];
    int64_t numel = 1;
    for (int d = 0; d < ndim; d++) numel *= dims[d];
    if (ndim > ST_MAX_DIMS || first < 0 || numel < 0 || first > t->numel || numel > t->numel - first) return -1;
    StTensor *v = mt_calloc(1, sizeof *v);
    *v = (StTensor){.name = mt_strdup(name), .dtype = t->dtype, .ndim = ndim, .numel = numel,
                    .data = t->data + (size_t)first * st_dtype_size(t->dtype),
                    .nbytes = (size_t)numel * st_dtype_size(t->dtype)};
    for (int d = 0; d < ndim; d++) v->shape[d] = dims[d];
    model->views = mt_realloc(model->views, (size_t)(model->num_views + 1) * sizeof *model->views);
    model->views[model->num_views++] = v;
    const int n = model->num_tensors + 1;
    model->tensors = mt_realloc(model->tensors, (size_t)n * sizeof *model->tensors);
    model->file_index = mt_realloc(model->file_index, (size_t)n * sizeof *model->file_index);
    model->used = mt_realloc(model->used, (size_t)n * sizeof *model->used);
    model->tensors[n - 1] = v;
    model->file_index[n - 1] = model->file_index[of];
    model->used[n - 1] = false;
    model->used[of] = true;
    model->num_tensors = n;
    return n - 1;
}

int st_model_find(const StModel *model, const char *name) {
    for (int i = 0; i < model->num_tensors; i++)
        if (strcmp(model->tensors[i]->name, name) == 0) return i;
    return -1;
}

const char *st_model_file_of(const StModel *model, int i) { return model->files[model->file_index[i]]->path; }

static int add_file(StModel *model, const char *path, char *err, size_t errlen) {
    StFile *file = st_open(path, err, errlen);
    if (!file) return -1;
    model->files = mt_realloc(model->files, (size_t)(model->num_files + 1) * sizeof *model->files);
    model->files[model->num_files++] = file;
    int total = model->num_tensors + file->num_tensors;
    model->tensors = mt_realloc(model->tensors, (size_t)(total ? total : 1) * sizeof *model->tensors);
    model->file_index = mt_realloc(model->file_index, (size_t)(total ? total : 1) * sizeof *model->file_index);
    for (int i = 0; i < file->num_tensors; i++) {
        const char *name = file->tensors[i].name;
        int previous = st_model_find(model, name);
        if (previous >= 0) {
            mt_set_error(err, errlen, "tensor '%s' is in both %s and %s", name, st_model_file_of(model, previous), path);
            return -1;
        }
        model->tensors[model->num_tensors] = &file->tensors[i];
        model->file_index[model->num_tensors] = model->num_files - 1;
        model->num_tensors++;
    }
    return 0;
}

/* The shards named by the index, each opened once, checked against the index. */
static int open_indexed(StModel *model, const char *dir, const char *index_path, char *err, size_t errlen) {
    JsonValue *root = json_parse_file(index_path, MAX_INDEX_FILE, err, errlen);
    if (!root) return -1;
    int status = 0;
    const JsonValue *map = json_get(root, "weight_map");
    if (!map || map->type != JSON_OBJECT) {
        mt_set_error(err, errlen, "%s: expected an object with a \"weight_map\" object", index_path);
        status = -1;
    }
    for (size_t i = 0; status == 0 && i < map->count; i++) {
        const JsonMember *m = &map->members[i];
        const JsonValue *file = m->value;
        if (file->type != JSON_STRING || file->string_len == 0 || strchr(file->string, '/') ||
            strlen(file->string) != file->string_len || strcmp(file->string, "..") == 0) {
            mt_set_error(err, errlen, "%s: weight_map.%s: expected a file name in %s", index_path, m->key, dir);
            status = -1;
            break;
        }
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, file->string);
        bool opened = false;
        for (int f = 0; f < model->num_files && !opened; f++) opened = strcmp(model->files[f]->path, path) == 0;
        if (!opened) status = add_file(model, path, err, errlen);
        if (status != 0) break;
        int at = st_model_find(model, m->key);
        if (at < 0 || strcmp(st_model_file_of(model, at), path) != 0) {
            mt_set_error(err, errlen, "%s: the index puts tensor '%s' in %s, but that file does not hold it",
                         index_path, m->key, file->string);
            status = -1;
        }
    }
    /* Every tensor of every shard must be listed (for the file that holds it). */
    for (int i = 0; status == 0 && i < model->num_tensors; i++) {
        const JsonValue *listed = json_get(map, model->tensors[i]->name);
        if (!listed) {
            mt_set_error(err, errlen, "%s holds tensor '%s', which %s does not list", st_model_file_of(model, i),
                         model->tensors[i]->name, index_path);
            status = -1;
        }
    }
    json_free(root);
    return status;
}

StModel *st_model_open(const char *dir, char *err, size_t errlen) {
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        mt_set_error(err, errlen, "%s: not a directory", dir);
        return NULL;
    }
    StModel *model = mt_calloc(1, sizeof *model);
    char index_path[4096], single_path[4096], bin_path[4096 + 16];
    snprintf(index_path, sizeof index_path, "%s/model.safetensors.index.json", dir);
    snprintf(single_path, sizeof single_path, "%s/model.safetensors", dir);
    snprintf(bin_path, sizeof bin_path, "%s/pytorch_model.bin", dir);
    int status;
    if (file_exists(single_path)) { /* first, as transformers' from_pretrained: an index beside it is stale */
        if (file_exists(index_path))
            mt_warn("%s: both model.safetensors and model.safetensors.index.json are there; reading "
                    "model.safetensors, as transformers does (the index and its shards are left from an earlier "
                    "save?)", dir);
        status = add_file(model, single_path, err, errlen);
    } else if (file_exists(index_path)) {
        status = open_indexed(model, dir, index_path, err, errlen);
    } else {
        bool has_bin = file_exists(bin_path);
        strcat(bin_path, ".index.json");
        has_bin = has_bin || file_exists(bin_path);
        mt_set_error(err, errlen, "%s: missing model.safetensors (and no model.safetensors.index.json)%s", dir,
                     has_bin ? "; only safetensors weights are supported, not pytorch_model.bin" : "");
        status = -1;
    }
    if (status != 0) {
        st_model_close(model);
        return NULL;
    }
    model->used = mt_calloc((size_t)(model->num_tensors ? model->num_tensors : 1), sizeof *model->used);
    return model;
}

int st_parse_size(const char *text, uint64_t *out) {
    static const struct {
        const char *suffix;
        double scale;
    } units[] = {{"", 1},      {"B", 1},           {"KB", 1e3},          {"MB", 1e6},
                 {"GB", 1e9},  {"TB", 1e12},       {"KIB", 1024.0},      {"MIB", 1048576.0},
                 {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
    if (!text || !*text || !(isdigit((unsigned char)text[0]) || text[0] == '.')) return -1;
    char *end;
    errno = 0;
    double value = strtod(text, &end);
    if (errno != 0 || !isfinite(value) || value <= 0) return -1;
    char suffix[8];
    size_t n = strlen(end);
    if (n >= sizeof suffix) return -1;
    for (size_t i = 0; i <= n; i++) suffix[i] = (char)toupper((unsigned char)end[i]);
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(suffix, units[i].suffix) != 0) continue;
        double bytes = floor(value * units[i].scale);
        if (bytes < 1 || bytes > 1.8e19) return -1;
        *out = (uint64_t)bytes;
        return 0;
    }
    return -1;
}
