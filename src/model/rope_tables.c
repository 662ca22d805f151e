/* rope_tables.c: the RoPE cos/sin tables (T, D/2), computed the way Hugging
 * Face transformers computes them so that parity checks hold to fp32 rounding.
 *
 * transformers works in float32 throughout:
 *   inv_freq[i] = 1 / theta^(float(2i) / D)                 (float32)
 *   llama3 scaling (_compute_llama3_parameters), in float32:
 *     wavelen = 2 pi / inv_freq
 *     wavelen > original / low_freq_factor  -> inv_freq / factor      (low band)
 *     wavelen < original / high_freq_factor -> inv_freq               (high band)
 *     otherwise smooth = (original / wavelen - low) / (high - low),
 *               inv_freq = (1 - smooth) * inv_freq / factor + smooth * inv_freq
 *   angle[t,i] = float32(t * inv_freq[i]); cos/sin in float32 of that angle.
 * (torch evaluates `scalar / tensor` as reciprocal(tensor) * scalar, and so
 * do we.) We reproduce each float32 step (each rounding where transformers rounds);
 * transcendental functions (pow, cos, sin) are evaluated in double and rounded
 * once to float, i.e. correctly rounded, which is what torch's float32 kernels
 * approximate to within an ulp. A table computed fully in double would differ
 * from transformers by up to about t * 2^-24 radians at position t.
 */
#include <math.h>
#include <stdlib.h>

#include "rope_tables.h"

#include "../core/error.h"

static float llama3_scale(float inv_freq, const RopeScaling *scaling) {
    /* Python scalars meet float32 tensors: torch casts each scalar to float,
     * and `scalar / tensor` is evaluated as reciprocal(tensor) * scalar. */
    float factor = (float)scaling->factor;
    float low_freq_factor = (float)scaling->low_freq_factor;
    float original = (float)scaling->original_max_position_embeddings;
    float low_freq_wavelen = (float)(scaling->original_max_position_embeddings / scaling->low_freq_factor);
    float high_freq_wavelen = (float)(scaling->original_max_position_embeddings / scaling->high_freq_factor);
    float band_width = (float)(scaling->high_freq_factor - scaling->low_freq_factor);

    float wavelen = (1.0f / inv_freq) * (float)(2.0 * M_PI);
    if (wavelen > low_freq_wavelen) return inv_freq / factor;
    if (wavelen < high_freq_wavelen) return inv_freq;
    float smooth = ((1.0f / wavelen) * original - low_freq_factor) / band_width;
    return (1.0f - smooth) * inv_freq / factor + smooth * inv_freq;
}

void rope_tables_init(float *cos_table, float *sin_table, int T, int D, double theta,
                      const RopeScaling *scaling) {
    int half = D / 2;
    float *inv_freq = mt_malloc((size_t)(half > 0 ? half : 1) * sizeof(float));
    for (int i = 0; i < half; i++) {
        float exponent = (float)(2 * i) / (float)D;
        float base_pow = (float)pow((double)(float)theta, (double)exponent);
        inv_freq[i] = 1.0f / base_pow;
        if (scaling != NULL && scaling->enabled) inv_freq[i] = llama3_scale(inv_freq[i], scaling);
    }
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            float angle = (float)t * inv_freq[i];
            cos_table[(size_t)t * half + i] = (float)cos((double)angle);
            sin_table[(size_t)t * half + i] = (float)sin((double)angle);
        }
    }
    free(inv_freq);
}
