/* test_model_device.c: the CPU ModelDevice (src/model/model_device.h) on the
 * tiny llama recipe, one rank:
 *   - two steps through the interface (zero_grad, forward, backward,
 *     reduce_grads, grad_sumsq, optimizer_step) give the same bits as the
 *     same steps on a plain Model with model_forward / model_backward /
 *     grad_sumsq / adamw_step: the interface adds and loses nothing (with
 *     fp32 and with bf16 optimizer states, which the device allocates as
 *     bf16: setup.state_dtype);
 *   - the pipeline stage ops of the device run a micro-batch to the same
 *     loss and gradients as forward / backward;
 *   - model_device_check and model_device_exists: an unknown device, and in
 *     a build without CUDA (the unit tests' build) the cuda device, refused
 *     with the key named. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "backend/backend.h"
#include "core/error.h"
#include "dist/grid.h"
#include "model/model_device.h"

enum { B = 2, T = 16 };

typedef struct Fixture {
    Recipe recipe;
    Grid grid;
    ModelPartition part;
    ModelDeviceSetup setup;
    int32_t inputs[B * T], targets[B * T];
} Fixture;

static Fixture *fixture_new(void) {
    Fixture *f = mt_calloc(1, sizeof *f);
    char err[1024];
    const char *overrides[] = {"run.dir=build/test-work/model-device"};
    if (recipe_load(&f->recipe, "recipes/tiny/llama.yaml", overrides, 1, 1, err, sizeof err) != 0) fail_msg("%s", err);
    GridLayout layout;
    assert_int_equal(grid_layout(1, 1, 1, 1, &layout, err, sizeof err), 0);
    grid_create(&f->grid, &layout, comm_world());
    f->part = model_partition_whole(&f->recipe.model);
    f->setup = (ModelDeviceSetup){.device = "cpu", .cfg = &f->recipe.model, .parallel = &f->recipe.parallel,
                                  .part = &f->part, .grid = &f->grid, .micro_batch_size = B, .seq_len = T,
                                  .precision = f->recipe.precision};
    for (int i = 0; i < B * T; i++) {
        f->inputs[i] = (i * 7 + 3) % f->recipe.model.vocab_size;
        f->targets[i] = (i * 11 + 5) % f->recipe.model.vocab_size;
    }
    return f;
}

static void fixture_free(Fixture *f) {
    grid_free(&f->grid);
    free(f);
}

static void assert_same_floats(const float *a, const float *b, long n, const char *what) {
    for (long i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) fail_msg("%s[%ld]: %.9g against %.9g", what, i, a[i], b[i]);
}

static void check_steps_match_plain_model(DType state_dtype) {
    Fixture *f = fixture_new();
    char err[512];
    f->setup.state_dtype = state_dtype;
    ModelDevice *dev = model_device_create(&f->setup, err, sizeof err);
    assert_non_null(dev);
    assert_true(dev->host_current);
    assert_int_equal(dev->optimizer.state_dtype, state_dtype);
    assert_true((dev->optimizer.m_bf16 != NULL) == (state_dtype == DTYPE_BF16));
    assert_true((dev->optimizer.m != NULL) == (state_dtype == DTYPE_FP32));
    Model *plain = model_create(&f->recipe.model, &cpu_backend, B, T);
    AdamW opt;
    adamw_init_dtype(&opt, plain->num_floats, state_dtype);
    assert_int_equal(plain->num_floats, dev->host->num_floats);
    model_init_weights(dev->host, 42);
    model_init_weights(plain, 42);
    dev->ops->from_host(dev);
    const OptimizerConfig *oc = &f->recipe.optimizer;
    for (int step = 0; step < 2; step++) {
        dev->ops->zero_grad(dev);
        dev->ops->step_begin(dev);
        const double loss = dev->ops->forward(dev, f->inputs, f->targets, B, T);
        dev->ops->backward(dev, 0.5f, true);
        dev->ops->reduce_grads(dev);
        const double sumsq = dev->ops->grad_sumsq(dev);
        dev->ops->optimizer_step(dev, oc, 1e-3, 0.75);
        MoeStepStats st;
        assert_false(dev->ops->moe_step_end(dev, 1, true, &st)); /* a dense model */

        model_zero_grad(plain);
        const double want = (double)model_forward(plain, f->inputs, f->targets, B, T);
        model_backward(plain, 0.5f);
        const double want_sumsq = grad_sumsq(plain->grads, plain->num_floats);
        adamw_step(&opt, plain, oc, 1e-3, 0.75f);

        assert_true(loss == want);
        assert_true(sumsq == want_sumsq);
        assert_true(sumsq > 0.0);
        assert_int_equal(dev->optimizer.step, step + 1);
        assert_same_floats(dev->host->grads, plain->grads, plain->num_floats, "grads");
        assert_same_floats(dev->host->params, plain->params, plain->num_floats, "params");
        const size_t moment_bytes = (size_t)plain->num_floats * adamw_state_elem_bytes(state_dtype);
        assert_memory_equal(adamw_m(&dev->optimizer), adamw_m(&opt), moment_bytes);
        assert_memory_equal(adamw_v(&dev->optimizer), adamw_v(&opt), moment_bytes);
    }
    char bus[64];
    assert_false(dev->ops->pci_bus_id(dev, bus, sizeof bus));
    assert_true(dev->ops->peak_bytes(dev) > 0.0);
    assert_int_equal(dev->ops->comms_check(dev, err, sizeof err), 0);
    adamw_free(&opt);
    model_free(plain);
    model_device_free(dev);
    fixture_free(f);
}

static void test_steps_match_plain_model(void **state) {
    check_steps_match_plain_model(DTYPE_FP32);
    check_steps_match_plain_model(DTYPE_BF16);
}

static void test_stage_ops_match_forward_backward(void **state) {
    Fixture *f = fixture_new();
    char err[512];
    ModelDevice *dev = model_device_create(&f->setup, err, sizeof err);
    assert_non_null(dev);
    model_init_weights(dev->host, 7);
    const long n = dev->host->num_floats;
    dev->ops->zero_grad(dev);
    const double loss = dev->ops->forward(dev, f->inputs, f->targets, B, T);
    dev->ops->backward(dev, 1.0f, true);
    float *grads = mt_malloc((size_t)n * sizeof(float));
    memcpy(grads, dev->host->grads, (size_t)n * sizeof(float));

    /* the same micro-batch through the stage steps, on a clone (another activation set sharing the weights) */
    const PipelineStageOps *s = dev->ops->stage;
    void *slot = s->clone(dev->stage_base);
    dev->ops->zero_grad(dev);
    s->forward_start(slot, f->inputs, NULL, B, T);
    s->forward_layers(slot, 0);
    const double staged = s->forward_head(slot, f->targets);
    s->backward_head(slot, 1.0f);
    s->backward_layers(slot, 0, 1.0f, true);
    s->backward_finish(slot, true);
    assert_true(staged == loss);
    assert_same_floats(dev->host->grads, grads, n, "grads through the stage ops");
    s->free_clone(slot);
    free(grads);
    model_device_free(dev);
    fixture_free(f);
}

static void test_check_refuses(void **state) {
    Fixture *f = fixture_new();
    char err[512];
    assert_true(model_device_exists("cpu"));
    assert_true(model_device_exists("cuda"));
    assert_false(model_device_exists("tpu"));
    f->setup.device = "tpu";
    assert_int_equal(model_device_check(&f->setup, err, sizeof err), MT_EXIT_USAGE);
    assert_non_null(strstr(err, "run.device: 'tpu' is not a device; expected cpu or cuda"));
    assert_null(model_device_create(&f->setup, err, sizeof err));
    /* what no build runs on a GPU yet is refused first (exit 2), in any build; a CPU build adds that it is one */
    f->setup.device = "cuda";
    f->setup.precision = DTYPE_FP32;
    assert_int_equal(model_device_check(&f->setup, err, sizeof err), MT_EXIT_USAGE);
    assert_non_null(strstr(err, "precision: 'fp32' is not available with run.device: cuda"));
#ifndef MT_CUDA
    assert_non_null(strstr(err, "this build is CPU only: make CUDA=1"));
    f->setup.precision = DTYPE_BF16; /* a recipe a GPU runs: only the build is missing (exit 1) */
    assert_int_equal(model_device_check(&f->setup, err, sizeof err), MT_EXIT_FAILURE);
    assert_non_null(strstr(err, "needs a build with the CUDA backend (make CUDA=1"));
#endif
    fixture_free(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_steps_match_plain_model),
        cmocka_unit_test(test_stage_ops_match_forward_backward),
        cmocka_unit_test(test_check_refuses),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
