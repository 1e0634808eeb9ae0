/* philox.c — Philox4x32-10 (see philox.h), written from the SC11 paper's description.
 *
 * One round: the two 32x32->64 products of counter words 0 and 2 with the multipliers M0, M1 are
 * split into hi/lo halves; the his are xored with the other two counter words and the key, and the
 * four words are permuted. Between rounds the key is bumped by the Weyl constants W0, W1 (the golden
 * ratio and sqrt(3)-1 in 32-bit fixed point). Ten rounds is the variant with the published
 * known-answer vectors and the one cuRAND and PyTorch use.
 */
#include "engine/philox.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void mk_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int r = 0; r < 10; r++) {
        if (r > 0) { /* key schedule: bump before every round but the first */
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
        uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

uint64_t mk_philox_u53(uint64_t seed, uint64_t step, uint32_t stream) {
    const uint32_t ctr[4] = {(uint32_t)step, (uint32_t)(step >> 32), stream, 0};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t o[4];
    mk_philox4x32_10(ctr, key, o);
    /* 32 bits of word 0 and the top 21 of word 1 */
    return ((uint64_t)o[0] << 21) | (o[1] >> 11);
}

double mk_philox_uniform(uint64_t seed, uint64_t step, uint32_t stream) {
    /* 53 bits: exactly representable, < 1 */
    return (double)mk_philox_u53(seed, step, stream) * (1.0 / 9007199254740992.0); /* 2^-53 */
}
