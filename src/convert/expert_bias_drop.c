/* expert_bias_drop.c: what `convert --drop-expert-bias` changes
 * (expert_bias_drop.h), measured from the checkpoint alone.
 *
 * A checkpoint holds no hidden state of any text, so the routers are probed
 * with the token embeddings: up to EXPERT_BIAS_PROBES ids (every id of a
 * smaller vocabulary, else ids evenly spaced over it; an all-zero row, such
 * as a padding row of the vocabulary, is left out: its scores all tie). Each
 * MoE layer's router takes them as moe_layer.c takes its input: the RMS norm
 * with the layer's mlp_norm weight (as cpu_rmsnorm_forward), the fp32 logits
 * by the backend's matmul, then the routing's own scores and top-k
 * (moe_router_scores, moe_top_k: ties to the lower expert). Its top-k with
 * and without the biases are compared, probe by probe: a choice changes
 * when an expert of one set is missing from the other. At layer 0 the embedding is the
 * layer's input but for attention's output; deeper, the hidden state has
 * moved further from it, so the share says how far the biases reach into the
 * routers' choices, not what a text will see: the message says what was
 * probed. Beside it, each layer's bias spread (max - min: a bias every expert
 * shares changes no choice) against the mean score 1/E (softmax scores sum
 * to 1), which needs no probe. Sigmoid routers are not exportable
 * (hf_config_write.c), so the scores are softmax's. */
#include "expert_bias_drop.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../backend/backend.h"
#include "../core/error.h"
#include "../model/moe_layer.h"

static int find_param(const ParamInfo *infos, int num_params, const char *name) {
    for (int i = 0; i < num_params; i++)
        if (!strcmp(infos[i].name, name)) return i;
    return -1;
}

/* Parameter `name` (whole: the registry is the whole model's) into dst. 0, or -1 with err. */
static int read_param(CkptParams *from, const ParamInfo *infos, int num_params, const char *name, float *dst,
                      char *err, size_t errlen) {
    const int p = find_param(infos, num_params, name);
    if (p < 0) {
        mt_set_error(err, errlen, "the model has no parameter %s", name);
        return -1;
    }
    int64_t start[3] = {0, 0, 0}, shape[3] = {1, 1, 1};
    for (int d = 0; d < infos[p].ndim; d++) shape[d] = infos[p].shape[d];
    return ckpt_params_read(from, p, start, shape, dst, err, errlen);
}

typedef struct LayerEffect {
    int layer;
    double spread;      /* max - min of its biases */
    long changed;       /* top-k choices that differ without the biases, over the probes */
    long probes_moved;  /* probes with at least one such choice */
} LayerEffect;

/* The probes: their ids into ids and their embedding rows, divided by their RMS (as cpu_rmsnorm_forward, before
 * the weight), into x (count x C); returns the count (zero rows left out), or -1 with err. */
static int read_probes(CkptParams *from, const ModelConfig *cfg, const ParamInfo *infos, int num_params, float *x,
                       char *err, size_t errlen) {
    const long V = cfg->vocab_size, C = cfg->hidden_size;
    const int embed = find_param(infos, num_params, "embed.weight");
    if (embed < 0) {
        mt_set_error(err, errlen, "the model has no parameter embed.weight");
        return -1;
    }
    const long wanted = V < EXPERT_BIAS_PROBES ? V : EXPERT_BIAS_PROBES;
    int count = 0;
    for (long i = 0; i < wanted; i++) {
        const int64_t start[2] = {i * V / wanted, 0}, shape[2] = {1, C}; /* ascending: each chunk decoded once */
        float *row = x + (size_t)count * C;
        if (ckpt_params_read(from, embed, start, shape, row, err, errlen) != 0) return -1;
        double sum_sq = 0.0;
        for (long c = 0; c < C; c++) sum_sq += (double)row[c] * row[c];
        if (sum_sq == 0.0) continue;
        const float r = (float)(1.0 / sqrt(sum_sq / C + (double)cfg->rms_norm_eps));
        for (long c = 0; c < C; c++) row[c] *= r;
        count++;
    }
    return count;
}

/* MoE layer l against the probes x (count x C, normalised): its effect; 0, or -1 with err. */
static int layer_effect(CkptParams *from, const ModelConfig *cfg, const ParamInfo *infos, int num_params, int l,
                        const float *x, int count, float *input, LayerEffect *out, char *err, size_t errlen) {
    const int C = cfg->hidden_size, E = cfg->moe.num_experts, k = cfg->moe.num_experts_per_tok;
    float *norm = mt_malloc((size_t)C * sizeof *norm), *router = mt_malloc((size_t)E * C * sizeof *router);
    float *bias = mt_malloc((size_t)E * sizeof *bias), *logits = mt_malloc((size_t)count * E * sizeof *logits + 1);
    float *scores = mt_malloc((size_t)count * E * sizeof *scores + 1);
    int32_t *with = mt_malloc((size_t)k * sizeof *with), *without = mt_malloc((size_t)k * sizeof *without);
    char name[96];
    int status = 0;
    snprintf(name, sizeof name, "layers.%d.mlp_norm.weight", l);
    status = read_param(from, infos, num_params, name, norm, err, errlen);
    snprintf(name, sizeof name, "layers.%d.mlp.router.weight", l);
    if (status == 0) status = read_param(from, infos, num_params, name, router, err, errlen);
    snprintf(name, sizeof name, "layers.%d.mlp.router.expert_bias", l);
    if (status == 0) status = read_param(from, infos, num_params, name, bias, err, errlen);
    *out = (LayerEffect){.layer = l};
    if (status == 0) {
        float lo = bias[0], hi = bias[0];
        for (int e = 1; e < E; e++) {
            lo = bias[e] < lo ? bias[e] : lo;
            hi = bias[e] > hi ? bias[e] : hi;
        }
        out->spread = (double)hi - (double)lo;
        for (long i = 0; i < (long)count * C; i++) input[i] = x[i] * norm[i % C];
        if (count > 0) {
            cpu_backend.matmul_forward(logits, input, router, NULL, count, C, E);
            moe_router_scores(&cfg->moe, logits, scores, count, E);
        }
        for (int n = 0; n < count; n++) {
            moe_top_k(scores + (size_t)n * E, bias, E, k, with);
            moe_top_k(scores + (size_t)n * E, NULL, E, k, without);
            int moved = 0;
            for (int j = 0; j < k; j++) {
                bool kept = false;
                for (int i = 0; i < k; i++) kept |= with[j] == without[i];
                moved += !kept;
            }
            out->changed += moved;
            out->probes_moved += moved > 0;
        }
    }
    free(without);
    free(with);
    free(scores);
    free(logits);
    free(bias);
    free(router);
    free(norm);
    return status;
}

int expert_bias_drop_say(const char *ckpt, const ModelConfig *cfg, CkptParams *from, const ParamInfo *infos,
                         int num_params, char *err, size_t errlen) {
    const long V = cfg->vocab_size, C = cfg->hidden_size;
    const int E = cfg->moe.num_experts, k = cfg->moe.num_experts_per_tok;
    const long wanted = V < EXPERT_BIAS_PROBES ? V : EXPERT_BIAS_PROBES;
    float *x = mt_malloc((size_t)wanted * C * sizeof *x), *input = mt_malloc((size_t)wanted * C * sizeof *input);
    LayerEffect *effects = mt_calloc((size_t)cfg->num_layers + 1, sizeof *effects);
    int num_moe = 0, status = 0;
    const int count = read_probes(from, cfg, infos, num_params, x, err, errlen);
    if (count < 0) status = -1;
    for (int l = 0; status == 0 && l < cfg->num_layers; l++)
        if (model_layer_is_moe(cfg, l))
            status = layer_effect(from, cfg, infos, num_params, l, x, count, input, &effects[num_moe++], err, errlen);
    if (status == 0 && num_moe > 0) {
        long changed = 0;
        int widest = 0, most = 0;
        for (int i = 0; i < num_moe; i++) {
            changed += effects[i].changed;
            if (effects[i].spread > effects[widest].spread) widest = i;
            if (effects[i].changed > effects[most].changed) most = i;
        }
        const double choices = (double)count * k; /* a layer's */
        char probes[160];
        if (count == wanted && wanted == V)
            snprintf(probes, sizeof probes, "the embeddings of all %d token ids", count);
        else
            snprintf(probes, sizeof probes, "the embeddings of %d token ids spread evenly over the vocabulary's "
                     "%ld", count, V);
        if (count < wanted) /* (all-zero rows: their scores tie) */
            snprintf(probes + strlen(probes), sizeof probes - strlen(probes), " (%ld all-zero rows left out)",
                     wanted - count);
        char share[200] = "";
        if (count > 0)
            snprintf(share, sizeof share, "%.1f%% of the top-%d choices change (%ld of %.0f; the most in layer %d: "
                     "%.1f%%)", 100.0 * changed / (choices * num_moe), k, changed, choices * num_moe,
                     effects[most].layer, 100.0 * effects[most].changed / choices);
        else
            snprintf(share, sizeof share, "no choice could be compared (every embedding row is zero)");
        mt_warn("--drop-expert-bias: %s's routers chose their experts with expert biases "
                "(model.moe.load_balancing: expert_bias), which the exported model has not: it routes some tokens "
                "to other experts than the trained model does. Probed with %s, each put through every MoE layer's "
                "router in place of the hidden state it would see (a stand-in: a checkpoint holds no hidden state, "
                "and on text the share may be higher or lower), %s; the biases span up to %.4g (layer %d), %.2f "
                "times the mean score 1/%d", ckpt, probes, share, effects[widest].spread, effects[widest].layer,
                effects[widest].spread * E, E);
        for (int i = 0; i < num_moe; i++) {
            const LayerEffect *f = &effects[i];
            fprintf(stderr, "convert: --drop-expert-bias: layer %d: biases span %.4g (%.2f times the mean score "
                    "1/%d); without them %ld of the %.0f top-%d choices change (%.1f%%), on %ld of the %d probes\n",
                    f->layer, f->spread, f->spread * E, E, f->changed, choices, k,
                    count > 0 ? 100.0 * f->changed / choices : 0.0, f->probes_moved, count);
        }
    }
    free(effects);
    free(input);
    free(x);
    return status;
}
