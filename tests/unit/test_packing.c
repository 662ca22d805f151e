/* test_packing.c: packed rows on the CPU model. A row holding several
 * samples (model_set_packed_positions: positions restarting at 0 at each
 * sample) gives the loss, the logits and every parameter gradient that its
 * samples give run one by one (relative 1e-6), for llama, qwen2 (biases)
 * and qwen3 (qk-norm, tied embeddings), with ignored targets, and with
 * selective recomputation; the document-masked attention op equals plain
 * causal attention on a row of one sample, bit for bit, and keeps each
 * sample's probabilities inside it; split over cp ranks' query positions it
 * gives the one-rank rows bit for bit and the one-rank key gradients; a MoE
 * model's row gives with padding what it gives without (test_packed_moe_padding). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "core/rng.h"
#include "model/model.h"
#include "test_tiny_config.h"

enum { B = 2, T = 16 };

/* Row 0: samples of 5, 7 and 4 tokens; row 1: one sample of 16. */
static const int row_samples[B][4] = {{5, 7, 4, 0}, {16, 0, 0, 0}};

static void make_row(int32_t *inputs, int32_t *targets, int32_t *positions, int vocab) {
    uint64_t s = 99;
    for (int i = 0; i < B * T; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        inputs[i] = (int32_t)((s >> 33) % (uint64_t)vocab);
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        targets[i] = (s >> 33) % 4 == 0 ? -1 : (int32_t)((s >> 35) % (uint64_t)vocab);
    }
    for (int b = 0; b < B; b++) {
        int at = 0;
        for (int k = 0; row_samples[b][k]; k++) {
            for (int i = 0; i < row_samples[b][k]; i++) positions[b * T + at + i] = i;
            at += row_samples[b][k];
            targets[b * T + at - 1] = -1; /* a sample's last token predicts nothing */
        }
    }
}

/* max |a - b| <= 1e-6 * max |b| over n values (and a tiny floor) */
static void assert_close(const float *a, const float *b, long n, const char *what) {
    double diff = 0, scale = 0;
    for (long i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)a[i] - (double)b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    if (!(diff <= 1e-6 * scale + 1e-12)) fail_msg("%s: max difference %g for values up to %g", what, diff, scale);
}

static void check_packed_equals_samples(ModelFamily family, bool tied, Recompute recompute) {
    ModelConfig cfg = tiny_config(family);
    cfg.tie_word_embeddings = tied;
    ModelPartition whole = model_partition_whole(&cfg);
    Model *model = model_create_recompute(&cfg, &whole, &cpu_backend, B, T, recompute);
    model_init_weights(model, 4321);
    int32_t inputs[B * T], targets[B * T], positions[B * T];
    make_row(inputs, targets, positions, cfg.vocab_size);
    const long V = cfg.vocab_size;

    /* packed: both rows in one micro-batch */
    model_zero_grad(model);
    model_set_packed_positions(model, positions, B, T);
    const float packed_loss = model_forward(model, inputs, targets, B, T);
    float *packed_logits = malloc((size_t)B * T * V * sizeof(float));
    memcpy(packed_logits, model_logits(model), (size_t)B * T * V * sizeof(float));
    model_backward(model, 1.0f);
    float *packed_grads = malloc((size_t)model->num_grad_floats * sizeof(float));
    memcpy(packed_grads, model->grads, (size_t)model->num_grad_floats * sizeof(float));

    /* one by one: the packed mean is sum_i count_i mean_i / total */
    model_set_packed_positions(model, NULL, 0, 0);
    model_zero_grad(model);
    long total = 0;
    for (int i = 0; i < B * T; i++) total += targets[i] >= 0;
    double loss = 0;
    for (int b = 0; b < B; b++) {
        int at = b * T;
        for (int k = 0; row_samples[b][k]; k++) {
            const int n = row_samples[b][k];
            long count = 0;
            for (int i = 0; i < n; i++) count += targets[at + i] >= 0;
            const float mean = model_forward(model, inputs + at, targets + at, 1, n);
            assert_close(model_logits(model), packed_logits + (size_t)at * V, (long)n * V, "a sample's logits");
            model_backward(model, (float)((double)count / (double)total));
            loss += (double)mean * (double)count / (double)total;
            at += n;
        }
    }
    assert_close(&packed_loss, &(float){(float)loss}, 1, "loss");
    for (int p = 0; p < model->num_params; p++) {
        const ParamInfo *info = &model->param_info[p];
        const long at = info->offset - model->trainable_offset;
        assert_close(packed_grads + at, model->grads + at, info->numel, info->name);
    }
    free(packed_logits);
    free(packed_grads);
    model_free(model);
}

static void test_packed_llama(void **state) { check_packed_equals_samples(FAMILY_LLAMA, false, RECOMPUTE_NONE); }
static void test_packed_qwen2(void **state) { check_packed_equals_samples(FAMILY_QWEN2, false, RECOMPUTE_NONE); }
static void test_packed_qwen3(void **state) { check_packed_equals_samples(FAMILY_QWEN3, true, RECOMPUTE_NONE); }
static void test_packed_recompute(void **state) {
    check_packed_equals_samples(FAMILY_LLAMA, false, RECOMPUTE_SELECTIVE);
    check_packed_equals_samples(FAMILY_LLAMA, false, RECOMPUTE_FULL);
}

/* A MoE model's packed row: its padding (places -1 - p, sft_packing.h) changes nothing. Samples of 5 and 7 tokens
 * in a row of 16 (4 of padding) give the cross entropy, the auxiliary losses, the routing statistics (assignments,
 * drops, imbalance) and every parameter gradient of the same samples in a row of 12 with none (relative 1e-6):
 * padding is routed nowhere, counted in no load-balancing, z-loss or capacity term (transformers, packing without
 * padding, computes the same). */
static void check_padding_changes_nothing(ModelFamily family, MoeLoadBalancing balancing, double capacity,
                                          double z_coeff, int shared) {
    ModelConfig cfg = moe_test_config(family);
    cfg.moe.load_balancing = balancing;
    cfg.moe.capacity_factor = capacity;
    cfg.moe.z_loss_coeff = z_coeff;
    cfg.moe.shared_expert_intermediate_size = shared;
    ModelPartition whole = model_partition_whole(&cfg);
    Model *model = model_create_recompute(&cfg, &whole, &cpu_backend, 1, T, RECOMPUTE_NONE);
    model_init_weights(model, 77);
    int32_t inputs[B * T], targets[B * T], positions[B * T];
    make_row(inputs, targets, positions, cfg.vocab_size); /* row 0: samples of 5, 7 and 4: the 4 become padding */
    for (int t = 12; t < T; t++) {
        inputs[t] = 0;
        targets[t] = -1;
        positions[t] = -1 - (t - 12);
    }
    float losses[2];
    MoeStepStats stats[2];
    float *grads[2];
    for (int padded = 0; padded < 2; padded++) {
        const int n = padded ? T : 12;
        model_zero_grad(model);
        model_moe_step_begin(model);
        model_set_packed_positions(model, positions, 1, n);
        losses[padded] = model_forward(model, inputs, targets, 1, n);
        model_backward(model, 1.0f);
        model_moe_step_end(model, NULL, 1, false, &stats[padded]);
        grads[padded] = malloc((size_t)model->num_grad_floats * sizeof(float));
        memcpy(grads[padded], model->grads, (size_t)model->num_grad_floats * sizeof(float));
    }
    assert_close(&losses[1], &losses[0], 1, "the cross entropy");
    const float aux[2] = {(float)stats[0].aux_loss, (float)stats[1].aux_loss};
    const float z[2] = {(float)stats[0].z_loss, (float)stats[1].z_loss};
    const float imbalance[2] = {(float)stats[0].imbalance_sum, (float)stats[1].imbalance_sum};
    assert_true(aux[0] > 0 || balancing == LB_NONE);
    assert_close(&aux[1], &aux[0], 1, "the load-balancing loss");
    assert_close(&z[1], &z[0], 1, "the z-loss");
    assert_close(&imbalance[1], &imbalance[0], 1, "the imbalance");
    assert_int_equal(stats[1].assignments, stats[0].assignments);
    assert_int_equal(stats[1].dropped, stats[0].dropped);
    for (int p = 0; p < model->num_params; p++) {
        const ParamInfo *info = &model->param_info[p];
        const long at = info->offset - model->trainable_offset;
        assert_close(grads[1] + at, grads[0] + at, info->numel, info->name);
    }
    free(grads[0]);
    free(grads[1]);
    model_free(model);
}

/* A micro-batch of padding alone (a row whose documents all lost their targets): no auxiliary loss, no NaN. */
static void check_padding_alone(void) {
    ModelConfig cfg = moe_test_config(FAMILY_MIXTRAL);
    cfg.moe.z_loss_coeff = 1e-3;
    ModelPartition whole = model_partition_whole(&cfg);
    Model *model = model_create_recompute(&cfg, &whole, &cpu_backend, 1, T, RECOMPUTE_NONE);
    model_init_weights(model, 78);
    int32_t inputs[T], targets[T], positions[T];
    for (int t = 0; t < T; t++) inputs[t] = t % 7, targets[t] = -1, positions[t] = -1 - t;
    model_zero_grad(model);
    model_moe_step_begin(model);
    model_set_packed_positions(model, positions, 1, T);
    assert_true(model_forward(model, inputs, targets, 1, T) == 0.0f);
    model_backward(model, 1.0f);
    MoeStepStats st;
    model_moe_step_end(model, NULL, 1, false, &st);
    assert_true(st.aux_loss == 0.0 && st.z_loss == 0.0 && st.assignments == 0);
    for (long i = 0; i < model->num_grad_floats; i++) assert_true(isfinite(model->grads[i]));
    model_free(model);
}

static void test_packed_moe_padding(void **state) {
    (void)state;
    check_padding_alone();
    check_padding_changes_nothing(FAMILY_QWEN3_MOE, LB_AUX_LOSS, 0.0, 0.0, 0);
    check_padding_changes_nothing(FAMILY_QWEN3_MOE, LB_SEQ_AUX_LOSS, 0.0, 1e-3, 8);
    check_padding_changes_nothing(FAMILY_MIXTRAL, LB_GLOBAL_AUX_LOSS, 0.5, 1e-3, 0); /* capacity: drops */
    check_padding_changes_nothing(FAMILY_MIXTRAL, LB_AUX_LOSS, 1.0, 0.0, 0);
}

/* The op: one sample per row is plain causal attention, bit for bit; a
 * packed row's probabilities stay inside each sample and sum to 1. */
static void test_doc_attention_op(void **state) {
    enum { H = 4, KVH = 2, D = 8 };
    const size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * KVH * D, np = (size_t)B * H * T * T;
    float *q = malloc(nq * sizeof(float)), *k = malloc(nk * sizeof(float)), *v = malloc(nk * sizeof(float));
    float *out_a = malloc(nq * sizeof(float)), *out_b = malloc(nq * sizeof(float));
    float *pa = malloc(np * sizeof(float)), *pb = malloc(np * sizeof(float));
    float *dout = malloc(nq * sizeof(float));
    float *g[6];
    for (int i = 0; i < 6; i++) g[i] = calloc(nq, sizeof(float));
    Rng rng;
    rng_seed(&rng, 5);
    for (size_t i = 0; i < nq; i++) q[i] = rng_normal(&rng), dout[i] = rng_normal(&rng);
    for (size_t i = 0; i < nk; i++) k[i] = rng_normal(&rng), v[i] = rng_normal(&rng);
    int32_t ident[B * T];
    for (int i = 0; i < B * T; i++) ident[i] = i % T;
    cpu_backend.attention_forward(out_a, pa, q, k, v, B, T, H, KVH, D);
    cpu_backend.attention_forward_doc(out_b, pb, q, k, v, NULL, ident, B, T, T, H, KVH, D);
    assert_memory_equal(out_a, out_b, nq * sizeof(float));
    assert_memory_equal(pa, pb, np * sizeof(float));
    cpu_backend.attention_backward(g[0], g[1], g[2], dout, pa, q, k, v, B, T, H, KVH, D);
    cpu_backend.attention_backward_doc(g[3], g[4], g[5], dout, pb, q, k, v, NULL, ident, B, T, T, H, KVH, D);
    for (int i = 0; i < 3; i++) assert_memory_equal(g[i], g[i + 3], (i == 0 ? nq : nk) * sizeof(float));

    int32_t inputs[B * T], targets[B * T], positions[B * T];
    make_row(inputs, targets, positions, 32);
    cpu_backend.attention_forward_doc(out_b, pb, q, k, v, NULL, positions, B, T, T, H, KVH, D);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                const float *row = pb + (((size_t)b * H + h) * T + t) * T;
                const int lo = t - positions[b * T + t];
                double sum = 0;
                for (int u = 0; u < T; u++) {
                    if (u < lo || u > t) assert_true(row[u] == 0.0f);
                    sum += row[u];
                }
                assert_true(fabs(sum - 1.0) < 1e-5);
            }
    free(q), free(k), free(v), free(out_a), free(out_b), free(pa), free(pb), free(dout);
    for (int i = 0; i < 6; i++) free(g[i]);
}

/* Context parallel: splitting a packed row's queries over cp ranks (the
 * load-balanced positions of model_cp_positions), each rank's
 * attention_forward_doc at its positions against the whole row's keys gives
 * the full packed attention's rows (the same sums in the same order: the
 * same bits, probs and dq too), and the ranks' dk and dv add up to the full
 * backward's. `reversed`: each rank's queries in descending position order
 * (the op takes its positions in any order). */
static void check_doc_attention_cp(int cp, bool reversed) {
    enum { H = 4, KVH = 2, D = 8 };
    const size_t row = (size_t)H * D, nq = (size_t)B * T * row, nk = (size_t)B * T * KVH * D;
    const size_t np = (size_t)B * H * T * T;
    float *q = malloc(nq * sizeof(float)), *k = malloc(nk * sizeof(float)), *v = malloc(nk * sizeof(float));
    float *dout = malloc(nq * sizeof(float)), *out = malloc(nq * sizeof(float)), *probs = malloc(np * sizeof(float));
    float *dq = calloc(nq, sizeof(float)), *dk = calloc(nk, sizeof(float)), *dv = calloc(nk, sizeof(float));
    double *dk_sum = calloc(nk, sizeof(double)), *dv_sum = calloc(nk, sizeof(double));
    Rng rng;
    rng_seed(&rng, 11);
    for (size_t i = 0; i < nq; i++) q[i] = rng_normal(&rng), dout[i] = rng_normal(&rng);
    for (size_t i = 0; i < nk; i++) k[i] = rng_normal(&rng), v[i] = rng_normal(&rng);
    int32_t inputs[B * T], targets[B * T], places[B * T];
    make_row(inputs, targets, places, 32);
    cpu_backend.attention_forward_doc(out, probs, q, k, v, NULL, places, B, T, T, H, KVH, D);
    cpu_backend.attention_backward_doc(dq, dk, dv, dout, probs, q, k, v, NULL, places, B, T, T, H, KVH, D);

    const int Tq = T / cp;
    int32_t pos[T];
    for (int rank = 0; rank < cp; rank++) {
        model_cp_positions(Tq, cp, rank, pos);
        for (int t = 0; reversed && t < Tq / 2; t++) {
            const int32_t keep = pos[t];
            pos[t] = pos[Tq - 1 - t];
            pos[Tq - 1 - t] = keep;
        }
        const size_t nql = (size_t)B * Tq * row;
        float *ql = malloc(nql * sizeof(float)), *doutl = malloc(nql * sizeof(float));
        float *outl = malloc(nql * sizeof(float)), *probsl = malloc((size_t)B * H * Tq * T * sizeof(float));
        float *dql = calloc(nql, sizeof(float)), *dkl = calloc(nk, sizeof(float)), *dvl = calloc(nk, sizeof(float));
        for (int b = 0; b < B; b++)
            for (int t = 0; t < Tq; t++) {
                memcpy(ql + ((size_t)b * Tq + t) * row, q + ((size_t)b * T + pos[t]) * row, row * sizeof(float));
                memcpy(doutl + ((size_t)b * Tq + t) * row, dout + ((size_t)b * T + pos[t]) * row,
                       row * sizeof(float));
            }
        cpu_backend.attention_forward_doc(outl, probsl, ql, k, v, pos, places, B, Tq, T, H, KVH, D);
        cpu_backend.attention_backward_doc(dql, dkl, dvl, doutl, probsl, ql, k, v, pos, places, B, Tq, T, H, KVH, D);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < Tq; t++) {
                const size_t local = ((size_t)b * Tq + t) * row, full = ((size_t)b * T + pos[t]) * row;
                assert_memory_equal(outl + local, out + full, row * sizeof(float));
                assert_memory_equal(dql + local, dq + full, row * sizeof(float));
                for (int h = 0; h < H; h++)
                    assert_memory_equal(probsl + (((size_t)b * H + h) * Tq + t) * T,
                                        probs + (((size_t)b * H + h) * T + pos[t]) * T, T * sizeof(float));
            }
        for (size_t i = 0; i < nk; i++) dk_sum[i] += dkl[i], dv_sum[i] += dvl[i];
        free(ql), free(doutl), free(outl), free(probsl), free(dql), free(dkl), free(dvl);
    }
    float *dk_cp = malloc(nk * sizeof(float)), *dv_cp = malloc(nk * sizeof(float));
    for (size_t i = 0; i < nk; i++) dk_cp[i] = (float)dk_sum[i], dv_cp[i] = (float)dv_sum[i];
    assert_close(dk_cp, dk, (long)nk, "dk: the sum of the cp ranks' vs one rank's");
    assert_close(dv_cp, dv, (long)nk, "dv: the sum of the cp ranks' vs one rank's");
    free(q), free(k), free(v), free(dout), free(out), free(probs), free(dq), free(dk), free(dv);
    free(dk_sum), free(dv_sum), free(dk_cp), free(dv_cp);
}

static void test_doc_attention_cp(void **state) {
    check_doc_attention_cp(2, false);
    check_doc_attention_cp(4, false);
    check_doc_attention_cp(2, true);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_doc_attention_op), cmocka_unit_test(test_packed_llama),
        cmocka_unit_test(test_packed_qwen2),     cmocka_unit_test(test_packed_qwen3),
        cmocka_unit_test(test_packed_recompute), cmocka_unit_test(test_doc_attention_cp),
        cmocka_unit_test(test_packed_moe_padding),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
