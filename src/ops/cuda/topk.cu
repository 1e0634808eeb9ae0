/* topk.cu — the lightning indexer of a CSA layer on the GPU: its scores and its top-k.
 *
 * Scores (dsv4.c indexer()): for query token t and compressed key j,
 *   sc = bf16(sum_h bf16(relu(bf16(q_th . K_j)) * w_th))
 * summed over heads in order, one warp per (t, j) (the dot's fp32 sum runs in another order than
 * the CPU's mk_vdot). Top-k by rank: element j of a row goes to position
 *   #{i : v_i > v_j} + #{i < j : v_i == v_j}
 * which is the CPU's insertion order (descending, ties to the lower index), exactly, with no
 * sorting network; O(n^2 / threads) per row: fine for a decode's rows up to a few thousand entries
 * (a 4096-token context has 1024), not for long contexts (a radix select would be needed there).
 */
#include "ops/cuda/cuda_common.cuh"

#include <math.h>

/* Visible entries of row t (position start + t): the groups completed by its own position. */
__device__ __forceinline__ int d_vis(int t, int start, int n_all) {
    return min((start + t + 1) / 4, n_all);
}

/* Head weight i: iw[i], or bf16(iw[i] * s) where s != 0 (mk_cuda_scale_bf16's bits). */
__device__ __forceinline__ float d_iw(const float *__restrict__ iw, size_t i, float s) {
    return s != 0.0f ? mk_d_bf16r(__fmul_rn(iw[i], s)) : iw[i];
}

/* ---- every piece of a call in one launch (pieces as for mk_cuda_attn_rows_multi) ---------------- */

/* The scores of every row r of the call (warp per (r, j), j < n_cap): row r of piece P sees
 * P's entries (n_all = (P.start + P.T) / 4 of them, P's block table); sc [R, n_cap]. */
__global__ void k_index_scores_multi(const mk_cuda_apiece *__restrict__ pc, int np, int stride,
                                     const float *__restrict__ iq, const float *__restrict__ iw,
                                     float iw_scale, mk_cuda_paged ikv, int R, int IH, int ID, int n_cap,
                                     float *__restrict__ sc) {
    MK_PDL_ENTER(); /* launched with programmatic dependent launch: nothing is touched before */
    size_t warp = (blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (warp >= (size_t)R * n_cap) return;
    int r = (int)(warp / n_cap), j = (int)(warp - (size_t)r * n_cap);
    const mk_cuda_apiece &P = mk_d_apiece_of(pc, np, stride, r);
    int t = r - P.row0, n_all = (P.start + P.T) / 4;
    if (j >= n_all || j >= d_vis(t, P.start, n_all)) {
        if (lane == 0) sc[(size_t)r * n_cap + j] = -INFINITY;
        return;
    }
    mk_cuda_paged pg = ikv;
    pg.tbl = P.tbl;
    const float *K = mk_d_paged_row(pg, j, ID);
    float acc = 0.0f;
    for (int h = 0; h < IH; h++) {
        const float *q = iq + ((size_t)r * IH + h) * ID;
        float d = 0.0f;
        for (int i = lane; i < ID; i += 32) d += q[i] * K[i];
        d = mk_d_bf16r(mk_d_warp_sum(d));
        if (d < 0) d = 0;
        acc += mk_d_bf16r(__fmul_rn(d, d_iw(iw, (size_t)r * IH + h, iw_scale)));
    }
    if (lane == 0) sc[(size_t)r * n_cap + j] = mk_d_bf16r(acc);
}

/* The same scores with the heads spread over the warps of a block per (r, j), for calls with few
 * (row, entry) pairs (a decode at a short context: a warp per pair ran its 64 heads one after
 * another on a few warps of an idle GPU). Each head's term is computed exactly as above (same lanes,
 * same tree), staged in shared memory, and thread 0 adds them in head order: the same bits. */
#define IDX_MAXH 256
#define IDX_FUSE_MAX 4096 /* the fused top-k stages a row of at most this many scores in shared memory */

/* ---- the top-k by a radix select (tuning index_topk = 1, the default) -----------------------------
 * The rank rule's order is (score descending, entry ascending). A score maps to a 32-bit key with the
 * same order (-0 taken as +0, which the rule counts as equal; NaN scores, which the rule cannot order
 * either, land at one end). Four 8-bit histogram passes find the key T of the kk-th largest entry and
 * how many of the entries equal to T it takes (`need`). The block then collects the entries above T
 * (in any order) and the `need` lowest-indexed entries equal to T (a counted pass in index order),
 * and sorts the kk candidates (key, ~entry) descending by a bitonic network in shared memory: the
 * rank order, so the same picks as the rank loops, in O(vis) passes plus O(kk log^2 kk) instead of
 * O(vis^2). At most IDX_RADIX_MAXK picks; the block's threads a multiple of 32, at least 256 (one
 * per bin) and at most 1024.
 * H100, batch-1 decode after a 4096-token prompt (1024 entries, top-512; session 26): the fused
 * scores + top-k launch 49 us in the graph against 250 us with the scan; step 1.193 ms against 1.398
 * (bench/gpu/results-2026-12-06-topk.md). A wide rank loop (4 entries a thread, no early exit) was no
 * faster than the scan and was removed. */
#define IDX_RADIX_MAXK 2048

__device__ __forceinline__ uint32_t idx_key(float x) {
    if (x == 0.0f) x = 0.0f; /* -0 == +0 for the rank rule */
    const uint32_t u = __float_as_uint(x);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ void index_topk_radix(const float *v, int vis, int kk, int32_t *__restrict__ o) {
    __shared__ unsigned hist[256];
    __shared__ unsigned long long cand[IDX_RADIX_MAXK];
    __shared__ int wsum[32];
    __shared__ uint32_t s_prefix;
    __shared__ int s_need, s_cnt;
    const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5, nwarp = nt >> 5;
    uint32_t prefix = 0, mask = 0;
    int need = kk;
    for (int shift = 24; shift >= 0; shift -= 8) { /* the next 8 bits of T */
        for (int b = tid; b < 256; b += nt) hist[b] = 0;
        __syncthreads();
        for (int j = tid; j < vis; j += nt) {
            const uint32_t kx = idx_key(v[j]);
            if ((kx & mask) == prefix) atomicAdd(&hist[(kx >> shift) & 0xffu], 1u);
        }
        __syncthreads();
        /* the bin holding the need-th largest of the prefix's entries: the b whose suffix sum
         * S(b) = hist[b] + ... + hist[255] reaches need while S(b + 1) does not (one b: S(0) >= need).
         * Thread b < 256 computes S(b) by a suffix scan in its warp plus the totals of the warps above:
         * thread 0 walking the bins took ~17 us a row at a short context (4 passes of 256 dependent
         * shared-memory steps). */
        unsigned h = 0, suf = 0;
        if (tid < 256) {
            h = hist[tid], suf = h;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned up = __shfl_down_sync(0xffffffffu, suf, o);
                if (lane + o < 32) suf += up;
            }
            if (lane == 0) wsum[warp] = (int)suf;
        }
        __syncthreads();
        if (tid < 256) {
            unsigned above = 0;
            for (int w = warp + 1; w < 8; w++) above += (unsigned)wsum[w];
            const unsigned S = suf + above;
            if (S >= (unsigned)need && S - h < (unsigned)need) {
                s_prefix = prefix | ((uint32_t)tid << shift);
                s_need = need - (int)(S - h);
            }
        }
        __syncthreads();
        prefix = s_prefix;
        need = s_need;
        mask |= 0xffu << shift;
        __syncthreads(); /* s_prefix / s_need are rewritten by the next pass */
    }
    const uint32_t T = prefix;
    const int ngt = kk - need; /* entries above T, all taken */
    if (tid == 0) s_cnt = 0;
    __syncthreads();
    for (int j = tid; j < vis; j += nt) {
        const uint32_t kx = idx_key(v[j]);
        if (kx > T) cand[atomicAdd(&s_cnt, 1)] = ((unsigned long long)kx << 32) | (0xffffffffu - (uint32_t)j);
    }
    __syncthreads();
    if (tid == 0) s_cnt = 0; /* now the ties taken so far */
    __syncthreads();
    for (int j0 = 0; j0 < vis; j0 += nt) { /* the ties in entry order, a chunk of nt entries at a time */
        const int j = j0 + tid;
        const bool tie = j < vis && idx_key(v[j]) == T;
        const unsigned bal = __ballot_sync(0xffffffffu, tie);
        if (lane == 0) wsum[warp] = __popc(bal);
        __syncthreads();
        int before = s_cnt + __popc(bal & ((1u << lane) - 1u));
        for (int w = 0; w < warp; w++) before += wsum[w];
        if (tie && before < need) cand[ngt + before] = ((unsigned long long)T << 32) | (0xffffffffu - (uint32_t)j);
        __syncthreads();
        if (tid == 0) {
            int tot = 0;
            for (int w = 0; w < nwarp; w++) tot += wsum[w];
            s_cnt += tot;
        }
        __syncthreads();
        if (s_cnt >= need) break; /* the same value in every thread */
    }
    int P = 1;
    while (P < kk) P <<= 1;
    for (int i = kk + tid; i < P; i += nt) cand[i] = 0ull; /* below every candidate */
    __syncthreads();
    for (int size = 2; size <= P; size <<= 1) { /* bitonic sort, descending */
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = tid; i < P / 2; i += nt) {
                const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
                const bool desc = (lo & size) == 0;
                const unsigned long long a = cand[lo], b = cand[hi];
                if (desc ? a < b : a > b) cand[lo] = b, cand[hi] = a;
            }
            __syncthreads();
        }
    }
    for (int i = tid; i < kk; i += nt) o[i] = (int32_t)(0xffffffffu - (uint32_t)(cand[i] & 0xffffffffull));
}

/* The top-k of row r of piece P from its scores v (n_all visible at most; by rank, ties to the lower
 * index, -1 padded) at sel + P.row0 * sel_cap + t * k_sel, by the whole block. */
__device__ __forceinline__ void index_topk_row(const mk_cuda_apiece &P, int r, const float *v, int sel_cap,
                                               int32_t *__restrict__ sel, int mode) {
    int t = r - P.row0, n_all = (P.start + P.T) / 4, k = P.k_sel;
    if (k <= 0) return;
    int vis = d_vis(t, P.start, n_all);
    int kk = min(k, vis);
    int32_t *o = sel + (size_t)P.row0 * sel_cap + (size_t)t * k;
    for (int i = kk + threadIdx.x; i < k; i += blockDim.x) o[i] = -1;
    if (mode == 1 && kk > 0 && kk <= IDX_RADIX_MAXK && vis > (int)blockDim.x && blockDim.x >= 256) {
        index_topk_radix(v, vis, kk, o);
        return;
    }
    /* a scan per entry that stops once its rank reaches kk: tuning index_topk = 0, and with 1 the rows
     * of at most one entry a thread (a thread's scan is then at most vis steps) or of more than
     * IDX_RADIX_MAXK picks. O(vis^2) work: 250 us of an H100 decode step at 1024 entries */
    for (int j = threadIdx.x; j < vis; j += blockDim.x) {
        float x = v[j];
        int rank = 0;
        for (int i = 0; i < vis && rank < kk; i++) {
            float y = v[i];
            rank += (y > x) || (y == x && i < j);
        }
        if (rank < kk) o[rank] = j;
    }
}

/* The same scores with the heads spread over the warps of a block per (r, j), for calls with few
 * (row, entry) pairs (a decode at a short context: a warp per pair ran its 64 heads one after
 * another on a few warps of an idle GPU). Each head's term is computed exactly as above (same lanes,
 * same tree), staged in shared memory, and thread 0 adds them in head order: the same bits.
 * With cnt (R counters, zero between launches; n_cap <= IDX_FUSE_MAX), the last block of row r to
 * finish (counted there) also runs the row's top-k on the scores, staged in shared memory, and
 * zeroes its counter: no second launch. */
__global__ void __launch_bounds__(256) k_index_scores_multi_hb(const mk_cuda_apiece *__restrict__ pc, int np,
                                                               int stride, const float *__restrict__ iq,
                                                               const float *__restrict__ iw, float iw_scale,
                                                               mk_cuda_paged ikv, int R, int IH, int ID, int n_cap,
                                                               float *__restrict__ sc, int32_t *cnt, int sel_cap,
                                                               int32_t *__restrict__ sel, int mode) {
    MK_PDL_ENTER(); /* launched with programmatic dependent launch: nothing is touched before */
    __shared__ float e[IDX_MAXH];
    __shared__ int last;
    const int r = blockIdx.y, j = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const mk_cuda_apiece &P = mk_d_apiece_of(pc, np, stride, r);
    const int t = r - P.row0, n_all = (P.start + P.T) / 4;
    if (j >= n_all || j >= d_vis(t, P.start, n_all)) {
        if (threadIdx.x == 0) sc[(size_t)r * n_cap + j] = -INFINITY;
    } else {
        mk_cuda_paged pg = ikv;
        pg.tbl = P.tbl;
        const float *K = mk_d_paged_row(pg, j, ID);
        for (int h = warp; h < IH; h += blockDim.x >> 5) {
            const float *q = iq + ((size_t)r * IH + h) * ID;
            float d = 0.0f;
            for (int i = lane; i < ID; i += 32) d += q[i] * K[i];
            d = mk_d_bf16r(mk_d_warp_sum(d));
            if (d < 0) d = 0;
            if (lane == 0) e[h] = mk_d_bf16r(__fmul_rn(d, d_iw(iw, (size_t)r * IH + h, iw_scale)));
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float acc = 0.0f;
            for (int h = 0; h < IH; h++) acc += e[h];
            sc[(size_t)r * n_cap + j] = mk_d_bf16r(acc);
        }
    }
    if (!cnt) return;
    if (threadIdx.x == 0) { /* the score is written before the count (the last block reads every score) */
        __threadfence();
        last = atomicAdd(cnt + r, 1) == n_cap - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    extern __shared__ float vs[];
    for (int i = threadIdx.x; i < n_cap; i += blockDim.x) vs[i] = __ldcg(sc + (size_t)r * n_cap + i);
    __syncthreads();
    index_topk_row(P, r, vs, sel_cap, sel, mode);
    if (threadIdx.x == 0) cnt[r] = 0;
}

/* One block per row r: the top-k of its piece's k_sel by rank (sel at row0 * sel_cap + t * k_sel). */
__global__ void k_index_topk_multi(const mk_cuda_apiece *__restrict__ pc, int np, int stride,
                                   const float *__restrict__ sc, int n_cap, int sel_cap,
                                   int32_t *__restrict__ sel, int mode) {
    MK_PDL_ENTER(); /* launched with programmatic dependent launch: nothing is touched before */
    int r = blockIdx.x;
    index_topk_row(mk_d_apiece_of(pc, np, stride, r), r, sc + (size_t)r * n_cap, sel_cap, sel, mode);
}

extern "C" int mk_cuda_index_multi(mk_cuda_ctx *ctx, const mk_cuda_apiece *pieces, int np, int stride,
                                   const float *iq, const float *iw, float iw_scale, mk_cuda_paged ikv, int R,
                                   int IH, int ID, int n_cap, float *sc, int32_t *cnt, int sel_cap, int32_t *sel,
                                   mk_err *err) {
    if (R <= 0 || np <= 0 || n_cap <= 0) return MK_OK;
    size_t warps = (size_t)R * n_cap;
    /* a block per (row, entry) while a warp each would leave the GPU mostly idle, else a warp each */
    size_t below = ctx->tune.index_block_pairs ? (size_t)ctx->tune.index_block_pairs
                                               : (size_t)(ctx->caps.sm_count > 0 ? ctx->caps.sm_count : 1) * 32;
    if (warps < below && IH <= IDX_MAXH && R <= 65535) {
        const int fuse = cnt && ctx->tune.index_fuse && n_cap <= IDX_FUSE_MAX;
        (void)mk_cuda_launch_pdl(ctx, dim3((unsigned)n_cap, (unsigned)R), 256, fuse ? sizeof(float) * n_cap : 0,
                                 k_index_scores_multi_hb, pieces, np, stride, iq, iw, iw_scale, ikv, R, IH, ID, n_cap, sc,
                                 fuse ? cnt : (int32_t *)NULL, sel_cap, sel, ctx->tune.index_topk);
        MK_CU_LAUNCHED(err, "cuda: index_scores_multi (heads over warps) launch");
        if (fuse) return MK_OK; /* the top-k ran in the scores' last blocks */
    } else {
        (void)mk_cuda_launch_pdl(ctx, (unsigned)((warps * 32 + 255) / 256), 256, 0, k_index_scores_multi, pieces, np, stride, iq, iw,
                                                                                         iw_scale, ikv, R, IH, ID, n_cap, sc);
        MK_CU_LAUNCHED(err, "cuda: index_scores_multi launch");
    }
    (void)mk_cuda_launch_pdl(ctx, R, 256, 0, k_index_topk_multi, pieces, np, stride, sc, n_cap, sel_cap, sel,
                             ctx->tune.index_topk);
    MK_CU_LAUNCHED(err, "cuda: index_topk_multi launch");
    return MK_OK;
}

/* After a forced selection: entries past the visible ones become -1 (dsv4.c). */
__global__ void k_index_clamp(int32_t *sel, int T, int n_all, int start, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= T * k) return;
    int t = i / k;
    if (sel[i] >= d_vis(t, start, n_all)) sel[i] = -1;
}

extern "C" int mk_cuda_index_clamp(mk_cuda_ctx *ctx, int32_t *sel, int T, int n_all, int start,
                                   int k, mk_err *err) {
    if (T <= 0 || k <= 0) return MK_OK;
    k_index_clamp<<<(T * k + 255) / 256, 256, 0, ctx->stream>>>(sel, T, n_all, start, k);
    MK_CU_LAUNCHED(err, "cuda: index_clamp launch");
    return MK_OK;
}
