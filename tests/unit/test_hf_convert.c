/* test_hf_convert.c: the Hugging Face name tables (src/convert/hf_names.c):
 * every registry parameter of every family variant (tied and untied,
 * biases, qk-norm) maps to the name transformers uses and back, pair by
 * pair as written out by hand; names a family lacks are refused; the
 * tables give the order save_pretrained shards in (module order for the
 * dense families, transformers 5's sorted order for the MoE ones).
 * config.json is tested in test_hf_config.c. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "backend/backend.h"
#include "convert/hf_names.h"
#include "model/model.h"
#include "test_tiny_config.h"

/* transformers' per-layer parameter names (modeling_llama / qwen2 / qwen3). */
static const char *const llama_layer[] = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
    "self_attn.o_proj.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
    "mlp.down_proj.weight", NULL};
static const char *const qwen2_extra[] = {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias",
                                          NULL};
static const char *const qwen3_extra[] = {"self_attn.q_norm.weight", "self_attn.k_norm.weight", NULL};

static int in_list(const char *name, int layers, const char *const *a, const char *const *b, bool tied) {
    if (!strcmp(name, "model.embed_tokens.weight") || !strcmp(name, "model.norm.weight")) return 1;
    if (!strcmp(name, "lm_head.weight")) return !tied;
    for (int l = 0; l < layers; l++) {
        char full[160];
        for (const char *const *list = a; list && *list; list++) {
            snprintf(full, sizeof full, "model.layers.%d.%s", l, *list);
            if (!strcmp(full, name)) return 1;
        }
        for (const char *const *list = b; list && *list; list++) {
            snprintf(full, sizeof full, "model.layers.%d.%s", l, *list);
            if (!strcmp(full, name)) return 1;
        }
    }
    return 0;
}

static void check_family(ModelFamily family, bool tied, const char *const *extra) {
    ModelConfig cfg = hf_test_config(family, tied);
    Model *model = model_create(&cfg, &cpu_backend, 1, 1);
    int expected = 2 + (tied ? 0 : 1) + cfg.num_layers * 9;
    for (const char *const *e = extra; e && *e; e++) expected += cfg.num_layers;
    assert_int_equal(model->num_params, expected);
    char (*names)[160] = calloc((size_t)model->num_params, 160);
    for (int p = 0; p < model->num_params; p++) {
        const char *ours = model->param_info[p].name;
        char back[160];
        if (hf_name_from_ours(family, ours, names[p], 160) != 0)
            fail_msg("%s: %s has no HF name", model_family_name(family), ours);
        if (!in_list(names[p], cfg.num_layers, llama_layer, extra, tied))
            fail_msg("%s: %s -> %s, which transformers does not have", model_family_name(family), ours, names[p]);
        assert_int_equal(hf_name_to_ours(family, names[p], back, sizeof back), 0);
        assert_string_equal(back, ours);
        for (int q = 0; q < p; q++)
            if (!strcmp(names[q], names[p])) fail_msg("two parameters map to %s", names[p]);
    }
    free(names);
    model_free(model);
}

static void test_name_tables_cover_registry(void **state) {
    (void)state;
    check_family(FAMILY_LLAMA, false, NULL);
    check_family(FAMILY_LLAMA, true, NULL);
    check_family(FAMILY_QWEN2, false, qwen2_extra);
    check_family(FAMILY_QWEN2, true, qwen2_extra);
    check_family(FAMILY_QWEN3, false, qwen3_extra);
    check_family(FAMILY_QWEN3, true, qwen3_extra);
}

/* Which parameter is which, written out by hand from transformers' modules
 * (a swap of two same-shaped names would pass every other check here). */
static void test_name_pairs(void **state) {
    (void)state;
    static const struct {
        ModelFamily family;
        const char *ours, *hf;
    } pairs[] = {
        {FAMILY_LLAMA, "embed.weight", "model.embed_tokens.weight"},
        {FAMILY_LLAMA, "layers.1.attn_norm.weight", "model.layers.1.input_layernorm.weight"},
        {FAMILY_LLAMA, "layers.1.attn.q_proj.weight", "model.layers.1.self_attn.q_proj.weight"},
        {FAMILY_LLAMA, "layers.1.attn.k_proj.weight", "model.layers.1.self_attn.k_proj.weight"},
        {FAMILY_LLAMA, "layers.1.attn.v_proj.weight", "model.layers.1.self_attn.v_proj.weight"},
        {FAMILY_LLAMA, "layers.1.attn.o_proj.weight", "model.layers.1.self_attn.o_proj.weight"},
        {FAMILY_LLAMA, "layers.1.mlp_norm.weight", "model.layers.1.post_attention_layernorm.weight"},
        {FAMILY_LLAMA, "layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.gate_proj.weight"},
        {FAMILY_LLAMA, "layers.1.mlp.up_proj.weight", "model.layers.1.mlp.up_proj.weight"},
        {FAMILY_LLAMA, "layers.1.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"},
        {FAMILY_LLAMA, "final_norm.weight", "model.norm.weight"},
        {FAMILY_LLAMA, "lm_head.weight", "lm_head.weight"},
        {FAMILY_QWEN2, "layers.0.attn.q_proj.bias", "model.layers.0.self_attn.q_proj.bias"},
        {FAMILY_QWEN2, "layers.0.attn.k_proj.bias", "model.layers.0.self_attn.k_proj.bias"},
        {FAMILY_QWEN2, "layers.0.attn.v_proj.bias", "model.layers.0.self_attn.v_proj.bias"},
        {FAMILY_QWEN2, "layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.gate_proj.weight"},
        {FAMILY_QWEN3, "layers.0.attn.q_norm.weight", "model.layers.0.self_attn.q_norm.weight"},
        {FAMILY_QWEN3, "layers.0.attn.k_norm.weight", "model.layers.0.self_attn.k_norm.weight"},
        {FAMILY_QWEN3, "layers.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"},
        {FAMILY_QWEN3, "embed.weight", "model.embed_tokens.weight"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        char out[160];
        assert_int_equal(hf_name_from_ours(pairs[i].family, pairs[i].ours, out, sizeof out), 0);
        assert_string_equal(out, pairs[i].hf);
        assert_int_equal(hf_name_to_ours(pairs[i].family, pairs[i].hf, out, sizeof out), 0);
        assert_string_equal(out, pairs[i].ours);
    }
}

static int by_position_family;
static int compare_by_position(const void *a, const void *b) {
    long x = hf_name_position((ModelFamily)by_position_family, *(const char *const *)a);
    long y = hf_name_position((ModelFamily)by_position_family, *(const char *const *)b);
    return x < y ? -1 : x > y;
}

/* Sorted by hf_name_position, the names come in transformers' state_dict
 * order (module registration order), which decides where shards split. */
static void test_state_dict_order(void **state) {
    (void)state;
    static const char *const qwen2[] = {
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.bias",
        "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.k_proj.bias",
        "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.v_proj.bias",
        "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
        "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
        "model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.q_proj.bias",
        "model.layers.1.self_attn.k_proj.weight", "model.layers.1.self_attn.k_proj.bias",
        "model.layers.1.self_attn.v_proj.weight", "model.layers.1.self_attn.v_proj.bias",
        "model.layers.1.self_attn.o_proj.weight", "model.layers.1.mlp.gate_proj.weight",
        "model.layers.1.mlp.up_proj.weight", "model.layers.1.mlp.down_proj.weight",
        "model.layers.1.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight",
        "model.norm.weight", "lm_head.weight"};
    static const char *const qwen3_layer[] = {
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
        "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
        "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight"};
    const ModelFamily families[] = {FAMILY_QWEN2, FAMILY_QWEN3, FAMILY_LLAMA};
    for (int f = 0; f < 3; f++) {
        ModelConfig cfg = hf_test_config(families[f], false);
        cfg.num_layers = f == 0 ? 2 : 12; /* 12: layer 10 must not sort before layer 2 */
        Model *model = model_create(&cfg, &cpu_backend, 1, 1);
        char (*names)[160] = calloc((size_t)model->num_params, 160);
        const char **order = calloc((size_t)model->num_params, sizeof *order);
        for (int p = 0; p < model->num_params; p++) {
            assert_int_equal(hf_name_from_ours(families[f], model->param_info[p].name, names[p], 160), 0);
            order[p] = names[p];
        }
        by_position_family = (int)families[f];
        qsort(order, (size_t)model->num_params, sizeof *order, compare_by_position);
        if (f == 0) {
            assert_int_equal(model->num_params, sizeof qwen2 / sizeof qwen2[0]);
            for (int p = 0; p < model->num_params; p++) assert_string_equal(order[p], qwen2[p]);
        } else if (f == 1) {
            assert_string_equal(order[0], "model.embed_tokens.weight");
            for (int l = 0; l < 12; l++)
                for (int k = 0; k < 11; k++) {
                    char want[160];
                    snprintf(want, sizeof want, "model.layers.%d.%s", l, qwen3_layer[k]);
                    assert_string_equal(order[1 + 11 * l + k], want);
                }
            assert_string_equal(order[1 + 11 * 12], "model.norm.weight");
            assert_string_equal(order[2 + 11 * 12], "lm_head.weight");
        } else {
            assert_string_equal(order[1], "model.layers.0.self_attn.q_proj.weight");
            assert_string_equal(order[8], "model.layers.0.input_layernorm.weight");
            assert_string_equal(order[9], "model.layers.0.post_attention_layernorm.weight");
            assert_string_equal(order[10], "model.layers.1.self_attn.q_proj.weight");
        }
        free(order);
        free(names);
        model_free(model);
    }
    assert_int_equal(hf_name_position(FAMILY_LLAMA, "model.layers.0.self_attn.q_proj.bias"), -1);
}

/* Stacked experts: expert e is row block e, named per expert as on the Hub,
 * and written expert after expert (w1, w2, w3 each) as transformers' state_dict. */
static void test_expert_pieces(void **state) {
    (void)state;
    ParamInfo info = {.name = "layers.3.mlp.experts.down_proj.weight", .ndim = 3, .shape = {4, 16, 8}};
    HfPiece pieces[8];
    assert_int_equal(hf_pieces(FAMILY_MIXTRAL, &info, 4, pieces, 8), 4);
    for (int e = 0; e < 4; e++) {
        char want[160];
        snprintf(want, sizeof want, "model.layers.3.block_sparse_moe.experts.%d.w2.weight", e);
        assert_string_equal(pieces[e].name, want);
        assert_int_equal(pieces[e].offset, 16 * 8 * e);
        assert_int_equal(pieces[e].ndim, 2);
        assert_int_equal(pieces[e].shape[0], 16);
        assert_int_equal(pieces[e].shape[1], 8);
    }
    char back[160];
    assert_int_equal(hf_name_to_ours(FAMILY_MIXTRAL, pieces[2].name, back, sizeof back), 0);
    assert_string_equal(back, info.name);
    ParamInfo up = {.name = "layers.3.mlp.experts.up_proj.weight", .ndim = 3, .shape = {4, 16, 8}};
    HfPiece up_pieces[8];
    assert_int_equal(hf_pieces(FAMILY_QWEN3_MOE, &up, 4, up_pieces, 8), 4);
    assert_string_equal(up_pieces[1].name, "model.layers.3.mlp.experts.1.up_proj.weight");
    /* save order (transformers 5, sorted by the fused names): every expert's
     * w2 (down_proj), then every w1 (gate), then every w3 (up), then the router */
    assert_true(hf_name_position(FAMILY_MIXTRAL, "model.layers.3.block_sparse_moe.experts.1.w1.weight") <
                hf_name_position(FAMILY_MIXTRAL, "model.layers.3.block_sparse_moe.experts.0.w3.weight"));
    assert_true(hf_name_position(FAMILY_MIXTRAL, "model.layers.3.block_sparse_moe.experts.3.w2.weight") <
                hf_name_position(FAMILY_MIXTRAL, "model.layers.3.block_sparse_moe.experts.0.w1.weight"));
    assert_true(hf_name_position(FAMILY_MIXTRAL, "model.layers.3.block_sparse_moe.experts.3.w3.weight") <
                hf_name_position(FAMILY_MIXTRAL, "model.layers.3.block_sparse_moe.gate.weight"));
    assert_true(hf_name_position(FAMILY_MIXTRAL, "model.layers.3.self_attn.v_proj.weight") <
                hf_name_position(FAMILY_MIXTRAL, "model.layers.4.input_layernorm.weight"));
    /* a stack of another number of experts than the config's */
    assert_int_equal(hf_pieces(FAMILY_MIXTRAL, &info, 3, pieces, 8), -1);
}

/* The MoE families in the order transformers 5's save_pretrained writes
 * them (revert_weight_conversion sorts the state_dict by dot_natural_key of
 * the fused names, then splits each fused tensor expert by expert). The
 * lists are what save_pretrained of MixtralForCausalLM / Qwen3MoeForCausalLM
 * (transformers 5.23.0) put into its shards, in order, for 2 layers of 3
 * experts; 11 layers check that layer 10 comes after layer 9, 12 experts
 * that expert 10 comes after expert 9. */
static void test_moe_save_order(void **state) {
    (void)state;
    static const char *const mixtral_layer[] = {
        "input_layernorm.weight",
        "block_sparse_moe.experts.{E}.w2.weight", "block_sparse_moe.experts.{E}.w1.weight",
        "block_sparse_moe.experts.{E}.w3.weight", "block_sparse_moe.gate.weight",
        "post_attention_layernorm.weight", "self_attn.k_proj.weight", "self_attn.o_proj.weight",
        "self_attn.q_proj.weight", "self_attn.v_proj.weight"};
    static const char *const qwen3_moe_layer[] = {
        "input_layernorm.weight",
        "mlp.experts.{E}.down_proj.weight", "mlp.experts.{E}.gate_proj.weight", "mlp.experts.{E}.up_proj.weight",
        "mlp.gate.weight", "post_attention_layernorm.weight", "self_attn.k_norm.weight", "self_attn.k_proj.weight",
        "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.q_proj.weight", "self_attn.v_proj.weight"};
    const struct {
        ModelFamily family;
        const char *const *layer;
        int per_layer, layers, experts;
    } cases[] = {
        {FAMILY_MIXTRAL, mixtral_layer, 10, 11, 3},
        {FAMILY_QWEN3_MOE, qwen3_moe_layer, 12, 2, 12},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char (*want)[160] = calloc(4096, 160);
        int n = 0;
        snprintf(want[n++], 160, "lm_head.weight");
        snprintf(want[n++], 160, "model.embed_tokens.weight");
        for (int l = 0; l < cases[c].layers; l++)
            for (int k = 0; k < cases[c].per_layer; k++) {
                const char *pattern = cases[c].layer[k], *e = strstr(pattern, "{E}");
                for (int x = 0; x < (e ? cases[c].experts : 1); x++, n++) {
                    if (e)
                        snprintf(want[n], 160, "model.layers.%d.%.*s%d%s", l, (int)(e - pattern), pattern, x, e + 3);
                    else
                        snprintf(want[n], 160, "model.layers.%d.%s", l, pattern);
                }
            }
        snprintf(want[n++], 160, "model.norm.weight");
        for (int i = 0; i + 1 < n; i++) {
            long a = hf_name_position(cases[c].family, want[i]), b = hf_name_position(cases[c].family, want[i + 1]);
            if (!(a >= 0 && a < b)) fail_msg("%s: '%s' (%ld) must come before '%s' (%ld)",
                                             model_family_name(cases[c].family), want[i], a, want[i + 1], b);
        }
        free(want);
    }
    /* the dense families keep module order (transformers 4, and a transformers 5 model built in Python) */
    assert_true(hf_name_position(FAMILY_LLAMA, "model.layers.0.self_attn.q_proj.weight") <
                hf_name_position(FAMILY_LLAMA, "model.layers.0.input_layernorm.weight"));
    assert_true(hf_name_position(FAMILY_LLAMA, "model.norm.weight") <
                hf_name_position(FAMILY_LLAMA, "lm_head.weight"));
}

static void test_name_table_refusals(void **state) {
    (void)state;
    char out[160];
    assert_int_equal(hf_name_from_ours(FAMILY_LLAMA, "layers.0.attn.q_proj.bias", out, sizeof out), -1);
    assert_int_equal(hf_name_from_ours(FAMILY_LLAMA, "layers.0.attn.q_norm.weight", out, sizeof out), -1);
    assert_int_equal(hf_name_from_ours(FAMILY_QWEN2, "layers.0.attn.k_norm.weight", out, sizeof out), -1);
    assert_int_equal(hf_name_from_ours(FAMILY_QWEN3, "layers.0.attn.v_proj.bias", out, sizeof out), -1);
    /* a stack of experts is several HF tensors: hf_pieces, not one name */
    assert_int_equal(hf_name_from_ours(FAMILY_MIXTRAL, "layers.0.mlp.experts.up_proj.weight", out, sizeof out), -1);
    assert_int_equal(hf_name_from_ours(FAMILY_MIXTRAL, "layers.0.mlp.router.expert_bias", out, sizeof out), -1);
    assert_int_equal(hf_name_to_ours(FAMILY_MIXTRAL, "model.layers.0.block_sparse_moe.experts.01.w1.weight", out,
                                     sizeof out), -1);
    assert_int_equal(hf_name_to_ours(FAMILY_LLAMA, "model.layers.0.self_attn.q_proj.bias", out, sizeof out), -1);
    assert_int_equal(hf_name_to_ours(FAMILY_LLAMA, "model.layers.01.mlp.up_proj.weight", out, sizeof out), -1);
    assert_int_equal(hf_name_to_ours(FAMILY_LLAMA, "model.layers.-1.mlp.up_proj.weight", out, sizeof out), -1);
    assert_int_equal(hf_name_to_ours(FAMILY_LLAMA, "model.layers..mlp.up_proj.weight", out, sizeof out), -1);
    assert_int_equal(hf_name_to_ours(FAMILY_LLAMA, "model.layers.0.mlp.up_proj.weight.x", out, sizeof out), -1);
    assert_int_equal(hf_name_to_ours(FAMILY_LLAMA, "model.layers.0.self_attn.rotary_emb.inv_freq", out, sizeof out), -1);
    assert_int_equal(hf_name_to_ours(FAMILY_QWEN3, "lm_head.bias", out, sizeof out), -1);
    assert_int_equal(hf_name_to_ours(FAMILY_QWEN2, "model.layers.12.self_attn.v_proj.bias", out, sizeof out), 0);
    assert_string_equal(out, "layers.12.attn.v_proj.bias");
    assert_int_equal(hf_name_from_ours(FAMILY_QWEN3, "layers.123.attn.q_norm.weight", out, sizeof out), 0);
    assert_string_equal(out, "model.layers.123.self_attn.q_norm.weight");
    char tiny[8];
    assert_int_equal(hf_name_from_ours(FAMILY_LLAMA, "final_norm.weight", tiny, sizeof tiny), -1); /* no room */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_name_tables_cover_registry),
        cmocka_unit_test(test_name_pairs),
        cmocka_unit_test(test_state_dict_order),
        cmocka_unit_test(test_name_table_refusals),
        cmocka_unit_test(test_expert_pieces),
        cmocka_unit_test(test_moe_save_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
