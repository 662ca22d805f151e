/* test_recipe.c: recipe loading (defaults, batch schedules in both forms,
 * train.tokens, --set overrides, model from a file, token ids), the write/load round
 * trip, and one test per validation error, each checking that the message
 * names the file, the line and the key path. */
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "config/recipe.h"
#include "config/yaml_tree.h"

#define RUN_BLOCK "run:\n  name: unit\n  seed: 7\n"
#define MODEL_BLOCK                                                                                               \
    "model:\n  family: llama\n  num_layers: 2\n  hidden_size: 64\n  intermediate_size: 192\n"                    \
    "  num_attention_heads: 4\n  num_key_value_heads: 2\n  vocab_size: 256\n  max_position_embeddings: 128\n"
#define MOE_BLOCK                                                                                                 \
    "  moe:\n    num_experts: 4\n    num_experts_per_tok: 2\n    moe_intermediate_size: 32\n"                     \
    "    capacity_factor: null\n    layer_freq: [1, 0]\n"
#define TRAIN_BLOCK "train:\n  steps: 100\n  seq_len: 64\n  micro_batch_size: 2\n  global_batch_size: 8\n"
#define OPTIMIZER_BLOCK                                                                                           \
    "optimizer:\n  lr: 3.0e-3\n  min_lr: 3.0e-4\n  betas: [0.9, 0.95]\n  schedule:\n    warmup_steps: 10\n"      \
    "    decay: cosine\n"
#define DATA_BLOCK "data:\n  train: [{path: data/tiny, weight: 1.0}]\n"
#define BASE RUN_BLOCK MODEL_BLOCK "parallel:\n  tp: 1\n" TRAIN_BLOCK OPTIMIZER_BLOCK DATA_BLOCK "checkpoint:\n  compression_level: 3\n"

static char work_dir[256];
static char err[2048];

static const char *write_file(const char *name, const char *text) {
    static char path[4][512];
    static int next;
    char *out = path[next++ % 4];
    snprintf(out, 512, "%s/%s", work_dir, name);
    for (char *slash = strchr(out + strlen(work_dir) + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
        *slash = '\0';
        mkdir(out, 0755);
        *slash = '/';
    }
    FILE *fp = fopen(out, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
    return out;
}

/* BASE with the first `from` replaced by `to` (the test fails if `from` is absent). */
static char *replaced(const char *text, const char *from, const char *to) {
    static char buffers[4][8192];
    static int next;
    char *out = buffers[next++ % 4];
    const char *at = strstr(text, from);
    if (!at) fail_msg("'%s' not in the base recipe", from);
    snprintf(out, sizeof buffers[0], "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    return out;
}

/* 1-based line of the first line of `text` that contains `needle`. */
static int line_of(const char *text, const char *needle) {
    const char *at = strstr(text, needle);
    if (!at) fail_msg("'%s' not in the recipe", needle);
    int line = 1;
    for (const char *p = text; p < at; p++) line += *p == '\n';
    return line;
}

static int load(Recipe *r, const char *text, const char *const *overrides, int n, int world) {
    const char *path = write_file("recipe.yaml", text);
    err[0] = '\0';
    return recipe_load(r, path, overrides, n, world, err, sizeof err);
}

static void load_ok(Recipe *r, const char *text, const char *const *overrides, int n, int world) {
    if (load(r, text, overrides, n, world) != 0) fail_msg("unexpected error: %s", err);
}

/* A run may be the first chunk of a longer schedule (Megatron's --exit-interval): with decay_steps given, warmup may
 * outlast train.steps; a constant schedule has no decay for warmup to end before. */
static void test_schedule_longer_than_the_run(void **state) {
    (void)state;
    Recipe r;
    load_ok(&r, replaced(BASE, "warmup_steps: 10", "warmup_steps: 200\n    decay_steps: 1000"), NULL, 0, 1);
    assert_int_equal(r.optimizer.warmup_steps, 200);
    assert_int_equal(r.optimizer.decay_steps, 1000);
    load_ok(&r, replaced(BASE, "warmup_steps: 10\n    decay: cosine", "warmup_steps: 40\n    decay: constant\n"
                                                                      "    decay_steps: 40"), NULL, 0, 1);
    assert_int_equal(r.optimizer.decay, DECAY_CONSTANT);
}

static void test_defaults(void **state) {
    Recipe r;
    load_ok(&r, BASE, NULL, 0, 1);
    assert_int_equal(r.model.head_dim, 16);
    assert_int_equal(r.model.num_key_value_heads, 2);
    assert_true(r.model.init_std == 0.02 && r.model.rope_theta == 10000.0 && r.model.rms_norm_eps == 1e-5);
    assert_false(r.model.attention_bias || r.model.qk_norm || r.model.rope_scaling.enabled);
    assert_false(r.model.token_ids.has_bos || r.model.token_ids.has_pad || r.model.token_ids.num_eos);
    assert_true(r.parallel.tp == 1 && r.parallel.pp == 1 && r.parallel.vpp == 1 && r.parallel.cp == 1);
    assert_true(r.parallel.ep == 1 && r.parallel.etp == 1);
    assert_int_equal(r.optimizer.decay_steps, 0);
    assert_int_equal(r.optimizer.decay, DECAY_COSINE);
    assert_true(r.optimizer.beta1 == 0.9 && r.optimizer.beta2 == 0.95 && r.optimizer.eps == 1e-8);
    assert_int_equal(r.optimizer.state_dtype, DTYPE_FP32);
    assert_string_equal(r.run.dir, "runs/unit");
    assert_string_equal(r.data.cache_dir, "runs/unit/data-cache");
    assert_string_equal(r.run.device, "cpu");
    assert_int_equal(r.run.seed, 7);
    assert_int_equal(r.logging.interval, 1);
    assert_true(r.logging.tensorboard);
    assert_int_equal(r.checkpoint.interval, 50);
    assert_int_equal(r.checkpoint.keep_last, 2);
    assert_int_equal(r.checkpoint.keep_every, 0);
    assert_true(r.checkpoint.async && r.checkpoint.load_optimizer);
    assert_int_equal(r.checkpoint.compression_level, 3);
    assert_int_equal(r.precision, DTYPE_BF16);
    assert_true(r.data.split[0] == 98 && r.data.split[1] == 2 && r.data.split[2] == 0);
    assert_int_equal(r.data.num_train, 1);
    char cwd[4096], expected[4200];
    assert_non_null(getcwd(cwd, sizeof cwd));
    snprintf(expected, sizeof expected, "%s/data/tiny", cwd); /* relative: from the current directory, absolute */
    assert_string_equal(r.data.train[0].path, expected);
    assert_int_equal(r.data.num_valid, 0);
    assert_int_equal(r.train.num_batch_stages, 1);
    assert_false(r.train.batch_stages_in_tokens);
    assert_true(r.train.batch_stages[0].start == 0 && r.train.batch_stages[0].global_batch_size == 8);
    assert_true(r.train.steps == 100 && r.train.tokens == 0);
    assert_int_equal(recipe_dp_size(&r, 1), 1);

    /* family-implied biases and norms, unless given; run.name from the file */
    load_ok(&r, replaced(replaced(BASE, "family: llama", "family: qwen2"), "  name: unit\n", ""), NULL, 0, 1);
    assert_true(r.model.attention_bias && !r.model.qk_norm);
    assert_string_equal(r.run.name, "recipe");
    assert_string_equal(r.run.dir, "runs/recipe");
    load_ok(&r, replaced(BASE, "family: llama", "family: qwen3"), NULL, 0, 1);
    assert_true(!r.model.attention_bias && r.model.qk_norm);
    load_ok(&r, replaced(BASE, "family: llama", "family: qwen2\n  attention_bias: false"), NULL, 0, 1);
    assert_false(r.model.attention_bias);
    /* min_lr follows lr when not given; split is all train when valid is given */
    load_ok(&r, replaced(replaced(BASE, "  min_lr: 3.0e-4\n", ""), "weight: 1.0}]", "weight: 1.0}]\n  valid: data/val"),
            NULL, 0, 1);
    assert_true(r.optimizer.min_lr == r.optimizer.lr * 0.1);
    assert_int_equal(r.data.num_valid, 1);
    assert_true(r.data.split[0] == 100 && r.data.split[1] == 0);
}

static void test_batch_schedules(void **state) {
    Recipe r;
    load_ok(&r, replaced(BASE, "  global_batch_size: 8\n",
                         "  batch_schedule:\n    - {step: 0, global_batch_size: 8}\n"
                         "    - step: 20\n      global_batch_size: 16\n    - {step: 50, global_batch_size: 32}\n"),
            NULL, 0, 2);
    assert_int_equal(r.train.num_batch_stages, 3);
    assert_false(r.train.batch_stages_in_tokens);
    assert_true(r.train.batch_stages[1].start == 20 && r.train.batch_stages[1].global_batch_size == 16);
    assert_true(r.train.batch_stages[2].start == 50 && r.train.batch_stages[2].global_batch_size == 32);

    load_ok(&r, replaced(BASE, "global_batch_size: 8", "global_batch_size: \"0:16 2.4B:320 4.8B:624\""), NULL, 0, 1);
    assert_true(r.train.batch_stages_in_tokens);
    assert_int_equal(r.train.num_batch_stages, 3);
    assert_true(r.train.batch_stages[1].start == 2400000000.0 && r.train.batch_stages[1].global_batch_size == 320);
    assert_true(r.train.batch_stages[2].start == 4800000000.0 && r.train.batch_stages[2].global_batch_size == 624);

    load_ok(&r, replaced(replaced(BASE, "global_batch_size: 8", "batch_schedule: 0:8 4K:16"), "steps: 100", "tokens: 2.4B"),
            NULL, 0, 1);
    assert_true(r.train.batch_stages_in_tokens && r.train.batch_stages[1].start == 4000);
    assert_true(r.train.tokens == 2400000000.0 && r.train.steps == 0);
}

static void test_overrides(void **state) {
    Recipe r;
    const char *sets[] = {"train.steps=20", "optimizer.betas=[0.9,0.99]", "model.rope_scaling=null",
                          "run.name=over", "parallel.tp=2", "optimizer.schedule.decay=wsd",
                          "optimizer.schedule.wsd_decay_steps=5"};
    const char *text = replaced(BASE, "max_position_embeddings: 128",
                                "max_position_embeddings: 128\n  rope_scaling: {type: llama3, factor: 8}");
    load_ok(&r, text, NULL, 0, 1);
    assert_true(r.model.rope_scaling.enabled && r.model.rope_scaling.factor == 8);
    assert_true(r.model.rope_scaling.high_freq_factor == 4 && r.model.rope_scaling.original_max_position_embeddings == 8192);
    load_ok(&r, text, sets, 7, 2);
    assert_int_equal(r.train.steps, 20);
    assert_true(r.optimizer.beta2 == 0.99);
    assert_false(r.model.rope_scaling.enabled);
    assert_string_equal(r.run.name, "over");
    assert_string_equal(r.run.dir, "runs/over");
    assert_int_equal(r.parallel.tp, 2);
    assert_int_equal(r.optimizer.decay, DECAY_WSD);
    assert_int_equal(r.optimizer.wsd_decay_steps, 5);
    /* null removes a key: steps -> tokens, global batch -> schedule */
    const char *swap[] = {"train.steps=null", "train.tokens=10K", "train.global_batch_size=null",
                          "train.batch_schedule=0:8 4K:16"};
    load_ok(&r, BASE, swap, 4, 1);
    assert_true(r.train.steps == 0 && r.train.tokens == 10000 && r.train.batch_stages_in_tokens);
}

/* Relative data paths and data.cache_dir become absolute, from the current directory ("./" dropped); absolute ones
 * and run.dir (with the default cache_dir under it) stay as given. */
static void test_relative_paths(void **state) {
    (void)state;
    Recipe r;
    char cwd[4096], want[3][4300];
    assert_non_null(getcwd(cwd, sizeof cwd));
    snprintf(want[0], sizeof want[0], "%s/a/b", cwd);
    snprintf(want[1], sizeof want[1], "%s/v", cwd);
    snprintf(want[2], sizeof want[2], "%s/cache", cwd);
    const char *sets[] = {"data.train=[./a/b, {path: /abs/c}]", "data.valid=[.//v]",
                          "data.cache_dir=./cache"};
    load_ok(&r, BASE, sets, 3, 1);
    assert_string_equal(r.data.train[0].path, want[0]);
    assert_string_equal(r.data.train[1].path, "/abs/c");
    assert_string_equal(r.data.valid[0].path, want[1]);
    assert_string_equal(r.data.cache_dir, want[2]);
    assert_string_equal(r.run.dir, "runs/unit");
    load_ok(&r, BASE, NULL, 0, 1);
    assert_string_equal(r.data.cache_dir, "runs/unit/data-cache");
    /* Megatron's --data-path form, weights and prefixes in turn, as one string or a list */
    const char *megatron[][1] = {{"data.train=0.7 /d/a 0.3 /d/b"}, {"data.train=[0.7, /d/a, 0.3, /d/b]"}};
    for (int k = 0; k < 2; k++) {
        load_ok(&r, BASE, megatron[k], 1, 1);
        assert_int_equal(r.data.num_train, 2);
        assert_string_equal(r.data.train[0].path, "/d/a");
        assert_string_equal(r.data.train[1].path, "/d/b");
        assert_true(r.data.train[0].weight == 0.7 && r.data.train[1].weight == 0.3);
    }
    const char *quoted[] = {"data.train=[\"0.5\", /d/a]"}; /* a quoted number is a prefix */
    load_ok(&r, BASE, quoted, 1, 1);
    assert_int_equal(r.data.num_train, 2);
    assert_string_equal(r.data.train[1].path, "/d/a");
    assert_true(r.data.train[1].weight == 0);
    const char *odd[] = {"data.train=[0.7, /d/a, 0.3]"}; /* not that form: a number is no dataset */
    assert_int_not_equal(load(&r, BASE, odd, 1, 1), 0);
    assert_non_null(strstr(err, "data.train: Megatron's --data-path form pairs each weight with a prefix (W1, P1, "
                                "W2, P2, ...): the last weight, '0.3', has none"));
    const char *numeric_prefix[] = {"data.train=[0.5, \"2024\", 0.5, /d/a]"}; /* a prefix may read as a number */
    load_ok(&r, BASE, numeric_prefix, 1, 1);
    assert_int_equal(r.data.num_train, 2);
    assert_true(strstr(r.data.train[0].path, "/2024") && r.data.train[0].weight == 0.5);
    /* the weight after its prefix ("data/english 0.5 data/greek"): not one odd path that no file has */
    const char *after[] = {"data.train=\"/d/a 0.5 /d/b\"", "data.valid=/d/a 0.5"};
    for (int k = 0; k < 2; k++) {
        assert_int_equal(load(&r, BASE, &after[k], 1, 1), -1);
        if (!strstr(err, k ? "data.valid: " : "data.train: ") ||
            !strstr(err, "expected Megatron's --data-path form, which starts with a weight: \"W1 PATH1 W2 PATH2 ...\", "
                         "found the weight '0.5' after the prefix '/d/a'"))
            fail_msg("%s: %s", after[k], err);
    }
    const char *spaced[] = {"data.train=/d/my data"}; /* a prefix with a space and no number in it stays a prefix */
    load_ok(&r, BASE, spaced, 1, 1);
    assert_string_equal(r.data.train[0].path, "/d/my data");
    const char *lone[] = {"data.train=[/d/a, 0.5]"}; /* a number where a prefix goes */
    assert_int_not_equal(load(&r, BASE, lone, 1, 1), 0);
    assert_non_null(strstr(err, "data.train[1]: expected a dataset prefix, found the number 0.5"));
    /* within MT_PATH_MAX as given, too long once joined: an error naming the key, not a cut path */
    char set[1100] = "data.train=";
    memset(set + strlen(set), 'y', 1020);
    set[strlen("data.train=") + 1020] = '\0';
    const char *longer[] = {set};
    assert_int_not_equal(load(&r, BASE, longer, 1, 1), 0);
    assert_non_null(strstr(err, "data.train[0].path: "));
    assert_non_null(strstr(err, "expected a path of at most 1023 characters"));
}

/* Ranks whose recipes differ name the first key that does, its section path and both values. */
static void test_text_difference(void **state) {
    (void)state;
    Recipe a, b;
    load_ok(&a, BASE, NULL, 0, 1);
    const char *sets[] = {"optimizer.schedule.warmup_steps=3"};
    load_ok(&b, BASE, sets, 1, 1);
    size_t na, nb;
    char *ta = recipe_yaml_text(&a, &na), *tb = recipe_yaml_text(&b, &nb), where[512];
    recipe_text_difference(tb, ta, "here", "on rank 0", where, sizeof where);
    assert_string_equal(where, "optimizer.schedule.warmup_steps: '3' here, '10' on rank 0");
    recipe_text_difference(ta, ta, "here", "on rank 0", where, sizeof where);
    assert_string_equal(where, "(no line differs)");
    /* a list's item: named by the list, shown whole */
    Recipe c;
    const char *schedule[] = {"train.global_batch_size=null", "train.batch_schedule=[{step: 0, global_batch_size: 4}, {step: 50, global_batch_size: 8}]"};
    load_ok(&c, BASE, schedule, 2, 1);
    const char *schedule8[] = {"train.global_batch_size=null", "train.batch_schedule=[{step: 0, global_batch_size: 4}, {step: 50, global_batch_size: 16}]"};
    Recipe d;
    load_ok(&d, BASE, schedule8, 2, 1);
    size_t nc, nd;
    char *tc = recipe_yaml_text(&c, &nc), *td = recipe_yaml_text(&d, &nd);
    recipe_text_difference(tc, td, "here", "on rank 0", where, sizeof where);
    assert_string_equal(where, "train.batch_schedule: '- {step: 50, global_batch_size: 8}' here, "
                               "'- {step: 50, global_batch_size: 16}' on rank 0");
    /* every change, key by key, a list's items by index; the watched prefix names the first it meets */
    char changes[1024], hit[256];
    assert_int_equal(recipe_text_changes(ta, tb, changes, sizeof changes, NULL, NULL, 0), 1);
    assert_string_equal(changes, "optimizer.schedule.warmup_steps 10 -> 3");
    assert_int_equal(recipe_text_changes(ta, ta, changes, sizeof changes, NULL, NULL, 0), 0);
    assert_string_equal(changes, "");
    static const char *const watched[] = {"train.batch", NULL};
    assert_int_equal(recipe_text_changes(tc, td, changes, sizeof changes, watched, hit, sizeof hit), 1);
    assert_string_equal(changes, "train.batch_schedule[1] {step: 50, global_batch_size: 8} -> "
                                 "{step: 50, global_batch_size: 16}");
    assert_string_equal(hit, "train.batch_schedule[1]");
    Recipe e;
    const char *three[] = {"train.global_batch_size=null", "train.batch_schedule=[{step: 0, global_batch_size: 4}, "
                           "{step: 50, global_batch_size: 8}, {step: 60, global_batch_size: 16}]", "run.seed=8"};
    load_ok(&e, BASE, three, 3, 1);
    size_t ne;
    char *te = recipe_yaml_text(&e, &ne);
    assert_int_equal(recipe_text_changes(te, tc, changes, sizeof changes, watched, hit, sizeof hit), 2);
    assert_string_equal(changes, "run.seed 8 -> 7; train.batch_schedule[2] {step: 60, global_batch_size: 16} -> (none)");
    free(te);
    /* a value on one side, a list on the other (data.valid null -> a list): one change, the list whole, both ways */
    Recipe v;
    const char *valid[] = {"data.valid=[{path: /d/a, weight: 1.0}, {path: /d/b, weight: 2.0}]", "data.split=[98, 2, 0]"};
    load_ok(&v, BASE, valid, 2, 1);
    size_t nv;
    char *tv = recipe_yaml_text(&v, &nv);
    assert_int_equal(recipe_text_changes(ta, tv, changes, sizeof changes, NULL, NULL, 0), 1);
    assert_string_equal(changes, "data.valid null -> [{path: \"/d/a\", weight: 1}, {path: \"/d/b\", weight: 2}]");
    assert_int_equal(recipe_text_changes(tv, ta, changes, sizeof changes, NULL, NULL, 0), 1);
    assert_string_equal(changes, "data.valid [{path: \"/d/a\", weight: 1}, {path: \"/d/b\", weight: 2}] -> null");
    free(tv);
    /* a line longer than any fixed buffer (a long data path) is compared whole: a difference at its end is seen */
    char long_a[900], long_b[900], dir[700];
    memset(dir, 'd', sizeof dir - 1);
    dir[sizeof dir - 1] = '\0';
    snprintf(long_a, sizeof long_a, "data.train=[{path: %s/a, weight: 1.0}]", dir);
    snprintf(long_b, sizeof long_b, "data.train=[{path: %s/a, weight: 2.0}]", dir);
    const char *la[] = {long_a}, *lb[] = {long_b};
    Recipe f, g;
    load_ok(&f, BASE, la, 1, 1);
    load_ok(&g, BASE, lb, 1, 1);
    size_t nf, ng;
    char *tf = recipe_yaml_text(&f, &nf), *tg = recipe_yaml_text(&g, &ng);
    assert_int_equal(recipe_text_changes(tf, tg, changes, sizeof changes, NULL, NULL, 0), 1);
    assert_non_null(strstr(changes, "weight: 1} -> "));
    recipe_text_difference(tf, tg, "here", "there", where, sizeof where);
    assert_non_null(strstr(where, "data.train: '- {path: "));
    free(tf);
    free(tg);
    free(tc);
    free(td);
    free(ta);
    free(tb);
}

static void test_model_from_file(void **state) {
    Recipe r;
    ModelConfig m;
    char model_path[600];
    /* the model file holds the model keys at the top level, unindented */
    write_file("tree/configs/tiny.yaml",
               "family: qwen3\nnum_layers: 3\nhidden_size: 32\nintermediate_size: 64\nnum_attention_heads: 4\n"
               "head_dim: 16\nvocab_size: 100\nmax_position_embeddings: 64\n");
    write_file("tree/configs/bad.yaml",
               "family: llama\nnum_layers: 3\nhidden_size: 32\nintermediate_size: 64\nnum_attention_heads: 4\n"
               "num_key_value_heads: 3\nvocab_size: 100\nmax_position_embeddings: 64\n");
    const char *text = replaced(replaced(BASE, MODEL_BLOCK, "model: configs/tiny.yaml\n"), "seq_len: 64", "seq_len: 32");
    const char *path = write_file("tree/recipes/tiny/r.yaml", text);
    const char *set[] = {"model.num_layers=6"};
    assert_int_equal(recipe_load(&r, path, set, 1, 1, err, sizeof err), 0);
    assert_true(r.model.family == FAMILY_QWEN3 && r.model.num_layers == 6 && r.model.head_dim == 16 && r.model.qk_norm);
    assert_int_equal(r.model.num_key_value_heads, 4);

    snprintf(model_path, sizeof model_path, "%s/tree/configs/tiny.yaml", work_dir);
    assert_int_equal(model_config_load(&m, model_path, err, sizeof err), 0);
    assert_true(m.num_layers == 3 && m.vocab_size == 100 && m.head_dim == 16);
    /* errors inside a model file name that file and line */
    char expect[700];
    snprintf(model_path, sizeof model_path, "%s/tree/configs/bad.yaml", work_dir);
    assert_int_equal(model_config_load(&m, model_path, err, sizeof err), -1);
    snprintf(expect, sizeof expect, "%s:6: num_key_value_heads: expected a divisor of num_attention_heads (4)", model_path);
    if (!strstr(err, expect)) fail_msg("got: %s", err);
    path = write_file("tree/recipes/tiny/b.yaml", replaced(BASE, MODEL_BLOCK, "model: configs/bad.yaml\n"));
    assert_int_equal(recipe_load(&r, path, NULL, 0, 1, err, sizeof err), -1);
    if (!strstr(err, "configs/bad.yaml:6: model.num_key_value_heads: expected a divisor")) fail_msg("got: %s", err);

    char dir[700];
    /* a --set model=FILE replaces a model file that does not exist (a shipped recipe's ckpt/base/model.yaml) */
    path = write_file("tree/recipes/tiny/missing.yaml", replaced(BASE, MODEL_BLOCK, "model: ckpt/none/model.yaml\n"));
    assert_int_equal(recipe_load(&r, path, NULL, 0, 1, err, sizeof err), -1);
    snprintf(dir, sizeof dir, "model=%s/tree/configs/tiny.yaml", work_dir);
    const char *other_model[] = {dir, "train.seq_len=32"};
    if (recipe_load(&r, path, other_model, 2, 1, err, sizeof err) != 0) fail_msg("got: %s", err);
    assert_true(r.model.family == FAMILY_QWEN3 && r.model.num_layers == 3);
    const char *model_set_last[] = {"train.seq_len=32", "init_from=null", dir}; /* in any order of the --set's */
    if (recipe_load(&r, path, model_set_last, 3, 1, err, sizeof err) != 0) fail_msg("got: %s", err);
    assert_true(r.model.family == FAMILY_QWEN3 && r.model.num_layers == 3);

    /* model: a checkpoint or a Hugging Face directory: where its model config is, or that it needs converting */
    write_file("tree/ckpt/base/model.yaml", "family: llama\n");
    write_file("tree/hf/tiny/config.json", "{}\n");
    snprintf(dir, sizeof dir, "model=%s/tree/ckpt/base", work_dir);
    const char *ckpt_set[] = {dir};
    assert_int_equal(load(&r, BASE, ckpt_set, 1, 1), -1);
    snprintf(expect, sizeof expect, "is a directory; a checkpoint's model config is the file %s/tree/ckpt/base/model.yaml",
             work_dir);
    if (!strstr(err, expect)) fail_msg("got: %s", err);
    snprintf(dir, sizeof dir, "model=%s/tree/hf/tiny", work_dir);
    assert_int_equal(load(&r, BASE, ckpt_set, 1, 1), -1);
    if (!strstr(err, "is a Hugging Face model directory; convert it first (megatrain convert ")) fail_msg("got: %s", err);
    snprintf(dir, sizeof dir, "model=%s/tree/hf/tiny/config.json", work_dir); /* its config.json: the same advice */
    assert_int_equal(load(&r, BASE, ckpt_set, 1, 1), -1);
    snprintf(expect, sizeof expect, "is a Hugging Face config.json; convert its model first (megatrain convert "
             "%s/tree/hf/tiny DST)", work_dir);
    if (!strstr(err, expect)) fail_msg("got: %s", err);
    /* a LoRA checkpoint's model.yaml brings its peft: section: the recipe's peft: unless the recipe has its own */
    write_file("tree/ckpt/lora/model.yaml", "family: qwen3\nnum_layers: 3\nhidden_size: 32\nintermediate_size: 64\n"
                                            "num_attention_heads: 4\nhead_dim: 16\nvocab_size: 100\n"
                                            "max_position_embeddings: 64\npeft:\n  type: lora\n  rank: 4\n  alpha: 12\n");
    snprintf(dir, sizeof dir, "model=%s/tree/ckpt/lora/model.yaml", work_dir);
    const char *lora_set[] = {dir, "train.seq_len=32"};
    if (load(&r, BASE, lora_set, 2, 1) != 0) fail_msg("got: %s", err);
    assert_true(r.model.peft.type == PEFT_LORA && r.model.peft.rank == 4 && r.model.peft.alpha == 12);
    assert_true(r.model.family == FAMILY_QWEN3 && r.model.num_layers == 3);
    if (load(&r, replaced(BASE, "parallel:", "peft: {type: lora, rank: 8, alpha: 16}\nparallel:"), lora_set, 2, 1) != 0)
        fail_msg("got: %s", err);
    assert_true(r.model.peft.rank == 8 && r.model.peft.alpha == 16);
    /* init_from without model: the checkpoint's model.yaml named */
    assert_int_equal(load(&r, replaced(BASE, MODEL_BLOCK, "init_from: ckpt/base\n"), NULL, 0, 1), -1);
    if (!strstr(err, "model: missing required key (the model of init_from ckpt/base is in ckpt/base/model.yaml: give "
                     "model: ckpt/base/model.yaml)"))
        fail_msg("got: %s", err);
}

static void assert_files_equal_after_first_line(const char *a, const char *b) {
    char la[4096], lb[4096];
    FILE *fa = fopen(a, "r"), *fb = fopen(b, "r");
    assert_true(fa && fb);
    int line = 0;
    for (;;) {
        char *ga = fgets(la, sizeof la, fa), *gb = fgets(lb, sizeof lb, fb);
        if (!ga || !gb) {
            assert_true(!ga && !gb);
            break;
        }
        if (line++ > 0 && strcmp(la, lb) != 0) fail_msg("line %d differs:\n%s%s", line, la, lb);
    }
    fclose(fa);
    fclose(fb);
}

#define SAME(field) assert_true(a->field == b->field)
static void assert_recipes_equal(const Recipe *a, const Recipe *b) {
    assert_string_equal(a->run.name, b->run.name);
    assert_string_equal(a->run.dir, b->run.dir);
    assert_string_equal(a->run.device, b->run.device);
    SAME(run.seed);
    const ModelConfig *ma = &a->model, *mb = &b->model;
    assert_true(ma->family == mb->family && ma->num_layers == mb->num_layers && ma->hidden_size == mb->hidden_size);
    assert_true(ma->intermediate_size == mb->intermediate_size && ma->num_attention_heads == mb->num_attention_heads);
    assert_true(ma->num_key_value_heads == mb->num_key_value_heads && ma->head_dim == mb->head_dim);
    assert_true(ma->vocab_size == mb->vocab_size && ma->max_position_embeddings == mb->max_position_embeddings);
    assert_true(ma->rope_theta == mb->rope_theta && ma->rms_norm_eps == mb->rms_norm_eps && ma->init_std == mb->init_std);
    assert_true(ma->tie_word_embeddings == mb->tie_word_embeddings && ma->attention_bias == mb->attention_bias);
    SAME(model.qk_norm);
    SAME(model.rope_scaling.enabled);
    SAME(model.rope_scaling.factor);
    SAME(model.rope_scaling.low_freq_factor);
    SAME(model.rope_scaling.high_freq_factor);
    SAME(model.rope_scaling.original_max_position_embeddings);
    SAME(model.peft.type), SAME(model.peft.rank), SAME(model.peft.alpha), SAME(model.peft.targets);
    SAME(model.peft.dropout);
    const MoeConfig *ea = &ma->moe, *eb = &mb->moe;
    assert_true(ea->num_experts == eb->num_experts && ea->num_experts_per_tok == eb->num_experts_per_tok);
    assert_true(ea->moe_intermediate_size == eb->moe_intermediate_size && ea->norm_topk_prob == eb->norm_topk_prob);
    assert_true(ea->shared_expert_intermediate_size == eb->shared_expert_intermediate_size);
    assert_true(ea->score_function == eb->score_function && ea->load_balancing == eb->load_balancing);
    assert_true(ea->aux_loss_coeff == eb->aux_loss_coeff && ea->z_loss_coeff == eb->z_loss_coeff);
    assert_true(ea->capacity_factor == eb->capacity_factor && ea->layer_freq == eb->layer_freq);
    assert_true(ea->layer_mask_given == eb->layer_mask_given);
    assert_memory_equal(ea->layer_mask, eb->layer_mask, sizeof ea->layer_mask);
    SAME(parallel.tp), SAME(parallel.pp), SAME(parallel.vpp), SAME(parallel.cp), SAME(parallel.ep), SAME(parallel.etp);
    SAME(parallel.sequence_parallel), SAME(parallel.distributed_optimizer), SAME(parallel.num_pp_layers);
    assert_memory_equal(a->parallel.pp_layers, b->parallel.pp_layers, sizeof a->parallel.pp_layers);
    SAME(train.steps), SAME(train.tokens), SAME(train.seq_len), SAME(train.micro_batch_size);
    SAME(train.num_batch_stages), SAME(train.batch_stages_in_tokens), SAME(train.eval_interval), SAME(train.eval_batches);
    for (int i = 0; i < a->train.num_batch_stages; i++) {
        SAME(train.batch_stages[i].start);
        SAME(train.batch_stages[i].global_batch_size);
    }
    SAME(optimizer.lr), SAME(optimizer.min_lr), SAME(optimizer.beta1), SAME(optimizer.beta2), SAME(optimizer.eps);
    SAME(optimizer.weight_decay), SAME(optimizer.clip_grad), SAME(optimizer.state_dtype), SAME(optimizer.warmup_steps);
    SAME(optimizer.decay), SAME(optimizer.decay_steps), SAME(optimizer.wsd_decay_steps), SAME(optimizer.wsd_decay_style);
    SAME(precision);
    SAME(data.num_train), SAME(data.num_valid);
    for (int i = 0; i < a->data.num_train; i++) {
        assert_string_equal(a->data.train[i].path, b->data.train[i].path);
        SAME(data.train[i].weight);
    }
    for (int i = 0; i < a->data.num_valid; i++) {
        assert_string_equal(a->data.valid[i].path, b->data.valid[i].path);
        SAME(data.valid[i].weight);
    }
    SAME(data.num_test);
    for (int i = 0; i < a->data.num_test; i++) {
        assert_string_equal(a->data.test[i].path, b->data.test[i].path);
        SAME(data.test[i].weight);
    }
    SAME(data.split[0]), SAME(data.split[1]), SAME(data.split[2]);
    SAME(optimizer.warmup_fraction), SAME(optimizer.warmup_init);
    SAME(optimizer.weight_decay_end), SAME(optimizer.weight_decay_style);
    assert_string_equal(a->data.cache_dir, b->data.cache_dir);
    SAME(checkpoint.interval), SAME(checkpoint.keep_last), SAME(checkpoint.keep_every), SAME(checkpoint.async);
    SAME(checkpoint.compression_level), SAME(checkpoint.load_optimizer), SAME(logging.interval), SAME(logging.tensorboard);
}

static void round_trip(const char *text, const char *const *sets, int n, int world) {
    Recipe first, second;
    char out1[600], out2[600];
    load_ok(&first, text, sets, n, world);
    snprintf(out1, sizeof out1, "%s/out1.yaml", work_dir);
    snprintf(out2, sizeof out2, "%s/out2.yaml", work_dir);
    if (recipe_write(&first, out1, err, sizeof err) != 0) fail_msg("%s", err);
    if (recipe_load(&second, out1, NULL, 0, world, err, sizeof err) != 0) fail_msg("reloading: %s", err);
    assert_recipes_equal(&first, &second);
    if (recipe_write(&second, out2, err, sizeof err) != 0) fail_msg("%s", err);
    assert_files_equal_after_first_line(out1, out2);
}

static void test_write_round_trip(void **state) {
    round_trip(BASE, NULL, 0, 1);
    const char *odd[] = {"optimizer.lr=0.0030000000000000001", "optimizer.min_lr=1.1e-7", "model.rms_norm_eps=1e-6",
                         "model.rope_scaling={type: llama3, factor: 32, low_freq_factor: 1.5}", "data.valid=[a, {path: b}]", "data.train=[{path: x, weight: 0.7}, {path: y, weight: 0.3}]",
                         "run.name=quote\"me", "optimizer.schedule.decay_steps=80", "data.split=[90.5, 9.5, 0]"};
    round_trip(BASE, odd, 9, 1);
    const char *fraction[] = {"optimizer.schedule.warmup_steps=0", "optimizer.schedule.warmup_fraction=0.03"};
    round_trip(BASE, fraction, 2, 1);
    const char *megatron_schedule[] = {"optimizer.schedule.warmup_init=1.5e-5", "optimizer.weight_decay=0.01",
                                       "optimizer.weight_decay_end=0.1", "optimizer.weight_decay_style=cosine"};
    round_trip(BASE, megatron_schedule, 4, 1);
    const char *test_data[] = {"data.test=[t1, {path: t2}]"};
    round_trip(BASE, test_data, 1, 1);
    Recipe wd;
    load_ok(&wd, BASE, megatron_schedule, 4, 1);
    assert_true(wd.optimizer.warmup_init == 1.5e-5 && wd.optimizer.weight_decay_end == 0.1);
    assert_int_equal(wd.optimizer.weight_decay_style, WD_COSINE);
    const char *tokens[] = {"train.steps=null", "train.tokens=2.4B", "train.global_batch_size=0:16 2.4B:320 4.8B:624"};
    round_trip(BASE, tokens, 3, 1);
    /* Megatron's --rampup-batch-size: written as the stages it makes, which reload the same */
    const char *rampup[] = {"train.global_batch_size=32", "train.rampup_batch_size=[8, 8, 300]"};
    round_trip(BASE, rampup, 2, 1);
    Recipe ramp;
    load_ok(&ramp, BASE, rampup, 2, 1);
    assert_true(ramp.train.batch_stages_in_tokens);
    assert_int_equal(ramp.train.num_batch_stages, 4);
    for (int k = 0; k < 4; k++) /* a stage every 100 samples of seq_len 64 */
        assert_true(ramp.train.batch_stages[k].start == k * 100.0 * 64 &&
                    ramp.train.batch_stages[k].global_batch_size == 8 + 8 * k);
    /* fewer SAMPLES than increments: stages share a threshold (Megatron skips to the later batch), and the stages
     * written reload */
    const char *short_ramp[] = {"train.global_batch_size=32", "train.rampup_batch_size=[8, 8, 2]"};
    round_trip(BASE, short_ramp, 2, 1);
    load_ok(&ramp, BASE, short_ramp, 2, 1); /* thresholds 1, 2, 2 samples: 16 from 1, 32 from 2 (24 never runs) */
    assert_int_equal(ramp.train.num_batch_stages, 3);
    assert_true(ramp.train.batch_stages[1].start == 64.0 && ramp.train.batch_stages[1].global_batch_size == 16);
    assert_true(ramp.train.batch_stages[2].start == 128.0 && ramp.train.batch_stages[2].global_batch_size == 32);
    const char *all[] = {"train.eval_batches=all"}; /* the word is kept, never what it resolves to */
    round_trip(BASE, all, 1, 1);
    Recipe words;
    load_ok(&words, BASE, all, 1, 1);
    assert_int_equal(words.train.eval_batches, MT_EVAL_BATCHES_ALL);
    char written[600];
    snprintf(written, sizeof written, "%s/all.yaml", work_dir);
    if (recipe_write(&words, written, err, sizeof err) != 0) fail_msg("%s", err);
    FILE *fp = fopen(written, "r");
    assert_non_null(fp);
    char line[256];
    bool said = false;
    while (fgets(line, sizeof line, fp)) said = said || strcmp(line, "  eval_batches: all\n") == 0;
    fclose(fp);
    assert_true(said);
    const char *megatron[] = {"train.eval_iters=all"}; /* Megatron's name is answered with the key, as for a count */
    assert_int_equal(load(&words, BASE, megatron, 1, 1), -1);
    if (!strstr(err, "did you mean 'train.eval_batches'")) fail_msg("%s", err);
    const char *moe_text = replaced(replaced(BASE, "family: llama", "family: mixtral"), "max_position_embeddings: 128\n",
                                    "max_position_embeddings: 128\n" MOE_BLOCK);
    const char *moe_sets[] = {"parallel.ep=2", "train.global_batch_size=null",
                              "train.batch_schedule=[{step: 0, global_batch_size: 4}, {step: 7, global_batch_size: 12}]"};
    round_trip(moe_text, moe_sets, 3, 2);
    const char *lora[] = {"peft={type: lora, rank: 8, alpha: 12.5, target_modules: [v_proj, q_proj, down_proj]}"};
    round_trip(BASE, lora, 1, 1);
    Recipe r;
    load_ok(&r, BASE, lora, 1, 1); /* the targets as bits, whatever their order in the list */
    assert_true(r.model.peft.type == PEFT_LORA && r.model.peft.rank == 8 && r.model.peft.alpha == 12.5);
    assert_int_equal(r.model.peft.targets, 1u << LORA_Q | 1u << LORA_V | 1u << LORA_DOWN);
    /* PEFT's module paths of every layer's projection (self_attn.q_proj, mlp.down_proj), as PEFT matches them */
    const char *paths[] = {"peft={type: lora, rank: 8, alpha: 8, target_modules: [self_attn.v_proj, q_proj, mlp.down_proj]}"};
    load_ok(&r, BASE, paths, 1, 1);
    assert_int_equal(r.model.peft.targets, 1u << LORA_Q | 1u << LORA_V | 1u << LORA_DOWN);
    const char *all_linear[] = {"peft={type: lora, rank: 4, alpha: 4, target_modules: all-linear}"};
    load_ok(&r, BASE, all_linear, 1, 1);
    assert_int_equal(r.model.peft.targets, LORA_ALL_TARGETS);
    const char *defaults[] = {"peft={type: lora, rank: 4, alpha: 4}"};
    load_ok(&r, BASE, defaults, 1, 1); /* every linear layer, dropout 0 */
    assert_true(r.model.peft.targets == LORA_ALL_TARGETS && r.model.peft.dropout == 0);
    load_ok(&r, BASE, NULL, 0, 1);
    assert_int_equal(r.model.peft.type, PEFT_NONE);
    const char *none[] = {"peft={type: none}"}; /* no adapters: rank and alpha not needed */
    load_ok(&r, BASE, none, 1, 1);
    assert_int_equal(r.model.peft.type, PEFT_NONE);
    load_ok(&r, moe_text, NULL, 0, 1);
    assert_true(r.model.moe.layer_mask_given && r.model.moe.layer_mask[0] == 1 && r.model.moe.layer_mask[1] == 0);
    assert_true(r.model.moe.num_experts == 4 && r.model.moe.capacity_factor == 0 && r.model.moe.aux_loss_coeff == 1e-2);
}

/* model.bos_token_id, eos_token_id (an id or a list) and pad_token_id: read,
 * kept in their form, written back; 0 is an id, null is none. */
static void test_token_ids(void **state) {
    Recipe r;
    const char *ids[] = {"model.bos_token_id=0", "model.eos_token_id=[5, 6, 255]", "model.pad_token_id=7"};
    load_ok(&r, BASE, ids, 3, 1);
    const SpecialTokenIds *t = &r.model.token_ids;
    assert_true(t->has_bos && t->bos == 0 && t->has_pad && t->pad == 7);
    assert_true(t->num_eos == 3 && t->eos_is_list && t->eos[0] == 5 && t->eos[1] == 6 && t->eos[2] == 255);
    round_trip(BASE, ids, 3, 1);
    const char *one[] = {"model.eos_token_id=9", "model.bos_token_id=null"};
    load_ok(&r, BASE, one, 2, 1);
    assert_true(t->num_eos == 1 && !t->eos_is_list && t->eos[0] == 9 && !t->has_bos && !t->has_pad);
    round_trip(BASE, one, 2, 1);
    const char *list_of_one[] = {"model.eos_token_id=[9]"};
    load_ok(&r, BASE, list_of_one, 1, 1);
    assert_true(t->num_eos == 1 && t->eos_is_list);
    round_trip(BASE, list_of_one, 1, 1);
}

static void test_token_counts_and_names(void **state) {
    double v;
    assert_int_equal(parse_token_count("2.4B", &v), 0);
    assert_true(v == 2400000000.0);
    assert_int_equal(parse_token_count("1.5K", &v), 0);
    assert_true(v == 1500);
    assert_int_equal(parse_token_count("3T", &v), 0);
    assert_true(v == 3e12);
    assert_int_equal(parse_token_count("7M", &v), 0);
    assert_true(v == 7e6);
    assert_int_equal(parse_token_count("123", &v), 0);
    assert_true(v == 123);
    assert_int_equal(parse_token_count("2.4X", &v), -1);
    assert_int_equal(parse_token_count("-1", &v), -1);
    assert_int_equal(parse_token_count("", &v), -1);
    assert_int_equal(parse_token_count("B", &v), -1);
    assert_string_equal(model_family_name(FAMILY_QWEN3_MOE), "qwen3_moe");
    assert_string_equal(model_family_name(FAMILY_QWEN2), "qwen2");
    assert_string_equal(lr_decay_name(DECAY_INVERSE_SQRT), "inverse_sqrt");
    assert_string_equal(wsd_decay_style_name(WSD_MINUS_SQRT), "minus_sqrt");
    assert_string_equal(dtype_name(DTYPE_BF16), "bf16");
    Recipe r;
    load_ok(&r, replaced(BASE, "  tp: 1", "  tp: 2\n  pp: 2"), NULL, 0, 8);
    assert_int_equal(recipe_dp_size(&r, 8), 2);
}

static void test_missing_file_and_override_message(void **state) {
    Recipe r;
    char path[600];
    snprintf(path, sizeof path, "%s/no-such-recipe.yaml", work_dir);
    assert_int_equal(recipe_load(&r, path, NULL, 0, 1, err, sizeof err), -1);
    assert_non_null(strstr(err, path));
    const char *set[] = {"train.stpes=3"};
    assert_int_equal(load(&r, BASE, set, 1, 1), -1);
    assert_string_equal(err, "--set train.stpes=3: unknown key 'train.stpes' (did you mean 'train.steps'?)");
}

/* data.split with shares left out, as Megatron pads them ("99,1" is 99,1,0), in both forms; more than three, or an
 * empty share, refused. Whole numbers are written as such (30, not 3.0e+01). */
static void test_short_split(void **state) {
    (void)state;
    Recipe r;
    const char *forms[][2] = {{"data.split=99,1", "99 1 0"}, {"data.split=[99, 1]", "99 1 0"},
                              {"data.split=100", "100 0 0"}, {"data.split=[7]", "7 0 0"},
                              {"data.split=969/30/1", "969 30 1"}};
    for (int i = 0; i < 5; i++) {
        load_ok(&r, BASE, &forms[i][0], 1, 1);
        char got[64];
        snprintf(got, sizeof got, "%g %g %g", r.data.split[0], r.data.split[1], r.data.split[2]);
        if (strcmp(got, forms[i][1]) != 0) fail_msg("%s: got %s", forms[i][0], got);
    }
    /* a negative share is named in the string form as in the list form */
    const char *negative[] = {"data.split=98,2,-1", "data.split=[98, 2, -1]"};
    for (int i = 0; i < 2; i++)
        if (load(&r, BASE, &negative[i], 1, 1) != -1 || !strstr(err, "data.split: expected weights >= 0, found '-1'"))
            fail_msg("%s: %s", negative[i], err);
    const char *bad[] = {"data.split=1,2,3,4", "data.split=99,", "data.split=[1, 2, 3, 4]", "data.split=,1"};
    for (int i = 0; i < 4; i++)
        if (load(&r, BASE, &bad[i], 1, 1) != -1 || !strstr(err, "data.split")) fail_msg("%s: %s", bad[i], err);
    /* a blend of many shards, as Megatron's --data-path lists them: up to 256 */
    static char many[256 * 16 + 64];
    int at = snprintf(many, sizeof many, "data.train=[");
    for (int i = 0; i < 256; i++) at += snprintf(many + at, sizeof many - (size_t)at, "%ss%d", i ? ", " : "", i);
    snprintf(many + at, sizeof many - (size_t)at, "]");
    const char *many_set[] = {many};
    load_ok(&r, BASE, many_set, 1, 1);
    assert_int_equal(r.data.num_train, 256);
    assert_string_equal(r.data.train[255].path + strlen(r.data.train[255].path) - 4, "s255");
    snprintf(many + at, sizeof many - (size_t)at, ", s256]");
    if (load(&r, BASE, many_set, 1, 1) != -1 || !strstr(err, "expected a list of 1..256 data sources, found 257"))
        fail_msg("%s", err);
    const char *whole[] = {"data.split=969,30,1"};
    load_ok(&r, BASE, whole, 1, 1);
    size_t len = 0;
    char *text = recipe_yaml_text(&r, &len);
    if (!strstr(text, "split: [969, 30, 1]")) fail_msg("%s", text);
    free(text);
}

/* Aliases a recipe may use are expanded; a document that expands past
 * YTREE_MAX_NODES is refused at the line of the alias that crossed it. */
static void test_aliases(void **state) {
    Recipe r;
    const char *text = replaced(replaced(BASE, "lr: 3.0e-3", "lr: &peak 3.0e-3"), "min_lr: 3.0e-4", "min_lr: *peak");
    load_ok(&r, text, NULL, 0, 1);
    assert_true(r.optimizer.lr == 3.0e-3 && r.optimizer.min_lr == 3.0e-3);
    /* [&a [99 scalars], *a x (m - 1), s scalars]: 1 + 100 m + s nodes; exactly the cap, then one more */
    static char doc[262144];
    for (int extra = 0; extra <= 1; extra++) {
        int m = (YTREE_MAX_NODES - 1) / 100, s = YTREE_MAX_NODES - 1 - 100 * m + extra;
        size_t n = (size_t)snprintf(doc, sizeof doc, "[&a [");
        for (int i = 0; i < 99; i++) n += (size_t)snprintf(doc + n, sizeof doc - n, "%sx", i ? "," : "");
        n += (size_t)snprintf(doc + n, sizeof doc - n, "]");
        for (int i = 1; i < m; i++) n += (size_t)snprintf(doc + n, sizeof doc - n, ",*a");
        for (int i = 0; i < s; i++) n += (size_t)snprintf(doc + n, sizeof doc - n, ",y");
        assert_true(n + 2 < sizeof doc);
        snprintf(doc + n, sizeof doc - n, "]");
        YNode *tree = ytree_load_string(doc, "--set x=DOC", err, sizeof err);
        if (!extra) {
            if (!tree) fail_msg("a document of exactly %d nodes was refused: %s", YTREE_MAX_NODES, err);
            assert_int_equal(tree->count, m + s);
            assert_int_equal(tree->entries[m - 1].value->count, 99);
            ytree_free(tree);
        } else {
            assert_null(tree);
            assert_string_equal(err, "--set x=DOC: YAML aliases expand the document past 100000 nodes (each *alias "
                                     "repeats every node of its &anchor); a recipe needs a few hundred");
        }
    }
    /* without aliases the cap is the document's own size */
    size_t n = (size_t)snprintf(doc, sizeof doc, "[");
    for (int i = 0; i < 6000 && n < sizeof doc; i++) /* 17 nodes each */
        n += (size_t)snprintf(doc + n, sizeof doc - n, "[a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p],");
    assert_true(n < sizeof doc);
    doc[n - 1] = ']';
    const char *path = write_file("big.yaml", doc);
    assert_null(ytree_load_file(path, err, sizeof err));
    char want[600];
    snprintf(want, sizeof want, "%s:1: the YAML document has more than 100000 nodes", path);
    if (strncmp(err, want, strlen(want)) != 0) fail_msg("expected '%s...', got: %s", want, err);
}

/* One bad recipe: BASE with `from` replaced by `to` and/or an override, and
 * what its one error message must say: it starts with "FILE:LINE: " for the
 * line holding `at` (or "--set OVERRIDE: " when `at` is NULL) and contains
 * `key` and `says`. */
typedef struct ErrorCase {
    const char *name;
    const char *from, *to;
    const char *set;
    int world;
    const char *at, *key, *says;
} ErrorCase;

/* ten items of x; six nested levels expand to a million nodes (d6 of /work/shared/repro) */
#define TEN(x) "[" x "," x "," x "," x "," x "," x "," x "," x "," x "," x "]"
#define BOMB "l0: &l0 " TEN("x") "\nl1: &l1 " TEN("*l0") "\nl2: &l2 " TEN("*l1") "\nl3: &l3 " TEN("*l2") \
             "\nl4: &l4 " TEN("*l3") "\nl5: &l5 " TEN("*l4") "\nl6: &l6 " TEN("*l5") "\n"
#define SCHEDULE(a, b) "  batch_schedule:\n    - {step: " a ", global_batch_size: 8}\n    - {step: " b ", global_batch_size: 16}\n"
static const ErrorCase error_cases[] = {
    /* unknown keys */
    {"unknown_key_suggests", "  steps: 100", "  stpes: 100", NULL, 1, "stpes", "train.stpes", "did you mean 'train.steps'?"},
    {"unknown_key_lists_valid", "  tp: 1", "  tp: 1\n  banana: 2", NULL, 1, "banana", "parallel.banana",
     "(valid keys in parallel: tp, pp, vpp, cp, ep, etp, sequence_parallel, distributed_optimizer, pp_layers)"},
    {"unknown_section", "parallel:", "paralel:", NULL, 1, "paralel", "'paralel'", "did you mean 'parallel'?"},
    {"unknown_model_key", "vocab_size: 256", "vocab_sise: 256", NULL, 1, "vocab_sise", "model.vocab_sise",
     "did you mean 'model.vocab_size'?"},
    {"unknown_key_in_override", NULL, NULL, "optimizer.schedule.warmup=3", 1, NULL, "optimizer.schedule.warmup",
     "did you mean 'optimizer.schedule.warmup_steps'?"},
    /* Megatron's names (RecipeKey.also), in their section or anywhere */
    {"megatron_name_in_section", "  tp: 1", "  tensor_model_parallel_size: 1", NULL, 1, "tensor_model_parallel_size",
     "parallel.tensor_model_parallel_size", "did you mean 'parallel.tp'?"},
    {"megatron_name_elsewhere", "  steps: 100", "  save_interval: 100", NULL, 1, "save_interval", "train.save_interval",
     "did you mean 'checkpoint.interval'?"},
    {"megatron_name_at_top", NULL, NULL, "train_iters=3", 1, NULL, "'train_iters'", "did you mean 'train.steps'?"},
    /* Megatron's flags a pretraining script carries, with what differs in unit or sense (docs/megatron.md) */
    {"megatron_init_method_std", NULL, NULL, "model.init_method_std=0.01", 1, NULL, "model.init_method_std",
     "did you mean 'model.initializer_range'?"},
    {"megatron_kv_channels", NULL, NULL, "model.kv_channels=16", 1, NULL, "model.kv_channels",
     "did you mean 'model.head_dim'?"},
    {"megatron_eval_iters", NULL, NULL, "train.eval_iters=10", 1, NULL, "train.eval_iters",
     "did you mean 'train.eval_batches'? Megatron's eval_iters counts global batches, megatrain's eval_batches "
     "micro-batches per data-parallel rank: eval_batches = eval_iters x global_batch_size / (micro_batch_size x dp)"},
    {"megatron_untie", NULL, NULL, "model.untie_embeddings_and_output_weights=true", 1, NULL,
     "model.untie_embeddings_and_output_weights", "did you mean 'model.tie_word_embeddings'? "
     "model.tie_word_embeddings is its opposite, and the defaults differ"},
    {"torchtitan_global_batch_minus_one", NULL, NULL, "train.global_batch_size=-1", 1, NULL,
     "train.global_batch_size", "expected a positive integer, found -1 (torchtitan's -1, local_batch_size x dp, is "
     "not taken: give the number, train.micro_batch_size x dp for no gradient accumulation)"},
    /* Megatron's --rampup-batch-size is a key (test_batch_schedule: its stages against Megatron's own ramp) */
    {"megatron_rampup_shape", NULL, NULL, "train.rampup_batch_size=[16,8]", 1, NULL, "train.rampup_batch_size",
     "expected [START, INCREMENT, SAMPLES] as Megatron's --rampup-batch-size"},
    {"megatron_rampup_with_schedule", "  global_batch_size: 8\n", SCHEDULE("0", "20") "  rampup_batch_size: [8, 8, 300]\n",
     NULL, 1, "rampup_batch_size", "train.rampup_batch_size", "found train.batch_schedule beside it, expected "
     "train.global_batch_size, the batch the ramp ends at"},
    {"megatron_rampup_with_token_gbs", "global_batch_size: 8", "global_batch_size: \"0:8 1M:16\"\n  rampup_batch_size: "
     "[8, 8, 300]", NULL, 1, "rampup_batch_size", "train.rampup_batch_size", "found a schedule in "
     "train.global_batch_size (\"0:8 1M:16\"), expected train.global_batch_size a number, the batch the ramp ends at"},
    {"megatron_rampup_increment", "global_batch_size: 8", "global_batch_size: 32\n  rampup_batch_size: [8, 5, 300]",
     NULL, 1, "rampup_batch_size", "train.rampup_batch_size", "INCREMENT (5) to divide their difference (24)"},
    {"megatron_rampup_stage_divides", "global_batch_size: 8", "global_batch_size: 32\n  rampup_batch_size: [4, 4, 30]",
     NULL, 4, "rampup_batch_size", "train.rampup_batch_size", "stage 0 has global batch size 4; expected a multiple "
     "of micro_batch_size * dp = 2 * 4 = 8"},
    {"megatron_step_schedule", NULL, NULL, "train.step_batch_size_schedule='0:8 1K:16'", 1, NULL,
     "train.step_batch_size_schedule", "did you mean 'train.batch_schedule'?"},
    {"megatron_train_samples", NULL, NULL, "train.train_samples=6400", 1, NULL, "train.train_samples",
     "did you mean 'train.tokens'? train.tokens = train_samples x seq_len"},
    {"megatron_warmup_samples", NULL, NULL, "optimizer.schedule.lr_warmup_samples=80", 1, NULL,
     "optimizer.schedule.lr_warmup_samples", "did you mean 'optimizer.schedule.warmup_steps'? megatrain's schedule "
     "counts steps: warmup_steps = lr_warmup_samples / global_batch_size"},
    {"megatron_decay_samples", NULL, NULL, "optimizer.schedule.lr_decay_samples=800", 1, NULL,
     "optimizer.schedule.lr_decay_samples", "did you mean 'optimizer.schedule.decay_steps'?"},
    {"megatron_no_load_optim", NULL, NULL, "checkpoint.no_load_optim=true", 1, NULL, "checkpoint.no_load_optim",
     "did you mean 'checkpoint.load_optimizer'? checkpoint.load_optimizer is its opposite"},
    {"megatron_bf16", NULL, NULL, "bf16=true", 1, NULL, "'bf16'",
     "did you mean 'precision'? Megatron's bf16: true is precision: bf16"},
    {"megatron_recompute_activations", NULL, NULL, "train.recompute_activations=true", 1, NULL,
     "train.recompute_activations", "did you mean 'train.recompute'? Megatron's recompute_activations: true is "
     "train.recompute: selective"},
    {"megatron_layers_per_virtual_stage", NULL, NULL, "parallel.num_layers_per_virtual_pipeline_stage=2", 1, NULL,
     "parallel.num_layers_per_virtual_pipeline_stage", "did you mean 'parallel.vpp'? Megatron's "
     "num_layers_per_virtual_pipeline_stage counts layers, megatrain's vpp virtual stages: vpp = num_layers / (pp x "
     "num_layers_per_virtual_pipeline_stage)"},
    /* their spellings of a value (RecipeKey.value_also): Megatron's decay style, torchtitan's sqrt decay */
    {"megatron_decay_value", NULL, NULL, "optimizer.schedule.decay=inverse-square-root", 1, NULL,
     "optimizer.schedule.decay", "found 'inverse-square-root' (did you mean inverse_sqrt? megatrain's name for "
     "inverse-square-root)"},
    {"torchtitan_sqrt_value", NULL, NULL, "optimizer.schedule.wsd_decay_style=sqrt", 1, NULL,
     "optimizer.schedule.wsd_decay_style", "(did you mean minus_sqrt? megatrain's name for sqrt)"},
    /* torchtitan's names (a second `also` name), and megatrain's own key written in another section */
    {"torchtitan_name", NULL, NULL, "parallel.tensor_parallel_degree=2", 1, NULL, "parallel.tensor_parallel_degree",
     "did you mean 'parallel.tp'?"},
    {"torchtitan_keep", NULL, NULL, "checkpoint.keep_latest_k=2", 1, NULL, "checkpoint.keep_latest_k",
     "did you mean 'checkpoint.keep_last'?"},
    /* torchtitan's sections, and its lr_scheduler keys with what differs in unit */
    /* a --set through a section's other name answers the key at its megatrain path */
    {"torchtitan_training", NULL, NULL, "training.steps=10", 1, NULL, "'training.steps'",
     "did you mean 'train.steps'?"},
    {"torchtitan_training_max_norm", NULL, NULL, "training.max_norm=1", 1, NULL, "'training.max_norm'",
     "did you mean 'optimizer.clip_grad'?"},
    {"torchtitan_parallelism", NULL, NULL, "parallelism.tensor_parallel_degree=2", 1, NULL,
     "'parallelism.tensor_parallel_degree'", "did you mean 'parallel.tp'?"},
    {"torchtitan_metrics", NULL, NULL, "metrics.log_freq=10", 1, NULL, "'metrics.log_freq'",
     "did you mean 'logging.interval'?"},
    {"torchtitan_job", NULL, NULL, "job.dump_folder=out", 1, NULL, "'job.dump_folder'", "did you mean 'run.dir'?"},
    {"torchtitan_lr_scheduler", NULL, NULL, "lr_scheduler.warmup_steps=5", 1, NULL, "'lr_scheduler.warmup_steps'",
     "did you mean 'optimizer.schedule.warmup_steps'? torchtitan's warmup_steps is optimizer.schedule.warmup_steps"},
    {"torchtitan_lr_scheduler_ratio", NULL, NULL, "lr_scheduler.decay_ratio=0.5", 1, NULL,
     "'lr_scheduler.decay_ratio'", "did you mean 'optimizer.schedule.wsd_decay_steps'? torchtitan's decay_ratio is "
     "a fraction of the steps"},
    /* a section of several keys is answered as a section (the keys inside once it is renamed) */
    {"torchtitan_section_in_file", "train:", "training:", NULL, 1, "training", "'training'",
     "did you mean 'train'?"},
    {"torchtitan_decay_ratio", NULL, NULL, "optimizer.schedule.decay_ratio=0.2", 1, NULL,
     "optimizer.schedule.decay_ratio", "did you mean 'optimizer.schedule.wsd_decay_steps'? torchtitan's decay_ratio "
     "is a fraction of the steps, megatrain's a count: wsd_decay_steps = decay_ratio x train.steps"},
    {"torchtitan_decay_ratio_elsewhere", NULL, NULL, "optimizer.decay_ratio=0.2", 1, NULL, "optimizer.decay_ratio",
     "did you mean 'optimizer.schedule.wsd_decay_steps'?"},
    {"torchtitan_decay_type", NULL, NULL, "optimizer.schedule.decay_type=linear", 1, NULL,
     "optimizer.schedule.decay_type", "did you mean 'optimizer.schedule.decay'? torchtitan's decay_type"},
    {"torchtitan_min_lr_factor", NULL, NULL, "optimizer.schedule.min_lr_factor=0.1", 1, NULL,
     "optimizer.schedule.min_lr_factor", "did you mean 'optimizer.min_lr'? torchtitan's min_lr_factor is a factor of "
     "the lr, megatrain's min_lr a rate: min_lr = min_lr_factor x optimizer.lr"},
    {"torchtitan_lr_min", NULL, NULL, "optimizer.lr_min=0.1", 1, NULL, "optimizer.lr_min",
     "did you mean 'optimizer.min_lr'? torchtitan's lr_min is a factor"},
    {"torchtitan_optimizer_name", NULL, NULL, "optimizer.name=AdamW", 1, NULL, "optimizer.name",
     "did you mean 'optimizer.type'? megatrain's one optimizer is adamw"},
    {"torchtitan_shard_degree", NULL, NULL, "parallel.data_parallel_shard_degree=4", 1, NULL,
     "parallel.data_parallel_shard_degree", "megatrain has no FSDP: the data-parallel size is what the launch leaves"},
    {"torchtitan_replicate_degree", NULL, NULL, "parallel.data_parallel_replicate_degree=2", 1, NULL,
     "parallel.data_parallel_replicate_degree", "the data-parallel size is not set, it is what the launch leaves"},
    {"megatron_dp", NULL, NULL, "parallel.dp=2", 1, NULL, "parallel.dp", "the data-parallel size is not set"},
    /* torchtitan's names that depend on their section (model.name is no optimizer.name), have no key, or whose
     * values are spelled otherwise */
    {"torchtitan_model_name", NULL, NULL, "model.name=llama3", 1, NULL, "model.name",
     "did you mean 'model.family'? torchtitan's model.name is the architecture"},
    {"torchtitan_model_family_value", NULL, NULL, "model.family=llama3", 1, NULL, "model.family",
     "did you mean llama? megatrain's name for llama3"},
    {"torchtitan_flavor", NULL, NULL, "model.flavor=debugmodel", 1, NULL, "model.flavor",
     "megatrain has no table of sizes"},
    {"torchtitan_tokenizer_path", NULL, NULL, "model.tokenizer_path=tok", 1, NULL, "model.tokenizer_path",
     "a run reads token ids: `megatrain data build --tokenizer PATH`"},
    {"torchtitan_local_batch_size", NULL, NULL, "train.local_batch_size=2", 1, NULL, "train.local_batch_size",
     "did you mean 'train.micro_batch_size'? torchtitan's local_batch_size is per data-parallel rank"},
    {"torchtitan_pp_microbatch", NULL, NULL, "parallel.pipeline_parallel_microbatch_size=1", 1, NULL,
     "parallel.pipeline_parallel_microbatch_size", "did you mean 'train.micro_batch_size'?"},
    {"torchtitan_pp_schedule", NULL, NULL, "parallel.pipeline_parallel_schedule=1F1B", 1, NULL,
     "parallel.pipeline_parallel_schedule", "the schedule follows parallel.vpp"},
    {"torchtitan_dataset", NULL, NULL, "train.dataset=c4", 1, NULL, "train.dataset",
     "megatrain has no named data sets"},
    {"torchtitan_dataset_path", NULL, NULL, "train.dataset_path=x", 1, NULL, "train.dataset_path",
     "did you mean 'data.train'? data.train is a PREFIX"},
    {"torchtitan_ckpt_enable", NULL, NULL, "checkpoint.enable=true", 1, NULL, "checkpoint.enable",
     "checkpoints are always on"},
    {"torchtitan_ckpt_folder", NULL, NULL, "checkpoint.folder=c", 1, NULL, "checkpoint.folder",
     "checkpoints go to run.dir/checkpoints"},
    {"torchtitan_model_only", NULL, NULL, "checkpoint.last_save_model_only=true", 1, NULL,
     "checkpoint.last_save_model_only", "`megatrain convert RUN_DIR OUT` writes the model alone"},
    {"torchtitan_export_dtype", NULL, NULL, "checkpoint.export_dtype=bfloat16", 1, NULL, "checkpoint.export_dtype",
     "did you mean 'model.export_dtype'? megatrain's model.export_dtype is what `megatrain convert` writes"},
    {"torchtitan_compile", NULL, NULL, "compile.enable=true", 1, NULL, "'compile'", "no torch.compile"},
    {"torchtitan_optimizer_type_case", NULL, NULL, "optimizer.type=AdamW", 1, NULL, "optimizer.type",
     "found 'AdamW' (did you mean adamw?)"},
    {"torchtitan_precision_value", NULL, NULL, "precision=bfloat16", 1, NULL, "precision",
     "did you mean bf16? megatrain's name for bfloat16"},
    {"key_of_another_section", "  steps: 100", "  steps: 100\n  lr: 0.1", NULL, 1, "lr: 0.1", "train.lr",
     "did you mean 'optimizer.lr'?"},
    {"key_at_top", NULL, NULL, "seed=3", 1, NULL, "'seed'", "did you mean 'run.seed'?"},
    {"megatron_load", NULL, NULL, "train.load=ckpt", 1, NULL, "train.load", "`megatrain resume RUN_DIR` continues a "
     "run from its checkpoint; init_from: CKPT starts a new run from a checkpoint's weights"},
    /* two keys at odds, one from the file and one from --set: the --set is blamed (at NULL), the file's key named */
    {"set_blamed_for_warmup", NULL, NULL, "optimizer.schedule.decay_steps=5", 1, NULL,
     "optimizer.schedule.warmup_steps", "expected fewer than optimizer.schedule.decay_steps (5), found 10"},
    {"set_blamed_for_min_lr", NULL, NULL, "optimizer.lr=1e-4", 1, NULL, "optimizer.min_lr",
     "expected at most optimizer.lr (0.0001), found 0.0003"},
    {"file_blamed_without_set", "warmup_steps: 10", "warmup_steps: 10\n    decay_steps: 5", NULL, 1, "warmup_steps",
     "optimizer.schedule.warmup_steps", "expected fewer than optimizer.schedule.decay_steps (5), found 10"},
    {"key_of_two_sections", NULL, NULL, "train.interval=3", 1, NULL, "train.interval",
     "did you mean 'checkpoint.interval' or 'logging.interval'?"},
    /* a choice spelled otherwise only in case or with '-' for '_' (Megatron's WSD) */
    {"choice_spelling", NULL, NULL, "optimizer.schedule.decay=WSD", 1, NULL, "optimizer.schedule.decay",
     "found 'WSD' (did you mean wsd?)"},
    /* wrong types */
    {"string_for_integer", "micro_batch_size: 2", "micro_batch_size: four", NULL, 1, "four", "train.micro_batch_size",
     "expected a positive integer, found 'four'"},
    {"mapping_for_integer", "  seq_len: 64", "  seq_len: {a: 1}", NULL, 1, "seq_len", "train.seq_len", "found a mapping"},
    {"quoted_integer", "hidden_size: 64", "hidden_size: \"64\"", NULL, 1, "hidden_size", "model.hidden_size",
     "found the string \"64\""},
    {"not_a_bool", "max_position_embeddings: 128", "max_position_embeddings: 128\n  tie_word_embeddings: maybe", NULL, 1,
     "maybe", "model.tie_word_embeddings", "expected true or false, found 'maybe'"},
    {"list_for_string", "name: unit", "name: [a, b]", NULL, 1, "name:", "run.name", "expected a string, found a list"},
    {"scalar_for_section", "parallel:\n  tp: 1", "parallel: 4", NULL, 1, "parallel", "parallel",
     "expected a mapping of keys, found '4'"},
    {"override_wrong_type", NULL, NULL, "train.micro_batch_size=zero", 1, NULL, "train.micro_batch_size",
     "expected a positive integer, found 'zero'"},
    /* a number key that takes one word besides (train.eval_batches: all) names it among what it expects */
    {"eval_batches_word", NULL, NULL, "train.eval_batches=every", 1, NULL, "train.eval_batches",
     "expected a positive integer or all, found 'every'"},
    {"eval_batches_typo", NULL, NULL, "train.eval_batches=alll", 1, NULL, "train.eval_batches",
     "expected a positive integer or all, found 'alll' (did you mean all?)"},
    {"eval_batches_zero", NULL, NULL, "train.eval_batches=0", 1, NULL, "train.eval_batches",
     "expected a positive integer or all, found '0'"},
    {"top_level_list", BASE, "- a\n- b\n", NULL, 1, "- a", "(top level)", "expected a mapping of recipe keys"},
    /* values out of range */
    {"negative_lr", "lr: 3.0e-3", "lr: -1.0e-3", NULL, 1, "lr: -1", "optimizer.lr", "expected a number >= 0, found '-1.0e-3'"},
    {"beta_above_one", "[0.9, 0.95]", "[0.9, 1.5]", NULL, 1, "betas", "optimizer.betas", "expected beta2 in [0, 1), found '1.5'"},
    {"beta_count", "[0.9, 0.95]", "[0.9]", NULL, 1, "betas", "optimizer.betas", "expected a list of two numbers"},
    {"micro_batch_zero", "micro_batch_size: 2", "micro_batch_size: 0", NULL, 1, "micro_batch_size",
     "train.micro_batch_size", "expected a positive integer, found '0'"},
    {"seq_len_above_positions", "seq_len: 64", "seq_len: 256", NULL, 1, "seq_len", "train.seq_len",
     "expected at most model.max_position_embeddings (128), found 256"},
    {"vocab_size_zero", "vocab_size: 256", "vocab_size: 0", NULL, 1, "vocab_size", "model.vocab_size",
     "expected a positive integer, found '0'"},
    {"hidden_size_too_large", "hidden_size: 64", "hidden_size: 1e12", NULL, 1, "hidden_size", "model.hidden_size",
     "found '1e12', which is too large (expected at most 2147483647)"},
    {"compression_level_high", "compression_level: 3", "compression_level: 23", NULL, 1, "compression_level",
     "checkpoint.compression_level", "expected an integer in 1..22, found '23'"},
    {"compression_level_zero", "compression_level: 3", "compression_level: 0", NULL, 1, "compression_level",
     "checkpoint.compression_level", "expected an integer in 1..22, found '0'"},
    {"precision_enum", "checkpoint:", "precision: fp16\ncheckpoint:", NULL, 1, "precision", "precision",
     "expected one of fp32 | bf16 | fp8, found 'fp16'"},
    {"family_enum", "family: llama", "family: gpt2", NULL, 1, "family", "model.family",
     "expected one of llama | qwen2 | qwen3 | mixtral | qwen3_moe, found 'gpt2'"},
    {"decay_enum", "decay: cosine", "decay: cosin", NULL, 1, "decay", "optimizer.schedule.decay",
     "expected one of constant | linear | cosine | inverse_sqrt | wsd, found 'cosin'"},
    {"device_enum", "seed: 7", "seed: 7\n  device: tpu", NULL, 1, "device", "run.device", "expected one of cpu | cuda"},
    {"data_weight_zero", "weight: 1.0", "weight: 0", NULL, 1, "weight", "data.train[0].weight",
     "expected a number > 0, found '0'"},
    /* impossible combinations */
    {"heads_not_divisible_by_kv", "num_key_value_heads: 2", "num_key_value_heads: 3", NULL, 1, "num_key_value_heads",
     "model.num_key_value_heads", "expected a divisor of num_attention_heads (4), found 3"},
    {"hidden_not_divisible_by_heads", "hidden_size: 64", "hidden_size: 66", NULL, 1, "hidden_size", "model.hidden_size",
     "expected a multiple of num_attention_heads (4) when head_dim is not given, found 66"},
    {"batch_not_divisible_by_dp", NULL, NULL, NULL, 8, "global_batch_size", "train.global_batch_size",
     "expected a multiple of micro_batch_size * dp = 2 * 8 = 16, found 8 (--set train.micro_batch_size=1 fits at dp 8)"},
    {"batch_fits_no_micro", NULL, NULL, NULL, 16, "global_batch_size", "train.global_batch_size",
     "found 8 (no micro-batch size does at dp 16: launch a number of ranks whose dp divides 8)"},
    {"schedule_stage_not_divisible", "  global_batch_size: 8\n",
     "  batch_schedule:\n    - {step: 0, global_batch_size: 8}\n    - {step: 10, global_batch_size: 10}\n", NULL, 2,
     "step: 10", "train.batch_schedule[1].global_batch_size",
     "stage 1 has global batch size 10; expected a multiple of micro_batch_size * dp = 2 * 2 = 4 (--set "
     "train.micro_batch_size=1 fits at dp 2)"},
    {"world_not_divisible", "  tp: 1", "  tp: 4", NULL, 6, "parallel:", "parallel",
     "expected tp * pp * cp (4 * 1 * 1 = 4) to divide the world size 6"},
    {"tp_not_dividing_heads", "  tp: 1", "  tp: 4", NULL, 4, "tp: 4", "parallel.tp",
     "expected a divisor of num_attention_heads (4) and num_key_value_heads (2), found 4"},
    {"pp_not_dividing_layers", "  tp: 1", "  pp: 4", NULL, 4, "pp: 4", "parallel.pp", "to divide num_layers (2)"},
    {"pp_layers_count", "  tp: 1", "  pp: 2\n  pp_layers: [1, 0, 1]", NULL, 2, "pp_layers", "parallel.pp_layers",
     "expected one layer count per pipeline stage (pp * vpp = 2 * 1 = 2), found 3"},
    {"pp_layers_sum", "  tp: 1", "  pp: 2\n  pp_layers: [1, 2]", NULL, 2, "pp_layers", "parallel.pp_layers",
     "expected the counts to add up to num_layers (2), found 3"},
    {"pp_layers_negative", "  tp: 1", "  pp: 2\n  pp_layers: [3, -1]", NULL, 2, "-1", "parallel.pp_layers",
     "expected item 1 to be a layer count"},
    {"ep_for_dense", "  tp: 1", "  ep: 2", NULL, 2, "ep: 2", "parallel.ep", "expected 1 for the dense family llama"},
    /* expert layouts refused from the recipe, naming the key, before any rank starts */
    {"ep_not_dividing_dp", "family: llama", "family: mixtral\n" MOE_BLOCK, "parallel.ep=4", 2, NULL, "parallel.ep",
     "expected a divisor of dp (world / (tp * cp * pp) = 2 / 1 = 2): the experts are split over data-parallel ranks, "
     "found 4"},
    {"etp_not_tp", "family: llama", "family: mixtral\n" MOE_BLOCK, "parallel.etp=2", 1, NULL, "parallel.etp",
     "expected 1 or tp (1), found 2"},
    {"capacity_with_cp", "family: llama",
     "family: mixtral\n  moe:\n    num_experts: 4\n    num_experts_per_tok: 2\n    moe_intermediate_size: 32\n"
     "    capacity_factor: 1.5\n", "parallel.cp=2", 2, "capacity_factor: 1.5", "model.moe.capacity_factor",
     "not implemented with context parallel (cp 2)"},
    {"min_lr_above_lr", "min_lr: 3.0e-4", "min_lr: 5.0e-3", NULL, 1, "min_lr", "optimizer.min_lr",
     "expected at most optimizer.lr (0.003), found 0.005"},
    {"warmup_above_steps", "warmup_steps: 10", "warmup_steps: 200", NULL, 1, "warmup_steps",
     "optimizer.schedule.warmup_steps", "expected at most train.steps (100), found 200"},
    {"warmup_not_below_decay_steps", "warmup_steps: 10", "warmup_steps: 30\n    decay_steps: 30", NULL, 1,
     "warmup_steps", "optimizer.schedule.warmup_steps",
     "expected fewer than optimizer.schedule.decay_steps (30), found 30 (the lr would drop"},
    {"decay_steps_zero", NULL, NULL, "optimizer.schedule.decay_steps=0", 1, NULL, "optimizer.schedule.decay_steps",
     "expected a positive integer, found '0'"},
    {"wsd_decay_above_steps", "decay: cosine", "decay: wsd\n    wsd_decay_steps: 150", NULL, 1, "wsd_decay_steps",
     "optimizer.schedule.wsd_decay_steps", "expected at most the decay steps (100, from train.steps), found 150"},
    {"wsd_without_decay_steps", "decay: cosine", "decay: wsd", NULL, 1, "schedule:", "optimizer.schedule.wsd_decay_steps",
     "expected a positive number of steps when decay is wsd"},
    {"steps_and_tokens", "  steps: 100", "  steps: 100\n  tokens: 2.4B", NULL, 1, "tokens", "train.tokens",
     "found both train.steps and train.tokens"},
    {"neither_steps_nor_tokens", "  steps: 100\n", "", NULL, 1, "train:", "train.steps",
     "missing required key (or give train.tokens)"},
    {"both_batch_forms", "  global_batch_size: 8\n", "  global_batch_size: 8\n" SCHEDULE("0", "10"), NULL, 1,
     "batch_schedule", "train.batch_schedule", "found both train.global_batch_size and train.batch_schedule"},
    {"schedule_first_not_zero", "  global_batch_size: 8\n", SCHEDULE("5", "10"), NULL, 1, "step: 5",
     "train.batch_schedule[0]", "expected the first stage at step 0, found step 5"},
    {"schedule_not_increasing", "  global_batch_size: 8\n", SCHEDULE("0", "0"), NULL, 1, "step: 0, global_batch_size: 16",
     "train.batch_schedule[1]", "expected steps in increasing order, found 0 after 0"},
    {"token_schedule_first_not_zero", "global_batch_size: 8", "global_batch_size: \"1B:16 2B:32\"", NULL, 1,
     "global_batch_size", "train.global_batch_size", "expected the first threshold to be 0, found 1B"},
    {"token_schedule_not_increasing", "global_batch_size: 8", "global_batch_size: 0:16 2B:32 1B:64", NULL, 1,
     "global_batch_size", "train.global_batch_size", "expected increasing thresholds, found 1B after 2000000000"},
    {"token_schedule_malformed", "global_batch_size: 8", "global_batch_size: 0:16 2.4B-320", NULL, 1, "global_batch_size",
     "train.global_batch_size", "expected TOKENS:BATCH items like \"0:16 2.4B:320\", found '2.4B-320'"},
    {"eos_id_above_vocab", "max_position_embeddings: 128", "max_position_embeddings: 128\n  eos_token_id: [2, 256]",
     NULL, 1, "eos_token_id", "model.eos_token_id", "expected ids below vocab_size (256), found 256"},
    {"bos_id_above_vocab", NULL, NULL, "model.bos_token_id=300", 1, NULL, "model.bos_token_id",
     "expected an id below vocab_size (256), found 300"},
    {"pad_id_negative", "max_position_embeddings: 128", "max_position_embeddings: 128\n  pad_token_id: -1", NULL, 1,
     "pad_token_id", "model.pad_token_id", "found '-1'"},
    {"eos_id_not_a_number", NULL, NULL, "model.eos_token_id=[1, x]", 1, NULL, "model.eos_token_id", "found 'x'"},
    {"eos_ids_empty", NULL, NULL, "model.eos_token_id=[]", 1, NULL, "model.eos_token_id",
     "expected a token id or a list of 1 to 16 ids"},
    {"moe_block_for_dense", "max_position_embeddings: 128\n", "max_position_embeddings: 128\n" MOE_BLOCK, NULL, 1, "moe:",
     "model.moe", "expected none for the dense family llama"},
    {"moe_family_without_moe", "family: llama", "family: mixtral", NULL, 1, "model:", "model.moe",
     "missing, required for the MoE family mixtral"},
    {"moe_layer_freq_length", "family: llama", "family: mixtral\n" MOE_BLOCK, "model.moe.layer_freq=[1, 0, 1]", 1, NULL,
     "model.moe.layer_freq", "expected one 0/1 entry per layer (num_layers = 2), found 3 entries"},
    {"moe_too_many_active_experts", "family: llama", "family: mixtral\n" MOE_BLOCK, "model.moe.num_experts_per_tok=5", 1,
     NULL, "model.moe.num_experts_per_tok", "expected at most moe.num_experts (4), found 5"},
    {"duplicate_key", "  tp: 1", "  tp: 1\n  tp: 2", NULL, 1, "tp: 2", "'tp'", "duplicate key 'tp'"},
    /* peft */
    {"peft_rank_zero", "parallel:", "peft:\n  type: lora\n  rank: 0\n  alpha: 8\nparallel:", NULL, 1, "rank: 0",
     "peft.rank", "expected a positive integer, found '0'"},
    {"peft_unknown_target", "parallel:", "peft:\n  type: lora\n  rank: 4\n  alpha: 8\n  target_modules:\n    - q_proj\n"
     "    - qkv_proj\nparallel:", NULL, 1, "- qkv_proj", "peft.target_modules",
     "item 1: 'qkv_proj' is not a layer LoRA adapts here; expected one of q_proj, k_proj, v_proj, o_proj, gate_proj, "
     "up_proj, down_proj"},
    {"peft_target_typo", "parallel:", "peft:\n  type: lora\n  rank: 4\n  alpha: 8\n  target_modules: [q_prj]\nparallel:",
     NULL, 1, "target_modules", "peft.target_modules", "item 0: 'q_prj' is not a layer LoRA adapts here (did you mean "
     "q_proj?); expected one of"},
    {"peft_target_string", "parallel:", "peft:\n  type: lora\n  rank: 4\n  alpha: 8\n  target_modules: v_proj\nparallel:",
     NULL, 1, "target_modules", "peft.target_modules", "found 'v_proj' (one module is a list of one: [v_proj]; PEFT "
     "reads a lone string as a regular expression of whole module paths)"},
    {"peft_target_twice", "parallel:", "peft:\n  type: lora\n  rank: 4\n  alpha: 8\n  target_modules: [q_proj, q_proj]\n"
     "parallel:", NULL, 1, "target_modules", "peft.target_modules", "item 1: q_proj is listed twice"},
    {"peft_target_path_twice", "parallel:", "peft:\n  type: lora\n  rank: 4\n  alpha: 8\n  target_modules: [q_proj, "
     "self_attn.q_proj]\nparallel:", NULL, 1, "target_modules", "peft.target_modules", "item 1: q_proj is listed twice"},
    {"peft_target_one_layer", "parallel:", "peft:\n  type: lora\n  rank: 4\n  alpha: 8\n  target_modules: "
     "[model.layers.0.mlp.up_proj]\nparallel:", NULL, 1, "target_modules", "peft.target_modules",
     "item 0: model.layers.0.mlp.up_proj names layer 0 alone: LoRA here adapts a projection in every layer (list "
     "up_proj)"},
    {"peft_target_wrong_block", "parallel:", "peft:\n  type: lora\n  rank: 4\n  alpha: 8\n  target_modules: "
     "[mlp.q_proj]\nparallel:", NULL, 1, "target_modules", "peft.target_modules",
     "item 0: 'mlp.q_proj' is not a layer LoRA adapts here"},
    {"peft_all_linear_in_list", "parallel:", "peft:\n  type: lora\n  rank: 4\n  alpha: 8\n  target_modules: "
     "[all-linear]\nparallel:", NULL, 1, "target_modules", "peft.target_modules",
     "item 0: all-linear stands alone, not in a list (target_modules: all-linear)"},
    {"peft_targets_empty", "parallel:", "peft:\n  type: lora\n  rank: 4\n  alpha: 8\n  target_modules: []\nparallel:",
     NULL, 1, "target_modules", "peft.target_modules", "expected a non-empty list of module names (q_proj, k_proj, "
     "v_proj, o_proj, gate_proj, up_proj, down_proj) or all-linear, found an empty list"},
    {"peft_dropout", "parallel:", "peft:\n  type: lora\n  rank: 4\n  alpha: 8\n  dropout: 0.1\nparallel:", NULL, 1,
     "dropout", "peft.dropout", "expected 0: LoRA dropout is not implemented yet, found 0.1"},
    {"peft_type_enum", "parallel:", "peft:\n  type: dora\n  rank: 4\n  alpha: 8\nparallel:", NULL, 1, "type: dora",
     "peft.type", "expected one of none | lora, found 'dora'"},
    {"peft_missing_alpha", "parallel:", "peft:\n  type: lora\n  rank: 4\nparallel:", NULL, 1, "peft:", "peft.alpha",
     "missing required key"},
    {"peft_missing_rank", "parallel:", "peft:\n  type: lora\n  alpha: 8\nparallel:", NULL, 1, "peft:", "peft.rank",
     "missing required key"},
    {"peft_unknown_key", "parallel:", "peft:\n  type: lora\n  rank: 4\n  alpha: 8\n  use_rslora: true\nparallel:", NULL, 1,
     "use_rslora", "peft.use_rslora", "(valid keys in peft: type, rank, alpha, target_modules, dropout)"},
    {"peft_moe", "family: llama", "family: mixtral\n" MOE_BLOCK,
     "peft={type: lora, rank: 4, alpha: 8, target_modules: [q_proj, gate_proj]}", 1, NULL, "peft.target_modules",
     "gate_proj: on a mixture-of-experts model (model.family mixtral) LoRA adapts the attention projections only"},
    {"peft_rank_not_divisible_by_tp", "  tp: 1", "  tp: 2", "peft={type: lora, rank: 3, alpha: 8}", 2, NULL, "peft.rank",
     "expected a multiple of parallel.tp (2): the column-parallel layers' A is split over tp along its rank, found 3"},
    /* missing keys */
    {"missing_model", MODEL_BLOCK, "", NULL, 1, "run:", "model", "missing required key"},
    {"missing_seq_len", "  seq_len: 64\n", "", NULL, 1, "train:", "train.seq_len", "missing required key"},
    {"missing_micro_batch", "  micro_batch_size: 2\n", "", NULL, 1, "train:", "train.micro_batch_size",
     "missing required key"},
    {"missing_batch", "  global_batch_size: 8\n", "", NULL, 1, "train:", "train.global_batch_size",
     "missing required key (or give train.batch_schedule)"},
    {"missing_data_train", "  train: [{path: data/tiny, weight: 1.0}]", "  valid: null", NULL, 1, "data:", "data.train",
     "missing required key"},
    /* an override setting another key of the section does not take the blame for the missing one */
    {"missing_seq_len_with_override", "  seq_len: 64\n", "", "train.steps=3", 1, "train:", "train.seq_len",
     "missing required key"},
    {"missing_steps_with_override", "  steps: 100\n", "", "train.micro_batch_size=1", 1, "train:", "train.steps",
     "missing required key (or give train.tokens)"},
    {"null_required_key", "micro_batch_size: 2", "micro_batch_size: null", NULL, 1, "micro_batch_size",
     "train.micro_batch_size", "missing required key"},
    {"model_file_not_found", MODEL_BLOCK, "model: configs/nope.yaml\n", NULL, 1, "model:", "model",
     "found 'configs/nope.yaml'"},
    /* syntax */
    {"yaml_syntax_error", "  seq_len: 64", "  seq_len: a: b", NULL, 1, "seq_len", "YAML syntax error",
     "mapping values are not allowed"},
    {"override_without_equals", NULL, NULL, "train.steps", 1, NULL, "train.steps", "expected key.path=value"},
    {"override_through_scalar", NULL, NULL, "train.steps.x=1", 1, NULL, "train.steps.x",
     "'train.steps' is '100', not a mapping"},
    {"alias_bomb", "checkpoint:", BOMB "checkpoint:", NULL, 1, "l4: &l4", "YAML aliases",
     "expand the document past 100000 nodes"},
    {"alias_bomb_in_value", "  betas: [0.9, 0.95]", "  betas: &b0 " TEN("0.9") "\n  b1: &b1 " TEN("*b0") "\n  b2: &b2 "
     TEN("*b1") "\n  b3: &b3 " TEN("*b2") "\n  b4: &b4 " TEN("*b3") "\n  b5: " TEN("*b4"), NULL, 1, "b4: &b4",
     "YAML aliases", "expand the document past 100000 nodes"},
    {"alias_bomb_in_override", NULL, NULL, "optimizer.betas=[&a " TEN("x") ", &b " TEN("*a") ", &c " TEN("*b") ", &d "
     TEN("*c") ", &e " TEN("*d") ", &f " TEN("*e") "]", 1, NULL, "YAML aliases", "expand the document past 100000 nodes"},
    {"override_yaml_error", NULL, NULL, "optimizer.betas=[0.9,", 1, NULL, "YAML syntax error", "did not find expected node content"},
    {"warmup_fraction_one", NULL, NULL, "optimizer.schedule.warmup_fraction=1", 1, NULL,
     "optimizer.schedule.warmup_fraction", "expected a fraction of the decay steps below 1, found 1"},
    {"warmup_fraction_and_steps", NULL, NULL, "optimizer.schedule.warmup_fraction=0.1", 1, NULL,
     "optimizer.schedule.warmup_fraction", "expected one of them (--set optimizer.schedule.warmup_steps=null drops the "
     "steps)"},
    /* Megatron's --lr-warmup-init and weight-decay increment (optimizer_param_scheduler.py's asserts, and a key that
     * would do nothing) */
    {"warmup_init_above_lr", NULL, NULL, "optimizer.schedule.warmup_init=0.01", 1, NULL,
     "optimizer.schedule.warmup_init", "expected at most optimizer.lr (0.003), found 0.01"},
    {"warmup_init_without_warmup", "    warmup_steps: 10\n", "    warmup_init: 1e-4\n", NULL, 1, "warmup_init",
     "optimizer.schedule.warmup_init", "found 0.0001 without a warmup, expected optimizer.schedule.warmup_steps or "
     "warmup_fraction"},
    {"weight_decay_style_without_end", NULL, NULL, "optimizer.weight_decay_style=linear", 1, NULL,
     "optimizer.weight_decay_style", "linear needs optimizer.weight_decay_end, the weight decay of the run's last step "
     "(from optimizer.weight_decay, 0.1, at the first)"},
    {"weight_decay_end_without_style", NULL, NULL, "optimizer.weight_decay_end=0.2", 1, NULL,
     "optimizer.weight_decay_end", "found 0.2 with weight_decay_style constant (weight_decay 0.1 throughout), expected "
     "optimizer.weight_decay_style linear or cosine"},
    {"weight_decay_end_below_start", "  lr: 3.0e-3\n", "  lr: 3.0e-3\n  weight_decay: 0.1\n  weight_decay_end: 0.05\n"
     "  weight_decay_style: cosine\n", NULL, 1, "weight_decay_end", "optimizer.weight_decay_end",
     "expected at least optimizer.weight_decay (0.1), found 0.05"},
    {"megatron_lr_warmup_init", NULL, NULL, "optimizer.lr_warmup_init=1e-5", 1, NULL, "optimizer.lr_warmup_init",
     "did you mean 'optimizer.schedule.warmup_init'?"},
    {"megatron_weight_decay_incr_style", NULL, NULL, "optimizer.weight_decay_incr_style=linear", 1, NULL,
     "optimizer.weight_decay_incr_style", "did you mean 'optimizer.weight_decay_style'?"},
    {"megatron_end_weight_decay", NULL, NULL, "optimizer.end_weight_decay=0.1", 1, NULL, "optimizer.end_weight_decay",
     "did you mean 'optimizer.weight_decay_end'?"},
    {"megatron_start_weight_decay", NULL, NULL, "optimizer.start_weight_decay=0.01", 1, NULL,
     "optimizer.start_weight_decay", "did you mean 'optimizer.weight_decay'? Megatron's start_weight_decay is "
     "optimizer.weight_decay, with weight_decay_end and weight_decay_style linear or cosine"},
    /* Hugging Face Trainer's TrainingArguments names */
    {"hf_learning_rate", NULL, NULL, "train.learning_rate=1e-4", 1, NULL, "train.learning_rate",
     "did you mean 'optimizer.lr'?"},
    {"hf_max_steps", NULL, NULL, "max_steps=100", 1, NULL, "'max_steps'", "did you mean 'train.steps'?"},
    {"hf_gradient_accumulation_steps", NULL, NULL, "train.gradient_accumulation_steps=4", 1, NULL,
     "train.gradient_accumulation_steps", "did you mean 'train.global_batch_size'? megatrain sets the global batch, "
     "not the accumulation: global_batch_size = per_device_train_batch_size x gradient_accumulation_steps x the "
     "data-parallel ranks"},
    {"hf_lr_scheduler_type_value", NULL, NULL, "optimizer.schedule.decay=cosine_with_min_lr", 1, NULL,
     "optimizer.schedule.decay", "did you mean cosine?"},
    {"hf_warmup_ratio", NULL, NULL, "optimizer.schedule.warmup_ratio=0.03", 1, NULL,
     "optimizer.schedule.warmup_ratio", "did you mean 'optimizer.schedule.warmup_fraction'? the Trainer rounds "
     "warmup_ratio x max_steps up to whole steps"},
    {"hf_num_train_epochs", NULL, NULL, "train.num_train_epochs=3", 1, NULL, "train.num_train_epochs",
     "unknown key 'train.num_train_epochs': megatrain counts steps or tokens"},
    {"hf_save_total_limit", NULL, NULL, "checkpoint.save_total_limit=3", 1, NULL, "checkpoint.save_total_limit",
     "did you mean 'checkpoint.keep_last'?"},
    /* Megatron's flags with no megatrain key: why, instead of a guess */
    {"megatron_hidden_dropout", NULL, NULL, "model.hidden_dropout=0.0", 1, NULL, "model.hidden_dropout",
     "unknown key 'model.hidden_dropout': megatrain trains without dropout (Megatron's default is 0.1: set 0 there "
     "for the same model)"},
    {"megatron_use_flash_attn", NULL, NULL, "use_flash_attn=true", 1, NULL, "'use_flash_attn'",
     "unknown key 'use_flash_attn': nothing to set: GPUs always run megatrain's own flash attention kernels"},
    {"megatron_load", NULL, NULL, "checkpoint.load=runs/x", 1, NULL, "checkpoint.load",
     "unknown key 'checkpoint.load': `megatrain resume RUN_DIR` continues a run from its checkpoint"},
    {"megatron_async_save", NULL, NULL, "checkpoint.async_save=true", 1, NULL, "checkpoint.async_save",
     "did you mean 'checkpoint.async'?"},
    {"blend_weights_mixed", NULL, NULL, "data.train=[a, {path: b, weight: 2}]", 1, NULL, "data.train",
     "item 1 has a weight and item 0 has none: give every dataset of a blend a weight, or none"},
    {"blend_weights_mixed_other_way", NULL, NULL, "data.train=[{path: a, weight: 2}, b]", 1, NULL, "data.train",
     "item 1 has no weight and item 0 has one: give every dataset of a blend a weight, or none"},
};
#define NUM_ERROR_CASES ((int)(sizeof error_cases / sizeof error_cases[0]))

static void test_error_case(void **state) {
    const ErrorCase *c = *state;
    static char text[8192];
    char where[700];
    Recipe r;
    snprintf(text, sizeof text, "%s", c->from ? replaced(BASE, c->from, c->to) : BASE);
    const char *sets[1] = {c->set};
    int rc = load(&r, text, sets, c->set ? 1 : 0, c->world);
    if (rc != -1) fail_msg("%s: expected -1, got %d", c->name, rc);
    if (c->at) snprintf(where, sizeof where, "%s/recipe.yaml:%d: ", work_dir, line_of(text, c->at));
    else snprintf(where, sizeof where, "--set %s: ", c->set);
    if (strncmp(err, where, strlen(where)) != 0) fail_msg("%s: message should start with '%s': %s", c->name, where, err);
    if (!strstr(err + strlen(where), c->key)) fail_msg("%s: message should name '%s': %s", c->name, c->key, err);
    if (!strstr(err, c->says)) fail_msg("%s: message should say '%s': %s", c->name, c->says, err);
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    return remove(path);
}

static int setup(void **state) {
    snprintf(work_dir, sizeof work_dir, "/tmp/test_recipe_XXXXXX");
    return mkdtemp(work_dir) ? 0 : -1;
}

static int teardown(void **state) {
    return nftw(work_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* yaml_quote: a string (a path: run.dir, a data path) written into recipe.yaml reads back as the same bytes, also
 * with the characters a YAML reader folds (line breaks, NEL, the line and paragraph separators) or drops (a BOM) */
static void test_yaml_quote_round_trip(void **state) {
    (void)state;
    static const char *const texts[] = {"plain/dir", "a \"quoted\" \\ path", "line\nbreak", "tab\there", "cr\rx",
                                        "nel\xc2\x85" "dir", "ls\xe2\x80\xa8" "ps\xe2\x80\xa9" "end", "c1\xc2\x9f" "x",
                                        "bom\xef\xbb\xbf" "x", "nonchars\xef\xbf\xbe" "\xef\xbf\xbf" "x", "del\x7f" "x", "caf\xc3\xa9 \xe2\x82\xac", ""};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        char quoted[256], doc[300], err[256];
        const size_t n = yaml_quote(texts[i], quoted, sizeof quoted);
        assert_true(n == strlen(quoted));
        assert_true(yaml_quote(texts[i], quoted, 4) == n); /* the length needed, whatever fits */
        yaml_quote(texts[i], quoted, sizeof quoted);
        snprintf(doc, sizeof doc, "key: %s\n", quoted);
        YNode *root = ytree_load_string(doc, "test", err, sizeof err);
        if (!root) fail_msg("case %zu: %s: %s", i, quoted, err);
        const YEntry *e = ytree_entry(root, "key");
        assert_non_null(e);
        if (strcmp(e->value->text, texts[i]) != 0) fail_msg("case %zu: %s read back as '%s'", i, quoted, e->value->text);
        ytree_free(root);
    }
}

int main(void) {
    const struct CMUnitTest units[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_yaml_quote_round_trip),
        cmocka_unit_test(test_schedule_longer_than_the_run),
        cmocka_unit_test(test_batch_schedules),
        cmocka_unit_test(test_overrides),
        cmocka_unit_test(test_relative_paths),
        cmocka_unit_test(test_text_difference),
        cmocka_unit_test(test_model_from_file),
        cmocka_unit_test(test_write_round_trip),
        cmocka_unit_test(test_token_ids),
        cmocka_unit_test(test_token_counts_and_names),
        cmocka_unit_test(test_missing_file_and_override_message),
        cmocka_unit_test(test_short_split),
        cmocka_unit_test(test_aliases),
    };
    /* the units, then a test per error case (the count taken from the list: a fixed number once let the error cases
     * overwrite the last three units, which then never ran) */
    enum { NUM_UNITS = sizeof units / sizeof units[0] };
    struct CMUnitTest tests[NUM_UNITS + NUM_ERROR_CASES];
    int count = 0;
    for (int i = 0; i < NUM_UNITS; i++) tests[count++] = units[i];
    for (int i = 0; i < NUM_ERROR_CASES; i++)
        tests[count++] = (struct CMUnitTest){error_cases[i].name, test_error_case, NULL, NULL, (void *)&error_cases[i]};
    return _cmocka_run_group_tests("recipe", tests, (size_t)count, setup, teardown);
}
