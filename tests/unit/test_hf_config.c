/* test_hf_config.c: Hugging Face config.json <-> ModelConfig
 * (src/convert/hf_config*.c): both spellings of RoPE settings (transformers
 * 4's rope_theta + rope_scaling, with "rope_type" or "type", and transformers
 * 5's rope_parameters) read to the same config; a Hub config equals the
 * shipped architecture file; transformers' defaults per model_type; what we
 * write reads back identically; the token ids and generation_config.json;
 * settings our model cannot reproduce, and
 * models transformers cannot hold, are rejected with messages naming them. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "config/recipe.h"
#include "convert/hf_config.h"
#include "core/fs.h"
#include "core/json.h"
#include "test_tiny_config.h"

static ModelConfig parse_ok(const char *text) {
    ModelConfig cfg;
    char err[512];
    if (hf_config_parse(text, strlen(text), "config.json", &cfg, err, sizeof err) != 0) fail_msg("%s", err);
    return cfg;
}

#define BASE_IDS "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 100"

/* Llama 3.2 1B's config, in the transformers 4 and the transformers 5 spelling. */
static const char llama32_v4[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 128000, \"eos_token_id\": 128001, \"head_dim\": 64, \"hidden_act\": \"silu\","
    " \"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 8192,"
    " \"max_position_embeddings\": 131072, \"mlp_bias\": false, \"model_type\": \"llama\","
    " \"num_attention_heads\": 32, \"num_hidden_layers\": 16, \"num_key_value_heads\": 8,"
    " \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 32.0,"
    " \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192,"
    " \"rope_type\": \"llama3\"}, \"rope_theta\": 500000.0, \"tie_word_embeddings\": true,"
    " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.45.0.dev0\", \"use_cache\": true,"
    " \"vocab_size\": 128256}";
static const char llama32_v5[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"dtype\": \"bfloat16\","
    " \"head_dim\": 64, \"hidden_act\": \"silu\", \"hidden_size\": 2048, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 8192, \"max_position_embeddings\": 131072, \"mlp_bias\": false,"
    " \"model_type\": \"llama\", \"num_attention_heads\": 32, \"num_hidden_layers\": 16,"
    " \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, \"rope_parameters\": {\"factor\": 32.0,"
    " \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192,"
    " \"rope_theta\": 500000.0, \"rope_type\": \"llama3\"}, \"tie_word_embeddings\": true,"
    " \"vocab_size\": 128256}";

static void assert_configs_equal(const ModelConfig *a, const ModelConfig *b) {
    assert_int_equal(a->family, b->family);
    assert_int_equal(a->num_layers, b->num_layers);
    assert_int_equal(a->hidden_size, b->hidden_size);
    assert_int_equal(a->intermediate_size, b->intermediate_size);
    assert_int_equal(a->num_attention_heads, b->num_attention_heads);
    assert_int_equal(a->num_key_value_heads, b->num_key_value_heads);
    assert_int_equal(a->head_dim, b->head_dim);
    assert_int_equal(a->vocab_size, b->vocab_size);
    assert_int_equal(a->max_position_embeddings, b->max_position_embeddings);
    assert_true(a->rope_theta == b->rope_theta);
    assert_int_equal(a->rope_scaling.enabled, b->rope_scaling.enabled);
    assert_true(a->rope_scaling.factor == b->rope_scaling.factor);
    assert_true(a->rope_scaling.low_freq_factor == b->rope_scaling.low_freq_factor);
    assert_true(a->rope_scaling.high_freq_factor == b->rope_scaling.high_freq_factor);
    assert_int_equal(a->rope_scaling.original_max_position_embeddings, b->rope_scaling.original_max_position_embeddings);
    assert_true(a->rms_norm_eps == b->rms_norm_eps);
    assert_int_equal(a->tie_word_embeddings, b->tie_word_embeddings);
    assert_int_equal(a->attention_bias, b->attention_bias);
    assert_int_equal(a->qk_norm, b->qk_norm);
    assert_true(a->init_std == b->init_std);
}

static void test_config_llama3_both_spellings(void **state) {
    (void)state;
    ModelConfig v4 = parse_ok(llama32_v4), v5 = parse_ok(llama32_v5);
    assert_int_equal(v4.family, FAMILY_LLAMA);
    assert_int_equal(v4.num_layers, 16);
    assert_int_equal(v4.hidden_size, 2048);
    assert_int_equal(v4.intermediate_size, 8192);
    assert_int_equal(v4.num_attention_heads, 32);
    assert_int_equal(v4.num_key_value_heads, 8);
    assert_int_equal(v4.head_dim, 64);
    assert_int_equal(v4.vocab_size, 128256);
    assert_int_equal(v4.max_position_embeddings, 131072);
    assert_true(v4.rope_theta == 500000.0);
    assert_true(v4.rope_scaling.enabled);
    assert_true(v4.rope_scaling.factor == 32.0);
    assert_true(v4.rope_scaling.low_freq_factor == 1.0);
    assert_true(v4.rope_scaling.high_freq_factor == 4.0);
    assert_int_equal(v4.rope_scaling.original_max_position_embeddings, 8192);
    assert_true(v4.rms_norm_eps == 1e-5);
    assert_true(v4.tie_word_embeddings);
    assert_false(v4.attention_bias);
    assert_false(v4.qk_norm);
    assert_true(v4.init_std == 0.02);
    assert_configs_equal(&v4, &v5);
    /* the older "type" key */
    char old[sizeof llama32_v4 + 8];
    snprintf(old, sizeof old, "%s", llama32_v4);
    char *at = strstr(old, "\"rope_type\"");
    memmove(at + 1, at + 6, strlen(at + 6) + 1); /* "rope_type" -> "type" */
    ModelConfig legacy = parse_ok(old);
    assert_configs_equal(&v4, &legacy);
}

/* The shipped architecture file says what the Hub's config.json says. */
static void test_config_matches_shipped_architecture(void **state) {
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s", __FILE__); /* .../tests/unit/test_hf_convert.c */
    for (int up = 0; up < 3; up++) {
        char *slash = strrchr(path, '/');
        if (slash) *slash = '\0';
        else snprintf(path, sizeof path, ".");
    }
    size_t n = strlen(path);
    snprintf(path + n, sizeof path - n, "/configs/llama3.2-1b.yaml");
    ModelConfig shipped, hub = parse_ok(llama32_v4);
    char err[512];
    memset(&shipped, 0, sizeof shipped);
    if (model_config_load(&shipped, path, err, sizeof err) != 0) fail_msg("%s", err);
    if (shipped.init_std == 0) shipped.init_std = 0.02;
    assert_configs_equal(&shipped, &hub);
}

static void test_config_defaults(void **state) {
    (void)state;
    /* llama with only the required keys: transformers' LlamaConfig defaults */
    ModelConfig c = parse_ok("{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 96,"
                             " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 100}");
    assert_int_equal(c.num_key_value_heads, 4);
    assert_int_equal(c.head_dim, 16);
    assert_int_equal(c.max_position_embeddings, 2048);
    assert_true(c.rope_theta == 10000.0);
    assert_false(c.rope_scaling.enabled);
    assert_true(c.rms_norm_eps == 1e-6);
    assert_false(c.tie_word_embeddings);
    /* qwen2: biases always, head_dim = hidden / heads; rope_parameters "default" */
    c = parse_ok("{\"model_type\": \"qwen2\", \"hidden_size\": 64, \"intermediate_size\": 96,"
                 " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                 " \"vocab_size\": 100, \"use_sliding_window\": false, \"sliding_window\": 4096,"
                 " \"rope_parameters\": {\"rope_theta\": 1000000.0, \"rope_type\": \"default\"}}");
    assert_int_equal(c.family, FAMILY_QWEN2);
    assert_true(c.attention_bias);
    assert_false(c.qk_norm);
    assert_int_equal(c.head_dim, 16);
    assert_int_equal(c.max_position_embeddings, 32768);
    assert_true(c.rope_theta == 1000000.0);
    assert_false(c.rope_scaling.enabled);
    /* qwen3: qk-norm, and head_dim 128 when absent (Qwen3Config's default) */
    c = parse_ok("{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"intermediate_size\": 96,"
                 " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"vocab_size\": 100,"
                 " \"rope_scaling\": null, \"head_dim\": null}");
    assert_int_equal(c.family, FAMILY_QWEN3);
    assert_true(c.qk_norm);
    assert_false(c.attention_bias);
    assert_int_equal(c.head_dim, 128);
}

/* A config.json of only the required keys, per model_type, against what transformers' model makes of it
 * (tests/fixtures/hf/config_defaults.json, by make_config_defaults.py): every key left out is filled as there. */
static void test_config_defaults_of_transformers(void **state) {
    (void)state;
    const char *path = "tests/fixtures/hf/config_defaults.json";
    char err[512];
    size_t len = 0;
    char *text = mt_read_file(path, 1 << 20, &len, err, sizeof err);
    if (!text) fail_msg("%s", err);
    JsonValue *root = json_parse(text, len, err, sizeof err);
    if (!root) fail_msg("%s: %s", path, err);
    const JsonValue *cases = json_get(root, "cases");
    assert_true(cases && cases->count == 8); /* five model types without num_key_value_heads, three with it null */
    for (size_t i = 0; i < cases->count; i++) {
        const JsonValue *k = cases->items[i];
        const char *type = json_get(k, "model_type")->string;
        const JsonValue *given = json_get(k, "config");
        ModelConfig c = parse_ok(given->string);
        const JsonValue *topk = json_get(k, "num_experts_per_tok");
        if (c.rope_theta != json_get(k, "rope_theta")->number || c.rms_norm_eps != json_get(k, "rms_norm_eps")->number ||
            c.max_position_embeddings != (int)json_get(k, "max_position_embeddings")->number ||
            c.num_key_value_heads != (int)json_get(k, "num_key_value_heads")->number ||
            c.head_dim != (int)json_get(k, "head_dim")->number ||
            (topk->type == JSON_NUMBER && c.moe.num_experts_per_tok != (int)topk->number))
            fail_msg("%s: rope_theta %g, rms_norm_eps %g, max_position_embeddings %d, num_key_value_heads %d, "
                     "head_dim %d, num_experts_per_tok %d differ from transformers'", type, c.rope_theta,
                     c.rms_norm_eps, c.max_position_embeddings, c.num_key_value_heads, c.head_dim,
                     c.moe.num_experts_per_tok);
    }
    json_free(root);
    free(text);
}

static void test_config_round_trip(void **state) {
    (void)state;
    const ModelFamily families[] = {FAMILY_LLAMA, FAMILY_QWEN2, FAMILY_QWEN3};
    for (int f = 0; f < 3; f++) {
        for (int variant = 0; variant < 2; variant++) {
            ModelConfig c = hf_test_config(families[f], variant == 1);
            c.head_dim = 8; /* not hidden / heads */
            c.init_std = 0.035;
            c.rope_theta = 500000.0;
            c.rms_norm_eps = 1e-6;
            if (variant == 1) {
                c.rope_scaling = (RopeScaling){true, 8.0, 1.0, 4.0, 8192};
            }
            char err[512];
            assert_int_equal(hf_config_check_exportable(&c, err, sizeof err), 0);
            char *text = hf_config_to_json(&c, "bfloat16");
            ModelConfig back;
            if (hf_config_parse(text, strlen(text), "written", &back, err, sizeof err) != 0) fail_msg("%s\n%s", err, text);
            assert_configs_equal(&c, &back);
            assert_non_null(strstr(text, hf_architecture(families[f])));
            assert_non_null(strstr(text, "\"torch_dtype\": \"bfloat16\""));
            char *again = hf_config_to_json(&back, "bfloat16");
            assert_string_equal(text, again);
            free(again);
            free(text);
        }
    }
}

/* bos_token_id, eos_token_id (an id or a list) and pad_token_id: read as
 * config.json says them, written back in the same form (null when none, so
 * transformers does not fall back to LlamaConfig's bos 1 / eos 2); an id
 * outside the vocabulary is left out; a generation_config.json from them
 * holds the ids that are set, in transformers' layout. */
static void test_config_token_ids(void **state) {
    (void)state;
    ModelConfig c = parse_ok(llama32_v4);
    assert_true(c.token_ids.has_bos && c.token_ids.bos == 128000 && !c.token_ids.has_pad);
    assert_true(c.token_ids.num_eos == 1 && !c.token_ids.eos_is_list && c.token_ids.eos[0] == 128001);
    c = parse_ok(BASE_IDS ", \"bos_token_id\": 1, \"eos_token_id\": [2, 3, 99], \"pad_token_id\": 0}");
    assert_true(c.token_ids.has_bos && c.token_ids.bos == 1 && c.token_ids.has_pad && c.token_ids.pad == 0);
    assert_true(c.token_ids.num_eos == 3 && c.token_ids.eos_is_list && c.token_ids.eos[2] == 99);
    char *text = hf_config_to_json(&c, "float32");
    assert_non_null(strstr(text, "\"bos_token_id\": 1,\n"));
    assert_non_null(strstr(text, "\"eos_token_id\": [\n    2,\n    3,\n    99\n  ],\n"));
    assert_non_null(strstr(text, "\"pad_token_id\": 0,\n"));
    ModelConfig back = parse_ok(text);
    assert_memory_equal(&back.token_ids, &c.token_ids, sizeof c.token_ids);
    free(text);
    char *generation = hf_generation_config_json(&c);
    assert_string_equal(generation, "{\n"
                                    "  \"_from_model_config\": true,\n"
                                    "  \"bos_token_id\": 1,\n"
                                    "  \"eos_token_id\": [\n    2,\n    3,\n    99\n  ],\n"
                                    "  \"output_attentions\": false,\n"
                                    "  \"output_hidden_states\": false,\n"
                                    "  \"pad_token_id\": 0,\n"
                                    "  \"use_cache\": true\n"
                                    "}\n");
    free(generation);
    /* none given (or null, or -1 for none, or beyond the vocabulary): null in config.json, absent in generation_config */
    c = parse_ok(BASE_IDS ", \"bos_token_id\": null, \"pad_token_id\": -1, \"eos_token_id\": 100}");
    assert_false(c.token_ids.has_bos || c.token_ids.has_pad || c.token_ids.num_eos);
    text = hf_config_to_json(&c, "float32");
    assert_non_null(strstr(text, "\"bos_token_id\": null,\n"));
    assert_non_null(strstr(text, "\"eos_token_id\": null,\n"));
    assert_non_null(strstr(text, "\"pad_token_id\": null,\n"));
    free(text);
    generation = hf_generation_config_json(&c);
    assert_null(strstr(generation, "token_id"));
    free(generation);
}

static void expect_config_error(const char *text, const char *message) {
    ModelConfig cfg;
    char err[512] = "";
    if (hf_config_parse(text, strlen(text), "x/config.json", &cfg, err, sizeof err) == 0) fail_msg("accepted: %s", text);
    if (!strstr(err, message)) fail_msg("for %s: message '%s' lacks '%s'", text, err, message);
    if (strncmp(err, "x/config.json: ", 15) != 0) fail_msg("message '%s' does not name the file", err);
}

#define BASE(type) "{\"model_type\": \"" type "\", \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 100"

static void test_config_errors(void **state) {
    (void)state;
    expect_config_error(BASE("gpt2") "}",
                        "model_type 'gpt2' is not a supported family (supported: llama, qwen2, qwen3, mixtral, qwen3_moe)");
    expect_config_error(BASE("mixtral") "}", "missing required key \"num_local_experts\"");
    expect_config_error(BASE("qwen3_moe") ", \"moe_intermediate_size\": 8}", "missing required key \"num_experts\"");
    expect_config_error(BASE("mixtral") ", \"num_local_experts\": 4, \"num_experts_per_tok\": 5}",
                        "num_experts_per_tok: expected at most num_local_experts (4), found 5");
    expect_config_error(BASE("mixtral") ", \"num_local_experts\": 2000}",
                        "num_local_experts: 2000 is too large (expected at most 1024)");
    expect_config_error(BASE("llama") ", \"num_attention_heads\": 1073741824, \"num_key_value_heads\": 1073741824, "
                                      "\"head_dim\": 4}",
                        "num_attention_heads x head_dim (1073741824 x 4) is too large");
    expect_config_error(BASE("mixtral") ", \"num_local_experts\": 4, \"router_jitter_noise\": \"0.1\"}",
                        "router_jitter_noise");
    /* a jitter (training only in transformers) is read as none, with a warning */
    const ModelConfig jittered = parse_ok(BASE("mixtral") ", \"num_key_value_heads\": 2, \"num_local_experts\": 4, \"router_jitter_noise\": 0.1}");
    assert_int_equal(jittered.moe.num_experts, 4);
    expect_config_error(BASE("qwen3_moe") ", \"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8, \"mlp_only_layers\": [5]}",
                        "mlp_only_layers: expected layer indices from 0 to num_hidden_layers - 1 (1), found 5");
    expect_config_error(BASE("qwen3_moe") ", \"num_experts\": 4, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 8, \"mlp_only_layers\": [\"1\"]}",
                        "mlp_only_layers: expected layer indices (integers), found a string");
    expect_config_error(BASE("mixtral") ", \"num_local_experts\": 4, \"sliding_window\": 4096}", "sliding_window");
    expect_config_error("{\"hidden_size\": 64}", "missing \"model_type\"");
    expect_config_error("{\"model_type\": \"llama\", \"hidden_size\": 64}", "missing required key \"intermediate_size\"");
    expect_config_error(BASE("llama") ", \"hidden_size\": \"64\"}", "hidden_size: expected an integer >= 1, found a string");
    expect_config_error(BASE("llama") ", \"num_key_value_heads\": 0}", "num_key_value_heads: expected an integer >= 1, found 0");
    expect_config_error(BASE("llama") ", \"num_key_value_heads\": 3}", "num_attention_heads (4) must be a multiple of num_key_value_heads (3)");
    expect_config_error(BASE("llama") ", \"eos_token_id\": \"</s>\"}", "eos_token_id: expected a token id (an integer) or null");
    expect_config_error(BASE("llama") ", \"eos_token_id\": [1, 2.5]}", "eos_token_id: expected a token id");
    expect_config_error(BASE("llama") ", \"eos_token_id\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}",
                        "eos_token_id: a list of 17 ids, megatrain keeps at most 16");
    expect_config_error(BASE("llama") ", \"hidden_act\": \"gelu\"}", "hidden_act: only \"silu\" is supported, found 'gelu'");
    expect_config_error(BASE("llama") ", \"attention_bias\": true}", "attention_bias: true is not supported");
    expect_config_error(BASE("qwen3") ", \"attention_bias\": true}", "attention_bias: true is not supported");
    expect_config_error(BASE("llama") ", \"mlp_bias\": true}", "mlp_bias: true is not supported");
    expect_config_error(BASE("qwen2") ", \"use_sliding_window\": true}", "use_sliding_window: true is not supported");
    expect_config_error(BASE("llama") ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}}",
                        "rope_scaling: rope_type 'yarn' is not supported (supported: default, llama3)");
    expect_config_error(BASE("llama") ", \"rope_parameters\": {\"rope_type\": \"linear\", \"factor\": 4.0}}",
                        "rope_parameters: rope_type 'linear' is not supported");
    expect_config_error(BASE("llama") ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"low_freq_factor\": 1.0,"
                                      " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}}",
                        "rope_scaling.factor: expected a positive number");
    expect_config_error(BASE("llama") ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 4.0,"
                                      " \"high_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192}}",
                        "high_freq_factor (1) must be greater than low_freq_factor (4)");
    expect_config_error(BASE("llama") ", \"rope_theta\": -1.0}", "rope_theta: expected a positive number");
    expect_config_error(BASE("llama") ", \"head_dim\": 7}", "head_dim: expected a positive even integer, found 7");
    expect_config_error(BASE("llama") ", \"tie_word_embeddings\": 1}", "tie_word_embeddings: expected true or false");
    expect_config_error(BASE("llama") ", \"num_hidden_layers\": 100000}",
                        "num_hidden_layers: 100000 is too large (expected at most 1024)");
    expect_config_error(BASE("llama") ", \"num_hidden_layers\": 1e12}",
                        "num_hidden_layers: 1000000000000 is too large (expected at most 1024)");
    expect_config_error(BASE("llama") ", \"vocab_size\": 1e300}", "vocab_size: 1e+300 is too large (expected at most 2147483647)");
    expect_config_error(BASE("llama") ", \"hidden_size\": 4294967296}",
                        "hidden_size: 4294967296 is too large (expected at most 2147483647)");
    expect_config_error(BASE("llama") ", \"hidden_size\": 64.5}", "hidden_size: expected an integer >= 1, found 64.5");
    expect_config_error("[1, 2]", "expected a JSON object, found an array");
    expect_config_error(BASE("llama") ",}", "x/config.json: line 1, column");

    /* Configs whose weights transformers cannot hold. */
    char err[512];
    ModelConfig c = hf_test_config(FAMILY_LLAMA, false);
    c.attention_bias = true;
    assert_int_equal(hf_config_check_exportable(&c, err, sizeof err), -1);
    assert_non_null(strstr(err, "model.attention_bias"));
    c = hf_test_config(FAMILY_LLAMA, false);
    c.qk_norm = true;
    assert_int_equal(hf_config_check_exportable(&c, err, sizeof err), -1);
    assert_non_null(strstr(err, "model.qk_norm"));
    c = hf_test_config(FAMILY_QWEN2, false);
    c.attention_bias = false;
    assert_int_equal(hf_config_check_exportable(&c, err, sizeof err), -1);
    c = hf_test_config(FAMILY_QWEN3, false);
    c.qk_norm = false;
    assert_int_equal(hf_config_check_exportable(&c, err, sizeof err), -1);
    c = hf_test_config(FAMILY_QWEN3_MOE, false);
    c.qk_norm = true;
    c.moe.num_experts = 4;
    c.moe.num_experts_per_tok = 2;
    c.moe.moe_intermediate_size = 8;
    c.moe.layer_freq = 1;
    c.moe.shared_expert_intermediate_size = 8; /* transformers' Qwen3-MoE has no shared expert */
    assert_int_equal(hf_config_check_exportable(&c, err, sizeof err), -1);
    assert_non_null(strstr(err, "shared_expert_intermediate_size"));
    c.moe.shared_expert_intermediate_size = 0;
    c.moe.score_function = SCORE_SIGMOID;
    assert_int_equal(hf_config_check_exportable(&c, err, sizeof err), -1);
    assert_non_null(strstr(err, "score_function"));
    c.moe.score_function = SCORE_SOFTMAX;
    assert_int_equal(hf_config_check_exportable(&c, err, sizeof err), 0);
    c.moe.load_balancing = LB_EXPERT_BIAS; /* transformers has no expert bias: convert's option drops it */
    assert_int_equal(hf_config_check_exportable(&c, err, sizeof err), -1);
    assert_non_null(strstr(err, "model.moe.load_balancing: expert_bias"));
    assert_non_null(strstr(err, "--drop-expert-bias exports the model without the biases"));
    c.moe.score_function = SCORE_SIGMOID; /* what the option cannot lift is said instead of it */
    assert_int_equal(hf_config_check_exportable(&c, err, sizeof err), -1);
    assert_non_null(strstr(err, "score_function"));
    assert_null(strstr(err, "--drop-expert-bias"));
    c.moe.score_function = SCORE_SOFTMAX;
    c.moe.load_balancing = LB_AUX_LOSS;
    /* Mixtral has no attention biases: refused before anything is written (it failed at the first bias's name) */
    c = hf_test_config(FAMILY_MIXTRAL, false);
    c.moe.num_experts = 4;
    c.moe.num_experts_per_tok = 2;
    c.moe.moe_intermediate_size = c.intermediate_size;
    c.moe.layer_freq = 1;
    c.moe.norm_topk_prob = true;
    assert_int_equal(hf_config_check_exportable(&c, err, sizeof err), 0);
    c.attention_bias = true;
    assert_int_equal(hf_config_check_exportable(&c, err, sizeof err), -1);
    assert_non_null(strstr(err, "model.attention_bias: MixtralForCausalLM has no attention biases"));
    c.moe.load_balancing = LB_EXPERT_BIAS;
    assert_int_equal(hf_config_check_exportable(&c, err, sizeof err), -1);
    assert_non_null(strstr(err, "model.attention_bias: MixtralForCausalLM has no attention biases"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_llama3_both_spellings),
        cmocka_unit_test(test_config_matches_shipped_architecture),
        cmocka_unit_test(test_config_defaults),
        cmocka_unit_test(test_config_defaults_of_transformers),
        cmocka_unit_test(test_config_round_trip),
        cmocka_unit_test(test_config_token_ids),
        cmocka_unit_test(test_config_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
