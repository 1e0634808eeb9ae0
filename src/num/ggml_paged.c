/* ggml_paged.c — f16 dots over block-scattered rows in ggml's orders (ggml_paged.h).
 *
 * Each kernel is ggml_exact.c's contiguous kernel with the loads redirected: the row is walked
 * chunk by chunk (one chunk = one vector of W lanes, never straddling a block since seg_len is a
 * multiple of W), chunk c feeding accumulator c % 4 (vec_dot) or the single accumulator (tinyBLAS),
 * exactly as element i feeds accumulator (i / W) % 4, lane i % W, in the contiguous kernels. The
 * reductions are the same trees (ggml_exact.c's header lists them); the vec_dot tail (n % 4W
 * elements) is summed in double. The scalar emulations follow the same order with fmaf and run
 * when the CPU lacks the level's instructions.
 */
#include "num/ggml_paged.h"

#include "num/formats.h"

#include <math.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define GP_X86 1
#define GP_AVX2 __attribute__((target("avx2,fma,f16c")))
#define GP_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma,f16c")))
#else
#define GP_X86 0
#endif

static int lanes(mk_gx_isa isa) { return isa == MK_GX_AVX512 ? 16 : isa == MK_GX_AVX2 ? 8 : 0; }
static int have(mk_gx_isa isa) { return isa != MK_GX_SCALAR && mk_gx_isa_native() >= isa; }

/* element j of the row whose block pieces start at seg[b] + off */
static inline const uint16_t *at(const uint16_t *const *seg, int L, size_t off, int j) {
    return seg[j / L] + off + (size_t)(j % L);
}

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

static float dot_emul(int W, int n, const uint16_t *const *seg, int L, size_t off, const uint16_t *y) {
    double s = 0.0;
    int i = 0;
    if (W) {
        float acc[4][16] = {{0}};
        int step = 4 * W, np = n - n % step;
        for (; i < np; i += W) {
            const uint16_t *x = at(seg, L, off, i);
            float *a = acc[(i / W) % 4];
            for (int l = 0; l < W; l++) a[l] = fmaf(h2f(x[l]), h2f(y[i + l]), a[l]);
        }
        for (int l = 0; l < W; l++) {
            acc[0][l] = acc[0][l] + acc[2][l];
            acc[1][l] = acc[1][l] + acc[3][l];
        }
        for (int l = 0; l < W; l++) acc[0][l] = acc[0][l] + acc[1][l];
        s = W == 16 ? red16(acc[0]) : red8_hadd(acc[0]);
    }
    for (; i < n; i++) {
        float p = h2f(*at(seg, L, off, i)) * h2f(y[i]);
        s += (double)p;
    }
    return (float)s;
}

static float dot_tb_emul(int KN, int n, const uint16_t *const *seg, int L, size_t off, const uint16_t *y) {
    float acc[16] = {0};
    for (int i = 0; i < n; i += KN) {
        const uint16_t *x = at(seg, L, off, i);
        for (int l = 0; l < KN; l++) acc[l] = fmaf(h2f(x[l]), h2f(y[i + l]), acc[l]);
    }
    return KN == 16 ? red16(acc) : red8_hsum(acc);
}

#if GP_X86

/* ==== AVX2 ========================================================================================= */

GP_AVX2 static inline __m256 h8(const uint16_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

GP_AVX2 static inline float v_red8_hsum(__m256 v) {
    __m128 t = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    t = _mm_add_ps(t, _mm_movehl_ps(t, t));
    t = _mm_add_ss(t, _mm_movehdup_ps(t));
    return _mm_cvtss_f32(t);
}

GP_AVX2 static inline float v_red8_hadd(__m256 v) {
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    t = _mm_hadd_ps(t, t);
    t = _mm_hadd_ps(t, t);
    return _mm_cvtss_f32(t);
}

GP_AVX2 static float dot_256(int n, const uint16_t *const *seg, int L, size_t off, const uint16_t *y) {
    __m256 s[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int np = n & ~31, c = 0;
    for (int b = 0; c * 8 < np; b++) {
        const uint16_t *x = seg[b] + off;
        for (int k = 0; k < L && c * 8 < np; k += 8, c++) s[c & 3] = _mm256_fmadd_ps(h8(x + k), h8(y + c * 8), s[c & 3]);
    }
    s[0] = _mm256_add_ps(s[0], s[2]);
    s[1] = _mm256_add_ps(s[1], s[3]);
    s[0] = _mm256_add_ps(s[0], s[1]);
    double r = v_red8_hadd(s[0]);
    for (int i = np; i < n; i++) {
        float p = _cvtsh_ss(*at(seg, L, off, i)) * _cvtsh_ss(y[i]);
        r += (double)p;
    }
    return (float)r;
}

GP_AVX2 static float dot_tb_256(int n, const uint16_t *const *seg, int L, size_t off, const uint16_t *y) {
    __m256 acc = _mm256_setzero_ps();
    int c = 0;
    for (int b = 0; c * 8 < n; b++) {
        const uint16_t *x = seg[b] + off;
        for (int k = 0; k < L && c * 8 < n; k += 8, c++) acc = _mm256_fmadd_ps(h8(x + k), h8(y + c * 8), acc);
    }
    return v_red8_hsum(acc);
}

GP_AVX2 static void dot_n_256(int tb, int n, const uint16_t *const *seg, int L, size_t rs, int count, const uint16_t *y,
                              float *out) {
    for (int i = 0; i < count; i++)
        out[i] = tb ? dot_tb_256(n, seg, L, (size_t)i * rs, y) : dot_256(n, seg, L, (size_t)i * rs, y);
}

/* ==== AVX-512 ====================================================================================== */

GP_AVX512 static inline __m512 h16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

GP_AVX512 static inline float v_red16(__m512 v) {
    __m256 t = _mm256_add_ps(_mm512_extractf32x8_ps(v, 1), _mm512_castps512_ps256(v));
    __m128 u = _mm_add_ps(_mm256_extractf128_ps(t, 1), _mm256_castps256_ps128(t));
    __m128 w = _mm_add_ps(u, _mm_shuffle_ps(u, u, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(_mm_add_ss(w, _mm_movehdup_ps(w)));
}

GP_AVX512 static float dot_512(int n, const uint16_t *const *seg, int L, size_t off, const uint16_t *y) {
    __m512 s[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int np = n & ~63, c = 0;
    for (int b = 0; c * 16 < np; b++) {
        const uint16_t *x = seg[b] + off;
        for (int k = 0; k < L && c * 16 < np; k += 16, c++)
            s[c & 3] = _mm512_fmadd_ps(h16(x + k), h16(y + c * 16), s[c & 3]);
    }
    s[0] = _mm512_add_ps(s[0], s[2]);
    s[1] = _mm512_add_ps(s[1], s[3]);
    s[0] = _mm512_add_ps(s[0], s[1]);
    double r = v_red16(s[0]);
    for (int i = np; i < n; i++) {
        float p = _cvtsh_ss(*at(seg, L, off, i)) * _cvtsh_ss(y[i]);
        r += (double)p;
    }
    return (float)r;
}

GP_AVX512 static float dot_tb_512(int n, const uint16_t *const *seg, int L, size_t off, const uint16_t *y) {
    __m512 acc = _mm512_setzero_ps();
    int c = 0;
    for (int b = 0; c * 16 < n; b++) {
        const uint16_t *x = seg[b] + off;
        for (int k = 0; k < L && c * 16 < n; k += 16, c++) acc = _mm512_fmadd_ps(h16(x + k), h16(y + c * 16), acc);
    }
    return v_red16(acc);
}

/* dot_512 of four rows (offsets off, off + rs, off + 2 rs, off + 3 rs): each row's accumulators
 * and reduction exactly as dot_512's, y's chunks converted once for the four, and the chunk
 * pointer walked once (the attention's KQV: four value dimensions against one row of
 * probabilities). The accumulators are named through constant indices so they stay in registers. */
GP_AVX512 static void dot4_512(int n, const uint16_t *const *seg, int L, size_t off, size_t rs, const uint16_t *y,
                               float *out) {
    __m512 s[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 4
        for (int a = 0; a < 4; a++) s[r][a] = _mm512_setzero_ps();
    const int np = n & ~63, nblk = (np + L - 1) / L;
    int b = 0, k = 0;
    const uint16_t *x = nblk ? seg[0] + off : NULL;
    for (int c = 0; c * 16 < np; c += 4)
#pragma GCC unroll 4
        for (int a = 0; a < 4; a++) {
            __m512 yv = h16(y + (c + a) * 16);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) s[r][a] = _mm512_fmadd_ps(h16(x + (size_t)r * rs + k), yv, s[r][a]);
            k += 16;
            if (k == L) {
                k = 0;
                if (++b < nblk) x = seg[b] + off;
            }
        }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        __m512 t0 = _mm512_add_ps(s[r][0], s[r][2]), t1 = _mm512_add_ps(s[r][1], s[r][3]);
        double v = v_red16(_mm512_add_ps(t0, t1));
        for (int i = np; i < n; i++) {
            float p = _cvtsh_ss(*at(seg, L, off + (size_t)r * rs, i)) * _cvtsh_ss(y[i]);
            v += (double)p;
        }
        out[r] = (float)v;
    }
}

/* dot_tb_512 of four rows (offsets off + r rs), y's chunks converted once, the pointer walked once */
GP_AVX512 static void dot4_tb_512(int n, const uint16_t *const *seg, int L, size_t off, size_t rs, const uint16_t *y,
                                  float *out) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int c = 0;
    for (int b = 0; c * 16 < n; b++) {
        const uint16_t *x = seg[b] + off;
        for (int k = 0; k < L && c * 16 < n; k += 16, c++) {
            __m512 yv = h16(y + c * 16);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) acc[r] = _mm512_fmadd_ps(h16(x + (size_t)r * rs + k), yv, acc[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) out[r] = v_red16(acc[r]);
}

GP_AVX512 static void dot_n_512(int tb, int n, const uint16_t *const *seg, int L, size_t rs, int count, const uint16_t *y,
                                float *out) {
    int i = 0;
    if (tb)
        for (; i + 4 <= count; i += 4) dot4_tb_512(n, seg, L, (size_t)i * rs, rs, y, out + i);
    else
        for (; i + 4 <= count; i += 4) dot4_512(n, seg, L, (size_t)i * rs, rs, y, out + i);
    for (; i < count; i++)
        out[i] = tb ? dot_tb_512(n, seg, L, (size_t)i * rs, y) : dot_512(n, seg, L, (size_t)i * rs, y);
}

#endif /* GP_X86 */

/* ==== public ======================================================================================= */

void mk_gx_dot_f16_paged(mk_gx_isa isa, int tb, int n, const uint16_t *const *seg, int seg_len, size_t row_stride,
                         int count, const uint16_t *y, float *out) {
    const int W = lanes(isa);
    if (seg_len < 1 || (W && seg_len % W) || (tb && (!W || n % W))) {
        for (int i = 0; i < count; i++) out[i] = NAN;
        return;
    }
#if GP_X86
    if (isa == MK_GX_AVX512 && have(isa)) { dot_n_512(tb, n, seg, seg_len, row_stride, count, y, out); return; }
    if (isa == MK_GX_AVX2 && have(isa)) { dot_n_256(tb, n, seg, seg_len, row_stride, count, y, out); return; }
#endif
    for (int i = 0; i < count; i++)
        out[i] = tb ? dot_tb_emul(W, n, seg, seg_len, (size_t)i * row_stride, y)
                    : dot_emul(W, n, seg, seg_len, (size_t)i * row_stride, y);
}
