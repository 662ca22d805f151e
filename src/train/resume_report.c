/* resume_report.c: what a resume says about the recipe it goes on with (resume_report.h). */
#include "resume_report.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../ckpt/checkpoint.h"
#include "../core/error.h"
#include "../data/data_loader.h"
#include "../dist/comm.h"

static ResumeReport armed;
static bool is_armed;

void resume_report_arm(const ResumeReport *report) {
    is_armed = report != NULL;
    if (report) armed = *report;
}

/* The keys by what a change of them does from the resume on: the training samples, the validation samples, the
 * function the model computes; the load-balancing loss terms' weights change only the router's gradient (the
 * model's output and its language-model loss are the same), checked field by field below. */
static const char *const sample_keys[] = {"run.seed", "train.seq_len", "data.train", "data.split", "data.pack", NULL};
static const char *const valid_keys[] = {"data.valid", NULL};
static const char *const test_keys[] = {"data.test", NULL};
static const char *const model_keys[] = {"model.", "peft.", NULL};

/* The first key of `watched` whose value differs between the two recipes' texts, into hit ("" when none). */
static void first_change(const char *before, const char *after, const char *const *watched, char *hit, size_t len) {
    char ignored[256];
    recipe_text_changes(before, after, ignored, sizeof ignored, watched, hit, len);
}

/* Whether dataset `path` of `split` now holds what the checkpoint recorded for `was` (record DATA): the same
 * fingerprint, so only its path changed. */
static bool same_contents(const CkptDataset *saved, int num_saved, const char *split, const char *was,
                          const char *path) {
    DatasetFingerprint now;
    char err[1400];
    for (int i = 0; i < num_saved; i++) {
        const CkptDataset *d = &saved[i];
        if (strcmp(d->split, split) != 0 || strcmp(d->path, was) != 0) continue;
        return data_fingerprint_path(path, &now, err, sizeof err) == 0 && now.documents == d->documents &&
               now.idx_bytes == d->idx_bytes && now.bin_bytes == d->bin_bytes && now.crc32c == d->crc32c;
    }
    return false;
}

/* Each dataset of one list (data.train, data.valid or data.test) whose path alone changed and whose files hold what the
 * checkpoint recorded at the old one: said, and its old path put back into `now` (a copy of the recipe in force),
 * so that it is not taken for other samples. */
static void say_moved(const DataSource *then, int num_then, DataSource *now, int num_now, const char *split,
                      const CkptDataset *saved, int num_saved) {
    for (int i = 0; i < num_then && i < num_now; i++) {
        if (!strcmp(then[i].path, now[i].path) || then[i].weight != now[i].weight ||
            !same_contents(saved, num_saved, split, then[i].path, now[i].path))
            continue;
        mt_log("resume: data.%s[%d] moved from %s to %s: the same contents (fingerprint matches)", split, i,
               then[i].path, now[i].path);
        snprintf(now[i].path, sizeof now[i].path, "%s", then[i].path);
    }
}

/* train.eval_batches counts micro-batches (batch b is samples b * micro_batch_size + [0, micro_batch_size) on
 * every layout): another micro_batch_size evaluates other samples, with the same weights another eval_loss. `all`
 * is every sample of the set once whatever the micro_batch_size (resolved again from the same data: the same
 * samples); a change to or from it is another set of samples. */
static void warn_eval_samples(const TrainConfig *then, const TrainConfig *now) {
    const bool was_all = then->eval_batches == MT_EVAL_BATCHES_ALL, is_all = now->eval_batches == MT_EVAL_BATCHES_ALL;
    if (was_all && is_all) return;
    if (was_all || is_all) {
        const TrainConfig *counted = was_all ? now : then;
        char first[96];
        snprintf(first, sizeof first, "the first %d batches of %d samples", counted->eval_batches,
                 counted->micro_batch_size);
        mt_warn("resume: eval_loss is now measured over %s instead of %s (other samples): the curve is not "
                "comparable across this resume", is_all ? "every validation sample once (train.eval_batches: all)"
                : first, was_all ? "every validation sample once (train.eval_batches: all)" : first);
        return;
    }
    const long was = (long)then->eval_batches * then->micro_batch_size, is = (long)now->eval_batches * now->micro_batch_size;
    if (then->micro_batch_size == now->micro_batch_size || was == is) return;
    char scale[96] = "";
    if (was % now->micro_batch_size == 0)
        snprintf(scale, sizeof scale, " (--set train.eval_batches=%ld)", was / now->micro_batch_size);
    mt_warn("resume: train.eval_batches counts micro-batches: eval_loss is now measured over %d batches of %d "
            "samples instead of %d of %d (other samples): the curve is not comparable across this resume; keep "
            "train.micro_batch_size %d or scale eval_batches%s", now->eval_batches, now->micro_batch_size,
            then->eval_batches, then->micro_batch_size, then->micro_batch_size, scale);
}

/* Into `out`: the checkpoint's recipe (`stored`) with what the resume itself writes into the recipe in force
 * (resume_cmd.c), which no --set asked: checkpoint.frozen_base store for a LoRA checkpoint that stores its base (the
 * default auto was reported as "auto -> store", a change the user never made), and load_optimizer true. */
static void as_resumed(Recipe *out, const Recipe *stored, const Recipe *resumed, bool stores_base) {
    *out = *stored;
    if (stores_base) out->checkpoint.frozen_base = resumed->checkpoint.frozen_base;
    out->checkpoint.load_optimizer = resumed->checkpoint.load_optimizer;
}

/* What the --set values change from the checkpoint's recipe (`checkpoint`), and what those changes do. */
static void say_changes(const Recipe *checkpoint, const Recipe *resumed, const char *checkpoint_dir, bool evaluates) {
    static Recipe copy;
    as_resumed(&copy, checkpoint, resumed, armed.stores_base);
    const Recipe *stored = &copy;
    size_t na, nb;
    char *before = recipe_yaml_text(stored, &na), *after = recipe_yaml_text(resumed, &nb), changes[4096];
    const int n = recipe_text_changes(before, after, changes, sizeof changes, NULL, NULL, 0);
    free(after);
    if (n == 0) {
        free(before);
        return;
    }
    mt_log("resume: --set changes %s", changes);
    /* what is compared: the recipe in force less the datasets that only moved, the router's loss weights and the
     * export dtype */
    static Recipe same;
    same = *resumed;
    CkptDataset *saved = NULL;
    int num_saved = 0;
    char err[1200];
    if (ckpt_read_datasets(checkpoint_dir, &saved, &num_saved, err, sizeof err) != 0) num_saved = 0;
    const DataConfig *then = &stored->data;
    say_moved(then->train, then->num_train, same.data.train, same.data.num_train, "train", saved, num_saved);
    say_moved(then->valid, then->num_valid, same.data.valid, same.data.num_valid, "valid", saved, num_saved);
    say_moved(then->test, then->num_test, same.data.test, same.data.num_test, "test", saved, num_saved);
    free(saved);
    const MoeConfig *was = &stored->model.moe;
    const bool router = same.model.moe.aux_loss_coeff != was->aux_loss_coeff ||
                        same.model.moe.z_loss_coeff != was->z_loss_coeff;
    same.model.moe.aux_loss_coeff = was->aux_loss_coeff;
    same.model.moe.z_loss_coeff = was->z_loss_coeff;
    same.model.export_dtype = stored->model.export_dtype; /* convert's default dtype: nothing computed */
    after = recipe_yaml_text(&same, &nb);
    char samples[900], valid[900], test[900], model[900];
    first_change(before, after, sample_keys, samples, sizeof samples);
    first_change(before, after, valid_keys, valid, sizeof valid);
    first_change(before, after, test_keys, test, sizeof test);
    first_change(before, after, model_keys, model, sizeof model);
    free(before);
    free(after);
    if (samples[0])
        mt_warn("resume: %s changes the samples the run reads from here on: it continues, but no longer computes "
                "what the uninterrupted run would", samples);
    if (valid[0] && evaluates)
        mt_warn("resume: %s changes the validation samples: eval_loss from here on is measured on other samples "
                "than before (the training is not affected)", valid);
    if (test[0] && evaluates)
        mt_warn("resume: %s changes the test samples: test_loss after the last step is measured on other samples "
                "than the run's recipe named (the training is not affected)", test);
    if (model[0])
        mt_warn("resume: %s changes what its model computes from here on: it continues, but no longer computes "
                "what the uninterrupted run would", model);
    if (router)
        mt_warn("resume: model.moe.%s changes only the router's gradient (the weight of a load-balancing loss "
                "term, not the model's output) from here on: it continues, but its weights no longer follow the "
                "uninterrupted run's", resumed->model.moe.aux_loss_coeff != was->aux_loss_coeff ? "aux_loss_coeff"
                : "z_loss_coeff");
    if (evaluates) warn_eval_samples(&stored->train, &resumed->train);
    if (strcmp(stored->init_from, resumed->init_from) != 0)
        mt_warn("resume: init_from has no effect on a resume: the weights are the checkpoint's");
}

/* run.dir/recipe.yaml edited since it was written: resume reads the checkpoint's recipe, not that file (and
 * rewrites it with the recipe in force), so the edit would be lost without a word. The file is loaded with the
 * resume's --set values too: a key they set is this resume's choice, not an edit left out. */
static void say_edited_recipe(const ResumeReport *r, const Recipe *resumed) {
    struct stat st;
    if (!r->run_dir_recipe[0] || stat(r->run_dir_recipe, &st) != 0) return;
    static Recipe file;
    char err[2048];
    if (recipe_load_resumed(&file, r->run_dir_recipe, r->overrides, r->num_overrides, 0, r->step, r->tokens,
                            r->samples, err, sizeof err) != 0) {
        mt_warn("resume: %s does not load as a recipe (%s); resume reads the checkpoint's recipe, not that file, "
                "and rewrites it", r->run_dir_recipe, err);
        return;
    }
    /* what a resume writes into the recipe itself is no edit (as run --resume-if-exists compares) */
    file.checkpoint.frozen_base = resumed->checkpoint.frozen_base;
    file.checkpoint.load_optimizer = resumed->checkpoint.load_optimizer;
    size_t na, nb;
    char *ours = recipe_yaml_text(resumed, &na), *theirs = recipe_yaml_text(&file, &nb), changes[4096];
    const int n = recipe_text_changes(ours, theirs, changes, sizeof changes, NULL, NULL, 0);
    free(ours);
    free(theirs);
    if (n > 0)
        mt_warn("resume: %s differs from the recipe this resume goes on with (the checkpoint's, with the --set "
                "values) at %d key%s (this resume's value -> the file's): %s; resume reads the checkpoint's recipe, "
                "not that file, and rewrites it: to change a key, resume with --set KEY=VALUE", r->run_dir_recipe, n,
                n == 1 ? "" : "s", changes);
}

void resume_report_say(const Recipe *resumed, const char *checkpoint_dir, bool evaluates) {
    if (!is_armed) return;
    is_armed = false;
    if (comm_world()->rank != 0) return;
    static Recipe stored;
    char err[2048];
    if (recipe_load_resumed(&stored, armed.recipe_path, armed.overrides, armed.num_kept, 0, armed.step, armed.tokens,
                            armed.samples, err, sizeof err) == 0)
        say_changes(&stored, resumed, checkpoint_dir, evaluates);
    if (armed.reference_unavailable)
        mt_warn("resume: --set checkpoint.frozen_base=reference is not done: %s stores its frozen base and records "
                "no other checkpoint that holds it, so the checkpoints of this run store it too (a LoRA run "
                "references the base it started from with init_from: docs/finetune.md)", checkpoint_dir);
    say_edited_recipe(&armed, resumed);
}
