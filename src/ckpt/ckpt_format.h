/* ckpt_format.h: the checkpoint metadata (what metadata.mtck holds) and its
 * binary encoding. docs/checkpoints.md describes the bytes for users.
 *
 * A checkpoint directory holds:
 *   metadata.mtck        this metadata (written last, inside the temporary directory)
 *   shard_RRRRR.zst      the zstd frames written by rank RRRRR (one frame per chunk)
 *   model.yaml           the model config (a configs/ file: model_config_load reads it)
 *   recipe.yaml          the resolved recipe, when the checkpoint comes from a run
 *   tokenizer.json ...   files carried for the Hugging Face export (role hf), as given
 * Every tensor is a GLOBAL tensor cut into chunks; each chunk records the
 * file, byte range, global offsets and shape, the filter and codec, and the
 * CRC-32C of its raw (unfiltered, uncompressed) bytes.
 *
 * Encoding (little-endian): "MTCKPT\n\0", u32 format version, u32 CRC-32C of
 * the body, u64 body length, body. The body is a list of records: 4-byte
 * tag, u64 payload length, payload. Readers skip records with tags they do
 * not know, so later versions can add records. Strings are u32 length +
 * bytes (no NUL). */
#ifndef MT_CKPT_CKPT_FORMAT_H
#define MT_CKPT_CKPT_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CKPT_FORMAT_VERSION 1
#define CKPT_MAGIC "MTCKPT\n"            /* 8 bytes with its NUL */
#define CKPT_HEADER_BYTES 24
#define CKPT_MAX_DIMS 4
#define CKPT_NAME_MAX 256                 /* tensor and file names, bytes */
#define CKPT_BASE_DIR_MAX 1023            /* a referenced base's directory, bytes (MT_PATH_MAX - 1) */
#define CKPT_METADATA_FILE "metadata.mtck"
#define CKPT_MODEL_FILE "model.yaml"
#define CKPT_RECIPE_FILE "recipe.yaml"

#define CKPT_CODEC_ZSTD "zstd"
#define CKPT_NUM_DTYPES 2
#define CKPT_NUM_FILTERS 2
#define CKPT_NUM_ROLES 4

typedef enum { CKPT_DTYPE_FP32 = 0, CKPT_DTYPE_BF16 = 1 } CkptDType;
typedef enum { CKPT_FILTER_NONE = 0, CKPT_FILTER_SHUFFLE4 = 1 } CkptFilter; /* shuffle4: byte planes of 4-byte words */
/* hf: a file carried for the Hugging Face export (tokenizer, generation config), opaque bytes */
typedef enum { CKPT_FILE_SHARD = 0, CKPT_FILE_MODEL_CONFIG = 1, CKPT_FILE_RECIPE = 2, CKPT_FILE_HF = 3 } CkptFileRole;

typedef struct CkptChunk {
    uint32_t file;                  /* index into CkptMeta.files (a shard) */
    uint64_t offset;                /* byte offset of its zstd frame in that file */
    uint64_t stored_bytes;          /* size of the frame */
    uint64_t raw_bytes;             /* numel * dtype size */
    uint32_t crc32c;                /* of the raw bytes */
    CkptFilter filter;
    int64_t start[CKPT_MAX_DIMS];   /* global offsets of the chunk */
    int64_t shape[CKPT_MAX_DIMS];
} CkptChunk;

typedef struct CkptTensorMeta {
    char *name;
    CkptDType dtype;
    int ndim;                       /* 1..CKPT_MAX_DIMS */
    int64_t shape[CKPT_MAX_DIMS];   /* global shape */
    int num_chunks;
    CkptChunk *chunks;
} CkptTensorMeta;

typedef struct CkptFileMeta {
    char *name;                     /* relative to the checkpoint directory, no '/' */
    CkptFileRole role;
    uint64_t size;
    uint32_t crc32c;                /* of the whole file */
} CkptFileMeta;

/* The training progress (record STAT): the loop's state (src/train/train_state.h), the AdamW step and the
 * schedule position it implies (recorded so inspect can show it and resume
 * can tell when a --set changed the schedule). */
typedef struct CkptState {
    int64_t step;
    int64_t consumed_samples;
    int64_t consumed_tokens;
    uint64_t rng[4];
    int64_t optimizer_step;
    int64_t total_steps;
    int64_t next_global_batch_size;
    double next_lr;
} CkptState;

/* The frozen base weights (LoRA's) that a checkpoint references instead of
 * storing them (record BASE, checkpoint.frozen_base: reference): the
 * absolute path of the checkpoint directory that holds them, and the
 * CRC-32C of that directory's metadata.mtck when the reference was made
 * (it lists every chunk's CRC, so it fingerprints the weights). A plain
 * value: nothing to free. */
typedef struct CkptBaseRef {
    bool present;                   /* false: no BASE record (the checkpoint stores what it holds) */
    char dir[CKPT_BASE_DIR_MAX + 1];
    uint32_t metadata_crc32c;
} CkptBaseRef;

/* A dataset the run trained on (record DATA): which of its data lists
 * ("train", "valid", "test"), its prefix, and its fingerprint (what
 * src/data/indexed_dataset.h's DatasetFingerprint holds; the loss mask's
 * files folded in), so that a resume can tell a dataset built again with
 * other contents at the same path. */
#define CKPT_DATA_SPLIT_MAX 8             /* "train", "valid", "test": bytes */
#define CKPT_MAX_DATASETS 4096
typedef struct CkptDataset {
    char split[CKPT_DATA_SPLIT_MAX + 1];
    char path[CKPT_BASE_DIR_MAX + 1];     /* a dataset prefix, 1..1023 bytes */
    int64_t documents;
    uint64_t idx_bytes, bin_bytes;
    uint32_t crc32c;
} CkptDataset;

typedef struct CkptMeta {
    uint32_t version;
    char *writer;                   /* "megatrain 0.1.0" */
    int64_t iteration;              /* the step in the directory name */
    int64_t created_unix;
    uint32_t num_ranks;             /* writing ranks (shard files) */
    bool has_state;
    CkptState state;
    CkptBaseRef base;               /* record BASE: where the frozen parameters it lacks are */
    int num_datasets;               /* record DATA (absent: 0): what the run trained on */
    CkptDataset *datasets;
    bool datasets_unreadable;       /* a DATA record this reader could not decode (dropped: num_datasets 0) */
    int num_files;
    CkptFileMeta *files;
    int num_tensors;
    CkptTensorMeta *tensors;        /* in the order written (model registry order) */
    int *by_name;                   /* tensor indices sorted by name (after decoding) */
} CkptMeta;

/* Encode into a malloc'ed buffer. Returns 0, or -1 with err set. */
int ckpt_meta_encode(const CkptMeta *meta, unsigned char **out, size_t *out_len, char *err, size_t errlen);

/* Decode and validate (magic, version, body checksum, bounds, chunks lying
 * inside their tensors and covering them exactly, unique names). Never reads
 * past len and never crashes on bad input. Returns 0, or -1 with err set
 * (meta is then empty). */
int ckpt_meta_decode(const unsigned char *data, size_t len, CkptMeta *meta, char *err, size_t errlen);

void ckpt_meta_free(CkptMeta *meta);

/* How far above CKPT_FORMAT_VERSION a version is taken for a newer megatrain's (with the header's length and CRC
 * right); beyond it, a corrupt header. */
#define CKPT_NEWER_VERSIONS 64
/* The format version above CKPT_FORMAT_VERSION that a ckpt_meta_decode met since ckpt_meta_newer_clear (from any
 * thread), else 0: a checkpoint a newer megatrain wrote, which this one cannot read but which is not corrupt (resume
 * leaves it where it is rather than moving it aside and falling back to an older one). */
unsigned ckpt_meta_newer(void);
void ckpt_meta_newer_clear(void);

/* The tensor called `name`, or NULL (binary search over by_name). */
const CkptTensorMeta *ckpt_meta_find(const CkptMeta *meta, const char *name);

/* The names written in the metadata, indexed by the enums. */
extern const char *const ckpt_dtype_names[CKPT_NUM_DTYPES];
extern const char *const ckpt_filter_names[CKPT_NUM_FILTERS];
extern const char *const ckpt_role_names[CKPT_NUM_ROLES];

size_t ckpt_dtype_size(CkptDType dtype);
const char *ckpt_dtype_name(CkptDType dtype);
const char *ckpt_filter_name(CkptFilter filter);
int64_t ckpt_numel(int ndim, const int64_t *shape);

#endif
