/* gemm_ref.c — the scalar reference of mk_linear (ops.h): clear loops, the reference's exact
 * quantization and accumulation structure (per-block exact dot, then scaled into an fp32 sum).
 * The fast path in gemm.c is tested against this. */
#include "num/formats.h"
#include "ops/ops.h"

#include <math.h>

size_t mk_wmat_bytes(const mk_wmat *W) {
    size_t nk = (size_t)W->n * (size_t)W->k;
    switch (W->kind) {
    case MK_W_BF16: return nk * 2;
    case MK_W_F32: return nk * 4;
    case MK_W_FP8:
    case MK_W_FP8_DQ: return nk + (size_t)((W->n + 127) / 128) * (size_t)((W->k + 127) / 128);
    case MK_W_FP4: return nk / 2 + (size_t)W->n * (size_t)(W->k / 32);
    }
    return 0;
}

size_t mk_linear_scratch(int m, int k) {
    /* quantized activations [m, k] + one scale per 128-block [m, ceil(k/128)] */
    return (size_t)m * (size_t)k + (size_t)m * (size_t)((k + 127) / 128) + 64;
}

/* Quantize m rows of x into xq (e4m3 values) and sa (scales), per 128-wide block. */
void mk_linear_quant_rows(const float *x, int m, int k, float *xq, float *sa) {
    int nb = (k + 127) / 128;
    for (int r = 0; r < m; r++)
        for (int b = 0; b < nb; b++) {
            int w = k - b * 128 < 128 ? k - b * 128 : 128;
            sa[(size_t)r * nb + b] =
                mk_act_quant_block(x + (size_t)r * k + b * 128, w, xq + (size_t)r * k + b * 128);
        }
}

void mk_linear_ref(const mk_wmat *W, const float *x, int m, float *y, int round_bf16,
                   float *scratch) {
    int n = W->n, k = W->k;
    int nb = (k + 127) / 128;
    float *xq = scratch, *sa = scratch + (size_t)m * k;
    if (W->kind == MK_W_FP8 || W->kind == MK_W_FP4) mk_linear_quant_rows(x, m, k, xq, sa);
    for (int r = 0; r < m; r++) {
        const float *xr = x + (size_t)r * k;
        const float *qr = xq + (size_t)r * k;
        for (int j = 0; j < n; j++) {
            float acc = 0.0f;
            switch (W->kind) {
            case MK_W_BF16: {
                const uint16_t *wr = (const uint16_t *)W->w + (size_t)j * k;
                for (int i = 0; i < k; i++) acc += xr[i] * mk_bf16_to_f32(wr[i]);
                break;
            }
            case MK_W_F32: {
                const float *wr = (const float *)W->w + (size_t)j * k;
                for (int i = 0; i < k; i++) acc += xr[i] * wr[i];
                break;
            }
            case MK_W_FP8: {
                const uint8_t *wr = (const uint8_t *)W->w + (size_t)j * k;
                const uint8_t *sr = W->scale + (size_t)(j / 128) * nb;
                for (int b = 0; b < nb; b++) {
                    float part = 0.0f;
                    int e = (b + 1) * 128 < k ? (b + 1) * 128 : k;
                    for (int i = b * 128; i < e; i++) part += qr[i] * mk_e4m3_table[wr[i]];
                    acc += part * sa[(size_t)r * nb + b] * mk_e8m0_to_f32(sr[b]);
                }
                break;
            }
            case MK_W_FP8_DQ: {
                const uint8_t *wr = (const uint8_t *)W->w + (size_t)j * k;
                const uint8_t *sr = W->scale + (size_t)(j / 128) * nb;
                for (int b = 0; b < nb; b++) {
                    float sb = mk_e8m0_to_f32(sr[b]);
                    int e = (b + 1) * 128 < k ? (b + 1) * 128 : k;
                    for (int i = b * 128; i < e; i++) acc += xr[i] * (mk_e4m3_table[wr[i]] * sb);
                }
                break;
            }
            case MK_W_FP4: {
                const uint8_t *wr = (const uint8_t *)W->w + (size_t)j * (k / 2);
                const uint8_t *sr = W->scale + (size_t)j * (k / 32);
                for (int b = 0; b < k / 32; b++) {
                    float part = 0.0f;
                    for (int i = b * 32; i < b * 32 + 32; i++) {
                        uint8_t byte = wr[i / 2];
                        part += qr[i] * mk_e2m1_table[(i & 1) ? byte >> 4 : byte & 15];
                    }
                    acc += part * sa[(size_t)r * nb + b / 4] * mk_e8m0_to_f32(sr[b]);
                }
                break;
            }
            }
            y[(size_t)r * n + j] = round_bf16 ? mk_bf16r(acc) : acc;
        }
    }
}
