/* recipe_defaults.c: default values (shared/RECIPE.md) set before the YAML is
 * read, and the defaults derived from other keys filled in after it. */
#include <string.h>

#include "recipe_schema.h"

void model_set_defaults(ModelConfig *model) {
    memset(model, 0, sizeof *model);
    model->family = FAMILY_LLAMA;
    model->rope_theta = 10000.0;
    model->rms_norm_eps = 1e-5;
    model->init_std = 0.02;
    model->moe.norm_topk_prob = true;
    model->moe.score_function = SCORE_SOFTMAX;
    model->moe.load_balancing = LB_AUX_LOSS;
    model->moe.aux_loss_coeff = 1e-2;
    model->moe.layer_freq = 1;
    model->moe.bias_update_rate = 1e-3;
    model->peft.targets = LORA_ALL_TARGETS; /* target_modules: every linear layer */
}

void model_fill_derived(ModelConfig *model, const YNode *model_map) {
    if (model->num_key_value_heads == 0) model->num_key_value_heads = model->num_attention_heads;
    if (model->head_dim == 0 && model->num_attention_heads > 0)
        model->head_dim = model->hidden_size / model->num_attention_heads;
    if (!ytree_has(model_map, "attention_bias")) model->attention_bias = model->family == FAMILY_QWEN2;
    if (!ytree_has(model_map, "qk_norm"))
        model->qk_norm = model->family == FAMILY_QWEN3 || model->family == FAMILY_QWEN3_MOE;
}

void peft_fill_derived(ModelConfig *model, const YNode *peft_map) {
    if (model->peft.type == PEFT_LORA && model_family_is_moe(model->family) && !ytree_has(peft_map, "target_modules"))
        model->peft.targets = 1u << LORA_Q | 1u << LORA_K | 1u << LORA_V | 1u << LORA_O;
}

Fp8Config fp8_config_default(void) {
    /* Transformer Engine's DelayedScaling defaults; E5M2 gradients (its HYBRID format) */
    return (Fp8Config){.recipe = FP8_RECIPE_TENSORWISE, .grad_format = FP8_E5M2, .amax_history_len = 1024,
                       .amax_compute_algo = FP8_AMAX_MAX, .margin = 0};
}

bool fp8_config_is_default(const Fp8Config *c) {
    const Fp8Config d = fp8_config_default();
    return c->recipe == d.recipe && c->grad_format == d.grad_format && c->amax_history_len == d.amax_history_len &&
           c->amax_compute_algo == d.amax_compute_algo && c->margin == d.margin;
}

void recipe_set_defaults(Recipe *recipe) {
    memset(recipe, 0, sizeof *recipe);
    recipe->run.seed = 1234;
    strcpy(recipe->run.device, "cpu");
    model_set_defaults(&recipe->model);
    recipe->parallel = (ParallelConfig){.tp = 1, .pp = 1, .vpp = 1, .cp = 1, .ep = 1, .etp = 1};
    recipe->train.eval_interval = 50;
    recipe->train.replica_check_interval = 100;
    recipe->train.eval_batches = 4;
    OptimizerConfig *opt = &recipe->optimizer;
    opt->lr = 3e-3;
    opt->beta1 = 0.9;
    opt->beta2 = 0.95;
    opt->eps = 1e-8;
    opt->weight_decay = 0.1;
    opt->clip_grad = 1.0;
    opt->state_dtype = DTYPE_FP32;
    opt->decay = DECAY_COSINE;
    opt->wsd_decay_style = WSD_MINUS_SQRT;
    recipe->precision = DTYPE_BF16;
    recipe->fp8 = fp8_config_default();
    recipe->checkpoint = (CheckpointConfig){.interval = 50, .keep_last = 2, .keep_every = 0, .async = true,
                                            .compression_level = 3, .load_optimizer = true,
                                            .frozen_base = FROZEN_BASE_AUTO};
    recipe->logging = (LoggingConfig){.interval = 1, .tensorboard = true, .timers_interval = 100, .peak_tflops = 0.0};
}

/* "recipes/tiny/llama.yaml" -> "llama" */
static void file_stem(char *out, size_t outlen, const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t len = strcspn(base, ".");
    if (len == 0) len = strlen(base);
    if (len >= outlen) len = outlen - 1;
    memcpy(out, base, len);
    out[len] = '\0';
    if (out[0] == '\0') snprintf(out, outlen, "run");
}

static void join_dir(char *out, size_t outlen, const char *dir, const char *name) {
    size_t dir_len = strlen(dir), name_len = strlen(name);
    if (dir_len + 1 + name_len >= outlen) dir_len = outlen - 2 - name_len;
    memcpy(out, dir, dir_len);
    out[dir_len] = '/';
    memcpy(out + dir_len + 1, name, name_len + 1);
}

#define DEFAULT_CACHE_DIR "data-cache" /* in run.dir */

bool recipe_cache_dir_is_default(const Recipe *recipe) {
    char dir[sizeof recipe->data.cache_dir];
    join_dir(dir, sizeof dir, recipe->run.dir, DEFAULT_CACHE_DIR);
    return strcmp(dir, recipe->data.cache_dir) == 0;
}

void recipe_fill_derived(Recipe *recipe, const YNode *root) {
    model_fill_derived(&recipe->model, ytree_get(root, "model"));
    peft_fill_derived(&recipe->model, ytree_get(root, "peft"));
    if (recipe->run.name[0] == '\0') file_stem(recipe->run.name, sizeof recipe->run.name, recipe->source_path);
    if (recipe->run.dir[0] == '\0') join_dir(recipe->run.dir, sizeof recipe->run.dir, "runs", recipe->run.name);
    /* "runs/x/" names runs/x, as a resume's located run directory does: one spelling, for the recipe's text */
    for (size_t n = strlen(recipe->run.dir); n > 1 && recipe->run.dir[n - 1] == '/'; n--) recipe->run.dir[n - 1] = '\0';
    if (recipe->data.cache_dir[0] == '\0')
        join_dir(recipe->data.cache_dir, sizeof recipe->data.cache_dir, recipe->run.dir, DEFAULT_CACHE_DIR);
    if (!ytree_has(ytree_get(root, "optimizer"), "min_lr")) recipe->optimizer.min_lr = recipe->optimizer.lr * 0.1;
    if (!ytree_has(ytree_get(root, "data"), "split")) {
        double split[3] = {98, 2, 0};
        if (recipe->data.num_valid > 0) split[0] = 100, split[1] = 0;
        memcpy(recipe->data.split, split, sizeof split);
    }
}
