/* cuda_common.cuh — what the CUDA op files share: the context struct, error mapping, and small
 * device helpers (exact format decoding, bf16 rounding, the mma.sync / ldmatrix / cp.async
 * wrappers). Internal to src/ops/cuda; the public API is ops_cuda.h.
 *
 * The .cu files are CUDA C: plain functions and structs, with C++ used only where the language
 * needs it (templates over a few compile-time tile sizes, so register arrays stay in registers).
 *
 * Exactness helpers: where the CPU reference evaluates `a * b + c` as two roundings (the host
 * build has no FMA), the kernels use __fmul_rn / __fadd_rn, which nvcc never contracts, so those
 * ops are bit-identical to their CPU twins.
 */
#ifndef MK_OPS_CUDA_COMMON_CUH
#define MK_OPS_CUDA_COMMON_CUH

#include <float.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
extern "C" { /* base/status.h is a C header without C++ guards */
#include "base/status.h"
}
#include "ops/cuda/ops_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

struct mk_cuda_ctx {
    int device;
    cudaStream_t stream;
    mk_cuda_caps caps;
    void *cublas;       /* cublasHandle_t, or NULL when built without cuBLAS */
    unsigned logged;    /* bit per "slower path used" note already logged */
    unsigned optin;     /* bit per kernel whose shared-memory opt-in is done */
    mk_cuda_tuning tune;
    unsigned *counters; /* [MK_CUDA_COUNTERS] zeroed arrival counters of split-K GEMV slabs; each
                           launch leaves them zero again */
    double *hc_partial; /* [MK_CUDA_HC_SPLIT_TOK * MK_CUDA_HC_SPLIT * 32] partial sums of the split
                           hc_pre reduction (hc.cu) */
    /* kernel trace (MINKE_CUDA_TRACE=1, benchmarks only): an event recorded after every launch
       while tracing; ctx.cu's mk_cuda_trace_* */
    int trace_on;                   /* recording now */
    int trace_n, trace_cap;
    cudaEvent_t *trace_ev;
    const char **trace_name;
    double *trace_host;             /* host clock (s) at each mark: when the launch was queued */
    /* the L2 lane (lane.cu): its stream and fork / join events, made before the first capture with it on */
    int capturing;                  /* between capture_begin and capture_end */
    int lane_pending;               /* lane work queued in this capture, not yet joined */
    long lane_count;                /* prefetch launches queued so far */
    cudaStream_t lane;
    cudaEvent_t lane_fork, lane_join;
    /* the side branch (lane.cu): while in_branch, `stream` is `side` and `main` the main stream */
    int in_branch, branch_pending;
    int prio_hi, prio_lo;           /* the device's greatest and least stream priorities (tuning prio) */
    cudaStream_t side, main;
    cudaEvent_t side_fork, side_done;
    /* the step I/O streams (ctx.cu's mk_cuda_copy_on): uploads, downloads; made at first use */
    cudaStream_t io[2];
    /* the bf16 matrices in slab tiles (gemv.cu's mk_cuda_bf16_tiles), by their weights' address */
    const void *tiled[MK_CUDA_TILED_MAX];
    int n_tiled;
    /* the fused argmax of k_gemv_bf16_wpipe (mk_cuda_linear_argmax): per block and row the block's best
       (value, id) [MK_CUDA_AM_ROWS][am_blocks], and an arrival counter (zero between launches) */
    float *am_v;
    int *am_i;
    unsigned *am_n;
    int am_blocks;
};
#define MK_CUDA_AM_ROWS 8
/* lane.cu, for ctx.cu: the lane's stream and events made (before a capture), the lane joined into
 * the main stream (before a capture ends), both freed */
int mk_cuda_lane_ready(mk_cuda_ctx *ctx, mk_err *err);
int mk_cuda_lane_join(mk_cuda_ctx *ctx, mk_err *err);
void mk_cuda_lane_free(mk_cuda_ctx *ctx);
#define MK_CUDA_HC_SPLIT 64     /* chunks of the hc*d row reduced by separate blocks */
#define MK_CUDA_HC_SPLIT_TOK 1024 /* tokens per split-path launch pair (the partials buffer's size) */
#define MK_CUDA_COUNTERS 65536

/* Launches kern on the context's stream over clusters of cx blocks along x (thread block clusters,
 * sm_90; cx <= 1: none) and, with pdl (unless the tuning's gemv_pdl is 0), with programmatic
 * dependent launch: its blocks are scheduled while the previous kernel finishes, which hides the
 * launch latency of a chain of small kernels. Such a kern must start with MK_PDL_ENTER() (or, like
 * the GEMVs, touch only constant data before mk_d_pdl_wait). Errors are left for cudaGetLastError
 * (MK_CU_LAUNCHED). */
template <typename... P, typename... A>
static inline cudaError_t mk_cuda_launch_cluster(mk_cuda_ctx *ctx, dim3 grid, dim3 block, size_t smem, int cx, int pdl,
                                                 void (*kern)(P...), A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = ctx->stream;
    cudaLaunchAttribute at[3];
    unsigned n = 0;
    if (cx > 1) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = (unsigned)cx;
        at[n].val.clusterDim.y = 1;
        at[n].val.clusterDim.z = 1;
        n++;
    }
    if (pdl && ctx->tune.gemv_pdl) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    if (ctx->tune.prio && ctx->capturing) { /* the main stream's kernels first, the side branch's after */
        at[n].id = cudaLaunchAttributePriority;
        at[n].val.priority = ctx->in_branch ? ctx->prio_lo : ctx->prio_hi;
        n++;
    }
    cfg.attrs = at;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kern, args...);
}

/* mk_cuda_launch_cluster without clusters, with programmatic dependent launch. */
template <typename... P, typename... A>
static inline cudaError_t mk_cuda_launch_pdl(mk_cuda_ctx *ctx, dim3 grid, dim3 block, size_t smem, void (*kern)(P...),
                                             A... args) {
    return mk_cuda_launch_cluster(ctx, grid, block, smem, 0, 1, kern, args...);
}

/* Maps a CUDA error to an mk_status and writes "what: cuda error text" into err. */
int mk_cuda_fail(mk_err *err, cudaError_t e, const char *what);

#define MK_CU_TRY(call, err, what)                                  \
    do {                                                            \
        cudaError_t e_ = (call);                                    \
        if (e_ != cudaSuccess) return mk_cuda_fail(err, e_, what);  \
    } while (0)
/* After a launch: configuration errors are reported here, faults at the next sync. While a
 * kernel trace records (benchmarks), an event marks the launch's end in the stream. */
void mk_cuda_trace_mark(mk_cuda_ctx *ctx, const char *what);
#define MK_CU_LAUNCHED(err, what)                                   \
    do {                                                            \
        MK_CU_TRY(cudaGetLastError(), err, what);                   \
        if (ctx->trace_on) mk_cuda_trace_mark(ctx, what);           \
    } while (0)

/* Logs `msg` once per context for note bit `bit` (slower paths, chosen kernels). */
void mk_cuda_note(mk_cuda_ctx *ctx, unsigned bit, const char *msg);

/* Kernels that need more than 48 KiB of dynamic shared memory must opt in, once per function
 * and context (bit: the kernel's slot in ctx->optin; the call is not repeated, so launches can be
 * captured into graphs). `bytes` must not grow between calls for one bit. */
enum { MK_OPTIN_GEMM64 = 0, MK_OPTIN_GEMM128, MK_OPTIN_ATTN8, MK_OPTIN_ATTN4, MK_OPTIN_ATTN2,
       MK_OPTIN_ATTN1, MK_OPTIN_MOE_STAGED, MK_OPTIN_HC_RI, MK_OPTIN_ATTN16, MK_OPTIN_SAMPLE,
       MK_OPTIN_SAMPLE_AGG, MK_OPTIN_SAMPLE_CL, MK_OPTIN_SAMPLE_CL_AGG, MK_OPTIN_ATTN4_MLP, MK_OPTIN_ATTN2_MLP, MK_OPTIN_ATTN1_MLP,
       MK_OPTIN_ATTN4_CL, MK_OPTIN_ATTN2_CL, MK_OPTIN_ATTN1_CL, MK_OPTIN_WG_FP4, MK_OPTIN_FP4_TILES,
       MK_OPTIN_ATTN4_CLF, MK_OPTIN_ATTN2_CLF, MK_OPTIN_ATTN1_CLF };
int mk_cuda_smem_optin(mk_cuda_ctx *ctx, unsigned bit, const void *func, size_t bytes, mk_err *err);

/* Threads per row of the RMSNorm kernel (basic.cu): about 4 values each, by d only (a row's bits
 * do not depend on the row count); kernels that fuse the norm run it with exactly this many. */
static inline int mk_cuda_rmsnorm_threads(int d) {
    int threads = (d / 4 + 31) / 32 * 32;
    return threads < 64 ? 64 : threads > 1024 ? 1024 : threads;
}

/* ---- device helpers ---------------------------------------------------------------------- */

/* Entry j of a paged compressed KV (ops_cuda.h mk_cuda_paged). */
__device__ __forceinline__ const float *mk_d_paged_row(const mk_cuda_paged &p, int j, int D) {
    return (const float *)(p.base + (size_t)p.tbl[j / p.epb] * p.block_bytes + p.off) + (size_t)(j % p.epb) * D;
}

/* The piece of call row r among np pieces (piece i at pc[i * stride], row0 ascending): the last
 * whose row0 <= r. */
__device__ __forceinline__ const mk_cuda_apiece &mk_d_apiece_of(const mk_cuda_apiece *pc, int np, int stride, int r) {
    int lo = 0, hi = np - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (pc[(size_t)mid * stride].row0 <= r) lo = mid;
        else hi = mid - 1;
    }
    return pc[(size_t)lo * stride];
}

__device__ __forceinline__ float mk_d_bf16r(float f) {
    return __bfloat162float(__float2bfloat16_rn(f));
}

/* e8m0 2^(e-127); e = 0 is the subnormal 2^-127, 255 NaN (as gemm.c's e8m0). */
__device__ __forceinline__ float mk_d_e8m0(uint32_t e) {
    uint32_t u = e == 0 ? 0x00400000u : e == 255 ? 0x7fc00000u : e << 23;
    return __uint_as_float(u);
}

/* The order in which the MoE combine adds a token's expert rows (k_moe_combine, and hc_post taking a
 * combine's operands, mk_cuda_moe_sum): the token's slots by expert id, equal ids in pick order (the
 * plan gives a hash layer's duplicate pick no slot of its own, so none tie today). sp[k]: the slot
 * of pick k (< 0: none), ix[k]: its expert. Warp-wide (all 32 lanes, K <= 64): lane l ranks picks l
 * and l + 32 and writes ord[rank] = slot; returns the slot count. */
__device__ __forceinline__ int mk_d_moe_slot_order(const int32_t *__restrict__ sp, const int32_t *__restrict__ ix,
                                                   int K, int32_t *ord) {
    int cnt = 0;
    for (int k = (int)(threadIdx.x & 31); k < 64; k += 32) {
        const int p = k < K ? sp[k] : -1, e = k < K ? ix[k] : 0;
        if (p >= 0) {
            int r = 0;
            for (int k2 = 0; k2 < K; k2++) {
                const int e2 = ix[k2];
                r += sp[k2] >= 0 && (e2 < e || (e2 == e && k2 < k));
            }
            ord[r] = p;
        }
        cnt += __popc(__ballot_sync(0xffffffffu, p >= 0));
    }
    return cnt;
}

/* The combined value at column k: 0, + eo[slot][k] in ord's order, bf16(y + shared) (shared: the
 * shared expert's value at k). */
__device__ __forceinline__ float mk_d_moe_combined(const float *__restrict__ eo, const int32_t *ord, int n,
                                                   float shared, int d, int k) {
    float y = 0.0f;
    for (int q = 0; q < n; q++) y = __fadd_rn(y, eo[(size_t)ord[q] * d + k]);
    return mk_d_bf16r(__fadd_rn(y, shared));
}

/* Exact e4m3 decoding: integer significand times a power of two. */
__device__ __forceinline__ float mk_d_e4m3(uint32_t b) {
    uint32_t e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 15 && m == 7) return __uint_as_float(0x7fc00000u);
    if (e) v = (float)(8 + m) * __uint_as_float((e - 10 + 127) << 23);
    else v = (float)m * __uint_as_float((uint32_t)(-9 + 127) << 23);
    return (b & 0x80) ? -v : v;
}

/* e2m1 nibble value. */
__device__ __forceinline__ float mk_d_e2m1(uint32_t nib) {
    uint32_t mag = nib & 7, ee = mag >> 1, mm = mag & 1;
    float v = ee == 0 ? 0.5f * (float)mm : (1.0f + 0.5f * (float)mm) * (float)(1u << (ee - 1));
    return (nib & 8) ? -v : v;
}

__device__ __forceinline__ float mk_d_bf16(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* Interleaved RoPE of pair i of the vector at p (table cs, tab_half pairs per position), as
 * mk_rope: bf16-rounded, no FMA contraction. */
__device__ __forceinline__ void mk_d_rope_pair(float *p, const float *__restrict__ cs, int tab_half, int pos, int i,
                                               int inverse) {
    const float *c2 = cs + ((size_t)pos * tab_half + i) * 2;
    float c = c2[0], s = inverse ? -c2[1] : c2[1];
    float a = p[2 * i], b = p[2 * i + 1];
    p[2 * i] = mk_d_bf16r(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));
    p[2 * i + 1] = mk_d_bf16r(__fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c)));
}

/* 2^ceil(log2(x)) from the fp32 bits of x, as mk_pow2_ceil. */
__device__ __forceinline__ float mk_d_pow2_ceil(float x) {
    uint32_t u = __float_as_uint(x);
    int e = (int)((u >> 23) & 0xff) - 127;
    if (u & 0x7fffffu) e += 1;
    return ldexpf(1.0f, e);
}

/* The arithmetic of act_quant (the reference's FP8 activation quantization per 128-block; quant.cu's
 * kernels and hc.cu's fused-norm output share it, so their bytes agree): the block scale from the
 * block's max |x|, an element's e4m3 byte, and where element i of a row is stored (perm: within
 * each 8-chunk the order (0,2,4,6,1,3,5,7) in which the FP4 GEMV widens packed nibbles). */
__device__ __forceinline__ float mk_d_act_scale(float amax) {
    return mk_d_pow2_ceil(__fmul_rn(fmaxf(amax, 1e-4f), 1.0f / 448.0f));
}
__device__ __forceinline__ uint8_t mk_d_e4m3_byte(float t) { /* t = v / s, clamped and converted */
    t = fminf(fmaxf(t, -448.0f), 448.0f);
    return (uint8_t)__nv_cvt_float_to_fp8(t, __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ uint8_t mk_d_act_byte(float v, float s) { return mk_d_e4m3_byte(__fdiv_rn(v, s)); }
/* 1 / s, exactly: s is a power of two (mk_d_pow2_ceil), so v * (1 / s) is the real number v / s and
 * its rounding is __fdiv_rn(v, s)'s, without the division's instruction sequence. */
__device__ __forceinline__ float mk_d_act_inv(float s) { return __frcp_rn(s); }
/* mk_d_act_byte's byte with v / s as v * inv (inv = mk_d_act_inv(s)): the same bits. */
__device__ __forceinline__ uint8_t mk_d_act_byte_inv(float v, float inv) { return mk_d_e4m3_byte(__fmul_rn(v, inv)); }
__device__ __forceinline__ int mk_d_act_pos(int i, int perm) {
    const int e = i & 7;
    return perm ? (i & ~7) + ((e & 1) ? 4 + (e >> 1) : (e >> 1)) : i;
}

/* Eight packed e2m1 nibbles (low nibble = even element) -> two words of four e4m3 bytes each:
 * `ev` holds elements 0,2,4,6 and `od` elements 1,3,5,7. The byte s.ee.m -> s000.ee.m00 is an
 * e4m3 whose value is the e2m1 value times 2^-6 exactly (ee = 0, the e2m1 half, lands on the
 * e4m3 subnormal 4 * 2^-9), so the caller folds 2^6 into the block scale. */
__device__ __forceinline__ void mk_d_fp4x8_to_e4m3(uint32_t w, uint32_t &ev, uint32_t &od) {
    ev = ((w << 4) & 0x80808080u) | ((w << 2) & 0x1c1c1c1cu);
    od = (w & 0x80808080u) | ((w >> 2) & 0x1c1c1c1cu);
}

/* D = A * B + C, m16n8k32, e4m3 x e4m3 -> f32. Fragments (lane = 4 * g + t):
 *   a0: row g,   k 4t..4t+3     a1: row g+8, k 4t..4t+3
 *   a2: row g,   k 16+4t..      a3: row g+8, k 16+4t..
 *   b0: col g,   k 4t..4t+3     b1: col g,   k 16+4t..
 *   c0, c1: row g, cols 2t, 2t+1;  c2, c3: row g+8, cols 2t, 2t+1 */
__device__ __forceinline__ void mk_d_mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* D = A * B + C, m16n8k16, bf16 x bf16 -> f32. Fragments: each register holds two bf16 along k:
 *   a0: row g, k 2t,2t+1   a1: row g+8, k 2t,2t+1   a2: row g, k 2t+8,+9   a3: row g+8, k 2t+8,+9
 *   b0: col g, k 2t,2t+1   b1: col g, k 2t+8,+9;   c as above. */
__device__ __forceinline__ void mk_d_mma_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                              uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* D = A * B + C, m16n8k16, f16 x f16 -> f32 (fragments as mk_d_mma_bf16). */
__device__ __forceinline__ void mk_d_mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                             uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* A wgmma shared-memory matrix descriptor for the layout the wgmma probes use: no
 * swizzle, 8-row x 16-byte core matrices, the K-adjacent one 128 bytes on, the M/N-adjacent one 256. */
__device__ __forceinline__ uint64_t mk_d_wgmma_desc(const void *p) {
    return (uint64_t)((__cvta_generic_to_shared(p) & 0x3ffff) >> 4) | ((uint64_t)(128 >> 4) << 16) |
           ((uint64_t)(256 >> 4) << 32);
}

/* Two e4m3 bytes (low byte = first element) -> f16x2 (low half = first), exactly: every e4m3
 * value, subnormals included, is a normal f16. */
__device__ __forceinline__ uint32_t mk_d_e4m3x2_to_f16x2(uint32_t two) {
    uint32_t r;
    unsigned short h = (unsigned short)two;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(h));
    return r;
}

/* Programmatic dependent launch (sm_90+). launch_dependents lets the next kernel of the stream be
 * scheduled before this one ends; wait blocks until the previous kernel has completed and its
 * memory is visible (immediately when the kernel was launched without the attribute). A kernel
 * launched with the attribute must call mk_d_pdl_wait before it touches anything the previous
 * kernel writes or reads-then-overwrites, and before it exits. */
__device__ __forceinline__ void mk_d_pdl_launch_dependents(void) {
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
__device__ __forceinline__ void mk_d_pdl_wait(void) {
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
}

/* The entry of a kernel launched by mk_cuda_launch_pdl: the next kernel may be scheduled now, and
 * this one waits for the previous kernel (a no-op when launched without the attribute). */
#define MK_PDL_ENTER()                \
    do {                              \
        mk_d_pdl_launch_dependents(); \
        mk_d_pdl_wait();              \
    } while (0)

/* The 128-byte lines of [p, p + bytes) into L2 by the whole block: constant data (norm weights,
 * biases) that a kernel reads after its wait for the previous kernel is requested before it, so
 * its memory latency overlaps the previous kernel (the layers' weight streams evict it from L2
 * every step). A hint: nothing waits for it. */
__device__ __forceinline__ void mk_d_l2_prefetch_block(const void *p, size_t bytes) {
    if (!p) return;
    const char *c = (const char *)p;
    for (size_t off = (size_t)threadIdx.x * 128; off < bytes; off += (size_t)blockDim.x * 128)
        asm volatile("prefetch.global.L2 [%0];\n" ::"l"(c + off));
}

/* The sampler's greedy rule: NaN counts as -inf, +inf as FLT_MAX, the largest value wins, the
 * lowest id among equal values; -1 when every value is -inf (or NaN). A candidate (v, i) beats
 * (bv, bi) when v > bv, or v == bv and i < bi; -inf values never become candidates. */
__device__ __forceinline__ void mk_d_am_better(float v, int i, float &bv, int &bi) {
    if (v > bv || (v == bv && i < bi)) bv = v, bi = i;
}

/* Value v at id i as a candidate (the rule above). */
__device__ __forceinline__ void mk_d_am_take(float v, int i, float &bv, int &bi) {
    if (isnan(v)) return;
    if (v == INFINITY) v = FLT_MAX;
    if (v > -INFINITY) mk_d_am_better(v, i, bv, bi);
}

/* A bf16 matrix [n, k] in rows (tl 0) or slab tiles (tl 1, mk_cuda_bf16_tiles): where row `row`'s 32-k
 * step 0 starts (bytes); step st of the row is MK_BF16_WST(tl) * st bytes further. */
#define MK_BF16_WST(tl) ((tl) ? 1024 : 64)
__device__ __forceinline__ const uint8_t *mk_d_bf16_row(const uint16_t *W, int row, int k, int tl) {
    const uint8_t *b = (const uint8_t *)W;
    return tl ? b + (size_t)(row >> 4) * ((size_t)k * 32) + (size_t)(row & 15) * 64 : b + (size_t)row * ((size_t)k * 2);
}

/* The routed experts' FP4 layout (mk_cuda_fp4_expert_layout, ops_cuda.h): where row `row`'s 128-block 0
 * starts in W [n, k / 2 bytes] and its 4 scale bytes in S [n, k / 32], in rows (tl 0) or slab tiles
 * (tl 1); 128-block kb of the row is MK_FP4_WKB(tl) * kb bytes further (its scales MK_FP4_SKB(tl) * kb).
 * A slab's 16 rows take 16 * k / 2 bytes (8 k) and 16 * k / 32 scale bytes (k / 2) either way. */
#define MK_FP4_WKB(tl) ((tl) ? 1024 : 64)
#define MK_FP4_SKB(tl) ((tl) ? 64 : 4)
__device__ __forceinline__ const uint8_t *mk_d_fp4_w(const uint8_t *W, int row, int k, int tl) {
    return tl ? W + (size_t)(row >> 4) * ((size_t)k * 8) + (size_t)(row & 15) * 64 : W + (size_t)row * ((size_t)k >> 1);
}
__device__ __forceinline__ const uint8_t *mk_d_fp4_s(const uint8_t *S, int row, int k, int tl) {
    return tl ? S + (size_t)(row >> 4) * ((size_t)k >> 1) + (size_t)(row & 15) * 4 : S + (size_t)row * ((size_t)k >> 5);
}

/* The 128-byte line at p into L2 (a hint: nothing waits for it). */
__device__ __forceinline__ void mk_d_l2_prefetch(const void *p) {
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

/* 16-byte streaming load of weights: not kept in L1 (each byte is used once per call). */
__device__ __forceinline__ uint4 mk_d_ld_stream(const void *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

__device__ __forceinline__ uint4 mk_d_ld16(const void *p) {
    return __ldg((const uint4 *)p);
}

__device__ __forceinline__ uint32_t mk_d_smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* cp.async of 16 bytes; src_bytes = 0 fills the destination with zeros (rows past the end). */
__device__ __forceinline__ void mk_d_cp_async16(void *smem, const void *gmem, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(mk_d_smem_addr(smem)),
                 "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void mk_d_cp_async4(void *smem, const void *gmem, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(mk_d_smem_addr(smem)),
                 "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void mk_d_cp_async_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::);
}
template <int N> __device__ __forceinline__ void mk_d_cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* ldmatrix x4 (four 8x8 b16 matrices = four 8-row x 16-byte tiles): lane l gives the address of
 * row (l & 7) of matrix l >> 3; register i of lane 4g + t gets bytes 4t..4t+3 of row g of
 * matrix i. */
__device__ __forceinline__ void mk_d_ldmatrix_x4(uint32_t (&r)[4], const void *smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(mk_d_smem_addr(smem)));
}

__device__ __forceinline__ float mk_d_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double mk_d_warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float mk_d_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* mk_d_warp_max of values that are >= 0 and not NaN, as one integer reduction: such floats order as
 * their bit patterns do, so the result is the same value (the full warp must call it). */
__device__ __forceinline__ float mk_d_warp_max_nn(float v) {
    return __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(v)));
}

/* Internal launchers shared between files (linear.cu dispatches to gemv.cu / gemm.cu). */
int mk_cuda_quant_launch(mk_cuda_ctx *ctx, const float *x, int m, int k, int perm, uint8_t *q,
                         float *sa, mk_err *err);
int mk_cuda_to_bf16_launch(mk_cuda_ctx *ctx, const float *x, size_t n, uint16_t *y, mk_err *err);
/* x [m, k] -> xh f16 [m, k] and sx [m, ceil(k/128)] with x = xh * sx per 128-block (sx a power of
 * two putting the block's largest |x| in [2^14, 2^15]): exact for bf16 inputs down to 2^-23 of
 * the block maximum. */
int mk_cuda_f16_prep_rope_launch(mk_cuda_ctx *ctx, float *x, int m, int k, const mk_cuda_rope_at_desc *rd,
                                 uint16_t *xh, float *sx, mk_err *err);
int mk_cuda_f16_prep_launch(mk_cuda_ctx *ctx, const float *x, int m, int k, uint16_t *xh, float *sx,
                            mk_err *err);
int mk_cuda_round_bf16_launch(mk_cuda_ctx *ctx, float *y, size_t n, mk_err *err);

/* gemv.cu: any m >= 1 in one launch, as chunks of 8 rows (gridDim.x, the fastest grid dimension,
 * so the chunks of one weight slab run together and share its bytes through L2); each chunk is
 * computed exactly as a launch of its 8 rows alone. xq/sa: quantized activations (natural layout
 * for FP8, permuted for FP4); xb: bf16 activations [m, k]; ws: split-K partials,
 * mk_cuda_gemv_splits(W) * m * n floats; with split-K (splits > 1) at most 8 rows per launch. */
int mk_cuda_gemv_splits(const mk_cuda_ctx *ctx, const mk_wmat *W);
int mk_cuda_gemv_fp8(mk_cuda_ctx *ctx, const mk_wmat *W, const uint8_t *xq, const float *sa, int m,
                     float *y, int round, float *ws, mk_err *err);
/* Two FP8 matrices of the same k over the same activations in one launch (y [m, n], y2 [m, n2];
 * ws holds both's partials), each exactly as its own launch: only when their launch plans agree
 * (_pair_ok). */
int mk_cuda_gemv_fp8_pair_ok(const mk_cuda_ctx *ctx, const mk_wmat *W, const mk_wmat *W2);
int mk_cuda_gemv_fp8_pair(mk_cuda_ctx *ctx, const mk_wmat *W, const mk_wmat *W2, const uint8_t *xq, const float *sa,
                          int m, float *y, float *y2, int round, float *ws, mk_err *err);
int mk_cuda_gemv_fp4(mk_cuda_ctx *ctx, const mk_wmat *W, const uint8_t *xq, const float *sa, int m,
                     float *y, int round, float *ws, mk_err *err);
/* Up to MK_CUDA_MULTI bf16 matrices of the same k and launch plan (no split-K) over xb in one launch. */
int mk_cuda_gemv_bf16_multi_ok(const mk_cuda_ctx *ctx, int count, const mk_wmat *const *W);
int mk_cuda_gemv_bf16_multi(mk_cuda_ctx *ctx, int count, const mk_wmat *const *W, const uint16_t *xb, int m,
                            float *const *y, const int *round, mk_err *err);
int mk_cuda_gemv_bf16(mk_cuda_ctx *ctx, const mk_wmat *W, const uint16_t *xb, int m, float *y,
                      int round, float *ws, mk_err *err);
/* mk_cuda_gemv_bf16 of m <= MK_CUDA_AM_ROWS rows on the warp-pipelined GEMV (its plan, or slab tiles) with
 * each row's argmax (mk_cuda_argmax_rows' rule) into am in the same launch (_ok: whether it applies). One
 * such launch at a time per context: the blocks' winners go through the context's am_v / am_i / am_n.
 * mk_cuda_gemv_bf16_am_ok: ops_cuda.h. */
int mk_cuda_gemv_bf16_am(mk_cuda_ctx *ctx, const mk_wmat *W, const uint16_t *xb, int m, float *y, int round,
                         int32_t *am, mk_err *err);
/* dq with G > 1: W [G gn, k] block-diagonal over G groups, xh / sx rows of G k (x's group i is
 * columns [i k, (i + 1) k)), y rows of G gn; each group computed as its own [gn, k] launch. */
int mk_cuda_gemv_dq(mk_cuda_ctx *ctx, const mk_wmat *W, int G, const uint16_t *xh, const float *sx, int m,
                    float *y, int round, float *ws, mk_err *err);
/* Any kind, any m: FP8/FP4 read xq (natural layout) and sa, the others read x. */
int mk_cuda_gemv_simple(mk_cuda_ctx *ctx, const mk_wmat *W, const float *x, const uint8_t *xq,
                        const float *sa, int m, float *y, int round, mk_err *err);

/* gemm.cu */
int mk_cuda_gemm_fp8_splits(const mk_cuda_ctx *ctx, int m, int n, int k);
int mk_cuda_gemm_fp8(mk_cuda_ctx *ctx, const mk_wmat *W, const uint8_t *xq, const float *sa, int m,
                     float *y, int round, float *ws, mk_err *err);
int mk_cuda_gemm_bf16_cublas(mk_cuda_ctx *ctx, const mk_wmat *W, const uint16_t *xb, int m,
                             float *y, int round, mk_err *err);

/* RMSNorm's 1 / sqrt(mean + eps) from each thread's sum of squares ss (double): warp trees, the
 * warps in order, by the whole block (every thread gets the same value). */
__device__ __forceinline__ float mk_d_rms_scale(double ss, int d, float eps) {
    __shared__ double part[32];
    ss = mk_d_warp_sum_d(ss);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    double tot = 0.0;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) tot += part[i];
    float var = (float)(tot / d);
    return 1.0f / sqrtf(__fadd_rn(var, eps));
}

/* The butterflies of basic.c's Hadamard transform over hs [n] (shared memory, n a power of two),
 * stage by stage, by the whole block (each output's arithmetic does not depend on which thread
 * computes it); ends with a barrier. Unscaled, unrounded. */
__device__ __forceinline__ void mk_d_hadamard_smem(float *hs, int n) {
    for (int h = 1; h < n; h <<= 1) {
        for (int p = threadIdx.x; p < n / 2; p += blockDim.x) {
            int j = (p / h) * 2 * h + (p % h);
            float a = hs[j], b = hs[j + h];
            hs[j] = __fadd_rn(a, b);
            hs[j + h] = __fsub_rn(a, b);
        }
        __syncthreads();
    }
}

/* RMSNorm of the row xr of d values into yr (may alias) by the whole block, as mk_rmsnorm: squares
 * summed in double (thread-strided, warp trees, warps in order), outputs rounded to bf16. The
 * bits depend on blockDim.x: launch with mk_cuda_rmsnorm_threads(d). */
__device__ __forceinline__ float mk_d_rms_of_row(const float *xr, int d, float eps) {
    double ss = 0.0;
#pragma unroll 4
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += (double)xr[i] * xr[i];
    return mk_d_rms_scale(ss, d, eps);
}

__device__ __forceinline__ void mk_d_rmsnorm_row(const float *xr, int d, const uint16_t *__restrict__ w, float eps, float *yr) {
    const float rs = mk_d_rms_of_row(xr, d, eps);
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float v = __fmul_rn(xr[i], rs);
        if (w) v = __fmul_rn(mk_d_bf16(w[i]), v);
        yr[i] = mk_d_bf16r(v);
    }
}

/* mk_cuda_act_quant's bytes and scales (perm: the FP4 layout) of a row of d values held by the
 * block, thread t holding elements t + j blockDim.x in v[j] (j < 4), the same bits: 128-block b is
 * held by the 128 threads of group b % (blockDim.x / 128) for one j, and its maximum |v| comes from
 * their four warps through shared memory (a maximum is exact in any order). Needs blockDim.x % 128
 * == 0, d % 128 == 0 and d <= 4 blockDim.x; all threads call it. */
/* FAST (hc.cu's tuning hc_fin 1, the default: H100, session 35): the warp maxima as one redux.sync each
 * (mk_d_warp_max_nn) and the bytes as v * (1 / s) (mk_d_act_byte_inv), the same values. */
template <bool FAST = false>
__device__ __forceinline__ void mk_d_quant_row(const float (&v)[4], int d, int perm, uint8_t *__restrict__ q,
                                               float *__restrict__ sa) {
    __shared__ float wmax[4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = threadIdx.x >> 7;
    const int tg = (int)threadIdx.x, T = (int)blockDim.x;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        float a;
        if (FAST) /* fmaxf(|v|, 0) is |v|, or 0 for a NaN (which the maximum's fmaxf passes over): >= 0, not NaN */
            a = mk_d_warp_max_nn(tg + j * T < d ? fmaxf(fabsf(v[j]), 0.0f) : 0.0f);
        else
            a = mk_d_warp_max(tg + j * T < d ? fabsf(v[j]) : 0.0f);
        if (lane == 0) wmax[j][warp] = a;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int i = tg + j * T;
        if (i >= d) continue;
        const float sc = mk_d_act_scale(fmaxf(fmaxf(wmax[j][4 * grp], wmax[j][4 * grp + 1]),
                                              fmaxf(wmax[j][4 * grp + 2], wmax[j][4 * grp + 3])));
        q[mk_d_act_pos(i, perm)] = FAST ? mk_d_act_byte_inv(v[j], mk_d_act_inv(sc)) : mk_d_act_byte(v[j], sc);
        if ((i & 127) == 0) sa[i >> 7] = sc;
    }
}

/* wo_a's input preparation (the FP8_DQ GEMV's activations) of one 128-block by a warp: xh = f16(x / s),
 * s = 2^(ceil(log2 amax) - 15) (1 for an all-zero block), so |xh| <= 2^15 and every bf16 value down to
 * 2^-23 of amax is exact in f16. v: the lane's four values (elements lane * 4 ..; 0 past the row's k).
 * With ro.cs (mk_cuda_rope_at's rotation of the last rd dims of every D-wide head, the row's position
 * pos[r], in place) the block is rotated first, pair by pair with mk_d_rope_pair's arithmetic, and the
 * rotated values written back to xr (the block's first element; the same bits as mk_cuda_rope_at then
 * the preparation; needs D % 4 == 0 and rd % 4 == 0, so a lane's four values are two whole pairs).
 * Row r of k values (nb blocks), block b. k_f16_prep and the decode attention's epilogue
 * (k_sparse_attn_cl's F16) run it. */
struct mk_f16_rope {
    const float *cs;
    const int32_t *pos;
    int tab_half, max_pos, D, rd, inverse;
};
/* The rotation of an mk_cuda_rope_at_desc for rows of k values, checked: D and rd multiples of 4 (a lane's
 * four values are two whole pairs), rd within D and the table, k a multiple of D. */
static inline int mk_f16_rope_of(const mk_cuda_rope_at_desc *rd, int k, mk_f16_rope *ro, mk_err *err) {
    const mk_rope_table *t = rd->table;
    if (rd->D <= 0 || rd->D % 4 || rd->rd <= 0 || rd->rd % 4 || rd->rd > rd->D || rd->rd / 2 > t->half || !t->cs ||
        !rd->pos || k % rd->D)
        return mk_fail(err, MK_EINVAL, "cuda: f16 preparation with rope: D %d, rd %d, k %d, table half %d", rd->D,
                       rd->rd, k, t->half);
    *ro = mk_f16_rope{t->cs, rd->pos, t->half, t->max_pos, rd->D, rd->rd, rd->inverse};
    return MK_OK;
}
__device__ __forceinline__ void mk_d_f16_prep_warp(float (&v)[4], float *xr, int r, int k, int b, int lane,
                                                   __half *__restrict__ xh, float *__restrict__ sx,
                                                   const mk_f16_rope &ro) {
    const int nb = (k + 127) >> 7, base = b * 128, w = min(128, k - base);
    float amax = 0.0f;
    if (ro.cs && lane * 4 < w) {
        const int e = (base + lane * 4) % ro.D, nope = ro.D - ro.rd, pos = ro.pos[r];
        if (e >= nope && pos >= 0 && pos < ro.max_pos) {
#pragma unroll
            for (int q = 0; q < 2; q++) { /* pairs (e, e + 1) and (e + 2, e + 3) */
                const float *c2 = ro.cs + ((size_t)pos * ro.tab_half + (e - nope) / 2 + q) * 2;
                const float c = c2[0], s = ro.inverse ? -c2[1] : c2[1], a = v[2 * q], bb = v[2 * q + 1];
                v[2 * q] = mk_d_bf16r(__fsub_rn(__fmul_rn(a, c), __fmul_rn(bb, s)));
                v[2 * q + 1] = mk_d_bf16r(__fadd_rn(__fmul_rn(a, s), __fmul_rn(bb, c)));
            }
#pragma unroll
            for (int j = 0; j < 4; j++) xr[lane * 4 + j] = v[j];
        }
    }
#pragma unroll
    for (int j = 0; j < 4; j++) amax = fmaxf(amax, fabsf(v[j]));
    amax = mk_d_warp_max(amax);
    float s = 1.0f;
    if (amax > 0.0f && amax <= 3.402823466e38f) {
        uint32_t u = __float_as_uint(amax);
        int e = (int)((u >> 23) & 0xff) - 127 + ((u & 0x7fffffu) != 0) - 15;
        s = ldexpf(1.0f, e < -126 ? -126 : e);
    }
    __half *hr = xh + (size_t)r * k + base;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        int i = lane * 4 + j;
        if (i < w) hr[i] = __float2half_rn(__fdiv_rn(v[j], s));
    }
    if (lane == 0) sx[(size_t)r * nb + b] = s;
}

/* mk_d_rmsnorm_row, then mk_d_quant_row of the normalized row into q / sa: the bits of
 * mk_cuda_rmsnorm then mk_cuda_act_quant (mk_d_quant_row's conditions). */
__device__ __forceinline__ void mk_d_rmsnorm_quant_row(const float *xr, int d, const uint16_t *__restrict__ w,
                                                       float eps, float *yr, int perm, uint8_t *__restrict__ q,
                                                       float *__restrict__ sa) {
    const float rs = mk_d_rms_of_row(xr, d, eps);
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int i = threadIdx.x + j * blockDim.x;
        v[j] = 0.0f;
        if (i < d) {
            float t = __fmul_rn(xr[i], rs);
            if (w) t = __fmul_rn(mk_d_bf16(w[i]), t);
            yr[i] = v[j] = mk_d_bf16r(t);
        }
    }
    mk_d_quant_row(v, d, perm, q, sa);
}


#endif
