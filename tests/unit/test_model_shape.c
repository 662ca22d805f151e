/* test_model_shape.c: the shared skeleton of the CPU and CUDA models
 * (src/model/model_shape.h): this rank's sizes under tensor, sequence and
 * context parallel and interleaved chunks; every cp rank's positions; the
 * RoPE rows of a cp rank are the whole sequence's rows at its positions, to
 * the bit; a micro-batch and tokens the checks refuse end the process. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/error.h"
#include "model/model_shape.h"
#include "model/rope_tables.h"

static ModelConfig config(void) {
    ModelConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.family = FAMILY_LLAMA;
    cfg.num_layers = 6;
    cfg.hidden_size = 16;
    cfg.intermediate_size = 24;
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 2;
    cfg.head_dim = 8;
    cfg.vocab_size = 32;
    cfg.rope_theta = 10000.0;
    return cfg;
}

static ModelPartition part_of(int tp, int tp_rank, bool sp, int cp, int cp_rank) {
    ModelPartition p = {.tp = tp, .tp_rank = tp_rank, .sequence_parallel = sp, .cp = cp, .cp_rank = cp_rank,
                        .num_chunks = 2, .chunk_first = {0, 4}, .chunk_layers = {2, 1}, .num_layers = 3,
                        .has_embed = true, .has_head = false, .ep = 1, .etp = 1};
    return p;
}

static void test_sizes(void **state) {
    (void)state;
    ModelConfig cfg = config();
    ModelPartition part = part_of(2, 1, true, 2, 1);
    ModelShape s = model_shape_of(&cfg, &part);
    assert_int_equal(s.C, 16);
    assert_int_equal(s.D, 8);
    assert_int_equal(s.H, 2);
    assert_int_equal(s.KVH, 1);
    assert_int_equal(s.I, 12);
    assert_int_equal(s.V, 16);
    assert_int_equal(s.HD, 16);
    assert_int_equal(s.KVD, 8);
    assert_int_equal(s.vocab, 32);
    assert_int_equal(s.vocab_start, 16);
    assert_true(s.sp);
    assert_int_equal(s.cp, 2);
    assert_int_equal(s.cp_rank, 1);
    assert_int_equal(model_shape_rows(&s, 12), 6);
    assert_int_equal(model_shape_row_offset(&s, 12), 6);
    assert_int_equal(s.L, 3);
    assert_int_equal(s.num_chunks, 2);
    assert_int_equal(s.chunk_start[1], 2);
    assert_int_equal(model_shape_chunk_end(&s, 0), 2);
    assert_int_equal(model_shape_chunk_end(&s, 1), 3);
    assert_true(s.has_embed);
    assert_false(s.has_head);

    /* sequence parallel means nothing without tensor parallel */
    part = part_of(1, 0, true, 1, 0);
    s = model_shape_of(&cfg, &part);
    assert_false(s.sp);
    assert_int_equal(s.V, 32);
    assert_int_equal(s.vocab_start, 0);
    assert_int_equal(model_shape_rows(&s, 12), 12);
    assert_int_equal(model_shape_row_offset(&s, 12), 0);
}

static void test_positions(void **state) {
    (void)state;
    ModelConfig cfg = config();
    ModelPartition part = part_of(1, 0, false, 2, 0);
    ModelShape s = model_shape_of(&cfg, &part);
    int32_t seq[8];
    model_sequence_positions(&s, 4, seq);
    const int32_t expected[8] = {0, 1, 6, 7, 2, 3, 4, 5};
    assert_memory_equal(seq, expected, sizeof expected);
    part = part_of(1, 0, false, 1, 0);
    s = model_shape_of(&cfg, &part);
    model_sequence_positions(&s, 3, seq);
    for (int t = 0; t < 3; t++) assert_int_equal(seq[t], t);
}

/* A cp rank's rows are the whole sequence's table at its positions, bit for bit. */
static void test_rope_rows(void **state) {
    (void)state;
    ModelConfig cfg = config();
    cfg.rope_scaling = (RopeScaling){.enabled = true, .factor = 8.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0,
                                     .original_max_position_embeddings = 8};
    enum { T = 6, CP = 3, HALF = 4 };
    float all_cos[T * CP * HALF], all_sin[T * CP * HALF];
    rope_tables_init(all_cos, all_sin, T * CP, cfg.head_dim, cfg.rope_theta, &cfg.rope_scaling);
    for (int r = 0; r < CP; r++) {
        ModelPartition part = part_of(1, 0, false, CP, r);
        ModelShape s = model_shape_of(&cfg, &part);
        float cos[T * HALF], sin[T * HALF];
        int32_t pos[T], expected[T];
        model_rope_rows(&s, &cfg, T, cos, sin, pos);
        model_cp_positions(T, CP, r, expected);
        assert_memory_equal(pos, expected, sizeof pos);
        for (int t = 0; t < T; t++) {
            assert_memory_equal(cos + t * HALF, all_cos + pos[t] * HALF, HALF * sizeof(float));
            assert_memory_equal(sin + t * HALF, all_sin + pos[t] * HALF, HALF * sizeof(float));
        }
    }
}

/* The exit status of a child that runs a check on (B, T) and, with token >= -1, tokens[1] = token. */
static int check_status(const ModelShape *s, int B, int T, int32_t token, bool targets) {
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(99);
        model_check_batch(s, "test", B, T, 2, 8);
        int32_t tokens[4] = {0, token, 31, 0};
        model_check_tokens(s, tokens, 4, targets);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static void test_checks(void **state) {
    (void)state;
    ModelConfig cfg = config();
    ModelPartition part = part_of(2, 0, true, 2, 0);
    ModelShape s = model_shape_of(&cfg, &part);
    assert_int_equal(check_status(&s, 2, 8, 5, false), 0);
    assert_int_equal(check_status(&s, 3, 8, 5, false), MT_EXIT_FAILURE); /* more rows than the buffers */
    assert_int_equal(check_status(&s, 1, 7, 5, false), MT_EXIT_FAILURE); /* cp: an odd number of tokens */
    assert_int_equal(check_status(&s, 2, 8, 32, false), MT_EXIT_USAGE); /* outside the vocabulary */
    assert_int_equal(check_status(&s, 2, 8, -1, false), MT_EXIT_USAGE); /* an input cannot be ignored */
    assert_int_equal(check_status(&s, 2, 8, -1, true), 0);              /* a target can */
    part = part_of(4, 0, true, 1, 0);
    cfg.num_attention_heads = cfg.num_key_value_heads = 4;
    s = model_shape_of(&cfg, &part);
    assert_int_equal(check_status(&s, 1, 6, 5, false), MT_EXIT_FAILURE); /* sp: 6 rows over tp 4 */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_positions),
        cmocka_unit_test(test_rope_rows),
        cmocka_unit_test(test_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
