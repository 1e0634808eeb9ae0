/* basic.c — CPU reference ops: RMSNorm, interleaved RoPE with YaRN tables, the Hadamard
 * transform, and single-query sparse attention with the sink (ops.h).
 *
 * Numerics follow DeepSeek's reference: norms run in fp32 (here: sum of squares in double, which
 * is closer to torch's cascaded sum than a running fp32 sum) and round the result to bf16; RoPE
 * multiplies the fp32 value pairs by fp32 (cos, sin) and rounds to bf16; attention accumulates
 * scores and the PV product in fp32 with the probabilities rounded to bf16 before PV, and the sink
 * only in the denominator. */
#include "minke.h"
#include "num/formats.h"
#include "ops/ops.h"

#include <math.h>
#include <stdlib.h>

void mk_rmsnorm(const float *x, int rows, int d, const uint16_t *w, float eps, float *y) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * d;
        float *yr = y + (size_t)r * d;
        double ss = 0.0;
        for (int i = 0; i < d; i++) ss += (double)xr[i] * xr[i];
        float var = (float)(ss / d);
        float rs = 1.0f / sqrtf(var + eps);
        for (int i = 0; i < d; i++) {
            float v = xr[i] * rs;
            if (w) v = mk_bf16_to_f32(w[i]) * v;
            yr[i] = mk_bf16r(v);
        }
    }
}

/* YaRN as the reference's precompute_freqs_cis computes it (fp32 tensors, python-float base). */
int mk_rope_table_init(mk_rope_table *t, int max_pos, int rd, double base, int original_seq_len,
                       double factor, double beta_fast, double beta_slow) {
    int half = rd / 2;
    t->max_pos = max_pos;
    t->half = half;
    t->cs = malloc(sizeof(float) * 2 * (size_t)max_pos * (size_t)half);
    if (!t->cs) return MK_ENOMEM;
    float freqs[256];
    for (int i = 0; i < half && i < 256; i++)
        freqs[i] = 1.0f / powf((float)base, (float)(2 * i) / (float)rd);
    if (original_seq_len > 0) {
        double lo_d = rd * log(original_seq_len / (beta_fast * 2 * M_PI)) / (2 * log(base));
        double hi_d = rd * log(original_seq_len / (beta_slow * 2 * M_PI)) / (2 * log(base));
        double low = floor(lo_d), high = ceil(hi_d);
        if (low < 0) low = 0;
        if (high > rd - 1) high = rd - 1;
        if (low == high) high += 0.001;
        for (int i = 0; i < half; i++) {
            float ramp = ((float)i - (float)low) / (float)(high - low);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            float smooth = 1.0f - ramp;
            freqs[i] = freqs[i] / (float)factor * (1.0f - smooth) + freqs[i] * smooth;
        }
    }
    for (int p = 0; p < max_pos; p++)
        for (int i = 0; i < half; i++) {
            float a = (float)p * freqs[i];
            t->cs[((size_t)p * half + i) * 2] = cosf(a);
            t->cs[((size_t)p * half + i) * 2 + 1] = sinf(a);
        }
    return MK_OK;
}

void mk_rope_table_free(mk_rope_table *t) {
    free(t->cs);
    t->cs = NULL;
}

void mk_rope(float *x, int rd, const mk_rope_table *t, int pos, int inverse) {
    const float *cs = t->cs + (size_t)pos * t->half * 2;
    for (int i = 0; i < rd / 2; i++) {
        float c = cs[2 * i], s = inverse ? -cs[2 * i + 1] : cs[2 * i + 1];
        float a = x[2 * i], b = x[2 * i + 1];
        x[2 * i] = mk_bf16r(a * c - b * s);
        x[2 * i + 1] = mk_bf16r(a * s + b * c);
    }
}

void mk_hadamard(float *x, int n, float scale) {
    for (int h = 1; h < n; h <<= 1)
        for (int i = 0; i < n; i += 2 * h)
            for (int j = i; j < i + h; j++) {
                float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    for (int i = 0; i < n; i++) x[i] = mk_bf16r(x[i] * scale);
}

typedef struct {
    const float *q;
    int D;
    const float *const *rows;
    int n;
    const float *sink;
    float scale;
    float *o;
} attn_job;

/* One head: online softmax over blocks of rows, probabilities rounded to bf16 before PV (the
 * reference's acc_s_cast), the sink only in the denominator. */
static void attn_head(void *ctx, int h, int tid) {
    (void)tid;
    const attn_job *J = ctx;
    enum { BLK = 256 };
    float sc[BLK];
    int D = J->D, n = J->n;
    const float *qh = J->q + (size_t)h * D;
    float *oh = J->o + (size_t)h * D;
    float m = -INFINITY, den = 0.0f;
    for (int d = 0; d < D; d++) oh[d] = 0.0f;
    if (n == 0) return;
    for (int b0 = 0; b0 < n; b0 += BLK) {
        int nb = n - b0 < BLK ? n - b0 : BLK;
        float bm = -INFINITY;
        for (int j = 0; j < nb; j++) {
            sc[j] = mk_vdot(qh, J->rows[b0 + j], D) * J->scale;
            if (sc[j] > bm) bm = sc[j];
        }
        float nm = bm > m ? bm : m;
        if (m != -INFINITY && nm != m) {
            float corr = expf(m - nm);
            den *= corr;
            for (int d = 0; d < D; d++) oh[d] *= corr;
        }
        for (int j = 0; j < nb; j++) {
            float p = expf(sc[j] - nm);
            den += p;
            mk_vaxpy(oh, mk_bf16r(p), J->rows[b0 + j], D);
        }
        m = nm;
    }
    den += expf(J->sink[h] - m);
    for (int d = 0; d < D; d++) oh[d] = mk_bf16r(oh[d] / den);
}

void mk_sparse_attn(mk_pool *pool, const float *q, int H, int D, const float *const *rows, int n,
                    const float *sink, float scale, float *o) {
    attn_job J = {q, D, rows, n, sink, scale, o};
    mk_pool_run(pool, H, attn_head, &J);
}
