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

bool lora_targets(const PeftConfig *peft, LoraTarget target) {
    return peft->type == PEFT_LORA && target >= LORA_Q && target < LORA_NUM_TARGETS && (peft->targets >> target & 1u);
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
