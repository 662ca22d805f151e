/* recipe_names.c: enum spellings, token counts ("2.4B") and the data
 * parallel size of a layout. */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "recipe_schema.h"

const char *model_family_name(ModelFamily family) {
    return family >= FAMILY_LLAMA && family <= FAMILY_QWEN3_MOE ? family_names[family] : "unknown";
}

const char *lr_decay_name(LrDecay decay) {
    return decay >= DECAY_CONSTANT && decay <= DECAY_WSD ? decay_names[decay] : "unknown";
}

const char *wsd_decay_style_name(WsdDecayStyle style) {
    return style >= WSD_EXPONENTIAL && style <= WSD_MINUS_SQRT ? wsd_style_names[style] : "unknown";
}

const char *weight_decay_style_name(WeightDecayStyle style) {
    return style >= WD_CONSTANT && style <= WD_COSINE ? weight_decay_style_names[style] : "unknown";
}

const char *dtype_name(DType dtype) {
    return dtype >= DTYPE_FP32 && dtype <= DTYPE_FP8 ? precision_names[dtype] : "unknown";
}

const char *loss_reduction_name(LossReduction loss) {
    return loss == LOSS_PER_MICRO_BATCH || loss == LOSS_PER_TOKEN ? loss_reduction_names[loss] : "unknown";
}

const char *pack_overlong_name(PackOverlong overlong) {
    return overlong == PACK_OVERLONG_ERROR || overlong == PACK_OVERLONG_TRUNCATE ? pack_overlong_names[overlong]
                                                                                  : "unknown";
}

/* The index of `text` in a NULL-terminated list of names, or -1. */
static int name_index(const char *const *names, const char *text) {
    for (int i = 0; text && names[i]; i++)
        if (strcmp(names[i], text) == 0) return i;
    return -1;
}

int loss_reduction_parse(const char *text, LossReduction *out) {
    const int i = name_index(loss_reduction_names, text);
    if (i >= 0) *out = (LossReduction)i;
    return i >= 0 ? 0 : -1;
}

int pack_overlong_parse(const char *text, PackOverlong *out) {
    const int i = name_index(pack_overlong_names, text);
    if (i >= 0) *out = (PackOverlong)i;
    return i >= 0 ? 0 : -1;
}

const char *lora_target_name(LoraTarget target) {
    return target >= LORA_Q && target < LORA_NUM_TARGETS ? lora_target_names[target] : "unknown";
}

/* A target_modules entry as PEFT matches it (a module whose name is the entry, or ends with "." and the entry)
 * against a decoder's projections, model.layers.L.self_attn.{q,k,v,o}_proj and model.layers.L.mlp.{gate,up,down}_proj:
 * the projection, and the layer when the entry names one (*layer -1: every layer). -1 when it names no projection. */
int lora_target_match(const char *entry, LoraTarget *target, long *layer) {
    const char *parts[6];
    size_t lens[6];
    int n = 0;
    for (const char *p = entry;; n++) {
        const char *dot = strchr(p, '.');
        if (n == 5) return -1; /* more components than model.layers.L.BLOCK.NAME */
        parts[n] = p;
        lens[n] = dot ? (size_t)(dot - p) : strlen(p);
        if (lens[n] == 0) return -1;
        if (!dot) break;
        p = dot + 1;
    }
    n++;
    int t = 0;
    while (t < LORA_NUM_TARGETS && (strlen(lora_target_name((LoraTarget)t)) != lens[n - 1] ||
                                    strncmp(parts[n - 1], lora_target_name((LoraTarget)t), lens[n - 1]) != 0))
        t++;
    if (t == LORA_NUM_TARGETS) return -1;
    const char *block = t <= LORA_O ? "self_attn" : "mlp"; /* the template, from its end: NAME, BLOCK, L, layers, model */
    if (n >= 2 && (lens[n - 2] != strlen(block) || strncmp(parts[n - 2], block, lens[n - 2]) != 0)) return -1;
    *layer = -1;
    if (n >= 3) {
        if (lens[n - 3] > 6 || strspn(parts[n - 3], "0123456789") < lens[n - 3] ||
            (lens[n - 3] > 1 && parts[n - 3][0] == '0')) /* a module's name is its index: "01" names none */
            return -1;
        *layer = strtol(parts[n - 3], NULL, 10);
    }
    if (n >= 4 && (lens[n - 4] != 6 || strncmp(parts[n - 4], "layers", 6) != 0)) return -1;
    if (n >= 5 && (lens[n - 5] != 5 || strncmp(parts[n - 5], "model", 5) != 0)) return -1;
    *target = (LoraTarget)t;
    return 0;
}

bool lora_targets(const PeftConfig *peft, LoraTarget target) {
    return peft->type == PEFT_LORA && target >= LORA_Q && target < LORA_NUM_TARGETS && (peft->targets >> target & 1u);
}

const char *lora_moe_refusal(const ModelConfig *m) {
    if (m->peft.type != PEFT_LORA || !model_family_is_moe(m->family)) return NULL;
    if (lora_targets(&m->peft, LORA_GATE) || lora_targets(&m->peft, LORA_UP) || lora_targets(&m->peft, LORA_DOWN))
        return "LoRA on a mixture-of-experts model adapts the attention projections only (target_modules q_proj, "
               "k_proj, v_proj, o_proj): the routed experts have no adapters";
    if (m->moe.load_balancing == LB_EXPERT_BIAS)
        return "LoRA on a mixture-of-experts model with load_balancing expert_bias: the expert biases would move in "
               "the frozen base, which LoRA's checkpoints do not store; choose another balancing";
    return NULL;
}

int parse_token_count(const char *text, double *out) {
    if (!text) return -1;
    while (isspace((unsigned char)*text)) text++;
    char *end;
    double value = strtod(text, &end);
    if (end == text || !isfinite(value) || value < 0) return -1;
    double scale = 1;
    switch (*end) {
    case 'K': case 'k': scale = 1e3; end++; break;
    case 'M': case 'm': scale = 1e6; end++; break;
    case 'B': case 'b': case 'G': case 'g': scale = 1e9; end++; break;
    case 'T': case 't': scale = 1e12; end++; break;
    default: break;
    }
    while (isspace((unsigned char)*end)) end++;
    if (*end != '\0') return -1;
    value = round(value * scale);
    if (!isfinite(value)) return -1;
    *out = value;
    return 0;
}

int recipe_smallest_world(const Recipe *recipe) {
    const ParallelConfig *p = &recipe->parallel;
    return p->tp * p->cp * p->pp * (p->ep > 1 ? p->ep : 1);
}

int recipe_dp_size(const Recipe *recipe, int world_size) {
    long model_parallel = (long)recipe->parallel.tp * recipe->parallel.pp * recipe->parallel.cp;
    if (model_parallel <= 0 || world_size <= 0 || world_size % model_parallel != 0) return 0;
    return (int)(world_size / model_parallel);
}
