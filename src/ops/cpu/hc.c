/* hc.c — manifold-constrained hyper-connections (mHC) of DeepSeek-V4 on the CPU (ops.h).
 *
 * The residual stream is hc (= 4) copies of the hidden state. Before each sub-layer, hc_pre mixes
 * them into one input with weights `pre` and computes `post` (how the sub-layer output is spread
 * back) and a doubly-stochastic-ish `comb` (how the old streams are remixed) by a Sinkhorn
 * normalisation that ends on a column step. All of this runs in fp32; the mixed input and the
 * new streams are rounded to bf16, as in the reference. */
#include "num/formats.h"
#include "ops/ops.h"

#include <math.h>

static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* mix[k] = (xf . fn[k]) * rsqrt(mean(xf^2) + eps) over the flattened hc*d values. */
static void hc_mix(const float *xf, int n, const float *fn, int nmix, float norm_eps, float *mix) {
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
