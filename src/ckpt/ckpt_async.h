/* ckpt_async.h: the saver the training loop uses: synchronous, or
 * asynchronous (checkpoint.async), where save() copies the parameters, the
 * optimizer moments and the training state into a host buffer and returns while
 * a background thread compresses and writes them.
 *
 * Only one save is in flight: the next save() waits for the previous one.
 * A failed background write is reported by the next poll(), save() or
 * wait(), which return -1 with its message: the loop must then stop (it
 * does not have the checkpoint it thinks it has). */
#ifndef MT_CKPT_CKPT_ASYNC_H
#define MT_CKPT_CKPT_ASYNC_H

#include <stdbool.h>
#include <stddef.h>

#include "../config/recipe.h"
#include "../dist/comm.h"
#include "../model/model.h"
#include "checkpoint.h"

typedef struct CkptSaver CkptSaver;

/* A saver writing to `checkpoints_dir` (run.dir/checkpoints) as `cfg` says
 * (async, compression_level, keep_last, keep_every). `recipe` is stored in
 * every checkpoint and must outlive the saver. */
CkptSaver *ckpt_saver_create(const char *checkpoints_dir, const Recipe *recipe);

/* Save over the ranks of `world` (when it has more than one): every rank
 * calls save(), poll() and wait() at the same steps (they become collective);
 * a `writer` writes its blocks of the model (ParamInfo regions, each element
 * by one rank: norm_owner) into its own shard file and rank 0 writes the
 * metadata (ckpt_dist.h). Asynchronously, the shards are written in the
 * background and the save is finished by the first poll() after every rank's
 * writer is done (or by the next save() or wait()). */
void ckpt_saver_distribute(CkptSaver *saver, const Comm *world, bool writer);

/* With the distributed optimizer: the moments passed to save() hold
 * only this rank's flat ranges [begin[i], end[i]) of the moments, packed
 * (the arrays must outlive the saver); this rank writes their moments, and
 * the parameters of the kinds ckpt_saver_write_kinds gives. */
void ckpt_saver_shard_moments(CkptSaver *saver, const size_t *begin, const size_t *end, int num_ranges);

/* Files every checkpoint of the run carries for the Hugging Face export
 * (the tokenizer files and generation_config.json of an init_from or resumed
 * checkpoint; checkpoint.h). `files` must outlive the saver; NULL: none. */
void ckpt_saver_carry_hf_files(CkptSaver *saver, const CkptHfFiles *files);

/* LoRA's frozen base referenced instead of stored (checkpoint.frozen_base:
 * reference): every checkpoint leaves the frozen parameters out and records
 * `base` (copied) in its metadata, record BASE. NULL or not present (the
 * default): they are stored. Before the first save. */
void ckpt_saver_reference_base(CkptSaver *saver, const CkptBaseRef *base);

/* The datasets the run trains on (record DATA: resume compares them with
 * what the paths hold then). `datasets` must outlive the saver; 0: none
 * recorded. Only the metadata's writer (rank 0) needs them. */
void ckpt_saver_record_data(CkptSaver *saver, const CkptDataset *datasets, int num_datasets);

/* Which parameters this rank writes: the dense ones, the routed experts
 * (expert parallel), or both (the default). */
void ckpt_saver_write_kinds(CkptSaver *saver, bool dense, bool experts);

/* Save the model, the optimizer's moments and the training state after step
 * state->step. Sync: writes it all. Async: waits for the previous save (a
 * wait over a second is said in the log), then copies and returns. Returns 0, or -1 with err (this save or the previous
 * background one failed). */
int ckpt_saver_save(CkptSaver *saver, const Model *model, const CkptMoments *moments, const CkptState *state,
                    char *err, size_t errlen);

/* Non-blocking: -1 with err when a background save has failed (reported once). */
int ckpt_saver_poll(CkptSaver *saver, char *err, size_t errlen);

/* Wait until no save is in flight. Returns 0, or -1 with err when one failed. */
int ckpt_saver_wait(CkptSaver *saver, char *err, size_t errlen);

/* The step of the last save started (-1 before the first). */
long ckpt_saver_last_step(const CkptSaver *saver);

/* Seconds the caller spent in save() (copying, waiting, or writing when sync). */
double ckpt_saver_blocked_seconds(const CkptSaver *saver);

/* Wait for the writer and free everything. */
void ckpt_saver_free(CkptSaver *saver);

#endif
