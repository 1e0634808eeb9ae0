/* basic.cu — RMSNorm, interleaved RoPE (tables from mk_rope_table_init, YaRN included) and the
 * Sylvester Hadamard transform on the GPU; twins of src/ops/cpu/basic.c. And the argmax of logits
 * rows with the sampler's greedy rule (src/engine/sampler.c), for greedy requests on the GPU.
 *
 * RMSNorm sums squares in double like the CPU op (so the fp32 mean almost always agrees to the
 * last bit), then rounds each output to bf16. RoPE and Hadamard perform exactly the CPU's fp32
 * operations in the same order, with contraction into FMA ruled out (__fmul_rn / __fadd_rn), so
 * they are bit-identical to the CPU.
 */
#include "ops/cuda/cuda_common.cuh"

#include <cooperative_groups.h>
#include <float.h>
#include <limits.h>

namespace cg = cooperative_groups;

/* One block per row. y may alias x: each thread reads its elements again before writing them. */
__global__ void __launch_bounds__(1024) k_rmsnorm(const float *x, int d, const uint16_t *__restrict__ w,
                                                  float eps, float *y) {
    mk_d_pdl_launch_dependents(); /* launched with programmatic dependent launch: only the weights */
    mk_d_l2_prefetch_block(w, (size_t)d * 2); /* are touched (prefetched) before the wait */
    mk_d_pdl_wait();
    mk_d_rmsnorm_row(x + (size_t)blockIdx.x * d, d, w, eps, y + (size_t)blockIdx.x * d);
}

__global__ void __launch_bounds__(1024) k_rmsnorm_quant(const float *x, int d, const uint16_t *__restrict__ w,
                                                        float eps, float *y, int perm, uint8_t *__restrict__ q,
                                                        float *__restrict__ sa) {
    mk_d_pdl_launch_dependents(); /* launched with programmatic dependent launch: only the weights */
    mk_d_l2_prefetch_block(w, (size_t)d * 2); /* are touched (prefetched) before the wait */
    mk_d_pdl_wait();
    const size_t r = blockIdx.x;
    mk_d_rmsnorm_quant_row(x + r * d, d, w, eps, y + r * d, perm, q + r * d, sa + r * (d >> 7));
}

extern "C" int mk_cuda_rmsnorm_quant(mk_cuda_ctx *ctx, const float *x, int rows, int d, const uint16_t *w, float eps,
                                     float *y, const mk_cuda_actq *aq, mk_err *err) {
    if (rows <= 0) return MK_OK;
    if (d <= 0) return mk_fail(err, MK_EINVAL, "cuda: rmsnorm: d = %d", d);
    const int th = mk_cuda_rmsnorm_threads(d);
    if (!ctx->tune.norm_quant || th % 128 || d % 128 || d > 4 * th) { /* two launches */
        int st = mk_cuda_rmsnorm(ctx, x, rows, d, w, eps, y, err);
        return st ? st : mk_cuda_act_quant(ctx, y, rows, d, aq->perm, aq->q, aq->sa, err);
    }
    (void)mk_cuda_launch_pdl(ctx, rows, th, 0, k_rmsnorm_quant, x, d, w, eps, y, aq->perm, aq->q, aq->sa);
    MK_CU_LAUNCHED(err, "cuda: rmsnorm_quant launch");
    return MK_OK;
}

extern "C" int mk_cuda_rmsnorm(mk_cuda_ctx *ctx, const float *x, int rows, int d, const uint16_t *w,
                               float eps, float *y, mk_err *err) {
    if (rows <= 0) return MK_OK;
    if (d <= 0) return mk_fail(err, MK_EINVAL, "cuda: rmsnorm: d = %d", d);
    /* about 4 values per thread (a row is one block: a decode's row must not wait on a few threads'
     * load chains); the thread count depends on d only, so a row's bits do not depend on rows */
    (void)mk_cuda_launch_pdl(ctx, rows, mk_cuda_rmsnorm_threads(d), 0, k_rmsnorm, x, d, w, eps, y);
    MK_CU_LAUNCHED(err, "cuda: rmsnorm launch");
    return MK_OK;
}

/* ---- RoPE --------------------------------------------------------------------------------- */

extern "C" int mk_cuda_rope_table_upload(mk_cuda_ctx *ctx, const mk_rope_table *host,
                                         mk_rope_table *dev, mk_err *err) {
    *dev = *host;
    dev->cs = NULL;
    size_t bytes = sizeof(float) * 2 * (size_t)host->max_pos * (size_t)host->half;
    void *p = NULL;
    int st = mk_cuda_alloc(ctx, bytes, &p, err);
    if (st) return st;
    st = mk_cuda_upload(ctx, p, host->cs, bytes, err);
    if (st) {
        mk_cuda_free(ctx, p);
        return st;
    }
    dev->cs = (float *)p;
    return MK_OK;
}

extern "C" void mk_cuda_rope_table_free(mk_cuda_ctx *ctx, mk_rope_table *dev) {
    mk_cuda_free(ctx, dev->cs);
    dev->cs = NULL;
}

/* One thread per rotated pair. Position of vector v: pos0 + v / vpp, or pos_of[v / vpp]. */
__global__ void k_rope(float *x, int n_vec, int stride, int half, const float *__restrict__ cs,
                       int tab_half, int pos0, const int32_t *__restrict__ pos_of, int max_pos, int vpp,
                       int inverse) {
    MK_PDL_ENTER(); /* launched with programmatic dependent launch: nothing is touched before */
    size_t id = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (id >= (size_t)n_vec * half) return;
    int v = (int)(id / half), i = (int)(id - (size_t)v * half);
    int pos = pos_of ? pos_of[v / vpp] : pos0 + v / vpp;
    if (pos < 0 || pos >= max_pos) return; /* checked by the callers; never read outside the table */
    mk_d_rope_pair(x + (size_t)v * stride, cs, tab_half, pos, i, inverse);
}

extern "C" int mk_cuda_rope(mk_cuda_ctx *ctx, float *x, int n_vec, int stride, int rd,
                            const mk_rope_table *t, int pos0, int vecs_per_pos, int inverse,
                            mk_err *err) {
    if (n_vec <= 0) return MK_OK;
    if (rd <= 0 || rd % 2 || rd / 2 > t->half || vecs_per_pos <= 0 || !t->cs)
        return mk_fail(err, MK_EINVAL, "cuda: rope: rd %d, table half %d, vecs_per_pos %d", rd,
                       t->half, vecs_per_pos);
    int last = pos0 + (n_vec - 1) / vecs_per_pos;
    if (pos0 < 0 || last >= t->max_pos)
        return mk_fail(err, MK_ERANGE, "cuda: rope: positions %d..%d outside the table (%d)", pos0,
                       last, t->max_pos);
    size_t n = (size_t)n_vec * (rd / 2);
    (void)mk_cuda_launch_pdl(ctx, (unsigned)((n + 255) / 256), 256, 0, k_rope, x, n_vec, stride, rd / 2, t->cs,
                                                                   t->half, pos0, (const int32_t *)NULL, t->max_pos, vecs_per_pos,
                                                                   inverse);
    MK_CU_LAUNCHED(err, "cuda: rope launch");
    return MK_OK;
}

extern "C" int mk_cuda_rope_at(mk_cuda_ctx *ctx, float *x, int n_vec, int stride, int rd,
                               const mk_rope_table *t, const int32_t *pos, int vecs_per_pos, int inverse,
                               mk_err *err) {
    if (n_vec <= 0) return MK_OK;
    if (rd <= 0 || rd % 2 || rd / 2 > t->half || vecs_per_pos <= 0 || !t->cs || !pos)
        return mk_fail(err, MK_EINVAL, "cuda: rope_at: rd %d, table half %d, vecs_per_pos %d", rd, t->half,
                       vecs_per_pos);
    size_t n = (size_t)n_vec * (rd / 2);
    (void)mk_cuda_launch_pdl(ctx, (unsigned)((n + 255) / 256), 256, 0, k_rope, x, n_vec, stride, rd / 2, t->cs, t->half, 0, pos,
                                                                   t->max_pos, vecs_per_pos, inverse);
    MK_CU_LAUNCHED(err, "cuda: rope_at launch");
    return MK_OK;
}

/* ---- Hadamard ----------------------------------------------------------------------------- */

/* One block per row, the row in shared memory; the butterflies of basic.c, stage by stage. */
__global__ void __launch_bounds__(256) k_hadamard(float *x, int n, float scale) {
    MK_PDL_ENTER(); /* launched with programmatic dependent launch: nothing is touched before */
    extern __shared__ float hs[];
    float *xr = x + (size_t)blockIdx.x * n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) hs[i] = xr[i];
    __syncthreads();
    mk_d_hadamard_smem(hs, n);
    for (int i = threadIdx.x; i < n; i += blockDim.x) xr[i] = mk_d_bf16r(__fmul_rn(hs[i], scale));
}

extern "C" int mk_cuda_hadamard(mk_cuda_ctx *ctx, float *x, int rows, int n, float scale,
                                mk_err *err) {
    if (rows <= 0) return MK_OK;
    if (n < 1 || n > 8192 || (n & (n - 1)))
        return mk_fail(err, MK_EINVAL, "cuda: hadamard: n = %d (a power of two up to 8192)", n);
    (void)mk_cuda_launch_pdl(ctx, rows, 256, sizeof(float) * n, k_hadamard, x, n, scale);
    MK_CU_LAUNCHED(err, "cuda: hadamard launch");
    return MK_OK;
}

/* ---- argmax of logits rows ------------------------------------------------------------------ */

/* The greedy rule: mk_d_am_better / mk_d_am_take (cuda_common.cuh). */

/* The best candidate of elements [lo, hi) of row r (lo a multiple of 4) by the block's threads,
 * to every thread of warp 0 (bv, bi; bi INT_MAX: none). The rule is a total order, so any visiting
 * order gives the same winner: a 16-byte-aligned row is read as float4s, four per thread in flight
 * (one SM streams a 129280-entry row in ~16 us; a dependent load per element took ~55 us). */
__device__ __forceinline__ void am_slice(const float *__restrict__ r, int lo, int hi, float &bv, int &bi) {
    __shared__ float sv[32];
    __shared__ int si[32];
    bv = -INFINITY;
    bi = INT_MAX;
    int tail = lo; /* elements [lo, tail) were read as float4s */
    if (((uintptr_t)r & 15) == 0) {
        const float4 *r4 = (const float4 *)r;
        const int a4 = lo >> 2, n4 = hi >> 2, nt = blockDim.x;
        for (int b = a4; b < n4; b += 4 * nt) {
            float4 v[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int j = b + u * nt + threadIdx.x;
                v[u] = j < n4 ? __ldg(r4 + j) : make_float4(NAN, NAN, NAN, NAN);
            }
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int i = 4 * (b + u * nt + threadIdx.x);
                mk_d_am_take(v[u].x, i, bv, bi), mk_d_am_take(v[u].y, i + 1, bv, bi);
                mk_d_am_take(v[u].z, i + 2, bv, bi), mk_d_am_take(v[u].w, i + 3, bv, bi);
            }
        }
        tail = n4 > a4 ? n4 << 2 : lo;
    }
    for (int i = tail + threadIdx.x; i < hi; i += blockDim.x) mk_d_am_take(r[i], i, bv, bi);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        mk_d_am_better(ov, oi, bv, bi);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if (lane == 0) sv[warp] = bv, si[warp] = bi;
    __syncthreads();
    if (warp == 0) {
        bv = lane < nw ? sv[lane] : -INFINITY;
        bi = lane < nw ? si[lane] : INT_MAX;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            mk_d_am_better(ov, oi, bv, bi);
        }
    }
}

/* One block of 1024 threads per row (many rows: the blocks fill the GPU). */
__global__ void __launch_bounds__(1024) k_argmax_rows(const float *__restrict__ x, int n, int32_t *__restrict__ out) {
    MK_PDL_ENTER();
    float bv;
    int bi;
    am_slice(x + (size_t)blockIdx.x * n, 0, n, bv, bi);
    if (threadIdx.x == 0) out[blockIdx.x] = bi == INT_MAX ? -1 : bi;
}

/* A cluster of AM_NB blocks per row (few rows, a decode's: one SM streaming a whole 129280-entry row
 * was 16 us of a step on the H100): block q scans slice q (float4-aligned bounds), and rank 0 takes
 * the best of the blocks' winners through distributed shared memory. The rule is a total order, so
 * the winner is the one-block kernel's. */
#define AM_NB 8
__global__ void __launch_bounds__(1024) k_argmax_cluster(const float *__restrict__ x, int n,
                                                         int32_t *__restrict__ out) {
    MK_PDL_ENTER();
    cg::cluster_group cl = cg::this_cluster();
    __shared__ float cv;
    __shared__ int ci;
    const int q = (int)cl.block_rank(), row = blockIdx.x / AM_NB;
    const int n4 = n >> 2, lo = q == 0 ? 0 : 4 * (int)((long long)n4 * q / AM_NB);
    const int hi = q == AM_NB - 1 ? n : 4 * (int)((long long)n4 * (q + 1) / AM_NB);
    float bv;
    int bi;
    am_slice(x + (size_t)row * n, lo, hi, bv, bi);
    if (threadIdx.x == 0) cv = bv, ci = bi;
    cl.sync(); /* every block's winner is in its shared memory */
    if (q == 0 && threadIdx.x == 0) {
        for (int b = 1; b < AM_NB; b++) mk_d_am_better(*cl.map_shared_rank(&cv, b), *cl.map_shared_rank(&ci, b), bv, bi);
        out[row] = bi == INT_MAX ? -1 : bi;
    }
    cl.sync(); /* no block leaves while rank 0 reads its shared memory */
}

extern "C" int mk_cuda_argmax_rows(mk_cuda_ctx *ctx, const float *x, int rows, int n, int32_t *out, mk_err *err) {
    if (rows <= 0) return MK_OK;
    if (n <= 0) return mk_fail(err, MK_EINVAL, "cuda: argmax: rows of %d values", n);
    if (ctx->tune.argmax_cluster && rows <= ctx->tune.argmax_cluster && n >= 4 * 1024 * AM_NB) {
        (void)mk_cuda_launch_cluster(ctx, dim3((unsigned)rows * AM_NB), dim3(1024), 0, AM_NB, 1, k_argmax_cluster, x, n,
                                     out);
        MK_CU_LAUNCHED(err, "cuda: argmax (cluster) launch");
        return MK_OK;
    }
    (void)mk_cuda_launch_pdl(ctx, rows, 1024, 0, k_argmax_rows, x, n, out);
    MK_CU_LAUNCHED(err, "cuda: argmax launch");
    return MK_OK;
}
