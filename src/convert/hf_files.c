/* hf_files.c: the files `convert` carries between a Hugging Face directory
 * and a checkpoint (hf_files.h), declared once in the table below. */
#include "hf_files.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/error.h"
#include "../core/fs.h"
#include "../ckpt/ckpt_fs.h"
#include "hf_config.h"

/* The files carried are ckpt_hf_carried_names (checkpoint.h); files in subdirectories (Llama 3's original/) are
 * not carried. */

/* The whole file at path (at most CKPT_MAX_HF_FILE_BYTES) into *data. */
static int read_whole(const char *path, unsigned char **data, size_t *len, char *err, size_t errlen) {
    FILE *f = mt_fopen_regular(path, NULL, NULL, err, errlen); /* a directory or a FIFO is refused */
    if (!f) return -1;
    size_t cap = 1 << 16, n = 0, got;
    unsigned char *buf = mt_malloc(cap);
    while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n > CKPT_MAX_HF_FILE_BYTES) break;
        if (n == cap) buf = mt_realloc(buf, cap *= 2);
    }
    const int failed = ferror(f);
    fclose(f);
    if (failed || n > CKPT_MAX_HF_FILE_BYTES) {
        if (failed) mt_set_error(err, errlen, "%s: cannot read: %s", path, strerror(errno));
        else mt_set_error(err, errlen, "%s: larger than %zu bytes, more than a checkpoint carries", path,
                          CKPT_MAX_HF_FILE_BYTES);
        free(buf);
        return -1;
    }
    *data = buf;
    *len = n;
    return 0;
}

int hf_files_collect(const char *dir, CkptHfFiles *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    for (int i = 0; ckpt_hf_carried_names[i]; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, ckpt_hf_carried_names[i]);
        struct stat st;
        if (stat(path, &st) != 0 && errno == ENOENT) {
            /* a dangling link: an interrupted Hub download's snapshot (its blob missing): carried nothing, said */
            char target[4096];
            const ssize_t n = lstat(path, &st) == 0 && S_ISLNK(st.st_mode) ? readlink(path, target, sizeof target - 1)
                                                                           : -1;
            if (n >= 0) {
                target[n] = '\0';
                mt_warn("%s -> %s: a link to nothing (an interrupted download?); not carried", path, target);
            }
            continue; /* not in this directory */
        }
        unsigned char *data = NULL;
        size_t len = 0;
        int rc = read_whole(path, &data, &len, err, errlen);
        if (rc == 0) rc = ckpt_hf_files_add(out, ckpt_hf_carried_names[i], data, len, err, errlen);
        free(data);
        if (rc != 0) {
            ckpt_hf_files_free(out);
            return -1;
        }
    }
    return 0;
}

static int write_one(const char *dir, const char *name, const void *data, size_t len, char *err, size_t errlen) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *out = fopen(path, "wb");
    bool failed = !out;
    if (out) {
        failed = fwrite(data, 1, len, out) != len || fflush(out) != 0 || fsync(fileno(out)) != 0;
        if (fclose(out) != 0) failed = true;
    }
    if (failed) mt_set_error(err, errlen, "%s: cannot write: %s", path, strerror(errno));
    return failed ? -1 : 0;
}

int hf_files_write_each(const char *dir, const CkptHfFiles *files, char *err, size_t errlen) {
    for (int i = 0; i < files->count; i++)
        if (write_one(dir, files->files[i].name, files->files[i].data, files->files[i].size, err, errlen) != 0)
            return -1;
    return 0;
}

int hf_files_write(const char *dir, const CkptHfFiles *files, const ModelConfig *cfg, char *err, size_t errlen) {
    if (hf_files_write_each(dir, files, err, errlen) != 0) return -1;
    if (ckpt_hf_files_find(files, "generation_config.json")) return 0;
    char *text = hf_generation_config_json(cfg);
    int rc = write_one(dir, "generation_config.json", text, strlen(text), err, errlen);
    free(text);
    return rc;
}

CkptHfFiles hf_files_tokenizer(const CkptHfFiles *files) {
    CkptHfFiles view = {0};
    for (int i = 0; i < files->count; i++)
        if (strcmp(files->files[i].name, "generation_config.json") != 0) view.files[view.count++] = files->files[i];
    return view;
}

void hf_files_list(const CkptHfFiles *files, char *out, size_t outlen) {
    size_t used = (size_t)snprintf(out, outlen, "%s", files->count ? "" : "none");
    for (int i = 0; i < files->count && used < outlen; i++)
        used += (size_t)snprintf(out + used, outlen - used, "%s%s", i ? ", " : "", files->files[i].name);
}

int hf_dir_commit(const char *tmp, const char *dst, char *err, size_t errlen) {
    if (mt_sync_dir(tmp, err, errlen) != 0) return -1;
    if (mt_rename_noreplace(tmp, dst) != 0) { /* DST made meanwhile: not replaced */
        mt_set_error(err, errlen, "%s: cannot rename %s to it: %s", dst, tmp, strerror(errno));
        return -1;
    }
    char parent[4096], ignored[256];
    mt_parent_dir(dst, parent, sizeof parent);
    if (mt_sync_dir(parent, err, errlen) == 0) return 0;
    ckpt_remove_tree(dst, ignored, sizeof ignored); /* its name's durability unknown: as a checkpoint, nothing left */
    return -1;
}
