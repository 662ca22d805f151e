/* inspect.c: `megatrain inspect CKPT`: what a checkpoint holds (progress,
 * model, files, and every tensor with its shape, dtype, chunks, bytes stored
 * and raw), verifying every file and every chunk checksum. CKPT is a
 * checkpoint directory, or a run (or checkpoints) directory, whose newest
 * checkpoint is inspected. A LoRA checkpoint says whether it stores its
 * frozen base or references it (where; checked against the recorded CRC).
 * Exit 0 when all is intact, 1 on any corruption (each problem named: the
 * file, the tensor, the chunk) or a referenced base that is missing or
 * changed, 2 on usage errors. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "../core/cli.h"
#include "../core/error.h"
#include "ckpt_base.h"
#include "ckpt_commands.h"
#include "ckpt_locate.h"
#include "ckpt_reader.h"
#include "ckpt_run.h"

static const char *const inspect_usage =
    "usage: megatrain inspect CKPT\n"
    "\n"
    "List the tensors of checkpoint CKPT (name, shape, dtype, chunks, bytes stored\n"
    "and raw) and verify every checksum; exit 1 when anything is corrupt.\n"
    "CKPT is a checkpoint directory (run.dir/checkpoints/iter_NNNNNNN) or a run\n"
    "directory, whose newest checkpoint is inspected.\n";

/* 1234567 -> "1.23 MB" */
static void format_bytes(char *out, size_t len, double bytes) {
    static const char *const units[] = {"B", "KB", "MB", "GB", "TB"};
    int u = 0;
    while (bytes >= 1000.0 && u < 4) bytes /= 1000.0, u++;
    if (u == 0) snprintf(out, len, "%.0f B", bytes);
    else snprintf(out, len, "%.2f %s", bytes, units[u]);
}

static void format_shape(char *out, size_t len, const CkptTensorMeta *t) {
    size_t n = (size_t)snprintf(out, len, "[");
    for (int d = 0; d < t->ndim && n < len; d++)
        n += (size_t)snprintf(out + n, len - n, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (n < len) snprintf(out + n, len - n, "]");
}

static void print_header(const CkptReader *r) {
    const CkptMeta *m = &r->meta;
    char when[64] = "?";
    time_t created = (time_t)m->created_unix;
    struct tm tm;
    if (gmtime_r(&created, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
    printf("checkpoint %s\n", r->dir);
    printf("  format %u, written by %s on %s, %u writing rank%s\n", m->version, m->writer, when, m->num_ranks,
           m->num_ranks == 1 ? "" : "s");
    if (m->has_state) {
        const CkptState *s = &m->state;
        printf("  step %lld of %lld: %lld samples and %lld tokens consumed; optimizer step %lld; next step: global "
               "batch %lld, lr %.6g\n",
               (long long)s->step, (long long)s->total_steps, (long long)s->consumed_samples,
               (long long)s->consumed_tokens, (long long)s->optimizer_step, (long long)s->next_global_batch_size,
               s->next_lr);
        const char *slash = strrchr(r->dir, '/');
        const long named = ckpt_parse_iter_name(slash ? slash + 1 : r->dir);
        if (named >= 0 && named != (long)s->step)
            mt_warn("%s: its name says step %ld, its metadata step %lld (renamed or copied?): a resume of its run "
                    "stops at it (exit 1) until it is renamed back to iter_%07lld or removed", r->dir, named,
                    (long long)s->step, (long long)s->step);
    } else {
        printf("  no training state (weights only)\n");
    }
}

/* A LoRA checkpoint's frozen base (its adapters give it away): stored in it, or referenced (record BASE) and
 * checked there. Returns 1 when a referenced base cannot be used (reported), else 0. */
static int print_base(const CkptReader *r) {
    const CkptBaseRef *base = &r->meta.base;
    if (base->present) {
        char err[4096];
        CkptReader *b = ckpt_base_open(r->dir, base, err, sizeof err);
        printf("  frozen base: not stored here, referenced: %s (metadata.mtck CRC-32C %08x) %s\n", base->dir,
               base->metadata_crc32c, b ? "ok" : "NOT USABLE");
        ckpt_reader_close(b);
        if (b) return 0;
        fflush(stdout);
        mt_error("%s", err);
        return 1;
    }
    for (int i = 0; i < r->meta.num_tensors; i++) {
        const char *name = r->meta.tensors[i].name;
        if (strncmp(name, "optimizer.", 10) != 0 && strstr(name, ".lora_A.")) {
            printf("  frozen base: stored in this checkpoint\n");
            break;
        }
    }
    return 0;
}

/* The datasets the run trained on (record DATA), as resume compares them. */
static void print_data(const CkptReader *r) {
    for (int i = 0; i < r->meta.num_datasets; i++) {
        const CkptDataset *d = &r->meta.datasets[i];
        char size[32];
        format_bytes(size, sizeof size, (double)(d->idx_bytes + d->bin_bytes));
        printf("  data.%s %s: %lld documents, %s of files, CRC-32C %08x\n", d->split, d->path,
               (long long)d->documents, size, d->crc32c);
    }
}

/* Check every listed file; print one line each. Returns the number of bad files. */
static int check_files(CkptReader *r) {
    int bad = 0;
    for (int i = 0; i < r->meta.num_files; i++) {
        const CkptFileMeta *f = &r->meta.files[i];
        char err[1024], size[32];
        format_bytes(size, sizeof size, (double)f->size);
        int rc = ckpt_reader_check_file(r, i, true, err, sizeof err);
        printf("  file %-24s %12s  %s\n", f->name, size, rc == 0 ? "ok" : "CORRUPT");
        if (rc != 0) {
            mt_error("%s", err);
            bad++;
        }
    }
    return bad;
}

/* A checkpoint that is gone after it was found was deleted while being read: a run still saving retires its old
 * checkpoints (checkpoint.keep_last). Said as such, not as corruption. */
static bool vanished(const char *dir) {
    struct stat st;
    if (stat(dir, &st) == 0) return false;
    mt_error("%s: removed while it was read (by its run's checkpoint retention? a run that is still saving deletes "
             "its older checkpoints: inspect the newest, or the run once it has stopped)", dir);
    return true;
}

static int inspect_dir(const char *dir) {
    char err[2048];
    CkptReader *r = ckpt_reader_open_metadata(dir, err, sizeof err);
    if (!r) {
        if (!vanished(dir)) mt_error("%s", err);
        return MT_EXIT_FAILURE;
    }
    print_header(r);
    const int bad_base = print_base(r);
    print_data(r);
    int bad_files = check_files(r);
    printf("\n%-48s %-14s %-5s %6s %12s %12s %6s  %s\n", "tensor", "shape", "dtype", "chunks", "stored", "raw", "ratio",
           "check");
    int bad_tensors = 0;
    double stored_total = 0, raw_total = 0;
    for (int i = 0; i < r->meta.num_tensors; i++) {
        const CkptTensorMeta *t = &r->meta.tensors[i];
        const double stored = (double)ckpt_tensor_stored_bytes(t), raw = (double)ckpt_tensor_raw_bytes(t);
        stored_total += stored;
        raw_total += raw;
        int rc = ckpt_reader_verify_tensor(r, t, err, sizeof err);
        char shape[64], stored_text[32], raw_text[32];
        format_shape(shape, sizeof shape, t);
        format_bytes(stored_text, sizeof stored_text, stored);
        format_bytes(raw_text, sizeof raw_text, raw);
        printf("%-48s %-14s %-5s %6d %12s %12s %6.3f  %s\n", t->name, shape, ckpt_dtype_name(t->dtype), t->num_chunks,
               stored_text, raw_text, raw > 0 ? stored / raw : 0.0, rc == 0 ? "ok" : "CORRUPT");
        if (rc != 0) {
            fflush(stdout);
            mt_error("%s", err);
            bad_tensors++;
        }
    }
    char stored_text[32], raw_text[32];
    format_bytes(stored_text, sizeof stored_text, stored_total);
    format_bytes(raw_text, sizeof raw_text, raw_total);
    const int num_tensors = r->meta.num_tensors;
    printf("\n%d tensors: %s stored, %s raw (%.1f%%); ", num_tensors, stored_text, raw_text,
           raw_total > 0 ? 100.0 * stored_total / raw_total : 0.0);
    ckpt_reader_close(r);
    if (bad_files == 0 && bad_tensors == 0) {
        printf("every checksum verified%s\n", bad_base ? "; the frozen base it references is NOT USABLE" : "");
        return bad_base ? MT_EXIT_FAILURE : MT_EXIT_OK;
    }
    struct stat st;
    const bool gone = stat(dir, &st) != 0;
    printf("%s\n", gone ? "REMOVED while read" : "CORRUPT");
    fflush(stdout);
    if (!vanished(dir))
        mt_error("%s: %d of %d tensors and %d of the files are corrupt", dir, bad_tensors, num_tensors, bad_files);
    return MT_EXIT_FAILURE;
}

int inspect_main(int argc, char **argv) {
    if (argc < 1) {
        mt_error("inspect: missing CKPT (a checkpoint or run directory)\n%s", inspect_usage);
        return MT_EXIT_USAGE;
    }
    const char *arg = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(inspect_usage, stdout);
            return MT_EXIT_OK;
        }
        if (argv[i][0] == '-' && argv[i][1] != '\0') { /* as every command says of an option it does not know */
            cli_unknown_option("inspect", argv[i], inspect_usage);
            return MT_EXIT_USAGE;
        }
        if (arg) {
            mt_error("unexpected argument '%s' (CKPT already given as '%s')\n%s", argv[i], arg, inspect_usage);
            return MT_EXIT_USAGE;
        }
        arg = argv[i];
    }
    if (!arg) {
        mt_error("inspect: missing CKPT (a checkpoint or run directory)\n%s", inspect_usage);
        return MT_EXIT_USAGE;
    }
    CkptLocation loc;
    char err[2048];
    const int located = ckpt_locate(arg, &loc, err, sizeof err);
    if (located != 0) {
        mt_error("%s", err);
        return located == CKPT_LOCATE_NO_DIR ? MT_EXIT_USAGE : MT_EXIT_FAILURE;
    }
    if (loc.single) return inspect_dir(loc.checkpoint_dir);
    long *steps = NULL;
    int n = ckpt_list_steps(loc.checkpoints_dir, &steps, err, sizeof err);
    if (n <= 0) {
        free(steps);
        mt_error("%s: %s", loc.checkpoints_dir, n < 0 ? err : "holds no checkpoints");
        return MT_EXIT_FAILURE;
    }
    char dir[MT_PATH_MAX + 32];
    ckpt_iter_path(dir, sizeof dir, loc.checkpoints_dir, steps[n - 1]);
    free(steps);
    return inspect_dir(dir);
}
