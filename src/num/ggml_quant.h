/* ggml_quant.h — the ggml / GGUF tensor formats minke reads, and the kernels that use them:
 * row dequantization, activation quantization, dot products and a threaded GEMV / GEMM.
 *
 * Type ids are ggml's (`enum ggml_type`, the MK_GGML_* constants of io/gguf.h), so a GGUF
 * tensor's type field is passed as is. Q5_0 / Q5_1 are here because llama.cpp's K-quant files
 * fall back to them for tensors whose width is not a multiple of 256 (all of SmolLM2's 576-wide
 * ones: a Q4_K_M SmolLM2 file is mostly Q5_0).
 * Weight formats (bytes per block, elements per block; d, dmin, m are IEEE half):
 *
 *   F32   (0)   4 B / 1     float
 *   F16   (1)   2 B / 1     half
 *   BF16  (30)  2 B / 1     bfloat16
 *   Q4_0  (2)  18 B / 32    d; qs[16]: element j < 16 is the low nibble of qs[j], element j + 16 its
 *                           high nibble; x = (q - 8) * d
 *   Q4_1  (3)  20 B / 32    d, m; qs[16] as Q4_0; x = q * d + m
 *   Q5_0  (6)  22 B / 32    d; qh (32 bits, little-endian); qs[16] as Q4_0; bit e of qh is bit 4
 *                           of element e; x = (q - 16) * d
 *   Q5_1  (7)  24 B / 32    d, m; qh; qs[16] as Q5_0; x = q * d + m
 *   Q8_0  (8)  34 B / 32    d; int8 qs[32]; x = q * d
 *   Q4_K  (12) 144 B / 256  d, dmin; scales[12]: eight 6-bit scales sc and eight 6-bit mins mn of
 *                           the 32-element sub-blocks (bytes 0-3: sc0-3 in bits 0-5 and the high
 *                           2 bits of sc4-7 in bits 6-7; bytes 4-7: the same for mn; bytes 8-11:
 *                           low 4 bits of sc4-7 | low 4 bits of mn4-7 << 4); qs[128]: per
 *                           64-element chunk c, 32 bytes whose low nibbles are sub-block 2c and
 *                           high nibbles sub-block 2c + 1; x = (d * sc) * q - dmin * mn
 *   Q5_K  (13) 176 B / 256  d, dmin, scales[12] as Q4_K; qh[32]; qs[128] as Q4_K; bit 4 of element
 *                           l of sub-block s (l < 32) is bit s of qh[l]; x = (d * sc) * q - dmin * mn
 *   Q6_K  (14) 210 B / 256  ql[128], qh[64], int8 scales[16], d. Per 128-element half h (ql + 64h,
 *                           qh + 32h) and l < 32: element l     = ql[l] & 15      | (qh[l] & 3) << 4,
 *                                                 element l + 32 = ql[l + 32] & 15 | (qh[l] >> 2 & 3) << 4,
 *                                                 element l + 64 = ql[l] >> 4      | (qh[l] >> 4 & 3) << 4,
 *                                                 element l + 96 = ql[l + 32] >> 4 | (qh[l] >> 6) << 4;
 *                           x = (d * scales[e / 16]) * (q - 32) for element e of the super-block
 *
 * Dequantization gives exactly ggml's values (every product above is exact in fp32; the one add
 * or subtract is done in ggml's order).
 *
 * Activation quantization — which activation format each weight type's dot uses, and why.
 * llama.cpp (ggml-cpu) converts the input vector to the weight type's `vec_dot_type` and takes
 * the dot product in that domain; minke does the same, with the same rounding, so that the
 * numbers match llama.cpp's on the same GGUF (and so that the quantized types run as integer
 * dot products, which is what makes them fast):
 *
 *   F32  weights -> F32  activations (no conversion)
 *   F16  weights -> F16  activations (x rounded to half, nearest-even; products of two halves are
 *                       exact in fp32, so the dot is an fp32 sum of exact products)
 *   BF16 weights -> BF16 activations (x rounded to bf16, nearest-even)
 *                   (both kept as floats holding the rounded values: one conversion less per dot)
 *   Q4_0 weights -> Q8_0 activations: per 32 values amax = max |x|, d = amax / 127 stored as half,
 *                   q = round-half-even(x * (127 / amax)) (llama.cpp's AVX2 quantize_row_q8_0).
 *   Q5_0, Q8_0 weights -> Q8_0 activations (same)
 *   Q4_1, Q5_1 weights -> Q8_1 activations: Q8_0's q and d, plus s = half(d * sum(q)) per
 *                   block. Q4_1 has an offset m, and sum_i (q_i d + m) x_i = d dx sum q_i x'_i + m * s: the
 *                   block sum of the activation carries the offset term. (llama.cpp pairs Q4_1
 *                   and Q5_1 with Q8_1 for this reason; s is rounded to half as in its
 *                   block_q8_1.) Q4_0 / Q5_0's fixed offsets -8 / -16 use the exact integer sum
 *                   of q instead, which is kept next to the Q8_0 activations.
 *   Q4_K, Q5_K, Q6_K -> Q8_K activations: per 256 values, max = the x of largest |x| (first one),
 *                   iscale = -127 / max, q = min(127, round-half-even(iscale * x)), d = 1 / iscale
 *                   (float), plus the sum of each 16 q's (bsums), which carry the K-quants' min
 *                   (Q4_K, Q5_K) and the -32 offset (Q6_K) terms. (llama.cpp's quantize_row_q8_K,
 *                   the reference version, which is what it runs on x86.)
 *
 * Determinism: every kernel has a scalar reference and an AVX2 version (chosen at run time:
 * AVX2 + FMA + F16C); they give bit-identical results. Products of 2+ activation rows against
 * Q4_1 / Q8_0 weights run, where the CPU has AVX-512 VNNI, on multi-row tiles (several weight
 * rows x up to 16 activation rows per pass, vpdpbusd for the integer sums) that give the same
 * bits as the one-row kernels: the batched decode of the Llama family reads each weight block
 * once for many rows instead of once per row. Integer block dots are exact; the float
 * steps after them (scale products, accumulation into 8 lanes, the final reduction tree) are the
 * same operations in the same order in both. So a result does not depend on the machine's SIMD
 * level or the thread count.
 * Against llama.cpp: the activations and weights are identical; the Q8_0 and Q4_1 dots are also
 * computed in llama.cpp's x86 order (ggml_vec_dot_q8_0_q8_0 / _q4_1_q8_1: per block, the exact
 * integer sums of elements 4l..4l+3 fused into 8 float lanes with the block's scale, hsum_float_8,
 * plus Q4_1's fused m * s chain), so those give llama.cpp's bits. The other types differ from it by
 * fp32 reassociation only (their lane structure differs; llama.cpp repacks Q4_0 / Q4_K on x86).
 *
 * Limits: a row length n must be a positive multiple of the block size (mk_ggml_row_bytes
 * returns 0 otherwise); non-finite activations give non-finite results. Nothing here aborts:
 * invalid arguments give NaN outputs, so loaders should check mk_ggml_type_supported and
 * mk_ggml_row_bytes first and report a clear error.
 */
#ifndef MK_NUM_GGML_QUANT_H
#define MK_NUM_GGML_QUANT_H

#include "base/threads.h"
#include "io/gguf.h" /* the ggml type ids (MK_GGML_*) and mk_ggml_type_name */

#include <stddef.h>
#include <stdint.h>

/* 1 if `type` is a weight type these kernels handle, else 0 (loaders: fail with the type name). */
int mk_ggml_type_supported(uint32_t type);
/* Elements per block (1 for F32/F16/BF16), bytes per block; 0 for unsupported types. */
int mk_ggml_block_elems(uint32_t type);
size_t mk_ggml_block_bytes(uint32_t type);
/* Bytes of one row of n elements; 0 if the type is unsupported, n <= 0 or n is not a multiple of
 * the block size. */
size_t mk_ggml_row_bytes(uint32_t type, int64_t n);

/* dst[0..n) = the values of one row (n elements, row_bytes(type, n) bytes at src). Invalid type or
 * n: dst (if n > 0) is filled with NaN. */
void mk_ggml_dequant_row(uint32_t type, const void *src, float *dst, int64_t n);

/* The activation format the dot of weight `type` uses (MK_GGML_Q8_0, _Q8_1, _Q8_K, or the weight
 * type itself for F32/F16/BF16); (uint32_t)-1 if unsupported. */
uint32_t mk_ggml_act_type(uint32_t type);
/* Bytes of one quantized activation row of n elements for weight `type`; 0 if invalid. Layouts
 * (nb = number of blocks; all arrays packed back to back in this order):
 *   Q8_0: int8 q[n], float d[nb] (the half-rounded scale), int32 sum[nb] (sum of q)
 *   Q8_1: as Q8_0, then float s[nb] (half(d * sum(q)) as float)
 *   Q8_K: int8 q[n], float d[nb], int16 bsums[nb][16]
 *   F32: float [n]; F16, BF16: float [n] holding the half- / bf16-rounded values */
size_t mk_ggml_act_bytes(uint32_t type, int64_t n);
/* Quantize / convert x[0..n) into act (mk_ggml_act_bytes(type, n) bytes) for weight `type`. */
void mk_ggml_quant_act(uint32_t type, const float *x, int64_t n, void *act);
/* Dot product of one weight row (n elements) with a quantized activation row; NaN if invalid. */
float mk_ggml_vec_dot(uint32_t type, int64_t n, const void *w_row, const void *act);

/* Scratch bytes mk_ggml_matmul needs for m rows of a k-wide input (0 if invalid). */
size_t mk_ggml_matmul_scratch(uint32_t type, int m, int k);
/* y[m, n] = x[m, k] @ W^T, W [n rows][row_bytes(type, k)] in ggml format: x's rows are converted
 * to the activation format once, then every output is one mk_ggml_vec_dot. Rows of W are spread
 * over the pool (may be NULL); small products run on the calling thread. The result does not
 * depend on the pool size. scratch: mk_ggml_matmul_scratch(type, m, k) bytes, any alignment.
 * Invalid type or k: y is filled with NaN. */
void mk_ggml_matmul(mk_pool *pool, uint32_t type, const void *W, int n, int k, const float *x,
                    int m, float *y, void *scratch);
/* mk_ggml_matmul with kernel choices: flags MK_GGML_MM_NO_VNNI keeps a product of 2+ rows on the
 * one-row AVX2 kernels (tests and benchmarks compare the two; the results are the same bits).
 * Products of 2+ rows against Q4_1 / Q8_0 weights otherwise run on the multi-row AVX-512 VNNI
 * tiles where the CPU has them (mk_ggml_have_vnni): a weight block is unpacked once for up to 16
 * activation rows and an activation block loaded once for 2-4 weight rows, each output still
 * summed in llama.cpp's order. The scratch (mk_ggml_matmul_scratch) covers both. */
#define MK_GGML_MM_NO_VNNI 1u
void mk_ggml_matmul_ex(mk_pool *pool, uint32_t type, const void *W, int n, int k, const float *x,
                       int m, float *y, void *scratch, unsigned flags);
/* Several products with the same input: y_i[m, n_i] = x[m, k] @ W_i^T for up to
 * MK_GGML_MM_MAX_MATS matrices of one type (a layer's Q, K, V, or its gate and up): x is
 * quantized once and all the matrices' rows are spread over the pool in one run. Each y_i is what
 * mk_ggml_matmul_ex(W_i) gives, bit for bit. scratch: mk_ggml_matmul_scratch(type, m, k) bytes. */
#define MK_GGML_MM_MAX_MATS 4
typedef struct {
    const void *W; /* [n rows][row_bytes(type, k)] */
    int n;
    float *y;      /* [m, n] */
} mk_ggml_mat;
void mk_ggml_matmul_n(mk_pool *pool, uint32_t type, int k, const mk_ggml_mat *mats, int nmat, const float *x,
                      int m, void *scratch, unsigned flags);
/* 1 when this CPU runs the multi-row VNNI kernels (AVX-512 F/BW/DQ/VL + VNNI), else 0. */
int mk_ggml_have_vnni(void);

#endif
