/* test_model_compare.c: the checkpoint-against-recipe comparison of model
 * configs that resume and init_from use (model_config_difference, driven by
 * the schema's `match` marks, src/config/model_config_compare.c):
 *   - the marks say the truth of the parameters: for a real architecture of
 *     each family in configs/, changing any plain model or moe key that is
 *     not marked WEIGHTS leaves every parameter's name and shape as they
 *     were (the registry's), and each WEIGHTS key changes some in one of
 *     them at least;
 *   - what each level compares: rope_theta, rms_norm_eps, the routing
 *     (FUNCTION) only for init_from; load_balancing and the coefficients
 *     never; a head_dim left out is hidden_size / num_attention_heads (the
 *     loader fills it in); rope_scaling
 *     as a block and then its factors; layer_freq as the layers it makes MoE
 *     (1 equals an all-ones list); a dense family's moe block not at all;
 *   - the messages name the key path and both values;
 *   - every marked key that is not a plain value says how it compares. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config/recipe.h"
#include "config/recipe_schema.h"
#include "model/model.h"
#include "model/model_internal.h"

static char why[1024];

static ModelConfig load(const char *text) {
    ModelConfig cfg;
    char err[1024];
    if (model_config_load_text(&cfg, text, "test.yaml", err, sizeof err) != 0) fail_msg("%s\n%s", err, text);
    return cfg;
}

static ModelConfig load_file(const char *name) {
    char path[512];
    const char *dir = getenv("MT_CONFIG_DIR");
    snprintf(path, sizeof path, "%s/%s", dir ? dir : "configs", name);
    ModelConfig cfg;
    char err[1024];
    if (model_config_load(&cfg, path, err, sizeof err) != 0) fail_msg("%s (run from the repository root)", err);
    return cfg;
}

#define DENSE                                                                                                        \
    "family: llama\nnum_layers: 4\nhidden_size: 64\nintermediate_size: 128\nnum_attention_heads: 4\n"                \
    "num_key_value_heads: 2\nvocab_size: 256\nmax_position_embeddings: 128\n"
#define MOE                                                                                                          \
    "family: mixtral\nnum_layers: 4\nhidden_size: 64\nintermediate_size: 128\nnum_attention_heads: 4\n"              \
    "num_key_value_heads: 2\nvocab_size: 256\nmax_position_embeddings: 128\n"                                        \
    "moe:\n  num_experts: 4\n  num_experts_per_tok: 2\n  moe_intermediate_size: 32\n"

static int differ(const ModelConfig *a, const ModelConfig *b, ModelMatch level) {
    why[0] = '\0';
    return model_config_difference(a, b, level, why, sizeof why);
}

static void expect_same(const ModelConfig *a, const ModelConfig *b, ModelMatch level) {
    if (differ(a, b, level) != 0) fail_msg("expected no difference, got: %s", why);
}

static void expect_message(const ModelConfig *a, const ModelConfig *b, ModelMatch level, const char *message) {
    assert_int_equal(differ(a, b, level), -1);
    if (strcmp(why, message) != 0) fail_msg("expected '%s', got '%s'", message, why);
}

static void test_levels(void **state) {
    (void)state;
    const ModelConfig a = load(DENSE);
    ModelConfig b = a;
    expect_same(&a, &b, MODEL_MATCH_FUNCTION);
    b.rope_theta = 500000;
    expect_same(&a, &b, MODEL_MATCH_WEIGHTS); /* a resume may extend the context */
    expect_message(&a, &b, MODEL_MATCH_FUNCTION, "model.rope_theta is 10000 in the checkpoint but 500000 in the recipe");
    b = a;
    b.rms_norm_eps = 1e-6;
    expect_same(&a, &b, MODEL_MATCH_WEIGHTS);
    assert_int_equal(differ(&a, &b, MODEL_MATCH_FUNCTION), -1);
    assert_non_null(strstr(why, "model.rms_norm_eps is "));
    b = a;
    b.hidden_size = 128;
    expect_message(&a, &b, MODEL_MATCH_WEIGHTS, "model.hidden_size is 64 in the checkpoint but 128 in the recipe");
    b = a;
    b.tie_word_embeddings = !a.tie_word_embeddings;
    expect_message(&a, &b, MODEL_MATCH_WEIGHTS,
                   a.tie_word_embeddings ? "model.tie_word_embeddings is true in the checkpoint but false in the recipe"
                                         : "model.tie_word_embeddings is false in the checkpoint but true in the recipe");
    b = a;
    b.max_position_embeddings = 4096; /* a training choice */
    b.init_std = 0.5;
    expect_same(&a, &b, MODEL_MATCH_FUNCTION);
    b = a;
    b.family = FAMILY_QWEN3;
    expect_message(&a, &b, MODEL_MATCH_WEIGHTS, "model.family is llama in the checkpoint but qwen3 in the recipe");
}

static void test_head_dim_default(void **state) {
    (void)state;
    const ModelConfig a = load(DENSE), b = load(DENSE "head_dim: 16\n"), c = load(DENSE "head_dim: 32\n");
    expect_same(&a, &b, MODEL_MATCH_FUNCTION); /* 64 / 4 (filled in by the loader): the same heads, said two ways */
    expect_message(&a, &c, MODEL_MATCH_WEIGHTS, "model.head_dim is 16 in the checkpoint but 32 in the recipe");
}

static void test_rope_scaling(void **state) {
    (void)state;
    const ModelConfig none = load(DENSE);
    const ModelConfig llama3 = load(DENSE "rope_scaling: {type: llama3, factor: 8, low_freq_factor: 1, "
                                          "high_freq_factor: 4, original_max_position_embeddings: 64}\n");
    ModelConfig other = llama3;
    expect_same(&none, &llama3, MODEL_MATCH_WEIGHTS);
    expect_message(&llama3, &none, MODEL_MATCH_FUNCTION,
                   "model.rope_scaling is llama3 in the checkpoint but null in the recipe");
    other.rope_scaling.factor = 16;
    expect_message(&llama3, &other, MODEL_MATCH_FUNCTION,
                   "model.rope_scaling.factor is 8 in the checkpoint but 16 in the recipe");
    other = llama3;
    other.rope_scaling.original_max_position_embeddings = 128;
    expect_message(&llama3, &other, MODEL_MATCH_FUNCTION, "model.rope_scaling.original_max_position_embeddings is 64 "
                                                           "in the checkpoint but 128 in the recipe");
}

static void test_moe(void **state) {
    (void)state;
    const ModelConfig a = load(MOE);
    ModelConfig b = a;
    b.moe.num_experts_per_tok = 1;
    expect_same(&a, &b, MODEL_MATCH_WEIGHTS);
    expect_message(&a, &b, MODEL_MATCH_FUNCTION,
                   "model.moe.num_experts_per_tok is 2 in the checkpoint but 1 in the recipe");
    b = a;
    b.moe.num_experts = 8;
    expect_message(&a, &b, MODEL_MATCH_WEIGHTS, "model.moe.num_experts is 4 in the checkpoint but 8 in the recipe");
    b = a;
    b.moe.score_function = SCORE_SIGMOID;
    expect_message(&a, &b, MODEL_MATCH_FUNCTION,
                   "model.moe.score_function is softmax in the checkpoint but sigmoid in the recipe");
    b = a;
    b.moe.load_balancing = LB_NONE; /* training choices: never compared */
    b.moe.aux_loss_coeff = 0.5;
    b.moe.capacity_factor = 2;
    expect_same(&a, &b, MODEL_MATCH_FUNCTION);
    const ModelConfig ones = load(MOE "  layer_freq: [1, 1, 1, 1]\n"), every2 = load(MOE "  layer_freq: 2\n");
    expect_same(&a, &ones, MODEL_MATCH_FUNCTION); /* the same layers, said two ways */
    expect_message(&a, &every2, MODEL_MATCH_WEIGHTS,
                   "layer 1 is MoE in the checkpoint but dense in the recipe (model.moe.layer_freq)");
    /* a dense family's moe block means nothing */
    ModelConfig d1 = load(DENSE), d2 = d1;
    d2.moe.num_experts = d1.moe.num_experts + 3;
    expect_same(&d1, &d2, MODEL_MATCH_FUNCTION);
}

static void test_peft(void **state) {
    (void)state;
    const ModelMatch W = MODEL_MATCH_WEIGHTS, F = MODEL_MATCH_FUNCTION;
    PeftConfig a = {.type = PEFT_LORA, .rank = 4, .alpha = 8, .targets = 1u << LORA_Q | 1u << LORA_V}, b = a;
    assert_int_equal(peft_config_difference(&a, &b, F, why, sizeof why), 0);
    b.alpha = 16; /* the adapters' scale: what they compute, not their shapes */
    assert_int_equal(peft_config_difference(&a, &b, W, why, sizeof why), 0);
    assert_int_equal(peft_config_difference(&a, &b, F, why, sizeof why), -1);
    assert_string_equal(why, "peft.alpha is 8 in the checkpoint but 16 in the recipe");
    b.rank = 8;
    assert_int_equal(peft_config_difference(&a, &b, W, why, sizeof why), -1);
    assert_string_equal(why, "peft.rank is 4 in the checkpoint but 8 in the recipe");
    b = a;
    b.targets |= 1u << LORA_DOWN;
    assert_int_equal(peft_config_difference(&a, &b, W, why, sizeof why), -1);
    assert_string_equal(why, "peft.target_modules is [q_proj, v_proj] in the checkpoint but [q_proj, v_proj, "
                             "down_proj] in the recipe");
    b = a;
    b.dropout = 0.1; /* a training choice */
    assert_int_equal(peft_config_difference(&a, &b, F, why, sizeof why), 0);
}

/* Every marked key that is not a plain value (a section or a custom key) has its own comparison. */
static void check_marked_keys_compare(const RecipeKey *keys) {
    for (const RecipeKey *key = keys; key->name; key++) {
        if (!key->match) continue;
        if (key->type == KT_CUSTOM && !key->differ) fail_msg("%s: marked, but no comparison", key->name);
        if (key->type == KT_SECTION) check_marked_keys_compare(key->keys);
    }
}

static void test_marked_keys_compare(void **state) {
    (void)state;
    check_marked_keys_compare(recipe_model_keys);
    check_marked_keys_compare(find_key(recipe_root_keys, "peft")->keys);
}

/* Every parameter's name and shape, one line each. */
static char *param_table(const ModelConfig *cfg) {
    const ModelPartition part = model_partition_whole(cfg);
    int count = 0;
    long total = 0;
    ParamInfo *infos = model_registry_of(cfg, &part, &count, &total);
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    for (int i = 0; i < count; i++) {
        fprintf(out, "%s", infos[i].name);
        for (int d = 0; d < infos[i].ndim; d++) fprintf(out, " %ld", infos[i].shape[d]);
        fputc('\n', out);
    }
    fclose(out);
    free(infos);
    return text;
}

/* Changes one plain key's value in cfg's `section` to another that the model accepts (ints: doubled, halved or
 * one more, the first the model's checks take, or 64 for 0; booleans flipped; numbers doubled; enums to the next
 * name). Returns false for a key that is not a plain value. */
static bool perturb(const RecipeKey *key, ModelConfig *cfg, size_t section_offset) {
    char *field = (char *)cfg + section_offset + key->offset;
    char err[512];
    switch (key->type) {
    case KT_INT: {
        const int was = *(int *)field, tries[] = {was ? 2 * was : 64, was / 2, was + 1};
        for (size_t i = 0; i < sizeof tries / sizeof *tries; i++) {
            *(int *)field = tries[i];
            if (tries[i] != was && model_config_validate(cfg, err, sizeof err) == 0) return true;
        }
        fail_msg("%s: no other value the model accepts (%s)", key->name, err);
        return false;
    }
    case KT_BOOL: *(bool *)field = !*(bool *)field; return true;
    case KT_DOUBLE: *(double *)field = *(double *)field ? 2 * *(double *)field : 0.5; return true;
    case KT_ENUM: {
        int n = 0;
        while (key->names[n]) n++;
        *(int *)field = (*(int *)field + 1) % n;
        return true;
    }
    default: return false;
    }
}

/* For one key table of cfg (the model's, or its moe block's at section_offset): each plain key changed alone.
 * A key not marked WEIGHTS must change no parameter; changes[i] counts the configs where key i changed some. */
static void check_marks_of(const char *file, const ModelConfig *cfg, const RecipeKey *keys, size_t section_offset,
                           const char *prefix, const char *before, int *changes) {
    for (int i = 0; keys[i].name; i++) {
        const RecipeKey *key = &keys[i];
        if (strcmp(key->name, "family") == 0) continue; /* another family: another table of names */
        ModelConfig changed = *cfg;
        if (!perturb(key, &changed, section_offset)) continue;
        char *after = param_table(&changed);
        if (strcmp(before, after) != 0) changes[i]++;
        if (key->match != MODEL_MATCH_WEIGHTS && strcmp(before, after) != 0)
            fail_msg("%s: changing %s%s changes the parameters, but it is not marked WEIGHTS (a resume would not "
                     "refuse it)", file, prefix, key->name);
        free(after);
    }
}

/* Every plain key marked WEIGHTS changed the parameters of at least one config (intermediate_size changes none
 * of a model whose every layer is MoE, so one config cannot say it). */
static void check_weights_changed(const RecipeKey *keys, const int *changes, const char *prefix) {
    for (int i = 0; keys[i].name; i++)
        if (keys[i].match == MODEL_MATCH_WEIGHTS && keys[i].type != KT_CUSTOM && keys[i].type != KT_SECTION &&
            strcmp(keys[i].name, "family") != 0 && changes[i] == 0)
            fail_msg("%s%s is marked WEIGHTS, but changing it changed no parameter of any config", prefix,
                     keys[i].name);
}

static void test_marks_follow_the_registry(void **state) {
    (void)state;
    /* each family: llama, qwen2 (q/k/v biases), qwen3 (q/k norms), mixtral, qwen3_moe */
    const char *files[] = {"llama3.2-1b.yaml", "qwen2.5-0.5b.yaml", "qwen3-0.6b.yaml", "mixtral-8x7b.yaml",
                           "qwen3-30b-a3b.yaml"};
    const RecipeKey *moe_keys = find_key(recipe_model_keys, "moe")->keys;
    int model_changes[64] = {0}, moe_changes[64] = {0};
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        ModelConfig cfg = load_file(files[f]);
        cfg.num_layers = 2; /* the registry's names repeat per layer: two say it all, and fast */
        char *before = param_table(&cfg);
        check_marks_of(files[f], &cfg, recipe_model_keys, 0, "model.", before, model_changes);
        if (model_family_is_moe(cfg.family))
            check_marks_of(files[f], &cfg, moe_keys, offsetof(ModelConfig, moe), "model.moe.", before, moe_changes);
        free(before);
    }
    check_weights_changed(recipe_model_keys, model_changes, "model.");
    check_weights_changed(moe_keys, moe_changes, "model.moe.");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_levels),
        cmocka_unit_test(test_head_dim_default),
        cmocka_unit_test(test_rope_scaling),
        cmocka_unit_test(test_moe),
        cmocka_unit_test(test_peft),
        cmocka_unit_test(test_marked_keys_compare),
        cmocka_unit_test(test_marks_follow_the_registry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
