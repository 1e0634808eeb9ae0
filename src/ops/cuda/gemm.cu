/* gemm.cu — block-scaled FP8 GEMM for m > 8 activation rows (prefill, batched decode), and the
 * cuBLAS bf16 GEMM used for bf16 weights at m > 8.
 *
 * FP8: C[m, n] = sum over 128-blocks kb of (sum_{k in kb} xq[m, k] w[n, k]) * sa[m, kb] * sb[n/128, kb]
 * (the reference's fp8_gemm). A block computes a BM x 128 tile of C (BM = 64 or 128 tokens,
 * 128 weight rows = one weight scale row, so sb is one scalar per kb), 8 warps as 2 x 4, each a
 * (BM/2) x 32 sub-tile of m16n8k32 e4m3 MMAs. Per kb the A (activations) and B (weights) tiles,
 * 128 bytes wide, arrive in shared memory by cp.async three stages ahead; 16-byte chunks are
 * XOR-swizzled by row so ldmatrix reads them without bank conflicts. The four k32 slices of a
 * block are summed into a zeroed partial, which is then scaled (sa from shared memory, sb) into
 * the fp32 accumulators — the reference's promotion per 128-block. When the tile grid would leave
 * SMs idle, K is split over gridDim.z and the partial results are summed in fixed order by a
 * second kernel (deterministic).
 *
 * This is mma.sync, not wgmma: simpler and portable to sm_100a, but short of Hopper's peak; a
 * wgmma/TMA version is the next step for prefill.
 */
#include "ops/cuda/cuda_common.cuh"

#ifndef MK_HAVE_CUBLAS
#define MK_HAVE_CUBLAS 1
#endif
#if MK_HAVE_CUBLAS
#include <cublas_v2.h>
#endif

#define G_STAGES 3

template <int BM> static constexpr size_t gemm_smem_bytes(void) {
    return (size_t)G_STAGES * (BM * 128 + 128 * 128 + BM * 4);
}

/* Queues the cp.async copies of block kb: A rows m0.. (zero-filled past M), B rows n0.., sa. */
template <int BM>
__device__ __forceinline__ void gemm_load(uint8_t *As, uint8_t *Bs, float *Ss,
                                          const uint8_t *__restrict__ A,
                                          const float *__restrict__ sa,
                                          const uint8_t *__restrict__ B, int M, int K, int nb,
                                          int m0, int n0, int kb, int tid) {
#pragma unroll
    for (int i = 0; i < BM * 8 / 256; i++) {
        int id = tid + i * 256, r = id >> 3, c = id & 7, row = m0 + r;
        const uint8_t *src = A + (size_t)(row < M ? row : 0) * K + (size_t)kb * 128 + c * 16;
        mk_d_cp_async16(As + r * 128 + ((c ^ (r & 7)) << 4), src, row < M ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < 128 * 8 / 256; i++) {
        int id = tid + i * 256, r = id >> 3, c = id & 7;
        const uint8_t *src = B + (size_t)(n0 + r) * K + (size_t)kb * 128 + c * 16;
        mk_d_cp_async16(Bs + r * 128 + ((c ^ (r & 7)) << 4), src, 16);
    }
    if (tid < BM) {
        int row = m0 + tid;
        mk_d_cp_async4(Ss + tid, sa + (size_t)(row < M ? row : 0) * nb + kb, row < M ? 4 : 0);
    }
}

/* A = xq e4m3 [M, K], sa [M, K/128], B = W e4m3 [N, K], Sb e8m0 [N/128, K/128].
 * Grid (N/128, ceil(M/BM), splits); split z covers blocks [z * per, (z + 1) * per). */
template <int BM>
__global__ void __launch_bounds__(256) k_gemm_fp8(const uint8_t *__restrict__ A,
                                                  const float *__restrict__ sa,
                                                  const uint8_t *__restrict__ B,
                                                  const uint8_t *__restrict__ Sb, int M, int N,
                                                  int K, int per, float *__restrict__ Y,
                                                  float *__restrict__ ws, int round) {
    extern __shared__ __align__(128) uint8_t smem[];
    constexpr int WM = BM / 2, MT = WM / 16, NT = 4;
    uint8_t *As = smem;
    uint8_t *Bs = smem + G_STAGES * BM * 128;
    float *Ss = (float *)(Bs + G_STAGES * 128 * 128);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 2, wn = warp & 3;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 128, m0 = blockIdx.y * BM;
    const int nb = K >> 7;
    const int kbeg = blockIdx.z * per;
    const int nk = min(nb, kbeg + per) - kbeg;

    float tot[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) tot[mt][nt][0] = tot[mt][nt][1] = tot[mt][nt][2] = tot[mt][nt][3] = 0.0f;

#pragma unroll
    for (int s = 0; s < G_STAGES - 1; s++) {
        if (s < nk)
            gemm_load<BM>(As + s * BM * 128, Bs + s * 128 * 128, Ss + s * BM, A, sa, B, M, K, nb, m0,
                          n0, kbeg + s, tid);
        mk_d_cp_async_commit();
    }
    for (int it = 0; it < nk; it++) {
        mk_d_cp_async_wait<G_STAGES - 2>();
        __syncthreads(); /* stage it is visible; stage it-1 is no longer read by anyone */
        int nx = it + G_STAGES - 1;
        if (nx < nk) {
            int sn = nx % G_STAGES;
            gemm_load<BM>(As + sn * BM * 128, Bs + sn * 128 * 128, Ss + sn * BM, A, sa, B, M, K, nb,
                          m0, n0, kbeg + nx, tid);
        }
        mk_d_cp_async_commit();
        const int st = it % G_STAGES;
        const uint8_t *as = As + st * BM * 128, *bs = Bs + st * 128 * 128;
        const float *ss = Ss + st * BM;
        float part[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) part[mt][nt][0] = part[mt][nt][1] = part[mt][nt][2] = part[mt][nt][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < 4; ks++) {
            uint32_t af[MT][4], bf[NT][2];
            const int mi = lane >> 3;
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                int r = wm * WM + mt * 16 + (mi & 1) * 8 + (lane & 7);
                int c = ks * 2 + (mi >> 1);
                mk_d_ldmatrix_x4(af[mt], as + r * 128 + ((c ^ (r & 7)) << 4));
            }
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                int r = wn * 32 + np * 16 + (mi >> 1) * 8 + (lane & 7);
                int c = ks * 2 + (mi & 1);
                uint32_t q[4];
                mk_d_ldmatrix_x4(q, bs + r * 128 + ((c ^ (r & 7)) << 4));
                bf[2 * np][0] = q[0];
                bf[2 * np][1] = q[1];
                bf[2 * np + 1][0] = q[2];
                bf[2 * np + 1][1] = q[3];
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
                    mk_d_mma_e4m3(part[mt][nt], af[mt][0], af[mt][1], af[mt][2], af[mt][3],
                                  bf[nt][0], bf[nt][1]);
        }
        const float sb = mk_d_e8m0(Sb[(size_t)(n0 >> 7) * nb + kbeg + it]);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            /* powers of two: part * (sa * sb) == (part * sa) * sb exactly */
            float slo = ss[wm * WM + mt * 16 + g] * sb, shi = ss[wm * WM + mt * 16 + g + 8] * sb;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                tot[mt][nt][0] = fmaf(part[mt][nt][0], slo, tot[mt][nt][0]);
                tot[mt][nt][1] = fmaf(part[mt][nt][1], slo, tot[mt][nt][1]);
                tot[mt][nt][2] = fmaf(part[mt][nt][2], shi, tot[mt][nt][2]);
                tot[mt][nt][3] = fmaf(part[mt][nt][3], shi, tot[mt][nt][3]);
            }
        }
    }
    mk_d_cp_async_wait<0>();

    const bool split = gridDim.z > 1;
    float *out = split ? ws + (size_t)blockIdx.z * M * N : Y;
    const int rnd = split ? 0 : round;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        int rlo = m0 + wm * WM + mt * 16 + g, rhi = rlo + 8;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            int col = n0 + wn * 32 + nt * 8 + 2 * t;
            if (rlo < M)
                *(float2 *)(out + (size_t)rlo * N + col) =
                    make_float2(rnd ? mk_d_bf16r(tot[mt][nt][0]) : tot[mt][nt][0],
                                rnd ? mk_d_bf16r(tot[mt][nt][1]) : tot[mt][nt][1]);
            if (rhi < M)
                *(float2 *)(out + (size_t)rhi * N + col) =
                    make_float2(rnd ? mk_d_bf16r(tot[mt][nt][2]) : tot[mt][nt][2],
                                rnd ? mk_d_bf16r(tot[mt][nt][3]) : tot[mt][nt][3]);
        }
    }
}

/* Y = sum over splits of ws (in split order), rounded if asked. */
__global__ void k_splitk_sum(const float *__restrict__ ws, int splits, size_t mn,
                             float *__restrict__ Y, int round) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < mn;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = ws[i];
        for (int z = 1; z < splits; z++) s += ws[(size_t)z * mn + i];
        Y[i] = round ? mk_d_bf16r(s) : s;
    }
}

int mk_cuda_gemm_fp8_splits(const mk_cuda_ctx *ctx, int m, int n, int k) {
    int bm = m <= 64 ? 64 : 128;
    int nb = k / 128;
    long tiles = (long)((m + bm - 1) / bm) * (n / 128);
    int sms = ctx->caps.sm_count > 0 ? ctx->caps.sm_count : 1;
    if (tiles >= sms || nb <= 1) return 1;
    /* at most one wave: a partial second wave costs as much as a full one */
    int s = (int)(sms / tiles);
    if (s > 8) s = 8;
    if (s > nb) s = nb;
    int per = (nb + s - 1) / s;
    return (nb + per - 1) / per;
}

int mk_cuda_gemm_fp8(mk_cuda_ctx *ctx, const mk_wmat *W, const uint8_t *xq, const float *sa, int m,
                     float *y, int round, float *ws, mk_err *err) {
    int n = W->n, k = W->k;
    if (m < 1 || n % 128 || k % 128)
        return mk_fail(err, MK_ENOTSUP, "cuda: fp8 gemm: needs n %% 128 == 0 and k %% 128 == 0 "
                       "(m %d, n %d, k %d)", m, n, k);
    int splits = mk_cuda_gemm_fp8_splits(ctx, m, n, k);
    if (splits > 1 && !ws) return mk_fail(err, MK_EINVAL, "cuda: fp8 gemm: split-K needs a workspace");
    int nb = k / 128, per = (nb + splits - 1) / splits;
    const uint8_t *w = (const uint8_t *)W->w;
    if (m <= 64) {
        size_t sm = gemm_smem_bytes<64>();
        int st = mk_cuda_smem_optin(ctx, MK_OPTIN_GEMM64, (const void *)k_gemm_fp8<64>, sm, err);
        if (st) return st;
        dim3 grid(n / 128, (m + 63) / 64, splits);
        k_gemm_fp8<64><<<grid, 256, sm, ctx->stream>>>(xq, sa, w, W->scale, m, n, k, per, y, ws, round);
    } else {
        size_t sm = gemm_smem_bytes<128>();
        int st = mk_cuda_smem_optin(ctx, MK_OPTIN_GEMM128, (const void *)k_gemm_fp8<128>, sm, err);
        if (st) return st;
        dim3 grid(n / 128, (m + 127) / 128, splits);
        k_gemm_fp8<128><<<grid, 256, sm, ctx->stream>>>(xq, sa, w, W->scale, m, n, k, per, y, ws, round);
    }
    MK_CU_LAUNCHED(err, "cuda: fp8 gemm launch");
    if (splits > 1) {
        size_t mn = (size_t)m * n;
        unsigned blocks = (unsigned)((mn + 255) / 256);
        if (blocks > 65535u * 8) blocks = 65535u * 8;
        k_splitk_sum<<<blocks, 256, 0, ctx->stream>>>(ws, splits, mn, y, round);
        MK_CU_LAUNCHED(err, "cuda: split-K sum launch");
    }
    return MK_OK;
}

int mk_cuda_gemm_bf16_cublas(mk_cuda_ctx *ctx, const mk_wmat *W, const uint16_t *xb, int m,
                             float *y, int round, mk_err *err) {
#if MK_HAVE_CUBLAS
    if (!ctx->cublas) return mk_fail(err, MK_ENOTSUP, "cuda: bf16 gemm: no cuBLAS handle");
    /* Column-major view: y^T [n, m] = W [n, k] (stored as k x n, transposed) x x^T [k, m]. */
    const float alpha = 1.0f, beta = 0.0f;
    cublasStatus_t s = cublasGemmEx((cublasHandle_t)ctx->cublas, CUBLAS_OP_T, CUBLAS_OP_N, W->n, m,
                                    W->k, &alpha, W->w, CUDA_R_16BF, W->k, xb, CUDA_R_16BF, W->k,
                                    &beta, y, CUDA_R_32F, W->n, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS)
        return mk_fail(err, MK_EINTERNAL, "cuda: cublasGemmEx (bf16, m %d n %d k %d) failed: status %d",
                       m, W->n, W->k, (int)s);
    if (round) return mk_cuda_round_bf16_launch(ctx, y, (size_t)m * W->n, err);
    return MK_OK;
#else
    (void)ctx; (void)W; (void)xb; (void)m; (void)y; (void)round;
    return mk_fail(err, MK_ENOTSUP, "cuda: built without cuBLAS (bf16 gemm)");
#endif
}

/* ---- wgmma probe ---------------------------------------------------------------------------
 * Can a wgmma GEMM give the engine's bits? The GEMVs and the row-invariant GEMMs sum a 128-block
 * as four chained m16n8k32 e4m3 MMAs (mma.sync) from zero, and a row's bits must not depend on the
 * kernel that computed it, so a wgmma (sm_90a warpgroup MMA) prefill GEMM is usable only if
 * wgmma.m64n8k32 gives the same bits as mma.sync for the same operands in the same k slots: the
 * tensor core's internal accumulation decides, which no document states. One block of 128 threads
 * computes a 64 x 8 x 128 product both ways: four wgmma steps (A and B K-major in shared memory,
 * no swizzle: 8-row x 16-byte core matrices of 128 bytes, the K-adjacent one 128 bytes on, the
 * M/N-adjacent one 256 bytes on; a generic-to-async proxy fence before the first), and each warp
 * its 16 rows by four chained mma.sync with the standard fragments. */
__global__ void k_probe_wgmma(const uint8_t *__restrict__ A, const uint8_t *__restrict__ B, float *__restrict__ yw,
                              float *__restrict__ ym) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __shared__ __align__(128) uint8_t As[4][64 * 32];
    __shared__ __align__(128) uint8_t Bs[4][8 * 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    for (int i = tid; i < 4 * 64 * 32; i += 128) { /* A [64][128]: step s = k / 32 */
        const int s = i >> 11, r = (i >> 5) & 63, c = i & 31;
        As[s][(r >> 3) * 256 + (c >> 4) * 128 + (r & 7) * 16 + (c & 15)] = A[r * 128 + s * 32 + c];
    }
    for (int i = tid; i < 4 * 8 * 32; i += 128) { /* B [8][128] (the 8 columns, K-major) */
        const int s = i >> 8, r = (i >> 5) & 7, c = i & 31;
        Bs[s][(c >> 4) * 128 + r * 16 + (c & 15)] = B[r * 128 + s * 32 + c];
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int s = 0; s < 4; s++) {
        const uint64_t da = mk_d_wgmma_desc(As[s]), db = mk_d_wgmma_desc(Bs[s]);
        if (s == 0)
            asm volatile("wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, %4, %5, 0, 1, 1;\n"
                         : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                         : "l"(da), "l"(db)
                         : "memory");
        else
            asm volatile("wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, %4, %5, 1, 1, 1;\n"
                         : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                         : "l"(da), "l"(db)
                         : "memory");
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    const int r0 = warp * 16 + g;
    yw[r0 * 8 + 2 * t] = d[0], yw[r0 * 8 + 2 * t + 1] = d[1];
    yw[(r0 + 8) * 8 + 2 * t] = d[2], yw[(r0 + 8) * 8 + 2 * t + 1] = d[3];
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int s = 0; s < 4; s++) {
        const uint8_t *a0 = A + (size_t)r0 * 128 + s * 32, *a1 = a0 + 8 * 128, *b = B + (size_t)g * 128 + s * 32;
        mk_d_mma_e4m3(c, *(const uint32_t *)(a0 + 4 * t), *(const uint32_t *)(a1 + 4 * t),
                      *(const uint32_t *)(a0 + 16 + 4 * t), *(const uint32_t *)(a1 + 16 + 4 * t),
                      *(const uint32_t *)(b + 4 * t), *(const uint32_t *)(b + 16 + 4 * t));
    }
    ym[r0 * 8 + 2 * t] = c[0], ym[r0 * 8 + 2 * t + 1] = c[1];
    ym[(r0 + 8) * 8 + 2 * t] = c[2], ym[(r0 + 8) * 8 + 2 * t + 1] = c[3];
#endif
}

int mk_cuda_probe_wgmma_e4m3(mk_cuda_ctx *ctx, const uint8_t *A, const uint8_t *B, float *yw, float *ym, mk_err *err) {
    if (ctx->caps.cc_major != 9)
        return mk_fail(err, MK_ENOTSUP, "cuda: wgmma probe: sm_90a only (this device is %d.%d)", ctx->caps.cc_major,
                       ctx->caps.cc_minor);
    uint8_t *dA = NULL, *dB = NULL;
    float *dw = NULL, *dm = NULL;
    int st = mk_cuda_alloc(ctx, 64 * 128, (void **)&dA, err);
    if (!st) st = mk_cuda_alloc(ctx, 8 * 128, (void **)&dB, err);
    if (!st) st = mk_cuda_alloc(ctx, sizeof(float) * 64 * 8, (void **)&dw, err);
    if (!st) st = mk_cuda_alloc(ctx, sizeof(float) * 64 * 8, (void **)&dm, err);
    if (!st) st = mk_cuda_upload(ctx, dA, A, 64 * 128, err);
    if (!st) st = mk_cuda_upload(ctx, dB, B, 8 * 128, err);
    if (!st) {
        k_probe_wgmma<<<1, 128, 0, ctx->stream>>>(dA, dB, dw, dm);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) st = mk_cuda_fail(err, e, "cuda: wgmma probe launch");
    }
    if (!st) st = mk_cuda_download(ctx, yw, dw, sizeof(float) * 64 * 8, err);
    if (!st) st = mk_cuda_download(ctx, ym, dm, sizeof(float) * 64 * 8, err);
    mk_cuda_free(ctx, dA), mk_cuda_free(ctx, dB), mk_cuda_free(ctx, dw), mk_cuda_free(ctx, dm);
    return st;
}

/* ---- f16 MMA probe (mk_cuda_probe_mma_f16) ---------------------------------------------------
 * One warp per tile: the e4m3 MMA with the standard fragments, then each way's two f16 MMAs. Way v's
 * half h holds 16 of the 32 k (half 0 is taken first when v is odd, half 1 when v is even); its
 * logical slot j (the f16 fragment's k) is pf16_k(v, h, j); both operands use the same map, so every
 * way sums the same exact products. */
__device__ __forceinline__ int pf16_k(int v, int h, int j) {
    if (v <= 2) return 16 * h + j;
    if (v <= 4 || v == 7) return (j >> 1) * 4 + 2 * h + (j & 1);
    return 2 * j + h;
}
__device__ __forceinline__ uint32_t pf16_pair(const uint8_t *p, int k0, int k1) {
    return mk_d_e4m3x2_to_f16x2((uint32_t)p[k0] | ((uint32_t)p[k1] << 8));
}
__global__ void k_probe_mma_f16(int nt, const uint8_t *__restrict__ A, const uint8_t *__restrict__ B,
                                const float *__restrict__ C, float *__restrict__ out) {
    const int tile = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    if (tile >= nt) return;
    const uint8_t *a = A + (size_t)tile * 16 * 32, *b = B + (size_t)tile * 8 * 32;
    const float *ct = C + (size_t)tile * 128;
    float *o = out + (size_t)tile * (1 + MK_CUDA_PROBE_F16_WAYS) * 128;
    for (int v = 0; v <= MK_CUDA_PROBE_F16_WAYS; v++) {
        float c[4] = {ct[g * 8 + 2 * t], ct[g * 8 + 2 * t + 1], ct[(g + 8) * 8 + 2 * t], ct[(g + 8) * 8 + 2 * t + 1]};
        if (v == 0) {
            mk_d_mma_e4m3(c, *(const uint32_t *)(a + g * 32 + 4 * t), *(const uint32_t *)(a + (g + 8) * 32 + 4 * t),
                          *(const uint32_t *)(a + g * 32 + 16 + 4 * t), *(const uint32_t *)(a + (g + 8) * 32 + 16 + 4 * t),
                          *(const uint32_t *)(b + g * 32 + 4 * t), *(const uint32_t *)(b + g * 32 + 16 + 4 * t));
        } else {
            const float c0[4] = {c[0], c[1], c[2], c[3]};
            if (v == 7) c[0] = c[1] = c[2] = c[3] = 0.0f;
            for (int step = 0; step < 2; step++) {
                const int h = (v & 1) ? step : 1 - step;
                const int k0 = pf16_k(v, h, 2 * t), k1 = pf16_k(v, h, 2 * t + 1);
                const int k8 = pf16_k(v, h, 2 * t + 8), k9 = pf16_k(v, h, 2 * t + 9);
                const uint8_t *ra = a + g * 32, *rb = a + (g + 8) * 32, *cb = b + g * 32;
                mk_d_mma_f16(c, pf16_pair(ra, k0, k1), pf16_pair(rb, k0, k1), pf16_pair(ra, k8, k9), pf16_pair(rb, k8, k9),
                             pf16_pair(cb, k0, k1), pf16_pair(cb, k8, k9));
            }
            if (v == 7)
                for (int i = 0; i < 4; i++) c[i] = __fadd_rn(c0[i], c[i]);
        }
        float *ov = o + (size_t)v * 128;
        ov[g * 8 + 2 * t] = c[0], ov[g * 8 + 2 * t + 1] = c[1];
        ov[(g + 8) * 8 + 2 * t] = c[2], ov[(g + 8) * 8 + 2 * t + 1] = c[3];
    }
}

int mk_cuda_probe_mma_f16(mk_cuda_ctx *ctx, int nt, const uint8_t *A, const uint8_t *B, const float *C, float *out,
                          mk_err *err) {
    if (nt < 1) return mk_fail(err, MK_EINVAL, "cuda: f16 mma probe: needs at least one tile (nt %d)", nt);
    const size_t na = (size_t)nt * 16 * 32, nb = (size_t)nt * 8 * 32, nc = sizeof(float) * (size_t)nt * 128;
    const size_t no = sizeof(float) * (size_t)nt * (1 + MK_CUDA_PROBE_F16_WAYS) * 128;
    uint8_t *dA = NULL, *dB = NULL;
    float *dC = NULL, *dO = NULL;
    int st = mk_cuda_alloc(ctx, na, (void **)&dA, err);
    if (!st) st = mk_cuda_alloc(ctx, nb, (void **)&dB, err);
    if (!st) st = mk_cuda_alloc(ctx, nc, (void **)&dC, err);
    if (!st) st = mk_cuda_alloc(ctx, no, (void **)&dO, err);
    if (!st) st = mk_cuda_upload(ctx, dA, A, na, err);
    if (!st) st = mk_cuda_upload(ctx, dB, B, nb, err);
    if (!st) st = mk_cuda_upload(ctx, dC, C, nc, err);
    if (!st) {
        k_probe_mma_f16<<<(nt + 3) / 4, 128, 0, ctx->stream>>>(nt, dA, dB, dC, dO);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) st = mk_cuda_fail(err, e, "cuda: f16 mma probe launch");
    }
    if (!st) st = mk_cuda_download(ctx, out, dO, no, err);
    mk_cuda_free(ctx, dA), mk_cuda_free(ctx, dB), mk_cuda_free(ctx, dC), mk_cuda_free(ctx, dO);
    return st;
}

/* ---- wgmma shape probe (mk_cuda_probe_wgmma_shapes) -------------------------------------------
 * Would a wgmma path give each output the same bits whatever the call's shape? A decode would run
 * m64n8k32 (one column used) and a prefill m64nNk32 with N up to 256, and a decode GEMV would rather
 * keep its weights in registers (wgmma's RS form: A from registers) than stage them. One block of 128
 * threads computes the 64 x 8 product over k = 128 (four chained k32 steps, the first from zero) as
 * m64n8k32 with A and B in shared memory, as m64n64k32 (B's first 8 rows = those 8 columns) and as
 * m64n8k32 with A from registers (the mma.sync fragment: a0 row g, k 4t..4t+3; a1 row g + 8; a2 / a3
 * k 16 + 4t..), storing each after the first step and after the fourth. */
__global__ void k_probe_wgmma_shapes(const uint8_t *__restrict__ A, const uint8_t *__restrict__ B,
                                     float *__restrict__ out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    __shared__ __align__(128) uint8_t As[4][64 * 32];
    __shared__ __align__(128) uint8_t Bs[4][64 * 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    for (int i = tid; i < 4 * 64 * 32; i += 128) { /* A [64][128] and B [64][128], step s = k / 32 */
        const int s = i >> 11, r = (i >> 5) & 63, c = i & 31, o = (r >> 3) * 256 + (c >> 4) * 128 + (r & 7) * 16 + (c & 15);
        As[s][o] = A[r * 128 + s * 32 + c];
        Bs[s][o] = B[r * 128 + s * 32 + c];
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int r0 = warp * 16 + g;
    /* out slot v (0..5) is [64][64]: v 0 / 1 n8 after step 1 / 4, 2 / 3 n64, 4 / 5 n8 with A in registers */
    auto put8 = [&](int v, const float (&d)[4]) {
        float *o = out + (size_t)v * 64 * 64;
        o[r0 * 64 + 2 * t] = d[0], o[r0 * 64 + 2 * t + 1] = d[1];
        o[(r0 + 8) * 64 + 2 * t] = d[2], o[(r0 + 8) * 64 + 2 * t + 1] = d[3];
    };
    { /* n8, both in shared memory */
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int s = 0; s < 4; s++) {
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
            if (s == 0)
                asm volatile("wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, %4, %5, 0, 1, 1;\n"
                             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                             : "l"(mk_d_wgmma_desc(As[s])), "l"(mk_d_wgmma_desc(Bs[s]))
                             : "memory");
            else
                asm volatile("wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, %4, %5, 1, 1, 1;\n"
                             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                             : "l"(mk_d_wgmma_desc(As[s])), "l"(mk_d_wgmma_desc(Bs[s]))
                             : "memory");
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            if (s == 0) put8(0, d);
        }
        put8(1, d);
    }
    { /* n64 */
        float d[32];
#pragma unroll
        for (int i = 0; i < 32; i++) d[i] = 0.0f;
        for (int s = 0; s < 4; s++) {
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#define PW_D64                                                                                                         \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),          \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),          \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),         \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define PW_R64                                                                                                         \
    "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
            if (s == 0)
                asm volatile("wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " PW_R64 ", %32, %33, 0, 1, 1;\n"
                             : PW_D64
                             : "l"(mk_d_wgmma_desc(As[s])), "l"(mk_d_wgmma_desc(Bs[s]))
                             : "memory");
            else
                asm volatile("wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " PW_R64 ", %32, %33, 1, 1, 1;\n"
                             : PW_D64
                             : "l"(mk_d_wgmma_desc(As[s])), "l"(mk_d_wgmma_desc(Bs[s]))
                             : "memory");
#undef PW_D64
#undef PW_R64
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            if (s == 0 || s == 3) {
                float *o = out + (size_t)(s == 0 ? 2 : 3) * 64 * 64;
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    o[r0 * 64 + 8 * j + 2 * t] = d[4 * j], o[r0 * 64 + 8 * j + 2 * t + 1] = d[4 * j + 1];
                    o[(r0 + 8) * 64 + 8 * j + 2 * t] = d[4 * j + 2], o[(r0 + 8) * 64 + 8 * j + 2 * t + 1] = d[4 * j + 3];
                }
            }
        }
    }
    { /* n8, A from registers */
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int s = 0; s < 4; s++) {
            const uint8_t *a0 = A + (size_t)r0 * 128 + s * 32, *a1 = a0 + 8 * 128;
            const uint32_t x0 = *(const uint32_t *)(a0 + 4 * t), x1 = *(const uint32_t *)(a1 + 4 * t);
            const uint32_t x2 = *(const uint32_t *)(a0 + 16 + 4 * t), x3 = *(const uint32_t *)(a1 + 16 + 4 * t);
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
            if (s == 0)
                asm volatile("wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, 0, 1, 1;\n"
                             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                             : "r"(x0), "r"(x1), "r"(x2), "r"(x3), "l"(mk_d_wgmma_desc(Bs[s]))
                             : "memory");
            else
                asm volatile("wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, 1, 1, 1;\n"
                             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                             : "r"(x0), "r"(x1), "r"(x2), "r"(x3), "l"(mk_d_wgmma_desc(Bs[s]))
                             : "memory");
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            if (s == 0) put8(4, d);
        }
        put8(5, d);
    }
#endif
}

int mk_cuda_probe_wgmma_shapes(mk_cuda_ctx *ctx, const uint8_t *A, const uint8_t *B, float *out, mk_err *err) {
    if (ctx->caps.cc_major != 9)
        return mk_fail(err, MK_ENOTSUP, "cuda: wgmma shape probe: sm_90a only (this device is %d.%d)",
                       ctx->caps.cc_major, ctx->caps.cc_minor);
    const size_t no = sizeof(float) * 6 * 64 * 64;
    uint8_t *dA = NULL, *dB = NULL;
    float *dO = NULL;
    int st = mk_cuda_alloc(ctx, 64 * 128, (void **)&dA, err);
    if (!st) st = mk_cuda_alloc(ctx, 64 * 128, (void **)&dB, err);
    if (!st) st = mk_cuda_alloc(ctx, no, (void **)&dO, err);
    if (!st) st = mk_cuda_upload(ctx, dA, A, 64 * 128, err);
    if (!st) st = mk_cuda_upload(ctx, dB, B, 64 * 128, err);
    if (!st) st = mk_cuda_memset(ctx, dO, 0, no, err);
    if (!st) {
        k_probe_wgmma_shapes<<<1, 128, 0, ctx->stream>>>(dA, dB, dO);
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) st = mk_cuda_fail(err, e, "cuda: wgmma shape probe launch");
    }
    if (!st) st = mk_cuda_download(ctx, out, dO, no, err);
    mk_cuda_free(ctx, dA), mk_cuda_free(ctx, dB), mk_cuda_free(ctx, dO);
    return st;
}

/* ---- wgmma FP4 expert GEMV probe (mk_cuda_probe_wgmma_fp4) -------------------------------------
 * A design probe for the decode experts, not used by the model: how fast would the one-token expert
 * GEMV be with sm_90a's native FP8 warpgroup MMA (no f16 emulation, one instruction per 64 rows x 32
 * k) instead of mma.sync? It takes mk_cuda_moe_gemv_fp4's operands for a decode (lane-ordered FP4
 * weights, the plan of T = 1, the permuted e4m3 row and its block scales) and computes the same
 * products: a block of WG_KS warpgroups takes 64 rows of one picked expert (its group of the plan),
 * warpgroup j a quarter of k; warp w of a warpgroup holds rows 16 w + g and + 8 as mma.sync's A
 * fragment (the nibbles widened as fp4l_mma_q widens them), which is wgmma's register-A layout (the
 * wgmma shape probe: the same bits as from shared memory). B is the token's row in shared memory,
 * column 0 of n8 (columns 1-7 zero), each 32-block's slots in mma.sync's B order. Each 32-block's
 * product starts from zero and is scaled into fp32 (as the GEMVs do); the warpgroups' partial sums
 * are added in order at the end. wgmma's accumulation differs from mma.sync's (the wgmma probe), so
 * the op test compares it with the expert GEMV within a tolerance, not bit for bit. */
#define WG_KS 4
__global__ void __launch_bounds__(128 * WG_KS, 2) k_probe_wgmma_fp4(const void *const *__restrict__ Wt,
                                                                    const uint8_t *const *__restrict__ St,
                                                                    const void *const *__restrict__ Wt3,
                                                                    const uint8_t *const *__restrict__ St3,
                                                                    const uint8_t *__restrict__ xq,
                                                                    const float *__restrict__ sa, int n, int k,
                                                                    const int32_t *__restrict__ plan, int TK, int E,
                                                                    int by_token, float *__restrict__ y,
                                                                    float *__restrict__ y3, int tl) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(128) uint8_t wg_smem[]; /* B: k / 32 tiles of 256 bytes, then the partials */
    if (blockIdx.z) Wt = Wt3, St = St3, y = y3;
    const int G = TK < E ? TK : E, grp = blockIdx.y;
    if (grp >= plan[0]) return;
    const int32_t *gexp = plan + 1, *goff = gexp + G, *stok = goff + G + 1;
    const int ex = gexp[grp], slot = goff[grp], xr = by_token ? stok[slot] : slot;
    const uint8_t *W = (const uint8_t *)Wt[ex], *S = St[ex];
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, warp = (tid >> 5) & 3, g = lane >> 2, t = lane & 3;
    const int nb = k >> 7, ns = k >> 5;
    const int wkb = MK_FP4_WKB(tl), skb = MK_FP4_SKB(tl); /* a 128-block's step in the experts' layout */
    /* B tiles: step s (32-block s) column 0 slot c at (c >> 4) * 128 + (c & 15), the other columns 0 */
    const uint8_t *xrow = xq + (size_t)xr * k;
    for (int i = tid; i < ns * 256; i += blockDim.x) {
        const int s = i >> 8, o = i & 255, col = (o & 127) >> 4, c = (o >> 7) * 16 + (o & 15);
        uint8_t v = 0;
        if (col == 0) { /* slot c of block q = s & 3: the permuted row's byte (fp4l_mma_q's B fragment) */
            const int q = s & 3, kb = s >> 2, tt = (c & 15) >> 2, ii = c & 3;
            v = xrow[(size_t)kb * 128 + 32 * q + 8 * tt + (c >= 16 ? 4 : 0) + ii];
        }
        wg_smem[i] = v;
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int r0 = blockIdx.x * 64 + warp * 16 + g;
    const uint8_t *w0 = mk_d_fp4_w(W, r0, k, tl) + t * 16, *w1 = mk_d_fp4_w(W, r0 + 8, k, tl) + t * 16;
    const uint8_t *s0p = mk_d_fp4_s(S, r0, k, tl), *s1p = mk_d_fp4_s(S, r0 + 8, k, tl);
    const int per = (nb + WG_KS - 1) / WG_KS, kb0 = wg * per, kb1 = min(nb, kb0 + per);
    float acc0 = 0.0f, acc1 = 0.0f; /* rows r0, r0 + 8, column 0 (lanes t == 0) */
    uint4 a0 = make_uint4(0, 0, 0, 0), a1 = a0;
    uint32_t sw0 = 0, sw1 = 0;
    if (kb0 < kb1) {
        a0 = mk_d_ld_stream(w0 + (size_t)kb0 * wkb), a1 = mk_d_ld_stream(w1 + (size_t)kb0 * wkb);
        sw0 = *(const uint32_t *)(s0p + skb * kb0), sw1 = *(const uint32_t *)(s1p + skb * kb0);
    }
    for (int kb = kb0; kb < kb1; kb++) {
        const uint4 c0 = a0, c1 = a1;
        const uint32_t cs0 = sw0, cs1 = sw1;
        if (kb + 1 < kb1) { /* the next 128-block's weights in flight during this one's MMAs */
            a0 = mk_d_ld_stream(w0 + (size_t)(kb + 1) * wkb), a1 = mk_d_ld_stream(w1 + (size_t)(kb + 1) * wkb);
            sw0 = *(const uint32_t *)(s0p + skb * (kb + 1)), sw1 = *(const uint32_t *)(s1p + skb * (kb + 1));
        }
        uint32_t e[4][4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const uint32_t u0 = q == 0 ? c0.x : q == 1 ? c0.y : q == 2 ? c0.z : c0.w;
            const uint32_t u1 = q == 0 ? c1.x : q == 1 ? c1.y : q == 2 ? c1.z : c1.w;
            mk_d_fp4x8_to_e4m3(u0, e[q][0], e[q][2]);
            mk_d_fp4x8_to_e4m3(u1, e[q][1], e[q][3]);
        }
        float d[4][4];
#pragma unroll
        for (int q = 0; q < 4; q++) d[q][0] = d[q][1] = d[q][2] = d[q][3] = 0.0f;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int q = 0; q < 4; q++)
            asm volatile("wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, 0, 1, 1;\n"
                         : "+f"(d[q][0]), "+f"(d[q][1]), "+f"(d[q][2]), "+f"(d[q][3])
                         : "r"(e[q][0]), "r"(e[q][1]), "r"(e[q][2]), "r"(e[q][3]),
                           "l"(mk_d_wgmma_desc(wg_smem + (size_t)(kb * 4 + q) * 256))
                         : "memory");
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        const float sx = sa[(size_t)xr * nb + kb];
#pragma unroll
        for (int q = 0; q < 4; q++) { /* 64 undoes the widened nibbles' 2^-6 */
            acc0 = fmaf(d[q][0], sx * (64.0f * mk_d_e8m0((cs0 >> (8 * q)) & 0xff)), acc0);
            acc1 = fmaf(d[q][2], sx * (64.0f * mk_d_e8m0((cs1 >> (8 * q)) & 0xff)), acc1);
        }
    }
    float *part = (float *)(wg_smem + (size_t)ns * 256); /* [WG_KS][64] */
    if (t == 0) part[wg * 64 + warp * 16 + g] = acc0, part[wg * 64 + warp * 16 + g + 8] = acc1;
    __syncthreads();
    if (tid < 64) {
        float v = 0.0f;
        for (int j = 0; j < WG_KS; j++) v += part[j * 64 + tid];
        y[(size_t)slot * n + blockIdx.x * 64 + tid] = v;
    }
#endif
}

int mk_cuda_probe_wgmma_fp4(mk_cuda_ctx *ctx, const void *const *W, const uint8_t *const *S, const void *const *W3,
                            const uint8_t *const *S3, int n, int k, const uint8_t *xq, const float *sa, int by_token,
                            const int32_t *plan, int K, int E, float *y, float *y3, mk_err *err) {
    if (ctx->caps.cc_major != 9)
        return mk_fail(err, MK_ENOTSUP, "cuda: wgmma fp4 probe: sm_90a only (this device is %d.%d)", ctx->caps.cc_major,
                       ctx->caps.cc_minor);
    if (n % 64 || k % 128 || K < 1 || E < 1 || (W3 == NULL) != (y3 == NULL))
        return mk_fail(err, MK_EINVAL, "cuda: wgmma fp4 probe: needs n %% 64 == 0, k %% 128 == 0, K, E >= 1 and W3 with y3 "
                       "(n %d, k %d, K %d, E %d)", n, k, K, E);
    const size_t smem = (size_t)(k / 32) * 256 + sizeof(float) * WG_KS * 64;
    int st = mk_cuda_smem_optin(ctx, MK_OPTIN_WG_FP4, (const void *)k_probe_wgmma_fp4, smem, err);
    if (st) return st;
    const int G = K < E ? K : E;
    k_probe_wgmma_fp4<<<dim3((unsigned)(n / 64), (unsigned)G, W3 ? 2u : 1u), 128 * WG_KS, smem, ctx->stream>>>(
        W, S, W3, S3, xq, sa, n, k, plan, K, E, by_token, y, y3, ctx->tune.fp4_tiles);
    MK_CU_LAUNCHED(err, "cuda: wgmma fp4 probe launch");
    return MK_OK;
}
