/* convert.c: the `megatrain convert` command line: options, which direction
 * SRC implies, and the checks made before either direction starts. */
#include "convert.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../ckpt/ckpt_fs.h"
#include "../ckpt/ckpt_locate.h"
#include "../core/cli.h"
#include "../core/error.h"
#include "../core/fs.h"
#include "../core/json.h"
#include "ckpt_latest_dir.h"
#include "hf_families.h"
#include "peft_config.h"

/* The usage; the families come from the one table (hf_families.c). */
static void print_usage(FILE *out) {
    char families[256];
    hf_family_list(families, sizeof families);
    fprintf(out,
            "usage: megatrain convert SRC DST [--dtype fp32|bf16|fp16] [--max-shard-size SIZE]\n"
            "                                 [--merge-lora | --base-model NAME_OR_PATH] [--drop-expert-bias]\n"
            "\n"
            "Convert between a Hugging Face model directory and a megatrain checkpoint.\n"
            "Families (config.json model_type): %s.\n"
            "\n"
            "  SRC with config.json (Hugging Face: config.json + model.safetensors, or\n"
            "  shards with model.safetensors.index.json)\n"
            "      -> DST is written as a megatrain checkpoint (model config + fp32 weights,\n"
            "         and the tokenizer files and generation_config.json as they are),\n"
            "         for `init_from: DST` in a recipe or `megatrain eval DST`.\n"
            "  SRC a PEFT adapter directory (adapter_config.json + adapter_model.safetensors)\n"
            "  with --base-model DIR, the model it was trained on: its Hugging Face directory\n"
            "  (default: its base_model_name_or_path, when that is a directory here), or a\n"
            "  megatrain checkpoint of it\n"
            "      -> DST is written as a megatrain LoRA checkpoint (the base and the\n"
            "         adapters, fp32; onto a checkpoint, the adapters alone, referencing\n"
            "         it) for `megatrain eval DST`, `init_from: DST` (model: DST/model.yaml\n"
            "         brings its peft: section), or convert back.\n"
            "  SRC a megatrain checkpoint (an iter_NNNNNNN directory, or a run or\n"
            "  checkpoints/ directory: its latest checkpoint)\n"
            "      -> DST is written as a Hugging Face directory that transformers'\n"
            "         from_pretrained loads: config.json, safetensors, generation_config.json\n"
            "         and the tokenizer files the checkpoint carries.\n"
            "         A LoRA run's checkpoint (peft: in its recipe) -> DST is PEFT's adapter\n"
            "         directory (adapter_config.json + adapter_model.safetensors) that\n"
            "         peft.PeftModel.from_pretrained(base_model, DST) loads; with\n"
            "         --merge-lora, the merged model (as PEFT's merge_and_unload) instead.\n"
            "\n"
            "options (megatrain -> Hugging Face only, but --base-model):\n"
            "  --dtype fp32|bf16|fp16    dtype of the safetensors (default: the model's export_dtype,\n"
            "                            the Hugging Face source's dtype; fp32 for a model made here;\n"
            "                            LoRA adapters fp32)\n"
            "  --max-shard-size SIZE     shard above this size, e.g. 5GB (default), 500MB, 2GiB\n"
            "  --merge-lora              a LoRA checkpoint: W + (alpha/rank) B A written as a\n"
            "                            plain Hugging Face model\n"
            "  --base-model NAME_OR_PATH a LoRA checkpoint's adapters: the base model PEFT's\n"
            "                            AutoPeftModelForCausalLM loads (the Hugging Face model\n"
            "                            the run started from: a Hub name or a directory), written\n"
            "                            as base_model_name_or_path (default null); a PEFT\n"
            "                            adapter directory: its base model, read (a Hugging\n"
            "                            Face directory) or referenced (a megatrain checkpoint)\n"
            "  --drop-expert-bias        a MoE model trained with model.moe.load_balancing:\n"
            "                            expert_bias (which transformers' Qwen3-MoE and Mixtral\n"
            "                            lack): export it without the routers' biases. Its\n"
            "                            routing then differs from the trained model's: a\n"
            "                            warning says by how much (the top-k choices that change\n"
            "                            on the token embeddings as the routers' input)\n"
            "\n"
            "DST must not exist. It appears only when complete; on any error (a missing\n"
            "file or tensor, a tensor of the wrong shape, an unexpected tensor, an\n"
            "unsupported family) nothing is written.\n",
            families);
}

static int usage_error(const char *fmt, const char *arg) {
    char message[512];
    snprintf(message, sizeof message, fmt, arg);
    mt_error("convert: %s (see megatrain convert --help)", message);
    return MT_EXIT_USAGE;
}

static int parse_dtype(const char *text, StDtype *out) {
    if (!strcmp(text, "fp32") || !strcmp(text, "float32") || !strcmp(text, "F32")) *out = ST_F32;
    else if (!strcmp(text, "bf16") || !strcmp(text, "bfloat16") || !strcmp(text, "BF16")) *out = ST_BF16;
    else if (!strcmp(text, "fp16") || !strcmp(text, "float16") || !strcmp(text, "F16")) *out = ST_F16;
    else return -1;
    return 0;
}

/* "--name value" or "--name=value": the value, advancing *i; NULL when absent. */
static const char *option_value(int argc, char **argv, int *i, const char *name) {
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n) != 0) return NULL;
    if (argv[*i][n] == '=') return argv[*i] + n + 1;
    if (argv[*i][n] != '\0') return NULL;
    if (*i + 1 >= argc) return "";
    return argv[++*i];
}


static int remove_temp_tree(const char *path) {
    char ignored[256];
    return ckpt_remove_tree(path, ignored, sizeof ignored);
}

/* What a convert into DST that was killed (SIGKILL, or Ctrl-C and SIGTERM, which end it at once) left: its
 * temporary directory DST.tmp.HOST.PID, as large as the model, removed once its process is gone (this host's only:
 * another machine's convert into DST on a shared file system may be running). */
static void remove_killed_temps(const char *dst) {
    char first[4200];
    const int removed = mt_remove_stale_temps_with(dst, remove_temp_tree, first, sizeof first);
    if (removed > 0)
        mt_log("convert: removed %d temporary director%s of an earlier convert into %s that was killed (%s)", removed,
               removed == 1 ? "y" : "ies", dst, first);
}
int convert_main(int argc, char **argv) {
    ConvertOptions options = {.dtype = ST_F32, .max_shard_bytes = 5000000000ull, .progress = true};
    const char *paths[2] = {NULL, NULL};
    int num_paths = 0;
    bool shard_given = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *value;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            print_usage(stdout);
            return MT_EXIT_OK;
        } else if ((value = option_value(argc, argv, &i, "--dtype"))) {
            if (parse_dtype(value, &options.dtype) != 0)
                return usage_error("--dtype: expected fp32, bf16 or fp16, found '%s'", value);
            options.dtype_given = true;
        } else if ((value = option_value(argc, argv, &i, "--max-shard-size"))) {
            if (st_parse_size(value, &options.max_shard_bytes) != 0)
                return usage_error("--max-shard-size: expected a size like 5GB, 500MB or 2GiB, found '%s'", value);
            shard_given = true;
        } else if (!strcmp(a, "--merge-lora")) {
            options.merge_lora = true;
        } else if (!strcmp(a, "--drop-expert-bias")) {
            options.drop_expert_bias = true;
        } else if ((value = option_value(argc, argv, &i, "--base-model"))) {
            if (!value[0]) return usage_error("%s", "--base-model: expected a Hugging Face model name or directory");
            options.base_model = value;
        } else if (a[0] == '-' && a[1] != '\0') {
            char *text = NULL;
            size_t len = 0;
            FILE *f = open_memstream(&text, &len);
            if (f) {
                print_usage(f);
                fclose(f);
            }
            cli_unknown_option("convert", a, text ? text : "");
            free(text);
            return MT_EXIT_USAGE;
        } else if (num_paths < 2) {
            paths[num_paths++] = a;
        } else {
            return usage_error("unexpected argument '%s' (SRC and DST already given)", a);
        }
    }
    if (num_paths < 2) {
        print_usage(stderr);
        return usage_error("%s", num_paths == 0 ? "missing SRC and DST" : "missing DST");
    }
    /* a directory is written absolute, as PEFT would take a relative one from wherever the adapter is loaded */
    char base_dir[PATH_MAX];
    struct stat st_base;
    if (options.base_model && stat(options.base_model, &st_base) == 0 && S_ISDIR(st_base.st_mode) &&
        realpath(options.base_model, base_dir))
        options.base_model = base_dir;
    if (options.base_model && !utf8_valid(options.base_model, strlen(options.base_model)))
        return usage_error("--base-model %s: the path is not UTF-8, which adapter_config.json (JSON text) cannot hold",
                           options.base_model); /* a directory made absolute: the current directory's too */
    if (options.merge_lora && options.base_model)
        return usage_error("%s", "--base-model names the base of PEFT's adapter directory; --merge-lora writes a whole "
                                 "model, which has none");
    const char *src = paths[0];
    if (!src[0] || !paths[1][0]) return usage_error("%s", !src[0] ? "SRC is empty" : "DST is empty");
    /* DST as a directory name: "out/" and "out/." are "out" (they made out and then found it there); at most 3071
     * characters, so that DST.tmp.PID fits the converters' 4096 (a longer one failed without a message) */
    char dst[3072];
    if (strlen(paths[1]) >= sizeof dst) return usage_error("%s", "DST: expected a path of at most 3071 characters");
    snprintf(dst, sizeof dst, "%s", paths[1]);
    for (size_t n = strlen(dst); n > 1;) {
        if (dst[n - 1] == '/') dst[--n] = '\0';
        else if (n > 2 && dst[n - 1] == '.' && dst[n - 2] == '/') dst[n -= 2] = '\0';
        else break;
    }
    struct stat st;
    if (stat(src, &st) != 0) {
        const int e = errno;
        mt_error("convert: %s: %s", src, strerror(e));
        return mt_path_stat_status(e); /* a SRC that is not there: usage, as every command's missing path (and a file,
                                        * below); one that cannot be read (no permission): a failure */
    }
    if (!S_ISDIR(st.st_mode)) { /* e.g. the config.json or a .safetensors of a Hugging Face directory */
        char parent[4096];
        snprintf(parent, sizeof parent, "%s", src);
        char *slash = strrchr(parent, '/');
        if (slash) *slash = '\0';
        mt_error("convert: %s is a file; SRC is a directory: a Hugging Face model's (the one holding config.json "
                 "and the .safetensors: %s?), a PEFT adapter's, or a megatrain run, checkpoints/ or checkpoint "
                 "directory", src, slash ? parent : ".");
        return MT_EXIT_USAGE;
    }
    if (lstat(dst, &st) == 0) {
        mt_error("convert: %s already exists; convert never overwrites (remove it or choose another DST)", dst);
        return MT_EXIT_USAGE; /* as data build's existing PREFIX: the command line names an output that is there */
    }
    char err[2048] = "";
    if (options.base_model && convert_base_model_missing(options.base_model, err, sizeof err)) {
        mt_error("convert: %s", err);
        return MT_EXIT_USAGE; /* a path of the command line that is not there (both directions) */
    }
    remove_killed_temps(dst);
    char config[4096];
    snprintf(config, sizeof config, "%s/config.json", src);
    const bool has_config = stat(config, &st) == 0;
    /* PEFT's adapter directory: adapter_config.json, and no model weights (some tools copy the base's config.json
     * there too) */
    char weights[4096 + 64];
    snprintf(weights, sizeof weights, "%s/model.safetensors", src);
    bool has_weights = stat(weights, &st) == 0;
    snprintf(weights, sizeof weights, "%s/model.safetensors.index.json", src);
    has_weights = has_weights || stat(weights, &st) == 0;
    snprintf(config, sizeof config, "%s/adapter_config.json", src);
    const bool from_peft = stat(config, &st) == 0 && !has_weights;
    const bool from_hf = has_config && !from_peft;
    /* a checkpoint's files and its temporary name live in MT_PATH_MAX buffers (a longer DST failed after making its
     * parent directories) */
    _Static_assert(MT_PATH_MAX - 64 == 960, "the message below says 960");
    if ((from_hf || from_peft) && strlen(dst) > MT_PATH_MAX - 64)
        return usage_error("%s", "DST: a checkpoint's path is at most 960 characters");
    int status;
    if (from_hf) {
        if (options.dtype_given || shard_given || options.merge_lora || options.base_model ||
            options.drop_expert_bias)
            return usage_error("%s", "--dtype, --max-shard-size, --merge-lora, --base-model and --drop-expert-bias "
                                     "apply to megatrain -> Hugging Face only (checkpoints hold fp32)");
        status = convert_hf_to_ckpt(src, dst, &options, err, sizeof err);
    } else if (from_peft) {
        if (options.dtype_given || shard_given || options.merge_lora || options.drop_expert_bias)
            return usage_error("%s", "--dtype, --max-shard-size, --merge-lora and --drop-expert-bias apply to "
                                     "megatrain -> Hugging Face only (checkpoints hold fp32)");
        char named[1024] = "", why[1024];
        const char *base = options.base_model;
        if (!base) { /* the base PEFT's AutoPeftModelForCausalLM would load, when it is a directory here */
            PeftConfig ignored;
            if (peft_config_read(config, 0, &ignored, named, sizeof named, NULL, 0, why, sizeof why) != 0) {
                mt_error("convert: %s", why);
                return MT_EXIT_FAILURE;
            }
            char base_config[1100], base_ckpt[1100], why_not[512];
            snprintf(base_config, sizeof base_config, "%s/config.json", named);
            /* a Hugging Face directory, or a megatrain checkpoint of the base (as --base-model takes them) */
            const bool usable = named[0] && (stat(base_config, &st) == 0 ||
                                             ckpt_latest_dir(named, base_ckpt, sizeof base_ckpt, why_not,
                                                             sizeof why_not) == 0);
            if (!usable) {
                mt_error("convert: %s is a PEFT adapter directory: name the Hugging Face directory of the model it "
                         "was trained on with --base-model DIR (its adapter_config.json's base_model_name_or_path %s%s%s)",
                         src, named[0] ? "'" : "is null", named, named[0] ? "' is not a model directory here" : "");
                return MT_EXIT_USAGE;
            }
            base = named;
        }
        status = convert_peft_to_ckpt(src, base, dst, &options, err, sizeof err);
    } else {
        status = convert_ckpt_to_hf(src, dst, &options, err, sizeof err);
    }
    if (status != 0) {
        CkptLocation loc; /* the hint only where SRC is no checkpoint at all */
        char ignored[512];
        if (from_hf || from_peft || ckpt_locate(src, &loc, ignored, sizeof ignored) == 0) mt_error("convert: %s", err);
        else mt_error("convert: %s (%s has no config.json, so it was read as a megatrain checkpoint)", err, src);
        return MT_EXIT_FAILURE;
    }
    return MT_EXIT_OK;
}
