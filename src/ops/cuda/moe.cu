/* moe.cu — the routed half of DeepSeek-V4's MoE on the GPU (src/models/dsv4_cuda.c):
 *
 *   route    scores = sqrt(softplus(gate logits)); score-routed layers take the top-k of
 *            scores + bias (rank order, ties to the lower expert as dsv4.c) and the margin
 *            k-th minus (k+1)-th biased score; hash layers read tid2eid[token];
 *   weights  w = score[idx] / sum_k score[idx_k] * route_scale (indices clamped into range);
 *   plan     one block groups the (token, k) slots by expert, ascending, tokens in order:
 *            plan = [n_groups, gexp[G], goff[G+1], stok[TK], spos[TK]] with sw[TK] the slot
 *            weights; spos[t*K+k] = the slot's row in the grouped outputs (-1 for a duplicate);
 *   experts  grouped GEMV over the active experts only (grid.y = group): a warp per output
 *            feature reads each weight row once per group of up to 4 tokens; w1 and w3 in one
 *            pass with SwiGLU, the routing weight and the bf16 rounding fused; then w2;
 *   combine  out[t] = bf16(sum over t's experts in ascending order of eo + shared).
 *
 * Weights stay as stored (BF16, FP8 with 128x128 e8m0 scales, FP4 e2m1 with per-32 e8m0 scales);
 * FP8/FP4 activations are the reference's per-128 FP8 quantization, passed in dequantized form
 * (mk_cuda_quant_sim with block 128: e4m3 x power of two, exact in fp32). Products are exact in
 * fp32; sums run in another order than mk_linear (per 16/32-wide chunk, then across lanes).
 */
#include "ops/cuda/cuda_common.cuh"

#include <limits.h>
#include <math.h>
#include <string.h>

/* ---- routing --------------------------------------------------------------------------------- */

__device__ __forceinline__ float d_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* k_moe_weights of token t by one thread (idx clamped into range, then the weights). */
__device__ __forceinline__ void moe_weights_tok(const float *__restrict__ s, int E, int K, float route_scale,
                                                int32_t *ix, float *w) {
    float sum = 0.0f;
    for (int k = 0; k < K; k++) {
        if (ix[k] < 0 || ix[k] >= E) ix[k] = 0;
        sum += s[ix[k]];
    }
    for (int k = 0; k < K; k++) w[k] = __fmul_rn(__fdiv_rn(s[ix[k]], sum), route_scale);
}

__device__ void moe_plan1_tok(const int32_t *idx, const float *w, int K, int E, int32_t *plan, float *sw);

/* moe_weights_tok then moe_plan1_tok of one token by the 32 lanes of a warp (K <= 32), lane k
 * holding pick k (e: its expert before the clamp): the same outputs, bit for bit. The weights' sum
 * adds the K scores in k order (gathered by shuffles, the serial loop's operations); a pick's group
 * is the number of distinct smaller experts, duplicates keep their first k (the selection sort's
 * result). One thread walked both loops over global memory, each step a dependent load: the routing
 * launch was 7-9 us of a batch-1 step's layer (H100, session 23's ncu). */
__device__ void moe_weights_plan_warp(const float *s, int E, int K, float route_scale, int e, int32_t *ix, float *w,
                                      int32_t *plan, float *sw) {
    const unsigned all = 0xffffffffu;
    const int lane = threadIdx.x & 31, on = lane < K;
    if (e < 0 || e >= E) e = 0;
    if (!on) e = INT_MAX; /* never smaller than a pick's expert, never equal to one */
    const float v = on ? s[e] : 0.0f;
    float sum = 0.0f;
    for (int k = 0; k < K; k++) sum += __shfl_sync(all, v, k);
    const float wk = __fmul_rn(__fdiv_rn(v, sum), route_scale);
    int first = on;
    for (int j = 0; j < K; j++) {
        const int ej = __shfl_sync(all, e, j);
        if (j < lane && ej == e) first = 0;
    }
    const unsigned fm = __ballot_sync(all, first);
    int g = 0;
    for (int j = 0; j < K; j++) {
        const int ej = __shfl_sync(all, e, j);
        g += ((fm >> j) & 1u) && ej < e;
    }
    const int TK = K, G = TK < E ? TK : E, ng = __popc(fm);
    int32_t *gexp = plan + 1, *goff = gexp + G, *stok = goff + G + 1, *spos = stok + TK;
    if (on) {
        ix[lane] = e;
        w[lane] = wk;
        spos[lane] = first ? g : -1;
    }
    if (first) gexp[g] = e, goff[g] = g, stok[g] = 0, sw[g] = wk;
    if (lane == 0) goff[ng] = ng, plan[0] = ng;
}

/* One block per token. With w, the routing weights too (k_moe_weights' arithmetic); with plan (one
 * token), the plan too (k_moe_plan1's). */
__global__ void k_moe_route(float *__restrict__ sc, int E, int K, const float *__restrict__ bias,
                            const int64_t *__restrict__ tid2eid, const int32_t *__restrict__ tok,
                            int vocab, int32_t *__restrict__ idx, float *__restrict__ margin, float route_scale,
                            float *__restrict__ w, int32_t *__restrict__ plan, float *__restrict__ sw,
                            int warp_plan) {
    if (!plan) mk_d_pdl_launch_dependents(); /* with the plan: no early start (MOE_PLAN_NOTE) */
    mk_d_l2_prefetch_block(bias, sizeof(float) * (size_t)E); /* constant: requested before the wait */
    mk_d_pdl_wait();
    extern __shared__ float bsc[]; /* [E] biased scores */
    __shared__ int32_t top[65];
    int t = blockIdx.x;
    float *s = sc + (size_t)t * E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float v = sqrtf(d_softplus(s[e]));
        s[e] = v;
        if (bias) bsc[e] = __fadd_rn(v, bias[e]);
    }
    __syncthreads();
    if (!bias) {
        if (warp_plan) { /* one token with its plan: warp 0 (tuning route_warp) */
            if (threadIdx.x < 32) {
                int id = tok[t];
                if (id < 0 || id >= vocab) id = 0;
                const int e = threadIdx.x < K ? (int)tid2eid[(size_t)id * K + threadIdx.x] : 0;
                if (threadIdx.x == 0) margin[t] = INFINITY;
                moe_weights_plan_warp(s, E, K, route_scale, e, idx + (size_t)t * K, w + (size_t)t * K, plan, sw);
            }
            return;
        }
        if (threadIdx.x == 0) {
            int id = tok[t];
            if (id < 0 || id >= vocab) id = 0;
            for (int k = 0; k < K; k++) idx[(size_t)t * K + k] = (int32_t)tid2eid[(size_t)id * K + k];
            margin[t] = INFINITY;
            if (w) moe_weights_tok(s, E, K, route_scale, idx + (size_t)t * K, w + (size_t)t * K);
            if (plan) moe_plan1_tok(idx, w, K, E, plan, sw);
        }
        return;
    }
    int kk = K + 1 <= E ? K + 1 : K;
    for (int j = threadIdx.x; j < E; j += blockDim.x) {
        float x = bsc[j];
        int rank = 0, i = 0;
        /* eight candidates per step (independent loads, one exit test): a top expert's count runs
         * over all E entries, which one dependent load per entry made the step's long pole */
        for (; i + 8 <= E && rank < kk; i += 8) {
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const float y = bsc[i + u];
                rank += (y > x) || (y == x && i + u < j);
            }
        }
        for (; i < E && rank < kk; i++) {
            float y = bsc[i];
            rank += (y > x) || (y == x && i < j);
        }
        if (rank < kk) top[rank] = j;
    }
    __syncthreads();
    if (warp_plan) { /* one token with its plan: warp 0 (tuning route_warp) */
        if (threadIdx.x < 32) {
            if (threadIdx.x == 0) margin[t] = kk > K ? __fsub_rn(bsc[top[K - 1]], bsc[top[K]]) : INFINITY;
            moe_weights_plan_warp(s, E, K, route_scale, threadIdx.x < K ? top[threadIdx.x] : 0, idx + (size_t)t * K,
                                  w + (size_t)t * K, plan, sw);
        }
        return;
    }
    if (threadIdx.x == 0) {
        for (int k = 0; k < K; k++) idx[(size_t)t * K + k] = top[k];
        margin[t] = kk > K ? __fsub_rn(bsc[top[K - 1]], bsc[top[K]]) : INFINITY;
        if (w) moe_weights_tok(s, E, K, route_scale, idx + (size_t)t * K, w + (size_t)t * K);
        if (plan) moe_plan1_tok(idx, w, K, E, plan, sw);
    }
}

/* k_moe_route over T tokens, with the weights (w) and, for one token, the plan (plan, sw) or not. */
static int moe_route_launch(mk_cuda_ctx *ctx, float *scores, int T, int E, int K, const float *bias,
                            const int64_t *tid2eid, const int32_t *tok, int vocab, float route_scale, int32_t *idx,
                            float *margin, float *w, int32_t *plan, float *sw, mk_err *err) {
    if (T <= 0) return MK_OK;
    if (K < 1 || K > 64 || E < K || E > 8192)
        return mk_fail(err, MK_EINVAL, "cuda: moe_route: %d of %d experts", K, E);
    if (!bias && !tid2eid) return mk_fail(err, MK_EINVAL, "cuda: moe_route: no bias and no tid2eid");
    const int warp_plan = ctx->tune.route_warp && plan && w && K <= 32;
    (void)mk_cuda_launch_pdl(ctx, T, 256, sizeof(float) * E, k_moe_route, scores, E, K, bias, tid2eid, tok, vocab, idx,
                             margin, route_scale, w, plan, sw, warp_plan);
    MK_CU_LAUNCHED(err, "cuda: moe_route launch");
    return MK_OK;
}

extern "C" int mk_cuda_moe_route(mk_cuda_ctx *ctx, float *scores, int T, int E, int K,
                                 const float *bias, const int64_t *tid2eid, const int32_t *tok,
                                 int vocab, int32_t *idx, float *margin, mk_err *err) {
    return moe_route_launch(ctx, scores, T, E, K, bias, tid2eid, tok, vocab, 0.0f, idx, margin, NULL, NULL, NULL, err);
}

extern "C" int mk_cuda_moe_route_weights(mk_cuda_ctx *ctx, float *scores, int T, int E, int K, const float *bias,
                                         const int64_t *tid2eid, const int32_t *tok, int vocab, float route_scale,
                                         int32_t *idx, float *margin, float *w, mk_err *err) {
    return moe_route_launch(ctx, scores, T, E, K, bias, tid2eid, tok, vocab, route_scale, idx, margin, w, NULL, NULL,
                            err);
}

extern "C" int mk_cuda_moe_route_plan(mk_cuda_ctx *ctx, float *scores, int T, int E, int K, const float *bias,
                                      const int64_t *tid2eid, const int32_t *tok, int vocab, float route_scale,
                                      int32_t *idx, float *margin, float *w, int32_t *plan, float *sw, mk_err *err) {
    if (T == 1 && ctx->tune.moe_route_plan)
        return moe_route_launch(ctx, scores, T, E, K, bias, tid2eid, tok, vocab, route_scale, idx, margin, w, plan, sw,
                                err);
    int st = mk_cuda_moe_route_weights(ctx, scores, T, E, K, bias, tid2eid, tok, vocab, route_scale, idx, margin, w, err);
    return st ? st : mk_cuda_moe_plan(ctx, idx, w, T, K, E, plan, sw, err);
}

/* One thread per token. */
__global__ void k_moe_weights(const float *__restrict__ sc, int T, int E, int K, float route_scale,
                              int32_t *idx, float *w) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    moe_weights_tok(sc + (size_t)t * E, E, K, route_scale, idx + (size_t)t * K, w + (size_t)t * K);
}

extern "C" int mk_cuda_moe_weights(mk_cuda_ctx *ctx, const float *scores, int T, int E, int K,
                                   float route_scale, int32_t *idx, float *w, mk_err *err) {
    if (T <= 0) return MK_OK;
    k_moe_weights<<<(T + 127) / 128, 128, 0, ctx->stream>>>(scores, T, E, K, route_scale, idx, w);
    MK_CU_LAUNCHED(err, "cuda: moe_weights launch");
    return MK_OK;
}

/* ---- plan ------------------------------------------------------------------------------------
 * MOE_PLAN_NOTE: the expert GEMVs read the plan before their programmatic-dependent-launch wait
 * (to fetch their weights early), two kernels after the one that writes it (the activation
 * quantization runs between). That is safe only if the kernel between was launched after the
 * plan's kernel completed, so the kernels that write a plan never let the next kernel start
 * early (no launch_dependents: the implicit trigger at their end). */

size_t mk_cuda_moe_plan_ints(int T, int K, int E) {
    int TK = T * K, G = TK < E ? TK : E;
    return 1 + (size_t)G + (size_t)G + 1 + 2 * (size_t)TK;
}

/* One block. Expert by expert (ascending), the tokens that chose it, in token order; a token
 * that names an expert twice is counted once, with its first weight (as dsv4.c). A counting sort
 * by one thread (O(T K^2 + E): the decisions of a step are a few thousand at most), with the
 * per-expert counts in shared memory [E]: stable in token order, so the plan is exactly the one
 * of the expert-by-expert scan it replaces (which cost O(E T K) and dominated batched steps). */
__global__ void k_moe_plan(const int32_t *__restrict__ idx, const float *__restrict__ w, int T,
                           int K, int E, int32_t *plan, float *sw) {
    mk_d_pdl_wait(); /* no early start for the next kernel: see MOE_PLAN_NOTE */
    extern __shared__ int32_t cnt[]; /* [E]: counts, then the next free slot of each expert */
    int TK = T * K, G = TK < E ? TK : E;
    int32_t *gexp = plan + 1, *goff = gexp + G, *stok = goff + G + 1, *spos = stok + TK;
    for (int i = threadIdx.x; i < TK; i += blockDim.x) spos[i] = -1;
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int e = idx[(size_t)t * K + k], dup = 0;
            for (int k2 = 0; k2 < k; k2++) dup |= idx[(size_t)t * K + k2] == e;
            if (!dup && e >= 0 && e < E) cnt[e]++;
        }
    int ng = 0, n = 0;
    for (int e = 0; e < E; e++) {
        int c = cnt[e];
        cnt[e] = n;
        if (c) {
            gexp[ng] = e;
            goff[ng] = n;
            ng++;
            n += c;
        }
    }
    goff[ng] = n;
    plan[0] = ng;
    for (int t = 0; t < T; t++)
        for (int k = 0; k < K; k++) {
            int e = idx[(size_t)t * K + k], dup = 0;
            for (int k2 = 0; k2 < k; k2++) dup |= idx[(size_t)t * K + k2] == e;
            if (dup || e < 0 || e >= E) continue;
            int slot = cnt[e]++;
            stok[slot] = t;
            sw[slot] = w[(size_t)t * K + k];
            spos[(size_t)t * K + k] = slot;
        }
}

/* The same plan with a block of PLAN_W warps (E <= PLAN_EMAX): warp w owns a contiguous range of
 * tokens; (A) per-range counts per expert (shared atomics: order-free), (B) per expert, the
 * ranges' first slots in range order after the experts before it, (C) each range's lane 0 places
 * its tokens in token order. Slots within an expert are therefore in token order: the plan is the
 * serial one's, entry for entry. */
#define PLAN_W 32
#define PLAN_EMAX 320
__global__ void __launch_bounds__(PLAN_W * 32) k_moe_plan_par(const int32_t *__restrict__ idx,
                                                              const float *__restrict__ w, int T, int K, int E,
                                                              int32_t *plan, float *sw) {
    mk_d_pdl_wait(); /* no early start for the next kernel: see MOE_PLAN_NOTE */
    extern __shared__ int32_t cw[]; /* [PLAN_W][E] counts, then next free slots; [E] totals after */
    int32_t *tot = cw + PLAN_W * E;
    const int TK = T * K, G = TK < E ? TK : E;
    int32_t *gexp = plan + 1, *goff = gexp + G, *stok = goff + G + 1, *spos = stok + TK;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int per = (T + PLAN_W - 1) / PLAN_W, t0 = warp * per, t1 = min(T, t0 + per);
    for (int i = threadIdx.x; i < PLAN_W * E; i += blockDim.x) cw[i] = 0;
    for (int i = threadIdx.x; i < TK; i += blockDim.x) spos[i] = -1;
    __syncthreads();
    for (int i = t0 * K + lane; i < t1 * K; i += 32) { /* (A) */
        int t = i / K, k = i - t * K, e = idx[i], dup = 0;
        for (int k2 = 0; k2 < k; k2++) dup |= idx[(size_t)t * K + k2] == e;
        if (!dup && e >= 0 && e < E) atomicAdd(&cw[warp * E + e], 1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int n = 0;
        for (int r = 0; r < PLAN_W; r++) n += cw[r * E + e];
        tot[e] = n;
    }
    __syncthreads();
    if (threadIdx.x == 0) { /* (B) the experts' first slots, ascending */
        int ng = 0, n = 0;
        for (int e = 0; e < E; e++) {
            int c = tot[e];
            tot[e] = n;
            if (c) {
                gexp[ng] = e;
                goff[ng] = n;
                ng++;
                n += c;
            }
        }
        goff[ng] = n;
        plan[0] = ng;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) { /* ... and each range's within its expert */
        int n = tot[e];
        for (int r = 0; r < PLAN_W; r++) {
            int c = cw[r * E + e];
            cw[r * E + e] = n;
            n += c;
        }
    }
    __syncthreads();
    if (lane == 0) /* (C) */
        for (int t = t0; t < t1; t++)
            for (int k = 0; k < K; k++) {
                int e = idx[(size_t)t * K + k], dup = 0;
                for (int k2 = 0; k2 < k; k2++) dup |= idx[(size_t)t * K + k2] == e;
                if (dup || e < 0 || e >= E) continue;
                int slot = cw[warp * E + e]++;
                stok[slot] = t;
                sw[slot] = w[(size_t)t * K + k];
                spos[(size_t)t * K + k] = slot;
            }
}

/* Faster plan for a single token (decode): the K slots sorted by expert; one thread. */
__device__ void moe_plan1_tok(const int32_t *idx, const float *w, int K, int E, int32_t *plan, float *sw) {
    int TK = K, G = TK < E ? TK : E;
    int32_t *gexp = plan + 1, *goff = gexp + G, *stok = goff + G + 1, *spos = stok + TK;
    int ng = 0;
    for (int k = 0; k < K; k++) spos[k] = -1;
    /* selection sort over K slots by expert id; duplicates keep their first k */
    int last = -1;
    for (int g = 0; g < K; g++) {
        int best = -1;
        for (int k = 0; k < K; k++) {
            int e = idx[k];
            if (e > last && (best < 0 || e < idx[best])) best = k;
        }
        if (best < 0) break;
        last = idx[best];
        gexp[ng] = last;
        goff[ng] = ng;
        stok[ng] = 0;
        sw[ng] = w[best];
        spos[best] = ng;
        ng++;
    }
    goff[ng] = ng;
    plan[0] = ng;
}

__global__ void k_moe_plan1(const int32_t *__restrict__ idx, const float *__restrict__ w, int K,
                            int E, int32_t *plan, float *sw) {
    if (threadIdx.x == 0) moe_plan1_tok(idx, w, K, E, plan, sw);
}

extern "C" int mk_cuda_moe_plan(mk_cuda_ctx *ctx, const int32_t *idx, const float *w, int T, int K,
                                int E, int32_t *plan, float *sw, mk_err *err) {
    if (T <= 0) return MK_OK;
    if (T == 1) k_moe_plan1<<<1, 32, 0, ctx->stream>>>(idx, w, K, E, plan, sw);
    else if (E <= PLAN_EMAX)
        (void)mk_cuda_launch_pdl(ctx, 1, PLAN_W * 32, sizeof(int32_t) * (size_t)(PLAN_W + 1) * E, k_moe_plan_par, idx, w, T, K, E,
                                                                                                  plan, sw);
    else (void)mk_cuda_launch_pdl(ctx, 1, 256, sizeof(int32_t) * (size_t)E, k_moe_plan, idx, w, T, K, E, plan, sw);
    MK_CU_LAUNCHED(err, "cuda: moe_plan launch");
    return MK_OK;
}

/* ---- grouped expert GEMV --------------------------------------------------------------------- */

__device__ __forceinline__ float2 d_h2f2(uint32_t u) {
    __half2 h;
    memcpy(&h, &u, sizeof h);
    return __half22float2(h);
}

/* Decodes the 16 weight bytes of chunk c of row j into EPC floats and returns the chunk's scale. */
template <int KIND>
__device__ __forceinline__ float d_load_chunk(const void *W, const uint8_t *S, int j, int k,
                                              int c, float *wv) {
    if (KIND == MK_W_BF16) {
        uint4 q = mk_d_ld_stream((const uint8_t *)W + ((size_t)j * k + (size_t)c * 8) * 2);
        uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            wv[2 * i] = __uint_as_float(u[i] << 16);
            wv[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        }
        return 1.0f;
    } else if (KIND == MK_W_FP8) {
        uint4 q = mk_d_ld_stream((const uint8_t *)W + (size_t)j * k + (size_t)c * 16);
        uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t lo = mk_d_e4m3x2_to_f16x2(u[i] & 0xffff), hi = mk_d_e4m3x2_to_f16x2(u[i] >> 16);
            float2 a = d_h2f2(lo), b = d_h2f2(hi);
            wv[4 * i] = a.x;
            wv[4 * i + 1] = a.y;
            wv[4 * i + 2] = b.x;
            wv[4 * i + 3] = b.y;
        }
        int nbk = (k + 127) >> 7;
        return mk_d_e8m0(S[(size_t)(j >> 7) * nbk + ((c * 16) >> 7)]);
    } else { /* FP4: 32 values, one per-32 scale */
        uint4 q = mk_d_ld_stream((const uint8_t *)W + (size_t)j * (k / 2) + (size_t)c * 16);
        uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t ev, od;
            mk_d_fp4x8_to_e4m3(u[i], ev, od); /* values x 2^-6 */
            uint32_t e01 = mk_d_e4m3x2_to_f16x2(ev & 0xffff), e23 = mk_d_e4m3x2_to_f16x2(ev >> 16);
            uint32_t o01 = mk_d_e4m3x2_to_f16x2(od & 0xffff), o23 = mk_d_e4m3x2_to_f16x2(od >> 16);
            float2 a = d_h2f2(e01), b = d_h2f2(e23);
            float2 p = d_h2f2(o01), r = d_h2f2(o23);
            wv[8 * i + 0] = a.x;
            wv[8 * i + 2] = a.y;
            wv[8 * i + 4] = b.x;
            wv[8 * i + 6] = b.y;
            wv[8 * i + 1] = p.x;
            wv[8 * i + 3] = p.y;
            wv[8 * i + 5] = r.x;
            wv[8 * i + 7] = r.y;
        }
        return mk_d_e8m0(S[(size_t)j * (k / 32) + c]) * 64.0f;
    }
}

template <int KIND> struct epc_of { static const int v = KIND == MK_W_BF16 ? 8 : KIND == MK_W_FP8 ? 16 : 32; };

#define MOE_NT 4     /* tokens per pass over a weight row */
#define MOE_WARPS 8  /* output features per block */

/* grid (ceil(n / MOE_WARPS), G). DUAL: W1 and W3 rows, SwiGLU with the slot weight -> out [slot,
 * n]; else W1 rows -> bf16 out. x rows: stok[slot] (by_token) or the slot itself. */
template <int KIND, int DUAL>
__global__ void __launch_bounds__(MOE_WARPS * 32)
    k_moe_gemv(const void *const *__restrict__ W1, const uint8_t *const *__restrict__ S1,
               const void *const *__restrict__ W3, const uint8_t *const *__restrict__ S3, int n,
               int k, const float *__restrict__ xd, int by_token, const int32_t *__restrict__ plan,
               const float *__restrict__ sw, int TK, int E, float lim, float *__restrict__ out) {
    const int EPC = epc_of<KIND>::v;
    int G = TK < E ? TK : E;
    int g = blockIdx.y;
    if (g >= plan[0]) return;
    const int32_t *gexp = plan + 1, *goff = gexp + G, *stok = goff + G + 1;
    int e = gexp[g], s0 = goff[g], s1 = goff[g + 1];
    int j = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (j >= n) return;
    const void *w1 = W1[e];
    const uint8_t *sc1 = S1 ? S1[e] : NULL;
    const void *w3 = DUAL ? W3[e] : NULL;
    const uint8_t *sc3 = DUAL && S3 ? S3[e] : NULL;
    int nch = k / EPC;
    for (int sb = s0; sb < s1; sb += MOE_NT) {
        int nt = min(MOE_NT, s1 - sb);
        const float *xr[MOE_NT];
#pragma unroll
        for (int q = 0; q < MOE_NT; q++) {
            int slot = sb + (q < nt ? q : 0);
            xr[q] = xd + (size_t)(by_token ? stok[slot] : slot) * k;
        }
        float a1[MOE_NT] = {0}, a3[MOE_NT] = {0};
        for (int c = lane; c < nch; c += 32) {
            float wv[EPC], wu[EPC];
            float s_1 = d_load_chunk<KIND>(w1, sc1, j, k, c, wv), s_3 = 0.0f;
            if (DUAL) s_3 = d_load_chunk<KIND>(w3, sc3, j, k, c, wu);
#pragma unroll
            for (int q = 0; q < MOE_NT; q++) {
                if (q >= nt) break;
                const float4 *xv = (const float4 *)(xr[q] + (size_t)c * EPC);
                float p1 = 0.0f, p3 = 0.0f;
#pragma unroll
                for (int i = 0; i < EPC / 4; i++) {
                    float4 x4 = __ldg(xv + i);
                    p1 += wv[4 * i] * x4.x + wv[4 * i + 1] * x4.y + wv[4 * i + 2] * x4.z + wv[4 * i + 3] * x4.w;
                    if (DUAL)
                        p3 += wu[4 * i] * x4.x + wu[4 * i + 1] * x4.y + wu[4 * i + 2] * x4.z + wu[4 * i + 3] * x4.w;
                }
                a1[q] += p1 * s_1;
                if (DUAL) a3[q] += p3 * s_3;
            }
        }
#pragma unroll
        for (int q = 0; q < MOE_NT; q++) {
            if (q >= nt) break;
            float v1 = mk_d_warp_sum(a1[q]);
            float v3 = DUAL ? mk_d_warp_sum(a3[q]) : 0.0f;
            if (lane == 0) {
                int slot = sb + q;
                float o;
                if (DUAL) {
                    float gg = mk_d_bf16r(v1), uu = mk_d_bf16r(v3);
                    if (lim > 0) {
                        uu = uu < -lim ? -lim : uu > lim ? lim : uu;
                        gg = gg > lim ? lim : gg;
                    }
                    float a = __fmul_rn(__fdiv_rn(gg, __fadd_rn(1.0f, expf(-gg))), uu);
                    o = mk_d_bf16r(__fmul_rn(sw[slot], a));
                } else {
                    o = mk_d_bf16r(v1);
                }
                out[(size_t)slot * n + j] = o;
            }
        }
    }
}

extern "C" int mk_cuda_moe_gemv(mk_cuda_ctx *ctx, int kind, const void *const *W1,
                                const uint8_t *const *S1, const void *const *W3,
                                const uint8_t *const *S3, int n, int k, const float *xd,
                                int by_token, const int32_t *plan, const float *sw, int T, int K,
                                int E, float lim, float *out, mk_err *err) {
    int TK = T * K, G = TK < E ? TK : E;
    if (T <= 0) return MK_OK;
    int epc = kind == MK_W_BF16 ? 8 : kind == MK_W_FP8 ? 16 : kind == MK_W_FP4 ? 32 : 0;
    if (!epc || k % epc) return mk_fail(err, MK_EINVAL, "cuda: moe_gemv: kind %d with k %d", kind, k);
    dim3 grid((unsigned)((n + MOE_WARPS - 1) / MOE_WARPS), (unsigned)G);
    int dual = W3 != NULL;
#define MOE_L(KD, DU)                                                                              \
    k_moe_gemv<KD, DU><<<grid, MOE_WARPS * 32, 0, ctx->stream>>>(W1, S1, W3, S3, n, k, xd, by_token, \
                                                                 plan, sw, TK, E, lim, out)
    if (kind == MK_W_BF16) { if (dual) MOE_L(MK_W_BF16, 1); else MOE_L(MK_W_BF16, 0); }
    else if (kind == MK_W_FP8) { if (dual) MOE_L(MK_W_FP8, 1); else MOE_L(MK_W_FP8, 0); }
    else { if (dual) MOE_L(MK_W_FP4, 1); else MOE_L(MK_W_FP4, 0); }
#undef MOE_L
    MK_CU_LAUNCHED(err, "cuda: moe_gemv launch");
    return MK_OK;
}

/* The SwiGLU epilogue of the tensor-core expert path: out[slot, j] from the separate w1 and w3
 * results, with exactly k_moe_gemv's DUAL arithmetic. out may alias v1. */
__global__ void k_moe_swiglu(const float *v1, const float *__restrict__ v3, const float *__restrict__ sw,
                             size_t total, int n, float lim, float *out) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= total) return;
    float gg = mk_d_bf16r(v1[i]), uu = mk_d_bf16r(v3[i]);
    if (lim > 0) {
        uu = uu < -lim ? -lim : uu > lim ? lim : uu;
        gg = gg > lim ? lim : gg;
    }
    float a = __fmul_rn(__fdiv_rn(gg, __fadd_rn(1.0f, expf(-gg))), uu);
    out[i] = mk_d_bf16r(__fmul_rn(sw[i / n], a));
}

extern "C" int mk_cuda_moe_swiglu(mk_cuda_ctx *ctx, const float *v1, const float *v3, const float *sw, int slots,
                                  int n, float lim, float *out, mk_err *err) {
    size_t total = (size_t)slots * n;
    if (!total) return MK_OK;
    k_moe_swiglu<<<(unsigned)((total + 255) / 256), 256, 0, ctx->stream>>>(v1, v3, sw, total, n, lim, out);
    MK_CU_LAUNCHED(err, "cuda: moe swiglu launch");
    return MK_OK;
}

/* ---- combine --------------------------------------------------------------------------------- */

/* Block (t, part): y = 0; y += eo[slot] for t's experts in ascending order; out = bf16(y +
 * shared[t]). */
__global__ void k_moe_combine(const float *__restrict__ eo, const int32_t *__restrict__ idx,
                              const int32_t *__restrict__ plan, int T, int K, int E, int d,
                              const float *__restrict__ shared, float *__restrict__ out) {
    MK_PDL_ENTER(); /* launched with programmatic dependent launch: nothing is touched before */
    __shared__ int32_t ord[64];
    __shared__ int32_t nord;
    int TK = T * K, G = TK < E ? TK : E;
    const int32_t *spos = plan + 1 + 2 * G + 1 + TK;
    int t = blockIdx.x;
    if (threadIdx.x < 32) { /* the token's slots by expert id */
        const int n = mk_d_moe_slot_order(spos + (size_t)t * K, idx + (size_t)t * K, K, ord);
        if (threadIdx.x == 0) nord = n;
    }
    __syncthreads();
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < d; i += gridDim.y * blockDim.x)
        out[(size_t)t * d + i] = mk_d_moe_combined(eo, ord, nord, shared[(size_t)t * d + i], d, i);
}

extern "C" int mk_cuda_moe_combine(mk_cuda_ctx *ctx, const float *eo, const int32_t *idx,
                                   const int32_t *plan, int T, int K, int E, int d,
                                   const float *shared, float *out, mk_err *err) {
    if (T <= 0) return MK_OK;
    if (K > 64) return mk_fail(err, MK_EINVAL, "cuda: moe_combine: K = %d", K);
    /* a token's d outputs over several blocks when there are few tokens (decode) */
    unsigned split = T >= 64 ? 1u : (unsigned)((d + 255) / 256);
    (void)mk_cuda_launch_pdl(ctx, dim3((unsigned)T, split), 256, 0, k_moe_combine, eo, idx, plan, T, K, E, d, shared, out);
    MK_CU_LAUNCHED(err, "cuda: moe_combine launch");
    return MK_OK;
}
