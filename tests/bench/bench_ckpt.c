/* bench_ckpt.c: the checkpoint writer on a real run's state (built and run
 * by tests/bench/bench_ckpt.sh, not part of `make test`).
 *
 * usage: bench_ckpt CKPT_DIR OUT_DIR REPS
 * Loads CKPT_DIR (weights, AdamW moments, state), writes the raw fp32 bytes
 * (params | m | v) to OUT_DIR/raw.bin for `zstd` to compress, then saves the
 * same state REPS times with the sync writer (all threads, compression level
 * 3) with and without the shuffle4 filter, and loads it back REPS times.
 * Prints key=value lines (medians): params, raw_bytes, stored_bytes,
 * save_s, stored_bytes_nofilter, save_s_nofilter, load_s. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "ckpt/checkpoint.h"
#include "ckpt/ckpt_fs.h"
#include "ckpt/ckpt_writer.h"
#include "core/timer.h"

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, compare_doubles);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: bench_ckpt CKPT_DIR OUT_DIR REPS\n");
        return 2;
    }
    const char *ckpt = argv[1], *out = argv[2];
    int reps = atoi(argv[3]);
    if (reps < 1 || reps > 100) reps = 3;
    char err[4096], path[4096];
    ModelConfig cfg;
    if (ckpt_read_model_config(ckpt, &cfg, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    Model *model = model_create(&cfg, &cpu_backend, 1, 1);
    CkptMoments opt = {.num_floats = model->num_floats};
    opt.m = calloc((size_t)opt.num_floats, sizeof(float));
    opt.v = calloc((size_t)opt.num_floats, sizeof(float));
    CkptState state;
    if (!opt.m || !opt.v) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    if (ckpt_load_training(ckpt, model, &opt, &state, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    const size_t n = (size_t)model->num_floats;
    snprintf(path, sizeof path, "%s/raw.bin", out);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(model->params, 4, n, f) != n || fwrite(opt.m, 4, n, f) != n || fwrite(opt.v, 4, n, f) != n ||
        fclose(f) != 0) {
        fprintf(stderr, "%s: cannot write\n", path);
        return 1;
    }

    int num_sources;
    CkptSource *sources = ckpt_sources_from_model(model, model->params, opt.m, opt.v, &num_sources);
    const CkptFilter filters[2] = {CKPT_FILTER_SHUFFLE4, CKPT_FILTER_NONE};
    double save_s[2];
    uint64_t stored[2];
    for (int k = 0; k < 2; k++) {
        CkptPayload p = {.num_sources = num_sources, .sources = sources, .model_config = &cfg,
                         .has_state = true, .state = state,
                         .iteration = state.step, .compression_level = 3, .filter = filters[k],
                         .threads = omp_get_max_threads()};
        double times[100];
        for (int r = 0; r < reps; r++) {
            snprintf(path, sizeof path, "%s/save_%d_%d", out, k, r);
            CkptWriteStats stats;
            double start = mt_now();
            if (ckpt_write_payload(path, &p, &stats, err, sizeof err) != 0) {
                fprintf(stderr, "%s\n", err);
                return 1;
            }
            times[r] = mt_now() - start;
            stored[k] = stats.stored_bytes;
        }
        save_s[k] = median(times, reps);
    }
    double load_times[100];
    for (int r = 0; r < reps; r++) {
        snprintf(path, sizeof path, "%s/save_0_%d", out, r);
        double start = mt_now();
        if (ckpt_load_training(path, model, &opt, &state, err, sizeof err) != 0) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        load_times[r] = mt_now() - start;
    }
    for (int k = 0; k < 2; k++)
        for (int r = 0; r < reps; r++) {
            snprintf(path, sizeof path, "%s/save_%d_%d", out, k, r);
            ckpt_remove_tree(path, err, sizeof err);
        }
    printf("params=%zu\nraw_bytes=%zu\nstored_bytes=%llu\nsave_s=%.4f\nstored_bytes_nofilter=%llu\n"
           "save_s_nofilter=%.4f\nload_s=%.4f\nthreads=%d\n",
           n, n * 12, (unsigned long long)stored[0], save_s[0], (unsigned long long)stored[1], save_s[1],
           median(load_times, reps), omp_get_max_threads());
    free(sources);
    model_free(model);
    free(opt.m);
    free(opt.v);
    return 0;
}
