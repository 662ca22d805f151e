/* model_partition.c: what a ModelPartition may cut (divisibility, with the
 * recipe key named) and the positions of a context-parallel rank. */
#include "../core/error.h"
#include "model_internal.h"

ModelPartition model_partition_whole(const ModelConfig *cfg) {
    return (ModelPartition){.tp = 1, .cp = 1, .ep = 1, .etp = 1, .num_chunks = 1, .chunk_first = {0},
                            .chunk_layers = {cfg->num_layers}, .num_layers = cfg->num_layers, .has_embed = true,
                            .has_head = true};
}

static int divides(int parts, long size, const char *parts_key, const char *size_key, char *err, size_t errlen) {
    if (size % parts == 0) return 0;
    mt_set_error(err, errlen, "%s: %d does not divide %s (%ld)", parts_key, parts, size_key, size);
    return -1;
}

int model_partition_check(const ModelConfig *cfg, const ModelPartition *part, int seq_len, char *err,
                          size_t errlen) {
    const int tp = part->tp, cp = part->cp;
    if (tp < 1 || cp < 1 || part->tp_rank < 0 || part->tp_rank >= tp || part->cp_rank < 0 || part->cp_rank >= cp) {
        mt_set_error(err, errlen, "model partition: rank out of range (tp %d/%d, cp %d/%d)", part->tp_rank, tp,
                     part->cp_rank, cp);
        return -1;
    }
    if (part->num_chunks < 1 || part->num_chunks > MT_MAX_CHUNKS) {
        mt_set_error(err, errlen, "model partition: %d model chunks (1 to %d)", part->num_chunks, MT_MAX_CHUNKS);
        return -1;
    }
    int total = 0, next = 0;
    for (int v = 0; v < part->num_chunks; v++) {
        const int first = part->chunk_first[v], n = part->chunk_layers[v];
        if (first < next || n < 0 || first + n > cfg->num_layers) {
            mt_set_error(err, errlen, "model partition: chunk %d (layers [%d, %d)) is not inside the model's %d "
                         "layers after the chunk before it", v, first, first + n, cfg->num_layers);
            return -1;
        }
        next = first + n;
        total += n;
    }
    if (total != part->num_layers) {
        mt_set_error(err, errlen, "model partition: the chunks hold %d layers, num_layers says %d", total,
                     part->num_layers);
        return -1;
    }
    if (divides(tp, cfg->num_attention_heads, "parallel.tp", "model.num_attention_heads", err, errlen) ||
        divides(tp, cfg->num_key_value_heads, "parallel.tp", "model.num_key_value_heads", err, errlen) ||
        divides(tp, cfg->intermediate_size, "parallel.tp", "model.intermediate_size", err, errlen) ||
        divides(tp, cfg->vocab_size, "parallel.tp", "model.vocab_size", err, errlen))
        return -1;
    if (seq_len > 0 && cp > 1 && divides(2 * cp, seq_len, "2 x parallel.cp", "train.seq_len", err, errlen))
        return -1;
    if (part->ep < 1 || part->ep_rank < 0 || part->ep_rank >= part->ep) {
        mt_set_error(err, errlen, "model partition: ep rank %d of %d", part->ep_rank, part->ep);
        return -1;
    }
    const bool moe = model_family_is_moe(cfg->family);
    if (part->ep > 1 && (!moe || divides(part->ep, cfg->moe.num_experts, "parallel.ep", "model.moe.num_experts", err,
                                         errlen)))
        return moe ? -1 : (mt_set_error(err, errlen, "parallel.ep: expert parallel needs a MoE family"), -1);
    if (part->etp != 1 && part->etp != tp) {
        mt_set_error(err, errlen, "parallel.etp: %d: expert tensor parallel splits the experts over the tp group: "
                     "expected 1 or tp (%d)", part->etp, tp);
        return -1;
    }
    if (moe && part->etp > 1 &&
        (divides(part->etp, cfg->moe.moe_intermediate_size, "parallel.etp", "model.moe.moe_intermediate_size", err,
                 errlen) ||
         divides(part->etp, cfg->moe.shared_expert_intermediate_size, "parallel.etp",
                 "model.moe.shared_expert_intermediate_size", err, errlen)))
        return -1;
    if (seq_len > 0 && part->sequence_parallel && divides(tp, seq_len / cp, "parallel.tp", "train.seq_len / cp (sequence_parallel)",
                                           err, errlen))
        return -1;
    return 0;
}

int model_local_layer(const ModelPartition *part, int layer) {
    int local = 0;
    for (int v = 0; v < part->num_chunks; v++) {
        const int first = part->chunk_first[v];
        if (layer >= first && layer < first + part->chunk_layers[v]) return local + layer - first;
        local += part->chunk_layers[v];
    }
    return -1;
}

void model_cp_positions(int T, int cp, int cp_rank, int32_t *positions) {
    const int half = T / 2;
    for (int t = 0; t < half; t++) {
        positions[t] = cp_rank * half + t;
        positions[half + t] = (2 * cp - 1 - cp_rank) * half + t;
    }
    if (cp == 1)
        for (int t = 0; t < T; t++) positions[t] = t; /* also for an odd T */
}
