/* safetensors.h: reading and writing safetensors files and sharded models.
 *
 * Format (github.com/huggingface/safetensors): u64 little-endian header
 * length N, N bytes of JSON (padded with spaces), then the raw little-endian
 * tensor data. The header maps each tensor name to {"dtype", "shape",
 * "data_offsets": [begin, end]} (offsets relative to the end of the header)
 * and may hold "__metadata__": {string: string}. Like the reference reader,
 * we require the tensors to tile the data exactly: no overlap, no gap, no
 * trailing bytes, each size equal to numel * dtype size.
 *
 * We read and write F32, BF16 and F16. A model is either one
 * model.safetensors or shards listed by model.safetensors.index.json
 * ({"metadata": {"total_size": ...}, "weight_map": {name: file}}).
 */
#ifndef MT_CONVERT_SAFETENSORS_H
#define MT_CONVERT_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER (100u * 1000u * 1000u) /* the reference reader's limit */

typedef enum { ST_F32, ST_BF16, ST_F16 } StDtype;

typedef struct StTensor {
    char *name;
    StDtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    const unsigned char *data; /* into the mapped file */
    size_t nbytes;
} StTensor;

typedef struct StMetadataEntry {
    char *key, *value;
} StMetadataEntry;

typedef struct StFile {
    char *path;
    void *map;          /* the mmap'd file (NULL for an in-memory parse) */
    size_t map_size;
    int num_tensors;
    StTensor *tensors;  /* in header order */
    int num_metadata;
    StMetadataEntry *metadata;
} StFile;

/* "F32" -> ST_F32 etc.; -1 when not one of ours. */
int st_dtype_from_name(const char *name);
const char *st_dtype_name(StDtype dtype);
size_t st_dtype_size(StDtype dtype);

/* Parse a whole safetensors file held in bytes[0..len) (kept by reference:
 * it must outlive the StFile). `label` names it in messages. Returns NULL
 * with err set on any malformation. */
StFile *st_parse(const unsigned char *bytes, size_t len, const char *label, char *err, size_t errlen);

/* mmap and parse `path`. NULL with err naming the file on failure. */
StFile *st_open(const char *path, char *err, size_t errlen);
void st_close(StFile *file);

const StTensor *st_find(const StFile *file, const char *name);
const char *st_metadata_get(const StFile *file, const char *key);

/* "[2, 3]": a shape for messages. */
void st_format_shape(char *out, size_t outlen, int ndim, const int64_t *shape);

/* Convert a tensor's data to fp32 (out holds numel floats). */
void st_tensor_to_f32(const StTensor *tensor, float *out);
/* Convert elements [first, first + count) of a tensor's data to fp32. */
void st_tensor_range_to_f32(const StTensor *tensor, int64_t first, int64_t count, float *out);

/* ---- writing ---- */

/* Produces elements [first, first + count) of a tensor to write, as fp32,
 * into out: for a tensor not held in memory (convert streams a checkpoint's
 * tensors through it). Returns 0, or -1 with err set. */
typedef int (*StFillFn)(const void *ctx, int64_t first, int64_t count, float *out, char *err, size_t errlen);

/* One tensor to write: fp32 source data, stored as `dtype`. */
typedef struct StWriteTensor {
    const char *name;
    StDtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    const float *data; /* numel floats, or NULL: made in blocks by fill (with fill_ctx) */
    bool same_storage; /* st_write_model: shares the storage of the tensor before it (slices of one
                        * torch tensor, as transformers 5 saves fused experts): same shard, and the
                        * storage's bytes are counted once, with the first */
    StFillFn fill;
    const void *fill_ctx;
} StWriteTensor;

size_t st_write_tensor_bytes(const StWriteTensor *tensor);

/* Write one safetensors file at `path` (created or truncated) holding
 * `count` tensors, ordered as the reference writer orders them (by name for
 * one dtype), with optional __metadata__ pairs. Returns 0, or -1 with err. */
int st_write_file(const char *path, const StWriteTensor *tensors, int count, const StMetadataEntry *metadata,
                  int num_metadata, char *err, size_t errlen);

/* Write a model into directory `dir` (which exists): model.safetensors when
 * the data fits in max_shard_bytes, else model-0000K-of-0000N.safetensors
 * files and model.safetensors.index.json, split exactly as transformers'
 * save_pretrained splits a state_dict given in this order (huggingface_hub:
 * shards fill in order; a tensor, or a run of tensors sharing one storage,
 * larger than the limit gets a file of its own).
 * `progress` (nullable) is called after each tensor. Returns 0 or -1. */
typedef void (*StProgressFn)(void *ctx, int done, int total);
int st_write_model(const char *dir, const StWriteTensor *tensors, int count, uint64_t max_shard_bytes,
                   int64_t total_parameters, StProgressFn progress, void *progress_ctx, char *err, size_t errlen);

/* ---- reading a model directory ---- */

typedef struct StModel {
    int num_files;
    StFile **files;
    /* every tensor of the model, with the file that holds it */
    int num_tensors;
    const StTensor **tensors;
    int *file_index; /* files[file_index[i]] holds tensors[i] */
    bool *used;      /* for the caller: mark tensors consumed, to find extra ones */
    StTensor **views; /* tensors added by st_model_add_view (owned) */
    int num_views;
} StModel;

/* Open the safetensors of an HF model directory: model.safetensors.index.json
 * and its shards, or model.safetensors. Checks that the index and the files
 * agree and that no tensor appears twice. NULL with err on failure. */
StModel *st_model_open(const char *dir, char *err, size_t errlen);
void st_model_close(StModel *model);
/* Index into model->tensors of `name`, or -1. */
int st_model_find(const StModel *model, const char *name);
/* The file path that holds tensor index i. */
const char *st_model_file_of(const StModel *model, int i);
/* A tensor named `name` of shape [dims] made of tensor `of`'s elements from `first` on (contiguous, within it), in
 * its file; `of` is marked used. Returns its index in model->tensors, or -1 (it would not fit in `of`). */
int st_model_add_view(StModel *model, int of, const char *name, int ndim, const int64_t *dims, int64_t first);

/* Parse a size like "5GB" (10^9), "500MB", "2GiB" (2^30), "1024" (bytes). 0 or -1. */
int st_parse_size(const char *text, uint64_t *out);

#endif
