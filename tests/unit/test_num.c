/* test_num.c — unit tests of src/num/formats.{h,c}: the bf16, f16, FP8 E4M3 (fn), E8M0 and FP4
 * E2M1 conversions and the reference's FP8 / FP4 activation quantizers (model-dsv4.md 3.0).
 *
 * Every expected value here is derived independently of formats.c: decoders are rebuilt from the
 * sign / exponent / mantissa bits (or from hand-written tables for anchor codes), encoders are
 * checked against a brute-force "nearest grid value, ties to the even code" search over those
 * independently decoded grids, bf16 rounding against a separate integer round-to-nearest-even,
 * and the quantizer scales against the spec's formula written out again here. Sweeps are
 * exhaustive over the small formats (256 / 16 / 65536 codes) and dense over fp32 bit patterns.
 */
#include <criterion/criterion.h>

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "num/formats.h"

/* ---------------------------------------------------------------- independent helpers */

static float bits2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t f2bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* 2^k as an fp32, built from bits (k in [-149, 127]), without libm. */
static float pow2f(int k) {
    if (k >= -126) return bits2f((uint32_t)(k + 127) << 23);
    return bits2f(1u << (k + 149)); /* subnormal */
}

/* Same bits (so +0 and -0 differ, and equal NaNs compare equal). */
#define ASSERT_SAME_F(got, want, ...)                                                            \
    cr_assert(f2bits(got) == f2bits(want), __VA_ARGS__)

/* Tiny deterministic PRNG (xorshift64*). */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd32(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}
/* Uniform in [-1, 1). */
static float rnd_unit(void) { return (float)((double)rnd32() / 2147483648.0 - 1.0); }

/* E4M3 (fn) from its bits: s eeee mmm, bias 7; e == 0 subnormal m/8 * 2^-6; e=15,m=7 NaN. */
static float ref_e4m3(int c) {
    int s = (c >> 7) & 1, e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    double v = e == 0 ? (double)m / 512.0 : (double)(8 + m) / 8.0 * (double)pow2f(e - 7);
    return (float)(s ? -v : v);
}

/* E2M1 from its bits: s ee m, bias 1; e == 0 subnormal m * 0.5. */
static float ref_e2m1(int c) {
    int s = (c >> 3) & 1, e = (c >> 1) & 3, m = c & 1;
    double v = e == 0 ? 0.5 * m : (1.0 + 0.5 * m) * (double)pow2f(e - 1);
    return (float)(s ? -v : v);
}

/* Nearest code among the non-negative codes 0..max_code of a monotone grid `val`, ties to the
 * even code; |x| beyond the top saturates. Distances are exact in double (see the grids). */
static int nearest_code(float x, float (*val)(int), int max_code, int sign_bit) {
    double a = fabs((double)x);
    int best = 0;
    if (a >= (double)val(max_code)) best = max_code;
    else {
        for (int c = 0; c < max_code; c++) {
            double lo = val(c), hi = val(c + 1);
            if (a >= lo && a < hi) {
                double dl = a - lo, dh = hi - a;
                if (dl < dh) best = c;
                else if (dh < dl) best = c + 1;
                else best = (c & 1) ? c + 1 : c;
                break;
            }
        }
    }
    return signbit(x) ? (best | sign_bit) : best;
}
static int ref_to_e4m3(float x) { return nearest_code(x, ref_e4m3, 0x7E, 0x80); }
static int ref_to_e2m1(float x) { return nearest_code(x, ref_e2m1, 7, 8); }

/* bf16 round to nearest even by integer carry on the upper half; NaN handled by the caller. */
static uint16_t ref_bf16_rne(uint32_t u) {
    uint32_t hi = u >> 16, lo = u & 0xFFFFu;
    if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u))) hi += 1; /* may carry into the exponent */
    return (uint16_t)hi;
}

/* The spec's scale: 2^(biased_exp - 127 + (mantissa != 0)) of the fp32 y, as a float. */
static float ref_pow2_ceil_bits(float y) {
    uint32_t u = f2bits(y);
    int e = (int)((u >> 23) & 0xFF) - 127 + ((u & 0x7FFFFFu) != 0);
    return pow2f(e);
}

static int is_pow2(float s) {
    int e;
    return s > 0 && isfinite(s) && frexpf(s, &e) == 0.5f;
}

/* ---------------------------------------------------------------- FP8 E4M3 */

Test(e4m3, anchor_codes) {
    static const struct { uint8_t c; float v; } t[] = {
        {0x00, 0.0f},        {0x01, 0.001953125f}, /* 2^-9: smallest subnormal */
        {0x02, 0.00390625f}, {0x07, 0.013671875f}, /* 7 * 2^-9: largest subnormal */
        {0x08, 0.015625f},   /* 2^-6: smallest normal */
        {0x30, 0.5f},        {0x38, 1.0f},         {0x39, 1.125f},  {0x3C, 1.5f},
        {0x40, 2.0f},        {0x48, 4.0f},         {0x77, 240.0f},  {0x78, 256.0f},
        {0x7D, 416.0f},      {0x7E, 448.0f},       /* max */
        {0x80, -0.0f},       {0x81, -0.001953125f}, {0xB8, -1.0f},  {0xFE, -448.0f},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        ASSERT_SAME_F(mk_e4m3_to_f32(t[i].c), t[i].v, "e4m3 0x%02X: got %a want %a", t[i].c,
                      (double)mk_e4m3_to_f32(t[i].c), (double)t[i].v);
    cr_assert(isnan(mk_e4m3_to_f32(0x7F)));
    cr_assert(isnan(mk_e4m3_to_f32(0xFF)));
}

Test(e4m3, all_256_codes_decode) {
    for (int c = 0; c < 256; c++) {
        float got = mk_e4m3_to_f32((uint8_t)c), want = ref_e4m3(c);
        if ((c & 0x7F) == 0x7F) {
            cr_assert(isnan(got), "0x%02X should be NaN", c);
            continue;
        }
        ASSERT_SAME_F(got, want, "e4m3 0x%02X: got %a want %a", c, (double)got, (double)want);
    }
}

Test(e4m3, all_256_codes_round_trip) {
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7F) == 0x7F) continue;
        uint8_t back = mk_f32_to_e4m3(mk_e4m3_to_f32((uint8_t)c));
        cr_assert_eq(back, c, "round trip 0x%02X -> 0x%02X", c, back);
    }
    cr_assert_eq(mk_f32_to_e4m3(-0.0f), 0x80);
    cr_assert_eq(mk_f32_to_e4m3(0.0f), 0x00);
}

Test(e4m3, table_after_init) {
    mk_num_init();
    for (int c = 0; c < 256; c++) {
        if ((c & 0x7F) == 0x7F) cr_assert(isnan(mk_e4m3_table[c]));
        else ASSERT_SAME_F(mk_e4m3_table[c], ref_e4m3(c), "table[0x%02X]", c);
    }
}

Test(e4m3, nan_input) {
    cr_assert_eq(mk_f32_to_e4m3(NAN) & 0x7F, 0x7F);
    cr_assert_eq(mk_f32_to_e4m3(-NAN) & 0x7F, 0x7F);
}

/* Every pair of adjacent values: the midpoint goes to the even code, one ulp off goes the
 * other way, both signs. */
Test(e4m3, midpoints_ties_to_even) {
    for (int c = 0; c < 0x7E; c++) {
        float lo = ref_e4m3(c), hi = ref_e4m3(c + 1);
        float mid = lo + (hi - lo) * 0.5f; /* exact: at most 5 significant bits */
        cr_assert(mid > lo && mid < hi);
        int even = (c & 1) ? c + 1 : c;
        for (int s = 0; s <= 1; s++) {
            float sg = s ? -1.0f : 1.0f;
            int sb = s ? 0x80 : 0;
            uint8_t g = mk_f32_to_e4m3(sg * mid);
            cr_assert_eq(g, even | sb, "mid %a between 0x%02X/0x%02X -> 0x%02X", (double)(sg * mid),
                         c, c + 1, g);
            g = mk_f32_to_e4m3(sg * nextafterf(mid, 0.0f));
            cr_assert_eq(g, c | sb, "below mid %a -> 0x%02X want 0x%02X", (double)mid, g, c | sb);
            g = mk_f32_to_e4m3(sg * nextafterf(mid, INFINITY));
            cr_assert_eq(g, (c + 1) | sb, "above mid %a -> 0x%02X", (double)mid, g);
            /* the grid points themselves and one float ulp around them */
            cr_assert_eq(mk_f32_to_e4m3(sg * lo), c | sb);
            if (c > 0) {
                cr_assert_eq(mk_f32_to_e4m3(sg * nextafterf(lo, INFINITY)), c | sb);
                cr_assert_eq(mk_f32_to_e4m3(sg * nextafterf(lo, 0.0f)), c | sb);
            }
        }
    }
}

Test(e4m3, subnormal_range) {
    const float u = 0.001953125f; /* 2^-9 */
    cr_assert_eq(mk_f32_to_e4m3(u * 0.5f), 0x00);                           /* tie 0 / 1 -> 0 */
    cr_assert_eq(mk_f32_to_e4m3(-u * 0.5f), 0x80);
    cr_assert_eq(mk_f32_to_e4m3(nextafterf(u * 0.5f, 1.0f)), 0x01);
    cr_assert_eq(mk_f32_to_e4m3(u * 1.5f), 0x02);                           /* tie 1 / 2 -> 2 */
    cr_assert_eq(mk_f32_to_e4m3(u * 2.5f), 0x02);                           /* tie 2 / 3 -> 2 */
    cr_assert_eq(mk_f32_to_e4m3(u * 3.5f), 0x04);
    cr_assert_eq(mk_f32_to_e4m3(u * 7.5f), 0x08);                /* tie 7 / normal 8 -> 8 */
    cr_assert_eq(mk_f32_to_e4m3(nextafterf(u * 7.5f, 0.0f)), 0x07);
    cr_assert_eq(mk_f32_to_e4m3(u * 8.5f), 0x08);                /* tie 0x08 / 0x09 -> 0x08 */
    /* fp32 subnormals and tiny normals go to (signed) zero */
    cr_assert_eq(mk_f32_to_e4m3(FLT_TRUE_MIN), 0x00);
    cr_assert_eq(mk_f32_to_e4m3(-FLT_TRUE_MIN), 0x80);
    cr_assert_eq(mk_f32_to_e4m3(1e-40f), 0x00);
    cr_assert_eq(mk_f32_to_e4m3(FLT_MIN), 0x00);
    cr_assert_eq(mk_f32_to_e4m3(nextafterf(u * 0.5f, 0.0f)), 0x00);
}

Test(e4m3, saturation) {
    const float big[] = {448.0f, nextafterf(448.0f, INFINITY), 449.0f, 464.0f, 479.0f,
                         480.0f, 1000.0f, 1e30f, FLT_MAX, INFINITY};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        cr_assert_eq(mk_f32_to_e4m3(big[i]), 0x7E, "%a", (double)big[i]);
        cr_assert_eq(mk_f32_to_e4m3(-big[i]), 0xFE, "%a", (double)-big[i]);
    }
    cr_assert_eq(mk_f32_to_e4m3(nextafterf(448.0f, 0.0f)), 0x7E);
    cr_assert_eq(mk_f32_to_e4m3(432.0f), 0x7E);                   /* tie 416 / 448 -> 448 (even) */
    cr_assert_eq(mk_f32_to_e4m3(nextafterf(432.0f, 0.0f)), 0x7D);
}

/* Dense sweep of fp32 bit patterns in [0, 448] (and the negatives) against brute force. */
Test(e4m3, sweep_vs_bruteforce) {
    const uint32_t top = f2bits(448.0f);
    long n = 0;
    for (uint32_t u = 0; u <= top; u += 2053) {
        float x = bits2f(u);
        int want = ref_to_e4m3(x);
        uint8_t g = mk_f32_to_e4m3(x);
        cr_assert_eq(g, want, "x=%a got 0x%02X want 0x%02X", (double)x, g, want);
        g = mk_f32_to_e4m3(-x);
        cr_assert_eq(g, want | 0x80, "x=%a got 0x%02X want 0x%02X", (double)-x, g, want | 0x80);
        n++;
    }
    for (int i = 0; i < 200000; i++) {
        float x = ldexpf(rnd_unit(), (int)(rnd32() % 30) - 20) * 448.0f;
        if (fabsf(x) > 448.0f) continue;
        int want = ref_to_e4m3(x);
        uint8_t g = mk_f32_to_e4m3(x);
        cr_assert_eq(g, want, "x=%a got 0x%02X want 0x%02X", (double)x, g, want);
    }
    cr_assert(n > 500000);
}

/* ---------------------------------------------------------------- E8M0 */

Test(e8m0, all_256_codes) {
    for (int c = 0; c < 256; c++) {
        float got = mk_e8m0_to_f32((uint8_t)c);
        if (c == 255) {
            cr_assert(isnan(got));
            continue;
        }
        /* 2^(c-127): a biased exponent field of c, or for c == 0 the subnormal 2^-127 */
        uint32_t want = c ? (uint32_t)c << 23 : 0x00400000u;
        cr_assert_eq(f2bits(got), want, "e8m0 %d: got %a", c, (double)got);
    }
    cr_assert_eq(mk_e8m0_to_f32(127), 1.0f);
    cr_assert_eq(mk_e8m0_to_f32(128), 2.0f);
    cr_assert_eq(mk_e8m0_to_f32(126), 0.5f);
    cr_assert_eq(mk_e8m0_to_f32(254), 0x1p127f);
    cr_assert(fpclassify(mk_e8m0_to_f32(0)) == FP_SUBNORMAL);
}

/* ---------------------------------------------------------------- FP4 E2M1 */

Test(e2m1, all_16_codes) {
    static const float hand[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    for (int c = 0; c < 16; c++) {
        ASSERT_SAME_F(ref_e2m1(c), hand[c], "self-check %d", c);
        ASSERT_SAME_F(mk_e2m1_to_f32((uint8_t)c), hand[c], "e2m1 %d", c);
        ASSERT_SAME_F(mk_e2m1_table[c], hand[c], "table %d", c);
        /* only the low nibble is used */
        ASSERT_SAME_F(mk_e2m1_to_f32((uint8_t)(c | 0xA0)), hand[c], "e2m1 0x%02X", c | 0xA0);
        cr_assert_eq(mk_f32_to_e2m1(hand[c]), c, "round trip %d", c);
    }
}

Test(e2m1, midpoints_ties_to_even) {
    static const struct { float x; float want; } t[] = {
        {0.25f, 0.0f}, {0.75f, 1.0f}, {1.25f, 1.0f}, {1.75f, 2.0f},
        {2.5f, 2.0f},  {3.5f, 4.0f},  {5.0f, 4.0f},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        for (int s = 0; s <= 1; s++) {
            float sg = s ? -1.0f : 1.0f;
            uint8_t g = mk_f32_to_e2m1(sg * t[i].x);
            ASSERT_SAME_F(mk_e2m1_table[g], sg * t[i].want, "%g -> %g want %g",
                          (double)(sg * t[i].x), (double)mk_e2m1_table[g], (double)(sg * t[i].want));
        }
    }
    /* every adjacent pair of the grid, generically: midpoint, just below, just above */
    for (int c = 0; c < 7; c++) {
        float lo = ref_e2m1(c), hi = ref_e2m1(c + 1), mid = (lo + hi) * 0.5f;
        int even = (c & 1) ? c + 1 : c;
        for (int s = 0; s <= 1; s++) {
            float sg = s ? -1.0f : 1.0f;
            int sb = s ? 8 : 0;
            cr_assert_eq(mk_f32_to_e2m1(sg * mid), even | sb, "mid %g", (double)(sg * mid));
            cr_assert_eq(mk_f32_to_e2m1(sg * nextafterf(mid, 0.0f)), c | sb, "below %g",
                         (double)mid);
            cr_assert_eq(mk_f32_to_e2m1(sg * nextafterf(mid, INFINITY)), (c + 1) | sb,
                         "above %g", (double)mid);
        }
    }
}

Test(e2m1, saturation_and_zero) {
    const float big[] = {6.0f, nextafterf(6.0f, INFINITY), 6.5f, 7.0f, 100.0f, FLT_MAX, INFINITY};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        cr_assert_eq(mk_f32_to_e2m1(big[i]), 7, "%g", (double)big[i]);
        cr_assert_eq(mk_f32_to_e2m1(-big[i]), 15, "%g", (double)-big[i]);
    }
    cr_assert_eq(mk_f32_to_e2m1(0.0f), 0);
    cr_assert_eq(mk_f32_to_e2m1(-0.0f), 8);
    cr_assert_eq(mk_f32_to_e2m1(FLT_TRUE_MIN), 0);
    cr_assert_eq(mk_f32_to_e2m1(-1e-30f), 8);
}

Test(e2m1, sweep_vs_bruteforce) {
    const uint32_t top = f2bits(8.0f);
    for (uint32_t u = 0; u <= top; u += 997) {
        float x = bits2f(u);
        int want = ref_to_e2m1(x);
        cr_assert_eq(mk_f32_to_e2m1(x), want, "x=%a", (double)x);
        cr_assert_eq(mk_f32_to_e2m1(-x), want | 8, "x=%a", (double)-x);
    }
}

/* ---------------------------------------------------------------- bf16 and f16 */

Test(bf16, ties_to_even_and_specials) {
    cr_assert_eq(mk_f32_to_bf16(bits2f(0x3F808000u)), 0x3F80); /* tie, even below: down */
    cr_assert_eq(mk_f32_to_bf16(bits2f(0x3F818000u)), 0x3F82); /* tie, odd below: up */
    cr_assert_eq(mk_f32_to_bf16(bits2f(0x3F808001u)), 0x3F81); /* just above a tie: up */
    cr_assert_eq(mk_f32_to_bf16(bits2f(0x3F807FFFu)), 0x3F80); /* just below a tie: down */
    cr_assert_eq(mk_f32_to_bf16(bits2f(0xBF808000u)), 0xBF80);
    cr_assert_eq(mk_f32_to_bf16(bits2f(0xBF818000u)), 0xBF82);
    cr_assert_eq(mk_f32_to_bf16(1.0f), 0x3F80);
    cr_assert_eq(mk_f32_to_bf16(-2.0f), 0xC000);
    cr_assert_eq(mk_f32_to_bf16(0.0f), 0x0000);
    cr_assert_eq(mk_f32_to_bf16(-0.0f), 0x8000);
    cr_assert_eq(mk_f32_to_bf16(INFINITY), 0x7F80);
    cr_assert_eq(mk_f32_to_bf16(-INFINITY), 0xFF80);
    /* overflow at the top: FLT_MAX rounds up to inf; the largest finite bf16 stays */
    cr_assert_eq(mk_f32_to_bf16(FLT_MAX), 0x7F80);
    cr_assert_eq(mk_f32_to_bf16(-FLT_MAX), 0xFF80);
    cr_assert_eq(mk_f32_to_bf16(bits2f(0x7F7F7FFFu)), 0x7F7F);
    cr_assert_eq(mk_f32_to_bf16(bits2f(0x7F7F8000u)), 0x7F80); /* tie, odd: up into inf */
    /* subnormal carry into the smallest normal */
    cr_assert_eq(mk_f32_to_bf16(bits2f(0x007FFFFFu)), 0x0080);
    cr_assert_eq(mk_f32_to_bf16(bits2f(0x00008000u)), 0x0000);
    cr_assert_eq(mk_f32_to_bf16(bits2f(0x00018000u)), 0x0002);
    /* mk_bf16r */
    cr_assert_eq(f2bits(mk_bf16r(bits2f(0x3F818000u))), 0x3F820000u);
    cr_assert_eq(mk_bf16r(1.0f + 0x1p-9f), 1.0f);
}

static void check_bf16_nan(uint32_t u) {
    uint16_t h = mk_f32_to_bf16(bits2f(u));
    cr_assert((h & 0x7F80) == 0x7F80 && (h & 0x7F) != 0, "NaN 0x%08X -> 0x%04X", u, h);
    cr_assert((h & 0x40) != 0, "NaN 0x%08X -> 0x%04X not quiet", u, h);
    cr_assert((h & 0x8000) == ((u >> 16) & 0x8000), "NaN sign 0x%08X -> 0x%04X", u, h);
    cr_assert(isnan(mk_bf16r(bits2f(u))));
}

Test(bf16, nan_stays_nan) {
    const uint32_t nans[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7F80FFFFu,
                             0x7FBFFFFFu, 0x7FFFFFFFu, 0xFFFFFFFFu, 0x7F808000u};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) check_bf16_nan(nans[i]);
    cr_assert(isnan(mk_bf16_to_f32(0x7FC0)));
    cr_assert(isnan(mk_bf16_to_f32(0x7F81)));
}

static void check_bf16_pattern(uint32_t u) {
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
        check_bf16_nan(u);
        return;
    }
    uint16_t want = ref_bf16_rne(u), got = mk_f32_to_bf16(bits2f(u));
    cr_assert_eq(got, want, "bf16(0x%08X) = 0x%04X want 0x%04X", u, got, want);
}

Test(bf16, sweep_vs_integer_rne) {
    for (uint32_t i = 0; i < (1u << 20); i++) check_bf16_pattern(i << 12);
    static const uint32_t low[] = {0x0000u, 0x0001u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu};
    for (uint32_t hi = 0; hi < 0x10000u; hi++)
        for (size_t j = 0; j < sizeof low / sizeof low[0]; j++) check_bf16_pattern(hi << 16 | low[j]);
    for (int i = 0; i < 1000000; i++) check_bf16_pattern(rnd32());
}

/* bf16 -> f32 for all 65536 codes, decoded from sign / exponent / mantissa. */
Test(bf16, all_codes_decode) {
    for (uint32_t h = 0; h < 0x10000u; h++) {
        int s = (int)(h >> 15), e = (int)((h >> 7) & 0xFF), m = (int)(h & 0x7F);
        float got = mk_bf16_to_f32((uint16_t)h);
        if (e == 255) {
            if (m) cr_assert(isnan(got), "0x%04X", h);
            else cr_assert(isinf(got) && (signbit(got) != 0) == s, "0x%04X", h);
            continue;
        }
        double v = e == 0 ? (double)m * (double)pow2f(-133)
                          : (1.0 + m / 128.0) * (double)pow2f(e - 127);
        float want = (float)(s ? -v : v);
        ASSERT_SAME_F(got, want, "bf16 0x%04X: got %a want %a", h, (double)got, (double)want);
        /* and it round-trips */
        cr_assert_eq(mk_f32_to_bf16(got), h, "bf16 round trip 0x%04X", h);
    }
}

/* IEEE half -> f32 for all 65536 codes. */
Test(f16, all_codes_decode) {
    for (uint32_t h = 0; h < 0x10000u; h++) {
        int s = (int)(h >> 15), e = (int)((h >> 10) & 0x1F), m = (int)(h & 0x3FF);
        float got = mk_f16_to_f32((uint16_t)h);
        if (e == 31) {
            if (m) cr_assert(isnan(got), "0x%04X", h);
            else cr_assert(isinf(got) && (signbit(got) != 0) == s, "0x%04X", h);
            continue;
        }
        /* normal: f32 bits with the exponent rebiased; subnormal: m * 2^-24 */
        float want = e ? bits2f((uint32_t)s << 31 | (uint32_t)(e - 15 + 127) << 23 | (uint32_t)m << 13)
                       : (float)((s ? -1.0 : 1.0) * m * (double)pow2f(-24));
        ASSERT_SAME_F(got, want, "f16 0x%04X: got %a want %a", h, (double)got, (double)want);
    }
    cr_assert_eq(mk_f16_to_f32(0x3C00), 1.0f);
    cr_assert_eq(mk_f16_to_f32(0x7BFF), 65504.0f);
    cr_assert_eq(mk_f16_to_f32(0x0001), 0x1p-24f);
}

/* ---------------------------------------------------------------- mk_pow2_ceil */

Test(pow2_ceil, powers_and_neighbours) {
    for (int k = -126; k <= 127; k++) {
        float p = pow2f(k);
        ASSERT_SAME_F(mk_pow2_ceil(p), p, "2^%d stays", k);
        if (k < 127)
            ASSERT_SAME_F(mk_pow2_ceil(nextafterf(p, INFINITY)), pow2f(k + 1), "just above 2^%d", k);
        if (k > -126)
            ASSERT_SAME_F(mk_pow2_ceil(nextafterf(p, 0.0f)), p, "just below 2^%d", k);
        if (k < 127) ASSERT_SAME_F(mk_pow2_ceil(p * 1.5f), pow2f(k + 1), "1.5 * 2^%d", k);
    }
    cr_assert_eq(mk_pow2_ceil(3.0f), 4.0f);
    cr_assert_eq(mk_pow2_ceil(0.75f), 1.0f);
    cr_assert_eq(mk_pow2_ceil(0.2232142857f), 0.25f);
    cr_assert_eq(mk_pow2_ceil(1e-4f * (1.0f / 448.0f)), 0x1p-22f);
}

/* The spec computes the exponent from the fp32 bits: a subnormal has a zero exponent field, so
 * it maps to 2^(0 - 127 + 1) = 2^-126 whatever its value (the reference's fast_log2_ceil). */
Test(pow2_ceil, subnormal_inputs) {
    const uint32_t sub[] = {0x00000001u, 0x00000002u, 0x00001000u, 0x00400000u, 0x007FFFFFu};
    for (size_t i = 0; i < sizeof sub / sizeof sub[0]; i++)
        ASSERT_SAME_F(mk_pow2_ceil(bits2f(sub[i])), 0x1p-126f, "sub 0x%08X", sub[i]);
    ASSERT_SAME_F(mk_pow2_ceil(FLT_MIN), 0x1p-126f, "FLT_MIN");
}

Test(pow2_ceil, sweep_vs_bits) {
    for (uint32_t u = 0x00000001u; u < 0x7F000000u; u += 4093) {
        float x = bits2f(u);
        ASSERT_SAME_F(mk_pow2_ceil(x), ref_pow2_ceil_bits(x), "x=%a", (double)x);
    }
}

/* ---------------------------------------------------------------- FP8 activation quantizer */

/* Independent reference of act_quant on one block: returns s, fills q. */
static float ref_act_quant(const float *x, int n, float *q) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > amax) amax = a;
    }
    if (amax < 1e-4f) amax = 1e-4f;
    float s = ref_pow2_ceil_bits(amax * (1.0f / 448.0f));
    for (int i = 0; i < n; i++) {
        float v = x[i] / s;
        if (v > 448.0f) v = 448.0f;
        if (v < -448.0f) v = -448.0f;
        q[i] = ref_e4m3(ref_to_e4m3(v));
    }
    return s;
}

static float block_amax(const float *x, int n) {
    float m = 0;
    for (int i = 0; i < n; i++) m = fabsf(x[i]) > m ? fabsf(x[i]) : m;
    return m;
}

Test(act_quant, hand_computed_block) {
    const float x[8] = {1.0f, -0.5f, 3.0f, 0.1f, 100.0f, -7.0f, 0.0f, 2.5f};
    /* amax = 100, 100/448 = 0.223 -> s = 0.25; x/s = 4, -2, 12, 0.4, 400, -28, 0, 10;
     * 0.4 -> 13 * 2^-5 = 0.40625 (binade [.25,.5), step 1/32); 400 is the tie 384 / 416 -> 384 */
    const float want_q[8] = {4.0f, -2.0f, 12.0f, 0.40625f, 384.0f, -28.0f, 0.0f, 10.0f};
    const float want_sim[8] = {1.0f, -0.5f, 3.0f, 0.1015625f, 96.0f, -7.0f, 0.0f, 2.5f};
    float q[8];
    float s = mk_act_quant_block(x, 8, q);
    cr_assert_eq(s, 0.25f);
    for (int i = 0; i < 8; i++) ASSERT_SAME_F(q[i], want_q[i], "q[%d] = %g", i, (double)q[i]);
    float y[8];
    memcpy(y, x, sizeof y);
    mk_act_quant_sim(y, 8, 8);
    for (int i = 0; i < 8; i++) ASSERT_SAME_F(y[i], want_sim[i], "sim[%d] = %g", i, (double)y[i]);
}

Test(act_quant, floor_all_zero) {
    float x[64] = {0}, q[64];
    float s = mk_act_quant_block(x, 64, q);
    /* log2(1e-4 / 448) = -22.09 -> s = 2^-22 */
    cr_assert_eq(s, 0x1p-22f, "s = %a", (double)s);
    for (int i = 0; i < 64; i++) cr_assert_eq(q[i], 0.0f);
    /* a tiny block below the floor uses the same scale */
    x[3] = 1e-6f;
    x[7] = -3e-5f;
    s = mk_act_quant_block(x, 64, q);
    cr_assert_eq(s, 0x1p-22f);
    ASSERT_SAME_F(q[3], ref_e4m3(ref_to_e4m3(1e-6f / 0x1p-22f)), "q[3]");
    ASSERT_SAME_F(q[7], ref_e4m3(ref_to_e4m3(-3e-5f / 0x1p-22f)), "q[7]");
    /* just above the floor: 2e-4 / 448 = 4.46e-7 -> 2^-21 */
    x[0] = 2e-4f;
    cr_assert_eq(mk_act_quant_block(x, 64, q), 0x1p-21f);
}

/* Values exactly at 448 * 2^k keep s = 2^k (amax / s = 448), one ulp above doubles s. */
Test(act_quant, scale_boundaries) {
    for (int k = -20; k <= 20; k++) {
        float x[4] = {0.5f * pow2f(k), 448.0f * pow2f(k), 0, 0}, q[4];
        float s = mk_act_quant_block(x, 4, q);
        cr_assert_eq(s, pow2f(k), "k=%d s=%a", k, (double)s);
        cr_assert_eq(q[1], 448.0f);
        x[1] = nextafterf(x[1], INFINITY);
        s = mk_act_quant_block(x, 4, q);
        cr_assert_eq(s, pow2f(k + 1), "k=%d above: s=%a", k, (double)s);
        x[1] = -224.0f * pow2f(k);
        s = mk_act_quant_block(x, 4, q);
        cr_assert_eq(s, pow2f(k - 1), "k=%d 224: s=%a", k, (double)s);
        cr_assert_eq(q[1], -448.0f);
    }
}

Test(act_quant, random_blocks_vs_reference) {
    float x[128], q[128], rq[128];
    for (int t = 0; t < 3000; t++) {
        int n = 1 + (int)(rnd32() % 128);
        int mag = (int)(rnd32() % 50) - 30;
        for (int i = 0; i < n; i++) x[i] = ldexpf(rnd_unit(), mag - (int)(rnd32() % 12));
        if (t % 7 == 0) x[rnd32() % (uint32_t)n] = 0.0f;
        float s = mk_act_quant_block(x, n, q);
        float rs = ref_act_quant(x, n, rq);
        ASSERT_SAME_F(s, rs, "t=%d s=%a want %a", t, (double)s, (double)rs);
        cr_assert(is_pow2(s));
        float amax = block_amax(x, n);
        if (amax < 1e-4f) amax = 1e-4f;
        float r = amax / s;
        cr_assert(r > 224.0f && r <= 448.0f, "t=%d amax/s = %g", t, (double)r);
        for (int i = 0; i < n; i++)
            ASSERT_SAME_F(q[i], rq[i], "t=%d x=%a q=%a want %a", t, (double)x[i], (double)q[i],
                          (double)rq[i]);
    }
}

/* sim: x <- bf16(q * s) per block; n = 192 in blocks of 64 has three independent scales, and a
 * ragged tail block gets its own. */
static void check_act_sim(int n, int block) {
    float x[2048], y[2048], q[2048];
    cr_assert(n <= 2048);
    for (int i = 0; i < n; i++) {
        int b = i / block;
        x[i] = rnd_unit() * (b % 3 == 0 ? 1e-3f : b % 3 == 1 ? 1.0f : 1000.0f);
    }
    memcpy(y, x, sizeof(float) * (size_t)n);
    mk_act_quant_sim(y, n, block);
    int nb = 0;
    for (int b = 0; b < n; b += block, nb++) {
        int m = n - b < block ? n - b : block;
        float s = ref_act_quant(x + b, m, q);
        float amax = block_amax(x + b, m);
        if (amax < 1e-4f) amax = 1e-4f;
        cr_assert(amax / s > 224.0f && amax / s <= 448.0f, "amax %a s %a", (double)amax, (double)s);
        for (int i = 0; i < m; i++) {
            float want = bits2f((uint32_t)ref_bf16_rne(f2bits(q[i] * s)) << 16);
            ASSERT_SAME_F(y[b + i], want, "n=%d block=%d i=%d: %a want %a", n, block, b + i,
                          (double)y[b + i], (double)want);
            cr_assert_eq(f2bits(y[b + i]) & 0xFFFFu, 0u, "not a bf16 value");
        }
    }
    cr_assert_eq(nb, (n + block - 1) / block);
}

Test(act_quant, sim_blocks) {
    check_act_sim(192, 64);
    check_act_sim(150, 64);
    check_act_sim(448, 64);
    check_act_sim(512, 128);
    check_act_sim(1, 128);
    check_act_sim(2048, 1024); /* blocks wider than any fixed scratch buffer */
    /* the three blocks really do get different scales: a small block is not flushed by the
     * large scale of its neighbour */
    float x[192];
    for (int i = 0; i < 192; i++) x[i] = i < 64 ? 1e-3f : i < 128 ? 1.0f : 1000.0f;
    mk_act_quant_sim(x, 192, 64);
    cr_assert_eq(x[0], mk_bf16r(ref_e4m3(ref_to_e4m3(1e-3f / 0x1p-18f)) * 0x1p-18f));
    cr_assert(x[0] > 9e-4f && x[0] < 1.1e-3f);
    cr_assert_eq(x[64], 1.0f);
    cr_assert_eq(x[191], 1024.0f); /* s = 4: 1000 / 4 = 250 -> 256 (step 16 in [128, 256)) */
}

/* mk_act_quant_block must not depend on mk_num_init() having run (Criterion runs every test in
 * its own process, so nothing has initialized the table here). */
Test(act_quant, works_without_init) {
    const float x[4] = {1.0f, 2.0f, -3.0f, 0.5f};
    float q[4];
    float s = mk_act_quant_block(x, 4, q);
    cr_assert_eq(s, 1.0f / 128.0f);
    for (int i = 0; i < 4; i++) cr_assert_eq(q[i], x[i] * 128.0f, "q[%d] = %g", i, (double)q[i]);
}

/* ---------------------------------------------------------------- FP4 activation quantizer */

static float ref_fp4_quant(const float *x, int n, float *q) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > amax) amax = a;
    }
    const float floor_ = 6.0f * pow2f(-126);
    if (amax < floor_) amax = floor_;
    float s = ref_pow2_ceil_bits(amax / 6.0f);
    for (int i = 0; i < n; i++) {
        float v = x[i] / s;
        if (v > 6.0f) v = 6.0f;
        if (v < -6.0f) v = -6.0f;
        q[i] = ref_e2m1(ref_to_e2m1(v));
    }
    return s;
}

Test(fp4_quant, hand_computed_block) {
    const float x[8] = {1.0f, -0.3f, 2.9f, 12.0f, -5.0f, 0.0f, 0.26f, 7.5f};
    /* amax = 12 -> 12/6 = 2 exactly -> s = 2; x/s = .5, -.15, 1.45, 6, -2.5, 0, .13, 3.75 */
    const float want_q[8] = {0.5f, -0.0f, 1.5f, 6.0f, -2.0f, 0.0f, 0.0f, 4.0f};
    const float want_sim[8] = {1.0f, -0.0f, 3.0f, 12.0f, -4.0f, 0.0f, 0.0f, 8.0f};
    float q[8];
    float s = mk_fp4_quant_block(x, 8, q);
    cr_assert_eq(s, 2.0f);
    for (int i = 0; i < 8; i++) ASSERT_SAME_F(q[i], want_q[i], "q[%d] = %g", i, (double)q[i]);
    float y[8];
    memcpy(y, x, sizeof y);
    mk_fp4_quant_sim(y, 8, 8);
    for (int i = 0; i < 8; i++) ASSERT_SAME_F(y[i], want_sim[i], "sim[%d] = %g", i, (double)y[i]);
}

Test(fp4_quant, floor) {
    float x[32] = {0}, q[32];
    float s = mk_fp4_quant_block(x, 32, q);
    cr_assert_eq(f2bits(s), 0x00800000u, "s = %a, want 2^-126", (double)s);
    for (int i = 0; i < 32; i++) cr_assert_eq(q[i], 0.0f);
    /* a subnormal-sized block also sits on the floor */
    x[5] = 1e-39f;
    cr_assert_eq(f2bits(mk_fp4_quant_block(x, 32, q)), 0x00800000u);
    /* 12 * 2^-126 / 6 = 2^-125 */
    x[5] = 12.0f * pow2f(-126);
    cr_assert_eq(mk_fp4_quant_block(x, 32, q), pow2f(-125));
    cr_assert_eq(q[5], 6.0f);
}

Test(fp4_quant, scale_boundaries) {
    for (int k = -20; k <= 20; k++) {
        float x[3] = {6.0f * pow2f(k), 0.25f * pow2f(k), 0}, q[3];
        cr_assert_eq(mk_fp4_quant_block(x, 3, q), pow2f(k), "k=%d", k);
        x[0] = nextafterf(x[0], INFINITY);
        cr_assert_eq(mk_fp4_quant_block(x, 3, q), pow2f(k + 1), "k=%d above", k);
        x[0] = -3.0f * pow2f(k);
        cr_assert_eq(mk_fp4_quant_block(x, 3, q), pow2f(k - 1), "k=%d 3", k);
        cr_assert_eq(q[0], -6.0f);
    }
}

Test(fp4_quant, random_blocks_vs_reference) {
    float x[32], q[32], rq[32];
    for (int t = 0; t < 5000; t++) {
        int n = 1 + (int)(rnd32() % 32);
        int mag = (int)(rnd32() % 60) - 40;
        for (int i = 0; i < n; i++) x[i] = ldexpf(rnd_unit(), mag - (int)(rnd32() % 6));
        float s = mk_fp4_quant_block(x, n, q);
        float rs = ref_fp4_quant(x, n, rq);
        ASSERT_SAME_F(s, rs, "t=%d s=%a want %a", t, (double)s, (double)rs);
        cr_assert(is_pow2(s));
        float r = block_amax(x, n) / s;
        cr_assert(r > 3.0f && r <= 6.0f, "t=%d amax/s = %g", t, (double)r);
        for (int i = 0; i < n; i++)
            ASSERT_SAME_F(q[i], rq[i], "t=%d x=%a q=%a want %a", t, (double)x[i], (double)q[i],
                          (double)rq[i]);
    }
}

static void check_fp4_sim(int n, int block) {
    float x[2048], y[2048], q[2048];
    cr_assert(n <= 2048);
    for (int i = 0; i < n; i++) x[i] = rnd_unit() * ((i / block) % 2 ? 0.01f : 50.0f);
    memcpy(y, x, sizeof(float) * (size_t)n);
    mk_fp4_quant_sim(y, n, block);
    for (int b = 0; b < n; b += block) {
        int m = n - b < block ? n - b : block;
        float s = ref_fp4_quant(x + b, m, q);
        for (int i = 0; i < m; i++) {
            float want = bits2f((uint32_t)ref_bf16_rne(f2bits(q[i] * s)) << 16);
            ASSERT_SAME_F(y[b + i], want, "n=%d block=%d i=%d", n, block, b + i);
        }
    }
}

Test(fp4_quant, sim_blocks) {
    check_fp4_sim(96, 32);
    check_fp4_sim(100, 32);
    check_fp4_sim(192, 64);
    check_fp4_sim(2048, 1024);
}
