/* ggml_exact.h — llama.cpp's float arithmetic, rounding for rounding: the kernels through which
 * minke's Llama-family forward pass (models/llama.c) gives the same bits as llama.cpp's CPU
 * backend on the same GGUF.
 *
 * Why: llama.cpp is the de-facto reference for GGUF models. Two correct implementations of the
 * same model differ in the last bits of every float op (summation order, fused multiply-adds,
 * exp approximations), and over 30 layers and a few dozen tokens those bits are enough to flip a
 * greedy choice between two close tokens. Matching llama.cpp's rounding points and summation
 * order makes greedy outputs identical, which makes "the same as llama.cpp" a test that either
 * passes or fails, not a judgement about a tolerance. The price is that these kernels are
 * written around ggml's choices rather than the fastest ones; they are still vectorized.
 *
 * Whose arithmetic: ggml-cpu as llama.cpp builds it by default (GGML_NATIVE: -march=native, GCC,
 * -O3, gnu11 / gnu++17, so the compiler may fuse a * b + c in scalar code; where it did, the
 * kernels here use an explicit fma, as found in the disassembly and checked against tensors
 * dumped from llama.cpp). What ggml does depends on the instruction set it was compiled for, so
 * every kernel takes an mk_gx_isa:
 *
 *   MK_GX_AVX512  a native build on a CPU with AVX512F and AVX512DQ: 16-lane vectors
 *                 (ggml_vec_dot_f16 with 4 x 16 accumulators, tinyBLAS with KN = 16, the AVX512
 *                 ggml_v_expf / ggml_v_silu, _mm512_reduce_add_ps's reduction tree)
 *   MK_GX_AVX2    a native build on an AVX2 + FMA + F16C CPU: 8-lane vectors (4 x 8
 *                 accumulators, KN = 8, the AVX2 ggml_v_expf, hadd-based reductions)
 *   MK_GX_SCALAR  anything older: ggml's plain C paths (no claim of exactness: a build for an
 *                 SSE-only CPU takes SSE paths that are not mirrored)
 *
 * mk_gx_isa_native() returns the level for the CPU we run on, which is what llama.cpp built
 * natively on this machine uses. Every kernel runs for every level on any CPU: the SIMD code
 * when the CPU has it, otherwise a scalar emulation of the same order (which is also what the
 * unit tests compare the SIMD code with).
 *
 * Quantized matmuls (Q4_1, Q8_0 against Q8_1 / Q8_0 activations) are in ggml_quant.c, whose dot
 * kernels follow llama.cpp's AVX2 vec_dot order (it is the same for AVX2 and AVX512 builds).
 *
 * The ops of a llama.cpp forward pass (flash attention off) and the kernel for each:
 *   rms_norm + mul          mk_gx_rmsnorm: sum of float squares in double, 1/sqrtf, x*s*w
 *   rope (normal / neox)    mk_gx_rope_cache + mk_gx_rope: theta = pos * theta_scale^i by
 *                           repeated float products, sincosf, one fused multiply-add per output
 *   KQ, KQV (F16 x F16)     mk_gx_dot_f16 (ggml_vec_dot_f16: one-token decode) or
 *                           mk_gx_dot_f16_tb (llamafile tinyBLAS: batches of 2+ tokens)
 *   soft_max                mk_gx_softmax_exp (ggml_vec_soft_max_f32: exp via ggml_v_expf on
 *                           vector lanes, expf on the tail, the sum in double)
 *   swiglu                  mk_gx_swiglu (ggml_v_silu lanes, x / (1 + expf(-x)) tail)
 *   f32 -> f16 (KV cache,   mk_gx_f32_to_f16: round to nearest even
 *   Q and softmax rows)
 */
#ifndef MK_NUM_GGML_EXACT_H
#define MK_NUM_GGML_EXACT_H

#include <stddef.h>
#include <stdint.h>

typedef enum { MK_GX_SCALAR = 0, MK_GX_AVX2 = 1, MK_GX_AVX512 = 2 } mk_gx_isa;

/* The level llama.cpp built natively on this CPU uses (detected once; thread-safe). */
mk_gx_isa mk_gx_isa_native(void);
const char *mk_gx_isa_name(mk_gx_isa isa);

/* ggml_vec_dot_f16: sum of x[i] * y[i] over n halves. SIMD levels: 4 accumulators of W lanes
 * (W = 16 / 8) over steps of 4W, element i in lane i % W of accumulator (i / W) % 4, fused
 * multiply-adds, then acc0 + acc2, acc1 + acc3, their sum, and the level's horizontal reduction;
 * the last n % 4W products are added in double. Scalar: every product added in double. */
float mk_gx_dot_f16(mk_gx_isa isa, int n, const uint16_t *x, const uint16_t *y);

/* tinyBLAS (llamafile sgemm) inner product for F16 x F16: one accumulator of KN lanes
 * (KN = mk_gx_tb_kn(isa)), element i in lane i % KN, fused multiply-adds in order of i, then the
 * horizontal reduction. llama.cpp uses it for a matmul with 2 or more src1 columns when k % KN
 * == 0 (and the output rows a multiple of 4); otherwise it takes the vec_dot path. n must be a
 * multiple of KN; returns NaN for MK_GX_SCALAR (no tinyBLAS there). */
float mk_gx_dot_f16_tb(mk_gx_isa isa, int n, const uint16_t *a, const uint16_t *b);
int mk_gx_tb_kn(mk_gx_isa isa); /* 16, 8, or 0 for MK_GX_SCALAR */

/* out[i] = dot(x + i * stride, y) for i < count, in tinyBLAS order (tb != 0) or vec_dot order:
 * the same values as count calls of the functions above, without a dispatch per row. */
void mk_gx_dot_f16_n(mk_gx_isa isa, int tb, int n, const uint16_t *x, size_t stride, int count, const uint16_t *y,
                     float *out);

/* ggml_vec_soft_max_f32: y[i] = exp(x[i] - max), returns sum y in double (W-lane chunks reduced
 * in float, each chunk's sum added in double; the tail exp'd by expf). */
double mk_gx_softmax_exp(mk_gx_isa isa, int n, float *y, const float *x, float max);

/* ggml_vec_swiglu_f32: y[i] = silu(x[i]) * g[i]. */
void mk_gx_swiglu(mk_gx_isa isa, int n, float *y, const float *x, const float *g);

/* ggml_v_expf on one lane of the level's vector (exposed for tests); MK_GX_SCALAR: expf. */
float mk_gx_expf_lane(mk_gx_isa isa, float x);

/* rms_norm followed by mul: s = 1 / sqrtf((float)(sum_i (double)(x[i] * x[i]) / n) + eps),
 * y[i] = x[i] * s * w[i] (two float products, in that order). y may alias x. */
void mk_gx_rmsnorm(int n, const float *x, const float *w, float eps, float *y);

/* RoPE angle cache of one position (ggml_rope_cache_init with freq_scale 1, no YaRN, no freq
 * factors): theta_0 = pos, theta_{i+1} = theta_i * powf(base, -2 / n_dims) in float;
 * cache[2i] = cos(theta_i), cache[2i + 1] = sin(theta_i) (sincosf). */
void mk_gx_rope_cache(int n_dims, float base, int pos, float *cache);
/* Rotate one head vector in place: pairs (2i, 2i + 1) (normal, llama) or (i, i + n_dims / 2)
 * (neox, qwen2): x0' = fma(x0, cos, -(x1 * sin)), x1' = fma(x0, sin, x1 * cos). */
void mk_gx_rope(int n_dims, int neox, const float *cache, float *x);

/* f32 -> f16, round to nearest even (ggml_cpu_fp32_to_fp16). */
void mk_gx_f32_to_f16(int n, const float *x, uint16_t *y);

#endif
