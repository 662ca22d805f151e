/* test_ops_determinism.c: the CPU backend gives the same bits run to run,
 * and the ops written with OpenMP (all but matmul, which is OpenBLAS) give
 * the same bits for any thread count: no atomics, no unordered reductions.
 */
#include "ops_test_util.h"

#include <omp.h>

#include "backend/backend.h"
#include "model/rope_tables.h"

static const BackendOps *ops = &cpu_backend;

enum { N = 37, C = 200, V = 300, OC = 150, B = 2, T = 9, H = 4, KVH = 2, D = 16 };
#define NQ (B * T * H * D)
#define NKV (B * T * KVH * D)

/* every output and gradient of one forward + backward of each op */
typedef struct {
    float *emb, *dwte;
    float *norm, *rstd, *dnorm_in, *dnorm_w;
    float *mm, *dmm_in, *dmm_w, *dmm_b;
    float *rope, *drope;
    float *att, *probs, *dq, *dk, *dv;
    float *swi, *dgate, *dup;
    float *losses, *dlogits;
    double loss_sum;
} Results;

typedef struct {
    int32_t tokens[N], targets[N];
    float *wte, *x, *w, *wmat, *bias, *gout, *cos, *sin, *q, *k, *v, *qgrad, *logits;
} Inputs;

static void make_inputs(Inputs *in) {
    Rng rng;
    rng_seed(&rng, 99);
    for (int n = 0; n < N; n++) {
        in->tokens[n] = (int32_t)rng_below(&rng, 13); /* many repeats */
        in->targets[n] = n % 5 == 3 ? -1 : (int32_t)rng_below(&rng, V);
    }
    in->wte = rand_floats(&rng, 13 * C, 1.0);
    in->x = rand_floats(&rng, N * C, 1.0);
    in->w = rand_floats(&rng, C, 1.0);
    in->wmat = rand_floats(&rng, OC * C, 0.1);
    in->bias = rand_floats(&rng, OC, 1.0);
    in->gout = rand_floats(&rng, N * C, 1.0);
    in->cos = zero_floats(T * D / 2);
    in->sin = zero_floats(T * D / 2);
    rope_tables_init(in->cos, in->sin, T, D, 10000.0, NULL);
    in->q = rand_floats(&rng, NQ, 1.0);
    in->k = rand_floats(&rng, NKV, 1.0);
    in->v = rand_floats(&rng, NKV, 1.0);
    in->qgrad = rand_floats(&rng, NQ, 1.0);
    in->logits = rand_floats(&rng, N * V, 3.0);
}

static void free_inputs(Inputs *in) {
    float *fields[] = {in->wte, in->x,   in->w, in->wmat, in->bias,  in->gout,  in->cos,
                       in->sin, in->q,   in->k, in->v,    in->qgrad, in->logits};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) free(fields[i]);
}

static void run_all(const Inputs *in, Results *r, int with_matmul) {
    r->emb = zero_floats(N * C), r->dwte = zero_floats(13 * C);
    ops->embedding_forward(r->emb, in->tokens, in->wte, N, C);
    ops->embedding_backward(r->dwte, in->gout, in->tokens, N, C);

    r->norm = zero_floats(N * C), r->rstd = zero_floats(N), r->dnorm_in = zero_floats(N * C), r->dnorm_w = zero_floats(C);
    ops->rmsnorm_forward(r->norm, r->rstd, in->x, in->w, N, C, 1e-5f);
    ops->rmsnorm_backward(r->dnorm_in, r->dnorm_w, in->gout, in->x, in->w, r->rstd, N, C);

    r->mm = zero_floats(N * OC), r->dmm_in = zero_floats(N * C), r->dmm_w = zero_floats(OC * C), r->dmm_b = zero_floats(OC);
    if (with_matmul) {
        ops->matmul_forward(r->mm, in->x, in->wmat, in->bias, N, C, OC);
        ops->matmul_backward(r->dmm_in, r->dmm_w, r->dmm_b, in->gout, in->x, in->wmat, N, C, OC);
    }

    r->rope = zero_floats(NQ), r->drope = zero_floats(NQ);
    ops->rope_forward(r->rope, in->q, in->cos, in->sin, B, T, H, D);
    ops->rope_backward(r->drope, in->qgrad, in->cos, in->sin, B, T, H, D);

    r->att = zero_floats(NQ), r->probs = zero_floats(B * H * T * T);
    r->dq = zero_floats(NQ), r->dk = zero_floats(NKV), r->dv = zero_floats(NKV);
    ops->attention_forward(r->att, r->probs, in->q, in->k, in->v, B, T, H, KVH, D);
    ops->attention_backward(r->dq, r->dk, r->dv, in->qgrad, r->probs, in->q, in->k, in->v, B, T, H, KVH, D);

    r->swi = zero_floats(N * C), r->dgate = zero_floats(N * C), r->dup = zero_floats(N * C);
    ops->swiglu_forward(r->swi, in->x, in->gout, (long)N * C);
    ops->swiglu_backward(r->dgate, r->dup, in->x, in->gout, in->x, (long)N * C);

    r->losses = zero_floats(N), r->dlogits = zero_floats(N * V);
    r->loss_sum = ops->cross_entropy_forward(r->losses, in->logits, in->targets, N, V);
    ops->cross_entropy_backward(r->dlogits, in->logits, in->targets, 1.0f / N, N, V);
}

static void free_results(Results *r) {
    float **fields[] = {&r->emb, &r->dwte, &r->norm, &r->rstd, &r->dnorm_in, &r->dnorm_w, &r->mm, &r->dmm_in,
                        &r->dmm_w, &r->dmm_b, &r->rope, &r->drope, &r->att, &r->probs, &r->dq, &r->dk, &r->dv,
                        &r->swi, &r->dgate, &r->dup, &r->losses, &r->dlogits};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) free(*fields[i]);
}

#define SAME(a, b, field, count) assert_memory_equal((a)->field, (b)->field, (size_t)(count) * sizeof(float))

static void assert_same(const Results *a, const Results *b) {
    SAME(a, b, emb, N * C), SAME(a, b, dwte, 13 * C);
    SAME(a, b, norm, N * C), SAME(a, b, rstd, N), SAME(a, b, dnorm_in, N * C), SAME(a, b, dnorm_w, C);
    SAME(a, b, mm, N * OC), SAME(a, b, dmm_in, N * C), SAME(a, b, dmm_w, OC * C), SAME(a, b, dmm_b, OC);
    SAME(a, b, rope, NQ), SAME(a, b, drope, NQ);
    SAME(a, b, att, NQ), SAME(a, b, probs, B * H * T * T), SAME(a, b, dq, NQ), SAME(a, b, dk, NKV), SAME(a, b, dv, NKV);
    SAME(a, b, swi, N * C), SAME(a, b, dgate, N * C), SAME(a, b, dup, N * C);
    SAME(a, b, losses, N), SAME(a, b, dlogits, N * V);
    assert_memory_equal(&a->loss_sum, &b->loss_sum, sizeof(double));
}

static void test_same_bits_run_to_run(void **state) {
    (void)state;
    Inputs in;
    make_inputs(&in);
    Results first, second;
    run_all(&in, &first, 1);
    run_all(&in, &second, 1);
    assert_true(max_abs(first.mm, N * OC) > 0.0 && max_abs(first.dk, NKV) > 0.0); /* they did run */
    assert_same(&first, &second);
    free_results(&first), free_results(&second);
    free_inputs(&in);
}

static void test_same_bits_any_thread_count(void **state) {
    (void)state;
    Inputs in;
    make_inputs(&in);
    int saved = omp_get_max_threads();
    Results one, many;
    omp_set_num_threads(1);
    run_all(&in, &one, 0);
    for (int threads = 2; threads <= 5; threads += 3) {
        omp_set_num_threads(threads);
        run_all(&in, &many, 0);
        assert_same(&one, &many);
        free_results(&many);
    }
    omp_set_num_threads(saved);
    free_results(&one);
    free_inputs(&in);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_bits_run_to_run),
        cmocka_unit_test(test_same_bits_any_thread_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
