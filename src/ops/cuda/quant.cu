/* quant.cu — activation preparation for the linear kernels: the reference's FP8 act_quant per
 * 128-wide block (bit-exact twin of mk_act_quant_block), fp32 -> bf16 conversion for the bf16
 * tensor-core path, and an in-place bf16 rounding of outputs.
 *
 * act_quant: amax = max(max|x|, 1e-4); s = 2^ceil(log2(amax * (1/448))) from the fp32 bits;
 * q = e4m3_rn(clamp(x / s, -448, 448)). One warp per (row, block), four values per lane; the
 * e4m3 rounding is the hardware's cvt.rn.satfinite (round to nearest even, like torch's cast and
 * mk_f32_to_e4m3; inputs are already clamped, so saturation never triggers). The FP4 GEMV wants
 * each 8-element chunk as (0,2,4,6,1,3,5,7) — the order in which it widens packed nibbles — so
 * with perm = 1 the bytes are stored in that order. f16_prep feeds the FP8_DQ GEMV (f16 tensor
 * cores): activations as f16 times a power-of-two scale per 128-block.
 * These kernels signal programmatic dependent launch at their start, so the GEMV that follows
 * can begin streaming weights while they run (it waits for them before reading activations).
 */
#include "ops/cuda/cuda_common.cuh"

/* Block b of row r quantized by one warp; lane holds elements lane*4 .. lane*4+3 of it in v (0
 * past w). */
__device__ __forceinline__ void act_quant_block(const float (&v)[4], int w, int lane, int r, int b, int k, int nb,
                                                int perm, uint8_t *__restrict__ q, float *__restrict__ sa) {
    const int base = b * 128;
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) amax = fmaxf(amax, fabsf(v[j]));
    const float s = mk_d_act_scale(mk_d_warp_max(amax));
    uint8_t *qr = q + (size_t)r * k + base;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int i = lane * 4 + j;
        if (i >= w) continue;
        qr[mk_d_act_pos(i, perm)] = mk_d_act_byte(v[j], s);
    }
    if (lane == 0) sa[(size_t)r * nb + b] = s;
}

__global__ void k_act_quant(const float *__restrict__ x, int m, int k, int perm,
                            uint8_t *__restrict__ q, float *__restrict__ sa) {
    MK_PDL_ENTER(); /* the GEMV after this may start streaming its weights */
    int warp = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
    int lane = threadIdx.x & 31;
    int nb = (k + 127) >> 7;
    if (warp >= m * nb) return;
    int r = warp / nb, b = warp - r * nb;
    int base = b * 128, w = min(128, k - base);
    const float *xr = x + (size_t)r * k + base;
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int i = lane * 4 + j;
        v[j] = i < w ? xr[i] : 0.0f;
    }
    act_quant_block(v, w, lane, r, b, k, nb, perm, q, sa);
}

/* SwiGLU (k_swiglu; with sw, k_moe_swiglu: inputs rounded to bf16, times the slot weight sw[r])
 * of row r's block b, then act_quant of it: the bits of the two kernels in a row, in one. */
__device__ __forceinline__ void swiglu_quant_warp(const float *__restrict__ g, const float *__restrict__ u,
                                                  const float *__restrict__ sw, int k, float lim, int perm,
                                                  float *__restrict__ out, uint8_t *__restrict__ q,
                                                  float *__restrict__ sa, int warp, int lane) {
    int nb = (k + 127) >> 7;
    int r = warp / nb, b = warp - r * nb;
    int base = b * 128, w = min(128, k - base);
    const size_t o = (size_t)r * k + base;
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int i = lane * 4 + j;
        v[j] = 0.0f;
        if (i < w) {
            float gg = g[o + i], uu = u[o + i];
            if (sw) gg = mk_d_bf16r(gg), uu = mk_d_bf16r(uu);
            if (lim > 0) {
                uu = uu < -lim ? -lim : uu > lim ? lim : uu;
                gg = gg > lim ? lim : gg;
            }
            float a = __fmul_rn(__fdiv_rn(gg, __fadd_rn(1.0f, expf(-gg))), uu);
            v[j] = sw ? mk_d_bf16r(__fmul_rn(sw[r], a)) : mk_d_bf16r(a);
            if (out) out[o + i] = v[j];
        }
    }
    act_quant_block(v, w, lane, r, b, k, nb, perm, q, sa);
}

__global__ void k_swiglu_quant(const float *__restrict__ g, const float *__restrict__ u,
                               const float *__restrict__ sw, int m, int k, float lim, int perm,
                               float *__restrict__ out, uint8_t *__restrict__ q, float *__restrict__ sa) {
    mk_d_pdl_launch_dependents();
    int warp = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
    if (warp >= m * ((k + 127) >> 7)) return;
    swiglu_quant_warp(g, u, sw, k, lim, perm, out, q, sa, warp, threadIdx.x & 31);
}

extern "C" int mk_cuda_swiglu_quant(mk_cuda_ctx *ctx, const float *g, const float *u, const float *sw, int m, int k,
                                    float lim, int perm, float *out, uint8_t *q, float *sa, mk_err *err) {
    if (m <= 0 || k <= 0) return MK_OK;
    if (perm && k % 8) return mk_fail(err, MK_EINVAL, "cuda: swiglu_quant: permuted layout needs k %% 8 == 0 (k = %d)", k);
    size_t warps = (size_t)m * ((k + 127) / 128);
    k_swiglu_quant<<<(unsigned)((warps + 7) / 8), 256, 0, ctx->stream>>>(g, u, sw, m, k, lim, perm, out, q, sa);
    MK_CU_LAUNCHED(err, "cuda: swiglu_quant launch");
    return MK_OK;
}

/* Two swiglu_quant jobs in one launch: job 0's warps, then job 1's. */
__global__ void k_swiglu_quant2(const mk_cuda_swiglu_job j0, const mk_cuda_swiglu_job j1, float lim) {
    mk_d_pdl_launch_dependents();
    int warp = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
    const int w0 = j0.m * ((j0.k + 127) >> 7);
    const mk_cuda_swiglu_job &j = warp < w0 ? j0 : j1;
    if (warp >= w0) warp -= w0;
    if (warp >= j.m * ((j.k + 127) >> 7)) return;
    swiglu_quant_warp(j.g, j.u, j.sw, j.k, lim, j.perm, j.out, j.q, j.sa, warp, threadIdx.x & 31);
}

extern "C" int mk_cuda_swiglu_quant2(mk_cuda_ctx *ctx, const mk_cuda_swiglu_job *j0, const mk_cuda_swiglu_job *j1,
                                     float lim, mk_err *err) {
    const mk_cuda_swiglu_job *j[2] = {j0, j1};
    size_t warps = 0;
    for (int i = 0; i < 2; i++) {
        if (j[i]->m < 0 || j[i]->k <= 0 || (j[i]->perm && j[i]->k % 8))
            return mk_fail(err, MK_EINVAL, "cuda: swiglu_quant2: job %d: m %d, k %d, perm %d (k %% 8 == 0 when permuted)", i,
                           j[i]->m, j[i]->k, j[i]->perm);
        warps += (size_t)j[i]->m * ((j[i]->k + 127) / 128);
    }
    if (!ctx->tune.swiglu_pair) { /* two launches */
        int st = mk_cuda_swiglu_quant(ctx, j0->g, j0->u, j0->sw, j0->m, j0->k, lim, j0->perm, j0->out, j0->q, j0->sa, err);
        return st ? st : mk_cuda_swiglu_quant(ctx, j1->g, j1->u, j1->sw, j1->m, j1->k, lim, j1->perm, j1->out, j1->q, j1->sa, err);
    }
    if (!warps) return MK_OK;
    k_swiglu_quant2<<<(unsigned)((warps + 7) / 8), 256, 0, ctx->stream>>>(*j0, *j1, lim);
    MK_CU_LAUNCHED(err, "cuda: swiglu_quant2 launch");
    return MK_OK;
}

__global__ void k_to_bf16(const float *__restrict__ x, size_t n, __nv_bfloat16 *__restrict__ y) {
    MK_PDL_ENTER(); /* launched with programmatic dependent launch: nothing is touched before */
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}

/* One warp per (row, 128-block): mk_d_f16_prep_warp (cuda_common.cuh). */
__global__ void k_f16_prep(float *__restrict__ x, int m, int k, __half *__restrict__ xh, float *__restrict__ sx,
                           const mk_f16_rope ro) {
    MK_PDL_ENTER(); /* launched with programmatic dependent launch: nothing is touched before */
    int warp = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
    int lane = threadIdx.x & 31;
    int nb = (k + 127) >> 7;
    if (warp >= m * nb) return;
    int r = warp / nb, b = warp - r * nb;
    int base = b * 128, w = min(128, k - base);
    float *xr = x + (size_t)r * k + base;
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int i = lane * 4 + j;
        v[j] = i < w ? xr[i] : 0.0f;
    }
    mk_d_f16_prep_warp(v, xr, r, k, b, lane, xh, sx, ro);
}

__global__ void k_round_bf16(float *__restrict__ y, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = mk_d_bf16r(y[i]);
}

static unsigned grid_for(size_t n, int threads) {
    size_t b = (n + threads - 1) / threads;
    if (b > 65535u * 8) b = 65535u * 8;
    return (unsigned)(b ? b : 1);
}

static int act_quant_launch(mk_cuda_ctx *ctx, int pdl, const float *x, int m, int k, int perm, uint8_t *q, float *sa,
                            mk_err *err) {
    if (m <= 0 || k <= 0) return MK_OK;
    if (perm && k % 8) return mk_fail(err, MK_EINVAL, "cuda: act_quant: permuted layout needs k %% 8 == 0 (k = %d)", k);
    size_t warps = (size_t)m * ((k + 127) / 128);
    unsigned blocks = (unsigned)((warps + 7) / 8);
    if (pdl) (void)mk_cuda_launch_pdl(ctx, blocks, 256, 0, k_act_quant, x, m, k, perm, q, sa);
    else k_act_quant<<<blocks, 256, 0, ctx->stream>>>(x, m, k, perm, q, sa);
    MK_CU_LAUNCHED(err, "cuda: act_quant launch");
    return MK_OK;
}

int mk_cuda_quant_launch(mk_cuda_ctx *ctx, const float *x, int m, int k, int perm, uint8_t *q,
                         float *sa, mk_err *err) {
    return act_quant_launch(ctx, 1, x, m, k, perm, q, sa, err);
}

int mk_cuda_f16_prep_launch(mk_cuda_ctx *ctx, const float *x, int m, int k, uint16_t *xh, float *sx,
                            mk_err *err) {
    if (m <= 0 || k <= 0) return MK_OK;
    size_t warps = (size_t)m * ((k + 127) / 128);
    (void)mk_cuda_launch_pdl(ctx, (unsigned)((warps + 7) / 8), 256, 0, k_f16_prep, (float *)x, m, k, (__half *)xh, sx,
                             mk_f16_rope{});
    MK_CU_LAUNCHED(err, "cuda: f16_prep launch");
    return MK_OK;
}

int mk_cuda_f16_prep_rope_launch(mk_cuda_ctx *ctx, float *x, int m, int k, const mk_cuda_rope_at_desc *rd,
                                 uint16_t *xh, float *sx, mk_err *err) {
    if (m <= 0 || k <= 0) return MK_OK;
    mk_f16_rope ro = {};
    const int st = mk_f16_rope_of(rd, k, &ro, err);
    if (st) return st;
    size_t warps = (size_t)m * ((k + 127) / 128);
    (void)mk_cuda_launch_pdl(ctx, (unsigned)((warps + 7) / 8), 256, 0, k_f16_prep, x, m, k, (__half *)xh, sx, ro);
    MK_CU_LAUNCHED(err, "cuda: f16_prep (with rope) launch");
    return MK_OK;
}

int mk_cuda_to_bf16_launch(mk_cuda_ctx *ctx, const float *x, size_t n, uint16_t *y, mk_err *err) {
    if (!n) return MK_OK;
    (void)mk_cuda_launch_pdl(ctx, grid_for(n, 256), 256, 0, k_to_bf16, x, n, (__nv_bfloat16 *)y);
    MK_CU_LAUNCHED(err, "cuda: to_bf16 launch");
    return MK_OK;
}

int mk_cuda_round_bf16_launch(mk_cuda_ctx *ctx, float *y, size_t n, mk_err *err) {
    if (!n) return MK_OK;
    k_round_bf16<<<grid_for(n, 256), 256, 0, ctx->stream>>>(y, n);
    MK_CU_LAUNCHED(err, "cuda: round_bf16 launch");
    return MK_OK;
}

/* The public op is launched without programmatic dependent launch: the routed experts' GEMV that
 * follows it reads its plan (written two kernels before) before waiting, which is safe only if
 * this kernel started after the plan was complete. */
extern "C" int mk_cuda_act_quant(mk_cuda_ctx *ctx, const float *x, int m, int k, int perm,
                                 uint8_t *q, float *sa, mk_err *err) {
    return act_quant_launch(ctx, 0, x, m, k, perm, q, sa, err);
}
