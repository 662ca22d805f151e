/* test_configs.c: every real architecture in configs/ (every .yaml file) loads with
 * model_config_load, is internally consistent, and has the parameter count
 * its publisher states (model cards and Hugging Face Hub pages, listed in
 * published_counts below), counted by model_count_params.
 *
 * Run from the repository root (tests/run_tests.sh does); MT_CONFIG_DIR
 * points elsewhere. */
#include <glob.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config/recipe.h"
#include "model/model.h"

/* A parameter count as published, in billions, written exactly as the
 * source writes it ("1.7", "7.61"): the number of digits says how precise
 * the figure is. non_embedding is NULL when the source gives none. */
typedef struct PublishedCount {
    const char *file;          /* under configs/ */
    const char *total;         /* billions */
    const char *non_embedding; /* billions, or NULL */
    const char *source;
} PublishedCount;

static const PublishedCount published_counts[] = {
    {"llama3.2-1b.yaml", "1.23", NULL, "Llama 3.2 model card (meta-llama/Llama-3.2-1B): 1.23B"},
    {"llama3.2-3b.yaml", "3.21", NULL, "Llama 3.2 model card (meta-llama/Llama-3.2-3B): 3.21B"},
    {"llama3-8b.yaml", "8.03", NULL, "HF Hub meta-llama/Meta-Llama-3-8B: 8.03B params"},
    {"llama3-70b.yaml", "70.6", NULL, "HF Hub meta-llama/Meta-Llama-3-70B: 70.6B params"},
    {"llama3.1-405b.yaml", "405", NULL, "Llama 3.1 model card: 405B"},
    {"qwen2.5-0.5b.yaml", "0.49", "0.36", "Qwen/Qwen2.5-0.5B model card"},
    {"qwen2.5-1.5b.yaml", "1.54", "1.31", "Qwen/Qwen2.5-1.5B model card"},
    {"qwen2.5-3b.yaml", "3.09", "2.77", "Qwen/Qwen2.5-3B model card"},
    {"qwen2.5-7b.yaml", "7.61", "6.53", "Qwen/Qwen2.5-7B model card"},
    {"qwen2.5-14b.yaml", "14.7", "13.1", "Qwen/Qwen2.5-14B model card"},
    {"qwen2.5-32b.yaml", "32.5", "31.0", "Qwen/Qwen2.5-32B model card"},
    {"qwen2.5-72b.yaml", "72.7", "70.0", "Qwen/Qwen2.5-72B model card"},
    {"qwen3-0.6b.yaml", "0.6", "0.44", "Qwen/Qwen3-0.6B model card"},
    {"qwen3-1.7b.yaml", "1.7", "1.4", "Qwen/Qwen3-1.7B model card"},
    {"qwen3-4b.yaml", "4.0", "3.6", "Qwen/Qwen3-4B model card"},
    {"qwen3-8b.yaml", "8.2", "6.95", "Qwen/Qwen3-8B model card"},
    {"qwen3-14b.yaml", "14.8", "13.2", "Qwen/Qwen3-14B model card"},
    {"qwen3-32b.yaml", "32.8", "31.2", "Qwen/Qwen3-32B model card"},
};
#define NUM_PUBLISHED (sizeof published_counts / sizeof published_counts[0])

static const char *config_dir(void) {
    const char *dir = getenv("MT_CONFIG_DIR");
    return dir && dir[0] ? dir : "configs";
}

static void load_config(const char *file, ModelConfig *cfg) {
    char path[MT_PATH_MAX], err[1024] = "";
    snprintf(path, sizeof path, "%s/%s", config_dir(), file);
    memset(cfg, 0, sizeof *cfg);
    if (model_config_load(cfg, path, err, sizeof err) != 0) fail_msg("%s: %s", path, err);
}

/* Does `count` (parameters) agree with a published figure `billions`?
 * Within 1%, or, where the figure itself is rounded more coarsely than 1%
 * (e.g. "1.7" stands for anything in [1.65, 1.75)), within that rounding. */
static void expect_matches(const char *file, const char *what, long count, const char *billions) {
    char *end;
    double published = strtod(billions, &end) * 1e9;
    assert_true(*end == '\0' && published > 0);
    const char *dot = strchr(billions, '.');
    int decimals = dot ? (int)strlen(dot + 1) : 0;
    double rounding = 0.5 * pow(10.0, -decimals) * 1e9;
    double tolerance = fmax(0.01 * published, rounding);
    double off = fabs((double)count - published);
    printf("  %-20s %-14s %15ld  published %6sB  off %.2f%%\n", file, what, count, billions,
           100.0 * off / published);
    if (off > tolerance)
        fail_msg("%s: %s parameters %ld, published %sB: off by %.2f%%", file, what, count, billions,
                 100.0 * off / published);
}

static void test_published_parameter_counts(void **state) {
    (void)state;
    for (size_t i = 0; i < NUM_PUBLISHED; i++) {
        const PublishedCount *p = &published_counts[i];
        ModelConfig cfg;
        load_config(p->file, &cfg);
        long total = model_count_params(&cfg);
        expect_matches(p->file, "total", total, p->total);
        if (p->non_embedding) {
            long embeddings = (long)cfg.vocab_size * cfg.hidden_size * (cfg.tie_word_embeddings ? 1 : 2);
            expect_matches(p->file, "non-embedding", total - embeddings, p->non_embedding);
        }
    }
}

/* Tying the embeddings removes exactly one [V, C] matrix from the count. */
static void test_tied_embeddings_count_once(void **state) {
    (void)state;
    ModelConfig cfg;
    load_config("llama3.2-1b.yaml", &cfg);
    assert_true(cfg.tie_word_embeddings);
    long tied = model_count_params(&cfg);
    cfg.tie_word_embeddings = false;
    long untied = model_count_params(&cfg);
    assert_int_equal(untied - tied, (long)cfg.vocab_size * cfg.hidden_size);
}

static void check_consistent(const char *what, const ModelConfig *cfg) {
    if (cfg->num_attention_heads <= 0 || cfg->num_key_value_heads <= 0)
        fail_msg("%s: head counts must be positive", what);
    if (cfg->num_attention_heads % cfg->num_key_value_heads != 0)
        fail_msg("%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", what,
                 cfg->num_attention_heads, cfg->num_key_value_heads);
    if (cfg->head_dim <= 0 || cfg->head_dim % 2 != 0)
        fail_msg("%s: head_dim %d must be positive and even (RoPE rotates pairs)", what, cfg->head_dim);
    if (cfg->num_layers <= 0 || cfg->hidden_size <= 0 || cfg->intermediate_size <= cfg->hidden_size ||
        cfg->vocab_size <= 0)
        fail_msg("%s: sizes must be positive with intermediate_size > hidden_size", what);
    if (!(cfg->rope_theta > 0) || !(cfg->rms_norm_eps > 0 && cfg->rms_norm_eps <= 1e-4))
        fail_msg("%s: rope_theta %g must be positive and rms_norm_eps %g in (0, 1e-4]", what, cfg->rope_theta,
                 cfg->rms_norm_eps);
    switch (cfg->family) {
    case FAMILY_LLAMA:
        /* Llama's published configs all have heads * head_dim == hidden_size */
        if ((long)cfg->num_attention_heads * cfg->head_dim != cfg->hidden_size)
            fail_msg("%s: llama: %d heads x head_dim %d != hidden_size %d", what, cfg->num_attention_heads,
                     cfg->head_dim, cfg->hidden_size);
        if (cfg->attention_bias || cfg->qk_norm) fail_msg("%s: llama has no q/k/v bias and no qk_norm", what);
        break;
    case FAMILY_QWEN2:
        if ((long)cfg->num_attention_heads * cfg->head_dim != cfg->hidden_size)
            fail_msg("%s: qwen2: %d heads x head_dim %d != hidden_size %d", what, cfg->num_attention_heads,
                     cfg->head_dim, cfg->hidden_size);
        if (!cfg->attention_bias || cfg->qk_norm) fail_msg("%s: qwen2 has q/k/v biases and no qk_norm", what);
        break;
    case FAMILY_QWEN3:
        /* Qwen3 sets head_dim = 128 on its own (0.6B: 16 x 128 = 2048 > hidden 1024) */
        if (cfg->head_dim != 128) fail_msg("%s: qwen3 head_dim is 128, found %d", what, cfg->head_dim);
        if (cfg->attention_bias || !cfg->qk_norm) fail_msg("%s: qwen3 has qk_norm and no q/k/v biases", what);
        break;
    default:
        break; /* MoE families: checked by their own tests */
    }
    if (cfg->rope_scaling.enabled) {
        const RopeScaling *r = &cfg->rope_scaling;
        if (!(r->factor > 1) || !(r->low_freq_factor > 0) || !(r->high_freq_factor > r->low_freq_factor) ||
            r->original_max_position_embeddings <= 0 ||
            r->original_max_position_embeddings >= cfg->max_position_embeddings)
            fail_msg("%s: llama3 rope_scaling needs factor > 1, 0 < low < high and original_max_position_"
                     "embeddings below max_position_embeddings",
                     what);
    }
}

/* Every file in configs/ loads and is consistent; every dense one has a
 * published count above (so a new config cannot skip the count check). */
static void test_every_config_loads_and_is_consistent(void **state) {
    (void)state;
    char pattern[MT_PATH_MAX];
    snprintf(pattern, sizeof pattern, "%s/*.yaml", config_dir());
    glob_t found;
    int rc = glob(pattern, 0, NULL, &found);
    if (rc != 0) fail_msg("no files match %s (run from the repository root or set MT_CONFIG_DIR)", pattern);
    assert_true(found.gl_pathc >= NUM_PUBLISHED);
    for (size_t i = 0; i < found.gl_pathc; i++) {
        const char *file = strrchr(found.gl_pathv[i], '/') + 1;
        ModelConfig cfg;
        load_config(file, &cfg);
        check_consistent(file, &cfg);
        bool dense = cfg.family == FAMILY_LLAMA || cfg.family == FAMILY_QWEN2 || cfg.family == FAMILY_QWEN3;
        bool listed = false;
        for (size_t j = 0; j < NUM_PUBLISHED; j++) listed |= strcmp(published_counts[j].file, file) == 0;
        if (dense && !listed) fail_msg("%s: add its published parameter count to published_counts", file);
    }
    globfree(&found);
}

/* The rope_scaling values of the Llama 3.1 / 3.2 configs (factor 8 and 32)
 * and their absence in Llama 3 are what the published configs say. */
static void test_llama_rope_scaling(void **state) {
    (void)state;
    static const struct {
        const char *file;
        double factor; /* 0: no rope_scaling */
    } expected[] = {
        {"llama3.2-1b.yaml", 32}, {"llama3.2-3b.yaml", 32}, {"llama3.1-405b.yaml", 8},
        {"llama3-8b.yaml", 0},    {"llama3-70b.yaml", 0},
    };
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
        ModelConfig cfg;
        load_config(expected[i].file, &cfg);
        assert_int_equal(cfg.rope_scaling.enabled, expected[i].factor > 0);
        assert_true(cfg.rope_theta == 500000.0);
        if (expected[i].factor > 0) {
            assert_true(cfg.rope_scaling.factor == expected[i].factor);
            assert_true(cfg.rope_scaling.low_freq_factor == 1.0);
            assert_true(cfg.rope_scaling.high_freq_factor == 4.0);
            assert_int_equal(cfg.rope_scaling.original_max_position_embeddings, 8192);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_config_loads_and_is_consistent),
        cmocka_unit_test(test_published_parameter_counts),
        cmocka_unit_test(test_tied_embeddings_count_once),
        cmocka_unit_test(test_llama_rope_scaling),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
