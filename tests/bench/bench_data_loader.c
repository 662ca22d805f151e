/* bench_data_loader.c: the training data loader alone (src/data), for
 * tests/bench/bench_data_loader.sh: opens PREFIX (its train share, seed 1234,
 * no sample-index cache) for N samples of SEQ_LEN tokens, reads them in the
 * training order, and prints one line of key=value: the open time, tokens/s,
 * and from /proc/self/io and /proc/self/status the bytes read from disk and
 * the anonymous and file-backed resident memory.
 * Usage: bench_data_loader SEQ_LEN N PREFIX [PREFIX ...] (several: blended by their tokens). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/timer.h"
#include "data/data_loader.h"

/* The value of the line of /proc/self/FILE that starts with `key`, or -1. */
static long long proc_value(const char *file, const char *key) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/self/%s", file);
    FILE *f = fopen(path, "r");
    long long value = -1;
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, key, strlen(key)) == 0) value = atoll(line + strlen(key));
    fclose(f);
    return value;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: bench_data_loader SEQ_LEN N PREFIX [PREFIX ...]\n");
        return 2;
    }
    const int seq_len = atoi(argv[1]);
    const long n = atol(argv[2]);
    static DataConfig data;
    data.num_train = argc - 3;
    for (int i = 0; i < data.num_train; i++) snprintf(data.train[i].path, sizeof data.train[i].path, "%s", argv[3 + i]);
    data.split[0] = 100;
    char err[4096];
    const double t0 = mt_now();
    DataLoader *loader = data_loader_create(&data, SPLIT_TRAIN, seq_len, 1234, n, err, sizeof err);
    if (!loader) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    const double t1 = mt_now();
    int32_t *sample = malloc(((size_t)seq_len + 1) * sizeof *sample);
    long long checksum = 0;
    for (long i = 0; i < n; i++) {
        data_loader_get(loader, i, sample);
        checksum += sample[seq_len / 2];
    }
    const double t2 = mt_now();
    printf("open_s=%.3f read_s=%.3f tokens_per_s=%.0f read_bytes=%lld rss_anon_kb=%lld rss_file_kb=%lld checksum=%lld\n",
           t1 - t0, t2 - t1, (double)n * seq_len / (t2 - t1), proc_value("io", "read_bytes:"),
           proc_value("status", "RssAnon:"), proc_value("status", "RssFile:"), checksum);
    free(sample);
    data_loader_free(loader);
    return 0;
}
