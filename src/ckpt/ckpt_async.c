/* ckpt_async.c: the training loop's saver (see ckpt_async.h).
 *
 * Async mode owns one writer thread (signals blocked, lower priority, half
 * the OpenMP threads for compression so it takes little from the step loop)
 * and one snapshot buffer of the params (fp32; without the frozen ones when
 * the checkpoints reference them) and the moments m, v (in
 * their dtype, fp32 or bf16), allocated at the first save. The loop never touches the snapshot while the writer
 * has it: save() waits for the writer before copying. */
#include "ckpt_async.h"

#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../core/error.h"
#include "../core/timer.h"
#include "ckpt_dist.h"
#include "ckpt_run.h"

#define WRITER_NICE 10

struct CkptSaver {
    char checkpoints_dir[MT_PATH_MAX];
    const Recipe *recipe;
    const CkptHfFiles *hf_files; /* carried into every checkpoint */
    CkptBaseRef base;            /* present: the frozen parameters are left out and this recorded instead */
    int num_datasets;            /* the run's data, recorded in every checkpoint (the caller's array) */
    const CkptDataset *datasets;
    CheckpointConfig cfg;
    long last_step;
    double blocked_seconds;

    /* async only */
    bool thread_started;
    pthread_t thread;
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    bool job_ready, busy, quit;
    int job_status;          /* of the last finished job */
    bool failure_unreported;
    char job_err[2200];
    unsigned char *snapshot; /* params | m | v */
    size_t snapshot_bytes;
    CkptSource *sources;
    int num_sources;
    CkptPayload payload;
    long job_step;

    /* saves over ranks (ckpt_saver_distribute) */
    const Comm *world;
    bool dist, writer;
    bool job_dist;           /* the writer thread's job is this rank's shard only */
    bool dist_pending;       /* begun, shards written or being written, not finished (same on every rank) */
    CkptDistSave dist_save;
    /* the distributed optimizer: the moments are this rank's flat ranges */
    const size_t *range_begin, *range_end;
    int num_ranges;
    bool write_dense, write_experts; /* which parameters this rank writes (both by default) */
};

/* A save is complete: say so, then delete what retention does not keep (its log lines follow this one). Rank 0's
 * (or the only rank's) job. */
static void saved(const CkptSaver *s, long step, const CkptWriteStats *st, bool async) {
    mt_log("checkpoint: saved %s/iter_%07ld (%.2f MB on disk for %.2f MB of tensors, %.2fs%s)", s->checkpoints_dir,
           step, (double)st->stored_bytes / 1e6, (double)st->raw_bytes / 1e6, st->seconds,
           async ? ", in the background" : "");
    char why[1024];
    if (ckpt_apply_retention(s->checkpoints_dir, s->cfg.keep_last, s->cfg.keep_every, why, sizeof why) < 0)
        mt_warn("checkpoint retention: %s", why);
}

static void *writer_main(void *arg) {
    CkptSaver *s = arg;
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), WRITER_NICE);
    pthread_mutex_lock(&s->mutex);
    for (;;) {
        while (!s->job_ready && !s->quit) pthread_cond_wait(&s->cond, &s->mutex);
        if (!s->job_ready && s->quit) break;
        s->job_ready = false;
        pthread_mutex_unlock(&s->mutex);

        char err[2048] = "";
        CkptWriteStats stats = {0};
        int rc = 0;
        if (s->job_dist) { /* its outcome is reported by ckpt_dist_finish */
            ckpt_dist_write(&s->dist_save, &s->payload);
        } else {
            rc = ckpt_save_run(s->checkpoints_dir, s->job_step, &s->payload, &stats, err, sizeof err);
            if (rc == 0) saved(s, s->job_step, &stats, true);
        }

        pthread_mutex_lock(&s->mutex);
        s->job_status = rc;
        if (rc != 0) {
            snprintf(s->job_err, sizeof s->job_err, "checkpoint at step %ld failed: %s", s->job_step, err);
            s->failure_unreported = true;
        }
        s->busy = false;
        pthread_cond_broadcast(&s->cond);
    }
    pthread_mutex_unlock(&s->mutex);
    return NULL;
}

CkptSaver *ckpt_saver_create(const char *checkpoints_dir, const Recipe *recipe) {
    CkptSaver *s = mt_calloc(1, sizeof *s);
    snprintf(s->checkpoints_dir, sizeof s->checkpoints_dir, "%s", checkpoints_dir);
    s->recipe = recipe;
    s->cfg = recipe->checkpoint;
    s->last_step = -1;
    s->write_dense = s->write_experts = true;
    if (s->cfg.async) {
        pthread_mutex_init(&s->mutex, NULL);
        pthread_cond_init(&s->cond, NULL);
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old); /* the thread inherits: signals go to the loop */
        s->thread_started = pthread_create(&s->thread, NULL, writer_main, s) == 0;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (!s->thread_started) {
            mt_warn("checkpoint: cannot start the background writer; saving synchronously");
            s->cfg.async = false;
        }
    }
    return s;
}

/* The payload fields shared by both modes. */
static CkptPayload payload_for(const CkptSaver *s, const Model *model, const CkptSource *sources, int num_sources,
                               const CkptState *state, int threads) {
    return (CkptPayload){
        .num_sources = num_sources,
        .sources = sources,
        .model_config = &model->cfg,
        .recipe = s->recipe,
        .hf_files = s->hf_files,
        .base = s->base.present ? &s->base : NULL,
        .num_datasets = s->num_datasets,
        .datasets = s->datasets,
        .has_state = true,
        .state = *state,
        .iteration = state->step,
        .compression_level = s->cfg.compression_level,
        .filter = CKPT_FILTER_SHUFFLE4,
        .threads = threads,
        .progress = !s->cfg.async, /* a synchronous save of a large model shows where it is */
    };
}

static CkptSource *sources_of(const CkptSaver *s, const Model *model, const float *params, const float *extra,
                              const void *m, const void *v, CkptDType moments_dtype, int *count);

static int save_sync(CkptSaver *s, const Model *model, const CkptMoments *opt, const CkptState *state, char *err,
                     size_t errlen) {
    int num_sources = 0;
    CkptSource *sources = sources_of(s, model, model->params, model_extra_state(model).data, opt->m, opt->v, opt->dtype,
                                     &num_sources);
    CkptPayload payload = payload_for(s, model, sources, num_sources, state, omp_get_max_threads());
    CkptWriteStats stats = {0};
    char why[2048];
    int rc = ckpt_save_run(s->checkpoints_dir, state->step, &payload, &stats, why, sizeof why);
    free(sources);
    if (rc != 0) {
        mt_set_error(err, errlen, "checkpoint at step %ld failed: %s", state->step, why);
        return -1;
    }
    saved(s, state->step, &stats, false);
    return 0;
}

void ckpt_saver_distribute(CkptSaver *s, const Comm *world, bool writer) {
    s->world = world;
    s->dist = world->size > 1;
    s->writer = writer;
}

void ckpt_saver_shard_moments(CkptSaver *s, const size_t *begin, const size_t *end, int num_ranges) {
    s->range_begin = begin;
    s->range_end = end;
    s->num_ranges = num_ranges;
}

/* The sources of params / the model's extra state / m / v (m and v of moments_dtype, laid out like params, or
 * this rank's packed ranges under ckpt_saver_shard_moments). */
static CkptSource *sources_of(const CkptSaver *s, const Model *model, const float *params, const float *extra,
                              const void *m, const void *v, CkptDType moments_dtype, int *count) {
    const bool frozen = !s->base.present;
    if (s->num_ranges > 0)
        return ckpt_sources_sharded(model, params, extra, s->write_dense, s->write_experts, frozen, m, v, moments_dtype,
                                    s->range_begin, s->range_end, s->num_ranges, count);
    return ckpt_sources_of_kinds(model, params, extra, m, v, moments_dtype, s->write_dense, s->write_experts, frozen,
                                 count);
}

/* Point the parameters' sources (not the moments' or the extra state's), which read model->params, at the same
 * floats of `copy`, a copy of model->params from float `from` on (the frozen ones before it are not written). */
static void rebase_params(CkptSource *sources, int n, const Model *model, const unsigned char *copy, size_t from) {
    for (int i = 0; i < n; i++) {
        if (strncmp(sources[i].name, "optimizer.", 10) == 0 || model_is_extra_state(sources[i].name)) continue;
        const size_t at = (size_t)((const float *)sources[i].data - model->params);
        sources[i].data = copy + (at - from) * sizeof(float);
    }
}

void ckpt_saver_carry_hf_files(CkptSaver *s, const CkptHfFiles *files) { s->hf_files = files; }

void ckpt_saver_reference_base(CkptSaver *s, const CkptBaseRef *base) {
    s->base = base && base->present ? *base : (CkptBaseRef){0};
}

void ckpt_saver_record_data(CkptSaver *s, const CkptDataset *datasets, int num_datasets) {
    s->datasets = datasets;
    s->num_datasets = num_datasets;
}

void ckpt_saver_write_kinds(CkptSaver *s, bool dense, bool experts) {
    s->write_dense = dense;
    s->write_experts = experts;
}

/* Collective: finish the pending save over ranks. */
static int finish_dist(CkptSaver *s, bool async, char *err, size_t errlen) {
    CkptWriteStats stats = {0};
    char why[2048];
    s->dist_pending = false;
    if (ckpt_dist_finish(&s->dist_save, &s->payload, s->checkpoints_dir, &stats, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "checkpoint at step %ld failed: %s", s->dist_save.step, why);
        return -1;
    }
    if (s->world->rank == 0) saved(s, s->dist_save.step, &stats, async);
    return 0;
}

static int save_sync_dist(CkptSaver *s, const Model *model, const CkptMoments *opt, const CkptState *state, char *err,
                          size_t errlen) {
    char why[2048];
    if (ckpt_dist_begin(&s->dist_save, s->world, s->checkpoints_dir, state->step, s->writer, why, sizeof why) != 0) {
        mt_set_error(err, errlen, "checkpoint at step %ld failed: %s", state->step, why);
        return -1;
    }
    int num_sources = 0;
    CkptSource *sources = sources_of(s, model, model->params, model_extra_state(model).data, opt->m, opt->v,
                                     opt->dtype, &num_sources);
    s->payload = payload_for(s, model, sources, num_sources, state, omp_get_max_threads());
    ckpt_dist_write(&s->dist_save, &s->payload);
    int rc = finish_dist(s, false, err, errlen);
    free(sources);
    return rc;
}

/* Wait for the writer; -1 with its error if its last job failed and that was not reported yet. */
static int wait_idle_locked(CkptSaver *s, char *err, size_t errlen) {
    while (s->busy) pthread_cond_wait(&s->cond, &s->mutex);
    if (s->failure_unreported) {
        s->failure_unreported = false;
        mt_set_error(err, errlen, "%s", s->job_err);
        return -1;
    }
    return 0;
}

/* A wait for the previous save longer than this is said in the log (the loop stood still for it). */
#define WAIT_NOTE_SECONDS 1.0

static int save_async(CkptSaver *s, const Model *model, const CkptMoments *opt, const CkptState *state, char *err,
                      size_t errlen) {
    const double wait_start = mt_now();
    pthread_mutex_lock(&s->mutex);
    int rc = wait_idle_locked(s, err, errlen);
    pthread_mutex_unlock(&s->mutex);
    if (rc == 0 && s->dist_pending) rc = finish_dist(s, true, err, errlen);
    if (rc != 0) return -1;
    const double waited = mt_now() - wait_start;
    if (waited > WAIT_NOTE_SECONDS) /* rank 0's line (mt_log); every rank waited as long, in finish_dist */
        mt_log("checkpoint: waited %.1f s for the previous save (iter_%07ld) to finish writing before saving step %ld "
               "(a save takes longer than checkpoint.interval steps)", waited, s->last_step, (long)state->step);
    if (s->dist) {
        char why[2048];
        if (ckpt_dist_begin(&s->dist_save, s->world, s->checkpoints_dir, state->step, s->writer, why, sizeof why) != 0) {
            mt_set_error(err, errlen, "checkpoint at step %ld failed: %s", state->step, why);
            return -1;
        }
        s->dist_pending = true;
        if (!s->writer) return 0;
    }

    /* The writer is idle: the snapshot and the payload are ours. Snapshot: params (n floats; from the first
     * trainable one on when the frozen ones are referenced, not written) | the model's
     * extra state (FP8 amax histories) | m | v (opt->num_floats each, of opt->dtype: n, or this rank's ranges). */
    const ModelExtraState extra = model_extra_state(model);
    const size_t params_from = s->base.present ? (size_t)model->trainable_offset : 0;
    const size_t params_bytes = ((size_t)model->num_floats - params_from) * sizeof(float);
    const size_t extra_bytes = (size_t)extra.num_floats * sizeof(float);
    const size_t moment_bytes = (size_t)opt->num_floats * ckpt_dtype_size(opt->dtype);
    if (!s->snapshot) {
        s->snapshot_bytes = params_bytes + extra_bytes + 2 * moment_bytes;
        s->snapshot = mt_malloc(s->snapshot_bytes);
        unsigned char *m = s->snapshot + params_bytes + extra_bytes;
        s->sources = sources_of(s, model, model->params,
                                extra.data ? (const float *)(s->snapshot + params_bytes) : NULL, m, m + moment_bytes,
                                opt->dtype, &s->num_sources);
        rebase_params(s->sources, s->num_sources, model, s->snapshot, params_from);
    }
    if (s->snapshot_bytes != params_bytes + extra_bytes + 2 * moment_bytes) {
        mt_set_error(err, errlen, "checkpoint: the model changed size during the run");
        return -1;
    }
    memcpy(s->snapshot, model->params + params_from, params_bytes);
    if (extra_bytes) memcpy(s->snapshot + params_bytes, extra.data, extra_bytes);
    memcpy(s->snapshot + params_bytes + extra_bytes, opt->m, moment_bytes);
    memcpy(s->snapshot + params_bytes + extra_bytes + moment_bytes, opt->v, moment_bytes);
    const int threads = omp_get_max_threads() / 2; /* leave the step loop most of the cores */
    s->payload = payload_for(s, model, s->sources, s->num_sources, state, threads > 1 ? threads : 1);
    s->job_step = state->step;
    s->job_dist = s->dist;

    pthread_mutex_lock(&s->mutex);
    s->busy = true;
    s->job_ready = true;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mutex);
    return 0;
}

int ckpt_saver_save(CkptSaver *s, const Model *model, const CkptMoments *optimizer, const CkptState *state,
                    char *err, size_t errlen) {
    const double start = mt_now();
    int rc = s->cfg.async ? save_async(s, model, optimizer, state, err, errlen)
             : s->dist    ? save_sync_dist(s, model, optimizer, state, err, errlen)
                          : save_sync(s, model, optimizer, state, err, errlen);
    s->blocked_seconds += mt_now() - start;
    s->last_step = state->step;
    return rc;
}

/* Collective (a save over ranks pending): whether every rank's writer is done. */
static bool all_written(CkptSaver *s) {
    pthread_mutex_lock(&s->mutex);
    int32_t done = !s->busy;
    pthread_mutex_unlock(&s->mutex);
    int32_t *all = mt_malloc((size_t)s->world->size * sizeof(int32_t));
    comm_all_gather(s->world, &done, all, 1, COMM_INT32);
    bool every = true;
    for (int r = 0; r < s->world->size; r++) every = every && all[r];
    free(all);
    return every;
}

int ckpt_saver_poll(CkptSaver *s, char *err, size_t errlen) {
    if (!s->cfg.async) return 0;
    if (s->dist_pending && all_written(s)) return finish_dist(s, true, err, errlen);
    pthread_mutex_lock(&s->mutex);
    int rc = 0;
    if (s->failure_unreported) {
        s->failure_unreported = false;
        mt_set_error(err, errlen, "%s", s->job_err);
        rc = -1;
    }
    pthread_mutex_unlock(&s->mutex);
    return rc;
}

int ckpt_saver_wait(CkptSaver *s, char *err, size_t errlen) {
    if (!s->cfg.async) return 0;
    pthread_mutex_lock(&s->mutex);
    int rc = wait_idle_locked(s, err, errlen);
    pthread_mutex_unlock(&s->mutex);
    if (s->dist_pending) { /* collective: every rank waits here */
        int fin = finish_dist(s, true, err, errlen);
        if (rc == 0) rc = fin;
    }
    return rc;
}

long ckpt_saver_last_step(const CkptSaver *s) { return s->last_step; }

double ckpt_saver_blocked_seconds(const CkptSaver *s) { return s->blocked_seconds; }

void ckpt_saver_free(CkptSaver *s) {
    if (!s) return;
    if (s->thread_started) {
        pthread_mutex_lock(&s->mutex);
        while (s->busy) pthread_cond_wait(&s->cond, &s->mutex);
        s->quit = true;
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&s->mutex);
        pthread_join(s->thread, NULL);
        pthread_mutex_destroy(&s->mutex);
        pthread_cond_destroy(&s->cond);
    }
    free(s->snapshot);
    free(s->sources);
    free(s);
}
