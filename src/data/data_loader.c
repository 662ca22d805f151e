/* data_loader.c: GPT samples from one or several blended indexed datasets
 * (see data_loader.h). Opens each dataset, builds or loads from cache the
 * sample index of its share of the split (or, with data.pack, packs it into
 * rows: packed_loader.h), and with several datasets assigns every global
 * sample to one of them by Megatron's greedy blending rule.
 *
 * Which documents: without data.valid, train/valid/test are the data.split
 * shares of each data.train dataset. With data.valid, as with Megatron's
 * separate --train/--valid-data-path, each list is used whole (train on all
 * of data.train, validate on all of data.valid); test stays the split share. */
#include "data_loader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "../core/timer.h"
#include "blend.h"
#include "gpt_sampling.h"
#include "indexed_dataset.h"
#include "loss_mask.h"
#include "packed_loader.h"
#include "sample_cache.h"
#include "sft_packing.h"

struct DataLoader {
    int seq_len;
    int num_datasets;
    IndexedDataset datasets[MT_MAX_DATA_SOURCES];
    IndexedDataset masks[MT_MAX_DATA_SOURCES]; /* SFT loss masks (loss_mask.h), where has_mask */
    bool has_mask[MT_MAX_DATA_SOURCES];
    bool any_mask;
    int source[MT_MAX_DATA_SOURCES]; /* each dataset's index in the recipe's list */
    bool packed;                   /* data.pack: rows of whole samples (sft_packing.h) instead of GPT samples */
    PackedRows rows[MT_MAX_DATA_SOURCES]; /* data.pack: each dataset's own rows */
    int32_t *scratch;              /* seq_len + 1 */
    GptSampleIndex indices[MT_MAX_DATA_SOURCES];
    int64_t num_samples;
    BlendIndex blend;              /* with several datasets: the dataset of each sample (blend.h) */
    int vocab_size;                /* > 0: every token a get returns is checked against [0, vocab_size) */
};

_Static_assert(MT_MAX_DATA_SOURCES <= BLEND_MAX_DATASETS, "a blend's dataset is a byte");

static const char *const split_names[] = {"train", "valid", "test"};

/* Indices with at least this many samples get a log line while they are built. */
#define LARGE_INDEX_SAMPLES 1000000

/* Build or load the index of ds's sequences [first, end). */
static int prepare_index(GptSampleIndex *gi, const IndexedDataset *ds, const DataConfig *data, DataSplit split,
                         int64_t first, int64_t end, int seq_len, uint64_t seed, int64_t num_samples, char *err,
                         size_t errlen) {
    SampleCacheKey key;
    int use_cache = data->cache_dir[0] != '\0';
    if (use_cache && sample_cache_key(&key, data->cache_dir, ds, split_names[split], first, end, seq_len, seed,
                                      num_samples, err, errlen) != 0)
        return -1;
    if (use_cache) {
        char why[256];
        int loaded = sample_cache_load(gi, &key, ds, why, sizeof(why));
        if (loaded == 0) return 0;
        if (loaded < 0) mt_warn("data: the sample index cache %s is damaged (%s); rebuilding it", key.path, why);
    }
    /* Large indices take a while to build: say what is happening (once cached, a restart skips this). */
    const bool large = num_samples >= LARGE_INDEX_SAMPLES;
    const double start = mt_now();
    if (large)
        mt_log("data: building the %s sample index of %s (%lld samples of %d tokens)...", split_names[split],
               ds->prefix, (long long)num_samples, seq_len);
    if (gpt_index_build(gi, ds, first, end, seq_len, seed, num_samples, err, errlen) != 0) return -1;
    if (large) mt_log("data: sample index built in %.1f s", mt_now() - start);
    char save_err[2400];
    if (use_cache && sample_cache_save(gi, &key, save_err, sizeof(save_err)) != 0) {
        mt_warn("%s (continuing without the cache)", save_err);
        return 0;
    }
    /* saved: use the file mapped, as the ranks that load it do (the pages shared, the heap copy freed) */
    GptSampleIndex mapped;
    char why[256];
    if (use_cache && sample_cache_load(&mapped, &key, ds, why, sizeof(why)) == 0) {
        gpt_index_free(gi);
        *gi = mapped;
    }
    return 0;
}

static int check_split_weights(const double split[3], char *err, size_t errlen) {
    if (split[0] < 0 || split[1] < 0 || split[2] < 0 || split[0] + split[1] + split[2] <= 0) {
        mt_set_error(err, errlen, "data.split: [%g, %g, %g] (expected non-negative weights with a positive sum)",
                     split[0], split[1], split[2]);
        return -1;
    }
    return 0;
}

/* Open the sources and keep those whose share of the split has tokens. An
 * empty share is an error when every share is empty, else a warning. */
static int open_sources(DataLoader *loader, const DataSource *sources, int count, const char *key,
                        const double weights[3], int which, const char *hint, double *kept_weights,
                        bool *weighed_by_size, int64_t *first, int64_t *end, char *err, size_t errlen) {
    char (*empty)[1400] = mt_malloc((size_t)count * sizeof *empty); /* the datasets left out, said at the end */
    int num_empty = 0;
    /* A blend gives every dataset a weight or none: then each weighs its share's tokens, as Megatron weighs the
     * datasets of a --data-path without weights by their size. */
    const bool by_size = count > 1 && !(sources[0].weight > 0);
    for (int i = 0; i < count; i++) {
        if (count > 1 && (sources[i].weight > 0) == by_size) {
            mt_set_error(err, errlen, "%s[%d] %s and %s[0] %s: give every dataset of a blend a weight, or none "
                         "(then each weighs its tokens, as Megatron weighs a --data-path without weights)", key, i,
                         by_size ? "has a weight" : "has no weight", key, by_size ? "has none" : "has one");
            free(empty);
            return -1;
        }
        IndexedDataset *ds = &loader->datasets[loader->num_datasets];
        char why[1400];
        if (indexed_dataset_open(ds, sources[i].path, why, sizeof why) != 0) {
            /* the recipe's key, then the file's error; the tiny recipes' data set is made by a script */
            const char *demo = "data/demo/english";
            const size_t n = strlen(sources[i].path), k = strlen(demo); /* (no pointer before the path: UB) */
            const bool missing_demo = n >= k && strcmp(sources[i].path + n - k, demo) == 0 && strstr(why, "No such file");
            /* any other prefix with no .idx at all: not built yet (the fine-tuning recipe's data/my-sft) */
            const bool missing = !missing_demo && strstr(why, ".idx: cannot open: No such file");
            mt_set_error(err, errlen, "%s[%d].path: %s%s%s%s", key, i, why,
                         missing_demo ? " (the demo data set of recipes/tiny: `bash scripts/demo_data.sh "
                         : missing    ? " (no dataset at that prefix: `megatrain data build --input FILE --output "
                                      : "",
                         missing_demo || missing ? sources[i].path : "",
                         missing_demo ? "` in the megatrain checkout builds it)"
                         : missing    ? "` writes one, with --format sft for conversations; or give another path)"
                                      : "");
            free(empty);
            return -1;
        }
        char tokens_of[1100];
        if (loss_mask_of(ds, sources[i].path, tokens_of, sizeof tokens_of)) {
            mt_set_error(err, errlen, "%s[%d].path: %s is the loss mask of %s (its bytes are 0 and 1, not tokens): "
                         "give %s, whose mask is read with it", key, i, sources[i].path, tokens_of, tokens_of);
            indexed_dataset_close(ds);
            free(empty);
            return -1;
        }
        indexed_dataset_advise_random(ds);
        int64_t a, b, tokens = 0;
        gpt_split_sequences(ds, weights, which, &a, &b);
        for (int64_t s = a; s < b; s++) tokens += indexed_length(ds, s);
        if (tokens == 0 && weights[1] == 0 && weights[2] == 0 && which == 0) { /* used whole */
            snprintf(empty[num_empty++], sizeof(empty[0]), "%s: %s dataset has no tokens", ds->prefix, key);
            indexed_dataset_close(ds);
            continue;
        }
        if (tokens == 0) {
            snprintf(empty[num_empty++], sizeof(empty[0]),
                     "%s: the %s share of data.split [%g, %g, %g] has no tokens (%lld of its %lld documents)",
                     ds->prefix, split_names[which], weights[0], weights[1], weights[2],
                     (long long)(b - a), (long long)(ds->num_documents_plus_one - 1));
            indexed_dataset_close(ds);
            continue;
        }
        int has_mask = loss_mask_open(&loader->masks[loader->num_datasets], ds, sources[i].path, err, errlen);
        if (has_mask < 0) {
            indexed_dataset_close(ds);
            free(empty);
            return -1;
        }
        loader->has_mask[loader->num_datasets] = has_mask == 1;
        if (has_mask == 1) indexed_dataset_advise_random(&loader->masks[loader->num_datasets]); /* read as the tokens */
        loader->any_mask |= has_mask == 1;
        loader->source[loader->num_datasets] = i;
        kept_weights[loader->num_datasets] = count == 1 ? 1.0 : by_size ? (double)tokens : sources[i].weight;
        first[loader->num_datasets] = a;
        end[loader->num_datasets] = b;
        loader->num_datasets++;
    }
    if (loader->num_datasets == 0) {
        mt_set_error(err, errlen, "%s%s", empty[0], hint);
        free(empty);
        return -1;
    }
    for (int i = 0; i < num_empty; i++) mt_log_warn("%s; leaving it out of the %s blend", empty[i], split_names[which]);
    *weighed_by_size = by_size && loader->num_datasets > 1;
    free(empty);
    return 0;
}

/* A blend without weights: what the weights came to (normalised), weighed by `what`. */
static void log_size_weights(const DataLoader *loader, const double *weights, const char *split_name, const char *key,
                             const char *what) {
    const size_t cap = (size_t)loader->num_datasets * 300;
    char *line = mt_malloc(cap);
    size_t at = 0;
    for (int d = 0; d < loader->num_datasets && at < cap; d++)
        at += (size_t)snprintf(line + at, cap - at, "%s%s %.1f%%", d ? ", " : "", loader->datasets[d].prefix,
                               100.0 * weights[d]);
    mt_log("data: %s blends %s by their %s (no weights given): %s", split_name, key, what, line);
    free(line);
}

/* data.pack: each opened dataset packed into its own rows (packed_loader.h);
 * count: the datasets the recipe lists, whose index names each in a blend. */
static int build_packed(DataLoader *loader, const char *key, int count, const double *weights, const int64_t *first,
                        const int64_t *end, const char *split_name, PackOverlong overlong, uint64_t seed, char *err,
                        size_t errlen) {
    PackedSource sources[MT_MAX_DATA_SOURCES];
    for (int d = 0; d < loader->num_datasets; d++) {
        PackedSource *p = &sources[d];
        p->ds = &loader->datasets[d];
        p->mask = loader->has_mask[d] ? &loader->masks[d] : NULL;
        if (count == 1) snprintf(p->key, sizeof p->key, "%s", key);
        else snprintf(p->key, sizeof p->key, "%s[%d]", key, loader->source[d]);
        p->weight = weights ? weights[d] : 0.0; /* none: weighed by the rows, once packed */
        p->first = first[d];
        p->end = end[d];
    }
    if (packed_sources_build(loader->rows, sources, loader->num_datasets, split_name, loader->seq_len, overlong, seed,
                             err, errlen) != 0)
        return -1;
    loader->packed = true;
    loader->scratch = mt_malloc(((size_t)loader->seq_len + 1) * sizeof *loader->scratch);
    return 0;
}

DataLoader *data_loader_create(const DataConfig *data, DataSplit split, int seq_len, uint64_t seed,
                               int64_t num_samples, char *err, size_t errlen) {
    static const double whole[3] = {1, 0, 0};
    if (seq_len <= 0 || (int)split < 0 || split > SPLIT_TEST) {
        mt_set_error(err, errlen, "data loader: seq_len %d and split %d (expected seq_len > 0, split 0..2)", seq_len,
                     (int)split);
        return NULL;
    }
    const DataSource *sources = data->train;
    int count = data->num_train, which = (int)split;
    const char *key = "data.train";
    const double *weights = data->split;
    const char *hint = split == SPLIT_VALID ? "; give data.valid or raise data.split[1]" : "";
    if ((split == SPLIT_VALID && data->num_valid > 0) || (split == SPLIT_TEST && data->num_test > 0)) {
        const bool valid = split == SPLIT_VALID; /* a list of its own, read whole */
        sources = valid ? data->valid : data->test;
        count = valid ? data->num_valid : data->num_test;
        key = valid ? "data.valid" : "data.test";
        weights = whole;
        which = 0;
        hint = "";
    } else if (split == SPLIT_TRAIN && data->num_valid > 0) {
        weights = whole; /* data.valid replaces the split: train on all of data.train */
    } else if (check_split_weights(data->split, err, errlen) != 0) {
        return NULL;
    }
    if (count <= 0 || count > MT_MAX_DATA_SOURCES) {
        mt_set_error(err, errlen, "%s: %d datasets (expected 1..%d)", key, count, MT_MAX_DATA_SOURCES);
        return NULL;
    }
    DataLoader *loader = mt_calloc(1, sizeof(*loader));
    loader->seq_len = seq_len;
    double kept_weights[MT_MAX_DATA_SOURCES];
    int64_t first[MT_MAX_DATA_SOURCES], end[MT_MAX_DATA_SOURCES];
    bool by_size = false;
    if (open_sources(loader, sources, count, key, weights, which, hint, kept_weights, &by_size, first, end, err,
                     errlen) != 0) {
        data_loader_free(loader);
        return NULL;
    }
    blend_normalize(kept_weights, loader->num_datasets);
    int64_t wanted = num_samples > 0 ? num_samples : 1;
    uint64_t split_seed = seed ^ (0x9e3779b97f4a7c15ULL * (uint64_t)(split + 1));
    if (data->pack) {
        if (build_packed(loader, key, count, by_size ? NULL : kept_weights, first, end, split_names[split], data->pack_overlong,
                         split_seed, err, errlen) != 0) {
            data_loader_free(loader);
            return NULL;
        }
        if (by_size) { /* each dataset's rows, what truncation and packing left of its tokens (Megatron's len) */
            for (int d = 0; d < loader->num_datasets; d++) kept_weights[d] = (double)loader->rows[d].num_rows;
            blend_normalize(kept_weights, loader->num_datasets);
            log_size_weights(loader, kept_weights, split_names[split], key, "packed rows");
        }
    } else {
        if (by_size) log_size_weights(loader, kept_weights, split_names[split], key, "tokens");
        for (int d = 0; d < loader->num_datasets; d++) {
            int64_t asked = loader->num_datasets == 1 ? wanted : blend_samples_per_dataset(kept_weights[d], wanted);
            if (prepare_index(&loader->indices[d], &loader->datasets[d], data, split, first[d], end[d], seq_len,
                              split_seed, asked, err, errlen) != 0) {
                data_loader_free(loader);
                return NULL;
            }
        }
    }
    if (loader->num_datasets == 1) {
        loader->num_samples = loader->packed ? loader->rows[0].num_rows : loader->indices[0].num_samples;
    } else {
        loader->num_samples = wanted;
        blend_index_build(&loader->blend, kept_weights, loader->num_datasets, wanted);
    }
    return loader;
}

int64_t data_loader_num_samples(const DataLoader *loader) { return loader->num_samples; }

int data_loader_num_datasets(const DataLoader *loader) { return loader->num_datasets; }

/* Dataset d's samples before its data repeats: its packed rows, or one epoch's GPT samples of its share. */
static int64_t dataset_distinct_samples(const DataLoader *loader, int d) {
    if (loader->packed) return loader->rows[d].num_rows;
    const GptSampleIndex *gi = &loader->indices[d];
    int64_t tokens = 0;
    for (int64_t s = gi->first_sequence; s < gi->end_sequence; s++) tokens += indexed_length(&loader->datasets[d], s);
    return (tokens - 1) / loader->seq_len;
}

int64_t data_loader_distinct_samples(const DataLoader *loader) {
    if (loader->num_datasets == 1) return dataset_distinct_samples(loader, 0);
    int64_t own[MT_MAX_DATA_SOURCES], seen[MT_MAX_DATA_SOURCES] = {0};
    for (int d = 0; d < loader->num_datasets; d++) own[d] = dataset_distinct_samples(loader, d);
    for (int64_t i = 0; i < loader->blend.size; i++) {
        const int d = loader->blend.dataset[i];
        if (++seen[d] > own[d]) return i;
    }
    return loader->blend.size;
}

DataLoader *data_loader_create_whole(const DataConfig *data, DataSplit split, int seq_len, uint64_t seed, char *err,
                                     size_t errlen) {
    DataLoader *loader = data_loader_create(data, split, seq_len, seed, 1, err, errlen);
    if (!loader || loader->num_datasets == 1) return loader;
    /* a blend of more samples than its datasets hold together repeats one of them: built for that many, the
     * blend's first num_samples are the same (blend.h, gpt_sampling.h: a longer build extends the order) */
    int64_t held = 0;
    for (int d = 0; d < loader->num_datasets; d++) held += dataset_distinct_samples(loader, d);
    if (held <= loader->num_samples) return loader;
    data_loader_free(loader);
    return data_loader_create(data, split, seq_len, seed, held, err, errlen);
}

const char *data_loader_dataset(const DataLoader *loader, int i, DatasetFingerprint *fp) {
    if (fp) *fp = indexed_dataset_fingerprint(&loader->datasets[i], loader->has_mask[i] ? &loader->masks[i] : NULL);
    return loader->datasets[i].prefix;
}

int data_fingerprint_path(const char *prefix, DatasetFingerprint *fp, char *err, size_t errlen) {
    IndexedDataset ds, mask;
    if (indexed_dataset_open(&ds, prefix, err, errlen) != 0) return -1;
    const int has_mask = loss_mask_open(&mask, &ds, prefix, err, errlen);
    if (has_mask >= 0) *fp = indexed_dataset_fingerprint(&ds, has_mask == 1 ? &mask : NULL);
    if (has_mask == 1) indexed_dataset_close(&mask);
    indexed_dataset_close(&ds);
    return has_mask < 0 ? -1 : 0;
}

/* The dataset of loader sample `index` and the sample's index within that
 * dataset, before it wraps modulo the dataset's own count of samples. */
static int64_t blended_sample(const DataLoader *loader, int64_t index, int *dataset) {
    int64_t i = index % loader->num_samples;
    if (i < 0) i += loader->num_samples;
    if (!loader->blend.dataset) {
        *dataset = 0;
        return i;
    }
    int64_t in_dataset;
    *dataset = blend_index_get(&loader->blend, i, &in_dataset);
    return in_dataset;
}

/* The dataset and its GPT sample of loader sample `index`. */
static void locate_sample(const DataLoader *loader, int64_t index, int *dataset, int64_t *sample) {
    const int64_t j = blended_sample(loader, index, dataset);
    const GptSampleIndex *gi = &loader->indices[*dataset];
    *sample = gi->shuffle[j % gi->num_samples];
}

void data_loader_set_vocab(DataLoader *loader, int vocab_size) { loader->vocab_size = vocab_size; }

/* Whether each of the n values lies in [lowest, vocab_size): one unsigned compare each, no branch (the loop
 * vectorises). */
static bool all_in_range(const int32_t *values, long n, int32_t lowest, int vocab_size) {
    const uint32_t span = (uint32_t)vocab_size - (uint32_t)lowest;
    uint32_t outside = 0;
    for (long i = 0; i < n; i++) outside |= (uint32_t)values[i] - (uint32_t)lowest >= span;
    return !outside;
}

int data_loader_get(const DataLoader *loader, int64_t index, int32_t *out) {
    int d;
    int64_t sample;
    locate_sample(loader, index, &d, &sample);
    gpt_index_read_sample(&loader->indices[d], &loader->datasets[d], loader->seq_len, sample, out);
    return loader->vocab_size <= 0 || all_in_range(out, (long)loader->seq_len + 1, 0, loader->vocab_size) ? 0 : -1;
}

bool data_loader_has_mask(const DataLoader *loader) { return loader->any_mask; }

bool data_loader_packed(const DataLoader *loader) { return loader->packed; }

int data_loader_get_packed(const DataLoader *loader, int64_t index, int32_t *inputs, int32_t *targets,
                           int32_t *positions) {
    int d;
    const int64_t j = blended_sample(loader, index, &d); /* packed_rows_read wraps j modulo the dataset's rows */
    const bool raw_targets_ok = packed_rows_read(&loader->rows[d], &loader->datasets[d],
                                                 loader->has_mask[d] ? &loader->masks[d] : NULL, j, inputs, targets,
                                                 positions, loader->scratch);
    if (loader->vocab_size <= 0) return 0;
    const long n = loader->seq_len;
    return raw_targets_ok && all_in_range(inputs, n, 0, loader->vocab_size) &&
                   all_in_range(targets, n, -1, loader->vocab_size) ? 0 : -1;
}

void data_loader_get_mask(const DataLoader *loader, int64_t index, int32_t *out) {
    int d;
    int64_t sample;
    locate_sample(loader, index, &d, &sample);
    if (!loader->has_mask[d]) {
        for (int t = 0; t <= loader->seq_len; t++) out[t] = 1;
        return;
    }
    gpt_index_read_sample(&loader->indices[d], &loader->masks[d], loader->seq_len, sample, out);
}

/* Tokens [at, at + n) of sequence seq of ds inside [0, vocab_size): 0, or -1 with the error of the first one
 * outside, naming the dataset, the token, where it is and how to see the dataset's ids (every check of a
 * dataset's tokens against the model's vocabulary says this). */
static int check_tokens(const IndexedDataset *ds, int64_t seq, int64_t at, int64_t n, int vocab_size, char *err,
                        size_t errlen) {
    int32_t block[4096];
    for (int64_t done = 0; done < n;) {
        const int64_t count = n - done < 4096 ? n - done : 4096;
        indexed_dataset_read(ds, seq, at + done, count, block);
        for (int64_t i = 0; i < count; i++)
            if (block[i] < 0 || block[i] >= vocab_size) {
                mt_set_error(err, errlen, "%s: token %d (token %lld of sequence %lld) is outside the model's "
                             "vocabulary [0, %d): was the dataset built with another tokenizer than the model's? "
                             "(`megatrain data inspect %s --tokenizer MODEL_DIR` shows its ids)", ds->prefix,
                             block[i], (long long)(at + done + i), (long long)seq, vocab_size, ds->prefix);
                return -1;
            }
        done += count;
    }
    return 0;
}

int data_loader_check_vocab(const DataLoader *loader, int vocab_size, int64_t max_tokens, char *err, size_t errlen) {
    for (int d = 0; d < loader->num_datasets; d++) {
        const IndexedDataset *ds = &loader->datasets[d];
        /* a scan of the first tokens in order: read-ahead on for it (the loader reads at random, open_sources) */
        indexed_dataset_advise_sequential(ds, (size_t)max_tokens * (size_t)ds->token_size);
        int64_t seen = 0;
        int rc = 0;
        for (int64_t seq = 0; seq < ds->num_sequences && seen < max_tokens && rc == 0; seq++) {
            const int64_t len = indexed_length(ds, seq);
            const int64_t n = len < max_tokens - seen ? len : max_tokens - seen;
            rc = check_tokens(ds, seq, 0, n, vocab_size, err, errlen);
            seen += n;
        }
        indexed_dataset_advise_random(ds);
        if (rc != 0) return -1;
    }
    return 0;
}

/* What check_piece needs: the dataset and the vocabulary, and where the message goes. */
typedef struct PieceCheck {
    const IndexedDataset *ds;
    int vocab_size;
    char *err;
    size_t errlen;
} PieceCheck;

static int check_piece(void *arg, int64_t seq, int64_t offset, int64_t count) {
    const PieceCheck *c = arg;
    return check_tokens(c->ds, seq, offset, count, c->vocab_size, c->err, c->errlen);
}

/* The documents of packed sample j of dataset d, each as far as its row reads it. */
static int check_packed_row(const DataLoader *loader, int d, int64_t j, char *err, size_t errlen) {
    const PackedRows *rows = &loader->rows[d];
    int64_t first, end;
    packed_rows_documents(rows, j, &first, &end);
    for (int64_t k = first; k < end; k++) {
        const int64_t seq = rows->docs[k];
        const int64_t n = packed_document_tokens(rows, &loader->datasets[d], seq);
        if (check_tokens(&loader->datasets[d], seq, 0, n, loader->vocab_size, err, errlen) != 0) return -1;
    }
    return 0;
}

int data_loader_check_sample(const DataLoader *loader, int64_t index, char *err, size_t errlen) {
    if (loader->vocab_size <= 0) return 0;
    int d;
    if (loader->packed) {
        const int64_t j = blended_sample(loader, index, &d);
        return check_packed_row(loader, d, j, err, errlen);
    }
    int64_t sample;
    locate_sample(loader, index, &d, &sample);
    PieceCheck check = {&loader->datasets[d], loader->vocab_size, err, errlen};
    return gpt_index_visit_sample(&loader->indices[d], &loader->datasets[d], loader->seq_len, sample, check_piece,
                                  &check);
}

void data_loader_free(DataLoader *loader) {
    if (!loader) return;
    for (int d = 0; d < loader->num_datasets; d++) {
        gpt_index_free(&loader->indices[d]);
        indexed_dataset_close(&loader->datasets[d]);
        if (loader->has_mask[d]) indexed_dataset_close(&loader->masks[d]);
        packed_rows_free(&loader->rows[d]);
    }
    free(loader->scratch);
    blend_index_free(&loader->blend);
    free(loader);
}
