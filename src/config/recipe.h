/* recipe.h: the typed recipe (shared/RECIPE.md is the contract for its keys).
 *
 * recipe_load() reads a YAML file with libyaml, applies --set overrides,
 * fills defaults, and validates. Every error names the file, the line and the
 * key path (e.g. "recipe.yaml:12: train.micro_batch_size: expected a positive
 * integer, found 'four'") and is reported with exit status 2 by the caller.
 */
#ifndef MT_CONFIG_RECIPE_H
#define MT_CONFIG_RECIPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../core/fp8.h"

#define MT_NAME_MAX 128
#define MT_PATH_MAX 1024
#define MT_MAX_DATA_SOURCES 256 /* a list of data.train, data.valid or data.test (a Megatron blend of many shards) */
#define MT_MAX_BATCH_STAGES 64
#define MT_MAX_LAYERS 1024
/* Routed experts of a MoE layer, and experts a token picks, at most (the recipe, config.json and the model). */
#define MT_MOE_MAX_EXPERTS 1024
#define MT_MOE_MAX_TOPK 64

typedef enum { FAMILY_LLAMA, FAMILY_QWEN2, FAMILY_QWEN3, FAMILY_MIXTRAL, FAMILY_QWEN3_MOE } ModelFamily;

typedef struct RopeScaling {
    bool enabled;          /* false: plain RoPE (rope_scaling: null) */
    double factor;         /* llama3: 8 */
    double low_freq_factor;  /* llama3: 1 */
    double high_freq_factor; /* llama3: 4 */
    int original_max_position_embeddings; /* llama3: 8192 */
} RopeScaling;

typedef enum { SCORE_SOFTMAX, SCORE_SIGMOID } MoeScoreFunction;
typedef enum { LB_AUX_LOSS, LB_SEQ_AUX_LOSS, LB_GLOBAL_AUX_LOSS, LB_EXPERT_BIAS, LB_NONE } MoeLoadBalancing;

typedef struct MoeConfig {
    int num_experts;
    int num_experts_per_tok;
    int moe_intermediate_size;
    int shared_expert_intermediate_size;
    bool norm_topk_prob;
    MoeScoreFunction score_function;
    MoeLoadBalancing load_balancing;
    double aux_loss_coeff;
    double z_loss_coeff;
    double capacity_factor; /* <= 0 means dropless (null) */
    double bias_update_rate; /* expert_bias balancing: the bias step per optimizer step (1e-3) */
    int layer_freq;         /* every Nth layer is MoE when layer_mask_given is false */
    bool layer_mask_given;
    unsigned char layer_mask[MT_MAX_LAYERS]; /* 0/1 list from the recipe */
} MoeConfig;

#define MT_MAX_EOS_TOKEN_IDS 16

/* The special token ids of a Hugging Face config.json (bos_token_id,
 * eos_token_id, pad_token_id): what `convert` writes into config.json and
 * generation_config.json. They change nothing the model computes. */
typedef struct SpecialTokenIds {
    bool has_bos, has_pad;
    int bos, pad;
    int num_eos;                   /* 0: no eos_token_id */
    int eos[MT_MAX_EOS_TOKEN_IDS];
    bool eos_is_list;              /* written as a list (Llama 3.1: [128001, 128008, 128009]), even of one */
} SpecialTokenIds;

/* peft: parameter-efficient fine-tuning, the recipe's top-level `peft:`
 * section. It lives in the model config because the adapters are model
 * parameters: the registry declares them from it, and a checkpoint's
 * model.yaml carries it (docs/finetune.md). */
/* model.export_dtype: the dtype `convert` writes Hugging Face tensors in by default (training never reads it);
 * auto: the init_from or resumed checkpoint's, fp32 without one */
typedef enum { EXPORT_AUTO, EXPORT_FP32, EXPORT_BF16, EXPORT_FP16 } ExportDtype;
typedef enum { PEFT_NONE, PEFT_LORA } PeftType;

/* The linear layers LoRA adapts, spelled as PEFT and Hugging Face name them
 * (lora_target_names in recipe_schema.c): column-parallel q/k/v and gate/up,
 * row-parallel o and down. */
typedef enum { LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_NUM_TARGETS } LoraTarget;

typedef struct PeftConfig {
    PeftType type;     /* none: every parameter trains */
    int rank;          /* r: A is (rank, in), B is (out, rank) */
    double alpha;      /* lora_alpha: the adapter's output is scaled by alpha / rank */
    unsigned targets;  /* bit t set: LoraTarget t has an adapter (target_modules) */
    double dropout;    /* lora_dropout: only 0 (dropout is not implemented) */
} PeftConfig;

#define LORA_ALL_TARGETS ((1u << LORA_NUM_TARGETS) - 1u)

typedef struct ModelConfig {
    ModelFamily family;
    int num_layers;
    int hidden_size;
    int intermediate_size;
    int num_attention_heads;
    int num_key_value_heads;
    int head_dim;
    int vocab_size;
    int max_position_embeddings;
    double rope_theta;
    RopeScaling rope_scaling;
    double rms_norm_eps;
    bool tie_word_embeddings;
    bool attention_bias; /* q, k, v biases (qwen2) */
    bool qk_norm;        /* per-head RMSNorm on q and k (qwen3) */
    double init_std;     /* initializer_range, default 0.02 */
    SpecialTokenIds token_ids;  /* bos_token_id, eos_token_id, pad_token_id (none by default) */
    ExportDtype export_dtype;   /* convert's default --dtype to Hugging Face: the source's torch_dtype (auto: below) */
    MoeConfig moe;       /* used by the MoE families only */
    PeftConfig peft;     /* LoRA adapters (the recipe's top-level peft:); type none: none */
} ModelConfig;

#define MT_MAX_PP_LAYERS_LIST 256

typedef struct ParallelConfig {
    int tp, pp, vpp, cp, ep, etp;
    bool sequence_parallel;
    bool distributed_optimizer;
    int num_pp_layers;                   /* 0: layers split evenly over the pp * vpp virtual stages */
    int pp_layers[MT_MAX_PP_LAYERS_LIST]; /* else the layers of each virtual stage, in order */
} ParallelConfig;

/* The layers of virtual pipeline stage g (0 .. pp*vpp - 1): parallel.pp_layers,
 * or an even split of num_layers (the recipe was validated). */
void parallel_stage_layers(const ParallelConfig *par, int num_layers, int g, int *first, int *count);

/* One entry of the batch-size schedule. Step form: from `start` = step on.
 * Token form (Megatron's "0:16 2.4B:320"): from `start` = consumed tokens on. */
typedef struct BatchStage {
    double start;
    long global_batch_size;
} BatchStage;

/* train.recompute: what the backward recomputes instead of keeping from the forward.
 * selective: the attention core (probabilities, output) and the SwiGLU activation;
 * full: everything of a layer but its input (the layer's forward reruns). */
typedef enum { RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL } Recompute;

/* train.loss: how the step's loss (and its gradient) is averaged.
 * per_micro_batch: each micro-batch's mean over its counted targets, then
 * the mean over micro-batches and dp ranks (the default);
 * per_token: the sum over every counted target of the global batch divided
 * by their number (Megatron's --calculate-per-token-loss), so the gradient
 * does not depend on how the batch is split. */
typedef enum { LOSS_PER_MICRO_BATCH, LOSS_PER_TOKEN } LossReduction;

/* train.eval_batches: all: every sample the validation set (and data.split's test share) holds, once. What it
 * resolves to depends on the data, so it is resolved where the loaders are built (src/data/eval_coverage.h), never
 * stored in the recipe, which keeps the word (run.dir/recipe.yaml and a checkpoint's say `all`). */
#define MT_EVAL_BATCHES_ALL (-1)

typedef struct TrainConfig {
    long steps;            /* 0 when train.tokens is given instead */
    double tokens;         /* 0 when train.steps is given */
    int seq_len;
    int micro_batch_size;
    int num_batch_stages;  /* >= 1; a plain global_batch_size is one stage at 0 */
    bool batch_stages_in_tokens;
    BatchStage batch_stages[MT_MAX_BATCH_STAGES];
    /* train.rampup_batch_size: Megatron's --rampup-batch-size [start, increment, samples] as given, rampup[0] 0 when
     * absent. recipe_load turns it into token stages ending at global_batch_size (train_resolve_rampup), which are
     * what the run uses and what run.dir/recipe.yaml holds. */
    long rampup[3];
    long eval_interval;    /* 0 disables evaluation */
    int eval_batches;      /* micro-batches an evaluation reads, or MT_EVAL_BATCHES_ALL */
    int max_nonfinite_steps; /* skip up to this many NaN/Inf steps in a row; 0 = stop at the first */
    long replica_check_interval; /* compare a parameter checksum across dp replicas every N steps; 0 = off */
    Recompute recompute;   /* activation recomputation in the backward (train.recompute) */
    LossReduction loss;    /* train.loss */
    long exit_interval;    /* stop (save, exit 0) after a step that is a multiple of this; 0 = off */
    /* Not keys: where a resumed run starts (recipe_load_resumed), 0 for a fresh one. The batch stages that ended
     * before it are not held to this launch's layout (they are not run again), and a token budget and the
     * samples the run reads are counted on from there with the schedule now in force (batch_schedule.h). */
    long resumed_step;
    double resumed_tokens;
    int64_t resumed_samples;
    double exit_duration_mins; /* stop (save, exit 0) after the step that ends this long after training began; 0 = off */
} TrainConfig;

typedef enum { DECAY_CONSTANT, DECAY_LINEAR, DECAY_COSINE, DECAY_INVERSE_SQRT, DECAY_WSD } LrDecay;
typedef enum { WSD_EXPONENTIAL, WSD_LINEAR, WSD_COSINE, WSD_MINUS_SQRT } WsdDecayStyle;
/* optimizer.weight_decay_style: how weight decay moves from weight_decay to weight_decay_end over the run
 * (Megatron's --weight-decay-incr-style) */
typedef enum { WD_CONSTANT, WD_LINEAR, WD_COSINE } WeightDecayStyle;
/* precision takes all three; optimizer.state_dtype fp32 or bf16 only */
typedef enum { DTYPE_FP32, DTYPE_BF16, DTYPE_FP8 } DType;

typedef enum { OPTIMIZER_ADAMW } OptimizerType; /* the one there is (optimizer.type) */

typedef struct OptimizerConfig {
    OptimizerType type;
    double lr, min_lr;
    double beta1, beta2, eps;
    double weight_decay;   /* the first step's; all steps' with weight_decay_style constant */
    double weight_decay_end;            /* with weight_decay_style linear or cosine: the last step's; 0: not given */
    WeightDecayStyle weight_decay_style;
    double clip_grad;      /* <= 0 disables clipping */
    DType state_dtype;
    long warmup_steps;
    double warmup_init;     /* the lr warmup starts from (Megatron's --lr-warmup-init); 0 by default */
    double warmup_fraction; /* > 0: warmup spans this fraction of the decay steps instead (Megatron's
                             * --lr-warmup-fraction, Hugging Face's warmup_ratio) */
    LrDecay decay;
    long decay_steps;      /* 0 means train.steps */
    long wsd_decay_steps;
    WsdDecayStyle wsd_decay_style;
} OptimizerConfig;

typedef struct DataSource {
    char path[MT_PATH_MAX]; /* Megatron prefix: path.bin + path.idx */
    double weight;          /* > 0; 0: none given (a blend without weights weighs each dataset by its tokens) */
} DataSource;

/* data.pack_overlong: error stops the run naming the document; truncate keeps its first seq_len + 1 tokens. */
typedef enum { PACK_OVERLONG_ERROR, PACK_OVERLONG_TRUNCATE } PackOverlong;

typedef struct DataConfig {
    int num_train;
    DataSource train[MT_MAX_DATA_SOURCES];
    int num_valid;          /* 0: validation comes from the split */
    DataSource valid[MT_MAX_DATA_SOURCES];
    int num_test;           /* 0: test data (test_loss after the last step) comes from the split, if it has a share */
    DataSource test[MT_MAX_DATA_SOURCES];
    double split[3];        /* train, valid, test weights (normalised when used) */
    char cache_dir[MT_PATH_MAX]; /* resolved: run.dir/data-cache when null */
    bool pack;              /* data.pack: whole documents packed into seq_len rows (SFT), first-fit decreasing */
    PackOverlong pack_overlong; /* data.pack_overlong: a document longer than seq_len + 1 tokens */
} DataConfig;

/* data.split's text form, "98,2,0" or "98/2/0", into split: 0, -1 when it
 * is not three weights >= 0, -2 when the train weight is 0. */
int data_split_parse(const char *text, double split[3]);

/* fp8.recipe: tensorwise (current scaling: each tensor's amax just before its cast) or delayed (the scale
 * from an amax history, as Transformer Engine's DelayedScaling). */
typedef enum { FP8_RECIPE_TENSORWISE, FP8_RECIPE_DELAYED } Fp8Recipe;
typedef enum { FP8_AMAX_MAX, FP8_AMAX_MOST_RECENT } Fp8AmaxAlgo;

/* The `fp8:` section, read with precision: fp8 (docs/fp8.md). */
typedef struct Fp8Config {
    Fp8Recipe recipe;
    Fp8Format grad_format;          /* the gradients' format in the backward: e5m2 (TE's HYBRID) or e4m3 */
    int amax_history_len;           /* delayed: amaxes kept per tensor */
    Fp8AmaxAlgo amax_compute_algo;  /* delayed: the scale's amax is the history's max or its most recent */
    int margin;                     /* scale = fp8_max / amax / 2^margin */
} Fp8Config;

/* The fp8: section's defaults (recipe_defaults.c), and whether c is them. */
Fp8Config fp8_config_default(void);
bool fp8_config_is_default(const Fp8Config *c);

/* checkpoint.frozen_base: what a LoRA run's checkpoints do with the frozen
 * base weights it took from init_from (docs/finetune.md). */
typedef enum {
    FROZEN_BASE_AUTO = 0,      /* reference, unless the base is a checkpoint inside a run's checkpoints/ (its
                                * retention may delete it): then store */
    FROZEN_BASE_REFERENCE = 1, /* leave them out and record the init_from checkpoint that holds them */
    FROZEN_BASE_STORE = 2,     /* store them in every checkpoint (self-contained) */
} FrozenBaseMode;

typedef struct CheckpointConfig {
    long interval;
    int keep_last;
    long keep_every;
    bool async;
    int compression_level;
    bool load_optimizer;
    FrozenBaseMode frozen_base;
} CheckpointConfig;

typedef struct LoggingConfig {
    long interval;
    bool tensorboard;
    long timers_interval;    /* a timer breakdown line every N steps; 0 = off */
    double peak_tflops;      /* the device's peak for MFU; 0 = from the GPU's name (none on the CPU) */
} LoggingConfig;

typedef struct RunConfig {
    char name[MT_NAME_MAX];
    char dir[MT_PATH_MAX];
    uint64_t seed;
    char device[16];       /* "cpu" or "cuda" */
} RunConfig;

typedef struct Recipe {
    char source_path[MT_PATH_MAX]; /* the YAML file it came from */
    char peft_source[MT_PATH_MAX]; /* the model file whose peft: section the recipe took (a LoRA checkpoint's
                                    * model.yaml, for a recipe without its own), or "" */
    RunConfig run;
    ModelConfig model;
    ParallelConfig parallel;
    TrainConfig train;
    OptimizerConfig optimizer;
    DType precision;
    Fp8Config fp8;
    DataConfig data;
    CheckpointConfig checkpoint;
    LoggingConfig logging;
    char init_from[MT_PATH_MAX]; /* checkpoint whose weights a fresh run starts from ("" = none) */
} Recipe;

/* Load `path`, apply `num_overrides` strings of the form "key.path=value"
 * (value parsed as YAML), fill defaults, validate for `world_size` ranks
 * (0: tp * pp * cp ranks, i.e. dp 1).
 * Returns 0 on success; otherwise writes one message naming the file, line
 * and key into err and returns -1 (the caller exits with status 2). */
int recipe_load(Recipe *recipe, const char *path, const char *const *overrides, int num_overrides,
                int world_size, char *err, size_t errlen);
/* recipe_load for a run resumed after `step` steps, `tokens` tokens and `samples` samples: the batch schedule's
 * stages that ended by then need not divide by this launch's micro_batch_size * dp (a resume onto another dp
 * mid-ramp). */
int recipe_load_resumed(Recipe *recipe, const char *path, const char *const *overrides, int num_overrides,
                        int world_size, long step, double tokens, int64_t samples, char *err, size_t errlen);

/* text as a YAML double-quoted scalar that reads back as the same bytes (quotes, backslashes and every character a
 * YAML reader would fold, drop or refuse escaped: C0 and C1 controls, NEL, the line and paragraph separators, a BOM,
 * U+FFFE and U+FFFF), into
 * out (len bytes, NUL-ended when len > 0); returns the length it needs, as snprintf. text must be UTF-8. */
size_t yaml_quote(const char *text, char *out, size_t len);

/* Every key at its default (recipe_defaults.c), as recipe_load starts: a recipe to fill by hand (eval's, to ask
 * plan.h whether a model and batch fit). */
void recipe_set_defaults(Recipe *recipe);

/* Load a model architecture file (a configs/ YAML file: the keys of `model:`). */
int model_config_load(ModelConfig *model, const char *path, char *err, size_t errlen);
/* The same from text in memory; `origin` names it in messages. */
int model_config_load_text(ModelConfig *model, const char *text, const char *origin, char *err, size_t errlen);

/* Whether the family routes its MLPs to experts (mixtral, qwen3_moe). */
bool model_family_is_moe(ModelFamily family);
/* Whether layer `layer` is a MoE layer (moe.layer_freq: every Nth, or its 0/1 list); false for a dense family. */
bool model_layer_is_moe(const ModelConfig *cfg, int layer);

/* What a checkpoint's model and a recipe's must agree on, as the schema marks each model key
 * (recipe_schema.c's `match`): WEIGHTS, what the stored tensors' names and shapes follow (a resume's check);
 * FUNCTION, that and what the weights were trained to compute (init_from's: RoPE, the norms' epsilon, the
 * routing). */
typedef enum { MODEL_MATCH_WEIGHTS = 1, MODEL_MATCH_FUNCTION = 2 } ModelMatch;
/* The first key marked at `level` or below in which the checkpoint's model (ckpt) and the recipe's differ, as
 * "model.KEY is A in the checkpoint but B in the recipe" in why: -1; 0 when none. */
int model_config_difference(const ModelConfig *ckpt, const ModelConfig *recipe, ModelMatch level, char *why,
                            size_t whylen);
/* The same of two adapters' peft: keys (both with adapters): at WEIGHTS their rank and target modules, at
 * FUNCTION also alpha (the scale alpha / rank of the adapters' product). */
int peft_config_difference(const PeftConfig *ckpt, const PeftConfig *recipe, ModelMatch level, char *why,
                           size_t whylen);
/* A LoRA peft: section as one line of YAML: "{type: lora, rank: 8, alpha: 24, target_modules: [q_proj, v_proj]}". */
void peft_config_text(const PeftConfig *peft, char *out, size_t len);

/* Whether data.cache_dir is its default, run.dir/data-cache (recipe_write writes it as null, so that a resume into
 * another run.dir caches there). */
bool recipe_cache_dir_is_default(const Recipe *recipe);

/* Write the fully resolved recipe as YAML (run.dir/recipe.yaml); it loads back
 * to an identical Recipe. Returns 0, or -1 with err set. */
int recipe_write(const Recipe *recipe, const char *path, char *err, size_t errlen);
/* CRC-32C of the resolved recipe as recipe_write writes its keys: equal on ranks that run the same recipe. */
uint32_t recipe_crc32c(const Recipe *recipe);
/* The resolved recipe's YAML, as recipe_crc32c reads it (malloc'd, *len bytes, NUL-terminated). */
char *recipe_yaml_text(const Recipe *recipe, size_t *len);
/* The first key whose line differs between two recipe_yaml_text texts, with both values named by where they come
 * from, into out: "train.steps: '5' here, '4' on rank 0" (ours_name "here", theirs_name "on rank 0"). */
void recipe_text_difference(const char *ours, const char *theirs, const char *ours_name, const char *theirs_name,
                            char *out, size_t outlen);
/* Every key whose value differs between two recipe_yaml_text texts (a list's items as LIST[i]), into out as
 * "train.steps 200 -> 300; optimizer.lr 0.003 -> 0.001" (cut to outlen); the first of them that starts with one
 * of the `watched` prefixes (NULL-terminated; may be NULL) into hit (or ""). Returns the number of changes. */
int recipe_text_changes(const char *before, const char *after, char *out, size_t outlen, const char *const *watched,
                        char *hit, size_t hitlen);
/* The same with the data paths (data.train, data.valid, data.test, data.cache_dir) left out: what ranks that resolved relative
 * paths from different directories still agree on. */
uint32_t recipe_crc32c_without_data_paths(const Recipe *recipe);

/* What a run started with init_from, or resumed, keeps of its checkpoint's model `from` where the recipe's `cfg`
 * leaves it unset: each token id (bos, eos, pad) and export_dtype (auto). Returns whether cfg's token ids now
 * differ from from's (the recipe set an id of its own). */
bool model_config_inherit_unset(ModelConfig *cfg, const ModelConfig *from);

/* Data parallel size for a world: world / (tp * pp * cp). */
int recipe_dp_size(const Recipe *recipe, int world_size);
/* recipe_load's checks of the layout (parallel.*) against the model, the batch and `world` ranks, alone, on a
 * recipe already loaded and changed in memory (`megatrain plan`'s search of layouts, plan_fit): 0, or -1 with err
 * naming the key (at the recipe's file, no line). */
int recipe_validate_layout(const Recipe *recipe, int world, char *err, size_t errlen);
/* The fewest ranks the recipe's layout runs on: tp * cp * pp * ep (dp = ep; ep is 1 for a dense model), what
 * `megatrain plan` assumes without --world. */
int recipe_smallest_world(const Recipe *recipe);

/* Names for enums (as written in YAML). */
const char *model_family_name(ModelFamily family);
const char *lr_decay_name(LrDecay decay);
const char *wsd_decay_style_name(WsdDecayStyle style);
const char *weight_decay_style_name(WeightDecayStyle style);
const char *dtype_name(DType dtype);
const char *loss_reduction_name(LossReduction loss);
const char *pack_overlong_name(PackOverlong overlong);
/* The value spelled `text` (as in YAML) into *out: 0, or -1 when no value is spelled so. */
int loss_reduction_parse(const char *text, LossReduction *out);
int pack_overlong_parse(const char *text, PackOverlong *out);
/* "q_proj", ..., "down_proj" (PEFT's and Hugging Face's module names). */
const char *lora_target_name(LoraTarget target);
/* A target_modules entry as PEFT matches it (a module whose name is the entry, or ends with "." and the entry)
 * against a decoder's projections, model.layers.L.self_attn.{q,k,v,o}_proj and model.layers.L.mlp.{gate,up,down}_proj:
 * the projection into *target, and the layer into *layer when the entry names one (-1: every layer); -1 when the
 * entry names no projection. */
int lora_target_match(const char *entry, LoraTarget *target, long *layer);
/* Whether LoRA adapts `target` (peft.type lora and the target listed). */
bool lora_targets(const PeftConfig *peft, LoraTarget target);
/* Why LoRA (m->peft) cannot adapt mixture-of-experts model m, NULL when it can (or m is dense, or has no LoRA): on a
 * MoE model it adapts the attention projections only (the routed experts have no adapters), and not with
 * load_balancing expert_bias (the biases move in the frozen base). */
const char *lora_moe_refusal(const ModelConfig *m);

/* Parse a token count with an optional K/M/B/T suffix ("2.4B"); returns 0 or -1. */
int parse_token_count(const char *text, double *out);

#endif
