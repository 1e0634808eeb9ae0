/* hc.cu — manifold-constrained hyper-connections (mHC) on the GPU: hc_pre (mixing weights,
 * Sinkhorn split, collapse of the hc streams), hc_post (spreading a sub-layer's output back) and
 * the head collapse; twins of src/ops/cpu/hc.c.
 *
 * hc_pre / hc_head: the (2+hc)*hc (head: hc) dot products over the hc*d flattened streams and the
 * sum of squares are accumulated in double, like the CPU, in MK_CUDA_HC_SPLIT chunks added in
 * chunk order: separate blocks reduce the chunks (one block per token left most of the GPU idle
 * in a decode: it was 68% of a step) and a finishing block per token adds them, up to
 * MK_CUDA_HC_SPLIT_TOK tokens per launch pair (the context's partials buffer), whatever the
 * call's token count, so a token's bits never depend on it. Then hc*hc lanes of
 * one warp run the tiny 4x4 Sinkhorn in fp32 registers (an element each, sums gathered by
 * shuffles) with the CPU's operation order per element (only expf may differ from the host's libm
 * by an ulp), and the block collapses the streams with the CPU's unfused fp32 arithmetic. hc_post is elementwise and bit-identical to the CPU.
 *
 * hc_post followed by hc_pre / hc_head of its output (mk_cuda_hc_post_pre_norm / _head_norm, the
 * model's post -> pre pairs) computes the hc_post in the split path's first kernel
 * (k_hc_post_part): block (t, c) writes exactly chunk c of token t's row and sums the values it
 * wrote with k_hc_mix_part's steps, so the row and the partials are those of the two kernels, bit
 * for bit, in one launch fewer. The finishing kernel can also write the activation quantization of
 * its normalized row for the next linear (mk_cuda_actq: act_quant's bytes and scales), one more
 * launch fewer.
 */
#include "ops/cuda/cuda_common.cuh"

#define HC_MAX 4
#define HC_MAXMIX ((2 + HC_MAX) * HC_MAX)
/* The parts of hc_pre's Sinkhorn split a warp computes (hc_sinkhorn_warp): pre and post, comb. */
#define HC_PART_PP 1
#define HC_PART_COMB 2

__device__ __forceinline__ float hc_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* The bounds [lo, hi) of chunk c of S of a row of n values (chunks of ceil(n / S); the last ones
 * may be short or empty). */
__device__ __forceinline__ void hc_chunk_bounds(int n, int S, int c, int *lo, int *hi) {
    const int chunk = (n + S - 1) / S;
    *lo = c * chunk;
    *hi = min(n, *lo + chunk);
}

/* Row value v (at position i of the row of n values) into a thread's double accumulators: the mix
 * dots with fn (q < nmix) and the sum of squares (acc[HC_MAXMIX]). */
__device__ __forceinline__ void hc_acc_add(double *acc, double v, const float *__restrict__ fn, int nmix, int n,
                                           int i) {
    acc[HC_MAXMIX] += v * v;
#pragma unroll
    for (int q = 0; q < HC_MAXMIX; q++)
        if (q < nmix) acc[q] += v * (double)fn[(size_t)q * n + i];
}

/* hc_acc_add with the mix weights of position i already in f (hc_fn_load); the same bits. */
__device__ __forceinline__ void hc_acc_add_f(double *acc, double v, const float (&f)[HC_MAXMIX], int nmix) {
    acc[HC_MAXMIX] += v * v;
#pragma unroll
    for (int q = 0; q < HC_MAXMIX; q++)
        if (q < nmix) acc[q] += v * (double)f[q];
}

/* The mix weights of position i (i < hi) into f, for hc_acc_add_f. */
__device__ __forceinline__ void hc_fn_load(float (&f)[HC_MAXMIX], const float *__restrict__ fn, int nmix, int n, int i,
                                           int hi) {
#pragma unroll
    for (int q = 0; q < HC_MAXMIX; q++) f[q] = q < nmix && i < hi ? __ldg(fn + (size_t)q * n + i) : 0.0f;
}

/* After each warp's column sums are in red: thread q <= HC_MAXMIX adds column q of the nw warps in
 * order (all threads must call it). */
__device__ __forceinline__ double hc_warps_in_order(double (*red)[HC_MAXMIX + 1], int nw) {
    __syncthreads();
    double a = 0.0;
    if (threadIdx.x <= HC_MAXMIX)
        for (int w = 0; w < nw; w++) a += red[w][threadIdx.x];
    __syncthreads(); /* red is reused by the next chunk */
    return a;
}

/* The block's accumulators added up: warp trees, then the warps in order. Returns (to thread
 * q <= HC_MAXMIX) column q. */
__device__ __forceinline__ double hc_block_sum(const double *acc, double (*red)[HC_MAXMIX + 1]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int q = 0; q <= HC_MAXMIX; q++) {
        double sum = mk_d_warp_sum_d(acc[q]);
        if (lane == 0) red[warp][q] = sum;
    }
    return hc_warps_in_order(red, nw);
}

/* hc_block_sum with the warp trees as one reduce-scatter (tuning hc_rs): at offset o = 16, 8, 4, 2, 1
 * each lane keeps half of its live columns (the upper half where lane bit o is set), sends the other
 * half to lane ^ o and adds what it receives to what it kept; column q ends in lane q. Each column's
 * sum is the butterfly's (the halves that meet at each level are the same lane groups, and a + b is
 * b + a), so the result is hc_block_sum's, bit for bit, with 31 shuffled doubles a warp instead of
 * 125 (the 25 columns padded to 32 with zeros). */
template <int O>
__device__ __forceinline__ void hc_rs_level(double (&a)[32], int lane) { /* live columns [0, 2 O) -> [0, O) */
    const bool up = (lane & O) != 0;
#pragma unroll
    for (int j = 0; j < O; j++) {
        const double send = up ? a[j] : a[j + O], keep = up ? a[j + O] : a[j];
        a[j] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
}
__device__ __forceinline__ double hc_block_sum_rs(const double *acc, double (*red)[HC_MAXMIX + 1]) {
    static_assert(HC_MAXMIX + 1 <= 32, "a column per lane");
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    double a[32];
#pragma unroll
    for (int q = 0; q < 32; q++) a[q] = q <= HC_MAXMIX ? acc[q] : 0.0;
    hc_rs_level<16>(a, lane);
    hc_rs_level<8>(a, lane);
    hc_rs_level<4>(a, lane);
    hc_rs_level<2>(a, lane);
    hc_rs_level<1>(a, lane);
    if (lane <= HC_MAXMIX) red[warp][lane] = a[0];
    return hc_warps_in_order(red, nw);
}

/* y[k] = bf16(sum_i pre[i] * h[i][k]) with the CPU's order and roundings. */
__device__ void hc_collapse_block(const float *__restrict__ ht, int hc, int d, const float *pre,
                                  float *__restrict__ y) {
#pragma unroll 4
    for (int k = threadIdx.x; k < d; k += blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < hc; i++) acc = __fadd_rn(acc, __fmul_rn(pre[i], ht[(size_t)i * d + k]));
        y[k] = mk_d_bf16r(acc);
    }
}

/* hc_collapse_block followed, with NORM, by RMSNorm of the collapsed row (weight nw, eps neps)
 * with k_rmsnorm's arithmetic in its order: valid only when blockDim.x is
 * mk_cuda_rmsnorm_threads(d) and d <= 4 blockDim.x (each thread then holds the same elements
 * k_rmsnorm's thread would, in the same order), which the callers check. With q, the normalized
 * row also as mk_cuda_act_quant's output (mk_d_quant_row: d % 128 == 0, checked by the callers). */

/* What the fused-norm collapse (hc_collapse_norm<true>) needs of a thread's four elements
 * k = threadIdx.x + j blockDim.x, loaded at the finishing kernels' start so that the loads overlap
 * the serial part (the chunk sums, the Sinkhorn) instead of following it: the streams' values
 * hv[j][i] (after the wait for the previous kernel) and the norm weights (constant: before it). */
struct hc_row_vals {
    float hv[4][HC_MAX];
    float w[4];
};
/* Thread t of the block holds elements t + j blockDim.x (j < 4). */
__device__ __forceinline__ void hc_row_weights(const uint16_t *__restrict__ nw, int d, hc_row_vals &r) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int k = (int)threadIdx.x + j * (int)blockDim.x;
        r.w[j] = nw && k < d ? mk_d_bf16(nw[k]) : 1.0f;
    }
}
__device__ __forceinline__ void hc_row_load(const float *__restrict__ ht, int hc, int d, hc_row_vals &r) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int k = (int)threadIdx.x + j * (int)blockDim.x;
#pragma unroll
        for (int i = 0; i < HC_MAX; i++) r.hv[j][i] = k < d && i < hc ? ht[(size_t)i * d + k] : 0.0f;
    }
}

/* mk_d_rms_scale's value (FIN 0) with the warps' partials added by one thread (FIN 1, tuning hc_fin's
 * default): the same sum in the same order, once instead of in every thread, broadcast through shared
 * memory (one barrier more; the other warps skip the 32-term serial sum and the division). */
template <int FIN>
__device__ __forceinline__ float hc_rms_scale(double ss, int d, float eps) {
    if (FIN == 0) return mk_d_rms_scale(ss, d, eps);
    __shared__ double part[32];
    __shared__ float rsh;
    ss = mk_d_warp_sum_d(ss);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double tot = 0.0;
        for (int i = 0; i < (int)(blockDim.x >> 5); i++) tot += part[i];
        const float var = (float)(tot / d);
        rsh = 1.0f / sqrtf(__fadd_rn(var, eps));
    }
    __syncthreads();
    return rsh;
}

/* The phase clocks of the finishing kernel (tuning hc_probe, a measurement tool): thread 0 of each
 * of the token-0 blocks stamps clock64() at each phase and prints them at its end. */
#define HC_NSTAMP 10
#define HC_STAMP(pc, i)                        \
    do {                                       \
        if (PROBE) (pc)[i] = (long long)clock64(); \
    } while (0)
__device__ __forceinline__ unsigned long long hc_gtime(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void hc_probe_print(const long long *pc, int last, unsigned long long g0, int tok, int yb,
                                               int ns) {
    if (threadIdx.x != 0 || tok != 0) return;
    const unsigned long long g1 = hc_gtime();
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    long long dl[HC_NSTAMP];
    for (int i = 0; i < HC_NSTAMP; i++) dl[i] = i > 0 && i <= last ? pc[i] - pc[i - 1] : 0;
    printf("hcfin y%d sm%u ns%d g0 %llu g1 %llu wait %lld stage %lld sums %lld sink %lld bar %lld coll %lld rms %lld "
           "norm %lld quant %lld\n", yb, smid, ns, g0, g1, dl[1], dl[2], dl[3], dl[4], dl[5],
           dl[6], dl[7], dl[8], dl[9]);
}

template <bool NORM, int FIN = 0, bool PROBE = false>
__device__ void hc_collapse_norm(const float *__restrict__ ht, int hc, int d, const float *pre,
                                 const uint16_t *__restrict__ nw, float neps, float *__restrict__ y,
                                 const hc_row_vals &rv, uint8_t *__restrict__ q = NULL, float *__restrict__ sq = NULL,
                                 int perm = 0, long long *pc = NULL) {
    if (!NORM) {
        hc_collapse_block(ht, hc, d, pre, y);
        return;
    }
    const int tg = (int)threadIdx.x, T = (int)blockDim.x; /* elements tg + j T, as hc_row_load */
    float v[4];
    double ss = 0.0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int k = tg + j * T;
        v[j] = 0.0f;
        if (k < d) {
            float acc = 0.0f;
#pragma unroll
            for (int i = 0; i < HC_MAX; i++)
                if (i < hc) acc = __fadd_rn(acc, __fmul_rn(pre[i], rv.hv[j][i]));
            v[j] = mk_d_bf16r(acc);
            ss += (double)v[j] * v[j];
        }
    }
    HC_STAMP(pc, 6);
    const float rs = hc_rms_scale<FIN>(ss, d, neps);
    HC_STAMP(pc, 7);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int k = tg + j * T;
        if (k < d) {
            float o = __fmul_rn(v[j], rs);
            if (nw) o = __fmul_rn(rv.w[j], o);
            y[k] = v[j] = mk_d_bf16r(o);
        }
    }
    HC_STAMP(pc, 8);
    if (q) mk_d_quant_row<FIN != 0>(v, d, perm, q, sq);
    HC_STAMP(pc, 9);
}

/* Thread q <= HC_MAXMIX stores column q of chunk c of token t: part[(t*S + c)*32 + q] (q < nmix: the
 * mix dots, the sum of squares at 31). */
__device__ __forceinline__ void hc_part_store(double *__restrict__ part, int t, int S, int c, double a) {
    if (threadIdx.x <= HC_MAXMIX) {
        const int q = threadIdx.x;
        part[((size_t)t * S + c) * 32 + (q == HC_MAXMIX ? 31 : q)] = a;
    }
}

/* Split path, part 1: block (t, c) reduces chunk c of token t's row into part[(t*S + c)*32 + q]
 * (q < nmix: the mix dots, q = 31: the sum of squares): the chunk's values thread-strided in
 * double (thread i: lo + i, lo + i + blockDim.x, ...), warp trees, warps in order (hc_block_sum). */
__global__ void __launch_bounds__(256) k_hc_mix_part(const float *__restrict__ h, int n,
                                                     const float *__restrict__ fn, int nmix,
                                                     double *__restrict__ part, int rs) {
    /* launched with programmatic dependent launch: only the constant mix weights are read before the
     * wait (the thread's first position, as in k_hc_post_part) */
    mk_d_pdl_launch_dependents();
    __shared__ double red[8][HC_MAXMIX + 1];
    const int t = blockIdx.x, c = blockIdx.y, S = gridDim.y;
    int lo, hi;
    hc_chunk_bounds(n, S, c, &lo, &hi);
    float f0[HC_MAXMIX];
    hc_fn_load(f0, fn, nmix, n, lo + threadIdx.x, hi);
    mk_d_pdl_wait();
    const float *ht = h + (size_t)t * n;
    double acc[HC_MAXMIX + 1];
#pragma unroll
    for (int q = 0; q <= HC_MAXMIX; q++) acc[q] = 0.0;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        if (i == lo + (int)threadIdx.x) hc_acc_add_f(acc, ht[i], f0, nmix);
        else hc_acc_add(acc, ht[i], fn, nmix, n, i);
    }
    hc_part_store(part, t, S, c, rs ? hc_block_sum_rs(acc, red) : hc_block_sum(acc, red));
}

/* The Sinkhorn split of src/ops/cpu/hc.c on one warp, in registers: lane l < hc*hc owns element
 * C[l / hc][l % hc] for the whole loop; the row and column sums gather their hc terms by
 * shuffles and add them in the CPU's order (0 + C[i][0] + C[i][1] + ...), so every element sees
 * exactly the operations, in the same order, that the one-thread version applies (the same bits;
 * only expf may differ from the host's libm by an ulp). Lanes < hc also write pre and post. mix
 * is in shared memory (written before a __syncwarp). All 32 lanes of the warp must call it.
 * The 39 dependent steps (20 iterations) are the finishing kernel's critical path, so hc is a
 * template parameter: the loops unroll, a step's hc shuffles are issued together, and the chain
 * per step is one shuffle latency, hc adds and the division (it was ~14 us per call with hc at
 * run time: index arithmetic and loop control inside every step). parts (HC_PART_*): which of
 * pre / post and comb to compute; each part's operations do not depend on the other's. */
template <int HC>
__device__ void hc_sinkhorn_warp_t(const float *mix, const float *__restrict__ scale, const float *__restrict__ base,
                                   int iters, float hc_eps, float *pre, float *__restrict__ post_t,
                                   float *__restrict__ comb_t, int parts) {
    const unsigned all = 0xffffffffu;
    const int l = threadIdx.x & 31, act = l < HC * HC, i = act ? l / HC : 0, j = act ? l % HC : 0;
    if ((parts & HC_PART_PP) && l < HC) {
        pre[l] = __fadd_rn(hc_sigmoid(__fadd_rn(__fmul_rn(mix[l], scale[0]), base[l])), hc_eps);
        post_t[l] = 2.0f * hc_sigmoid(__fadd_rn(__fmul_rn(mix[HC + l], scale[1]), base[HC + l]));
    }
    if (!(parts & HC_PART_COMB)) return;
    float c = act ? __fadd_rn(__fmul_rn(mix[2 * HC + l], scale[2]), base[2 * HC + l]) : 0.0f;
    float v[HC];
#pragma unroll
    for (int q = 0; q < HC; q++) v[q] = __shfl_sync(all, c, i * HC + q);
    float mx = -INFINITY;
#pragma unroll
    for (int q = 0; q < HC; q++)
        if (v[q] > mx) mx = v[q];
    c = expf(c - mx);
#pragma unroll
    for (int q = 0; q < HC; q++) v[q] = __shfl_sync(all, c, i * HC + q);
    float sum = 0.0f;
#pragma unroll
    for (int q = 0; q < HC; q++) sum = __fadd_rn(sum, v[q]);
    c = __fadd_rn(__fdiv_rn(c, sum), hc_eps);
    for (int it = 0; it < iters; it++) {
        if (it > 0) { /* row step (skipped on the first pass) */
#pragma unroll
            for (int q = 0; q < HC; q++) v[q] = __shfl_sync(all, c, i * HC + q);
            float rs = 0.0f;
#pragma unroll
            for (int q = 0; q < HC; q++) rs = __fadd_rn(rs, v[q]);
            c = __fdiv_rn(c, __fadd_rn(rs, hc_eps));
        }
#pragma unroll
        for (int q = 0; q < HC; q++) v[q] = __shfl_sync(all, c, q * HC + j); /* column step */
        float cs = 0.0f;
#pragma unroll
        for (int q = 0; q < HC; q++) cs = __fadd_rn(cs, v[q]);
        c = __fdiv_rn(c, __fadd_rn(cs, hc_eps));
    }
    if (act) comb_t[l] = c;
}

/* hc_sinkhorn_warp_t for hc = 1..HC_MAX (hc_check bounds it). */
__device__ void hc_sinkhorn_warp(const float *mix, int hc, const float *__restrict__ scale,
                                 const float *__restrict__ base, int iters, float hc_eps, float *pre,
                                 float *__restrict__ post_t, float *__restrict__ comb_t, int parts) {
    static_assert(HC_MAX == 4, "hc_sinkhorn_warp dispatches hc = 1..4");
    switch (hc) {
    case 4: hc_sinkhorn_warp_t<4>(mix, scale, base, iters, hc_eps, pre, post_t, comb_t, parts); break;
    case 3: hc_sinkhorn_warp_t<3>(mix, scale, base, iters, hc_eps, pre, post_t, comb_t, parts); break;
    case 2: hc_sinkhorn_warp_t<2>(mix, scale, base, iters, hc_eps, pre, post_t, comb_t, parts); break;
    default: hc_sinkhorn_warp_t<1>(mix, scale, base, iters, hc_eps, pre, post_t, comb_t, parts); break;
    }
}

/* Split path, part 2: one block per token adds the chunks in order, then the mixes, the Sinkhorn
 * and the collapse. The block first stages every chunk's partials in shared memory (all threads,
 * coalesced), so the ordered sums read shared memory instead of waiting on one global load after
 * another; the Sinkhorn then runs on hc lanes (hc_sinkhorn_warp).
 * With gridDim.y == 2 (tuning hc_fin_split) a token has two blocks that both add the chunks (the
 * same operations: the same mix): block y = 0 computes pre and post and the collapse (what the
 * next kernel reads), block y = 1 only comb, whose 39 dependent Sinkhorn steps (read by the
 * hc_post after the sub-layer) then run beside the collapse instead of before it. */
#define HC_FIN_MAXS 64
static_assert(MK_CUDA_HC_SPLIT <= HC_FIN_MAXS, "k_hc_pre_fin stages at most HC_FIN_MAXS chunks");
template <bool NORM, int FIN, bool PROBE>
__global__ void __launch_bounds__(1024) k_hc_pre_fin(const float *__restrict__ h, int hc, int d, int S,
                                                    const double *__restrict__ part,
                                                    const float *__restrict__ scale,
                                                    const float *__restrict__ base, int iters,
                                                    float hc_eps, float norm_eps, const uint16_t *__restrict__ nw,
                                                    float neps, float *__restrict__ x,
                                                    float *__restrict__ post, float *__restrict__ comb,
                                                    uint8_t *__restrict__ xq, float *__restrict__ xsa, int perm) {
    /* launched with programmatic dependent launch: only the norm weights are read before the wait */
    long long pc[HC_NSTAMP];
    const unsigned long long g0 = PROBE ? hc_gtime() : 0ull;
    HC_STAMP(pc, 0);
    mk_d_pdl_launch_dependents();
    /* grid (tokens, 1 or 2) of 1024 threads */
    const int yb = (int)blockIdx.y, ny = (int)gridDim.y, t = (int)blockIdx.x, ntok = (int)gridDim.x;
    const int parts = ny == 1 ? HC_PART_PP | HC_PART_COMB : yb == 0 ? HC_PART_PP : HC_PART_COMB;
    const bool rows = parts & HC_PART_PP; /* this block collapses the row */
    hc_row_vals rv;
    if (NORM && rows) hc_row_weights(nw, d, rv);
    if (threadIdx.x < 32) { /* the mixes' scales and biases, read by the serial part after the wait */
        mk_d_l2_prefetch_block(scale, sizeof(float) * 3);
        mk_d_l2_prefetch_block(base, sizeof(float) * (2 + hc) * hc);
    }
    mk_d_pdl_wait();
    HC_STAMP(pc, 1);
    __shared__ float mix[HC_MAXMIX];
    __shared__ float pre[HC_MAX];
    __shared__ double stage[HC_FIN_MAXS * 32];
    const int nmix = (2 + hc) * hc, n = hc * d;
    const float *ht = h + (size_t)t * n;
    const double *pt = part + (size_t)t * S * 32;
    if (NORM && rows) hc_row_load(ht, hc, d, rv);
    for (int i = threadIdx.x; i < S * 32; i += blockDim.x) stage[i] = pt[i];
    __syncthreads();
    HC_STAMP(pc, 2);
    if (threadIdx.x < 32) { /* column q summed over the chunks in chunk order, one lane each */
        const int q = threadIdx.x;
        double a = 0.0;
        if (q < nmix || q == 31)
#pragma unroll 8
            for (int c = 0; c < S; c++) a += stage[c * 32 + q];
        const double ss = __shfl_sync(0xffffffffu, a, 31);
        const float r = 1.0f / sqrtf(__fadd_rn((float)(ss / n), norm_eps));
        if (q < nmix) mix[q] = __fmul_rn((float)a, r);
        __syncwarp();
        HC_STAMP(pc, 3);
        hc_sinkhorn_warp(mix, hc, scale, base, iters, hc_eps, pre, post + (size_t)t * hc, comb + (size_t)t * hc * hc,
                         parts);
        HC_STAMP(pc, 4);
    }
    if (!rows) { /* the comb block: nothing else (the block's threads all return together) */
        if (PROBE) hc_probe_print(pc, 4, g0, t, yb, ntok);
        return;
    }
    __syncthreads();
    HC_STAMP(pc, 5);
    hc_collapse_norm<NORM, FIN, PROBE>(ht, hc, d, pre, nw, neps, x + (size_t)t * d, rv, xq ? xq + (size_t)t * d : NULL,
                                       xq ? xsa + (size_t)t * (d >> 7) : NULL, perm, pc);
    if (PROBE) hc_probe_print(pc, NORM ? 9 : 5, g0, t, yb, ntok);
}

/* The head's split path, part 2 (part 1: k_hc_mix_part with nmix = hc): the chunks in order, pre,
 * the collapse (src/ops/cpu/hc.c's mk_hc_head). */
template <bool NORM>
__global__ void __launch_bounds__(1024) k_hc_head_fin(const float *__restrict__ h, int hc, int d, int S,
                                                     const double *__restrict__ part,
                                                     const float *__restrict__ scale,
                                                     const float *__restrict__ base, float hc_eps,
                                                     float norm_eps, const uint16_t *__restrict__ nw, float neps,
                                                     float *__restrict__ y) {
    /* launched with programmatic dependent launch: only the norm weights are read before the wait */
    mk_d_pdl_launch_dependents();
    hc_row_vals rv;
    if (NORM) hc_row_weights(nw, d, rv);
    if (threadIdx.x < 32) { /* the scale and biases, read by the serial part after the wait */
        mk_d_l2_prefetch_block(scale, sizeof(float));
        mk_d_l2_prefetch_block(base, sizeof(float) * hc);
    }
    mk_d_pdl_wait();
    __shared__ float pre[HC_MAX];
    __shared__ double stage[HC_FIN_MAXS * 32];
    const int t = blockIdx.x, n = hc * d;
    const double *pt = part + (size_t)t * S * 32;
    if (NORM) hc_row_load(h + (size_t)t * n, hc, d, rv);
    for (int i = threadIdx.x; i < S * 32; i += blockDim.x) stage[i] = pt[i];
    __syncthreads();
    if (threadIdx.x < 32) {
        const int q = threadIdx.x;
        double a = 0.0;
        if (q < hc || q == 31)
#pragma unroll 8
            for (int c = 0; c < S; c++) a += stage[c * 32 + q];
        const double ss = __shfl_sync(0xffffffffu, a, 31);
        const float r = 1.0f / sqrtf(__fadd_rn((float)(ss / n), norm_eps));
        if (q < hc) {
            float m = __fmul_rn((float)a, r);
            pre[q] = __fadd_rn(hc_sigmoid(__fadd_rn(__fmul_rn(m, scale[0]), base[q])), hc_eps);
        }
    }
    __syncthreads();
    hc_collapse_norm<NORM>(h + (size_t)t * n, hc, d, pre, nw, neps, y + (size_t)t * d, rv);
}

/* hc_post's element (j, k) of one token, before the bf16 rounding: post[j] * x[k] +
 * sum_i comb[i][j] * res[i][k] in the CPU's order (xk = x[k]; rt, pt, ct: the token's rows). */
__device__ __forceinline__ float hc_post_elem_x(float xk, const float *__restrict__ rt, const float *__restrict__ pt,
                                                const float *__restrict__ ct, int hc, int d, int j, int k) {
    float acc = __fmul_rn(pt[j], xk);
    for (int i = 0; i < hc; i++) acc = __fadd_rn(acc, __fmul_rn(ct[i * hc + j], rt[(size_t)i * d + k]));
    return acc;
}
__device__ __forceinline__ float hc_post_elem(const float *__restrict__ xt, const float *__restrict__ rt,
                                              const float *__restrict__ pt, const float *__restrict__ ct, int hc,
                                              int d, int j, int k) {
    return hc_post_elem_x(xt[k], rt, pt, ct, hc, d, j, k);
}

/* The MoE combine of token tg (mk_cuda_moe_combine's operands, as k_moe_combine adds them): warp 0
 * puts the token's slots in the combine's order (mk_d_moe_slot_order); all threads must call it (it
 * ends with a barrier). */
__device__ __forceinline__ void hc_sum_order(const mk_cuda_moe_sum &ms, int tg, int32_t *ord, int *nord) {
    if (threadIdx.x < 32) {
        const int TK = ms.T * ms.K, G = TK < ms.E ? TK : ms.E;
        const int32_t *spos = ms.plan + 1 + 2 * G + 1 + TK;
        const int n = mk_d_moe_slot_order(spos + (size_t)tg * ms.K, ms.idx + (size_t)tg * ms.K, ms.K, ord);
        if (threadIdx.x == 0) *nord = n;
    }
    __syncthreads();
}
/* The token's combined value k (k_moe_combine's). */
__device__ __forceinline__ float hc_sum_x(const mk_cuda_moe_sum &ms, const int32_t *ord, int nord, int tg, int d, int k) {
    return mk_d_moe_combined(ms.eo, ord, nord, ms.shared[(size_t)tg * d + k], d, k);
}

/* k_hc_post_part's element with every load issued before the first arithmetic (tuning
 * hc_post_loads): the sub-layer value (x[k], or the MoE combine's rows and shared value), post[j],
 * comb[i][j] and res[i][k]. Written the plain way (hc_sum_x, then hc_post_elem_x), each use waits for
 * its loads before the next loads issue: the combine's loop, then post * x, then the hc loop are up to
 * three memory round trips after the programmatic wait (ncu, session 33: the two stalls of the x path
 * were 17% of the kernel's samples). The operations and their order are hc_sum_x's and
 * hc_post_elem_x's: the same bits. The combine keeps up to HC_EO_REG slots in registers (V4: 6);
 * further slots are loaded in its loop as before. */
#define HC_EO_REG 8
__device__ __forceinline__ float hc_post_elem_ld(const mk_cuda_moe_sum &ms, const int32_t *ord, int nord, int tg,
                                                 const float *__restrict__ xt, const float *__restrict__ rt,
                                                 const float *__restrict__ pt, const float *__restrict__ ct, int hc,
                                                 int d, int j, int k) {
    float ev[HC_EO_REG], sh = 0.0f, xk = 0.0f, c[HC_MAX], r[HC_MAX];
    if (ms.eo) {
#pragma unroll
        for (int q = 0; q < HC_EO_REG; q++) ev[q] = q < nord ? ms.eo[(size_t)ord[q] * d + k] : 0.0f;
        sh = ms.shared[(size_t)tg * d + k];
    } else {
        xk = xt[k];
    }
    const float p = pt[j];
#pragma unroll
    for (int i = 0; i < HC_MAX; i++) {
        c[i] = i < hc ? ct[i * hc + j] : 0.0f;
        r[i] = i < hc ? rt[(size_t)i * d + k] : 0.0f;
    }
    if (ms.eo) { /* mk_d_moe_combined's sum */
        float y = 0.0f;
#pragma unroll
        for (int q = 0; q < HC_EO_REG; q++)
            if (q < nord) y = __fadd_rn(y, ev[q]);
        for (int q = HC_EO_REG; q < nord; q++) y = __fadd_rn(y, ms.eo[(size_t)ord[q] * d + k]);
        xk = mk_d_bf16r(__fadd_rn(y, sh));
    }
    float acc = __fmul_rn(p, xk); /* hc_post_elem_x's */
#pragma unroll
    for (int i = 0; i < HC_MAX; i++)
        if (i < hc) acc = __fadd_rn(acc, __fmul_rn(c[i], r[i]));
    return acc;
}

/* out[t][j][k] = bf16(post[j] * x[k] + sum_i comb[i][j] * res[i][k]), one thread per output. */
__global__ void k_hc_post(const float *__restrict__ x, const float *__restrict__ res,
                          const float *__restrict__ post, const float *__restrict__ comb, int s,
                          int hc, int d, float *__restrict__ out) {
    MK_PDL_ENTER(); /* launched with programmatic dependent launch: nothing is touched before */
    size_t id = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t per_tok = (size_t)hc * d;
    if (id >= (size_t)s * per_tok) return;
    int t = (int)(id / per_tok);
    int j = (int)((id - (size_t)t * per_tok) / d);
    int k = (int)(id - (size_t)t * per_tok - (size_t)j * d);
    out[id] = mk_d_bf16r(hc_post_elem(x + (size_t)t * d, res + (size_t)t * per_tok, post + (size_t)t * hc,
                                      comb + (size_t)t * hc * hc, hc, d, j, k));
}

/* hc_post fused with the following hc_pre / hc_head's split part 1 (k_hc_mix_part) of its output:
 * block (t, c) computes and stores exactly the outputs of chunk c of token t's row, each thread
 * the elements k_hc_mix_part's thread reads, in the same order, and sums the values it stored
 * (bf16-rounded) into part like k_hc_mix_part: both outputs are those of k_hc_post then
 * k_hc_mix_part, bit for bit. A block needs no other block's outputs (no grid-wide sync). Reads
 * post / comb and writes neither (the finishing kernel, launched after it, may overwrite them). */
template <bool LD>
__global__ void __launch_bounds__(256, 1) k_hc_post_part(const float *__restrict__ x, const float *__restrict__ res,
                                                      const float *__restrict__ post,
                                                      const float *__restrict__ comb, int hc, int d,
                                                      float *__restrict__ out, const float *__restrict__ fn,
                                                      int nmix, double *__restrict__ part, const mk_cuda_moe_sum ms,
                                                      int t0, int rs) {
    /* launched with programmatic dependent launch: the thread's first mix weights (constant) are
     * loaded before the wait, so their memory latency overlaps the previous kernel; with ms.eo, x is
     * the MoE combine of token t0 + t, its order read from the plan before the wait too (the plan
     * kernel lets no kernel start before it ends: MOE_PLAN_NOTE in moe.cu) */
    mk_d_pdl_launch_dependents();
    __shared__ double red[8][HC_MAXMIX + 1];
    __shared__ int32_t ord[64];
    __shared__ int nord;
    const int t = blockIdx.x, c = blockIdx.y, S = gridDim.y, n = hc * d;
    int lo, hi;
    hc_chunk_bounds(n, S, c, &lo, &hi);
    float f0[HC_MAXMIX];
    hc_fn_load(f0, fn, nmix, n, lo + threadIdx.x, hi);
    if (ms.eo) hc_sum_order(ms, t0 + t, ord, &nord);
    mk_d_pdl_wait();
    const float *xt = x + (size_t)t * d, *rt = res + (size_t)t * n, *pt = post + (size_t)t * hc,
                *ct = comb + (size_t)t * hc * hc;
    float *ot = out + (size_t)t * n;
    double acc[HC_MAXMIX + 1];
#pragma unroll
    for (int q = 0; q <= HC_MAXMIX; q++) acc[q] = 0.0;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const int j = i / d, k = i - j * d;
        float o;
        if (LD) {
            o = mk_d_bf16r(hc_post_elem_ld(ms, ord, nord, t0 + t, xt, rt, pt, ct, hc, d, j, k));
        } else {
            const float xk = ms.eo ? hc_sum_x(ms, ord, nord, t0 + t, d, k) : xt[k];
            o = mk_d_bf16r(hc_post_elem_x(xk, rt, pt, ct, hc, d, j, k));
        }
        ot[i] = o;
        if (i == lo + (int)threadIdx.x) hc_acc_add_f(acc, o, f0, nmix);
        else hc_acc_add(acc, o, fn, nmix, n, i);
    }
    hc_part_store(part, t, S, c, rs ? hc_block_sum_rs(acc, red) : hc_block_sum(acc, red));
}

/* Split path, part 1 for many tokens (prefill) when a chunk is exactly one element per thread of
 * k_hc_mix_part (hc d == 256 MK_CUDA_HC_SPLIT, V4's 4 x 4096): the same partials, bit for bit,
 * without a block and a shuffle tree per (token, chunk). What k_hc_mix_part computes for column q
 * of chunk c: each thread's one product (0.0 + v * f in double, exact), the xor-butterfly sum of
 * each warp (lane 0's tree: a[i] + a[i + 16], then + 8, + 4, + 2, + 1), the 8 warps' sums added in
 * order to 0.0. Here block (c, token group) stages the chunk's mix rows and HC_RI_TOK tokens'
 * values in shared memory as doubles, and thread (token w, column q) computes that same tree in
 * registers for each of the 8 warp groups and adds them in order. */
#define HC_RI_TOK 8
#define HC_RI_STRIDE 258 /* doubles per staged mix row (16-byte loads of 8 lanes on 8 bank groups) */
static size_t hc_ri_smem(void) { return sizeof(double) * (size_t)(HC_MAXMIX * HC_RI_STRIDE + HC_RI_TOK * 256); }

__global__ void __launch_bounds__(256) k_hc_mix_ri(const float *__restrict__ h, int ns, int n,
                                                  const float *__restrict__ fn, int nmix, double *__restrict__ part) {
    MK_PDL_ENTER();
    extern __shared__ __align__(16) double hc_dsm[];
    double *fs = hc_dsm, *hs = hc_dsm + HC_MAXMIX * HC_RI_STRIDE;
    const int c = blockIdx.x, S = gridDim.x, t0 = blockIdx.y * HC_RI_TOK, lo = c * 256;
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    for (int i = tid; i < nmix * 256; i += 256) {
        const int q = i >> 8, e = i & 255;
        fs[q * HC_RI_STRIDE + e] = (double)fn[(size_t)q * n + lo + e];
    }
#pragma unroll
    for (int r = 0; r < HC_RI_TOK; r++)
        hs[r * 256 + tid] = t0 + r < ns ? (double)h[(size_t)(t0 + r) * n + lo + tid] : 0.0;
    __syncthreads();
    const int q = lane, t = t0 + w;
    if (t >= ns || !(q < nmix || q == HC_MAXMIX)) return;
    const double *hv = hs + w * 256, *fv = fs + q * HC_RI_STRIDE;
    double a = 0.0;
    for (int g = 0; g < 8; g++) { /* k_hc_mix_part's warp g: elements lo + 32 g + l */
        double p[32];
#pragma unroll
        for (int l = 0; l < 32; l += 2) {
            const double2 v = *(const double2 *)(hv + 32 * g + l);
            const double2 f = q == HC_MAXMIX ? v : *(const double2 *)(fv + 32 * g + l);
            p[l] = __dadd_rn(0.0, __dmul_rn(v.x, f.x));
            p[l + 1] = __dadd_rn(0.0, __dmul_rn(v.y, f.y));
        }
#pragma unroll
        for (int l = 0; l < 16; l++) p[l] = __dadd_rn(p[l], p[l + 16]);
#pragma unroll
        for (int l = 0; l < 8; l++) p[l] = __dadd_rn(p[l], p[l + 8]);
#pragma unroll
        for (int l = 0; l < 4; l++) p[l] = __dadd_rn(p[l], p[l + 4]);
#pragma unroll
        for (int l = 0; l < 2; l++) p[l] = __dadd_rn(p[l], p[l + 2]);
        p[0] = __dadd_rn(p[0], p[1]);
        a = __dadd_rn(a, p[0]);
    }
    part[((size_t)t * S + c) * 32 + (q == HC_MAXMIX ? 31 : q)] = a;
}

static int hc_check(int s, int hc, int d, mk_err *err) {
    if (hc < 1 || hc > HC_MAX || d < 1 || s < 0)
        return mk_fail(err, MK_ENOTSUP, "cuda: hc: hc %d (1..%d), d %d, s %d", hc, HC_MAX, d, s);
    return MK_OK;
}

/* Whether the finishing kernels (1024 threads) can run the RMSNorm of their row themselves. */
static int hc_fuse_norm(int d) { return mk_cuda_rmsnorm_threads(d) == 1024 && d <= 4 * 1024; }

/* The hc_post that writes the row a split path then reads (the fused ops): out [s, hc, d] =
 * hc_post(x, res, post, comb). */
typedef struct {
    const float *x, *res, *post, *comb;
    float *out;
    mk_cuda_moe_sum ms; /* ms.eo: x is the MoE combine of these operands (see mk_cuda_moe_sum) */
} hc_post_in;

/* Split path, part 1 for tokens [t0, t0 + ns) into ctx->hc_partial: k_hc_mix_part over h, or,
 * with pin, k_hc_post_part writing pin->out (= h) as it goes. */
static int hc_part1(mk_cuda_ctx *ctx, const hc_post_in *pin, const float *h, int t0, int ns, int hc, int d,
                    const float *fn, int nmix, const char *what, mk_err *err) {
    const dim3 grid((unsigned)ns, MK_CUDA_HC_SPLIT);
    const size_t n = (size_t)hc * d;
    if (ctx->tune.hc_ri && ns >= ctx->tune.hc_ri && n == (size_t)256 * MK_CUDA_HC_SPLIT) { /* many tokens */
        int st = mk_cuda_smem_optin(ctx, MK_OPTIN_HC_RI, (const void *)k_hc_mix_ri, hc_ri_smem(), err);
        if (st) return st;
        if (pin) { /* the hc_post first (its elementwise kernel: the same values), then its rows' sums */
            const size_t total = (size_t)ns * n;
            (void)mk_cuda_launch_pdl(ctx, (unsigned)((total + 255) / 256), 256, 0, k_hc_post, pin->x + (size_t)t0 * d,
                                     pin->res + t0 * n, pin->post + (size_t)t0 * hc, pin->comb + (size_t)t0 * hc * hc,
                                     ns, hc, d, pin->out + t0 * n);
            MK_CU_LAUNCHED(err, "cuda: hc_post launch");
            h = pin->out;
        }
        (void)mk_cuda_launch_pdl(ctx, dim3(MK_CUDA_HC_SPLIT, (unsigned)((ns + HC_RI_TOK - 1) / HC_RI_TOK)), 256,
                                 hc_ri_smem(), k_hc_mix_ri, h + t0 * n, ns, (int)n, fn, nmix, ctx->hc_partial);
        MK_CU_LAUNCHED(err, what);
        return MK_OK;
    }
    if (pin)
        (void)mk_cuda_launch_pdl(ctx, grid, 256, 0, ctx->tune.hc_post_loads ? k_hc_post_part<true> : k_hc_post_part<false>,
                                 pin->ms.eo ? pin->x : pin->x + (size_t)t0 * d, pin->res + t0 * n,
                                 pin->post + (size_t)t0 * hc, pin->comb + (size_t)t0 * hc * hc, hc, d, pin->out + t0 * n,
                                 fn, nmix, ctx->hc_partial, pin->ms, t0, ctx->tune.hc_rs);
    else
        (void)mk_cuda_launch_pdl(ctx, grid, 256, 0, k_hc_mix_part, h + t0 * n, (int)n, fn, nmix, ctx->hc_partial,
                                 ctx->tune.hc_rs);
    MK_CU_LAUNCHED(err, what);
    return MK_OK;
}

/* hc_pre of h, or with pin of the hc_post it computes (h = pin->out). Token group g's finishing
 * kernel writes post / comb rows of group g only, before group g+1's part 1 reads its own rows:
 * pin->post / pin->comb may be post / comb. */
/* A MoE combine in place of the sub-layer output: its operands present, the call's tokens, K <= 64. */
static int hc_sum_check(const mk_cuda_moe_sum *ms, int s, mk_err *err) {
    if (!ms) return MK_OK;
    if (!ms->eo || !ms->idx || !ms->plan || !ms->shared || !ms->out || ms->T != s || ms->K < 1 || ms->K > 64 ||
        ms->E < 1)
        return mk_fail(err, MK_EINVAL, "cuda: hc_post of a moe combine: missing operands or bad shape (T %d of %d, K %d, "
                       "E %d)", ms->T, s, ms->K, ms->E);
    return MK_OK;
}

/* With pin->ms, where a token group would take the many-token path (k_hc_post, elementwise: no
 * per-token order), the combine runs first on its own into ms.out and pin becomes a plain hc_post
 * of it (*tmp). Returns the hc_post to run. */
static const hc_post_in *hc_sum_first(mk_cuda_ctx *ctx, const hc_post_in *pin, int s, int hc, int d, hc_post_in *tmp,
                                      int *st, mk_err *err) {
    *st = MK_OK;
    if (!pin || !pin->ms.eo) return pin;
    const int ns = s < MK_CUDA_HC_SPLIT_TOK ? s : MK_CUDA_HC_SPLIT_TOK; /* the largest group */
    if (!(ctx->tune.hc_ri && ns >= ctx->tune.hc_ri && (size_t)hc * d == (size_t)256 * MK_CUDA_HC_SPLIT)) return pin;
    const mk_cuda_moe_sum *m = &pin->ms;
    *st = mk_cuda_moe_combine(ctx, m->eo, m->idx, m->plan, m->T, m->K, m->E, d, m->shared, m->out, err);
    *tmp = *pin;
    tmp->x = m->out;
    tmp->ms.eo = NULL;
    return tmp;
}

static int hc_pre_any(mk_cuda_ctx *ctx, const hc_post_in *pin, const float *h, int s, int hc, int d, const float *fn,
                      const float *scale, const float *base, int iters, float hc_eps, float norm_eps, int norm,
                      const uint16_t *nw, float neps, float *x, float *post, float *comb, const mk_cuda_actq *aq,
                      mk_err *err) {
    int st = hc_check(s, hc, d, err);
    if (st || s == 0) return st;
    hc_post_in tmp;
    pin = hc_sum_first(ctx, pin, s, hc, d, &tmp, &st, err);
    if (st) return st;
    if (aq && (!norm || !aq->q || !aq->sa))
        return mk_fail(err, MK_EINVAL, "cuda: hc_pre: quantized output needs the normalized row and both buffers");
    const int fuse = norm && hc_fuse_norm(d), S = MK_CUDA_HC_SPLIT;
    const int fq = aq && fuse && d % 128 == 0; /* the finishing kernel quantizes the row itself */
    for (int t0 = 0; t0 < s; t0 += MK_CUDA_HC_SPLIT_TOK) { /* MK_CUDA_HC_SPLIT_TOK tokens at a time */
        const int ns = s - t0 < MK_CUDA_HC_SPLIT_TOK ? s - t0 : MK_CUDA_HC_SPLIT_TOK;
        const float *ht = h + (size_t)t0 * hc * d;
        st = hc_part1(ctx, pin, h, t0, ns, hc, d, fn, (2 + hc) * hc, "cuda: hc_pre (split) launch", err);
        if (st) return st;
        const dim3 fgrid((unsigned)ns, ctx->tune.hc_fin_split ? 2 : 1); /* y = 1: comb beside the collapse */
        if (fuse) {
            /* tuning hc_fin picks the collapse's variant, hc_probe adds the phase clocks */
            typedef void (*fin_k)(const float *, int, int, int, const double *, const float *, const float *, int,
                                  float, float, const uint16_t *, float, float *, float *, float *, uint8_t *, float *,
                                  int);
            static const fin_k ks[2][2] = {{k_hc_pre_fin<true, 0, false>, k_hc_pre_fin<true, 1, false>},
                                           {k_hc_pre_fin<true, 0, true>, k_hc_pre_fin<true, 1, true>}};
            (void)mk_cuda_launch_pdl(ctx, fgrid, 1024, 0, ks[ctx->tune.hc_probe][ctx->tune.hc_fin], ht, hc, d, S,
                                     ctx->hc_partial, scale, base, iters, hc_eps, norm_eps, nw, neps,
                                     x + (size_t)t0 * d, post + (size_t)t0 * hc, comb + (size_t)t0 * hc * hc,
                                     fq ? aq->q + (size_t)t0 * d : (uint8_t *)NULL,
                                     fq ? aq->sa + (size_t)t0 * (d / 128) : (float *)NULL, fq ? aq->perm : 0);
        } else
            (void)mk_cuda_launch_pdl(ctx, fgrid, 1024, 0, k_hc_pre_fin<false, 0, false>, ht, hc, d, S, ctx->hc_partial,
                                     scale, base, iters, hc_eps, norm_eps, (const uint16_t *)NULL, 0.0f,
                                     x + (size_t)t0 * d, post + (size_t)t0 * hc, comb + (size_t)t0 * hc * hc,
                                     (uint8_t *)NULL, (float *)NULL, 0);
        MK_CU_LAUNCHED(err, "cuda: hc_pre (finish) launch");
    }
    if (norm && !fuse) {
        st = mk_cuda_rmsnorm(ctx, x, s, d, nw, neps, x, err);
        if (st) return st;
    }
    if (aq && !fq) return mk_cuda_act_quant(ctx, x, s, d, aq->perm, aq->q, aq->sa, err);
    return MK_OK;
}

extern "C" int mk_cuda_hc_pre(mk_cuda_ctx *ctx, const float *h, int s, int hc, int d,
                              const float *fn, const float *scale, const float *base, int iters,
                              float hc_eps, float norm_eps, float *x, float *post, float *comb,
                              mk_err *err) {
    return hc_pre_any(ctx, NULL, h, s, hc, d, fn, scale, base, iters, hc_eps, norm_eps, 0, NULL, 0.0f, x, post, comb,
                      NULL, err);
}

extern "C" int mk_cuda_hc_pre_norm(mk_cuda_ctx *ctx, const float *h, int s, int hc, int d, const float *fn,
                                   const float *scale, const float *base, int iters, float hc_eps, float norm_eps,
                                   const uint16_t *nw, float neps, float *x, float *post, float *comb,
                                   const mk_cuda_actq *aq, mk_err *err) {
    return hc_pre_any(ctx, NULL, h, s, hc, d, fn, scale, base, iters, hc_eps, norm_eps, 1, nw, neps, x, post, comb, aq,
                      err);
}

extern "C" int mk_cuda_hc_post_pre_norm(mk_cuda_ctx *ctx, const float *x, const float *res, const float *post,
                                        const float *comb, int s, int hc, int d, float *out, const float *fn,
                                        const float *scale, const float *base, int iters, float hc_eps,
                                        float norm_eps, const uint16_t *nw, float neps, float *xo, float *post_o,
                                        float *comb_o, const mk_cuda_actq *aq, const mk_cuda_moe_sum *ms,
                                        mk_err *err) {
    int st = hc_sum_check(ms, s, err);
    if (st) return st;
    const hc_post_in pin = {x, res, post, comb, out, ms ? *ms : mk_cuda_moe_sum{}};
    return hc_pre_any(ctx, &pin, out, s, hc, d, fn, scale, base, iters, hc_eps, norm_eps, 1, nw, neps, xo, post_o,
                      comb_o, aq, err);
}

extern "C" int mk_cuda_hc_post(mk_cuda_ctx *ctx, const float *x, const float *res,
                               const float *post, const float *comb, int s, int hc, int d,
                               float *out, mk_err *err) {
    int st = hc_check(s, hc, d, err);
    if (st || s == 0) return st;
    size_t n = (size_t)s * hc * d;
    (void)mk_cuda_launch_pdl(ctx, (unsigned)((n + 255) / 256), 256, 0, k_hc_post, x, res, post, comb, s, hc, d, out);
    MK_CU_LAUNCHED(err, "cuda: hc_post launch");
    return MK_OK;
}

/* hc_head of h, or with pin of the hc_post it computes (h = pin->out). */
static int hc_head_any(mk_cuda_ctx *ctx, const hc_post_in *pin, const float *h, int s, int hc, int d, const float *fn,
                       const float *scale, const float *base, float hc_eps, float norm_eps, int norm,
                       const uint16_t *nw, float neps, float *y, mk_err *err) {
    int st = hc_check(s, hc, d, err);
    if (st || s == 0) return st;
    hc_post_in tmp;
    pin = hc_sum_first(ctx, pin, s, hc, d, &tmp, &st, err);
    if (st) return st;
    const int fuse = norm && hc_fuse_norm(d), S = MK_CUDA_HC_SPLIT;
    for (int t0 = 0; t0 < s; t0 += MK_CUDA_HC_SPLIT_TOK) { /* MK_CUDA_HC_SPLIT_TOK tokens at a time */
        const int ns = s - t0 < MK_CUDA_HC_SPLIT_TOK ? s - t0 : MK_CUDA_HC_SPLIT_TOK;
        const float *ht = h + (size_t)t0 * hc * d;
        st = hc_part1(ctx, pin, h, t0, ns, hc, d, fn, hc, "cuda: hc_head (split) launch", err);
        if (st) return st;
        if (fuse)
            (void)mk_cuda_launch_pdl(ctx, ns, 1024, 0, k_hc_head_fin<true>, ht, hc, d, S, ctx->hc_partial, scale, base, hc_eps,
                                     norm_eps, nw, neps, y + (size_t)t0 * d);
        else
            (void)mk_cuda_launch_pdl(ctx, ns, 1024, 0, k_hc_head_fin<false>, ht, hc, d, S, ctx->hc_partial, scale, base, hc_eps,
                                     norm_eps, (const uint16_t *)NULL, 0.0f, y + (size_t)t0 * d);
        MK_CU_LAUNCHED(err, "cuda: hc_head (finish) launch");
    }
    if (norm && !fuse) return mk_cuda_rmsnorm(ctx, y, s, d, nw, neps, y, err);
    return MK_OK;
}

extern "C" int mk_cuda_hc_head(mk_cuda_ctx *ctx, const float *h, int s, int hc, int d,
                               const float *fn, const float *scale, const float *base,
                               float hc_eps, float norm_eps, float *y, mk_err *err) {
    return hc_head_any(ctx, NULL, h, s, hc, d, fn, scale, base, hc_eps, norm_eps, 0, NULL, 0.0f, y, err);
}

extern "C" int mk_cuda_hc_head_norm(mk_cuda_ctx *ctx, const float *h, int s, int hc, int d, const float *fn,
                                    const float *scale, const float *base, float hc_eps, float norm_eps,
                                    const uint16_t *nw, float neps, float *y, mk_err *err) {
    return hc_head_any(ctx, NULL, h, s, hc, d, fn, scale, base, hc_eps, norm_eps, 1, nw, neps, y, err);
}

extern "C" int mk_cuda_hc_post_head_norm(mk_cuda_ctx *ctx, const float *x, const float *res, const float *post,
                                         const float *comb, int s, int hc, int d, float *out, const float *fn,
                                         const float *scale, const float *base, float hc_eps, float norm_eps,
                                         const uint16_t *nw, float neps, float *y, const mk_cuda_moe_sum *ms,
                                         mk_err *err) {
    int st = hc_sum_check(ms, s, err);
    if (st) return st;
    const hc_post_in pin = {x, res, post, comb, out, ms ? *ms : mk_cuda_moe_sum{}};
    return hc_head_any(ctx, &pin, out, s, hc, d, fn, scale, base, hc_eps, norm_eps, 1, nw, neps, y, err);
}
