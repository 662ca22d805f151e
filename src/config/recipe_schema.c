/* recipe_schema.c: every recipe key (shared/RECIPE.md) with its type, field,
 * range and whether it is required. Reading, unknown-key suggestions and
 * recipe_write all follow these tables, so a key is declared once. */
#include <limits.h>
#include <stddef.h>
#include <string.h>

#include "recipe_schema.h"

const char *const family_names[] = {"llama", "qwen2", "qwen3", "mixtral", "qwen3_moe", NULL};
const char *const decay_names[] = {"constant", "linear", "cosine", "inverse_sqrt", "wsd", NULL};
const char *const wsd_style_names[] = {"exponential", "linear", "cosine", "minus_sqrt", NULL};
const char *const weight_decay_style_names[] = {"constant", "linear", "cosine", NULL};
const char *const dtype_names[] = {"fp32", "bf16", NULL};
const char *const export_dtype_names[] = {"auto", "fp32", "bf16", "fp16", NULL}; /* ExportDtype order */
const char *const precision_names[] = {"fp32", "bf16", "fp8", NULL}; /* DType order */
static const char *const optimizer_type_names[] = {"adamw", NULL}; /* OptimizerType order */
static const char *const fp8_recipe_names[] = {"tensorwise", "delayed", NULL};
static const char *const fp8_format_names[] = {"e4m3", "e5m2", NULL}; /* Fp8Format order */
static const char *const fp8_amax_algo_names[] = {"max", "most_recent", NULL};
static const char *const score_names[] = {"softmax", "sigmoid", NULL};
static const char *const balancing_names[] = {"aux_loss", "seq_aux_loss", "global_aux_loss", "expert_bias", "none", NULL};
static const char *const device_names[] = {"cpu", "cuda", NULL};
const char *const recompute_names[] = {"none", "selective", "full", NULL};
const char *const loss_reduction_names[] = {"per_micro_batch", "per_token", NULL};
const char *const pack_overlong_names[] = {"error", "truncate", NULL};
static const char *const peft_type_names[] = {"none", "lora", NULL};
static const char *const frozen_base_names[] = {"auto", "reference", "store", NULL}; /* FrozenBaseMode order */
const char *const lora_target_names[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                                         NULL};

#define INT_KEY(n, st, f, lo, hi) .name = n, .type = KT_INT, .offset = offsetof(st, f), .ranged = true, .min = lo, .max = hi
#define LONG_KEY(n, st, f, lo) .name = n, .type = KT_LONG, .offset = offsetof(st, f), .ranged = true, .min = lo, .max = MT_NO_MAX
#define NUM_KEY(n, st, f, lo) .name = n, .type = KT_DOUBLE, .offset = offsetof(st, f), .ranged = true, .min = lo, .max = MT_NO_MAX
#define BOOL_KEY(n, st, f) .name = n, .type = KT_BOOL, .offset = offsetof(st, f)
#define ENUM_KEY(n, st, f, list) .name = n, .type = KT_ENUM, .offset = offsetof(st, f), .names = list
#define STRING_KEY(n, st, f) .name = n, .type = KT_STRING, .offset = offsetof(st, f), .size = sizeof(((st *)0)->f)
#define SECTION_KEY(n, st, f, list) .name = n, .type = KT_SECTION, .offset = offsetof(st, f), .keys = list
#define CUSTOM_KEY(n, r, w) .name = n, .type = KT_CUSTOM, .read = r, .write = w

/* What a checkpoint's model and a recipe's must agree on (`match`; recipe.h's ModelMatch): WEIGHTS, the keys the
 * stored tensors' names and shapes follow (resume and init_from refuse a difference); FUNCTION, what the weights
 * were trained to compute (init_from refuses a difference; a resume may change it, as a long-context extension
 * changes rope_theta). Unmarked keys are training choices. */
#define WEIGHTS MODEL_MATCH_WEIGHTS
#define FUNCTION MODEL_MATCH_FUNCTION

static const RecipeKey moe_keys[] = {
    /* .also: Megatron-LM's flag names (docs/moe.md), Mixtral's config.json name for the expert count */
    {INT_KEY("num_experts", MoeConfig, num_experts, 1, MT_MOE_MAX_EXPERTS), .required = true, .match = WEIGHTS,
     .also = "num_local_experts"},
    {INT_KEY("num_experts_per_tok", MoeConfig, num_experts_per_tok, 1, MT_MOE_MAX_TOPK), .required = true,
     .match = FUNCTION, .also = "moe_router_topk"},
    {INT_KEY("moe_intermediate_size", MoeConfig, moe_intermediate_size, 1, INT_MAX), .required = true,
     .match = WEIGHTS, .also = "moe_ffn_hidden_size"},
    {INT_KEY("shared_expert_intermediate_size", MoeConfig, shared_expert_intermediate_size, 0, INT_MAX),
     .match = WEIGHTS, .also = "moe_shared_expert_intermediate_size"},
    {BOOL_KEY("norm_topk_prob", MoeConfig, norm_topk_prob), .match = FUNCTION},
    {ENUM_KEY("score_function", MoeConfig, score_function, score_names), .match = FUNCTION,
     .also = "moe_router_score_function"},
    {ENUM_KEY("load_balancing", MoeConfig, load_balancing, balancing_names),
     .also = "moe_router_load_balancing_type"},
    {NUM_KEY("aux_loss_coeff", MoeConfig, aux_loss_coeff, 0), .also = "moe_aux_loss_coeff router_aux_loss_coef"},
    {NUM_KEY("z_loss_coeff", MoeConfig, z_loss_coeff, 0), .also = "moe_z_loss_coeff router_z_loss_coef"},
    {NUM_KEY("capacity_factor", MoeConfig, capacity_factor, 0), .nullable = true,
     .also = "moe_expert_capacity_factor"},
    {NUM_KEY("bias_update_rate", MoeConfig, bias_update_rate, 0), .also = "moe_router_bias_update_rate"},
    {CUSTOM_KEY("layer_freq", read_layer_freq, write_layer_freq), .match = WEIGHTS, .differ = differ_layer_freq,
     .also = "moe_layer_freq decoder_sparse_step mlp_only_layers"},
    {0},
};

const RecipeKey recipe_model_keys[] = {
    {ENUM_KEY("family", ModelConfig, family, family_names), .required = true, .match = WEIGHTS, .also = "name",
     .value_also = "llama3=llama llama2=llama"},
    {INT_KEY("num_layers", ModelConfig, num_layers, 1, MT_MAX_LAYERS), .required = true, .also = "num_hidden_layers",
     .match = WEIGHTS},
    {INT_KEY("hidden_size", ModelConfig, hidden_size, 1, INT_MAX), .required = true, .match = WEIGHTS},
    {INT_KEY("intermediate_size", ModelConfig, intermediate_size, 1, INT_MAX), .required = true, .match = WEIGHTS,
     .also = "ffn_hidden_size"},
    {INT_KEY("num_attention_heads", ModelConfig, num_attention_heads, 1, INT_MAX), .required = true,
     .match = WEIGHTS},
    {INT_KEY("num_key_value_heads", ModelConfig, num_key_value_heads, 1, INT_MAX), .match = WEIGHTS,
     .also = "num_query_groups"},
    {INT_KEY("head_dim", ModelConfig, head_dim, 1, INT_MAX), .match = WEIGHTS, .also = "kv_channels"},
    {INT_KEY("vocab_size", ModelConfig, vocab_size, 1, INT_MAX), .required = true, .match = WEIGHTS},
    {INT_KEY("max_position_embeddings", ModelConfig, max_position_embeddings, 1, INT_MAX), .required = true},
    {NUM_KEY("rope_theta", ModelConfig, rope_theta, 0), .above_min = true, .match = FUNCTION, .also = "rotary_base"},
    {CUSTOM_KEY("rope_scaling", read_rope_scaling, write_rope_scaling), .match = FUNCTION,
     .differ = differ_rope_scaling},
    {NUM_KEY("rms_norm_eps", ModelConfig, rms_norm_eps, 0), .above_min = true, .match = FUNCTION,
     .also = "norm_epsilon"},
    {BOOL_KEY("tie_word_embeddings", ModelConfig, tie_word_embeddings), .match = WEIGHTS,
     .also = "untie_embeddings_and_output_weights"},
    {BOOL_KEY("attention_bias", ModelConfig, attention_bias), .match = WEIGHTS},
    {BOOL_KEY("qk_norm", ModelConfig, qk_norm), .match = WEIGHTS},
    {NUM_KEY("initializer_range", ModelConfig, init_std, 0), .also = "init_method_std"},
    {CUSTOM_KEY("bos_token_id", read_bos_token_id, write_bos_token_id)},
    {CUSTOM_KEY("eos_token_id", read_eos_token_id, write_eos_token_id)},
    {CUSTOM_KEY("pad_token_id", read_pad_token_id, write_pad_token_id)},
    /* not the training dtype (`precision`): what `convert` writes for Hugging Face unless --dtype says */
    {ENUM_KEY("export_dtype", ModelConfig, export_dtype, export_dtype_names),
     .value_also = "float32=fp32 bfloat16=bf16 float16=fp16"},
    {SECTION_KEY("moe", ModelConfig, moe, moe_keys), .write = write_moe_section, .match = WEIGHTS,
     .differ = differ_moe_section},
    {0},
};

/* peft (the root key; read into Recipe.model.peft). dropout is read so that
 * a PEFT user's `dropout: 0` works; anything else is refused (peft_validate).
 * rank and alpha are required with adapters (`type: none` needs neither). */
static bool has_adapters(const void *peft) { return ((const PeftConfig *)peft)->type != PEFT_NONE; }
static const RecipeKey peft_keys[] = {
    {ENUM_KEY("type", PeftConfig, type, peft_type_names), .required = true},
    {INT_KEY("rank", PeftConfig, rank, 1, INT_MAX), .required = true, .required_if = has_adapters, .also = "r",
     .match = WEIGHTS},
    {NUM_KEY("alpha", PeftConfig, alpha, 0), .above_min = true, .required = true, .required_if = has_adapters,
     .also = "lora_alpha", .match = FUNCTION},
    {CUSTOM_KEY("target_modules", read_target_modules, write_target_modules), .match = WEIGHTS,
     .differ = differ_target_modules},
    {NUM_KEY("dropout", PeftConfig, dropout, 0), .also = "lora_dropout"},
    {0},
};

static const RecipeKey run_keys[] = {
    {STRING_KEY("name", RunConfig, name)},
    {STRING_KEY("dir", RunConfig, dir), .nullable = true, .also = "save dump_folder output_dir"},
    {.name = "seed", .type = KT_U64, .offset = offsetof(RunConfig, seed)},
    {STRING_KEY("device", RunConfig, device), .names = device_names},
    {0},
};

static const RecipeKey parallel_keys[] = {
    {INT_KEY("tp", ParallelConfig, tp, 1, 65536), .also = "tensor_model_parallel_size tensor_parallel_degree"},
    {INT_KEY("pp", ParallelConfig, pp, 1, 65536), .also = "pipeline_model_parallel_size pipeline_parallel_degree"},
    {INT_KEY("vpp", ParallelConfig, vpp, 1, 65536),
     .also = "virtual_pipeline_model_parallel_size num_layers_per_virtual_pipeline_stage"},
    {INT_KEY("cp", ParallelConfig, cp, 1, 65536), .also = "context_parallel_size context_parallel_degree"},
    {INT_KEY("ep", ParallelConfig, ep, 1, INT_MAX), .also = "expert_model_parallel_size expert_parallel_degree"},
    {INT_KEY("etp", ParallelConfig, etp, 1, INT_MAX),
     .also = "expert_tensor_parallel_size expert_tensor_parallel_degree"},
    {BOOL_KEY("sequence_parallel", ParallelConfig, sequence_parallel)},
    {BOOL_KEY("distributed_optimizer", ParallelConfig, distributed_optimizer), .also = "use_distributed_optimizer"},
    {CUSTOM_KEY("pp_layers", read_pp_layers, write_pp_layers)},
    {0},
};

static const RecipeKey train_keys[] = {
    {CUSTOM_KEY("steps", read_steps, write_steps_or_tokens), .also = "train_iters max_steps"},
    {CUSTOM_KEY("tokens", read_tokens, write_nothing), .also = "train_samples"},
    {INT_KEY("seq_len", TrainConfig, seq_len, 1, INT_MAX), .required = true, .also = "seq_length"},
    {INT_KEY("micro_batch_size", TrainConfig, micro_batch_size, 1, INT_MAX), .required = true,
     .also = "local_batch_size per_device_train_batch_size pipeline_parallel_microbatch_size"},
    {CUSTOM_KEY("global_batch_size", read_global_batch_size, write_batch), .also = "gradient_accumulation_steps"},
    {CUSTOM_KEY("batch_schedule", read_batch_schedule, write_nothing), .also = "step_batch_size_schedule"},
    /* written as the stages it makes (write_batch) */
    {CUSTOM_KEY("rampup_batch_size", read_rampup_batch_size, write_nothing)},
    {LONG_KEY("eval_interval", TrainConfig, eval_interval, 0), .also = "validation eval_steps eval_strategy"},
    /* all: every validation sample once (Hugging Face Trainer's evaluation of the whole set), resolved with the
     * data where the loaders are built (src/data/eval_coverage.h) */
    {INT_KEY("eval_batches", TrainConfig, eval_batches, 1, INT_MAX), .word = "all", .word_value = MT_EVAL_BATCHES_ALL,
     .also = "eval_iters"},
    {INT_KEY("max_nonfinite_steps", TrainConfig, max_nonfinite_steps, 0, INT_MAX)},
    {LONG_KEY("replica_check_interval", TrainConfig, replica_check_interval, 0)},
    {ENUM_KEY("recompute", TrainConfig, recompute, recompute_names),
     .also = "recompute_granularity recompute_activations activation_checkpoint gradient_checkpointing"},
    {ENUM_KEY("loss", TrainConfig, loss, loss_reduction_names)},
    {LONG_KEY("exit_interval", TrainConfig, exit_interval, 0)},
    {NUM_KEY("exit_duration_mins", TrainConfig, exit_duration_mins, 0), .also = "exit_duration_in_mins"},
    {0},
};

static const RecipeKey schedule_keys[] = {
    {LONG_KEY("warmup_steps", OptimizerConfig, warmup_steps, 0), .also = "lr_warmup_iters lr_warmup_samples"},
    {NUM_KEY("warmup_fraction", OptimizerConfig, warmup_fraction, 0), .also = "lr_warmup_fraction warmup_ratio"},
    {NUM_KEY("warmup_init", OptimizerConfig, warmup_init, 0), .also = "lr_warmup_init"},
    {ENUM_KEY("decay", OptimizerConfig, decay, decay_names), .also = "lr_decay_style decay_type lr_scheduler_type",
     .value_also = "inverse-square-root=inverse_sqrt constant_with_warmup=constant cosine_with_min_lr=cosine "
                   "warmup_stable_decay=wsd"},
    {LONG_KEY("decay_steps", OptimizerConfig, decay_steps, 1), .nullable = true, .also = "lr_decay_iters lr_decay_samples"},
    {LONG_KEY("wsd_decay_steps", OptimizerConfig, wsd_decay_steps, 0), .also = "lr_wsd_decay_iters lr_wsd_decay_samples decay_ratio"},
    {ENUM_KEY("wsd_decay_style", OptimizerConfig, wsd_decay_style, wsd_style_names), .also = "lr_wsd_decay_style",
     .value_also = "sqrt=minus_sqrt"},
    {0},
};

static const RecipeKey optimizer_keys[] = {
    {ENUM_KEY("type", OptimizerConfig, type, optimizer_type_names), .also = "name"},
    {NUM_KEY("lr", OptimizerConfig, lr, 0), .also = "learning_rate"},
    {NUM_KEY("min_lr", OptimizerConfig, min_lr, 0), .also = "lr_min min_lr_factor"},
    {CUSTOM_KEY("betas", read_betas, write_betas), .also = "adam_beta1 adam_beta2 beta1 beta2"},
    {NUM_KEY("eps", OptimizerConfig, eps, 0), .above_min = true, .also = "adam_eps adam_epsilon"},
    {NUM_KEY("weight_decay", OptimizerConfig, weight_decay, 0), .also = "start_weight_decay"},
    {NUM_KEY("weight_decay_end", OptimizerConfig, weight_decay_end, 0), .nullable = true, .also = "end_weight_decay"},
    {ENUM_KEY("weight_decay_style", OptimizerConfig, weight_decay_style, weight_decay_style_names),
     .also = "weight_decay_incr_style"},
    {NUM_KEY("clip_grad", OptimizerConfig, clip_grad, 0), .also = "max_norm max_grad_norm"},
    {ENUM_KEY("state_dtype", OptimizerConfig, state_dtype, dtype_names), .value_also = "float32=fp32 bfloat16=bf16"},
    {.name = "schedule", .type = KT_SECTION, .offset = 0, .keys = schedule_keys, .also = "lr_scheduler"},
    {0},
};

static const RecipeKey data_keys[] = {
    {CUSTOM_KEY("train", read_train_sources, write_train_sources), .required = true,
     .also = "data_path dataset_path train_data_path"},
    {CUSTOM_KEY("valid", read_valid_sources, write_valid_sources), .also = "valid_data_path"},
    {CUSTOM_KEY("test", read_test_sources, write_test_sources), .also = "test_data_path"},
    {CUSTOM_KEY("split", read_split, write_split)},
    {STRING_KEY("cache_dir", DataConfig, cache_dir), .nullable = true, .also = "data_cache_path"},
    {BOOL_KEY("pack", DataConfig, pack)},
    {ENUM_KEY("pack_overlong", DataConfig, pack_overlong, pack_overlong_names)},
    {0},
};

static const RecipeKey fp8_keys[] = {
    {ENUM_KEY("recipe", Fp8Config, recipe, fp8_recipe_names), .also = "fp8_recipe"},
    {ENUM_KEY("grad_format", Fp8Config, grad_format, fp8_format_names), .also = "fp8_format"},
    {INT_KEY("amax_history_len", Fp8Config, amax_history_len, 1, 1 << 20), .also = "fp8_amax_history_len"},
    {ENUM_KEY("amax_compute_algo", Fp8Config, amax_compute_algo, fp8_amax_algo_names), .also = "fp8_amax_compute_algo"},
    {INT_KEY("margin", Fp8Config, margin, 0, 64), .also = "fp8_margin"},
    {0},
};

static const RecipeKey checkpoint_keys[] = {
    {LONG_KEY("interval", CheckpointConfig, interval, 0), .also = "save_interval save_steps save_strategy"},
    {INT_KEY("keep_last", CheckpointConfig, keep_last, 0, INT_MAX), .also = "keep_latest_k save_total_limit"},
    {LONG_KEY("keep_every", CheckpointConfig, keep_every, 0)},
    {BOOL_KEY("async", CheckpointConfig, async), .also = "async_mode async_save"},
    {INT_KEY("compression_level", CheckpointConfig, compression_level, 1, 22)},
    {BOOL_KEY("load_optimizer", CheckpointConfig, load_optimizer), .also = "no_load_optim"},
    {ENUM_KEY("frozen_base", CheckpointConfig, frozen_base, frozen_base_names)},
    {0},
};

static const RecipeKey logging_keys[] = {
    {LONG_KEY("interval", LoggingConfig, interval, 1), .also = "log_interval log_freq logging_steps"},
    {BOOL_KEY("tensorboard", LoggingConfig, tensorboard),
     .also = "enable_tensorboard tensorboard_dir save_tb_folder report_to"},
    {LONG_KEY("timers_interval", LoggingConfig, timers_interval, 0)},
    {NUM_KEY("peak_tflops", LoggingConfig, peak_tflops, 0)},
    {0},
};

const RecipeKey recipe_root_keys[] = {
    {SECTION_KEY("run", Recipe, run, run_keys), .also = "job"},
    {SECTION_KEY("model", Recipe, model, recipe_model_keys), .required = true},
    {SECTION_KEY("peft", Recipe, model.peft, peft_keys), .write = write_peft_section},
    {SECTION_KEY("parallel", Recipe, parallel, parallel_keys), .also = "parallelism"},
    {SECTION_KEY("train", Recipe, train, train_keys), .required = true, .also = "training"},
    {SECTION_KEY("optimizer", Recipe, optimizer, optimizer_keys)},
    {ENUM_KEY("precision", Recipe, precision, precision_names), .also = "mixed_precision_param bf16",
     .value_also = "float32=fp32 bfloat16=bf16 float8=fp8"},
    {SECTION_KEY("fp8", Recipe, fp8, fp8_keys), .also = "float8"},
    {SECTION_KEY("data", Recipe, data, data_keys), .required = true},
    {SECTION_KEY("checkpoint", Recipe, checkpoint, checkpoint_keys)},
    {SECTION_KEY("logging", Recipe, logging, logging_keys), .also = "metrics"},
    {STRING_KEY("init_from", Recipe, init_from), .nullable = true, .also = "initial_load_path"},
    {0},
};

/* Another project's name (or, with a '.', its path: model.name is not optimizer.name) and what it means. */
typedef struct NameNote {
    const char *name, *note;
} NameNote;

/* What an `also` name means where megatrain's key takes another unit or another form (torchtitan's lr_scheduler
 * keys, its sections that hold what several megatrain keys do): said after the "did you mean". */
static const NameNote also_notes[] = {
    {"decay_ratio", "torchtitan's decay_ratio is a fraction of the steps, megatrain's a count: wsd_decay_steps = "
                    "decay_ratio x train.steps, with optimizer.schedule.decay: wsd"},
    {"decay_type", "torchtitan's decay_type is the shape of its decay: with decay_ratio, decay: wsd and "
                   "optimizer.schedule.wsd_decay_style linear, cosine or minus_sqrt (its sqrt); without, decay: "
                   "linear or cosine"},
    {"lr_min", "torchtitan's lr_min is a factor of the lr, megatrain's min_lr a rate: min_lr = lr_min x optimizer.lr"},
    {"min_lr_factor", "torchtitan's min_lr_factor is a factor of the lr, megatrain's min_lr a rate: min_lr = "
                      "min_lr_factor x optimizer.lr"},
    {"lr_scheduler", "torchtitan's warmup_steps is optimizer.schedule.warmup_steps; decay_ratio, decay_type and "
                     "min_lr_factor are answered there. Its warmup starts at lr / (warmup_steps + 1) where "
                     "megatrain's (Megatron's) starts at 0, and its decay runs one step ahead"},
    {"activation_checkpoint", "torchtitan's activation_checkpoint.mode: none, selective or full"},
    {"validation", "torchtitan's validation.freq is train.eval_interval, its steps train.eval_batches and its "
                   "dataset_path data.valid"},
    {"mixed_precision_param", "torchtitan's FSDP parameter dtype; megatrain's precision is the compute dtype "
                              "(fp32, bf16 or fp8), its master weights fp32"},
    {"float8", "torchtitan's float8 keys differ: fp8.recipe, grad_format, margin, with precision: fp8 (docs/fp8.md)"},
    {"beta1", "optimizer.betas is [beta1, beta2]"},
    {"beta2", "optimizer.betas is [beta1, beta2]"},
    {"adam_beta1", "optimizer.betas is [beta1, beta2]"},
    {"adam_beta2", "optimizer.betas is [beta1, beta2]"},
    {"optimizer.name", "megatrain's one optimizer is adamw"},
    {"model.name", "torchtitan's model.name is the architecture: model.family llama (its llama3), qwen2, qwen3, "
                   "mixtral or qwen3_moe; megatrain has no flavors, the recipe gives the shape"},
    {"local_batch_size", "torchtitan's local_batch_size is per data-parallel rank, as micro_batch_size is; its "
                         "global_batch_size (-1: local_batch_size x dp) is train.global_batch_size, which "
                         "micro-batches accumulate to; on a pipeline micro_batch_size is its "
                         "pipeline_parallel_microbatch_size"},
    {"pipeline_parallel_microbatch_size", "torchtitan splits local_batch_size into pipeline micro-batches of this "
                                          "size: train.micro_batch_size = pipeline_parallel_microbatch_size, "
                                          "train.global_batch_size = local_batch_size x dp"},
    {"dataset_path", "data.train is a PREFIX that `megatrain data build --input FILE --output PREFIX --tokenizer "
                     "tokenizer.json` writes (PREFIX.bin, PREFIX.idx), not a Hugging Face dataset directory "
                     "(docs/data.md)"},
    {"checkpoint.export_dtype", "megatrain's model.export_dtype is what `megatrain convert` writes for Hugging Face "
                                "(auto, fp32, bf16, fp16); torchtitan's, its last model-only save's"},
    /* Megatron-LM's flags where megatrain's key takes another unit, form or sense (docs/megatron.md) */
    {"eval_iters", "Megatron's eval_iters counts global batches, megatrain's eval_batches micro-batches per "
                   "data-parallel rank: eval_batches = eval_iters x global_batch_size / (micro_batch_size x dp)"},
    {"untie_embeddings_and_output_weights", "model.tie_word_embeddings is its opposite, and the defaults differ: "
                                            "Megatron ties unless given untie_embeddings_and_output_weights, "
                                            "megatrain unties unless tie_word_embeddings: true"},
    {"step_batch_size_schedule", "the same \"0:768 250B:1536\" string of token thresholds (docs/megatron.md)"},
    {"train_samples", "train.tokens = train_samples x seq_len (or train.steps = train_samples / global_batch_size)"},
    {"lr_warmup_samples", "megatrain's schedule counts steps: warmup_steps = lr_warmup_samples / global_batch_size"},
    {"lr_decay_samples", "megatrain's schedule counts steps: decay_steps = lr_decay_samples / global_batch_size"},
    {"start_weight_decay", "Megatron's start_weight_decay is optimizer.weight_decay, with weight_decay_end and "
                           "weight_decay_style linear or cosine"},
    {"lr_wsd_decay_samples", "megatrain's schedule counts steps: wsd_decay_steps = lr_wsd_decay_samples / "
                             "global_batch_size"},
    {"no_load_optim", "checkpoint.load_optimizer is its opposite: no_load_optim: true is load_optimizer: false"},
    /* Hugging Face Trainer's TrainingArguments where megatrain's key takes another unit or form (docs/finetune.md) */
    {"gradient_accumulation_steps", "megatrain sets the global batch, not the accumulation: global_batch_size = "
                                    "per_device_train_batch_size x gradient_accumulation_steps x the data-parallel "
                                    "ranks (micro-batches accumulate to it)"},
    {"eval_strategy", "the Trainer's eval_strategy steps with eval_steps N is train.eval_interval: N; no is 0"},
    {"save_strategy", "the Trainer's save_strategy steps with save_steps N is checkpoint.interval: N (a run also "
                      "saves at its end)"},
    {"gradient_checkpointing", "the Trainer's gradient_checkpointing: true is train.recompute: full"},
    {"warmup_ratio", "the Trainer rounds warmup_ratio x max_steps up to whole steps, megatrain keeps the fraction "
                     "(Megatron's way): for the Trainer's lr at every step give optimizer.schedule.warmup_steps = "
                     "ceil(warmup_ratio x train.steps)"},
    {"lr_scheduler_type", "the Trainer's linear and cosine decay to 0: with optimizer.min_lr: 0 they are "
                          "megatrain's (its default min_lr is lr / 10)"},
    {"report_to", "report_to: tensorboard is logging.tensorboard: true (written to run.dir/tensorboard; wandb is "
                  "not written)"},
    {"bf16", "Megatron's bf16: true is precision: bf16 (the compute dtype; fp16 is not implemented)"},
    {"recompute_activations", "Megatron's recompute_activations: true is train.recompute: selective"},
    {"num_layers_per_virtual_pipeline_stage", "Megatron's num_layers_per_virtual_pipeline_stage counts layers, "
                                              "megatrain's vpp virtual stages: vpp = num_layers / (pp x "
                                              "num_layers_per_virtual_pipeline_stage)"},
};

/* Other projects' keys that megatrain has no key for, with why (Megatron's flags that a pretraining script carries;
 * docs/megatron.md): answered instead of a guess at a key of similar spelling. */
static const char *const resume_note = "`megatrain resume RUN_DIR` continues a run from its checkpoint; init_from: CKPT "
                                       "starts a new run from a checkpoint's weights";
static const char *const dropout_note = "megatrain trains without dropout (Megatron's default is 0.1: set 0 there for "
                                        "the same model)";
static const char *const one_impl_note = "megatrain has one implementation of each layer, on the CPU and on GPUs";
static const char *const dp_note = "the data-parallel size is not set, it is what the launch leaves, world size / (tp "
                                   "* cp * pp) (mpirun -np 8 with tp 2 gives dp 4)";
static const char *const tokenizer_note = "a run reads token ids: `megatrain data build --tokenizer PATH` tokenizes "
                                          "the text into data.train (docs/data.md), and model.vocab_size must hold "
                                          "its ids";
static const NameNote no_key_notes[] = {
    {"load", resume_note},
    {"pretrained_checkpoint", resume_note},
    {"hidden_dropout", dropout_note},
    {"attention_dropout", dropout_note},
    {"use_flash_attn", "nothing to set: GPUs always run megatrain's own flash attention kernels (docs/gpu.md)"},
    {"attention_softmax_in_fp32", "nothing to set: the softmax always computes in fp32"},
    {"overlap_grad_reduce", "nothing to set: on GPUs the data-parallel gradient reduction always overlaps the "
                            "backward (docs/parallel.md)"},
    {"overlap_param_gather", "nothing to set: with parallel.distributed_optimizer on GPUs the parameters are always "
                             "gathered bucket by bucket under the next forward (docs/parallel.md)"},
    {"use_mcore_models", one_impl_note},
    {"transformer_impl", one_impl_note},
    {"ckpt_format", "megatrain writes its own sharded, zstd-compressed checkpoints; `megatrain convert` reads and "
                    "writes Hugging Face's (docs/checkpoints.md)"},
    {"make_vocab_size_divisible_by", "the vocabulary is not padded: model.vocab_size is used as given"},
    {"parallel.dp", dp_note},
    {"data_parallel_size", dp_note},
    {"tokenizer_model", tokenizer_note},
    {"tokenizer_type", tokenizer_note},
    {"vocab_file", tokenizer_note},
    /* torchtitan's */
    {"data_parallel_replicate_degree", dp_note},
    {"data_parallel_shard_degree", "megatrain has no FSDP: the data-parallel size is what the launch leaves, world "
                                   "size / (tp * cp * pp), every rank holding its stage's weights and gradients; "
                                   "parallel.distributed_optimizer: true (ZeRO-1) shards the fp32 master weights and "
                                   "AdamW moments over those ranks (docs/parallel.md)"},
    {"model.flavor", "megatrain has no table of sizes: the recipe spells the shape out (num_layers, hidden_size, "
                     "intermediate_size, num_attention_heads, num_key_value_heads, vocab_size; recipes/ has tiny, "
                     "8B and 70B ones), or `model: DIR/model.yaml` takes a converted checkpoint's"},
    {"tokenizer_path", tokenizer_note},
    {"hf_assets_path", tokenizer_note},
    {"dataset", "megatrain has no named data sets: data.train is the PREFIX that `megatrain data build --input FILE "
                "--output PREFIX --tokenizer tokenizer.json` writes from text or JSONL (docs/data.md)"},
    {"pipeline_parallel_schedule", "the schedule follows parallel.vpp: 1F1B with vpp 1, interleaved 1F1B with vpp > "
                                   "1 (torchtitan's 1F1B and Interleaved1F1B); GPipe, ZBV and the others are not "
                                   "implemented"},
    {"checkpoint.enable", "checkpoints are always on: a run saves every checkpoint.interval steps (0: none on the "
                          "way) and at its end"},
    {"checkpoint.folder", "checkpoints go to run.dir/checkpoints, where `megatrain resume RUN_DIR` finds them (a "
                          "symbolic link there puts them elsewhere, docs/checkpoints.md)"},
    {"last_save_model_only", "every checkpoint holds the optimizer state, for resume; `megatrain convert RUN_DIR "
                             "OUT` writes the model alone, as Hugging Face safetensors"},
    {"compile", "nothing to set: megatrain is compiled C with its own CPU and CUDA kernels (no torch.compile)"},
    {"enable_wandb", "wandb is not written: logging.tensorboard: true writes run.dir/tensorboard, and every run "
                     "writes run.dir/metrics.jsonl"},
    {"gc_freq", "nothing to set: megatrain runs no Python, so no garbage collector"},
    /* Hugging Face Trainer's */
    {"num_train_epochs", "megatrain counts steps or tokens: train.tokens = epochs x the training data's tokens "
                         "(`megatrain data inspect PREFIX` counts them), or train.steps"},
    {"per_device_eval_batch_size", "evaluation reads batches of train.micro_batch_size (train.eval_batches of them, "
                                   "or all: every validation sample once)"},
};

/* The note of `path` ("model.name"): an entry of that whole path, else one of its last name ("name") alone. */
static const char *name_note(const NameNote *notes, size_t count, const char *path) {
    const char *dot = strrchr(path, '.');
    const char *name = dot ? dot + 1 : path;
    for (size_t i = 0; i < count; i++)
        if (strcmp(notes[i].name, path) == 0) return notes[i].note;
    for (size_t i = 0; i < count; i++)
        if (!strchr(notes[i].name, '.') && strcmp(notes[i].name, name) == 0) return notes[i].note;
    return NULL;
}

const char *recipe_no_key_note(const char *path) {
    return name_note(no_key_notes, sizeof no_key_notes / sizeof no_key_notes[0], path);
}

const char *recipe_also_note(const char *path) {
    return name_note(also_notes, sizeof also_notes / sizeof also_notes[0], path);
}
