/* test_ckpt_io.c: checkpoint directories on disk: every tensor, the
 * optimizer and the TrainState come back bit for bit (also NaN,
 * infinities, -0 and denormals, and with tensors cut into many chunks, read
 * back by regions across chunk boundaries); corruption (a flipped byte in a
 * chunk, a truncated shard, a damaged model.yaml or metadata, a missing
 * metadata) is detected and named; an existing checkpoint is never
 * overwritten; shape mismatches and weights-only checkpoints are refused
 * where a run's state is needed. bf16 moments (optimizer.state_dtype: bf16)
 * are stored as bf16 tensors (2 bytes an element, the parameters staying
 * fp32), written by ckpt_write_dir and by the async saver, and load bit for
 * bit into bf16 moments, widened exactly into fp32 ones; fp32 moments load
 * into bf16 ones rounded to nearest even (float16.h's f32_to_bf16, NaN and
 * infinities included). Files carried for the Hugging Face export are
 * written as given and read back verified, a damaged one left out with a
 * warning. */
#include <fcntl.h>
#include <math.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "ckpt/checkpoint.h"
#include "ckpt/ckpt_fs.h"
#include "ckpt/ckpt_model_config.h"
#include "ckpt/ckpt_reader.h"
#include "ckpt/ckpt_run.h"
#include "ckpt/ckpt_writer.h"
#include "core/fs.h"
#include "core/float16.h"
#include "test_ckpt_util.h"

static void test_round_trip_bit_exact(void **state) {
    (void)state;
    Saved s;
    make_saved(&s, 1);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/rt", work);
    write_saved(dir, &s);
    expect_loads_equal(dir, &s);

    ModelConfig cfg;
    char err[2048];
    assert_int_equal(ckpt_read_model_config(dir, &cfg, err, sizeof err), 0);
    assert_int_equal(ckpt_model_shape_check(&cfg, &recipe.model, err, sizeof err), 0);
    assert_true(cfg.attention_bias);
    assert_int_equal(cfg.vocab_size, 40);
    assert_true(cfg.rope_theta == recipe.model.rope_theta && cfg.rms_norm_eps == recipe.model.rms_norm_eps);

    Model *weights_only = new_model(&cfg);
    assert_int_equal(ckpt_load_model(dir, weights_only, err, sizeof err), 0);
    assert_memory_equal(weights_only->params, s.model->params, (size_t)s.model->num_floats * 4);
    model_free(weights_only);
    free_saved(&s);
}

/* s with its moments as bf16: f32_to_bf16 of its fp32 moments (so NaN, infinities and denormals occur). */
static void make_saved_bf16(Saved *s, uint64_t seed) {
    make_saved(s, seed);
    AdamW b;
    adamw_init_dtype(&b, s->opt.num_floats, DTYPE_BF16);
    for (long i = 0; i < b.num_floats; i++) {
        b.m_bf16[i] = f32_to_bf16(s->opt.m[i]);
        b.v_bf16[i] = f32_to_bf16(s->opt.v[i]);
    }
    b.step = s->opt.step;
    adamw_free(&s->opt);
    s->opt = b;
}

/* Load dir's moments into fresh moments of `dtype` (the parameters and the step checked against s). */
static void load_moments_as(const char *dir, const Saved *s, DType dtype, AdamW *opt) {
    Model *model = new_model(&recipe.model);
    adamw_init_dtype(opt, model->num_floats, dtype);
    char err[2048];
    if (load_training(dir, model, opt, NULL, err, sizeof err) != 0) fail_msg("%s", err);
    assert_memory_equal(model->params, s->model->params, (size_t)model->num_floats * 4);
    assert_int_equal(opt->step, s->opt.step);
    model_free(model);
}

/* The dtypes a checkpoint records: fp32 parameters, bf16 moments of 2 bytes an element without a filter. */
static void expect_bf16_moments_stored(const char *dir) {
    char err[2048];
    CkptReader *r = ckpt_reader_open(dir, err, sizeof err);
    if (!r) fail_msg("%s", err);
    int moments = 0;
    for (int i = 0; i < r->meta.num_tensors; i++) {
        const CkptTensorMeta *t = &r->meta.tensors[i];
        const bool moment = strncmp(t->name, "optimizer.", 10) == 0;
        assert_int_equal(t->dtype, moment ? CKPT_DTYPE_BF16 : CKPT_DTYPE_FP32);
        assert_int_equal(ckpt_tensor_raw_bytes(t), (uint64_t)ckpt_numel(t->ndim, t->shape) * (moment ? 2 : 4));
        for (int c = 0; moment && c < t->num_chunks; c++) assert_int_equal(t->chunks[c].filter, CKPT_FILTER_NONE);
        moments += moment;
    }
    assert_true(moments > 0);
    ckpt_reader_close(r);
}

static void test_bf16_moments(void **state) {
    (void)state;
    Saved b;
    make_saved_bf16(&b, 21);
    const long n = b.opt.num_floats;
    char dir[512], err[2048];
    snprintf(dir, sizeof dir, "%s/bf16", work);
    write_saved(dir, &b);
    expect_bf16_moments_stored(dir);
    AdamW got;
    load_moments_as(dir, &b, DTYPE_BF16, &got); /* bf16 -> bf16: the same bits */
    assert_memory_equal(got.m_bf16, b.opt.m_bf16, (size_t)n * 2);
    assert_memory_equal(got.v_bf16, b.opt.v_bf16, (size_t)n * 2);
    adamw_free(&got);
    load_moments_as(dir, &b, DTYPE_FP32, &got); /* bf16 -> fp32: widened exactly */
    for (long i = 0; i < n; i++) {
        const float m = bf16_to_f32(b.opt.m_bf16[i]), v = bf16_to_f32(b.opt.v_bf16[i]);
        assert_memory_equal(&got.m[i], &m, 4);
        assert_memory_equal(&got.v[i], &v, 4);
    }
    adamw_free(&got);

    /* the async saver's snapshot of bf16 moments */
    char ck[512], iter[600];
    snprintf(ck, sizeof ck, "%s/bf16-async/checkpoints", work);
    CkptSaver *saver = ckpt_saver_create(ck, &recipe);
    assert_int_equal(saver_save(saver, &b, err, sizeof err), 0);
    memset(b.opt.m_bf16, 0xff, (size_t)n * 2); /* the loop goes on while the writer works */
    assert_int_equal(ckpt_saver_wait(saver, err, sizeof err), 0);
    ckpt_saver_free(saver);
    snprintf(iter, sizeof iter, "%s/iter_0000017", ck);
    expect_bf16_moments_stored(iter);
    load_moments_as(iter, &b, DTYPE_BF16, &got);
    Saved again;
    make_saved_bf16(&again, 21); /* the bits saved */
    assert_memory_equal(got.m_bf16, again.opt.m_bf16, (size_t)n * 2);
    assert_memory_equal(got.v_bf16, again.opt.v_bf16, (size_t)n * 2);
    adamw_free(&got);
    free_saved(&again);
    free_saved(&b);

    /* fp32 -> bf16: rounded to nearest even */
    Saved f;
    make_saved(&f, 22);
    snprintf(dir, sizeof dir, "%s/fp32-to-bf16", work);
    write_saved(dir, &f);
    load_moments_as(dir, &f, DTYPE_BF16, &got);
    long inexact = 0;
    for (long i = 0; i < n; i++) {
        assert_int_equal(got.m_bf16[i], f32_to_bf16(f.opt.m[i]));
        assert_int_equal(got.v_bf16[i], f32_to_bf16(f.opt.v[i]));
        inexact += bf16_to_f32(got.m_bf16[i]) != f.opt.m[i];
    }
    assert_true(inexact > n / 2);
    adamw_free(&got);
    free_saved(&f);
}

/* stderr of fn(arg) captured into out (the warnings). */
static void capture_stderr(void (*fn)(void *), void *arg, char *out, size_t len) {
    char path[512];
    snprintf(path, sizeof path, "%s/stderr.txt", work);
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    dup2(fd, 2);
    close(fd);
    fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *f = fopen(path, "r");
    size_t got = fread(out, 1, len - 1, f);
    out[got] = '\0';
    fclose(f);
}

typedef struct HfRead {
    const char *dir;
    CkptHfFiles files;
    int rc;
} HfRead;
static void read_hf(void *arg) {
    HfRead *h = arg;
    char err[1024];
    h->rc = ckpt_hf_files_read(h->dir, &h->files, err, sizeof err);
}

/* Files carried for the Hugging Face export: written byte for byte by
 * ckpt_write_dir and by the async saver (whose caller may free nothing
 * while it writes), listed in the metadata, read back verified; a
 * truncated, a corrupt and a missing one are each left out with a warning
 * naming the file, while the weights still load; names other than the
 * carried list (the checkpoint's own among them) are refused. */
static void test_hf_files(void **state) {
    (void)state;
    char err[2048], dir[512], path[700], warnings[4096];
    CkptHfFiles files = {0};
    const char tokenizer[] = "{\"model\": {\"type\": \"BPE\"}}\n", generation[] = "{\"eos_token_id\": 3}\n";
    unsigned char binary[300];
    for (int i = 0; i < 300; i++) binary[i] = (unsigned char)(i * 37);
    assert_int_equal(ckpt_hf_files_add(&files, "tokenizer.json", tokenizer, strlen(tokenizer), err, sizeof err), 0);
    assert_int_equal(ckpt_hf_files_add(&files, "generation_config.json", generation, strlen(generation), err, sizeof err), 0);
    assert_int_equal(ckpt_hf_files_add(&files, "tokenizer.model", binary, sizeof binary, err, sizeof err), 0);
    assert_int_equal(ckpt_hf_files_add(&files, "added_tokens.json", "", 0, err, sizeof err), 0);
    assert_int_equal(files.count, 4);
    assert_int_equal(ckpt_hf_files_add(&files, "model.yaml", "x", 1, err, sizeof err), -1);
    assert_int_equal(ckpt_hf_files_add(&files, "shard_00000.zst", "x", 1, err, sizeof err), -1);
    assert_int_equal(ckpt_hf_files_add(&files, "../x", "x", 1, err, sizeof err), -1);
    /* names outside the carried list: the export would copy them beside its own output, and the import read them */
    assert_int_equal(ckpt_hf_files_add(&files, "config.json", "{}", 2, err, sizeof err), -1);
    assert_int_equal(ckpt_hf_files_add(&files, "model.safetensors.index.json", "{}", 2, err, sizeof err), -1);
    assert_int_equal(ckpt_hf_files_add(&files, "evil.sh", "x", 1, err, sizeof err), -1);
    assert_non_null(strstr(err, "'evil.sh' is not a file a checkpoint carries"));

    Saved s;
    make_saved(&s, 31);
    const CkptMoments m = saved_moments(&s);
    const CkptState st = saved_state(&s);
    snprintf(dir, sizeof dir, "%s/hf_files", work);
    CheckpointWrite what = {.model_config = &recipe.model, .model = s.model, .recipe = &recipe, .moments = &m,
                            .state = &st, .compression_level = 3, .hf_files = &files};
    if (ckpt_write_dir(dir, &what, err, sizeof err) != 0) fail_msg("%s", err);
    snprintf(path, sizeof path, "%s/tokenizer.model", dir);
    unsigned char *bytes = NULL;
    size_t len = 0;
    assert_int_equal(ckpt_read_file(path, 1 << 20, &bytes, &len, err, sizeof err), 0);
    assert_true(len == sizeof binary && memcmp(bytes, binary, len) == 0); /* as given, in the directory */
    free(bytes);
    HfRead h = {.dir = dir};
    capture_stderr(read_hf, &h, warnings, sizeof warnings);
    assert_int_equal(h.rc, 0);
    assert_string_equal(warnings, "");
    assert_int_equal(h.files.count, 4);
    for (int i = 0; i < files.count; i++) {
        const CkptHfFile *got = ckpt_hf_files_find(&h.files, files.files[i].name);
        assert_non_null(got);
        assert_true(got->size == files.files[i].size && memcmp(got->data, files.files[i].data, got->size) == 0);
    }
    ckpt_hf_files_free(&h.files);
    expect_loads_equal(dir, &s);

    /* the async saver carries them into every checkpoint */
    char ck[512], iter[600];
    snprintf(ck, sizeof ck, "%s/hf-async/checkpoints", work);
    CkptSaver *saver = ckpt_saver_create(ck, &recipe);
    ckpt_saver_carry_hf_files(saver, &files);
    assert_int_equal(saver_save(saver, &s, err, sizeof err), 0);
    assert_int_equal(ckpt_saver_wait(saver, err, sizeof err), 0);
    ckpt_saver_free(saver);
    snprintf(iter, sizeof iter, "%s/iter_0000017", ck);
    h = (HfRead){.dir = iter};
    capture_stderr(read_hf, &h, warnings, sizeof warnings);
    assert_int_equal(h.files.count, 4);
    assert_non_null(ckpt_hf_files_find(&h.files, "generation_config.json"));
    ckpt_hf_files_free(&h.files);

    /* damage: tokenizer.json truncated, tokenizer.model's bytes changed, generation_config.json gone */
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    assert_int_equal(truncate(path, 5), 0);
    snprintf(path, sizeof path, "%s/tokenizer.model", dir);
    int fd = open(path, O_WRONLY);
    assert_int_equal(pwrite(fd, "X", 1, 100), 1);
    close(fd);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    assert_int_equal(unlink(path), 0);
    h = (HfRead){.dir = dir};
    capture_stderr(read_hf, &h, warnings, sizeof warnings);
    assert_int_equal(h.rc, 0);
    assert_int_equal(h.files.count, 1); /* added_tokens.json */
    assert_non_null(ckpt_hf_files_find(&h.files, "added_tokens.json"));
    if (!strstr(warnings, "tokenizer.json: 5 bytes, the metadata says") ||
        !strstr(warnings, "tokenizer.model: checksum mismatch") || !strstr(warnings, "generation_config.json") ||
        !strstr(warnings, "it is left out"))
        fail_msg("warnings do not name the damaged files: %s", warnings);
    ckpt_hf_files_free(&h.files);
    expect_loads_equal(dir, &s); /* the weights do not depend on them */
    free_saved(&s);
    ckpt_hf_files_free(&files);
}

static void flip_byte(const char *path, long offset);

static void test_many_chunks_and_regions(void **state) {
    (void)state;
    Saved s;
    make_saved(&s, 2);
    int num_sources;
    CkptSource *sources = ckpt_sources_from_model(s.model, s.model->params, s.opt.m, s.opt.v, &num_sources);
    CkptPayload p = {.num_sources = num_sources, .sources = sources, .model_config = &recipe.model,
                     .recipe = &recipe, .has_state = true,
                     .state = saved_state(&s), .iteration = 17,
                     .compression_level = 1, .filter = CKPT_FILTER_SHUFFLE4, .threads = 2,
                     .chunk_bytes = 3 * 16 * 4 /* three rows of a [*, 16] matrix */};
    char dir[512], err[2048];
    snprintf(dir, sizeof dir, "%s/chunks", work);
    CkptWriteStats stats;
    assert_int_equal(ckpt_write_payload(dir, &p, &stats, err, sizeof err), 0);
    assert_int_equal(stats.raw_bytes, (uint64_t)s.model->num_floats * 12);
    expect_loads_equal(dir, &s);

    CkptReader *r = ckpt_reader_open(dir, err, sizeof err);
    assert_non_null(r);
    const CkptTensorMeta *embed = ckpt_meta_find(&r->meta, "embed.weight"); /* [40, 16]: 14 chunks */
    assert_non_null(embed);
    assert_int_equal(embed->num_chunks, 14);
    const ParamInfo *info = model_find_param(s.model, "embed.weight");
    const float *src = s.model->params + info->offset;
    const int64_t starts[][2] = {{0, 0}, {2, 5}, {5, 0}, {37, 15}, {1, 3}};
    const int64_t shapes[][2] = {{40, 16}, {2, 3}, {7, 16}, {3, 1}, {30, 11}};
    const int saved_threads = omp_get_max_threads();
    for (int threads = 1; threads <= 3; threads += 2) { /* one chunk after another, and several at once */
        omp_set_num_threads(threads);
        for (int k = 0; k < 5; k++) {
            float out[640];
            assert_int_equal(ckpt_reader_read(r, embed, starts[k], shapes[k], out, err, sizeof err), 0);
            for (int64_t i = 0; i < shapes[k][0]; i++)
                assert_memory_equal(&out[i * shapes[k][1]], &src[(starts[k][0] + i) * 16 + starts[k][1]],
                                    (size_t)shapes[k][1] * 4);
        }
    }
    const int64_t outside_start[2] = {39, 0}, outside_shape[2] = {2, 16};
    float out[32];
    assert_int_equal(ckpt_reader_read(r, embed, outside_start, outside_shape, out, err, sizeof err), -1);
    /* chunks 5 and 9 damaged: both ways name chunk 5, the first, with the same words */
    long victims[2];
    for (int i = 0; i < 2; i++) {
        const CkptChunk *ch = &embed->chunks[i ? 9 : 5];
        victims[i] = (long)(ch->offset + ch->stored_bytes / 2);
    }
    ckpt_reader_close(r);
    char path[600], first_err[2048];
    snprintf(path, sizeof path, "%s/shard_00000.zst", dir);
    for (int i = 0; i < 2; i++) flip_byte(path, victims[i]);
    const int64_t whole_start[2] = {0, 0}, whole_shape[2] = {40, 16};
    float whole[640];
    for (int threads = 1; threads <= 3; threads += 2) {
        omp_set_num_threads(threads);
        r = ckpt_reader_open_metadata(dir, err, sizeof err);
        assert_non_null(r);
        embed = ckpt_meta_find(&r->meta, "embed.weight");
        assert_int_equal(ckpt_reader_read(r, embed, whole_start, whole_shape, whole, err, sizeof err), -1);
        if (!strstr(err, "tensor 'embed.weight' chunk 5 ")) fail_msg("%d threads: %s", threads, err);
        if (threads == 1) snprintf(first_err, sizeof first_err, "%s", err);
        else assert_string_equal(err, first_err);
        ckpt_reader_close(r);
    }
    omp_set_num_threads(saved_threads);
    for (int i = 0; i < 2; i++) flip_byte(path, victims[i]);
    free(sources);
    free_saved(&s);
}

/* A 3-D stack whose planes exceed a chunk is cut along dim 1 too; every
 * region reads back. */
static void test_3d_chunks(void **state) {
    (void)state;
    float data[4 * 6 * 5];
    for (int i = 0; i < 120; i++) data[i] = (float)i * 0.5f - 7.0f;
    CkptSource src = {.name = "layers.0.mlp.experts.up_proj.weight", .ndim = 3, .global_shape = {4, 6, 5},
                      .shape = {4, 6, 5}, .data = data};
    CkptPayload p = {.num_sources = 1, .sources = &src, .model_config = &recipe.model, .compression_level = 1,
                     .filter = CKPT_FILTER_SHUFFLE4, .threads = 2, .chunk_bytes = 2 * 5 * 4 /* two lines */};
    char dir[512], err[2048];
    snprintf(dir, sizeof dir, "%s/chunks3d", work);
    assert_int_equal(ckpt_write_payload(dir, &p, NULL, err, sizeof err), 0);
    CkptReader *r = ckpt_reader_open(dir, err, sizeof err);
    assert_non_null(r);
    const CkptTensorMeta *t = ckpt_meta_find(&r->meta, src.name);
    assert_int_equal(t->num_chunks, 4 * 3); /* [1, 2, 5] each */
    const int64_t start[3] = {1, 1, 2}, shape[3] = {2, 4, 3};
    float out[24];
    assert_int_equal(ckpt_reader_read(r, t, start, shape, out, err, sizeof err), 0);
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 4; b++)
            for (int c = 0; c < 3; c++)
                assert_true(out[(a * 4 + b) * 3 + c] == data[((1 + a) * 6 + 1 + b) * 5 + 2 + c]);
    ckpt_reader_close(r);
}

/* CkptFillFn that copies from a source's in-memory twin (fill_ctx), counting each element it makes of source
 * `counted`, and fails for a source named "fails". */
static unsigned char made[4096];
static const CkptSource *counted;
static int copy_fill(const CkptSource *source, int64_t first, int64_t count, void *out, char *err, size_t errlen) {
    if (strcmp(source->name, "fails") == 0) {
        snprintf(err, errlen, "the fill failed at element %lld", (long long)first);
        return -1;
    }
    const CkptSource *twin = source->fill_ctx;
    const size_t elem = ckpt_dtype_size(source->dtype);
    memcpy(out, (const char *)twin->data + (size_t)first * elem, (size_t)count * elem);
    for (int64_t i = first; twin == counted && i < first + count && i < 4096; i++) made[i]++;
    return 0;
}

/* Sources made chunk by chunk by a fill (convert's streaming) give the same
 * shard, byte for byte, and the same chunks as the same regions in memory:
 * a model's parameters cut into many chunks, a 3-D stack whose planes are
 * cut along dim 1, a bf16 tensor; the fill is asked for every element once.
 * A failing fill fails the save, naming the tensor, and leaves nothing. */
static void test_filled_sources(void **state) {
    (void)state;
    Saved s;
    make_saved(&s, 3);
    int num_model;
    CkptSource *model_sources = ckpt_sources_from_model(s.model, s.model->params, NULL, NULL, &num_model);
    float stack[4 * 6 * 5];
    uint16_t halves[7 * 3];
    for (int i = 0; i < 120; i++) stack[i] = (float)i * 0.5f - 7.0f;
    for (int i = 0; i < 21; i++) halves[i] = (uint16_t)(0x3f80 + i);
    const int n = num_model + 2;
    CkptSource *in_memory = calloc((size_t)n, sizeof *in_memory), *filled = calloc((size_t)n, sizeof *filled);
    memcpy(in_memory, model_sources, (size_t)num_model * sizeof *in_memory);
    in_memory[num_model] = (CkptSource){.name = "stack", .ndim = 3, .global_shape = {4, 6, 5}, .shape = {4, 6, 5},
                                        .data = stack};
    in_memory[num_model + 1] = (CkptSource){.name = "halves", .ndim = 2, .global_shape = {7, 3}, .shape = {7, 3},
                                            .data = halves, .dtype = CKPT_DTYPE_BF16};
    for (int i = 0; i < n; i++) {
        filled[i] = in_memory[i];
        filled[i].data = NULL;
        filled[i].fill = copy_fill;
        filled[i].fill_ctx = &in_memory[i];
    }
    memset(made, 0, sizeof made);
    counted = &in_memory[0];
    assert_int_equal(in_memory[0].shape[0] * in_memory[0].shape[1], 640); /* the embedding, [40, 16] */
    char dirs[2][512], err[2048];
    for (int k = 0; k < 2; k++) {
        CkptPayload p = {.num_sources = n, .sources = k ? filled : in_memory, .model_config = &recipe.model,
                         .compression_level = 1, .filter = CKPT_FILTER_SHUFFLE4, .threads = 2,
                         .chunk_bytes = 2 * 5 * 4 /* two lines of the stack */};
        snprintf(dirs[k], sizeof dirs[k], "%s/filled%d", work, k);
        if (ckpt_write_payload(dirs[k], &p, NULL, err, sizeof err) != 0) fail_msg("%s", err);
    }
    /* each element of the embedding (the first source, 640 floats) made exactly once */
    for (int i = 0; i < 640; i++) assert_int_equal(made[i], 1);
    size_t len[2];
    unsigned char *shard[2];
    for (int k = 0; k < 2; k++) {
        char path[1100];
        snprintf(path, sizeof path, "%s/shard_00000.zst", dirs[k]);
        assert_int_equal(ckpt_read_file(path, (size_t)1 << 26, &shard[k], &len[k], err, sizeof err), 0);
    }
    assert_int_equal(len[0], len[1]);
    assert_memory_equal(shard[0], shard[1], len[0]);
    CkptReader *r[2];
    for (int k = 0; k < 2; k++) assert_non_null(r[k] = ckpt_reader_open(dirs[k], err, sizeof err));
    assert_int_equal(r[0]->meta.num_tensors, n);
    assert_int_equal(r[1]->meta.num_tensors, n);
    for (int t = 0; t < n; t++) {
        const CkptTensorMeta *a = &r[0]->meta.tensors[t], *b = &r[1]->meta.tensors[t];
        assert_string_equal(a->name, b->name);
        assert_int_equal(a->dtype, b->dtype);
        assert_int_equal(a->num_chunks, b->num_chunks);
        for (int c = 0; c < a->num_chunks; c++) {
            assert_int_equal(a->chunks[c].offset, b->chunks[c].offset);
            assert_int_equal(a->chunks[c].crc32c, b->chunks[c].crc32c);
            assert_memory_equal(a->chunks[c].start, b->chunks[c].start, sizeof a->chunks[c].start);
            assert_memory_equal(a->chunks[c].shape, b->chunks[c].shape, sizeof a->chunks[c].shape);
        }
    }
    assert_int_equal(ckpt_meta_find(&r[1]->meta, "stack")->num_chunks, 4 * 3);
    for (int k = 0; k < 2; k++) ckpt_reader_close(r[k]);
    free(shard[0]);
    free(shard[1]);

    filled[1].name = "fails";
    CkptPayload p = {.num_sources = n, .sources = filled, .model_config = &recipe.model, .compression_level = 1,
                     .filter = CKPT_FILTER_SHUFFLE4, .threads = 2};
    char dir[512];
    snprintf(dir, sizeof dir, "%s/filled_fails", work);
    assert_int_equal(ckpt_write_payload(dir, &p, NULL, err, sizeof err), -1);
    assert_non_null(strstr(err, "tensor 'fails': the fill failed at element 0"));
    struct stat st;
    assert_int_not_equal(stat(dir, &st), 0);
    char tmp[1100];
    assert_int_equal(mt_temp_name(tmp, sizeof tmp, dir), 0);
    assert_int_not_equal(stat(tmp, &st), 0);
    free(filled);
    free(in_memory);
    free(model_sources);
    free_saved(&s);
}

/* A model config whose model.yaml would not load back (rms_norm_eps 0: the YAML reader wants > 0) is refused by
 * the writer, naming the key, and nothing is left: a checkpoint written always loads. */
static void test_unloadable_config_refused(void **state) {
    (void)state;
    ModelConfig cfg = recipe.model;
    cfg.rms_norm_eps = 0;
    float data[4] = {1, 2, 3, 4};
    CkptSource src = {.name = "x", .ndim = 1, .global_shape = {4}, .shape = {4}, .data = data};
    CkptPayload p = {.num_sources = 1, .sources = &src, .model_config = &cfg, .compression_level = 1,
                     .filter = CKPT_FILTER_SHUFFLE4, .threads = 1};
    char dir[512], err[2048];
    snprintf(dir, sizeof dir, "%s/unloadable", work);
    assert_int_equal(ckpt_write_payload(dir, &p, NULL, err, sizeof err), -1);
    if (!strstr(err, "the model config cannot be saved so that it loads (model.yaml: rms_norm_eps: expected a number > 0"))
        fail_msg("%s", err);
    struct stat st;
    assert_int_not_equal(stat(dir, &st), 0);
    p.model_config = &recipe.model;
    assert_int_equal(ckpt_write_payload(dir, &p, NULL, err, sizeof err), 0);
}

/* The distributed optimizer's moments: flat ranges that start and end
 * inside rows and planes of a 3-D expert block (ep rank 1 of 2) become boxes
 * of the global tensors holding exactly the right values, for fp32 and for
 * bf16 moments (the flat indices are exact in bf16). */
static void check_sharded_boxes(CkptDType dtype) {
    ParamInfo infos[2];
    memset(infos, 0, sizeof infos);
    snprintf(infos[0].name, sizeof infos[0].name, "dense.weight");
    infos[0] = (ParamInfo){.ndim = 2, .shape = {5, 3, 1}, .global_shape = {5, 3, 1}, .numel = 15, .offset = 0,
                           .norm_owner = true};
    snprintf(infos[0].name, sizeof infos[0].name, "dense.weight");
    infos[1] = (ParamInfo){.ndim = 3, .shape = {2, 3, 4}, .global_shape = {4, 3, 4}, .global_start = {2, 0, 0},
                           .numel = 24, .offset = 15, .norm_owner = true, .expert = true};
    snprintf(infos[1].name, sizeof infos[1].name, "experts.weight");
    Model model = {.num_params = 2, .param_info = infos, .num_floats = 39, .num_grad_floats = 39};
    const size_t begin[2] = {7, 25}, end[2] = {20, 39};
    float m[27], v[27];
    uint16_t m16[27], v16[27];
    int k = 0;
    for (int r = 0; r < 2; r++)
        for (size_t i = begin[r]; i < end[r]; i++, k++) {
            m[k] = v[k] = (float)i; /* the local flat index */
            m16[k] = v16[k] = f32_to_bf16((float)i);
        }
    const bool bf16 = dtype == CKPT_DTYPE_BF16;
    int n = 0;
    CkptSource *sources = ckpt_sources_sharded(&model, NULL, NULL, false, false, true, bf16 ? (void *)m16 : (void *)m,
                                               bf16 ? (void *)v16 : (void *)v, dtype, begin, end, 2, &n);
    long covered = 0;
    for (int i = 0; i < n; i++) {
        const CkptSource *s = &sources[i];
        if (strncmp(s->name, "optimizer.m.", 12) != 0) continue;
        const ParamInfo *p = strstr(s->name, "experts") ? &infos[1] : &infos[0];
        assert_int_equal(s->dtype, dtype);
        const int64_t d1 = s->ndim > 1 ? s->shape[1] : 1, d2 = s->ndim > 2 ? s->shape[2] : 1;
        for (int64_t a = 0; a < s->shape[0]; a++)
            for (int64_t b = 0; b < d1; b++)
                for (int64_t c = 0; c < d2; c++, covered++) {
                    const int64_t at = (a * d1 + b) * d2 + c;
                    const float got = bf16 ? bf16_to_f32(((const uint16_t *)s->data)[at]) : ((const float *)s->data)[at];
                    long local; /* the local flat index of this global element */
                    if (p->ndim == 3)
                        local = (long)p->offset + (((s->start[0] + a - p->global_start[0]) * p->shape[1] + s->start[1] + b) *
                                                       p->shape[2] + s->start[2] + c);
                    else
                        local = (long)p->offset + (s->start[0] + a) * p->shape[1] + s->start[1] + b;
                    assert_true(got == (float)local);
                }
    }
    assert_int_equal(covered, 27); /* every owned float once */
    free(sources);
}

static void test_sharded_boxes(void **state) {
    (void)state;
    check_sharded_boxes(CKPT_DTYPE_FP32);
    check_sharded_boxes(CKPT_DTYPE_BF16);
}

static void flip_byte(const char *path, long offset) {
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    unsigned char b;
    assert_int_equal(pread(fd, &b, 1, offset), 1);
    b ^= 0x10;
    assert_int_equal(pwrite(fd, &b, 1, offset), 1);
    close(fd);
}

static void expect_unreadable(const char *dir, const char *needle1, const char *needle2) {
    Model *model = new_model(&recipe.model);
    AdamW opt;
    adamw_init(&opt, model->num_floats);
    TrainState st;
    char err[2048] = "";
    assert_int_equal(load_training(dir, model, &opt, &st, err, sizeof err), CKPT_ERR_UNREADABLE);
    if (!strstr(err, needle1) || (needle2 && !strstr(err, needle2)))
        fail_msg("error '%s' does not mention '%s' and '%s'", err, needle1, needle2 ? needle2 : "");
    model_free(model);
    adamw_free(&opt);
}

static void test_corruption_detected(void **state) {
    (void)state;
    Saved s;
    make_saved(&s, 3);
    char dir[512], path[600], err[2048];
    snprintf(dir, sizeof dir, "%s/corrupt", work);
    write_saved(dir, &s);
    CkptReader *r = ckpt_reader_open(dir, err, sizeof err);
    assert_non_null(r);
    const CkptChunk *ch = &ckpt_meta_find(&r->meta, "optimizer.v.layers.1.mlp.up_proj.weight")->chunks[0];
    const long victim = (long)(ch->offset + ch->stored_bytes / 2);
    const long shard_size = (long)r->meta.files[0].size;
    ckpt_reader_close(r);
    snprintf(path, sizeof path, "%s/shard_00000.zst", dir);

    flip_byte(path, victim);
    expect_unreadable(dir, "optimizer.v.layers.1.mlp.up_proj.weight", "shard_00000.zst");
    flip_byte(path, victim);
    expect_loads_equal(dir, &s); /* flipped back: intact again */

    assert_int_equal(truncate(path, shard_size - 100), 0);
    expect_unreadable(dir, "truncated", NULL);
    /* read past the size check, the tensor cut off says the file is truncated, with both sizes */
    r = ckpt_reader_open_metadata(dir, err, sizeof err);
    assert_non_null(r);
    assert_int_equal(ckpt_reader_verify_tensor(r, ckpt_meta_find(&r->meta, "optimizer.v.lm_head.weight"), err, sizeof err),
                     -1);
    char expected[160];
    snprintf(expected, sizeof expected, "shard_00000.zst: tensor 'optimizer.v.lm_head.weight' chunk 0: cannot read bytes ");
    assert_non_null(strstr(err, expected));
    snprintf(expected, sizeof expected, ": the file is truncated: expected %ld bytes, found %ld", shard_size, shard_size - 100);
    if (!strstr(err, expected)) fail_msg("'%s' does not say '%s'", err, expected);
    ckpt_reader_close(r);
    assert_int_equal(truncate(path, shard_size), 0); /* zero-filled tail: size right, content wrong */
    expect_unreadable(dir, "optimizer.v.lm_head.weight", "chunk 0"); /* the last tensor written */

    snprintf(dir, sizeof dir, "%s/corrupt2", work);
    write_saved(dir, &s);
    snprintf(path, sizeof path, "%s/model.yaml", dir);
    flip_byte(path, 20);
    ModelConfig cfg;
    assert_int_equal(ckpt_read_model_config(dir, &cfg, err, sizeof err), -1);
    assert_non_null(strstr(err, "model.yaml: checksum mismatch"));
    flip_byte(path, 20);
    snprintf(path, sizeof path, "%s/metadata.mtck", dir);
    flip_byte(path, 100);
    expect_unreadable(dir, "metadata", "checksum");
    unlink(path);
    expect_unreadable(dir, "metadata.mtck", "not a complete checkpoint");
    free_saved(&s);
}

/* Metadata that passes its checksum but claims a huge tensor (a forged or
 * broken writer): the chunk is called corrupt, with both sizes, before
 * anything of the claimed size is allocated (it said "out of memory"). */
static void test_forged_chunk_size_refused(void **state) {
    (void)state;
    Saved s;
    make_saved(&s, 12);
    char dir[512], path[600], err[2048];
    snprintf(dir, sizeof dir, "%s/forged", work);
    write_saved(dir, &s);
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_METADATA_FILE);
    unsigned char *data;
    size_t len;
    assert_int_equal(ckpt_read_file(path, (size_t)1 << 26, &data, &len, err, sizeof err), 0);
    CkptMeta m;
    assert_int_equal(ckpt_meta_decode(data, len, &m, err, sizeof err), 0);
    free(data);
    CkptTensorMeta *t = NULL;
    for (int i = 0; i < m.num_tensors; i++)
        if (strcmp(m.tensors[i].name, "final_norm.weight") == 0) t = &m.tensors[i];
    assert_non_null(t);
    assert_int_equal(t->num_chunks, 1); /* 16 floats: one chunk, one zstd frame of 64 bytes */
    const int64_t huge = (int64_t)1 << 56;
    t->shape[0] = t->chunks[0].shape[0] = huge;
    t->chunks[0].raw_bytes = (uint64_t)huge * 4;
    assert_int_equal(ckpt_meta_encode(&m, &data, &len, err, sizeof err), 0);
    ckpt_meta_free(&m);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
    free(data);

    CkptReader *r = ckpt_reader_open(dir, err, sizeof err);
    if (!r) fail_msg("%s", err);
    assert_int_equal(ckpt_reader_verify_tensor(r, ckpt_meta_find(&r->meta, "final_norm.weight"), err, sizeof err), -1);
    if (!strstr(err, "tensor 'final_norm.weight' chunk 0") ||
        !strstr(err, "the metadata says 288230376151711744 raw bytes, its zstd frame holds 64"))
        fail_msg("unexpected error: %s", err);
    ckpt_reader_close(r);
    free_saved(&s);
}

static void test_never_overwrites(void **state) {
    (void)state;
    Saved a, b;
    make_saved(&a, 4);
    make_saved(&b, 5);
    char dir[512], err[2048];
    snprintf(dir, sizeof dir, "%s/keep/iter_0000017", work);
    mt_make_dirs(dir, err, sizeof err);
    ckpt_remove_tree(dir, err, sizeof err);
    write_saved(dir, &a);
    const CkptMoments bm = saved_moments(&b);
    const CkptState bs = saved_state(&b);
    CheckpointWrite what = {.model_config = &recipe.model, .model = b.model, .recipe = &recipe, .moments = &bm,
                            .state = &bs, .compression_level = 3};
    assert_int_equal(ckpt_write_dir(dir, &what, err, sizeof err), -1);
    assert_non_null(strstr(err, "never overwritten"));
    expect_loads_equal(dir, &a);
    long *steps = NULL;
    char parent[512];
    snprintf(parent, sizeof parent, "%s/keep", work);
    assert_int_equal(ckpt_list_steps(parent, &steps, err, sizeof err), 1);
    free(steps);
    /* An empty directory in the way is not replaced either (rename would). */
    snprintf(dir, sizeof dir, "%s/keep/iter_0000018", work);
    assert_int_equal(mkdir(dir, 0755), 0);
    assert_int_equal(ckpt_write_dir(dir, &what, err, sizeof err), -1);
    free_saved(&a);
    free_saved(&b);
}

/* mt_make_dirs_made records the shallowest directory it made, and mt_remove_made_dirs removes those (run.dir of a
 * refused run and the parents the run made for it), never one that was there, also when the making failed on the
 * way down (a name too long for the file system: the parents made before it go). */
static void test_made_dirs_removed(void **state) {
    (void)state;
    char dir[1024], made[1024], want[1024], err[2048];
    struct stat st;
    snprintf(dir, sizeof dir, "%s/md/a/b/", work); /* a trailing slash is the same directory */
    assert_int_equal(mt_make_dirs_made(dir, made, sizeof made, err, sizeof err), 0);
    snprintf(want, sizeof want, "%s/md", work);
    assert_string_equal(made, want);
    mt_remove_made_dirs(dir, made);
    assert_int_equal(stat(want, &st), -1);
    assert_int_equal(stat(work, &st), 0);
    snprintf(want, sizeof want, "%s/pre", work); /* there before: kept */
    assert_int_equal(mkdir(want, 0755), 0);
    snprintf(dir, sizeof dir, "%s/pre/x/y", work);
    assert_int_equal(mt_make_dirs_made(dir, made, sizeof made, err, sizeof err), 0);
    mt_remove_made_dirs(dir, made);
    assert_int_equal(stat(want, &st), 0);
    snprintf(dir, sizeof dir, "%s/pre/x", work);
    assert_int_equal(stat(dir, &st), -1);
    char name[300];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    snprintf(dir, sizeof dir, "%s/long/c/%s", work, name); /* NAME_MAX 255: its mkdir fails after long/c's */
    assert_int_equal(mt_make_dirs_made(dir, made, sizeof made, err, sizeof err), -1);
    snprintf(want, sizeof want, "%s/long", work);
    assert_string_equal(made, want);
    mt_remove_made_dirs(dir, made);
    if (stat(want, &st) == 0) fail_msg("%s/c, made for a directory that could not be made, was left", want);
}

static void test_mismatches_refused(void **state) {
    (void)state;
    Saved s;
    make_saved(&s, 6);
    char dir[512], err[2048];
    snprintf(dir, sizeof dir, "%s/shape", work);
    write_saved(dir, &s);
    ModelConfig wider = recipe.model;
    wider.intermediate_size = 32;
    Model *other = new_model(&wider);
    assert_int_equal(ckpt_load_training(dir, other, NULL, NULL, err, sizeof err), CKPT_ERR_MISMATCH);
    assert_non_null(strstr(err, "mlp.gate_proj.weight' is [24, 16], the model needs [32, 16]"));
    assert_int_equal(ckpt_model_shape_check(&recipe.model, &wider, err, sizeof err), -1);
    assert_non_null(strstr(err, "model.intermediate_size is 24 in the checkpoint but 32 in the recipe"));
    model_free(other);

    ModelConfig fewer = recipe.model;
    fewer.num_layers = 1;
    other = new_model(&fewer);
    assert_int_equal(ckpt_load_training(dir, other, NULL, NULL, err, sizeof err), CKPT_ERR_MISMATCH);
    assert_non_null(strstr(err, "layers.1."));
    model_free(other);

    /* Weights only (as convert writes): no optimizer, no state. */
    snprintf(dir, sizeof dir, "%s/weights", work);
    CheckpointWrite what = {.model_config = &recipe.model, .model = s.model, .compression_level = 3};
    assert_int_equal(ckpt_write_dir(dir, &what, err, sizeof err), 0);
    AdamW opt;
    adamw_init(&opt, s.model->num_floats);
    TrainState st;
    assert_int_equal(load_training(dir, s.model, &opt, &st, err, sizeof err), CKPT_ERR_MISMATCH);
    assert_non_null(strstr(err, "no training state"));
    assert_int_equal(ckpt_load_model(dir, s.model, err, sizeof err), 0);
    adamw_free(&opt);
    free_saved(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_bit_exact),
        cmocka_unit_test(test_many_chunks_and_regions),
        cmocka_unit_test(test_3d_chunks),
        cmocka_unit_test(test_filled_sources),
        cmocka_unit_test(test_unloadable_config_refused),
        cmocka_unit_test(test_sharded_boxes),
        cmocka_unit_test(test_bf16_moments),
        cmocka_unit_test(test_hf_files),
        cmocka_unit_test(test_corruption_detected),
        cmocka_unit_test(test_forged_chunk_size_refused),
        cmocka_unit_test(test_never_overwrites),
        cmocka_unit_test(test_mismatches_refused),
        cmocka_unit_test(test_made_dirs_removed),
    };
    return cmocka_run_group_tests(tests, ckpt_test_setup, ckpt_test_teardown);
}
