/* philox.h — Philox4x32-10, the counter-based random number generator of the sampler.
 *
 * Philox (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3", SC11) maps a
 * 128-bit counter and a 64-bit key to 128 random bits through 10 rounds of multiply-and-xor. It has
 * no state: the output is a pure function of (counter, key). The sampler keys it with the request's
 * seed and counts with the request's decode step, so a seeded request draws the same numbers no
 * matter which other requests, threads or batch shapes share the engine.
 *
 * Counter layout used by mk_philox_uniform: ctr = {step lo, step hi, stream, 0}, key = {seed lo,
 * seed hi}. `stream` separates independent uses within one step (the sampler uses stream 0).
 * Checked against the Random123 known-answer vectors in tests/unit/test_sampler.c.
 */
#ifndef MK_ENGINE_PHILOX_H
#define MK_ENGINE_PHILOX_H

#include <stdint.h>

/* One Philox4x32-10 block: out = philox(ctr, key). */
void mk_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

/* A uniform double in [0, 1) with 53 random bits, drawn from the block at counter
 * {step, stream} under key seed. Same arguments, same value, on every machine. */
double mk_philox_uniform(uint64_t seed, uint64_t step, uint32_t stream);
/* Those 53 bits as an integer: mk_philox_uniform = mk_philox_u53 / 2^53. */
uint64_t mk_philox_u53(uint64_t seed, uint64_t step, uint32_t stream);

#endif
