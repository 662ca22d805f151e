/* fp8_scaling.h: the scales of the FP8 casts (docs/fp8.md), as Transformer
 * Engine computes them for its tensorwise (current) and delayed scaling.
 *
 *   cast:      q = fp8(x * scale)                  fp8_quantize (core/fp8.h): RNE, saturating
 *   product:   a . b = (q_a . q_b) / (scale_a * scale_b)
 *   scale:     sf = (fmax / amax) / 2^margin        fmax: 448 (E4M3), 57344 (E5M2)
 *              sf = previous   where amax <= 0, inf or NaN (nothing to scale by)
 *              sf = FLT_MAX    where sf is inf (amax so tiny that fmax / amax overflows)
 *
 *   tensorwise: amax = max |x| of the tensor itself, just before its cast,
 *     and previous = 1: TE's compute_scale_from_amax
 *     (transformer_engine/common/recipe/recipe_common.cuh) with
 *     Float8CurrentScaling's defaults (amax_epsilon 0, no power-of-2 scales;
 *     it has no margin: pass 0).
 *
 *   delayed: a tensor keeps scale (1 at first) and a history h[0..len-1]
 *     (zeros at first). A cast uses the scale as it is and records its amax
 *     in h[0]. Then, once per optimizer step (TE: after each forward and
 *     backward), with the amax reduced over the ranks sharing the tensor:
 *       a     = max_i h[i]   (amax_compute_algo max; NaN if one is NaN, which
 *                             fp8_amax never records)
 *             | h[0]         (most_recent)
 *       h     = roll(h, -1): h[i] = h[i+1], h[len-1] = the old h[0]; then h[0] = 0
 *       scale = sf(a, previous = scale)
 *     So the scale of cast t+1 comes from amax_t (most_recent) or from the
 *     largest of the len latest amaxes amax_{t-len+1} .. amax_t (max, zeros
 *     before the first len); after the update h[len-1] = amax_t,
 *     h[len-2] = amax_{t-1}, ..., h[1] = amax_{t-len+2}, and h[0] = 0.
 *
 * The order is TE's PyTorch reference (transformer_engine/pytorch/quantization.py,
 * fp8.py re-exports it): _amax_and_scale_update = _compute_amax_and_update_history
 * (_default_get_amax_and_update_history: torch.max over the history or
 * history[0], then _update_amax_history: torch.roll(-1), history[0] = 0) and
 * then _default_sf_compute. The quantizer's amax is amax_history[0]
 * (DelayedScalingRecipeState.make_quantizers), which the cast writes;
 * FP8GlobalStateManager.reduce_and_update_fp8_tensors reduces it (MAX over
 * the amax reduction group) and updates, at autocast_exit for the forward
 * and at the end of the first module's backward for the gradients.
 *
 * TE's default path runs the same update fused on the GPU
 * (kernel_bulk in transformer_engine/common/recipe/delayed_scaling.cu;
 * NVTE_UNFUSED_FP8_UPDATE=1 selects the reference above). It differs only
 * where an amax is 0 or NaN, or fmax / amax overflows: a recorded amax of 0
 * leaves both history and scale as they are; fmaxf skips NaNs in the max; the
 * scale is (fmax * 2^-margin) / amax. These functions follow the reference.
 */
#ifndef MT_MODEL_FP8_SCALING_H
#define MT_MODEL_FP8_SCALING_H

#include "../config/recipe.h"

/* The scale a cast multiplies by (fp8 = cast(x * scale); the product divides by it): Transformer
 * Engine's _default_sf_compute: (fmax / amax) / 2^margin, keeping `previous` where amax is 0 or not
 * finite; FLT_MAX where the result is not finite (amax so small that fmax / amax overflows). */
float fp8_scale_from_amax(float amax, float fmax, int margin, float previous);

/* delayed scaling of one tensor */
typedef struct Fp8History {
    float *amax; /* len amaxes: amax[0] the current cast's slot (0 after an update), then oldest to newest */
    int len;
    float scale; /* the scale the next cast uses */
} Fp8History;

void fp8_history_init(Fp8History *h, int len); /* amaxes 0, scale 1 (TE's initial state); len >= 1 */
void fp8_history_free(Fp8History *h);

/* Record the amax of the cast that used h->scale, then update as TE does after a forward/backward:
 * the history's max (or most recent) gives the new scale, then the history rolls. `amax` is the
 * largest |x| the tensor's casts saw since the last update, reduced over the ranks sharing it. */
void fp8_history_update(Fp8History *h, float amax, const Fp8Config *cfg, float fmax);

#endif
