/* test_ggml_multirow.c — the multi-row matmul kernels of src/num/ggml_quant.c (AVX-512 VNNI tiles
 * for Q4_1 and Q8_0 weights, used for products of 2+ activation rows) against the one-row kernels
 * they must equal bit for bit (each output is still one dot in llama.cpp's order):
 *
 *   1. random weight blocks (random halves for d / m, every byte value for the quants, Q8_0's -128
 *      included) and activations of mixed magnitudes, for row counts around the tile sizes (pairs
 *      of rows, tiles of 8, odd counts with a padded last row) and weight row counts that leave
 *      tails of the 4-row tiles: mk_ggml_matmul == mk_ggml_matmul_ex(MK_GGML_MM_NO_VNNI) == one
 *      mk_ggml_vec_dot per output, with and without a thread pool;
 *   2. the scratch size covers the repacked activations (the buffer is guarded at its end);
 *   3. mk_ggml_matmul_n (several matrices, one input) equals one mk_ggml_matmul per matrix, for one
 *      row and many, both kernel sets.
 *
 * Where the CPU has no AVX-512 VNNI both sides run the one-row kernels (the test then only checks
 * the dispatch) and a warning says so.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>

#include "base/threads.h"
#include "num/formats.h"
#include "num/ggml_quant.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float rndf(void) { return (float)(rnd() >> 40) * 0x1p-23f - 1.0f; } /* [-1, 1) */

/* n random rows of k elements in `type` (Q4_1: d, m, qs[16]; Q8_0: d, qs[32]) */
static uint8_t *random_weights(uint32_t type, int n, int k) {
    size_t rb = mk_ggml_row_bytes(type, k);
    uint8_t *w = malloc(rb * (size_t)n);
    cr_assert(w);
    const int bb = (int)mk_ggml_block_bytes(type), nb = n * (k / 32);
    for (int b = 0; b < nb; b++) {
        uint8_t *p = w + (size_t)b * bb;
        uint16_t d = mk_f32_to_f16(rndf() * 0.05f), m = mk_f32_to_f16(rndf() * 0.2f);
        memcpy(p, &d, 2);
        if (type == MK_GGML_Q4_1) {
            memcpy(p + 2, &m, 2);
            for (int i = 4; i < 20; i++) p[i] = (uint8_t)rnd();
        } else {
            for (int i = 2; i < 34; i++) p[i] = (uint8_t)rnd();
        }
    }
    return w;
}

static void check(mk_pool *pool, uint32_t type, int n, int k, int m) {
    uint8_t *w = random_weights(type, n, k);
    float *x = malloc(sizeof(float) * (size_t)m * k);
    cr_assert(x);
    for (int r = 0; r < m; r++) {
        float scale = (r % 3 == 0) ? 0.01f : (r % 3 == 1) ? 1.0f : 30.0f;
        for (int i = 0; i < k; i++) x[(size_t)r * k + i] = rndf() * scale;
    }
    if (m > 2) for (int i = 0; i < k; i++) x[(size_t)(m - 1) * k + i] = 0.0f; /* an all-zero row */
    size_t sb = mk_ggml_matmul_scratch(type, m, k);
    cr_assert(sb > 0);
    uint8_t *scr = malloc(sb + 64);
    cr_assert(scr);
    memset(scr + sb, 0xa5, 64);
    float *y1 = malloc(sizeof(float) * (size_t)m * n), *y2 = malloc(sizeof(float) * (size_t)m * n);
    cr_assert(y1 && y2);
    mk_ggml_matmul(pool, type, w, n, k, x, m, y1, scr);
    for (int i = 0; i < 64; i++) cr_assert_eq(scr[sb + i], 0xa5, "scratch overrun (type %u, m %d, k %d)", type, m, k);
    mk_ggml_matmul_ex(pool, type, w, n, k, x, m, y2, scr, MK_GGML_MM_NO_VNNI);
    size_t ab = mk_ggml_act_bytes(type, k), rb = mk_ggml_row_bytes(type, k);
    uint8_t *act = malloc(ab);
    cr_assert(act);
    for (int r = 0; r < m; r++) {
        mk_ggml_quant_act(type, x + (size_t)r * k, k, act);
        for (int j = 0; j < n; j++) {
            float want = mk_ggml_vec_dot(type, k, w + (size_t)j * rb, act);
            float a = y1[(size_t)r * n + j], b = y2[(size_t)r * n + j];
            cr_assert(mk_f32_bits(a) == mk_f32_bits(want), "%s n %d k %d m %d: y[%d][%d] = %.9g (multi-row), vec_dot %.9g",
                      mk_ggml_type_name(type), n, k, m, r, j, a, want);
            cr_assert(mk_f32_bits(b) == mk_f32_bits(want), "%s n %d k %d m %d: y[%d][%d] = %.9g (one-row), vec_dot %.9g",
                      mk_ggml_type_name(type), n, k, m, r, j, b, want);
        }
    }
    free(act);
    free(y1);
    free(y2);
    free(scr);
    free(x);
    free(w);
}

static const int k_ms[] = {2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 24, 31, 33, 64, 65};
static const int k_ns[] = {1, 3, 4, 5, 16, 19, 64};
static const int k_ks[] = {32, 64, 96, 576};

static void sweep(uint32_t type, mk_pool *pool) {
    if (!mk_ggml_have_vnni()) cr_log_info("no AVX-512 VNNI here: both sides run the one-row kernels"); /* a warning would fail the run (Criterion exits 1) */
    for (size_t a = 0; a < sizeof k_ms / sizeof *k_ms; a++)
        for (size_t b = 0; b < sizeof k_ns / sizeof *k_ns; b++)
            for (size_t c = 0; c < sizeof k_ks / sizeof *k_ks; c++) check(pool, type, k_ns[b], k_ks[c], k_ms[a]);
}

Test(ggml_multirow, q4_1_equals_one_row) { sweep(MK_GGML_Q4_1, NULL); }
Test(ggml_multirow, q8_0_equals_one_row) { sweep(MK_GGML_Q8_0, NULL); }

Test(ggml_multirow, threaded_large) {
    mk_pool *pool = mk_pool_create(3);
    cr_assert(pool);
    /* big enough for the pool: the model's shapes (576 -> 1536, 1536 -> 576, the output matrix) */
    check(pool, MK_GGML_Q4_1, 1536, 576, 64);
    check(pool, MK_GGML_Q4_1, 576, 1536, 37);
    check(pool, MK_GGML_Q8_0, 4096, 576, 33);
    check(pool, MK_GGML_Q4_1, 200, 576, 2);
    mk_pool_free(pool);
}

Test(ggml_multirow, several_matrices_equal_one_each) {
    mk_pool *pool = mk_pool_create(2);
    cr_assert(pool);
    const uint32_t types[] = {MK_GGML_Q4_1, MK_GGML_Q8_0};
    const int ns[3] = {576, 192, 200}, k = 576, ms[] = {1, 2, 5, 16, 37};
    for (int ti = 0; ti < 2; ti++)
        for (size_t mi = 0; mi < sizeof ms / sizeof *ms; mi++)
            for (unsigned flags = 0; flags < 2; flags++) {
                const uint32_t type = types[ti];
                const int m = ms[mi];
                uint8_t *w[3];
                float *y[3], *want[3];
                mk_ggml_mat mats[3];
                float *x = malloc(sizeof(float) * (size_t)m * k);
                cr_assert(x);
                for (int i = 0; i < m * k; i++) x[i] = rndf() * 3.0f;
                void *scr = malloc(mk_ggml_matmul_scratch(type, m, k));
                cr_assert(scr);
                for (int i = 0; i < 3; i++) {
                    w[i] = random_weights(type, ns[i], k);
                    y[i] = malloc(sizeof(float) * (size_t)m * ns[i]);
                    want[i] = malloc(sizeof(float) * (size_t)m * ns[i]);
                    cr_assert(y[i] && want[i]);
                    mats[i] = (mk_ggml_mat){w[i], ns[i], y[i]};
                    mk_ggml_matmul_ex(pool, type, w[i], ns[i], k, x, m, want[i], scr, flags);
                }
                mk_ggml_matmul_n(pool, type, k, mats, 3, x, m, scr, flags);
                for (int i = 0; i < 3; i++) {
                    cr_assert(memcmp(y[i], want[i], sizeof(float) * (size_t)m * ns[i]) == 0,
                              "%s m %d flags %u: matrix %d differs from its own call", mk_ggml_type_name(type), m, flags, i);
                    free(w[i]);
                    free(y[i]);
                    free(want[i]);
                }
                free(scr);
                free(x);
            }
    mk_pool_free(pool);
}
