/* fp8_scaling.h: the scale an FP8 cast multiplies a tensor by (placeholder
 * of the scaling state machine: replaced by the full module). */
#ifndef MT_MODEL_FP8_SCALING_H
#define MT_MODEL_FP8_SCALING_H

/* Transformer Engine's _default_sf_compute: (fmax / amax) / 2^margin,
 * keeping `previous` where amax is 0 or not finite, fp32's largest value
 * where the result overflows. */
float fp8_scale_from_amax(float amax, float fmax, int margin, float previous);

#endif
