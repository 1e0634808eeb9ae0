/* attn.cu — sparse attention with the sink on the GPU (twin of mk_sparse_attn, basic.c): one
 * query token over a gathered set of KV rows (K = V, a single shared head), all H heads.
 *
 * A block serves one query token and a group of HG heads (16 for prefill and large batches), so
 * each gathered row is read once per group rather than once per head; HG shrinks when there are
 * too few tokens to fill the GPU (each head's arithmetic is the same whatever its group). Rows are processed in chunks of 256 with the CPU's online
 * softmax: scores of the chunk (a warp per 4 rows, lanes over D, a reduce-scatter over the lanes:
 * one shuffle per (row, head) pair instead of five), the chunk maximum, rescaling of the
 * running output and denominator when the maximum grows, probabilities rounded to bf16 before the
 * PV product (the reference's acc_s_cast), the sink only in the denominator. The PV product runs
 * with a thread per output element and fmaf in row order, which is what the CPU's AVX2 axpy does,
 * so outside the score dot products (summed in another order) and expf the arithmetic matches.
 *
 * A decode (at most 4 heads per block) runs the same arithmetic on a thread-block cluster of 4
 * blocks per head group (k_sparse_attn_cl, tuning attn_cluster): a batch-1 step's one-block
 * launches were latency-bound on the rows' reads (28 us each inside a captured H100 step; 9 us on
 * the cluster, bench/gpu/results-2026-12-06-attn.md). Every kernel here gives a head the same bits
 * whatever its group, its kernel and the other tokens of the call.
 */
#include "ops/cuda/cuda_common.cuh"

#include <cooperative_groups.h>
namespace cg = cooperative_groups;

#define ATT_CHUNK 256
#define ATT_THREADS 256
#define ATT_MAXD 1024

/* Sum over the warp's 32 lanes of each of a lane's NP values (NP a power of two <= 32): halving
 * exchanges (lane bit 4 picks which half of the values a lane keeps, then bit 3, ...), NP - 1
 * shuffles in all, then plain butterfly steps over the lanes that share an index. Returns the total
 * of value *idx (-1 in lanes that should not write: the lanes sharing an index hold the same sum).
 * A fixed order, whatever the rows and the row count. */
/* One halving exchange over lane bit o: values [0, H) of lanes with the bit clear and [H, 2H) of
 * lanes with it set stay (summed with the partner's), as v[0, H). */
template <int H, int NP>
__device__ __forceinline__ void score_halve(float (&v)[NP], int lane, int o) {
    const bool upper = lane & o;
#pragma unroll
    for (int i = 0; i < H; i++) {
        const float send = upper ? v[i] : v[i + H], keep = upper ? v[i + H] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
    }
}

template <int NP>
__device__ __forceinline__ float score_reduce(float (&v)[NP], int lane, int *idx) {
    constexpr int LG = NP >= 32 ? 5 : NP >= 16 ? 4 : NP >= 8 ? 3 : NP >= 4 ? 2 : NP >= 2 ? 1 : 0;
    if constexpr (NP >= 32) score_halve<16>(v, lane, 16);
    if constexpr (NP >= 16) score_halve<8>(v, lane, 16 >> (LG - 4));
    if constexpr (NP >= 8) score_halve<4>(v, lane, 16 >> (LG - 3));
    if constexpr (NP >= 4) score_halve<2>(v, lane, 16 >> (LG - 2));
    if constexpr (NP >= 2) score_halve<1>(v, lane, 16 >> (LG - 1));
    float t = v[0];
#pragma unroll
    for (int o = 16 >> LG; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    *idx = (lane & ((32 >> LG) - 1)) ? -1 : lane >> (5 - LG);
    return t;
}

/* The chunk's softmax step, per head (a warp each): chunk max, new running max, probabilities
 * (rounded to bf16 in place), denominator, and the factor the running output is rescaled by. */
template <int HG>
__device__ __forceinline__ void att_softmax_chunk(float (*sc)[ATT_CHUNK], int nb, float *s_m, float *s_den,
                                                  float *s_corr, int warp, int lane) {
    for (int h = warp; h < HG; h += ATT_THREADS / 32) {
        float bm = -INFINITY;
        for (int j = lane; j < nb; j += 32) bm = fmaxf(bm, sc[h][j]);
        bm = mk_d_warp_max(bm);
        float m = s_m[h], nm = bm > m ? bm : m;
        float corr = (m != -INFINITY && nm != m) ? expf(m - nm) : 1.0f;
        float psum = 0.0f;
        for (int j = lane; j < nb; j += 32) {
            float p = expf(sc[h][j] - nm);
            psum += p;
            sc[h][j] = mk_d_bf16r(p);
        }
        psum = mk_d_warp_sum(psum);
        if (lane == 0) {
            s_den[h] = s_den[h] * corr + psum;
            s_m[h] = nm;
            s_corr[h] = corr;
        }
    }
}

template <int HG, int DJ>
__device__ __forceinline__ void att_rescale(float (&oacc)[HG][DJ], const float *s_corr) {
#pragma unroll
    for (int h = 0; h < HG; h++) {
        float corr = s_corr[h];
        if (corr != 1.0f)
#pragma unroll
            for (int j = 0; j < DJ; j++) oacc[h][j] *= corr;
    }
}

/* The output of the block's HG heads (oh: head h0's row): the sink only in the denominator. */
template <int HG, int DJ>
__device__ __forceinline__ void att_store(const float (&oacc)[HG][DJ], const float *s_den, const float *s_m,
                                          const float *sink, int n, float *oh, int D, int h0, int tid) {
#pragma unroll
    for (int h = 0; h < HG; h++) {
        float den = n > 0 ? s_den[h] + expf(sink[h0 + h] - s_m[h]) : 1.0f;
#pragma unroll
        for (int jj = 0; jj < DJ; jj++) {
            int d = tid + jj * ATT_THREADS;
            if (d < D) oh[(size_t)h * D + d] = n > 0 ? mk_d_bf16r(oacc[h][jj] / den) : 0.0f;
        }
    }
}

/* HG heads per block; RW rows per warp in the scores (RW x HG values per lane for score_reduce:
 * 4 x HG up to 8 heads, 2 x 16 for 16 heads: the same tree per (row, head)); DJ output elements per
 * thread (D <= DJ x ATT_THREADS). */
/* MLP (tuning attn_mlp): the score loop loads 4 of a lane's D steps of its RW rows before their fmafs,
 * and the PV loop PB rows of a thread's outputs before theirs (16 with few heads per block, 8 else),
 * instead of what the compiler hoists from an unrolled loop. The fmaf chains keep their order (d
 * ascending per score, rows ascending per output): the same bits. Why: at batch 1 the kernel runs 64
 * blocks of one head, latency-bound on L2 reads of the gathered rows, and in a captured step the next
 * GEMV's early blocks stream their weights meanwhile, which lengthens every round trip (ktrace, session
 * 24: 22-48 us a launch in the graph against ncu's 11-15 us alone). */
template <int HG, bool MLP = false, int RW = (HG > 8 ? 2 : 4), int DJ = (HG > 8 ? 2 : ATT_MAXD / ATT_THREADS)>
__global__ void __launch_bounds__(ATT_THREADS) k_sparse_attn(const float *__restrict__ q, int H,
                                                             int D,
                                                             const float *const *__restrict__ rows,
                                                             const int32_t *__restrict__ row_start,
                                                             const float *__restrict__ sink,
                                                             float scale, float *__restrict__ o) {
    mk_d_pdl_launch_dependents(); /* launched with programmatic dependent launch: only the sinks */
    if (sink) mk_d_l2_prefetch_block(sink + blockIdx.x * HG, sizeof(float) * HG); /* before the wait */
    mk_d_pdl_wait();
    extern __shared__ float qs[];                 /* [HG][D] */
    __shared__ float sc[HG][ATT_CHUNK];           /* scores, then bf16 probabilities */
    __shared__ const float *rp[ATT_CHUNK];        /* the chunk's row pointers */
    __shared__ float s_m[HG], s_den[HG], s_corr[HG];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int t = blockIdx.y, h0 = blockIdx.x * HG;
    const int r0 = row_start[t], n = row_start[t + 1] - r0;
    for (int i = tid; i < HG * D; i += ATT_THREADS) qs[i] = q[((size_t)t * H + h0) * D + i];
    if (tid < HG) {
        s_m[tid] = -INFINITY;
        s_den[tid] = 0.0f;
    }
    float oacc[HG][DJ];
#pragma unroll
    for (int h = 0; h < HG; h++)
#pragma unroll
        for (int j = 0; j < DJ; j++) oacc[h][j] = 0.0f;
    __syncthreads();
    for (int b0 = 0; b0 < n; b0 += ATT_CHUNK) {
        const int nb = min(ATT_CHUNK, n - b0);
        for (int j = tid; j < nb; j += ATT_THREADS) rp[j] = rows[r0 + b0 + j];
        __syncthreads();
        /* scores: a warp per RW rows, lanes over D; the RW x HG partial sums of a lane are added
         * over the warp by a reduce-scatter (score_reduce), not a butterfly per (row, head) */
        for (int j0 = warp * RW; j0 < nb; j0 += ATT_THREADS / 32 * RW) {
            const float *kv[RW];
#pragma unroll
            for (int r = 0; r < RW; r++) kv[r] = rp[j0 + r < nb ? j0 + r : j0];
            float s[RW * HG];
#pragma unroll
            for (int i = 0; i < RW * HG; i++) s[i] = 0.0f;
            if (MLP) {
                constexpr int AU = 4; /* D steps loaded ahead */
                for (int d0 = lane; d0 < D; d0 += 32 * AU) {
                    float v[AU][RW];
#pragma unroll
                    for (int a = 0; a < AU; a++)
#pragma unroll
                        for (int r = 0; r < RW; r++) v[a][r] = d0 + 32 * a < D ? kv[r][d0 + 32 * a] : 0.0f;
#pragma unroll
                    for (int a = 0; a < AU; a++) {
                        const int d = d0 + 32 * a;
                        if (d < D) {
#pragma unroll
                            for (int h = 0; h < HG; h++) {
                                const float qv = qs[h * D + d];
#pragma unroll
                                for (int r = 0; r < RW; r++) s[r * HG + h] = fmaf(qv, v[a][r], s[r * HG + h]);
                            }
                        }
                    }
                }
            } else {
                for (int d = lane; d < D; d += 32) {
                    float v[RW];
#pragma unroll
                    for (int r = 0; r < RW; r++) v[r] = kv[r][d];
#pragma unroll
                    for (int h = 0; h < HG; h++) {
                        const float qv = qs[h * D + d];
#pragma unroll
                        for (int r = 0; r < RW; r++) s[r * HG + h] = fmaf(qv, v[r], s[r * HG + h]);
                    }
                }
            }
            int pi;
            const float tot = score_reduce<RW * HG>(s, lane, &pi);
            if (pi >= 0 && j0 + pi / HG < nb) sc[pi % HG][j0 + pi / HG] = __fmul_rn(tot, scale);
        }
        __syncthreads();
        att_softmax_chunk<HG>(sc, nb, s_m, s_den, s_corr, warp, lane);
        __syncthreads();
        /* PV */
        att_rescale<HG, DJ>(oacc, s_corr);
        if (MLP) {
            constexpr int PB = HG <= 2 ? 16 : 8; /* rows loaded ahead */
            for (int j0 = 0; j0 < nb; j0 += PB) {
                float v[PB][DJ];
#pragma unroll
                for (int b = 0; b < PB; b++) {
                    const float *kv = rp[j0 + b < nb ? j0 + b : j0];
#pragma unroll
                    for (int jj = 0; jj < DJ; jj++) {
                        const int d = tid + jj * ATT_THREADS;
                        v[b][jj] = j0 + b < nb && d < D ? kv[d] : 0.0f;
                    }
                }
#pragma unroll
                for (int b = 0; b < PB; b++) {
                    if (j0 + b < nb) {
#pragma unroll
                        for (int jj = 0; jj < DJ; jj++) {
                            if (tid + jj * ATT_THREADS < D) {
#pragma unroll
                                for (int h = 0; h < HG; h++) oacc[h][jj] = fmaf(sc[h][j0 + b], v[b][jj], oacc[h][jj]);
                            }
                        }
                    }
                }
            }
        } else {
#pragma unroll 8 /* the rows' loads in flight together (the fmaf chain per output stays in row order) */
            for (int j = 0; j < nb; j++) {
                const float *kv = rp[j];
#pragma unroll
                for (int jj = 0; jj < DJ; jj++) {
                    int d = tid + jj * ATT_THREADS;
                    if (d < D) {
                        float v = kv[d];
#pragma unroll
                        for (int h = 0; h < HG; h++) oacc[h][jj] = fmaf(sc[h][j], v, oacc[h][jj]);
                    }
                }
            }
        }
        __syncthreads(); /* sc and rp are rewritten by the next chunk */
    }
    att_store<HG, DJ>(oacc, s_den, s_m, sink, n, o + ((size_t)t * H + h0) * D, D, h0, tid);
}


/* Cluster (tuning attn_cluster; at most 4 heads per block and D a multiple of 16 up to 512: a decode's
 * launches): ATC_C blocks, a thread-block cluster, share what one k_sparse_attn block does, with the
 * same arithmetic in the same order (same bits). Why: at batch 1 a block of one head reads ~130-230
 * rows (2 KB each) twice, scores then PV, from L2 / HBM, one latency round per few rows: 22-33 us a
 * launch in a captured H100 step (ktrace, session 25; with PDL on or off, and with the rows staged in
 * shared memory by one block it was still 19-33 us: one SM's share of the L2 bandwidth). In the cluster
 * block `cr` computes the scores of the chunk's 32-row passes cr, cr + ATC_C, ... (a pass as in
 * k_sparse_attn: 8 warps x 4 rows, a lane's 16 D steps loaded before their fmafs); the blocks then read
 * the chunk's scores from each other's shared memory and each computes the softmax step (the same code on
 * the same values); the PV product of output elements [cr * D / ATC_C, ...) reads those columns of the
 * rows, copied into shared memory by cp.async from the chunk's start (ATC_PVR rows per buffer, two
 * buffers), and runs the same fmaf chain in row order. */
#define ATC_C 4                     /* blocks per cluster */
#define ATC_PVR 64                  /* rows per PV buffer */
#define ATC_DSMAX (512 / ATC_C)     /* columns per block: D <= 512 */
#define ATC_BUF_FLOATS (ATC_PVR * ATC_DSMAX)

/* Columns [d0, d0 + DS) of the chunk's rows [j0, j0 + ATC_PVR) (those below nb) into a PV buffer. */
__device__ __forceinline__ void atc_stage(float *buf, const float *const *rp, int j0, int nb, int d0, int DS, int tid) {
    const int c4 = DS >> 2, nr = min(ATC_PVR, nb - j0);
    for (int i = tid; i < nr * c4; i += ATT_THREADS) {
        const int r = i / c4, c = i - r * c4;
        const float *src = rp[j0 + r] + d0 + 4 * c;
        float *dst = buf + r * ATC_DSMAX + 4 * c;
        if (((uintptr_t)src & 15) == 0) {
            mk_d_cp_async16(dst, src, 16);
        } else {
#pragma unroll
            for (int e = 0; e < 4; e++) mk_d_cp_async4(dst + e, src + e, 4);
        }
    }
}

/* F16 (the tuning's attn_f16; D / ATC_C == 128: a block's quarter of a head is one 128-block of wo_a's
 * input row): the epilogue also prepares wo_a's input, mk_d_f16_prep_warp per (head, 128-block) by a
 * warp over the block's outputs (staged in qs, free by then): the same bits as k_f16_prep over o. */
template <int HG, bool F16 = false>
__global__ void __launch_bounds__(ATT_THREADS, 2) k_sparse_attn_cl(const float *__restrict__ q, int H, int D,
                                                                   const float *const *__restrict__ rows,
                                                                   const int32_t *__restrict__ row_start,
                                                                   const float *__restrict__ sink, float scale,
                                                                   float *__restrict__ o, __half *__restrict__ xh,
                                                                   float *__restrict__ sx, const mk_f16_rope ro) {
    constexpr int RW = 4, AU = 512 / 32; /* a lane's D steps of a row: all loaded before their fmafs */
    cg::cluster_group cl = cg::this_cluster();
    const int cr = (int)cl.block_rank();
    const int h0 = (blockIdx.x / ATC_C) * HG;
    mk_d_pdl_launch_dependents(); /* launched with programmatic dependent launch: only the sinks */
    if (sink && cr == 0) mk_d_l2_prefetch_block(sink + h0, sizeof(float) * HG); /* before the wait */
    mk_d_pdl_wait();
    extern __shared__ __align__(16) float atc_smem[];
    float *pvb = atc_smem;                     /* [2][ATC_PVR][ATC_DSMAX] */
    float *qs = atc_smem + 2 * ATC_BUF_FLOATS; /* [HG][D] */
    __shared__ float scl[HG][ATT_CHUNK];       /* the scores of this block's passes */
    __shared__ float sc[HG][ATT_CHUNK];        /* the chunk's scores, then bf16 probabilities */
    __shared__ const float *rp[ATT_CHUNK];
    __shared__ float s_m[HG], s_den[HG], s_corr[HG];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int t = blockIdx.y, DS = D / ATC_C, d0 = cr * DS;
    const int r0 = row_start[t], n = row_start[t + 1] - r0;
    for (int i = tid; i < HG * D; i += ATT_THREADS) qs[i] = q[((size_t)t * H + h0) * D + i];
    if (tid < HG) {
        s_m[tid] = -INFINITY;
        s_den[tid] = 0.0f;
    }
    float oacc[HG][1];
#pragma unroll
    for (int h = 0; h < HG; h++) oacc[h][0] = 0.0f;
    __syncthreads();
    for (int b0 = 0; b0 < n; b0 += ATT_CHUNK) {
        const int nb = min(ATT_CHUNK, n - b0);
        for (int j = tid; j < nb; j += ATT_THREADS) rp[j] = rows[r0 + b0 + j];
        __syncthreads();
        /* the PV columns of the first two buffers: in flight during the scores (one commit group per
         * buffer, empty ones too, so that wait<1> before buffer u means groups 0..u are done) */
        const int nsub = (nb + ATC_PVR - 1) / ATC_PVR;
        for (int u = 0; u < 2; u++) {
            if (u < nsub) atc_stage(pvb + u * ATC_BUF_FLOATS, rp, u * ATC_PVR, nb, d0, DS, tid);
            mk_d_cp_async_commit();
        }
        /* pass p to block (p + g) % ATC_C of head group g: the clusters do not all start on the same rows */
        const int g = blockIdx.x / ATC_C, p0 = ((cr - g) % ATC_C + ATC_C) % ATC_C;
        for (int j0 = p0 * ATT_THREADS / 32 * RW + warp * RW; j0 < nb; j0 += ATC_C * ATT_THREADS / 32 * RW) {
            const float *kv[RW];
#pragma unroll
            for (int r = 0; r < RW; r++) kv[r] = rp[j0 + r < nb ? j0 + r : j0];
            float s[RW * HG];
#pragma unroll
            for (int i = 0; i < RW * HG; i++) s[i] = 0.0f;
            float v[AU][RW];
#pragma unroll
            for (int a = 0; a < AU; a++)
#pragma unroll
                for (int r = 0; r < RW; r++) v[a][r] = lane + 32 * a < D ? kv[r][lane + 32 * a] : 0.0f;
#pragma unroll
            for (int a = 0; a < AU; a++) {
                const int d = lane + 32 * a;
                if (d < D) {
#pragma unroll
                    for (int h = 0; h < HG; h++) {
                        const float qv = qs[h * D + d];
#pragma unroll
                        for (int r = 0; r < RW; r++) s[r * HG + h] = fmaf(qv, v[a][r], s[r * HG + h]);
                    }
                }
            }
            int pi;
            const float tot = score_reduce<RW * HG>(s, lane, &pi);
            if (pi >= 0 && j0 + pi / HG < nb) scl[pi % HG][j0 + pi / HG] = __fmul_rn(tot, scale);
        }
        cl.sync(); /* every block's scores written */
        for (int i = tid; i < HG * nb; i += ATT_THREADS) {
            const int h = i / nb, j = i - h * nb;
            const float *src = cl.map_shared_rank(&scl[0][0], (unsigned)(((j >> 5) + g) % ATC_C));
            sc[h][j] = src[h * ATT_CHUNK + j];
        }
        cl.sync(); /* every block has read the others' scores (scl is rewritten by the next chunk) */
        att_softmax_chunk<HG>(sc, nb, s_m, s_den, s_corr, warp, lane);
        __syncthreads();
        att_rescale<HG, 1>(oacc, s_corr);
        for (int u = 0; u < nsub; u++) { /* PV: rows ascending, as k_sparse_attn */
            mk_d_cp_async_wait<1>();
            __syncthreads();
            float *buf = pvb + (u & 1) * ATC_BUF_FLOATS;
            const int nr = min(ATC_PVR, nb - u * ATC_PVR);
            if (tid < DS) {
#pragma unroll 8
                for (int b = 0; b < nr; b++) {
                    const int j = u * ATC_PVR + b;
                    const float v = buf[b * ATC_DSMAX + tid];
#pragma unroll
                    for (int h = 0; h < HG; h++) oacc[h][0] = fmaf(sc[h][j], v, oacc[h][0]);
                }
            }
            __syncthreads(); /* the buffer is read; refill it */
            if (u + 2 < nsub) atc_stage(buf, rp, (u + 2) * ATC_PVR, nb, d0, DS, tid);
            mk_d_cp_async_commit();
        }
        __syncthreads(); /* sc and rp are rewritten by the next chunk */
    }
    if (!F16) {
        if (tid < DS) {
#pragma unroll
            for (int h = 0; h < HG; h++) {
                const float den = n > 0 ? s_den[h] + expf(sink[h0 + h] - s_m[h]) : 1.0f;
                o[((size_t)t * H + h0 + h) * D + d0 + tid] = n > 0 ? mk_d_bf16r(oacc[h][0] / den) : 0.0f;
            }
        }
        return;
    }
    float *ov = qs; /* [HG][128]: the queries are no longer read (the last chunk's barriers passed) */
    if (tid < DS) {
#pragma unroll
        for (int h = 0; h < HG; h++) {
            const float den = n > 0 ? s_den[h] + expf(sink[h0 + h] - s_m[h]) : 1.0f;
            ov[h * 128 + tid] = n > 0 ? mk_d_bf16r(oacc[h][0] / den) : 0.0f;
        }
    }
    __syncthreads();
    const int k = H * D;
    for (int h = warp; h < HG; h += ATT_THREADS / 32) {
        const int b = ((h0 + h) * D + d0) >> 7;
        float *xr = o + (size_t)t * k + (size_t)b * 128;
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) v[j] = ov[h * 128 + lane * 4 + j];
        mk_d_f16_prep_warp(v, xr, t, k, b, lane, xh, sx, ro);
#pragma unroll
        for (int j = 0; j < 4; j++) xr[lane * 4 + j] = v[j]; /* o as k_f16_prep leaves it (rotated) */
    }
}

struct attn_f16_args {
    uint16_t *xh;
    float *sx;
    mk_f16_rope ro;
};

template <int HG>
static int attn_launch(mk_cuda_ctx *ctx, const float *q, int T, int H, int D,
                       const float *const *rows, const int32_t *row_start, const float *sink,
                       float scale, float *o, const attn_f16_args *f, mk_err *err) {
    /* opt in once for the largest D (the bit is per kernel, so the size must not grow later) */
    size_t smem = sizeof(float) * HG * D;
    unsigned bit = HG == 16 ? MK_OPTIN_ATTN16 : HG == 8 ? MK_OPTIN_ATTN8 : HG == 4 ? MK_OPTIN_ATTN4
                 : HG == 2  ? MK_OPTIN_ATTN2 : MK_OPTIN_ATTN1;
    /* (HG = 16 takes D <= 512, but its static arrays and 32 KB of queries also need the opt-in) */
    if (HG <= 4 && ctx->tune.attn_cluster && D <= 512 && D % (4 * ATC_C) == 0) {
        constexpr int HC = HG <= 4 ? HG : 4; /* (instantiated for the small groups only) */
        const size_t dyn = sizeof(float) * (2 * ATC_BUF_FLOATS + HC * 512);
        const unsigned cbit = HC == 4 ? MK_OPTIN_ATTN4_CL : HC == 2 ? MK_OPTIN_ATTN2_CL : MK_OPTIN_ATTN1_CL;
        const size_t stat = sizeof(float) * (2 * HC * ATT_CHUNK + 3 * HC) + sizeof(void *) * ATT_CHUNK;
        mk_err oe;
        if (f && D / ATC_C == 128) { /* with wo_a's input preparation in the epilogue */
            const unsigned fbit = HC == 4 ? MK_OPTIN_ATTN4_CLF : HC == 2 ? MK_OPTIN_ATTN2_CLF : MK_OPTIN_ATTN1_CLF;
            if (dyn + stat <= ctx->caps.smem_optin &&
                mk_cuda_smem_optin(ctx, fbit, (const void *)k_sparse_attn_cl<HC, true>, dyn, &oe) == MK_OK) {
                (void)mk_cuda_launch_cluster(ctx, dim3(ATC_C * (H / HG), T), ATT_THREADS,
                                             sizeof(float) * (2 * ATC_BUF_FLOATS + HC * D), ATC_C, 1,
                                             k_sparse_attn_cl<HC, true>, q, H, D, rows, row_start, sink, scale, o,
                                             (__half *)f->xh, f->sx, f->ro);
                MK_CU_LAUNCHED(err, "cuda: sparse attention (cluster, wo_a's input) launch");
                return MK_OK;
            }
        }
        if (!f && dyn + stat <= ctx->caps.smem_optin && /* else the one-block kernels */
            mk_cuda_smem_optin(ctx, cbit, (const void *)k_sparse_attn_cl<HC>, dyn, &oe) == MK_OK) {
            (void)mk_cuda_launch_cluster(ctx, dim3(ATC_C * (H / HG), T), ATT_THREADS,
                                         sizeof(float) * (2 * ATC_BUF_FLOATS + HC * D), ATC_C, 1, k_sparse_attn_cl<HC>,
                                         q, H, D, rows, row_start, sink, scale, o, (__half *)NULL, (float *)NULL,
                                         mk_f16_rope{});
            MK_CU_LAUNCHED(err, "cuda: sparse attention (cluster) launch");
            return MK_OK;
        }
    }
    if (f) return mk_fail(err, MK_ENOTSUP, "cuda: sparse attention: wo_a's input only from the cluster kernel with D 512");
    const bool mlp = ctx->tune.attn_mlp && HG <= 4; /* few heads per block: a decode's latency-bound launches */
    const void *fn = mlp ? (const void *)k_sparse_attn<HG, true> : (const void *)k_sparse_attn<HG>;
    if (mlp) bit = HG == 4 ? MK_OPTIN_ATTN4_MLP : HG == 2 ? MK_OPTIN_ATTN2_MLP : MK_OPTIN_ATTN1_MLP;
    int st = mk_cuda_smem_optin(ctx, bit, fn, sizeof(float) * HG * ATT_MAXD, err);
    if (st) return st;
    dim3 grid(H / HG, T);
    if (mlp)
        (void)mk_cuda_launch_pdl(ctx, grid, ATT_THREADS, smem, k_sparse_attn<HG, true>, q, H, D, rows, row_start, sink,
                                 scale, o);
    else
        (void)mk_cuda_launch_pdl(ctx, grid, ATT_THREADS, smem, k_sparse_attn<HG>, q, H, D, rows, row_start, sink, scale,
                                 o);
    MK_CU_LAUNCHED(err, "cuda: sparse attention launch");
    return MK_OK;
}

static int sparse_attn(mk_cuda_ctx *ctx, const float *q, int T, int H, int D, const float *const *rows,
                       const int32_t *row_start, const float *sink, float scale, float *o, const attn_f16_args *f,
                       mk_err *err) {
    if (T <= 0 || H <= 0) return MK_OK;
    if (D < 1 || D > ATT_MAXD)
        return mk_fail(err, MK_ENOTSUP, "cuda: sparse attention: D = %d (1..%d)", D, ATT_MAXD);
    /* 16 or 8 heads per block when the queries fit comfortably in shared memory and the grid still
     * fills the GPU; fewer for few tokens (a decode): a head's arithmetic does not depend on the group */
    const long fill = ctx->caps.sm_count > 0 ? ctx->caps.sm_count : 1;
    if (ctx->tune.attn_cluster && D <= 512 && D % (4 * ATC_C) == 0 && (long)T * (H / 8) < fill && H % 4 == 0) {
        /* the cluster kernel where the cascade below takes at most 4 heads a block: the fewest heads
         * per block whose clusters all fit in one wave (a batch-1 step: 2 heads, 128 blocks; with 1,
         * the 256 blocks' last ones started ~10 us after the previous kernel ended, session 25) */
        int hg = 1;
        while (hg < 4 && (long)ATC_C * T * (H / hg) > fill) hg *= 2;
        const int force = ctx->tune.attn_cluster_hg; /* benchmarks: 1, 2 or 4 heads a block */
        if ((force == 1 || force == 2 || force == 4) && H % force == 0) hg = force;
        if (hg == 1) return attn_launch<1>(ctx, q, T, H, D, rows, row_start, sink, scale, o, f, err);
        if (hg == 2) return attn_launch<2>(ctx, q, T, H, D, rows, row_start, sink, scale, o, f, err);
        return attn_launch<4>(ctx, q, T, H, D, rows, row_start, sink, scale, o, f, err);
    }
    if (f) return mk_fail(err, MK_ENOTSUP, "cuda: sparse attention: wo_a's input only from the cluster kernel");
    if (ctx->tune.attn16 && H % 16 == 0 && D <= 512 && (long)T * (H / 16) >= fill) /* rows read half as often */
        return attn_launch<16>(ctx, q, T, H, D, rows, row_start, sink, scale, o, f, err);
    if (H % 8 == 0 && D <= 512 && (long)T * (H / 8) >= fill)
        return attn_launch<8>(ctx, q, T, H, D, rows, row_start, sink, scale, o, f, err);
    if (H % 4 == 0 && (long)T * (H / 4) >= fill)
        return attn_launch<4>(ctx, q, T, H, D, rows, row_start, sink, scale, o, f, err);
    if (H % 2 == 0 && (long)T * (H / 2) >= fill)
        return attn_launch<2>(ctx, q, T, H, D, rows, row_start, sink, scale, o, f, err);
    return attn_launch<1>(ctx, q, T, H, D, rows, row_start, sink, scale, o, f, err);
}

extern "C" int mk_cuda_sparse_attn(mk_cuda_ctx *ctx, const float *q, int T, int H, int D,
                                   const float *const *rows, const int32_t *row_start,
                                   const float *sink, float scale, float *o, mk_err *err) {
    return sparse_attn(ctx, q, T, H, D, rows, row_start, sink, scale, o, NULL, err);
}

extern "C" int mk_cuda_sparse_attn_f16(mk_cuda_ctx *ctx, const float *q, int T, int H, int D,
                                       const float *const *rows, const int32_t *row_start, const float *sink,
                                       float scale, float *o, uint16_t *xh, float *sx,
                                       const mk_cuda_rope_at_desc *rd, mk_err *err) {
    if (!ctx->tune.attn_f16 || !xh || !sx)
        return mk_fail(err, MK_ENOTSUP, "cuda: sparse attention with wo_a's input: off (tuning attn_f16)");
    attn_f16_args f = {xh, sx, {}};
    if (rd) { /* heads of D rotated as wo_a's own preparation would */
        if (rd->D != D) return mk_fail(err, MK_EINVAL, "cuda: sparse attention with rope: heads of %d, not %d", rd->D, D);
        const int st = mk_f16_rope_of(rd, H * D, &f.ro, err);
        if (st) return st;
    }
    return sparse_attn(ctx, q, T, H, D, rows, row_start, sink, scale, o, &f, err);
}
