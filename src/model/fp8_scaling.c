/* fp8_scaling.c: fp8_scaling.h. */
#include "fp8_scaling.h"

#include <float.h>
#include <math.h>

float fp8_scale_from_amax(float amax, float fmax, int margin, float previous) {
    if (!(amax > 0.0f) || !isfinite(amax)) return previous;
    const float scale = (fmax / amax) / ldexpf(1.0f, margin);
    return isinf(scale) ? FLT_MAX : scale;
}
