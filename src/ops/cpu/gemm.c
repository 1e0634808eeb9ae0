/* gemm.c — mk_linear, the hot op of decode: y[m, n] = x[m, k] @ W^T for every weight kind, spread
 * over the thread pool by output feature (each thread streams its own contiguous slice of W).
 *
 * Decode is a stream of GEMVs (m = 1) over weights far larger than the caches, so the kernels are
 * built to keep up with memory: the weight bytes are turned into fp32 with a few integer ops per
 * 8 values (vpmaddubsw + shift + mask; no table lookups or conversion instructions), and the next
 * weights are prefetched a couple of KiB ahead. With m > 1 rows, each pool task (16 rows of W)
 * runs the same GEMV kernel once per activation row: its slice of W comes from DRAM once and from
 * L1 / L2 for the other rows. Products smaller than ~256 KiB of weights run on the calling thread
 * (waking the pool costs more than it saves there).
 *
 * A row's result does not depend on m: every row goes through the same kernel, so y[r] of an
 * m-row call is bit for bit y of row r run alone (tests/unit/test_gemm_rows.c), and callers can
 * stack rows of unrelated sequences (a batched decode step) into one call. (This replaced a
 * 4 x 2 register-tile kernel for m > 1, which decoded each weight block once for many rows but
 * summed in another order; with the GEMV's order imposed on it, it was slower per row than the
 * GEMV at every m measured, 4 to 64, on the 2-core Zen 3 machine.)
 *
 * Numerics: the result is the reference's (gemm_ref.c) up to fp32 reassociation. Products of an
 * e4m3 activation and an e4m3 / e2m1 weight are exact in fp32, and all scales are powers of two,
 * so the only differences are the order in which the per-block dots and the block sums are added.
 *
 *   FP8 weights. The byte s.eeee.mmm is moved to f32 bits s<<31 | eeee.mmm<<20, which is the
 *     weight times 2^-120 exactly; e4m3 subnormals (e = 0) land on f32 subnormals with the same
 *     meaning, so no special case is needed. To keep products and sums normal the activations are
 *     stored pre-multiplied by 2^118 (|q| <= 448 < 2^9, so q * 2^118 < 2^127); the block dot is
 *     then the true dot times 2^-2 and the 4 is folded into the block scale. (This relies on
 *     subnormal inputs not being flushed: with MXCSR.DAZ set, mk_linear takes the scalar path.)
 *   FP4 weights. Nibble s.ee.m goes to s<<31 | ee.m<<22: the e2m1 value times 2^-126 (e = 0
 *     again lands on the matching subnormal); 2^8 is folded into the per-32 scale. But 0.5 is one
 *     of e2m1's 7 magnitudes, so most weight vectors hold an f32 subnormal, and on Intel cores
 *     (Sapphire Rapids measured) an FMA with a subnormal input takes a microcode assist: ~30x
 *     slower than on normal inputs. So on Intel the nibbles go through f16 instead: the bytes are
 *     first transposed so each 128-bit half holds one 16-bit byte pair of every lane
 *     (fp4_bytes_f16), vpmaddubsw puts s.ee.m at f16 bits 15, 11..9 (the e2m1 value times 2^-14,
 *     e = 0 on the f16 subnormal) and vcvtph2ps widens that to a normal f32, at full speed. The
 *     activations are then pre-scaled by 2^6, so every product, lane and sum is the one the f32
 *     placement computes: the same bits (test_gemm's fp4_decodes_agree); ~35x the speed there.
 *     Zen cores keep the placement, which takes fewer instructions (bench_gemm times both).
 *   FP8_DQ (FP8 storage used as dequantized values, activations NOT quantized): the raw
 *     activations can have any magnitude, so there the decoded weights are first multiplied back
 *     by 2^120 (exact) and the block dot is scaled by the weight scale alone.
 *   BF16: the high half of a 32-bit lane is already an f32; the low half is shifted up.
 *   FP4 is the one kind that is compute-bound on a small core (64 multiply-adds per 32 bytes): its
 *     kernel works on two rows at once (more independent work per activation load), takes the
 *     per-32 scales of a row segment in one vectorized pass, and feeds the decoded weights
 *     straight into FMAs: on the Zen 3 machine this was written on, the same kernel with a vmulps
 *     on the (often subnormal) decoded FP4 weights ran 2.5x slower.
 *   Lane order: one 32-byte load gives 8 lanes of 4 (FP8), 8 (FP4) or 2 (BF16) packed values; the
 *     vector of "value p of every lane" holds elements p, E+p, 2E+p, ... So the activations are
 *     stored once per call in that permuted order (within each 8E-element chunk), which turns the
 *     unpacking into shifts and masks and costs nothing per weight.
 *   Elements after the last full SIMD chunk (k not a multiple of 128 for FP8, of 64 for FP4, of 16
 *     for BF16, of 8 for F32) keep natural order, are not pre-scaled, and go through the scalar
 *     code, which is also the whole computation on machines without AVX2.
 *
 * Inputs with inf / NaN give non-finite outputs where the reference's do, though which of inf and
 * NaN can differ (an infinite scale times a zero partial lane is NaN).
 *
 * Activation quantization (act_quant, per 128 block) is done once per call by an exact
 * re-implementation of mk_act_quant_block without table lookups: e4m3 round-to-nearest-even is an
 * integer round of the f32 mantissa to 3 bits for normal values and an add/subtract of 2^14
 * (whose ulp is the e4m3 subnormal step 2^-9) below 2^-6. Blocks with inf/NaN fall back to
 * mk_act_quant_block so even their odd semantics match.
 */
#include "base/cpu.h"
#include "num/formats.h"
#include "ops/ops.h"

#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MK_HAVE_X86 1
#define MK_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define MK_HAVE_X86 0
#endif

#define ROWS_PER_TASK 16 /* rows of W per pool task */
#ifndef PREFETCH
#define PREFETCH 2048 /* bytes of W prefetched ahead of the GEMV kernels */
#endif
#define POOL_MIN_BYTES (256.0 * 1024) /* weight bytes x m below which the pool is not used */
#define PREP_POOL_MIN 32768           /* activations (m x k) below which they are prepared inline */

/* ---- scalar helpers (exact) ------------------------------------------------------------- */

static inline float f32_bits(uint32_t u) { return mk_f32_from_bits(u); }

/* e8m0 scale 2^(e-127); e = 0 is the subnormal 2^-127, 255 is NaN. */
static inline float e8m0(uint8_t e) {
    uint32_t u = e == 0 ? 0x00400000u : e == 255 ? 0x7fc00000u : (uint32_t)e << 23;
    return f32_bits(u);
}

/* Exact e4m3 / e2m1 decoding without tables or subnormal intermediates: (integer significand)
 * times a normal power of two. */
static inline float e4m3_val(uint8_t b) {
    int e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return NAN;
    float v = e ? (float)(8 + m) * f32_bits((uint32_t)(e - 10 + 127) << 23)
                : (float)m * f32_bits((uint32_t)(-9 + 127) << 23);
    return (b & 0x80) ? -v : v;
}
static inline float e2m1_val(uint8_t nib) {
    static const float t[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    return t[nib & 15];
}

/* Round finite v, |v| <= 448, to the e4m3 grid, nearest-even: the value of
 * mk_e4m3_table[mk_f32_to_e4m3(v)]. */
static inline float e4m3_rne(float v) {
    uint32_t u = mk_f32_bits(v), sgn = u & 0x80000000u, a = u & 0x7fffffffu;
    uint32_t r;
    if (a < 0x3c800000u) { /* below 2^-6: fixed step 2^-9 = ulp(2^14) */
        r = mk_f32_bits((f32_bits(a) + 16384.0f) - 16384.0f);
    } else {
        r = (a + 0x7ffffu + ((a >> 20) & 1u)) & 0xfff00000u;
    }
    return f32_bits(r | sgn);
}

/* mk_act_quant_block, exactly, without the e4m3 table (scalar). Returns the scale. */
static float quant_block_scalar(const float *x, int n, float *q) {
    float amax = 0.0f;
    int bad = 0;
    for (int i = 0; i < n; i++) {
        float a = fabsf(x[i]);
        if (!(a <= FLT_MAX)) bad = 1;
        amax = fmaxf(amax, a);
    }
    if (bad) return mk_act_quant_block(x, n, q);
    amax = fmaxf(amax, 1e-4f);
    float s = mk_pow2_ceil(amax * (1.0f / 448.0f));
    float inv = 1.0f / s; /* s is 2^e with e in [-22, 120]: 1/s is exact and x*inv == x/s */
    for (int i = 0; i < n; i++) {
        float v = x[i] * inv;
        v = fminf(fmaxf(v, -448.0f), 448.0f);
        q[i] = e4m3_rne(v);
    }
    return s;
}

/* ---- the job ------------------------------------------------------------------------------ */

typedef struct {
    const mk_wmat *W;
    const float *x;  /* caller's activations */
    float *xp;       /* prepared activations [m, k] (in scratch), or x itself for F32 */
    float *sa;       /* [m, nb] activation scales (FP8 / FP4) */
    float *y;
    int m, n, k, nb; /* nb: 128-blocks along k */
    int kv;          /* [0, kv) is handled by SIMD in permuted order, [kv, k) by scalar code */
    int E;           /* values per 32-bit lane in the SIMD layout (4 FP8, 8 FP4, 2 BF16, 1 F32) */
    float pre;       /* pre-scale of quantized activations in [0, kv) (2^118 for FP8/FP4, 2^6 for
                      * FP4 through f16) */
    int simd;        /* 0: scalar, 1: AVX2 */
    int fp4h;        /* FP4 through the f16 decode (gemv_fp4_h) */
    int round;
} job_t;

/* Contribution of [kv, k) to y[r, j], in the reference's order and rounding structure. With kv = 0
 * this is the whole scalar mk_linear. */
static float tail_dot(const job_t *J, int j, int r) {
    const mk_wmat *W = J->W;
    int k = J->k, nb = J->nb, kv = J->kv;
    const float *xr = J->xp + (size_t)r * k;
    float acc = 0.0f;
    switch (W->kind) {
    case MK_W_BF16: {
        const uint16_t *wr = (const uint16_t *)W->w + (size_t)j * k;
        for (int i = kv; i < k; i++) acc += xr[i] * mk_bf16_to_f32(wr[i]);
        break;
    }
    case MK_W_F32: {
        const float *wr = (const float *)W->w + (size_t)j * k;
        for (int i = kv; i < k; i++) acc += xr[i] * wr[i];
        break;
    }
    case MK_W_FP8: {
        const uint8_t *wr = (const uint8_t *)W->w + (size_t)j * k;
        const uint8_t *sr = W->scale + (size_t)(j / 128) * nb;
        for (int b = kv / 128; b < nb; b++) {
            float part = 0.0f;
            int e = (b + 1) * 128 < k ? (b + 1) * 128 : k;
            for (int i = b * 128; i < e; i++) part += xr[i] * e4m3_val(wr[i]);
            acc += part * J->sa[(size_t)r * nb + b] * e8m0(sr[b]);
        }
        break;
    }
    case MK_W_FP8_DQ: {
        const uint8_t *wr = (const uint8_t *)W->w + (size_t)j * k;
        const uint8_t *sr = W->scale + (size_t)(j / 128) * nb;
        for (int b = kv / 128; b < nb; b++) {
            float sb = e8m0(sr[b]);
            int e = (b + 1) * 128 < k ? (b + 1) * 128 : k;
            for (int i = b * 128; i < e; i++) acc += xr[i] * (e4m3_val(wr[i]) * sb);
        }
        break;
    }
    case MK_W_FP4: {
        const uint8_t *wr = (const uint8_t *)W->w + (size_t)j * (k / 2);
        const uint8_t *sr = W->scale + (size_t)j * (k / 32);
        for (int g = kv / 32; g < k / 32; g++) {
            float part = 0.0f;
            for (int i = g * 32; i < g * 32 + 32; i += 2) {
                uint8_t byte = wr[i / 2];
                part += xr[i] * e2m1_val(byte & 15);
                part += xr[i + 1] * e2m1_val(byte >> 4);
            }
            acc += part * J->sa[(size_t)r * nb + g / 4] * e8m0(sr[g]);
        }
        break;
    }
    }
    return acc;
}

static inline void store_y(const job_t *J, int r, int j, float v) {
    J->y[(size_t)r * J->n + j] = J->round ? mk_bf16r(v) : v;
}

static void scalar_rows(const job_t *J, int j0, int j1) {
    for (int j = j0; j < j1; j++)
        for (int r = 0; r < J->m; r++) store_y(J, r, j, tail_dot(J, j, r));
}

/* dst[c*8E + 8p + i] = src[c*8E + E*i + p] * pre, for the len/(8E) chunks of [0, len). */
static void permute_chunks(const float *src, float *dst, int len, int E, float pre) {
    for (int c = 0; c < len; c += 8 * E)
        for (int p = 0; p < E; p++)
            for (int i = 0; i < 8; i++) dst[c + 8 * p + i] = src[c + E * i + p] * pre;
}

#if MK_HAVE_X86

/* ---- AVX2 ---------------------------------------------------------------------------------- */

MK_AVX2 static inline float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

/* permute_chunks for E = 2, 4, 8: an 8 x E -> E x 8 transpose per chunk, in registers. */
MK_AVX2 static void permute_chunks_avx2(const float *src, float *dst, int len, int E, float pre) {
    const __m256 vp = _mm256_set1_ps(pre);
    if (E == 2) {
        for (int c = 0; c < len; c += 16) {
            __m256 a = _mm256_loadu_ps(src + c), b = _mm256_loadu_ps(src + c + 8);
            /* per 128-bit lane: [a0 a2 b0 b2] = elements 0,1,4,5 | 2,3,6,7 of column 0 */
            __m256 e = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
            __m256 o = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
            e = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), _MM_SHUFFLE(3, 1, 2, 0)));
            o = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), _MM_SHUFFLE(3, 1, 2, 0)));
            _mm256_storeu_ps(dst + c, _mm256_mul_ps(e, vp));
            _mm256_storeu_ps(dst + c + 8, _mm256_mul_ps(o, vp));
        }
    } else if (E == 4) {
        /* rows i = 0..7 of 4 values; a_r holds rows 2r (low lane) and 2r+1 (high lane). A 4 x 4
         * transpose per lane gives column p as rows 0,2,4,6 | 1,3,5,7, then lanes are reordered. */
        const __m256i ord = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (int c = 0; c < len; c += 32) {
            __m256 a0 = _mm256_loadu_ps(src + c), a1 = _mm256_loadu_ps(src + c + 8);
            __m256 a2 = _mm256_loadu_ps(src + c + 16), a3 = _mm256_loadu_ps(src + c + 24);
            __m256 t0 = _mm256_unpacklo_ps(a0, a1), t1 = _mm256_unpackhi_ps(a0, a1);
            __m256 t2 = _mm256_unpacklo_ps(a2, a3), t3 = _mm256_unpackhi_ps(a2, a3);
            __m256 r[4] = {_mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2)),
                           _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2))};
            for (int p = 0; p < 4; p++)
                _mm256_storeu_ps(dst + c + 8 * p,
                                 _mm256_mul_ps(_mm256_permutevar8x32_ps(r[p], ord), vp));
        }
    } else if (E == 8) { /* the classic 8 x 8 transpose */
        for (int c = 0; c < len; c += 64) {
            __m256 a[8], t[8], u[8];
            for (int i = 0; i < 8; i++) a[i] = _mm256_loadu_ps(src + c + 8 * i);
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm256_unpacklo_ps(a[i], a[i + 1]);
                t[i + 1] = _mm256_unpackhi_ps(a[i], a[i + 1]);
            }
            for (int h = 0; h < 8; h += 4) {
                u[h] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(1, 0, 1, 0));
                u[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], _MM_SHUFFLE(3, 2, 3, 2));
                u[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(1, 0, 1, 0));
                u[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], _MM_SHUFFLE(3, 2, 3, 2));
            }
            for (int p = 0; p < 4; p++) {
                _mm256_storeu_ps(dst + c + 8 * p,
                                 _mm256_mul_ps(_mm256_permute2f128_ps(u[p], u[p + 4], 0x20), vp));
                _mm256_storeu_ps(dst + c + 8 * (p + 4),
                                 _mm256_mul_ps(_mm256_permute2f128_ps(u[p], u[p + 4], 0x31), vp));
            }
        }
    } else {
        permute_chunks(src, dst, len, E, pre);
    }
}

/* quant_block_scalar, 8 lanes at a time; bit-identical. */
MK_AVX2 static float quant_block_avx2(const float *x, int n, float *q) {
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 vmax = _mm256_setzero_ps();
    __m256i bad = _mm256_setzero_si256();
    int n8 = n & ~7;
    for (int i = 0; i < n8; i += 8) {
        __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), absm);
        vmax = _mm256_max_ps(vmax, a);
        bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(_mm256_castps_si256(a),
                                                      _mm256_set1_epi32(0x7f7fffff)));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float amax = _mm_cvtss_f32(m4);
    int isbad = !_mm256_testz_si256(bad, bad);
    for (int i = n8; i < n; i++) {
        float a = fabsf(x[i]);
        if (!(a <= FLT_MAX)) isbad = 1;
        amax = fmaxf(amax, a);
    }
    if (isbad) return mk_act_quant_block(x, n, q);
    amax = fmaxf(amax, 1e-4f);
    float s = mk_pow2_ceil(amax * (1.0f / 448.0f));
    float inv = 1.0f / s;
    const __m256 vinv = _mm256_set1_ps(inv), lo = _mm256_set1_ps(-448.0f),
                 hi = _mm256_set1_ps(448.0f), big = _mm256_set1_ps(16384.0f),
                 tiny = _mm256_set1_ps(0x1p-6f);
    const __m256i half = _mm256_set1_epi32(0x7ffff), one = _mm256_set1_epi32(1),
                  keep = _mm256_set1_epi32((int)0xfff00000u);
    for (int i = 0; i < n8; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vinv);
        v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
        __m256 a = _mm256_and_ps(v, absm);
        __m256 sgn = _mm256_andnot_ps(absm, v);
        __m256 small = _mm256_sub_ps(_mm256_add_ps(a, big), big);
        __m256i ai = _mm256_castps_si256(a);
        __m256i rnd = _mm256_add_epi32(half, _mm256_and_si256(_mm256_srli_epi32(ai, 20), one));
        __m256 norm = _mm256_castsi256_ps(_mm256_and_si256(_mm256_add_epi32(ai, rnd), keep));
        __m256 r = _mm256_blendv_ps(norm, small, _mm256_cmp_ps(a, tiny, _CMP_LT_OQ));
        _mm256_storeu_ps(q + i, _mm256_or_ps(r, sgn));
    }
    for (int i = n8; i < n; i++) {
        float v = x[i] * inv;
        v = fminf(fmaxf(v, -448.0f), 448.0f);
        q[i] = e4m3_rne(v);
    }
    return s;
}

#define FP8_MASK ((int)0x87f00000u) /* sign + e4m3 exponent/mantissa at f32 bits 26..20 */
#define FP4_MASK ((int)0x81c00000u) /* sign + e2m1 exponent/mantissa at f32 bits 24..22 */

/* The placement of the packed codes is done with vpmaddubsw, which sign-extends each byte and
 * multiplies it by a small power of two (so the code's sign lands on bit 15 of a 16-bit half and
 * its e/m bits just below the f32 exponent position once the half is the top of a lane), on the
 * integer-multiply pipes: plain shifts would all compete for the two shift pipes of the FP unit,
 * which was the bottleneck. Products are at most 16 * 128 = 2048: no saturation. */

/* The four 8-float vectors of one 32-byte FP8 chunk (element 4i+p in lane i of o_p), times
 * 2^-120. 16 * sext(byte) puts the sign at bit 15 (and above), e/m at bits 10..4 of the half. */
#define FP8_DECODE(v, o0, o1, o2, o3)                                                            \
    do {                                                                                         \
        const __m256i m_ = _mm256_set1_epi32(FP8_MASK);                                          \
        __m256i lo_ = _mm256_maddubs_epi16(_mm256_set1_epi16(16), (v));      /* bytes 0 | 2 */   \
        __m256i hi_ = _mm256_maddubs_epi16(_mm256_set1_epi16(16 << 8), (v)); /* bytes 1 | 3 */   \
        o2 = _mm256_castsi256_ps(_mm256_and_si256(lo_, m_));                                     \
        o3 = _mm256_castsi256_ps(_mm256_and_si256(hi_, m_));                                     \
        o0 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(lo_, 16), m_));             \
        o1 = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(hi_, 16), m_));             \
    } while (0)

/* FP4 codes as f16 (the Intel decode, see the FP4 note at the top): after fp4_bytes_f16 each
 * 128-bit half holds one 16-bit pair of bytes per lane (bytes 0-1 of lanes 0..7 below, bytes 2-3
 * above), 32 * sext(byte) puts the high nibble's sign at bit 15 and its e/m bits at 11..9, where
 * f16 keeps its exponent's low bits and mantissa's top bit: the e2m1 value times 2^-14, e = 0
 * landing on the matching f16 subnormal, which vcvtph2ps widens at full speed. */
#define FP4H_MASK ((short)0x8e00)
MK_AVX2 static inline __m256i fp4_bytes_f16(__m256i v) {
    const __m256i lohi = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1,
                                          4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    return _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, lohi), _MM_SHUFFLE(3, 1, 2, 0));
}

/* -- GEMV kernels (m = 1) -- */

/* FP8 (dq = 0): pre-scaled quantized activations, block scale sa * sb * 4.
 * FP8_DQ (dq = 1): raw activations (any magnitude), so the decoded weights are first brought back
 * to their true values (times 2^120, exact) and the block dot is scaled by sb alone. */
MK_AVX2 static inline __attribute__((always_inline)) void gemv_fp8_impl(const job_t *J, int j0,
                                                                        int j1, const int dq, int ar) {
    const int k = J->k, nb = J->nb, nbf = J->kv / 128;
    const __m256 up = _mm256_set1_ps(0x1p120f);
    const float *x = J->xp + (size_t)ar * k, *sa = J->sa + (size_t)ar * nb;
    for (int j = j0; j < j1; j++) {
        const uint8_t *wr = (const uint8_t *)J->W->w + (size_t)j * k;
        const uint8_t *sr = J->W->scale + (size_t)(j / 128) * nb;
        __m256 acc = _mm256_setzero_ps();
        for (int b = 0; b < nbf; b++) {
            const uint8_t *wb = wr + b * 128;
            const float *xb = x + b * 128;
            _mm_prefetch((const char *)wb + PREFETCH, _MM_HINT_T0);
            _mm_prefetch((const char *)wb + PREFETCH + 64, _MM_HINT_T0);
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int t = 0; t < 128; t += 32) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(wb + t));
                __m256 e0, e1, e2, e3;
                FP8_DECODE(v, e0, e1, e2, e3);
                if (dq) {
                    e0 = _mm256_mul_ps(e0, up);
                    e1 = _mm256_mul_ps(e1, up);
                    e2 = _mm256_mul_ps(e2, up);
                    e3 = _mm256_mul_ps(e3, up);
                }
                a0 = _mm256_fmadd_ps(e0, _mm256_loadu_ps(xb + t), a0);
                a1 = _mm256_fmadd_ps(e1, _mm256_loadu_ps(xb + t + 8), a1);
                a2 = _mm256_fmadd_ps(e2, _mm256_loadu_ps(xb + t + 16), a2);
                a3 = _mm256_fmadd_ps(e3, _mm256_loadu_ps(xb + t + 24), a3);
            }
            float c = dq ? e8m0(sr[b]) : sa[b] * e8m0(sr[b]) * 4.0f; /* 4 = 2^120 / 2^118 */
            __m256 part = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
            acc = _mm256_fmadd_ps(part, _mm256_set1_ps(c), acc);
        }
        float v = hsum8(acc);
        if (J->kv < k) v += tail_dot(J, j, ar);
        store_y(J, ar, j, v);
    }
}
MK_AVX2 static void gemv_fp8(const job_t *J, int j0, int j1, int ar) { gemv_fp8_impl(J, j0, j1, 0, ar); }
MK_AVX2 static void gemv_fp8_dq(const job_t *J, int j0, int j1, int ar) { gemv_fp8_impl(J, j0, j1, 1, ar); }

/* sf[i] = sa[block of group g0+i] * 256 * e8m0(sr[i]) for i < gn (g0 a multiple of 8): the
 * per-32 scales of one FP4 row segment, 8 at a time (256 = 2^126 / 2^118, or 2^14 / 2^6 for the f16
 * decode). */
#define FP4_SEG 256
MK_AVX2 static void fp4_row_scales(const uint8_t *sr, const float *sa, int g0, int gn, float *sf) {
    const __m256i idx = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    const __m256 k256 = _mm256_set1_ps(256.0f);
    int i = 0;
    for (; i + 8 <= gn; i += 8) {
        uint64_t u;
        memcpy(&u, sr + i, 8);
        const uint64_t lo = 0x0101010101010101ull, hi = 0x8080808080808080ull;
        /* e8m0 0 (2^-127, subnormal) and 255 (NaN) are not e << 23: take the scalar path */
        if (((u - lo) & ~u & hi) | ((~u - lo) & u & hi)) {
            for (int t = i; t < i + 8; t++) sf[t] = sa[(g0 + t) / 4] * 256.0f * e8m0(sr[t]);
            continue;
        }
        __m256 sb = _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sr + i))), 23));
        __m256 a = _mm256_permutevar8x32_ps(
            _mm256_castps128_ps256(_mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(sa + (g0 + i) / 4)))),
            idx);
        _mm256_store_ps(sf + i, _mm256_mul_ps(_mm256_mul_ps(a, k256), sb));
    }
    for (; i < gn; i++) sf[i] = sa[(g0 + i) / 4] * 256.0f * e8m0(sr[i]);
}

/* NR (1 or 2) rows of FP4 at once. Two rows share every activation load: with 64 multiply-adds
 * per 32 weight bytes, the 8 activation loads per chunk are as much of the cost as the FMAs.
 * H: the f16 decode (fp4_bytes_f16) instead of the f32 bit placement; the same lanes, products and
 * sums, so the same bits. */
MK_AVX2 static inline __attribute__((always_inline)) void gemv_fp4_rows(const job_t *J, int j,
                                                                        const int NR, int ar, const int H) {
    const int k = J->k, gv = J->kv / 32; /* groups of 32 in the SIMD part (even) */
    const float *x = J->xp + (size_t)ar * k;
    const __m256i idx = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    const __m256i m = H ? _mm256_set1_epi16(FP4H_MASK) : _mm256_set1_epi32(FP4_MASK);
    const __m256i c02 = _mm256_set1_epi16(H ? 32 : 4), c13 = _mm256_set1_epi16(H ? 32 << 8 : 4 << 8);
    _Alignas(32) float sf[2][FP4_SEG];
    const uint8_t *wr[2], *sr[2];
    __m256 acc0[2], acc1[2]; /* per row: even / odd chunks */
    const size_t pf = NR * (size_t)(k / 2) > PREFETCH ? NR * (size_t)(k / 2) : PREFETCH;
#pragma GCC unroll 2
    for (int r = 0; r < NR; r++) {
        wr[r] = (const uint8_t *)J->W->w + (size_t)(j + r) * (k / 2);
        sr[r] = J->W->scale + (size_t)(j + r) * (k / 32);
        acc0[r] = acc1[r] = _mm256_setzero_ps();
    }
    for (int g0 = 0; g0 < gv; g0 += FP4_SEG) {
        int gn = gv - g0 < FP4_SEG ? gv - g0 : FP4_SEG;
        for (int r = 0; r < NR; r++) fp4_row_scales(sr[r] + g0, J->sa + (size_t)ar * J->nb, g0, gn, sf[r]);
        /* one 64-element chunk = 32 bytes = groups 2c, 2c+1 (lanes 0-3, 4-7) */
        for (int c = 0; c < gn / 2; c++) {
            const int cc = g0 / 2 + c;
            const float *xb = x + 64 * cc;
            __m256i v[2], v4[2];
            __m256 p[2][2];
#pragma GCC unroll 2
            for (int r = 0; r < NR; r++) {
                /* rows are adjacent, so with a pair in flight the useful look-ahead is the next
                 * pair at the same offset (or PREFETCH bytes, whichever is further) */
                if (!(c & 1)) _mm_prefetch((const char *)wr[r] + 32 * cc + pf, _MM_HINT_T0);
                v[r] = _mm256_loadu_si256((const __m256i *)(wr[r] + 32 * cc));
                if (H) v[r] = fp4_bytes_f16(v[r]);
                v4[r] = _mm256_slli_epi16(v[r], 4);
            }
            /* step t: elements t (low halves, moved up) and t + 4 (high halves) of every lane,
             * see the FP4 note at the top; two independent chains per row */
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++) {
                __m256 xl = _mm256_loadu_ps(xb + 8 * t), xh = _mm256_loadu_ps(xb + 8 * t + 32);
#pragma GCC unroll 2
                for (int r = 0; r < NR; r++) {
                    __m256i q = _mm256_maddubs_epi16(t & 2 ? c13 : c02, t & 1 ? v[r] : v4[r]);
                    __m256 wl, wh;
                    if (H) {
                        /* through memory: vcvtph2ps from memory needs no shuffle-port uop (from a
                         * register it takes one, and so does the vextracti128 of the high half),
                         * and the shuffle port was the bottleneck: 1.38x (4.7 -> 6.4 GB/s a thread) */
                        _Alignas(32) uint16_t hb[16];
                        _mm256_store_si256((__m256i *)hb, _mm256_and_si256(q, m));
                        __asm__ volatile("" : "+m"(hb)); /* keep the compiler from turning it back */
                        wl = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)hb));
                        wh = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(hb + 8)));
                    } else {
                        wl = _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(q, 16), m));
                        wh = _mm256_castsi256_ps(_mm256_and_si256(q, m));
                    }
                    /* (an FMA onto zero, not vmulps: see the FP4 note at the top) */
                    p[r][t & 1] = _mm256_fmadd_ps(
                        wh, xh, _mm256_fmadd_ps(wl, xl, t < 2 ? _mm256_setzero_ps() : p[r][t & 1]));
                }
            }
#pragma GCC unroll 2
            for (int r = 0; r < NR; r++) {
                __m256 sum = _mm256_add_ps(p[r][0], p[r][1]);
                __m256 cv = _mm256_permutevar8x32_ps(
                    _mm256_castps128_ps256(
                        _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(sf[r] + 2 * c)))),
                    idx);
                if (c & 1) acc1[r] = _mm256_fmadd_ps(sum, cv, acc1[r]);
                else acc0[r] = _mm256_fmadd_ps(sum, cv, acc0[r]);
            }
        }
    }
    for (int r = 0; r < NR; r++) {
        float v = hsum8(_mm256_add_ps(acc0[r], acc1[r]));
        if (J->kv < k) v += tail_dot(J, j + r, ar);
        store_y(J, ar, j + r, v);
    }
}

MK_AVX2 static void gemv_fp4(const job_t *J, int j0, int j1, int ar) {
    int j = j0;
    for (; j + 2 <= j1; j += 2) gemv_fp4_rows(J, j, 2, ar, 0);
    if (j < j1) gemv_fp4_rows(J, j, 1, ar, 0);
}

MK_AVX2 static void gemv_fp4_h(const job_t *J, int j0, int j1, int ar) {
    int j = j0;
    for (; j + 2 <= j1; j += 2) gemv_fp4_rows(J, j, 2, ar, 1);
    if (j < j1) gemv_fp4_rows(J, j, 1, ar, 1);
}

MK_AVX2 static void gemv_bf16(const job_t *J, int j0, int j1, int ar) {
    const int k = J->k, nc = J->kv / 16;
    const float *x = J->xp + (size_t)ar * k;
    const __m256i hm = _mm256_set1_epi32((int)0xffff0000u);
    for (int j = j0; j < j1; j++) {
        const uint16_t *wr = (const uint16_t *)J->W->w + (size_t)j * k;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int c = 0;
        for (; c + 4 <= nc; c += 4) {
            const uint16_t *w = wr + 16 * c;
            const float *xb = x + 16 * c;
            _mm_prefetch((const char *)w + PREFETCH, _MM_HINT_T0);
            _mm_prefetch((const char *)w + PREFETCH + 64, _MM_HINT_T0);
            __m256i v0 = _mm256_loadu_si256((const __m256i *)w);
            __m256i v1 = _mm256_loadu_si256((const __m256i *)(w + 16));
            __m256i v2 = _mm256_loadu_si256((const __m256i *)(w + 32));
            __m256i v3 = _mm256_loadu_si256((const __m256i *)(w + 48));
            a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)),
                                 _mm256_loadu_ps(xb), a0);
            a1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v0, hm)),
                                 _mm256_loadu_ps(xb + 8), a1);
            a2 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v1, 16)),
                                 _mm256_loadu_ps(xb + 16), a2);
            a3 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v1, hm)),
                                 _mm256_loadu_ps(xb + 24), a3);
            a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v2, 16)),
                                 _mm256_loadu_ps(xb + 32), a0);
            a1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v2, hm)),
                                 _mm256_loadu_ps(xb + 40), a1);
            a2 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v3, 16)),
                                 _mm256_loadu_ps(xb + 48), a2);
            a3 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v3, hm)),
                                 _mm256_loadu_ps(xb + 56), a3);
        }
        for (; c < nc; c++) {
            __m256i v0 = _mm256_loadu_si256((const __m256i *)(wr + 16 * c));
            a0 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)),
                                 _mm256_loadu_ps(x + 16 * c), a0);
            a1 = _mm256_fmadd_ps(_mm256_castsi256_ps(_mm256_and_si256(v0, hm)),
                                 _mm256_loadu_ps(x + 16 * c + 8), a1);
        }
        float v = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        if (J->kv < k) v += tail_dot(J, j, ar);
        store_y(J, ar, j, v);
    }
}

MK_AVX2 static void gemv_f32(const job_t *J, int j0, int j1, int ar) {
    const int k = J->k, kv = J->kv;
    const float *x = J->xp + (size_t)ar * k;
    for (int j = j0; j < j1; j++) {
        const float *wr = (const float *)J->W->w + (size_t)j * k;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int i = 0;
        for (; i + 32 <= kv; i += 32) {
            _mm_prefetch((const char *)(wr + i) + PREFETCH, _MM_HINT_T0);
            _mm_prefetch((const char *)(wr + i) + PREFETCH + 64, _MM_HINT_T0);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i), _mm256_loadu_ps(x + i), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i + 8), _mm256_loadu_ps(x + i + 8), a1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i + 16), _mm256_loadu_ps(x + i + 16), a2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i + 24), _mm256_loadu_ps(x + i + 24), a3);
        }
        for (; i < kv; i += 8)
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wr + i), _mm256_loadu_ps(x + i), a0);
        float v = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        if (kv < k) v += tail_dot(J, j, ar);
        store_y(J, ar, j, v);
    }
}

#endif /* MK_HAVE_X86 */

/* ---- driver ------------------------------------------------------------------------------ */

/* Prepare activation row r: quantize (FP8/FP4) and lay out [0, kv) for the SIMD kernels. */
static void prep_row(void *ctx, int r, int tid) {
    (void)tid;
    const job_t *J = ctx;
    const int k = J->k, kv = J->kv;
    const float *xr = J->x + (size_t)r * k;
    float *dst = J->xp + (size_t)r * k;
    mk_wkind kind = J->W->kind;
    if (kind == MK_W_FP8 || kind == MK_W_FP4) {
        float q[128];
        for (int b = 0; b < J->nb; b++) {
            int w = k - b * 128 < 128 ? k - b * 128 : 128;
            float s;
#if MK_HAVE_X86
            if (J->simd) s = quant_block_avx2(xr + b * 128, w, q);
            else
#endif
                s = quant_block_scalar(xr + b * 128, w, q);
            J->sa[(size_t)r * J->nb + b] = s;
            /* the part of this block inside [0, kv) is a whole number of SIMD chunks */
            int in = kv - b * 128;
            in = in < 0 ? 0 : in > w ? w : in;
            if (in) {
#if MK_HAVE_X86
                if (J->simd) permute_chunks_avx2(q, dst + b * 128, in, J->E, J->pre);
                else
#endif
                    permute_chunks(q, dst + b * 128, in, J->E, J->pre);
            }
            memcpy(dst + b * 128 + in, q + in, sizeof(float) * (size_t)(w - in));
        }
    } else if (kind == MK_W_BF16 || kind == MK_W_FP8_DQ) { /* raw activations, permuted */
#if MK_HAVE_X86
        if (J->simd) permute_chunks_avx2(xr, dst, kv, J->E, 1.0f);
        else
#endif
            permute_chunks(xr, dst, kv, J->E, 1.0f);
        memcpy(dst + kv, xr + kv, sizeof(float) * (size_t)(k - kv));
    }
}

static void linear_task(void *ctx, int t, int tid) {
    (void)tid;
    const job_t *J = ctx;
    int j0 = t * ROWS_PER_TASK, j1 = j0 + ROWS_PER_TASK < J->n ? j0 + ROWS_PER_TASK : J->n;
#if MK_HAVE_X86
    if (J->simd) {
        /* every row through the GEMV kernels, over this task's slice of W (16 rows), which
         * stays in L1 / L2 after the first activation row: DRAM reads W once per call */
        for (int r = 0; r < J->m; r++) switch (J->W->kind) {
            case MK_W_FP8: gemv_fp8(J, j0, j1, r); break;
            case MK_W_FP8_DQ: gemv_fp8_dq(J, j0, j1, r); break;
            case MK_W_FP4:
                if (J->fp4h) gemv_fp4_h(J, j0, j1, r);
                else gemv_fp4(J, j0, j1, r);
                break;
            case MK_W_BF16: gemv_bf16(J, j0, j1, r); break;
            case MK_W_F32: gemv_f32(J, j0, j1, r); break;
            }
        return;
    }
#endif
    scalar_rows(J, j0, j1);
}

/* Which FP4 decode the AVX2 path uses: mk_linear_fp4_decode's setting, else MINKE_CPU_FP4
 * (f16 | bits), else f16 on Intel (where an FMA on an f32 subnormal takes a microcode assist,
 * ~30x slower) and the bit placement elsewhere (Zen runs subnormals at full speed, and the
 * placement needs fewer instructions). Both give the same bits. */
static _Atomic int fp4_forced = MK_FP4_AUTO;

int mk_linear_fp4_decode(int mode) {
    int old = atomic_load_explicit(&fp4_forced, memory_order_relaxed);
    if (mode == MK_FP4_AUTO || mode == MK_FP4_BITS || mode == MK_FP4_F16)
        atomic_store_explicit(&fp4_forced, mode, memory_order_relaxed);
    return old;
}

static int fp4_f16(void) {
    int forced = atomic_load_explicit(&fp4_forced, memory_order_relaxed);
    if (forced != MK_FP4_AUTO) return forced == MK_FP4_F16;
    static _Atomic int chosen = -1; /* racing first calls compute the same value */
    int c = atomic_load_explicit(&chosen, memory_order_relaxed);
    if (c < 0) {
        const char *e = getenv("MINKE_CPU_FP4");
        c = mk_cpu_intel();
        if (e && !strcmp(e, "f16")) c = 1;
        else if (e && !strcmp(e, "bits")) c = 0;
        else if (e && *e) /* once per process (racing first calls may both print it) */
            fprintf(stderr, "minke: MINKE_CPU_FP4=%s: expected f16 or bits; using %s (this CPU's default)\n", e,
                    c ? "f16" : "bits");
        atomic_store_explicit(&chosen, c, memory_order_relaxed);
    }
    return c;
}

static int have_simd(void) {
#if MK_HAVE_X86
    if (!mk_cpu_avx2()) return 0;
    /* the FP8 / FP4 decodes pass e4m3 / e2m1 subnormals as f32 subnormals: not with DAZ */
    if (_mm_getcsr() & 0x0040) return 0;
    return 1;
#else
    return 0;
#endif
}

int mk_linear_simd(void) { return have_simd(); }

void mk_linear(mk_pool *pool, const mk_wmat *W, const float *x, int m, float *y, int round_bf16,
               float *scratch) {
    job_t J;
    memset(&J, 0, sizeof J);
    J.W = W;
    J.x = x;
    J.y = y;
    J.m = m;
    J.n = W->n;
    J.k = W->k;
    J.nb = (W->k + 127) / 128;
    J.round = round_bf16;
    J.simd = have_simd();
    J.pre = 1.0f;
    if (m <= 0 || J.n <= 0) return;
    switch (W->kind) {
    case MK_W_FP8:
    case MK_W_FP8_DQ: J.E = 4; J.kv = J.k / 128 * 128; break;
    case MK_W_FP4: J.E = 8; J.kv = J.k / 64 * 64; break;
    case MK_W_BF16: J.E = 2; J.kv = J.k / 16 * 16; break;
    case MK_W_F32: J.E = 1; J.kv = J.k / 8 * 8; break;
    }
    if (!J.simd) J.kv = 0;
    if (W->kind == MK_W_FP8 || W->kind == MK_W_FP4) J.pre = 0x1p118f;
    if (W->kind == MK_W_FP4 && J.simd && fp4_f16()) {
        J.fp4h = 1;
        J.pre = 0x1p6f; /* weights times 2^-14 instead of 2^-126: the same products */
    }
    if (W->kind == MK_W_F32) {
        J.xp = (float *)x; /* used in place, never written */
    } else {
        J.xp = scratch;
        J.sa = scratch + (size_t)m * J.k;
        if ((W->kind == MK_W_BF16 || W->kind == MK_W_FP8_DQ) && !J.simd) J.xp = (float *)x;
        else mk_pool_run((size_t)m * J.k >= PREP_POOL_MIN ? pool : NULL, m, prep_row, &J);
    }
    /* Waking the pool costs about as much as streaming a couple of hundred KiB of weights, so
     * small products run on the calling thread alone. */
    if ((double)mk_wmat_bytes(W) * m < POOL_MIN_BYTES) pool = NULL;
    int ntask = (J.n + ROWS_PER_TASK - 1) / ROWS_PER_TASK;
    mk_pool_run(pool, ntask, linear_task, &J);
}
