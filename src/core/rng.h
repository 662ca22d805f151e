/* rng.h: the deterministic random number generator used everywhere.
 *
 * xoshiro256** seeded through splitmix64. Its whole state is four u64 words,
 * so it can be saved in a checkpoint and restored bit for bit.
 */
#ifndef MT_CORE_RNG_H
#define MT_CORE_RNG_H

#include <stdint.h>

typedef struct Rng {
    uint64_t s[4];
} Rng;

void rng_seed(Rng *rng, uint64_t seed);
uint64_t rng_next_u64(Rng *rng);
/* Uniform in [0, 1) with 53 random bits. */
double rng_uniform(Rng *rng);
/* Uniform integer in [0, n) without modulo bias; n > 0. */
uint64_t rng_below(Rng *rng, uint64_t n);
/* Standard normal (Box-Muller, one value per call, deterministic). */
double rng_normal(Rng *rng);
/* Fisher-Yates shuffle of an int64 array. */
void rng_shuffle_i64(Rng *rng, int64_t *a, int64_t n);

#endif
