/* resume_report.h: what a resume says about the recipe it goes on with, once
 * the checkpoint has loaded on every rank and the resume is accepted (so
 * once, for the checkpoint actually resumed, never before a refusal): what
 * its --set values change, key by key, and which of them make the run read
 * other samples, compute another model, or only train the router otherwise;
 * a dataset that moved with the same contents; an evaluation over other
 * samples (train.eval_batches counts micro-batches; `all` to or from a
 * count); and an edited
 * run.dir/recipe.yaml, which resume does not read.
 *
 * resume_cmd.c arms the report before each checkpoint it tries;
 * train_resume.c says it when the load succeeded. */
#ifndef MT_TRAIN_RESUME_REPORT_H
#define MT_TRAIN_RESUME_REPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "../config/recipe.h"

typedef struct ResumeReport {
    char recipe_path[MT_PATH_MAX + 32];   /* the checkpoint's recipe.yaml */
    const char *const *overrides;         /* the run's own directory ("run.dir=...") first, when num_kept is 1, */
    int num_overrides;                    /* then the --set values: how many in all */
    int num_kept;                         /* how many of them the checkpoint's own recipe is loaded with: 0 or 1 */
    long step;                            /* the checkpoint's progress (recipe_load_resumed) */
    double tokens;
    int64_t samples;
    char run_dir_recipe[MT_PATH_MAX + 32]; /* run.dir/recipe.yaml to compare with, "" for none (a branch, or
                                            * run --resume-if-exists, whose recipe is the command's) */
    bool stores_base;                     /* a LoRA checkpoint that stores its frozen base: resume_cmd.c made the
                                            * recipe's checkpoint.frozen_base store, which no --set asked */
    bool reference_unavailable;           /* ... though a --set asked reference: said as a warning */
} ResumeReport;

/* The report to say at the next successful load (copied); NULL disarms it. */
void resume_report_arm(const ResumeReport *report);

/* Rank 0, once the checkpoint `checkpoint_dir` has loaded: the armed report against `resumed` (the recipe in
 * force); `evaluates`: the run has validation data. Disarms it; nothing when none is armed. */
void resume_report_say(const Recipe *resumed, const char *checkpoint_dir, bool evaluates);

#endif
