/* test_peft_config.c: PEFT's adapter_config.json read and written
 * (src/convert/peft_config.c): what PEFT 0.21 saved for the parity fixture
 * (tests/fixtures/peft/llama/adapter), PEFT's defaults and spellings
 * ("all-linear" as written and as PEFT saves it, expanded to paths; its
 * suffix match; null for unset), lora_dropout read as 0 with a note, every
 * setting that would make PEFT compute something else refused naming the
 * key and what was found (known ones with the reason, unknown ones unless at
 * a default that changes nothing), and what peft_config_to_json writes read
 * back as the same PeftConfig. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "convert/peft_config.h"

static char err[1024], note[512], base[256];

static int parse(const char *text, PeftConfig *out) {
    err[0] = note[0] = base[0] = '\0';
    return peft_config_parse(text, strlen(text), "adapter_config.json", 4, out, base, sizeof base, note, sizeof note,
                             err, sizeof err);
}

/* text is refused with a message holding `expected` */
static void refused(const char *text, const char *expected) {
    PeftConfig peft;
    if (parse(text, &peft) == 0) fail_msg("accepted: %s", text);
    if (!strstr(err, expected)) fail_msg("for %s\n  the message: %s\n  lacks: %s", text, err, expected);
    if (strncmp(err, "adapter_config.json: ", 21) != 0) fail_msg("the message does not name the file: %s", err);
}

static void test_peft_saved(void **state) {
    (void)state;
    PeftConfig peft;
    if (peft_config_read("tests/fixtures/peft/llama/adapter/adapter_config.json", 2, &peft, base, sizeof base, note,
                         sizeof note, err, sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(peft.type, PEFT_LORA);
    assert_int_equal(peft.rank, 4);
    assert_true(peft.alpha == 8);
    assert_int_equal(peft.targets, LORA_ALL_TARGETS); /* listed in another order than ours */
    assert_true(peft.dropout == 0);
    assert_string_equal(base, ""); /* null */
    assert_string_equal(note, "");
    if (peft_config_read("tests/fixtures/peft/qwen3/adapter/adapter_config.json", 2, &peft, NULL, 0, NULL, 0, err,
                         sizeof err) != 0)
        fail_msg("%s", err);
    assert_int_equal(peft.targets, 1u << LORA_Q | 1u << LORA_V | 1u << LORA_O | 1u << LORA_UP | 1u << LORA_DOWN);
    assert_true(peft.alpha == 12);
}

static void test_defaults_and_spellings(void **state) {
    (void)state;
    PeftConfig peft;
    /* r and lora_alpha absent: PEFT's defaults (8, 8); "all-linear"; a Hub name as the base */
    assert_int_equal(parse("{\"peft_type\": \"LORA\", \"target_modules\": \"all-linear\", \"task_type\": null, "
                           "\"base_model_name_or_path\": \"meta-llama/Llama-3.2-1B\", \"use_dora\": false, "
                           "\"rank_pattern\": {}, \"modules_to_save\": null, \"layers_to_transform\": null, "
                           "\"some_future_option\": null}",
                           &peft),
                     0);
    assert_int_equal(peft.rank, 8);
    assert_true(peft.alpha == 8);
    assert_int_equal(peft.targets, LORA_ALL_TARGETS);
    assert_string_equal(base, "meta-llama/Llama-3.2-1B");
    /* lora_dropout is a training setting: read as 0, and said */
    assert_int_equal(parse("{\"peft_type\": \"LORA\", \"r\": 16, \"lora_alpha\": 32.5, \"lora_dropout\": 0.05, "
                           "\"target_modules\": [\"q_proj\", \"v_proj\", \"q_proj\"]}",
                           &peft),
                     0);
    assert_int_equal(peft.rank, 16);
    assert_true(peft.alpha == 32.5);
    assert_true(peft.dropout == 0);
    assert_int_equal(peft.targets, 1u << LORA_Q | 1u << LORA_V);
    assert_string_equal(note, "lora_dropout 0.05 is read as 0: megatrain's LoRA has no dropout (it changes training "
                              "only, not what the adapters compute)");
    /* "all-linear" as PEFT saves it, expanded to every projection's path in every layer (here 4), in its order */
    char text[4096] = "{\"peft_type\": \"LORA\", \"target_modules\": [";
    for (int l = 3; l >= 0; l--)
        for (int t = 0; t < LORA_NUM_TARGETS; t++)
            snprintf(text + strlen(text), sizeof text - strlen(text), "%s\"model.layers.%d.%s.%s\"",
                     l == 3 && t == 0 ? "" : ", ", l, t <= LORA_O ? "self_attn" : "mlp",
                     lora_target_name((LoraTarget)t));
    strcat(text, "]}");
    assert_int_equal(parse(text, &peft), 0);
    assert_int_equal(peft.targets, LORA_ALL_TARGETS);
    /* PEFT's suffix match: a projection by its block's path, by its layer's, or both; "all-linear" in any case */
    assert_int_equal(parse("{\"peft_type\": \"LORA\", \"target_modules\": [\"self_attn.q_proj\", \"mlp.down_proj\", "
                           "\"0.mlp.up_proj\", \"layers.1.mlp.up_proj\", \"2.mlp.up_proj\", \"model.layers.3.mlp.up_proj\"]}",
                           &peft),
                     0);
    assert_int_equal(peft.targets, 1u << LORA_Q | 1u << LORA_DOWN | 1u << LORA_UP);
    assert_int_equal(parse("{\"peft_type\": \"LORA\", \"target_modules\": \"ALL-LINEAR\"}", &peft), 0);
    assert_int_equal(peft.targets, LORA_ALL_TARGETS);
    /* keys that change nothing at any value; unknown keys at their defaults; plain initialisations; a repeated key
     * counts as its last, as Python reads it */
    assert_int_equal(parse("{\"peft_type\": \"LORA\", \"target_modules\": [\"v_proj\"], \"peft_version\": \"0.99\", "
                           "\"inference_mode\": false, \"megatron_core\": \"megatron.core\", \"qalora_group_size\": 16, "
                           "\"loftq_config\": {}, \"future_flag\": false, \"modules_to_save\": [], \"future_config\": null, "
                           "\"init_lora_weights\": \"Gaussian\", \"eva_config\": {\"rho\": 2.0}, \"corda_config\": null, "
                           "\"use_dora\": true, \"use_dora\": false}",
                           &peft),
                     0);
    assert_int_equal(peft.targets, 1u << LORA_V);
    for (const char *const *init = (const char *const[]){"true", "false", "\"orthogonal\"", "\"eva\"", "\"mica\"", NULL};
         *init; init++) { /* these set A and B only */
        char config[256];
        snprintf(config, sizeof config, "{\"peft_type\": \"LORA\", \"target_modules\": [\"q_proj\"], "
                                        "\"init_lora_weights\": %s}", *init);
        if (parse(config, &peft) != 0) fail_msg("%s: %s", *init, err);
    }
}

static void test_refusals(void **state) {
    (void)state;
    const char *lora = "{\"peft_type\": \"LORA\", \"target_modules\": [\"q_proj\"], ";
    char text[512];
#define WITH(extra) (snprintf(text, sizeof text, "%s%s}", lora, extra), text)
    refused("[1, 2]", "expected a JSON object (PEFT's adapter_config.json), found an array");
    refused("{\"peft_type\": ", "adapter_config.json: line 1, column 15");
    refused("{\"r\": 4}", "peft_type: expected \"LORA\" (megatrain reads LoRA adapters), found nothing");
    refused("{\"peft_type\": \"IA3\"}", "peft_type: expected \"LORA\" (megatrain reads LoRA adapters), found \"IA3\"");
    refused(WITH("\"task_type\": \"SEQ_CLS\""), "task_type: expected \"CAUSAL_LM\" or null");
    refused(WITH("\"r\": 0"), "r: expected a positive number, found 0");
    refused(WITH("\"r\": 2.5"), "r: expected a positive integer, found 2.5");
    refused(WITH("\"r\": \"8\""), "r: expected a positive number, found \"8\"");
    refused(WITH("\"lora_alpha\": -1"), "lora_alpha: expected a positive number, found -1");
    refused(WITH("\"lora_dropout\": 1.5"), "lora_dropout: expected a number in [0, 1), found 1.5");
    refused(WITH("\"bias\": \"all\""), "bias: expected \"none\" (megatrain's LoRA has no biases of its own), found \"all\"");
    refused(WITH("\"use_rslora\": true"), "use_rslora: expected false (rank-stabilised LoRA scales by lora_alpha / "
                                          "sqrt(r), megatrain by lora_alpha / r), found true");
    refused(WITH("\"use_dora\": true"), "use_dora: expected false (");
    refused(WITH("\"fan_in_fan_out\": true"), "fan_in_fan_out: expected false (");
    refused(WITH("\"lora_bias\": true"), "lora_bias: expected false (");
    refused(WITH("\"rank_pattern\": {\"q_proj\": 4, \"v_proj\": 8}"), "rank_pattern: expected null or empty "
            "(every adapter has rank r in megatrain: a pattern may only repeat r), found an object");
    refused(WITH("\"rank_pattern\": {\"q_proj\": \"4\"}"), "rank_pattern: expected null or empty");
    refused(WITH("\"alpha_pattern\": {\"q_proj\": 16}"), "alpha_pattern: expected null or empty");
    refused(WITH("\"layers_to_transform\": [0, 1]"), "layers_to_transform: expected null (megatrain adapts "
                                                     "every layer: a list may only name them all), found an array");
    refused(WITH("\"layers_to_transform\": [0, 1, 2, 2]"), "layers_to_transform: expected null");
    refused(WITH("\"layers_to_transform\": [0, 1, 2, 3.5]"), "layers_to_transform: expected null");
    refused(WITH("\"layers_to_transform\": [0, 1, 2, 3, 4]"), "layers_to_transform: expected null");
    refused(WITH("\"layers_to_transform\": 3"), "layers_to_transform: expected null (megatrain adapts every "
                                                "layer: a list may only name them all), found 3");
    /* what megatrain does anyway: r and lora_alpha (PEFT's defaults, 8 and 8) repeated, every one of the base's 4
     * layers listed */
    PeftConfig peft;
    assert_int_equal(parse(WITH("\"rank_pattern\": {\"q_proj\": 8, \"layers.1.v_proj\": 8}, \"alpha_pattern\": "
                                "{\"v_proj\": 8.0}, \"layers_to_transform\": [3, 1, 0, 2, 1]"), &peft), 0);
    assert_int_equal(peft.rank, 8);
    refused(WITH("\"modules_to_save\": [\"lm_head\"]"), "modules_to_save: expected null or empty");
    refused(WITH("\"exclude_modules\": \"layers.0\""), "exclude_modules: expected null or empty");
    refused(WITH("\"target_parameters\": [\"w\"]"), "target_parameters: expected null or empty");
    refused(WITH("\"layer_replication\": [[0, 1]]"), "layer_replication: expected null (");
    refused(WITH("\"base_model_name_or_path\": 3"), "base_model_name_or_path: expected a string or null (a name or path "
                                                    "of at most 255 bytes, no NUL), found 3");
    refused(WITH("\"base_model_name_or_path\": \"a\\u0000b\""), "base_model_name_or_path: expected a string or null");
    char long_name[400] = "\"base_model_name_or_path\": \"";
    memset(long_name + strlen(long_name), 'x', 256);
    strcat(long_name, "\"");
    refused(WITH(long_name), "base_model_name_or_path: expected a string or null (a name or path of at most 255 bytes");
    refused("{\"peft_type\": \"LORA\"}", "target_modules: expected a list of q_proj, k_proj, v_proj, o_proj, gate_proj, "
                                         "up_proj, down_proj (or their paths), or \"all-linear\", found nothing");
    refused("{\"peft_type\": \"LORA\", \"target_modules\": []}", "target_modules: expected a list of");
    refused("{\"peft_type\": \"LORA\", \"target_modules\": \".*attn.*\"}",
            "target_modules: expected a list of module names or \"all-linear\" (a regular expression is not read: "
            "list the modules it matches), found \".*attn.*\"");
    refused("{\"peft_type\": \"LORA\", \"target_modules\": [\"q_proj\", \"lm_head\"]}",
            "target_modules[1]: expected a projection LoRA adapts in megatrain, by name (q_proj, k_proj, v_proj, o_proj, "
            "gate_proj, up_proj, down_proj) or path (mlp.down_proj, model.layers.0.mlp.down_proj), found \"lm_head\"");
    refused("{\"peft_type\": \"LORA\", \"target_modules\": [7]}", "target_modules[0]: expected a projection");
    refused("{\"peft_type\": \"LORA\", \"target_modules\": [\"self_attn.down_proj\"]}", "target_modules[0]: expected a "
                                                                                     "projection");
    refused("{\"peft_type\": \"LORA\", \"target_modules\": [\"model.layers.x.mlp.up_proj\"]}", "target_modules[0]: expected");
    refused("{\"peft_type\": \"LORA\", \"target_modules\": [\"model.model.layers.0.mlp.up_proj\"]}", "target_modules[0]");
    refused("{\"peft_type\": \"LORA\", \"target_modules\": [\".q_proj\"]}", "target_modules[0]: expected");
    /* paths name layers: each projection in every layer of the base (4 here) or in none */
    refused("{\"peft_type\": \"LORA\", \"target_modules\": [\"model.layers.4.mlp.up_proj\"]}",
            "target_modules[0]: expected a layer of the base model (it has 4), found \"model.layers.4.mlp.up_proj\"");
    refused("{\"peft_type\": \"LORA\", \"target_modules\": [\"layers.0.mlp.up_proj\", \"1.mlp.up_proj\", \"q_proj\"]}",
            "target_modules: lists up_proj in 2 of the base model's 4 layers: megatrain adapts a projection in every "
            "layer or in none (as layers_to_transform: null)");
    /* initialisations that rewrite the base; LoRA variants; keys this reader does not know */
    refused(WITH("\"init_lora_weights\": \"pissa\""), "init_lora_weights: expected true, false, \"gaussian\", "
                                                    "\"orthogonal\", \"eva\" or \"mica\" (\"pissa\", \"olora\", \"corda\", "
                                                    "\"loftq\", \"lora_ga\" rewrite the base weights");
    refused(WITH("\"init_lora_weights\": \"olora\""), "init_lora_weights: expected true");
    refused(WITH("\"alora_invocation_tokens\": [1, 2]"), "alora_invocation_tokens: expected null "
                                                        "(activated LoRA applies the adapters only after its invocation "
                                                        "tokens), found an array");
    refused(WITH("\"kasa_config\": {\"k\": 1}"), "kasa_config: expected null (a setting this reader does "
                                                 "not know: a LoRA variant, or an option newer than it), found an object");
    refused(WITH("\"use_bdlora\": \"yes\""), "use_bdlora: expected null (");
    /* {} makes PEFT build a variant's default config: off only for the keys whose default it is */
    refused(WITH("\"kasa_config\": {}"), "kasa_config: expected null (a setting this reader does not know");
    refused(WITH("\"arrow_config\": {}"), "arrow_config: expected null (");
    /* a layer's module is named by its index: "01" names none */
    refused("{\"peft_type\": \"LORA\", \"target_modules\": [\"model.layers.01.mlp.up_proj\"]}", "target_modules[0]: expected");
#undef WITH
}

/* What peft_config_to_json writes reads back as the same adapters and base. */
static void test_round_trip(void **state) {
    (void)state;
    const PeftConfig cases[] = {
        {.type = PEFT_LORA, .rank = 4, .alpha = 8, .targets = LORA_ALL_TARGETS},
        {.type = PEFT_LORA, .rank = 64, .alpha = 6.5, .targets = 1u << LORA_DOWN},
        {.type = PEFT_LORA, .rank = 1, .alpha = 1e-3, .targets = 1u << LORA_K | 1u << LORA_GATE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text = peft_config_to_json(&cases[i], i == 1 ? "/data/base model" : NULL);
        PeftConfig back;
        if (parse(text, &back) != 0) fail_msg("%s\n%s", err, text);
        assert_int_equal(back.rank, cases[i].rank);
        assert_true(back.alpha == cases[i].alpha);
        assert_int_equal(back.targets, cases[i].targets);
        assert_string_equal(base, i == 1 ? "/data/base model" : "");
        assert_string_equal(note, "");
        free(text);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peft_saved),
        cmocka_unit_test(test_defaults_and_spellings),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
