/* run_notes.h: what a run's recipe does that its author may not have meant, said once at the start of a run (rank
 * 0, train_setup's warn_unused_settings): a dataset listed twice in a blend, validation data that is the training
 * data or that no evaluation reads, a MoE capacity_factor that drops nothing, a schedule phase or batch stage past the last step (warnings); and the
 * banner's line that sums up the LR schedule. The notes are made here and printed by the caller, so a test reads them without a run. */
#ifndef MT_TRAIN_RUN_NOTES_H
#define MT_TRAIN_RUN_NOTES_H

#include <stdbool.h>
#include <stddef.h>

#include "../config/recipe.h"

#define RUN_NOTES_MAX 12
#define RUN_NOTE_LEN 768

typedef struct RunNotes {
    int count;
    char text[RUN_NOTES_MAX][RUN_NOTE_LEN];
    bool line[RUN_NOTES_MAX]; /* said as a line, not a warning: a batch stage past the end (a short run of a recipe
                               * made for a longer one, as the tests and the demo run them, asks nothing of anyone) */
} RunNotes;

/* data.train and data.valid: a prefix listed twice in one of them (each entry reads the same samples in the same
 * order), data.valid naming a dataset of data.train, data.valid with evaluation off. */
void run_notes_data(const Recipe *recipe, RunNotes *notes);

/* A MoE model's model.moe.capacity_factor of at least num_experts / num_experts_per_tok: a capacity that holds every
 * token an expert can be given (at most each token once), so nothing is ever dropped (a line). */
void run_notes_model(const Recipe *recipe, RunNotes *notes);

/* A warmup, a WSD decay or a batch_schedule stage that lies past the last step of `total_steps`
 * (train_total_steps). */
void run_notes_schedule(const Recipe *recipe, long total_steps, RunNotes *notes);

/* The LR schedule in one line over `total_steps` (>= 1), into buf: warmup, decay, min lr, where WSD's decay starts,
 * the lr of the last step. */
void run_notes_lr_line(const Recipe *recipe, long total_steps, char *buf, size_t len);

/* Each note through mt_log_warn, or mt_log ("note: ...") where it is a line. */
void run_notes_print(const RunNotes *notes);

/* The notes of the recipe's data and schedule (over train_total_steps), printed. */
void run_notes_say(const Recipe *recipe);

#endif
