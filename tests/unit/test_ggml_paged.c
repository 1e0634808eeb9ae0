/* test_ggml_paged.c — the paged f16 dots (src/num/ggml_paged.c) give the bits of the contiguous
 * kernels (mk_gx_dot_f16_n) on the same rows, for every level (SIMD where the CPU has it, the
 * scalar emulation otherwise), both orders, block sizes 16/32/64, lengths with and without a
 * vec_dot tail, and blocks scattered in memory in a shuffled order; invalid shapes give NaN. */
#include <criterion/criterion.h>

#include "num/formats.h"
#include "num/ggml_paged.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float rnds(void) { return (float)(rnd() >> 40) * 0x1p-23f - 1.0f; }

Test(ggml_paged, equals_contiguous) {
    enum { ROWS = 8, MAXN = 640, MAXB = 64 };
    static uint16_t rows[ROWS][MAXN], y[MAXN];
    static uint16_t pool[MAXN / 16 + 2][ROWS * MAXB]; /* blocks, row-major [ROWS][L] inside */
    const mk_gx_isa isas[] = {MK_GX_SCALAR, MK_GX_AVX2, MK_GX_AVX512};
    const int lens[] = {16, 32, 64};
    const int ns[] = {16, 48, 64, 80, 128, 200, 256, 333, 640};
    for (int trial = 0; trial < 4; trial++) {
        for (int i = 0; i < ROWS; i++)
            for (int j = 0; j < MAXN; j++) rows[i][j] = mk_f32_to_f16(rnds() * (trial == 3 ? 1000.0f : 2.0f));
        for (int j = 0; j < MAXN; j++) y[j] = mk_f32_to_f16(rnds());
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3; b++) {
                const int L = lens[b], nblk = (MAXN + L - 1) / L;
                /* block k of the row lives in pool slot perm[k] (a shuffled table) */
                int perm[MAXN / 16 + 2];
                for (int k = 0; k < nblk; k++) perm[k] = k;
                for (int k = nblk - 1; k > 0; k--) {
                    int r = (int)(rnd() % (uint64_t)(k + 1)), t = perm[k];
                    perm[k] = perm[r];
                    perm[r] = t;
                }
                const uint16_t *seg[MAXN / 16 + 2];
                for (int k = 0; k < nblk; k++) {
                    for (int i = 0; i < ROWS; i++)
                        for (int j = 0; j < L; j++) {
                            int pos = k * L + j;
                            pool[perm[k]][i * L + j] = pos < MAXN ? rows[i][pos] : 0;
                        }
                    seg[k] = pool[perm[k]];
                }
                for (int c = 0; c < (int)(sizeof ns / sizeof *ns); c++)
                    for (int tb = 0; tb < 2; tb++) {
                        int n = ns[c];
                        if (tb && (isas[a] == MK_GX_SCALAR || n % (isas[a] == MK_GX_AVX512 ? 16 : 8))) continue;
                        float want[ROWS], got[ROWS];
                        mk_gx_dot_f16_n(isas[a], tb, n, rows[0], MAXN, ROWS, y, want);
                        mk_gx_dot_f16_paged(isas[a], tb, n, seg, L, (size_t)L, ROWS, y, got);
                        for (int i = 0; i < ROWS; i++)
                            cr_assert(mk_f32_bits(want[i]) == mk_f32_bits(got[i]),
                                      "isa %d tb %d L %d n %d row %d: paged %.9g, contiguous %.9g", isas[a], tb, L, n, i,
                                      got[i], want[i]);
                    }
            }
    }
}

Test(ggml_paged, invalid_shapes_give_nan) {
    static uint16_t blk[64 * 4], y[64];
    const uint16_t *seg[2] = {blk, blk};
    float out[2];
    mk_gx_dot_f16_paged(MK_GX_AVX512, 0, 64, seg, 24, 24, 2, y, out); /* 24 not a multiple of 16 */
    cr_assert(isnan(out[0]) && isnan(out[1]));
    mk_gx_dot_f16_paged(MK_GX_AVX2, 1, 36, seg, 32, 32, 2, y, out); /* tb with n % 8 != 0 */
    cr_assert(isnan(out[0]) && isnan(out[1]));
    mk_gx_dot_f16_paged(MK_GX_SCALAR, 1, 32, seg, 32, 32, 2, y, out); /* no tinyBLAS without SIMD */
    cr_assert(isnan(out[0]) && isnan(out[1]));
}
