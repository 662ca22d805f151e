/* ckpt_hf_files.c: the files a checkpoint carries for the Hugging Face
 * export (checkpoint.h, CkptHfFiles): adding them, checking their names,
 * and reading them back from a checkpoint, each verified by size and
 * CRC-32C, a damaged one left out with a warning. */
#include "ckpt_hf_files.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/crc32c.h"
#include "../core/error.h"
#include "checkpoint.h"
#include "ckpt_fs.h"
#include "ckpt_reader.h"

const char *const ckpt_hf_carried_names[] = {
    "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json",      "tokenizer.model", "vocab.json",          "merges.txt",
    "chat_template.jinja",    NULL,
};

bool ckpt_hf_file_name_ok(const char *name) {
    for (int i = 0; ckpt_hf_carried_names[i]; i++)
        if (!strcmp(name, ckpt_hf_carried_names[i])) return true;
    return false;
}

const CkptHfFile *ckpt_hf_files_find(const CkptHfFiles *files, const char *name) {
    for (int i = 0; files && i < files->count; i++)
        if (!strcmp(files->files[i].name, name)) return &files->files[i];
    return NULL;
}

int ckpt_hf_files_add(CkptHfFiles *files, const char *name, const void *data, size_t size, char *err, size_t errlen) {
    if (!ckpt_hf_file_name_ok(name)) {
        mt_set_error(err, errlen, "'%s' is not a file a checkpoint carries (the tokenizer's files and "
                     "generation_config.json: docs/convert.md)", name);
        return -1;
    }
    if (size > CKPT_MAX_HF_FILE_BYTES) {
        mt_set_error(err, errlen, "%s: %zu bytes, more than a checkpoint carries (%zu)", name, size,
                     CKPT_MAX_HF_FILE_BYTES);
        return -1;
    }
    CkptHfFile *slot = (CkptHfFile *)ckpt_hf_files_find(files, name);
    if (!slot) {
        if (files->count >= CKPT_MAX_HF_FILES) {
            mt_set_error(err, errlen, "%s: a checkpoint carries at most %d such files", name, CKPT_MAX_HF_FILES);
            return -1;
        }
        slot = &files->files[files->count++];
        snprintf(slot->name, sizeof slot->name, "%s", name);
    } else {
        free(slot->data);
    }
    slot->data = mt_malloc(size ? size : 1);
    if (size) memcpy(slot->data, data, size);
    slot->size = size;
    return 0;
}

void ckpt_hf_files_free(CkptHfFiles *files) {
    for (int i = 0; i < files->count; i++) free(files->files[i].data);
    memset(files, 0, sizeof *files);
}

int ckpt_hf_files_read(const char *dir, CkptHfFiles *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    CkptReader *r = ckpt_reader_open_metadata(dir, err, errlen);
    if (!r) return -1;
    for (int i = 0; i < r->meta.num_files; i++) {
        const CkptFileMeta *f = &r->meta.files[i];
        if (f->role != CKPT_FILE_HF) continue;
        char path[MT_PATH_MAX + CKPT_NAME_MAX + 2], why[1024];
        ckpt_file_path(path, sizeof path, dir, f->name);
        unsigned char *data = NULL;
        size_t len = 0;
        if (ckpt_read_file(path, CKPT_MAX_HF_FILE_BYTES, &data, &len, why, sizeof why) != 0) {
            mt_warn("%s; it is left out", why);
            continue;
        }
        const uint32_t crc = crc32c(0, data, len);
        if (len != f->size)
            mt_warn("%s: %zu bytes, the metadata says %llu (truncated or replaced); it is left out", path, len,
                    (unsigned long long)f->size);
        else if (crc != f->crc32c)
            mt_warn("%s: checksum mismatch (stored %08x, computed %08x): the file is corrupt; it is left out", path,
                    f->crc32c, crc);
        else if (ckpt_hf_files_add(out, f->name, data, len, why, sizeof why) != 0)
            mt_warn("%s: %s; it is left out", path, why);
        free(data);
    }
    ckpt_reader_close(r);
    return 0;
}
