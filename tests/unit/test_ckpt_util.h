/* test_ckpt_util.h: shared by the checkpoint unit tests (header-only): a
 * scratch directory with a small qwen2 recipe loaded from it, and a model,
 * AdamW state and TrainState filled with random bits (NaN, infinities, -0
 * and denormals among them) to save and compare bit for bit. */
#ifndef TEST_CKPT_UTIL_H
#define TEST_CKPT_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/checkpoint.h"
#include "ckpt/ckpt_async.h"
#include "ckpt/ckpt_fs.h"
#include "core/rng.h"
#include "train/train_ckpt.h"

static char work[256];
static Recipe recipe;

static const char *recipe_yaml =
    "run: {name: ckpt-test, seed: 5}\n"
    "model: {family: qwen2, num_layers: 2, hidden_size: 16, intermediate_size: 24, num_attention_heads: 4,\n"
    "        num_key_value_heads: 2, vocab_size: 40, max_position_embeddings: 64}\n"
    "train: {steps: 10, seq_len: 8, micro_batch_size: 2, global_batch_size: 4}\n"
    "data: {train: [{path: /nonexistent/data, weight: 1.0}]}\n"
    "checkpoint: {keep_last: 2, keep_every: 30, async: true, compression_level: 3}\n";

static inline int ckpt_test_setup(void **state) {
    (void)state;
    snprintf(work, sizeof work, "/tmp/test_ckpt_io.XXXXXX");
    if (!mkdtemp(work)) return -1;
    char path[512], err[1024];
    snprintf(path, sizeof path, "%s/recipe.yaml", work);
    FILE *f = fopen(path, "w");
    fputs(recipe_yaml, f);
    fclose(f);
    if (recipe_load(&recipe, path, NULL, 0, 1, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    return 0;
}

static inline int ckpt_test_teardown(void **state) {
    (void)state;
    char err[256];
    return ckpt_remove_tree(work, err, sizeof err);
}

/* Random bits, with special values sprinkled in (bit exactness, not values, is what counts). */
static inline void fill_random(float *x, long n, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    for (long i = 0; i < n; i++) x[i] = (float)rng_normal(&rng) * 0.02f;
    const uint32_t specials[] = {0x7fc00001u, 0x7f800000u, 0xff800000u, 0x80000000u, 0x00000001u, 0x007fffffu};
    for (int k = 0; k < 6 && k < n; k++) memcpy(&x[(k * 7919) % n], &specials[k], 4);
}

static Model *new_model(const ModelConfig *cfg) { return model_create(cfg, &cpu_backend, 1, 4); }

typedef struct Saved {
    Model *model;
    AdamW opt;
    TrainState state;
} Saved;

static inline void make_saved(Saved *s, uint64_t seed) {
    s->model = new_model(&recipe.model);
    fill_random(s->model->params, s->model->num_floats, seed);
    adamw_init(&s->opt, s->model->num_floats);
    fill_random(s->opt.m, s->opt.num_floats, seed + 1);
    fill_random(s->opt.v, s->opt.num_floats, seed + 2);
    s->opt.step = 17;
    train_state_init(&s->state, seed);
    s->state.step = 17;
    s->state.consumed_samples = 68;
    s->state.consumed_tokens = 544;
    rng_next_u64(&s->state.rng);
}

static inline void free_saved(Saved *s) {
    model_free(s->model);
    adamw_free(&s->opt);
}

/* What the checkpoint code takes of s: the moments and the CkptState the loop would give it. */
static inline CkptMoments saved_moments(const Saved *s) { return train_ckpt_moments(&s->opt); }
static inline CkptState saved_state(const Saved *s) { return train_ckpt_state(&s->state, s->opt.step, &recipe); }

/* ckpt_load_training into the loop's AdamW and TrainState (either may be NULL), as train_resume.c does. */
static inline int load_training(const char *dir, Model *model, AdamW *opt, TrainState *st, char *err, size_t len) {
    CkptMoments m = opt ? train_ckpt_moments(opt) : (CkptMoments){0};
    CkptState saved;
    int rc = ckpt_load_training(dir, model, opt ? &m : NULL, st ? &saved : NULL, err, len);
    if (rc == 0 && st) train_state_from_ckpt(st, &saved);
    if (rc == 0 && opt) train_ckpt_moments_done(opt, &m);
    return rc;
}

/* ckpt_saver_save of the loop's state, as train.c does. */
static inline int saver_save(CkptSaver *saver, const Saved *s, char *err, size_t len) {
    const CkptMoments m = saved_moments(s);
    const CkptState st = saved_state(s);
    return ckpt_saver_save(saver, s->model, &m, &st, err, len);
}

static inline void write_saved(const char *dir, const Saved *s) {
    const CkptMoments m = saved_moments(s);
    const CkptState st = saved_state(s);
    CheckpointWrite what = {.model_config = &recipe.model, .model = s->model, .recipe = &recipe, .moments = &m,
                            .state = &st, .compression_level = 3};
    char err[2048];
    if (ckpt_write_dir(dir, &what, err, sizeof err) != 0) fail_msg("%s", err);
}

/* Load dir into fresh buffers and compare with s bit for bit. */
static inline void expect_loads_equal(const char *dir, const Saved *s) {
    Model *model = new_model(&recipe.model);
    AdamW opt;
    adamw_init(&opt, model->num_floats);
    TrainState st;
    train_state_init(&st, 999);
    char err[2048];
    int rc = load_training(dir, model, &opt, &st, err, sizeof err);
    if (rc != 0) fail_msg("%s", err);
    assert_memory_equal(model->params, s->model->params, (size_t)model->num_floats * 4);
    assert_memory_equal(opt.m, s->opt.m, (size_t)model->num_floats * 4);
    assert_memory_equal(opt.v, s->opt.v, (size_t)model->num_floats * 4);
    assert_int_equal(opt.step, s->opt.step);
    assert_int_equal(st.step, s->state.step);
    assert_int_equal(st.consumed_samples, s->state.consumed_samples);
    assert_int_equal(st.consumed_tokens, s->state.consumed_tokens);
    assert_memory_equal(st.rng.s, s->state.rng.s, sizeof st.rng.s);
    model_free(model);
    adamw_free(&opt);
}

#endif
