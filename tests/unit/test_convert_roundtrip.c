/* test_convert_roundtrip.c: `megatrain convert` in process (convert_main):
 * HF directories written here from model_init_weights'd models (config.json
 * and safetensors, one file or sharded; fp32, bf16, f16; tied with and
 * without lm_head.weight; tokenizer files and generation_config.json of
 * arbitrary bytes) go to a megatrain checkpoint and back, and every file
 * comes back byte for byte; token ids reach config.json and a made
 * generation_config.json; tied embeddings as transformers 5 loads them; a run directory resolves to its latest
 * checkpoint; a missing tensor, a wrong shape, an extra tensor, an
 * unsupported family, a missing file and an existing DST fail with a
 * message naming them and leave nothing at DST, as does a write that fails
 * half-way (a file size limit standing in for a full disk); init_from loads the weights
 * and refuses a recipe model that differs from the checkpoint's; a model
 * trained with expert biases exports only with --drop-expert-bias, which says
 * what changes and exports what its model computes with the biases zeroed. */
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "backend/backend.h"
#include "ckpt/checkpoint.h"
#include "convert/convert.h"
#include "convert/hf_config.h"
#include "convert/hf_names.h"
#include "convert/init_from.h"
#include "convert/lora_export.h"
#include "core/error.h"
#include "core/fs.h"
#include "model/model.h"

#include "test_work_dir.h"

static ModelConfig tiny_config(ModelFamily family, bool tied) {
    ModelConfig c;
    memset(&c, 0, sizeof c);
    c.family = family;
    c.num_layers = 2;
    c.hidden_size = 16;
    c.intermediate_size = 24;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.head_dim = 4;
    c.vocab_size = 40;
    c.max_position_embeddings = 64;
    c.rope_theta = 10000.0;
    c.rms_norm_eps = 1e-5;
    c.init_std = 0.02;
    c.tie_word_embeddings = tied;
    c.attention_bias = family == FAMILY_QWEN2;
    c.qk_norm = family == FAMILY_QWEN3;
    return c;
}

/* How to spoil an HF directory on purpose. */
typedef struct Spoil {
    const char *skip;        /* leave this HF tensor out */
    const char *transpose;   /* write this 2-D tensor with its dims swapped */
    bool extra;              /* add a tensor nobody asked for */
    bool inv_freq;           /* add transformers' old rotary buffers (to be ignored) */
    bool lm_head_when_tied;  /* tied: also store lm_head.weight (a copy of the embedding) */
    uint64_t lm_head_seed;   /* with lm_head_when_tied: the copy from a model of this seed instead (a distinct head) */
    const char *model_type;  /* replace model_type in config.json */
    bool no_hf_files;        /* no tokenizer files and no generation_config.json */
} Spoil;

/* The files carried as opaque bytes: not even valid UTF-8 or JSON. */
static const char *const carried[][2] = {
    {"tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"\xff\xfe\": 0}}} trailing"},
    {"tokenizer_config.json", "{\"eos_token\": \"</s>\",\r\n \"x\": 1}"},
    {"generation_config.json", "{ \"eos_token_id\": [7, 8],   \"temperature\": 0.6 }"},
    {"chat_template.jinja", "{% for m in messages %}{{ m }}{% endfor %}"},
};

static void write_text(const char *dir, const char *name, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* An HF directory from a seeded model: config.json and safetensors. */
static void make_hf_dir(const char *dir, const ModelConfig *cfg, uint64_t seed, StDtype dtype, uint64_t max_shard,
                        const Spoil *spoil) {
    static const Spoil none = {0};
    if (!spoil) spoil = &none;
    Model *model = model_create(cfg, &cpu_backend, 1, 1);
    model_init_weights(model, seed);
    assert_int_equal(mkdir(dir, 0777), 0);
    StWriteTensor t[64];
    static char names[64][160];
    static float extra_data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int n = 0;
    for (int p = 0; p < model->num_params; p++) {
        const ParamInfo *info = &model->param_info[p];
        HfPiece pieces[8]; /* one, or one per expert of a stack */
        const int count = hf_pieces(cfg->family, info, cfg->moe.num_experts, pieces, 8);
        assert_true(count > 0);
        for (int k = 0; k < count; k++) {
            memcpy(names[n], pieces[k].name, sizeof names[n]);
            if (spoil->skip && !strcmp(names[n], spoil->skip)) continue;
            t[n] = (StWriteTensor){names[n], dtype, pieces[k].ndim, {pieces[k].shape[0], pieces[k].shape[1]},
                                   model->params + info->offset + pieces[k].offset, false, NULL, NULL};
            if (spoil->transpose && !strcmp(names[n], spoil->transpose)) {
                t[n].shape[0] = pieces[k].shape[1];
                t[n].shape[1] = pieces[k].shape[0];
            }
            n++;
        }
    }
    Model *other = NULL; /* the source of a distinct head */
    if (spoil->lm_head_seed) {
        other = model_create(cfg, &cpu_backend, 1, 1);
        model_init_weights(other, spoil->lm_head_seed);
    }
    if (cfg->tie_word_embeddings && spoil->lm_head_when_tied)
        t[n++] = (StWriteTensor){"lm_head.weight", dtype, 2, {cfg->vocab_size, cfg->hidden_size},
                                 (other ? other : model)->params + model_find_param(model, "embed.weight")->offset,
                                 false, NULL, NULL};
    if (spoil->extra) t[n++] = (StWriteTensor){"model.layers.0.mlp.extra.weight", dtype, 1, {8}, extra_data, false, NULL, NULL};
    if (spoil->inv_freq)
        t[n++] = (StWriteTensor){"model.layers.1.self_attn.rotary_emb.inv_freq", dtype, 1, {2}, extra_data, false, NULL, NULL};
    /* in transformers' state_dict order, as save_pretrained shards it (insertion sort) */
    for (int i = 1; i < n; i++) {
        StWriteTensor x = t[i];
        long key = hf_name_position(cfg->family, x.name);
        int j = i;
        for (; j > 0; j--) {
            long prev = hf_name_position(cfg->family, t[j - 1].name);
            if (key < 0 || (prev >= 0 && prev <= key)) break;
            t[j] = t[j - 1];
        }
        t[j] = x;
    }
    char err[512];
    assert_int_equal(st_write_model(dir, t, n, max_shard, model->num_floats, NULL, NULL, err, sizeof err), 0);
    char *json = hf_config_to_json(cfg, dtype == ST_F32 ? "float32" : dtype == ST_BF16 ? "bfloat16" : "float16");
    if (spoil->model_type) {
        char *at = strstr(json, "\"model_type\": \"");
        assert_non_null(at);
        char *value = at + 15, *end = strchr(value, '"');
        char *patched = malloc(strlen(json) + 64);
        snprintf(patched, strlen(json) + 64, "%.*s%s%s", (int)(value - json), json, spoil->model_type, end);
        free(json);
        json = patched;
    }
    write_text(dir, "config.json", json);
    free(json);
    for (size_t i = 0; !spoil->no_hf_files && i < sizeof carried / sizeof carried[0]; i++)
        write_text(dir, carried[i][0], carried[i][1]);
    model_free(model);
    if (other) model_free(other);
}

/* Run `megatrain convert ARGS...` in process with stderr captured into `message`. */
static int convert(char *message, size_t len, int argc, ...) {
    char *argv[8];
    va_list ap;
    va_start(ap, argc);
    for (int i = 0; i < argc; i++) argv[i] = va_arg(ap, char *);
    va_end(ap);
    char path[512];
    snprintf(path, sizeof path, "%s/stderr.txt", work_dir);
    fflush(stderr);
    int saved = dup(2);
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    dup2(fd, 2);
    close(fd);
    fflush(stdout);
    int saved_out = dup(1), null = open("/dev/null", O_WRONLY);
    dup2(null, 1); /* the summary lines */
    close(null);
    int status = convert_main(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(saved, 2);
    dup2(saved_out, 1);
    close(saved);
    close(saved_out);
    FILE *f = fopen(path, "r");
    size_t got = fread(message, 1, len - 1, f);
    message[got] = '\0';
    fclose(f);
    return status;
}

static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("%s: missing", path);
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *data = malloc(*len + 1);
    assert_int_equal(fread(data, 1, *len, f), *len);
    fclose(f);
    return data;
}

/* File `name` of directory a and of directory b hold the same bytes. */
static void assert_same_file(const char *a, const char *b, const char *name) {
    char pa[1024], pb[1024];
    snprintf(pa, sizeof pa, "%s/%s", a, name);
    snprintf(pb, sizeof pb, "%s/%s", b, name);
    size_t la, lb;
    unsigned char *da = slurp(pa, &la), *db = slurp(pb, &lb);
    if (la != lb || memcmp(da, db, la) != 0) fail_msg("%s and %s differ", pa, pb);
    free(da);
    free(db);
}

/* Every file of a is in b with the same bytes, and b has no other files. */
static void assert_same_files(const char *a, const char *b) {
    int count_a = 0, count_b = 0;
    DIR *d = opendir(a);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        count_a++;
        assert_same_file(a, b, e->d_name);
    }
    closedir(d);
    d = opendir(b);
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') count_b++;
    closedir(d);
    assert_int_equal(count_a, count_b);
}

static int exists(const char *path) { return access(path, F_OK) == 0; }

/* The three directories of case `name`: its HF source, checkpoint and HF copy back (512 bytes each). */
static void case_dirs(const char *name, char *hf, char *ckpt, char *back) {
    snprintf(hf, 512, "%s/%s.hf", work_dir, name);
    snprintf(ckpt, 512, "%s/%s.ckpt", work_dir, name);
    snprintf(back, 512, "%s/%s.back", work_dir, name);
}

static void round_trip_config(const char *name, const ModelConfig *config, StDtype dtype, uint64_t max_shard) {
    char hf[512], ckpt[512], back[512], msg[2048], shard[32];
    case_dirs(name, hf, ckpt, back);
    snprintf(shard, sizeof shard, "%llu", (unsigned long long)max_shard);
    const ModelConfig cfg = *config;
    make_hf_dir(hf, &cfg, 42, dtype, max_shard, NULL);
    if (convert(msg, sizeof msg, 2, hf, ckpt) != 0) fail_msg("%s -> ckpt: %s", name, msg);
    const char *dtype_arg = dtype == ST_F32 ? "fp32" : dtype == ST_BF16 ? "bf16" : "fp16";
    if (convert(msg, sizeof msg, 6, ckpt, back, "--dtype", dtype_arg, "--max-shard-size", shard) != 0)
        fail_msg("%s -> hf: %s", name, msg);
    assert_same_files(hf, back);
}

static void round_trip(const char *name, ModelFamily family, bool tied, StDtype dtype, uint64_t max_shard) {
    const ModelConfig cfg = tiny_config(family, tied);
    round_trip_config(name, &cfg, dtype, max_shard);
}

/* One layer of hidden size 24 (4 heads of 6): a dimension of 44,000 set beside it makes tensors larger than a
 * streamed block whose rows do not divide one. */
static ModelConfig narrow_config(ModelFamily family) {
    ModelConfig cfg = tiny_config(family, false);
    cfg.num_layers = 1;
    cfg.hidden_size = 24;
    cfg.head_dim = 6;
    return cfg;
}

/* Tensors larger than the blocks that convert streams (2^20 elements a
 * block of a safetensors tensor on one OpenMP thread, 4 MiB chunks of a
 * checkpoint), of 24 or 44,000 columns, so that blocks and chunks begin and
 * end inside rows and fall across each other: the embedding and the head
 * [44000, 24], and Mixtral's experts (planes of [44000, 24] and
 * [24, 44000], each above a chunk) come back byte for byte. */
static void test_round_trips_streamed_in_blocks(void **state) {
    (void)state;
    const int saved_threads = omp_get_max_threads();
    omp_set_num_threads(1); /* blocks of 2^20 elements (2^20 a thread) */
    ModelConfig cfg = narrow_config(FAMILY_LLAMA);
    cfg.vocab_size = 44000;
    round_trip_config("llama_blocks", &cfg, ST_F32, 5000000000ull);
    cfg = narrow_config(FAMILY_MIXTRAL);
    cfg.intermediate_size = 44000;
    cfg.moe = (MoeConfig){.num_experts = 2, .num_experts_per_tok = 1, .moe_intermediate_size = 44000,
                          .norm_topk_prob = true, .layer_freq = 1};
    round_trip_config("mixtral_blocks", &cfg, ST_BF16, 5000000000ull);
    omp_set_num_threads(saved_threads);
}

/* --merge-lora streams: each adapted projection merged block by block as
 * it is written equals lora_merge's model (merged whole, in memory) bit for
 * bit, every other tensor the checkpoint's. Projections of 24 and 90,000
 * columns (2.16 million elements, three checkpoint chunks) on 1, 2 and 3
 * OpenMP threads: blocks of 2^20 elements a thread, so 3 and 2 blocks
 * beginning and ending inside rows (the chunks read one after another, and
 * several at once sharing the chunk at each seam), then one block. */
static void test_merge_lora_streamed(void **state) {
    (void)state;
    ModelConfig cfg = narrow_config(FAMILY_LLAMA);
    cfg.intermediate_size = 90000;
    cfg.peft = (PeftConfig){.type = PEFT_LORA, .rank = 3, .alpha = 6.5, .targets = LORA_ALL_TARGETS};
    Model *lora = model_create(&cfg, &cpu_backend, 1, 1);
    model_init_weights(lora, 5);
    uint64_t x = 12345; /* the B adapters start at zero: give every adapter values */
    for (long i = lora->trainable_offset; i < lora->num_floats; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        lora->params[i] = (float)((double)(x >> 40) / (double)(1ull << 24) - 0.5) * 0.1f;
    }
    char ckpt[512], out[512], msg[2048], path[700], hf[192];
    snprintf(ckpt, sizeof ckpt, "%s/lora.ckpt", work_dir);
    if (ckpt_write_dir(ckpt, &(CheckpointWrite){.model = lora}, msg, sizeof msg) != 0) fail_msg("%s", msg);
    ModelConfig base = cfg;
    base.peft.type = PEFT_NONE;
    Model *merged = model_create(&base, &cpu_backend, 1, 1);
    if (lora_merge(lora, merged, msg, sizeof msg) != 0) fail_msg("%s", msg);
    const int saved_threads = omp_get_max_threads();
    for (int threads = 1; threads <= 3; threads++) {
        omp_set_num_threads(threads);
        snprintf(out, sizeof out, "%s/lora_merged_%d.hf", work_dir, threads);
        if (convert(msg, sizeof msg, 3, ckpt, out, "--merge-lora") != 0) fail_msg("--merge-lora: %s", msg);
        snprintf(path, sizeof path, "%s/model.safetensors", out);
        StFile *file = st_open(path, msg, sizeof msg);
        if (!file) fail_msg("%s", msg);
        assert_int_equal(file->num_tensors, merged->num_params);
        int adapted = 0;
        for (int i = 0; i < merged->num_params; i++) {
            const ParamInfo *p = &merged->param_info[i];
            assert_int_equal(hf_name_from_ours(FAMILY_LLAMA, p->name, hf, sizeof hf), 0);
            const StTensor *t = st_find(file, hf);
            if (!t || t->dtype != ST_F32 || t->numel != p->numel) fail_msg("%s: missing or misshapen", hf);
            if (memcmp(t->data, merged->params + p->offset, (size_t)p->numel * sizeof(float)) != 0)
                fail_msg("%d threads: %s differs from lora_merge's", threads, hf);
            adapted += memcmp(t->data, lora->params + p->offset, (size_t)p->numel * sizeof(float)) != 0;
        }
        assert_int_equal(adapted, 7); /* q, k, v, o, gate, up, down: merged, not copied */
        st_close(file);
    }
    omp_set_num_threads(saved_threads);
    model_free(merged);
    model_free(lora);
}

/* --drop-expert-bias: a qwen3_moe checkpoint trained with load_balancing expert_bias, its routers set so that the
 * warning's numbers are known: layer 0's router is zero (every score 1/4, so without biases the ties go to experts
 * 0 and 1) and its biases favour experts 2 and 3, so both choices of every probe change; layer 1's biases are
 * equal (a shift every expert shares), so none does. Without the option the export is refused naming it, and
 * nothing is written; with it the export holds no bias, and converted back into a model without biases it
 * computes the logits of the checkpoint's model with its biases zeroed, bit for bit (with them: others). */
static void test_drop_expert_bias(void **state) {
    (void)state;
    ModelConfig cfg = tiny_config(FAMILY_QWEN3_MOE, false);
    cfg.qk_norm = true;
    cfg.moe = (MoeConfig){.num_experts = 4, .num_experts_per_tok = 2, .moe_intermediate_size = 8,
                          .norm_topk_prob = true, .score_function = SCORE_SOFTMAX, .load_balancing = LB_EXPERT_BIAS,
                          .aux_loss_coeff = 0.001, .layer_freq = 1, .bias_update_rate = 1e-3};
    enum { B = 2, T = 8 };
    Model *model = model_create(&cfg, &cpu_backend, B, T);
    model_init_weights(model, 21);
    float *router0 = model->params + model_find_param(model, "layers.0.mlp.router.weight")->offset;
    float *bias0 = model->params + model_find_param(model, "layers.0.mlp.router.expert_bias")->offset;
    float *bias1 = model->params + model_find_param(model, "layers.1.mlp.router.expert_bias")->offset;
    memset(router0, 0, 4 * 16 * sizeof(float));
    const float biases0[4] = {0.0f, 0.0f, 0.2f, 0.1f};
    for (int e = 0; e < 4; e++) bias0[e] = biases0[e], bias1[e] = 0.3f;
    char ckpt[512], hf[512], back[512], msg[4096], path[700], err[1024];
    snprintf(ckpt, sizeof ckpt, "%s/bias.ckpt", work_dir);
    snprintf(hf, sizeof hf, "%s/bias.hf", work_dir);
    snprintf(back, sizeof back, "%s/bias_back.ckpt", work_dir);
    if (ckpt_write_dir(ckpt, &(CheckpointWrite){.model = model}, msg, sizeof msg) != 0) fail_msg("%s", msg);

    assert_int_equal(convert(msg, sizeof msg, 2, ckpt, hf), MT_EXIT_FAILURE);
    assert_non_null(strstr(msg, "model.moe.load_balancing: expert_bias routing has no transformers counterpart"));
    assert_non_null(strstr(msg, "--drop-expert-bias exports the model without the biases"));
    assert_false(exists(hf));

    if (convert(msg, sizeof msg, 3, ckpt, hf, "--drop-expert-bias") != 0) fail_msg("--drop-expert-bias: %s", msg);
    const char *const said[] = {
        "which the exported model has not: it routes some tokens to other experts than the trained model does",
        "Probed with the embeddings of all 40 token ids",
        "50.0% of the top-2 choices change (80 of 160; the most in layer 0: 100.0%)",
        "the biases span up to 0.2 (layer 0), 0.80 times the mean score 1/4",
        "layer 0: biases span 0.2 (0.80 times the mean score 1/4); without them 80 of the 80 top-2 choices change "
        "(100.0%), on 40 of the 40 probes",
        "layer 1: biases span 0 (0.00 times the mean score 1/4); without them 0 of the 80 top-2 choices change "
        "(0.0%), on 0 of the 40 probes"};
    for (size_t i = 0; i < sizeof said / sizeof said[0]; i++)
        if (!strstr(msg, said[i])) fail_msg("the warning does not say '%s': %s", said[i], msg);
    snprintf(path, sizeof path, "%s/model.safetensors", hf);
    StFile *file = st_open(path, msg, sizeof msg);
    if (!file) fail_msg("%s", msg);
    for (int i = 0; i < file->num_tensors; i++)
        if (strstr(file->tensors[i].name, "bias")) fail_msg("the export holds %s", file->tensors[i].name);
    st_close(file);

    /* the export in megatrain: a model without biases, every weight the checkpoint's */
    if (convert(msg, sizeof msg, 2, hf, back) != 0) fail_msg("%s", msg);
    ModelConfig plain = cfg;
    plain.moe.load_balancing = LB_AUX_LOSS;
    Model *exported = model_create(&plain, &cpu_backend, B, T);
    if (init_from_checkpoint(exported, back, NULL, NULL, err, sizeof err) != 0) fail_msg("%s", err);
    assert_int_equal(exported->num_params, model->num_params - 2);
    for (int i = 0; i < exported->num_params; i++) {
        const ParamInfo *p = &exported->param_info[i], *q = model_find_param(model, p->name);
        if (!q || memcmp(exported->params + p->offset, model->params + q->offset, (size_t)p->numel * sizeof(float)))
            fail_msg("%s: not the checkpoint's", p->name);
    }
    int32_t inputs[B * T], targets[B * T];
    for (int i = 0; i < B * T; i++) inputs[i] = (int32_t)((i * 7 + 3) % 40), targets[i] = (int32_t)((i * 5 + 1) % 40);
    const size_t bytes = (size_t)B * T * 40 * sizeof(float);
    float *biased = mt_malloc(bytes), *zeroed = mt_malloc(bytes);
    model_moe_step_begin(model);
    model_forward(model, inputs, targets, B, T);
    memcpy(biased, model_logits(model), bytes);
    memset(bias0, 0, 4 * sizeof(float));
    memset(bias1, 0, 4 * sizeof(float));
    model_moe_step_begin(model);
    model_forward(model, inputs, targets, B, T);
    memcpy(zeroed, model_logits(model), bytes);
    model_moe_step_begin(exported);
    model_forward(exported, inputs, targets, B, T);
    assert_memory_equal(model_logits(exported), zeroed, bytes);
    assert_memory_not_equal(biased, zeroed, bytes);
    free(zeroed);
    free(biased);
    model_free(exported);
    model_free(model);
}

static void test_round_trips(void **state) {
    (void)state; /* each with the carried files, which come back byte for byte */
    round_trip("llama", FAMILY_LLAMA, false, ST_F32, 5000000000ull);
    round_trip("llama_tied_sharded", FAMILY_LLAMA, true, ST_F32, 3000);
    round_trip("qwen2_bf16", FAMILY_QWEN2, false, ST_BF16, 5000000000ull);
    round_trip("qwen3_f16_sharded", FAMILY_QWEN3, true, ST_F16, 2000);
    char hf[512];
    snprintf(hf, sizeof hf, "%s/llama_tied_sharded.hf/model.safetensors.index.json", work_dir);
    assert_true(exists(hf)); /* the sharded cases really were sharded */
}

/* Token ids from config.json reach the checkpoint's model.yaml and come
 * back in config.json; without a generation_config.json to carry, one is
 * made from them as transformers would. */
static void test_token_ids_and_generation_config(void **state) {
    (void)state;
    char hf[512], ckpt[512], back[512], msg[2048], path[700], err[512];
    case_dirs("ids", hf, ckpt, back);
    ModelConfig cfg = tiny_config(FAMILY_LLAMA, false);
    cfg.token_ids = (SpecialTokenIds){.has_bos = true, .bos = 1, .num_eos = 2, .eos = {2, 39}, .eos_is_list = true};
    Spoil bare = {.no_hf_files = true};
    make_hf_dir(hf, &cfg, 5, ST_F32, 5000000000ull, &bare);
    if (convert(msg, sizeof msg, 2, hf, ckpt) != 0) fail_msg("%s", msg);
    ModelConfig stored;
    assert_int_equal(ckpt_read_model_config(ckpt, &stored, err, sizeof err), 0);
    assert_memory_equal(&stored.token_ids, &cfg.token_ids, sizeof cfg.token_ids);
    assert_int_equal(convert(msg, sizeof msg, 2, ckpt, back), 0);
    assert_same_file(hf, back, "config.json");
    snprintf(path, sizeof path, "%s/generation_config.json", back);
    size_t la;
    char *made = (char *)slurp(path, &la), *want = hf_generation_config_json(&cfg);
    assert_true(la == strlen(want) && memcmp(made, want, la) == 0);
    assert_non_null(strstr(want, "\"bos_token_id\": 1"));
    free(made);
    free(want);
    snprintf(path, sizeof path, "%s/tokenizer.json", back);
    assert_false(exists(path));
}

/* Tied checkpoints that store lm_head.weight anyway, and old rotary buffers: accepted. */
static void test_tolerated_extras(void **state) {
    (void)state;
    char hf[512], ckpt[512], back[512], msg[2048];
    case_dirs("tied_with_head", hf, ckpt, back);
    ModelConfig cfg = tiny_config(FAMILY_LLAMA, true);
    Spoil spoil = {.lm_head_when_tied = true, .inv_freq = true};
    make_hf_dir(hf, &cfg, 7, ST_F32, 5000000000ull, &spoil);
    if (convert(msg, sizeof msg, 2, hf, ckpt) != 0) fail_msg("%s", msg);
    assert_int_equal(convert(msg, sizeof msg, 2, ckpt, back), 0);
    /* written back the way transformers saves a tied model: without lm_head.weight */
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", back);
    char err[512];
    StFile *file = st_open(path, err, sizeof err);
    assert_non_null(file);
    assert_null(st_find(file, "lm_head.weight"));
    assert_null(st_find(file, "model.layers.1.self_attn.rotary_emb.inv_freq"));
    assert_non_null(st_find(file, "model.embed_tokens.weight"));
    st_close(file);
}

/* tie_word_embeddings: true as transformers 5 loads it: a stored
 * lm_head.weight that differs from the embedding is kept, untied (the
 * checkpoint's model and the config.json written back say
 * tie_word_embeddings: false, and the safetensors come back byte for byte);
 * a directory holding only lm_head.weight has it as the tied embedding. */
static void test_tied_as_transformers5(void **state) {
    (void)state;
    char hf[512], ckpt[512], back[512], msg[2048], path[700], err[512];
    case_dirs("distinct_head", hf, ckpt, back);
    ModelConfig cfg = tiny_config(FAMILY_LLAMA, true);
    Spoil distinct = {.lm_head_when_tied = true, .lm_head_seed = 99};
    make_hf_dir(hf, &cfg, 7, ST_F32, 5000000000ull, &distinct);
    if (convert(msg, sizeof msg, 2, hf, ckpt) != 0) fail_msg("%s", msg);
    if (!strstr(msg, "lm_head.weight differs from model.embed_tokens.weight") || !strstr(msg, "not tied"))
        fail_msg("no warning about the distinct head: '%s'", msg);
    ModelConfig stored;
    assert_int_equal(ckpt_read_model_config(ckpt, &stored, err, sizeof err), 0);
    assert_false(stored.tie_word_embeddings);
    assert_int_equal(convert(msg, sizeof msg, 2, ckpt, back), 0);
    assert_same_file(hf, back, "model.safetensors");
    snprintf(path, sizeof path, "%s/config.json", back);
    size_t len;
    char *json = (char *)slurp(path, &len);
    json[len] = '\0';
    assert_non_null(strstr(json, "\"tie_word_embeddings\": false"));
    free(json);

    /* only lm_head.weight (a copy of the embedding): the tied embedding, as a plain tied directory gives */
    char plain[512], plain_ckpt[512], plain_back[512];
    case_dirs("head_only", hf, ckpt, back);
    Spoil head_only = {.lm_head_when_tied = true, .skip = "model.embed_tokens.weight"};
    make_hf_dir(hf, &cfg, 8, ST_F32, 5000000000ull, &head_only);
    if (convert(msg, sizeof msg, 2, hf, ckpt) != 0) fail_msg("%s", msg);
    assert_int_equal(convert(msg, sizeof msg, 2, ckpt, back), 0);
    snprintf(plain, sizeof plain, "%s/head_only_plain.hf", work_dir);
    snprintf(plain_ckpt, sizeof plain_ckpt, "%s/head_only_plain.ckpt", work_dir);
    snprintf(plain_back, sizeof plain_back, "%s/head_only_plain.back", work_dir);
    make_hf_dir(plain, &cfg, 8, ST_F32, 5000000000ull, NULL);
    assert_int_equal(convert(msg, sizeof msg, 2, plain, plain_ckpt), 0);
    assert_int_equal(convert(msg, sizeof msg, 2, plain_ckpt, plain_back), 0);
    assert_same_files(plain_back, back);
}

static void expect_failure(const char *name, const ModelConfig *cfg, const Spoil *spoil, const char *message) {
    char hf[512], ckpt[512], msg[2048];
    snprintf(hf, sizeof hf, "%s/%s.hf", work_dir, name);
    snprintf(ckpt, sizeof ckpt, "%s/%s.ckpt", work_dir, name);
    make_hf_dir(hf, cfg, 3, ST_F32, 5000000000ull, spoil);
    int status = convert(msg, sizeof msg, 2, hf, ckpt);
    if (status != MT_EXIT_FAILURE) fail_msg("%s: exit %d, message: %s", name, status, msg);
    if (!strstr(msg, message)) fail_msg("%s: message '%s' lacks '%s'", name, msg, message);
    if (exists(ckpt)) fail_msg("%s: %s was written", name, ckpt);
}

static void test_errors(void **state) {
    (void)state;
    ModelConfig llama = tiny_config(FAMILY_LLAMA, false);
    Spoil skip = {.skip = "model.layers.1.mlp.up_proj.weight"};
    expect_failure("missing", &llama, &skip, "missing tensor 'model.layers.1.mlp.up_proj.weight'");
    Spoil transpose = {.transpose = "model.layers.0.mlp.gate_proj.weight"};
    expect_failure("shape", &llama, &transpose,
                   "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [16, 24], but config.json makes it [24, 16]");
    Spoil extra = {.extra = true};
    expect_failure("extra", &llama, &extra, "unexpected tensor 'model.layers.0.mlp.extra.weight'");
    Spoil gpt2 = {.model_type = "gpt2"};
    expect_failure("family", &llama, &gpt2, "model_type 'gpt2' is not a supported family (supported: llama, qwen2, qwen3, mixtral, qwen3_moe)");
    ModelConfig tied = tiny_config(FAMILY_LLAMA, true);
    Spoil untie = {.model_type = "qwen2"}; /* a llama directory called qwen2: the biases are missing */
    expect_failure("biases", &tied, &untie, "missing tensor 'model.layers.0.self_attn.q_proj.bias'");

    char msg[4096], hf[512], dst[512], path[600];
    /* config.json without weights */
    snprintf(hf, sizeof hf, "%s/noweights.hf", work_dir);
    snprintf(dst, sizeof dst, "%s/noweights.ckpt", work_dir);
    make_hf_dir(hf, &llama, 1, ST_F32, 5000000000ull, NULL);
    snprintf(path, sizeof path, "%s/model.safetensors", hf);
    remove(path);
    assert_int_equal(convert(msg, sizeof msg, 2, hf, dst), MT_EXIT_FAILURE);
    assert_non_null(strstr(msg, "missing model.safetensors"));
    assert_false(exists(dst));
    /* SRC that does not exist (a usage error, as every command's missing path); SRC that is not a checkpoint; DST
     * that exists */
    snprintf(path, sizeof path, "%s/nothing_here", work_dir);
    assert_int_equal(convert(msg, sizeof msg, 2, path, dst), MT_EXIT_USAGE);
    assert_non_null(strstr(msg, "nothing_here: No such file or directory"));
    snprintf(path, sizeof path, "%s/empty_dir", work_dir);
    mkdir(path, 0777);
    assert_int_equal(convert(msg, sizeof msg, 2, path, dst), MT_EXIT_FAILURE);
    assert_false(exists(dst));
    assert_int_equal(convert(msg, sizeof msg, 2, hf, path), MT_EXIT_USAGE); /* as data build's existing PREFIX */
    assert_non_null(strstr(msg, "empty_dir already exists"));
    /* DST with a trailing "/" or "/.": the directory of that name (it made DST and then refused it, existing) */
    snprintf(path, sizeof path, "%s/slash.ckpt/", work_dir);
    if (convert(msg, sizeof msg, 2, "tests/fixtures/hf/llama_tied", path) != MT_EXIT_OK) fail_msg("%s", msg);
    snprintf(path, sizeof path, "%s/slash.ckpt", work_dir);
    char slash_back[700];
    snprintf(slash_back, sizeof slash_back, "%s/slash.hf/.", work_dir);
    if (convert(msg, sizeof msg, 2, path, slash_back) != MT_EXIT_OK) fail_msg("%s", msg);
    snprintf(slash_back, sizeof slash_back, "%s/slash.hf/config.json", work_dir);
    assert_true(exists(slash_back));
    /* a DST too long for its temporary name: a usage error that says so (it was an empty message), nothing made */
    char *longer = malloc(3200);
    snprintf(longer, 3200, "%s/long/", work_dir);
    memset(longer + strlen(longer), 'd', 3200 - strlen(longer) - 1);
    longer[3199] = '\0';
    assert_int_equal(convert(msg, sizeof msg, 2, "tests/fixtures/hf/llama_tied", longer), MT_EXIT_USAGE);
    assert_non_null(strstr(msg, "DST: expected a path of at most 3071 characters"));
    snprintf(slash_back, sizeof slash_back, "%s/long", work_dir);
    assert_false(exists(slash_back));
    /* into a checkpoint, whose files live in MT_PATH_MAX buffers: at most 960 characters, said before any mkdir */
    longer[strlen(work_dir) + 1000] = '\0';
    assert_int_equal(convert(msg, sizeof msg, 2, "tests/fixtures/hf/llama_tied", longer), MT_EXIT_USAGE);
    assert_non_null(strstr(msg, "DST: a checkpoint's path is at most 960 characters"));
    assert_false(exists(slash_back));
    free(longer);
    /* usage */
    assert_int_equal(convert(msg, sizeof msg, 1, hf), MT_EXIT_USAGE);
    assert_non_null(strstr(msg, "missing DST"));
    assert_int_equal(convert(msg, sizeof msg, 4, hf, dst, "--dtype", "fp8"), MT_EXIT_USAGE);
    assert_non_null(strstr(msg, "--dtype: expected fp32, bf16 or fp16, found 'fp8'"));
    assert_int_equal(convert(msg, sizeof msg, 3, hf, dst, "--max-shard-size=lots"), MT_EXIT_USAGE);
    assert_int_equal(convert(msg, sizeof msg, 3, hf, dst, "--frobnicate"), MT_EXIT_USAGE);
    assert_int_equal(convert(msg, sizeof msg, 4, hf, dst, "--dtype", "bf16"), MT_EXIT_USAGE); /* HF -> megatrain */
    assert_int_equal(convert(msg, sizeof msg, 4, hf, dst, "--base-model", "x"), MT_EXIT_USAGE);
    assert_non_null(strstr(msg, "--base-model and --drop-expert-bias apply to megatrain -> Hugging Face only"));
    assert_false(exists(dst));
    /* --base-model: the adapters' base; not with --merge-lora, not of a checkpoint without adapters */
    snprintf(path, sizeof path, "%s/slash.ckpt", work_dir);
    assert_int_equal(convert(msg, sizeof msg, 5, path, dst, "--merge-lora", "--base-model", "x"), MT_EXIT_USAGE);
    assert_non_null(strstr(msg, "--merge-lora writes a whole model"));
    assert_int_equal(convert(msg, sizeof msg, 4, path, dst, "--base-model", "x"), MT_EXIT_FAILURE);
    assert_non_null(strstr(msg, "--base-model: ") && strstr(msg, "has no LoRA adapters"));
    assert_false(exists(dst));

    /* A damaged chunk stops the export (which streams the checkpoint) half-way, naming the tensor and the chunk;
     * nothing is left at DST or under its temporary name. */
    char ckpt[512], back[512], shard[600], tmp[700];
    case_dirs("damaged", hf, ckpt, back);
    make_hf_dir(hf, &llama, 3, ST_F32, 5000000000ull, NULL);
    if (convert(msg, sizeof msg, 2, hf, ckpt) != 0) fail_msg("%s", msg);
    snprintf(shard, sizeof shard, "%s/shard_00000.zst", ckpt);
    struct stat st;
    assert_int_equal(stat(shard, &st), 0);
    FILE *f = fopen(shard, "r+b");
    assert_non_null(f);
    fseek(f, st.st_size / 2, SEEK_SET);
    int byte = fgetc(f);
    fseek(f, st.st_size / 2, SEEK_SET);
    fputc(byte ^ 0x40, f);
    fclose(f);
    assert_int_equal(convert(msg, sizeof msg, 2, ckpt, back), MT_EXIT_FAILURE);
    if (!strstr(msg, "shard_00000.zst: tensor '") || !strstr(msg, "' chunk ")) fail_msg("%s", msg);
    assert_false(exists(back));
    assert_int_equal(mt_temp_name_host(tmp, sizeof tmp, back), 0); /* DST.tmp.HOST.PID */
    assert_false(exists(tmp));
}

/* No leftovers at DST (nor a DST.tmp.* beside it) when writing fails half-way. */
static void assert_nothing_at(const char *dst) {
    if (exists(dst)) fail_msg("%s was written", dst);
    char dir[512];
    snprintf(dir, sizeof dir, "%s", dst);
    char *slash = strrchr(dir, '/');
    *slash = '\0';
    DIR *d = opendir(dir);
    struct dirent *e;
    while ((e = readdir(d)))
        if (strncmp(e->d_name, slash + 1, strlen(slash + 1)) == 0) fail_msg("%s/%s was left behind", dir, e->d_name);
    closedir(d);
}

static void test_write_failure(void **state) {
    (void)state;
    char hf[512], ckpt[512], dst[512], msg[2048];
    snprintf(hf, sizeof hf, "%s/full.hf", work_dir);
    snprintf(ckpt, sizeof ckpt, "%s/full.ckpt", work_dir);
    ModelConfig cfg = tiny_config(FAMILY_LLAMA, false);
    make_hf_dir(hf, &cfg, 5, ST_F32, 5000000000ull, NULL);
    assert_int_equal(convert(msg, sizeof msg, 2, hf, ckpt), 0);
    /* Files may grow to 4 KB only: config.json fits, the weights do not. */
    struct rlimit saved, small = {4096, 4096};
    getrlimit(RLIMIT_FSIZE, &saved);
    small.rlim_max = saved.rlim_max;
    signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &small);
    snprintf(dst, sizeof dst, "%s/full.out", work_dir);
    int to_hf = convert(msg, sizeof msg, 2, ckpt, dst);
    char dst2[512], msg2[2048];
    snprintf(dst2, sizeof dst2, "%s/full2.ckpt", work_dir);
    int to_ckpt = convert(msg2, sizeof msg2, 2, hf, dst2);
    setrlimit(RLIMIT_FSIZE, &saved);
    signal(SIGXFSZ, SIG_DFL);
    if (to_hf != MT_EXIT_FAILURE) fail_msg("megatrain -> HF on a full disk: exit %d", to_hf);
    assert_non_null(strstr(msg, "model.safetensors: cannot write"));
    assert_nothing_at(dst);
    if (to_ckpt != MT_EXIT_FAILURE) fail_msg("HF -> megatrain on a full disk: exit %d", to_ckpt);
    assert_nothing_at(dst2);
}

/* A run directory (checkpoints/latest_checkpointed_iteration.txt) converts
 * from its latest checkpoint; init_from loads the same weights. */
static void test_run_dir_and_init_from(void **state) {
    (void)state;
    char hf[512], run[512], ckpts[600], iter[700], path[800], back[512], msg[2048], err[1024];
    snprintf(hf, sizeof hf, "%s/run_src.hf", work_dir);
    snprintf(run, sizeof run, "%s/run", work_dir);
    snprintf(ckpts, sizeof ckpts, "%s/checkpoints", run);
    snprintf(iter, sizeof iter, "%s/iter_0000007", ckpts);
    ModelConfig cfg = tiny_config(FAMILY_QWEN3, false);
    cfg.token_ids = (SpecialTokenIds){.num_eos = 1, .eos = {3}, .has_pad = true, .pad = 0};
    make_hf_dir(hf, &cfg, 99, ST_F32, 5000000000ull, NULL);
    mkdir(run, 0777);
    mkdir(ckpts, 0777);
    if (convert(msg, sizeof msg, 2, hf, iter) != 0) fail_msg("%s", msg);
    snprintf(path, sizeof path, "%s/latest_checkpointed_iteration.txt", ckpts);
    FILE *f = fopen(path, "w");
    fputs("7\n", f);
    fclose(f);
    snprintf(back, sizeof back, "%s/run_back.hf", work_dir);
    if (convert(msg, sizeof msg, 2, run, back) != 0) fail_msg("%s", msg);
    assert_same_files(hf, back);

    /* init_from: the same weights as the seeded source model, the token ids
     * the recipe leaves unset, and the carried files */
    Model *source = model_create(&cfg, &cpu_backend, 1, 1);
    model_init_weights(source, 99);
    ModelConfig recipe_model = cfg;
    recipe_model.token_ids = (SpecialTokenIds){.has_bos = true, .bos = 1}; /* its own bos, no eos or pad */
    Model *model = model_create(&recipe_model, &cpu_backend, 2, 8);
    model_init_weights(model, 1);
    CkptHfFiles files = {0};
    if (init_from_checkpoint(model, run, &files, NULL, err, sizeof err) != 0) fail_msg("%s", err);
    assert_memory_equal(model->params, source->params, (size_t)model->num_floats * sizeof(float));
    const SpecialTokenIds *ids = &model->cfg.token_ids;
    assert_true(ids->has_bos && ids->bos == 1 && ids->has_pad && ids->pad == 0 && ids->num_eos == 1 && ids->eos[0] == 3);
    assert_int_equal(files.count, (int)(sizeof carried / sizeof carried[0]));
    for (size_t i = 0; i < sizeof carried / sizeof carried[0]; i++) {
        const CkptHfFile *got = ckpt_hf_files_find(&files, carried[i][0]);
        assert_non_null(got);
        assert_true(got->size == strlen(carried[i][1]) && memcmp(got->data, carried[i][1], got->size) == 0);
    }
    ckpt_hf_files_free(&files);
    model_free(model);
    model_free(source);

    /* a recipe model that is not the checkpoint's */
    ModelConfig other = cfg;
    other.intermediate_size = 32;
    model = model_create(&other, &cpu_backend, 1, 1);
    assert_int_equal(init_from_checkpoint(model, iter, NULL, NULL, err, sizeof err), MT_EXIT_USAGE);
    assert_non_null(strstr(err, "model.intermediate_size is 24 in the checkpoint but 32 in the recipe"));
    model_free(model);
    other = cfg;
    other.rope_theta = 500000.0;
    model = model_create(&other, &cpu_backend, 1, 1);
    assert_int_equal(init_from_checkpoint(model, iter, NULL, NULL, err, sizeof err), MT_EXIT_USAGE);
    assert_non_null(strstr(err, "model.rope_theta is 10000 in the checkpoint but 500000 in the recipe"));
    model_free(model);
    other = cfg;
    other.max_position_embeddings = 4096; /* does not change the computation: allowed */
    model = model_create(&other, &cpu_backend, 1, 1);
    assert_int_equal(init_from_checkpoint(model, iter, NULL, NULL, err, sizeof err), 0);
    model_free(model);
    snprintf(path, sizeof path, "%s/no_such_ckpt", work_dir);
    model = model_create(&cfg, &cpu_backend, 1, 1);
    assert_int_equal(init_from_checkpoint(model, path, NULL, NULL, err, sizeof err), MT_EXIT_FAILURE);
    assert_non_null(strstr(err, "init_from: "));
    assert_non_null(strstr(err, "no_such_ckpt"));
    model_free(model);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_round_trips_streamed_in_blocks),
        cmocka_unit_test(test_merge_lora_streamed),
        cmocka_unit_test(test_drop_expert_bias),
        cmocka_unit_test(test_tolerated_extras),
        cmocka_unit_test(test_token_ids_and_generation_config),
        cmocka_unit_test(test_tied_as_transformers5),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_write_failure),
        cmocka_unit_test(test_run_dir_and_init_from),
    };
    return cmocka_run_group_tests(tests, work_dir_setup, work_dir_teardown);
}
