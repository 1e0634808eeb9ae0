/* sample.cu — a sampled token drawn on the GPU, where the logits are: the host sampler's draw
 * (src/engine/sampler.c: temperature, min_p, top_k, top_p, one Philox uniform per step; bias,
 * penalties and masked stop tokens applied first by mk_cuda_adjust_rows from the sampler's list of
 * adjusted tokens; no logprobs), token for token.
 *
 * One block of 1024 threads per row. The steps and the arithmetic are the host's:
 *   - the logits sanitized as the sampler does (NaN -> -inf, +inf -> FLT_MAX) and their maximum;
 *   - each token's weight exp((l - max) / T) and its integer mass from src/num/sample_math.h
 *     (the same bits on both sides); min_p removes weights below it;
 *   - top_k: the k-th largest logit among the candidates by a radix select over its order-preserving
 *     32-bit key (8 bits a pass); candidates below that value are removed (ties with it kept);
 *     (the passes' decisions and keys are sample_math.h's: tests/unit/test_sampler.c runs the
 *     same passes serially against the host sampler);
 *   - top_p: the candidates in the sampler's order (logit descending, id ascending) as a 64-bit key
 *     (the logit's key, then the complement of the id), and a radix descent over it with each
 *     bin's exact integer mass: the last candidate whose mass before it is below top_p * total,
 *     so the kept set is the host's prefix;
 *   - the draw: the first id (ascending) whose cumulative mass exceeds floor(u * total), with the
 *     uniform's 53 bits given by the caller (mk_philox_u53 of the request's seed and step).
 * Masses are integers, so every sum is exact and its order (atomics, tree, serial) cannot change a
 * decision. A row whose logits are all -inf (or NaN) gets -1, where the host sampler fails.
 * The radix passes count into a histogram per warp (64 KiB of dynamic shared memory, then 24 KiB
 * for sample_bins' gathered candidates), added up
 * after each pass: most candidates of a row share their first key bytes, and one histogram for
 * the block would serialize every atomic of the block on one bin. With the tuning's sample_agg the
 * lanes of a warp that share a bin add to it once (their sum), not one after another.
 * With the tuning's sample_bins, top_k and top_p first sort the candidates into weight bins
 * (sample_math.h's mk_sample_wbin: an earlier bin, larger logits) in a pass they already make (the
 * weights' pass counts them, top_p's total adds their masses): every bin but the one where the
 * count or the mass runs out is settled. Where that bin's candidates fit MK_SAMPLE_GATHER (its
 * exact count for top_k; for top_p its mass over its least mass, a bound), they are gathered into
 * shared memory in one more pass and the radix passes run over them only, from the earlier bins'
 * count or mass: the same decisions (tests/unit/test_sampler.c runs both ways), with 5 passes over
 * the row instead of up to 16 on a row whose cut falls in a sparse bin. Also with sample_bins,
 * top_p's pass over the last byte of the logit's key counts the candidates by bin: where the cut's
 * logit has no tie, its candidate is alone in its range, the id bytes can't split anything, and the
 * descent stops after 4 of its 8 passes (kstar: the logit's key with zero id bits).
 */
#include "ops/cuda/cuda_common.cuh"

#include <cooperative_groups.h>
#include <float.h>
#include <limits.h>

namespace cg = cooperative_groups;

#include "num/sample_math.h"

#define SMP_T 1024
#define SMP_W (SMP_T / 32)

__device__ __forceinline__ float smp_san(float x) { return isnan(x) ? -INFINITY : x == INFINITY ? FLT_MAX : x; }

/* Block-wide reductions (all threads call them; the result reaches every thread): op over the
 * warp by shuffles, then over the warps' results in shared memory (slot: SMP_W entries). */
template <typename T, typename Op> __device__ T smp_reduce(T v, T *slot, Op op) {
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads(); /* the slots' previous readers are done */
    if ((threadIdx.x & 31) == 0) slot[threadIdx.x >> 5] = v;
    __syncthreads();
    v = slot[0];
    for (int w = 1; w < SMP_W; w++) v = op(v, slot[w]);
    return v;
}
struct smp_red {
    float f[SMP_W];
    unsigned long long u[SMP_W];
    int i[SMP_W];
};
__device__ __forceinline__ float smp_max(float v, smp_red &r) {
    return smp_reduce(v, r.f, [](float a, float b) { return fmaxf(a, b); });
}
__device__ __forceinline__ unsigned long long smp_sum(unsigned long long v, smp_red &r) {
    return smp_reduce(v, r.u, [](unsigned long long a, unsigned long long b) { return a + b; });
}
__device__ __forceinline__ int smp_min(int v, smp_red &r) {
    return smp_reduce(v, r.i, [](int a, int b) { return min(a, b); });
}

/* One radix pass's per-warp histograms (whist: SMP_W x 256) added into hist (256 bins); all threads
 * call it after counting (it starts with the barrier that ends the counting). */
__device__ __forceinline__ void smp_hist_sum(const unsigned long long *whist, unsigned long long *hist) {
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += SMP_T) {
        unsigned long long v = 0;
        for (int q = 0; q < SMP_W; q++) v += whist[q * 256 + b];
        hist[b] = v;
    }
    __syncthreads();
}
__device__ __forceinline__ void smp_hist_clear(unsigned long long *whist) {
    for (int b = threadIdx.x; b < SMP_W * 256; b += SMP_T) whist[b] = 0;
    __syncthreads();
}
#define SMP_SMEM (sizeof(unsigned long long) * SMP_W * 256)
/* the gathered candidates of one weight bin (tuning sample_bins), after the histograms: their keys,
 * then their masses */
#define SMP_GATHER_SMEM ((sizeof(unsigned long long) + sizeof(uint32_t)) * MK_SAMPLE_GATHER)
#define SMP_SMEM_ALL (SMP_SMEM + SMP_GATHER_SMEM)

/* Adds m (< 2^32) to bin b of the warp's histogram, or nothing where !ok: the lanes with the same bin
 * add their sum once (most candidates of a pass share a bin; their atomics would run one after
 * another). The sum of a group is exact: two 16-bit halves summed in 32 bits. Called by every
 * active lane of the warp together. */
template <bool AGG>
__device__ __forceinline__ void smp_hist_add(unsigned long long *my, int ok, uint32_t b, uint32_t m) {
    if (!AGG) { /* one atomic per lane (tuning sample_agg 0) */
        if (ok) atomicAdd(&my[b], (unsigned long long)m);
        return;
    }
    const unsigned peers = __match_any_sync(__activemask(), ok ? b : 0xffffffffu);
    const uint32_t lo = __reduce_add_sync(peers, ok ? (m & 0xffffu) : 0u);
    const uint32_t hi = __reduce_add_sync(peers, ok ? (m >> 16) : 0u);
    if (ok && (int)(threadIdx.x & 31) == __ffs(peers) - 1)
        atomicAdd(&my[b], ((unsigned long long)hi << 16) + lo);
}

/* Adds 1 to cnt[b] where ok (called by every active lane of the warp together): with AGG, once per
 * group of lanes with the same bin (their number). */
template <bool AGG> __device__ __forceinline__ void smp_cnt_add(unsigned *cnt, int ok, uint32_t b) {
    if (!AGG) {
        if (ok) atomicAdd(&cnt[b], 1u);
        return;
    }
    const unsigned peers = __match_any_sync(__activemask(), ok ? b : 0xffffffffu);
    if (ok && (int)(threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&cnt[b], (unsigned)__popc(peers));
}

/* Row blockIdx.x of logits [rows, V]: its draw d, its weights into ws [rows, V] (scratch), the
 * token into out; bins: the tuning's sample_bins. */
template <bool AGG>
__global__ void __launch_bounds__(SMP_T) k_sample_rows(const float *__restrict__ logits, int V,
                                                       const mk_sample_draw *__restrict__ draws, float *__restrict__ ws,
                                                       int32_t *__restrict__ out, int bins) {
    MK_PDL_ENTER(); /* launched with programmatic dependent launch: nothing is touched before */
    __shared__ smp_red red;
    __shared__ unsigned long long hist[256];
    extern __shared__ unsigned long long whist[]; /* [SMP_W][256], then the gathered keys and masses */
    unsigned long long *my = whist + (threadIdx.x >> 5) * 256;
    unsigned long long *gk = whist + SMP_W * 256;
    uint32_t *gm = (uint32_t *)(gk + MK_SAMPLE_GATHER);
    __shared__ int sel_bin, gn;
    __shared__ unsigned long long sel_val;
    __shared__ unsigned cnt1[256]; /* with bins: top_p's candidates by their last logit byte */
    const int tid = threadIdx.x, row = blockIdx.x;
    const float *l = logits + (size_t)row * V;
    float *w = ws + (size_t)row * V;
    const mk_sample_draw d = draws[row];
    if (!(d.inv_t > 0.0f)) return; /* a row without a draw (the whole block returns) */

    /* the maximum of the sanitized logits */
    float mx = -INFINITY;
    for (int i = tid; i < V; i += SMP_T) mx = fmaxf(mx, smp_san(l[i]));
    mx = smp_max(mx, red);
    if (mx == -INFINITY) { /* every token masked */
        if (tid == 0) out[row] = -1;
        return;
    }
    /* weights (min_p applied) and the candidate count; with bins and a top_k, by weight bin too */
    const int kbins = bins && d.top_k > 0 && d.top_k < V;
    if (kbins) smp_hist_clear(whist);
    unsigned long long n = 0;
    for (int i = tid; i < V; i += SMP_T) {
        float wi = mk_sample_weight(smp_san(l[i]), mx, d.inv_t);
        if (d.min_p > 0.0f && wi < d.min_p) wi = 0.0f;
        w[i] = wi;
        n += wi > 0.0f;
        if (kbins) smp_hist_add<AGG>(my, wi > 0.0f, (uint32_t)mk_sample_wbin(wi), 1u);
    }
    n = smp_sum(n, red); /* its barriers also make w visible to the whole block */

    /* top_k: the k-th largest logit among the candidates (its value: ties with it stay) */
    float thr = -INFINITY;
    if (d.top_k > 0 && d.top_k < V && n > (unsigned long long)d.top_k) {
        uint32_t prefix = 0, mask = 0;
        unsigned long long k = (unsigned long long)d.top_k;
        int m = -1; /* the gathered candidates of the k-th's weight bin; -1: the passes read the row */
        if (kbins) {
            smp_hist_sum(whist, hist);
            if (tid == 0) sel_bin = mk_sample_topk_wbin(hist, k, &sel_val), gn = 0;
            __syncthreads();
            const int bb = sel_bin;
            if (hist[bb] <= MK_SAMPLE_GATHER) { /* the k-th is the (k - earlier bins')-th of bin bb */
                k -= sel_val;
                for (int i = tid; i < V; i += SMP_T) {
                    const float wi = w[i];
                    if (wi > 0.0f && mk_sample_wbin(wi) == bb) {
                        const int j = atomicAdd(&gn, 1);
                        if (j < MK_SAMPLE_GATHER) gk[j] = mk_sample_key(smp_san(l[i]));
                    }
                }
                __syncthreads();
                m = min(gn, MK_SAMPLE_GATHER); /* = hist[bb] */
            }
        }
        const int nn = m < 0 ? V : m;
        for (int shift = 24; shift >= 0; shift -= 8) {
            smp_hist_clear(whist);
            for (int i = tid; i < nn; i += SMP_T) {
                const uint32_t key = m < 0 ? mk_sample_key(smp_san(l[i])) : (uint32_t)gk[i];
                const int ok = (m >= 0 || w[i] > 0.0f) && (key & mask) == prefix;
                smp_hist_add<AGG>(my, ok, (key >> shift) & 255u, 1u);
            }
            smp_hist_sum(whist, hist);
            if (tid == 0) sel_bin = mk_sample_topk_bin(hist, k, &sel_val); /* the bin holding the k-th */
            __syncthreads();
            prefix |= (uint32_t)sel_bin << shift;
            mask |= 255u << shift;
            k = sel_val;
            __syncthreads();
        }
        thr = mk_sample_unkey(prefix);
    }

    /* top_p: the kept prefix of the candidates in the sampler's order, by exact masses */
    unsigned long long kstar = 0; /* candidates with key >= kstar are kept (0: all) */
    if (d.top_p < 1.0f) {
        if (bins) smp_hist_clear(whist);
        unsigned long long n2 = 0, z = 0;
        for (int i = tid; i < V; i += SMP_T) {
            const float wi = w[i];
            const int ok = wi > 0.0f && smp_san(l[i]) >= thr;
            if (ok) n2++, z += mk_sample_mass(wi);
            if (bins) smp_hist_add<AGG>(my, ok, (uint32_t)mk_sample_wbin(wi), ok ? mk_sample_mass(wi) : 0u);
        }
        n2 = smp_sum(n2, red);
        z = smp_sum(z, red);
        if (n2 > 1) {
            const double target = __dmul_rn((double)d.top_p, (double)z);
            unsigned long long prefix = 0, mask = 0, above = 0; /* above: the mass before the prefix's range */
            int m = -1; /* the gathered candidates of the cut's weight bin; -1: the passes read the row */
            if (bins) {
                smp_hist_sum(whist, hist);
                if (tid == 0) sel_bin = mk_sample_topp_wbin(hist, target, &sel_val), gn = 0;
                __syncthreads();
                const int bb = sel_bin;
                if (hist[bb] / mk_sample_wbin_min_mass(bb) <= MK_SAMPLE_GATHER) { /* a bound on its count */
                    above = sel_val;
                    for (int i = tid; i < V; i += SMP_T) {
                        const float wi = w[i], v = smp_san(l[i]);
                        if (wi > 0.0f && v >= thr && mk_sample_wbin(wi) == bb) {
                            const int j = atomicAdd(&gn, 1);
                            if (j < MK_SAMPLE_GATHER) gk[j] = mk_sample_order_key(v, i), gm[j] = mk_sample_mass(wi);
                        }
                    }
                    __syncthreads();
                    m = min(gn, MK_SAMPLE_GATHER);
                }
            }
            const int nn = m < 0 ? V : m;
            for (int shift = 56; shift >= 0; shift -= 8) {
                /* with bins, the last logit byte's pass also counts (the cut's logit without a tie:
                 * the id bytes can't split anything, and the descent stops) */
                const int count = bins && shift == 32;
                if (count)
                    for (int b = tid; b < 256; b += SMP_T) cnt1[b] = 0;
                smp_hist_clear(whist);
                for (int i = tid; i < nn; i += SMP_T) {
                    unsigned long long key;
                    uint32_t ms = 0;
                    int ok;
                    if (m < 0) {
                        const float wi = w[i], v = smp_san(l[i]);
                        key = mk_sample_order_key(v, i);
                        ok = wi > 0.0f && v >= thr && (key & mask) == prefix;
                        if (ok) ms = mk_sample_mass(wi);
                    } else {
                        key = gk[i];
                        ok = (key & mask) == prefix;
                        ms = gm[i];
                    }
                    const uint32_t b = (uint32_t)(key >> shift) & 255u;
                    smp_hist_add<AGG>(my, ok, b, ok ? ms : 0u);
                    if (count) smp_cnt_add<AGG>(cnt1, ok, b);
                }
                smp_hist_sum(whist, hist);
                if (tid == 0) sel_bin = mk_sample_topp_bin(hist, above, target, &sel_val);
                __syncthreads();
                /* sel_bin >= 0: the prefix is a kept candidate's, so the first non-empty bin under it
                 * starts at its mass before, which is < target (> 0: top_p > 0, z >= 2^31) */
                prefix |= (unsigned long long)sel_bin << shift;
                mask |= 255ull << shift;
                above = sel_val;
                const int alone = count && cnt1[sel_bin] == 1;
                __syncthreads();
                if (alone) break; /* kstar: the logit's key, id bits 0 */
            }
            kstar = prefix;
        }
    }

    /* the draw: per thread a run of consecutive ids, the runs' exact masses scanned in order */
    const int per = (V + SMP_T - 1) / SMP_T, i0 = tid * per, i1 = min(V, i0 + per);
    auto kept_mass = [&](int i) -> unsigned long long {
        const float wi = w[i], v = smp_san(l[i]);
        if (!(wi > 0.0f && v >= thr)) return 0;
        if (kstar && mk_sample_order_key(v, i) < kstar) return 0;
        return mk_sample_mass(wi);
    };
    unsigned long long mine = 0;
    for (int i = i0; i < i1; i++) mine += kept_mass(i);
    const unsigned long long total = smp_sum(mine, red);
    const unsigned long long t = mk_sample_target(d.u53, total);
    /* exclusive prefix of the runs: a warp scan, then the warps' totals */
    unsigned long long incl = mine;
    const int lane = tid & 31, warp = tid >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    __syncthreads();
    if (lane == 31) red.u[warp] = incl;
    __syncthreads();
    unsigned long long c = incl - mine;
    for (int q = 0; q < warp; q++) c += red.u[q];
    int found = INT_MAX;
    if (c + mine > t) /* the target falls in this run */
        for (int i = i0; i < i1; i++) {
            c += kept_mass(i);
            if (c > t) {
                found = i;
                break;
            }
        }
    found = smp_min(found, red);
    if (tid == 0) out[row] = found == INT_MAX ? -1 : found;
}

/* Row blockIdx.x's adjusted tokens (mk_cuda_adjust_rows): one entry per token, so no two threads
 * write one logit. */
__global__ void __launch_bounds__(256) k_adjust_rows(float *__restrict__ logits, int V,
                                                     const mk_sample_draw *__restrict__ draws,
                                                     const mk_sample_adj *__restrict__ adj) {
    MK_PDL_ENTER();
    const mk_sample_draw d = draws[blockIdx.x];
    float *l = logits + (size_t)blockIdx.x * V;
    for (int e = threadIdx.x; e < d.n_adj; e += blockDim.x) {
        const mk_sample_adj a = adj[d.adj_off + e];
        if (a.id < 0 || a.id >= V) continue; /* checked on the host: never */
        l[a.id] = mk_sample_adjust(smp_san(l[a.id]), &a, d.rep, d.freq, d.pres);
    }
}

extern "C" int mk_cuda_adjust_rows(mk_cuda_ctx *ctx, float *logits, int rows, int V, const mk_sample_draw *draws,
                                   const mk_sample_adj *adj, mk_err *err) {
    if (rows <= 0) return MK_OK;
    if (V <= 0 || !logits || !draws || !adj)
        return mk_fail(err, MK_EINVAL, "cuda: adjust rows: bad arguments (rows of %d values)", V);
    (void)mk_cuda_launch_pdl(ctx, rows, 256, 0, k_adjust_rows, logits, V, draws, adj);
    MK_CU_LAUNCHED(err, "cuda: adjust rows launch");
    return MK_OK;
}

/* ---- the draw by a cluster of SMC_NB blocks per row (tuning sample_cluster) ----------------------
 * The same steps and decisions as k_sample_rows, each block holding a contiguous slice of the row
 * (ids [V * rank / SMC_NB, V * (rank + 1) / SMC_NB)) in shared memory, logits and weights: the
 * passes read shared memory instead of a whole row from L2 on one SM (latency-bound: ~8 passes of
 * 1 MB each). What the single block reduced over the row, the cluster reduces over the blocks'
 * results through distributed shared memory, in rank order; the histograms are integer counts and
 * masses, so every block sees the same exact totals and takes the same decisions. Ids stay global:
 * the sampler's order keys and the draw's ascending scan are those of the whole row. */
#define SMC_NB 8

/* v (every thread of every block holds its block's) combined over the cluster's blocks in rank
 * order; slot: two local entries used in turn (a block is at most one exchange ahead of another). */
template <typename T, typename Op> __device__ T smc_all(cg::cluster_group &cl, T v, T *slot, int &buf, Op op) {
    if (threadIdx.x == 0) slot[buf] = v;
    cl.sync();
    T r = *cl.map_shared_rank(&slot[buf], 0);
    for (int q = 1; q < SMC_NB; q++) r = op(r, *cl.map_shared_rank(&slot[buf], q));
    buf ^= 1;
    return r;
}

/* One radix pass's totals over the cluster: the block's per-warp histograms summed into its
 * hist[hb] (256 bins), then every block's summed in rank order into tot (all threads call it). */
__device__ __forceinline__ void smc_hist_total(cg::cluster_group &cl, const unsigned long long *whist,
                                               unsigned long long (*hist)[256], int &hb, unsigned long long *tot) {
    smp_hist_sum(whist, hist[hb]);
    cl.sync();
    for (int b = threadIdx.x; b < 256; b += SMP_T) {
        unsigned long long v = 0;
        for (int q = 0; q < SMC_NB; q++) v += cl.map_shared_rank(hist[hb], q)[b];
        tot[b] = v;
    }
    hb ^= 1;
    __syncthreads();
}

template <bool AGG>
__global__ void __launch_bounds__(SMP_T) k_sample_cluster(const float *__restrict__ logits, int V,
                                                          const mk_sample_draw *__restrict__ draws,
                                                          int32_t *__restrict__ out, int bins) {
    cg::cluster_group cl = cg::this_cluster();
    __shared__ smp_red red;
    __shared__ unsigned long long hist[2][256], tot[256];
    __shared__ unsigned long long xu[2];
    __shared__ float xf[2];
    __shared__ int xi[2];
    __shared__ int sel_bin, gn;
    __shared__ unsigned long long sel_val;
    __shared__ unsigned cnt1[256]; /* with bins: top_p's candidates by their last logit byte */
    /* [SMP_W][256], the gathered keys and masses, then the slice's logits and weights */
    extern __shared__ unsigned long long whist[];
    const int tid = threadIdx.x, rank = (int)cl.block_rank(), row = blockIdx.x / SMC_NB;
    const int a = (int)((long long)V * rank / SMC_NB), n_loc = (int)((long long)V * (rank + 1) / SMC_NB) - a;
    const int cap = (V + SMC_NB - 1) / SMC_NB;
    unsigned long long *gk = whist + SMP_W * 256;
    uint32_t *gm = (uint32_t *)(gk + MK_SAMPLE_GATHER);
    float *sl = (float *)(gm + MK_SAMPLE_GATHER), *sw = sl + cap;
    unsigned long long *my = whist + (threadIdx.x >> 5) * 256;
    int bu = 0, bf = 0, bi = 0, hb = 0;
    const auto fmax_op = [](float x, float y) { return fmaxf(x, y); };
    const auto add_op = [](unsigned long long x, unsigned long long y) { return x + y; };
    const float *l = logits + (size_t)row * V + a;
    const mk_sample_draw d = draws[row];
    if (!(d.inv_t > 0.0f)) return; /* a row without a draw: the whole cluster returns */

    /* the slice, sanitized, and the maximum */
    float mx = -INFINITY;
#pragma unroll 8
    for (int i = tid; i < n_loc; i += SMP_T) {
        const float v = smp_san(l[i]);
        sl[i] = v;
        mx = fmaxf(mx, v);
    }
    mx = smp_max(mx, red);
    mx = smc_all(cl, mx, xf, bf, fmax_op);
    if (mx == -INFINITY) { /* every token masked */
        if (rank == 0 && tid == 0) out[row] = -1;
        cl.sync(); /* no block leaves while another may read its slots */
        return;
    }
    const int kbins = bins && d.top_k > 0 && d.top_k < V;
    if (kbins) smp_hist_clear(whist);
    unsigned long long n = 0;
    for (int i = tid; i < n_loc; i += SMP_T) {
        float wi = mk_sample_weight(sl[i], mx, d.inv_t);
        if (d.min_p > 0.0f && wi < d.min_p) wi = 0.0f;
        sw[i] = wi;
        n += wi > 0.0f;
        if (kbins) smp_hist_add<AGG>(my, wi > 0.0f, (uint32_t)mk_sample_wbin(wi), 1u);
    }
    n = smp_sum(n, red); /* its barriers make sw visible to the block */
    n = smc_all(cl, n, xu, bu, add_op);

    float thr = -INFINITY;
    if (d.top_k > 0 && d.top_k < V && n > (unsigned long long)d.top_k) {
        uint32_t prefix = 0, mask = 0;
        unsigned long long k = (unsigned long long)d.top_k;
        int m = -1; /* the block's gathered candidates of the k-th's weight bin; -1: its slice */
        if (kbins) {
            smc_hist_total(cl, whist, hist, hb, tot); /* the cluster's counts by bin: one decision */
            if (tid == 0) sel_bin = mk_sample_topk_wbin(tot, k, &sel_val), gn = 0;
            __syncthreads();
            const int bb = sel_bin;
            if (tot[bb] <= MK_SAMPLE_GATHER) {
                k -= sel_val;
                for (int i = tid; i < n_loc; i += SMP_T) {
                    const float wi = sw[i];
                    if (wi > 0.0f && mk_sample_wbin(wi) == bb) {
                        const int j = atomicAdd(&gn, 1);
                        if (j < MK_SAMPLE_GATHER) gk[j] = mk_sample_key(sl[i]);
                    }
                }
                __syncthreads();
                m = min(gn, MK_SAMPLE_GATHER);
            }
        }
        const int nn = m < 0 ? n_loc : m;
        for (int shift = 24; shift >= 0; shift -= 8) {
            smp_hist_clear(whist);
            for (int i = tid; i < nn; i += SMP_T) {
                const uint32_t key = m < 0 ? mk_sample_key(sl[i]) : (uint32_t)gk[i];
                const int ok = (m >= 0 || sw[i] > 0.0f) && (key & mask) == prefix;
                smp_hist_add<AGG>(my, ok, (key >> shift) & 255u, 1u);
            }
            smc_hist_total(cl, whist, hist, hb, tot);
            if (tid == 0) sel_bin = mk_sample_topk_bin(tot, k, &sel_val);
            __syncthreads();
            prefix |= (uint32_t)sel_bin << shift;
            mask |= 255u << shift;
            k = sel_val;
            __syncthreads();
        }
        thr = mk_sample_unkey(prefix);
    }

    unsigned long long kstar = 0;
    if (d.top_p < 1.0f) {
        if (bins) smp_hist_clear(whist);
        unsigned long long n2 = 0, z = 0;
        for (int i = tid; i < n_loc; i += SMP_T) {
            const float wi = sw[i];
            const int ok = wi > 0.0f && sl[i] >= thr;
            if (ok) n2++, z += mk_sample_mass(wi);
            if (bins) smp_hist_add<AGG>(my, ok, (uint32_t)mk_sample_wbin(wi), ok ? mk_sample_mass(wi) : 0u);
        }
        n2 = smc_all(cl, smp_sum(n2, red), xu, bu, add_op);
        z = smc_all(cl, smp_sum(z, red), xu, bu, add_op);
        if (n2 > 1) {
            const double target = __dmul_rn((double)d.top_p, (double)z);
            unsigned long long prefix = 0, mask = 0, above = 0;
            int m = -1;
            if (bins) {
                smc_hist_total(cl, whist, hist, hb, tot); /* the cluster's masses by bin */
                if (tid == 0) sel_bin = mk_sample_topp_wbin(tot, target, &sel_val), gn = 0;
                __syncthreads();
                const int bb = sel_bin;
                if (tot[bb] / mk_sample_wbin_min_mass(bb) <= MK_SAMPLE_GATHER) { /* bounds every block's count */
                    above = sel_val;
                    for (int i = tid; i < n_loc; i += SMP_T) {
                        const float wi = sw[i], v = sl[i];
                        if (wi > 0.0f && v >= thr && mk_sample_wbin(wi) == bb) {
                            const int j = atomicAdd(&gn, 1);
                            if (j < MK_SAMPLE_GATHER) gk[j] = mk_sample_order_key(v, a + i), gm[j] = mk_sample_mass(wi);
                        }
                    }
                    __syncthreads();
                    m = min(gn, MK_SAMPLE_GATHER);
                }
            }
            const int nn = m < 0 ? n_loc : m;
            for (int shift = 56; shift >= 0; shift -= 8) {
                const int count = bins && shift == 32; /* as k_sample_rows: the count, over the cluster */
                if (count)
                    for (int b = tid; b < 256; b += SMP_T) cnt1[b] = 0;
                smp_hist_clear(whist);
                for (int i = tid; i < nn; i += SMP_T) {
                    unsigned long long key;
                    uint32_t ms = 0;
                    int ok;
                    if (m < 0) {
                        const float wi = sw[i], v = sl[i];
                        key = mk_sample_order_key(v, a + i);
                        ok = wi > 0.0f && v >= thr && (key & mask) == prefix;
                        if (ok) ms = mk_sample_mass(wi);
                    } else {
                        key = gk[i];
                        ok = (key & mask) == prefix;
                        ms = gm[i];
                    }
                    const uint32_t b = (uint32_t)(key >> shift) & 255u;
                    smp_hist_add<AGG>(my, ok, b, ok ? ms : 0u);
                    if (count) smp_cnt_add<AGG>(cnt1, ok, b);
                }
                smc_hist_total(cl, whist, hist, hb, tot); /* its cluster barrier also publishes cnt1 */
                if (tid == 0) sel_bin = mk_sample_topp_bin(tot, above, target, &sel_val);
                __syncthreads();
                prefix |= (unsigned long long)sel_bin << shift;
                mask |= 255ull << shift;
                above = sel_val;
                unsigned c1 = 0; /* written once per launch: no later pass overwrites a block's cnt1 */
                if (count)
                    for (int q = 0; q < SMC_NB; q++) c1 += cl.map_shared_rank(cnt1, q)[sel_bin];
                const int alone = c1 == 1;
                __syncthreads();
                if (alone) break;
            }
            kstar = prefix;
        }
    }

    /* the draw: per thread a run of consecutive ids of the slice; the slices in rank order */
    const int per = (n_loc + SMP_T - 1) / SMP_T, i0 = tid * per, i1 = min(n_loc, i0 + per);
    auto kept_mass = [&](int i) -> unsigned long long {
        const float wi = sw[i], v = sl[i];
        if (!(wi > 0.0f && v >= thr)) return 0;
        if (kstar && mk_sample_order_key(v, a + i) < kstar) return 0;
        return mk_sample_mass(wi);
    };
    unsigned long long mine = 0;
    for (int i = i0; i < i1; i++) mine += kept_mass(i);
    const unsigned long long blk = smp_sum(mine, red);
    if (tid == 0) xu[bu] = blk;
    cl.sync();
    unsigned long long total = 0, before = 0;
    for (int q = 0; q < SMC_NB; q++) {
        const unsigned long long v = *cl.map_shared_rank(&xu[bu], q);
        total += v;
        if (q < rank) before += v;
    }
    bu ^= 1;
    const unsigned long long t = mk_sample_target(d.u53, total);
    unsigned long long incl = mine;
    const int lane = tid & 31, warp = tid >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
    }
    __syncthreads();
    if (lane == 31) red.u[warp] = incl;
    __syncthreads();
    unsigned long long c = before + incl - mine;
    for (int q = 0; q < warp; q++) c += red.u[q];
    int found = INT_MAX;
    if (c + mine > t)
        for (int i = i0; i < i1; i++) {
            c += kept_mass(i);
            if (c > t) {
                found = a + i;
                break;
            }
        }
    found = smp_min(found, red);
    found = smc_all(cl, found, xi, bi, [](int x, int y) { return min(x, y); });
    if (rank == 0 && tid == 0) out[row] = found == INT_MAX ? -1 : found;
    cl.sync(); /* no block leaves while another may read its slots */
}

/* Dynamic shared memory of k_sample_cluster for rows of V values; SMC_STATIC_MAX bounds its static
 * shared memory (7728 bytes, ptxas for sm_90a: 464 to spare; more and the opt-in fails, an error,
 * not a fallback), so dynamic + static fit the device's opt-in limit. */
#define SMC_STATIC_MAX 8192
static size_t smc_smem(int V) { return SMP_SMEM_ALL + sizeof(float) * 2 * (size_t)((V + SMC_NB - 1) / SMC_NB); }

/* sample_cluster's answer when the device refuses the cluster kernel's shared memory (its static part
 * grown past SMC_STATIC_MAX, say): the caller draws with one block per row instead, noted once.
 * NOTE_SAMPLE_CLUSTER: a bit of the context's logged notes (linear.cu's use bits 0-4). */
#define SMC_REFUSED 1
enum { NOTE_SAMPLE_CLUSTER = 16 };
static int sample_cluster(mk_cuda_ctx *ctx, const float *logits, int rows, int V, const mk_sample_draw *draws,
                          int32_t *out, mk_err *err) {
    const int agg = ctx->tune.sample_agg;
    const void *fn = agg ? (const void *)k_sample_cluster<true> : (const void *)k_sample_cluster<false>;
    const size_t smem = smc_smem(V);
    /* opted in once per kernel, so at the most any vocabulary taking this path needs (the caller's
     * bound): a later, larger V must not outgrow the first call's size */
    mk_err oe = {0, {0}};
    if (mk_cuda_smem_optin(ctx, agg ? MK_OPTIN_SAMPLE_CL_AGG : MK_OPTIN_SAMPLE_CL, fn,
                           ctx->caps.smem_optin - SMC_STATIC_MAX, &oe)) {
        char msg[sizeof oe.msg + 96];
        snprintf(msg, sizeof msg, "the cluster draw's shared memory was refused (%s): one block per row draws", oe.msg);
        mk_cuda_note(ctx, NOTE_SAMPLE_CLUSTER, msg);
        return SMC_REFUSED;
    }
    const int bins = ctx->tune.sample_bins;
    const dim3 grid((unsigned)rows * SMC_NB), block(SMP_T);
    if (agg)
        (void)mk_cuda_launch_cluster(ctx, grid, block, smem, SMC_NB, 0, k_sample_cluster<true>, logits, V, draws, out,
                                     bins);
    else
        (void)mk_cuda_launch_cluster(ctx, grid, block, smem, SMC_NB, 0, k_sample_cluster<false>, logits, V, draws, out,
                                     bins);
    MK_CU_LAUNCHED(err, "cuda: sample (cluster) launch");
    return MK_OK;
}

extern "C" int mk_cuda_sample_uses_cluster(const mk_cuda_ctx *ctx, int rows, int V) {
    /* a cluster per row where its slices fit in shared memory (with the static part), for launches of
     * at most sample_cluster_rows rows (0: any) */
    return ctx->tune.sample_cluster && (!ctx->tune.sample_cluster_rows || rows <= ctx->tune.sample_cluster_rows) &&
           V >= SMC_NB && smc_smem(V) + SMC_STATIC_MAX <= ctx->caps.smem_optin;
}

extern "C" int mk_cuda_sample_rows(mk_cuda_ctx *ctx, const float *logits, int rows, int V, const mk_sample_draw *draws,
                                   float *ws, int32_t *out, mk_err *err) {
    if (rows <= 0) return MK_OK;
    if (V <= 0 || !logits || !draws || !ws || !out)
        return mk_fail(err, MK_EINVAL, "cuda: sample: bad arguments (rows of %d values)", V);
    if (mk_cuda_sample_uses_cluster(ctx, rows, V)) {
        const int st = sample_cluster(ctx, logits, rows, V, draws, out, err);
        if (st != SMC_REFUSED) return st;
    }
    const int agg = ctx->tune.sample_agg;
    int st = mk_cuda_smem_optin(ctx, agg ? MK_OPTIN_SAMPLE_AGG : MK_OPTIN_SAMPLE,
                                agg ? (const void *)k_sample_rows<true> : (const void *)k_sample_rows<false>,
                                SMP_SMEM_ALL, err);
    if (st) return st;
    (void)mk_cuda_launch_pdl(ctx, rows, SMP_T, SMP_SMEM_ALL, agg ? k_sample_rows<true> : k_sample_rows<false>, logits,
                             V, draws, ws, out, ctx->tune.sample_bins);
    MK_CU_LAUNCHED(err, "cuda: sample launch");
    return MK_OK;
}
