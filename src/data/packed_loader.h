/* packed_loader.h: the data loader's packed path (data.pack, data_loader.c).
 *
 * Each dataset of a split is packed on its own (sft_packing.h) into rows
 * over its share [first, end) of the split, all with the split's seed, so a
 * dataset's rows are those it has when it is the only dataset. A packed row
 * is one sample of its dataset; the loader assigns its samples to the
 * datasets by the blending rule (blend.h), so the weights are the share of
 * rows. Building says so in one log line per split (documents of each
 * dataset, rows, share of positions used) and warns of truncated and
 * one-token documents, and of truncated documents whose kept part has no
 * target the loss mask counts (the cut removed all they train). */
#ifndef MT_DATA_PACKED_LOADER_H
#define MT_DATA_PACKED_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "../config/recipe.h"
#include "indexed_dataset.h"
#include "sft_packing.h"

typedef struct PackedSource {
    const IndexedDataset *ds;
    const IndexedDataset *mask; /* its loss mask (SFT data), or NULL */
    char key[64];         /* names it in messages: "data.train" alone, "data.train[1]" in a blend */
    double weight;        /* normalised; shown in the log line of a blend (0: none given, its rows weigh it) */
    int64_t first, end;   /* its sequences of the split */
} PackedSource;

/* Pack each of the n sources into rows[i] (n >= 1). 0, or -1 with err (an
 * overlong document under PACK_OVERLONG_ERROR, a dataset with nothing to
 * pack); on failure the rows built so far are freed. */
int packed_sources_build(PackedRows *rows, const PackedSource *sources, int n, const char *split_name, int seq_len,
                         PackOverlong overlong, uint64_t seed, char *err, size_t errlen);

#endif
