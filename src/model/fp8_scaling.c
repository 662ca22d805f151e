/* fp8_scaling.c: the FP8 scale from an amax and the delayed-scaling amax
 * history of one tensor, in Transformer Engine's order (the math and the
 * sources are in fp8_scaling.h). */
#include "fp8_scaling.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"

float fp8_scale_from_amax(float amax, float fmax, int margin, float previous) {
    float sf = (fmax / amax) / ldexpf(1.0f, margin); /* fp32, as TE's (fp8_max / amax) / (2**margin) */
    if (!(amax > 0.0f) || !isfinite(amax)) sf = previous; /* torch.where(amax > 0.0, ...), isfinite(amax) */
    if (isinf(sf)) sf = FLT_MAX;                          /* torch.where(isinf(sf), _fp32_max, sf) */
    return sf;
}

void fp8_history_init(Fp8History *h, int len) {
    if (len < 1) mt_die(MT_EXIT_FAILURE, "fp8: an amax history needs a length >= 1, got %d", len);
    h->amax = mt_calloc((size_t)len, sizeof *h->amax);
    h->len = len;
    h->scale = 1.0f;
}

void fp8_history_free(Fp8History *h) {
    free(h->amax);
    h->amax = NULL;
    h->len = 0;
}

/* torch.max over the history: NaN as soon as one amax is NaN */
static float history_max(const Fp8History *h) {
    float a = h->amax[0];
    for (int i = 1; i < h->len && !isnan(a); i++)
        if (isnan(h->amax[i]) || h->amax[i] > a) a = h->amax[i];
    return a;
}

void fp8_history_update(Fp8History *h, float amax, const Fp8Config *cfg, float fmax) {
    h->amax[0] = amax; /* the cast wrote it: the quantizer's amax is amax_history[0] */
    const float a = cfg->amax_compute_algo == FP8_AMAX_MAX ? history_max(h) : h->amax[0];
    /* _update_amax_history: torch.roll(history, -1), then history[0] = 0 */
    const float newest = h->amax[0];
    memmove(h->amax, h->amax + 1, (size_t)(h->len - 1) * sizeof *h->amax);
    h->amax[h->len - 1] = newest;
    h->amax[0] = 0.0f;
    h->scale = fp8_scale_from_amax(a, fmax, cfg->margin, h->scale);
}
