/* test_ggml_quant.c — the ggml block formats (src/num/ggml_quant.c).
 *
 *   1. half <-> float conversion: exhaustive over all 65536 halves against F16C (and against
 *      mk_f16_to_f32), and float -> half against F16C on edge values and random bits;
 *   2. per type, a hand-built block whose dequantized values were worked out by hand from the
 *      format description (the expected numbers are written in the test, not computed by the code
 *      under test), and a hand-worked dot product;
 *   3. the activation quantizers on hand-picked inputs (round-half-even, the half-rounded Q8_0
 *      scale, Q8_1's s, Q8_K's first-maximum sign rule and bsums);
 *   4. random blocks: scalar and AVX2 dequantization, activation quantization and dots are bit-for-
 *      bit equal, and the dot agrees with sum(dequant(w) * x) within the activation's quantization
 *      error (and with sum(dequant(w) * dequant(act)) to fp32 rounding);
 *   5. mk_ggml_matmul: threaded == unthreaded == row-by-row vec_dot, m = 1 and m > 1 (which
 *      also covers the four-row kernels of Q8_0 / Q4_1, whose llama.cpp order is checked against
 *      a brute-force restatement in test_ggml_exact.c);
 *   6. invalid types and sizes give 0 / NaN, never a crash.
 *
 * The .c file is included so the scalar and AVX2 kernels can be called side by side.
 */
#include <criterion/criterion.h>

#include "num/ggml_quant.c"

#include "base/threads.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers --------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}
static float rndu(void) { return (float)(rnd() >> 40) * 0x1p-24f; } /* [0, 1) */
static float rnds(void) { return rndu() * 2.0f - 1.0f; }               /* [-1, 1) */

static void wr16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }

static const type_info *T(uint32_t type) {
    const type_info *t = find_type(type);
    cr_assert(t, "type %u missing", type);
    return t;
}

static int simd_here(void) {
    int s = use_simd();
    if (!s) cr_log_info("no AVX2/FMA/F16C here: scalar-vs-AVX2 checks are skipped"); /* a warning fails the run */
    return s;
}

static float dq1(uint32_t type, const uint8_t *blk, int e) {
    float y[256];
    const type_info *t = T(type);
    t->dq[0](blk, y, 1);
    float s = y[e];
    if (use_simd() && t->dq[1]) {
        t->dq[1](blk, y, 1);
        cr_assert(mk_f32_bits(y[e]) == mk_f32_bits(s), "AVX2 dequant differs at %d", e);
    }
    return s;
}

#define EXPECT_F(got, want)                                                                      \
    cr_assert((got) == (want), "%s: got %.9g, want %.9g", #got, (double)(got), (double)(want))

/* ---- 1. half conversion ---------------------------------------------------------------- */

#if MK_HAVE_X86
MK_AVX2 static uint32_t f16c_widen(uint16_t h) {
    __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)h));
    return (uint32_t)_mm_cvtsi128_si32(_mm_castps_si128(f));
}
#endif

Test(ggml_quant, half_to_float_exhaustive) {
    for (uint32_t h = 0; h < 65536; h++) {
        float v = h2f((uint16_t)h);
        float ref = mk_f16_to_f32((uint16_t)h);
        if (isnan(ref)) cr_assert(isnan(v), "h %04x", h);
        else cr_assert(mk_f32_bits(v) == mk_f32_bits(ref), "h %04x: %g vs %g", h, v, ref);
#if MK_HAVE_X86
        if (use_simd()) cr_assert(mk_f32_bits(v) == f16c_widen((uint16_t)h), "h %04x vs F16C", h);
#endif
    }
}

#if MK_HAVE_X86
MK_AVX2 static uint16_t f16c_round(float f) {
    return (uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0);
}
#endif

Test(ggml_quant, float_to_half) {
    /* hand values: 1 -> 0x3c00, 65504 max, 65520 (tie above max) -> inf, 2^-24 smallest
     * subnormal, 2^-25 (tie with 0) -> 0, 3 * 2^-25 (tie between 1 and 2 steps) -> 2 steps,
     * 1 + 2^-11 (tie, even) -> 1.0, 1 + 3 * 2^-11 (tie) -> 1 + 2^-9 */
    cr_assert_eq(f2h(1.0f), 0x3c00);
    cr_assert_eq(f2h(-2.0f), 0xc000);
    cr_assert_eq(f2h(65504.0f), 0x7bff);
    cr_assert_eq(f2h(65519.0f), 0x7bff);
    cr_assert_eq(f2h(65520.0f), 0x7c00);
    cr_assert_eq(f2h(0x1p-24f), 0x0001);
    cr_assert_eq(f2h(0x1p-25f), 0x0000);
    cr_assert_eq(f2h(3 * 0x1p-25f), 0x0002);
    cr_assert_eq(f2h(1.0f + 0x1p-11f), 0x3c00);
    cr_assert_eq(f2h(1.0f + 3 * 0x1p-11f), 0x3c02);
    cr_assert_eq(f2h(0x1p-14f), 0x0400);
    cr_assert_eq(f2h(-0.0f), 0x8000);
    cr_assert_eq(f2h(INFINITY), 0x7c00);
#if MK_HAVE_X86
    if (!simd_here()) return;
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)rnd();
        if (i & 1) u = (u & 0x80000000u) | ((u & 0x0fffffffu) + 0x30000000u); /* near half range */
        float f = mk_f32_from_bits(u);
        cr_assert_eq(f2h(f), f16c_round(f), "f %08x: %04x vs %04x", u, f2h(f), f16c_round(f));
    }
#endif
}

/* ---- 2. hand-built blocks ------------------------------------------------------------------ */

Test(ggml_quant, table) {
    cr_assert(mk_ggml_type_supported(MK_GGML_Q4_1));
    cr_assert(mk_ggml_type_supported(MK_GGML_Q5_0) && mk_ggml_type_supported(MK_GGML_Q5_1));
    cr_assert(!mk_ggml_type_supported(MK_GGML_Q2_K));
    cr_assert(!mk_ggml_type_supported(MK_GGML_Q8_K));
    cr_assert_eq(mk_ggml_row_bytes(MK_GGML_Q4_0, 64), 36);
    cr_assert_eq(mk_ggml_row_bytes(MK_GGML_Q4_1, 32), 20);
    cr_assert_eq(mk_ggml_row_bytes(MK_GGML_Q8_0, 96), 102);
    cr_assert_eq(mk_ggml_row_bytes(MK_GGML_Q5_0, 64), 44);
    cr_assert_eq(mk_ggml_row_bytes(MK_GGML_Q5_1, 32), 24);
    cr_assert_eq(mk_ggml_row_bytes(MK_GGML_Q4_K, 512), 288);
    cr_assert_eq(mk_ggml_row_bytes(MK_GGML_Q5_K, 256), 176);
    cr_assert_eq(mk_ggml_row_bytes(MK_GGML_Q6_K, 256), 210);
    cr_assert_eq(mk_ggml_row_bytes(MK_GGML_BF16, 3), 6);
    cr_assert_eq(mk_ggml_row_bytes(MK_GGML_Q4_0, 48), 0);
    cr_assert_eq(mk_ggml_row_bytes(MK_GGML_Q4_K, 576), 0);
    cr_assert_eq(mk_ggml_row_bytes(MK_GGML_F32, 0), 0);
    cr_assert_eq(mk_ggml_row_bytes(99, 32), 0);
    cr_assert_eq(mk_ggml_act_type(MK_GGML_Q4_1), MK_GGML_Q8_1);
    cr_assert_eq(mk_ggml_act_type(MK_GGML_Q4_0), MK_GGML_Q8_0);
    cr_assert_eq(mk_ggml_act_type(MK_GGML_Q5_0), MK_GGML_Q8_0);
    cr_assert_eq(mk_ggml_act_type(MK_GGML_Q5_1), MK_GGML_Q8_1);
    cr_assert_eq(mk_ggml_act_type(MK_GGML_Q5_K), MK_GGML_Q8_K);
    cr_assert_eq(mk_ggml_act_type(MK_GGML_F16), MK_GGML_F16);
}

Test(ggml_quant, hand_float_types) {
    float f = 1.5f;
    uint8_t b[8];
    memcpy(b, &f, 4);
    EXPECT_F(dq1(MK_GGML_F32, b, 0), 1.5f);
    /* f16: 0x3555 = 2^-2 * (1 + 341/1024) = 0.333251953125; 0x0001 = 2^-24 */
    wr16(b, 0x3555);
    wr16(b + 2, 0x0001);
    wr16(b + 4, 0x7bff);
    float y[3];
    mk_ggml_dequant_row(MK_GGML_F16, b, y, 3);
    EXPECT_F(y[0], 0.333251953125f);
    EXPECT_F(y[1], 0x1p-24f);
    EXPECT_F(y[2], 65504.0f);
    /* bf16: 0x3fc0 = 1.5, 0xc040 = -3 */
    wr16(b, 0x3fc0);
    wr16(b + 2, 0xc040);
    mk_ggml_dequant_row(MK_GGML_BF16, b, y, 2);
    EXPECT_F(y[0], 1.5f);
    EXPECT_F(y[1], -3.0f);
}

/* Q4_0: d = 0.5 (0x3800); qs[0] = 0x9f: element 0 = 15 -> (15-8)*0.5 = 3.5, element 16 = 9 -> 0.5;
 * qs[1] = 0x08: element 1 = 0, element 17 = (0-8)*0.5 = -4; other bytes 0x88 -> 0. */
static void hand_q4_0(uint8_t *blk) {
    wr16(blk, 0x3800);
    memset(blk + 2, 0x88, 16);
    blk[2] = 0x9f;
    blk[3] = 0x08;
}

Test(ggml_quant, hand_q4_0) {
    uint8_t blk[18];
    hand_q4_0(blk);
    EXPECT_F(dq1(MK_GGML_Q4_0, blk, 0), 3.5f);
    EXPECT_F(dq1(MK_GGML_Q4_0, blk, 16), 0.5f);
    EXPECT_F(dq1(MK_GGML_Q4_0, blk, 1), 0.0f);
    EXPECT_F(dq1(MK_GGML_Q4_0, blk, 17), -4.0f);
    EXPECT_F(dq1(MK_GGML_Q4_0, blk, 31), 0.0f);
}

/* Q4_1: d = 1 (0x3c00), m = -1 (0xbc00); qs[0] = 0x2f: e0 = 15 - 1 = 14, e16 = 2 - 1 = 1;
 * qs[15] = 0x01: e15 = 1 - 1 = 0, e31 = 0 - 1 = -1; other bytes 0 -> -1. */
static void hand_q4_1(uint8_t *blk) {
    wr16(blk, 0x3c00);
    wr16(blk + 2, 0xbc00);
    memset(blk + 4, 0, 16);
    blk[4] = 0x2f;
    blk[4 + 15] = 0x01;
}

Test(ggml_quant, hand_q4_1) {
    uint8_t blk[20];
    hand_q4_1(blk);
    EXPECT_F(dq1(MK_GGML_Q4_1, blk, 0), 14.0f);
    EXPECT_F(dq1(MK_GGML_Q4_1, blk, 16), 1.0f);
    EXPECT_F(dq1(MK_GGML_Q4_1, blk, 15), 0.0f);
    EXPECT_F(dq1(MK_GGML_Q4_1, blk, 31), -1.0f);
    EXPECT_F(dq1(MK_GGML_Q4_1, blk, 7), -1.0f);
}

/* Q5_0: d = 1; qh = 0x80010001 (bits 0, 16, 31: elements 0, 16, 31 get 16).
 * qs[0] = 0x3f: element 0 = 15 | 16 = 31 -> 15, element 16 = 3 | 16 = 19 -> 3;
 * qs[15] = 0x80: element 15 = 0 -> -16, element 31 = 8 | 16 = 24 -> 8; all other elements
 * q = 0 -> -16. */
static void hand_q5(uint8_t *blk, int with_m) {
    int o = with_m ? 4 : 2;
    memset(blk, 0, 24);
    if (with_m) { /* Q5_1: d = 0.5, m = 2: x = q * 0.5 + 2 */
        wr16(blk, 0x3800);
        wr16(blk + 2, 0x4000);
    } else {
        wr16(blk, 0x3c00);
    }
    blk[o] = 0x01;
    blk[o + 2] = 0x01;
    blk[o + 3] = 0x80;
    blk[o + 4] = 0x3f;
    blk[o + 4 + 15] = 0x80;
}

Test(ggml_quant, hand_q5_0_q5_1) {
    uint8_t blk[24];
    hand_q5(blk, 0);
    EXPECT_F(dq1(MK_GGML_Q5_0, blk, 0), 15.0f);
    EXPECT_F(dq1(MK_GGML_Q5_0, blk, 16), 3.0f);
    EXPECT_F(dq1(MK_GGML_Q5_0, blk, 15), -16.0f);
    EXPECT_F(dq1(MK_GGML_Q5_0, blk, 31), 8.0f);
    EXPECT_F(dq1(MK_GGML_Q5_0, blk, 1), -16.0f);
    /* Q5_1: 31 * 0.5 + 2 = 17.5; 19 * 0.5 + 2 = 11.5; 0 -> 2; 24 * 0.5 + 2 = 14 */
    hand_q5(blk, 1);
    EXPECT_F(dq1(MK_GGML_Q5_1, blk, 0), 17.5f);
    EXPECT_F(dq1(MK_GGML_Q5_1, blk, 16), 11.5f);
    EXPECT_F(dq1(MK_GGML_Q5_1, blk, 15), 2.0f);
    EXPECT_F(dq1(MK_GGML_Q5_1, blk, 31), 14.0f);
}

/* Q8_0: d = 0.25 (0x3400); q[0] = -128 -> -32, q[5] = -3 -> -0.75, q[31] = 127 -> 31.75. */
static void hand_q8_0(uint8_t *blk) {
    wr16(blk, 0x3400);
    memset(blk + 2, 0, 32);
    blk[2] = 0x80;
    blk[2 + 5] = (uint8_t)-3;
    blk[2 + 31] = 127;
}

Test(ggml_quant, hand_q8_0) {
    uint8_t blk[34];
    hand_q8_0(blk);
    EXPECT_F(dq1(MK_GGML_Q8_0, blk, 0), -32.0f);
    EXPECT_F(dq1(MK_GGML_Q8_0, blk, 5), -0.75f);
    EXPECT_F(dq1(MK_GGML_Q8_0, blk, 31), 31.75f);
    EXPECT_F(dq1(MK_GGML_Q8_0, blk, 1), 0.0f);
}

/* K-quant scales: sc0 = 2, mn0 = 1, sc5 = 33 (0b10_0001), mn5 = 50 (0b11_0010), others 0.
 *   byte 0 = sc0 = 2; byte 1 = sc1 | (sc5 >> 4) << 6 = 0x80; byte 4 = mn0 = 1;
 *   byte 5 = mn1 | (mn5 >> 4) << 6 = 0xc0; byte 9 = (sc5 & 15) | (mn5 & 15) << 4 = 0x21. */
static void hand_kscales(uint8_t *s) {
    memset(s, 0, 12);
    s[0] = 2;
    s[1] = 0x80;
    s[4] = 1;
    s[5] = 0xc0;
    s[9] = 0x21;
}

/* Q4_K: d = 1, dmin = 0.5. qs[0] = 0x07: element 0 (sub-block 0) q = 7 -> 2*7 - 0.5*1 = 13.5;
 * element 1: q = 0 -> -0.5; element 32 (sub-block 1, sc = mn = 0) -> 0.
 * qs[64 + 3] = 0xf0: element 128 + 32 + 3 = 163 (sub-block 5) q = 15 -> 33*15 - 0.5*50 = 470;
 * element 160: q = 0 -> -25; element 131 (sub-block 4, zero scales) -> 0. */
static void hand_q4_k(uint8_t *blk) {
    memset(blk, 0, 144);
    wr16(blk, 0x3c00);
    wr16(blk + 2, 0x3800);
    hand_kscales(blk + 4);
    blk[16 + 0] = 0x07;
    blk[16 + 64 + 3] = 0xf0;
}

Test(ggml_quant, hand_q4_k) {
    uint8_t blk[144];
    hand_q4_k(blk);
    EXPECT_F(dq1(MK_GGML_Q4_K, blk, 0), 13.5f);
    EXPECT_F(dq1(MK_GGML_Q4_K, blk, 1), -0.5f);
    EXPECT_F(dq1(MK_GGML_Q4_K, blk, 32), 0.0f);
    EXPECT_F(dq1(MK_GGML_Q4_K, blk, 163), 470.0f);
    EXPECT_F(dq1(MK_GGML_Q4_K, blk, 160), -25.0f);
    EXPECT_F(dq1(MK_GGML_Q4_K, blk, 131), 0.0f);
}

/* Q5_K: as Q4_K plus qh: qh[0] bit 0 -> element 0 gets 16: q = 23 -> 2*23 - 0.5 = 45.5;
 * qh[3] bit 5 -> element 163 (sub-block 5, l = 3): q = 31 -> 33*31 - 25 = 998;
 * qh[3] bit 4 (sub-block 4, zero scales) changes nothing: element 131 = 0. */
static void hand_q5_k(uint8_t *blk) {
    memset(blk, 0, 176);
    wr16(blk, 0x3c00);
    wr16(blk + 2, 0x3800);
    hand_kscales(blk + 4);
    blk[16 + 0] = 0x01;
    blk[16 + 3] = 0x30;
    blk[48 + 0] = 0x07;
    blk[48 + 64 + 3] = 0xf0;
}

Test(ggml_quant, hand_q5_k) {
    uint8_t blk[176];
    hand_q5_k(blk);
    EXPECT_F(dq1(MK_GGML_Q5_K, blk, 0), 45.5f);
    EXPECT_F(dq1(MK_GGML_Q5_K, blk, 1), -0.5f);
    EXPECT_F(dq1(MK_GGML_Q5_K, blk, 32), 0.0f);
    EXPECT_F(dq1(MK_GGML_Q5_K, blk, 163), 998.0f);
    EXPECT_F(dq1(MK_GGML_Q5_K, blk, 131), 0.0f);
}

/* Q6_K: d = 0.5 (0x3800 at byte 208); scales sc0 = 2, sc2 = -4, sc4 = 7, sc6 = -1, sc9 = 3.
 *   ql[0] = 0x5a, qh[0] = 0xe4 (2-bit fields 0, 1, 2, 3 from the bottom):
 *     element 0  = 10 | 0 << 4 = 10 -> 0.5 * 2 * (10 - 32) = -22
 *     element 32 = (ql[32] & 15 = 0) | 1 << 4 = 16 -> 0.5 * -4 * -16 = 32
 *     element 64 = 5 | 2 << 4 = 37 -> 0.5 * 7 * 5 = 17.5
 *     element 96 = (ql[32] >> 4 = 0) | 3 << 4 = 48 -> 0.5 * -1 * 16 = -8
 *   second half: ql[64 + 17] = 0x0f, qh[32 + 17] = 0x03: element 128 + 17 = 63 -> scale
 *     sc[8 + 1] = 3: 0.5 * 3 * 31 = 46.5
 *   element 1: q = 0 -> 0.5 * 2 * -32 = -32; element 20 (sc1 = 0) -> 0 */
static void hand_q6_k(uint8_t *blk) {
    memset(blk, 0, 210);
    int8_t *sc = (int8_t *)(blk + 192);
    sc[0] = 2;
    sc[2] = -4;
    sc[4] = 7;
    sc[6] = -1;
    sc[9] = 3;
    blk[0] = 0x5a;
    blk[128] = 0xe4;
    blk[64 + 17] = 0x0f;
    blk[128 + 32 + 17] = 0x03;
    wr16(blk + 208, 0x3800);
}

Test(ggml_quant, hand_q6_k) {
    uint8_t blk[210];
    hand_q6_k(blk);
    EXPECT_F(dq1(MK_GGML_Q6_K, blk, 0), -22.0f);
    EXPECT_F(dq1(MK_GGML_Q6_K, blk, 32), 32.0f);
    EXPECT_F(dq1(MK_GGML_Q6_K, blk, 64), 17.5f);
    EXPECT_F(dq1(MK_GGML_Q6_K, blk, 96), -8.0f);
    EXPECT_F(dq1(MK_GGML_Q6_K, blk, 145), 46.5f);
    EXPECT_F(dq1(MK_GGML_Q6_K, blk, 1), -32.0f);
    EXPECT_F(dq1(MK_GGML_Q6_K, blk, 20), 0.0f);
}

/* ---- 3. activation quantizers on hand-picked inputs ----------------------------------------- */

/* quantize with scalar and AVX2, check they agree, return the scalar bytes */
static void qa_both(uint32_t act_type, const float *x, int64_t n, uint8_t *out) {
    size_t nb = act_bytes(act_type, n);
    quant_act(act_type, x, n, out, 0);
    if (use_simd()) {
        uint8_t *o2 = malloc(nb);
        quant_act(act_type, x, n, o2, 1);
        cr_assert(memcmp(out, o2, nb) == 0, "act type %u: scalar and AVX2 differ", act_type);
        free(o2);
    }
}

Test(ggml_quant, hand_act_q8_0_q8_1) {
    /* amax = 127 -> d = 1 (half 0x3c00 exactly), id = 1: q = round-half-even(x) */
    float x[32] = {127, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 3.49f, -126.6f};
    uint8_t a[32 + 12];
    qa_both(MK_GGML_Q8_1, x, 32, a);
    act32 v = act32_view(a, 32);
    int want[8] = {127, 0, 2, 2, 0, -2, 3, -127};
    for (int j = 0; j < 8; j++) cr_assert_eq(v.q[j], want[j], "q[%d] = %d", j, v.q[j]);
    EXPECT_F(v.d[0], 1.0f);
    cr_assert_eq(v.sum[0], 127 + 2 + 2 - 2 + 3 - 127);
    EXPECT_F(v.s[0], 5.0f);
    /* amax = 1: d = 1/127 rounded to half = 2^-7 * (1 + 8/1024) = 0.00787353515625; all q = 127;
     * s = half(d_f32 * 4064) = half(~32.0000003) = 32 */
    for (int j = 0; j < 32; j++) x[j] = 1.0f;
    qa_both(MK_GGML_Q8_1, x, 32, a);
    v = act32_view(a, 32);
    EXPECT_F(v.d[0], 0.00787353515625f);
    cr_assert_eq(v.q[17], 127);
    cr_assert_eq(v.sum[0], 4064);
    EXPECT_F(v.s[0], 32.0f);
    /* an all-zero block: d = 0, q = 0 */
    memset(x, 0, sizeof x);
    qa_both(MK_GGML_Q8_0, x, 32, a);
    v = act32_view(a, 32);
    EXPECT_F(v.d[0], 0.0f);
    cr_assert_eq(v.q[3], 0);
    cr_assert_eq(v.sum[0], 0);
}

Test(ggml_quant, hand_act_q8_k) {
    /* max |x| = 2 at index 5 (negative) and again at 9 (positive): the first one sets the sign,
     * iscale = -127 / -2 = 63.5: x = -2 -> -127, 2 -> 127, 1 -> 63.5 -> 64 (even),
     * 0.5 -> 31.75 -> 32, -1 -> -64; d = 1 / 63.5 */
    float x[256] = {0};
    x[5] = -2.0f;
    x[9] = 2.0f;
    x[0] = 1.0f;
    x[1] = 0.5f;
    x[17] = -1.0f;
    uint8_t a[256 + 36];
    qa_both(MK_GGML_Q8_K, x, 256, a);
    actk v = actk_view(a, 256);
    cr_assert_eq(v.q[5], -127);
    cr_assert_eq(v.q[9], 127);
    cr_assert_eq(v.q[0], 64);
    cr_assert_eq(v.q[1], 32);
    cr_assert_eq(v.q[17], -64);
    cr_assert_eq(v.q[100], 0);
    EXPECT_F(v.d[0], 1.0f / 63.5f);
    cr_assert_eq(v.bsums[0], 64 + 32 - 127 + 127);
    cr_assert_eq(v.bsums[1], -64);
    cr_assert_eq(v.bsums[2], 0);
    /* flipping the order flips the sign convention: max = +2 first, iscale = -63.5, d < 0 */
    x[5] = 2.0f;
    x[9] = -2.0f;
    qa_both(MK_GGML_Q8_K, x, 256, a);
    v = actk_view(a, 256);
    cr_assert_eq(v.q[5], -127);
    cr_assert_eq(v.q[0], -64);
    EXPECT_F(v.d[0], 1.0f / -63.5f);
}

/* ---- hand-worked dots -------------------------------------------------------------------- */

static float dot_both(uint32_t type, const uint8_t *w, const void *act, int64_t n) {
    const type_info *t = T(type);
    float s = t->dot[0](w, act, n);
    if (use_simd() && t->dot[1]) {
        float v = t->dot[1](w, act, n);
        cr_assert(mk_f32_bits(s) == mk_f32_bits(v), "type %s: scalar %.9g AVX2 %.9g", t->name, s, v);
    }
    cr_assert(mk_f32_bits(s) == mk_f32_bits(mk_ggml_vec_dot(type, n, w, act)));
    return s;
}

Test(ggml_quant, hand_dots_32) {
    /* Q4_0 x (x[0] = 127, x[j] = j): amax 127 -> d = 1, q = x. Weights: e0 = 3.5, e16 = 0.5,
     * e17 = -4: dot = 3.5 * 127 + 0.5 * 16 - 4 * 17 = 384.5 */
    float x[32];
    x[0] = 127;
    for (int j = 1; j < 32; j++) x[j] = (float)j;
    uint8_t blk[34], a[64];
    hand_q4_0(blk);
    mk_ggml_quant_act(MK_GGML_Q4_0, x, 32, a);
    EXPECT_F(dot_both(MK_GGML_Q4_0, blk, a, 32), 384.5f);
    /* Q5_0, same x: 15 * 127 + 3 * 16 + 8 * 31 - 16 * (1 + ... + 30 - 16) = 2201 - 16 * 449 = -4983 */
    hand_q5(blk, 0);
    EXPECT_F(dot_both(MK_GGML_Q5_0, blk, a, 32), -4983.0f);

    /* x = 1 everywhere: q = 127, dx = 0.00787353515625 (see hand_act), s = 32. */
    for (int j = 0; j < 32; j++) x[j] = 1.0f;
    /* Q8_0 weights (d = 0.25; q0 = -128, q5 = -3, q31 = 127): sumi = 127 * (-128 - 3 + 127) = -508,
     * dot = (0.25 * 0.00787353515625) * -508 = -0.99993896484375 (true value: -1) */
    hand_q8_0(blk);
    mk_ggml_quant_act(MK_GGML_Q8_0, x, 32, a);
    EXPECT_F(dot_both(MK_GGML_Q8_0, blk, a, 32), -0.99993896484375f);
    /* Q4_1 weights (d = 1, m = -1, nibbles 15, 2, 1 and 29 zeros): sum q = 18,
     * dot = (1 * dx) * (18 * 127) + (-1) * 32 = 17.998901367... - 32 = -14.0010986328125
     * (true value: 14 + 1 + 0 - 29 = -14) */
    hand_q4_1(blk);
    mk_ggml_quant_act(MK_GGML_Q4_1, x, 32, a);
    EXPECT_F(dot_both(MK_GGML_Q4_1, blk, a, 32), -14.0010986328125f);
    /* Q5_1 (d = 0.5, m = 2; q = 31, 19, 24 and 29 zeros): sum q = 74,
     * dot = (0.5 * dx) * (74 * 127) + 2 * 32 = 36.99774169921875 + 64 (true value: 101) */
    hand_q5(blk, 1);
    EXPECT_F(dot_both(MK_GGML_Q5_1, blk, a, 32), 100.99774169921875f);
}

/* An activation row of Q8_K with every q = 1, d = 0.5, bsums = 16: the dot is 0.5 * sum(w). */
static void ones_q8_k(uint8_t *a) {
    memset(a, 1, 256);
    float d = 0.5f;
    memcpy(a + 256, &d, 4);
    int16_t bs[16];
    for (int i = 0; i < 16; i++) bs[i] = 16;
    memcpy(a + 260, bs, 32);
}

Test(ggml_quant, hand_dots_k) {
    uint8_t a[256 + 36], blk[210];
    ones_q8_k(a);
    /* Q4_K: sub-block 0: 13.5 + 31 * -0.5 = -2; sub-block 5: 470 + 31 * -25 = -305; total -307 */
    hand_q4_k(blk);
    EXPECT_F(dot_both(MK_GGML_Q4_K, blk, a, 256), -153.5f);
    /* Q5_K: sub-block 0: 45.5 - 15.5 = 30; sub-block 5: 998 - 775 = 223; total 253 */
    hand_q5_k(blk);
    EXPECT_F(dot_both(MK_GGML_Q5_K, blk, a, 256), 126.5f);
    /* Q6_K, sum over sub-blocks of 0.5 * sc * sum(q - 32):
     *   sc0 = 2: (-22 - 15*32) -> -502;  sc2 = -4: (-16 - 480) -> 992;  sc4 = 7: (5 - 480) -> -1662.5
     *   sc6 = -1: (16 - 480) -> 232;     sc9 = 3: (31 - 480) -> -673.5;  total -1614 */
    hand_q6_k(blk);
    EXPECT_F(dot_both(MK_GGML_Q6_K, blk, a, 256), -807.0f);
}

Test(ggml_quant, hand_dots_float) {
    /* F16: w = [1, -2, 0.5], x = [3, 0.25, 4] (exact in half): 3 - 0.5 + 2 = 4.5 */
    uint8_t w[12];
    wr16(w, 0x3c00);
    wr16(w + 2, 0xc000);
    wr16(w + 4, 0x3800);
    float x[3] = {3.0f, 0.25f, 4.0f};
    float a[3];
    mk_ggml_quant_act(MK_GGML_F16, x, 3, a);
    EXPECT_F(dot_both(MK_GGML_F16, w, a, 3), 4.5f);
    /* BF16: w = [1.5, -3], x = [2, 1/3 -> bf16 0.333984375]: 3 - 1.001953125 = 1.998046875 */
    wr16(w, 0x3fc0);
    wr16(w + 2, 0xc040);
    float xb[2] = {2.0f, 1.0f / 3.0f};
    mk_ggml_quant_act(MK_GGML_BF16, xb, 2, a);
    EXPECT_F(dot_both(MK_GGML_BF16, w, a, 2), 1.998046875f);
    /* F32 */
    float wf[3] = {0.5f, 2.0f, -1.0f};
    float xa[3];
    mk_ggml_quant_act(MK_GGML_F32, x, 3, xa);
    EXPECT_F(dot_both(MK_GGML_F32, (const uint8_t *)wf, xa, 3), 1.5f + 0.5f - 4.0f);
}

/* ---- 4. random blocks -------------------------------------------------------------------------- */

/* a row of random blocks: random bytes with sane half scales */
static void random_row(uint32_t type, uint8_t *w, int64_t n) {
    const type_info *t = T(type);
    size_t bytes = mk_ggml_row_bytes(type, n);
    for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)rnd();
    int64_t nb = n / t->blk;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = w + (size_t)b * (size_t)t->bytes;
        switch (type) {
        case MK_GGML_F32: {
            float f = rnds() * 2.0f;
            memcpy(p, &f, 4);
            break;
        }
        case MK_GGML_F16: wr16(p, f2h(rnds() * 2.0f)); break;
        case MK_GGML_BF16: wr16(p, mk_f32_to_bf16(rnds() * 2.0f)); break;
        case MK_GGML_Q4_0:
        case MK_GGML_Q5_0:
        case MK_GGML_Q8_0: wr16(p, f2h(rnds() * 0.05f)); break;
        case MK_GGML_Q4_1:
        case MK_GGML_Q5_1:
            wr16(p, f2h(rndu() * 0.02f));
            wr16(p + 2, f2h(-rndu() * 0.15f));
            break;
        case MK_GGML_Q4_K:
        case MK_GGML_Q5_K:
            wr16(p, f2h(rndu() * 0.002f));
            wr16(p + 2, f2h(rndu() * 0.002f));
            break;
        case MK_GGML_Q6_K: wr16(p + 208, f2h(rndu() * 0.002f)); break;
        }
    }
}

/* random activations: per 32 values a random magnitude, some zero blocks, some huge / tiny */
static void random_x(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i += 32) {
        float mag = (float)exp((double)rnds() * 4.0);
        int kind = (int)(rnd() % 16);
        for (int64_t j = i; j < i + 32 && j < n; j++) {
            x[j] = kind == 0 ? 0.0f : rnds() * mag;
            if (kind == 1 && (rnd() & 1)) x[j] = 0.0f;
        }
    }
}

/* the activation values the dot effectively uses (q * d, or the rounded float) */
static void act_values(uint32_t act_type, const void *act, int64_t n, double *xa, double *step) {
    if (act_type == MK_GGML_Q8_0 || act_type == MK_GGML_Q8_1) {
        act32 v = act32_view(act, n);
        for (int64_t i = 0; i < n; i++) {
            xa[i] = (double)v.q[i] * v.d[i / 32];
            step[i] = fabs((double)v.d[i / 32]);
        }
    } else if (act_type == MK_GGML_Q8_K) {
        actk v = actk_view(act, n);
        for (int64_t i = 0; i < n; i++) {
            xa[i] = (double)v.q[i] * v.d[i / 256];
            step[i] = fabs((double)v.d[i / 256]);
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            xa[i] = ((const float *)act)[i];
            step[i] = 0.0;
        }
    }
}

static const uint32_t k_all[] = {MK_GGML_F32,  MK_GGML_F16,  MK_GGML_BF16, MK_GGML_Q4_0,
                                 MK_GGML_Q4_1, MK_GGML_Q5_0, MK_GGML_Q5_1, MK_GGML_Q8_0,
                                 MK_GGML_Q4_K, MK_GGML_Q5_K, MK_GGML_Q6_K};

static void check_random(uint32_t type, int64_t n, int reps) {
    const type_info *t = T(type);
    int simd = use_simd();
    size_t wb = mk_ggml_row_bytes(type, n), ab = mk_ggml_act_bytes(type, n);
    cr_assert(wb && ab);
    uint8_t *w = malloc(wb), *a = malloc(ab), *a2 = malloc(ab);
    float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
    float *y2 = malloc(sizeof(float) * (size_t)n);
    double *xa = malloc(sizeof(double) * (size_t)n), *step = malloc(sizeof(double) * (size_t)n);
    for (int rep = 0; rep < reps; rep++) {
        random_row(type, w, n);
        random_x(x, n);
        /* dequantization */
        t->dq[0](w, y, n / t->blk);
        if (simd && t->dq[1]) {
            t->dq[1](w, y2, n / t->blk);
            cr_assert(memcmp(y, y2, sizeof(float) * (size_t)n) == 0, "%s n=%ld: dequant differs",
                      t->name, (long)n);
        }
        /* activation quantization */
        quant_act(t->act_type, x, n, a, 0);
        if (simd) {
            quant_act(t->act_type, x, n, a2, 1);
            cr_assert(memcmp(a, a2, ab) == 0, "%s n=%ld: act quant differs", t->name, (long)n);
        }
        /* dot */
        float s = t->dot[0](w, a, n);
        if (simd && t->dot[1]) {
            float v = t->dot[1](w, a, n);
            cr_assert(mk_f32_bits(s) == mk_f32_bits(v), "%s n=%ld: dot scalar %.9g AVX2 %.9g",
                      t->name, (long)n, s, v);
        }
        /* against the dequantized weights: with the activation's own values, to fp32 rounding
         * (plus Q8_1's half-rounded s); with the original x, within the quantization steps */
        act_values(t->act_type, a, n, xa, step);
        /* |x - q d| <= 0.5 d for Q8_K (d exact); Q8_0 / Q8_1 also round d to half: <= 0.57 d */
        double qf = t->act_type == MK_GGML_Q8_K ? 0.501 : 0.57;
        double ref_a = 0, ref_x = 0, mag = 0, magx = 0, qerr = 0;
        for (int64_t i = 0; i < n; i++) {
            ref_a += (double)y[i] * xa[i];
            ref_x += (double)y[i] * x[i];
            mag += fabs((double)y[i] * xa[i]);
            magx += fabs((double)y[i] * x[i]);
            qerr += fabs((double)y[i]) * step[i] * qf;
        }
        double tol_a = mag * 2e-6 + 1e-30;
        if (t->act_type == MK_GGML_Q8_1) { /* m * s uses s = half(d * sum q) */
            act32 v = act32_view(a, n);
            for (int64_t b = 0; b < n / 32; b++)
                tol_a += fabs(h2f(rd16(w + (size_t)t->bytes * b + 2))) * fabs((double)v.sum[b] * v.d[b]) * 2e-3;
        }
        cr_assert(fabs((double)s - ref_a) <= tol_a, "%s n=%ld: dot %.9g vs dequant ref %.9g (tol %g)",
                  t->name, (long)n, s, ref_a, tol_a);
        double rel = t->act_type == MK_GGML_BF16 ? 0x1p-8 : t->act_type == MK_GGML_F16 ? 0x1p-11 : 0.0;
        double tol_x = tol_a + qerr + magx * rel;
        cr_assert(fabs((double)s - ref_x) <= tol_x, "%s n=%ld: dot %.9g vs exact %.9g (tol %g)",
                  t->name, (long)n, s, ref_x, tol_x);
    }
    free(w);
    free(a);
    free(a2);
    free(x);
    free(y);
    free(y2);
    free(xa);
    free(step);
}

Test(ggml_quant, random_blocks) {
    simd_here();
    for (size_t i = 0; i < sizeof k_all / sizeof k_all[0]; i++) {
        uint32_t type = k_all[i];
        int blk = mk_ggml_block_elems(type);
        if (blk == 1) {
            int64_t ns[] = {1, 7, 31, 32, 33, 100, 576, 1000};
            for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) check_random(type, ns[j], 20);
        } else if (blk == 32) {
            int64_t nbs[] = {1, 3, 7, 8, 9, 16, 18, 19, 48, 100};
            for (size_t j = 0; j < sizeof nbs / sizeof nbs[0]; j++) check_random(type, 32 * nbs[j], 20);
        } else {
            int64_t nbs[] = {1, 2, 3, 6, 11};
            for (size_t j = 0; j < sizeof nbs / sizeof nbs[0]; j++) check_random(type, 256 * nbs[j], 20);
        }
    }
}

/* Every byte pattern of the weights' quant bytes, including Q8_0's -128 and K-quant scales with
 * all 6 bits set, goes through the integer kernels: fully random bytes except the half scales. */
Test(ggml_quant, extreme_bytes) {
    if (!simd_here()) return;
    for (size_t i = 0; i < sizeof k_all / sizeof k_all[0]; i++) {
        uint32_t type = k_all[i];
        const type_info *t = T(type);
        if (t->blk == 1) continue;
        int64_t n = t->blk * 16;
        size_t wb = mk_ggml_row_bytes(type, n), ab = mk_ggml_act_bytes(type, n);
        uint8_t *w = malloc(wb), *a = malloc(ab);
        float *x = malloc(sizeof(float) * (size_t)n);
        for (int rep = 0; rep < 50; rep++) {
            random_row(type, w, n);
            int fill = rep % 3; /* all 0xff, all 0x80, random */
            /* the half scales stay sane: d (and m / dmin) at the start, Q6_K's d at 208 */
            int hoff = type == MK_GGML_Q6_K ? 208 : 0;
            int hlen = type == MK_GGML_Q4_1 || type == MK_GGML_Q5_1 || type == MK_GGML_Q4_K ||
                               type == MK_GGML_Q5_K ? 4 : 2;
            for (int64_t b = 0; b < n / t->blk; b++)
                for (int j = 0; j < t->bytes; j++) {
                    if (j >= hoff && j < hoff + hlen) continue;
                    uint8_t *p = w + (size_t)b * (size_t)t->bytes + j;
                    if (fill == 0) *p = 0xff;
                    else if (fill == 1) *p = 0x80;
                }
            /* activations at full scale: many q = +-127 */
            for (int64_t j = 0; j < n; j++) x[j] = (rnd() & 1) ? 1.0f : -1.0f;
            quant_act(t->act_type, x, n, a, 1);
            float s = t->dot[0](w, a, n), v = t->dot[1](w, a, n);
            cr_assert(mk_f32_bits(s) == mk_f32_bits(v), "%s fill %d: %.9g vs %.9g", t->name, fill, s, v);
        }
        free(w);
        free(a);
        free(x);
    }
}

/* ---- 5. matmul ---------------------------------------------------------------------------------- */

static void check_matmul(uint32_t type, int n, int k, int m, mk_pool *pool) {
    size_t rb = mk_ggml_row_bytes(type, k);
    cr_assert(rb);
    uint8_t *W = malloc(rb * (size_t)n);
    for (int j = 0; j < n; j++) random_row(type, W + rb * (size_t)j, k);
    float *x = malloc(sizeof(float) * (size_t)m * k);
    random_x(x, (int64_t)m * k);
    float *y1 = malloc(sizeof(float) * (size_t)m * n), *y2 = malloc(sizeof(float) * (size_t)m * n);
    size_t sb = mk_ggml_matmul_scratch(type, m, k);
    cr_assert(sb);
    void *scratch = malloc(sb + 1);
    mk_ggml_matmul(NULL, type, W, n, k, x, m, y1, (uint8_t *)scratch + 1); /* unaligned scratch */
    mk_ggml_matmul(pool, type, W, n, k, x, m, y2, scratch);
    cr_assert(memcmp(y1, y2, sizeof(float) * (size_t)m * n) == 0, "%s n=%d k=%d m=%d: threaded differs",
              mk_ggml_type_name(type), n, k, m);
    /* == one vec_dot per output */
    size_t ab = mk_ggml_act_bytes(type, k);
    uint8_t *a = malloc(ab);
    for (int r = 0; r < m; r++) {
        mk_ggml_quant_act(type, x + (size_t)r * k, k, a);
        for (int j = 0; j < n; j += 7) {
            float v = mk_ggml_vec_dot(type, k, W + rb * (size_t)j, a);
            cr_assert(mk_f32_bits(v) == mk_f32_bits(y1[(size_t)r * n + j]), "%s: y[%d,%d]",
                      mk_ggml_type_name(type), r, j);
        }
    }
    free(a);
    free(W);
    free(x);
    free(y1);
    free(y2);
    free(scratch);
}

Test(ggml_quant, matmul_threads) {
    mk_pool *pool = mk_pool_create(3);
    cr_assert(pool);
    for (size_t i = 0; i < sizeof k_all / sizeof k_all[0]; i++) {
        uint32_t type = k_all[i];
        /* above the pool threshold (256 KiB of weights x m) and off the 16-row task size */
        int k = 1024, n = type == MK_GGML_F32 ? 100 : 515;
        check_matmul(type, n, k, 1, pool);
        check_matmul(type, 61, k, 9, pool);
        check_matmul(type, 40, k, 70, pool); /* activations quantized on the pool too */
        check_matmul(type, n, 2048, 1, NULL);
    }
    mk_pool_free(pool);
}

/* ---- 6. invalid input ------------------------------------------------------------------------- */

Test(ggml_quant, invalid) {
    float y[4] = {0};
    uint8_t w[64] = {0};
    mk_ggml_dequant_row(MK_GGML_Q2_K, w, y, 4); /* unsupported */
    cr_assert(isnan(y[0]) && isnan(y[3]));
    mk_ggml_dequant_row(MK_GGML_Q4_0, w, y, 4); /* not a multiple of 32 */
    cr_assert(isnan(y[0]));
    cr_assert(isnan(mk_ggml_vec_dot(99, 32, w, w)));
    cr_assert_eq(mk_ggml_act_bytes(MK_GGML_Q8_K, 256), 0);
    cr_assert_eq(mk_ggml_matmul_scratch(MK_GGML_Q4_K, 1, 100), 0);
    float x[100] = {0}, out[2] = {0};
    mk_ggml_matmul(NULL, MK_GGML_Q4_K, w, 2, 100, x, 1, out, NULL);
    cr_assert(isnan(out[0]) && isnan(out[1]));
    mk_ggml_matmul(NULL, 77, w, 2, 32, x, 1, out, NULL);
    cr_assert(isnan(out[0]));
}
