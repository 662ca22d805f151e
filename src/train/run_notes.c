/* run_notes.c: the start-of-run notes of run_notes.h. A blend that lists a prefix twice reads it twice with the same
 * shuffle (each entry builds the same sample order, as Megatron-LM's blend does), so every sample is used twice back
 * to back: warned, not refused. Steps are counted as lr_at and the batch schedule count them: after N completed
 * steps, so the logged step N + 1 is the first with what starts at N. */
#include "run_notes.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../config/batch_schedule.h"
#include "../core/error.h"
#include "lr_schedule.h"

static void add(RunNotes *notes, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(RunNotes *notes, const char *fmt, ...) {
    if (notes->count >= RUN_NOTES_MAX) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(notes->text[notes->count], RUN_NOTE_LEN, fmt, ap);
    va_end(ap);
    notes->count++;
}

/* Whether two dataset prefixes name the same files: their PREFIX.idx resolved (a link, "a/../a"), else the text. */
static bool same_prefix(const char *a, const char *b) {
    if (strcmp(a, b) == 0) return true;
    char idx[MT_PATH_MAX + 8], real_a[PATH_MAX], real_b[PATH_MAX];
    snprintf(idx, sizeof idx, "%s.idx", a);
    if (!realpath(idx, real_a)) return false;
    snprintf(idx, sizeof idx, "%s.idx", b);
    return realpath(idx, real_b) && strcmp(real_a, real_b) == 0;
}

/* Each prefix that `sources` lists more than once, said at its first entry with the entries that repeat it. */
static void note_twice(const DataSource *sources, int count, const char *key, RunNotes *notes) {
    bool said[MT_MAX_DATA_SOURCES] = {false};
    for (int i = 0; i < count; i++) {
        if (said[i]) continue;
        char items[128];
        int n = snprintf(items, sizeof items, "%d", i), times = 1;
        double weights = sources[i].weight;
        for (int j = i + 1; j < count; j++) {
            if (said[j] || !same_prefix(sources[i].path, sources[j].path)) continue;
            said[j] = true;
            times++;
            weights += sources[j].weight;
            if (n >= 0 && (size_t)n < sizeof items) n += snprintf(items + n, sizeof items - (size_t)n, ", %d", j);
        }
        if (times == 1) continue;
        char merge[96] = "list it once (weighed by its tokens, each entry counts it again)";
        if (weights > 0) snprintf(merge, sizeof merge, "list it once with the weights summed (%g)", weights);
        char twice[24] = "twice";
        if (times > 2) snprintf(twice, sizeof twice, "%d times", times);
        add(notes, "%s lists %s %s (items %s): each entry reads the same samples in the same order, so each sample "
            "is used %s back to back; %s", key, sources[i].path, twice, items, twice, merge);
    }
}

/* Each dataset of a held-out list (data.valid, data.test) that is also in data.train, said once per dataset:
 * `scores` what its loss then measures, `instead` what to do. */
static void note_trained_on(const DataConfig *data, const DataSource *held, int count, const char *key,
                            const char *scores, const char *instead, RunNotes *notes) {
    for (int v = 0; v < count; v++)
        for (int t = 0; t < data->num_train; t++)
            if (same_prefix(held[v].path, data->train[t].path)) {
                add(notes, "%s[%d] is data.train[%d] (%s): %s documents this run trains on; give held-out data%s", key,
                    v, t, held[v].path, scores, instead);
                break;
            }
}

void run_notes_data(const Recipe *recipe, RunNotes *notes) {
    const DataConfig *data = &recipe->data;
    note_twice(data->train, data->num_train, "data.train", notes);
    note_twice(data->valid, data->num_valid, "data.valid", notes);
    note_trained_on(data, data->valid, data->num_valid, "data.valid", "evaluation scores",
                    ", or drop data.valid to hold out data.split's share of data.train", notes);
    note_twice(data->test, data->num_test, "data.test", notes);
    note_trained_on(data, data->test, data->num_test, "data.test", "test_loss scores", "", notes);
    if (data->num_valid > 0 && recipe->train.eval_interval <= 0)
        add(notes, "data.valid is given but evaluation is off (train.eval_interval is 0), so it is not read; "
            "--set train.eval_interval=N evaluates every N steps");
    if (data->num_test > 0 && recipe->train.eval_interval <= 0)
        add(notes, "data.test is given but evaluation is off (train.eval_interval is 0), so it is not read; "
            "--set train.eval_interval=N evaluates every N steps and data.test after the last one");
}

void run_notes_model(const Recipe *recipe, RunNotes *notes) {
    const MoeConfig *m = &recipe->model.moe;
    if (!model_family_is_moe(recipe->model.family) || m->capacity_factor <= 0 || m->num_experts_per_tok <= 0 ||
        m->capacity_factor * m->num_experts_per_tok < m->num_experts)
        return;
    /* an expert's capacity from each rank is ceil(c N k / E) rows of its N tokens, which route to it at most once */
    add(notes, "model.moe.capacity_factor %g is at least num_experts / num_experts_per_tok (%d / %d): each expert's "
        "capacity holds every token that can be routed to it, so no token is dropped and the factor changes "
        "nothing (a capacity below that drops the tokens past it)", m->capacity_factor, m->num_experts,
        m->num_experts_per_tok);
    notes->line[notes->count - 1] = true;
}

/* The lr schedule in words, into buf: "warmup 5 steps to 0.001, cosine decay to 0.0001 at step 40". */
static void describe_lr(const OptimizerConfig *o, long decay_steps, double warmup, char *buf, size_t len) {
    const char *steps = warmup == 1.0 ? "step" : "steps";
    int n = warmup > 0 && o->warmup_init > 0
                ? snprintf(buf, len, "warmup %g %s from %g to %g", warmup, steps, o->warmup_init, o->lr)
            : warmup > 0 ? snprintf(buf, len, "warmup %g %s to %g", warmup, steps, o->lr)
                         : snprintf(buf, len, "no warmup, %g from the first step", o->lr);
    if (n < 0 || (size_t)n >= len) return;
    buf += n;
    len -= (size_t)n;
    const char *until = o->decay_steps > 0 ? "optimizer.schedule.decay_steps" : "train.steps";
    switch (o->decay) {
    case DECAY_CONSTANT: snprintf(buf, len, ", then constant"); break;
    case DECAY_INVERSE_SQRT: snprintf(buf, len, ", then inverse_sqrt decay, not below %g", o->min_lr); break;
    case DECAY_LINEAR:
    case DECAY_COSINE:
        snprintf(buf, len, ", then %s decay to %g at step %ld (%s)", lr_decay_name(o->decay), o->min_lr, decay_steps,
                 until);
        break;
    case DECAY_WSD:
        snprintf(buf, len, ", constant to step %ld, then %s decay to %g at step %ld (%s)",
                 decay_steps - o->wsd_decay_steps, wsd_decay_style_name(o->wsd_decay_style), o->min_lr, decay_steps,
                 until);
        break;
    }
}

static void note_batch_stages(const TrainConfig *train, long total_steps, RunNotes *notes) {
    /* the tokens consumed before the last step: what a token-form stage is compared with there */
    const double last_tokens = (double)train_schedule_samples(train, total_steps - 1) * train->seq_len;
    if (train->rampup[0] > 0) { /* stages train.rampup_batch_size made: its key, one note for all of them */
        int first = 1;
        while (first < train->num_batch_stages && train->batch_stages[first].start <= last_tokens) first++;
        const int last = train->num_batch_stages - 1, before = notes->count;
        if (first > last) return;
        const BatchStage *a = &train->batch_stages[first], *b = &train->batch_stages[last];
        if (first == last)
            add(notes, "train.rampup_batch_size: stage %d (global batch size %ld, from %.0f tokens) starts after the "
                "%.0f tokens this run consumes before its last step: it never applies", first, a->global_batch_size,
                a->start, last_tokens);
        else
            add(notes, "train.rampup_batch_size: stages %d to %d (global batch size %ld to %ld, from %.0f tokens) start "
                "after the %.0f tokens this run consumes before its last step: they never apply", first, last,
                a->global_batch_size, b->global_batch_size, a->start, last_tokens);
        if (notes->count > before) notes->line[before] = true;
        return;
    }
    for (int i = 1; i < train->num_batch_stages; i++) {
        const BatchStage *stage = &train->batch_stages[i];
        const int before = notes->count;
        if (!train->batch_stages_in_tokens && stage->start >= (double)total_steps)
            add(notes, "train.batch_schedule[%d] (step %.0f, global batch size %ld) starts after this run's last "
                "step (%ld; a stage at step N applies from the logged step N + 1): it never applies", i, stage->start,
                stage->global_batch_size, total_steps);
        else if (train->batch_stages_in_tokens && stage->start > last_tokens)
            add(notes, "train.batch_schedule stage %d (from %.0f tokens, global batch size %ld) starts after "
                "the %.0f tokens this run consumes before its last step: it never applies", i, stage->start,
                stage->global_batch_size, last_tokens);
        if (notes->count > before) notes->line[before] = true;
    }
}

/* decay_steps (train.steps when null) and the warmup in steps (warmup_fraction's, not rounded) */
static long decay_steps_of(const OptimizerConfig *o, long total_steps) {
    return o->decay_steps > 0 ? o->decay_steps : total_steps;
}
static double warmup_of(const OptimizerConfig *o, long total_steps) {
    return o->warmup_fraction > 0 ? o->warmup_fraction * (double)decay_steps_of(o, total_steps)
                                  : (double)o->warmup_steps;
}

void run_notes_lr_line(const Recipe *recipe, long total_steps, char *buf, size_t len) {
    const OptimizerConfig *o = &recipe->optimizer;
    char schedule[384];
    describe_lr(o, decay_steps_of(o, total_steps), warmup_of(o, total_steps), schedule, sizeof schedule);
    int n = snprintf(buf, len, "lr schedule: %s; this run's last step, %ld, uses lr %.4g", schedule, total_steps,
                     lr_at(o, total_steps - 1, total_steps));
    if (o->weight_decay_style != WD_CONSTANT && n > 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, "; weight decay %g to %g (%s) over the run's %ld steps", o->weight_decay,
                 o->weight_decay_end, weight_decay_style_name(o->weight_decay_style), total_steps);
}

void run_notes_schedule(const Recipe *recipe, long total_steps, RunNotes *notes) {
    if (total_steps < 1) return;
    const OptimizerConfig *o = &recipe->optimizer;
    const long decay_steps = decay_steps_of(o, total_steps);
    const double warmup = warmup_of(o, total_steps);
    const double last_lr = lr_at(o, total_steps - 1, total_steps); /* the update of the last step */
    const char *longer = o->decay_steps <= 0 ? "lower optimizer.schedule.warmup_steps"
                         : "as meant if this run is the first part of a longer schedule (resume it with a larger "
                           "train.steps); else shorten optimizer.schedule.decay_steps, or set it to null (train.steps)";
    if (warmup > (double)(total_steps - 1))
        add(notes, "optimizer.schedule: the warmup (%g steps) ends after this run's last step (%ld), which uses "
            "lr %.4g, below optimizer.lr %g; %s", warmup, total_steps, last_lr, o->lr, longer);
    else if (o->decay == DECAY_WSD && decay_steps - o->wsd_decay_steps >= total_steps - 1)
        add(notes, "optimizer.schedule: the wsd decay starts after step %ld (decay_steps %ld - wsd_decay_steps "
            "%ld), past this run's last step (%ld): the run ends at the peak lr %g; %s",
            decay_steps - o->wsd_decay_steps, decay_steps, o->wsd_decay_steps, total_steps, o->lr, longer);
    note_batch_stages(&recipe->train, total_steps, notes);
}

void run_notes_say(const Recipe *recipe) {
    RunNotes notes = {0};
    run_notes_data(recipe, &notes);
    run_notes_model(recipe, &notes);
    run_notes_schedule(recipe, train_total_steps(&recipe->train), &notes);
    run_notes_print(&notes);
}

void run_notes_print(const RunNotes *notes) {
    for (int i = 0; i < notes->count; i++) {
        if (notes->line[i]) mt_log("note: %s", notes->text[i]);
        else mt_log_warn("%s", notes->text[i]);
    }
}
