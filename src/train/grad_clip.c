/* grad_clip.c: the factor that clips gradients to a maximum global norm. */
#include "grad_clip.h"

double grad_clip_scale(double grad_norm, double clip_grad) {
    if (!(clip_grad > 0.0)) return 1.0;
    double scale = clip_grad / (grad_norm + 1e-6);
    return scale < 1.0 ? scale : 1.0;
}
