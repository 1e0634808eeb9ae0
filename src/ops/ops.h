/* ops.h — the backend-neutral op interface of minke's forward passes.
 *
 * Each op takes raw pointers, sizes and (where it runs in parallel) a thread pool; the CPU
 * implementation in src/ops/cpu/ is the reference for every other backend. Activations are fp32
 * arrays; where the DeepSeek reference keeps a tensor in bf16, the op rounds its output to bf16
 * (mk_bf16r), so a "bf16 tensor" here is an fp32 array holding bf16-representable values. This
 * keeps the arithmetic readable and the rounding points exactly where the reference has them.
 *
 * Shapes are given in comments as [rows, cols]; all arrays are row-major and contiguous.
 */
#ifndef MK_OPS_OPS_H
#define MK_OPS_OPS_H

#include "base/threads.h"

#include <stddef.h>
#include <stdint.h>

/* ---- weight matrices -------------------------------------------------------------------- */

typedef enum {
    MK_W_BF16 = 1, /* uint16 bf16 [n, k] */
    MK_W_F32,      /* float [n, k] */
    MK_W_FP8,      /* uint8 e4m3 [n, k]; scale e8m0 [ceil(n/128), ceil(k/128)] */
    MK_W_FP4,      /* uint8 packed e2m1 [n, k/2] (low nibble = even k); scale e8m0 [n, k/32] */
    MK_W_FP8_DQ,   /* FP8 storage used as its exact dequantized bf16 values with NO activation
                      quantization (the reference's convert.py dequantizes wo_a to bf16) */
} mk_wkind;

typedef struct {
    mk_wkind kind;
    int n, k;             /* logical output and input features */
    const void *w;        /* points into the mmapped checkpoint */
    const uint8_t *scale; /* FP8 / FP4 only */
} mk_wmat;

/* Bytes of weight data (and scales) one full pass over W reads. */
size_t mk_wmat_bytes(const mk_wmat *W);

/* Scratch floats mk_linear needs for m rows of a k-wide input (activation quantization). */
size_t mk_linear_scratch(int m, int k);

/* y[m, n] = x[m, k] @ W^T, as the reference's linear() computes it for W's dtype:
 *   FP8: x is FP8-quantized per 128-wide block (act_quant, ue8m0), C = sum over K blocks of the
 *        exact block dot times both scales, accumulated in fp32;
 *   FP4: x is FP8-quantized per 128 block, weights carry one e8m0 scale per 32 along K;
 *   BF16: plain matmul of bf16 values with fp32 accumulation;
 *   F32: x used as is (fp32), weights upcast.
 * round_bf16: round the outputs to bf16 (the reference's bf16 output), else keep fp32.
 * scratch: at least mk_linear_scratch(m, k) floats. pool may be NULL (single thread). */
void mk_linear(mk_pool *pool, const mk_wmat *W, const float *x, int m, float *y, int round_bf16,
               float *scratch);
/* The FP4 weight decode of mk_linear's AVX2 path (tests and benchmarks; both give the same bits):
 * MK_FP4_F16 widens the codes through f16 (vcvtph2ps), MK_FP4_BITS places them straight into f32
 * bits, where e2m1's 0.5 lands on an f32 subnormal (slow on Intel). MK_FP4_AUTO: MINKE_CPU_FP4
 * (f16 | bits) if set, else f16 on Intel CPUs. Returns the previous setting. */
enum { MK_FP4_AUTO = 0, MK_FP4_BITS = 1, MK_FP4_F16 = 2 };
int mk_linear_fp4_decode(int mode);
/* 1: mk_linear runs its AVX2 kernels on this thread now (AVX2, FMA and F16C, MXCSR.DAZ clear);
 * 0: the scalar code. */
int mk_linear_simd(void);
/* The scalar reference of the same (src/ops/cpu/gemm_ref.c); mk_linear must match it within
 * fp32 reassociation. */
void mk_linear_ref(const mk_wmat *W, const float *x, int m, float *y, int round_bf16,
                   float *scratch);

/* ---- norms, rope ------------------------------------------------------------------------ */

/* y[r] = bf16(w * (x[r] * rsqrt(mean(x[r]^2) + eps))) for r < rows; w bf16 [d] (NULL = no weight).
 * y may alias x. */
void mk_rmsnorm(const float *x, int rows, int d, const uint16_t *w, float eps, float *y);

/* RoPE tables: cos/sin [max_pos, rd/2] for one base (YaRN when original_seq_len > 0). */
typedef struct {
    int max_pos, half; /* half = rd / 2 */
    float *cs;         /* [max_pos, half, 2]: cos, sin */
} mk_rope_table;
int mk_rope_table_init(mk_rope_table *t, int max_pos, int rd, double base, int original_seq_len,
                       double factor, double beta_fast, double beta_slow);
void mk_rope_table_free(mk_rope_table *t);
/* Interleaved-pair rotation of x[0..rd) by position pos (inverse = conjugate), output rounded to
 * bf16. */
void mk_rope(float *x, int rd, const mk_rope_table *t, int pos, int inverse);

/* Sylvester-order Walsh-Hadamard transform of n (power of two) values, times `scale`,
 * fp32 inside, rounded to bf16. */
void mk_hadamard(float *x, int n, float scale);

/* ---- hyper-connections -------------------------------------------------------------------- */

/* hc_pre over s tokens: h [s, hc, d] -> x [s, d] (bf16), post [s, hc], comb [s, hc, hc].
 * fn f32 [(2+hc)*hc, hc*d], scale f32 [3], base f32 [(2+hc)*hc]. */
void mk_hc_pre(const float *h, int s, int hc, int d, const float *fn, const float *scale,
               const float *base, int iters, float hc_eps, float norm_eps, float *x, float *post,
               float *comb);
/* hc_post: out [s, hc, d] = bf16(post[j] * x + sum_i comb[i][j] * res[i]). out may not alias res. */
void mk_hc_post(const float *x, const float *res, const float *post, const float *comb, int s,
                int hc, int d, float *out);
/* head collapse: y [s, d] = bf16(sum_j (sigmoid(mix_j * scale + base_j) + eps) * h[j]). */
void mk_hc_head(const float *h, int s, int hc, int d, const float *fn, const float *scale,
                const float *base, float hc_eps, float norm_eps, float *y);

/* ---- vector primitives (src/ops/cpu/vec.c; AVX2 when present) --------------------------- */

float mk_vdot(const float *a, const float *b, int n);
void mk_vaxpy(float *y, float a, const float *x, int n); /* y += a * x */

/* ---- attention ---------------------------------------------------------------------------- */

/* One query token over gathered KV rows (K = V), all heads:
 *   s_j = (q_h . kv_j) * scale;  o_h = sum_j bf16(exp(s_j - M)) kv_j / (sum_j exp(s_j - M) +
 *   exp(sink_h - M)); output bf16.
 * q [H, D], rows: n pointers to D-float KV rows, sink [H], o [H, D]. n may be 0.
 * Heads are spread over the pool (may be NULL). */
void mk_sparse_attn(mk_pool *pool, const float *q, int H, int D, const float *const *rows, int n,
                    const float *sink, float scale, float *o);

#endif
