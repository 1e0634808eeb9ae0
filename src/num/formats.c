/* formats.c — bit-exact number formats and the reference's activation quantizers (formats.h). */
#include "num/formats.h"

#include <math.h>

const float mk_e2m1_table[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
float mk_e4m3_table[256];

float mk_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    int e = (h >> 10) & 0x1f;
    uint32_t m = h & 0x3ff;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? NAN : INFINITY;
    else v = ldexpf((float)(m | 0x400), e - 25);
    return sign ? -v : v;
}

uint16_t mk_f32_to_f16(float f) {
    uint32_t u = mk_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00;          /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00;         /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {                               /* below 2^-14: f16 subnormal */
        float v = fabsf(f) * 16777216.0f;                /* in units of 2^-24 */
        return sign | (uint16_t)(int)rintf(v);          /* exact scaling, RNE */
    }
    uint32_t r = a + 0xfff + ((a >> 13) & 1);           /* RNE on the 13 dropped bits */
    return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

float mk_e4m3_to_f32(uint8_t b) {
    int s = b >> 7, e = (b >> 3) & 0xf, m = b & 7;
    float v;
    if (e == 15 && m == 7) return NAN;
    if (e == 0) v = ldexpf((float)m, -9);          /* subnormal: m/8 * 2^-6 */
    else v = ldexpf((float)(8 + m), e - 10);        /* (1 + m/8) * 2^(e-7) */
    return s ? -v : v;
}

uint8_t mk_f32_to_e4m3(float f) {
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (isnan(f)) return 0x7f | sign;
    if (a >= 448.0f) return sign | 0x7e; /* saturate (inputs are clamped to +-448 first) */
    /* Find the nearest representable value with ties to even mantissa. E4M3 values below 2^-6 are
     * subnormal with a fixed step of 2^-9; above, step is 2^(e-10). */
    int e;
    frexpf(a, &e);                 /* a = fr * 2^e, fr in [0.5,1): exponent of a is e-1 */
    int exp_unb = e - 1;           /* a in [2^exp_unb, 2^(exp_unb+1)) */
    if (a == 0.0f) return sign;
    float step = exp_unb < -6 ? ldexpf(1.0f, -9) : ldexpf(1.0f, exp_unb - 3);
    float k = a / step;            /* exact: division by a power of two */
    float r = rintf(k);            /* round half to even (default rounding mode) */
    float v = r * step;
    /* v may have bumped into the next binade; re-encode from the value */
    if (v == 0.0f) return sign;
    int ee;
    frexpf(v, &ee);
    int eu = ee - 1;
    if (eu < -6) return sign | (uint8_t)(int)(v / ldexpf(1.0f, -9));
    int mant = (int)(v / ldexpf(1.0f, eu - 3)) - 8;
    return sign | (uint8_t)((eu + 7) << 3) | (uint8_t)mant;
}

float mk_e8m0_to_f32(uint8_t b) {
    if (b == 255) return NAN;
    return ldexpf(1.0f, (int)b - 127);
}

float mk_e2m1_to_f32(uint8_t nib) { return mk_e2m1_table[nib & 15]; }

uint8_t mk_f32_to_e2m1(float f) {
    uint8_t sign = signbit(f) ? 8 : 0;
    float a = fabsf(f);
    if (isnan(f)) return sign | 7; /* no NaN in e2m1; never produced by the quantizer */
    /* grid 0 .5 1 1.5 2 3 4 6; midpoints with ties to the even code (even mantissa bit) */
    uint8_t c;
    if (a < 0.25f) c = 0;
    else if (a == 0.25f) c = 0;        /* tie 0 / 0.5 -> 0 (even) */
    else if (a < 0.75f) c = 1;
    else if (a == 0.75f) c = 2;        /* tie .5 / 1 -> 1.0 (code 2, even) */
    else if (a < 1.25f) c = 2;
    else if (a == 1.25f) c = 2;        /* tie 1 / 1.5 -> 1.0 (even) */
    else if (a < 1.75f) c = 3;
    else if (a == 1.75f) c = 4;        /* tie 1.5 / 2 -> 2.0 */
    else if (a < 2.5f) c = 4;
    else if (a == 2.5f) c = 4;         /* tie 2 / 3 -> 2.0 */
    else if (a < 3.5f) c = 5;
    else if (a == 3.5f) c = 6;         /* tie 3 / 4 -> 4.0 */
    else if (a < 5.0f) c = 6;
    else if (a == 5.0f) c = 6;         /* tie 4 / 6 -> 4.0 */
    else c = 7;
    return sign | c;
}

void mk_num_init(void) {
    for (int i = 0; i < 256; i++) mk_e4m3_table[i] = mk_e4m3_to_f32((uint8_t)i);
}

float mk_pow2_ceil(float x) {
    uint32_t u = mk_f32_bits(x);
    int e = (int)((u >> 23) & 0xff) - 127;
    if ((u & 0x7fffffu) != 0) e += 1;
    return ldexpf(1.0f, e);
}

float mk_act_quant_block(const float *x, int n, float *q) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    amax = fmaxf(amax, 1e-4f);
    float s = mk_pow2_ceil(amax * (1.0f / 448.0f));
    for (int i = 0; i < n; i++) {
        float v = x[i] / s;
        v = fminf(fmaxf(v, -448.0f), 448.0f);
        q[i] = mk_e4m3_to_f32(mk_f32_to_e4m3(v)); /* not mk_e4m3_table: may run before init */
    }
    return s;
}

float mk_fp4_quant_block(const float *x, int n, float *q) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    amax = fmaxf(amax, 6.0f * ldexpf(1.0f, -126));
    float s = mk_pow2_ceil(amax / 6.0f);
    for (int i = 0; i < n; i++) {
        float v = x[i] / s;
        v = fminf(fmaxf(v, -6.0f), 6.0f);
        q[i] = mk_e2m1_table[mk_f32_to_e2m1(v)];
    }
    return s;
}

/* The block quantizers read all of x before writing q[i] from x[i] alone, so q may alias x:
 * the sims quantize in place and need no scratch buffer (any block width works). */
void mk_act_quant_sim(float *x, int n, int block) {
    for (int b = 0; b < n; b += block) {
        int m = n - b < block ? n - b : block;
        float s = mk_act_quant_block(x + b, m, x + b);
        for (int i = 0; i < m; i++) x[b + i] = mk_bf16r(x[b + i] * s);
    }
}

void mk_fp4_quant_sim(float *x, int n, int block) {
    for (int b = 0; b < n; b += block) {
        int m = n - b < block ? n - b : block;
        float s = mk_fp4_quant_block(x + b, m, x + b);
        for (int i = 0; i < m; i++) x[b + i] = mk_bf16r(x[b + i] * s);
    }
}
