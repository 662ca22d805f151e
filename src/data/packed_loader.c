/* packed_loader.c: each dataset of a split packed on its own, with the log
 * line and warnings of the packing (packed_loader.h). */
#include "packed_loader.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"

/* Positions the packed rows of ds fill (the rest is padding). */
static int64_t packed_positions(const PackedRows *rows, const IndexedDataset *ds) {
    int64_t used = 0;
    for (int64_t k = 0; k < rows->documents; k++) {
        int64_t len = indexed_length(ds, rows->docs[k]);
        used += (len > rows->seq_len + 1 ? rows->seq_len + 1 : len) - 1;
    }
    return used;
}

static double used_percent(const PackedRows *rows, const IndexedDataset *ds) {
    return 100.0 * (double)packed_positions(rows, ds) / ((double)rows->num_rows * rows->seq_len);
}

/* One line for the split: one dataset as before blends existed, several each with its documents and rows. */
static void log_packing(const PackedRows *rows, const PackedSource *sources, int n, const char *split_name,
                        int seq_len) {
    if (n == 1) {
        mt_log("data: %s packed %lld documents into %lld rows of %d positions (%.1f%% used)", split_name,
               (long long)rows[0].documents, (long long)rows[0].num_rows, seq_len, used_percent(&rows[0], sources[0].ds));
        return;
    }
    const size_t cap = (size_t)n * (MT_PATH_MAX + 200);
    char *line = mt_malloc(cap);
    size_t at = 0;
    double all_rows = 0; /* a blend without weights weighs each dataset by its rows */
    for (int i = 0; i < n; i++) all_rows += (double)rows[i].num_rows;
    for (int i = 0; i < n && at < cap; i++)
        at += (size_t)snprintf(line + at, cap - at, "%s%s %s (weight %.3g): %lld documents into %lld rows (%.1f%% used)",
                               i ? "; " : "", sources[i].key, sources[i].ds->prefix,
                               sources[i].weight > 0 ? sources[i].weight : (double)rows[i].num_rows / all_rows,
                               (long long)rows[i].documents, (long long)rows[i].num_rows,
                               used_percent(&rows[i], sources[i].ds));
    mt_log("data: %s packed %d datasets, each into its own rows of %d positions, blended by weight (the share of "
           "rows): %s", split_name, n, seq_len, line);
    free(line);
}

/* The truncated documents of rows whose kept targets (tokens 1 .. seq_len) the loss mask all masks. */
static int64_t truncated_without_targets(const PackedRows *rows, const IndexedDataset *ds, const IndexedDataset *mask,
                                         int seq_len) {
    if (!mask || !rows->truncated) return 0;
    int32_t *kept = mt_malloc((size_t)seq_len * sizeof *kept);
    int64_t n = 0;
    for (int64_t k = 0; k < rows->documents; k++) {
        const int64_t seq = rows->docs[k];
        if (indexed_length(ds, seq) <= seq_len + 1) continue;
        indexed_dataset_read(mask, seq, 1, seq_len, kept);
        int32_t any = 0;
        for (int t = 0; t < seq_len; t++) any |= kept[t];
        n += any == 0;
    }
    free(kept);
    return n;
}

int packed_sources_build(PackedRows *rows, const PackedSource *sources, int n, const char *split_name, int seq_len,
                         PackOverlong overlong, uint64_t seed, char *err, size_t errlen) {
    for (int i = 0; i < n; i++) {
        if (packed_rows_build(&rows[i], sources[i].ds, sources[i].key, sources[i].first, sources[i].end, seq_len,
                              overlong, seed, err, errlen) != 0) {
            for (int k = 0; k < i; k++) packed_rows_free(&rows[k]);
            return -1;
        }
    }
    log_packing(rows, sources, n, split_name, seq_len);
    for (int i = 0; i < n; i++) {
        /* "data.train" names the datasets; the split says which of their rows (validation from data.split) */
        char key[160];
        snprintf(key, sizeof key, "%s (%s rows)", sources[i].key, split_name);
        if (rows[i].truncated)
            mt_log_warn("data: %s: %lld documents longer than seq_len + 1 = %d tokens were truncated to it "
                        "(data.pack_overlong: truncate)", key, (long long)rows[i].truncated, seq_len + 1);
        const int64_t empty = truncated_without_targets(&rows[i], sources[i].ds, sources[i].mask, seq_len);
        const bool training = strcmp(split_name, "train") == 0; /* else validation rows: a run's, or eval's */
        if (empty)
            mt_log_warn("data: %s: %lld of those %lld truncated documents keep no target the loss mask counts (the "
                        "tokens it counts, a completion or an assistant's turn, all lie past the first %d): %s%s; a "
                        "longer %s keeps them (data.pack_overlong: error names the first overlong one)",
                        key, (long long)empty, (long long)rows[i].truncated, seq_len + 1,
                        training ? "they train nothing" : "they add nothing to the evaluation's loss",
                        empty != rows[i].documents ? ""
                        : training ? ", and neither does any other document of it (every step's loss will be 0)"
                                   : ", and neither does any other document of it",
                        training ? "train.seq_len" : "seq_len (train.seq_len; eval's --seq-len)");
        if (rows[i].too_short)
            mt_log_warn("data: %s: %lld documents of one token have no target and were left out", key,
                        (long long)rows[i].too_short);
    }
    return 0;
}
