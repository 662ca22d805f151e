/* recipe_load.c: recipe_load and model_config_load: parse the YAML tree,
 * replace a `model: PATH` by that file's tree, apply --set overrides, read
 * the keys into the struct, fill derived defaults and validate. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "recipe_schema.h"
#include "../core/error.h"
#include "../core/json.h"

/* Find model file `name`: as given (relative to the current directory),
 * else in the recipe's directory and each of its parents. */
static int find_model_file(const char *name, const char *recipe_path, char *out, size_t outlen) {
    if (name[0] == '/' || access(name, R_OK) == 0) {
        snprintf(out, outlen, "%s", name);
        return access(name, R_OK) == 0 ? 0 : -1;
    }
    char dir[PATH_MAX], cwd[PATH_MAX], candidate[2 * PATH_MAX];
    char recipe_dir[PATH_MAX];
    snprintf(recipe_dir, sizeof recipe_dir, "%s", recipe_path);
    char *slash = strrchr(recipe_dir, '/');
    if (slash) *slash = '\0';
    else snprintf(recipe_dir, sizeof recipe_dir, ".");
    if (!realpath(recipe_dir, dir)) return -1;
    if (!getcwd(cwd, sizeof cwd)) cwd[0] = '\0';
    size_t cwd_len = strlen(cwd);
    for (;;) {
        snprintf(candidate, sizeof candidate, "%s/%s", strcmp(dir, "/") == 0 ? "" : dir, name);
        if (access(candidate, R_OK) == 0) {
            /* shown relative to the current directory when it lies below it */
            bool below = cwd_len > 1 && strncmp(candidate, cwd, cwd_len) == 0 && candidate[cwd_len] == '/';
            const char *shown = below ? candidate + cwd_len + 1 : candidate;
            if (strlen(shown) >= outlen) return -1;
            memcpy(out, shown, strlen(shown) + 1);
            return 0;
        }
        char *last = strrchr(dir, '/');
        if (!last || strcmp(dir, "/") == 0) return -1;
        if (last == dir) last[1] = '\0';
        else *last = '\0';
    }
}

/* When `model:` is a string, replace it by the tree of that file. */
static int graft_model_file(YNode *root, Recipe *recipe, char *err, size_t errlen) {
    const char *recipe_path = recipe->source_path;
    YEntry *entry = ytree_entry(root, "model");
    if (!entry || entry->value->kind != YNODE_SCALAR || ytree_is_null(entry->value)) return 0;
    char found[MT_PATH_MAX];
    if (find_model_file(entry->value->text, recipe_path, found, sizeof found) != 0) {
        /* a checkpoint's model.yaml (the fine-tuning recipe's ckpt/base/model.yaml): `convert` writes it */
        const char *name = entry->value->text;
        const size_t n = strlen(name), k = strlen("/model.yaml");
        const bool ckpt = n > k && strcmp(name + n - k, "/model.yaml") == 0;
        return key_error(err, errlen, entry->loc, "model",
                         "expected a mapping or the path of a model file, found '%s', which is neither in the current "
                         "directory nor beside the recipe or in a directory above it%s%.*s%s",
                         name, ckpt ? " (a checkpoint's model config: `megatrain convert HF_MODEL_DIR " : "",
                         ckpt ? (int)(n - k) : 0, name, ckpt ? "` run here writes it)" : "");
    }
    struct stat st;
    if (stat(found, &st) == 0 && S_ISDIR(st.st_mode)) { /* a checkpoint or a Hugging Face model, most likely */
        char inside[MT_PATH_MAX + 32];
        snprintf(inside, sizeof inside, "%s/model.yaml", found);
        if (access(inside, R_OK) == 0)
            return key_error(err, errlen, entry->loc, "model", "'%s' is a directory; a checkpoint's model config is "
                             "the file %s", found, inside);
        snprintf(inside, sizeof inside, "%s/config.json", found);
        if (access(inside, R_OK) == 0)
            return key_error(err, errlen, entry->loc, "model", "'%s' is a Hugging Face model directory; convert it "
                             "first (megatrain convert %s DST), then give model: DST/model.yaml and init_from: DST",
                             found, found);
    }
    const char *base = strrchr(found, '/') ? strrchr(found, '/') + 1 : found;
    if (strcmp(base, "config.json") == 0) { /* a Hugging Face model's: its keys are not a model file's */
        char dir[MT_PATH_MAX];
        snprintf(dir, sizeof dir, "%.*s", base > found ? (int)(base - found - 1) : 1, base > found ? found : ".");
        return key_error(err, errlen, entry->loc, "model", "'%s' is a Hugging Face config.json; convert its model "
                         "first (megatrain convert %s DST), then give model: DST/model.yaml and init_from: DST",
                         found, dir);
    }
    YNode *model = ytree_load_file(found, err, errlen);
    if (!model) return -1;
    if (model->kind != YNODE_MAPPING) {
        char what[128];
        YLoc loc = {found, model->loc.line ? model->loc.line : 1};
        key_error(err, errlen, loc, "model", "expected a mapping of model keys in %s, found %s", found,
                  ytree_describe(model, what, sizeof what));
        ytree_free(model);
        return -1;
    }
    ytree_free(entry->value);
    entry->value = model;
    /* A checkpoint's model.yaml carries its run's peft: section (a LoRA checkpoint's adapters are parameters): it is
     * the recipe's peft: unless the recipe has its own, so that `model: CKPT/model.yaml` with `init_from: CKPT`
     * continues the adapters (init_from refuses a LoRA checkpoint without them) */
    for (int i = 0; i < model->count; i++) {
        if (strcmp(model->entries[i].key, "peft") != 0) continue;
        YEntry moved = model->entries[i];
        memmove(&model->entries[i], &model->entries[i + 1], (size_t)(model->count - i - 1) * sizeof *model->entries);
        model->count--;
        if (!ytree_entry(root, "peft") && ytree_set_path(root, "peft", moved.value, moved.loc, err, errlen) == 0) {
            moved.value = NULL; /* the root's now */
            snprintf(recipe->peft_source, sizeof recipe->peft_source, "%s", found);
        }
        ytree_free(moved.value);
        free(moved.key);
        free(moved.loc.file);
        break;
    }
    return 0;
}

static int apply_override(YNode *root, const char *text, char *err, size_t errlen) {
    const char *equals = strchr(text, '=');
    if (!equals || equals == text) {
        mt_set_error(err, errlen, "--set %s: expected key.path=value (for example --set train.steps=20)", text);
        return -1;
    }
    char origin[MT_PATH_MAX + 8], key[MT_KEY_PATH_MAX];
    snprintf(origin, sizeof origin, "--set %s", text);
    size_t key_len = (size_t)(equals - text);
    if (key_len >= sizeof key) {
        mt_set_error(err, errlen, "%s: key path too long", origin);
        return -1;
    }
    memcpy(key, text, key_len);
    key[key_len] = '\0';
    YNode *value = ytree_load_string(equals + 1, origin, err, errlen);
    if (!value) return -1;
    /* nothing but blanks or a comment (an empty shell variable, most likely): YAML reads it as null, the default,
     * which only an explicit null asks for */
    if (value->kind == YNODE_SCALAR && !value->quoted && value->text[0] == '\0') {
        ytree_free(value);
        mt_set_error(err, errlen, "%s: no value after '=' (write %s=null for the key's default)", origin, key);
        return -1;
    }
    YLoc loc = {origin, 0};
    return ytree_set_path(root, key, value, loc, err, errlen);
}

static int load_tree(Recipe *recipe, YNode *root, const char *const *overrides, int num_overrides, char *err,
                     size_t errlen) {
    YLoc top = {recipe->source_path, 1};
    char what[128];
    if (root->kind != YNODE_MAPPING)
        return key_error(err, errlen, root->loc.line ? root->loc : top, "(top level)",
                         "expected a mapping of recipe keys (run, model, train, ...), found %s",
                         ytree_describe(root, what, sizeof what));
    /* a --set model=... before any --set model.KEY=... replaces the section: the recipe's own model file need not
     * exist (after one, the order is refused below, naming both) */
    bool model_replaced = false;
    for (int i = 0; i < num_overrides && strncmp(overrides[i], "model.", 6); i++)
        if (!strncmp(overrides[i], "model=", 6)) model_replaced = true;
    if (!model_replaced && graft_model_file(root, recipe, err, errlen) != 0) return -1;
    const char *model_key_set = NULL; /* an earlier --set model.KEY=..., which a --set model=... would replace */
    for (int i = 0; i < num_overrides; i++) {
        if (!strncmp(overrides[i], "model=", 6) && model_key_set) {
            mt_set_error(err, errlen, "--set %s replaces the whole model section, so the earlier --set %s would be "
                         "lost: give --set %s first", overrides[i], model_key_set, overrides[i]);
            return -1;
        }
        if (!strncmp(overrides[i], "model.", 6)) model_key_set = overrides[i];
        if (apply_override(root, overrides[i], err, errlen) != 0) return -1;
        /* --set model=PATH: the file's keys, which later --set model.KEY=... change (only then: before it, with any
         * other --set in between, the recipe's own model file is not read) */
        if (!strncmp(overrides[i], "model=", 6) && graft_model_file(root, recipe, err, errlen) != 0) return -1;
    }
    const YEntry *init_from = ytree_entry(root, "init_from");
    if (!ytree_entry(root, "model") && init_from && init_from->value->kind == YNODE_SCALAR &&
        !ytree_is_null(init_from->value)) /* the model is the checkpoint's: say where its config is */
        return key_error(err, errlen, top, "model", "missing required key (the model of init_from %s is in %s/model.yaml:"
                         " give model: %s/model.yaml)", init_from->value->text, init_from->value->text,
                         init_from->value->text);
    return read_section(recipe, recipe_root_keys, root, top, "", err, errlen);
}

/* A relative data path (or data.cache_dir) is taken from the current directory, and made absolute here so that
 * run.dir/recipe.yaml and the checkpoints name the files the run read: a resume from another directory reads the
 * same ones. run.dir stays as given (a resume names its own); model files are read above and not kept. */
static int absolute_path(char *path, size_t size, const char *key, char *err, size_t errlen) {
    if (path[0] == '/' || path[0] == '\0') return 0;
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) {
        mt_set_error(err, errlen, "%s: %s is relative, and the current directory cannot be read to resolve it", key,
                     path);
        return -1;
    }
    if (!utf8_valid(cwd, strlen(cwd))) { /* recipe.yaml could not hold it: no checkpoint of the run would resume */
        mt_set_error(err, errlen, "%s: %s is relative, and the current directory's path is not UTF-8, which "
                     "recipe.yaml (YAML text) cannot hold: give an absolute path, or start from another directory",
                     key, path);
        return -1;
    }
    const char *rest = path;
    while (rest[0] == '.' && rest[1] == '/') /* ./data/x: /cwd/data/x */
        for (rest += 2; *rest == '/'; rest++) {}
    if (strcmp(rest, ".") == 0) rest = "";
    char joined[2 * PATH_MAX];
    const int n = snprintf(joined, sizeof joined, "%s%s%s", cwd, strcmp(cwd, "/") && rest[0] ? "/" : "", rest);
    if (n < 0 || (size_t)n >= size) {
        mt_set_error(err, errlen, "%s: %s/%s: expected a path of at most %zu characters", key, cwd, rest, size - 1);
        return -1;
    }
    memcpy(path, joined, (size_t)n + 1);
    return 0;
}

static int absolute_data_paths(Recipe *recipe, char *err, size_t errlen) {
    DataConfig *data = &recipe->data;
    char key[64];
    for (int i = 0; i < data->num_train; i++) {
        snprintf(key, sizeof key, "data.train[%d].path", i);
        if (absolute_path(data->train[i].path, sizeof data->train[i].path, key, err, errlen) != 0) return -1;
    }
    for (int i = 0; i < data->num_valid; i++) {
        snprintf(key, sizeof key, "data.valid[%d].path", i);
        if (absolute_path(data->valid[i].path, sizeof data->valid[i].path, key, err, errlen) != 0) return -1;
    }
    for (int i = 0; i < data->num_test; i++) {
        snprintf(key, sizeof key, "data.test[%d].path", i);
        if (absolute_path(data->test[i].path, sizeof data->test[i].path, key, err, errlen) != 0) return -1;
    }
    if (recipe_cache_dir_is_default(recipe)) return 0; /* run.dir/data-cache: follows run.dir */
    return absolute_path(data->cache_dir, sizeof data->cache_dir, "data.cache_dir", err, errlen);
}

int recipe_load(Recipe *recipe, const char *path, const char *const *overrides, int num_overrides, int world_size,
                char *err, size_t errlen) {
    return recipe_load_resumed(recipe, path, overrides, num_overrides, world_size, 0, 0.0, 0, err, errlen);
}

int recipe_load_resumed(Recipe *recipe, const char *path, const char *const *overrides, int num_overrides,
                        int world_size, long step, double tokens, int64_t samples, char *err, size_t errlen) {
    recipe_set_defaults(recipe);
    recipe->train.resumed_step = step;
    recipe->train.resumed_tokens = tokens;
    recipe->train.resumed_samples = samples;
    if (strlen(path) >= sizeof recipe->source_path) {
        mt_set_error(err, errlen, "%s: recipe path too long", path);
        return -1;
    }
    snprintf(recipe->source_path, sizeof recipe->source_path, "%s", path);
    YNode *root = ytree_load_file(path, err, errlen);
    if (!root) return -1;
    int rc = load_tree(recipe, root, overrides, num_overrides, err, errlen);
    if (rc == 0) rc = train_resolve_rampup(&recipe->train, ytree_get(root, "train"), err, errlen);
    if (rc == 0) {
        recipe_fill_derived(recipe, root);
        rc = recipe_validate(recipe, root, world_size, err, errlen);
    }
    if (rc == 0) rc = absolute_data_paths(recipe, err, errlen);
    ytree_free(root);
    return rc;
}

/* The model keys (and a checkpoint's peft: section) of a parsed model file `origin` into *model; frees root. */
static int read_model_file(ModelConfig *model, YNode *root, const char *origin, char *err, size_t errlen) {
    YLoc top = {(char *)origin, 1};
    /* A checkpoint's model.yaml also carries the run's peft: section (its
     * adapters are parameters): the model keys are read from a view of the
     * mapping without it, then the section with the recipe's table. */
    const YEntry *peft = ytree_entry(root, "peft");
    YNode model_keys = *root;
    if (peft) {
        model_keys.entries = mt_malloc((size_t)root->count * sizeof *model_keys.entries);
        model_keys.count = 0;
        for (int i = 0; i < root->count; i++)
            if (&root->entries[i] != peft) model_keys.entries[model_keys.count++] = root->entries[i];
    }
    int rc = read_section(model, recipe_model_keys, &model_keys, top, "", err, errlen);
    if (rc == 0) {
        model_fill_derived(model, &model_keys);
        rc = model_validate(model, &model_keys, top, "", err, errlen);
    }
    if (peft) free(model_keys.entries);
    if (rc == 0 && peft) rc = read_peft_section(&model->peft, peft, err, errlen);
    if (rc == 0 && peft) peft_fill_derived(model, peft->value);
    if (rc == 0 && peft) rc = peft_validate(model, peft->value, peft->loc, err, errlen);
    ytree_free(root);
    return rc;
}

int model_config_load(ModelConfig *model, const char *path, char *err, size_t errlen) {
    model_set_defaults(model);
    YNode *root = ytree_load_file(path, err, errlen);
    return root ? read_model_file(model, root, path, err, errlen) : -1;
}

int model_config_load_text(ModelConfig *model, const char *text, const char *origin, char *err, size_t errlen) {
    model_set_defaults(model);
    YNode *root = ytree_load_string(text, origin, err, errlen);
    return root ? read_model_file(model, root, origin, err, errlen) : -1;
}
