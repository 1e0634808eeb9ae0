/* gemv.cu — the decode GEMVs (m <= 8 activation rows) on tensor cores, reading the checkpoint's
 * FP8 / FP4 / bf16 bytes straight from device memory, plus a plain FMA kernel for every kind.
 *
 * Decode is memory-bound: a GEMV must stream W at close to the HBM rate, so each lane issues
 * 16-byte loads and keeps several in flight, and the arithmetic is put where it costs nothing:
 * the tensor cores. The weights are the A operand of mma.sync (16 output rows per warp) and the
 * activation rows are the 8 columns of B, so m = 1..8 costs the same MMAs and the same bytes.
 *
 * Layout trick. The fragment layouts of mma.sync spread k over the four lanes of a quad, which
 * would force 4-byte loads. But inside one scale block the order of k does not matter as long as
 * A and B use the same order, so lane (g, t) loads 16 contiguous bytes of its row and feeds them
 * to the MMA as if they were the k-slots the fragment assigns it; B (the activations) is loaded
 * the same way, so every product pairs the right weight with the right activation.
 *
 *   FP8: a warp covers 16 rows x 64 k per step (two m16n8k32 MMAs), two steps per 128-block; the
 *        four MMAs of a block sum into a zeroed partial that is then scaled by the activation and
 *        weight block scales and added to fp32 accumulators (the reference's promotion per block).
 *   FP4 (mk_cuda_gemv_fp4; the routed experts' kernels read their weights in lane order and put
 *        8 tokens in one MMA per 32-block instead, see the MoE section below): the per-32 weight
 *        scale changes within what one MMA sums, so the B operand is made
 *        block-diagonal: column (b, q) of B holds activation row b only in the k-slots of lane q
 *        and zeros elsewhere. Lane q's 16 bytes are one 32-block, so C[row][(b, q)] is that
 *        block's partial sum alone; it is scaled by its own e8m0 scale and the four q are summed
 *        at the end. One MMA set serves two activation rows (8 columns = 2 rows x 4 blocks).
 *        Nibbles are widened to e4m3 in registers (mk_d_fp4x8_to_e4m3: even and odd elements in
 *        separate words, which the quantizer's permuted activation layout mirrors).
 *   BF16: m16n8k16 bf16 MMAs; no scales, one accumulator over the whole k range.
 *   FP8_DQ (wo_a): the reference uses these weights dequantized to bf16 with unquantized
 *        activations, so the e4m3 bytes are widened to f16 (exact, cvt) and the activations are
 *        f16 with a power-of-two scale per 128-block (exact for bf16 inputs within 2^23 of the
 *        block maximum); m16n8k16 f16 MMAs, per-block scaling as for FP8.
 * Launch sharing (same bits as separate launches: each block runs its own kernel's code): an FP8
 * pair (k_gemv_fp8 with W2: wq_a + wkv, sh1 + sh3), up to MK_CUDA_MULTI bf16 matrices over one input
 * (k_gemv_bf16's matrix table: the compressors' and indexer's projections), and the routed experts'
 * decode GEMV with an FP8 GEMV (k_moe_fp4_with_fp8: the shared expert rides along).
 * Every GEMV is launched with programmatic dependent launch: it signals at its start that the
 * next kernel may be scheduled, issues its weight loads, and only then waits for the previous
 * kernel (griddepcontrol.wait) before loading activations — so weight streaming overlaps the
 * previous kernel's tail and the launch gap.
 * K is split over the warps of a block (whole scale blocks each) so that enough loads are in
 * flight to cover the memory latency; partial sums are added in warp order (deterministic). K can
 * also be split over several blocks per slab (the last block of a slab adds the partials in split
 * order), but on the H200 that extra pass cost more than it gained, so it is off by default
 * (mk_cuda_tuning.gemv_max_splits; bench/gpu/results-2026-12-02.md has the measurements).
 *
 * Many rows (prefill, batches): the engine needs a row's bits not to depend on the other rows, so
 * m > 8 rows get the GEMV's arithmetic, not a GEMM's. The row-invariant GEMMs (k_gemm_fp8_ri,
 * k_gemm_dq_ri, k_gemm_bf16_ri, and k_moe_fp4_ri for the experts) compute it in a GEMM's
 * arrangement: a block is 8 warps x 16 weight rows over 32 or 64 activation rows staged in shared
 * memory, and each warp walks all of k, summing each of the GEMV's warp ranges from zero as a
 * segment and adding the segments in warp order — what the GEMV's warps and gemv_reduce do. The
 * weights then stream once per 64 rows instead of once per 8 (bench/gpu/results-2026-12-04-prefill.md);
 * they are used where their grid fills the GPU, the chunks of 8 elsewhere.
 *
 * Numerics: products of e4m3 x e4m3 (and e2m1 x e4m3, bf16 x bf16) are exact; the tensor core
 * adds them with its own internal precision (the reference's TileLang kernel does the same), and
 * scales are powers of two, so results match mk_linear up to summation order within a block.
 */
#include "ops/cuda/cuda_common.cuh"

#define GEMV_MAXW 8      /* warps per block */
#define GEMV_MAXSPLIT 16 /* blocks per slab along k */

/* Launch plan for `slabs` 16-row slabs over `units` k-units (128-blocks, or 32-k steps for bf16):
 * enough warps in flight to cover the memory latency (~16 per SM), whole units per warp, and for
 * short-and-wide matrices several blocks per slab along k (`splits`, gridDim.z) so that every SM
 * streams. Warp w of split z covers units [(z * nw + w) * per, ... + per). */
typedef struct {
    int nw, splits, per;
} gemv_plan;

static gemv_plan plan_for(const mk_cuda_ctx *ctx, int slabs, int units) {
    int target = ctx->caps.sm_count * ctx->tune.gemv_warps_per_sm;
    int T = (target + slabs - 1) / slabs; /* warps per slab */
    int maxs = ctx->tune.gemv_max_splits < GEMV_MAXSPLIT ? ctx->tune.gemv_max_splits : GEMV_MAXSPLIT;
    if (T > GEMV_MAXW * maxs) T = GEMV_MAXW * maxs;
    if (T > units) T = units;
    if (T < 1) T = 1;
    gemv_plan p;
    p.per = (units + T - 1) / T;
    int parts = (units + p.per - 1) / p.per;
    p.nw = parts < GEMV_MAXW ? parts : GEMV_MAXW;
    p.splits = (parts + p.nw - 1) / p.nw;
    return p;
}

static int gemv_units(const mk_wmat *W) { return W->kind == MK_W_BF16 ? W->k / 32 : W->k / 128; }

/* Launches a GEMV kernel on the context's stream, with programmatic dependent launch unless the
 * tuning turns it off (the kernels touch only weights before mk_d_pdl_wait). */
template <typename... P, typename... A>
static cudaError_t gemv_launch(mk_cuda_ctx *ctx, dim3 grid, int threads, void (*kern)(P...), A... args) {
    return mk_cuda_launch_pdl(ctx, grid, dim3(threads), 0, kern, args...);
}

/* The grid of a pipelined decode GEMV over `slabs` slabs with blocks of nw warps: one wave at the
 * plan's register budget (16 warps of 128 registers per SM), or the tuning's gemv_pipe_grid. */
static int pipe_grid(const mk_cuda_ctx *ctx, int slabs, int nw) {
    long g = ctx->tune.gemv_pipe_grid > 0 ? ctx->tune.gemv_pipe_grid
                                          : (long)(ctx->caps.sm_count > 0 ? ctx->caps.sm_count : 1) * (16 / nw);
    return (int)(g < slabs ? g : slabs);
}

int mk_cuda_gemv_splits(const mk_cuda_ctx *ctx, const mk_wmat *W) {
    return plan_for(ctx, W->n / 16, gemv_units(W)).splits;
}

__device__ __forceinline__ float gemv_out(float v, int round) { return round ? mk_d_bf16r(v) : v; }

/* Sums the warps' accumulators in warp order into warp 0 (all threads must call it). */
template <int NV>
__device__ __forceinline__ void gemv_reduce(float (&acc)[NV], float *red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (nw == 1) return;
#pragma unroll
    for (int i = 0; i < NV; i++) red[(warp * 32 + lane) * NV + i] = acc[i];
    __syncthreads();
    if (warp == 0)
        for (int w = 1; w < nw; w++)
#pragma unroll
            for (int i = 0; i < NV; i++) acc[i] += red[(w * 32 + lane) * NV + i];
}

/* Writes the block's [m, 16] result tile (shared memory, tile[col * 16 + row]) for its slab. With
 * one split it goes straight to y. Otherwise each split stores its partial tile in ws and the last
 * split to finish (a per-slab counter) adds the partials in split order — deterministic whatever
 * the arrival order — and resets the counter for the next launch. All threads must call it. */
/* S splits, this block split z, its slab counter cidx (gemv_finish: the grid's). */
__device__ void gemv_finish_at(const float *tile, int m, int n, int n0, float *__restrict__ y, int round,
                               float *__restrict__ ws, unsigned *__restrict__ counters, int S, int z, int cidx) {
    __shared__ int is_last;
    const int tid = threadIdx.x, nt = blockDim.x;
    if (S == 1) {
        for (int i = tid; i < m * 16; i += nt)
            y[(size_t)(i >> 4) * n + n0 + (i & 15)] = gemv_out(tile[i], round);
        return;
    }
    for (int i = tid; i < m * 16; i += nt)
        ws[((size_t)z * m + (i >> 4)) * n + n0 + (i & 15)] = tile[i];
    __threadfence();
    __syncthreads();
    if (tid == 0) is_last = atomicAdd(&counters[cidx], 1u) == (unsigned)(S - 1);
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    for (int i = tid; i < m * 16; i += nt) {
        float s = 0.0f;
        for (int z = 0; z < S; z++) s += __ldcg(ws + ((size_t)z * m + (i >> 4)) * n + n0 + (i & 15));
        y[(size_t)(i >> 4) * n + n0 + (i & 15)] = gemv_out(s, round);
    }
    if (tid == 0) counters[cidx] = 0;
}

__device__ __forceinline__ void gemv_finish(const float *tile, int m, int n, int n0, float *__restrict__ y, int round,
                                            float *__restrict__ ws, unsigned *__restrict__ counters) {
    gemv_finish_at(tile, m, n, n0, y, round, ws, counters, gridDim.z, blockIdx.z, blockIdx.y);
}

/* ---- FP8 ---------------------------------------------------------------------------------- */

/* W e4m3 [n, k], S e8m0 [n/128, k/128], xq e4m3 [m, k], sa [m, k/128], y [m, n].
 * Block (slab, split): 16 rows; warp w handles its `per` 128-blocks (see plan_for). */
/* A second matrix (W2, S2 [n2, k], y2; s1 = n / 16 slabs of the first): slabs s1.. of the grid
 * are W2's, computed exactly as a launch of W2 alone with the same plan (the callers check the
 * plans agree), its split-K partials after the first's in ws. */
template <int U>
__device__ __forceinline__ void gemv_fp8_body(const uint3 bid, const int gz, const uint8_t *__restrict__ W,
                                                     const uint8_t *__restrict__ S,
                                                     const uint8_t *__restrict__ xq,
                                                     const float *__restrict__ sa, int m, int n,
                                                     int k, int per, float *__restrict__ y,
                                                     int round, float *__restrict__ ws,
                                                     unsigned *__restrict__ counters,
                                                     const uint8_t *__restrict__ W2, const uint8_t *__restrict__ S2,
                                                     int n2, float *__restrict__ y2) {
    __shared__ float red[GEMV_MAXW * 32 * 4];
    __shared__ float tile[8 * 16];
    int slab = bid.y;
    if (slab >= (n >> 4)) { /* the second matrix */
        slab -= n >> 4;
        ws += (size_t)gz * min(8, m) * n;
        W = W2, S = S2, y = y2, n = n2;
    }
    { /* chunk x: activation rows 8 c .. 8 c + 7 (a launch over m > 8 rows) */
        const int c8 = (int)bid.x * 8;
        xq += (size_t)c8 * k;
        sa += (size_t)c8 * (k >> 7);
        y += (size_t)c8 * n;
        m = min(8, m - c8);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = slab * 16;
    const int nb = k >> 7;
    const int kb0 = ((int)bid.z * nw + warp) * per, kb1 = min(nb, kb0 + per);
    const uint8_t *w0 = W + (size_t)(n0 + g) * k + t * 16; /* row g */
    const uint8_t *w1 = w0 + (size_t)8 * k;                /* row g + 8 */
    const bool xcol = g < m;                               /* this lane supplies B column g */
    const uint8_t *xr = xq + (size_t)(xcol ? g : 0) * k + t * 16;
    const uint8_t *sbr = S + (size_t)(n0 >> 7) * nb;
    const int c0 = 2 * t, c1 = 2 * t + 1; /* the C columns (activation rows) this lane holds */
    const bool v0 = c0 < m, v1 = c1 < m;
    const float *sa0 = sa + (size_t)(v0 ? c0 : 0) * nb;
    const float *sa1 = sa + (size_t)(v1 ? c1 : 0) * nb;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int kb = kb0; kb < kb1; kb += U) {
        uint4 a[U][2][2], b[U][2]; /* [block][64-k step][row half] */
        float f0[U], f1[U];        /* combined scales sa * sb of the two C columns */
        float sbv[U];
#pragma unroll
        for (int u = 0; u < U; u++) { /* weights first: they do not depend on the previous kernel */
            if (kb + u < kb1) {
#pragma unroll
                for (int s = 0; s < 2; s++) {
                    size_t off = (size_t)(kb + u) * 128 + s * 64;
                    a[u][s][0] = mk_d_ld_stream(w0 + off);
                    a[u][s][1] = mk_d_ld_stream(w1 + off);
                }
                sbv[u] = mk_d_e8m0(sbr[kb + u]);
            }
        }
        mk_d_pdl_wait();
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (kb + u < kb1) {
#pragma unroll
                for (int s = 0; s < 2; s++) {
                    size_t off = (size_t)(kb + u) * 128 + s * 64;
                    b[u][s] = xcol ? mk_d_ld16(xr + off) : make_uint4(0, 0, 0, 0);
                }
                f0[u] = v0 ? sa0[kb + u] * sbv[u] : 0.0f;
                f1[u] = v1 ? sa1[kb + u] * sbv[u] : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (kb + u < kb1) {
                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int s = 0; s < 2; s++) {
                    mk_d_mma_e4m3(c, a[u][s][0].x, a[u][s][1].x, a[u][s][0].y, a[u][s][1].y,
                                  b[u][s].x, b[u][s].y);
                    mk_d_mma_e4m3(c, a[u][s][0].z, a[u][s][1].z, a[u][s][0].w, a[u][s][1].w,
                                  b[u][s].z, b[u][s].w);
                }
                /* both scales are powers of two: c * (sa * sb) == (c * sa) * sb exactly */
                acc[0] = fmaf(c[0], f0[u], acc[0]);
                acc[1] = fmaf(c[1], f1[u], acc[1]);
                acc[2] = fmaf(c[2], f0[u], acc[2]);
                acc[3] = fmaf(c[3], f1[u], acc[3]);
            }
        }
    }
    mk_d_pdl_wait(); /* warps without work, before any write */
    gemv_reduce<4>(acc, red);
    if (warp == 0) {
        if (v0) tile[c0 * 16 + g] = acc[0], tile[c0 * 16 + g + 8] = acc[2];
        if (v1) tile[c1 * 16 + g] = acc[1], tile[c1 * 16 + g + 8] = acc[3];
    }
    __syncthreads();
    gemv_finish_at(tile, m, n, n0, y, round, ws, counters, gz, bid.z, bid.y);
}


/* Block (row chunk x, slab y, split z). */
template <int U>
__global__ void __launch_bounds__(256, 2) k_gemv_fp8(const uint8_t *__restrict__ W,
                                                     const uint8_t *__restrict__ S,
                                                     const uint8_t *__restrict__ xq,
                                                     const float *__restrict__ sa, int m, int n,
                                                     int k, int per, float *__restrict__ y,
                                                     int round, float *__restrict__ ws,
                                                     unsigned *__restrict__ counters,
                                                     const uint8_t *__restrict__ W2, const uint8_t *__restrict__ S2,
                                                     int n2, float *__restrict__ y2) {
    mk_d_pdl_launch_dependents();
    gemv_fp8_body<U>(blockIdx, gridDim.z, W, S, xq, sa, m, n, k, per, y, round, ws, counters, W2, S2, n2, y2);
}

/* The pipelined GEMVs' loop over a warp's `total` items: two items of weights in flight, item i + 2
 * loaded as soon as item i is computed (load(item, i) issues the weight loads; comp(item, i) loads the
 * activations and computes). The first two are requested before the PDL wait: weights do not depend
 * on the previous kernel. (Requesting them after it, or only one before it, measured slower: H100,
 * session 27: the kernel before finishes sooner, the GEMV later.) */
template <typename Item, typename L, typename C>
__device__ __forceinline__ void gemv_pipe2(int total, L &load, C &comp) {
    Item A, B;
    if (total > 0) load(A, 0);
    if (total > 1) load(B, 1);
    mk_d_pdl_wait(); /* the weights of two items are on their way; now the activations */
    for (int i = 0; i < total; i += 2) {
        comp(A, i);
        if (i + 2 < total) load(A, i + 2);
        if (i + 1 >= total) break;
        comp(B, i + 1);
        if (i + 3 < total) load(B, i + 3);
    }
}

/* The FP8 GEMV for at most 8 rows, pipelined (tuning gemv_pipe): a block of nw warps serves the
 * slabs blockIdx.y, + gridDim.y, ... (both matrices' slabs, as k_gemv_fp8's grid numbers them);
 * each warp walks its k range of each slab (plan_for's, as in k_gemv_fp8) in items of two
 * 128-blocks, and loads item i + 1's weights before it computes item i, across slab boundaries, so
 * a warp always has a load in flight instead of alternating load bursts and arithmetic. Each slab
 * gets k_gemv_fp8's per-block MMAs, fmaf order and warp-order sum: the same bits. All warps run the
 * same number of items per slab (empty ones skip), so the per-slab barriers line up. */
struct fp8_item {
    uint4 a[2][2][2]; /* [block][64-k step][row half] */
    float sb[2];
};

__global__ void __launch_bounds__(256, 2) k_gemv_fp8_pipe(const uint8_t *__restrict__ W, const uint8_t *__restrict__ S,
                                                          const uint8_t *__restrict__ xq, const float *__restrict__ sa,
                                                          int m, int n, int k, int per, float *__restrict__ y,
                                                          int round, const uint8_t *__restrict__ W2,
                                                          const uint8_t *__restrict__ S2, int n2,
                                                          float *__restrict__ y2) {
    mk_d_pdl_launch_dependents();
    __shared__ float red[GEMV_MAXW * 32 * 4];
    __shared__ float tile[8 * 16];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nb = k >> 7, s1 = n >> 4, ns = s1 + (n2 >> 4);
    const int kb0 = warp * per, kb1 = min(nb, kb0 + per);
    const int ng = (per + 1) >> 1; /* items per slab */
    const int nsl = ((int)blockIdx.y < ns) ? (ns - (int)blockIdx.y + (int)gridDim.y - 1) / (int)gridDim.y : 0;
    const int total = nsl * ng;
    const bool xcol = g < m;
    const uint8_t *xr = xq + (size_t)(xcol ? g : 0) * k + t * 16;
    const int c0 = 2 * t, c1 = 2 * t + 1;
    const bool v0 = c0 < m, v1 = c1 < m;
    const float *sa0 = sa + (size_t)(v0 ? c0 : 0) * nb;
    const float *sa1 = sa + (size_t)(v1 ? c1 : 0) * nb;
    auto load = [&](fp8_item &it, int i) {
        int slab = (int)blockIdx.y + (i / ng) * (int)gridDim.y;
        const uint8_t *Wm = W, *Sm = S;
        if (slab >= s1) slab -= s1, Wm = W2, Sm = S2;
        const int kb = kb0 + 2 * (i % ng), n0 = slab * 16;
        const uint8_t *w0 = Wm + (size_t)(n0 + g) * k + t * 16, *w1 = w0 + (size_t)8 * k;
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (kb + u < kb1) {
#pragma unroll
                for (int s = 0; s < 2; s++) {
                    const size_t off = (size_t)(kb + u) * 128 + s * 64;
                    it.a[u][s][0] = mk_d_ld_stream(w0 + off);
                    it.a[u][s][1] = mk_d_ld_stream(w1 + off);
                }
                it.sb[u] = mk_d_e8m0(Sm[(size_t)(n0 >> 7) * nb + kb + u]);
            }
        }
    };
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    auto comp = [&](const fp8_item &it, int i) {
        const int kb = kb0 + 2 * (i % ng);
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (kb + u < kb1) {
                uint4 b[2];
#pragma unroll
                for (int s = 0; s < 2; s++)
                    b[s] = xcol ? mk_d_ld16(xr + (size_t)(kb + u) * 128 + s * 64) : make_uint4(0, 0, 0, 0);
                const float f0 = v0 ? sa0[kb + u] * it.sb[u] : 0.0f, f1 = v1 ? sa1[kb + u] * it.sb[u] : 0.0f;
                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int s = 0; s < 2; s++) {
                    mk_d_mma_e4m3(c, it.a[u][s][0].x, it.a[u][s][1].x, it.a[u][s][0].y, it.a[u][s][1].y, b[s].x,
                                  b[s].y);
                    mk_d_mma_e4m3(c, it.a[u][s][0].z, it.a[u][s][1].z, it.a[u][s][0].w, it.a[u][s][1].w, b[s].z,
                                  b[s].w);
                }
                acc[0] = fmaf(c[0], f0, acc[0]);
                acc[1] = fmaf(c[1], f1, acc[1]);
                acc[2] = fmaf(c[2], f0, acc[2]);
                acc[3] = fmaf(c[3], f1, acc[3]);
            }
        }
        if (i % ng == ng - 1) { /* the slab's last item: warp-order sum, store, next slab from zero */
            int slab = (int)blockIdx.y + (i / ng) * (int)gridDim.y, nn = n;
            float *yy = y;
            if (slab >= s1) slab -= s1, yy = y2, nn = n2;
            gemv_reduce<4>(acc, red);
            if (warp == 0) {
                if (v0) tile[c0 * 16 + g] = acc[0], tile[c0 * 16 + g + 8] = acc[2];
                if (v1) tile[c1 * 16 + g] = acc[1], tile[c1 * 16 + g + 8] = acc[3];
            }
            __syncthreads();
            gemv_finish_at(tile, m, nn, slab * 16, yy, round, NULL, NULL, 1, 0, 0); /* one split: the store */
            __syncthreads(); /* red and tile are reused by the next slab */
            acc[0] = acc[1] = acc[2] = acc[3] = 0.0f;
        }
    };
    gemv_pipe2<fp8_item>(total, load, comp);
}

/* ---- the FP8 GEMV's bits for many rows: the row-invariant GEMM (prefill, large batches) ------- */

/* The chunks-of-8 launch re-streams W for every 8 activation rows and gives each warp a k range,
 * so its tiles cannot share staged activations. This kernel computes every (output row, activation
 * row) with exactly the GEMV's operations in the GEMV's order, arranged as a GEMM: a block is 8
 * warps x 16 rows (8 slabs) and 8 J activation rows; the activations' 128-blocks are staged in
 * shared memory by cp.async (RI_ST stages ahead) and read by all 8 warps; each warp streams its own
 * slab's weights once per block. A warp walks all of k itself: the GEMV's k ranges (plan_for's
 * `per` 128-blocks each) become segments, each summed from zero with the GEMV's per-block MMAs and
 * fmaf, and the segments are added in order — what gemv_reduce does with the warps' sums. So the
 * result is the GEMV's, bit for bit, for every row count (op test: = the chunks of 8).
 * Shared layout: stage s holds 8 J rows x 128 bytes; 16-byte chunk c of row r sits at chunk
 * c ^ 4 (r & 1), so the 8 lanes of a quarter warp (rows g, g + 1; chunks t) hit 8 different bank
 * groups. */
#define RI_ST 4

/* Helpers of the row-invariant GEMMs (this kernel and the FP8_DQ, bf16 and expert ones below). */

/* Stage u of a cp.async pipeline of ST stages: wait for stage u, make it visible to the block (and
 * free stage u - 1 for reuse), issue stage u + ST - 1 (stage(v) queues its copies) and commit. The
 * first ST - 1 stages are issued by ri_prologue. A commit per step even when nothing is issued keeps
 * the group count in step with u. */
template <int ST, typename F> __device__ __forceinline__ void ri_prologue(F &&stage, int nu) {
#pragma unroll
    for (int p = 0; p < ST - 1; p++) {
        if (p < nu) stage(p);
        mk_d_cp_async_commit();
    }
}
template <int ST, typename F> __device__ __forceinline__ void ri_advance(F &&stage, int u, int nu) {
    mk_d_cp_async_wait<ST - 2>();
    __syncthreads();
    if (u + ST - 1 < nu) stage(u + ST - 1);
    mk_d_cp_async_commit();
}

/* Rows [0, 8 J) of CH 16-byte chunks each into dst (row r at r * 16 CH; chunk c at swz(r, c)), row
 * r's chunk c from src(r) + 16 c, rows >= mt zero-filled; 256 threads. */
template <int J, int CH, typename SWZ, typename SRC>
__device__ __forceinline__ void ri_stage_rows(uint8_t *dst, int mt, SWZ swz, SRC src) {
#pragma unroll
    for (int i = 0; i < (8 * J * CH) / 256; i++) {
        const int id = threadIdx.x + i * 256, r = id / CH, c = id % CH;
        const bool ok = r < mt;
        mk_d_cp_async16(dst + r * 16 * CH + swz(r, c) * 16, src(ok ? r : 0) + c * 16, ok ? 16 : 0);
    }
}

/* S steps of a warp's rows g / g + 8 (w0 / w1: the lane's bytes) from byte off, into a; a step is sst
 * bytes further (64 in rows; 1024 in bf16 slab tiles, mk_cuda_bf16_tiles). */
template <int S>
__device__ __forceinline__ void ri_load_w(uint4 (&a)[S][2], const uint8_t *w0, const uint8_t *w1, size_t off,
                                          int sst = 64) {
#pragma unroll
    for (int s = 0; s < S; s++)
        a[s][0] = mk_d_ld_stream(w0 + off + (size_t)s * sst), a[s][1] = mk_d_ld_stream(w1 + off + (size_t)s * sst);
}

/* The end of a GEMV warp range (a segment): its sum (part, from zero) added to the earlier ones in
 * order, as gemv_reduce adds the warps' sums; part restarts from zero. */
template <int NV> __device__ __forceinline__ void ri_fold(float (&tot)[NV], float (&part)[NV], bool first) {
#pragma unroll
    for (int i = 0; i < NV; i++) tot[i] = first ? part[i] : tot[i] + part[i], part[i] = 0.0f;
}

/* The warp's 16 rows (n0 + g, n0 + g + 8) x 8 J activation rows (tile j's C columns 2 t, 2 t + 1) of
 * tot into y rows r0 + .. (those < mt), as gemv_finish_at writes them. */
template <int J>
__device__ __forceinline__ void ri_store(const float (&tot)[4 * J], float *__restrict__ y, int n, int n0, int r0,
                                         int mt, int round) {
    const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int ra = 8 * j + 2 * t, rb = ra + 1;
        if (ra < mt) {
            y[(size_t)(r0 + ra) * n + n0 + g] = gemv_out(tot[4 * j + 0], round);
            y[(size_t)(r0 + ra) * n + n0 + g + 8] = gemv_out(tot[4 * j + 2], round);
        }
        if (rb < mt) {
            y[(size_t)(r0 + rb) * n + n0 + g] = gemv_out(tot[4 * j + 1], round);
            y[(size_t)(r0 + rb) * n + n0 + g + 8] = gemv_out(tot[4 * j + 3], round);
        }
    }
}

/* WD (tuning ri_wdepth): how many 128-blocks of its weights a warp has in flight while it computes
 * one (a ring of WD register items, the kb loop unrolled by WD so each item's slot is fixed); pf
 * (tuning ri_l2_pf, 0: none): its rows' 128-block kb + pf are requested into L2 while it computes
 * kb. Only when the loads are issued changes, not what is computed: the same bits for every WD
 * and pf. */
template <int J, int WD>
__global__ void __launch_bounds__(256, J == 8 ? 1 : 2)
    k_gemm_fp8_ri(const uint8_t *__restrict__ W, const uint8_t *__restrict__ S, const uint8_t *__restrict__ xq,
                  const float *__restrict__ sa, int m, int n, int k, int per, float *__restrict__ y, int round,
                  const uint8_t *__restrict__ W2, const uint8_t *__restrict__ S2, int n2, float *__restrict__ y2, int pf) {
    __shared__ __align__(16) uint8_t xs[RI_ST][8 * J * 128];
    __shared__ float ss[RI_ST][8 * J];
    mk_d_pdl_launch_dependents();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nb = k >> 7;
    int slab = (int)blockIdx.y * 8 + warp;
    const bool active = slab < (n >> 4) + (n2 >> 4);
    if (slab >= (n >> 4)) { /* the second matrix */
        slab -= n >> 4;
        W = W2, S = S2, y = y2, n = n2;
    }
    if (!active) slab = 0;
    const int r0 = (int)blockIdx.x * 8 * J, mt = min(8 * J, m - r0);
    const int n0 = slab * 16;
    const uint8_t *w0 = W + (size_t)(n0 + g) * k + t * 16; /* row g */
    const uint8_t *w1 = w0 + (size_t)8 * k;                /* row g + 8 */
    const uint8_t *sbr = S + (size_t)(n0 >> 7) * nb;
    const int c0 = 2 * t, c1 = 2 * t + 1;

    /* activations of 128-block kb into stage kb % RI_ST (rows past m zero-filled) */
    auto stage = [&](int kb) {
        ri_stage_rows<J, 8>(xs[kb % RI_ST], mt, [](int r, int c) { return c ^ ((r & 1) << 2); },
                            [&](int r) { return xq + (size_t)(r0 + r) * k + (size_t)kb * 128; });
        if (tid < 8 * J) {
            const bool ok = tid < mt;
            mk_d_cp_async4(&ss[kb % RI_ST][tid], sa + (size_t)(r0 + (ok ? tid : 0)) * nb + kb, ok ? 4 : 0);
        }
    };

    uint4 a[2][2], an[WD][2][2]; /* this block's weights, the next WD blocks' (and their scales) */
    float sbv[WD];
#pragma unroll
    for (int u = 0; u < WD; u++) {
        sbv[u] = 0.0f;
        if (active && u < nb) {
            ri_load_w(an[u], w0, w1, (size_t)u * 128);
            sbv[u] = mk_d_e8m0(sbr[u]);
        }
    }
    mk_d_pdl_wait();
    ri_prologue<RI_ST>(stage, nb);
    float tot[4 * J], part[4 * J];
#pragma unroll
    for (int i = 0; i < 4 * J; i++) tot[i] = part[i] = 0.0f;
    for (int kb0 = 0; kb0 < nb; kb0 += WD) {
#pragma unroll
        for (int u = 0; u < WD; u++) {
            const int kb = kb0 + u;
            if (kb >= nb) break; /* the same for every thread */
            ri_advance<RI_ST>(stage, kb, nb);
#pragma unroll
            for (int s = 0; s < 2; s++) a[s][0] = an[u][s][0], a[s][1] = an[u][s][1];
            if (active && lane < 16 && kb + pf < nb) /* lane r: row n0 + r's 128-block kb + pf, into L2 */
                mk_d_l2_prefetch(W + (size_t)(n0 + lane) * k + (size_t)(kb + pf) * 128);
            const float sb = sbv[u];
            if (active && kb + WD < nb) {
                ri_load_w(an[u], w0, w1, (size_t)(kb + WD) * 128);
                sbv[u] = mk_d_e8m0(sbr[kb + WD]);
            }
            if (active) {
                const uint8_t *xst = xs[kb % RI_ST];
                const float *sst = ss[kb % RI_ST];
#pragma unroll
                for (int j = 0; j < J; j++) {
                    if (8 * j >= mt) break;
                    const uint8_t *xr = xst + (8 * j + g) * 128;
                    uint4 b[2];
#pragma unroll
                    for (int s = 0; s < 2; s++) b[s] = *(const uint4 *)(xr + (((s * 4 + t) ^ ((g & 1) << 2)) << 4));
                    const float f0 = sst[8 * j + c0] * sb, f1 = sst[8 * j + c1] * sb;
                    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                    for (int s = 0; s < 2; s++) {
                        mk_d_mma_e4m3(c, a[s][0].x, a[s][1].x, a[s][0].y, a[s][1].y, b[s].x, b[s].y);
                        mk_d_mma_e4m3(c, a[s][0].z, a[s][1].z, a[s][0].w, a[s][1].w, b[s].z, b[s].w);
                    }
                    part[4 * j + 0] = fmaf(c[0], f0, part[4 * j + 0]);
                    part[4 * j + 1] = fmaf(c[1], f1, part[4 * j + 1]);
                    part[4 * j + 2] = fmaf(c[2], f0, part[4 * j + 2]);
                    part[4 * j + 3] = fmaf(c[3], f1, part[4 * j + 3]);
                }
                if ((kb + 1) % per == 0 || kb + 1 == nb) ri_fold(tot, part, kb < per); /* a GEMV warp's range ends */
            }
        }
    }
    mk_d_cp_async_wait<0>();
    if (active) ri_store<J>(tot, y, n, n0, r0, mt, round);
}

/* Tiles of 8 rows per block of the row-invariant GEMM for m rows over `slabs` 16-row slabs: 8 when
 * that fills the SMs (the tuning's ri_min_blocks, 0 = the SM count), else 4, else 1 (the GEMV's
 * chunks of 8: more blocks in flight for a weight-bound batch); never more than the tuning's
 * gemv_tiles. */
static int ri_tiles_for(const mk_cuda_ctx *ctx, int m, int slabs) {
    const int want = ctx->tune.ri_min_blocks > 0 ? ctx->tune.ri_min_blocks : ctx->caps.sm_count;
    const int groups = (slabs + 7) / 8;
    for (int J = 8; J >= 4; J >>= 1)
        if (J <= ctx->tune.gemv_tiles && m > 8 && (long)((m + 8 * J - 1) / (8 * J)) * groups >= want) return J;
    return 1;
}

int mk_cuda_gemv_fp8_pair_ok(const mk_cuda_ctx *ctx, const mk_wmat *W, const mk_wmat *W2) {
    if (W->kind != MK_W_FP8 || W2->kind != MK_W_FP8 || W->k != W2->k || W->k % 128 || W->n % 16 || W2->n % 16 ||
        (W->n + W2->n) / 16 > 65535)
        return 0;
    gemv_plan a = plan_for(ctx, W->n / 16, W->k / 128), b = plan_for(ctx, W2->n / 16, W2->k / 128);
    return a.per == b.per && a.nw == b.nw && a.splits == b.splits;
}

int mk_cuda_gemv_fp8(mk_cuda_ctx *ctx, const mk_wmat *W, const uint8_t *xq, const float *sa, int m,
                     float *y, int round, float *ws, mk_err *err) {
    return mk_cuda_gemv_fp8_pair(ctx, W, NULL, xq, sa, m, y, NULL, round, ws, err);
}

int mk_cuda_gemv_fp8_pair(mk_cuda_ctx *ctx, const mk_wmat *W, const mk_wmat *W2, const uint8_t *xq, const float *sa,
                          int m, float *y, float *y2, int round, float *ws, mk_err *err) {
    int n = W->n, k = W->k, n2 = W2 ? W2->n : 0;
    if (m < 1 || n % 16 || n / 16 > 65535 || k % 128)
        return mk_fail(err, MK_ENOTSUP, "cuda: fp8 gemv: needs m >= 1, n %% 16 == 0 (n <= 1048560), k %% 128 == 0 "
                       "(m %d, n %d, k %d)", m, n, k);
    if (W2 && !mk_cuda_gemv_fp8_pair_ok(ctx, W, W2))
        return mk_fail(err, MK_ENOTSUP, "cuda: fp8 gemv pair: [%d, %d] and [%d, %d] do not share a launch plan", n, k,
                       W2->n, W2->k);
    gemv_plan p = plan_for(ctx, n / 16, k / 128);
    const int J = p.splits == 1 ? ri_tiles_for(ctx, m, (n + n2) / 16) : 1;
    if (J > 1) { /* the row-invariant GEMM: the same bits */
        dim3 grid((m + 8 * J - 1) / (8 * J), ((n + n2) / 16 + 7) / 8, 1);
        const uint8_t *w2 = W2 ? (const uint8_t *)W2->w : (const uint8_t *)NULL, *s2 = W2 ? W2->scale : NULL;
        /* a deeper weight ring only at 8 tiles (1 block per SM, 255 registers: no spill at WD 2) */
        cudaError_t e = J == 4 ? gemv_launch(ctx, grid, 256, k_gemm_fp8_ri<4, 1>, (const uint8_t *)W->w, W->scale, xq,
                                             sa, m, n, k, p.per, y, round, w2, s2, n2, y2, ctx->tune.ri_l2_pf)
                        : ctx->tune.ri_wdepth == 2
                            ? gemv_launch(ctx, grid, 256, k_gemm_fp8_ri<8, 2>, (const uint8_t *)W->w, W->scale, xq, sa,
                                          m, n, k, p.per, y, round, w2, s2, n2, y2, ctx->tune.ri_l2_pf)
                            : gemv_launch(ctx, grid, 256, k_gemm_fp8_ri<8, 1>, (const uint8_t *)W->w, W->scale, xq, sa,
                                          m, n, k, p.per, y, round, w2, s2, n2, y2, ctx->tune.ri_l2_pf);
        MK_CU_TRY(e, err, "cuda: fp8 row-invariant gemm launch");
        if (ctx->trace_on) mk_cuda_trace_mark(ctx, "cuda: fp8 row-invariant gemm launch");
        return MK_OK;
    }
    if (p.splits == 1 && m <= 8 && ctx->tune.gemv_pipe) { /* decode: the pipelined GEMV, the same bits */
        MK_CU_TRY(gemv_launch(ctx, dim3(1, pipe_grid(ctx, (n + n2) / 16, p.nw), 1), p.nw * 32, k_gemv_fp8_pipe,
                              (const uint8_t *)W->w, W->scale, xq, sa, m, n, k, p.per, y, round,
                              W2 ? (const uint8_t *)W2->w : (const uint8_t *)NULL,
                              W2 ? W2->scale : (const uint8_t *)NULL, n2, y2),
                  err, "cuda: fp8 gemv launch");
        if (ctx->trace_on) mk_cuda_trace_mark(ctx, "cuda: fp8 gemv (pipelined) launch");
        return MK_OK;
    }
    if (p.splits > 1 && !ws) return mk_fail(err, MK_EINVAL, "cuda: fp8 gemv: split-K needs a workspace");
    if (p.splits > 1 && m > 8)
        return mk_fail(err, MK_EINVAL, "cuda: fp8 gemv: split-K takes at most 8 rows per launch (m %d)", m);
    dim3 grid((m + 7) / 8, (n + n2) / 16, p.splits);
    MK_CU_TRY(gemv_launch(ctx, grid, p.nw * 32, k_gemv_fp8<4>, (const uint8_t *)W->w, W->scale, xq,
                          sa, m, n, k, p.per, y, round, ws, ctx->counters,
                          W2 ? (const uint8_t *)W2->w : (const uint8_t *)NULL, W2 ? W2->scale : (const uint8_t *)NULL,
                          n2, y2),
              err, "cuda: fp8 gemv launch");
    if (ctx->trace_on) mk_cuda_trace_mark(ctx, "cuda: fp8 gemv launch");
    return MK_OK;
}

/* ---- FP4 ---------------------------------------------------------------------------------- */

/* One 128-block of the FP4 GEMVs: the two 16-byte weight groups a (rows g and g + 8) widened to
 * e4m3, four MMAs per activation-row pair p against xv, each 32-block's sum scaled by its weight
 * scale (sg: rows g, sg8: rows g + 8; two e8m0 bytes each) and the activation block scale sav[p]. */
template <int NP>
__device__ __forceinline__ void fp4_mma_step(const uint4 (&a)[2], uint32_t sg, uint32_t sg8, const uint4 (&xv)[NP][2],
                                             const float (&sav)[NP], float (&acc)[NP][4]) {
    uint32_t e0[4], o0[4], e1[4], o1[4];
    mk_d_fp4x8_to_e4m3(a[0].x, e0[0], o0[0]);
    mk_d_fp4x8_to_e4m3(a[0].y, e0[1], o0[1]);
    mk_d_fp4x8_to_e4m3(a[0].z, e0[2], o0[2]);
    mk_d_fp4x8_to_e4m3(a[0].w, e0[3], o0[3]);
    mk_d_fp4x8_to_e4m3(a[1].x, e1[0], o1[0]);
    mk_d_fp4x8_to_e4m3(a[1].y, e1[1], o1[1]);
    mk_d_fp4x8_to_e4m3(a[1].z, e1[2], o1[2]);
    mk_d_fp4x8_to_e4m3(a[1].w, e1[3], o1[3]);
    /* 64 undoes the 2^-6 of the widened nibbles (exact) */
    float sb00 = 64.0f * mk_d_e8m0(sg & 0xff), sb01 = 64.0f * mk_d_e8m0(sg >> 8);
    float sb10 = 64.0f * mk_d_e8m0(sg8 & 0xff), sb11 = 64.0f * mk_d_e8m0(sg8 >> 8);
#pragma unroll
    for (int p = 0; p < NP; p++) {
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mk_d_mma_e4m3(c, e0[0], e1[0], o0[0], o1[0], xv[p][0].x, xv[p][0].y);
        mk_d_mma_e4m3(c, e0[1], e1[1], o0[1], o1[1], xv[p][0].z, xv[p][0].w);
        mk_d_mma_e4m3(c, e0[2], e1[2], o0[2], o1[2], xv[p][1].x, xv[p][1].y);
        mk_d_mma_e4m3(c, e0[3], e1[3], o0[3], o1[3], xv[p][1].z, xv[p][1].w);
        float s = sav[p];
        acc[p][0] = fmaf(c[0], s * sb00, acc[p][0]);
        acc[p][1] = fmaf(c[1], s * sb01, acc[p][1]);
        acc[p][2] = fmaf(c[2], s * sb10, acc[p][2]);
        acc[p][3] = fmaf(c[3], s * sb11, acc[p][3]);
    }
}

/* W packed e2m1 [n, k/2], S e8m0 [n, k/32], xq e4m3 [m, k] in the permuted chunk order,
 * sa [m, k/128]. NP pairs of activation rows per MMA set (m <= 2 NP). */
template <int NP, int U>
__global__ void __launch_bounds__(256, 2) k_gemv_fp4(const uint8_t *__restrict__ W,
                                                     const uint8_t *__restrict__ S,
                                                     const uint8_t *__restrict__ xq,
                                                     const float *__restrict__ sa, int m, int n,
                                                     int k, int per, float *__restrict__ y,
                                                     int round, float *__restrict__ ws,
                                                     unsigned *__restrict__ counters) {
    __shared__ float red[GEMV_MAXW * 32 * 2 * NP];
    __shared__ float tile[8 * 16];
    mk_d_pdl_launch_dependents();
    { /* chunk blockIdx.x: activation rows 8 c .. 8 c + 7 (a launch over m > 8 rows) */
        const int c8 = (int)blockIdx.x * 8;
        xq += (size_t)c8 * k;
        sa += (size_t)c8 * (k >> 7);
        y += (size_t)c8 * n;
        m = min(8, m - c8);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.y * 16;
    const int nb = k >> 7, nsb = k >> 5;
    const size_t rowb = (size_t)k >> 1;
    const int kb0 = (blockIdx.z * nw + warp) * per, kb1 = min(nb, kb0 + per);
    const uint8_t *w0 = W + (size_t)(n0 + g) * rowb + t * 16; /* 16 bytes = 32-block t of a kb */
    const uint8_t *w1 = w0 + 8 * rowb;
    /* the C columns 2t, 2t+1 are blocks q = 2(t&1), 2(t&1)+1 of activation row 2p + (t>>1) */
    const uint8_t *s0p = S + (size_t)(n0 + g) * nsb + 2 * (t & 1);
    const uint8_t *s1p = s0p + (size_t)8 * nsb;
    const bool diag = (g & 3) == t; /* B column g = (row 2p + (g>>2), block g&3): nonzero here */
    float acc[NP][4];
#pragma unroll
    for (int p = 0; p < NP; p++) acc[p][0] = acc[p][1] = acc[p][2] = acc[p][3] = 0.0f;
    for (int kb = kb0; kb < kb1; kb += U) {
        uint4 a[U][2], xv[U][NP][2];
        uint32_t sg[U], sg8[U];
        float sav[U][NP];
#pragma unroll
        for (int u = 0; u < U; u++) { /* weights and their scales first */
            if (kb + u < kb1) {
                a[u][0] = mk_d_ld_stream(w0 + (size_t)(kb + u) * 64);
                a[u][1] = mk_d_ld_stream(w1 + (size_t)(kb + u) * 64);
                sg[u] = *(const uint16_t *)(s0p + 4 * (kb + u));
                sg8[u] = *(const uint16_t *)(s1p + 4 * (kb + u));
            }
        }
        mk_d_pdl_wait();
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (kb + u < kb1) {
#pragma unroll
                for (int p = 0; p < NP; p++) {
                    int b = 2 * p + (g >> 2);
                    if (diag && b < m) {
                        const uint8_t *xp = xq + (size_t)b * k + (size_t)(kb + u) * 128 + 32 * t;
                        xv[u][p][0] = mk_d_ld16(xp);
                        xv[u][p][1] = mk_d_ld16(xp + 16);
                    } else {
                        xv[u][p][0] = xv[u][p][1] = make_uint4(0, 0, 0, 0);
                    }
                    int bc = 2 * p + (t >> 1);
                    sav[u][p] = bc < m ? sa[(size_t)bc * nb + kb + u] : 0.0f;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (kb + u < kb1) fp4_mma_step<NP>(a[u], sg[u], sg8[u], xv[u], sav[u], acc);
        }
    }
    mk_d_pdl_wait(); /* warps without work, before any write */
    /* sum the four blocks q of each (row, activation row): two here, two in lane t ^ 1 */
    float r[2 * NP];
#pragma unroll
    for (int p = 0; p < NP; p++) {
        float lo = acc[p][0] + acc[p][1], hi = acc[p][2] + acc[p][3];
        lo += __shfl_xor_sync(0xffffffffu, lo, 1);
        hi += __shfl_xor_sync(0xffffffffu, hi, 1);
        r[2 * p] = lo;
        r[2 * p + 1] = hi;
    }
    gemv_reduce<2 * NP>(r, red);
    if (warp == 0 && !(t & 1)) {
#pragma unroll
        for (int p = 0; p < NP; p++) {
            int bc = 2 * p + (t >> 1);
            if (bc < m) tile[bc * 16 + g] = r[2 * p], tile[bc * 16 + g + 8] = r[2 * p + 1];
        }
    }
    __syncthreads();
    gemv_finish(tile, m, n, n0, y, round, ws, counters);
}

int mk_cuda_gemv_fp4(mk_cuda_ctx *ctx, const mk_wmat *W, const uint8_t *xq, const float *sa, int m,
                     float *y, int round, float *ws, mk_err *err) {
    int n = W->n, k = W->k;
    if (m < 1 || n % 16 || n / 16 > 65535 || k % 128)
        return mk_fail(err, MK_ENOTSUP, "cuda: fp4 gemv: needs m >= 1, n %% 16 == 0 (n <= 1048560), k %% 128 == 0 "
                       "(m %d, n %d, k %d)", m, n, k);
    gemv_plan p = plan_for(ctx, n / 16, k / 128);
    if (p.splits > 1 && !ws) return mk_fail(err, MK_EINVAL, "cuda: fp4 gemv: split-K needs a workspace");
    if (p.splits > 1 && m > 8)
        return mk_fail(err, MK_EINVAL, "cuda: fp4 gemv: split-K takes at most 8 rows per launch (m %d)", m);
    dim3 grid((m + 7) / 8, n / 16, p.splits);
    const uint8_t *w = (const uint8_t *)W->w;
    cudaError_t e;
    if (m <= 2)
        e = gemv_launch(ctx, grid, p.nw * 32, k_gemv_fp4<1, 4>, w, W->scale, xq, sa, m, n, k, p.per, y,
                        round, ws, ctx->counters);
    else if (m <= 4)
        e = gemv_launch(ctx, grid, p.nw * 32, k_gemv_fp4<2, 2>, w, W->scale, xq, sa, m, n, k, p.per, y,
                        round, ws, ctx->counters);
    else
        e = gemv_launch(ctx, grid, p.nw * 32, k_gemv_fp4<4, 1>, w, W->scale, xq, sa, m, n, k, p.per, y,
                        round, ws, ctx->counters);
    MK_CU_TRY(e, err, "cuda: fp4 gemv launch");
    if (ctx->trace_on) mk_cuda_trace_mark(ctx, "cuda: fp4 gemv launch");
    return MK_OK;
}

/* ---- grouped FP4 expert GEMV (MoE) ------------------------------------------------------------
 * The routed experts' FP4 weights are uploaded in lane order (mk_cuda_fp4_expert_layout: in each
 * row's 64-byte 128-block, the 4 x 4 matrix of 4-byte words [32-block q][word j] is transposed, so
 * the 16 bytes lane t loads are word t of each of the four 32-blocks), by default in slab tiles too
 * (tuning fp4_tiles: a slab's 16 rows one 1 KB run per 128-block, its scales one 64-byte run; the
 * kernels take the places from mk_d_fp4_w / mk_d_fp4_s). Then one m16n8k32 MMA sums
 * exactly one 32-block: lane (g, t) supplies its 8 elements of block q for rows g and g + 8 (A) and
 * the matching 8 activation bytes of token column g (B; in the quantizer's permuted layout they are
 * 8 contiguous bytes at 32 q + 8 t of the 128-block), so C holds 16 rows x 8 tokens of block q's
 * partial, which is scaled by its e8m0 weight scale and the token's activation block scale into
 * fp32 accumulators: acc = fmaf(c, sa * sw, acc) per (128-block, 32-block) in order. Every kernel
 * below runs exactly that per output (the k range split over the block's 8 warps, each warp's
 * blocks in order, the warps summed in warp order), so a slot's result does not depend on how many
 * slots its expert has in the call: decode (one slot per expert) and prefill / batches agree bit
 * for bit. Compared with a block-diagonal B (2 tokens per MMA), 8 tokens share each MMA, each
 * widening of the nibbles and each weight load. */

/* 32-block q (a compile-time constant once unrolled) of one 128-block: the lane's nibbles widened
 * and one MMA from zero into c. */
__device__ __forceinline__ void fp4l_mma_q(const uint4 &a0, const uint4 &a1, const uint2 (&x)[4], int q,
                                           float (&c)[4]) {
    const uint32_t w0 = q == 0 ? a0.x : q == 1 ? a0.y : q == 2 ? a0.z : a0.w;
    const uint32_t w1 = q == 0 ? a1.x : q == 1 ? a1.y : q == 2 ? a1.z : a1.w;
    uint32_t e0, o0, e1, o1;
    mk_d_fp4x8_to_e4m3(w0, e0, o0);
    mk_d_fp4x8_to_e4m3(w1, e1, o1);
    c[0] = c[1] = c[2] = c[3] = 0.0f;
    mk_d_mma_e4m3(c, e0, e1, o0, o1, x[q].x, x[q].y);
}

/* One 128-block: a0 / a1 the lane's 16 weight bytes of rows g / g + 8 (lane order), sw0 / sw1 their
 * four e8m0 scales (byte q: 32-block q), x[q] the 8 activation bytes of the lane's token column g
 * for block q, sa0 / sa1 the activation block scales of token columns 2t / 2t + 1. acc: rows g, g + 8
 * x columns 2t, 2t + 1 as the MMA's C fragment. */
__device__ __forceinline__ void fp4l_step(const uint4 &a0, const uint4 &a1, uint32_t sw0, uint32_t sw1,
                                          const uint2 (&x)[4], float sa0, float sa1, float (&acc)[4]) {
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float c[4];
        fp4l_mma_q(a0, a1, x, q, c);
        /* 64 undoes the 2^-6 of the widened nibbles; every factor is a power of two (exact) */
        const float s0 = 64.0f * mk_d_e8m0((sw0 >> (8 * q)) & 0xff), s1 = 64.0f * mk_d_e8m0((sw1 >> (8 * q)) & 0xff);
        acc[0] = fmaf(c[0], sa0 * s0, acc[0]);
        acc[1] = fmaf(c[1], sa1 * s0, acc[1]);
        acc[2] = fmaf(c[2], sa0 * s1, acc[2]);
        acc[3] = fmaf(c[3], sa1 * s1, acc[3]);
    }
}

/* fp4l_step with fewer instructions per 32-block (the expert GEMVs of decode and small batches are
 * issue-bound: ncu, bench/gpu/results-2026-12-04-wslab.md; tuning moe_fast_step): when no scale byte
 * of the warp's rows is >= 249, 64 * e8m0(e) is the float with exponent field e + 6 (2^(e - 121),
 * normal for e in [0, 248], e = 0 included), built by one shift-and-add instead of e8m0's special
 * cases and a multiply; with ONE (a chunk of one slot: a decode's), only column 0 of C is scaled and
 * accumulated (the only column stored; acc[1] and acc[3] are left alone). The same values, so the
 * same bits as fp4l_step; a warp with a scale byte >= 249 in any lane's rows (64 * 2^122 overflows,
 * 255 is NaN) takes fp4l_step. */
__device__ __forceinline__ bool fp4l_scales_plain(uint32_t sw) { /* no byte >= 249 */
    return (sw & ((sw & 0x7f7f7f7fu) + 0x07070707u) & 0x80808080u) == 0;
}
template <bool ONE>
__device__ __forceinline__ void fp4l_step_fast(const uint4 &a0, const uint4 &a1, uint32_t sw0, uint32_t sw1,
                                               const uint2 (&x)[4], float sa0, float sa1, float (&acc)[4]) {
    /* warp-uniform: mma.sync needs every lane of the warp at the same instruction */
    if (!__all_sync(0xffffffffu, fp4l_scales_plain(sw0) && fp4l_scales_plain(sw1))) {
        fp4l_step(a0, a1, sw0, sw1, x, sa0, sa1, acc);
        return;
    }
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float c[4];
        fp4l_mma_q(a0, a1, x, q, c);
        const float s0 = __uint_as_float((((sw0 >> (8 * q)) & 0xffu) << 23) + (6u << 23));
        const float s1 = __uint_as_float((((sw1 >> (8 * q)) & 0xffu) << 23) + (6u << 23));
        acc[0] = fmaf(c[0], sa0 * s0, acc[0]);
        acc[2] = fmaf(c[2], sa0 * s1, acc[2]);
        if (!ONE) {
            acc[1] = fmaf(c[1], sa1 * s0, acc[1]);
            acc[3] = fmaf(c[3], sa1 * s1, acc[3]);
        }
    }
}

/* In-place lane order of FP4 rows [n, k/2 bytes] (k % 128 == 0): a thread per 64-byte block. */
__device__ __forceinline__ void fp4_lane_store(uint4 *p, const uint4 (&v)[4]) { /* v[q]: 32-block q's words 0..3 */
    p[0] = make_uint4(v[0].x, v[1].x, v[2].x, v[3].x);
    p[1] = make_uint4(v[0].y, v[1].y, v[2].y, v[3].y);
    p[2] = make_uint4(v[0].z, v[1].z, v[2].z, v[3].z);
    p[3] = make_uint4(v[0].w, v[1].w, v[2].w, v[3].w);
}
__global__ void k_fp4_lane_order(uint32_t *__restrict__ w, size_t nblocks) {
    const size_t b = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (b >= nblocks) return;
    uint4 *p = (uint4 *)(w + b * 16);
    const uint4 v[4] = {p[0], p[1], p[2], p[3]};
    fp4_lane_store(p, v);
}

/* Slab tiles in place (tuning fp4_tiles): block = one slab of 16 rows, staged in shared memory (its
 * 16 k / 2 weight bytes and 16 k / 32 scale bytes), then written back in tile order: unit u = 16 kb + r
 * of the slab's range holds row r's 128-block kb, in lane order, and its 4 scale bytes. */
__global__ void __launch_bounds__(256) k_fp4_tiles(uint8_t *__restrict__ w, uint8_t *__restrict__ s, int k) {
    extern __shared__ __align__(16) uint8_t tl_smem[];
    const size_t rowb = (size_t)k >> 1, nsb = (size_t)k >> 5;
    const int nb = k >> 7;
    uint8_t *ws = w + (size_t)blockIdx.x * 16 * rowb, *ss = s + (size_t)blockIdx.x * 16 * nsb;
    uint8_t *wsm = tl_smem, *ssm = tl_smem + 16 * rowb;
    for (size_t i = threadIdx.x; i < rowb; i += blockDim.x) /* 16 rows x rowb bytes = rowb uint4 */
        ((uint4 *)wsm)[i] = ((const uint4 *)ws)[i];
    for (size_t i = threadIdx.x; i < 4 * nsb; i += blockDim.x) ((uint32_t *)ssm)[i] = ((const uint32_t *)ss)[i];
    __syncthreads();
    for (int u = threadIdx.x; u < 16 * nb; u += blockDim.x) {
        const int kb = u >> 4, r = u & 15;
        const uint4 *src = (const uint4 *)(wsm + (size_t)r * rowb + (size_t)kb * 64);
        const uint4 v[4] = {src[0], src[1], src[2], src[3]};
        fp4_lane_store((uint4 *)(ws + (size_t)u * 64), v);
        ((uint32_t *)ss)[u] = *(const uint32_t *)(ssm + (size_t)r * nsb + (size_t)kb * 4);
    }
}

extern "C" int mk_cuda_fp4_expert_layout(mk_cuda_ctx *ctx, mk_wmat *dev, mk_err *err) {
    if (dev->kind != MK_W_FP4 || dev->k % 128 || dev->n <= 0 || dev->n % 16)
        return mk_fail(err, MK_EINVAL,
                       "cuda: fp4 expert layout: needs FP4 weights with n %% 16 == 0 and k %% 128 == 0 (kind %d, n %d, k %d)",
                       (int)dev->kind, dev->n, dev->k);
    if (!ctx->tune.fp4_tiles) {
        const size_t nblocks = (size_t)dev->n * (size_t)(dev->k / 128);
        k_fp4_lane_order<<<(unsigned)((nblocks + 255) / 256), 256, 0, ctx->stream>>>((uint32_t *)dev->w, nblocks);
        MK_CU_LAUNCHED(err, "cuda: fp4 lane order launch");
        return MK_OK;
    }
    if (!dev->scale) return mk_fail(err, MK_EINVAL, "cuda: fp4 expert layout: the weights have no scales");
    const size_t smem = (size_t)16 * (dev->k / 2) + (size_t)16 * (dev->k / 32);
    if (smem > ctx->caps.smem_optin)
        return mk_fail(err, MK_ENOTSUP, "cuda: fp4 expert layout: k %d needs %zu bytes of shared memory a slab (at most %zu)",
                       dev->k, smem, (size_t)ctx->caps.smem_optin);
    /* the device's whole opt-in once (a model's matrices come in several k; mk_cuda_smem_optin asks once per bit) */
    if (smem > 48 * 1024) {
        const int st = mk_cuda_smem_optin(ctx, MK_OPTIN_FP4_TILES, (const void *)k_fp4_tiles, ctx->caps.smem_optin, err);
        if (st) return st;
    }
    k_fp4_tiles<<<(unsigned)(dev->n / 16), 256, smem, ctx->stream>>>((uint8_t *)dev->w, (uint8_t *)dev->scale, dev->k);
    MK_CU_LAUNCHED(err, "cuda: fp4 tiles launch");
    return MK_OK;
}

/* bf16 slab tiles (mk_cuda_bf16_tiles): 16-byte piece p of a run of whole slabs in rows (src: row
 * r = p / (k / 8), piece c = p % (k / 8) of it, i.e. 32-k step c / 4, quarter c % 4) to its tile place
 * in dst: ((r / 16) (k / 32) + c / 4) 1024 + (r % 16) 64 + (c % 4) 16 bytes. */
__global__ void k_bf16_tiles(const uint4 *__restrict__ src, uint4 *__restrict__ dst, size_t pieces, int k) {
    const size_t rp = (size_t)k / 8;
    for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < pieces; p += (size_t)gridDim.x * blockDim.x) {
        const size_t r = p / rp, c = p % rp;
        dst[(r >> 4) * (rp * 16) + (c >> 2) * 64 + (r & 15) * 4 + (c & 3)] = src[p];
    }
}

extern "C" int mk_cuda_bf16_tiled(const mk_cuda_ctx *ctx, const mk_wmat *W) {
    if (!W || W->kind != MK_W_BF16 || !W->w) return 0;
    for (int i = 0; i < ctx->n_tiled; i++)
        if (ctx->tiled[i] == W->w) return 1;
    return 0;
}

extern "C" void mk_cuda_bf16_tiles_forget(mk_cuda_ctx *ctx, const void *w) {
    for (int i = 0; i < ctx->n_tiled; i++)
        if (ctx->tiled[i] == w) {
            ctx->tiled[i] = ctx->tiled[--ctx->n_tiled];
            return;
        }
}

extern "C" int mk_cuda_bf16_tiles(mk_cuda_ctx *ctx, const mk_wmat *dev, mk_err *err) {
    if (dev->kind != MK_W_BF16 || !dev->w || dev->n <= 0 || dev->n % 16 || dev->k <= 0 || dev->k % 128)
        return mk_fail(err, MK_EINVAL,
                       "cuda: bf16 slab tiles: need bf16 weights with n %% 16 == 0 and k %% 128 == 0 (kind %d, n %d, k %d)",
                       (int)dev->kind, dev->n, dev->k);
    if (mk_cuda_bf16_tiled(ctx, dev)) return mk_fail(err, MK_EINVAL, "cuda: bf16 slab tiles: the matrix is in tiles already");
    if (ctx->n_tiled >= MK_CUDA_TILED_MAX)
        return mk_fail(err, MK_ENOTSUP, "cuda: bf16 slab tiles: at most %d matrices a context", MK_CUDA_TILED_MAX);
    const size_t slab = (size_t)32 * (size_t)dev->k, slabs = (size_t)dev->n / 16; /* bytes a slab (16 rows) */
    size_t per = ((size_t)64 << 20) / slab;
    if (per < 1) per = 1;
    if (per > slabs) per = slabs;
    void *tmp = NULL;
    cudaError_t e = cudaMalloc(&tmp, per * slab);
    if (e != cudaSuccess) return mk_cuda_fail(err, e, "cuda: bf16 slab tiles: staging buffer");
    uint8_t *w = (uint8_t *)dev->w;
    for (size_t s0 = 0; s0 < slabs && e == cudaSuccess; s0 += per) {
        const size_t cnt = slabs - s0 < per ? slabs - s0 : per;
        e = cudaMemcpyAsync(tmp, w + s0 * slab, cnt * slab, cudaMemcpyDeviceToDevice, ctx->stream);
        if (e == cudaSuccess) {
            k_bf16_tiles<<<1024, 256, 0, ctx->stream>>>((const uint4 *)tmp, (uint4 *)(w + s0 * slab), cnt * slab / 16, dev->k);
            e = cudaGetLastError();
        }
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(ctx->stream);
    cudaFree(tmp);
    if (e != cudaSuccess) return mk_cuda_fail(err, e, "cuda: bf16 slab tiles");
    ctx->tiled[ctx->n_tiled++] = dev->w;
    return MK_OK;
}

/* The token columns of the chunk of up to 8 slots from c0 (of the group's [c_lo, c_hi)): m, the row of
 * the lane's B column g (xr; 0 when g >= m) and of its C columns 2t / 2t + 1 (r0 / r1; -1 when
 * absent): the slot's token row (by_token) or the slot's own row. */
struct moe_cols {
    int m, xr, r0, r1;
};
__device__ __forceinline__ moe_cols moe_chunk_cols(const int32_t *__restrict__ stok, int by_token, int c0, int c_hi,
                                                   int g, int t) {
    moe_cols c;
    c.m = min(8, c_hi - c0);
    c.xr = g < c.m ? (by_token ? stok[c0 + g] : c0 + g) : 0;
    c.r0 = 2 * t < c.m ? (by_token ? stok[c0 + 2 * t] : c0 + 2 * t) : -1;
    c.r1 = 2 * t + 1 < c.m ? (by_token ? stok[c0 + 2 * t + 1] : c0 + 2 * t + 1) : -1;
    return c;
}

/* The end of an expert GEMV chunk: the warps' partial sums added in warp order, then the chunk's
 * m slot rows of the block's SL slabs stored. */
template <int SL>
__device__ __forceinline__ void moe_chunk_store(const float (&acc)[SL][4], float *red, float (*tile)[8 * 16], int m,
                                                int c0, int n, unsigned bx, float *__restrict__ y, int round) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nthr = blockDim.x;
    const int g = lane >> 2, t = lane & 3;
    float r[SL * 4];
#pragma unroll
    for (int q = 0; q < SL; q++)
#pragma unroll
        for (int i = 0; i < 4; i++) r[q * 4 + i] = acc[q][i];
    gemv_reduce<SL * 4>(r, red);
    if (warp == 0) {
#pragma unroll
        for (int q = 0; q < SL; q++) {
            const int c0c = 2 * t, c1c = 2 * t + 1;
            if (c0c < m) tile[q][c0c * 16 + g] = r[q * 4 + 0], tile[q][c0c * 16 + g + 8] = r[q * 4 + 2];
            if (c1c < m) tile[q][c1c * 16 + g] = r[q * 4 + 1], tile[q][c1c * 16 + g + 8] = r[q * 4 + 3];
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < SL * m * 16; i += nthr) {
        const int q = i / (m * 16), j = i - q * m * 16;
        y[(size_t)(c0 + (j >> 4)) * n + ((int)bx * SL + q) * 16 + (j & 15)] = gemv_out(tile[q][j], round);
    }
    __syncthreads();
}

/* Block (slab group, expert group, matrix): SL 16-row slabs of the group's expert for every slot of
 * the group, in chunks of up to 8 slots (token columns: the slot's token row, or the slot's own row).
 * With a second matrix (W3, y3: w3 next to w1) gridDim.z = 2. Launched with programmatic dependent
 * launch: the plan is read at once (it was written two kernels before), the block's weight rows are
 * prefetched into L2 (pf), then it waits for the previous kernel. y [slot, n] fp32 (round: bf16). */
template <int U, int SL>
__device__ __forceinline__ void moe_fp4_body(const uint3 bid, const void *const *__restrict__ Wt,
                                                         const uint8_t *const *__restrict__ St,
                                                         const void *const *__restrict__ Wt3,
                                                         const uint8_t *const *__restrict__ St3,
                                                         const uint8_t *__restrict__ xq,
                                                         const float *__restrict__ sa, int n, int k, int per,
                                                         const int32_t *__restrict__ plan, int TK, int E,
                                                         int by_token, float *__restrict__ y,
                                                         float *__restrict__ y3, int round, int fast, int tl,
                                                         bool pf = true) { /* pf: the L2 prefetch below */
    __shared__ float red[GEMV_MAXW * 32 * 4 * SL];
    __shared__ float tile[SL][8 * 16];
    if (bid.z) Wt = Wt3, St = St3, y = y3; /* the second matrix of a pair (w3 next to w1) */
    const int G = TK < E ? TK : E, grp = bid.y;
    /* the plan is two kernels old (written before the activations' quantization started) */
    if (grp >= plan[0]) {
        mk_d_pdl_wait();
        return;
    }
    const int32_t *gexp = plan + 1, *goff = gexp + G, *stok = goff + G + 1;
    const int ex = gexp[grp], c_lo = goff[grp], c_hi = goff[grp + 1];
    const uint8_t *W = (const uint8_t *)Wt[ex], *S = St[ex];
    if (pf) { /* this block's 16 SL weight rows (SL whole slabs either way) into L2 while the previous kernel finishes */
        const int lines = (int)(((size_t)k >> 1) / 128);
        for (int i = threadIdx.x; i < 16 * SL * lines; i += blockDim.x)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(W + (size_t)(bid.x * 16 * SL + i / lines) * (k >> 1) +
                                                          (size_t)(i % lines) * 128));
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nb = k >> 7;
    const int kb0 = warp * per, kb1 = min(nb, kb0 + per);
    const int wkb = MK_FP4_WKB(tl), skb = MK_FP4_SKB(tl); /* a 128-block's step in the layout */
    const uint8_t *w0[SL], *w1[SL], *s0p[SL], *s1p[SL];
#pragma unroll
    for (int q = 0; q < SL; q++) { /* slab q: rows n0 + 16 q .. */
        const int nq = (bid.x * SL + q) * 16;
        w0[q] = mk_d_fp4_w(W, nq + g, k, tl) + t * 16;
        w1[q] = mk_d_fp4_w(W, nq + g + 8, k, tl) + t * 16;
        s0p[q] = mk_d_fp4_s(S, nq + g, k, tl);
        s1p[q] = mk_d_fp4_s(S, nq + g + 8, k, tl);
    }
    mk_d_pdl_wait();
    for (int c0 = c_lo; c0 < c_hi; c0 += 8) {
        const moe_cols mc = moe_chunk_cols(stok, by_token, c0, c_hi, g, t);
        const int m = mc.m, r0 = mc.r0, r1 = mc.r1;
        const uint8_t *xp = xq + (size_t)mc.xr * k + 8 * t;
        float acc[SL][4];
#pragma unroll
        for (int q = 0; q < SL; q++) acc[q][0] = acc[q][1] = acc[q][2] = acc[q][3] = 0.0f;
        for (int kb = kb0; kb < kb1; kb += U) {
            uint4 a[SL][U][2];
            uint32_t sw[SL][U][2];
            uint2 x[U][4];
            float s0[U], s1[U];
#pragma unroll
            for (int u = 0; u < U; u++) {
                if (kb + u < kb1) {
#pragma unroll
                    for (int q = 0; q < SL; q++) {
                        a[q][u][0] = mk_d_ld_stream(w0[q] + (size_t)(kb + u) * wkb);
                        a[q][u][1] = mk_d_ld_stream(w1[q] + (size_t)(kb + u) * wkb);
                        sw[q][u][0] = *(const uint32_t *)(s0p[q] + skb * (kb + u));
                        sw[q][u][1] = *(const uint32_t *)(s1p[q] + skb * (kb + u));
                    }
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        x[u][j] = g < m ? *(const uint2 *)(xp + (size_t)(kb + u) * 128 + 32 * j) : make_uint2(0, 0);
                    s0[u] = r0 >= 0 ? sa[(size_t)r0 * nb + kb + u] : 0.0f;
                    s1[u] = r1 >= 0 ? sa[(size_t)r1 * nb + kb + u] : 0.0f;
                }
            }
            if (fast && m == 1) { /* a decode's slot: the one-column step (same bits; tuning moe_fast_step) */
#pragma unroll
                for (int u = 0; u < U; u++) {
                    if (kb + u < kb1) {
#pragma unroll
                        for (int q = 0; q < SL; q++)
                            fp4l_step_fast<true>(a[q][u][0], a[q][u][1], sw[q][u][0], sw[q][u][1], x[u], s0[u], 0.0f, acc[q]);
                    }
                }
            } else if (fast) {
#pragma unroll
                for (int u = 0; u < U; u++) {
                    if (kb + u < kb1) {
#pragma unroll
                        for (int q = 0; q < SL; q++)
                            fp4l_step_fast<false>(a[q][u][0], a[q][u][1], sw[q][u][0], sw[q][u][1], x[u], s0[u], s1[u], acc[q]);
                    }
                }
            } else {
#pragma unroll
                for (int u = 0; u < U; u++) {
                    if (kb + u < kb1) {
#pragma unroll
                        for (int q = 0; q < SL; q++) fp4l_step(a[q][u][0], a[q][u][1], sw[q][u][0], sw[q][u][1], x[u], s0[u], s1[u], acc[q]);
                    }
                }
            }
        }
        moe_chunk_store<SL>(acc, red, tile, m, c0, n, bid.x, y, round);
    }
}


template <int U, int SL, int MINB = 2>
__global__ void __launch_bounds__(256, MINB) k_moe_gemv_fp4(const void *const *__restrict__ Wt,
                                                         const uint8_t *const *__restrict__ St,
                                                         const void *const *__restrict__ Wt3,
                                                         const uint8_t *const *__restrict__ St3,
                                                         const uint8_t *__restrict__ xq,
                                                         const float *__restrict__ sa, int n, int k, int per,
                                                         const int32_t *__restrict__ plan, int TK, int E,
                                                         int by_token, float *__restrict__ y,
                                                         float *__restrict__ y3, int round, int fast, int tl, int pf) {
    mk_d_pdl_launch_dependents();
    moe_fp4_body<U, SL>(blockIdx, Wt, St, Wt3, St3, xq, sa, n, k, per, plan, TK, E, by_token, y, y3, round, fast, tl, pf);
}


/* The decode expert GEMV (k_moe_gemv_fp4<2, 2>, grid (mx, my, mz)) and an FP8 GEMV (one matrix or a
 * pair, k_gemv_fp8<4>, grid (1, fy, 1): at most 8 rows, no split) in one launch: blocks [0, mx my mz)
 * are the expert GEMV's, the rest the FP8 GEMV's slabs; every block runs its kernel's code, so each
 * output has that kernel's bits. The shared expert's GEMVs ride along with the routed experts'. */
template <int UM, int UF, int MINB>
__global__ void __launch_bounds__(256, MINB) k_moe_fp4_with_fp8(const void *const *__restrict__ Wt,
                                                         const uint8_t *const *__restrict__ St,
                                                         const void *const *__restrict__ Wt3,
                                                         const uint8_t *const *__restrict__ St3,
                                                         const uint8_t *__restrict__ xq,
                                                         const float *__restrict__ sa, int n, int k, int per,
                                                         const int32_t *__restrict__ plan, int TK, int E,
                                                         int by_token, float *__restrict__ y,
                                                         float *__restrict__ y3, int round, int fast, int tl, int mx, int my, int mz,
        const uint8_t *__restrict__ FW, const uint8_t *__restrict__ FS, const uint8_t *__restrict__ fxq,
        const float *__restrict__ fsa, int fm, int fn, int fk, int fper, float *__restrict__ fy,
        int fround, const uint8_t *__restrict__ FW2, const uint8_t *__restrict__ FS2, int fn2,
        float *__restrict__ fy2, int pf) {
    mk_d_pdl_launch_dependents();
    const int b = blockIdx.x, nm = mx * my * mz;
    const uint3 eb = make_uint3(b % mx, (b / mx) % my, b / (mx * my));
    if (b < nm)
        moe_fp4_body<UM, 2>(eb, Wt, St, Wt3, St3, xq, sa, n, k, per, plan, TK, E, by_token, y, y3, round, fast, tl, pf);
    else
        gemv_fp8_body<UF>(make_uint3(0, b - nm, 0), 1, FW, FS, fxq, fsa, fm, fn, fk, fper, fy, fround,
                         (float *)NULL, (unsigned *)NULL, FW2, FS2, fn2, fy2);
}

/* k_moe_gemv_fp4<., 1>'s arithmetic for groups of several chunks of slots (prefill, large batches):
 * the slab's weights (16 rows, lane order) are copied into shared memory once per block instead of
 * being loaded once per chunk of 8 slots, and each chunk's activation rows and block scales are
 * copied into shared memory by cp.async while the chunk before is computed (two buffers), with one
 * barrier per chunk: at chunk i's barrier its activations have landed and every warp is done with
 * chunk i - 1, whose warp partials (red2[(i - 1) & 1]) are then summed in warp order, as
 * gemv_reduce does. Bit for bit k_moe_gemv_fp4 (same sums in the same order).
 * Dynamic shared memory (staged_smem): the slab's 16 weight rows (k/2 + 64 bytes each), 2 x 8
 * activation rows (k + 32 bytes each; the pads spread the lanes' loads over the banks), 2 x 8 x
 * k/128 floats (~101 KB at k = 4096). */
__global__ void __launch_bounds__(256, 2) k_moe_fp4_staged(const void *const *__restrict__ Wt,
                                                           const uint8_t *const *__restrict__ St,
                                                           const void *const *__restrict__ Wt3,
                                                           const uint8_t *const *__restrict__ St3,
                                                           const uint8_t *__restrict__ xq,
                                                           const float *__restrict__ sa, int n, int k, int per,
                                                           const int32_t *__restrict__ plan, int TK, int E,
                                                           int by_token, float *__restrict__ y,
                                                           float *__restrict__ y3, int round, int tl) {
    extern __shared__ __align__(16) uint8_t moe_dsm[];
    __shared__ float red2[2][GEMV_MAXW][32][4]; /* [chunk parity][warp][lane][C fragment] */
    mk_d_pdl_launch_dependents();
    if (blockIdx.z) Wt = Wt3, St = St3, y = y3;
    const int G = TK < E ? TK : E, grp = blockIdx.y;
    if (grp >= plan[0]) { /* the plan is two kernels old, as for k_moe_gemv_fp4 */
        mk_d_pdl_wait();
        return;
    }
    const int32_t *gexp = plan + 1, *goff = gexp + G, *stok = goff + G + 1;
    const int ex = gexp[grp], c_lo = goff[grp], c_hi = goff[grp + 1];
    const uint8_t *W = (const uint8_t *)Wt[ex], *S = St[ex];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tid = threadIdx.x, nthr = blockDim.x;
    const int g = lane >> 2, t = lane & 3;
    const int nb = k >> 7;
    const int kb0 = warp * per, kb1 = min(nb, kb0 + per);
    const int n0 = blockIdx.x * 16;
    const int wkb = MK_FP4_WKB(tl), skb = MK_FP4_SKB(tl); /* a 128-block's step in the layout */
    const int rs = (k >> 1) + 64, xs_k = k + 32;       /* padded row strides in shared memory */
    uint8_t *wsm = moe_dsm;                            /* [16][rs] the slab's FP4 rows */
    uint8_t *xs = moe_dsm + (size_t)16 * rs;           /* [2][8][xs_k] activation bytes */
    float *ss = (float *)(xs + (size_t)16 * xs_k);     /* [2][8][nb] activation block scales */
    { /* the slab's weights into shared memory as rows (they do not depend on the previous kernel) */
        const int wp = k >> 5; /* 16-byte pieces per row */
        for (int i = tid; i < 16 * wp; i += nthr) {
            const int r = i / wp, c = i - r * wp;
            mk_d_cp_async16(wsm + (size_t)r * rs + (size_t)c * 16,
                            mk_d_fp4_w(W, n0 + r, k, tl) + (size_t)(c >> 2) * wkb + (size_t)(c & 3) * 16, 16);
        }
        mk_d_cp_async_commit();
    }
    const uint8_t *s0p = mk_d_fp4_s(S, n0 + g, k, tl), *s1p = mk_d_fp4_s(S, n0 + g + 8, k, tl);
    mk_d_pdl_wait();
    const int pieces = k >> 4; /* 16-byte pieces per activation row */
    auto stage = [&](int buf, int c0) { /* the chunk's row ids first (independent loads), then the copies */
        const int m = min(8, c_hi - c0);
        int rows[8];
#pragma unroll
        for (int r = 0; r < 8; r++) rows[r] = r < m ? (by_token ? stok[c0 + r] : c0 + r) : 0;
#pragma unroll
        for (int r = 0; r < 8; r++) {
            if (r >= m) break;
            for (int c = tid; c < pieces; c += nthr)
                mk_d_cp_async16(xs + ((size_t)buf * 8 + r) * xs_k + (size_t)c * 16, xq + (size_t)rows[r] * k + (size_t)c * 16,
                                16);
            for (int c = tid; c < nb; c += nthr)
                mk_d_cp_async4(ss + ((size_t)buf * 8 + r) * nb + c, sa + (size_t)rows[r] * nb + c, 4);
        }
    };
    stage(0, c_lo);
    mk_d_cp_async_commit();
    auto finish = [&](int pc0, int pbuf) { /* output (slot col, row): lane (g = row & 7, t = col / 2) */
        const int pm = min(8, c_hi - pc0);
        if (tid < pm * 16) {
            const int col = tid >> 4, row = tid & 15;
            const int li = (row & 7) * 4 + (col >> 1), ri = (row >> 3) * 2 + (col & 1);
            float v = red2[pbuf][0][li][ri];
            for (int w = 1; w < GEMV_MAXW; w++) v += red2[pbuf][w][li][ri];
            y[(size_t)(pc0 + col) * n + n0 + row] = gemv_out(v, round);
        }
    };
    int buf = 0;
    for (int c0 = c_lo; c0 < c_hi; c0 += 8, buf ^= 1) {
        mk_d_cp_async_wait<0>();
        __syncthreads();
        if (c0 + 8 < c_hi) stage(buf ^ 1, c0 + 8);
        mk_d_cp_async_commit();
        if (c0 > c_lo) finish(c0 - 8, buf ^ 1);
        const int m = min(8, c_hi - c0);
        const uint8_t *xp = xs + ((size_t)buf * 8 + (g < m ? g : 0)) * xs_k + 8 * t;
        const float *sp0 = 2 * t < m ? ss + ((size_t)buf * 8 + 2 * t) * nb : NULL;
        const float *sp1 = 2 * t + 1 < m ? ss + ((size_t)buf * 8 + 2 * t + 1) * nb : NULL;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 1
        for (int kb = kb0; kb < kb1; kb++) {
            const uint4 a0 = *(const uint4 *)(wsm + (size_t)g * rs + (size_t)kb * 64 + t * 16);
            const uint4 a1 = *(const uint4 *)(wsm + (size_t)(g + 8) * rs + (size_t)kb * 64 + t * 16);
            const uint32_t sw0 = *(const uint32_t *)(s0p + skb * kb), sw1 = *(const uint32_t *)(s1p + skb * kb);
            uint2 x[4];
#pragma unroll
            for (int j = 0; j < 4; j++) x[j] = g < m ? *(const uint2 *)(xp + (size_t)kb * 128 + 32 * j) : make_uint2(0, 0);
            fp4l_step(a0, a1, sw0, sw1, x, sp0 ? sp0[kb] : 0.0f, sp1 ? sp1[kb] : 0.0f, acc);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) red2[buf][warp][lane][i] = acc[i];
    }
    __syncthreads();
    finish(c_hi - 1 - (c_hi - 1 - c_lo) % 8, buf ^ 1);
}

/* The experts' row-invariant GEMM (prefill: many slots per expert). The same arithmetic per (slot,
 * output row) as k_moe_gemv_fp4 and k_moe_fp4_staged — fp4l_step's MMA per 32-block and fmaf per
 * block in k order within each of the 8 warp ranges (`per` 128-blocks), the ranges added in order —
 * arranged as k_gemm_fp8_ri: a block is 8 warps x 16 rows of one expert and the group's slots in
 * tiles of 8 J, the slots' activation 128-blocks staged in shared memory by cp.async (RI_ST ahead,
 * gathered by token row) and shared by the 8 warps; each warp streams its slab's weights once per
 * 8 J slots, widens the nibbles once for all J tiles, and walks all of k, its segments added in
 * order. In shared memory 16-byte chunk c of row r sits at chunk c ^ 2 (r & 3), so that the 8-byte
 * loads of a half warp (rows g..g+3, chunks 4 q + t) hit different banks. WD and pf: the weight
 * 128-blocks a warp has in flight and requests into L2 ahead, as in k_gemm_fp8_ri (the same bits
 * for every WD and pf). */
template <int J, int WD>
__global__ void __launch_bounds__(256, J == 8 ? 1 : 2) k_moe_fp4_ri(const void *const *__restrict__ Wt,
                                                                   const uint8_t *const *__restrict__ St,
                                                                   const void *const *__restrict__ Wt3,
                                                                   const uint8_t *const *__restrict__ St3,
                                                                   const uint8_t *__restrict__ xq,
                                                                   const float *__restrict__ sa, int n, int k, int per,
                                                                   const int32_t *__restrict__ plan, int TK, int E,
                                                                   int by_token, float *__restrict__ y,
                                                                   float *__restrict__ y3, int round, int tl, int pf) {
    __shared__ __align__(16) uint8_t xs[RI_ST][8 * J * 128];
    __shared__ float ss[RI_ST][8 * J];
    __shared__ int rows[8 * J];
    mk_d_pdl_launch_dependents();
    if (blockIdx.z) Wt = Wt3, St = St3, y = y3;
    const int G = TK < E ? TK : E, grp = blockIdx.y;
    if (grp >= plan[0]) { /* the plan is two kernels old, as for k_moe_gemv_fp4 */
        mk_d_pdl_wait();
        return;
    }
    const int32_t *gexp = plan + 1, *goff = gexp + G, *stok = goff + G + 1;
    const int ex = gexp[grp], c_lo = goff[grp], c_hi = goff[grp + 1];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nb = k >> 7;
    const int slab = (int)blockIdx.x * 8 + warp;
    const bool active = slab < (n >> 4);
    const int n0 = active ? slab * 16 : 0;
    const int wkb = MK_FP4_WKB(tl), skb = MK_FP4_SKB(tl); /* a 128-block's step in the layout */
    const uint8_t *Wx = (const uint8_t *)Wt[ex];
    const uint8_t *w0 = mk_d_fp4_w(Wx, n0 + g, k, tl) + t * 16, *w1 = mk_d_fp4_w(Wx, n0 + g + 8, k, tl) + t * 16;
    const uint8_t *s0p = mk_d_fp4_s(St[ex], n0 + g, k, tl), *s1p = mk_d_fp4_s(St[ex], n0 + g + 8, k, tl);
    mk_d_pdl_wait();
    for (int tb = c_lo; tb < c_hi; tb += 8 * J) {
        const int mt = min(8 * J, c_hi - tb);
        __syncthreads(); /* the previous tile's reads of rows / stages are done */
        if (tid < 8 * J) rows[tid] = tid < mt ? (by_token ? stok[tb + tid] : tb + tid) : 0;
        __syncthreads();
        auto stage = [&](int kb) {
            ri_stage_rows<J, 8>(xs[kb % RI_ST], mt, [](int r, int c) { return c ^ ((r & 3) << 1); },
                                [&](int r) { return xq + (size_t)rows[r] * k + (size_t)kb * 128; });
            if (tid < 8 * J)
                mk_d_cp_async4(&ss[kb % RI_ST][tid], sa + (size_t)rows[tid] * nb + kb, tid < mt ? 4 : 0);
        };
        ri_prologue<RI_ST>(stage, nb);
        uint4 a0, a1, an0[WD], an1[WD];
        uint32_t sw0, sw1, swn0[WD], swn1[WD];
#pragma unroll
        for (int u = 0; u < WD; u++) {
            an0[u] = an1[u] = make_uint4(0, 0, 0, 0), swn0[u] = swn1[u] = 0;
            if (active && u < nb) {
                an0[u] = mk_d_ld_stream(w0 + (size_t)u * wkb), an1[u] = mk_d_ld_stream(w1 + (size_t)u * wkb);
                swn0[u] = *(const uint32_t *)(s0p + skb * u), swn1[u] = *(const uint32_t *)(s1p + skb * u);
            }
        }
        float tot[4 * J], part[4 * J];
#pragma unroll
        for (int i = 0; i < 4 * J; i++) tot[i] = part[i] = 0.0f;
        for (int kb0 = 0; kb0 < nb; kb0 += WD) {
#pragma unroll
            for (int u = 0; u < WD; u++) {
                const int kb = kb0 + u;
                if (kb >= nb) break; /* the same for every thread */
                ri_advance<RI_ST>(stage, kb, nb);
                a0 = an0[u], a1 = an1[u], sw0 = swn0[u], sw1 = swn1[u];
                if (active && lane < 16 && kb + pf < nb) /* lane r: row n0 + r's 128-block kb + pf, into L2 */
                    mk_d_l2_prefetch(mk_d_fp4_w(Wx, n0 + lane, k, tl) + (size_t)(kb + pf) * wkb);
                if (active && kb + WD < nb) {
                    an0[u] = mk_d_ld_stream(w0 + (size_t)(kb + WD) * wkb);
                    an1[u] = mk_d_ld_stream(w1 + (size_t)(kb + WD) * wkb);
                    swn0[u] = *(const uint32_t *)(s0p + skb * (kb + WD));
                    swn1[u] = *(const uint32_t *)(s1p + skb * (kb + WD));
                }
                if (!active) continue;
                uint32_t e0[4], o0[4], e1[4], o1[4];
                float s0[4], s1[4];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    mk_d_fp4x8_to_e4m3(q == 0 ? a0.x : q == 1 ? a0.y : q == 2 ? a0.z : a0.w, e0[q], o0[q]);
                    mk_d_fp4x8_to_e4m3(q == 0 ? a1.x : q == 1 ? a1.y : q == 2 ? a1.z : a1.w, e1[q], o1[q]);
                    s0[q] = 64.0f * mk_d_e8m0((sw0 >> (8 * q)) & 0xff), s1[q] = 64.0f * mk_d_e8m0((sw1 >> (8 * q)) & 0xff);
                }
                const uint8_t *xst = xs[kb % RI_ST];
                const float *sst = ss[kb % RI_ST];
#pragma unroll
                for (int j = 0; j < J; j++) {
                    if (8 * j >= mt) break;
                    const uint8_t *xr = xst + (8 * j + g) * 128;
                    const float sa0 = sst[8 * j + 2 * t], sa1 = sst[8 * j + 2 * t + 1];
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        const uint2 x = *(const uint2 *)(xr + (((4 * q + t) ^ ((g & 3) << 2)) << 3));
                        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                        mk_d_mma_e4m3(c, e0[q], e1[q], o0[q], o1[q], x.x, x.y);
                        part[4 * j + 0] = fmaf(c[0], sa0 * s0[q], part[4 * j + 0]);
                        part[4 * j + 1] = fmaf(c[1], sa1 * s0[q], part[4 * j + 1]);
                        part[4 * j + 2] = fmaf(c[2], sa0 * s1[q], part[4 * j + 2]);
                        part[4 * j + 3] = fmaf(c[3], sa1 * s1[q], part[4 * j + 3]);
                    }
                }
                if ((kb + 1) % per == 0 || kb + 1 == nb) ri_fold(tot, part, kb < per); /* a GEMV warp's range ends */
            }
        }
        mk_d_cp_async_wait<0>();
        if (active) ri_store<J>(tot, y, n, n0, tb, mt, round);
    }
}

static size_t staged_smem(int k) { /* k_moe_fp4_staged's dynamic shared memory */
    return (size_t)16 * ((size_t)k / 2 + 64) + (size_t)16 * ((size_t)k + 32) + sizeof(float) * 16 * (size_t)(k / 128);
}

int mk_cuda_moe_gemv_fp4(mk_cuda_ctx *ctx, const void *const *W, const uint8_t *const *S, const void *const *W3,
                         const uint8_t *const *S3, int n, int k, const uint8_t *xq, const float *sa, int by_token,
                         const int32_t *plan, int T, int K, int E, float *y, float *y3, int round, mk_err *err) {
    if (T <= 0) return MK_OK;
    if (n % 16 || k % 128)
        return mk_fail(err, MK_ENOTSUP, "cuda: moe fp4 gemv: needs n %% 16 == 0 and k %% 128 == 0 (n %d, k %d)", n, k);
    int TK = T * K, G = TK < E ? TK : E, nw = GEMV_MAXW, nb = k / 128;
    int per = (nb + nw - 1) / nw;
    if ((W3 == NULL) != (y3 == NULL) || (W3 && !S3))
        return mk_fail(err, MK_EINVAL, "cuda: moe fp4 gemv: a second matrix needs its scales and output");
    dim3 grid((unsigned)(n / 16), (unsigned)G, W3 ? 2u : 1u);
    cudaError_t e;
    const int sl = ctx->tune.moe_slabs, fast = ctx->tune.moe_fast_step, tl = ctx->tune.fp4_tiles;
    if (T == 1 && sl == 2 && n % 32 == 0) { /* decode, two slabs per block (tuning) */
        /* the blocks an SM and the L2 prefetch of the decode kernel with the shared expert
         * (k_moe_fp4_with_fp8: tuning moe_occ / moe_pf); the same sums each way */
        grid.x = (unsigned)(n / 32);
        e = ctx->tune.moe_occ == 3
                ? gemv_launch(ctx, grid, nw * 32, k_moe_gemv_fp4<1, 2, 3>, W, S, W3, S3, xq, sa, n, k, per, plan, TK,
                              E, by_token, y, y3, round, fast, tl, ctx->tune.moe_pf)
                : gemv_launch(ctx, grid, nw * 32, k_moe_gemv_fp4<2, 2>, W, S, W3, S3, xq, sa, n, k, per, plan, TK, E,
                              by_token, y, y3, round, fast, tl, ctx->tune.moe_pf);
    } else if (T > 1 && ctx->tune.moe_ri && ctx->tune.gemv_tiles >= 4 && TK >= ctx->tune.moe_ri * G) {
        /* many slots per expert (prefill): the row-invariant GEMM */
        grid.x = (unsigned)((n / 16 + 7) / 8);
        /* a deeper weight ring only at 8 tiles (as for the FP8 GEMM) */
        const int pf = ctx->tune.ri_l2_pf;
        e = ctx->tune.gemv_tiles < 8
                ? gemv_launch(ctx, grid, 256, k_moe_fp4_ri<4, 1>, W, S, W3, S3, xq, sa, n, k, per, plan, TK, E,
                              by_token, y, y3, round, tl, pf)
            : ctx->tune.ri_wdepth == 2
                ? gemv_launch(ctx, grid, 256, k_moe_fp4_ri<8, 2>, W, S, W3, S3, xq, sa, n, k, per, plan, TK, E,
                              by_token, y, y3, round, tl, pf)
                : gemv_launch(ctx, grid, 256, k_moe_fp4_ri<8, 1>, W, S, W3, S3, xq, sa, n, k, per, plan, TK, E,
                              by_token, y, y3, round, tl, pf);
    } else if (T > 1 && ctx->tune.moe_staged && staged_smem(k) <= ctx->caps.smem_optin) { /* several slots per expert */
        int st = mk_cuda_smem_optin(ctx, MK_OPTIN_MOE_STAGED, (const void *)k_moe_fp4_staged, staged_smem(k), err);
        if (st) return st;
        e = mk_cuda_launch_pdl(ctx, grid, dim3(nw * 32), staged_smem(k), k_moe_fp4_staged, W, S, W3, S3, xq, sa, n, k,
                               per, plan, TK, E, by_token, y, y3, round, tl);
    } else { /* tuning moe_b_occ / moe_b_pf / moe_b_sl: 3 blocks an SM, no L2 prefetch, two slabs a block by
              * default (H100 batch 64: 7.87 ms a step against 10.00; results-2026-12-06-topk.md); the same
              * sums each way */
        void (*kern)(const void *const *, const uint8_t *const *, const void *const *, const uint8_t *const *,
                     const uint8_t *, const float *, int, int, int, const int32_t *, int, int, int, float *, float *,
                     int, int, int, int) = k_moe_gemv_fp4<4, 1>;
        if (ctx->tune.moe_b_sl == 2 && n % 32 == 0) {
            grid.x = (unsigned)(n / 32);
            kern = ctx->tune.moe_b_occ == 3 ? k_moe_gemv_fp4<1, 2, 3> : k_moe_gemv_fp4<2, 2>;
        } else if (ctx->tune.moe_b_occ == 3) {
            kern = k_moe_gemv_fp4<2, 1, 3>;
        }
        e = gemv_launch(ctx, grid, nw * 32, kern, W, S, W3, S3, xq, sa, n, k, per, plan, TK, E, by_token, y, y3, round,
                        fast, tl, ctx->tune.moe_b_pf);
    }
    MK_CU_TRY(e, err, "cuda: moe fp4 gemv launch");
    if (ctx->trace_on) mk_cuda_trace_mark(ctx, "cuda: moe fp4 gemv launch");
    return MK_OK;
}

int mk_cuda_moe_gemv_fp4_with(mk_cuda_ctx *ctx, const void *const *W, const uint8_t *const *S, const void *const *W3,
                              const uint8_t *const *S3, int n, int k, const uint8_t *xq, const float *sa, int by_token,
                              const int32_t *plan, int T, int K, int E, float *y, float *y3, int round,
                              const mk_cuda_fp8_job *f, mk_err *err) {
    int one = f && ctx->tune.moe_with_fp8 && T == 1 && ctx->tune.moe_slabs == 2 && n % 32 == 0 &&
              n % 16 == 0 && k % 128 == 0 &&
              f->m >= 1 && f->m <= 8 && f->W->kind == MK_W_FP8 && f->W->n % 16 == 0 && f->W->k % 128 == 0 &&
              (!f->W2 || mk_cuda_gemv_fp8_pair_ok(ctx, f->W, f->W2));
    if (one) {
        const gemv_plan p = plan_for(ctx, f->W->n / 16, f->W->k / 128);
        one = p.splits == 1 && p.nw == GEMV_MAXW;
    }
    if (!one) return mk_fail(err, MK_ENOTSUP, "cuda: moe fp4 gemv: the fp8 gemv cannot share its launch");
    const int TK = T * K, G = TK < E ? TK : E, my = G, mz = W3 ? 2 : 1;
    const int mx = n / 32;
    if ((W3 == NULL) != (y3 == NULL) || (W3 && !S3))
        return mk_fail(err, MK_EINVAL, "cuda: moe fp4 gemv: a second matrix needs its scales and output");
    const int n2 = f->W2 ? f->W2->n : 0, fslabs = (f->W->n + n2) / 16;
    const gemv_plan p = plan_for(ctx, f->W->n / 16, f->W->k / 128);
    const int per = (k / 128 + GEMV_MAXW - 1) / GEMV_MAXW;
    /* 3 blocks an SM (tuning moe_occ; U 1 and 80 registers) and no L2 prefetch before the PDL wait
     * (moe_pf): H100, experts 192.7 us a greedy step in the graph against 264.9 at 2 blocks with the
     * prefetch (bench/gpu/results-2026-12-06-topk.md); the same blocks and sums: the same bits */
    void (*kern)(const void *const *, const uint8_t *const *, const void *const *, const uint8_t *const *,
                 const uint8_t *, const float *, int, int, int, const int32_t *, int, int, int, float *, float *, int,
                 int, int, int, int, int, const uint8_t *, const uint8_t *, const uint8_t *, const float *, int, int, int,
                 int, float *, int, const uint8_t *, const uint8_t *, int, float *, int) =
        ctx->tune.moe_occ == 3 ? k_moe_fp4_with_fp8<1, 2, 3> : k_moe_fp4_with_fp8<2, 4, 2>;
    cudaError_t e = gemv_launch(ctx, dim3((unsigned)(mx * my * mz + fslabs)), GEMV_MAXW * 32,
                                kern, W, S,
                                W3, S3, xq, sa, n, k, per, plan, TK, E, by_token, y, y3, round, ctx->tune.moe_fast_step,
                                ctx->tune.fp4_tiles, mx, my, mz,
                                (const uint8_t *)f->W->w, f->W->scale, f->xq, f->sa, f->m, f->W->n, f->W->k, p.per, f->y,
                                f->round, f->W2 ? (const uint8_t *)f->W2->w : (const uint8_t *)NULL,
                                f->W2 ? f->W2->scale : (const uint8_t *)NULL, n2, f->y2, ctx->tune.moe_pf);
    MK_CU_TRY(e, err, "cuda: moe fp4 gemv (with fp8) launch");
    if (ctx->trace_on) mk_cuda_trace_mark(ctx, "cuda: moe fp4 gemv (with fp8) launch");
    return MK_OK;
}

/* ---- BF16 --------------------------------------------------------------------------------- */

/* W bf16 [n, k], xb bf16 [m, k]; a step is 32 k (16 bytes per lane and row). The launch covers the
 * matrices of M over the same xb: slabs [M.s0[j], M.s0[j + 1]) of the grid are matrix j's, each
 * computed exactly as a launch of it alone with the same plan (the callers check the plans agree;
 * split-K only with one matrix). */
struct bf16_set {
    const uint16_t *W[MK_CUDA_MULTI];
    float *y[MK_CUDA_MULTI];
    int n[MK_CUDA_MULTI], round[MK_CUDA_MULTI], s0[MK_CUDA_MULTI + 1], count;
};

template <int U>
__global__ void __launch_bounds__(256, 2) k_gemv_bf16(const bf16_set M, const uint16_t *__restrict__ xb, int m, int k,
                                                      int per, float *__restrict__ ws,
                                                      unsigned *__restrict__ counters) {
    __shared__ float red[GEMV_MAXW * 32 * 4];
    __shared__ float tile[8 * 16];
    mk_d_pdl_launch_dependents();
    int j = 0;
    while (j + 1 < M.count && (int)blockIdx.y >= M.s0[j + 1]) j++;
    const uint16_t *__restrict__ W = M.W[j];
    float *__restrict__ y = M.y[j];
    const int n = M.n[j], round = M.round[j];
    { /* chunk blockIdx.x: activation rows 8 c .. 8 c + 7 (a launch over m > 8 rows) */
        const int c8 = (int)blockIdx.x * 8;
        xb += (size_t)c8 * k;
        y += (size_t)c8 * n;
        m = min(8, m - c8);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = ((int)blockIdx.y - M.s0[j]) * 16;
    const int ns = k >> 5;
    const int s0 = (blockIdx.z * nw + warp) * per, s1 = min(ns, s0 + per);
    const uint8_t *w0 = (const uint8_t *)(W + (size_t)(n0 + g) * k) + t * 16;
    const uint8_t *w1 = w0 + (size_t)16 * k; /* 8 rows of 2k bytes */
    const bool xcol = g < m;
    const uint8_t *xr = (const uint8_t *)(xb + (size_t)(xcol ? g : 0) * k) + t * 16;
    const int c0 = 2 * t, c1 = 2 * t + 1;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int st = s0; st < s1; st += U) {
        uint4 a[U][2], b[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (st + u < s1) {
                size_t off = (size_t)(st + u) * 64;
                a[u][0] = mk_d_ld_stream(w0 + off);
                a[u][1] = mk_d_ld_stream(w1 + off);
            }
        }
        mk_d_pdl_wait();
#pragma unroll
        for (int u = 0; u < U; u++)
            if (st + u < s1) b[u] = xcol ? mk_d_ld16(xr + (size_t)(st + u) * 64) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (st + u < s1) {
                mk_d_mma_bf16(c, a[u][0].x, a[u][1].x, a[u][0].y, a[u][1].y, b[u].x, b[u].y);
                mk_d_mma_bf16(c, a[u][0].z, a[u][1].z, a[u][0].w, a[u][1].w, b[u].z, b[u].w);
            }
        }
    }
    mk_d_pdl_wait(); /* warps without work, before any write */
    gemv_reduce<4>(c, red);
    if (warp == 0) {
        if (c0 < m) tile[c0 * 16 + g] = c[0], tile[c0 * 16 + g + 8] = c[2];
        if (c1 < m) tile[c1 * 16 + g] = c[1], tile[c1 * 16 + g + 8] = c[3];
    }
    __syncthreads();
    gemv_finish(tile, m, n, n0, y, round, ws, counters);
}

/* The end of k_gemv_bf16_wpipe's fused argmax: the lanes' best candidates of rows c0 = 2t / c1 = 2t + 1
 * (mk_d_am_take's rule, a total order: any visiting order gives the same winner) taken over the lanes of
 * each t, then over the block's warps into am_v / am_i [row][block]; the last block to arrive (am_n)
 * takes the blocks' winners of each row into am[row] (-1: none) and sets am_n back to zero. */
__device__ __forceinline__ void bf16_argmax_end(int m, float bv0, int bi0, float bv1, int bi1, int32_t *__restrict__ am,
                                                float *__restrict__ am_v, int *__restrict__ am_i,
                                                unsigned *__restrict__ am_n) {
    __shared__ float sv[GEMV_MAXW][MK_CUDA_AM_ROWS];
    __shared__ int si[GEMV_MAXW][MK_CUDA_AM_ROWS];
    __shared__ bool last;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5, t = lane & 3;
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) { /* over g: lanes t, t + 4, ... */
        mk_d_am_better(__shfl_xor_sync(0xffffffffu, bv0, o), __shfl_xor_sync(0xffffffffu, bi0, o), bv0, bi0);
        mk_d_am_better(__shfl_xor_sync(0xffffffffu, bv1, o), __shfl_xor_sync(0xffffffffu, bi1, o), bv1, bi1);
    }
    if (lane < 4) sv[warp][2 * t] = bv0, si[warp][2 * t] = bi0, sv[warp][2 * t + 1] = bv1, si[warp][2 * t + 1] = bi1;
    __syncthreads();
    const int nb = (int)gridDim.x, b = (int)blockIdx.x;
    if (threadIdx.x < m) { /* the block's winner of row r */
        const int r = threadIdx.x;
        float v = sv[0][r];
        int id = si[0][r];
        for (int w = 1; w < nw; w++) mk_d_am_better(sv[w][r], si[w][r], v, id);
        am_v[(size_t)r * nb + b] = v, am_i[(size_t)r * nb + b] = id;
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(am_n, 1u) == (unsigned)nb - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int r = warp; r < m; r += nw) { /* warp r: row r over the blocks' winners */
        float v = -INFINITY;
        int id = INT_MAX;
        for (int q = lane; q < nb; q += 32) mk_d_am_better(__ldcg(am_v + (size_t)r * nb + q), __ldcg(am_i + (size_t)r * nb + q), v, id);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            mk_d_am_better(__shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, id, o), v, id);
        if (lane == 0) am[r] = id == INT_MAX ? -1 : id;
    }
    if (threadIdx.x == 0) *am_n = 0u;
}

/* k_gemv_bf16 for plans of one warp per slab (the head: nw 1, the whole k in one MMA chain), with the
 * warps independent and pipelined (tuning bf16_pipe): a grid of one wave of warps, warp w serving
 * slabs w, w + W, ... (W warps in all); each walks its slabs' k in items of BP_U 32-k steps and keeps
 * two items of weights in flight, loading item i + 2 as soon as item i is computed, across slab
 * boundaries, so its loads never stop for a slab's end, a barrier or a block's exit. A slab's MMA
 * chain is k_gemv_bf16's (steps in order from zero; U only groups the loads) and its C fragment is
 * stored from the lanes' registers (gemv_out): the same bits. At most 8 activation rows (one chunk).
 * tl: W in slab tiles (mk_cuda_bf16_tiles); am (mk_cuda_gemv_bf16_am): each row's argmax as well, from the
 * values stored (bf16_argmax_end). H100 (session 26): the head adds 351.8 us to a greedy step in the graph
 * (~3.0 TB/s) against 358.9 with k_gemv_bf16's 8080 one-warp blocks. */
#define BP_U 4
struct bf16_item {
    uint4 a[BP_U][2]; /* [step][row half] */
};
__global__ void __launch_bounds__(256, 2) k_gemv_bf16_wpipe(const uint16_t *__restrict__ W, const uint16_t *__restrict__ xb,
                                                           int m, int n, int k, float *__restrict__ y, int round,
                                                           int nwarps, int tl, int32_t *__restrict__ am,
                                                           float *__restrict__ am_v, int *__restrict__ am_i,
                                                           unsigned *__restrict__ am_n) {
    mk_d_pdl_launch_dependents();
    const int lane = threadIdx.x & 31, gw = (int)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int g = lane >> 2, t = lane & 3;
    const int ns = k >> 5, ng = (ns + BP_U - 1) / BP_U, slabs = n >> 4;
    const int nsl = gw < slabs ? (slabs - gw + nwarps - 1) / nwarps : 0;
    const int total = nsl * ng;
    const bool xcol = g < m;
    const uint8_t *xr = (const uint8_t *)(xb + (size_t)(xcol ? g : 0) * k) + t * 16;
    const int c0 = 2 * t, c1 = 2 * t + 1;
    auto load = [&](bf16_item &it, int i) {
        const int slab = gw + (i / ng) * nwarps, st0 = (i % ng) * BP_U;
        const uint8_t *w0 = mk_d_bf16_row(W, slab * 16 + g, k, tl) + t * 16;
        const uint8_t *w1 = mk_d_bf16_row(W, slab * 16 + g + 8, k, tl) + t * 16;
        const int wst = MK_BF16_WST(tl);
#pragma unroll
        for (int u = 0; u < BP_U; u++) {
            if (st0 + u < ns) {
                it.a[u][0] = mk_d_ld_stream(w0 + (size_t)(st0 + u) * wst);
                it.a[u][1] = mk_d_ld_stream(w1 + (size_t)(st0 + u) * wst);
            }
        }
    };
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float bv0 = -INFINITY, bv1 = -INFINITY; /* with am: the lane's best of rows c0 / c1 so far */
    int bi0 = INT_MAX, bi1 = INT_MAX;
    auto comp = [&](const bf16_item &it, int i) {
        const int st0 = (i % ng) * BP_U;
        uint4 b[BP_U];
#pragma unroll
        for (int u = 0; u < BP_U; u++)
            if (st0 + u < ns) b[u] = xcol ? mk_d_ld16(xr + (size_t)(st0 + u) * 64) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < BP_U; u++) {
            if (st0 + u < ns) {
                mk_d_mma_bf16(c, it.a[u][0].x, it.a[u][1].x, it.a[u][0].y, it.a[u][1].y, b[u].x, b[u].y);
                mk_d_mma_bf16(c, it.a[u][0].z, it.a[u][1].z, it.a[u][0].w, it.a[u][1].w, b[u].z, b[u].w);
            }
        }
        if (i % ng == ng - 1) { /* the slab's last item: its outputs, then the next slab from zero */
            const int n0 = (gw + (i / ng) * nwarps) * 16;
            const float o0 = gemv_out(c[0], round), o1 = gemv_out(c[1], round), o2 = gemv_out(c[2], round),
                        o3 = gemv_out(c[3], round);
            if (c0 < m) y[(size_t)c0 * n + n0 + g] = o0, y[(size_t)c0 * n + n0 + g + 8] = o2;
            if (c1 < m) y[(size_t)c1 * n + n0 + g] = o1, y[(size_t)c1 * n + n0 + g + 8] = o3;
            if (am) { /* the stored values as argmax candidates (rows c0, c1; ids in order within the lane) */
                mk_d_am_take(o0, n0 + g, bv0, bi0), mk_d_am_take(o2, n0 + g + 8, bv0, bi0);
                mk_d_am_take(o1, n0 + g, bv1, bi1), mk_d_am_take(o3, n0 + g + 8, bv1, bi1);
            }
            c[0] = c[1] = c[2] = c[3] = 0.0f;
        }
    };
    gemv_pipe2<bf16_item>(total, load, comp);
    if (am) bf16_argmax_end(m, bv0, bi0, bv1, bi1, am, am_v, am_i, am_n);
}

/* k_gemv_bf16's bits for many rows of one matrix (the head over a batch's rows, prefill), arranged
 * as k_gemm_fp8_ri: 8 warps x 16 rows and 8 J activation rows per block, the bf16 activations
 * staged in shared memory 128 k (256 bytes a row) at a time by cp.async (ST stages), each warp
 * walking all of k in 32-k steps with the GEMV's warp ranges (plan_for's `per` steps) as segments:
 * each segment's MMA chain from zero, the segments added in order. In shared memory 16-byte chunk c of row r sits
 * at chunk c ^ 4 (r & 1) (a quarter warp: rows g, g + 1, chunks 4 s + t: 8 bank groups). */
template <int J, int ST = 3>
__global__ void __launch_bounds__(256, 1)
    k_gemm_bf16_ri(const uint16_t *__restrict__ W, const uint16_t *__restrict__ xb, int m, int n, int k, int per,
                   float *__restrict__ y, int round, int tl) {
    __shared__ __align__(16) uint8_t xs[ST][8 * J * 256]; /* 3 stages of 64 rows: 48 KiB */
    mk_d_pdl_launch_dependents();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nu = k >> 7, ns = k >> 5; /* 128-k stages, 32-k steps */
    const int slab = (int)blockIdx.y * 8 + warp;
    const bool active = slab < (n >> 4);
    const int n0 = active ? slab * 16 : 0;
    const int r0 = (int)blockIdx.x * 8 * J, mt = min(8 * J, m - r0);
    const uint8_t *w0 = mk_d_bf16_row(W, n0 + g, k, tl) + t * 16, *w1 = mk_d_bf16_row(W, n0 + g + 8, k, tl) + t * 16;
    const int wst = MK_BF16_WST(tl); /* a 32-k step's bytes in the layout */
    auto stage = [&](int u) {
        ri_stage_rows<J, 16>(xs[u % ST], mt, [](int r, int c) { return c ^ ((r & 1) << 2); },
                             [&](int r) { return (const uint8_t *)(xb + (size_t)(r0 + r) * k + (size_t)u * 128); });
    };
    uint4 an[4][2];
    if (active) ri_load_w(an, w0, w1, 0, wst);
    mk_d_pdl_wait();
    ri_prologue<ST>(stage, nu);
    float tot[4 * J], part[4 * J];
#pragma unroll
    for (int i = 0; i < 4 * J; i++) tot[i] = part[i] = 0.0f;
    for (int u = 0; u < nu; u++) {
        ri_advance<ST>(stage, u, nu);
        uint4 a[4][2];
#pragma unroll
        for (int s = 0; s < 4; s++) a[s][0] = an[s][0], a[s][1] = an[s][1];
        if (active && u + 1 < nu) ri_load_w(an, w0, w1, (size_t)(u + 1) * 4 * wst, wst);
        if (!active) continue;
        const uint8_t *xst = xs[u % ST];
#pragma unroll
        for (int s = 0; s < 4; s++) { /* step 4 u + s */
#pragma unroll
            for (int j = 0; j < J; j++) {
                if (8 * j >= mt) break;
                const uint4 b = *(const uint4 *)(xst + (8 * j + g) * 256 + (((4 * s + t) ^ ((g & 1) << 2)) << 4));
                float cc[4] = {part[4 * j], part[4 * j + 1], part[4 * j + 2], part[4 * j + 3]};
                mk_d_mma_bf16(cc, a[s][0].x, a[s][1].x, a[s][0].y, a[s][1].y, b.x, b.y);
                mk_d_mma_bf16(cc, a[s][0].z, a[s][1].z, a[s][0].w, a[s][1].w, b.z, b.w);
                part[4 * j] = cc[0], part[4 * j + 1] = cc[1], part[4 * j + 2] = cc[2], part[4 * j + 3] = cc[3];
            }
            const int st = 4 * u + s;
            if ((st + 1) % per == 0 || st + 1 == ns) ri_fold(tot, part, st < per); /* a GEMV warp's range ends */
        }
    }
    mk_d_cp_async_wait<0>();
    if (active) ri_store<J>(tot, y, n, n0, r0, mt, round);
}

/* k_gemv_bf16_wpipe over W (tl: in slab tiles; am: with the rows' argmax, mk_cuda_gemv_bf16_am) and
 * k_gemm_bf16_ri<8> (per: the GEMV plan's steps a warp range), as mk_cuda_gemv_bf16 launches them. */
static int bf16_wpipe_launch(mk_cuda_ctx *ctx, const mk_wmat *W, const uint16_t *xb, int m, float *y, int round, int tl,
                             int32_t *am, mk_err *err) {
    const int slabs = W->n / 16, wave = (ctx->caps.sm_count > 0 ? ctx->caps.sm_count : 1) * 16;
    const int nwarps = slabs < wave ? slabs : wave;
    MK_CU_TRY(gemv_launch(ctx, dim3((unsigned)((nwarps + 7) / 8)), 256, k_gemv_bf16_wpipe, (const uint16_t *)W->w, xb, m,
                          W->n, W->k, y, round, nwarps, tl, am, am ? ctx->am_v : (float *)NULL,
                          am ? ctx->am_i : (int *)NULL, am ? ctx->am_n : (unsigned *)NULL),
              err, "cuda: bf16 gemv (warps pipelined) launch");
    if (ctx->trace_on) mk_cuda_trace_mark(ctx, "cuda: bf16 gemv (warps pipelined) launch");
    return MK_OK;
}

static int bf16_ri_launch(mk_cuda_ctx *ctx, const mk_wmat *W, const uint16_t *xb, int m, float *y, int round, int per,
                          int tl, mk_err *err) {
    dim3 grid((m + 63) / 64, (W->n / 16 + 7) / 8, 1);
    MK_CU_TRY(gemv_launch(ctx, grid, 256, k_gemm_bf16_ri<8>, (const uint16_t *)W->w, xb, m, W->n, W->k, per, y, round, tl),
              err, "cuda: bf16 row-invariant gemm launch");
    if (ctx->trace_on) mk_cuda_trace_mark(ctx, "cuda: bf16 row-invariant gemm launch");
    return MK_OK;
}

/* Whether mk_cuda_gemv_bf16 runs W at m rows on k_gemv_bf16_wpipe: in slab tiles up to 8 rows, in rows
 * (tuning bf16_pipe) where the plan gives a slab one warp and no split, and the row-invariant GEMM does
 * not take the launch. */
static int bf16_takes_wpipe(const mk_cuda_ctx *ctx, const mk_wmat *W, int m) {
    if (m < 1 || m > 8) return 0;
    if (mk_cuda_bf16_tiled(ctx, W)) return 1;
    const gemv_plan p = plan_for(ctx, W->n / 16, W->k / 32);
    return ctx->tune.bf16_pipe && p.nw == 1 && p.splits == 1 && !(W->k % 128 == 0 && ri_tiles_for(ctx, m, W->n / 16) > 1);
}

int mk_cuda_gemv_bf16(mk_cuda_ctx *ctx, const mk_wmat *W, const uint16_t *xb, int m, float *y,
                      int round, float *ws, mk_err *err) {
    int n = W->n, k = W->k;
    if (m < 1 || n % 16 || n / 16 > 65535 || k % 32)
        return mk_fail(err, MK_ENOTSUP, "cuda: bf16 gemv: needs m >= 1, n %% 16 == 0 (n <= 1048560), k %% 32 == 0 "
                       "(m %d, n %d, k %d)", m, n, k);
    const int tl = mk_cuda_bf16_tiled(ctx, W);
    if (bf16_takes_wpipe(ctx, W, m)) /* the head: warps pipelined, same bits */
        return bf16_wpipe_launch(ctx, W, xb, m, y, round, tl, NULL, err);
    if (tl) /* slab tiles beyond 8 rows: one MMA chain over the whole k per slab (the head's plan) */
        return bf16_ri_launch(ctx, W, xb, m, y, round, k / 32, 1, err);
    gemv_plan p = plan_for(ctx, n / 16, k / 32);
    if (p.splits > 1 && !ws) return mk_fail(err, MK_EINVAL, "cuda: bf16 gemv: split-K needs a workspace");
    if (p.splits > 1 && m > 8)
        return mk_fail(err, MK_EINVAL, "cuda: bf16 gemv: split-K takes at most 8 rows per launch (m %d)", m);
    if (p.splits == 1 && k % 128 == 0 && ri_tiles_for(ctx, m, n / 16) > 1) /* the row-invariant GEMM: the same bits */
        return bf16_ri_launch(ctx, W, xb, m, y, round, p.per, 0, err);
    dim3 grid((m + 7) / 8, n / 16, p.splits);
    bf16_set M = {};
    M.W[0] = (const uint16_t *)W->w, M.y[0] = y, M.n[0] = n, M.round[0] = round, M.s0[1] = n / 16, M.count = 1;
    MK_CU_TRY(gemv_launch(ctx, grid, p.nw * 32, k_gemv_bf16<8>, M, xb, m, k, p.per, ws, ctx->counters), err,
              "cuda: bf16 gemv launch");
    if (ctx->trace_on) mk_cuda_trace_mark(ctx, "cuda: bf16 gemv launch");
    return MK_OK;
}

extern "C" int mk_cuda_gemv_bf16_am_ok(const mk_cuda_ctx *ctx, const mk_wmat *W, int m) {
    return W->kind == MK_W_BF16 && m <= MK_CUDA_AM_ROWS && W->n % 16 == 0 && W->k % 32 == 0 && ctx->am_n &&
           bf16_takes_wpipe(ctx, W, m);
}

int mk_cuda_gemv_bf16_am(mk_cuda_ctx *ctx, const mk_wmat *W, const uint16_t *xb, int m, float *y, int round,
                         int32_t *am, mk_err *err) {
    if (!mk_cuda_gemv_bf16_am_ok(ctx, W, m))
        return mk_fail(err, MK_ENOTSUP, "cuda: bf16 gemv with argmax: needs the warp-pipelined GEMV's plan and at most %d "
                       "rows (m %d, n %d, k %d)", MK_CUDA_AM_ROWS, m, W->n, W->k);
    return bf16_wpipe_launch(ctx, W, xb, m, y, round, mk_cuda_bf16_tiled(ctx, W), am, err);
}

int mk_cuda_gemv_bf16_multi_ok(const mk_cuda_ctx *ctx, int count, const mk_wmat *const *W) {
    if (count < 1 || count > MK_CUDA_MULTI) return 0;
    int slabs = 0;
    gemv_plan p0 = {0, 0, 0};
    for (int i = 0; i < count; i++) {
        const mk_wmat *V = W[i];
        if (V->kind != MK_W_BF16 || V->k != W[0]->k || V->k % 32 || V->n % 16 || mk_cuda_bf16_tiled(ctx, V)) return 0;
        gemv_plan p = plan_for(ctx, V->n / 16, V->k / 32);
        if (p.splits > 1) return 0;
        if (i == 0) p0 = p;
        else if (p.per != p0.per || p.nw != p0.nw) return 0;
        slabs += V->n / 16;
    }
    return slabs <= 65535;
}

int mk_cuda_gemv_bf16_multi(mk_cuda_ctx *ctx, int count, const mk_wmat *const *W, const uint16_t *xb, int m,
                            float *const *y, const int *round, mk_err *err) {
    if (m < 1 || !mk_cuda_gemv_bf16_multi_ok(ctx, count, W))
        return mk_fail(err, MK_ENOTSUP, "cuda: bf16 gemv multi: %d matrices do not share k and a launch plan", count);
    bf16_set M = {};
    for (int i = 0; i < count; i++) {
        M.W[i] = (const uint16_t *)W[i]->w, M.y[i] = y[i], M.n[i] = W[i]->n, M.round[i] = round[i];
        M.s0[i + 1] = M.s0[i] + W[i]->n / 16;
    }
    M.count = count;
    gemv_plan p = plan_for(ctx, W[0]->n / 16, W[0]->k / 32);
    dim3 grid((m + 7) / 8, M.s0[count], 1);
    MK_CU_TRY(gemv_launch(ctx, grid, p.nw * 32, k_gemv_bf16<8>, M, xb, m, W[0]->k, p.per, (float *)NULL,
                          ctx->counters),
              err, "cuda: bf16 gemv launch");
    if (ctx->trace_on) mk_cuda_trace_mark(ctx, "cuda: bf16 gemv launch");
    return MK_OK;
}

/* ---- FP8_DQ (wo_a: FP8 storage used as dequantized values, activations not quantized) ------ */

__device__ __forceinline__ uint32_t u4_word(const uint4 &v, int j) {
    return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

/* W e4m3 [n, k], S e8m0 [n/128, k/128], xh f16 [m, xs], sx [m, xs/128] (x = xh * sx per block).
 * Grouped (gn > 0, wo_a): output rows [i gn, (i + 1) gn) read x columns [i k, (i + 1) k), xs = G k.
 * Like the FP8 GEMV (16 rows x 64 k per warp step, lane (g, t) owns 16 contiguous k), but with
 * m16n8k16 f16 MMAs: the lane's 16 weight bytes become 8 f16 pairs by cvt (exact), its 16 f16
 * activations are the matching B pairs. Per 128-block: partial * (sx * sb) into fp32. */
template <int U>
__global__ void __launch_bounds__(256, 2) k_gemv_dq(const uint8_t *__restrict__ W,
                                                    const uint8_t *__restrict__ S,
                                                    const uint16_t *__restrict__ xh,
                                                    const float *__restrict__ sx, int m, int n,
                                                    int k, int per, float *__restrict__ y,
                                                    int round, float *__restrict__ ws,
                                                    unsigned *__restrict__ counters, int xs, int gn) {
    __shared__ float red[GEMV_MAXW * 32 * 4];
    __shared__ float tile[8 * 16];
    mk_d_pdl_launch_dependents();
    const int n0 = blockIdx.y * 16;
    { /* chunk blockIdx.x: activation rows 8 c .. 8 c + 7 (a launch over m > 8 rows) */
        const int c8 = (int)blockIdx.x * 8;
        const int gi = gn ? n0 / gn : 0; /* the group's columns of x */
        xh += (size_t)c8 * xs + (size_t)gi * k;
        sx += (size_t)c8 * (xs >> 7) + (size_t)gi * (k >> 7);
        y += (size_t)c8 * n;
        m = min(8, m - c8);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nb = k >> 7, xnb = xs >> 7;
    const int kb0 = (blockIdx.z * nw + warp) * per, kb1 = min(nb, kb0 + per);
    const uint8_t *w0 = W + (size_t)(n0 + g) * k + t * 16;
    const uint8_t *w1 = w0 + (size_t)8 * k;
    const bool xcol = g < m;
    const uint8_t *xr = (const uint8_t *)(xh + (size_t)(xcol ? g : 0) * xs) + t * 32;
    const uint8_t *sbr = S + (size_t)(n0 >> 7) * nb;
    const int c0 = 2 * t, c1 = 2 * t + 1;
    const bool v0 = c0 < m, v1 = c1 < m;
    const float *sx0 = sx + (size_t)(v0 ? c0 : 0) * xnb;
    const float *sx1 = sx + (size_t)(v1 ? c1 : 0) * xnb;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int kb = kb0; kb < kb1; kb += U) {
        uint4 a[U][2][2], b[U][2][2]; /* [block][64-k step][row half | activation half] */
        float sbv[U], f0[U], f1[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (kb + u < kb1) {
#pragma unroll
                for (int s = 0; s < 2; s++) {
                    size_t off = (size_t)(kb + u) * 128 + s * 64;
                    a[u][s][0] = mk_d_ld_stream(w0 + off);
                    a[u][s][1] = mk_d_ld_stream(w1 + off);
                }
                sbv[u] = mk_d_e8m0(sbr[kb + u]);
            }
        }
        mk_d_pdl_wait();
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (kb + u < kb1) {
#pragma unroll
                for (int s = 0; s < 2; s++) {
                    size_t off = (size_t)(kb + u) * 256 + s * 128; /* bytes of f16 */
                    b[u][s][0] = xcol ? mk_d_ld16(xr + off) : make_uint4(0, 0, 0, 0);
                    b[u][s][1] = xcol ? mk_d_ld16(xr + off + 16) : make_uint4(0, 0, 0, 0);
                }
                f0[u] = v0 ? sx0[kb + u] * sbv[u] : 0.0f;
                f1[u] = v1 ? sx1[kb + u] * sbv[u] : 0.0f;
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (kb + u < kb1) {
                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int s = 0; s < 2; s++) {
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        uint32_t wg = u4_word(a[u][s][0], j), wg8 = u4_word(a[u][s][1], j);
                        const uint4 &bb = b[u][s][j >> 1];
                        uint32_t bx = (j & 1) ? bb.z : bb.x, by = (j & 1) ? bb.w : bb.y;
                        mk_d_mma_f16(c, mk_d_e4m3x2_to_f16x2(wg & 0xffff),
                                     mk_d_e4m3x2_to_f16x2(wg8 & 0xffff), mk_d_e4m3x2_to_f16x2(wg >> 16),
                                     mk_d_e4m3x2_to_f16x2(wg8 >> 16), bx, by);
                    }
                }
                acc[0] = fmaf(c[0], f0[u], acc[0]);
                acc[1] = fmaf(c[1], f1[u], acc[1]);
                acc[2] = fmaf(c[2], f0[u], acc[2]);
                acc[3] = fmaf(c[3], f1[u], acc[3]);
            }
        }
    }
    mk_d_pdl_wait();
    gemv_reduce<4>(acc, red);
    if (warp == 0) {
        if (v0) tile[c0 * 16 + g] = acc[0], tile[c0 * 16 + g + 8] = acc[2];
        if (v1) tile[c1 * 16 + g] = acc[1], tile[c1 * 16 + g + 8] = acc[3];
    }
    __syncthreads();
    gemv_finish(tile, m, n, n0, y, round, ws, counters);
}

/* k_gemv_dq's bits for many rows, arranged as k_gemm_fp8_ri (8 warps x 16 rows, 8 J activation
 * rows per block, the f16 activations' 128-blocks (256 bytes a row) staged in shared memory by
 * cp.async and shared by the warps, each warp's k walk split into the GEMV's warp ranges, added in
 * order). Grouped (wo_a): the block's 128 rows lie in one group (gn % 128 == 0, checked by the
 * caller). Each unit's weight bytes are widened to f16 once for all tiles. In shared memory
 * 16-byte chunk c of row r sits at chunk c ^ (r & 1) (a quarter warp: rows g, g + 1, chunks 2 t
 * (+ 1): 8 bank groups). */
template <int J>
__global__ void __launch_bounds__(256, 1) k_gemm_dq_ri(const uint8_t *__restrict__ W, const uint8_t *__restrict__ S,
                                                       const uint16_t *__restrict__ xh, const float *__restrict__ sx,
                                                       int m, int n, int k, int per, float *__restrict__ y, int round,
                                                       int xs_, int gn, int pf) {
    __shared__ __align__(16) uint8_t xs[RI_ST][8 * J * 256];
    __shared__ float ss[RI_ST][8 * J];
    mk_d_pdl_launch_dependents();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nb = k >> 7, xnb = xs_ >> 7;
    const int slab = (int)blockIdx.y * 8 + warp;
    const bool active = slab < (n >> 4);
    const int n0 = active ? slab * 16 : 0;
    const int gi = gn ? (int)blockIdx.y * 128 / gn : 0; /* the group's columns of x */
    const uint16_t *xg = xh + (size_t)gi * k;
    const float *sg = sx + (size_t)gi * nb;
    const int r0 = (int)blockIdx.x * 8 * J, mt = min(8 * J, m - r0);
    const uint8_t *w0 = W + (size_t)(n0 + g) * k + t * 16, *w1 = w0 + (size_t)8 * k;
    const uint8_t *sbr = S + (size_t)(n0 >> 7) * nb;
    const int c0 = 2 * t, c1 = 2 * t + 1;
    auto stage = [&](int kb) {
        ri_stage_rows<J, 16>(xs[kb % RI_ST], mt, [](int r, int c) { return c ^ (r & 1); },
                             [&](int r) { return (const uint8_t *)(xg + (size_t)(r0 + r) * xs_ + (size_t)kb * 128); });
        if (tid < 8 * J) {
            const bool ok = tid < mt;
            mk_d_cp_async4(&ss[kb % RI_ST][tid], sg + (size_t)(r0 + (ok ? tid : 0)) * xnb + kb, ok ? 4 : 0);
        }
    };
    uint4 an[2][2];
    if (active) ri_load_w(an, w0, w1, 0);
    mk_d_pdl_wait();
    ri_prologue<RI_ST>(stage, nb);
    float tot[4 * J], part[4 * J];
#pragma unroll
    for (int i = 0; i < 4 * J; i++) tot[i] = part[i] = 0.0f;
    for (int kb = 0; kb < nb; kb++) {
        ri_advance<RI_ST>(stage, kb, nb);
        uint4 a[2][2];
#pragma unroll
        for (int s = 0; s < 2; s++) a[s][0] = an[s][0], a[s][1] = an[s][1];
        if (active && kb + 1 < nb) ri_load_w(an, w0, w1, (size_t)(kb + 1) * 128);
        if (active && lane < 16 && kb + pf < nb) /* lane r: row n0 + r's 128-block kb + pf, into L2 (ri_l2_pf) */
            mk_d_l2_prefetch(W + (size_t)(n0 + lane) * k + (size_t)(kb + pf) * 128);
        if (!active) continue;
        uint32_t h[2][4][4]; /* [64-k step][word q][A register] the widened weights */
#pragma unroll
        for (int s = 0; s < 2; s++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const uint32_t wg = u4_word(a[s][0], q), wg8 = u4_word(a[s][1], q);
                h[s][q][0] = mk_d_e4m3x2_to_f16x2(wg & 0xffff), h[s][q][1] = mk_d_e4m3x2_to_f16x2(wg8 & 0xffff);
                h[s][q][2] = mk_d_e4m3x2_to_f16x2(wg >> 16), h[s][q][3] = mk_d_e4m3x2_to_f16x2(wg8 >> 16);
            }
        const float sb = mk_d_e8m0(sbr[kb]);
        const uint8_t *xst = xs[kb % RI_ST];
        const float *sst = ss[kb % RI_ST];
#pragma unroll
        for (int j = 0; j < J; j++) {
            if (8 * j >= mt) break;
            const uint8_t *xr = xst + (8 * j + g) * 256;
            const float f0 = sst[8 * j + c0] * sb, f1 = sst[8 * j + c1] * sb;
            float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int s = 0; s < 2; s++) {
                uint4 b[2];
#pragma unroll
                for (int hh = 0; hh < 2; hh++) b[hh] = *(const uint4 *)(xr + (((s * 8 + 2 * t + hh) ^ (g & 1)) << 4));
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const uint4 &bb = b[q >> 1];
                    const uint32_t bx = (q & 1) ? bb.z : bb.x, by = (q & 1) ? bb.w : bb.y;
                    mk_d_mma_f16(c, h[s][q][0], h[s][q][1], h[s][q][2], h[s][q][3], bx, by);
                }
            }
            part[4 * j + 0] = fmaf(c[0], f0, part[4 * j + 0]);
            part[4 * j + 1] = fmaf(c[1], f1, part[4 * j + 1]);
            part[4 * j + 2] = fmaf(c[2], f0, part[4 * j + 2]);
            part[4 * j + 3] = fmaf(c[3], f1, part[4 * j + 3]);
        }
        if ((kb + 1) % per == 0 || kb + 1 == nb) ri_fold(tot, part, kb < per);
    }
    mk_d_cp_async_wait<0>();
    if (active) ri_store<J>(tot, y, n, n0, r0, mt, round);
}

int mk_cuda_gemv_dq(mk_cuda_ctx *ctx, const mk_wmat *W, int G, const uint16_t *xh, const float *sx, int m,
                    float *y, int round, float *ws, mk_err *err) {
    int n = W->n, k = W->k;
    if (m < 1 || n % 16 || n / 16 > 65535 || k % 128 || G < 1 || n % G || (n / G) % 16)
        return mk_fail(err, MK_ENOTSUP, "cuda: fp8_dq gemv: needs m >= 1, n %% 16 == 0 (n <= 1048560), k %% 128 == 0, "
                       "n / G %% 16 == 0 (m %d, n %d, k %d, G %d)", m, n, k, G);
    /* grouped: the launch plan of one group's matrix, so a group's bits are those of its own launch */
    gemv_plan p = plan_for(ctx, n / G / 16, k / 128);
    if (p.splits > 1 && !ws) return mk_fail(err, MK_EINVAL, "cuda: fp8_dq gemv: split-K needs a workspace");
    if (p.splits > 1 && m > 8)
        return mk_fail(err, MK_EINVAL, "cuda: fp8_dq gemv: split-K takes at most 8 rows per launch (m %d)", m);
    const int gn = G > 1 ? n / G : 0;
    if (p.splits == 1 && (gn == 0 || gn % 128 == 0) && ri_tiles_for(ctx, m, n / 16) > 1) {
        /* the row-invariant GEMM: the same bits (4 tiles: its f16 stages fill the static shared memory) */
        dim3 grid((m + 31) / 32, (n / 16 + 7) / 8, 1);
        MK_CU_TRY(gemv_launch(ctx, grid, 256, k_gemm_dq_ri<4>, (const uint8_t *)W->w, W->scale, xh, sx, m, n, k, p.per,
                              y, round, G * k, gn, ctx->tune.ri_l2_pf),
                  err, "cuda: fp8_dq row-invariant gemm launch");
        if (ctx->trace_on) mk_cuda_trace_mark(ctx, "cuda: fp8_dq row-invariant gemm launch");
        return MK_OK;
    }
    dim3 grid((m + 7) / 8, n / 16, p.splits);
    MK_CU_TRY(gemv_launch(ctx, grid, p.nw * 32, k_gemv_dq<2>, (const uint8_t *)W->w, W->scale, xh, sx,
                          m, n, k, p.per, y, round, ws, ctx->counters, G * k, G > 1 ? n / G : 0),
              err, "cuda: fp8_dq gemv launch");
    if (ctx->trace_on) mk_cuda_trace_mark(ctx, "cuda: fp8_dq gemv launch");
    return MK_OK;
}

/* ---- simple: one warp per output feature, any kind and shape ----------------------------- */

/* The scalar reference's structure (gemm_ref.c) with the k loop spread over the lanes: per
 * scale block each lane sums its share, scales it, and the lanes' sums are added at the end. */
__global__ void __launch_bounds__(256) k_gemv_simple(int kind, const void *__restrict__ Wv,
                                                     const uint8_t *__restrict__ S,
                                                     const float *__restrict__ x,
                                                     const uint8_t *__restrict__ xq,
                                                     const float *__restrict__ sa, int m, int n,
                                                     int k, float *__restrict__ y, int round) {
    const int j = (int)((blockIdx.x * (size_t)blockDim.x + threadIdx.x) >> 5);
    const int lane = threadIdx.x & 31;
    if (j >= n) return;
    const int nb = (k + 127) >> 7;
    for (int r = 0; r < m; r++) {
        float acc = 0.0f;
        if (kind == MK_W_BF16) {
            const uint16_t *wr = (const uint16_t *)Wv + (size_t)j * k;
            const float *xr = x + (size_t)r * k;
            for (int i = lane; i < k; i += 32) acc += xr[i] * mk_d_bf16(wr[i]);
        } else if (kind == MK_W_F32) {
            const float *wr = (const float *)Wv + (size_t)j * k;
            const float *xr = x + (size_t)r * k;
            for (int i = lane; i < k; i += 32) acc += xr[i] * wr[i];
        } else if (kind == MK_W_FP8) {
            const uint8_t *wr = (const uint8_t *)Wv + (size_t)j * k;
            const uint8_t *sr = S + (size_t)(j >> 7) * nb;
            const uint8_t *qr = xq + (size_t)r * k;
            for (int b = 0; b < nb; b++) {
                float part = 0.0f;
                int e = min(k, (b + 1) * 128);
                for (int i = b * 128 + lane; i < e; i += 32) part += mk_d_e4m3(qr[i]) * mk_d_e4m3(wr[i]);
                acc += part * sa[(size_t)r * nb + b] * mk_d_e8m0(sr[b]);
            }
        } else if (kind == MK_W_FP8_DQ) {
            const uint8_t *wr = (const uint8_t *)Wv + (size_t)j * k;
            const uint8_t *sr = S + (size_t)(j >> 7) * nb;
            const float *xr = x + (size_t)r * k;
            for (int b = 0; b < nb; b++) {
                float sb = mk_d_e8m0(sr[b]);
                int e = min(k, (b + 1) * 128);
                for (int i = b * 128 + lane; i < e; i += 32) acc += xr[i] * (mk_d_e4m3(wr[i]) * sb);
            }
        } else { /* MK_W_FP4 */
            const uint8_t *wr = (const uint8_t *)Wv + (size_t)j * (k / 2);
            const uint8_t *sr = S + (size_t)j * (k / 32);
            const uint8_t *qr = xq + (size_t)r * k;
            for (int b = 0; b < k / 32; b++) {
                int i = b * 32 + lane;
                uint32_t byte = wr[i >> 1];
                float part = mk_d_e4m3(qr[i]) * mk_d_e2m1((i & 1) ? byte >> 4 : byte & 15);
                acc += part * sa[(size_t)r * nb + (b >> 2)] * mk_d_e8m0(sr[b]);
            }
        }
        acc = mk_d_warp_sum(acc);
        if (lane == 0) y[(size_t)r * n + j] = gemv_out(acc, round);
    }
}

int mk_cuda_gemv_simple(mk_cuda_ctx *ctx, const mk_wmat *W, const float *x, const uint8_t *xq,
                        const float *sa, int m, float *y, int round, mk_err *err) {
    if (W->kind == MK_W_FP4 && W->k % 32)
        return mk_fail(err, MK_EINVAL, "cuda: fp4 weights need k %% 32 == 0 (k = %d)", W->k);
    unsigned blocks = (unsigned)(((size_t)W->n * 32 + 255) / 256);
    k_gemv_simple<<<blocks, 256, 0, ctx->stream>>>((int)W->kind, W->w, W->scale, x, xq, sa, m, W->n,
                                                   W->k, y, round);
    MK_CU_LAUNCHED(err, "cuda: simple gemv launch");
    return MK_OK;
}
