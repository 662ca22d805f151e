/* recipe_validate.c: checks that span several keys (head counts, the layout
 * against the world size, batch divisibility, LR schedule lengths, MoE
 * blocks, token ids below the vocabulary).
 * Each failure names the file and line of the key it blames. */
#include <stdarg.h>
#include <string.h>

#include "../core/json.h"
#include "batch_schedule.h"
#include "recipe_schema.h"

/* Location of the deepest key of dotted `rel` present under `map`; *whole (when not NULL): whether all of it is. */
static YLoc key_loc(const YNode *map, YLoc loc, const char *rel, bool *whole) {
    char part[MT_KEY_PATH_MAX];
    const char *p = rel;
    while (*p) {
        size_t len = strcspn(p, ".");
        if (len >= sizeof part) break;
        memcpy(part, p, len);
        part[len] = '\0';
        const YEntry *entry = ytree_entry(map, part);
        if (!entry) break;
        loc = entry->loc;
        map = entry->value;
        p += len;
        if (*p == '.') p++;
    }
    if (whole) *whole = *p == '\0';
    return loc;
}

static YLoc path_loc(const YNode *map, YLoc loc, const char *rel) { return key_loc(map, loc, rel, NULL); }

static int fail(char *err, size_t errlen, const YNode *map, YLoc loc, const char *prefix, const char *rel,
                const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static int fail(char *err, size_t errlen, const YNode *map, YLoc loc, const char *prefix, const char *rel,
                const char *fmt, ...) {
    char message[512], path[MT_KEY_PATH_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    return key_error(err, errlen, path_loc(map, loc, rel), join_path(path, sizeof path, prefix, rel), "%s", message);
}

/* fail() of two keys at odds, blaming `rel` at its line, or at the --set that gave `other` when `rel` comes from the
 * recipe file and `other` from the command line (--set optimizer.schedule.decay_steps=3 under the file's warmup 5). */
static int fail_pair(char *err, size_t errlen, const YNode *root, YLoc at, const char *rel, const char *other,
                     const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static int fail_pair(char *err, size_t errlen, const YNode *root, YLoc at, const char *rel, const char *other,
                     const char *fmt, ...) {
    char message[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    bool whole = false;
    YLoc loc = path_loc(root, at, rel);
    const YLoc other_loc = key_loc(root, at, other, &whole);
    if (loc.line > 0 && whole && other_loc.line == 0) loc = other_loc; /* line 0: a --set (yaml_tree.h) */
    return key_error(err, errlen, loc, rel, "%s", message);
}

int model_validate(const ModelConfig *m, const YNode *map, YLoc loc, const char *prefix, char *err, size_t errlen) {
    if (m->num_attention_heads % m->num_key_value_heads != 0)
        return fail(err, errlen, map, loc, prefix, "num_key_value_heads",
                    "expected a divisor of num_attention_heads (%d), found %d", m->num_attention_heads,
                    m->num_key_value_heads);
    if (!ytree_has(map, "head_dim") && m->hidden_size % m->num_attention_heads != 0)
        return fail(err, errlen, map, loc, prefix, "hidden_size",
                    "expected a multiple of num_attention_heads (%d) when head_dim is not given, found %d",
                    m->num_attention_heads, m->hidden_size);
    const SpecialTokenIds *ids = &m->token_ids;
    if (ids->has_bos && ids->bos >= m->vocab_size)
        return fail(err, errlen, map, loc, prefix, "bos_token_id", "expected an id below vocab_size (%d), found %d",
                    m->vocab_size, ids->bos);
    if (ids->has_pad && ids->pad >= m->vocab_size)
        return fail(err, errlen, map, loc, prefix, "pad_token_id", "expected an id below vocab_size (%d), found %d",
                    m->vocab_size, ids->pad);
    for (int i = 0; i < ids->num_eos; i++)
        if (ids->eos[i] >= m->vocab_size)
            return fail(err, errlen, map, loc, prefix, "eos_token_id", "expected ids below vocab_size (%d), found %d",
                        m->vocab_size, ids->eos[i]);
    bool has_moe = ytree_has(map, "moe");
    if (model_family_is_moe(m->family) && !has_moe)
        return fail(err, errlen, map, loc, prefix, "moe", "missing, required for the MoE family %s",
                    model_family_name(m->family));
    if (!model_family_is_moe(m->family) && has_moe)
        return fail(err, errlen, map, loc, prefix, "moe",
                    "found a moe block, expected none for the dense family %s (MoE families: mixtral, qwen3_moe)",
                    model_family_name(m->family));
    if (!has_moe) return 0;
    if (m->moe.num_experts_per_tok > m->moe.num_experts)
        return fail(err, errlen, map, loc, prefix, "moe.num_experts_per_tok",
                    "expected at most moe.num_experts (%d), found %d", m->moe.num_experts, m->moe.num_experts_per_tok);
    const YNode *freq = ytree_get(ytree_get(map, "moe"), "layer_freq");
    if (freq && freq->kind == YNODE_SEQUENCE && freq->count != m->num_layers)
        return fail(err, errlen, map, loc, prefix, "moe.layer_freq",
                    "expected one 0/1 entry per layer (num_layers = %d), found %d entries", m->num_layers, freq->count);
    return 0;
}

int peft_validate(const ModelConfig *m, const YNode *peft_map, YLoc peft_loc, char *err, size_t errlen) {
    const PeftConfig *p = &m->peft;
    if (p->type == PEFT_NONE) return 0;
    const char *moe = lora_moe_refusal(m);
    for (int t = LORA_GATE; moe && t <= LORA_DOWN && ytree_has(peft_map, "target_modules"); t++)
        if (lora_targets(p, (LoraTarget)t)) /* the first MLP target, at target_modules */
            return fail(err, errlen, peft_map, peft_loc, "peft", "target_modules",
                        "%s: on a mixture-of-experts model (model.family %s) LoRA adapts the attention projections "
                        "only (q_proj, k_proj, v_proj, o_proj, the default there): the routed experts have no "
                        "adapters", lora_target_name((LoraTarget)t), model_family_name(m->family));
    if (moe)
        return key_error(err, errlen, peft_loc, "peft", "%s (model.family %s)", moe, model_family_name(m->family));
    if (p->dropout != 0)
        return fail(err, errlen, peft_map, peft_loc, "peft", "dropout",
                    "expected 0: LoRA dropout is not implemented yet, found %g", p->dropout);
    return 0;
}

/* Location and path of batch stage i (a list item, or the key itself: rampup_batch_size for the stages it made). */
static YLoc stage_loc(const YNode *root, YLoc root_loc, int stage, char *path, size_t pathlen) {
    const YNode *train = ytree_get(root, "train");
    const char *key = ytree_has(train, "rampup_batch_size")   ? "rampup_batch_size" /* its stages */
                      : ytree_has(train, "global_batch_size") ? "global_batch_size"
                                                              : "batch_schedule";
    const YEntry *entry = ytree_entry(train, key);
    snprintf(path, pathlen, "train.%s", key);
    if (!entry) return path_loc(root, root_loc, "train");
    if (entry->value->kind == YNODE_SEQUENCE && stage < entry->value->count && strcmp(key, "batch_schedule") == 0) {
        snprintf(path, pathlen, "train.%s[%d].global_batch_size", key, stage);
        return entry->value->entries[stage].loc;
    }
    return entry->loc;
}

static int validate_layout(const Recipe *r, const YNode *root, YLoc at, int world, char *err, size_t errlen) {
    const ParallelConfig *p = &r->parallel;
    const ModelConfig *m = &r->model;
    long model_parallel = (long)p->tp * p->pp * p->cp;
    if (world % model_parallel != 0)
        return fail(err, errlen, root, at, "", "parallel",
                    "expected tp * pp * cp (%d * %d * %d = %ld) to divide the world size %d (%s%ld)", p->tp,
                    p->pp, p->cp, model_parallel, world,
                    world == 1 ? "one process: launch it with mpirun -np N, N a multiple of "
                               : "launch a number of ranks that is a multiple of ",
                    model_parallel);
    long dp = world / model_parallel;
    long unit = (long)r->train.micro_batch_size * dp;
    const TrainConfig *t = &r->train;
    const double resumed_at = t->batch_stages_in_tokens ? t->resumed_tokens : (double)t->resumed_step;
    /* a stage a resumed run has finished (the next one applies already) is not run on this layout */
#define STAGE_FINISHED(i) ((i) + 1 < t->num_batch_stages && t->batch_stages[(i) + 1].start <= resumed_at)
    for (int i = 0; i < r->train.num_batch_stages; i++) {
        if (STAGE_FINISHED(i)) continue;
        long batch = r->train.batch_stages[i].global_batch_size;
        if (batch % unit == 0) continue;
        char path[MT_KEY_PATH_MAX], fix[160];
        YLoc loc = stage_loc(root, at, i, path, sizeof path);
        /* the largest smaller micro-batch that every stage still to run divides into at this dp, if any */
        int micro = r->train.micro_batch_size - 1;
        for (; micro > 0; micro--) {
            bool fits = true;
            for (int j = 0; j < t->num_batch_stages && fits; j++)
                fits = STAGE_FINISHED(j) || t->batch_stages[j].global_batch_size % ((long)micro * dp) == 0;
            if (fits) break;
        }
        if (micro > 0)
            snprintf(fix, sizeof fix, " (--set train.micro_batch_size=%d fits at dp %ld)", micro, dp);
        else
            snprintf(fix, sizeof fix, " (no micro-batch size does at dp %ld: launch a number of ranks whose dp divides "
                     "%ld)", dp, batch);
        if (r->train.num_batch_stages == 1)
            return key_error(err, errlen, loc, path, "expected a multiple of micro_batch_size * dp = %d * %ld = %ld, "
                             "found %ld%s", r->train.micro_batch_size, dp, unit, batch, fix);
        return key_error(err, errlen, loc, path,
                         "stage %d has global batch size %ld; expected a multiple of micro_batch_size * dp = %d * %ld = "
                         "%ld%s", i, batch, r->train.micro_batch_size, dp, unit, fix);
    }
    if (p->vpp > 1 && p->pp > 1)
        for (int i = 0; i < r->train.num_batch_stages; i++) {
            if (STAGE_FINISHED(i)) continue;
            long micro = r->train.batch_stages[i].global_batch_size / unit;
            if (micro % p->pp == 0) continue;
            char path[MT_KEY_PATH_MAX];
            YLoc loc = stage_loc(root, at, i, path, sizeof path);
            return key_error(err, errlen, loc, path,
                             "the interleaved schedule (vpp %d) needs the micro-batches per step, global_batch_size / "
                             "(micro_batch_size * dp) = %ld, to be a multiple of pp (%d)", p->vpp, micro, p->pp);
        }
#undef STAGE_FINISHED
    if (m->num_attention_heads % p->tp != 0 || m->num_key_value_heads % p->tp != 0)
        return fail(err, errlen, root, at, "", "parallel.tp",
                    "expected a divisor of num_attention_heads (%d) and num_key_value_heads (%d), found %d",
                    m->num_attention_heads, m->num_key_value_heads, p->tp);
    if (m->vocab_size % p->tp != 0)
        return fail(err, errlen, root, at, "", "parallel.tp",
                    "expected a divisor of vocab_size (%d) for the vocab-parallel embedding, found %d", m->vocab_size,
                    p->tp);
    if (m->intermediate_size % p->tp != 0)
        return fail(err, errlen, root, at, "", "parallel.tp",
                    "expected a divisor of intermediate_size (%d) for the column-parallel MLP, found %d",
                    m->intermediate_size, p->tp);
    if (m->peft.type == PEFT_LORA && m->peft.rank % p->tp != 0) /* Megatron-Bridge's split of A in q/k/v, gate/up */
        return fail(err, errlen, root, at, "", "peft.rank",
                    "expected a multiple of parallel.tp (%d): the column-parallel layers' A is split over tp along "
                    "its rank, found %d", p->tp, m->peft.rank);
    if (p->sequence_parallel && p->tp > 1 && (r->train.seq_len / p->cp) % p->tp != 0)
        return fail(err, errlen, root, at, "", "parallel.sequence_parallel",
                    "expected seq_len / cp (%d / %d) to be a multiple of tp (%d) to split the sequence", r->train.seq_len,
                    p->cp, p->tp);
    if (p->vpp > 1 && p->pp == 1)
        return fail(err, errlen, root, at, "", "parallel.vpp", "expected 1 when pp is 1, found %d", p->vpp);
    if (p->num_pp_layers > 0) {
        long sum = 0;
        for (int i = 0; i < p->num_pp_layers; i++) sum += p->pp_layers[i];
        if (p->num_pp_layers != (long)p->pp * p->vpp)
            return fail(err, errlen, root, at, "", "parallel.pp_layers",
                        "expected one layer count per pipeline stage (pp * vpp = %d * %d = %ld), found %d", p->pp,
                        p->vpp, (long)p->pp * p->vpp, p->num_pp_layers);
        if (sum != m->num_layers)
            return fail(err, errlen, root, at, "", "parallel.pp_layers",
                        "expected the counts to add up to num_layers (%d), found %ld", m->num_layers, sum);
    } else if (m->num_layers % (p->pp * p->vpp) != 0) {
        return fail(err, errlen, root, at, "", p->vpp > 1 ? "parallel.vpp" : "parallel.pp",
                    "expected pp * vpp (%d * %d) to divide num_layers (%d), or parallel.pp_layers to list each "
                    "stage's layers", p->pp, p->vpp, m->num_layers);
    }
    if (p->cp > 1 && r->train.seq_len % (2 * p->cp) != 0)
        return fail(err, errlen, root, at, "", "train.seq_len", "expected a multiple of 2 * cp = %d, found %d", 2 * p->cp,
                    r->train.seq_len);
    if (!model_family_is_moe(m->family)) {
        if (p->ep > 1 || p->etp > 1)
            return fail(err, errlen, root, at, "", p->ep > 1 ? "parallel.ep" : "parallel.etp",
                        "expected 1 for the dense family %s, found %d", model_family_name(m->family),
                        p->ep > 1 ? p->ep : p->etp);
        return 0;
    }
    if (m->moe.num_experts % p->ep != 0)
        return fail(err, errlen, root, at, "", "parallel.ep", "expected a divisor of moe.num_experts (%d), found %d",
                    m->moe.num_experts, p->ep);
    if (p->etp != 1 && p->etp != p->tp)
        return fail(err, errlen, root, at, "", "parallel.etp",
                    "expert tensor parallel splits the experts over the tp group: expected 1 or tp (%d), found %d",
                    p->tp, p->etp);
    /* each tp rank holds 1/etp of every expert's intermediate (and the shared expert's), as the dense MLP's */
    if (m->moe.moe_intermediate_size % p->etp != 0)
        return fail(err, errlen, root, at, "", "parallel.etp",
                    "expected a divisor of model.moe.moe_intermediate_size (%d) for the experts' column-parallel "
                    "gate/up, found %d", m->moe.moe_intermediate_size, p->etp);
    if (m->moe.shared_expert_intermediate_size % p->etp != 0)
        return fail(err, errlen, root, at, "", "parallel.etp",
                    "expected a divisor of model.moe.shared_expert_intermediate_size (%d) for the shared expert's "
                    "column-parallel gate/up, found %d", m->moe.shared_expert_intermediate_size, p->etp);
    if (p->ep > 1 && dp % p->ep != 0)
        return fail(err, errlen, root, at, "", "parallel.ep",
                    "expected a divisor of dp (world / (tp * cp * pp) = %d / %ld = %ld): the experts are split over "
                    "data-parallel ranks, found %d", world, model_parallel, dp, p->ep);
    /* (so ep * etp divides world / pp = tp * cp * dp) */
    if (p->cp > 1 && m->moe.capacity_factor > 0)
        return fail(err, errlen, root, at, "", "model.moe.capacity_factor",
                    "not implemented with context parallel (cp %d): an expert's capacity spans the cp ranks' tokens; "
                    "set it to null (dropless) or cp to 1", p->cp);
    return 0;
}

int recipe_validate_layout(const Recipe *r, int world, char *err, size_t errlen) {
    /* no tree: each failure names its key alone (validate_layout's locations come from the recipe's file) */
    return validate_layout(r, NULL, (YLoc){(char *)r->source_path, 0}, world, err, errlen);
}

/* Megatron's --start-weight-decay / --end-weight-decay / --weight-decay-incr-style: the end is given exactly when
 * the style moves the decay, and is not below the start (Megatron asserts end_wd >= start_wd). */
static int validate_weight_decay(const OptimizerConfig *o, const YNode *root, YLoc at, char *err, size_t errlen) {
    const bool moves = o->weight_decay_style != WD_CONSTANT;
    if (moves && o->weight_decay_end == 0 && o->weight_decay > 0)
        return fail_pair(err, errlen, root, at, "optimizer.weight_decay_style", "optimizer.weight_decay_end",
                         "%s needs optimizer.weight_decay_end, the weight decay of the run's last step (from "
                         "optimizer.weight_decay, %g, at the first)", weight_decay_style_name(o->weight_decay_style),
                         o->weight_decay);
    if (!moves && o->weight_decay_end > 0 && o->weight_decay_end != o->weight_decay)
        return fail_pair(err, errlen, root, at, "optimizer.weight_decay_end", "optimizer.weight_decay_style",
                         "found %g with weight_decay_style constant (weight_decay %g throughout), expected "
                         "optimizer.weight_decay_style linear or cosine to move the weight decay to it",
                         o->weight_decay_end, o->weight_decay);
    if (moves && o->weight_decay_end < o->weight_decay)
        return fail_pair(err, errlen, root, at, "optimizer.weight_decay_end", "optimizer.weight_decay",
                         "expected at least optimizer.weight_decay (%g), found %g (the weight decay rises over the "
                         "run, as Megatron's --weight-decay-incr-style)", o->weight_decay, o->weight_decay_end);
    return 0;
}

static int validate_schedule(const Recipe *r, const YNode *root, YLoc at, char *err, size_t errlen) {
    const OptimizerConfig *o = &r->optimizer;
    if (o->min_lr > o->lr)
        return fail_pair(err, errlen, root, at, "optimizer.min_lr", "optimizer.lr",
                         "expected at most optimizer.lr (%g), found %g", o->lr, o->min_lr);
    if (o->warmup_init > o->lr)
        return fail_pair(err, errlen, root, at, "optimizer.schedule.warmup_init", "optimizer.lr",
                         "expected at most optimizer.lr (%g), found %g (the lr warmup rises from warmup_init to lr)",
                         o->lr, o->warmup_init);
    if (o->warmup_init > 0 && o->warmup_steps == 0 && o->warmup_fraction == 0)
        return fail(err, errlen, root, at, "", "optimizer.schedule.warmup_init",
                    "found %g without a warmup, expected optimizer.schedule.warmup_steps or warmup_fraction (the lr "
                    "warmup starts from it)", o->warmup_init);
    if (o->warmup_fraction > 0) { /* a share of the decay span: it ends before the decay does, whatever the steps */
        char fraction[32]; /* as written: %g says 1 for 0.999999999 */
        json_format_double(fraction, sizeof fraction, o->warmup_fraction);
        if (o->warmup_fraction >= 1.0)
            return fail(err, errlen, root, at, "", "optimizer.schedule.warmup_fraction",
                        "expected a fraction of the decay steps below 1, found %s", fraction);
        if (o->warmup_steps > 0)
            return fail(err, errlen, root, at, "", "optimizer.schedule.warmup_fraction",
                        "found both warmup_steps (%ld) and warmup_fraction (%s), expected one of them (--set "
                        "optimizer.schedule.warmup_steps=null drops the steps)", o->warmup_steps, fraction);
    }
    /* With decay_steps given, the schedule is its own (a run may be a first chunk of it, as Megatron's
     * --exit-interval allows): warmup must end before the decay does, as Megatron asserts, else the lr falls
     * from lr to min_lr in one step. Without it the decay spans the run, which warmup must fit. */
    if (o->decay_steps > 0) {
        if (o->decay != DECAY_CONSTANT && o->warmup_steps >= o->decay_steps)
            return fail_pair(err, errlen, root, at, "optimizer.schedule.warmup_steps", "optimizer.schedule.decay_steps",
                        "expected fewer than optimizer.schedule.decay_steps (%ld), found %ld (the lr would drop from "
                        "optimizer.lr to min_lr in one step when warmup ends)", o->decay_steps, o->warmup_steps);
    } else if (r->train.steps > 0 && o->warmup_steps > r->train.steps) {
        return fail_pair(err, errlen, root, at, "optimizer.schedule.warmup_steps", "train.steps",
                    "expected at most train.steps (%ld), found %ld (a short run needs --set "
                    "optimizer.schedule.warmup_steps=%ld or fewer, or a longer schedule's "
                    "optimizer.schedule.decay_steps)", r->train.steps, o->warmup_steps, r->train.steps);
    } else {
        const long token_steps = r->train.tokens > 0 ? train_total_steps(&r->train) : 0;
        if (token_steps > 0 && o->warmup_steps > token_steps)
            return fail(err, errlen, root, at, "", "optimizer.schedule.warmup_steps",
                        "expected at most the %ld steps train.tokens (%.0f) takes, found %ld (a short run needs --set "
                        "optimizer.schedule.warmup_steps=%ld or fewer, or a longer schedule's "
                        "optimizer.schedule.decay_steps)", token_steps, r->train.tokens, o->warmup_steps, token_steps);
    }
    if (o->decay != DECAY_WSD) return 0;
    if (o->wsd_decay_steps <= 0)
        return fail(err, errlen, root, at, "", "optimizer.schedule.wsd_decay_steps",
                    "expected a positive number of steps when decay is wsd, found %ld", o->wsd_decay_steps);
    long decay_steps = o->decay_steps > 0 ? o->decay_steps : r->train.steps;
    if (decay_steps > 0 && o->wsd_decay_steps > decay_steps)
        return fail_pair(err, errlen, root, at, "optimizer.schedule.wsd_decay_steps",
                    o->decay_steps > 0 ? "optimizer.schedule.decay_steps" : "train.steps",
                    "expected at most the decay steps (%ld, from %s), found %ld", decay_steps,
                    o->decay_steps > 0 ? "optimizer.schedule.decay_steps" : "train.steps", o->wsd_decay_steps);
    return 0;
}

/* A blend gives every dataset a weight or none (then each weighs its tokens, as Megatron weighs a --data-path
 * without weights by size). */
static int validate_blend(const DataSource *sources, int count, const char *key, const YNode *root, YLoc at,
                          char *err, size_t errlen) {
    for (int i = 1; i < count; i++) {
        if ((sources[i].weight > 0) == (sources[0].weight > 0)) continue;
        return fail(err, errlen, root, at, "", key, "item %d %s and item 0 %s: give every dataset of a blend a "
                    "weight, or none (then each weighs its tokens, as Megatron weighs a --data-path without weights)",
                    i, sources[i].weight > 0 ? "has a weight" : "has no weight",
                    sources[0].weight > 0 ? "has one" : "has none");
    }
    return 0;
}

int recipe_validate(const Recipe *r, const YNode *root, int world_size, char *err, size_t errlen) {
    YLoc at = {(char *)r->source_path, 1};
    /* 0: the smallest world of the layout, for `megatrain plan` without --world: its model-parallel size, times ep
     * (dp = ep, the fewest data-parallel ranks the experts split over) */
    if (world_size < 1) world_size = world_size == 0 ? recipe_smallest_world(r) : 1;
    if (model_validate(&r->model, ytree_get(root, "model"), path_loc(root, at, "model"), "model", err, errlen) != 0)
        return -1;
    if (peft_validate(&r->model, ytree_get(root, "peft"), path_loc(root, at, "peft"), err, errlen) != 0) return -1;
    if (r->train.steps > 0 && r->train.tokens > 0)
        return fail(err, errlen, root, at, "", "train.tokens",
                    "found both train.steps and train.tokens, expected only one of them (on the command line, "
                    "--set train.tokens=null or train.steps=null drops the recipe's)");
    if (r->train.steps == 0 && r->train.tokens == 0)
        return fail(err, errlen, root, at, "", "train.steps", "missing required key (or give train.tokens)");
    if (r->train.num_batch_stages == 0)
        return fail(err, errlen, root, at, "", "train.global_batch_size",
                    "missing required key (or give train.batch_schedule)");
    if (r->train.seq_len > r->model.max_position_embeddings)
        return fail(err, errlen, root, at, "", "train.seq_len",
                    "expected at most model.max_position_embeddings (%d), found %d", r->model.max_position_embeddings,
                    r->train.seq_len);
    if (validate_blend(r->data.train, r->data.num_train, "data.train", root, at, err, errlen) != 0 ||
        validate_blend(r->data.valid, r->data.num_valid, "data.valid", root, at, err, errlen) != 0 ||
        validate_blend(r->data.test, r->data.num_test, "data.test", root, at, err, errlen) != 0)
        return -1;
    /* test data from one place: data.test, or data.split's test share of data.train (ignored beside data.valid,
     * which trains on all of data.train; setup warns) */
    if (r->data.num_test > 0 && r->data.num_valid == 0 && r->data.split[2] > 0.0)
        return fail_pair(err, errlen, root, at, "data.split", "data.test",
                         "its test share (%g) and data.test both give test data, expected one of them (data.test: "
                         "\"data.split=[%g, %g, 0]\" holds out no test share of data.train)", r->data.split[2],
                         r->data.split[0], r->data.split[1]);
    if (validate_layout(r, root, at, world_size, err, errlen) != 0) return -1;
    if (validate_weight_decay(&r->optimizer, root, at, err, errlen) != 0) return -1;
    return validate_schedule(r, root, at, err, errlen);
}
