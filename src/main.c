/* main.c: command dispatch for the megatrain executable.
 *
 * megatrain run RECIPE.yaml [--set key.path=value ...]
 * megatrain resume RUN_OR_CKPT_DIR [--set key.path=value ...]
 * megatrain convert SRC DST [--dtype fp32|bf16|fp16] [--max-shard-size SIZE] [--merge-lora | --base-model NAME]
 *                           [--drop-expert-bias]
 * megatrain eval CKPT --data PREFIX [--batches N] [--seq-len T] [--pack] [--loss per_micro_batch|per_token] ...
 * megatrain inspect CKPT
 * megatrain data build --input FILE --output PREFIX [--tokenizer PATH|byte] [--eod-token TEXT] [--workers N] [--overwrite]
 * megatrain data build --format sft [--chat-template auto|llama3|llama3.1|chatml|qwen3] --input CHAT.jsonl --output PREFIX ...
 * megatrain data inspect PREFIX [--tokenizer PATH] [--docs N] [--json]
 * megatrain plan RECIPE.yaml [--world N] [--device-memory GiB]
 * Exit status: 0 success, 2 usage or recipe error, 1 any other failure.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_commands.h"
#include "config/recipe.h"
#include "convert/convert.h"
#include "core/cli.h"
#include "core/error.h"
#include "core/timer.h"
#include "data/data_build.h"
#include "data/data_inspect.h"
#include "dist/comm.h"
#include "dist/launch_env.h"
#include "dist/launch_threads.h"
#include "eval/eval.h"
#include "plan/plan.h"
#include "train/train.h"
#include "version.h"

#define MAX_OVERRIDES 256

static const char *const usage_text =
    "usage: megatrain COMMAND [ARGS]\n"
    "\n"
    "Train Llama, Qwen and mixture-of-experts models from YAML recipes: pretraining, supervised\n"
    "fine-tuning and LoRA, on the CPU or CUDA GPUs, on one rank or a parallel layout.\n"
    "\n"
    "commands:\n"
    "  run RECIPE.yaml [--set key.path=value ...] [--resume-if-exists]\n"
    "                                              train; output under run.dir (or continue it: a\n"
    "                                              requeued job's one command)\n"
    "  resume RUN_OR_CKPT_DIR [--set key.path=value ...]\n"
    "                                              continue from the latest valid checkpoint\n"
    "  convert SRC DST [--dtype fp32|bf16|fp16] [--max-shard-size SIZE] [--merge-lora | --base-model NAME]\n"
    "          [--drop-expert-bias]\n"
    "                                              Hugging Face dir <-> megatrain checkpoint (LoRA:\n"
    "                                              PEFT's adapter, or the merged model)\n"
    "  eval CKPT_OR_RUN_DIR [--data PREFIX] [--split W [--test]] [--batches N] [--seq-len T] [--micro-batch-size B]\n"
    "       [--seed S] [--pack [--pack-overlong error|truncate]] [--loss per_micro_batch|per_token] [--device D]\n"
    "       [--json]\n"
    "                                              mean next-token loss of a checkpoint on data (SFT: its\n"
    "                                              loss mask; packed rows; per-token mean)\n"
    "  inspect CKPT                                list tensors, verify every checksum\n"
    "  data build --input FILE --output PREFIX [--tokenizer PATH|byte] [--eod-token TEXT] [--json-key KEY]\n"
    "             [--add-bos] [--format text|jsonl] [--workers N] [--max-line-mib N] [--overwrite]\n"
    "                                              text or JSONL -> Megatron .bin/.idx\n"
    "  data build --format sft [--chat-template auto|llama3|llama3.1|chatml|qwen3] --input CHAT.jsonl --output PREFIX ...\n"
    "                                              SFT conversations -> .bin/.idx + a loss mask PREFIX_mask\n"
    "  data inspect PREFIX [--tokenizer PATH] [--docs N] [--json]\n"
    "                                              what a .bin/.idx dataset holds, documents decoded\n"
    "  plan RECIPE.yaml [--world N] [--device-memory GiB] [--set key.path=value ...]\n"
    "                                              the parallel layout: shards, memory and FLOPs per rank,\n"
    "                                              whether it fits, what run.device: cuda refuses\n"
    "\n"
    "options:\n"
    "  -h, --help      this help; `megatrain COMMAND --help` for one command\n"
    "  --version       print the version\n"
    "\n"
    "exit status: 0 success, 2 usage or recipe error, 1 any other failure.\n"
    "Recipe keys: the source tree's README.md (section \"Recipes\"); recipes/ has examples to start from,\n"
    "and a run writes every key it used, defaults included, to run.dir/recipe.yaml.\n";

static const char *const run_usage_text =
    "usage: megatrain run RECIPE.yaml [--set key.path=value ...] [--resume-if-exists]\n"
    "\n"
    "Train the model described by RECIPE.yaml. Writes run.dir/recipe.yaml (the\n"
    "resolved recipe) and run.dir/metrics.jsonl, and prints one line per logged step.\n"
    "A run.dir that holds checkpoints is refused: `megatrain resume` continues it.\n"
    "\n"
    "  --set key.path=value   override one recipe key; the value is YAML\n"
    "                         (e.g. --set train.steps=20 --set optimizer.betas=[0.9,0.99]; null removes\n"
    "                         a key: --set train.batch_schedule=null)\n"
    "  --resume-if-exists     when run.dir holds checkpoints, resume from the newest valid one as\n"
    "                         `megatrain resume RUN_DIR` with these --set values does; else start: one\n"
    "                         command for a job that is requeued after preemption. The checkpoint's recipe\n"
    "                         with these --set values must be this one (a recipe file that changed is\n"
    "                         refused, naming the first key that differs)\n"
    "\n"
    "Under mpirun the same command trains on many ranks with the recipe's parallel: layout\n"
    "(parallel.tp, pp, vpp, cp, ep, etp, sequence_parallel, distributed_optimizer; dp is what the\n"
    "world leaves), with the one-rank losses. run.device: cuda needs a CUDA build (make CUDA=1;\n"
    "`megatrain --version` says which this is) and precision: bf16, one GPU a rank.\n"
    "\n"
    "A Megatron-LM or torchtitan name written as a key (train_iters, eval_iters,\n"
    "tensor_model_parallel_size, ...) is answered with megatrain's key and what differs in unit;\n"
    "docs/megatron.md maps a Megatron command line flag by flag, and torchtitan's TOML keys.\n"
    "\n"
    "examples:\n"
    "  megatrain run recipes/tiny/llama.yaml --set train.steps=20 --set run.dir=runs/try\n"
    "  megatrain plan my.yaml --world 8          (the layout and memory per rank first)\n"
    "  mpirun -np 8 megatrain run my.yaml --set parallel.tp=2 --set parallel.pp=2\n"
    "  megatrain run my.yaml --set run.device=cuda --set precision=bf16 --set train.recompute=selective\n"
    "  megatrain run my.yaml --set train.eval_batches=all\n"
    "                         (eval_loss over every validation sample once, as Hugging Face's Trainer: the\n"
    "                         batches it resolves to are said at the start; a partial last batch is padded\n"
    "                         with masked samples and weighed by its samples)\n";

static int is_help(const char *arg) { return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0; }

/* Parse "RECIPE [--set k=v | --set=k=v]..." into path and overrides. */
static int parse_recipe_args(int argc, char **argv, const char **path, const char **overrides,
                             int *num_overrides, const char *usage) {
    *path = NULL;
    *num_overrides = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *value = NULL;
        if (is_help(a)) {
            fputs(usage, stdout);
            return 1;
        } else if (strcmp(a, "--set") == 0) {
            if (i + 1 >= argc) mt_die(MT_EXIT_USAGE, "--set needs key.path=value\n%s", usage);
            value = argv[++i];
        } else if (strncmp(a, "--set=", 6) == 0) {
            value = a + 6;
        } else if (a[0] == '-' && a[1] != '\0') {
            cli_unknown_option("run", a, usage);
            exit(MT_EXIT_USAGE);
        } else if (*path) {
            mt_die(MT_EXIT_USAGE, "unexpected argument '%s' (recipe already given as '%s')", a, *path);
        } else {
            *path = a;
        }
        if (value) {
            if (!strchr(value, '=')) mt_die(MT_EXIT_USAGE, "--set %s: expected key.path=value", value);
            if (*num_overrides >= MAX_OVERRIDES) mt_die(MT_EXIT_USAGE, "too many --set options");
            overrides[(*num_overrides)++] = value;
        }
    }
    if (!*path) mt_die(MT_EXIT_USAGE, "missing RECIPE.yaml\n%s", usage);
    return 0;
}

static int cmd_run(int argc, char **argv) {
    const char *path;
    const char *overrides[MAX_OVERRIDES];
    int num_overrides;
    bool resume_if_exists = false; /* taken out of argv: the other arguments are plan's too */
    int kept = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--resume-if-exists") == 0 && (i == 0 || strcmp(argv[i - 1], "--set") != 0))
            resume_if_exists = true;
        else
            argv[kept++] = argv[i];
    }
    argc = kept;
    if (parse_recipe_args(argc, argv, &path, overrides, &num_overrides, run_usage_text)) return MT_EXIT_OK;
    static Recipe recipe;
    char err[2048] = "";
    int world_size = launch_world_size();
    /* Several ranks (mpirun): MPI starts first, so that a recipe every rank refuses is said once (by the first
     * rank that refuses it) and the ranks end together with its status. A single rank never starts MPI. */
    if (world_size > 1) dist_init(NULL, NULL);
    const int loaded = recipe_load(&recipe, path, overrides, num_overrides, world_size, err, sizeof err) != 0
                           ? MT_EXIT_USAGE : MT_EXIT_OK;
    const int status = dist_report_first(loaded, err);
    if (status != MT_EXIT_OK) return dist_finish_together(status);
    if (resume_if_exists) return run_or_resume(&recipe, overrides, num_overrides);
    return dist_finish(train_run(&recipe));
}

static const char *const data_usage_text =
    "usage: megatrain data build --input FILE --output PREFIX [--tokenizer PATH|byte] [--eod-token TEXT]\n"
    "                            [--json-key KEY] [--add-bos] [--format text|jsonl] [--workers N] [--max-line-mib N]\n"
    "                            [--overwrite]\n"
    "                                       text or JSONL -> Megatron .bin/.idx, tokenized on N threads\n"
    "       megatrain data build --format sft [--chat-template auto|llama3|llama3.1|chatml|qwen3] --input CHAT.jsonl --output PREFIX ...\n"
    "                                       SFT records -> .bin/.idx and the loss mask PREFIX_mask.{bin,idx}\n"
    "       megatrain data inspect PREFIX [--tokenizer PATH] [--docs N] [--json]\n"
    "                                       documents, tokens, dtype, lengths, the first documents decoded\n"
    "`megatrain data build --help` and `megatrain data inspect --help` say more.\n";

static int cmd_data(int argc, char **argv) {
    if (argc < 1 || is_help(argv[0])) {
        fputs(data_usage_text, argc < 1 ? stderr : stdout);
        return argc < 1 ? MT_EXIT_USAGE : MT_EXIT_OK;
    }
    if (strcmp(argv[0], "build") == 0) return data_build_main(argc - 1, argv + 1);
    if (strcmp(argv[0], "inspect") == 0) return data_inspect_main(argc - 1, argv + 1);
    mt_die(MT_EXIT_USAGE, "unknown data command '%s' (expected 'build' or 'inspect')\n%s", argv[0], data_usage_text);
}

/* convert, eval, inspect, data and plan run in one process. Launched on several ranks (a job script that puts
 * `mpirun -np N` before every step), the copies would race over the same output files: rank 0 does the work, and
 * the others leave at once with status 0. Whether this process is one of several is the launcher's word
 * (launch_env.h); a plain call in a Slurm batch script is one process, and says nothing of ranks. */
static bool left_to_rank0(const char *cmd) {
    const int world = launch_world_size();
    if (!launch_started_several()) return false;
    if (launch_rank() != 0) return true;
    /* on stderr: stdout may be the command's result (eval --json, data inspect --json) */
    fprintf(stderr, "%s runs in one process; this launch has %d ranks (%s): rank 0 does the work, the others exit "
            "at once\n", cmd, world, launch_world_size_name());
    return false;
}

int main(int argc, char **argv) {
    mt_mark_process_start(); /* train.exit_duration_mins counts from here */
    /* A file-size limit (ulimit -f) makes a write fail with EFBIG, which every writer reports naming its file,
     * rather than kill the process with SIGXFSZ mid-save (a background save's thread blocks it anyway). */
    signal(SIGXFSZ, SIG_IGN);
    if (argc < 2) {
        fputs(usage_text, stderr);
        return MT_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (is_help(cmd) || strcmp(cmd, "help") == 0) {
        fputs(usage_text, stdout);
        return MT_EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
#ifdef MT_CUDA
        printf("megatrain %s (with the CUDA backend: run.device cpu or cuda)\n", MEGATRAIN_VERSION);
#else
        printf("megatrain %s (CPU only: make CUDA=1 builds the CUDA backend)\n", MEGATRAIN_VERSION);
#endif
        return MT_EXIT_OK;
    }
    if (strcmp(cmd, "run") == 0 || strcmp(cmd, "resume") == 0) { /* the commands that take several ranks */
        char note[512];
        const int warning = launch_share_cpus(note, sizeof note);
        if (note[0] && launch_rank() == 0) {
            if (warning) mt_warn("%s", note);
            else mt_log("%s", note);
        }
        return strcmp(cmd, "run") == 0 ? cmd_run(argc - 2, argv + 2) : resume_main(argc - 2, argv + 2);
    }
    static const char *const one_process[] = {"convert", "eval", "inspect", "data", "plan", NULL};
    for (int i = 0; one_process[i]; i++)
        if (strcmp(cmd, one_process[i]) == 0 && left_to_rank0(cmd)) return MT_EXIT_OK;
    if (strcmp(cmd, "convert") == 0) return convert_main(argc - 2, argv + 2);
    if (strcmp(cmd, "eval") == 0) return eval_main(argc - 2, argv + 2);
    if (strcmp(cmd, "inspect") == 0) return inspect_main(argc - 2, argv + 2);
    if (strcmp(cmd, "data") == 0) return cmd_data(argc - 2, argv + 2);
    if (strcmp(cmd, "plan") == 0) return plan_main(argc - 2, argv + 2);
    /* what another trainer's user types: Megatron's pretrain_gpt.py trains, torchtitan's train.py, TRL's finetune */
    static const char *const other_names[][2] = {{"train", "run"},      {"pretrain", "run"},   {"finetune", "run"},
                                                 {"sft", "run"},        {"evaluate", "eval"},  {"export", "convert"},
                                                 {"import", "convert"}, {"estimate", "plan"}};
    for (size_t i = 0; i < sizeof other_names / sizeof other_names[0]; i++)
        if (strcmp(cmd, other_names[i][0]) == 0)
            mt_die(MT_EXIT_USAGE, "unknown command '%s' (did you mean '%s'?)\n%s", cmd, other_names[i][1], usage_text);
    mt_die(MT_EXIT_USAGE, "unknown command '%s'\n%s", cmd, usage_text);
}
