/* micro_batch.h: B samples of a DataLoader as a model's inputs and targets,
 * the one way a run (its steps and its evaluation) and `megatrain eval` read
 * them.
 *
 * A plain sample is seq_len + 1 tokens: the inputs are its first seq_len,
 * the targets the same shifted by one; an SFT dataset's loss mask
 * (loss_mask.h) sets a masked target to -1 (not counted). A packed sample
 * (data.pack, sft_packing.h) is a row of whole documents whose targets the
 * loader gives (-1: masked or padding), with each position's place in its
 * document. Under context parallel a rank holds T = seq_len / cp positions
 * of each sample (`positions`, identity without cp); packed places always
 * cover whole rows (every cp rank needs every document's extent).
 *
 * A loader given the model's vocabulary (data_loader_set_vocab) checks every
 * token of every whole sample it reads (so all tp, cp and pipeline ranks
 * reading a sample see the same); a sample with a token outside it is
 * refused: loaded as inputs 0 and targets -1, so that a forward still runs
 * (every rank's collectives meet) and counts nothing, and the first refusal
 * is kept in `refused` for the caller to stop on. */
#ifndef MT_DATA_MICRO_BATCH_H
#define MT_DATA_MICRO_BATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "data_loader.h"

typedef struct MicroBatch {
    int size;                    /* B: samples */
    int seq_len;                 /* positions of a whole sample */
    int local_len;               /* T: positions of each sample this rank holds (seq_len / cp) */
    int32_t *positions;          /* [T]: which positions; 0 .. T-1 after init, the caller's cp cut after that */
    int32_t *inputs, *targets;   /* [B x T]: the micro-batch loaded last (target -1: not counted) */
    int32_t *places;             /* [B x seq_len]: packed rows: each position's place in its document */
    int32_t *sample, *sample_mask; /* [seq_len + 1]: one sample and its mask (packed: a row's inputs, targets) */
    char refused[3072];          /* "" or the first refused sample's error (data_loader_check_sample's), kept */
    bool empty;                  /* no target of the loaded samples counts, whole samples (every cp rank alike):
                                  * every token masked or padding; a refused sample counts nothing */
} MicroBatch;

/* Buffers for `size` samples of seq_len positions of which this rank holds local_len. */
void micro_batch_init(MicroBatch *mb, int size, int seq_len, int local_len);
void micro_batch_free(MicroBatch *mb);

/* Load samples first .. first + size - 1 of loader into mb->inputs and
 * mb->targets (a refused sample as inputs 0, targets -1, its error in
 * mb->refused unless one is there). Returns the packed rows' places
 * (mb->places, for the model device's set_positions), or NULL for plain rows. */
const int32_t *micro_batch_load(MicroBatch *mb, const DataLoader *loader, int64_t first);

/* micro_batch_load of an evaluation's last partial batch (eval_coverage.h): samples first .. first + count - 1
 * (1 <= count <= size), the places after them padding: sample `first` again (read already, so refused alike)
 * with every target -1. `empty` says whether a target of the `count` samples counts. */
const int32_t *micro_batch_load_part(MicroBatch *mb, const DataLoader *loader, int64_t first, int count);

/* Targets of the loaded micro-batch that count in the loss (>= 0). */
long micro_batch_counted(const MicroBatch *mb);

#endif
