/* ggml_quant.c — ggml block formats: dequantization, activation quantization, dot products and the
 * threaded GEMV / GEMM (ggml_quant.h has the formats and the numerics contract).
 *
 * Layout of this file: scalar helpers; per type the scalar reference (dequant, activation
 * quantization, dot); the AVX2 versions (target attribute, chosen at run time when the CPU has
 * AVX2 + FMA + F16C); the multi-row AVX-512 VNNI tiles for Q4_1 / Q8_0 (products of 2+ rows,
 * chosen at run time when the CPU has AVX-512 F/BW/DQ/VL + VNNI); the dispatch table;
 * mk_ggml_matmul.
 *
 * How scalar and AVX2 stay bit-identical:
 *   - Integer parts are exact: every block dot is an int32 sum (maddubs pairs never saturate: the
 *     unsigned operand is <= 63, or <= 128 with a signed one of magnitude <= 127).
 *   - Q8_0 and Q4_1 follow llama.cpp's x86 vec_dot exactly (see lanes_fma), so that the Llama
 *     family's logits are bit-identical to llama.cpp's: per block, 8 exact integer lane sums
 *     (elements 4l..4l+3), each fused into float lane l with the block's scale; Q4_1's m * s terms
 *     in one fused scalar chain; hsum8 at the end. The scalar code writes the same fmaf calls.
 *   - the other 32-element formats (Q4_0, Q5_0, Q5_1): block b's float contribution
 *     (dw * dx) * (float)sumi is added into lane b % 8 of an 8-lane accumulator; the AVX2 kernel
 *     handles 8 blocks per step (eight int32 sums reduced into one vector of 8), which is exactly
 *     the scalar's lane update, and any last blocks that do not fill 8 go through scalar float
 *     code on the stored lanes. The lanes are summed by one fixed tree (hsum8). (llama.cpp on
 *     x86 repacks Q4_0 into interleaved rows with their own kernels; these are not its order.)
 *   - 256-element formats (K-quants): one integer dot per super-block, then the same scalar float
 *     statements in both paths.
 *   - F16 / BF16 / F32: element i goes to lane i % 32; products of two halves (F16) are exact, so
 *     the AVX2 FMA equals the scalar multiply-then-add; BF16 and F32 use multiply then add.
 *   - Dequantization: all products are exact in fp32 (e.g. Q6_K: d (11 bits) * scale (8) * q (6)
 *     has at most 24 significant bits), the one add / subtract is in ggml's order.
 *   - Half -> float is exact either way (h2f, or F16C in the AVX2 code).
 *   The scalar code writes every multiply and add as its own statement, so no compiler fuses them
 *   (the project's -std=c11 turns contraction off for gcc; clang only fuses within an expression).
 *
 * Speed (decode is a stream of GEMVs over weights far larger than the caches): the integer dots
 * are the ones llama.cpp uses (vpmaddubsw of unsigned weights and signed activations, vpmaddwd
 * with the sub-block scales), with less work around them: the fixed offsets of Q4_0 / Q5_0 and
 * Q6_K come from activation sums (stored next to the activations, or Q8_K's bsums) instead of
 * per-element subtractions, 32-element blocks are reduced 8 at a time into one vector of block
 * sums whose scales are converted 8 at a time (F16C), and the weights are prefetched PREFETCH
 * bytes ahead (which matters: without it decode is 30% slower on the Zen 4 VM). Q8_0 and Q4_1,
 * bound to llama.cpp's order (one fused multiply-add chain per row), run four weight rows per
 * pass over the activations (dot4): four independent chains, one activation load. On the Zen 3 machine this was written on, one core runs the Q4_x / Q5_x / K-quant
 * dots at 12-18 GB/s of weights from L1 (Q8_0 27, the float types 30+), about its DRAM read rate.
 * A batched step (many activation rows) is compute-bound instead: there the one-row kernels
 * redo the weight unpacking for every row and spend a dozen instructions per 32 products; the
 * multi-row tiles unpack a block once for up to 16 rows and do 64 products per vpdpbusd. On the
 * 2-core Zen 4 VM (one core, 1536 x 576 Q4_1, 16-64 rows): about 60 GMAC/s against 17-24 for
 * the one-row kernels.
 */
#include "num/ggml_quant.h"

#include "base/cpu.h"
#include "num/formats.h"

#include <float.h>
#include <math.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MK_HAVE_X86 1
#define MK_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define MK_HAVE_X86 0
#endif

#define QK 32   /* elements per Q4_0 / Q4_1 / Q8_0 block */
#define QKK 256 /* elements per K-quant super-block */

/* ---- scalar helpers ------------------------------------------------------------------------ */

static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* IEEE half -> float, exact (what F16C's vcvtph2ps gives, NaNs quieted). */
static inline float h2f(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3ffu;
    if (e == 0) {
        float v = (float)m * 0x1p-24f; /* zero or subnormal: m * 2^-24, exact */
        return mk_f32_from_bits(mk_f32_bits(v) | s);
    }
    if (e == 31) return mk_f32_from_bits(s | 0x7f800000u | (m ? 0x00400000u | (m << 13) : 0u));
    return mk_f32_from_bits(s | ((e + 112u) << 23) | (m << 13));
}

/* float -> IEEE half, round to nearest even (what F16C's vcvtps2ph with RNE gives). */
static inline uint16_t f2h(float f) {
    uint32_t u = mk_f32_bits(f), s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(s | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00u); /* >= 65520 rounds to inf */
    if (a >= 0x38800000u) {                               /* normal half */
        uint32_t h = (a >> 13) - (112u << 10), rem = a & 0x1fffu;
        h += rem > 0x1000u || (rem == 0x1000u && (h & 1u));
        return (uint16_t)(s | h);
    }
    /* subnormal half: adding 0.5 (ulp 2^-24 = the half subnormal step) rounds to nearest even */
    float r = mk_f32_from_bits(a) + 0.5f;
    return (uint16_t)(s | (mk_f32_bits(r) - 0x3f000000u));
}

static inline float hsum8_s(const float *a) {
    float t0 = a[0] + a[4], t1 = a[1] + a[5], t2 = a[2] + a[6], t3 = a[3] + a[7];
    float u0 = t0 + t2, u1 = t1 + t3;
    return u0 + u1;
}

/* 32 lanes (F16/BF16/F32 dots) -> one float: lanes l, l+8, l+16, l+24 first, then hsum8. */
static inline float hsum32_s(const float *a) {
    float t[8];
    for (int l = 0; l < 8; l++) {
        float p = a[l] + a[l + 8], q = a[l + 16] + a[l + 24];
        t[l] = p + q;
    }
    return hsum8_s(t);
}

/* Q4_K / Q5_K: eight 6-bit scales and mins from the 12 packed bytes (see the header). */
static inline void kq_scales(const uint8_t *q, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t a = rd32(q), b = rd32(q + 4), c = rd32(q + 8);
    uint32_t w[4] = {a & 0x3f3f3f3fu, (c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u),
                     b & 0x3f3f3f3fu, ((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u)};
    memcpy(sc, w, 8);
    memcpy(mn, w + 2, 8);
}

/* ---- activation row layouts ----------------------------------------------------------------- */

/* Q8_0 / Q8_1 row: q[n] | d[nb] | sum[nb] | (Q8_1) s[nb]. */
typedef struct {
    const int8_t *q;
    const float *d;
    const int32_t *sum;
    const float *s;
} act32;

static act32 act32_view(const void *act, int64_t n) {
    int64_t nb = n / QK;
    const uint8_t *p = act;
    act32 v;
    v.q = (const int8_t *)p;
    v.d = (const float *)(p + n);
    v.sum = (const int32_t *)(p + n + 4 * nb);
    v.s = (const float *)(p + n + 8 * nb);
    return v;
}

/* Q8_K row: q[n] | d[nb] | bsums[nb][16]. */
typedef struct {
    const int8_t *q;
    const float *d;
    const int16_t *bsums;
} actk;

static actk actk_view(const void *act, int64_t n) {
    int64_t nb = n / QKK;
    const uint8_t *p = act;
    actk v;
    v.q = (const int8_t *)p;
    v.d = (const float *)(p + n);
    v.bsums = (const int16_t *)(p + n + 4 * nb);
    return v;
}

/* ==== scalar reference ========================================================================= */

/* ---- dequantization (nb blocks) ---- */

static void dq_f32_s(const uint8_t *p, float *y, int64_t n) { memcpy(y, p, sizeof(float) * (size_t)n); }
static void dq_f16_s(const uint8_t *p, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = h2f(rd16(p + 2 * i));
}
static void dq_bf16_s(const uint8_t *p, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = mk_bf16_to_f32(rd16(p + 2 * i));
}

static void dq_q4_0_s(const uint8_t *p, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 18, y += QK) {
        float d = h2f(rd16(p));
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((p[2 + j] & 15) - 8) * d;
            y[j + 16] = (float)((p[2 + j] >> 4) - 8) * d;
        }
    }
}

static void dq_q4_1_s(const uint8_t *p, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 20, y += QK) {
        float d = h2f(rd16(p)), m = h2f(rd16(p + 2));
        for (int j = 0; j < 16; j++) {
            float lo = (float)(p[4 + j] & 15) * d, hi = (float)(p[4 + j] >> 4) * d;
            y[j] = lo + m;
            y[j + 16] = hi + m;
        }
    }
}

/* Q5_0 / Q5_1: element e's 5th bit is bit e of the 32-bit qh */
static inline int q5_val(const uint8_t *qh4, const uint8_t *qs, int e) {
    uint32_t qh = rd32(qh4);
    int lo = e < 16 ? qs[e] & 15 : qs[e - 16] >> 4;
    return lo | (int)((qh >> e) & 1u) << 4;
}

static void dq_q5_0_s(const uint8_t *p, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 22, y += QK) {
        float d = h2f(rd16(p));
        for (int e = 0; e < QK; e++) y[e] = (float)(q5_val(p + 2, p + 6, e) - 16) * d;
    }
}

static void dq_q5_1_s(const uint8_t *p, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 24, y += QK) {
        float d = h2f(rd16(p)), m = h2f(rd16(p + 2));
        for (int e = 0; e < QK; e++) {
            float v = (float)q5_val(p + 4, p + 8, e) * d;
            y[e] = v + m;
        }
    }
}

static void dq_q8_0_s(const uint8_t *p, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 34, y += QK) {
        float d = h2f(rd16(p));
        for (int j = 0; j < QK; j++) y[j] = (float)(int8_t)p[2 + j] * d;
    }
}

static void dq_q4_k_s(const uint8_t *p, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 144) {
        float d = h2f(rd16(p)), dmin = h2f(rd16(p + 2));
        uint8_t sc[8], mn[8];
        kq_scales(p + 4, sc, mn);
        const uint8_t *qs = p + 16;
        for (int c = 0; c < 4; c++, qs += 32) {
            float d1 = d * (float)sc[2 * c], m1 = dmin * (float)mn[2 * c];
            float d2 = d * (float)sc[2 * c + 1], m2 = dmin * (float)mn[2 * c + 1];
            for (int l = 0; l < 32; l++) {
                float v = d1 * (float)(qs[l] & 15);
                *y++ = v - m1;
            }
            for (int l = 0; l < 32; l++) {
                float v = d2 * (float)(qs[l] >> 4);
                *y++ = v - m2;
            }
        }
    }
}

static void dq_q5_k_s(const uint8_t *p, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 176) {
        float d = h2f(rd16(p)), dmin = h2f(rd16(p + 2));
        uint8_t sc[8], mn[8];
        kq_scales(p + 4, sc, mn);
        const uint8_t *qh = p + 16, *qs = p + 48;
        for (int c = 0; c < 4; c++, qs += 32) {
            float d1 = d * (float)sc[2 * c], m1 = dmin * (float)mn[2 * c];
            float d2 = d * (float)sc[2 * c + 1], m2 = dmin * (float)mn[2 * c + 1];
            for (int l = 0; l < 32; l++) {
                int q = (qs[l] & 15) | (((qh[l] >> (2 * c)) & 1) << 4);
                float v = d1 * (float)q;
                *y++ = v - m1;
            }
            for (int l = 0; l < 32; l++) {
                int q = (qs[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
                float v = d2 * (float)q;
                *y++ = v - m2;
            }
        }
    }
}

/* Q6_K 6-bit value of element e (0..255) of a super-block at p. */
static inline int q6_val(const uint8_t *p, int e) {
    int h = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
    const uint8_t *ql = p + 64 * h, *qh = p + 128 + 32 * h;
    int lo = quarter & 1 ? ql[l + 32] : ql[l];
    lo = quarter & 2 ? lo >> 4 : lo & 15;
    return lo | (((qh[l] >> (2 * quarter)) & 3) << 4);
}

static void dq_q6_k_s(const uint8_t *p, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 210, y += QKK) {
        float d = h2f(rd16(p + 208));
        const int8_t *sc = (const int8_t *)(p + 192);
        for (int e = 0; e < QKK; e++) {
            float ds = d * (float)sc[e / 16];
            y[e] = ds * (float)(q6_val(p, e) - 32);
        }
    }
}

/* ---- activation quantization ---- */

/* round-half-even of v (|v| small) to int8, saturating like the AVX2 packs (NaN -> -128). */
static inline int8_t q8_round(float v) {
    if (!(v >= -128.0f)) return -128;
    if (v > 127.0f) return 127;
    return (int8_t)(int)rintf(v);
}

/* Q8_0 (and Q8_1 when s != NULL): llama.cpp's AVX2 quantize_row_q8_0 / _q8_1 arithmetic. */
static void qa_q8_0_s(const float *x, int64_t n, uint8_t *out, int with_s) {
    int64_t nb = n / QK;
    int8_t *q = (int8_t *)out;
    float *dd = (float *)(out + n);
    int32_t *sum = (int32_t *)(out + n + 4 * nb);
    float *ss = (float *)(out + n + 8 * nb);
    for (int64_t b = 0; b < nb; b++, x += QK, q += QK) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++) {
            float a = fabsf(x[j]);
            amax = amax > a ? amax : a;
        }
        float d = amax / 127.0f;
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int32_t s = 0;
        for (int j = 0; j < QK; j++) {
            q[j] = q8_round(x[j] * id);
            s += q[j];
        }
        dd[b] = h2f(f2h(d));
        sum[b] = s;
        if (with_s) ss[b] = h2f(f2h(d * (float)s));
    }
}

/* Q8_K: llama.cpp's quantize_row_q8_K_ref. */
static inline int nearest_int(float v) { /* round-half-even for |v| < 2^22 */
    float t = v + 12582912.0f;
    return (int)(mk_f32_bits(t) & 0x007fffffu) - 0x00400000;
}

static void qa_q8_k_s(const float *x, int64_t n, uint8_t *out) {
    int64_t nb = n / QKK;
    int8_t *q = (int8_t *)out;
    float *dd = (float *)(out + n);
    int16_t *bs = (int16_t *)(out + n + 4 * nb);
    for (int64_t b = 0; b < nb; b++, x += QKK, q += QKK, bs += 16) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QKK; j++) {
            float a = fabsf(x[j]);
            if (a > amax) { amax = a; max = x[j]; }
        }
        if (amax == 0.0f || !(amax <= FLT_MAX)) {
            /* all zero (ggml: d = 0, q = 0); non-finite blocks give a NaN scale */
            memset(q, 0, QKK);
            memset(bs, 0, 32);
            dd[b] = amax == 0.0f ? 0.0f : NAN;
            continue;
        }
        float iscale = -127.0f / max;
        for (int j = 0; j < QKK; j++) {
            int v = nearest_int(iscale * x[j]);
            q[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += q[16 * g + j];
            bs[g] = (int16_t)s;
        }
        dd[b] = 1.0f / iscale;
    }
}

static void qa_f32_s(const float *x, int64_t n, uint8_t *out) { memcpy(out, x, sizeof(float) * (size_t)n); }
/* F16 / BF16 activations are kept as floats holding the rounded values: the same numbers as
 * llama.cpp's half / bf16 vectors, without a second conversion in every dot. */
static void qa_f16_s(const float *x, int64_t n, uint8_t *out) {
    float *h = (float *)out;
    for (int64_t i = 0; i < n; i++) h[i] = h2f(f2h(x[i]));
}
static void qa_bf16_s(const float *x, int64_t n, uint8_t *out) {
    float *h = (float *)out;
    for (int64_t i = 0; i < n; i++) h[i] = mk_bf16r(x[i]);
}

/* ---- dots ---- */

static float dot_f32_s(const uint8_t *w, const void *act, int64_t n) {
    const float *x = act;
    float acc[32] = {0};
    for (int64_t i = 0; i < n; i++) {
        float wi;
        memcpy(&wi, w + 4 * i, 4);
        float p = wi * x[i];
        acc[i & 31] += p;
    }
    return hsum32_s(acc);
}

static float dot_f16_s(const uint8_t *w, const void *act, int64_t n) {
    const float *x = act;
    float acc[32] = {0};
    for (int64_t i = 0; i < n; i++) {
        float p = h2f(rd16(w + 2 * i)) * x[i]; /* exact: both are halves */
        acc[i & 31] += p;
    }
    return hsum32_s(acc);
}

static float dot_bf16_s(const uint8_t *w, const void *act, int64_t n) {
    const float *x = act;
    float acc[32] = {0};
    for (int64_t i = 0; i < n; i++) {
        float p = mk_bf16_to_f32(rd16(w + 2 * i)) * x[i];
        acc[i & 31] += p;
    }
    return hsum32_s(acc);
}

/* Exact integer block dots (shared by the scalar dots and the AVX2 tails). */
static inline int32_t idot_q4_0(const uint8_t *qs, const int8_t *x) {
    int32_t s = 0;
    for (int j = 0; j < 16; j++) s += ((qs[j] & 15) - 8) * x[j] + ((qs[j] >> 4) - 8) * x[j + 16];
    return s;
}

static inline int32_t idot_q5(const uint8_t *qh4, const uint8_t *qs, const int8_t *x, int off) {
    int32_t s = 0;
    for (int e = 0; e < QK; e++) s += (q5_val(qh4, qs, e) - off) * x[e];
    return s;
}

/* The float step of one 32-block, shared by scalar and AVX2 tails: lane b % 8 += (dw*dx)*sumi. */
static inline void lane_add(float *acc, int64_t b, float dw, float dx, int32_t sumi) {
    float d = dw * dx;
    float p = d * (float)sumi;
    acc[b & 7] += p;
}

static float dot_q4_0_s(const uint8_t *w, const void *act, int64_t n) {
    act32 a = act32_view(act, n);
    float acc[8] = {0};
    for (int64_t b = 0; b < n / QK; b++, w += 18)
        lane_add(acc, b, h2f(rd16(w)), a.d[b], idot_q4_0(w + 2, a.q + QK * b));
    return hsum8_s(acc);
}

static float dot_q5_0_s(const uint8_t *w, const void *act, int64_t n) {
    act32 a = act32_view(act, n);
    float acc[8] = {0};
    for (int64_t b = 0; b < n / QK; b++, w += 22)
        lane_add(acc, b, h2f(rd16(w)), a.d[b], idot_q5(w + 2, w + 6, a.q + QK * b, 16));
    return hsum8_s(acc);
}

/* llama.cpp's x86 order for Q8_0 and Q4_1 (ggml_vec_dot_q8_0_q8_0, ggml_vec_dot_q4_1_q8_1, AVX2
 * paths, which AVX-512 builds use too): per block, lane l of 8 holds the exact integer sum of
 * elements 4l..4l+3 (what vpmaddubsw + vpmaddwd, or vpdpbusd, leave), converted to float and
 * fused into float lane l with the block's scale (dw * dx): acc[l] = fma(d, isum[l], acc[l]);
 * after the last block, hsum8. Q4_1's offset terms m * s are fused into one scalar in block
 * order, added last. */
static inline void lanes_fma(float *acc, float dw, float dx, const int32_t *isum) {
    float d = dw * dx;
    for (int l = 0; l < 8; l++) acc[l] = fmaf(d, (float)isum[l], acc[l]);
}

static float dot_q8_0_s(const uint8_t *w, const void *act, int64_t n) {
    act32 a = act32_view(act, n);
    float acc[8] = {0};
    for (int64_t b = 0; b < n / QK; b++, w += 34) {
        const int8_t *q = (const int8_t *)(w + 2), *x = a.q + QK * b;
        int32_t is[8];
        for (int l = 0; l < 8; l++) {
            is[l] = 0;
            for (int e = 4 * l; e < 4 * l + 4; e++) is[l] += q[e] * x[e];
        }
        lanes_fma(acc, h2f(rd16(w)), a.d[b], is);
    }
    return hsum8_s(acc);
}

/* Q4_1: sum_i (q_i dw + m) dx x_i = (dw dx) sum q_i x_i + m * s (s = half(d sum x) from Q8_1);
 * the m * s terms go to a second set of 8 lanes, added at the end (as llama.cpp keeps them apart). */
static inline void lane_add_m(float *accm, int64_t b, float m, float s) {
    float p = m * s;
    accm[b & 7] += p;
}

static float dot_q4_1_s(const uint8_t *w, const void *act, int64_t n) {
    act32 a = act32_view(act, n);
    float acc[8] = {0}, summs = 0.0f;
    for (int64_t b = 0; b < n / QK; b++, w += 20) {
        const uint8_t *qs = w + 4;
        const int8_t *x = a.q + QK * b;
        int32_t is[8];
        for (int l = 0; l < 8; l++) {
            is[l] = 0;
            for (int e = 4 * l; e < 4 * l + 4; e++) is[l] += (e < 16 ? qs[e] & 15 : qs[e - 16] >> 4) * x[e];
        }
        summs = fmaf(h2f(rd16(w + 2)), a.s[b], summs);
        lanes_fma(acc, h2f(rd16(w)), a.d[b], is);
    }
    return hsum8_s(acc) + summs;
}

static float dot_q5_1_s(const uint8_t *w, const void *act, int64_t n) {
    act32 a = act32_view(act, n);
    float acc[8] = {0}, accm[8] = {0};
    for (int64_t b = 0; b < n / QK; b++, w += 24) {
        lane_add(acc, b, h2f(rd16(w)), a.d[b], idot_q5(w + 4, w + 8, a.q + QK * b, 0));
        lane_add_m(accm, b, h2f(rd16(w + 2)), a.s[b]);
    }
    return hsum8_s(acc) + hsum8_s(accm);
}

/* K-quants: the float step of one super-block (shared with AVX2): sumf += (dx*d) isum - (dx*dmin) msum */
static inline float kq_step(float sumf, float dx, float d, float dmin, int32_t isum, int32_t msum) {
    float dd = dx * d, dm = dx * dmin;
    float p = dd * (float)isum, q = dm * (float)msum;
    sumf += p;
    sumf -= q;
    return sumf;
}

/* sum over sub-blocks of mn[j] * (bsums of its 32 elements) */
static inline int32_t kq_msum(const uint8_t *mn, const int16_t *bs) {
    int32_t s = 0;
    for (int j = 0; j < 8; j++) s += mn[j] * (bs[2 * j] + bs[2 * j + 1]);
    return s;
}

static float dot_q4_k_s(const uint8_t *w, const void *act, int64_t n) {
    actk a = actk_view(act, n);
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / QKK; b++, w += 144) {
        uint8_t sc[8], mn[8];
        kq_scales(w + 4, sc, mn);
        const uint8_t *qs = w + 16;
        const int8_t *x = a.q + QKK * b;
        int32_t isum = 0;
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                isum += sc[2 * c] * (qs[32 * c + l] & 15) * x[64 * c + l];
                isum += sc[2 * c + 1] * (qs[32 * c + l] >> 4) * x[64 * c + 32 + l];
            }
        sumf = kq_step(sumf, a.d[b], h2f(rd16(w)), h2f(rd16(w + 2)), isum,
                       kq_msum(mn, a.bsums + 16 * b));
    }
    return sumf;
}

static float dot_q5_k_s(const uint8_t *w, const void *act, int64_t n) {
    actk a = actk_view(act, n);
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / QKK; b++, w += 176) {
        uint8_t sc[8], mn[8];
        kq_scales(w + 4, sc, mn);
        const uint8_t *qh = w + 16, *qs = w + 48;
        const int8_t *x = a.q + QKK * b;
        int32_t isum = 0;
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                int lo = (qs[32 * c + l] & 15) | (((qh[l] >> (2 * c)) & 1) << 4);
                int hi = (qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
                isum += sc[2 * c] * lo * x[64 * c + l];
                isum += sc[2 * c + 1] * hi * x[64 * c + 32 + l];
            }
        sumf = kq_step(sumf, a.d[b], h2f(rd16(w)), h2f(rd16(w + 2)), isum,
                       kq_msum(mn, a.bsums + 16 * b));
    }
    return sumf;
}

static float dot_q6_k_s(const uint8_t *w, const void *act, int64_t n) {
    actk a = actk_view(act, n);
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / QKK; b++, w += 210) {
        const int8_t *sc = (const int8_t *)(w + 192);
        const int8_t *x = a.q + QKK * b;
        int32_t isum = 0;
        for (int e = 0; e < QKK; e++) isum += sc[e / 16] * (q6_val(w, e) - 32) * x[e];
        sumf = kq_step(sumf, a.d[b], h2f(rd16(w + 208)), 0.0f, isum, 0);
    }
    return sumf;
}

/* ==== AVX2 ===================================================================================== */

#if MK_HAVE_X86

/* half -> float with F16C: the same values as h2f (the tests check all 65536), without branches */
MK_AVX2 static inline float h2f_v(uint16_t h) { return _cvtsh_ss(h); }

MK_AVX2 static inline int32_t hsum_i32_8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

MK_AVX2 static inline int32_t hsum_i32_4(__m128i s) {
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* Lane i of the result = the sum of the 8 int32 lanes of v[i]. */
MK_AVX2 static inline __m256i reduce8(const __m256i *v) {
    __m256i a = _mm256_hadd_epi32(v[0], v[1]), b = _mm256_hadd_epi32(v[2], v[3]);
    __m256i c = _mm256_hadd_epi32(v[4], v[5]), d = _mm256_hadd_epi32(v[6], v[7]);
    __m256i ab = _mm256_hadd_epi32(a, b), cd = _mm256_hadd_epi32(c, d);
    /* ab: [v0 v1 v2 v3 low halves | v0 v1 v2 v3 high halves], cd likewise for v4..v7 */
    return _mm256_add_epi32(_mm256_permute2x128_si256(ab, cd, 0x20),
                            _mm256_permute2x128_si256(ab, cd, 0x31));
}

/* 16 nibbles -> 32 bytes: low nibbles in bytes 0-15, high nibbles in bytes 16-31. */
MK_AVX2 static inline __m256i nibbles32(const uint8_t *p) {
    __m128i r = _mm_loadu_si128((const __m128i *)p);
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(r), _mm_srli_epi16(r, 4), 1);
    return _mm256_and_si256(v, _mm256_set1_epi8(15));
}

#ifndef PREFETCH
#define PREFETCH 2048 /* bytes of W prefetched ahead of the dot kernels (0: none) */
#endif

/* prefetch the `bytes` bytes (a multiple of 64 or less) that lie PREFETCH ahead of p */
MK_AVX2 static inline void pf(const uint8_t *p, int bytes) {
#if PREFETCH > 0
    for (int o = 0; o < bytes; o += 64) _mm_prefetch((const char *)p + PREFETCH + o, _MM_HINT_T0);
#else
    (void)p;
    (void)bytes;
#endif
}

/* the 32-bit words at p, p + stride, p + 2 stride, p + 3 stride (vector loads only: building
 * the vector through general registers and the stack costs a store-forwarding stall) */
MK_AVX2 static inline __m128i gather4(const uint8_t *p, int stride) {
    __m128i a = _mm_loadu_si32(p), b = _mm_loadu_si32(p + stride);
    __m128i c = _mm_loadu_si32(p + 2 * stride), d = _mm_loadu_si32(p + 3 * stride);
    return _mm_unpacklo_epi64(_mm_unpacklo_epi32(a, b), _mm_unpacklo_epi32(c, d));
}

/* the halves at p, p + stride, ..., p + 7 stride -> 8 floats (reads 4 bytes at each) */
MK_AVX2 static inline __m256 h8(const uint8_t *p, int stride) {
    const __m128i lo16 = _mm_set1_epi32(0xffff);
    __m128i a = _mm_and_si128(gather4(p, stride), lo16);
    __m128i b = _mm_and_si128(gather4(p + 4 * stride, stride), lo16);
    return _mm256_cvtph_ps(_mm_packus_epi32(a, b));
}

/* Q4_1 / Q5_1: d and m of 8 blocks (each block starts with the two halves) */
MK_AVX2 static inline void dm8(const uint8_t *p, int stride, __m256 *d, __m256 *m) {
    __m128i a = gather4(p, stride), b = gather4(p + 4 * stride, stride);
    const __m128i lo16 = _mm_set1_epi32(0xffff);
    *d = _mm256_cvtph_ps(_mm_packus_epi32(_mm_and_si128(a, lo16), _mm_and_si128(b, lo16)));
    *m = _mm256_cvtph_ps(_mm_packus_epi32(_mm_srli_epi32(a, 16), _mm_srli_epi32(b, 16)));
}

/* Q5_0 / Q5_1: the 32 bits of qh as bytes 0x10 (bit set) or 0 */
MK_AVX2 static inline __m256i q5_high(const uint8_t *qh4) {
    const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101ll, 0x0202020202020202ll,
                                              0x0303030303030303ll);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)rd32(qh4)), spread);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(16));
}

/* ---- dequantization ---- */

MK_AVX2 static void dq_f16_v(const uint8_t *p, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * i))));
    for (; i < n; i++) y[i] = h2f_v(rd16(p + 2 * i));
}

MK_AVX2 static void dq_bf16_v(const uint8_t *p, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 2 * i)));
        _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; i < n; i++) y[i] = mk_bf16_to_f32(rd16(p + 2 * i));
}

/* 32 int8 (as a byte vector) -> 4 x 8 floats stored at y */
MK_AVX2 static inline void store_i8x32(float *y, __m256i q, __m256 d, __m256 m, int add_m) {
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    __m256i v[4] = {_mm256_cvtepi8_epi32(lo), _mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)),
                    _mm256_cvtepi8_epi32(hi), _mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))};
    for (int i = 0; i < 4; i++) {
        __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(v[i]), d);
        if (add_m) f = _mm256_add_ps(f, m);
        _mm256_storeu_ps(y + 8 * i, f);
    }
}

MK_AVX2 static void dq_q4_0_v(const uint8_t *p, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 18, y += QK) {
        __m256i q = _mm256_sub_epi8(nibbles32(p + 2), _mm256_set1_epi8(8));
        store_i8x32(y, q, _mm256_set1_ps(h2f_v(rd16(p))), _mm256_setzero_ps(), 0);
    }
}

MK_AVX2 static void dq_q4_1_v(const uint8_t *p, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 20, y += QK)
        store_i8x32(y, nibbles32(p + 4), _mm256_set1_ps(h2f_v(rd16(p))),
                    _mm256_set1_ps(h2f_v(rd16(p + 2))), 1);
}

MK_AVX2 static void dq_q5_0_v(const uint8_t *p, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 22, y += QK) {
        __m256i q = _mm256_or_si256(nibbles32(p + 6), q5_high(p + 2));
        store_i8x32(y, _mm256_sub_epi8(q, _mm256_set1_epi8(16)), _mm256_set1_ps(h2f_v(rd16(p))),
                    _mm256_setzero_ps(), 0);
    }
}

MK_AVX2 static void dq_q5_1_v(const uint8_t *p, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 24, y += QK)
        store_i8x32(y, _mm256_or_si256(nibbles32(p + 8), q5_high(p + 4)),
                    _mm256_set1_ps(h2f_v(rd16(p))), _mm256_set1_ps(h2f_v(rd16(p + 2))), 1);
}

MK_AVX2 static void dq_q8_0_v(const uint8_t *p, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 34, y += QK)
        store_i8x32(y, _mm256_loadu_si256((const __m256i *)(p + 2)), _mm256_set1_ps(h2f_v(rd16(p))),
                    _mm256_setzero_ps(), 0);
}

/* 32 unsigned bytes q -> y = d1 * q - m1 (K-quants) */
MK_AVX2 static inline void store_kq(float *y, __m256i q, float d1, float m1) {
    __m256 d = _mm256_set1_ps(d1), m = _mm256_set1_ps(m1);
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    __m256i v[4] = {_mm256_cvtepu8_epi32(lo), _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)),
                    _mm256_cvtepu8_epi32(hi), _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))};
    for (int i = 0; i < 4; i++)
        _mm256_storeu_ps(y + 8 * i, _mm256_sub_ps(_mm256_mul_ps(d, _mm256_cvtepi32_ps(v[i])), m));
}

MK_AVX2 static void dq_q4_k_v(const uint8_t *p, float *y, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int64_t b = 0; b < nb; b++, p += 144) {
        float d = h2f_v(rd16(p)), dmin = h2f_v(rd16(p + 2));
        uint8_t sc[8], mn[8];
        kq_scales(p + 4, sc, mn);
        for (int c = 0; c < 4; c++, y += 64) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(p + 16 + 32 * c));
            store_kq(y, _mm256_and_si256(raw, m4), d * (float)sc[2 * c], dmin * (float)mn[2 * c]);
            store_kq(y + 32, _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4),
                     d * (float)sc[2 * c + 1], dmin * (float)mn[2 * c + 1]);
        }
    }
}

MK_AVX2 static void dq_q5_k_v(const uint8_t *p, float *y, int64_t nb) {
    const __m256i m4 = _mm256_set1_epi8(15), b4 = _mm256_set1_epi8(16);
    for (int64_t b = 0; b < nb; b++, p += 176) {
        float d = h2f_v(rd16(p)), dmin = h2f_v(rd16(p + 2));
        uint8_t sc[8], mn[8];
        kq_scales(p + 4, sc, mn);
        __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 16));
        for (int c = 0; c < 4; c++, y += 64) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(p + 48 + 32 * c));
            /* bits 0 and 1 of qh (shifted down 2 per chunk) become bit 4 of the two halves */
            __m256i lo = _mm256_or_si256(_mm256_and_si256(raw, m4),
                                         _mm256_and_si256(_mm256_slli_epi16(qh, 4), b4));
            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4),
                                         _mm256_and_si256(_mm256_slli_epi16(qh, 3), b4));
            store_kq(y, lo, d * (float)sc[2 * c], dmin * (float)mn[2 * c]);
            store_kq(y + 32, hi, d * (float)sc[2 * c + 1], dmin * (float)mn[2 * c + 1]);
            qh = _mm256_srli_epi16(qh, 2);
        }
    }
}

/* Q6_K: the four 32-value quarters of half h (unsigned 0..63) */
MK_AVX2 static inline void q6_quarters(const uint8_t *p, int h, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    __m256i l0 = _mm256_loadu_si256((const __m256i *)(p + 64 * h));
    __m256i l1 = _mm256_loadu_si256((const __m256i *)(p + 64 * h + 32));
    __m256i qh = _mm256_loadu_si256((const __m256i *)(p + 128 + 32 * h));
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m30));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
}

MK_AVX2 static void dq_q6_k_v(const uint8_t *p, float *y, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, p += 210) {
        float d = h2f_v(rd16(p + 208));
        const int8_t *sc = (const int8_t *)(p + 192);
        for (int h = 0; h < 2; h++) {
            __m256i q[4];
            q6_quarters(p, h, q);
            for (int k = 0; k < 4; k++, y += 32) {
                __m256i v = _mm256_sub_epi8(q[k], _mm256_set1_epi8(32));
                __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
                __m256i e[4] = {_mm256_cvtepi8_epi32(lo), _mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)),
                                _mm256_cvtepi8_epi32(hi), _mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))};
                for (int i = 0; i < 4; i++) {
                    float ds = d * (float)sc[8 * h + 2 * k + i / 2];
                    _mm256_storeu_ps(y + 8 * i,
                                     _mm256_mul_ps(_mm256_set1_ps(ds), _mm256_cvtepi32_ps(e[i])));
                }
            }
        }
    }
}

/* ---- activation quantization ---- */

MK_AVX2 static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* 4 x 8 int32 -> 32 int8 in order (saturating) */
MK_AVX2 static inline __m256i pack32(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
    __m256i a = _mm256_packs_epi32(i0, i1), b = _mm256_packs_epi32(i2, i3);
    return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, b),
                                       _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

MK_AVX2 static void qa_q8_0_v(const float *x, int64_t n, uint8_t *out, int with_s) {
    int64_t nb = n / QK;
    int8_t *q = (int8_t *)out;
    float *dd = (float *)(out + n);
    int32_t *sum = (int32_t *)(out + n + 4 * nb);
    float *ss = (float *)(out + n + 8 * nb);
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < nb; b++, x += QK, q += QK) {
        __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
        __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        /* max(a, |v|) keeps the scalar's "a > |v| ? a : |v|" order */
        __m256 mx = _mm256_max_ps(_mm256_setzero_ps(), _mm256_and_ps(v0, absm));
        mx = _mm256_max_ps(mx, _mm256_and_ps(v1, absm));
        mx = _mm256_max_ps(mx, _mm256_and_ps(v2, absm));
        mx = _mm256_max_ps(mx, _mm256_and_ps(v3, absm));
        float amax = hmax8(mx);
        float d = amax / 127.0f;
        float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        __m256 mul = _mm256_set1_ps(id);
        __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, mul));
        __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, mul));
        __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, mul));
        __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, mul));
        __m256i qv = pack32(i0, i1, i2, i3);
        _mm256_storeu_si256((__m256i *)q, qv);
        /* the sum of the stored (saturated) bytes, as the scalar code sums q[j] */
        __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), qv);
        int32_t s = hsum_i32_8(_mm256_madd_epi16(s16, _mm256_set1_epi16(1)));
        dd[b] = h2f_v(f2h(d));
        sum[b] = s;
        if (with_s) ss[b] = h2f_v(f2h(d * (float)s));
    }
}

MK_AVX2 static void qa_q8_k_v(const float *x, int64_t n, uint8_t *out) {
    int64_t nb = n / QKK;
    int8_t *q = (int8_t *)out;
    float *dd = (float *)(out + n);
    int16_t *bs = (int16_t *)(out + n + 4 * nb);
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t b = 0; b < nb; b++, x += QKK, q += QKK, bs += 16) {
        __m256 mx = _mm256_setzero_ps();
        for (int j = 0; j < QKK; j += 8) mx = _mm256_max_ps(mx, _mm256_and_ps(_mm256_loadu_ps(x + j), absm));
        float amax = hmax8(mx);
        if (amax == 0.0f || !(amax <= FLT_MAX)) { /* as the scalar code (NaN never wins a max) */
            float a2 = 0.0f;
            for (int j = 0; j < QKK; j++) {
                float a = fabsf(x[j]);
                if (a > a2) a2 = a;
            }
            memset(q, 0, QKK);
            memset(bs, 0, 32);
            dd[b] = a2 == 0.0f ? 0.0f : NAN;
            continue;
        }
        /* the first element with |x| == amax gives the sign (ggml keeps the first maximum) */
        const __m256 va = _mm256_set1_ps(amax);
        float max = amax;
        for (int j = 0; j < QKK; j += 8) {
            __m256 v = _mm256_loadu_ps(x + j);
            int msk = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(v, absm), va, _CMP_EQ_OQ));
            if (msk) { max = x[j + __builtin_ctz((unsigned)msk)]; break; }
        }
        float iscale = -127.0f / max;
        const __m256 mul = _mm256_set1_ps(iscale);
        for (int j = 0; j < QKK; j += 32) {
            __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j), mul));
            __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8), mul));
            __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 16), mul));
            __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 24), mul));
            __m256i qv = pack32(i0, i1, i2, i3); /* saturation = ggml's MIN(127, v) */
            _mm256_storeu_si256((__m256i *)(q + j), qv);
            /* sums of 16: pairs (maddubs), quads (madd), then within each 128-bit half */
            __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), qv),
                                           _mm256_set1_epi16(1));
            __m128i lo = _mm256_castsi256_si128(s4), hi = _mm256_extracti128_si256(s4, 1);
            bs[j / 16] = (int16_t)hsum_i32_4(lo);
            bs[j / 16 + 1] = (int16_t)hsum_i32_4(hi);
        }
        dd[b] = 1.0f / iscale;
    }
}

MK_AVX2 static void qa_f16_v(const float *x, int64_t n, uint8_t *out) {
    float *h = (float *)out;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(h + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i),
                                                                _MM_FROUND_TO_NEAREST_INT)));
    for (; i < n; i++) h[i] = h2f_v(f2h(x[i]));
}

/* ---- dots ---- */

MK_AVX2 static float dot_f32_v(const uint8_t *w, const void *act, int64_t n) {
    const float *x = act, *wf = (const float *)w;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        pf(w + 4 * i, 128);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(_mm256_loadu_ps(wf + i + 8 * c),
                                                         _mm256_loadu_ps(x + i + 8 * c)));
    }
    float a[32];
    for (int c = 0; c < 4; c++) _mm256_storeu_ps(a + 8 * c, acc[c]);
    for (; i < n; i++) {
        float wi;
        memcpy(&wi, w + 4 * i, 4);
        float p = wi * x[i];
        a[i & 31] += p;
    }
    return hsum32_s(a);
}

MK_AVX2 static float dot_f16_v(const uint8_t *w, const void *act, int64_t n) {
    const float *x = act;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        pf(w + 2 * i, 64);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m256 wv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 2 * (i + 8 * c))));
            acc[c] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + i + 8 * c), acc[c]); /* exact product:
                                                                        fma == mul + add */
        }
    }
    float a[32];
    for (int c = 0; c < 4; c++) _mm256_storeu_ps(a + 8 * c, acc[c]);
    for (; i < n; i++) {
        float p = h2f_v(rd16(w + 2 * i)) * x[i];
        a[i & 31] += p;
    }
    return hsum32_s(a);
}

MK_AVX2 static inline __m256 bf16x8(const void *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

MK_AVX2 static float dot_bf16_v(const uint8_t *w, const void *act, int64_t n) {
    const float *x = act;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        pf(w + 2 * i, 64);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            acc[c] = _mm256_add_ps(acc[c], _mm256_mul_ps(bf16x8(w + 2 * (i + 8 * c)),
                                                         _mm256_loadu_ps(x + i + 8 * c)));
    }
    float a[32];
    for (int c = 0; c < 4; c++) _mm256_storeu_ps(a + 8 * c, acc[c]);
    for (; i < n; i++) {
        float p = mk_bf16_to_f32(rd16(w + 2 * i)) * x[i];
        a[i & 31] += p;
    }
    return hsum32_s(a);
}

/* Integer block dots, 8 int32 partial sums per block (the block's sum is their total). */
MK_AVX2 static inline __m256i bdot_q4_0(const uint8_t *blk, const int8_t *x) { /* sum q x, q 0..15 */
    __m256i p = _mm256_maddubs_epi16(nibbles32(blk + 2), _mm256_loadu_si256((const __m256i *)x));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}
MK_AVX2 static inline __m256i bdot_q4_1(const uint8_t *blk, const int8_t *x) {
    __m256i p = _mm256_maddubs_epi16(nibbles32(blk + 4), _mm256_loadu_si256((const __m256i *)x));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}
MK_AVX2 static inline __m256i bdot_q5_0(const uint8_t *blk, const int8_t *x) { /* q 0..31 */
    __m256i q = _mm256_or_si256(nibbles32(blk + 6), q5_high(blk + 2));
    __m256i p = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)x));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}
MK_AVX2 static inline __m256i bdot_q5_1(const uint8_t *blk, const int8_t *x) {
    __m256i q = _mm256_or_si256(nibbles32(blk + 8), q5_high(blk + 4));
    __m256i p = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)x));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}
MK_AVX2 static inline __m256i bdot_q8_0(const uint8_t *blk, const int8_t *x) {
    __m256i w = _mm256_loadu_si256((const __m256i *)(blk + 2));
    __m256i xv = _mm256_loadu_si256((const __m256i *)x);
    /* |w| (unsigned, <= 128) times x with w's sign: pairs <= 2 * 128 * 127, no saturation */
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xv, w));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* Q4_0: 8 blocks per step; sumi = sum q x - 8 sum x (the activation block sums are stored). */
MK_AVX2 static float dot_q4_0_v(const uint8_t *w, const void *act, int64_t n) {
    act32 a = act32_view(act, n);
    int64_t nb = n / QK, b = 0;
    __m256 acc = _mm256_setzero_ps();
    for (; b + 8 <= nb; b += 8, w += 8 * 18) {
        pf(w, 8 * 18);
        __m256i v[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) v[i] = bdot_q4_0(w + 18 * i, a.q + QK * (b + i));
        __m256i s = reduce8(v);
        __m256i xs = _mm256_loadu_si256((const __m256i *)(a.sum + b));
        s = _mm256_sub_epi32(s, _mm256_slli_epi32(xs, 3));
        __m256 d = _mm256_mul_ps(h8(w, 18), _mm256_loadu_ps(a.d + b));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(s)));
    }
    float l[8];
    _mm256_storeu_ps(l, acc);
    for (; b < nb; b++, w += 18) {
        int32_t s = hsum_i32_8(bdot_q4_0(w, a.q + QK * b)) - 8 * a.sum[b];
        lane_add(l, b, h2f_v(rd16(w)), a.d[b], s);
    }
    return hsum8_s(l);
}

/* Q5_0: as Q4_0 with 5-bit q and offset 16 */
MK_AVX2 static float dot_q5_0_v(const uint8_t *w, const void *act, int64_t n) {
    act32 a = act32_view(act, n);
    int64_t nb = n / QK, b = 0;
    __m256 acc = _mm256_setzero_ps();
    for (; b + 8 <= nb; b += 8, w += 8 * 22) {
        pf(w, 8 * 22);
        __m256i v[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) v[i] = bdot_q5_0(w + 22 * i, a.q + QK * (b + i));
        __m256i s = reduce8(v);
        __m256i xs = _mm256_loadu_si256((const __m256i *)(a.sum + b));
        s = _mm256_sub_epi32(s, _mm256_slli_epi32(xs, 4));
        __m256 d = _mm256_mul_ps(h8(w, 22), _mm256_loadu_ps(a.d + b));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(s)));
    }
    float l[8];
    _mm256_storeu_ps(l, acc);
    for (; b < nb; b++, w += 22) {
        int32_t s = hsum_i32_8(bdot_q5_0(w, a.q + QK * b)) - 16 * a.sum[b];
        lane_add(l, b, h2f_v(rd16(w)), a.d[b], s);
    }
    return hsum8_s(l);
}

/* Q8_0 / Q4_1 in llama.cpp's order (see lanes_fma): one block's 8 lanes of exact integer sums
 * as floats */
MK_AVX2 static inline __m256 bxy_q8_0(const uint8_t *blk, const int8_t *x) {
    return _mm256_cvtepi32_ps(bdot_q8_0(blk, x));
}
MK_AVX2 static inline __m256 bxy_q4_1(const uint8_t *blk, const int8_t *x) {
    return _mm256_cvtepi32_ps(bdot_q4_1(blk, x));
}

MK_AVX2 static inline float hsum8_v(__m256 v) { /* ggml's hsum_float_8 (= hsum8_s) */
    __m128 t = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
}

MK_AVX2 static inline float fma_ss(float a, float b, float c) {
    return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

MK_AVX2 static float dot_q8_0_v(const uint8_t *w, const void *act, int64_t n) {
    act32 a = act32_view(act, n);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK; b++, w += 34) {
        pf(w, 34);
        float d = h2f_v(rd16(w)) * a.d[b];
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), bxy_q8_0(w, a.q + QK * b), acc);
    }
    return hsum8_v(acc);
}

/* four rows of W (stride bytes apart) against one activation row: the same per-row order, with
 * the activation block loaded once and four independent accumulation chains */
MK_AVX2 static void dot4_q8_0_v(const uint8_t *w, size_t stride, const void *act, int64_t n, float *out) {
    act32 a = act32_view(act, n);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < n / QK; b++, w += 34) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(a.q + QK * b));
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const uint8_t *wr = w + r * stride;
            pf(wr, 34);
            __m256i wv = _mm256_loadu_si256((const __m256i *)(wr + 2));
            __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv));
            __m256 xy = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
            float d = h2f_v(rd16(wr)) * a.d[b];
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), xy, acc[r]);
        }
    }
    for (int r = 0; r < 4; r++) out[r] = hsum8_v(acc[r]);
}

MK_AVX2 static float dot_q4_1_v(const uint8_t *w, const void *act, int64_t n) {
    act32 a = act32_view(act, n);
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (int64_t b = 0; b < n / QK; b++, w += 20) {
        pf(w, 20);
        float d = h2f_v(rd16(w)) * a.d[b];
        summs = fma_ss(h2f_v(rd16(w + 2)), a.s[b], summs);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), bxy_q4_1(w, a.q + QK * b), acc);
    }
    return hsum8_v(acc) + summs;
}

MK_AVX2 static void dot4_q4_1_v(const uint8_t *w, size_t stride, const void *act, int64_t n, float *out) {
    act32 a = act32_view(act, n);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    __m128 summs[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m256i one16 = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < n / QK; b++, w += 20) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(a.q + QK * b));
        __m128 dx = _mm_set_ss(a.d[b]), sx = _mm_set_ss(a.s[b]);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const uint8_t *wr = w + r * stride;
            pf(wr, 20);
            __m128i raw = _mm_loadu_si128((const __m128i *)(wr + 4));
            __m256i q = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(raw), _mm_srli_epi16(raw, 4), 1), m4);
            __m256 xy = _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(q, xv), one16));
            /* the two halves d, m of the block, converted together */
            __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)rd32(wr)));
            __m128 d = _mm_mul_ss(dm, dx);
            summs[r] = _mm_fmadd_ss(_mm_movehdup_ps(dm), sx, summs[r]);
            acc[r] = _mm256_fmadd_ps(_mm256_broadcastss_ps(d), xy, acc[r]);
        }
    }
    for (int r = 0; r < 4; r++) out[r] = hsum8_v(acc[r]) + _mm_cvtss_f32(summs[r]);
}

MK_AVX2 static float dot_q5_1_v(const uint8_t *w, const void *act, int64_t n) {
    act32 a = act32_view(act, n);
    int64_t nb = n / QK, b = 0;
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (; b + 8 <= nb; b += 8, w += 8 * 24) {
        pf(w, 8 * 24);
        __m256i v[8];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) v[i] = bdot_q5_1(w + 24 * i, a.q + QK * (b + i));
        __m256i s = reduce8(v);
        __m256 dw, mw;
        dm8(w, 24, &dw, &mw);
        __m256 d = _mm256_mul_ps(dw, _mm256_loadu_ps(a.d + b));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(d, _mm256_cvtepi32_ps(s)));
        accm = _mm256_add_ps(accm, _mm256_mul_ps(mw, _mm256_loadu_ps(a.s + b)));
    }
    float l[8], lm[8];
    _mm256_storeu_ps(l, acc);
    _mm256_storeu_ps(lm, accm);
    for (; b < nb; b++, w += 24) {
        lane_add(l, b, h2f_v(rd16(w)), a.d[b], hsum_i32_8(bdot_q5_1(w, a.q + QK * b)));
        lane_add_m(lm, b, h2f_v(rd16(w + 2)), a.s[b]);
    }
    return hsum8_s(l) + hsum8_s(lm);
}

/* int16 element e of a 128-bit half, broadcast (shuffle control) */
#define BCAST16(e) _mm256_set1_epi16((short)(((2 * (e) + 1) << 8) | (2 * (e))))

/* Q4_K / Q5_K mins term: sum_j mn[j] * (bsums[2j] + bsums[2j+1]) */
MK_AVX2 static inline int32_t kq_msum_v(__m128i mn16, const int16_t *bs) {
    __m128i pr = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)bs),
                                _mm_loadu_si128((const __m128i *)(bs + 8)));
    return hsum_i32_4(_mm_madd_epi16(mn16, pr));
}

/* scales and mins of a Q4_K / Q5_K super-block as int16: [sc0..sc7 | mn0..mn7] */
MK_AVX2 static inline __m256i kq_scales16(const uint8_t *q) {
    uint32_t a = rd32(q), b = rd32(q + 4), c = rd32(q + 8);
    __m128i v = _mm_setr_epi32((int)(a & 0x3f3f3f3fu),
                               (int)((c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u)),
                               (int)(b & 0x3f3f3f3fu),
                               (int)(((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u)));
    return _mm256_cvtepu8_epi16(v);
}

MK_AVX2 static float dot_q4_k_v(const uint8_t *w, const void *act, int64_t n) {
    actk a = actk_view(act, n);
    const __m256i m4 = _mm256_set1_epi8(15);
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / QKK; b++, w += 144) {
        pf(w, 144);
        __m256i s16 = kq_scales16(w + 4);
        __m256i scv = _mm256_permute2x128_si256(s16, s16, 0x00);
        const int8_t *x = a.q + QKK * b;
        const uint8_t *qs = w + 16;
        __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i pl = _mm256_maddubs_epi16(_mm256_and_si256(raw, m4),
                                              _mm256_loadu_si256((const __m256i *)(x + 64 * c)));
            __m256i ph = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4),
                                              _mm256_loadu_si256((const __m256i *)(x + 64 * c + 32)));
            pl = _mm256_madd_epi16(pl, _mm256_shuffle_epi8(scv, BCAST16(2 * c)));
            ph = _mm256_madd_epi16(ph, _mm256_shuffle_epi8(scv, BCAST16(2 * c + 1)));
            acc = _mm256_add_epi32(acc, _mm256_add_epi32(pl, ph));
        }
        int32_t msum = kq_msum_v(_mm256_extracti128_si256(s16, 1), a.bsums + 16 * b);
        sumf = kq_step(sumf, a.d[b], h2f_v(rd16(w)), h2f_v(rd16(w + 2)), hsum_i32_8(acc), msum);
    }
    return sumf;
}

MK_AVX2 static float dot_q5_k_v(const uint8_t *w, const void *act, int64_t n) {
    actk a = actk_view(act, n);
    const __m256i m4 = _mm256_set1_epi8(15), b4 = _mm256_set1_epi8(16);
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / QKK; b++, w += 176) {
        pf(w, 176);
        __m256i s16 = kq_scales16(w + 4);
        __m256i scv = _mm256_permute2x128_si256(s16, s16, 0x00);
        const int8_t *x = a.q + QKK * b;
        const uint8_t *qs = w + 48;
        __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 16));
        __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m256i raw = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i lo = _mm256_or_si256(_mm256_and_si256(raw, m4),
                                         _mm256_and_si256(_mm256_slli_epi16(qh, 4), b4));
            __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4),
                                         _mm256_and_si256(_mm256_slli_epi16(qh, 3), b4));
            qh = _mm256_srli_epi16(qh, 2);
            __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(x + 64 * c)));
            __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(x + 64 * c + 32)));
            pl = _mm256_madd_epi16(pl, _mm256_shuffle_epi8(scv, BCAST16(2 * c)));
            ph = _mm256_madd_epi16(ph, _mm256_shuffle_epi8(scv, BCAST16(2 * c + 1)));
            acc = _mm256_add_epi32(acc, _mm256_add_epi32(pl, ph));
        }
        int32_t msum = kq_msum_v(_mm256_extracti128_si256(s16, 1), a.bsums + 16 * b);
        sumf = kq_step(sumf, a.d[b], h2f_v(rd16(w)), h2f_v(rd16(w + 2)), hsum_i32_8(acc), msum);
    }
    return sumf;
}

MK_AVX2 static float dot_q6_k_v(const uint8_t *w, const void *act, int64_t n) {
    actk a = actk_view(act, n);
    /* quarter k of a half: int16 scale 2k on the low 128 bits (elements 0-15), 2k+1 on the high */
    const __m256i ctl[4] = {
        _mm256_setr_m128i(_mm_set1_epi16(0x0100), _mm_set1_epi16(0x0302)),
        _mm256_setr_m128i(_mm_set1_epi16(0x0504), _mm_set1_epi16(0x0706)),
        _mm256_setr_m128i(_mm_set1_epi16(0x0908), _mm_set1_epi16(0x0b0a)),
        _mm256_setr_m128i(_mm_set1_epi16(0x0d0c), _mm_set1_epi16(0x0f0e)),
    };
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / QKK; b++, w += 210) {
        pf(w, 210);
        const int8_t *x = a.q + QKK * b;
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 192)));
        /* the -32 offset: 32 * sum_s sc[s] * bsums[s] (sub-blocks of 16 = the bsums groups) */
        __m256i corr = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)(a.bsums + 16 * b)));
        __m256i acc = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 5));
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256i scv = h ? _mm256_permute2x128_si256(sc16, sc16, 0x11)
                            : _mm256_permute2x128_si256(sc16, sc16, 0x00);
            __m256i q[4];
            q6_quarters(w, h, q);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m256i p = _mm256_maddubs_epi16(
                    q[k], _mm256_loadu_si256((const __m256i *)(x + 128 * h + 32 * k)));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_shuffle_epi8(scv, ctl[k])));
            }
        }
        sumf = kq_step(sumf, a.d[b], h2f_v(rd16(w + 208)), 0.0f, hsum_i32_8(acc), 0);
    }
    return sumf;
}


/* ---- multi-row matmul: AVX-512 VNNI tiles (Q4_1, Q8_0) --------------------------------------
 * A step of many rows (a batched decode, a prefill) against Q4_1 / Q8_0 weights: each output is
 * still one dot in llama.cpp's order (lanes_fma: per block, 8 exact integer lane sums of
 * elements 4l..4l+3, fused into float lane l with fl(dw * dx); Q4_1's m * s chain; hsum8), but a
 * tile of weight rows x activation rows shares every load: a weight block is unpacked once for
 * many rows, an activation block loaded once for several weight rows. Two tile forms:
 *   - row-lane (mr_tile16, rows in groups of 16): lane i of a vector is row i, vector l holds lane
 *     l of the 8-lane order for 16 rows; one scale multiply serves 16 rows;
 *   - pairs (mr_tile, the rows left over, or fewer than 16): one zmm holds one block of two rows,
 *     vpdpbusd gives both rows' 8 lane sums at once; 4 weight rows x 4 pairs per tile.
 * Either way every int32 is the exact sum of the same 4 products as maddubs + madd's, the scale
 * fl(dw * dx) and the fma run per lane as in the one-row kernels, Q4_1's m * s chains run one
 * per vector lane, and each row's reduction is hsum8's tree. So the results are bit-identical to
 * dot_q4_1_v / dot_q8_0_v (and the scalar reference); tests/unit/test_ggml_multirow.c checks it.
 * Q8_0 weights are signed: the activations are stored as x + 128 (unsigned) and the weight
 * block's 128 * sum of each 4 w is subtracted, an exact integer identity. */

#define MK_VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,avx2,fma,f16c")))
#define MR_NW 4 /* weight rows per tile */
#define MR_NP 4 /* activation row pairs per tile */

/* The repacked activations (mk_ggml_matmul's scratch), np = ceil(m / 2) pairs, nb blocks:
 *   q [nb][np][64]  row 2p's 32 int8 (Q4_1) or x + 128 (Q8_0), then row 2p + 1's; but rows
 *                   [0, m16) (m >= 16: the multiples of 16) in the row-lane layout, 16 rows in
 *                   the space of 8 pairs: [lane l < 8][row < 16][elements 4l..4l+3]
 *   d [nb][2 np]    the scale of each row
 *   s [nb][2 np]    Q8_1's s of each row (Q4_1 only)
 * A missing last row of an odd m is zeros (its outputs are not stored). */
typedef struct {
    uint8_t *q;
    float *d, *s;
    int np, nb;
    int m16; /* rows [0, m16) in groups of 16 (the row-lane layout), the rest in pairs */
} mr_act;

static size_t mr_bytes(int m, int k) {
    size_t np = (size_t)(m + 1) / 2, nb = (size_t)k / QK;
    return nb * np * (64 + 8 + 8) + 3 * 64;
}

static mr_act mr_view(void *p, int m, int k) {
    mr_act a;
    a.np = (m + 1) / 2;
    a.nb = k / QK;
    a.m16 = m >= 16 ? m & ~15 : 0;
    uint8_t *b = (uint8_t *)(((uintptr_t)p + 63) & ~(uintptr_t)63);
    a.q = b;
    a.d = (float *)(b + (size_t)a.nb * a.np * 64);
    a.s = a.d + (size_t)a.nb * a.np * 2;
    return a;
}

/* Row r of the per-row activations (Q8_0 / Q8_1 layout) into its place in the pairs. */
static void mr_put_row(const mr_act *A, int r, const void *act, int k, int q8) {
    act32 a = act32_view(act, k);
    const int p = r / 2, h = r % 2;
    for (int b = 0; b < A->nb; b++) {
        uint8_t *dst = A->q + ((size_t)b * A->np + p) * 64 + 32 * h;
        const uint8_t *src = (const uint8_t *)(a.q + QK * b);
        const uint32_t flip = q8 ? 0x80808080u : 0u;
        if (r < A->m16) { /* row-lane layout: [lane l][16 rows][elements 4l..4l+3] */
            dst = A->q + ((size_t)b * A->np + (size_t)(r / 16) * 8) * 64 + 4 * (r % 16);
            for (int l = 0; l < 8; l++) {
                uint32_t v = rd32(src + 4 * l) ^ flip;
                memcpy(dst + 64 * l, &v, 4);
            }
        } else {
            for (int l = 0; l < 8; l++) {
                uint32_t v = rd32(src + 4 * l) ^ flip;
                memcpy(dst + 4 * l, &v, 4);
            }
        }
        A->d[(size_t)b * 2 * A->np + r] = a.d[b];
        if (!q8) A->s[(size_t)b * 2 * A->np + r] = a.s[b];
    }
}

static void mr_zero_row(const mr_act *A, int r, int q8) {
    const int p = r / 2, h = r % 2;
    for (int b = 0; b < A->nb; b++) {
        memset(A->q + ((size_t)b * A->np + p) * 64 + 32 * h, q8 ? 0x80 : 0, 32);
        A->d[(size_t)b * 2 * A->np + r] = 0.0f;
        if (!q8) A->s[(size_t)b * 2 * A->np + r] = 0.0f;
    }
}

/* One tile: NW weight rows (stride bytes apart) x NP pairs from pair p0; writes y[row][j]
 * (row < m, ldy floats per row). q8: Q8_0 weights, else Q4_1. Constant NW / NP: unrolled. */
MK_VNNI static inline __attribute__((always_inline)) void mr_tile(const int q8, const int NW, const int NP, const uint8_t *w,
                                                                  size_t stride, const mr_act *A, int p0, float *y,
                                                                  size_t ldy, int m) {
    const int bb = q8 ? 34 : 20;
    __m512 acc[MR_NW][MR_NP];
    __m256 summs[MR_NW];
#pragma GCC unroll 4
    for (int j = 0; j < NW; j++) {
        summs[j] = _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) acc[j][p] = _mm512_setzero_ps();
    }
    const __m512i m4 = _mm512_set1_epi8(15), c128 = _mm512_set1_epi8((char)0x80);
    for (int b = 0; b < A->nb; b++) {
        __m512i qv[MR_NW], corr[MR_NW];
        float dw[MR_NW], mw[MR_NW];
#pragma GCC unroll 4
        for (int j = 0; j < NW; j++) {
            const uint8_t *blk = w + (size_t)j * stride + (size_t)b * bb;
            _mm_prefetch((const char *)blk + PREFETCH, _MM_HINT_T0);
            if (q8) {
                dw[j] = h2f_v(rd16(blk));
                qv[j] = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(blk + 2)));
                corr[j] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, qv[j]));
            } else {
                __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)rd32(blk)));
                dw[j] = _mm_cvtss_f32(dm);
                mw[j] = _mm_cvtss_f32(_mm_movehdup_ps(dm));
                __m128i raw = _mm_loadu_si128((const __m128i *)(blk + 4));
                __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(raw), _mm_srli_epi16(raw, 4), 1);
                qv[j] = _mm512_and_si512(_mm512_broadcast_i64x4(v), m4);
                corr[j] = _mm512_setzero_si512();
            }
        }
        const __mmask8 rows = (__mmask8)((1u << (2 * NP)) - 1);
        /* fl(dw * dx) of the tile's rows, 8 at once; each pair's two then spread over its halves */
        const __m256 dx8 = _mm256_maskz_loadu_ps(rows, A->d + (size_t)b * 2 * A->np + 2 * p0);
        __m512 d8[MR_NW];
#pragma GCC unroll 4
        for (int j = 0; j < NW; j++) d8[j] = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(dw[j]), dx8));
        if (!q8) {
            __m256 s = _mm256_maskz_loadu_ps(rows, A->s + (size_t)b * 2 * A->np + 2 * p0);
#pragma GCC unroll 4
            for (int j = 0; j < NW; j++) summs[j] = _mm256_fmadd_ps(_mm256_set1_ps(mw[j]), s, summs[j]);
        }
        const uint8_t *xq = A->q + ((size_t)b * A->np + p0) * 64;
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            __m512i x = _mm512_load_si512((const void *)(xq + 64 * p));
            const __m512i sel = _mm512_set_epi32(2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1, 2 * p + 1,
                                                 2 * p + 1, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p, 2 * p);
#pragma GCC unroll 4
            for (int j = 0; j < NW; j++) {
                __m512 d = _mm512_permutexvar_ps(sel, d8[j]);
                __m512i is = q8 ? _mm512_dpbusd_epi32(corr[j], x, qv[j]) : _mm512_dpbusd_epi32(corr[j], qv[j], x);
                acc[j][p] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(is), acc[j][p]);
            }
        }
    }
#pragma GCC unroll 4
    for (int j = 0; j < NW; j++) {
        float sm[8];
        _mm256_storeu_ps(sm, summs[j]);
#pragma GCC unroll 4
        for (int p = 0; p < NP; p++) {
            const int r = 2 * (p0 + p);
            float lo = hsum8_v(_mm512_castps512_ps256(acc[j][p])), hi = hsum8_v(_mm512_extractf32x8_ps(acc[j][p], 1));
            if (!q8) {
                lo += sm[2 * p];
                hi += sm[2 * p + 1];
            }
            y[(size_t)r * ldy + j] = lo;
            if (r + 1 < m) y[(size_t)(r + 1) * ldy + j] = hi;
        }
    }
}

/* Row-lane tile (m >= 16): NW weight rows x 16 activation rows, lane i of every vector = row i.
 * Per block and weight row, vpdpbusd of the weight's 4 bytes of lane l (broadcast) with the 16
 * rows' 4 bytes of lane l gives lane l's exact integer sum for all 16 rows; the scale products
 * fl(dw * dx) of the 16 rows are one vector multiply (the pair tiles spend one per two rows);
 * acc[j][l] = fma(d, isum_l, acc[j][l]) is lane l's chain for every row, and the final hsum8 is
 * the same tree (l, l + 4, then (0 + 2) + (1 + 3)) written across the rows' lanes. */
#define MR_TW 2 /* weight rows per row-lane tile */
MK_VNNI static inline __attribute__((always_inline)) void mr_tile16(const int q8, const int NW, const uint8_t *w, size_t stride,
                                                                    const mr_act *A, int g, float *y, size_t ldy) {
    const int bb = q8 ? 34 : 20;
    __m512 acc[MR_TW][8], summs[MR_TW];
#pragma GCC unroll 2
    for (int j = 0; j < NW; j++) {
        summs[j] = _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++) acc[j][l] = _mm512_setzero_ps();
    }
    const __m256i m4 = _mm256_set1_epi8(15);
    for (int b = 0; b < A->nb; b++) {
        int32_t wq[MR_TW][8] __attribute__((aligned(32))), cr[MR_TW][8] __attribute__((aligned(32)));
        __m512 d[MR_TW];
        const __m512 dx = _mm512_loadu_ps(A->d + (size_t)b * 2 * A->np + 16 * g);
#pragma GCC unroll 2
        for (int j = 0; j < NW; j++) {
            const uint8_t *blk = w + (size_t)j * stride + (size_t)b * bb;
            _mm_prefetch((const char *)blk + PREFETCH, _MM_HINT_T0);
            if (q8) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 2));
                _mm256_store_si256((__m256i *)wq[j], v);
                __m256i c = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), v);
                _mm256_store_si256((__m256i *)cr[j], _mm256_sub_epi32(_mm256_setzero_si256(), c));
                d[j] = _mm512_mul_ps(_mm512_set1_ps(h2f_v(rd16(blk))), dx);
            } else {
                __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128((int)rd32(blk)));
                __m128i raw = _mm_loadu_si128((const __m128i *)(blk + 4));
                __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(raw), _mm_srli_epi16(raw, 4), 1);
                _mm256_store_si256((__m256i *)wq[j], _mm256_and_si256(v, m4));
                d[j] = _mm512_mul_ps(_mm512_set1_ps(_mm_cvtss_f32(dm)), dx);
                summs[j] = _mm512_fmadd_ps(_mm512_set1_ps(_mm_cvtss_f32(_mm_movehdup_ps(dm))),
                                           _mm512_loadu_ps(A->s + (size_t)b * 2 * A->np + 16 * g), summs[j]);
            }
        }
        /* read wq / cr back from memory: as broadcast loads (the load ports), not as shuffles of
         * the registers they were stored from (which GCC would otherwise make of them) */
        __asm__ volatile("" ::: "memory");
        const uint8_t *xq = A->q + ((size_t)b * A->np + (size_t)g * 8) * 64;
#pragma GCC unroll 8
        for (int l = 0; l < 8; l++) {
            __m512i x = _mm512_load_si512((const void *)(xq + 64 * l));
#pragma GCC unroll 2
            for (int j = 0; j < NW; j++) {
                __m512i is = q8 ? _mm512_dpbusd_epi32(_mm512_set1_epi32(cr[j][l]), x, _mm512_set1_epi32(wq[j][l]))
                                : _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi32(wq[j][l]), x);
                acc[j][l] = _mm512_fmadd_ps(d[j], _mm512_cvtepi32_ps(is), acc[j][l]);
            }
        }
    }
#pragma GCC unroll 2
    for (int j = 0; j < NW; j++) {
        __m512 t0 = _mm512_add_ps(acc[j][0], acc[j][4]), t1 = _mm512_add_ps(acc[j][1], acc[j][5]);
        __m512 t2 = _mm512_add_ps(acc[j][2], acc[j][6]), t3 = _mm512_add_ps(acc[j][3], acc[j][7]);
        __m512 r = _mm512_add_ps(_mm512_add_ps(t0, t2), _mm512_add_ps(t1, t3));
        if (!q8) r = _mm512_add_ps(r, summs[j]);
        float o[16];
        _mm512_storeu_ps(o, r);
        for (int i = 0; i < 16; i++) y[(size_t)(16 * g + i) * ldy + j] = o[i];
    }
}

MK_VNNI static void mr_tile16_q4_1(int NW, const uint8_t *w, size_t stride, const mr_act *A, int g, float *y, size_t ldy) {
    if (NW == MR_TW) mr_tile16(0, MR_TW, w, stride, A, g, y, ldy);
    else mr_tile16(0, 1, w, stride, A, g, y, ldy);
}
MK_VNNI static void mr_tile16_q8_0(int NW, const uint8_t *w, size_t stride, const mr_act *A, int g, float *y, size_t ldy) {
    if (NW == MR_TW) mr_tile16(1, MR_TW, w, stride, A, g, y, ldy);
    else mr_tile16(1, 1, w, stride, A, g, y, ldy);
}

#define MR_CASE(Q8, NW, NP) mr_tile(Q8, NW, NP, w, stride, A, p0, y, ldy, m)
#define MR_NPS(Q8, NW)                                  \
    switch (NP) {                                       \
    case 1: MR_CASE(Q8, NW, 1); break;                  \
    case 2: MR_CASE(Q8, NW, 2); break;                  \
    case 3: MR_CASE(Q8, NW, 3); break;                  \
    default: MR_CASE(Q8, NW, 4); break;                 \
    }

MK_VNNI static void mr_tile_q4_1(int NW, int NP, const uint8_t *w, size_t stride, const mr_act *A, int p0, float *y, size_t ldy, int m) {
    if (NW == MR_NW) { MR_NPS(0, MR_NW) } else { MR_NPS(0, 1) }
}
MK_VNNI static void mr_tile_q8_0(int NW, int NP, const uint8_t *w, size_t stride, const mr_act *A, int p0, float *y, size_t ldy, int m) {
    if (NW == MR_NW) { MR_NPS(1, MR_NW) } else { MR_NPS(1, 1) }
}
#undef MR_NPS
#undef MR_CASE

#endif /* MK_HAVE_X86 */

/* ==== dispatch ================================================================================= */

typedef void (*dq_fn)(const uint8_t *p, float *y, int64_t nblocks);
typedef float (*dot_fn)(const uint8_t *w, const void *act, int64_t n);
/* four weight rows, `stride` bytes apart, against one activation row (AVX2 only; optional) */
typedef void (*dot4_fn)(const uint8_t *w, size_t stride, const void *act, int64_t n, float *out);

typedef struct {
    uint32_t type, act_type;
    const char *name;
    int blk;      /* elements per block */
    int bytes;    /* bytes per block */
    dq_fn dq[2];  /* scalar, AVX2 (both take a count of blocks) */
    dot_fn dot[2];
    dot4_fn dot4;
} type_info;

#if MK_HAVE_X86
#define V(f) f
#else
#define V(f) NULL
#endif

static const type_info k_types[] = {
    {MK_GGML_F32, MK_GGML_F32, "f32", 1, 4, {dq_f32_s, dq_f32_s}, {dot_f32_s, V(dot_f32_v)}, NULL},
    {MK_GGML_F16, MK_GGML_F16, "f16", 1, 2, {dq_f16_s, V(dq_f16_v)}, {dot_f16_s, V(dot_f16_v)}, NULL},
    {MK_GGML_BF16, MK_GGML_BF16, "bf16", 1, 2, {dq_bf16_s, V(dq_bf16_v)}, {dot_bf16_s, V(dot_bf16_v)}, NULL},
    {MK_GGML_Q4_0, MK_GGML_Q8_0, "q4_0", QK, 18, {dq_q4_0_s, V(dq_q4_0_v)}, {dot_q4_0_s, V(dot_q4_0_v)}, NULL},
    {MK_GGML_Q4_1, MK_GGML_Q8_1, "q4_1", QK, 20, {dq_q4_1_s, V(dq_q4_1_v)}, {dot_q4_1_s, V(dot_q4_1_v)}, V(dot4_q4_1_v)},
    {MK_GGML_Q5_0, MK_GGML_Q8_0, "q5_0", QK, 22, {dq_q5_0_s, V(dq_q5_0_v)}, {dot_q5_0_s, V(dot_q5_0_v)}, NULL},
    {MK_GGML_Q5_1, MK_GGML_Q8_1, "q5_1", QK, 24, {dq_q5_1_s, V(dq_q5_1_v)}, {dot_q5_1_s, V(dot_q5_1_v)}, NULL},
    {MK_GGML_Q8_0, MK_GGML_Q8_0, "q8_0", QK, 34, {dq_q8_0_s, V(dq_q8_0_v)}, {dot_q8_0_s, V(dot_q8_0_v)}, V(dot4_q8_0_v)},
    {MK_GGML_Q4_K, MK_GGML_Q8_K, "q4_K", QKK, 144, {dq_q4_k_s, V(dq_q4_k_v)}, {dot_q4_k_s, V(dot_q4_k_v)}, NULL},
    {MK_GGML_Q5_K, MK_GGML_Q8_K, "q5_K", QKK, 176, {dq_q5_k_s, V(dq_q5_k_v)}, {dot_q5_k_s, V(dot_q5_k_v)}, NULL},
    {MK_GGML_Q6_K, MK_GGML_Q8_K, "q6_K", QKK, 210, {dq_q6_k_s, V(dq_q6_k_v)}, {dot_q6_k_s, V(dot_q6_k_v)}, NULL},
};

static const type_info *find_type(uint32_t type) {
    for (size_t i = 0; i < sizeof k_types / sizeof k_types[0]; i++)
        if (k_types[i].type == type) return &k_types[i];
    return NULL;
}

/* 1 when the AVX2 kernels can run here (AVX2, FMA and F16C; base/cpu.h, detected once). */
static int use_simd(void) { return mk_cpu_avx2(); }

/* 1 when the AVX-512 VNNI multi-row kernels can run here (AVX-512 F, BW, DQ, VL and VNNI, plus
 * the AVX2 set). Detected once, as use_simd. */
static int use_vnni(void) {
    static volatile int vnni = -1;
    if (vnni < 0) {
#if MK_HAVE_X86
        vnni = use_simd() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512vnni");
#else
        vnni = 0;
#endif
    }
    return vnni;
}

int mk_ggml_have_vnni(void) { return use_vnni(); }

static void quant_act(uint32_t act_type, const float *x, int64_t n, uint8_t *out, int simd) {
#if MK_HAVE_X86
    if (simd) {
        switch (act_type) {
        case MK_GGML_Q8_0: qa_q8_0_v(x, n, out, 0); return;
        case MK_GGML_Q8_1: qa_q8_0_v(x, n, out, 1); return;
        case MK_GGML_Q8_K: qa_q8_k_v(x, n, out); return;
        case MK_GGML_F16: qa_f16_v(x, n, out); return;
        default: break;
        }
    }
#endif
    switch (act_type) {
    case MK_GGML_Q8_0: qa_q8_0_s(x, n, out, 0); break;
    case MK_GGML_Q8_1: qa_q8_0_s(x, n, out, 1); break;
    case MK_GGML_Q8_K: qa_q8_k_s(x, n, out); break;
    case MK_GGML_F16: qa_f16_s(x, n, out); break;
    case MK_GGML_BF16: qa_bf16_s(x, n, out); break;
    case MK_GGML_F32: qa_f32_s(x, n, out); break;
    default: break;
    }
}

static size_t act_bytes(uint32_t act_type, int64_t n) {
    switch (act_type) {
    case MK_GGML_Q8_0: return (size_t)n + 8 * (size_t)(n / QK);
    case MK_GGML_Q8_1: return (size_t)n + 12 * (size_t)(n / QK);
    case MK_GGML_Q8_K: return (size_t)n + 36 * (size_t)(n / QKK);
    case MK_GGML_F16:
    case MK_GGML_BF16:
    case MK_GGML_F32: return 4 * (size_t)n;
    default: return 0;
    }
}

/* ==== public API =============================================================================== */

int mk_ggml_type_supported(uint32_t type) { return find_type(type) != NULL; }

int mk_ggml_block_elems(uint32_t type) {
    const type_info *t = find_type(type);
    return t ? t->blk : 0;
}

size_t mk_ggml_block_bytes(uint32_t type) {
    const type_info *t = find_type(type);
    return t ? (size_t)t->bytes : 0;
}

size_t mk_ggml_row_bytes(uint32_t type, int64_t n) {
    const type_info *t = find_type(type);
    if (!t || n <= 0 || n % t->blk) return 0;
    return (size_t)(n / t->blk) * (size_t)t->bytes;
}

static void fill_nan(float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = NAN;
}

void mk_ggml_dequant_row(uint32_t type, const void *src, float *dst, int64_t n) {
    const type_info *t = find_type(type);
    if (!mk_ggml_row_bytes(type, n)) { fill_nan(dst, n); return; }
    int simd = use_simd();
    dq_fn f = t->dq[simd && t->dq[1] ? 1 : 0];
    f(src, dst, n / t->blk);
}

uint32_t mk_ggml_act_type(uint32_t type) {
    const type_info *t = find_type(type);
    return t ? t->act_type : (uint32_t)-1;
}

size_t mk_ggml_act_bytes(uint32_t type, int64_t n) {
    if (!mk_ggml_row_bytes(type, n)) return 0;
    return act_bytes(find_type(type)->act_type, n);
}

void mk_ggml_quant_act(uint32_t type, const float *x, int64_t n, void *act) {
    if (!mk_ggml_row_bytes(type, n)) return;
    quant_act(find_type(type)->act_type, x, n, act, use_simd());
}

float mk_ggml_vec_dot(uint32_t type, int64_t n, const void *w_row, const void *act) {
    const type_info *t = find_type(type);
    if (!mk_ggml_row_bytes(type, n)) return NAN;
    dot_fn f = t->dot[use_simd() && t->dot[1] ? 1 : 0];
    return f(w_row, act, n);
}

/* ---- matmul ------------------------------------------------------------------------------- */

#define MM_ROWS 16          /* rows of W per pool task */
#define MM_TILE 4           /* prefill: rows of W kept hot while all activation rows pass */
#ifndef POOL_MIN_BYTES
#define POOL_MIN_BYTES (32.0 * 1024) /* weight bytes x m below which the pool is not used */
#endif
#define QUANT_POOL_MIN 16384          /* activations (m x k) below which they are quantized inline */

static size_t act_stride(uint32_t act_type, int k) { return (act_bytes(act_type, k) + 63) & ~(size_t)63; }

/* 1 when the multi-row kernels take this product: Q4_1 / Q8_0 weights, 2+ rows, VNNI here. */
static int mr_eligible(uint32_t type, int m, unsigned flags) {
    return MK_HAVE_X86 && m >= 2 && (type == MK_GGML_Q4_1 || type == MK_GGML_Q8_0) && !(flags & MK_GGML_MM_NO_VNNI) &&
           use_vnni();
}

size_t mk_ggml_matmul_scratch(uint32_t type, int m, int k) {
    if (m <= 0 || !mk_ggml_row_bytes(type, k)) return 0;
    size_t b = (size_t)m * act_stride(find_type(type)->act_type, k) + 64;
#if MK_HAVE_X86
    if (m >= 2 && (type == MK_GGML_Q4_1 || type == MK_GGML_Q8_0)) b += mr_bytes(m, k);
#endif
    return b;
}

typedef struct {
    const uint8_t *W;
    size_t row_bytes;
    const float *x;
    uint8_t *act; /* [m][stride] */
    size_t stride;
    uint32_t type, act_type;
    float *y;
    int n, k, m, simd, mr; /* mr: the multi-row kernels (act repacked into A) */
    dot_fn dot;
    dot4_fn dot4;
#if MK_HAVE_X86
    mr_act A;
#endif
} mm_job;

static void mm_quant_task(void *ctx, int r, int tid) {
    (void)tid;
    const mm_job *J = ctx;
    uint8_t *a = J->act + (size_t)r * J->stride;
    quant_act(J->act_type, J->x + (size_t)r * J->k, J->k, a, J->simd);
#if MK_HAVE_X86
    if (J->mr) mr_put_row(&J->A, r, a, J->k, J->type == MK_GGML_Q8_0);
#endif
}

#if MK_HAVE_X86
/* multi-row: MM_ROWS weight rows, every activation row, in tiles of MR_NW x 2 MR_NP */
static void mm_mr_task(void *ctx, int t, int tid) {
    (void)tid;
    const mm_job *J = ctx;
    const int j0 = t * MM_ROWS, j1 = j0 + MM_ROWS < J->n ? j0 + MM_ROWS : J->n;
    for (int g = 0; g < J->A.m16 / 16; g++)
        for (int jt = j0; jt < j1;) {
            const int nw = j1 - jt >= MR_TW ? MR_TW : 1;
            if (J->type == MK_GGML_Q8_0)
                mr_tile16_q8_0(nw, J->W + (size_t)jt * J->row_bytes, J->row_bytes, &J->A, g, J->y + jt, (size_t)J->n);
            else
                mr_tile16_q4_1(nw, J->W + (size_t)jt * J->row_bytes, J->row_bytes, &J->A, g, J->y + jt, (size_t)J->n);
            jt += nw;
        }
    for (int jt = j0; jt < j1 && J->A.m16 < J->m;) {
        const int nw = j1 - jt >= MR_NW ? MR_NW : 1;
        for (int p0 = J->A.m16 / 2; p0 < J->A.np; p0 += MR_NP) {
            const int np = J->A.np - p0 < MR_NP ? J->A.np - p0 : MR_NP;
            if (J->type == MK_GGML_Q8_0)
                mr_tile_q8_0(nw, np, J->W + (size_t)jt * J->row_bytes, J->row_bytes, &J->A, p0, J->y + jt, (size_t)J->n, J->m);
            else
                mr_tile_q4_1(nw, np, J->W + (size_t)jt * J->row_bytes, J->row_bytes, &J->A, p0, J->y + jt, (size_t)J->n, J->m);
        }
        jt += nw;
    }
}
#endif

static void mm_task(void *ctx, int t, int tid) {
    (void)tid;
    const mm_job *J = ctx;
    int j0 = t * MM_ROWS, j1 = j0 + MM_ROWS < J->n ? j0 + MM_ROWS : J->n;
    if (J->m == 1) {
        int j = j0;
        if (J->dot4)
            for (; j + 4 <= j1; j += 4) J->dot4(J->W + (size_t)j * J->row_bytes, J->row_bytes, J->act, J->k, J->y + j);
        for (; j < j1; j++) J->y[j] = J->dot(J->W + (size_t)j * J->row_bytes, J->act, J->k);
        return;
    }
    /* prefill: a few weight rows stay in L1 while every activation row passes over them */
    for (int jt = j0; jt < j1; jt += MM_TILE) {
        int je = jt + MM_TILE < j1 ? jt + MM_TILE : j1;
        for (int r = 0; r < J->m; r++) {
            const uint8_t *a = J->act + (size_t)r * J->stride;
            if (J->dot4 && je - jt == 4) {
                J->dot4(J->W + (size_t)jt * J->row_bytes, J->row_bytes, a, J->k, J->y + (size_t)r * J->n + jt);
                continue;
            }
            for (int j = jt; j < je; j++)
                J->y[(size_t)r * J->n + j] = J->dot(J->W + (size_t)j * J->row_bytes, a, J->k);
        }
    }
}

void mk_ggml_matmul(mk_pool *pool, uint32_t type, const void *W, int n, int k, const float *x,
                    int m, float *y, void *scratch) {
    mk_ggml_matmul_ex(pool, type, W, n, k, x, m, y, scratch, 0);
}

void mk_ggml_matmul_ex(mk_pool *pool, uint32_t type, const void *W, int n, int k, const float *x,
                       int m, float *y, void *scratch, unsigned flags) {
    const mk_ggml_mat one = {W, n, y};
    mk_ggml_matmul_n(pool, type, k, &one, 1, x, m, scratch, flags);
}

/* Task t of a product over several matrices: matrix i's task t - task0[i]. */
typedef struct {
    const mm_job *J;
    const mk_ggml_mat *mats;
    int nmat;
    int task0[MK_GGML_MM_MAX_MATS + 1];
} mm_multi;

static void mm_multi_task(void *ctx, int t, int tid) {
    const mm_multi *M = ctx;
    int i = 0;
    while (t >= M->task0[i + 1]) i++;
    mm_job L = *M->J;
    L.W = M->mats[i].W;
    L.n = M->mats[i].n;
    L.y = M->mats[i].y;
#if MK_HAVE_X86
    if (L.mr) { mm_mr_task(&L, t - M->task0[i], tid); return; }
#endif
    mm_task(&L, t - M->task0[i], tid);
}

void mk_ggml_matmul_n(mk_pool *pool, uint32_t type, int k, const mk_ggml_mat *mats, int nmat, const float *x,
                      int m, void *scratch, unsigned flags) {
    if (m <= 0 || nmat <= 0) return;
    if (nmat > MK_GGML_MM_MAX_MATS || !mk_ggml_row_bytes(type, k)) {
        for (int i = 0; i < nmat; i++) if (mats[i].n > 0) fill_nan(mats[i].y, (int64_t)m * mats[i].n);
        return;
    }
    const type_info *t = find_type(type);
    mm_job J;
    J.row_bytes = mk_ggml_row_bytes(type, k);
    J.x = x;
    J.type = type;
    J.act_type = t->act_type;
    J.stride = act_stride(t->act_type, k);
    J.act = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    J.k = k;
    J.m = m;
    J.simd = use_simd();
    J.dot = t->dot[J.simd && t->dot[1] ? 1 : 0];
    J.dot4 = J.simd ? t->dot4 : NULL;
    J.mr = mr_eligible(type, m, flags);
    mm_multi M = {&J, mats, nmat, {0}};
    double total = 0;
    for (int i = 0; i < nmat; i++) {
        const int n = mats[i].n > 0 ? mats[i].n : 0;
        M.task0[i + 1] = M.task0[i] + (n + MM_ROWS - 1) / MM_ROWS;
        total += n;
    }
    if (!M.task0[nmat]) return;
#if MK_HAVE_X86
    if (J.mr) {
        J.A = mr_view(J.act + (size_t)m * J.stride, m, k);
        if (m % 2) mr_zero_row(&J.A, m, type == MK_GGML_Q8_0);
    }
#endif
    /* the activations are quantized once for every matrix */
    mk_pool_run((double)m * k >= QUANT_POOL_MIN ? pool : NULL, m, mm_quant_task, &J);
    /* Waking the pool costs about as much as streaming a couple of hundred KiB of weights. */
    if ((double)J.row_bytes * total * m < POOL_MIN_BYTES) pool = NULL;
    mk_pool_run(pool, M.task0[nmat], mm_multi_task, &M);
}
