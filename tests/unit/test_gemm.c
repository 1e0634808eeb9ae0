/* test_gemm.c — the fast mk_linear (src/ops/cpu/gemm.c) against the scalar reference
 * mk_linear_ref (src/ops/cpu/gemm_ref.c) for every weight kind.
 *
 * Random weights of each kind (FP8 bytes without the NaN codes, e8m0 scales in 120..130), shapes
 * with k off the 128 / 64 / 16 / 8 SIMD granules and n off the 16-row task size, m = 1 (the GEMV
 * kernels), 3 and 17 (the prefill tile, odd row counts) and 40 (more than one activation tile),
 * each run with a NULL pool and a 2-thread pool (mk_linear uses the pool only above ~256 KiB of
 * weight bytes x m, so every kind has a shape above that at m = 1). The two results may differ only by fp32
 * reassociation, so the tolerance is relative to the sum of |terms| of each output, which is
 * itself computed by the reference on |W| and |x| (quantization is symmetric, so that is exactly
 * the sum of |q| |w| sa sb). With bf16 output rounding one bf16 ulp more is allowed.
 *
 * Also checked: the activation quantizer bit for bit (identity FP8 weights make y the dequantized
 * activations; inputs include e4m3 ties, subnormal-range values, the 448 clamp, zeros, -0, and
 * blocks with inf / NaN), the decode identities the kernels rely on (exhaustively over all codes),
 * and the scalar fallback taken when MXCSR.DAZ is set.
 */
#include <criterion/criterion.h>

#include "base/threads.h"
#include "num/formats.h"
#include "ops/ops.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* ---- helpers --------------------------------------------------------------------------- */

static uint64_t rng_state;
static uint64_t rnd(void) {
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}
static float rndu(void) { return (float)(rnd() >> 40) * 0x1p-24f; } /* [0, 1) */

typedef struct {
    mk_wmat W, Wabs;
    void *w, *wabs;
    uint8_t *scale;
} wbuf;

static size_t scale_count(mk_wkind kind, int n, int k) {
    switch (kind) {
    case MK_W_FP8:
    case MK_W_FP8_DQ: return (size_t)((n + 127) / 128) * (size_t)((k + 127) / 128);
    case MK_W_FP4: return (size_t)n * (size_t)(k / 32);
    default: return 0;
    }
}

static void make_w(wbuf *b, mk_wkind kind, int n, int k) {
    size_t nk = (size_t)n * k, bytes = 0;
    switch (kind) {
    case MK_W_BF16: bytes = nk * 2; break;
    case MK_W_F32: bytes = nk * 4; break;
    case MK_W_FP8:
    case MK_W_FP8_DQ: bytes = nk; break;
    case MK_W_FP4: bytes = nk / 2; break;
    }
    b->w = malloc(bytes);
    b->wabs = malloc(bytes);
    size_t ns = scale_count(kind, n, k);
    b->scale = ns ? malloc(ns) : NULL;
    for (size_t i = 0; i < ns; i++) b->scale[i] = (uint8_t)(120 + rnd() % 11);
    for (size_t i = 0; i < nk; i++) {
        switch (kind) {
        case MK_W_BF16: {
            uint16_t h = mk_f32_to_bf16((rndu() - 0.5f) * 4.0f);
            ((uint16_t *)b->w)[i] = h;
            ((uint16_t *)b->wabs)[i] = h & 0x7fff;
            break;
        }
        case MK_W_F32: {
            float f = (rndu() - 0.5f) * 4.0f;
            ((float *)b->w)[i] = f;
            ((float *)b->wabs)[i] = fabsf(f);
            break;
        }
        case MK_W_FP8:
        case MK_W_FP8_DQ: {
            uint8_t c;
            do c = (uint8_t)rnd(); while ((c & 0x7f) == 0x7f);
            ((uint8_t *)b->w)[i] = c;
            ((uint8_t *)b->wabs)[i] = c & 0x7f;
            break;
        }
        case MK_W_FP4:
            if (i < nk / 2) {
                uint8_t c = (uint8_t)rnd();
                ((uint8_t *)b->w)[i] = c;
                ((uint8_t *)b->wabs)[i] = c & 0x77;
            }
            break;
        }
    }
    b->W = (mk_wmat){kind, n, k, b->w, b->scale};
    b->Wabs = (mk_wmat){kind, n, k, b->wabs, b->scale};
}

static void free_w(wbuf *b) {
    free(b->w);
    free(b->wabs);
    free(b->scale);
}

/* Activations with a different magnitude per 128 block (exercises the block scales), a few
 * exact zeros and negative zeros. */
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

static float bf16_ulp(float v) {
    int e;
    frexpf(fabsf(v), &e); /* |v| in [2^(e-1), 2^e) */
    return ldexpf(1.0f, e - 1 - 7);
}

static const char *kind_name(mk_wkind k) {
    switch (k) {
    case MK_W_BF16: return "bf16";
    case MK_W_F32: return "f32";
    case MK_W_FP8: return "fp8";
    case MK_W_FP8_DQ: return "fp8_dq";
    case MK_W_FP4: return "fp4";
    }
    return "?";
}

/* Compare mk_linear with mk_linear_ref on one random problem, for both output roundings and with
 * and without a pool. */
static void check(mk_wkind kind, int n, int k, int m, mk_pool *pool2) {
    wbuf b;
    make_w(&b, kind, n, k);
    float *x = malloc(sizeof(float) * (size_t)m * k), *xabs = malloc(sizeof(float) * (size_t)m * k);
    make_x(x, m, k);
    for (size_t i = 0; i < (size_t)m * k; i++) xabs[i] = fabsf(x[i]);
    size_t ns = mk_linear_scratch(m, k);
    float *scratch = malloc(sizeof(float) * ns);
    float *yref = malloc(sizeof(float) * (size_t)m * n), *yabs = malloc(sizeof(float) * (size_t)m * n);
    float *y = malloc(sizeof(float) * (size_t)m * n);
    for (int round = 0; round < 2; round++) {
        mk_linear_ref(&b.W, x, m, yref, round, scratch);
        mk_linear_ref(&b.Wabs, xabs, m, yabs, 0, scratch);
        for (int p = 0; p < 2; p++) {
            mk_pool *pool = p ? pool2 : NULL;
            for (size_t i = 0; i < (size_t)m * n; i++) y[i] = NAN;
            /* dirty scratch: the fast path must not depend on its contents */
            for (size_t i = 0; i < ns; i++) scratch[i] = (float)i * 1e30f;
            mk_linear(pool, &b.W, x, m, y, round, scratch);
            for (int r = 0; r < m; r++)
                for (int j = 0; j < n; j++) {
                    size_t o = (size_t)r * n + j;
                    float tol = 2e-5f * yabs[o] + 1e-30f;
                    if (round) tol += bf16_ulp(yref[o]);
                    float d = fabsf(y[o] - yref[o]);
                    cr_assert(d <= tol,
                              "%s n=%d k=%d m=%d round=%d pool=%d: y[%d,%d] = %.9g, ref %.9g "
                              "(|terms| %.6g)",
                              kind_name(kind), n, k, m, round, p, r, j, (double)y[o],
                              (double)yref[o], (double)yabs[o]);
                }
        }
    }
    free(x);
    free(xabs);
    free(scratch);
    free(yref);
    free(yabs);
    free(y);
    free_w(&b);
}

static void check_shapes(mk_wkind kind, const int (*shapes)[2], int ns) {
    mk_num_init();
    rng_state = 0x9e3779b97f4a7c15ull ^ (uint64_t)kind;
    mk_pool *pool = mk_pool_create(2);
    cr_assert(pool);
    static const int ms[] = {1, 3, 17, 40};
    for (int s = 0; s < ns; s++)
        for (int i = 0; i < 4; i++) {
            if (ms[i] == 40 && (size_t)shapes[s][0] * shapes[s][1] > 300000) continue;
            check(kind, shapes[s][0], shapes[s][1], ms[i], pool);
        }
    mk_pool_free(pool);
}

/* ---- kinds ----------------------------------------------------------------------------- */

Test(gemm, fp8) {
    static const int s[][2] = {{300, 512}, {130, 4096}, {37, 200}, {16, 128}, {5, 1000}, {1, 256}};
    check_shapes(MK_W_FP8, s, 6);
}

Test(gemm, fp8_dq) {
    static const int s[][2] = {{70, 640}, {129, 4096}, {9, 300}, {33, 100}};
    check_shapes(MK_W_FP8_DQ, s, 4);
}

Test(gemm, fp4) {
    static const int s[][2] = {{100, 512}, {200, 4096}, {21, 192}, {19, 224}, {3, 32}, {64, 96}};
    check_shapes(MK_W_FP4, s, 6);
}

/* The two FP4 decodes of the AVX2 path (f32 bit placement, and f16 through vcvtph2ps, which
 * Intel cores run without the subnormal assist) put the same values in the same lanes: bit for bit
 * the same outputs, for every code (including +-0.5, the e2m1 subnormals, and -0), rows made of
 * +-0.5 alone, k off the 64 granule, scale bytes 0 and 255 among the random ones, with and
 * without a pool. Each path also meets the reference in Test(gemm, fp4) on a machine that picks it. */
Test(gemm, fp4_decodes_agree) {
    mk_num_init();
    if (!mk_linear_simd()) cr_skip_test("mk_linear runs its scalar code here: no AVX2 decode to compare");
    rng_state = 0x5eed0f4ull;
    mk_pool *pool = mk_pool_create(2);
    cr_assert(pool);
    static const int s[][2] = {{100, 512}, {200, 4096}, {21, 192}, {19, 224}, {3, 32}, {64, 96}, {40, 1024}};
    static const int ms[] = {1, 3, 17};
    for (size_t si = 0; si < sizeof s / sizeof s[0]; si++)
        for (int mi = 0; mi < 3; mi++) {
            int n = s[si][0], k = s[si][1], m = ms[mi];
            wbuf b;
            make_w(&b, MK_W_FP4, n, k);
            uint8_t *w = b.w;
            for (int j = 0; j < n; j += 7) /* every 7th row: only +-0.5 */
                for (int i = 0; i < k / 2; i++) w[(size_t)j * (k / 2) + i] = (uint8_t)(0x11 | (rnd() & 0x88));
            size_t nsc = scale_count(MK_W_FP4, n, k);
            if (nsc > 8) {
                b.scale[nsc / 3] = 0;
                b.scale[nsc / 2] = 255;
            }
            float *x = malloc(sizeof(float) * (size_t)m * k);
            make_x(x, m, k);
            float *scratch = malloc(sizeof(float) * mk_linear_scratch(m, k));
            float *y1 = malloc(sizeof(float) * (size_t)m * n), *y2 = malloc(sizeof(float) * (size_t)m * n);
            for (int round = 0; round < 2; round++)
                for (int p = 0; p < 2; p++) {
                    int old = mk_linear_fp4_decode(MK_FP4_BITS);
                    mk_linear(p ? pool : NULL, &b.W, x, m, y1, round, scratch);
                    mk_linear_fp4_decode(MK_FP4_F16);
                    mk_linear(p ? pool : NULL, &b.W, x, m, y2, round, scratch);
                    mk_linear_fp4_decode(old);
                    for (size_t i = 0; i < (size_t)m * n; i++)
                        cr_assert(!memcmp(&y1[i], &y2[i], sizeof(float)),
                                  "fp4 n=%d k=%d m=%d round=%d pool=%d: y[%zu] bits %a, f16 %a", n, k, m,
                                  round, p, i, (double)y1[i], (double)y2[i]);
                }
            free(x);
            free(scratch);
            free(y1);
            free(y2);
            free_w(&b);
        }
    mk_pool_free(pool);
}

Test(gemm, bf16) {
    static const int s[][2] = {{77, 1000}, {129, 4096}, {40, 15}, {18, 128}, {3, 4111}};
    check_shapes(MK_W_BF16, s, 5);
}

Test(gemm, f32) {
    static const int s[][2] = {{50, 333}, {17, 7}, {33, 4096}, {16, 64}};
    check_shapes(MK_W_F32, s, 4);
}

/* ---- activation quantization, bit for bit ------------------------------------------------ */

/* FP8 identity weights (e4m3 1.0 = 0x38, scale 2^0) make y[r, j] = q[r, j] * sa: one exact term,
 * so fast and reference must agree exactly. A block holding inf has an infinite scale; there the
 * reference's y is inf or NaN (0 * inf) depending on summation order, so only "not finite" is
 * required. */
static void check_identity(const float *x, int m, int k, mk_pool *pool) {
    uint8_t *w = calloc((size_t)k * k, 1);
    int nb = (k + 127) / 128;
    uint8_t *sc = malloc((size_t)nb * nb);
    memset(sc, 127, (size_t)nb * nb);
    for (int j = 0; j < k; j++) w[(size_t)j * k + j] = 0x38;
    mk_wmat W = {MK_W_FP8, k, k, w, sc};
    float *scratch = malloc(sizeof(float) * mk_linear_scratch(m, k));
    float *y = malloc(sizeof(float) * (size_t)m * k), *yr = malloc(sizeof(float) * (size_t)m * k);
    mk_linear_ref(&W, x, m, yr, 0, scratch);
    mk_linear(pool, &W, x, m, y, 0, scratch);
    for (int i = 0; i < m * k; i++)
        cr_assert(mk_f32_bits(y[i]) == mk_f32_bits(yr[i]) || (!isfinite(y[i]) && !isfinite(yr[i])),
                  "m=%d x[%d] = %a: quantized %a, reference %a", m, i, (double)x[i], (double)y[i],
                  (double)yr[i]);
    free(w);
    free(sc);
    free(scratch);
    free(y);
    free(yr);
}

Test(gemm, act_quant_exact) {
    mk_num_init();
    rng_state = 12345;
    enum { K = 1024 + 40 }; /* 8 full blocks + a partial one (40 = 5 vectors) */
    static float x[3 * K];
    for (int r = 0; r < 3; r++)
        for (int b = 0; b < K; b += 128) {
            float *xb = x + r * K + b;
            int w = K - b < 128 ? K - b : 128;
            int mode = (r * 9 + b / 128) % 9;
            /* per block: the amax sets the scale s = 2^ceil(log2(amax/448)) */
            float s = ldexpf(1.0f, (int)(rnd() % 30) - 15);
            for (int i = 0; i < w; i++) {
                float v;
                switch (mode) {
                case 0: /* exact e4m3 grid midpoints (ties) in every binade, incl. subnormal */
                    v = ldexpf((float)(2 * (int)(rnd() % 16) + 17), (int)(rnd() % 15) - 13);
                    break;
                case 1: /* subnormal-range values: below 2^-6 * s */
                    v = rndu() * ldexpf(1.0f, -6) * 448.0f;
                    break;
                case 2: v = 0.0f; break; /* all zero: amax floored at 1e-4 */
                case 3: v = (i & 1) ? -0.0f : 1e-30f; break;
                case 4: v = (rndu() - 0.5f) * 1000.0f; break;
                case 5: v = (i == 7) ? INFINITY : rndu(); break;
                case 6: v = (i == 3) ? NAN : rndu() - 0.5f; break;
                case 7: v = 0x1p-140f * (float)(rnd() % 100); break; /* f32 subnormals */
                default: v = (rndu() - 0.5f) * 3.0f; break;
                }
                if (mode < 2) v *= s;
                if (rnd() & 1) v = -v;
                xb[i] = v;
            }
            if (mode == 0) xb[0] = 448.0f * s; /* the block max sits exactly on 448 s */
        }
    mk_pool *pool = mk_pool_create(2);
    check_identity(x, 1, K, NULL);
    check_identity(x, 3, K, NULL);
    check_identity(x, 3, K, pool);
    mk_pool_free(pool);
}

/* ---- decode identities ------------------------------------------------------------------- */

/* The suggested fp16 route: e4m3 byte b as fp16 bits ((b & 0x7f) << 7) | ((b & 0x80) << 8) is the
 * e4m3 value / 256, for all 254 non-NaN codes. */
Test(gemm, e4m3_via_f16) {
    mk_num_init();
    int checked = 0;
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7f) == 0x7f) continue;
        uint16_t h = (uint16_t)(((b & 0x7f) << 7) | ((b & 0x80) << 8));
        float v = mk_f16_to_f32(h) * 256.0f;
        float ref = mk_e4m3_to_f32((uint8_t)b);
        cr_assert(mk_f32_bits(v) == mk_f32_bits(ref), "code %#x: %a vs %a", b, (double)v,
                  (double)ref);
        checked++;
    }
    cr_assert_eq(checked, 254);
}

/* The routes gemm.c uses: e4m3 at f32 bits s<<31 | em<<20 is the value * 2^-120; e2m1 at
 * s<<31 | em<<22 is the value * 2^-126 (subnormal codes land on f32 subnormals). */
Test(gemm, decode_via_f32_bits) {
    mk_num_init();
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7f) == 0x7f) continue;
        uint32_t u = ((uint32_t)(b & 0x80) << 24) | ((uint32_t)(b & 0x7f) << 20);
        float v = mk_f32_from_bits(u) * 0x1p120f;
        float ref = mk_e4m3_to_f32((uint8_t)b);
        cr_assert(mk_f32_bits(v) == mk_f32_bits(ref), "e4m3 %#x: %a vs %a", b, (double)v,
                  (double)ref);
    }
    for (int nib = 0; nib < 16; nib++) {
        uint32_t u = ((uint32_t)(nib & 8) << 28) | ((uint32_t)(nib & 7) << 22);
        float v = mk_f32_from_bits(u) * 0x1p126f;
        float ref = mk_e2m1_to_f32((uint8_t)nib);
        cr_assert(mk_f32_bits(v) == mk_f32_bits(ref), "e2m1 %#x: %a vs %a", nib, (double)v,
                  (double)ref);
    }
}

/* Subnormal weight codes only (0x01-0x07, 0x81-0x87) with large and tiny activations: the
 * products must stay exact through the f32-subnormal decode. */
Test(gemm, fp8_subnormal_weights) {
    mk_num_init();
    rng_state = 777;
    int n = 40, k = 256, m = 1;
    uint8_t *w = malloc((size_t)n * k), sc[2] = {127, 100}; /* [1 row block, 2 k blocks] */
    for (int i = 0; i < n * k; i++) w[i] = (uint8_t)((rnd() & 0x80) | (1 + rnd() % 7));
    mk_wmat W = {MK_W_FP8, n, k, w, sc};
    float x[256], y[40], yr[40], scratch[512];
    for (int i = 0; i < k; i++) x[i] = (i < 128 ? 300.0f : 1e-3f) * (rndu() - 0.5f);
    mk_linear_ref(&W, x, m, yr, 0, scratch);
    mk_linear(NULL, &W, x, m, y, 0, scratch);
    for (int j = 0; j < n; j++)
        cr_assert(fabsf(y[j] - yr[j]) <= 1e-5f * fabsf(yr[j]) + 1e-30f, "y[%d] %a ref %a", j,
                  (double)y[j], (double)yr[j]);
    free(w);
}

/* With denormals-are-zero set the SIMD decodes would lose e4m3 subnormals; mk_linear must notice
 * and still match. */
Test(gemm, daz_fallback) {
#if defined(__x86_64__)
    mk_num_init();
    rng_state = 4242;
    unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x0040);
    mk_pool *pool = mk_pool_create(2);
    check(MK_W_FP8, 40, 384, 1, pool);
    check(MK_W_FP4, 40, 256, 3, pool);
    mk_pool_free(pool);
    _mm_setcsr(csr);
#endif
}
