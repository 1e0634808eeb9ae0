/* ggml_exact.c — llama.cpp's float kernels in its own order (ggml_exact.h says why and which).
 *
 * Layout: scalar emulations of each level's order (the references: they run when the CPU lacks
 * the level's instructions, and the unit tests compare the SIMD code with them bit for bit);
 * the AVX2 kernels; the AVX-512 kernels; the dispatching public functions.
 *
 * The emulations spell out every rounding step: a fused multiply-add is fmaf (never a * b + c,
 * which -std=c11 keeps unfused anyway), the horizontal reductions are written as the trees the
 * SIMD code uses:
 *   red16      _mm512_reduce_add_ps (GCC's and clang's): a[i] + a[i+8], then + [i+4], then
 *              (t0 + t2) + (t1 + t3)
 *   red8_hsum  ggml's hsum_float_8 and tinyBLAS's hsum(__m256): a[i] + a[i+4], then
 *              (t0 + t2) + (t1 + t3)
 *   red8_hadd  GGML_F32x8_REDUCE's last step (two _mm_hadd_ps): a[i] + a[i+4], then
 *              (t0 + t1) + (t2 + t3)
 * The SIMD kernels spell the same trees with explicit shuffles rather than relying on a
 * compiler's reduction intrinsic.
 */
#include "num/ggml_exact.h"

#include "num/formats.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define GX_X86 1
#define GX_AVX2 __attribute__((target("avx2,fma,f16c")))
#define GX_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma,f16c")))
#else
#define GX_X86 0
#endif

/* ---- CPU level -------------------------------------------------------------------------------- */

static int detect(void) {
#if GX_X86
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return MK_GX_SCALAR;
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 29))) return MK_GX_SCALAR; /* F16C */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl"))
        return MK_GX_AVX512;
    return MK_GX_AVX2;
#else
    return MK_GX_SCALAR;
#endif
}

mk_gx_isa mk_gx_isa_native(void) {
    /* benign race: every thread computes the same value */
    static volatile int level = -1;
    if (level < 0) level = detect();
    return (mk_gx_isa)level;
}

const char *mk_gx_isa_name(mk_gx_isa isa) {
    switch (isa) {
    case MK_GX_AVX512: return "avx512";
    case MK_GX_AVX2: return "avx2";
    default: return "scalar";
    }
}

static int have(mk_gx_isa isa) { return isa != MK_GX_SCALAR && mk_gx_isa_native() >= isa; }
static int lanes(mk_gx_isa isa) { return isa == MK_GX_AVX512 ? 16 : isa == MK_GX_AVX2 ? 8 : 0; }

int mk_gx_tb_kn(mk_gx_isa isa) { return lanes(isa); }

/* ==== scalar emulations ============================================================================ */

static inline float h2f(uint16_t h) { return mk_f16_to_f32(h); }

static float red16(const float *a) {
    float t[8], u[4];
    for (int i = 0; i < 8; i++) t[i] = a[i + 8] + a[i];
    for (int i = 0; i < 4; i++) u[i] = t[i + 4] + t[i];
    float v0 = u[0] + u[2], v1 = u[1] + u[3];
    return v0 + v1;
}

static float red8_hsum(const float *a) {
    float t[4];
    for (int i = 0; i < 4; i++) t[i] = a[i + 4] + a[i];
    float v0 = t[0] + t[2], v1 = t[1] + t[3];
    return v0 + v1;
}

static float red8_hadd(const float *a) {
    float t[4];
    for (int i = 0; i < 4; i++) t[i] = a[i] + a[i + 4];
    float v0 = t[0] + t[1], v1 = t[2] + t[3];
    return v0 + v1;
}

static float dot_f16_emul(int W, int n, const uint16_t *x, const uint16_t *y) {
    double s = 0.0;
    int i = 0;
    if (W) {
        float acc[4][16] = {{0}};
        int step = 4 * W, np = n - n % step;
        for (; i < np; i += step)
            for (int j = 0; j < 4; j++)
                for (int l = 0; l < W; l++)
                    acc[j][l] = fmaf(h2f(x[i + j * W + l]), h2f(y[i + j * W + l]), acc[j][l]);
        for (int l = 0; l < W; l++) {
            acc[0][l] = acc[0][l] + acc[2][l];
            acc[1][l] = acc[1][l] + acc[3][l];
        }
        for (int l = 0; l < W; l++) acc[0][l] = acc[0][l] + acc[1][l];
        s = W == 16 ? red16(acc[0]) : red8_hadd(acc[0]);
    }
    for (; i < n; i++) {
        float p = h2f(x[i]) * h2f(y[i]);
        s += (double)p;
    }
    return (float)s;
}

static float dot_f16_tb_emul(int KN, int n, const uint16_t *a, const uint16_t *b) {
    float acc[16] = {0};
    for (int i = 0; i < n; i += KN)
        for (int l = 0; l < KN; l++) acc[l] = fmaf(h2f(a[i + l]), h2f(b[i + l]), acc[l]);
    return KN == 16 ? red16(acc) : red8_hsum(acc);
}

static inline uint32_t fbits(float f) { return mk_f32_bits(f); }
static inline float bitsf(uint32_t u) { return mk_f32_from_bits(u); }

/* ggml_v_expf, AVX-512 version, one lane: n = round(x / ln 2) by the 1.5 * 2^23 trick, b = x - n
 * ln 2 in two steps, a degree-5 polynomial, then scalef (x 2^n, rounded once); |n| > 192 gives
 * 0 or inf. */
static float expf_512_emul(float x) {
    const float r = 0x1.8p23f;
    float z = fmaf(x, 0x1.715476p+0f, r);
    float n = z - r;
    float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    float u = b * b;
    float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
                   fmaf(0x1.ffffecp-1f, b, 1.0f));
    if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : INFINITY;
    if (n != n) return n; /* scalef(j, NaN) */
    return ldexpf(j, (int)n);
}

/* ggml_v_expf, AVX2 version, one lane: the same reduction and a slightly different polynomial
 * tail, with 2^n built in the exponent bits (k) and a two-factor scale (s1 * s2) when |n| > 126. */
static float expf_256_emul(float x) {
    const float r = 0x1.8p23f;
    float z = fmaf(x, 0x1.715476p+0f, r);
    float n = z - r;
    float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    uint32_t e = fbits(z) << 23;
    float k = bitsf(e + fbits(1.0f));
    float u = b * b;
    float c1b = 0x1.ffffecp-1f * b;
    float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u, c1b);
    float an = fabsf(n);
    if (!(an > 126.0f)) return fmaf(k, j, k);
    uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
    float s1 = bitsf(g + 0x7f000000u), s2 = bitsf(e - g);
    if (an > 192.0f) return s1 * s1;
    return fmaf(s2, j, s2) * s1;
}

float mk_gx_expf_lane(mk_gx_isa isa, float x) {
    if (isa == MK_GX_AVX512) return expf_512_emul(x);
    if (isa == MK_GX_AVX2) return expf_256_emul(x);
    return expf(x);
}

static double softmax_emul(mk_gx_isa isa, int n, float *y, const float *x, float max) {
    int W = lanes(isa), i = 0;
    double s = 0.0;
    if (W)
        for (; i + W <= n; i += W) {
            float v[16];
            for (int l = 0; l < W; l++) v[l] = mk_gx_expf_lane(isa, x[i + l] - max);
            memcpy(y + i, v, sizeof(float) * (size_t)W);
            s += (double)(W == 16 ? red16(v) : red8_hsum(v));
        }
    for (; i < n; i++) {
        float v = expf(x[i] - max);
        s += (double)v;
        y[i] = v;
    }
    return s;
}

static void swiglu_emul(mk_gx_isa isa, int n, float *y, const float *x, const float *g) {
    int W = lanes(isa), i = 0;
    if (W)
        for (; i + W <= n; i += W)
            for (int l = 0; l < W; l++) {
                float xv = x[i + l];
                float e = mk_gx_expf_lane(isa, 0.0f - xv);
                float s = xv / (1.0f + e);
                y[i + l] = s * g[i + l];
            }
    for (; i < n; i++) {
        float xv = x[i];
        float s = xv / (1.0f + expf(-xv));
        y[i] = s * g[i];
    }
}

/* ==== AVX2 ========================================================================================= */

#if GX_X86

GX_AVX2 static inline __m256 h8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

GX_AVX2 static inline float v_red8_hsum(__m256 v) {
    __m128 t = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
}

GX_AVX2 static inline float v_red8_hadd(__m256 v) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_hadd_ps(t, t);
    t = _mm_hadd_ps(t, t);
    return _mm_cvtss_f32(t);
}

GX_AVX2 static inline float dot_f16_256(int n, const uint16_t *x, const uint16_t *y) {
    __m256 s[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int i = 0, np = n & ~31;
    for (; i < np; i += 32)
        for (int j = 0; j < 4; j++) s[j] = _mm256_fmadd_ps(h8(x + i + 8 * j), h8(y + i + 8 * j), s[j]);
    s[0] = _mm256_add_ps(s[0], s[2]);
    s[1] = _mm256_add_ps(s[1], s[3]);
    s[0] = _mm256_add_ps(s[0], s[1]);
    double r = v_red8_hadd(s[0]);
    for (; i < n; i++) {
        float p = _cvtsh_ss(x[i]) * _cvtsh_ss(y[i]);
        r += (double)p;
    }
    return (float)r;
}

GX_AVX2 static inline float dot_f16_tb_256(int n, const uint16_t *a, const uint16_t *b) {
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) acc = _mm256_fmadd_ps(h8(a + i), h8(b + i), acc);
    return v_red8_hsum(acc);
}

GX_AVX2 static inline __m256 v_expf_256(__m256 x) {
    const __m256 r = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
    const __m256 n = _mm256_sub_ps(z, r);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1.0f))));
    const __m256 an = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 big = _mm256_cmp_ps(an, _mm256_set1_ps(126.0f), _CMP_GT_OQ);
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 p45 = _mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f));
    const __m256 p23 = _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f));
    const __m256 j = _mm256_fmadd_ps(_mm256_fmadd_ps(p45, u, p23), u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    const __m256 normal = _mm256_fmadd_ps(k, j, k);
    if (!_mm256_movemask_ps(big)) return normal;
    const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                       _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256 huge = _mm256_cmp_ps(an, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
    const __m256 scaled = _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1);
    __m256 v = _mm256_blendv_ps(normal, scaled, big);
    return _mm256_blendv_ps(v, _mm256_mul_ps(s1, s1), huge);
}

GX_AVX2 static double softmax_256(int n, float *y, const float *x, float max) {
    int i = 0;
    double s = 0.0;
    const __m256 mx = _mm256_set1_ps(max);
    for (; i + 8 <= n; i += 8) {
        __m256 v = v_expf_256(_mm256_sub_ps(_mm256_loadu_ps(x + i), mx));
        _mm256_storeu_ps(y + i, v);
        s += (double)v_red8_hsum(v);
    }
    for (; i < n; i++) {
        float v = expf(x[i] - max);
        s += (double)v;
        y[i] = v;
    }
    return s;
}

GX_AVX2 static void swiglu_256(int n, float *y, const float *x, const float *g) {
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 xv = _mm256_loadu_ps(x + i);
        __m256 e = v_expf_256(_mm256_sub_ps(_mm256_setzero_ps(), xv));
        __m256 s = _mm256_div_ps(xv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(s, _mm256_loadu_ps(g + i)));
    }
    for (; i < n; i++) {
        float xv = x[i];
        float s = xv / (1.0f + expf(-xv));
        y[i] = s * g[i];
    }
}

GX_AVX2 static void f32_to_f16_256(int n, const float *x, uint16_t *y) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = mk_f32_to_f16(x[i]);
}

/* ==== AVX-512 ====================================================================================== */

GX_AVX512 static inline __m512 h16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* _mm512_reduce_add_ps's tree, spelled out */
GX_AVX512 static inline float v_red16(__m512 v) {
    __m256 t = _mm256_add_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v));
    __m128 u = _mm_add_ps(_mm256_extractf128_ps(t, 1), _mm256_castps256_ps128(t));
    __m128 w = _mm_add_ps(u, _mm_shuffle_ps(u, u, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(_mm_add_ss(w, _mm_movehdup_ps(w)));
}

GX_AVX512 static inline float dot_f16_512(int n, const uint16_t *x, const uint16_t *y) {
    __m512 s[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int i = 0, np = n & ~63;
    for (; i < np; i += 64)
        for (int j = 0; j < 4; j++) s[j] = _mm512_fmadd_ps(h16(x + i + 16 * j), h16(y + i + 16 * j), s[j]);
    s[0] = _mm512_add_ps(s[0], s[2]);
    s[1] = _mm512_add_ps(s[1], s[3]);
    s[0] = _mm512_add_ps(s[0], s[1]);
    double r = v_red16(s[0]);
    for (; i < n; i++) {
        float p = _cvtsh_ss(x[i]) * _cvtsh_ss(y[i]);
        r += (double)p;
    }
    return (float)r;
}

GX_AVX512 static inline float dot_f16_tb_512(int n, const uint16_t *a, const uint16_t *b) {
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < n; i += 16) acc = _mm512_fmadd_ps(h16(a + i), h16(b + i), acc);
    return v_red16(acc);
}

GX_AVX512 static inline __m512 v_expf_512(__m512 x) {
    const __m512 r = _mm512_set1_ps(0x1.8p23f);
    const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), r);
    const __m512 n = _mm512_sub_ps(z, r);
    const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
                                      _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
    const __mmask16 huge = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192.0f), _CMP_GT_OQ);
    const __m512 u = _mm512_mul_ps(b, b);
    const __m512 p45 = _mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f));
    const __m512 p23 = _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f));
    const __m512 p01 = _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f));
    const __m512 j = _mm512_fmadd_ps(_mm512_fmadd_ps(p45, u, p23), u, p01);
    const __m512 res = _mm512_scalef_ps(j, n);
    if (!huge) return res;
    const __m512 alt = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ),
                                            _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
    return _mm512_mask_blend_ps(huge, res, alt);
}

GX_AVX512 static double softmax_512(int n, float *y, const float *x, float max) {
    int i = 0;
    double s = 0.0;
    const __m512 mx = _mm512_set1_ps(max);
    for (; i + 16 <= n; i += 16) {
        __m512 v = v_expf_512(_mm512_sub_ps(_mm512_loadu_ps(x + i), mx));
        _mm512_storeu_ps(y + i, v);
        s += (double)v_red16(v);
    }
    for (; i < n; i++) {
        float v = expf(x[i] - max);
        s += (double)v;
        y[i] = v;
    }
    return s;
}

GX_AVX512 static void swiglu_512(int n, float *y, const float *x, const float *g) {
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 xv = _mm512_loadu_ps(x + i);
        __m512 e = v_expf_512(_mm512_sub_ps(_mm512_setzero_ps(), xv));
        __m512 s = _mm512_div_ps(xv, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
        _mm512_storeu_ps(y + i, _mm512_mul_ps(s, _mm512_loadu_ps(g + i)));
    }
    for (; i < n; i++) {
        float xv = x[i];
        float s = xv / (1.0f + expf(-xv));
        y[i] = s * g[i];
    }
}

/* count dots of rows x + i * stride with the same y: one call instead of count dispatches */
GX_AVX2 static void dot_f16_n_256(int n, const uint16_t *x, size_t stride, int count, const uint16_t *y, float *out, int tb) {
    if (tb) for (int i = 0; i < count; i++) out[i] = dot_f16_tb_256(n, x + (size_t)i * stride, y);
    else for (int i = 0; i < count; i++) out[i] = dot_f16_256(n, x + (size_t)i * stride, y);
}

/* dot_f16_512 of four rows x, x + stride, x + 2 stride, x + 3 stride with one y: each row's
 * accumulators and reduction exactly as dot_f16_512's, y's chunks converted once for the four
 * (the attention's KQ: four keys against one query). */
GX_AVX512 static void dot_f16_4_512(int n, const uint16_t *x, size_t stride, const uint16_t *y, float *out) {
    __m512 s[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int a = 0; a < 4; a++) s[r][a] = _mm512_setzero_ps();
    int i = 0, np = n & ~63;
    for (; i < np; i += 64)
#pragma GCC unroll 4
        for (int a = 0; a < 4; a++) {
            __m512 yv = h16(y + i + 16 * a);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) s[r][a] = _mm512_fmadd_ps(h16(x + (size_t)r * stride + i + 16 * a), yv, s[r][a]);
        }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        __m512 t0 = _mm512_add_ps(s[r][0], s[r][2]), t1 = _mm512_add_ps(s[r][1], s[r][3]);
        double v = v_red16(_mm512_add_ps(t0, t1));
        for (int j = np; j < n; j++) {
            float p = _cvtsh_ss(x[(size_t)r * stride + j]) * _cvtsh_ss(y[j]);
            v += (double)p;
        }
        out[r] = (float)v;
    }
}

/* dot_f16_tb_512 of four rows with one y (n a multiple of 16), y's chunks converted once */
GX_AVX512 static void dot_f16_tb_4_512(int n, const uint16_t *x, size_t stride, const uint16_t *y, float *out) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int i = 0; i < n; i += 16) {
        __m512 yv = h16(y + i);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) acc[r] = _mm512_fmadd_ps(h16(x + (size_t)r * stride + i), yv, acc[r]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) out[r] = v_red16(acc[r]);
}

GX_AVX512 static void dot_f16_n_512(int n, const uint16_t *x, size_t stride, int count, const uint16_t *y, float *out, int tb) {
    int i = 0;
    if (tb) {
        for (; i + 4 <= count; i += 4) dot_f16_tb_4_512(n, x + (size_t)i * stride, stride, y, out + i);
        for (; i < count; i++) out[i] = dot_f16_tb_512(n, x + (size_t)i * stride, y);
        return;
    }
    for (; i + 4 <= count; i += 4) dot_f16_4_512(n, x + (size_t)i * stride, stride, y, out + i);
    for (; i < count; i++) out[i] = dot_f16_512(n, x + (size_t)i * stride, y);
}

#endif /* GX_X86 */

/* ==== public ======================================================================================= */

float mk_gx_dot_f16(mk_gx_isa isa, int n, const uint16_t *x, const uint16_t *y) {
#if GX_X86
    if (isa == MK_GX_AVX512 && have(isa)) return dot_f16_512(n, x, y);
    if (isa == MK_GX_AVX2 && have(isa)) return dot_f16_256(n, x, y);
#endif
    return dot_f16_emul(lanes(isa), n, x, y);
}

float mk_gx_dot_f16_tb(mk_gx_isa isa, int n, const uint16_t *a, const uint16_t *b) {
    int kn = lanes(isa);
    if (!kn || n % kn) return NAN;
#if GX_X86
    if (isa == MK_GX_AVX512 && have(isa)) return dot_f16_tb_512(n, a, b);
    if (isa == MK_GX_AVX2 && have(isa)) return dot_f16_tb_256(n, a, b);
#endif
    return dot_f16_tb_emul(kn, n, a, b);
}

void mk_gx_dot_f16_n(mk_gx_isa isa, int tb, int n, const uint16_t *x, size_t stride, int count, const uint16_t *y,
                     float *out) {
    if (tb && (!lanes(isa) || n % lanes(isa))) {
        for (int i = 0; i < count; i++) out[i] = NAN;
        return;
    }
#if GX_X86
    if (isa == MK_GX_AVX512 && have(isa)) { dot_f16_n_512(n, x, stride, count, y, out, tb); return; }
    if (isa == MK_GX_AVX2 && have(isa)) { dot_f16_n_256(n, x, stride, count, y, out, tb); return; }
#endif
    for (int i = 0; i < count; i++)
        out[i] = tb ? dot_f16_tb_emul(lanes(isa), n, x + (size_t)i * stride, y) : dot_f16_emul(lanes(isa), n, x + (size_t)i * stride, y);
}

double mk_gx_softmax_exp(mk_gx_isa isa, int n, float *y, const float *x, float max) {
#if GX_X86
    if (isa == MK_GX_AVX512 && have(isa)) return softmax_512(n, y, x, max);
    if (isa == MK_GX_AVX2 && have(isa)) return softmax_256(n, y, x, max);
#endif
    return softmax_emul(isa, n, y, x, max);
}

void mk_gx_swiglu(mk_gx_isa isa, int n, float *y, const float *x, const float *g) {
#if GX_X86
    if (isa == MK_GX_AVX512 && have(isa)) { swiglu_512(n, y, x, g); return; }
    if (isa == MK_GX_AVX2 && have(isa)) { swiglu_256(n, y, x, g); return; }
#endif
    swiglu_emul(isa, n, y, x, g);
}

void mk_gx_rmsnorm(int n, const float *x, const float *w, float eps, float *y) {
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        float sq = x[i] * x[i]; /* rounded to float, then widened (ggml's (ggml_float)(x*x)) */
        sum += (double)sq;
    }
    const float mean = (float)(sum / n);
    const float scale = 1.0f / sqrtf(mean + eps);
    for (int i = 0; i < n; i++) {
        float v = x[i] * scale;
        y[i] = v * w[i];
    }
}

void mk_gx_rope_cache(int n_dims, float base, int pos, float *cache) {
    const float theta_scale = powf(base, -2.0f / (float)n_dims);
    float theta = (float)pos;
    for (int i = 0; i < n_dims; i += 2) {
        float s, c;
        sincosf(theta, &s, &c);
        cache[i] = c;
        cache[i + 1] = s;
        theta *= theta_scale;
    }
}

/* GCC contracted ggml's x0*cos - x1*sin and x0*sin + x1*cos into these two fmas (checked
 * against llama.cpp's tensors). Inlined twice: into an FMA-target function, where fmaf is one
 * instruction, and into the portable one, where it is a libm call. */
static inline __attribute__((always_inline)) void rope_body(int n_dims, int neox, const float *cache, float *x) {
    const int off = neox ? n_dims / 2 : 1;
    for (int i = 0; i < n_dims; i += 2) {
        const float c = cache[i], s = cache[i + 1];
        float *p = x + (neox ? i / 2 : i);
        const float x0 = p[0], x1 = p[off];
        p[0] = fmaf(x0, c, -(x1 * s));
        p[off] = fmaf(x0, s, x1 * c);
    }
}

#if GX_X86
GX_AVX2 static void rope_fma(int n_dims, int neox, const float *cache, float *x) { rope_body(n_dims, neox, cache, x); }
#endif

void mk_gx_rope(int n_dims, int neox, const float *cache, float *x) {
#if GX_X86
    if (have(MK_GX_AVX2)) { rope_fma(n_dims, neox, cache, x); return; }
#endif
    rope_body(n_dims, neox, cache, x);
}

void mk_gx_f32_to_f16(int n, const float *x, uint16_t *y) {
#if GX_X86
    if (have(MK_GX_AVX2)) { f32_to_f16_256(n, x, y); return; }
#endif
    for (int i = 0; i < n; i++) y[i] = mk_f32_to_f16(x[i]);
}
