/* test_gemm_rows.c — mk_linear's result for a row does not depend on how many rows the call has.
 *
 * The m = 1 GEMV kernels and the m > 1 tile kernel of src/ops/cpu/gemm.c sum every output in the
 * same order, so stacking rows of unrelated sequences into one call (the batched DeepSeek-V4
 * step) gives each row the bits it gets alone. For every weight kind, random W and x (shapes with
 * k off the SIMD granules and n off the 4-row tile and the 16-row task): each row of an m = 7
 * call equals the m = 1 call on that row bit for bit, and the rows of an m = 2 call equal the
 * first two rows of an m = 5 call; with bf16 output rounding and without, single-threaded and on
 * a 2-thread pool (the pool splits by output feature and must not change anything either). Also
 * a call of 40 rows (more than one 32-row activation tile).
 */
#include <criterion/criterion.h>

#include "base/threads.h"
#include "num/formats.h"
#include "ops/ops.h"

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
static float rndu(void) { return (float)(rnd() >> 40) * 0x1p-24f; }

typedef struct {
    mk_wmat W;
    void *w;
    uint8_t *scale;
} wbuf;

static void make_w(wbuf *b, mk_wkind kind, int n, int k) {
    size_t nk = (size_t)n * k, bytes = 0, ns = 0;
    switch (kind) {
    case MK_W_BF16: bytes = nk * 2; break;
    case MK_W_F32: bytes = nk * 4; break;
    case MK_W_FP8:
    case MK_W_FP8_DQ: bytes = nk; ns = (size_t)((n + 127) / 128) * ((k + 127) / 128); break;
    case MK_W_FP4: bytes = nk / 2; ns = (size_t)n * (k / 32); break;
    }
    b->w = malloc(bytes);
    b->scale = ns ? malloc(ns) : NULL;
    for (size_t i = 0; i < ns; i++) b->scale[i] = (uint8_t)(118 + rnd() % 15);
    for (size_t i = 0; i < nk; i++) {
        switch (kind) {
        case MK_W_BF16: ((uint16_t *)b->w)[i] = mk_f32_to_bf16((rndu() - 0.5f) * 4.0f); break;
        case MK_W_F32: ((float *)b->w)[i] = (rndu() - 0.5f) * 4.0f; break;
        case MK_W_FP8:
        case MK_W_FP8_DQ: {
            uint8_t c;
            do c = (uint8_t)rnd(); while ((c & 0x7f) == 0x7f);
            ((uint8_t *)b->w)[i] = c;
            break;
        }
        case MK_W_FP4:
            if (i < nk / 2) ((uint8_t *)b->w)[i] = (uint8_t)rnd();
            break;
        }
    }
    b->W = (mk_wmat){kind, n, k, b->w, b->scale};
}

static void make_x(float *x, int m, int k) {
    for (int r = 0; r < m; r++)
        for (int b = 0; b < k; b += 128) {
            float mag = ldexpf(1.0f, (int)(rnd() % 17) - 8);
            for (int i = b; i < k && i < b + 128; i++) {
                uint64_t u = rnd();
                float v = (rndu() - 0.5f) * mag;
                if (u % 61 == 0) v = 0.0f;
                if (u % 67 == 0) v = -0.0f;
                x[(size_t)r * k + i] = v;
            }
        }
}

/* y of rows [r0, r0 + m) of x, as one call */
static void run(mk_pool *pool, const mk_wmat *W, const float *x, int r0, int m, float *y, int round) {
    float *scratch = malloc(sizeof(float) * mk_linear_scratch(m, W->k));
    mk_linear(pool, W, x + (size_t)r0 * W->k, m, y, round, scratch);
    free(scratch);
}

static void check_kind(mk_wkind kind, const char *name) {
    /* (n, k): k on and off every granule (128 FP8, 64 FP4, 16 BF16, 8 F32); one large enough for
     * the pool to be used at m = 1 */
    static const int shapes[][2] = {{37, 256}, {21, 200}, {64, 1152}, {19, 96}, {300, 1024}};
    mk_pool *pool = mk_pool_create(2);
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int n = shapes[si][0], k = shapes[si][1];
        if (kind == MK_W_FP4 && k % 32) continue; /* FP4 rows are whole 32-groups */
        wbuf b;
        make_w(&b, kind, n, k);
        const int M = 40;
        float *x = malloc(sizeof(float) * (size_t)M * k);
        make_x(x, M, k);
        float *one = malloc(sizeof(float) * n), *many = malloc(sizeof(float) * (size_t)M * n);
        float *two = malloc(sizeof(float) * 2 * (size_t)n);
        for (int round = 0; round < 2; round++)
            for (int pi = 0; pi < 2; pi++) {
                mk_pool *p = pi ? pool : NULL;
                run(p, &b.W, x, 0, 7, many, round);
                for (int r = 0; r < 7; r++) {
                    run(p, &b.W, x, r, 1, one, round);
                    for (int j = 0; j < n; j++)
                        cr_expect_eq(mk_f32_bits(one[j]), mk_f32_bits(many[(size_t)r * n + j]),
                                     "%s n=%d k=%d round=%d pool=%d: row %d of m=7, y[%d] = %a, alone %a", name,
                                     n, k, round, pi, r, j, many[(size_t)r * n + j], one[j]);
                }
                run(p, &b.W, x, 0, 5, many, round);
                run(p, &b.W, x, 0, 2, two, round);
                for (size_t i = 0; i < 2 * (size_t)n; i++)
                    cr_expect_eq(mk_f32_bits(two[i]), mk_f32_bits(many[i]),
                                 "%s n=%d k=%d round=%d pool=%d: m=2 vs m=5 at %zu: %a vs %a", name, n, k, round,
                                 pi, i, two[i], many[i]);
                run(p, &b.W, x, 0, M, many, round);
                for (int r = 0; r < M; r += 13) {
                    run(p, &b.W, x, r, 1, one, round);
                    for (int j = 0; j < n; j++)
                        cr_expect_eq(mk_f32_bits(one[j]), mk_f32_bits(many[(size_t)r * n + j]),
                                     "%s n=%d k=%d: row %d of m=%d differs at %d", name, n, k, r, M, j);
                }
            }
        free(x);
        free(one);
        free(two);
        free(many);
        free(b.w);
        free(b.scale);
    }
    mk_pool_free(pool);
}

Test(gemm_rows, fp8) { check_kind(MK_W_FP8, "fp8"); }
Test(gemm_rows, fp8_dq) { check_kind(MK_W_FP8_DQ, "fp8_dq"); }
Test(gemm_rows, fp4) { check_kind(MK_W_FP4, "fp4"); }
Test(gemm_rows, bf16) { check_kind(MK_W_BF16, "bf16"); }
Test(gemm_rows, f32) { check_kind(MK_W_F32, "f32"); }
