/* dsv4k.cu — small model-level kernels of the DeepSeek-V4 GPU forward (src/models/dsv4_cuda.c):
 * embedding gather, the reference's QAT simulations (FP8 act_quant_sim, FP4 fp4_quant_sim) on
 * strided rows, the per-head bf16 RMS normalisation of q, RoPE with a position step (compressed
 * entries), compressor softmax pooling, bf16 scaling, ape addition, SwiGLU, the gathering of the
 * sparse-attention row lists from the window ring and the compressed cache, and device copies.
 *
 * Numerics follow the CPU code of src/models/dsv4.c and src/num/formats.c: the quantization sims
 * are bit-exact (same fp32 operations, the hardware's round-to-nearest-even e4m3 conversion, the
 * e2m1 grid with ties to the even code), RoPE is the basic.cu rotation; the pooling and the q
 * normalisation sum in another order (fp32), with expf, within an ulp of the CPU.
 */
#include "ops/cuda/cuda_common.cuh"

#include <math.h>

/* ---- embedding ------------------------------------------------------------------------------ */

/* Block (t, c): elements [256 c, 256 c + 256) of token t's embedding row into its hc streams, a
 * thread per element (one block per token walked the row serially: 10.5 us of a batch-1 step). */
#define EMBED_T 256
__global__ void __launch_bounds__(EMBED_T) k_embed_hc(const uint16_t *__restrict__ emb, int32_t *tok,
                                                      const int32_t *__restrict__ fsrc, const int32_t *__restrict__ am,
                                                      int hc, int d, int vocab, float *__restrict__ h) {
    MK_PDL_ENTER(); /* launched with programmatic dependent launch: nothing is touched before */
    const int t = blockIdx.x, i = blockIdx.y * EMBED_T + threadIdx.x;
    int id;
    const int s = fsrc ? fsrc[t] : -1;
    if (s >= 0) { /* fed: the previous step's pick, written back for the kernels after (hash routing) */
        id = am[s];
        if (id < 0 || id >= vocab) id = 0;
        if (blockIdx.y == 0 && threadIdx.x == 0) tok[t] = id;
    } else {
        id = tok[t];
        if (id < 0 || id >= vocab) id = 0;
    }
    if (i >= d) return;
    const float v = mk_d_bf16(emb[(size_t)id * d + i]);
    for (int j = 0; j < hc; j++) h[((size_t)t * hc + j) * d + i] = v;
}

extern "C" int mk_cuda_embed_hc_fed(mk_cuda_ctx *ctx, const uint16_t *embed, int vocab, int32_t *tok,
                                    const int32_t *fsrc, const int32_t *am, int T, int hc, int d, float *h,
                                    mk_err *err) {
    if (T <= 0) return MK_OK;
    if (d < 1 || (d + EMBED_T - 1) / EMBED_T > 65535) return mk_fail(err, MK_EINVAL, "cuda: embed: rows of %d values", d);
    if (fsrc && !am) return mk_fail(err, MK_EINVAL, "cuda: embed: fed rows without the picks");
    (void)mk_cuda_launch_pdl(ctx, dim3((unsigned)T, (unsigned)((d + EMBED_T - 1) / EMBED_T)), EMBED_T, 0, k_embed_hc,
                             embed, tok, fsrc, am, hc, d, vocab, h);
    MK_CU_LAUNCHED(err, "cuda: embed launch");
    return MK_OK;
}

extern "C" int mk_cuda_embed_hc(mk_cuda_ctx *ctx, const uint16_t *embed, int vocab,
                                const int32_t *tok, int T, int hc, int d, float *h, mk_err *err) {
    /* tok is only read without fsrc */
    return mk_cuda_embed_hc_fed(ctx, embed, vocab, (int32_t *)tok, NULL, NULL, T, hc, d, h, err);
}

/* ---- quantization simulations --------------------------------------------------------------- */

__device__ __forceinline__ float d_e2m1_round(float a) { /* |v| on the e2m1 grid, ties to even */
    if (a <= 0.25f) return 0.0f;
    if (a < 0.75f) return 0.5f;
    if (a <= 1.25f) return 1.0f;
    if (a < 1.75f) return 1.5f;
    if (a <= 2.5f) return 2.0f;
    if (a < 3.5f) return 3.0f;
    if (a <= 5.0f) return 4.0f;
    return 6.0f;
}

/* Block b (of `block` values, <= 128) of the row at x / y, by one warp. */
__device__ __forceinline__ void quant_sim_block(const float *__restrict__ x, float *__restrict__ y, int n, int block,
                                                int b, int fp4, int lane) {
    int base = b * block, w = min(block, n - base);
    const float *xr = x + base;
    float *yr = y + base;
    float v[4], amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int i = lane + 32 * j;
        v[j] = i < w ? xr[i] : 0.0f;
        amax = fmaxf(amax, fabsf(v[j]));
    }
    amax = mk_d_warp_max(amax);
    float s;
    if (fp4) {
        amax = fmaxf(amax, 6.0f * 1.17549435e-38f);
        s = mk_d_pow2_ceil(__fdiv_rn(amax, 6.0f));
    } else {
        amax = fmaxf(amax, 1e-4f);
        s = mk_d_pow2_ceil(__fmul_rn(amax, 1.0f / 448.0f));
    }
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int i = lane + 32 * j;
        if (i >= w) continue;
        float q = __fdiv_rn(v[j], s), o;
        if (fp4) {
            q = fminf(fmaxf(q, -6.0f), 6.0f);
            float a = d_e2m1_round(fabsf(q));
            o = signbit(q) ? -a : a;
        } else {
            q = fminf(fmaxf(q, -448.0f), 448.0f);
            __nv_fp8_storage_t b8 = __nv_cvt_float_to_fp8(q, __NV_SATFINITE, __NV_E4M3);
            o = mk_d_e4m3((uint32_t)b8);
        }
        yr[i] = mk_d_bf16r(__fmul_rn(o, s));
    }
}

/* The indexer's queries: per vector of n (a power of two, <= 1024; one block of max(n, 32)
 * threads), mk_cuda_rope_at of its last rd values (vecs_per_pos vectors per position, pos[v /
 * vecs_per_pos]), mk_cuda_hadamard(scale), then mk_cuda_quant_sim(block 32, FP4), in shared
 * memory: each step's arithmetic per element as its kernel's (the butterflies' outputs do not
 * depend on which thread computes them), the same bits in one launch. */
__device__ __forceinline__ void idx_q_prep_vec(float *__restrict__ xr, float *hq, int v, int n, int rd,
                                               const float *__restrict__ cs, int tab_half, int max_pos,
                                               const int32_t *__restrict__ pos, int vpp, float scale) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) hq[i] = xr[i];
    __syncthreads();
    const int p = pos[v / vpp];
    if (p >= 0 && p < max_pos)
        for (int i = threadIdx.x; i < rd / 2; i += blockDim.x) mk_d_rope_pair(hq + (n - rd), cs, tab_half, p, i, 0);
    __syncthreads();
    mk_d_hadamard_smem(hq, n);
    for (int i = threadIdx.x; i < n; i += blockDim.x) hq[i] = mk_d_bf16r(__fmul_rn(hq[i], scale));
    __syncthreads();
    const int lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    for (int b = threadIdx.x >> 5; b < (n + 31) / 32; b += nw) quant_sim_block(hq, xr, n, 32, b, 1, lane);
}

__global__ void __launch_bounds__(1024) k_idx_q_prep(float *__restrict__ x, int n, int rd, const float *__restrict__ cs,
                                                     int tab_half, int max_pos, const int32_t *__restrict__ pos,
                                                     int vpp, float scale) {
    MK_PDL_ENTER(); /* launched with programmatic dependent launch: nothing is touched before */
    extern __shared__ float hq[];
    const int v = blockIdx.x;
    idx_q_prep_vec(x + (size_t)v * n, hq, v, n, rd, cs, tab_half, max_pos, pos, vpp, scale);
}

extern "C" int mk_cuda_idx_q_prep(mk_cuda_ctx *ctx, float *x, int n_vec, int n, int rd, const mk_rope_table *t,
                                  const int32_t *pos, int vecs_per_pos, float scale, mk_err *err) {
    if (n_vec <= 0) return MK_OK;
    if (!ctx->tune.norm_quant || n < 1 || n > 1024 || (n & (n - 1)) || rd <= 0 || rd % 2 || rd > n ||
        rd / 2 > t->half || vecs_per_pos <= 0 || !t->cs || !pos) { /* the three ops */
        int st = mk_cuda_rope_at(ctx, x + (n - rd), n_vec, n, rd, t, pos, vecs_per_pos, 0, err);
        if (!st) st = mk_cuda_hadamard(ctx, x, n_vec, n, scale, err);
        return st ? st : mk_cuda_quant_sim(ctx, x, n_vec, n, n, 32, 1, x, err);
    }
    (void)mk_cuda_launch_pdl(ctx, n_vec, n < 32 ? 32 : n, sizeof(float) * n, k_idx_q_prep, x, n, rd, t->cs, t->half,
                             t->max_pos, pos, vecs_per_pos, scale);
    MK_CU_LAUNCHED(err, "cuda: idx_q_prep launch");
    return MK_OK;
}

/* One warp per (row, block); block <= 128. */
__global__ void k_quant_sim(const float *__restrict__ x, int rows, int stride, int n, int block,
                            int fp4, float *__restrict__ y) {
    MK_PDL_ENTER(); /* launched with programmatic dependent launch: nothing is touched before */
    int warp = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
    int lane = threadIdx.x & 31;
    int nb = (n + block - 1) / block;
    if (warp >= rows * nb) return;
    int r = warp / nb, b = warp - r * nb;
    quant_sim_block(x + (size_t)r * stride, y + (size_t)r * stride, n, block, b, fp4, lane);
}

/* The attention's kv rows (dsv4.c): RMSNorm (weight w), RoPE of the last rd values at the row's
 * position, then the FP8 simulation of the first D - rd in blocks of 64: a block of
 * mk_cuda_rmsnorm_threads(D) threads per row, the three kernels' arithmetic in their order. */
__device__ __forceinline__ void kv_norm_rope_q_row(float *x, int D, const uint16_t *__restrict__ w, float eps, int rd,
                                                   const float *__restrict__ cs, int tab_half, int pos, int max_pos) {
    mk_d_rmsnorm_row(x, D, w, eps, x);
    __syncthreads();
    if (pos < 0 || pos >= max_pos) return; /* checked by the caller */
    for (int i = threadIdx.x; i < rd / 2; i += blockDim.x) mk_d_rope_pair(x + D - rd, cs, tab_half, pos, i, 0);
    __syncthreads();
    const int nope = D - rd, nb = (nope + 63) / 64;
    for (int b = threadIdx.x >> 5; b < nb; b += blockDim.x >> 5) quant_sim_block(x, x, nope, 64, b, 0, threadIdx.x & 31);
}

__global__ void __launch_bounds__(1024) k_kv_norm_rope_q(float *kv, int D, const uint16_t *__restrict__ w, float eps,
                                                         int rd, const float *__restrict__ cs, int tab_half,
                                                         const int32_t *__restrict__ pos_of, int max_pos) {
    mk_d_pdl_launch_dependents(); /* launched with programmatic dependent launch: only the weights */
    mk_d_l2_prefetch_block(w, (size_t)D * 2); /* are touched (prefetched) before the wait */
    mk_d_pdl_wait();
    kv_norm_rope_q_row(kv + (size_t)blockIdx.x * D, D, w, eps, rd, cs, tab_half, pos_of[blockIdx.x], max_pos);
}

extern "C" int mk_cuda_kv_norm_rope_q(mk_cuda_ctx *ctx, float *kv, int rows, int D, const uint16_t *w, float eps, int rd,
                                      const mk_rope_table *t, const int32_t *pos, mk_err *err) {
    if (rows <= 0) return MK_OK;
    if (D <= 0 || rd <= 0 || rd % 2 || rd > D || rd / 2 > t->half || !t->cs || !pos)
        return mk_fail(err, MK_EINVAL, "cuda: kv_norm_rope_q: D %d, rd %d, table half %d", D, rd, t->half);
    (void)mk_cuda_launch_pdl(ctx, rows, mk_cuda_rmsnorm_threads(D), 0, k_kv_norm_rope_q, kv, D, w, eps, rd, t->cs, t->half, pos,
                                                                           t->max_pos);
    MK_CU_LAUNCHED(err, "cuda: kv_norm_rope_q launch");
    return MK_OK;
}

extern "C" int mk_cuda_quant_sim(mk_cuda_ctx *ctx, const float *x, int rows, int stride, int n,
                                 int block, int fp4, float *y, mk_err *err) {
    if (rows <= 0 || n <= 0) return MK_OK;
    if (block <= 0 || block > 128)
        return mk_fail(err, MK_EINVAL, "cuda: quant_sim: block %d (1..128)", block);
    size_t warps = (size_t)rows * ((n + block - 1) / block);
    (void)mk_cuda_launch_pdl(ctx, (unsigned)((warps * 32 + 255) / 256), 256, 0, k_quant_sim, x, rows, stride, n,
                                                                               block, fp4, y);
    MK_CU_LAUNCHED(err, "cuda: quant_sim launch");
    return MK_OK;
}

/* ---- per-head q normalisation in bf16 arithmetic (dsv4.c q_rms_bf16) ------------------------ */

/* The vector x of D values normalized in place by one warp (dsv4.c q_rms_bf16). */
__device__ __forceinline__ void head_rms_vec(float *x, int D, float eps, int lane) {
    float ss = 0.0f;
    for (int i = lane; i < D; i += 32) ss += mk_d_bf16r(__fmul_rn(x[i], x[i]));
    ss = mk_d_warp_sum(ss);
    float mean = mk_d_bf16r(__fdiv_rn(ss, (float)D));
    float var = mk_d_bf16r(__fadd_rn(mean, eps));
    float r = mk_d_bf16r(__fdiv_rn(1.0f, sqrtf(var)));
    for (int i = lane; i < D; i += 32) x[i] = mk_d_bf16r(__fmul_rn(x[i], r));
}

__global__ void k_head_rms_bf16(float *q, int n_vec, int D, float eps) {
    int v = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
    if (v >= n_vec) return;
    head_rms_vec(q + (size_t)v * D, D, eps, threadIdx.x & 31);
}

/* k_head_rms_bf16 then RoPE of each vector's last rd values at its row's position (vecs_per_pos
 * vectors a row), by the same warp. */
__device__ __forceinline__ void head_rms_rope_vec(float *x, int v, int D, float eps, int rd, const float *__restrict__ cs,
                                                  int tab_half, const int32_t *__restrict__ pos_of, int max_pos, int vpp,
                                                  int lane) {
    head_rms_vec(x, D, eps, lane);
    __syncwarp();
    const int pos = pos_of[v / vpp];
    if (pos < 0 || pos >= max_pos) return; /* checked by the caller */
    for (int i = lane; i < rd / 2; i += 32) mk_d_rope_pair(x + D - rd, cs, tab_half, pos, i, 0);
}

__global__ void k_head_rms_rope(float *q, int n_vec, int D, float eps, int rd, const float *__restrict__ cs,
                                int tab_half, const int32_t *__restrict__ pos_of, int max_pos, int vpp) {
    MK_PDL_ENTER(); /* launched with programmatic dependent launch: nothing is touched before */
    int v = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
    if (v >= n_vec) return;
    head_rms_rope_vec(q + (size_t)v * D, v, D, eps, rd, cs, tab_half, pos_of, max_pos, vpp, threadIdx.x & 31);
}

extern "C" int mk_cuda_head_rms_rope(mk_cuda_ctx *ctx, float *q, int n_vec, int D, float eps, int rd,
                                     const mk_rope_table *t, const int32_t *pos, int vecs_per_pos, mk_err *err) {
    if (n_vec <= 0) return MK_OK;
    if (D <= 0 || rd <= 0 || rd % 2 || rd > D || rd / 2 > t->half || vecs_per_pos <= 0 || !t->cs || !pos)
        return mk_fail(err, MK_EINVAL, "cuda: head_rms_rope: D %d, rd %d, table half %d", D, rd, t->half);
    (void)mk_cuda_launch_pdl(ctx, (unsigned)(((size_t)n_vec * 32 + 255) / 256), 256, 0, k_head_rms_rope, q, n_vec, D, eps, rd, t->cs,
                                                                                         t->half, pos, t->max_pos,
                                                                                         vecs_per_pos);
    MK_CU_LAUNCHED(err, "cuda: head_rms_rope launch");
    return MK_OK;
}

extern "C" int mk_cuda_head_rms_bf16(mk_cuda_ctx *ctx, float *q, int n_vec, int D, float eps,
                                     mk_err *err) {
    if (n_vec <= 0) return MK_OK;
    k_head_rms_bf16<<<(unsigned)(((size_t)n_vec * 32 + 255) / 256), 256, 0, ctx->stream>>>(q, n_vec, D, eps);
    MK_CU_LAUNCHED(err, "cuda: head_rms launch");
    return MK_OK;
}

/* ---- RoPE with a position step: vector v at position pos0 + v * step ----------------------- */

__global__ void k_rope_step(float *x, int n_vec, int stride, int half, const float *__restrict__ cs,
                            int tab_half, int pos0, int step, int inverse) {
    size_t id = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (id >= (size_t)n_vec * half) return;
    int v = (int)(id / half), i = (int)(id - (size_t)v * half);
    int pos = pos0 + v * step;
    const float *c2 = cs + ((size_t)pos * tab_half + i) * 2;
    float c = c2[0], s = inverse ? -c2[1] : c2[1];
    float *p = x + (size_t)v * stride + 2 * i;
    float a = p[0], b = p[1];
    p[0] = mk_d_bf16r(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
    p[1] = mk_d_bf16r(__fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c)));
}

extern "C" int mk_cuda_rope_step(mk_cuda_ctx *ctx, float *x, int n_vec, int stride, int rd,
                                 const mk_rope_table *t, int pos0, int step, int inverse,
                                 mk_err *err) {
    if (n_vec <= 0) return MK_OK;
    int last = pos0 + (n_vec - 1) * step;
    if (rd <= 0 || rd % 2 || rd / 2 > t->half || pos0 < 0 || last >= t->max_pos || !t->cs)
        return mk_fail(err, MK_ERANGE, "cuda: rope_step: rd %d, positions %d..%d, table %d", rd, pos0,
                       last, t->max_pos);
    size_t n = (size_t)n_vec * (rd / 2);
    k_rope_step<<<(unsigned)((n + 255) / 256), 256, 0, ctx->stream>>>(x, n_vec, stride, rd / 2, t->cs,
                                                                        t->half, pos0, step, inverse);
    MK_CU_LAUNCHED(err, "cuda: rope_step launch");
    return MK_OK;
}

/* ---- the attention's row preparation in one launch ------------------------------------------ */

/* mk_cuda_attn_prep: blocks [0, nqb) normalize and rotate the q vectors (a warp each, as
 * k_head_rms_rope), the next R blocks the kv rows (a block each, as k_kv_norm_rope_q: blockDim.x
 * is mk_cuda_rmsnorm_threads(D), which its norm's bits need), the last niq blocks the indexer's
 * query vectors (a block each, as k_idx_q_prep, whose bits do not depend on the block's size). */
__global__ void __launch_bounds__(1024) k_attn_prep(float *q, int nq, int qvpp, int D, float eps, float *kv,
                                                    const uint16_t *__restrict__ w, int R, float *iq, int niq,
                                                    int ivpp, int ID, float iscale, int rd,
                                                    const float *__restrict__ cs, int tab_half,
                                                    const int32_t *__restrict__ pos, int max_pos) {
    extern __shared__ float hq[];
    const int vpb = blockDim.x >> 5, nqb = (nq + vpb - 1) / vpb, b = blockIdx.x;
    mk_d_pdl_launch_dependents(); /* launched with programmatic dependent launch: only the kv norm's */
    if (b >= nqb && b < nqb + R) mk_d_l2_prefetch_block(w, (size_t)D * 2); /* weights before the wait */
    mk_d_pdl_wait();
    if (b < nqb) {
        const int v = b * vpb + (threadIdx.x >> 5);
        if (v < nq) head_rms_rope_vec(q + (size_t)v * D, v, D, eps, rd, cs, tab_half, pos, max_pos, qvpp, threadIdx.x & 31);
    } else if (b < nqb + R) {
        kv_norm_rope_q_row(kv + (size_t)(b - nqb) * D, D, w, eps, rd, cs, tab_half, pos[b - nqb], max_pos);
    } else {
        const int v = b - nqb - R;
        if (v < niq) idx_q_prep_vec(iq + (size_t)v * ID, hq, v, ID, rd, cs, tab_half, max_pos, pos, ivpp, iscale);
    }
}

extern "C" int mk_cuda_attn_prep(mk_cuda_ctx *ctx, int R, float *q, int H, int D, float eps, float *kv,
                                 const uint16_t *kv_w, int rd, const mk_rope_table *t, const int32_t *pos, float *iq,
                                 int IH, int ID, float iscale, mk_err *err) {
    if (R <= 0) return MK_OK;
    const int th = mk_cuda_rmsnorm_threads(D);
    const int with_iq = iq && IH > 0;
    if (!ctx->tune.attn_prep || D <= 0 || rd <= 0 || rd % 2 || rd > D || rd / 2 > t->half || !t->cs || !pos || H <= 0 ||
        (with_iq && (ID < 1 || ID > 1024 || (ID & (ID - 1)) || rd > ID)) ||
        (size_t)R * H + (size_t)R * (with_iq ? IH : 0) + (size_t)R > 0x7fffffffu) { /* the separate ops */
        int st = mk_cuda_head_rms_rope(ctx, q, R * H, D, eps, rd, t, pos, H, err);
        if (!st) st = mk_cuda_kv_norm_rope_q(ctx, kv, R, D, kv_w, eps, rd, t, pos, err);
        if (!st && with_iq) st = mk_cuda_idx_q_prep(ctx, iq, R * IH, ID, rd, t, pos, IH, iscale, err);
        return st;
    }
    const int vpb = th / 32, nq = R * H, nqb = (nq + vpb - 1) / vpb, niq = with_iq ? R * IH : 0;
    (void)mk_cuda_launch_pdl(ctx, (unsigned)(nqb + R + niq), th, with_iq ? sizeof(float) * ID : 0, k_attn_prep, q, nq, H,
                             D, eps, kv, kv_w, R, iq, niq, with_iq ? IH : 1, with_iq ? ID : 0, iscale, rd, t->cs,
                             t->half, pos, t->max_pos);
    MK_CU_LAUNCHED(err, "cuda: attn_prep launch");
    return MK_OK;
}

/* ---- elementwise ----------------------------------------------------------------------------- */

__global__ void k_scale_bf16(float *x, size_t n, float s) {
    MK_PDL_ENTER(); /* launched with programmatic dependent launch: nothing is touched before */
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] = mk_d_bf16r(__fmul_rn(x[i], s));
}

extern "C" int mk_cuda_scale_bf16(mk_cuda_ctx *ctx, float *x, size_t n, float s, mk_err *err) {
    if (!n) return MK_OK;
    (void)mk_cuda_launch_pdl(ctx, (unsigned)((n + 255) / 256), 256, 0, k_scale_bf16, x, n, s);
    MK_CU_LAUNCHED(err, "cuda: scale_bf16 launch");
    return MK_OK;
}

/* x[t, :] += ape[(pos0 + t) % r, :] for t < T, rows of w. */
__global__ void k_add_ape(float *x, int T, int w, const float *__restrict__ ape, int r, int pos0) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)T * w) return;
    int t = (int)(i / w), c = (int)(i - (size_t)t * w);
    x[i] = __fadd_rn(x[i], ape[(size_t)((pos0 + t) % r) * w + c]);
}

extern "C" int mk_cuda_add_ape(mk_cuda_ctx *ctx, float *x, int T, int w, const float *ape, int r,
                               int pos0, mk_err *err) {
    if (T <= 0) return MK_OK;
    size_t n = (size_t)T * w;
    k_add_ape<<<(unsigned)((n + 255) / 256), 256, 0, ctx->stream>>>(x, T, w, ape, r, pos0);
    MK_CU_LAUNCHED(err, "cuda: add_ape launch");
    return MK_OK;
}

/* a = bf16(silu(clamp g) * clamp u) (dsv4.c expert(), no routing weight). g may alias out. */
__global__ void k_swiglu(const float *g, const float *u, size_t n, float lim, float *out) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float gg = g[i], uu = u[i];
    if (lim > 0) {
        uu = uu < -lim ? -lim : uu > lim ? lim : uu;
        gg = gg > lim ? lim : gg;
    }
    float a = __fmul_rn(__fdiv_rn(gg, __fadd_rn(1.0f, expf(-gg))), uu);
    out[i] = mk_d_bf16r(a);
}

extern "C" int mk_cuda_swiglu(mk_cuda_ctx *ctx, const float *g, const float *u, size_t n, float lim,
                              float *out, mk_err *err) {
    if (!n) return MK_OK;
    k_swiglu<<<(unsigned)((n + 255) / 256), 256, 0, ctx->stream>>>(g, u, n, lim, out);
    MK_CU_LAUNCHED(err, "cuda: swiglu launch");
    return MK_OK;
}

/* out[i] = bf16(a[i] + b[i % bn]) (the MTP input: e_proj broadcast over the hc copies). */
__global__ void k_add_bcast_bf16(const float *a, const float *b, size_t n, size_t d, int rep,
                                 float *out) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    size_t row = i / d, c = i - row * d;
    out[i] = mk_d_bf16r(__fadd_rn(b[(row / rep) * d + c], a[i]));
}

extern "C" int mk_cuda_add_bcast_bf16(mk_cuda_ctx *ctx, const float *a, const float *b, int rows,
                                      int rep, int d, float *out, mk_err *err) {
    size_t n = (size_t)rows * d;
    if (!n) return MK_OK;
    k_add_bcast_bf16<<<(unsigned)((n + 255) / 256), 256, 0, ctx->stream>>>(a, b, n, (size_t)d, rep, out);
    MK_CU_LAUNCHED(err, "cuda: add_bcast launch");
    return MK_OK;
}

/* ---- compressor pooling ---------------------------------------------------------------------- */

/* Entry e pools its slots per channel: softmax over the slot scores, weighted sum of the slot
 * values (dsv4.c pool_slots), output rounded to bf16. Slots: segment A (rows a0.., columns 0..D,
 * nA of them), then segment B (rows b0.., columns offB.., r of them); see mk_cuda_cmp_pool. */
/* Channel ch of entry e (prefill: the e-th group of the rows at kv / sc; else the state slots). */
__device__ __forceinline__ float d_cmp_pool_ch(const float *__restrict__ kv, const float *__restrict__ sc, int W2,
                                               int D, int r, int ov, int prefill, int e, int ch) {
    int a0, nA, b0, offB = ov ? D : 0;
    if (prefill) {
        a0 = (e - 1) * r; /* e = 0: the r rows before kv (see mk_cuda_cmp_pool) */
        nA = ov ? r : 0;
        b0 = e * r;
    } else {
        a0 = 0;
        nA = ov ? r : 0;
        b0 = ov ? r : 0;
    }
    float mx = -INFINITY;
    for (int j = 0; j < nA; j++) mx = fmaxf(mx, sc[(size_t)(a0 + j) * W2 + ch]);
    for (int j = 0; j < r; j++) mx = fmaxf(mx, sc[(size_t)(b0 + j) * W2 + offB + ch]);
    float sum = 0.0f;
    for (int j = 0; j < nA; j++) sum += expf(sc[(size_t)(a0 + j) * W2 + ch] - mx);
    for (int j = 0; j < r; j++) sum += expf(sc[(size_t)(b0 + j) * W2 + offB + ch] - mx);
    float acc = 0.0f;
    for (int j = 0; j < nA; j++) {
        size_t o = (size_t)(a0 + j) * W2 + ch;
        acc += kv[o] * __fdiv_rn(expf(sc[o] - mx), sum);
    }
    for (int j = 0; j < r; j++) {
        size_t o = (size_t)(b0 + j) * W2 + offB + ch;
        acc += kv[o] * __fdiv_rn(expf(sc[o] - mx), sum);
    }
    return mk_d_bf16r(acc);
}

__global__ void k_cmp_pool(const float *__restrict__ kv, const float *__restrict__ sc, int W2, int D,
                           int r, int ov, int prefill, int n_ent, float *__restrict__ out) {
    int e = blockIdx.y;
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n_ent || ch >= D) return;
    out[(size_t)e * D + ch] = d_cmp_pool_ch(kv, sc, W2, D, r, ov, prefill, e, ch);
}

extern "C" int mk_cuda_cmp_pool(mk_cuda_ctx *ctx, const float *kv, const float *sc, int W2, int D,
                                int r, int ov, int prefill, int n_ent, float *out, mk_err *err) {
    if (n_ent <= 0) return MK_OK;
    dim3 grid((unsigned)((D + 127) / 128), (unsigned)n_ent);
    k_cmp_pool<<<grid, 128, 0, ctx->stream>>>(kv, sc, W2, D, r, ov, prefill, n_ent, out);
    MK_CU_LAUNCHED(err, "cuda: cmp_pool launch");
    return MK_OK;
}

/* ---- attention row lists --------------------------------------------------------------------- */

/* The row lists of every row of several pieces (mk_cuda_attn_rows_multi): counts per row, a prefix
 * over all rows, then the lists. A warp serves a row
 * (its lanes over the window, the selected entries compacted in order by ballots, the HCA
 * entries), so a decode's one row is not one thread's loop of a few hundred stores. */
__global__ void __launch_bounds__(1024) k_attn_rows_multi(const mk_cuda_apiece *__restrict__ pc, int np, int stride, int R,
                                                          int win, int D, const float *kv_call, mk_cuda_paged ckv,
                                                          int ratio, const int32_t *__restrict__ sel, int sel_cap,
                                                          const float **rows, int32_t *row_start, int ring_put) {
    MK_PDL_ENTER(); /* launched with programmatic dependent launch: nothing is touched before */
    extern __shared__ int32_t cnt[]; /* [R + 1] */
    __shared__ int32_t wtot[32];
    const unsigned all = 0xffffffffu;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int r = warp; r < R; r += nw) {
        const mk_cuda_apiece &P = mk_d_apiece_of(pc, np, stride, r);
        int t = r - P.row0, p = P.start + t, n = p - win + 1 < 0 ? p + 1 : win;
        if (ratio == 4) {
            const int32_t *sr = sel + (size_t)P.row0 * sel_cap + (size_t)t * P.k_sel;
            int c = 0;
            for (int i = lane; i < P.k_sel; i += 32) c += sr[i] >= 0 && sr[i] < P.n_ckv;
            n += __reduce_add_sync(all, c);
        } else if (ratio) {
            n += min((p + 1) / ratio, P.n_ckv);
        }
        if (lane == 0) cnt[r + 1] = n;
    }
    __syncthreads();
    { /* inclusive prefix of cnt[1..R]: a serial run per thread, the runs' totals scanned */
        const int seg = (R + blockDim.x - 1) / blockDim.x, lo = threadIdx.x * seg, hi = min(R, lo + seg);
        int run = 0;
        for (int i = lo; i < hi; i++) run += cnt[i + 1];
        int inc = run;
        for (int o = 1; o < 32; o <<= 1) {
            int v = __shfl_up_sync(all, inc, o);
            if (lane >= o) inc += v;
        }
        if (lane == 31) wtot[warp] = inc;
        __syncthreads();
        int before = inc - run;
        for (int w = 0; w < warp; w++) before += wtot[w];
        for (int i = lo; i < hi; i++) cnt[i + 1] = before += cnt[i + 1];
        if (threadIdx.x == 0) cnt[0] = 0;
    }
    __syncthreads();
    for (int r = threadIdx.x; r <= R; r += blockDim.x) row_start[r] = cnt[r];
    for (int r = warp; r < R; r += nw) {
        const mk_cuda_apiece &P = mk_d_apiece_of(pc, np, stride, r);
        int t = r - P.row0, p = P.start + t, n = cnt[r];
        const float *kv = kv_call + (size_t)P.row0 * D;
        const int q0 = p - win + 1 < 0 ? 0 : p - win + 1;
        for (int q = q0 + lane; q <= p; q += 32)
            rows[n + q - q0] = q >= P.start ? kv + (size_t)(q - P.start) * D : P.ring + (size_t)(q % win) * D;
        n += p - q0 + 1;
        mk_cuda_paged pg = ckv;
        pg.tbl = P.tbl;
        if (ratio == 4) {
            const int32_t *sr = sel + (size_t)P.row0 * sel_cap + (size_t)t * P.k_sel;
            for (int b = 0; b < P.k_sel; b += 32) {
                int s = b + lane < P.k_sel ? sr[b + lane] : -1, ok = s >= 0 && s < P.n_ckv;
                unsigned m = __ballot_sync(all, ok);
                if (ok) rows[n + __popc(m & ((1u << lane) - 1))] = mk_d_paged_row(pg, s, D);
                n += __popc(m);
            }
        } else if (ratio) {
            int vis = min((p + 1) / ratio, P.n_ckv);
            for (int j = lane; j < vis; j += 32) rows[n + j] = mk_d_paged_row(pg, j, D);
        }
        if (ring_put) { /* a one-row piece: its row into ring slot p % win, which holds position p - win,
                         * outside every list of the call (and of the window snapshots after it) */
            float *dst = (float *)P.ring + (size_t)(p % win) * D;
            for (int c = lane; c < D; c += 32) dst[c] = kv[c];
        }
    }
}

/* The same lists for a call of at most ROWS_WIDE_MAX rows (a decode step of few sequences; tuning
 * rows_wide): the rows one after another, each shared by the whole block, so a row costs a few
 * memory round trips instead of one warp's loop over its window, its selected entries and its
 * ring row. Threads run over the window, the HCA entries and the ring row; the selected entries
 * (ratio 4) go in chunks of 32 to the warps (at most 2 chunks a warp: k_sel <= ROWS_WIDE_CH x 32),
 * each chunk's valid picks counted by a ballot, the counts scanned in chunk order, and each pick
 * stored at its chunk's offset plus its rank among the chunk's valid picks: the order
 * k_attn_rows_multi's warp gives them, so the same lists. 1024 threads. */
#define ROWS_WIDE_MAX 4
#define ROWS_WIDE_CH 64
__global__ void __launch_bounds__(1024) k_attn_rows_wide(const mk_cuda_apiece *__restrict__ pc, int np, int stride, int R,
                                                         int win, int D, const float *kv_call, mk_cuda_paged ckv,
                                                         int ratio, const int32_t *__restrict__ sel, int sel_cap,
                                                         const float **rows, int32_t *row_start, int ring_put) {
    MK_PDL_ENTER(); /* launched with programmatic dependent launch: nothing is touched before */
    __shared__ int32_t coff[ROWS_WIDE_CH + 1]; /* the chunks' valid picks, then their offsets; [CH]: total */
    const unsigned all = 0xffffffffu;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int base = 0; /* the row's first list entry (the same in every thread) */
    if (threadIdx.x == 0) row_start[0] = 0;
    for (int r = 0; r < R; r++) {
        const mk_cuda_apiece &P = mk_d_apiece_of(pc, np, stride, r);
        const int t = r - P.row0, p = P.start + t;
        const int q0 = p - win + 1 < 0 ? 0 : p - win + 1, nwin = p - q0 + 1;
        const float *kv = kv_call + (size_t)P.row0 * D;
        for (int q = q0 + (int)threadIdx.x; q <= p; q += blockDim.x)
            rows[base + q - q0] = q >= P.start ? kv + (size_t)(q - P.start) * D : P.ring + (size_t)(q % win) * D;
        mk_cuda_paged pg = ckv;
        pg.tbl = P.tbl;
        int n = nwin;
        if (ratio == 4) {
            const int32_t *sr = sel + (size_t)P.row0 * sel_cap + (size_t)t * P.k_sel;
            const int nch = (P.k_sel + 31) / 32;
            int sv[2];
            unsigned mv[2];
#pragma unroll
            for (int i = 0; i < 2; i++) { /* chunk warp + i nw: its picks, valid ones balloted */
                const int ch = warp + i * nw, k = ch * 32 + lane;
                sv[i] = ch < nch && k < P.k_sel ? sr[k] : -1;
                mv[i] = __ballot_sync(all, sv[i] >= 0 && sv[i] < P.n_ckv);
                if (ch < nch && lane == 0) coff[ch] = __popc(mv[i]);
            }
            __syncthreads();
            if (warp == 0) { /* exclusive scan of the chunk counts, two chunks a lane */
                const int a = 2 * lane < nch ? coff[2 * lane] : 0, b = 2 * lane + 1 < nch ? coff[2 * lane + 1] : 0;
                int inc = a + b;
                for (int o = 1; o < 32; o <<= 1) {
                    const int v = __shfl_up_sync(all, inc, o);
                    if (lane >= o) inc += v;
                }
                const int ex = inc - a - b; /* each lane rewrites only the entries it read */
                if (2 * lane < nch) coff[2 * lane] = ex;
                if (2 * lane + 1 < nch) coff[2 * lane + 1] = ex + a;
                if (lane == 31) coff[ROWS_WIDE_CH] = inc;
            }
            __syncthreads();
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int ch = warp + i * nw;
                if (ch < nch && sv[i] >= 0 && sv[i] < P.n_ckv)
                    rows[base + n + coff[ch] + __popc(mv[i] & ((1u << lane) - 1))] = mk_d_paged_row(pg, sv[i], D);
            }
            n += coff[ROWS_WIDE_CH];
        } else if (ratio) {
            const int vis = min((p + 1) / ratio, P.n_ckv);
            for (int j = threadIdx.x; j < vis; j += blockDim.x) rows[base + n + j] = mk_d_paged_row(pg, j, D);
            n += vis;
        }
        if (ring_put) { /* as k_attn_rows_multi: slot p % win holds position p - win, in no list */
            float *dst = (float *)P.ring + (size_t)(p % win) * D;
            for (int c = threadIdx.x; c < D; c += blockDim.x) dst[c] = kv[c];
        }
        base += n;
        if (threadIdx.x == 0) row_start[r + 1] = base;
        __syncthreads(); /* coff is the next row's */
    }
}

extern "C" int mk_cuda_attn_rows_multi(mk_cuda_ctx *ctx, const mk_cuda_apiece *pieces, int np, int stride, int R, int win,
                                       int D, const float *kv_call, mk_cuda_paged ckv, int ratio,
                                       const int32_t *sel, int sel_cap, const float **rows, int32_t *row_start,
                                       int ring_put, mk_err *err) {
    if (R <= 0 || np <= 0) return MK_OK;
    if (R > 12000) return mk_fail(err, MK_ERANGE, "cuda: attn_rows: %d rows in one call", R);
    if (ring_put && R != np)
        return mk_fail(err, MK_EINVAL, "cuda: attn_rows with the ring writes: %d rows in %d pieces (one each)", R, np);
    if (ctx->tune.rows_wide && R <= ROWS_WIDE_MAX && (ratio != 4 || sel_cap <= ROWS_WIDE_CH * 32)) {
        (void)mk_cuda_launch_pdl(ctx, 1, 1024, 0, k_attn_rows_wide, pieces, np, stride, R, win, D, kv_call, ckv, ratio,
                                 sel, sel_cap, rows, row_start, ring_put);
        MK_CU_LAUNCHED(err, "cuda: attn_rows_wide launch");
        return MK_OK;
    }
    int threads = R < 32 ? R * 32 : 1024;
    (void)mk_cuda_launch_pdl(ctx, 1, threads, sizeof(int32_t) * (R + 1), k_attn_rows_multi, pieces, np, stride, R, win, D, kv_call, ckv,
                                                                              ratio, sel, sel_cap, rows, row_start, ring_put);
    MK_CU_LAUNCHED(err, "cuda: attn_rows_multi launch");
    return MK_OK;
}

/* Block (x, r): row r of the call goes to its piece's ring if it is among the piece's last win. */
__global__ void k_ring_put_multi(const mk_cuda_apiece *__restrict__ pc, int np, int stride, const float *__restrict__ kv,
                                 int win, int D) {
    MK_PDL_ENTER(); /* launched with programmatic dependent launch: nothing is touched before */
    const int r = blockIdx.y;
    const mk_cuda_apiece &P = mk_d_apiece_of(pc, np, stride, r);
    const int t = r - P.row0, n = P.T < win ? P.T : win;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < P.T - n || c >= D) return;
    ((float *)P.ring)[(size_t)((P.start + t) % win) * D + c] = kv[(size_t)r * D + c];
}

extern "C" int mk_cuda_ring_put_multi(mk_cuda_ctx *ctx, const mk_cuda_apiece *pieces, int np, int stride, int R,
                                      const float *kv_call, int win, int D, mk_err *err) {
    if (R <= 0 || np <= 0) return MK_OK;
    if (R > 65535) return mk_fail(err, MK_ERANGE, "cuda: ring_put_multi: %d rows in one call", R);
    (void)mk_cuda_launch_pdl(ctx, dim3((unsigned)((D + 127) / 128), (unsigned)R), 128, 0, k_ring_put_multi, pieces, np, stride, kv_call,
                                                                                          win, D);
    MK_CU_LAUNCHED(err, "cuda: ring_put_multi launch");
    return MK_OK;
}

/* Column c of a one-token piece's projected row into its state slot (ov ? r : 0) + start % r, the
 * score plus ape[start % r]. */
__device__ __forceinline__ void d_cmp_put(const mk_cuda_apiece &P, int which, const float *__restrict__ kvp,
                                          const float *__restrict__ scp, int W2, const float *__restrict__ ape, int r,
                                          int ov, int c) {
    const int slot = (ov ? r : 0) + P.start % r;
    P.cst[which][0][(size_t)slot * W2 + c] = kvp[(size_t)P.row0 * W2 + c];
    P.cst[which][1][(size_t)slot * W2 + c] = __fadd_rn(scp[(size_t)P.row0 * W2 + c], ape[(size_t)(P.start % r) * W2 + c]);
}

__global__ void k_cmp_put_multi(const mk_cuda_apiece *__restrict__ pc, int stride, int which,
                                const float *__restrict__ kvp, const float *__restrict__ scp, int W2,
                                const float *__restrict__ ape, int r, int ov) {
    MK_PDL_ENTER(); /* launched with programmatic dependent launch: nothing is touched before */
    const mk_cuda_apiece &P = pc[(size_t)blockIdx.y * stride];
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (P.T != 1 || c >= W2) return;
    d_cmp_put(P, which, kvp, scp, W2, ape, r, ov, c);
}

extern "C" int mk_cuda_cmp_put_multi(mk_cuda_ctx *ctx, const mk_cuda_apiece *pieces, int np, int stride, int which,
                                     const float *kvp, const float *scp, int W2, const float *ape, int r, int ov,
                                     mk_err *err) {
    if (np <= 0) return MK_OK;
    if (np > 65535 || r < 1 || which < 0 || which > 1)
        return mk_fail(err, MK_EINVAL, "cuda: cmp_put_multi: %d pieces, ratio %d, which %d", np, r, which);
    (void)mk_cuda_launch_pdl(ctx, dim3((unsigned)((W2 + 255) / 256), (unsigned)np), 256, 0, k_cmp_put_multi, pieces, stride, which,
                                                                                           kvp, scp, W2, ape, r, ov);
    MK_CU_LAUNCHED(err, "cuda: cmp_put_multi launch");
    return MK_OK;
}

/* A compressor's decode step for every one-token piece (mk_cuda_cmp_step_multi): block i is piece
 * i, mk_cuda_rmsnorm_threads(D) threads. The state slot as k_cmp_put_multi; where the position
 * completes a group, each step of the host-launched chain with its kernel's arithmetic (the pooled
 * entry in shared memory: k_cmp_pool's channel function, k_rmsnorm's row function on the same
 * thread count, k_rope_step's pair formula, k_hadamard's butterflies and scaling, k_quant_sim's
 * warp per block), then the row into the piece's block. */
__global__ void __launch_bounds__(1024) k_cmp_step_multi(const mk_cuda_apiece *__restrict__ pc, int stride, int which,
                                                         const float *__restrict__ kvp, const float *__restrict__ scp,
                                                         int W2, int D, const float *__restrict__ ape, int r, int ov,
                                                         const uint16_t *__restrict__ nw, float eps, int rd,
                                                         const float *__restrict__ cs, int tab_half, int max_pos,
                                                         int is_idx, float hscale, mk_cuda_paged dst) {
    mk_d_pdl_launch_dependents(); /* launched with programmatic dependent launch: only the constant */
    mk_d_l2_prefetch_block(nw, (size_t)D * 2); /* weights are touched (prefetched) before the wait */
    mk_d_l2_prefetch_block(ape, sizeof(float) * (size_t)r * W2);
    mk_d_pdl_wait();
    extern __shared__ float es[];
    const mk_cuda_apiece &P = pc[(size_t)blockIdx.x * stride];
    if (P.T != 1) return;
    float *kvs = P.cst[which][0], *scs = P.cst[which][1];
    for (int c = threadIdx.x; c < W2; c += blockDim.x) d_cmp_put(P, which, kvp, scp, W2, ape, r, ov, c);
    if ((P.start + 1) % r) return; /* the whole block: no group completed */
    __syncthreads();               /* the slot written above is read by other threads */
    for (int ch = threadIdx.x; ch < D; ch += blockDim.x) es[ch] = d_cmp_pool_ch(kvs, scs, W2, D, r, ov, 0, 0, ch);
    __syncthreads();
    if (ov) /* the overlap slots [r, 2r) become the next group's [0, r) */
        for (int i = threadIdx.x; i < r * W2; i += blockDim.x) {
            kvs[i] = kvs[(size_t)r * W2 + i];
            scs[i] = scs[(size_t)r * W2 + i];
        }
    mk_d_rmsnorm_row(es, D, nw, eps, es);
    __syncthreads();
    const int pos0 = P.start + 1 - r;
    if (pos0 >= 0 && pos0 < max_pos) /* checked by the caller */
        for (int i = threadIdx.x; i < rd / 2; i += blockDim.x) mk_d_rope_pair(es + D - rd, cs, tab_half, pos0, i, 0);
    __syncthreads();
    mk_cuda_paged pg = dst;
    pg.tbl = P.tbl;
    float *row = (float *)mk_d_paged_row(pg, (P.start + 1) / r - 1, D);
    const int lane = threadIdx.x & 31, nw32 = blockDim.x >> 5;
    if (is_idx) {
        mk_d_hadamard_smem(es, D);
        for (int i = threadIdx.x; i < D; i += blockDim.x) es[i] = mk_d_bf16r(__fmul_rn(es[i], hscale));
        __syncthreads();
        for (int b = threadIdx.x >> 5; b < (D + 31) / 32; b += nw32) quant_sim_block(es, row, D, 32, b, 1, lane);
    } else {
        const int nope = D - rd;
        for (int b = threadIdx.x >> 5; b < (nope + 63) / 64; b += nw32) quant_sim_block(es, row, nope, 64, b, 0, lane);
        for (int i = nope + threadIdx.x; i < D; i += blockDim.x) row[i] = es[i];
    }
}

extern "C" int mk_cuda_cmp_step_multi(mk_cuda_ctx *ctx, const mk_cuda_apiece *pieces, int np, int stride, int which,
                                      const float *kvp, const float *scp, int W2, int D, const float *ape, int r,
                                      int ov, const uint16_t *nw, float eps, int rd, const mk_rope_table *rope,
                                      int is_idx, float hscale, mk_cuda_paged dst, mk_err *err) {
    if (!ctx->tune.cmp_step || D < 1 || D > 4096 || W2 != (ov ? 2 : 1) * D || rd < 0 || rd % 2 || rd > D ||
        rd / 2 > rope->half || !rope->cs || (is_idx && (D & (D - 1))) || r < 1 || which < 0 || which > 1)
        return MK_ENOTSUP;
    if (np <= 0) return MK_OK;
    if (np > 65535 || dst.epb < 1) return mk_fail(err, MK_EINVAL, "cuda: cmp_step_multi: %d pieces, %d entries per block",
                                                  np, dst.epb);
    (void)mk_cuda_launch_pdl(ctx, (unsigned)np, mk_cuda_rmsnorm_threads(D), sizeof(float) * D, k_cmp_step_multi,
                             pieces, stride, which, kvp, scp, W2, D, ape, r, ov, nw, eps, rd, rope->cs, rope->half,
                             rope->max_pos, is_idx, hscale, dst);
    MK_CU_LAUNCHED(err, "cuda: cmp_step_multi launch");
    return MK_OK;
}

/* ---- window ring and its snapshots ----------------------------------------------------------- */


/* Slot s of the snapshot after position e: position q = e - ((e - s) mod win). */
__global__ void k_snap_ring(uint16_t *dst, const float *ring, const float *__restrict__ kv, int start, int e,
                            int win, int D) {
    int s = blockIdx.y;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= D) return;
    int q = e - (((e - s) % win) + win) % win;
    const float *src = q >= start ? kv + (size_t)(q - start) * D : ring + (size_t)s * D;
    __nv_bfloat16 b = __float2bfloat16_rn(src[c]);
    dst[(size_t)s * D + c] = *(uint16_t *)&b;
}

extern "C" int mk_cuda_snap_ring(mk_cuda_ctx *ctx, uint16_t *dst, const float *ring, const float *kv_call,
                                 int start, int e, int win, int D, mk_err *err) {
    if (e < win - 1) return mk_fail(err, MK_EINVAL, "cuda: snap_ring: position %d inside the first window", e);
    k_snap_ring<<<dim3((unsigned)((D + 127) / 128), (unsigned)win), 128, 0, ctx->stream>>>(dst, ring, kv_call, start,
                                                                                        e, win, D);
    MK_CU_LAUNCHED(err, "cuda: snap_ring launch");
    return MK_OK;
}

__global__ void k_bf16_to_f32(const uint16_t *__restrict__ x, size_t n, float *__restrict__ y) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = __uint_as_float((uint32_t)x[i] << 16);
}

extern "C" int mk_cuda_bf16_to_f32(mk_cuda_ctx *ctx, const uint16_t *x, size_t n, float *y, mk_err *err) {
    if (!n) return MK_OK;
    k_bf16_to_f32<<<(unsigned)((n + 255) / 256), 256, 0, ctx->stream>>>(x, n, y);
    MK_CU_LAUNCHED(err, "cuda: bf16_to_f32 launch");
    return MK_OK;
}

/* ---- copies ---------------------------------------------------------------------------------- */

extern "C" int mk_cuda_copy(mk_cuda_ctx *ctx, void *dst, const void *src, size_t bytes, mk_err *err) {
    if (!bytes) return MK_OK;
    MK_CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx->stream), err,
              "cuda: device copy");
    if (ctx->trace_on) mk_cuda_trace_mark(ctx, "cuda: device copy");
    return MK_OK;
}

extern "C" int mk_cuda_copy2d(mk_cuda_ctx *ctx, void *dst, size_t dpitch, const void *src,
                              size_t spitch, size_t width, size_t rows, mk_err *err) {
    if (!width || !rows) return MK_OK;
    MK_CU_TRY(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice,
                                ctx->stream),
              err, "cuda: device 2d copy");
    return MK_OK;
}

/* Fills n floats with v (compressor scores start at -inf). */
__global__ void k_fill(float *x, size_t n, float v) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}

extern "C" int mk_cuda_fill(mk_cuda_ctx *ctx, float *x, size_t n, float v, mk_err *err) {
    if (!n) return MK_OK;
    k_fill<<<(unsigned)((n + 255) / 256), 256, 0, ctx->stream>>>(x, n, v);
    MK_CU_LAUNCHED(err, "cuda: fill launch");
    return MK_OK;
}

/* ---- bandwidth reference for the model benchmark ------------------------------------------- */

extern "C" int mk_cuda_copy_bandwidth(mk_cuda_ctx *ctx, size_t bytes, int iters, double *gbs,
                                      mk_err *err) {
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    int rc = mk_cuda_alloc(ctx, bytes, &a, err);
    if (!rc) rc = mk_cuda_alloc(ctx, bytes, &b, err);
    if (!rc) rc = mk_cuda_memset(ctx, a, 0x3c, bytes, err);
    cudaError_t ce = cudaSuccess;
    if (!rc) ce = cudaEventCreate(&e0);
    if (!rc && ce == cudaSuccess) ce = cudaEventCreate(&e1);
    for (int w = 0; !rc && ce == cudaSuccess && w < 2; w++)
        ce = cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, ctx->stream);
    if (!rc && ce == cudaSuccess) ce = cudaEventRecord(e0, ctx->stream);
    for (int i = 0; !rc && ce == cudaSuccess && i < iters; i++)
        ce = cudaMemcpyAsync(i & 1 ? a : b, i & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice, ctx->stream);
    if (!rc && ce == cudaSuccess) ce = cudaEventRecord(e1, ctx->stream);
    if (!rc && ce == cudaSuccess) ce = cudaEventSynchronize(e1);
    float ms = 0;
    if (!rc && ce == cudaSuccess) ce = cudaEventElapsedTime(&ms, e0, e1);
    if (!rc && ce != cudaSuccess) rc = mk_cuda_fail(err, ce, "cuda: copy bandwidth");
    if (!rc) *gbs = 2.0 * (double)bytes * iters / (ms * 1e-3) / 1e9;
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    mk_cuda_free(ctx, a);
    mk_cuda_free(ctx, b);
    return rc;
}
