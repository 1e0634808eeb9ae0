/* formats.h — the number formats of DeepSeek-V4 checkpoints and of its reference activation
 * quantizers, bit-exact.
 *
 *   bf16         truncated fp32; rounding fp32 -> bf16 is round-to-nearest-even (NaN kept quiet)
 *   FP8 E4M3     (e4m3fn) 1-4-3, bias 7, no infinities, 0x7F/0xFF are NaN, max 448
 *   E8M0         unsigned power-of-two scale: 2^(e-127); 255 is NaN (e = 0 gives 2^-127)
 *   FP4 E2M1     1-2-1: {0, .5, 1, 1.5, 2, 3, 4, 6} and negatives; packed two per byte, low
 *                nibble = even element
 *
 * Activation quantizers of the reference (kernel.py act_quant / fp4_act_quant, scale_fmt ue8m0):
 *   FP8 block:  amax = max(max|x|, 1e-4); s = 2^ceil(log2(amax / 448)); q = e4m3(clamp(x/s))
 *   FP4 block:  amax = max(max|x|, 6 * 2^-126); s = 2^ceil(log2(amax / 6)); q = e2m1(clamp(x/s))
 * `s` is computed from the fp32 bits (exponent + (mantissa != 0)), which is what the reference's
 * fast_log2_ceil does. Conversions to e4m3 / e2m1 round to nearest, ties to even, as torch's
 * casts do. The `_sim` variants write back bf16(q * s) in place: the reference's QAT simulation.
 */
#ifndef MK_NUM_FORMATS_H
#define MK_NUM_FORMATS_H

#include <stdint.h>
#include <string.h>

static inline float mk_f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t mk_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* bf16 <-> f32 */
static inline float mk_bf16_to_f32(uint16_t h) { return mk_f32_from_bits((uint32_t)h << 16); }
static inline uint16_t mk_f32_to_bf16(float f) {
    uint32_t u = mk_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
/* Round an fp32 value to the nearest bf16 value (RNE), returned as fp32. */
static inline float mk_bf16r(float f) { return mk_bf16_to_f32(mk_f32_to_bf16(f)); }

/* f16 (IEEE half) -> f32, for GGUF and tests. */
float mk_f16_to_f32(uint16_t h);
/* f32 -> f16 (IEEE half), round to nearest even, overflow to inf, NaN kept. */
uint16_t mk_f32_to_f16(float f);

/* FP8 E4M3 (fn) */
float mk_e4m3_to_f32(uint8_t b);
uint8_t mk_f32_to_e4m3(float f); /* RNE, saturating to +-448 (inputs are pre-clamped) */
/* E8M0 scale */
float mk_e8m0_to_f32(uint8_t b);
/* FP4 E2M1 nibble (low 4 bits used) */
float mk_e2m1_to_f32(uint8_t nib);
uint8_t mk_f32_to_e2m1(float f); /* RNE on the e2m1 grid, saturating to +-6 */
extern const float mk_e2m1_table[16];
extern float mk_e4m3_table[256]; /* filled by mk_num_init() */
void mk_num_init(void);

/* Power-of-two scale as the reference computes it: 2^ceil(log2(x)) from the fp32 bits of x
 * (x > 0, finite). */
float mk_pow2_ceil(float x);

/* FP8 activation quantization of one block of n values: writes q (e4m3 values as float) and
 * returns the scale s (a power of two). */
float mk_act_quant_block(const float *x, int n, float *q);
/* FP4 activation quantization of one block of n values (values as float on the e2m1 grid). */
float mk_fp4_quant_block(const float *x, int n, float *q);
/* In-place QAT simulations over a row of n values in blocks of `block`: x <- bf16(q * s). */
void mk_act_quant_sim(float *x, int n, int block);
void mk_fp4_quant_sim(float *x, int n, int block);

#endif
