/* grad_clip.h: the factor that clips gradients to a maximum global norm. */
#ifndef MT_TRAIN_GRAD_CLIP_H
#define MT_TRAIN_GRAD_CLIP_H

/* min(1, clip_grad / (grad_norm + 1e-6)) as torch's clip_grad_norm_ and
 * Megatron do; 1 when clip_grad <= 0 (clipping off). */
double grad_clip_scale(double grad_norm, double clip_grad);

#endif
