/* resume_cmd.c: `megatrain resume RUN_OR_CKPT_DIR [--set key.path=value ...]`.
 *
 * The recipe comes from the checkpoint (its recipe.yaml) with run.dir set to
 * the run directory the checkpoint lies in, then the --set overrides. The
 * newest checkpoint that verifies is used: one that is incomplete or
 * corrupt is reported, moved aside (iter_N.invalid) so that later saves do
 * not collide with it, and the next older one is tried; an entry named like
 * a checkpoint that is none (a file, a dangling link, a checkpoint renamed to
 * another step) stops the resume (exit 1), moving nothing. A checkpoint named
 * explicitly is used or refused, never replaced by another. A model shape
 * that differs from the checkpoint's is refused (exit 2). A LoRA checkpoint
 * whose referenced frozen base is missing or changed is refused (exit 1)
 * before anything is written or moved: the checkpoint itself is fine. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../ckpt/checkpoint.h"
#include "../ckpt/ckpt_locate.h"
#include "../ckpt/ckpt_model_config.h"
#include "../ckpt/ckpt_reader.h"
#include "../ckpt/ckpt_run.h"
#include "../config/batch_schedule.h"
#include "../config/recipe.h"
#include "../config/yaml_tree.h"
#include "../core/cli.h"
#include "../core/error.h"
#include "../core/fs.h"
#include "../core/json.h"
#include "../dist/comm.h"
#include "../dist/launch_env.h"
#include "../version.h"
#include "resume_report.h"
#include "train.h"
#include "train_context.h"

#define MAX_OVERRIDES 256

static const char *const resume_usage =
    "usage: megatrain resume RUN_OR_CKPT_DIR [--set key.path=value ...]\n"
    "\n"
    "Continue a run from its newest valid checkpoint (RUN_DIR or RUN_DIR/checkpoints),\n"
    "or from the checkpoint directory named (RUN_DIR/checkpoints/iter_NNNNNNN).\n"
    "The recipe is the checkpoint's; --set changes keys such as train.steps, the\n"
    "schedule, logging or checkpoint.load_optimizer (not the model's shape), and\n"
    "--set run.dir=NEW continues in another directory.\n";

/* argv -> the directory and the --set values. Returns 0, 1 (help printed) or 2. */
static int parse_args(int argc, char **argv, const char **dir, const char **sets, int *num_sets) {
    *dir = NULL;
    *num_sets = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *value = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(resume_usage, stdout);
            return 1;
        } else if (!strcmp(a, "--set")) {
            if (i + 1 >= argc) {
                mt_error("--set needs key.path=value\n%s", resume_usage);
                return 2;
            }
            value = argv[++i];
        } else if (!strncmp(a, "--set=", 6)) {
            value = a + 6;
        } else if (a[0] == '-' && a[1]) {
            cli_unknown_option("resume", a, resume_usage);
            return 2;
        } else if (*dir) {
            mt_error("unexpected argument '%s' (the directory is already given as '%s')", a, *dir);
            return 2;
        } else {
            *dir = a;
        }
        if (value) {
            if (!strchr(value, '=') || *num_sets >= MAX_OVERRIDES - 1) {
                mt_error("--set %s: expected key.path=value", value);
                return 2;
            }
            sets[(*num_sets)++] = value;
        }
    }
    if (!*dir) {
        mt_error("missing RUN_OR_CKPT_DIR\n%s", resume_usage);
        return 2;
    }
    return 0;
}

/* "run.dir=\"DIR\"": DIR as a YAML double-quoted scalar that reads back as DIR byte for byte (yaml_quote: a raw line
 * break, NEL among them, would be folded into a space, and the run would continue elsewhere). -1 with err when DIR
 * cannot be said so: not UTF-8 (YAML holds text), or too long for run.dir. */
static int run_dir_override(char *out, size_t len, const char *dir, char *err, size_t errlen) {
    if (!utf8_valid(dir, strlen(dir))) {
        mt_set_error(err, errlen, "%s: the run directory's path is not UTF-8, which a recipe (YAML) cannot hold: "
                     "rename it, or resume its checkpoint with --set run.dir=NEW", dir);
        return -1;
    }
    const int n = snprintf(out, len, "run.dir=");
    if (strlen(dir) >= MT_PATH_MAX || n < 0 || yaml_quote(dir, out + n, len - (size_t)n) >= len - (size_t)n) {
        mt_set_error(err, errlen, "%s: the run directory's path is longer than run.dir holds (%d bytes)", dir,
                     MT_PATH_MAX - 1);
        return -1;
    }
    return 0;
}

/* Whether a --set gives section.key a value: "section.key=..." or "section={... key: ...}" (the section form, which
 * replaces the section with the keys it names). */
static bool sets_key(const char *set, const char *section, const char *key) {
    const size_t ns = strlen(section), nk = strlen(key);
    if (strncmp(set, section, ns) != 0) return false;
    if (set[ns] == '.') return strncmp(set + ns + 1, key, nk) == 0 && set[ns + 1 + nk] == '=';
    if (set[ns] != '=') return false;
    char err[256];
    YNode *value = ytree_load_string(set + ns + 1, "--set", err, sizeof err);
    const bool has_key = value && value->kind == YNODE_MAPPING && ytree_entry(value, key);
    ytree_free(value);
    return has_key;
}

/* What a --set does to run.dir: RUN_DIR_SET (run.dir=..., or run={... dir: ...}: the run goes there), RUN_DIR_DROPPED
 * (run={...} without dir: it replaces the section, run.dir with it, which the run's own must then be again), or
 * RUN_DIR_KEPT. */
typedef enum { RUN_DIR_KEPT, RUN_DIR_SET, RUN_DIR_DROPPED } RunDirEffect;
static RunDirEffect run_dir_effect(const char *set) {
    if (!strncmp(set, "run.dir=", 8)) return RUN_DIR_SET;
    if (strncmp(set, "run=", 4) != 0) return RUN_DIR_KEPT;
    char err[256];
    YNode *value = ytree_load_string(set + 4, "--set", err, sizeof err);
    const bool has_dir = value && value->kind == YNODE_MAPPING && ytree_entry(value, "dir");
    ytree_free(value);
    return has_dir ? RUN_DIR_SET : RUN_DIR_DROPPED;
}

static bool sets_run_dir(const char *const *sets, int num_sets) {
    for (int i = 0; i < num_sets; i++)
        if (run_dir_effect(sets[i]) == RUN_DIR_SET) return true;
    return false;
}

/* Move an unusable checkpoint aside as <dir>.invalid[.K]; never deletes.
 * Rank 0's job when there are several ranks. */
static void move_aside(const char *dir) {
    if (dist_rank() != 0) return;
    char target[MT_PATH_MAX + 80];
    for (int k = 0; k < 100; k++) {
        if (k == 0) snprintf(target, sizeof target, "%s.invalid", dir);
        else snprintf(target, sizeof target, "%s.invalid.%d", dir, k);
        struct stat st;
        if (lstat(target, &st) == 0) continue;
        if (rename(dir, target) == 0) mt_warn("moved %s aside to %s", dir, target);
        else mt_warn("cannot move %s aside: %s", dir, strerror(errno));
        return;
    }
}

/* Whether run_dir holds the checkpoint `ckpt` itself (of step `step`: the same metadata, byte for byte): then its
 * checkpoints are this run's, and `ckpt` a copy of one of them. */
static bool holds_same_checkpoint(const char *run_dir, const char *ckpt, long step) {
    char mine[MT_PATH_MAX + 64], theirs[MT_PATH_MAX + 64], ignored[256];
    snprintf(mine, sizeof mine, "%s/%s", ckpt, CKPT_METADATA_FILE);
    snprintf(theirs, sizeof theirs, "%s/checkpoints/iter_%07ld/%s", run_dir, step, CKPT_METADATA_FILE);
    size_t na = 0, nb = 0;
    char *a = mt_read_file(mine, (size_t)1 << 30, &na, ignored, sizeof ignored);
    char *b = a ? mt_read_file(theirs, (size_t)1 << 30, &nb, ignored, sizeof ignored) : NULL;
    const bool same = a && b && na == nb && memcmp(a, b, na) == 0;
    free(a);
    free(b);
    return same;
}

/* Later saves of the resumed run (from checkpoint `ckpt` of step `step`) land in run.dir/checkpoints. In the run's
 * own directory: refuse when it holds checkpoints newer than `step` (they would be mixed with the new ones). In
 * another directory (a branch, --set run.dir=NEW): refuse any checkpoint there, which would be another run's (or
 * branch's), mixed with this one's and deleted by its retention, as `run` refuses them. A checkpoint outside a run's
 * checkpoints/ (a copy kept aside) continues in its recipe's run.dir, often relative to wherever resume runs: the
 * run's own only when that holds the very checkpoint copied, else maybe another run's, refused as a branch. */
static int check_target_dir(const Recipe *recipe, const CkptLocation *loc, const char *ckpt, bool run_dir_given,
                            long step, char *err, size_t errlen) {
    char dir[MT_PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/checkpoints", recipe->run.dir);
    long *steps = NULL;
    int n = ckpt_list_entries(dir, &steps, err, errlen);
    if (n < 0) return MT_EXIT_FAILURE;
    long newest = n > 0 ? steps[n - 1] : -1;
    free(steps);
    const bool copy_elsewhere = !run_dir_given && !loc->run_dir[0] && n > 0 &&
                                !holds_same_checkpoint(recipe->run.dir, ckpt, step);
    if (copy_elsewhere) {
        mt_set_error(err, errlen,
                     "%s is not inside a run's checkpoints/ directory, so the run would continue in its recipe's "
                     "run.dir, '%s', which holds checkpoints (the newest at step %ld) but not this one: maybe another "
                     "run's, which would be mixed with this one's (and deleted by its retention); continue in an "
                     "empty directory: --set run.dir=NEW", ckpt, recipe->run.dir, newest);
        return MT_EXIT_USAGE;
    }
    if (n > 0 && run_dir_given && !mt_same_file(recipe->run.dir, loc->run_dir)) {
        mt_set_error(err, errlen,
                     "run.dir: '%s' already holds checkpoints (the newest at step %ld) of another run or branch; "
                     "their checkpoints would be mixed with this one's (and deleted by its retention): continue in "
                     "an empty run.dir (--set run.dir=NEW), or continue that branch with `megatrain resume %s`",
                     recipe->run.dir, newest, recipe->run.dir);
        return MT_EXIT_USAGE;
    }
    if (newest <= step) return 0;
    mt_set_error(err, errlen,
                 "%s holds a newer checkpoint (step %ld) than the one resumed from (step %ld); the new checkpoints would "
                 "be mixed with it: resume from the newest (megatrain resume %s), or continue in another directory "
                 "with --set run.dir=NEW",
                 dir, newest, step, recipe->run.dir);
    return MT_EXIT_USAGE;
}

/* The result of trying one checkpoint. */
enum { TRY_NEXT = -1000 };

/* Every rank refused the resume at the same point (said once): the ranks end MPI together, no abort. */
static bool refused_together;

/* run --resume-if-exists: the recipe the checkpoint's (with the --set values) must equal; NULL for resume. */
static const Recipe *run_recipe;

/* A refusal every rank meets at the same point, before the resumed run's collectives (each reads the same files):
 * the first failing rank says it (dist_report_first), and the ranks end together. Returns the agreed status. */
__attribute__((format(printf, 2, 3))) static int refuse_together(int status, const char *fmt, ...) {
    char message[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    status = dist_report_first(status, message);
    if (status != 0) refused_together = true;
    return status;
}

/* Resume from checkpoint `dir`: TRY_NEXT when it is unusable (reported), else an exit status. */
static int try_checkpoint(const char *dir, const CkptLocation *loc, const char *const *sets, int num_sets) {
    char err[4096];
    /* an entry named like a checkpoint that is none (a file; a dangling link: an archive volume not mounted) is no
     * corrupt checkpoint: falling back would lose the state it stands for, and moving a link aside hide it */
    const int kind = ckpt_entry_not_dir(dir, err, sizeof err);
    if (kind != 0)
        return refuse_together(MT_EXIT_FAILURE, "resume: %s is named like a checkpoint but is %s; nothing was moved "
                               "aside and no older checkpoint tried: %s, and resume again", dir, err,
                               kind == 2 ? "mount what it links to (or remove the link to resume from the older "
                                           "checkpoints)" : "remove it (or move it out of checkpoints/)");
    CkptReader *r = ckpt_reader_open(dir, err, sizeof err);
    if (!r) { /* every rank reads the same files to the same verdict: rank 0 says it */
        /* (not of a newer format's: the refusal after it says why, and that nothing is skipped) */
        if (dist_rank() == 0 && !ckpt_meta_newer()) mt_warn("skipping checkpoint %s: %s", dir, err);
        return TRY_NEXT;
    }
    const bool has_state = r->meta.has_state, references_base = r->meta.base.present;
    bool has_recipe = false;
    for (int i = 0; i < r->meta.num_files; i++) has_recipe |= r->meta.files[i].role == CKPT_FILE_RECIPE;
    const long step = has_state ? (long)r->meta.state.step : 0;
    const double tokens = has_state ? (double)r->meta.state.consumed_tokens : 0.0;
    const int64_t samples = has_state ? r->meta.state.consumed_samples : 0;
    ckpt_reader_close(r);
    /* a checkpoint renamed (or copied) to another step's name would be resumed as the newest, and the newer ones
     * it hides refused: its name and its metadata must say the same step; it is no corrupt one either (moved
     * aside, the state it holds would be left behind) */
    const char *slash = strrchr(dir, '/');
    const long named = ckpt_parse_iter_name(slash ? slash + 1 : dir);
    if (has_state && named >= 0 && named != step) {
        char own[MT_PATH_MAX + 32];
        snprintf(own, sizeof own, "%.*siter_%07ld", slash ? (int)(slash + 1 - dir) : 0, dir, step);
        struct stat st;
        return refuse_together(MT_EXIT_FAILURE, "resume: %s: its name says step %ld, its metadata step %ld (renamed "
                               "or copied?); nothing was moved aside and no older checkpoint tried: %s %s%s, and "
                               "resume again", dir, named, step, stat(own, &st) == 0 ? "remove it (a copy?" : "rename "
                               "it back to", own, stat(own, &st) == 0 ? " is there)" : " (or remove it)");
    }
    if (!has_state || !has_recipe) {
        return refuse_together(MT_EXIT_FAILURE,
                               "%s: not a checkpoint of a run (no %s); it can initialise a new run but not be resumed",
                               dir, has_state ? "recipe" : "training state");
    }
    if (references_base && ckpt_check_base(dir, err, sizeof err) != 0) {
        return refuse_together(MT_EXIT_FAILURE, "resume: %s", err);
    }

    const char *overrides[2 * MAX_OVERRIDES + 1]; /* the run's own directory first, and again after a run={...} */
    char run_dir_set[4 * MT_PATH_MAX + 32];
    int n = 0;
    /* --set run.dir=NEW: a branch, which the run's own directory does not concern */
    const bool run_dir_given = sets_run_dir(sets, num_sets);
    const bool own_dir = loc->run_dir[0] && !run_dir_given;
    if (own_dir && run_dir_override(run_dir_set, sizeof run_dir_set, loc->run_dir, err, sizeof err) != 0)
        return refuse_together(MT_EXIT_USAGE, "resume: %s", err);
    if (own_dir) overrides[n++] = run_dir_set;
    for (int i = 0; i < num_sets; i++) {
        overrides[n++] = sets[i];
        /* run={seed: 7} replaced the section, the run's directory with it: the run's own again */
        if (own_dir && run_dir_effect(sets[i]) == RUN_DIR_DROPPED) overrides[n++] = run_dir_set;
    }

    static Recipe recipe;
    char path[MT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", dir, CKPT_RECIPE_FILE);
    /* every rank reads the same recipe: a refusal is said once, and the ranks end together (resume_main) */
    char said[sizeof err + 400] = "";
    const int loaded = recipe_load_resumed(&recipe, path, overrides, n, launch_world_size(), step, tokens, samples, err,
                                           sizeof err) != 0
                           ? MT_EXIT_USAGE : MT_EXIT_OK;
    /* the experts' split is named for a MoE checkpoint only (a dense one's hint would name keys of no use to it) */
    ModelConfig hinted;
    const bool moe = loaded != MT_EXIT_OK && ckpt_read_model_config(dir, &hinted, said, sizeof said) == 0 &&
                     hinted.moe.num_experts > 0;
    if (loaded != MT_EXIT_OK)
        snprintf(said, sizeof said, "%s%s", err,
                 strstr(err, "to divide the world size") && moe ? "\n  (checkpoints resume on any layout: set the one "
                 "of this launch, e.g. --set parallel.tp=1 --set parallel.pp=1 --set parallel.cp=1, and with pp 1 "
                 "--set parallel.vpp=1 --set parallel.pp_layers=null; a MoE model's experts too, e.g. "
                 "--set parallel.ep=1 --set parallel.etp=1)"
                 : strstr(err, "to divide the world size") ? "\n  (checkpoints resume on any layout: set the one of "
                 "this launch, e.g. --set parallel.tp=1 --set parallel.pp=1 --set parallel.cp=1, and with pp 1 "
                 "--set parallel.vpp=1 --set parallel.pp_layers=null)"
                 : strstr(err, "parallel.ep:") || strstr(err, "parallel.etp:")
                     ? "\n  (checkpoints resume on any layout: set this launch's expert split, e.g. --set parallel.ep=1 "
                       "--set parallel.etp=1; ep divides dp, etp is 1 or tp)"
                 : strstr(err, "parallel.pp_layers:") || strstr(err, "parallel.vpp:")
                     ? "\n  (the checkpoint's pipeline split: a resume on another pp sets its own, e.g. "
                       "--set parallel.pp_layers=null --set parallel.vpp=1)" : "");
    const int agreed = dist_report_first(loaded, said);
    if (agreed != MT_EXIT_OK) {
        refused_together = true;
        return agreed;
    }
    /* the run goes on in its own directory, byte for byte (a path the recipe reader would change, resumed elsewhere,
     * let its retention delete another directory's checkpoints) */
    if (own_dir && strcmp(recipe.run.dir, loc->run_dir) != 0)
        return refuse_together(MT_EXIT_USAGE, "resume: %s: the recipe reads the run directory's path back as '%s': "
                               "rename the directory, or resume with --set run.dir=NEW", loc->run_dir, recipe.run.dir);
    if (run_recipe) { /* run --resume-if-exists: the same run or none */
        /* what a resume writes into the recipe itself is not the user's change: the checkpoint's values of
         * checkpoint.frozen_base (a LoRA resume stores its base), load_optimizer (true once resumed) */
        static Recipe asked;
        asked = *run_recipe;
        asked.checkpoint.frozen_base = recipe.checkpoint.frozen_base;
        asked.checkpoint.load_optimizer = recipe.checkpoint.load_optimizer;
        size_t na, nb;
        char *ours = recipe_yaml_text(&asked, &na), *theirs = recipe_yaml_text(&recipe, &nb), where[2600] = "";
        if (strcmp(ours, theirs) != 0)
            recipe_text_difference(ours, theirs, "in this recipe", "in the checkpoint's", where, sizeof where);
        free(ours);
        free(theirs);
        if (where[0])
            return refuse_together(MT_EXIT_USAGE, "--resume-if-exists: %s holds a run whose recipe differs from this "
                                   "one, first at %s: to change it on purpose, `megatrain resume %s --set KEY=VALUE`; "
                                   "else choose another run.dir", dir, where, recipe.run.dir);
    }
    ModelConfig stored;
    if (ckpt_read_model_config(dir, &stored, err, sizeof err) != 0) {
        /* (not of a newer format's: the refusal after it says why, and that nothing is skipped) */
        if (dist_rank() == 0 && !ckpt_meta_newer()) mt_warn("skipping checkpoint %s: %s", dir, err);
        return TRY_NEXT;
    }
    if (ckpt_model_shape_check(&stored, &recipe.model, err, sizeof err) != 0)
        return refuse_together(MT_EXIT_USAGE, "%s", err);
    int status = check_target_dir(&recipe, loc, dir, run_dir_given, step, err, sizeof err);
    if (status != 0) return refuse_together(status, "%s", err);
    /* A checkpoint that stores its frozen base has none recorded to reference: the run goes on storing it (a --set
     * of reference, which cannot be done, is warned of with the report). */
    bool reference_asked = false;
    for (int i = 0; i < num_sets; i++)
        reference_asked |= sets_key(sets[i], "checkpoint", "frozen_base") && /* checkpoint={frozen_base: ...} too */
                           recipe.checkpoint.frozen_base == FROZEN_BASE_REFERENCE;
    if (recipe.model.peft.type == PEFT_LORA && !references_base) recipe.checkpoint.frozen_base = FROZEN_BASE_STORE;
    /* load_optimizer applies to this start only: the recipe the resumed run
     * stores says true, so a later resume loads the optimizer again. */
    bool load_optimizer = recipe.checkpoint.load_optimizer;
    /* --resume-if-exists: every requeue continues the run, AdamW state included; only a --set of the key says no
     * (in a recipe file it is a one-off resume's, which would drop the state at each requeue) */
    bool optimizer_set = false;
    for (int i = 0; i < num_sets; i++) optimizer_set |= sets_key(sets[i], "checkpoint", "load_optimizer");
    if (run_recipe && !optimizer_set) load_optimizer = true;
    recipe.checkpoint.load_optimizer = true;
    /* said once the checkpoint has loaded (train_resume.c): for the checkpoint actually resumed, after every
     * refusal, a load's included */
    ResumeReport report = {.overrides = overrides, .num_overrides = n, .num_kept = n > num_sets ? 1 : 0, .step = step, .tokens = tokens,
                           .samples = samples, .stores_base = recipe.model.peft.type == PEFT_LORA && !references_base,
                           .reference_unavailable = reference_asked && recipe.model.peft.type == PEFT_LORA &&
                                                    !references_base};
    snprintf(report.recipe_path, sizeof report.recipe_path, "%s", path);
    if (own_dir && !run_recipe) /* (--resume-if-exists: the recipe is the command's, compared above) */
        snprintf(report.run_dir_recipe, sizeof report.run_dir_recipe, "%s/recipe.yaml", loc->run_dir);
    resume_report_arm(&report);
    status = train_resume(&recipe, dir, load_optimizer, err, sizeof err);
    resume_report_arm(NULL);
    if (status != TRAIN_CHECKPOINT_UNREADABLE) return status;
    /* every rank agreed it is unreadable: the first that could not load it says why, once */
    char skipped[sizeof err + MT_PATH_MAX + 64];
    snprintf(skipped, sizeof skipped, "skipping checkpoint %s: %s", dir, err);
    dist_warn_first(err[0] != '\0' && !ckpt_meta_newer(), skipped);
    return TRY_NEXT;
}

static int resume_from(const char *arg, const char *const *sets, int num_sets);

int run_or_resume(const Recipe *recipe, const char *const *sets, int num_sets) {
    char dir[MT_PATH_MAX + 16], err[2048], invalid[2048 + MT_PATH_MAX] = "";
    snprintf(dir, sizeof dir, "%s/checkpoints", recipe->run.dir);
    long *steps = NULL;
    const int n = ckpt_list_entries(dir, &steps, err, sizeof err);
    free(steps);
    /* rank 0's listing decides for every rank (a stale view elsewhere must not split the job between a fresh
     * run's collectives and a resume's): 1 resume, 0 start, -1 refuse */
    int decision = n > 0 ? 1 : ckpt_invalid_only(dir, invalid, sizeof invalid) > 0 ? -1 : 0;
    if (comm_world()->size > 1) comm_broadcast(comm_world(), &decision, 1, COMM_INT32, 0);
    if (decision < 0) /* every checkpoint was found unusable and moved aside: starting over would lose the run */
        return dist_finish_together(refuse_together(MT_EXIT_FAILURE, "--resume-if-exists: %s", invalid));
    if (decision == 0) { /* a fresh run (or no checkpoints/ directory yet) */
        if (dist_rank() == 0) mt_log("run: --resume-if-exists: no checkpoint in %s: starting the run", dir);
        return dist_finish(train_run(recipe));
    }
    if (dist_rank() == 0) mt_log("run: --resume-if-exists: %s holds checkpoints: resuming", dir);
    run_recipe = recipe;
    /* run.dir is the recipe's (a --set of it included): the directory to lock, resume in, and compare */
    const char *kept[MAX_OVERRIDES];
    int num_kept = 0;
    for (int i = 0; i < num_sets && num_kept < MAX_OVERRIDES; i++)
        if (run_dir_effect(sets[i]) != RUN_DIR_SET) kept[num_kept++] = sets[i];
    const int status = resume_from(recipe->run.dir, kept, num_kept);
    return refused_together ? dist_finish_together(status) : dist_finish(status);
}

int resume_main(int argc, char **argv) {
    const char *arg, *sets[MAX_OVERRIDES];
    int num_sets;
    int rc = parse_args(argc, argv, &arg, sets, &num_sets);
    if (rc != 0) return rc == 1 ? MT_EXIT_OK : MT_EXIT_USAGE;
    /* Several ranks (mpirun): every rank reads the same checkpoint and comes
     * to the same verdict on each; rank 0 alone moves bad ones aside and
     * writes run.dir (train_setup_resume). */
    if (launch_world_size() > 1) dist_init(NULL, NULL);
    const int status = resume_from(arg, sets, num_sets);
    return refused_together ? dist_finish_together(status) : dist_finish(status);
}

/* After a checkpoint was found unusable: when what failed was this machine's (too many open files, memory,
 * permissions: mt_env_error) on any rank, every rank stops (exit 1) with the checkpoint left where it is. Moving it
 * aside as corrupt, and falling back to an older one, would train the run again from there, and with every
 * checkpoint failing alike leave none (--resume-if-exists then refuses the run). A collective; 0 or 1. */
static int refuse_machine_failure(const char *dir) {
    const int env = mt_env_error();
    return refuse_together(env ? MT_EXIT_FAILURE : 0,
                           "%s could not be read for a reason of this machine, not of the checkpoint (%s): it is left "
                           "as it is and no older checkpoint is tried; fix that (ulimit -n, memory, permissions) and "
                           "resume again", dir, strerror(env));
}

/* After a checkpoint was found unusable: when its format is a newer megatrain's (ckpt_meta_newer) on any rank, every
 * rank stops (exit 1) with the checkpoint left where it is. An older megatrain in a job script (a module, a build not
 * updated) moved each checkpoint of the run aside as corrupt in turn, after which --resume-if-exists refused the run
 * even with the right megatrain. A collective; 0 or 1. */
static int refuse_newer_format(const char *dir) {
    const unsigned version = ckpt_meta_newer();
    return refuse_together(version ? MT_EXIT_FAILURE : 0,
                           "%s was written by a newer megatrain (checkpoint format version %u; this one, %s, reads "
                           "version %d): it is left as it is and no older checkpoint is tried; resume with the "
                           "megatrain that wrote it", dir, version, "megatrain " MEGATRAIN_VERSION, CKPT_FORMAT_VERSION);
}

static int resume_from(const char *arg, const char *const *sets, int num_sets) {
    CkptLocation loc;
    char err[2048];
    const int located = ckpt_locate(arg, &loc, err, sizeof err);
    if (located != 0) /* a missing RUN_OR_CKPT_DIR, or a file: usage, as every command's missing path */
        return refuse_together(located == CKPT_LOCATE_NO_DIR ? MT_EXIT_USAGE : MT_EXIT_FAILURE, "%s", err);
    /* Continuing in the run's own directory: it is this process's before any checkpoint is tried (and one moved
     * aside), so that a second resume, or the run itself still going, refuses this one first (train_setup_resume
     * locks run.dir in any case; with --set run.dir=NEW the source run is only read). */
    const bool run_dir_set = sets_run_dir(sets, num_sets);
    if (loc.run_dir[0] && !run_dir_set) {
        const int locked = dist_rank() != 0 || train_lock_run_dir(loc.run_dir, err, sizeof err) == 0;
        if (refuse_together(locked ? 0 : MT_EXIT_FAILURE, "%s", locked ? "" : err) != 0) return MT_EXIT_FAILURE;
    }
    if (loc.single) {
        mt_env_error_clear();
        ckpt_meta_newer_clear();
        int status = try_checkpoint(loc.checkpoint_dir, &loc, sets, num_sets);
        if (status != TRY_NEXT) return status;
        if (refuse_machine_failure(loc.checkpoint_dir) != 0 || refuse_newer_format(loc.checkpoint_dir) != 0)
            return MT_EXIT_FAILURE;
        return refuse_together(MT_EXIT_FAILURE,
                               "%s: the checkpoint is incomplete or corrupt (see above); resume from the run directory "
                               "to use the newest valid one", loc.checkpoint_dir);
    }
    long *steps = NULL;
    int n = ckpt_list_entries(loc.checkpoints_dir, &steps, err, sizeof err);
    if (n < 0) return refuse_together(MT_EXIT_FAILURE, "%s", err);
    long pointer;
    char found[256];
    int pointer_status = ckpt_read_latest(loc.checkpoints_dir, &pointer, found, sizeof found);
    if (pointer_status == -2 && n > 0)
        mt_warn("%s/%s holds %s, not a step number; ignoring it: resuming from the newest checkpoint directory, "
                "iter_%07ld", loc.checkpoints_dir, CKPT_LATEST_FILE, found, steps[n - 1]);
    else if (pointer_status == -2)
        mt_warn("%s/%s holds %s, not a step number; ignoring it", loc.checkpoints_dir, CKPT_LATEST_FILE, found);
    else if (n > 0 && pointer_status == 0 && pointer != steps[n - 1])
        mt_log("resume: %s says step %ld, the newest checkpoint directory is step %ld", CKPT_LATEST_FILE, pointer,
               steps[n - 1]);
    int status = TRY_NEXT, skipped = 0;
    for (int i = n - 1; i >= 0 && status == TRY_NEXT; i--) {
        char dir[MT_PATH_MAX + 32];
        ckpt_iter_path(dir, sizeof dir, loc.checkpoints_dir, steps[i]);
        mt_env_error_clear();
        ckpt_meta_newer_clear();
        status = try_checkpoint(dir, &loc, sets, num_sets);
        if (status == TRY_NEXT && (refuse_machine_failure(dir) != 0 || refuse_newer_format(dir) != 0)) {
            free(steps);
            return MT_EXIT_FAILURE;
        }
        if (status == TRY_NEXT) {
            skipped++;
            if (!run_dir_set) move_aside(dir); /* a branch (--set run.dir=NEW) only reads the source run */
            if (i > 0 && dist_rank() == 0) mt_warn("falling back to the next older checkpoint");
        }
    }
    free(steps);
    if (status == TRY_NEXT) {
        return refuse_together(MT_EXIT_FAILURE, "%s: no valid checkpoint to resume from (%d incomplete or corrupt)",
                               loc.checkpoints_dir, skipped);
    }
    return status;
}
