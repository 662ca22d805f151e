/* train_data_record.c: the run's datasets for its checkpoints' DATA record,
 * and resume's warning when one of them changed (train_data_record.h). */
#include "train_data_record.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../ckpt/checkpoint.h"
#include "../core/error.h"
#include "../dist/comm.h"

/* Whether datasets[0..count) holds split's dataset `path` already. */
static bool recorded(const CkptDataset *datasets, int count, const char *split, const char *path) {
    for (int i = 0; i < count; i++)
        if (strcmp(datasets[i].split, split) == 0 && strcmp(datasets[i].path, path) == 0) return true;
    return false;
}

/* Append split's dataset `path` with its fingerprint to ctx->datasets. */
static void append(TrainContext *ctx, const char *split, const char *path, const DatasetFingerprint *fp) {
    ctx->datasets = mt_realloc(ctx->datasets, (size_t)(ctx->num_datasets + 1) * sizeof *ctx->datasets);
    CkptDataset *d = &ctx->datasets[ctx->num_datasets++];
    *d = (CkptDataset){.documents = fp->documents, .idx_bytes = fp->idx_bytes, .bin_bytes = fp->bin_bytes,
                       .crc32c = fp->crc32c};
    snprintf(d->split, sizeof d->split, "%s", split);
    snprintf(d->path, sizeof d->path, "%s", path);
}

/* Whether split's dataset `path` is left out of the record: a prefix too long for it (no warning later), or one
 * recorded already (a blend that lists a dataset twice, weighing it up: one record, one fingerprint, one warning). */
static bool skipped(const TrainContext *ctx, const char *split, const char *path) {
    return strlen(path) > CKPT_BASE_DIR_MAX || recorded(ctx->datasets, ctx->num_datasets, split, path);
}

static void record_loader(TrainContext *ctx, const DataLoader *loader, const char *split) {
    for (int i = 0; i < data_loader_num_datasets(loader); i++) {
        const char *path = data_loader_dataset(loader, i, NULL);
        if (skipped(ctx, split, path)) continue;
        DatasetFingerprint fp;
        data_loader_dataset(loader, i, &fp);
        append(ctx, split, path, &fp);
    }
}

/* The datasets of the recipe's list that the loader left out (their share of the split had no tokens): recorded
 * too, so that one built again with tokens in its share, which the blend then takes in, is warned about. */
static void record_left_out(TrainContext *ctx, const DataSource *sources, int count, const char *split) {
    for (int i = 0; i < count; i++) {
        DatasetFingerprint fp;
        char err[1400];
        if (skipped(ctx, split, sources[i].path)) continue;
        if (data_fingerprint_path(sources[i].path, &fp, err, sizeof err) == 0) append(ctx, split, sources[i].path, &fp);
        /* (else: the loader opened it moments ago; not expected) */
    }
}

void train_data_record_make(TrainContext *ctx) {
    if (comm_world()->rank != 0) return;
    const DataConfig *data = &ctx->recipe->data;
    record_loader(ctx, ctx->train_data, "train");
    record_left_out(ctx, data->train, data->num_train, "train");
    if (ctx->valid_data && data->num_valid > 0) {
        record_loader(ctx, ctx->valid_data, "valid");
        record_left_out(ctx, data->valid, data->num_valid, "valid");
    }
    if (ctx->test_data && data->num_test > 0) {
        record_loader(ctx, ctx->test_data, "test");
        record_left_out(ctx, data->test, data->num_test, "test");
    }
}

/* What differs between the checkpoint's fingerprint and this run's, for the warning. */
static void describe_change(const CkptDataset *then, const CkptDataset *now, char *out, size_t outlen) {
    if (then->documents != now->documents || then->bin_bytes != now->bin_bytes)
        snprintf(out, outlen, "%" PRId64 " documents in %" PRIu64 " bytes then, %" PRId64 " in %" PRIu64 " now",
                 then->documents, then->idx_bytes + then->bin_bytes, now->documents, now->idx_bytes + now->bin_bytes);
    else
        snprintf(out, outlen, "%" PRId64 " documents as then, other contents (CRC-32C %08x then, %08x now)",
                 now->documents, then->crc32c, now->crc32c);
}

void train_data_record_compare(const TrainContext *ctx, const char *checkpoint_dir) {
    if (comm_world()->rank != 0) return;
    CkptDataset *saved = NULL;
    int num_saved = 0;
    char err[1200];
    const int rc = ckpt_read_datasets(checkpoint_dir, &saved, &num_saved, err, sizeof err);
    if (rc != 0) {
        mt_warn("resume: the checkpoint's record of its data is %s: the datasets are not compared", rc < 0 ? err
                : "of a form this megatrain cannot read (written by a newer one?)");
        return;
    }
    for (int i = 0; i < num_saved; i++)
        for (int j = 0; j < ctx->num_datasets; j++) {
            const CkptDataset *then = &saved[i], *now = &ctx->datasets[j];
            if (strcmp(then->split, now->split) != 0 || strcmp(then->path, now->path) != 0) continue;
            if (then->documents == now->documents && then->idx_bytes == now->idx_bytes &&
                then->bin_bytes == now->bin_bytes && then->crc32c == now->crc32c)
                continue;
            char what[256];
            describe_change(then, now, what, sizeof what);
            /* data.valid and data.test feed only the evaluation: the training itself still equals the
             * uninterrupted run's */
            const bool valid = strcmp(then->split, "valid") == 0, test = strcmp(then->split, "test") == 0;
            mt_warn("resume: data.%s dataset %s has changed since the checkpoint was written (%s): %s "
                    "(docs/checkpoints.md)", then->split, then->path, what,
                    valid  ? "the validation losses from here on are measured on other samples than before (the "
                             "training is not affected)"
                    : test ? "test_loss after the last step is measured on other samples than the run's recipe named "
                             "(the training is not affected)"
                           : "the run reads other samples from here on and no longer equals the uninterrupted one");
        }
    free(saved);
}
