/* safetensors.c: parsing and validating a safetensors file (header JSON,
 * offsets, sizes), mmap'ing it, and converting its tensors to fp32. */
#include "safetensors.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../core/error.h"
#include "../core/json.h"
#include "../core/float16.h"
#include "../core/fs.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (safetensors data is little-endian)"
#endif

static const char *const dtype_names[] = {"F32", "BF16", "F16"};

int st_dtype_from_name(const char *name) {
    for (int i = 0; i < 3; i++)
        if (strcmp(name, dtype_names[i]) == 0) return i;
    return -1;
}

const char *st_dtype_name(StDtype dtype) { return dtype_names[dtype]; }

size_t st_dtype_size(StDtype dtype) { return dtype == ST_F32 ? 4 : 2; }

void st_close(StFile *file) {
    if (!file) return;
    for (int i = 0; i < file->num_tensors; i++) free(file->tensors[i].name);
    for (int i = 0; i < file->num_metadata; i++) {
        free(file->metadata[i].key);
        free(file->metadata[i].value);
    }
    free(file->tensors);
    free(file->metadata);
    if (file->map) munmap(file->map, file->map_size);
    free(file->path);
    free(file);
}

static int read_metadata(StFile *file, const JsonValue *meta, const char *label, char *err, size_t errlen) {
    if (meta->type != JSON_OBJECT) {
        mt_set_error(err, errlen, "%s: header: __metadata__ must be an object of strings, found %s", label,
                     json_type_name(meta->type));
        return -1;
    }
    file->metadata = mt_calloc(meta->count ? meta->count : 1, sizeof *file->metadata);
    for (size_t i = 0; i < meta->count; i++) {
        const JsonMember *m = &meta->members[i];
        if (m->value->type != JSON_STRING) {
            mt_set_error(err, errlen, "%s: header: __metadata__.%s must be a string, found %s", label, m->key,
                         json_type_name(m->value->type));
            return -1;
        }
        file->metadata[file->num_metadata].key = mt_strdup(m->key);
        file->metadata[file->num_metadata].value = mt_strdup(m->value->string);
        file->num_metadata++;
    }
    return 0;
}

/* One header entry into *t (name set by the caller). data_len: bytes after the header. */
static int read_entry(StTensor *t, const JsonValue *info, size_t data_len, uint64_t *begin, uint64_t *end,
                      const char *label, char *err, size_t errlen) {
    const char *name = t->name;
    if (info->type != JSON_OBJECT) {
        mt_set_error(err, errlen, "%s: header: tensor '%s': expected an object, found %s", label, name,
                     json_type_name(info->type));
        return -1;
    }
    const JsonValue *dtype = json_get(info, "dtype");
    const JsonValue *shape = json_get(info, "shape");
    const JsonValue *offsets = json_get(info, "data_offsets");
    if (!dtype || dtype->type != JSON_STRING) {
        mt_set_error(err, errlen, "%s: header: tensor '%s': missing \"dtype\" string", label, name);
        return -1;
    }
    int d = st_dtype_from_name(dtype->string);
    if (d < 0) {
        mt_set_error(err, errlen, "%s: tensor '%s' has dtype %s; supported dtypes are F32, BF16 and F16", label, name,
                     dtype->string);
        return -1;
    }
    t->dtype = (StDtype)d;
    if (!shape || shape->type != JSON_ARRAY || shape->count > ST_MAX_DIMS) {
        mt_set_error(err, errlen, "%s: header: tensor '%s': expected \"shape\" as an array of at most %d sizes", label,
                     name, ST_MAX_DIMS);
        return -1;
    }
    t->ndim = (int)shape->count;
    uint64_t numel = 1;
    for (size_t i = 0; i < shape->count; i++) {
        int64_t dim;
        if (json_as_int64(shape->items[i], &dim) != 0 || dim < 0) {
            mt_set_error(err, errlen, "%s: header: tensor '%s': shape[%zu] is not a non-negative integer", label,
                         name, i);
            return -1;
        }
        t->shape[i] = dim;
        if (dim != 0 && numel > UINT64_MAX / 8 / (uint64_t)dim) {
            mt_set_error(err, errlen, "%s: header: tensor '%s': shape is too large", label, name);
            return -1;
        }
        numel *= (uint64_t)dim;
    }
    t->numel = (int64_t)numel;
    int64_t b, e;
    if (!offsets || offsets->type != JSON_ARRAY || offsets->count != 2 || json_as_int64(offsets->items[0], &b) != 0 ||
        json_as_int64(offsets->items[1], &e) != 0 || b < 0 || e < 0) {
        mt_set_error(err, errlen, "%s: header: tensor '%s': expected \"data_offsets\" as [begin, end] byte offsets",
                     label, name);
        return -1;
    }
    if (b > e) {
        mt_set_error(err, errlen, "%s: tensor '%s': data_offsets [%lld, %lld] end before they begin", label, name,
                     (long long)b, (long long)e);
        return -1;
    }
    if ((uint64_t)e > data_len) {
        mt_set_error(err, errlen,
                     "%s: tensor '%s': data_offsets [%lld, %lld] are out of range (the data section is %zu bytes)",
                     label, name, (long long)b, (long long)e, data_len);
        return -1;
    }
    uint64_t expected = numel * st_dtype_size(t->dtype);
    if ((uint64_t)(e - b) != expected) {
        mt_set_error(err, errlen,
                     "%s: tensor '%s': data_offsets [%lld, %lld] hold %lld bytes, but %llu elements of %s need %llu",
                     label, name, (long long)b, (long long)e, (long long)(e - b), (unsigned long long)numel,
                     dtype->string, (unsigned long long)expected);
        return -1;
    }
    *begin = (uint64_t)b;
    *end = (uint64_t)e;
    t->nbytes = (size_t)expected;
    return 0;
}

typedef struct Span {
    uint64_t begin, end;
    int index;
} Span;

static int compare_spans(const void *a, const void *b) {
    const Span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* The reference reader's rule: sorted by offset, tensors tile the data exactly. */
static int check_tiling(const StFile *file, Span *spans, int n, size_t data_len, const char *label, char *err,
                        size_t errlen) {
    qsort(spans, (size_t)n, sizeof *spans, compare_spans);
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        const char *name = file->tensors[spans[i].index].name;
        if (spans[i].begin < at) {
            mt_set_error(err, errlen, "%s: tensor '%s' (bytes %llu..%llu) overlaps tensor '%s'", label, name,
                         (unsigned long long)spans[i].begin, (unsigned long long)spans[i].end,
                         file->tensors[spans[i - 1].index].name);
            return -1;
        }
        if (spans[i].begin > at) {
            mt_set_error(err, errlen, "%s: %llu bytes before tensor '%s' belong to no tensor (offset %llu)", label,
                         (unsigned long long)(spans[i].begin - at), name, (unsigned long long)at);
            return -1;
        }
        at = spans[i].end;
    }
    if (at != data_len) {
        mt_set_error(err, errlen, "%s: the last %llu bytes of the data section belong to no tensor", label,
                     (unsigned long long)(data_len - at));
        return -1;
    }
    return 0;
}

static int parse_header(StFile *file, const unsigned char *bytes, size_t len, const char *label, char *err,
                        size_t errlen) {
    if (len < 8) {
        mt_set_error(err, errlen, "%s: %zu bytes is too short for a safetensors file (8-byte header length)", label,
                     len);
        return -1;
    }
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; i--) header_len = (header_len << 8) | bytes[i];
    if (header_len > ST_MAX_HEADER) {
        mt_set_error(err, errlen, "%s: header length %llu is over the %u-byte limit (not a safetensors file?)", label,
                     (unsigned long long)header_len, ST_MAX_HEADER);
        return -1;
    }
    if (header_len > len - 8) {
        mt_set_error(err, errlen, "%s: header length %llu runs past the end of the %zu-byte file", label,
                     (unsigned long long)header_len, len);
        return -1;
    }
    const char *header = (const char *)bytes + 8;
    if (header_len < 2 || header[0] != '{') {
        mt_set_error(err, errlen, "%s: the header does not start with '{' (not a safetensors file?)", label);
        return -1;
    }
    char why[256];
    JsonValue *root = json_parse(header, (size_t)header_len, why, sizeof why);
    if (!root) {
        mt_set_error(err, errlen, "%s: header: %s", label, why);
        return -1;
    }
    if (root->type != JSON_OBJECT) {
        mt_set_error(err, errlen, "%s: header: expected an object, found %s", label, json_type_name(root->type));
        json_free(root);
        return -1;
    }
    const unsigned char *data = bytes + 8 + header_len;
    size_t data_len = len - 8 - (size_t)header_len;
    file->tensors = mt_calloc(root->count ? root->count : 1, sizeof *file->tensors);
    Span *spans = mt_calloc(root->count ? root->count : 1, sizeof *spans);
    int status = 0;
    bool seen_metadata = false;
    for (size_t i = 0; i < root->count && status == 0; i++) {
        const JsonMember *m = &root->members[i];
        if (strcmp(m->key, "__metadata__") == 0) {
            if (seen_metadata) {
                mt_set_error(err, errlen, "%s: header: __metadata__ appears twice", label);
                status = -1;
            } else {
                seen_metadata = true;
                status = read_metadata(file, m->value, label, err, errlen);
            }
            continue;
        }
        if (m->key_len != strlen(m->key) || m->key_len == 0) {
            mt_set_error(err, errlen, "%s: header: a tensor name is empty or holds a NUL character", label);
            status = -1;
            break;
        }
        if (st_find(file, m->key)) {
            mt_set_error(err, errlen, "%s: header: tensor '%s' appears twice", label, m->key);
            status = -1;
            break;
        }
        StTensor *t = &file->tensors[file->num_tensors];
        t->name = mt_strdup(m->key);
        file->num_tensors++;
        Span *s = &spans[file->num_tensors - 1];
        s->index = file->num_tensors - 1;
        status = read_entry(t, m->value, data_len, &s->begin, &s->end, label, err, errlen);
        if (status == 0) t->data = data + s->begin;
    }
    if (status == 0) status = check_tiling(file, spans, file->num_tensors, data_len, label, err, errlen);
    free(spans);
    json_free(root);
    return status;
}

StFile *st_parse(const unsigned char *bytes, size_t len, const char *label, char *err, size_t errlen) {
    StFile *file = mt_calloc(1, sizeof *file);
    file->path = mt_strdup(label);
    if (parse_header(file, bytes, len, label, err, errlen) != 0) {
        st_close(file);
        return NULL;
    }
    return file;
}

StFile *st_open(const char *path, char *err, size_t errlen) {
    uint64_t file_size = 0;
    int fd = mt_open_regular(path, NULL, &file_size, err, errlen); /* a FIFO is refused, not waited on */
    if (fd < 0) return NULL;
    size_t size = (size_t)file_size;
    if (size < 8) {
        close(fd);
        mt_set_error(err, errlen, "%s: %zu bytes is too short for a safetensors file (8-byte header length)", path,
                     size);
        return NULL;
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        mt_set_error(err, errlen, "%s: cannot map: %s", path, strerror(errno));
        return NULL;
    }
    StFile *file = mt_calloc(1, sizeof *file);
    file->path = mt_strdup(path);
    file->map = map;
    file->map_size = size;
    if (parse_header(file, map, size, path, err, errlen) != 0) {
        st_close(file);
        return NULL;
    }
    return file;
}

const StTensor *st_find(const StFile *file, const char *name) {
    for (int i = 0; i < file->num_tensors; i++)
        if (strcmp(file->tensors[i].name, name) == 0) return &file->tensors[i];
    return NULL;
}

const char *st_metadata_get(const StFile *file, const char *key) {
    for (int i = 0; i < file->num_metadata; i++)
        if (strcmp(file->metadata[i].key, key) == 0) return file->metadata[i].value;
    return NULL;
}

void st_tensor_to_f32(const StTensor *tensor, float *out) { st_tensor_range_to_f32(tensor, 0, tensor->numel, out); }

void st_tensor_range_to_f32(const StTensor *tensor, int64_t first, int64_t count, float *out) {
    const unsigned char *p = tensor->data + (size_t)first * st_dtype_size(tensor->dtype);
    size_t n = (size_t)count;
    if (tensor->dtype == ST_F32) {
        memcpy(out, p, n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, sizeof h);
        out[i] = tensor->dtype == ST_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
}

void st_format_shape(char *out, size_t outlen, int ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(out, outlen, "[");
    for (int i = 0; i < ndim && used < outlen; i++)
        used += (size_t)snprintf(out + used, outlen - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (used < outlen) snprintf(out + used, outlen - used, "]");
}
