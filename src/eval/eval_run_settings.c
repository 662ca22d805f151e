/* eval_run_settings.c: `megatrain eval` of a run's checkpoint takes the run's own evaluation settings
 * (eval_run_settings.h).
 *
 * A run's checkpoint carries its resolved recipe (recipe.yaml). Its eval_loss came from data.valid (or data.train's
 * validation share by data.split) read in eval_batches batches of micro_batch_size x seq_len with run.seed, packed
 * or not, reduced per micro-batch or per token; with those, eval gives the same loss (src/eval/eval.c). So what the
 * command line leaves out is taken from there, and said on stderr; what it gives is kept, with a note when that
 * makes the loss another than the run's. A converted checkpoint has no recipe: the defaults of eval_options.c. */
#include "eval_run_settings.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "../ckpt/checkpoint.h"
#include "../config/recipe.h"
#include "../core/error.h"

/* train.eval_batches as --batches takes it: "3", "all". */
static const char *batches_text(int batches, char *buf, size_t len) {
    if (batches == MT_EVAL_BATCHES_ALL) return "all";
    snprintf(buf, len, "%d", batches);
    return buf;
}

/* The recipe of the run that wrote checkpoint `ckpt` into *run (its path into path); false when it has none that
 * loads (a conversion's checkpoint). */
static bool load_run(const char *ckpt, Recipe *run, char *path, size_t len) {
    char err[2048];
    snprintf(path, len, "%s/%s", ckpt, CKPT_RECIPE_FILE);
    struct stat st;
    return stat(path, &st) == 0 && recipe_load(run, path, NULL, 0, 0, err, sizeof err) == 0;
}

/* Whether checkpoint `ckpt` has a recipe that does not load (a key renamed since, a file edited by hand): said,
 * since its settings then are not taken. */
static void say_unreadable_recipe(const char *ckpt, const char *path) {
    static Recipe run;
    char err[2048];
    struct stat st;
    if (stat(path, &st) == 0 && recipe_load(&run, path, NULL, 0, 0, err, sizeof err) != 0)
        fprintf(stderr, "eval: note: the run's recipe of %s does not load (%s): its settings are not taken, the "
                "defaults are\n", ckpt, err);
}

/* Whether dataset prefixes a and b name the same files (their .idx, whatever the spelling of the path). */
static bool same_dataset(const char *a, const char *b) {
    char pa[MT_PATH_MAX + 8], pb[MT_PATH_MAX + 8];
    struct stat sa, sb;
    snprintf(pa, sizeof pa, "%s.idx", a);
    snprintf(pb, sizeof pb, "%s.idx", b);
    return stat(pa, &sa) == 0 && stat(pb, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* The run that wrote checkpoint `ckpt` evaluated with its recipe's settings: when --data is what it evaluated on
 * (its one data.valid dataset, or with none the validation share of its one data.train) and these settings differ,
 * one note on stderr says the options that reproduce the run's eval_loss (nothing for a checkpoint without a
 * recipe, a conversion, or a run that did not evaluate). */
void eval_note_run_settings(const char *ckpt, const EvalOptions *opt) {
    static Recipe run;
    char path[MT_PATH_MAX + 80];
    if (!load_run(ckpt, &run, path, sizeof path)) return;
    if (run.train.eval_interval <= 0 || run.train.eval_batches == 0) return; /* the run logged no eval_loss */
    /* the run's evaluation data, when eval can read it: its one data.valid dataset, or with none the validation share
     * of its one data.train dataset (a blend is read by no single --data); --test scores test_loss, not eval_loss */
    const bool validated_on = run.data.num_valid == 1 && same_dataset(run.data.valid[0].path, opt->data);
    const bool split = run.data.num_valid == 0 && run.data.num_train == 1 && run.data.split[1] > 0 &&
                       same_dataset(run.data.train[0].path, opt->data);
    /* a blend: --data one of its datasets scores that one alone */
    const int blended = run.data.num_valid > 1 ? run.data.num_valid
                        : run.data.num_valid == 0 && run.data.split[1] > 0 && run.data.num_train > 1 ? run.data.num_train
                                                                                                        : 0;
    const DataSource *blend = run.data.num_valid > 1 ? run.data.valid : run.data.train;
    for (int i = 0; i < blended && !opt->test; i++)
        if (same_dataset(blend[i].path, opt->data)) {
            fprintf(stderr, "eval: note: the run of %s evaluated on a blend of %d datasets (data.%s); eval scores "
                    "--data alone, so this is not its eval_loss (%s)\n", ckpt, blended,
                    run.data.num_valid > 1 ? "valid" : "train", path);
            return;
        }
    if ((!validated_on && !split) || opt->test) return;
    char wanted[512] = "";
    size_t n = 0;
#define ADD(...) n += (size_t)snprintf(wanted + n, n < sizeof wanted ? sizeof wanted - n : 0, __VA_ARGS__)
    if (opt->seq_len != run.train.seq_len) ADD(" --seq-len %d", run.train.seq_len);
    if (opt->micro_batch_size != run.train.micro_batch_size) ADD(" --micro-batch-size %d", run.train.micro_batch_size);
    char num[24];
    if (opt->batches != run.train.eval_batches) ADD(" --batches %s", batches_text(run.train.eval_batches, num, sizeof num));
    if (opt->seed != run.run.seed) ADD(" --seed %llu", (unsigned long long)run.run.seed);
    if (opt->pack != run.data.pack) ADD("%s", run.data.pack ? " --pack" : " (no --pack)");
    if (run.data.pack && opt->pack_overlong != run.data.pack_overlong)
        ADD(" --pack-overlong %s", pack_overlong_name(run.data.pack_overlong));
    if (opt->loss != run.train.loss) ADD(" --loss %s", loss_reduction_name(run.train.loss));
    if (split && (!opt->split_given || memcmp(opt->split, run.data.split, sizeof opt->split) != 0))
        ADD(" --split %g,%g,%g", run.data.split[0], run.data.split[1], run.data.split[2]);
    if (validated_on && opt->split_given) ADD(" (no --split: its data.valid whole)");
#undef ADD
    if (wanted[0])
        fprintf(stderr, "eval: note: the run of %s evaluated with other settings; its eval_loss is this command "
                "with%s (%s)\n", ckpt, wanted, path);
}

int eval_run_settings(const char *ckpt, EvalOptions *opt) {
    static Recipe run;
    static char data[MT_PATH_MAX];
    char path[MT_PATH_MAX + 80];
    data[0] = '\0';
    if (!load_run(ckpt, &run, path, sizeof path)) {
        say_unreadable_recipe(ckpt, path);
        return 0;
    }
    char taken[MT_PATH_MAX + 512] = "";
    size_t n = 0;
#define ADD(...) n += (size_t)snprintf(taken + n, n < sizeof taken ? sizeof taken - n : 0, __VA_ARGS__)
    if (!opt->data) { /* the data its evaluation read, when one dataset */
        const double *split = opt->split_given ? opt->split : run.data.split; /* a --split given is the one read */
        const double share = split[opt->test ? 2 : 1];
        if (run.data.num_valid == 1 && !opt->test) {
            snprintf(data, sizeof data, "%s", run.data.valid[0].path);
            ADD(" --data %s (its data.valid)", data);
        } else if (opt->test && run.data.num_test == 1 && !opt->split_given) {
            snprintf(data, sizeof data, "%s", run.data.test[0].path);
            ADD(" --data %s (its data.test)", data);
        } else if (opt->test && run.data.num_test > 1 && !opt->split_given) {
            mt_error("eval: --test: the run of %s tested on a blend of %d datasets (data.test; %s): eval scores one "
                     "dataset, give --data PREFIX", ckpt, run.data.num_test, path);
            return 2;
        } else if (run.data.num_valid == 0 && run.data.num_train == 1 && share > 0) {
            snprintf(data, sizeof data, "%s", run.data.train[0].path);
            if (opt->split_given) {
                ADD(" --data %s (its data.train)", data);
            } else {
                memcpy(opt->split, run.data.split, sizeof opt->split);
                opt->split_given = true;
                ADD(" --data %s --split %g,%g,%g (its data.train and data.split)", data, opt->split[0],
                    opt->split[1], opt->split[2]);
            }
        } else if (opt->test && run.data.num_valid == 0 && run.data.num_train == 1 && !opt->split_given) {
            mt_error("eval: --test: the run of %s has no test data (no data.test, data.split %g,%g,%g; %s): give "
                     "--split with a test share, or --data PREFIX to score all of it", ckpt, run.data.split[0],
                     run.data.split[1], run.data.split[2], path);
            return 2;
        } else if (!opt->test && !opt->split_given && run.data.num_valid == 0 && !(share > 0)) {
            /* the run had nothing to evaluate on (a fine-tuning recipe's data.split 100,0,0): not a conversion's
             * checkpoint, which eval_options_check's error would call it (a --split without a validation share is
             * that option's error, there) */
            mt_error("eval: --data PREFIX is required: the run of %s had no validation data to take (no data.valid, "
                     "and data.split %g,%g,%g leaves data.train no validation share; %s): give --data PREFIX (--data "
                     "%s scores the run's training data)", ckpt, run.data.split[0], run.data.split[1],
                     run.data.split[2], path,
                     run.data.train[0].path);
            return 2;
        } else if (run.data.num_valid > 1 || (run.data.num_valid == 0 && run.data.num_train > 1 && share > 0)) {
            mt_error("eval: the run of %s evaluated on a blend of %d datasets (data.%s; %s): eval scores one dataset, "
                     "give --data PREFIX", ckpt, run.data.num_valid > 1 ? run.data.num_valid : run.data.num_train,
                     run.data.num_valid > 1 ? "valid" : "train", path);
            return 2;
        }
        if (data[0]) opt->data = data;
    }
    if (!(opt->given & EVAL_GAVE_SEQ_LEN)) opt->seq_len = run.train.seq_len, ADD(" --seq-len %d", run.train.seq_len);
    if (!(opt->given & EVAL_GAVE_MICRO_BATCH))
        opt->micro_batch_size = run.train.micro_batch_size, ADD(" --micro-batch-size %d", run.train.micro_batch_size);
    char num[24];
    if (!(opt->given & EVAL_GAVE_BATCHES) && run.train.eval_batches != 0)
        opt->batches = run.train.eval_batches, ADD(" --batches %s", batches_text(run.train.eval_batches, num, sizeof num));
    if (!(opt->given & EVAL_GAVE_SEED)) opt->seed = run.run.seed, ADD(" --seed %llu", (unsigned long long)run.run.seed);
    if (!(opt->given & EVAL_GAVE_PACK)) {
        opt->pack = run.data.pack;
        if (run.data.pack) ADD(" --pack");
    }
    if (!(opt->given & EVAL_GAVE_PACK_OVERLONG) && opt->pack) {
        opt->pack_overlong = run.data.pack_overlong;
        ADD(" --pack-overlong %s", pack_overlong_name(run.data.pack_overlong));
    }
    if (!(opt->given & EVAL_GAVE_LOSS)) {
        opt->loss = run.train.loss;
        if (run.train.loss != LOSS_PER_MICRO_BATCH) ADD(" --loss %s", loss_reduction_name(run.train.loss));
    }
#undef ADD
    if (taken[0]) fprintf(stderr, "eval: the run's settings (%s):%s\n", path, taken);
    return 0;
}
