/* train_context.h: what the training loop holds while it runs (private to
 * src/train): the recipe, the process layout, the model, the optimizer, the
 * data loaders, the token buffers of one micro-batch and the TrainState. */
#ifndef MT_TRAIN_TRAIN_CONTEXT_H
#define MT_TRAIN_TRAIN_CONTEXT_H

#include <stdbool.h>
#include <stdint.h>

#include "../ckpt/checkpoint.h"
#include "../config/recipe.h"
#include "../data/data_loader.h"
#include "../data/eval_coverage.h"
#include "../data/micro_batch.h"
#include "../model/model.h"
#include "../model/model_device.h"
#include "../obs/energy.h"
#include "metrics.h"
#include "pipeline.h"
#include "train_layout.h"
#include "train_state.h"


typedef struct TrainContext {
    const Recipe *recipe;
    TrainLayout layout;
    Grid grid;                /* the process grid: tp, cp, dp, pp and embedding groups */
    ModelPartition part;      /* the part of the model this rank holds */
    Pipeline pipe;            /* pp > 1: the pipeline executor */
    char pipeline_note[256];  /* pp > 1: the banner's line on it (setup_pipeline) */
    long total_steps;
    ModelDevice *device;      /* run.device's model of this rank's part, its optimizer state (model_device.h) */
    Model *model;             /* device->host: the registry and the host's weights */
    DataLoader *train_data;
    DataLoader *valid_data;   /* NULL when evaluation is off */
    DataLoader *test_data;    /* data.split's test share, evaluated after the last step; NULL when none or eval off */
    EvalExtent valid_extent;  /* what an evaluation of each reads: train.eval_batches resolved where the loaders are */
    EvalExtent test_extent;   /* built (`all`: the samples each holds), kept here, the recipe left as it was read */
    MicroBatch batch;         /* micro_batch_size samples, seq_len / cp positions of each (context parallel) */
    long empty_batches;       /* the step's or evaluation's micro-batches this rank computed a loss for (the last
                               * stage) in which no target counts (MicroBatch.empty), and whether that was said: */
    bool said_empty_train, said_empty_eval;
    TrainState state;
    StepTimers timers;        /* where the steps' time went since the last timers line */
    EnergyMeter energy;       /* the GPU's energy counter (NVML); closed on the CPU */
    long start_step;          /* 0, or the step of the checkpoint resumed from */
    char resumed_from[MT_PATH_MAX]; /* that checkpoint's directory ("" for a fresh run): a branch's (another run.dir's)
                                     * is where it goes on from until it saves one of its own */
    bool stopped_together;    /* setup or the loop ended on a failure every rank agreed on at the same point (a
                               * refusal in setup, refused data, too many non-finite steps, a failed save, differing
                               * replicas): it has been said once; no rank waits, none aborts */
    CkptHfFiles hf_files;     /* what the init_from or resumed checkpoint carries for Hugging Face: carried on */
    CkptBaseRef frozen_base;  /* present: the checkpoints reference this frozen base instead of storing it */
    int num_datasets;         /* rank 0: the datasets the checkpoints record (train_data_record.h) */
    CkptDataset *datasets;
    char checkpoints_dir[MT_PATH_MAX + 16]; /* run.dir/checkpoints */
    char made_dir[MT_PATH_MAX]; /* rank 0 of a fresh run: the shallowest directory of run.dir's path it made ("" when
                                 * run.dir was there), removed if the run stops before its first step */
} TrainContext;

/* What one step produced, for the metrics line. */
typedef struct StepResult {
    long global_batch_size;
    double loss;              /* mean over the step's micro-batches */
    double grad_norm;         /* before clipping */
    double lr;
    double weight_decay;      /* with optimizer.weight_decay_style linear or cosine; NAN when constant */
    bool nonfinite;           /* loss or grad norm NaN/Inf: the update was skipped */
    bool moe;                 /* the fields below are set (MoE families) */
    double moe_aux_loss;      /* load-balancing + z losses of every MoE layer, per micro-batch (dp mean) */
    double moe_lb_loss;       /* the load-balancing loss without its coefficient, mean over the MoE layers (Megatron's
                               * load_balancing_loss: about 1 when balanced); NAN without one */
    double moe_z_loss;        /* the router z-loss without its coefficient, likewise; NAN without one */
    double moe_imbalance;     /* max / mean tokens per expert, mean over the MoE layers */
    double moe_drop_rate;     /* assignments dropped by the capacity / all assignments */
    double moe_spill_rate;    /* GPU under ep: MoE layer forwards whose expert side spilled / all; NAN where none can */
} StepResult;

/* Everything before the first step of a fresh run: check the recipe against
 * what this build supports, create run.dir and write recipe.yaml there, open
 * the data loaders, create and initialise the model and the optimizer.
 * Returns 0, or an exit status (MT_EXIT_USAGE / MT_EXIT_FAILURE) after
 * writing the reason into err; train_teardown is safe either way. */
int train_setup(TrainContext *ctx, const Recipe *recipe, char *err, size_t errlen);
void train_teardown(TrainContext *ctx);

/* Rank 0 of a fresh run refused before its first step (in setup, or a writer that cannot open after it): when the run
 * made run.dir (ctx->made_dir), the files setup wrote there (recipe.yaml, metrics.jsonl, the lock) and the data's
 * index cache when it lies in run.dir (data.cache_dir's default) are removed, then run.dir and the parents the run
 * made for it, each only if nothing else is in it. A run.dir that was there is left as it was. Before
 * train_teardown. */
void train_remove_refused_run_dir(const TrainContext *ctx);

/* The part of setup both a fresh and a resumed run do: check the recipe
 * against this build, count the steps, check the data against the
 * tokenizer the checkpoint tokenizer_dir carries (NULL: none; see
 * train_check_data_tokenizer), open the data loaders, allocate the batch
 * buffers, create the model (weights not initialised) and a fresh
 * optimizer. Returns 0 or an exit status with err set; a refusal before
 * the model is agreed (train_setup_agree). */
int train_setup_common(TrainContext *ctx, const Recipe *recipe, const char *tokenizer_dir,
                       const char *tokenizer_source, char *err, size_t errlen);

/* Collective over the world, at a point of setup every rank reaches with no
 * collective skipped: the first failing rank's status and err
 * (dist_report_first prints it, once); on a failure ctx->stopped_together
 * is set, and the caller does not print err again: every rank tears down
 * and ends MPI with no abort (dist_finish_together). */
int train_setup_agree(TrainContext *ctx, int status, const char *err);

/* Collective, first in setup (before anything is written): every rank runs rank 0's recipe, compared by the
 * resolved recipe's CRC-32C (mpirun's MPMD form can give ranks different --set values). 0, or not 0 agreed as
 * train_setup_agree agrees (the rank that differs named). */
int train_setup_same_recipe(TrainContext *ctx, const Recipe *recipe, char *err, size_t errlen);

/* The file in run.dir that a run's rank 0 locks while it writes there (train_lock_run_dir). */
#define TRAIN_RUN_DIR_LOCK ".megatrain.lock"

/* Rank 0 of a run or resume, before it writes run.dir: run.dir/TRAIN_RUN_DIR_LOCK locked for the process's
 * life (mt_lock_file), so that a second process on the same run (a job started again while the first still
 * runs) is refused, naming the holder, before it writes anything. A file system without locks is warned about
 * and passes. Returns 0, or -1 with err. */
int train_lock_run_dir(const char *run_dir, char *err, size_t errlen);

/* Rank 0 of a run or resume, once it is accepted and before it writes recipe.yaml and cuts metrics.jsonl: the
 * directory the TensorBoard writer opens after setup (run.dir/tensorboard, with logging.tensorboard) made and
 * writable, so that a run refused for it (a file of that name there) leaves run.dir's files as they were. Returns
 * 0, or -1 with err naming the path and the key. */
int train_check_writers(const Recipe *recipe, char *err, size_t errlen);

/* Each dataset of the recipe that `data build` made (PREFIX.build.json)
 * against the tokenizer.json that checkpoint `ckpt_dir` (or a run
 * directory's newest) carries, `model_source` naming it in messages
 * ("init_from", "resume from"): a dataset another tokenizer made is
 * refused (src/data/dataset_tokenizer.h); nothing is checked when the
 * checkpoint carries no tokenizer.json or cannot be read (its load says
 * why). Cheap: run before the loaders and the model. Returns 0, or -1
 * with err. */
int train_check_data_tokenizer(const Recipe *recipe, const char *ckpt_dir, const char *model_source, char *err,
                               size_t errlen);

/* What test_loss scores, for messages: "data.test", or "data.split's test share of data.train". */
const char *train_test_data_name(const DataConfig *data);

/* Setup of `megatrain resume`: train_setup_common, then the weights, the
 * optimizer (when load_optimizer) and the TrainState from checkpoint_dir;
 * only then run.dir is touched: recipe.yaml rewritten, metrics.jsonl cut
 * back to the checkpoint's step. Returns 0, an exit status, or
 * TRAIN_CHECKPOINT_UNREADABLE (train.h) when the checkpoint failed
 * verification, all with err set. */
int train_setup_resume(TrainContext *ctx, const Recipe *recipe, const char *checkpoint_dir, bool load_optimizer,
                       char *err, size_t errlen);

/* What train_step and train_evaluate return on every rank at once when a
 * rank refused a sample of theirs (a token outside the model's vocabulary,
 * src/data/micro_batch.h): the ranks agreed on it in the reductions they
 * make anyway, so all stop together. err holds the dataset's error on the
 * first rank (tp, cp, pp 0) of each dp replica that read such a sample,
 * "" on the others. */
#define TRAIN_DATA_REFUSED 1

/* Run step state.step: forward and backward over this rank's micro-batches,
 * clip, AdamW, and advance the counters. A NaN/Inf loss or grad norm skips
 * clip and AdamW and sets result->nonfinite (the step still counts).
 * Returns 0, -1 with err set (a batch that does not divide), or
 * TRAIN_DATA_REFUSED: nothing updated, the counters unmoved. */
int train_step(TrainContext *ctx, StepResult *result, char *err, size_t errlen);

/* *eval_loss: the mean loss over ctx->valid_extent's micro-batches of the
 * first validation samples (the same samples at every evaluation; `all`:
 * every one once, eval_coverage.h); forward only; NAN when a signal stopped
 * it. Returns 0 or TRAIN_DATA_REFUSED. */
int train_evaluate(TrainContext *ctx, double *eval_loss, char *err, size_t errlen);
/* The same over ctx->test_data (Megatron's test evaluation at the end of training). */
int train_evaluate_test(TrainContext *ctx, double *test_loss, char *err, size_t errlen);

#endif
