/* recipe_schema.h: the table of recipe keys (name, type, field offset, range,
 * default-free) that drives reading, unknown-key checks and writing, plus the
 * shared helpers of src/config. Private to src/config. */
#ifndef MT_CONFIG_RECIPE_SCHEMA_H
#define MT_CONFIG_RECIPE_SCHEMA_H

#include <stdio.h>

#include "recipe.h"
#include "yaml_tree.h"

#define MT_KEY_PATH_MAX 256
#define MT_NO_MAX 1e300

typedef enum { KT_INT, KT_LONG, KT_U64, KT_DOUBLE, KT_BOOL, KT_STRING, KT_ENUM, KT_SECTION, KT_CUSTOM } KeyType;

typedef struct RecipeKey RecipeKey;

/* Custom reader: `base` is the section struct; `entry` the key and value;
 * `path` the dotted key path. Returns 0, or -1 with err set. */
typedef int (*KeyReadFn)(void *base, const YEntry *entry, const char *path, char *err, size_t errlen);
/* Custom writer: writes "name: value" lines at `indent` spaces. */
typedef void (*KeyWriteFn)(FILE *out, const void *base, const char *name, int indent);
/* Custom comparison (model_config_compare.c): `ckpt` and `recipe` are the section structs (as a writer's base),
 * `path` the key's dotted path; the first difference at `level` into why: -1; 0 when none. */
typedef int (*KeyDiffFn)(const void *ckpt, const void *recipe, const char *path, ModelMatch level, char *why,
                         size_t whylen);

struct RecipeKey {
    const char *name;         /* NULL ends a table */
    KeyType type;
    size_t offset;            /* of the field inside the section struct */
    size_t size;              /* KT_STRING: capacity */
    bool ranged;              /* numbers: check min..max */
    double min, max;          /* inclusive, unless above_min */
    bool above_min;           /* value must be > min */
    bool nullable;            /* written as null when zero (any key read as null keeps its default) */
    const char *word;         /* KT_INT, KT_LONG: the one word the key takes besides its numbers (train.eval_batches:
                               * all), read and written as word_value, which lies outside min..max; NULL: none */
    long word_value;
    bool required;
    bool (*required_if)(const void *base); /* required only when this says so of the section read (NULL: always) */
    const char *const *names; /* KT_ENUM and restricted KT_STRING; NULL-terminated */
    const RecipeKey *keys;    /* KT_SECTION */
    KeyReadFn read;           /* KT_CUSTOM */
    KeyWriteFn write;         /* KT_CUSTOM */
    const char *also;         /* other projects' names for it, separated by spaces (PEFT's r for rank, Megatron's
                               * and torchtitan's names): an unknown key of such a name is answered with "did you
                               * mean" this one */
    const char *value_also;   /* KT_ENUM: other projects' spellings of its values, "theirs=ours" separated by
                               * spaces (Megatron's inverse-square-root=inverse_sqrt): such a value is answered with
                               * "did you mean" ours */
    ModelMatch match;         /* model and peft keys: what a checkpoint's and a recipe's must agree on (0: a
                               * training choice, never compared) */
    KeyDiffFn differ;         /* a marked KT_CUSTOM key's comparison, or another than the value's (NULL: the value) */
};

extern const RecipeKey recipe_root_keys[];
/* What another project's name (a RecipeKey.also) means where megatrain's key differs in unit or form (torchtitan's
 * decay_ratio, a fraction of the steps, for wsd_decay_steps, a count), or NULL. `path` is where it was written
 * ("optimizer.schedule.decay_ratio"): a note of that whole path is taken before one of its last name. */
const char *recipe_also_note(const char *path);
/* Why megatrain has no key for another project's name at `path` (Megatron's hidden_dropout, torchtitan's
 * parallel.data_parallel_shard_degree), or NULL; the lookup is recipe_also_note's. */
const char *recipe_no_key_note(const char *path);
extern const RecipeKey recipe_model_keys[];

/* Enum spellings, indexed by the enum value. */
extern const char *const family_names[];
extern const char *const export_dtype_names[];
extern const char *const decay_names[];
extern const char *const wsd_style_names[];
extern const char *const weight_decay_style_names[];
extern const char *const dtype_names[];
extern const char *const precision_names[];
extern const char *const recompute_names[];
extern const char *const loss_reduction_names[];
extern const char *const pack_overlong_names[];
extern const char *const lora_target_names[];

/* "LOC: PATH: message" into err; returns -1. */
int key_error(char *err, size_t errlen, YLoc loc, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* Plain scalar parsing (0, or -1 when the node is not of that type). */
int yscalar_long(const YNode *node, long long *out);
int yscalar_double(const YNode *node, double *out);
int yscalar_bool(const YNode *node, bool *out);

/* Read a number in [min, max] (message: "expected an integer >= 1, found 'x'"). */
int read_integer(const YNode *node, YLoc loc, const char *path, long long min, long long max, long long *out,
                 char *err, size_t errlen);
int read_number(const YNode *node, YLoc loc, const char *path, double min, double max, bool above_min,
                double *out, char *err, size_t errlen);

/* Walk mapping `map` (at `loc`, key path `path`, "" for the root) into
 * `base` following `keys`: unknown keys, types, ranges, required keys. */
int read_section(void *base, const RecipeKey *keys, const YNode *map, YLoc loc, const char *path, char *err,
                 size_t errlen);

/* The key of `keys` closest to `name` (edit distance <= 2, or a key that
 * starts with `name`), or NULL. */
const char *suggest_key(const RecipeKey *keys, const char *name);
/* The one of the NULL-ended `names` closest to `name` (edit distance <= 2, lengths within 1: a typo), or NULL. */
const char *suggest_name(const char *const *names, const char *name);
const RecipeKey *find_key(const RecipeKey *keys, const char *name);

/* "a.b" + "c" -> "a.b.c" (or "c" when prefix is ""). */
const char *join_path(char *buf, size_t buflen, const char *prefix, const char *name);

/* The first key of `keys` marked at `level` or below whose value differs between two section structs, as
 * "PREFIX.KEY is A in the checkpoint but B in the recipe" (model_config_compare.c): -1; 0 when none. */
int section_difference(const void *ckpt, const void *recipe, const RecipeKey *keys, const char *prefix,
                       ModelMatch level, char *why, size_t whylen);
/* The message of a difference at `path`, both values as text. */
int say_difference(const char *path, const char *ckpt, const char *recipe, char *why, size_t whylen);

/* Write the keys of a section at `indent` (recipe_write.c). */
void write_section(FILE *out, const void *base, const RecipeKey *keys, int indent);
void write_yaml_string(FILE *out, const char *text);
void write_yaml_double(FILE *out, double value);
void write_token_count(FILE *out, double tokens); /* integral: no exponent */

/* Defaults before reading, derived defaults after (recipe_defaults.c). */
void model_set_defaults(ModelConfig *model);
void model_fill_derived(ModelConfig *model, const YNode *model_map);
/* A MoE model's LoRA without target_modules adapts the attention projections (its experts have none). */
void peft_fill_derived(ModelConfig *model, const YNode *peft_map);
void recipe_fill_derived(Recipe *recipe, const YNode *root);

/* Custom readers and writers (recipe_custom_*.c). */
int read_rope_scaling(void *base, const YEntry *entry, const char *path, char *err, size_t errlen);
void write_rope_scaling(FILE *out, const void *base, const char *name, int indent);
int read_bos_token_id(void *base, const YEntry *entry, const char *path, char *err, size_t errlen);
int read_eos_token_id(void *base, const YEntry *entry, const char *path, char *err, size_t errlen);
int read_pad_token_id(void *base, const YEntry *entry, const char *path, char *err, size_t errlen);
void write_bos_token_id(FILE *out, const void *base, const char *name, int indent);
void write_eos_token_id(FILE *out, const void *base, const char *name, int indent);
void write_pad_token_id(FILE *out, const void *base, const char *name, int indent);
int read_layer_freq(void *base, const YEntry *entry, const char *path, char *err, size_t errlen);
void write_layer_freq(FILE *out, const void *base, const char *name, int indent);
void write_moe_section(FILE *out, const void *base, const char *name, int indent);
int differ_rope_scaling(const void *ckpt, const void *recipe, const char *path, ModelMatch level, char *why,
                        size_t whylen);
int differ_moe_section(const void *ckpt, const void *recipe, const char *path, ModelMatch level, char *why,
                       size_t whylen);
int differ_layer_freq(const void *ckpt, const void *recipe, const char *path, ModelMatch level, char *why,
                      size_t whylen);
int differ_target_modules(const void *ckpt, const void *recipe, const char *path, ModelMatch level, char *why,
                          size_t whylen);
int read_betas(void *base, const YEntry *entry, const char *path, char *err, size_t errlen);
int read_pp_layers(void *base, const YEntry *entry, const char *path, char *err, size_t errlen);
void write_pp_layers(FILE *out, const void *base, const char *name, int indent);
void write_betas(FILE *out, const void *base, const char *name, int indent);
int read_steps(void *base, const YEntry *entry, const char *path, char *err, size_t errlen);
int read_tokens(void *base, const YEntry *entry, const char *path, char *err, size_t errlen);
void write_steps_or_tokens(FILE *out, const void *base, const char *name, int indent);
int read_global_batch_size(void *base, const YEntry *entry, const char *path, char *err, size_t errlen);
int read_batch_schedule(void *base, const YEntry *entry, const char *path, char *err, size_t errlen);
void write_batch(FILE *out, const void *base, const char *name, int indent);
int read_rampup_batch_size(void *base, const YEntry *entry, const char *path, char *err, size_t errlen);
/* train.rampup_batch_size (train_map: the recipe's train section) into the stages of the schedule: stage k (k = 0 ..
 * K, K = (global_batch_size - start) / increment) of batch start + k x increment from ceil(k x samples / K) x seq_len
 * consumed tokens on (a sample later where Megatron's float division falls short of k there), as Megatron's
 * RampupBatchsizeNumMicroBatchesCalculator switches (docs/megatron.md). Needs
 * train.global_batch_size (the batch the ramp ends at) and no batch_schedule. */
int train_resolve_rampup(TrainConfig *train, const YNode *train_map, char *err, size_t errlen);
int read_train_sources(void *base, const YEntry *entry, const char *path, char *err, size_t errlen);
int read_valid_sources(void *base, const YEntry *entry, const char *path, char *err, size_t errlen);
void write_train_sources(FILE *out, const void *base, const char *name, int indent);
void write_valid_sources(FILE *out, const void *base, const char *name, int indent);
int read_test_sources(void *base, const YEntry *entry, const char *path, char *err, size_t errlen);
void write_test_sources(FILE *out, const void *base, const char *name, int indent);
int read_split(void *base, const YEntry *entry, const char *path, char *err, size_t errlen);
void write_split(FILE *out, const void *base, const char *name, int indent);
void write_nothing(FILE *out, const void *base, const char *name, int indent);
int read_target_modules(void *base, const YEntry *entry, const char *path, char *err, size_t errlen);
void write_target_modules(FILE *out, const void *base, const char *name, int indent);
/* The root key `peft` (base: the Recipe): nothing when its type is none. */
void write_peft_section(FILE *out, const void *base, const char *name, int indent);
/* The same section from a PeftConfig (a checkpoint's model.yaml writes it after the model keys). */
void write_peft_of(FILE *out, const PeftConfig *peft, int indent);
/* Read a `peft:` mapping into *peft (model_config_load: a checkpoint's model.yaml). */
int read_peft_section(PeftConfig *peft, const YEntry *entry, char *err, size_t errlen);

/* Cross-key checks (recipe_validate.c): the model alone, then the recipe. */
int model_validate(const ModelConfig *model, const YNode *model_map, YLoc model_loc, const char *prefix,
                   char *err, size_t errlen);
/* peft against the model: a dense family, dropout 0 (peft_map: the peft:
 * mapping, at peft_loc, for the lines of its keys). */
int peft_validate(const ModelConfig *model, const YNode *peft_map, YLoc peft_loc, char *err, size_t errlen);
int recipe_validate(const Recipe *recipe, const YNode *root, int world_size, char *err, size_t errlen);

#endif
