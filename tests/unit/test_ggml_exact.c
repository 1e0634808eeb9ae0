/* test_ggml_exact.c — llama.cpp-order kernels (src/num/ggml_exact.c) and the llama.cpp order of
 * the Q4_1 / Q8_0 dots (src/num/ggml_quant.c).
 *
 *   1. hand-worked inputs on which the summation orders disagree, with the value each order must
 *      give written in the test (ggml_vec_dot_f16 with 4 x 16 and 4 x 8 accumulators, tinyBLAS's
 *      single accumulator, the scalar double sum);
 *   2. every SIMD kernel equals the scalar emulation of its level bit for bit, on random inputs
 *      and edge values (the emulation is what runs on CPUs without the instructions);
 *   3. ggml_v_expf's two versions: special values, and within 2 ulp of expf where finite;
 *   4. softmax, swiglu, rmsnorm, RoPE and f32 -> f16 on hand-checked values;
 *   5. the Q8_0 and Q4_1 dots against a brute-force restatement of llama.cpp's AVX2 vec_dot
 *      (per block, 8 integer lane sums, a fused multiply-add per lane, hsum_float_8, Q4_1's fused
 *      m * s sum added last).
 * The .c file is included so the emulations can be called directly.
 */
#include <criterion/criterion.h>

#include "num/ggml_exact.c"
#include "num/ggml_quant.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float rnds(void) { return (float)(rnd() >> 40) * 0x1p-23f - 1.0f; } /* [-1, 1) */

static uint16_t h(float f) { return mk_f32_to_f16(f); }

#define BITS_EQ(a, b, ...) cr_assert(mk_f32_bits(a) == mk_f32_bits(b), __VA_ARGS__)

static const mk_gx_isa k_isas[] = {MK_GX_SCALAR, MK_GX_AVX2, MK_GX_AVX512};

/* ---- 1. orders on hand-worked inputs ------------------------------------------------------------ */

/* x = y with x[0] = 2048 (product 2^22) and x[16] = x[32] = x[48] = 0.5 (products 0.25): 2^22 +
 * 0.25 is a tie that rounds back to 2^22 in float (ulp 0.5), so the result depends on which
 * partial sums meet first:
 *   AVX-512 vec_dot: element i in accumulator (i / 16) % 4: acc0 = 2^22, acc1..3 = 0.25;
 *                    acc0 + acc2 = 2^22, acc1 + acc3 = 0.5, sum 2^22 + 0.5 (exact)  -> 4194304.5
 *   AVX2 vec_dot:    accumulators of 8, steps of 32: elements 0 and 32 meet in acc0 lane 0
 *                    (2^22 + 0.25 = 2^22), 16 and 48 in acc2 (0.5): acc0 + acc2    -> 4194304.5
 *   tinyBLAS:        one accumulator, 2^22 + 0.25 three times in order           -> 4194304
 *   scalar:          in double                                                   -> 4194304.75 */
Test(ggml_exact, dot_orders_by_hand) {
    uint16_t x[64];
    for (int i = 0; i < 64; i++) x[i] = h(0.0f);
    x[0] = h(2048.0f);
    x[16] = x[32] = x[48] = h(0.5f);
    cr_assert_eq(mk_gx_dot_f16(MK_GX_AVX512, 64, x, x), 4194304.5f);
    cr_assert_eq(mk_gx_dot_f16(MK_GX_AVX2, 64, x, x), 4194304.5f);
    cr_assert_eq(mk_gx_dot_f16(MK_GX_SCALAR, 64, x, x), 4194304.75f);
    cr_assert_eq(mk_gx_dot_f16_tb(MK_GX_AVX512, 64, x, x), 4194304.0f);
    cr_assert_eq(mk_gx_dot_f16_tb(MK_GX_AVX2, 64, x, x), 4194304.0f);
    cr_assert(isnan(mk_gx_dot_f16_tb(MK_GX_SCALAR, 64, x, x)));
    cr_assert_eq(mk_gx_tb_kn(MK_GX_AVX512), 16);
    cr_assert_eq(mk_gx_tb_kn(MK_GX_AVX2), 8);
    /* the leftovers past the last full step are added in double: n = 65 with x[64] = 0.5 adds
     * 0.25 to the double sum (4194304.75), which then rounds to float: tie -> 4194304.75 is exact */
    uint16_t z[65];
    memcpy(z, x, sizeof x);
    z[64] = h(0.5f);
    cr_assert_eq(mk_gx_dot_f16(MK_GX_AVX512, 65, z, z), 4194304.75f);
}

/* The horizontal reductions' trees: lanes of one accumulator that meet early or late.
 * AVX-512 (a[i] + a[i+8], then + [i+4], then (0+2) + (1+3)): a0 = 2^22, a8 = 0.25 -> 2^22;
 * a4 = a12 = 0.25 -> 0.5; then 2^22 + 0.5. With a1 = 0.25 instead of a4 (meeting a0's sum last
 * in (0+2) + (1+3) after a0 + a8 = 2^22): 2^22 + 0.25 + 0.25 with a9 = 0.25: (a1 + a9) = 0.5. */
Test(ggml_exact, reduction_trees_by_hand) {
    float a[16] = {0};
    a[0] = 0x1p22f;
    a[8] = a[4] = a[12] = 0.25f;
    cr_assert_eq(red16(a), 4194304.5f);
    memset(a, 0, sizeof a);
    a[0] = 0x1p22f;
    a[8] = 0.25f; /* meets a0 first: lost */
    a[2] = 0.25f; /* meets a0's sum in (t0 + t2): lost */
    a[1] = 0.25f; /* t1 + t3 = 0.25, then 2^22 + 0.25: lost */
    cr_assert_eq(red16(a), 4194304.0f);
    /* hsum_float_8: (a[i] + a[i+4]) then (t0 + t2) + (t1 + t3); hadd: (t0 + t1) + (t2 + t3) */
    float b[8] = {0x1p22f, 0.25f, 0.25f, 0, 0, 0, 0, 0.25f};
    /* hsum: t = [2^22, .25, .25, .25]: (2^22 + .25) + (.25 + .25) = 2^22 + .5 */
    cr_assert_eq(red8_hsum(b), 4194304.5f);
    /* hadd: (2^22 + .25) + (.25 + .25) = 2^22 + 0.5 as well; swap: */
    float c[8] = {0x1p22f, 0, 0.25f, 0.25f, 0, 0.25f, 0, 0};
    /* hsum: t = [2^22, .25, .25, .25] -> 2^22 + .5; hadd: (2^22 + .25) + (.25 + .25) = 2^22 + .5 */
    cr_assert_eq(red8_hsum(c), 4194304.5f);
    float e[8] = {0x1p22f, 0, 0.25f, 0, 0, 0, 0.25f, 0.25f};
    /* hsum: t = [2^22, 0, .5, .25]: (2^22 + .5) + .25 -> 2^22 + .5 (tie to even: .75 -> 1? no:
     * ulp 0.5, 4194304.5 + 0.25 is a tie between .5 and 1.0 -> even mantissa: 4194305) */
    cr_assert_eq(red8_hsum(e), 4194305.0f);
    /* hadd: t = [2^22, 0, .5, .25]: (2^22 + 0) + (.5 + .25) = 2^22 + .75 -> tie -> 4194305 */
    cr_assert_eq(red8_hadd(e), 4194305.0f);
    float f[8] = {0x1p22f, 0.25f, 0, 0, 0, 0, 0.25f, 0};
    /* hsum: t = [2^22, .25, .25, 0]: (2^22 + .25) + (.25 + 0) = 2^22 + .25 -> 2^22 */
    cr_assert_eq(red8_hsum(f), 4194304.0f);
    /* hadd: (2^22 + .25) + (.25 + 0) -> 2^22 as well; t0 + t1 first: */
    float g[8] = {0x1p22f, 0, 0.25f, 0.25f, 0, 0, 0, 0};
    /* hsum: (2^22 + .25) + (0 + .25) = 2^22; hadd: (2^22 + 0) + (.25 + .25) = 2^22 + .5 */
    cr_assert_eq(red8_hsum(g), 4194304.0f);
    cr_assert_eq(red8_hadd(g), 4194304.5f);
}

/* ---- 2. SIMD == emulation ------------------------------------------------------------------------ */

static void random_halves(uint16_t *x, int n, float scale) {
    for (int i = 0; i < n; i++) x[i] = h(rnds() * scale);
}

Test(ggml_exact, f16_dots_simd_equal_emulation) {
    if (mk_gx_isa_native() == MK_GX_SCALAR) cr_log_warn("no AVX2 here: only the emulations run");
    uint16_t x[1100], y[1100];
    for (int rep = 0; rep < 400; rep++) {
        int n = rep < 200 ? 1 + (int)(rnd() % 300) : 64 * (1 + (int)(rnd() % 17));
        random_halves(x, n, 8.0f);
        random_halves(y, n, 1.0f);
        for (int k = 1; k < 3; k++) {
            mk_gx_isa isa = k_isas[k];
            float v = mk_gx_dot_f16(isa, n, x, y), e = dot_f16_emul(lanes(isa), n, x, y);
            BITS_EQ(v, e, "%s dot n=%d: %.9g vs emulation %.9g", mk_gx_isa_name(isa), n, v, e);
            int kn = mk_gx_tb_kn(isa), m = n - n % kn;
            if (m) {
                v = mk_gx_dot_f16_tb(isa, m, x, y);
                e = dot_f16_tb_emul(kn, m, x, y);
                BITS_EQ(v, e, "%s tinyBLAS n=%d: %.9g vs emulation %.9g", mk_gx_isa_name(isa), m, v, e);
            }
        }
    }
    /* the many-rows form equals one call per row, for every level and both orders */
    uint16_t rows[5 * 80];
    float out[5];
    random_halves(rows, 5 * 80, 4.0f);
    random_halves(y, 80, 1.0f);
    for (size_t k = 0; k < 3; k++)
        for (int tb = 0; tb < 2; tb++) {
            mk_gx_isa isa = k_isas[k];
            int n = tb ? 64 : 77;
            mk_gx_dot_f16_n(isa, tb, n, rows, 80, 5, y, out);
            for (int i = 0; i < 5; i++) {
                float v = tb ? mk_gx_dot_f16_tb(isa, n, rows + 80 * i, y) : mk_gx_dot_f16(isa, n, rows + 80 * i, y);
                cr_assert(mk_f32_bits(v) == mk_f32_bits(out[i]) || (isnan(v) && isnan(out[i])), "%s tb=%d row %d",
                          mk_gx_isa_name(isa), tb, i);
            }
        }
}

static const float k_edge[] = {0.0f, -0.0f, 1.0f, -1.0f, 88.0f, 88.5f, 89.0f, -87.0f, -88.0f, -103.0f, -104.0f,
                               -110.0f, 87.33654f, -87.33654f, 126.0f * 0.6931472f, -126.0f * 0.6931472f,
                               133.0f, -133.0f, 1e-30f, -1e-30f, 1e30f, -1e30f, INFINITY, -INFINITY, 0.5f,
                               -0.5f, 10.0f, -10.0f, 0x1p-126f, 80.0f, -80.0f, -95.0f, -100.0f};

Test(ggml_exact, expf_simd_equal_emulation) {
    float x[1024], y[1024], ye[1024], g[1024], z[1024], ze[1024];
    int ne = (int)(sizeof k_edge / sizeof k_edge[0]);
    for (int rep = 0; rep < 40; rep++) {
        int n = 1024;
        for (int i = 0; i < n; i++) {
            x[i] = i < ne && rep == 0 ? k_edge[i] : rnds() * (rep % 4 == 0 ? 120.0f : rep % 4 == 1 ? 20.0f : 2.0f);
            g[i] = rnds();
        }
        for (int k = 1; k < 3; k++) {
            mk_gx_isa isa = k_isas[k];
            /* softmax with max 0: y = v_expf(x) on every full vector, expf on the tail */
            int m = 1000 + (int)(rnd() % 24);
            double s = mk_gx_softmax_exp(isa, m, y, x, 0.0f), se = softmax_emul(isa, m, ye, x, 0.0f);
            for (int i = 0; i < m; i++) BITS_EQ(y[i], ye[i], "%s exp(%.9g): %.9g vs %.9g", mk_gx_isa_name(isa), x[i], y[i], ye[i]);
            cr_assert(s == se || (isnan(s) && isnan(se)), "%s softmax sum %.17g vs %.17g", mk_gx_isa_name(isa), s, se);
            mk_gx_swiglu(isa, m, z, x, g);
            swiglu_emul(isa, m, ze, x, g);
            for (int i = 0; i < m; i++)
                BITS_EQ(z[i], ze[i], "%s swiglu(%.9g, %.9g): %.9g vs %.9g", mk_gx_isa_name(isa), x[i], g[i], z[i], ze[i]);
        }
    }
}

/* ---- 3. ggml_v_expf ---------------------------------------------------------------------------- */

static int ulps(float a, float b) {
    int32_t ia = (int32_t)mk_f32_bits(a), ib = (int32_t)mk_f32_bits(b);
    return abs(ia - ib);
}

Test(ggml_exact, expf_lanes) {
    for (int k = 1; k < 3; k++) {
        mk_gx_isa isa = k_isas[k];
        cr_assert_eq(mk_gx_expf_lane(isa, 0.0f), 1.0f);
        cr_assert_eq(mk_gx_expf_lane(isa, -INFINITY), 0.0f);
        cr_assert_eq(mk_gx_expf_lane(isa, INFINITY), INFINITY);
        cr_assert_eq(mk_gx_expf_lane(isa, -200.0f), 0.0f);
        cr_assert_eq(mk_gx_expf_lane(isa, 200.0f), INFINITY);
        cr_assert(isnan(mk_gx_expf_lane(isa, NAN)));
        /* accurate to about 1.5 ulp (plus 0.5 for the rounding) where the result is normal */
        for (float x = -87.0f; x < 88.5f; x += 0.0137f) {
            float v = mk_gx_expf_lane(isa, x), r = expf(x);
            cr_assert(ulps(v, r) <= 2, "%s exp(%.9g) = %.9g, expf %.9g", mk_gx_isa_name(isa), x, v, r);
        }
    }
    cr_assert_eq(mk_gx_expf_lane(MK_GX_SCALAR, 1.5f), expf(1.5f));
}

/* ---- 4. the other ops by hand ------------------------------------------------------------------- */

Test(ggml_exact, softmax_by_hand) {
    /* 20 equal scores: 16 on the vector path, 4 on the tail; exp(0) = 1, sum 20 */
    float x[20], y[20];
    for (int i = 0; i < 20; i++) x[i] = 3.0f;
    for (size_t k = 0; k < 3; k++) {
        double s = mk_gx_softmax_exp(k_isas[k], 20, y, x, 3.0f);
        cr_assert_eq(s, 20.0);
        for (int i = 0; i < 20; i++) cr_assert_eq(y[i], 1.0f);
    }
    /* masked entries (-inf) are exact zeros and leave the sum alone */
    x[5] = -INFINITY;
    x[17] = -INFINITY;
    for (size_t k = 0; k < 3; k++) {
        double s = mk_gx_softmax_exp(k_isas[k], 20, y, x, 3.0f);
        cr_assert_eq(s, 18.0);
        cr_assert_eq(y[5], 0.0f);
        cr_assert_eq(y[17], 0.0f);
    }
}

Test(ggml_exact, swiglu_by_hand) {
    /* silu(0) * g = 0; silu(x) = x / (1 + e^-x): at x = -inf-like large negative, 0 */
    float x[3] = {0.0f, -200.0f, 200.0f}, g[3] = {5.0f, 1.0f, 0.5f}, y[3];
    for (size_t k = 0; k < 3; k++) {
        mk_gx_swiglu(k_isas[k], 3, y, x, g);
        cr_assert_eq(y[0], 0.0f);
        cr_assert(y[1] == 0.0f); /* -200 / (1 + inf) = -0 */
        cr_assert_eq(y[2], 100.0f);
    }
}

Test(ggml_exact, rmsnorm_by_hand) {
    /* x = [2, -2, 2, -2]: mean square 4, eps 0: scale 0.5; w = [1, 2, 3, 0.5] */
    float x[4] = {2, -2, 2, -2}, w[4] = {1, 2, 3, 0.5f}, y[4];
    mk_gx_rmsnorm(4, x, w, 0.0f, y);
    cr_assert_eq(y[0], 1.0f);
    cr_assert_eq(y[1], -2.0f);
    cr_assert_eq(y[2], 3.0f);
    cr_assert_eq(y[3], -0.5f);
    /* in place, and the products are two roundings: x * s first, then * w */
    float a[1] = {3.0f}, b[1] = {1.0f / 3.0f};
    mk_gx_rmsnorm(1, a, b, 0.0f, a); /* s = 1/3 (rounded); 3 * s = 1 (rounded); 1 * w = w */
    cr_assert_eq(a[0], 1.0f / 3.0f);
    /* the sum of squares is of float squares, in double: 1e20^2 overflows float */
    float big[2] = {1e20f, 1e20f}, one[2] = {1, 1}, r[2];
    mk_gx_rmsnorm(2, big, one, 0.0f, r);
    cr_assert_eq(r[0], 0.0f); /* x*x = inf in float -> scale 1/inf = 0 */
}

Test(ggml_exact, rope_by_hand) {
    float cache[8];
    mk_gx_rope_cache(8, 10000.0f, 0, cache); /* position 0: cos 1, sin 0 */
    for (int i = 0; i < 8; i += 2) {
        cr_assert_eq(cache[i], 1.0f);
        cr_assert_eq(cache[i + 1], 0.0f);
    }
    mk_gx_rope_cache(8, 10000.0f, 3, cache);
    /* theta_i = 3 * ts^i by repeated float products, ts = powf(10000, -2/8) = 0.1 (rounded) */
    float ts = powf(10000.0f, -0.25f), th = 3.0f;
    for (int i = 0; i < 8; i += 2) {
        cr_assert_eq(cache[i], cosf(th));
        cr_assert_eq(cache[i + 1], sinf(th));
        th *= ts;
    }
    /* normal: pairs (0,1), (2,3); x0' = fma(x0, c, -(x1 s)), x1' = fma(x0, s, x1 c) */
    float c2[4] = {0.0f, 1.0f, 0.5f, 0.25f};
    float v[4] = {1.0f, 2.0f, 4.0f, 8.0f};
    mk_gx_rope(4, 0, c2, v);
    cr_assert_eq(v[0], -2.0f); /* 1*0 - 2*1 */
    cr_assert_eq(v[1], 1.0f);  /* 1*1 + 2*0 */
    cr_assert_eq(v[2], 0.0f);  /* 4*0.5 - 8*0.25 */
    cr_assert_eq(v[3], 5.0f);  /* 4*0.25 + 8*0.5 */
    /* neox: pairs (0,2), (1,3) */
    float w[4] = {1.0f, 4.0f, 2.0f, 8.0f};
    mk_gx_rope(4, 1, c2, w);
    cr_assert_eq(w[0], -2.0f);
    cr_assert_eq(w[2], 1.0f);
    cr_assert_eq(w[1], 0.0f);
    cr_assert_eq(w[3], 5.0f);
    /* the fused product: x0 = 1 + 2^-12, c = 1 - 2^-12, x1 s = 1 - 2^-24 (exactly 1 - 2^-24):
     * x0 c = 1 - 2^-24 exactly, which unfused rounds to 1 - 2^-24 (representable) ... use a case
     * where the unfused product rounds: x0 = c = 1 + 2^-12: x0 c = 1 + 2^-11 + 2^-24 (rounds to
     * 1 + 2^-11 unfused); x1 s = 1 + 2^-11: fused gives 2^-24, unfused 0 */
    float c3[2] = {1.0f + 0x1p-12f, 1.0f};
    float u[2] = {1.0f + 0x1p-12f, 1.0f + 0x1p-11f};
    mk_gx_rope(2, 0, c3, u);
    cr_assert_eq(u[0], 0x1p-24f);
}

Test(ggml_exact, f32_to_f16) {
    float x[300];
    uint16_t y[300];
    for (int i = 0; i < 300; i++) x[i] = i < 4 ? (float[]){65504.0f, 65520.0f, 0x1p-25f, 0x1.8p-24f}[i] : rnds() * 1000.0f;
    mk_gx_f32_to_f16(300, x, y);
    for (int i = 0; i < 300; i++) cr_assert_eq(y[i], mk_f32_to_f16(x[i]), "x = %.9g", x[i]);
    cr_assert_eq(y[1], 0x7c00); /* 65520 rounds to inf */
    cr_assert_eq(y[2], 0x0000); /* 2^-25: tie -> even (0) */
    cr_assert_eq(y[3], 0x0002); /* 1.5 * 2^-24: tie -> even (2) */
}

/* ---- 5. Q8_0 / Q4_1 dots in llama.cpp's order ------------------------------------------------- */

static float hf(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return mk_f16_to_f32(v);
}

/* llama.cpp's AVX2 ggml_vec_dot_q8_0_q8_0 / ggml_vec_dot_q4_1_q8_1, restated: block by block,
 * the 8 integer sums of 4 consecutive products, acc[l] = fma(d_w * d_x, sum_l, acc[l]); Q4_1:
 * summs = fma(m, s, summs) in block order; result hsum_float_8(acc) (+ summs). The activation
 * layout is ggml_quant.h's (q[n] | d[nb] | sum[nb] | s[nb]). */
static float brute(uint32_t type, const uint8_t *w, const uint8_t *act, int n) {
    int nb = n / 32;
    const int8_t *q = (const int8_t *)act;
    const float *dx = (const float *)(act + n), *sx = (const float *)(act + n + 8 * nb);
    float acc[8] = {0}, summs = 0;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = w + (size_t)b * (type == MK_GGML_Q8_0 ? 34 : 20);
        float d = hf(blk) * dx[b];
        for (int l = 0; l < 8; l++) {
            int s = 0;
            for (int e = 4 * l; e < 4 * l + 4; e++) {
                int wq = type == MK_GGML_Q8_0 ? (int8_t)blk[2 + e] : e < 16 ? blk[4 + e] & 15 : blk[4 + e - 16] >> 4;
                s += wq * q[32 * b + e];
            }
            acc[l] = fmaf(d, (float)s, acc[l]);
        }
        if (type == MK_GGML_Q4_1) summs = fmaf(hf(blk + 2), sx[b], summs);
    }
    float t[4];
    for (int i = 0; i < 4; i++) t[i] = acc[i + 4] + acc[i];
    float r = (t[0] + t[2]) + (t[1] + t[3]);
    return r + summs;
}

Test(ggml_exact, q8_0_q4_1_dots_in_llamacpp_order) {
    const uint32_t types[2] = {MK_GGML_Q8_0, MK_GGML_Q4_1};
    for (int ti = 0; ti < 2; ti++) {
        uint32_t type = types[ti];
        for (int rep = 0; rep < 200; rep++) {
            int n = 32 * (1 + (int)(rnd() % 20));
            size_t wb = mk_ggml_row_bytes(type, n), ab = mk_ggml_act_bytes(type, n);
            uint8_t *w = malloc(wb * 4), *a = malloc(ab);
            float *x = malloc(sizeof(float) * (size_t)n);
            for (size_t i = 0; i < wb * 4; i++) w[i] = (uint8_t)rnd();
            int bb = type == MK_GGML_Q8_0 ? 34 : 20;
            for (int r = 0; r < 4; r++)
                for (int b = 0; b < n / 32; b++) { /* sane half scales (d, m) */
                    uint8_t *blk = w + r * wb + (size_t)b * bb;
                    uint16_t d = h(rnds() * 0.05f), m = h(rnds() * 0.1f);
                    memcpy(blk, &d, 2);
                    if (type == MK_GGML_Q4_1) memcpy(blk + 2, &m, 2);
                }
            for (int i = 0; i < n; i++) x[i] = rnds() * (1 + (float)(rnd() % 100));
            mk_ggml_quant_act(type, x, n, a);
            for (int r = 0; r < 4; r++) {
                float v = mk_ggml_vec_dot(type, n, w + r * wb, a), e = brute(type, w + r * wb, a, n);
                BITS_EQ(v, e, "%s n=%d: %.9g vs llama.cpp order %.9g", mk_ggml_type_name(type), n, v, e);
            }
            /* and through the matmul (4-row kernel, 1 row tail) */
            float y[5];
            size_t sb = mk_ggml_matmul_scratch(type, 1, n);
            void *scr = malloc(sb);
            uint8_t *w5 = malloc(wb * 5);
            memcpy(w5, w, wb * 4);
            memcpy(w5 + wb * 4, w, wb);
            mk_ggml_matmul(NULL, type, w5, 5, n, x, 1, y, scr);
            for (int r = 0; r < 5; r++) BITS_EQ(y[r], brute(type, w5 + r * wb, a, n), "%s matmul row %d", mk_ggml_type_name(type), r);
            free(scr);
            free(w5);
            free(w);
            free(a);
            free(x);
        }
    }
}
