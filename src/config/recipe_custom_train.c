/* recipe_custom_train.c: train and optimizer keys that are not plain
 * scalars: steps XOR tokens, the global batch size or its schedule (a step
 * list, Megatron's token-threshold string, or Megatron's batch ramp made into
 * its stages) and optimizer.betas. */
#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "recipe_schema.h"

int read_betas(void *base, const YEntry *entry, const char *path, char *err, size_t errlen) {
    OptimizerConfig *opt = base;
    const YNode *node = entry->value;
    char found[128];
    double beta[2];
    if (node->kind != YNODE_SEQUENCE || node->count != 2)
        return key_error(err, errlen, entry->loc, path, "expected a list of two numbers [beta1, beta2], found %s",
                         node->kind == YNODE_SEQUENCE ? "a list of another length" : ytree_describe(node, found, sizeof found));
    for (int i = 0; i < 2; i++) {
        const YNode *item = node->entries[i].value;
        if (yscalar_double(item, &beta[i]) != 0 || beta[i] < 0 || beta[i] >= 1)
            return key_error(err, errlen, node->entries[i].loc, path, "expected beta%d in [0, 1), found %s", i + 1,
                             ytree_describe(item, found, sizeof found));
    }
    opt->beta1 = beta[0];
    opt->beta2 = beta[1];
    return 0;
}

void write_betas(FILE *out, const void *base, const char *name, int indent) {
    const OptimizerConfig *opt = base;
    fprintf(out, "%*s%s: [", indent, "", name);
    write_yaml_double(out, opt->beta1);
    fprintf(out, ", ");
    write_yaml_double(out, opt->beta2);
    fprintf(out, "]\n");
}

int read_steps(void *base, const YEntry *entry, const char *path, char *err, size_t errlen) {
    long long steps;
    if (read_integer(entry->value, entry->loc, path, 1, 1LL << 53, &steps, err, errlen) != 0) return -1;
    ((TrainConfig *)base)->steps = (long)steps;
    return 0;
}

int read_tokens(void *base, const YEntry *entry, const char *path, char *err, size_t errlen) {
    char found[128];
    double tokens;
    if (entry->value->kind != YNODE_SCALAR || parse_token_count(entry->value->text, &tokens) != 0 || tokens < 1 ||
        tokens > 0x1p53)
        return key_error(err, errlen, entry->loc, path,
                         "expected a positive token count like 2400000000 or 2.4B, at most 2^53 (9.0e15), found %s",
                         ytree_describe(entry->value, found, sizeof found));
    ((TrainConfig *)base)->tokens = tokens;
    return 0;
}

void write_steps_or_tokens(FILE *out, const void *base, const char *name, int indent) {
    const TrainConfig *train = base;
    if (train->steps > 0) fprintf(out, "%*ssteps: %ld\n", indent, "", train->steps);
    if (train->tokens > 0) {
        fprintf(out, "%*stokens: ", indent, "");
        write_token_count(out, train->tokens);
        fputc('\n', out);
    }
}

/* Megatron's "0:16 2.4B:320 4.8B:624" into token-based stages. */
static int parse_token_schedule(TrainConfig *train, const YEntry *entry, const char *path, char *err, size_t errlen) {
    const char *text = entry->value->text;
    char item[128];
    int count = 0;
    const char *p = text;
    for (;;) {
        while (isspace((unsigned char)*p) || *p == ',') p++;
        if (*p == '\0') break;
        const char *token = p;
        size_t token_len = strcspn(p, " \t\r\n,");
        size_t len = token_len < sizeof item ? token_len : sizeof item - 1;
        memcpy(item, p, len);
        item[len] = '\0';
        p += token_len;
        char *colon = strchr(item, ':');
        double start;
        char *end;
        long batch = 0;
        if (colon) {
            *colon = '\0';
            batch = strtol(colon + 1, &end, 10);
        }
        if (!colon || *end != '\0' || colon[1] == '\0' || batch < 1 || parse_token_count(item, &start) != 0)
            return key_error(err, errlen, entry->loc, path,
                             "expected TOKENS:BATCH items like \"0:16 2.4B:320\", found '%.*s' in '%s'", (int)token_len, token, text);
        if (count == MT_MAX_BATCH_STAGES)
            return key_error(err, errlen, entry->loc, path, "expected at most %d stages", MT_MAX_BATCH_STAGES);
        if (count == 0 && start != 0)
            return key_error(err, errlen, entry->loc, path, "expected the first threshold to be 0, found %s", item);
        if (start > 0x1p53) /* as train.tokens: a threshold past any budget, and exact in the schedule's integers */
            return key_error(err, errlen, entry->loc, path, "expected thresholds of at most 2^53 (9.0e15) tokens, found %s",
                             item);
        if (count > 0 && start <= train->batch_stages[count - 1].start)
            return key_error(err, errlen, entry->loc, path, "expected increasing thresholds, found %s after %.17g", item,
                             train->batch_stages[count - 1].start);
        train->batch_stages[count++] = (BatchStage){start, batch};
    }
    if (count == 0)
        return key_error(err, errlen, entry->loc, path, "expected TOKENS:BATCH items like \"0:16 2.4B:320\", found ''");
    train->num_batch_stages = count;
    train->batch_stages_in_tokens = true;
    return 0;
}

static int reject_second_batch(const TrainConfig *train, const YEntry *entry, const char *path, char *err,
                               size_t errlen) {
    if (train->num_batch_stages == 0) return 0;
    return key_error(err, errlen, entry->loc, path,
                     "found both train.global_batch_size and train.batch_schedule, expected only one of them "
                     "(on the command line, --set train.batch_schedule=null or train.global_batch_size=null drops "
                     "the recipe's)");
}

int read_global_batch_size(void *base, const YEntry *entry, const char *path, char *err, size_t errlen) {
    TrainConfig *train = base;
    const YNode *node = entry->value;
    char found[128];
    long long batch;
    if (reject_second_batch(train, entry, path, err, errlen) != 0) return -1;
    if (yscalar_long(node, &batch) == 0) {
        if (batch < 1) /* torchtitan's -1 is local_batch_size x dp, Megatron's default micro_batch_size x dp */
            return key_error(err, errlen, entry->loc, path, "expected a positive integer, found %lld%s", batch,
                             batch == -1 ? " (torchtitan's -1, local_batch_size x dp, is not taken: give the number, "
                                           "train.micro_batch_size x dp for no gradient accumulation)"
                                         : "");
        train->num_batch_stages = 1;
        train->batch_stages_in_tokens = false;
        train->batch_stages[0] = (BatchStage){0, (long)batch};
        return 0;
    }
    if (node->kind == YNODE_SCALAR && strchr(node->text, ':')) return parse_token_schedule(train, entry, path, err, errlen);
    return key_error(err, errlen, entry->loc, path,
                     "expected a positive integer or a schedule like \"0:16 2.4B:320\", found %s",
                     ytree_describe(node, found, sizeof found));
}

typedef struct StepStage {
    long step;
    long global_batch_size;
} StepStage;

static const RecipeKey stage_keys[] = {
    {.name = "step", .type = KT_LONG, .offset = offsetof(StepStage, step), .ranged = true, .min = 0, .max = MT_NO_MAX,
     .required = true},
    {.name = "global_batch_size", .type = KT_LONG, .offset = offsetof(StepStage, global_batch_size), .ranged = true,
     .min = 1, .max = MT_NO_MAX, .required = true},
    {0},
};

int read_batch_schedule(void *base, const YEntry *entry, const char *path, char *err, size_t errlen) {
    TrainConfig *train = base;
    const YNode *node = entry->value;
    char found[128], item_path[MT_KEY_PATH_MAX];
    if (reject_second_batch(train, entry, path, err, errlen) != 0) return -1;
    if (node->kind == YNODE_SCALAR && !ytree_is_null(node)) return parse_token_schedule(train, entry, path, err, errlen);
    if (node->kind != YNODE_SEQUENCE || node->count == 0)
        return key_error(err, errlen, entry->loc, path,
                         "expected a list of {step, global_batch_size} or a string like \"0:16 2.4B:320\", found %s",
                         node->kind == YNODE_SEQUENCE ? "an empty list" : ytree_describe(node, found, sizeof found));
    if (node->count > MT_MAX_BATCH_STAGES)
        return key_error(err, errlen, entry->loc, path, "expected at most %d stages, found %d", MT_MAX_BATCH_STAGES,
                         node->count);
    for (int i = 0; i < node->count; i++) {
        const YEntry *item = &node->entries[i];
        StepStage stage = {0};
        snprintf(item_path, sizeof item_path, "%s[%d]", path, i);
        if (read_section(&stage, stage_keys, item->value, item->loc, item_path, err, errlen) != 0) return -1;
        if (i == 0 && stage.step != 0)
            return key_error(err, errlen, item->loc, item_path, "expected the first stage at step 0, found step %ld",
                             stage.step);
        if (i > 0 && stage.step <= (long)train->batch_stages[i - 1].start)
            return key_error(err, errlen, item->loc, item_path, "expected steps in increasing order, found %ld after %.0f",
                             stage.step, train->batch_stages[i - 1].start);
        train->batch_stages[i] = (BatchStage){(double)stage.step, stage.global_batch_size};
    }
    train->num_batch_stages = node->count;
    train->batch_stages_in_tokens = false;
    return 0;
}

/* Megatron's --rampup-batch-size START INCREMENT SAMPLES, kept as given until the whole recipe is read: its stages need
 * train.global_batch_size and seq_len (train_resolve_rampup). null drops it (--set train.rampup_batch_size=null). */
int read_rampup_batch_size(void *base, const YEntry *entry, const char *path, char *err, size_t errlen) {
    TrainConfig *train = base;
    const YNode *node = entry->value;
    char found[128];
    memset(train->rampup, 0, sizeof train->rampup);
    if (ytree_is_null(node)) return 0;
    static const char *const what[3] = {"START (the first global batch size)", "INCREMENT", "SAMPLES"};
    if (node->kind != YNODE_SEQUENCE || node->count != 3)
        return key_error(err, errlen, entry->loc, path,
                         "expected [START, INCREMENT, SAMPLES] as Megatron's --rampup-batch-size (the first global "
                         "batch size, its increment, and the samples over which it grows to train.global_batch_size), "
                         "found %s", node->kind == YNODE_SEQUENCE ? "a list of another length"
                                                                  : ytree_describe(node, found, sizeof found));
    for (int i = 0; i < 3; i++) {
        long long v;
        const YNode *item = node->entries[i].value;
        if (yscalar_long(item, &v) != 0 || v < 1 || v > (i == 2 ? (1LL << 40) : (long long)INT32_MAX))
            return key_error(err, errlen, entry->loc, path, "expected %s a positive integer%s, found %s", what[i],
                             i == 2 ? " of at most 2^40" : "", ytree_describe(item, found, sizeof found));
        train->rampup[i] = (long)v;
    }
    return 0;
}

int train_resolve_rampup(TrainConfig *train, const YNode *train_map, char *err, size_t errlen) {
    if (train->rampup[0] == 0) return 0;
    const YEntry *entry = ytree_entry(train_map, "rampup_batch_size");
    const YLoc loc = entry ? entry->loc : (YLoc){0};
    const char *path = "train.rampup_batch_size";
    const long start = train->rampup[0], increment = train->rampup[1], samples = train->rampup[2];
    const YNode *gbs = ytree_get(train_map, "global_batch_size");
    if (!ytree_has(train_map, "batch_schedule") && gbs && gbs->kind == YNODE_SCALAR && strchr(gbs->text, ':'))
        return key_error(err, errlen, loc, path, /* Megatron's token-threshold string written there */
                         "found a schedule in train.global_batch_size (\"%s\"), expected train.global_batch_size a "
                         "number, the batch the ramp ends at (Megatron's --global-batch-size)", gbs->text);
    if (train->num_batch_stages != 1 || train->batch_stages_in_tokens)
        return key_error(err, errlen, loc, path,
                         "found %s, expected train.global_batch_size, the batch the ramp ends at (Megatron's "
                         "--global-batch-size; --set train.batch_schedule=null drops a recipe's schedule)",
                         train->num_batch_stages == 0 ? "no train.global_batch_size" : "train.batch_schedule beside it");
    const long end = train->batch_stages[0].global_batch_size;
    if (start > end || (end - start) % increment != 0)
        return key_error(err, errlen, loc, path,
                         "expected START (%ld) at most train.global_batch_size (%ld), and INCREMENT (%ld) to divide "
                         "their difference (%ld), as Megatron asserts", start, end, increment, end - start);
    const long steps = (end - start) / increment; /* K: the increments; each is a stage after the first */
    if (steps + 1 > MT_MAX_BATCH_STAGES)
        return key_error(err, errlen, loc, path,
                         "makes %ld stages (from %ld to %ld by %ld), expected at most %d: a larger INCREMENT", steps + 1,
                         start, end, increment, MT_MAX_BATCH_STAGES);
    train->batch_stages[0] = (BatchStage){0, start};
    int count = 1;
    const double per_increment = (double)samples / (double)steps; /* Megatron's rampup_samples_per_increment */
    for (long k = 1; k <= steps; k++) { /* Megatron: int(consumed / (samples / K)) >= k from ceil(k x samples / K) */
        int64_t from = ((int64_t)k * samples + steps - 1) / steps;
        /* a whole-number threshold where Megatron's float division comes out just below k (27 / (27 / 13) is 12.99..):
         * its stage starts a sample later (once past SAMPLES, the last stage in any case) */
        if (from <= samples && (int64_t)((double)from / per_increment) < k) from++;
        const BatchStage stage = {(double)from * train->seq_len, start + k * increment};
        if (stage.start > 0x1p53) /* as a token schedule's threshold: run.dir/recipe.yaml reads it back */
            return key_error(err, errlen, loc, path,
                             "makes a stage from %.17g tokens (%lld samples of train.seq_len %d), expected "
                             "thresholds of at most 2^53 (9.0e15) tokens: a smaller SAMPLES", stage.start,
                             (long long)from, train->seq_len);
        /* SAMPLES below K: stages that share a threshold, of which the last applies (Megatron skips to it); only it
         * is kept, so that the schedule's thresholds increase, as run.dir/recipe.yaml's must to be read back */
        if (stage.start == train->batch_stages[count - 1].start) count--;
        train->batch_stages[count++] = stage;
    }
    train->num_batch_stages = count;
    train->batch_stages_in_tokens = true;
    return 0;
}

void write_batch(FILE *out, const void *base, const char *name, int indent) {
    const TrainConfig *train = base;
    if (train->batch_stages_in_tokens) {
        fprintf(out, "%*sbatch_schedule: \"", indent, "");
        for (int i = 0; i < train->num_batch_stages; i++) {
            fprintf(out, "%s", i ? " " : "");
            write_token_count(out, train->batch_stages[i].start);
            fprintf(out, ":%ld", train->batch_stages[i].global_batch_size);
        }
        fprintf(out, "\"\n");
    } else if (train->num_batch_stages == 1) {
        fprintf(out, "%*sglobal_batch_size: %ld\n", indent, "", train->batch_stages[0].global_batch_size);
    } else {
        fprintf(out, "%*sbatch_schedule:\n", indent, "");
        for (int i = 0; i < train->num_batch_stages; i++)
            fprintf(out, "%*s- {step: %.0f, global_batch_size: %ld}\n", indent + 2, "", train->batch_stages[i].start,
                    train->batch_stages[i].global_batch_size);
    }
}

void write_nothing(FILE *out, const void *base, const char *name, int indent) {
    (void)out, (void)base, (void)name, (void)indent;
}

int read_pp_layers(void *base, const YEntry *entry, const char *path, char *err, size_t errlen) {
    ParallelConfig *par = base;
    const YNode *node = entry->value;
    char found[128];
    if (ytree_is_null(node)) {
        par->num_pp_layers = 0;
        return 0;
    }
    if (node->kind != YNODE_SEQUENCE || node->count < 1 || node->count > MT_MAX_PP_LAYERS_LIST)
        return key_error(err, errlen, entry->loc, path,
                         "expected a list of 1..%d layer counts, one per pipeline stage (pp * vpp of them), found %s",
                         MT_MAX_PP_LAYERS_LIST, ytree_describe(node, found, sizeof found));
    for (int i = 0; i < node->count; i++) {
        long long value;
        const YNode *item = node->entries[i].value;
        if (yscalar_long(item, &value) != 0 || value < 0 || value > MT_MAX_LAYERS)
            return key_error(err, errlen, node->entries[i].loc, path, "expected item %d to be a layer count in 0..%d, found %s",
                             i, MT_MAX_LAYERS, ytree_describe(item, found, sizeof found));
        par->pp_layers[i] = (int)value;
    }
    par->num_pp_layers = node->count;
    return 0;
}

void write_pp_layers(FILE *out, const void *base, const char *name, int indent) {
    const ParallelConfig *par = base;
    fprintf(out, "%*s%s: ", indent, "", name);
    if (par->num_pp_layers == 0) {
        fprintf(out, "null\n");
        return;
    }
    fputc('[', out);
    for (int i = 0; i < par->num_pp_layers; i++) fprintf(out, "%s%d", i ? ", " : "", par->pp_layers[i]);
    fprintf(out, "]\n");
}

void parallel_stage_layers(const ParallelConfig *par, int num_layers, int g, int *first, int *count) {
    if (par->num_pp_layers > 0) {
        *first = 0;
        for (int i = 0; i < g; i++) *first += par->pp_layers[i];
        *count = par->pp_layers[g];
        return;
    }
    const int stages = par->pp * (par->vpp > 1 ? par->vpp : 1);
    *count = num_layers / stages;
    *first = g * *count;
}
