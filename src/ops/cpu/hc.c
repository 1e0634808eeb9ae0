/* hc.c — manifold-constrained hyper-connections (mHC) of DeepSeek-V4 on the CPU (ops.h).
 *
 * The residual stream is hc (= 4) copies of the hidden state. Before each sub-layer, hc_pre mixes
 * them into one input with weights `pre` and computes `post` (how the sub-layer output is spread
 * back) and a doubly-stochastic-ish `comb` (how the old streams are remixed) by a Sinkhorn
 * normalisation that ends on a column step. All of this runs in fp32; the mixed input and the
 * new streams are rounded to bf16, as in the reference. */
#include "base/cpu.h"
#include "num/formats.h"
#include "ops/ops.h"

#include <math.h>

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

#if defined(__x86_64__)
#include <immintrin.h>
#define HC_AVX2 __attribute__((target("avx2,fma")))

HC_AVX2 static double hsum4d(__m256d v) {
    __m128d a = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(a, _mm_unpackhi_pd(a, a)));
}

/* The sums of hc_mix in double, 8 lanes (two vectors) per sum and four of the nmix sums per pass
 * over xf: each product is exact in double and each add rounds once, as in the scalar loop; only
 * the order of the adds differs. n is a multiple of 8. */
HC_AVX2 static void hc_mix_avx2(const float *xf, int n, const float *fn, int nmix, double *ss, double *dot) {
    __m256d s0 = _mm256_setzero_pd(), s1 = s0;
    for (int i = 0; i < n; i += 8) {
        __m256d a = _mm256_cvtps_pd(_mm_loadu_ps(xf + i)), b = _mm256_cvtps_pd(_mm_loadu_ps(xf + i + 4));
        s0 = _mm256_fmadd_pd(a, a, s0);
        s1 = _mm256_fmadd_pd(b, b, s1);
    }
    *ss = hsum4d(_mm256_add_pd(s0, s1));
    int k = 0;
    for (; k + 4 <= nmix; k += 4) {
        const float *f0 = fn + (size_t)k * n, *f1 = f0 + n, *f2 = f1 + n, *f3 = f2 + n;
        __m256d a0 = _mm256_setzero_pd(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0;
        for (int i = 0; i < n; i += 8) {
            __m256d x0 = _mm256_cvtps_pd(_mm_loadu_ps(xf + i)), x1 = _mm256_cvtps_pd(_mm_loadu_ps(xf + i + 4));
            a0 = _mm256_fmadd_pd(x0, _mm256_cvtps_pd(_mm_loadu_ps(f0 + i)), a0);
            a1 = _mm256_fmadd_pd(x1, _mm256_cvtps_pd(_mm_loadu_ps(f0 + i + 4)), a1);
            b0 = _mm256_fmadd_pd(x0, _mm256_cvtps_pd(_mm_loadu_ps(f1 + i)), b0);
            b1 = _mm256_fmadd_pd(x1, _mm256_cvtps_pd(_mm_loadu_ps(f1 + i + 4)), b1);
            c0 = _mm256_fmadd_pd(x0, _mm256_cvtps_pd(_mm_loadu_ps(f2 + i)), c0);
            c1 = _mm256_fmadd_pd(x1, _mm256_cvtps_pd(_mm_loadu_ps(f2 + i + 4)), c1);
            d0 = _mm256_fmadd_pd(x0, _mm256_cvtps_pd(_mm_loadu_ps(f3 + i)), d0);
            d1 = _mm256_fmadd_pd(x1, _mm256_cvtps_pd(_mm_loadu_ps(f3 + i + 4)), d1);
        }
        dot[k] = hsum4d(_mm256_add_pd(a0, a1));
        dot[k + 1] = hsum4d(_mm256_add_pd(b0, b1));
        dot[k + 2] = hsum4d(_mm256_add_pd(c0, c1));
        dot[k + 3] = hsum4d(_mm256_add_pd(d0, d1));
    }
    for (; k < nmix; k++) {
        const float *f = fn + (size_t)k * n;
        __m256d a0 = _mm256_setzero_pd(), a1 = a0;
        for (int i = 0; i < n; i += 8) {
            a0 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(xf + i)), _mm256_cvtps_pd(_mm_loadu_ps(f + i)), a0);
            a1 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(xf + i + 4)), _mm256_cvtps_pd(_mm_loadu_ps(f + i + 4)),
                                 a1);
        }
        dot[k] = hsum4d(_mm256_add_pd(a0, a1));
    }
}
#endif

/* mix[k] = (xf . fn[k]) * rsqrt(mean(xf^2) + eps) over the flattened hc*d values, the sums in
 * double (products exact, one rounding per add). The AVX2 path adds in another order; rounded to
 * float the sums are practically always the scalar loop's (they could differ only by extreme
 * cancellation or a double sum on a float rounding boundary; 2000 random cases: all equal). */
static void hc_mix(const float *xf, int n, const float *fn, int nmix, float norm_eps, float *mix) {
#if defined(__x86_64__)
    if (n % 8 == 0 && nmix <= 64 && mk_cpu_avx2()) {
        double ss, dot[64];
        hc_mix_avx2(xf, n, fn, nmix, &ss, dot);
        float r = 1.0f / sqrtf((float)(ss / n) + norm_eps);
        for (int k = 0; k < nmix; k++) mix[k] = (float)dot[k] * r;
        return;
    }
#endif
    double ss = 0.0;
    for (int i = 0; i < n; i++) ss += (double)xf[i] * xf[i];
    float r = 1.0f / sqrtf((float)(ss / n) + norm_eps);
    for (int k = 0; k < nmix; k++) {
        const float *f = fn + (size_t)k * n;
        double acc = 0.0;
        for (int i = 0; i < n; i++) acc += (double)xf[i] * f[i];
        mix[k] = (float)acc * r;
    }
}

/* y[k] = bf16(sum_i pre[i] * h[i][k]) where pre[i] = sigmoid(mix[i] * scale0 + base[i]) + eps:
 * the weighted collapse of the hc streams that hc_pre and the head share. */
static void hc_collapse(const float *ht, int hc, int d, const float *mix, float scale0,
                        const float *base, float hc_eps, float *y) {
    float pre[16];
    for (int i = 0; i < hc; i++) pre[i] = sigmoidf(mix[i] * scale0 + base[i]) + hc_eps;
    for (int k = 0; k < d; k++) {
        float acc = 0.0f;
        for (int i = 0; i < hc; i++) acc += pre[i] * ht[(size_t)i * d + k];
        y[k] = mk_bf16r(acc);
    }
}

void mk_hc_pre(const float *h, int s, int hc, int d, const float *fn, const float *scale,
               const float *base, int iters, float hc_eps, float norm_eps, float *x, float *post,
               float *comb) {
    int nmix = (2 + hc) * hc;
    float mix[64];
    for (int t = 0; t < s; t++) {
        const float *ht = h + (size_t)t * hc * d;
        hc_mix(ht, hc * d, fn, nmix, norm_eps, mix);
        for (int i = 0; i < hc; i++)
            post[(size_t)t * hc + i] = 2.0f * sigmoidf(mix[hc + i] * scale[1] + base[hc + i]);
        float C[16][16];
        for (int i = 0; i < hc; i++) {
            float mx = -INFINITY;
            for (int j = 0; j < hc; j++) {
                C[i][j] = mix[2 * hc + hc * i + j] * scale[2] + base[2 * hc + hc * i + j];
                if (C[i][j] > mx) mx = C[i][j];
            }
            float sum = 0.0f;
            for (int j = 0; j < hc; j++) sum += (C[i][j] = expf(C[i][j] - mx));
            for (int j = 0; j < hc; j++) C[i][j] = C[i][j] / sum + hc_eps;
        }
        for (int it = 0; it < iters; it++) {
            if (it > 0) { /* row normalisation (skipped on the first pass) */
                for (int i = 0; i < hc; i++) {
                    float rs = 0.0f;
                    for (int j = 0; j < hc; j++) rs += C[i][j];
                    for (int j = 0; j < hc; j++) C[i][j] /= rs + hc_eps;
                }
            }
            for (int j = 0; j < hc; j++) { /* column normalisation */
                float cs = 0.0f;
                for (int i = 0; i < hc; i++) cs += C[i][j];
                for (int i = 0; i < hc; i++) C[i][j] /= cs + hc_eps;
            }
        }
        for (int i = 0; i < hc; i++)
            for (int j = 0; j < hc; j++) comb[((size_t)t * hc + i) * hc + j] = C[i][j];
        hc_collapse(ht, hc, d, mix, scale[0], base, hc_eps, x + (size_t)t * d);
    }
}

void mk_hc_post(const float *x, const float *res, const float *post, const float *comb, int s,
                int hc, int d, float *out) {
    for (int t = 0; t < s; t++) {
        const float *xt = x + (size_t)t * d;
        const float *rt = res + (size_t)t * hc * d;
        const float *pt = post + (size_t)t * hc;
        const float *ct = comb + (size_t)t * hc * hc;
        float *ot = out + (size_t)t * hc * d;
        for (int j = 0; j < hc; j++)
            for (int k = 0; k < d; k++) {
                float acc = pt[j] * xt[k];
                for (int i = 0; i < hc; i++) acc += ct[i * hc + j] * rt[(size_t)i * d + k];
                ot[(size_t)j * d + k] = mk_bf16r(acc);
            }
    }
}

void mk_hc_head(const float *h, int s, int hc, int d, const float *fn, const float *scale,
                const float *base, float hc_eps, float norm_eps, float *y) {
    float mix[16];
    for (int t = 0; t < s; t++) {
        const float *ht = h + (size_t)t * hc * d;
        hc_mix(ht, hc * d, fn, hc, norm_eps, mix);
        hc_collapse(ht, hc, d, mix, scale[0], base, hc_eps, y + (size_t)t * d);
    }
}
