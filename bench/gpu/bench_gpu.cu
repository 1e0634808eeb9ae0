/* bench_gpu.cu — GPU benchmark of the decode-critical kernels against the machine's own ceilings,
 * all measured in one run (bench/gpu/run.sh drives it on the GPU machine).
 *
 *   1. HBM bandwidth: a device-to-device cudaMemcpy (bytes read + written; launched directly, as
 *      a graph memcpy node goes through the slower copy engines), a copy kernel and a read-only
 *      kernel (16-byte loads, several in flight per thread), over 2 GiB buffers (>> L2); and the
 *      cost of an empty kernel node in a graph (the per-op floor).
 *   2. mk_cuda_linear at DeepSeek-V4-Flash decode shapes (m = 1, and a few m <= 8): time per call,
 *      bytes of weights (+ scales) per call over that time, and that rate as a fraction of both
 *      bandwidths. Each timed loop rotates over enough weight copies to exceed the L2 many times
 *      and is replayed as a CUDA graph (launch gaps as in a captured decode step). "op" includes
 *      the activation quantization kernel; "kernel" reuses the quantized activations
 *      (MK_CUDA_LIN_REUSE_X), i.e. the GEMV alone. cuBLAS's bf16 GEMV gives a reference point.
 *   2c. The head's GEMV (bf16 129280 x 4096) at 1 and 8 rows with its weights in rows and in slab
 *      tiles (mk_cuda_bf16_tiles), alternating.
 *   3. The FP8 GEMM at m = 64 / 256 against cuBLAS bf16 GEMM (bf16 weights and activations, fp32
 *      accumulation) on the same shapes, and cuBLAS bf16 at 8192^3 as the matrix-rate ceiling.
 *   4. The GPU draw (mk_cuda_sample_rows) at vocabulary 129280, 1 to 64 rows, over peaked (normal,
 *      sd 2.5) and near-uniform logits, one block or a cluster per row (sample_cluster, with no row
 *      limit), with and without weight bins (sample_bins), and with the context's defaults (the
 *      cluster up to sample_cluster_rows rows): time per call.
 *
 * Weights are random bytes in the real formats (FP8 without NaN codes, FP4, e8m0 scales near
 * 2^-7), activations random bf16 values: never zeros, which run faster than real data.
 * Usage: bench_gpu [results.md]   (the markdown also goes to stdout)
 */
#include "ops/cuda/cuda_common.cuh"
#include "ops/cuda/ops_cuda.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef MK_HAVE_CUBLAS
#define MK_HAVE_CUBLAS 1
#endif
#if MK_HAVE_CUBLAS
#include <cublas_v2.h>
#endif

static FILE *md;
static void out(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    if (md) {
        va_start(ap, fmt);
        vfprintf(md, fmt, ap);
        va_end(ap);
    }
    fflush(stdout);
}

#define CU(x)                                                                                     \
    do {                                                                                          \
        cudaError_t e_ = (x);                                                                     \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));  \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)
#define MK(x)                                                                                     \
    do {                                                                                          \
        mk_err err_ = {0, {0}};                                                                   \
        int s_ = (x);                                                                             \
        if (s_) {                                                                                 \
            fprintf(stderr, "%s:%d: %s -> %d: %s\n", __FILE__, __LINE__, #x, s_, err_.msg);       \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

static mk_cuda_ctx *ctx;
static cudaStream_t stream;

/* ---- random device data ------------------------------------------------------------------ */

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* mode 0: e4m3 bytes without NaN; 1: any byte (packed e2m1); 2: e8m0 scales 2^-10 .. 2^-3 */
__global__ void k_fill_bytes(uint8_t *p, size_t n, uint64_t seed, int mode) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t r = mix64(seed + i * 0x9e3779b97f4a7c15ull);
        uint8_t b = (uint8_t)r;
        if (mode == 0 && (b & 0x7f) == 0x7f) b ^= 1;
        if (mode == 2) b = (uint8_t)(117 + (r % 8));
        p[i] = b;
    }
}
/* bf16 values of magnitude up to ~0.1 */
__global__ void k_fill_bf16(uint16_t *p, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t r = mix64(seed + i * 0x9e3779b97f4a7c15ull);
        float v = ((float)(r & 0xffffff) / 16777216.0f - 0.5f) * 0.2f;
        p[i] = (uint16_t)(__float_as_uint(v) >> 16);
    }
}
/* activations: bf16 values in [-2, 2) */
__global__ void k_fill_act(float *p, size_t n, uint64_t seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t r = mix64(seed + i * 0x9e3779b97f4a7c15ull);
        float v = ((float)(r & 0xffffff) / 16777216.0f - 0.5f) * 4.0f;
        p[i] = __uint_as_float(__float_as_uint(v) & 0xffff0000u);
    }
}

static uint64_t seed_ctr = 1;
static void fill_bytes(void *p, size_t n, int mode) {
    k_fill_bytes<<<1024, 256, 0, stream>>>((uint8_t *)p, n, (seed_ctr++) * 0x1234567ull, mode);
    CU(cudaGetLastError());
}
static void *dalloc(size_t bytes) {
    void *p = NULL;
    CU(cudaMalloc(&p, bytes));
    return p;
}

/* A device weight matrix of `kind` with random data (formats as stored). */
static mk_wmat make_w(mk_wkind kind, int n, int k) {
    mk_wmat W;
    memset(&W, 0, sizeof W);
    W.kind = kind;
    W.n = n;
    W.k = k;
    size_t nk = (size_t)n * k;
    if (kind == MK_W_FP8 || kind == MK_W_FP8_DQ) {
        W.w = dalloc(nk);
        fill_bytes((void *)W.w, nk, 0);
        size_t ns = (size_t)((n + 127) / 128) * ((k + 127) / 128);
        W.scale = (const uint8_t *)dalloc(ns);
        fill_bytes((void *)W.scale, ns, 2);
    } else if (kind == MK_W_FP4) {
        W.w = dalloc(nk / 2);
        fill_bytes((void *)W.w, nk / 2, 1);
        size_t ns = (size_t)n * (k / 32);
        W.scale = (const uint8_t *)dalloc(ns);
        fill_bytes((void *)W.scale, ns, 2);
    } else {
        W.w = dalloc(nk * 2);
        k_fill_bf16<<<1024, 256, 0, stream>>>((uint16_t *)W.w, nk, (seed_ctr++) * 77ull);
        CU(cudaGetLastError());
    }
    return W;
}
static void free_w(mk_wmat *W) {
    cudaFree((void *)W->w);
    if (W->scale) cudaFree((void *)W->scale);
}
static size_t w_bytes(const mk_wmat *W) {
    size_t nk = (size_t)W->n * W->k;
    switch (W->kind) {
    case MK_W_BF16: return nk * 2;
    case MK_W_F32: return nk * 4;
    case MK_W_FP8:
    case MK_W_FP8_DQ: return nk + (size_t)((W->n + 127) / 128) * ((W->k + 127) / 128);
    case MK_W_FP4: return nk / 2 + (size_t)W->n * (W->k / 32);
    }
    return 0;
}

/* ---- timing ------------------------------------------------------------------------------ */

typedef void (*work_fn)(void *arg, int i);

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median seconds per call of fn over `per` calls captured into one graph, `reps` replays. */
static double time_graph(work_fn fn, void *arg, int per, int reps) {
    for (int i = 0; i < per; i++) fn(arg, i); /* warm-up, outside the capture */
    CU(cudaStreamSynchronize(stream));
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CU(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    for (int i = 0; i < per; i++) fn(arg, i);
    CU(cudaStreamEndCapture(stream, &g));
    CU(cudaGraphInstantiate(&ge, g, 0));
    CU(cudaGraphLaunch(ge, stream));
    CU(cudaStreamSynchronize(stream));
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    double t[64];
    if (reps > 64) reps = 64;
    for (int r = 0; r < reps; r++) {
        CU(cudaEventRecord(e0, stream));
        CU(cudaGraphLaunch(ge, stream));
        CU(cudaEventRecord(e1, stream));
        CU(cudaEventSynchronize(e1));
        float ms;
        CU(cudaEventElapsedTime(&ms, e0, e1));
        t[r] = ms * 1e-3 / per;
    }
    qsort(t, reps, sizeof t[0], cmp_d);
    CU(cudaEventDestroy(e0));
    CU(cudaEventDestroy(e1));
    CU(cudaGraphExecDestroy(ge));
    CU(cudaGraphDestroy(g));
    return t[reps / 2];
}

/* ---- 1. bandwidth -------------------------------------------------------------------------- */

__global__ void k_read(const uint4 *__restrict__ p, size_t n16, uint32_t *sink) {
    uint32_t acc = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
              d = __ldcs(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n16; i += stride) {
        uint4 a = __ldcs(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == 0x12345678u) sink[0] = acc; /* keeps the loads; practically never taken */
}

__global__ void k_copy(const uint4 *__restrict__ src, uint4 *__restrict__ dst, size_t n16) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        uint4 a = __ldcs(src + i), b = __ldcs(src + i + stride), c = __ldcs(src + i + 2 * stride),
              d = __ldcs(src + i + 3 * stride);
        __stcs(dst + i, a);
        __stcs(dst + i + stride, b);
        __stcs(dst + i + 2 * stride, c);
        __stcs(dst + i + 3 * stride, d);
    }
    for (; i < n16; i += stride) __stcs(dst + i, __ldcs(src + i));
}

__global__ void k_empty(void) {}

typedef struct {
    void *a, *b;
    size_t bytes;
    uint32_t *sink;
    int blocks;
} bw_arg;
static void w_memcpy(void *arg, int i) {
    bw_arg *A = (bw_arg *)arg;
    CU(cudaMemcpyAsync(i & 1 ? A->a : A->b, i & 1 ? A->b : A->a, A->bytes, cudaMemcpyDeviceToDevice, stream));
}
static void w_copy(void *arg, int i) {
    bw_arg *A = (bw_arg *)arg;
    k_copy<<<A->blocks, 512, 0, stream>>>((const uint4 *)(i & 1 ? A->b : A->a), (uint4 *)(i & 1 ? A->a : A->b), A->bytes / 16);
    CU(cudaGetLastError());
}
static void w_read(void *arg, int i) {
    bw_arg *A = (bw_arg *)arg;
    k_read<<<A->blocks, 512, 0, stream>>>((const uint4 *)(i & 1 ? A->b : A->a), A->bytes / 16, A->sink);
    CU(cudaGetLastError());
}
static void w_empty(void *arg, int i) {
    (void)arg;
    (void)i;
    k_empty<<<1, 32, 0, stream>>>();
    CU(cudaGetLastError());
}

/* Median seconds per call of fn, launched directly (no graph), `per` calls per timed group. */
static double time_direct(work_fn fn, void *arg, int per, int reps) {
    for (int i = 0; i < 2; i++) fn(arg, i);
    CU(cudaStreamSynchronize(stream));
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    double t[64];
    if (reps > 64) reps = 64;
    for (int r = 0; r < reps; r++) {
        CU(cudaEventRecord(e0, stream));
        for (int i = 0; i < per; i++) fn(arg, i);
        CU(cudaEventRecord(e1, stream));
        CU(cudaEventSynchronize(e1));
        float ms;
        CU(cudaEventElapsedTime(&ms, e0, e1));
        t[r] = ms * 1e-3 / per;
    }
    qsort(t, reps, sizeof t[0], cmp_d);
    CU(cudaEventDestroy(e0));
    CU(cudaEventDestroy(e1));
    return t[reps / 2];
}

static double bw_copy_rw, bw_read, t_node;

static void bench_bandwidth(void) {
    bw_arg A;
    A.bytes = (size_t)2 << 30;
    A.a = dalloc(A.bytes);
    A.b = dalloc(A.bytes);
    A.sink = (uint32_t *)dalloc(64);
    fill_bytes(A.a, A.bytes, 1);
    fill_bytes(A.b, A.bytes, 1);
    A.blocks = mk_cuda_ctx_caps(ctx)->sm_count * 4;
    double tm = time_direct(w_memcpy, &A, 4, 9);
    double tmg = time_graph(w_memcpy, &A, 4, 9);
    double tc = time_direct(w_copy, &A, 4, 9);
    double tr = time_direct(w_read, &A, 4, 9);
    t_node = time_graph(w_empty, &A, 100, 9);
    bw_copy_rw = 2.0 * A.bytes / tm / 1e9;
    bw_read = A.bytes / tr / 1e9;
    out("## HBM bandwidth (2 GiB buffers)\n\n| measurement | GB/s |\n| --- | --- |\n");
    out("| cudaMemcpyAsync device-to-device (bytes read + written) | **%.0f** |\n", bw_copy_rw);
    out("| the same copy as a CUDA-graph memcpy node (bytes read + written) | %.0f |\n", 2.0 * A.bytes / tmg / 1e9);
    out("| copy kernel, 16-byte loads and stores (bytes read + written) | %.0f |\n", 2.0 * A.bytes / tc / 1e9);
    out("| read-only kernel, 16-byte loads | **%.0f** |\n", bw_read);
    out("| datasheet-style peak (memory clock x bus width) | %.0f |\n\n", mk_cuda_ctx_caps(ctx)->dram_peak_gbs);
    out("An empty kernel costs %.2f us per node in a CUDA graph of 100 (the floor under every op below).\n\n", t_node * 1e6);
    cudaFree(A.a);
    cudaFree(A.b);
    cudaFree(A.sink);
}

/* ---- 2. linear at decode shapes ------------------------------------------------------------ */

#define MAXCOPIES 64
typedef struct {
    mk_wmat W[MAXCOPIES];
    int ncopies;
    float *x, *y;
    void *scratch;
    size_t sbytes;
    int m, flags;
    mk_cuda_kernel kern;
} lin_arg;

static void w_linear(void *arg, int i) {
    lin_arg *L = (lin_arg *)arg;
    MK(mk_cuda_linear_ex(ctx, L->kern, L->flags, &L->W[i % L->ncopies], L->x, L->m, L->y, 1,
                         L->scratch, L->sbytes, &err_));
}

static void lin_setup(lin_arg *L, mk_wkind kind, int n, int k, int maxm, size_t target_bytes) {
    memset(L, 0, sizeof *L);
    L->W[0] = make_w(kind, n, k);
    size_t b = w_bytes(&L->W[0]);
    int c = (int)((target_bytes + b - 1) / b);
    if (c > MAXCOPIES) c = MAXCOPIES;
    if (c < 1) c = 1;
    for (int i = 1; i < c; i++) L->W[i] = make_w(kind, n, k);
    L->ncopies = c;
    L->x = (float *)dalloc(sizeof(float) * (size_t)maxm * k);
    k_fill_act<<<256, 256, 0, stream>>>(L->x, (size_t)maxm * k, (seed_ctr++) * 31ull);
    CU(cudaGetLastError());
    L->y = (float *)dalloc(sizeof(float) * (size_t)maxm * n);
    L->sbytes = mk_cuda_linear_scratch(ctx, &L->W[0], maxm);
    L->scratch = dalloc(L->sbytes);
}
static void lin_free(lin_arg *L) {
    for (int i = 0; i < L->ncopies; i++) free_w(&L->W[i]);
    cudaFree(L->x);
    cudaFree(L->y);
    cudaFree(L->scratch);
}

typedef struct {
    const char *name;
    mk_wkind kind;
    int n, k;
} shape;

static const char *kind_str(mk_wkind k) {
    return k == MK_W_FP8 ? "fp8" : k == MK_W_FP4 ? "fp4" : k == MK_W_BF16 ? "bf16" : k == MK_W_FP8_DQ ? "fp8 (dq)" : "f32";
}

static void bench_row(const shape *S, int m, mk_cuda_kernel kern, int with_kernel_only) {
    lin_arg L;
    lin_setup(&L, S->kind, S->n, S->k, m, (size_t)1 << 30);
    L.m = m;
    L.kern = kern;
    size_t bytes = w_bytes(&L.W[0]);
    int per = bytes > ((size_t)256 << 20) ? 8 : 50;
    double t = time_graph(w_linear, &L, per, 9);
    double gbs = bytes / t / 1e9;
    char konly[64] = "-";
    if (with_kernel_only && S->kind != MK_W_FP8_DQ) {
        /* the previous calls left the quantized x in scratch: time the GEMV alone */
        L.flags = MK_CUDA_LIN_REUSE_X;
        double t2 = time_graph(w_linear, &L, per, 9);
        snprintf(konly, sizeof konly, "%.2f us, %.0f GB/s (%.0f%%)", t2 * 1e6, bytes / t2 / 1e9,
                 100.0 * bytes / t2 / 1e9 / bw_copy_rw);
    }
    out("| %s | %s %dx%d | %d | %s | %.1f | %.2f | %.0f | %.0f%% | %.0f%% | %s |\n", S->name,
        kind_str(S->kind), S->n, S->k, m, mk_cuda_linear_kernel_name(ctx, kern, &L.W[0], m),
        bytes / 1e6, t * 1e6, gbs, 100.0 * gbs / bw_copy_rw, 100.0 * gbs / bw_read, konly);
    lin_free(&L);
}

#if MK_HAVE_CUBLAS
static cublasHandle_t cub;
typedef struct {
    void *W[MAXCOPIES];
    int ncopies;
    void *x, *y;
    int m, n, k;
} cub_arg;
static void w_cublas(void *arg, int i) {
    cub_arg *C = (cub_arg *)arg;
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = cublasGemmEx(cub, CUBLAS_OP_T, CUBLAS_OP_N, C->n, C->m, C->k, &one,
                                    C->W[i % C->ncopies], CUDA_R_16BF, C->k, C->x, CUDA_R_16BF,
                                    C->k, &zero, C->y, CUDA_R_16BF, C->n, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasGemmEx failed: %d\n", (int)s);
        exit(1);
    }
}
/* seconds per cuBLAS bf16 GEMM y[m, n] = x[m, k] W[n, k]^T, bf16 out, fp32 accumulation */
static double time_cublas(int m, int n, int k, int *copies_out) {
    cub_arg C;
    memset(&C, 0, sizeof C);
    C.m = m;
    C.n = n;
    C.k = k;
    size_t b = (size_t)n * k * 2;
    int c = (int)((((size_t)1 << 30) + b - 1) / b);
    if (c > MAXCOPIES) c = MAXCOPIES;
    if (c < 1) c = 1;
    for (int i = 0; i < c; i++) {
        C.W[i] = dalloc(b);
        k_fill_bf16<<<1024, 256, 0, stream>>>((uint16_t *)C.W[i], (size_t)n * k, (seed_ctr++) * 5ull);
    }
    C.ncopies = c;
    C.x = dalloc((size_t)m * k * 2);
    k_fill_bf16<<<256, 256, 0, stream>>>((uint16_t *)C.x, (size_t)m * k, (seed_ctr++) * 3ull);
    C.y = dalloc((size_t)m * n * 2);
    CU(cudaGetLastError());
    double flop = 2.0 * m * n * k;
    int per = flop > 1e11 ? 5 : 30;
    double t = time_graph(w_cublas, &C, per, 9);
    for (int i = 0; i < c; i++) cudaFree(C.W[i]);
    cudaFree(C.x);
    cudaFree(C.y);
    if (copies_out) *copies_out = c;
    return t;
}
#endif

static void bench_decode(void) {
    static const shape shapes[] = {
        {"attn.wq_a", MK_W_FP8, 1024, 4096},      {"attn.wkv", MK_W_FP8, 512, 4096},
        {"attn.wq_b", MK_W_FP8, 32768, 1024},     {"attn.wo_b", MK_W_FP8, 4096, 8192},
        {"square", MK_W_FP8, 4096, 4096},         {"shared_experts.w1/w3", MK_W_FP8, 2048, 4096},
        {"shared_experts.w2", MK_W_FP8, 4096, 2048}, {"experts.E.w1/w3", MK_W_FP4, 2048, 4096},
        {"experts.E.w2", MK_W_FP4, 4096, 2048},   {"attn.wo_a (one group)", MK_W_FP8_DQ, 1024, 4096},
        {"ffn.gate", MK_W_BF16, 256, 4096},       {"head", MK_W_BF16, 129280, 4096},
    };
    out("## Linear at decode shapes (bf16-rounded outputs; CUDA-graph replay, weights rotated over >= 1 GiB of copies)\n\n");
    out("bandwidth fractions are of the device-to-device cudaMemcpy (read + write) %.0f GB/s and of the read-only kernel %.0f GB/s measured above; default tuning: 16 warps/SM, no split-K, programmatic dependent launch on\n\n",
        bw_copy_rw, bw_read);
    out("| weight | kind / shape [n, k] | m | kernel | MB / call | us / call (op) | GB/s (op) | of copy | of read-only | kernel alone (x reused) |\n");
    out("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) bench_row(&shapes[i], 1, MK_CUDA_K_AUTO, 1);
    static const shape sq = {"square", MK_W_FP8, 4096, 4096}, ex = {"experts.E.w1/w3", MK_W_FP4, 2048, 4096},
                       bf = {"bf16 square", MK_W_BF16, 4096, 4096};
    bench_row(&sq, 1, MK_CUDA_K_SIMPLE, 0);
    bench_row(&sq, 4, MK_CUDA_K_AUTO, 1);
    bench_row(&sq, 8, MK_CUDA_K_AUTO, 1);
    bench_row(&ex, 2, MK_CUDA_K_AUTO, 1);
    bench_row(&ex, 8, MK_CUDA_K_AUTO, 1);
    bench_row(&ex, 1, MK_CUDA_K_SIMPLE, 0);
    static const shape dq = {"attn.wo_a (one group)", MK_W_FP8_DQ, 1024, 4096};
    bench_row(&dq, 1, MK_CUDA_K_SIMPLE, 0);
    bench_row(&dq, 8, MK_CUDA_K_AUTO, 1);
    bench_row(&bf, 1, MK_CUDA_K_AUTO, 1);
    /* the tuning knobs, one at a time against the defaults (16 warps/SM, no split-K, PDL on) */
    static const shape sw[] = {{"attn.wq_a", MK_W_FP8, 1024, 4096},      {"attn.wkv", MK_W_FP8, 512, 4096},
                               {"square", MK_W_FP8, 4096, 4096},         {"attn.wo_b", MK_W_FP8, 4096, 8192},
                               {"experts.E.w1/w3", MK_W_FP4, 2048, 4096}, {"attn.wo_a (one group)", MK_W_FP8_DQ, 1024, 4096},
                               {"ffn.gate", MK_W_BF16, 256, 4096}};
    static const struct {
        const char *name;
        int wps, splits, pdl;
    } knobs[] = {{"no PDL", 16, 1, 0}, {"split-K up to 16", 16, 16, 1}, {"8 warps/SM", 8, 1, 1}};
    mk_cuda_tuning tun, def;
    mk_cuda_ctx_get_tuning(ctx, &def);
    for (size_t w = 0; w < sizeof knobs / sizeof knobs[0]; w++) {
        tun = def;
        tun.gemv_warps_per_sm = knobs[w].wps;
        tun.gemv_max_splits = knobs[w].splits;
        tun.gemv_pdl = knobs[w].pdl;
        mk_cuda_ctx_set_tuning(ctx, &tun);
        for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++) {
            char nm[96];
            snprintf(nm, sizeof nm, "%s [%s]", sw[i].name, knobs[w].name);
            shape S = sw[i];
            S.name = nm;
            bench_row(&S, 1, MK_CUDA_K_AUTO, 1);
        }
    }
    mk_cuda_ctx_set_tuning(ctx, &def);
#if MK_HAVE_CUBLAS
    double t = time_cublas(1, 4096, 4096, NULL);
    double b = 4096.0 * 4096 * 2;
    out("| bf16 square (cuBLAS GemmEx, reference) | bf16 4096x4096 | 1 | cublas | %.1f | %.2f | %.0f | %.0f%% | %.0f%% | - |\n",
        b / 1e6, t * 1e6, b / t / 1e9, 100.0 * b / t / 1e9 / bw_copy_rw, 100.0 * b / t / 1e9 / bw_read);
#endif
    out("\n");
}

/* ---- 2b. the decode experts: the expert GEMV against the wgmma design probe ----------------- */

/* One decode step's routed experts (K = 6 picks of E = 64, V4-Flash widths), w1 / w3 in one launch and
 * w2 in another, by mk_cuda_moe_gemv_fp4 (mma.sync, the model's kernel) and by mk_cuda_probe_wgmma_fp4
 * (sm_90a wgmma, a design probe: bench/gpu/results-2026-12-07.md). Each call takes the next of 10
 * plans of 6 experts not picked by the previous 9 calls, so the weights (~75 MB a step) come from
 * HBM, not L2. Random bytes: the speed does not depend on the values. */
#define MOEB_E 64
#define MOEB_K 6
#define MOEB_P 10
typedef struct {
    const void **tw; /* device tables: w1 [E], w3 [E], w2 [E] */
    const uint8_t **ts;
    int32_t *plan[MOEB_P];
    uint8_t *xq, *aq;
    float *sa, *saa, *y1, *y3, *y2;
    int d, I, wg, w2;
} moeb_arg;
static void w_moeb(void *arg, int i) {
    moeb_arg *A = (moeb_arg *)arg;
    const void *const *W1 = A->tw, *const *W3 = W1 + MOEB_E, *const *W2 = W1 + 2 * MOEB_E;
    const uint8_t *const *S1 = A->ts, *const *S3 = S1 + MOEB_E, *const *S2 = S1 + 2 * MOEB_E;
    const int32_t *pl = A->plan[i % MOEB_P];
    if (!A->w2 && !A->wg)
        MK(mk_cuda_moe_gemv_fp4(ctx, W1, S1, W3, S3, A->I, A->d, A->xq, A->sa, 1, pl, 1, MOEB_K, MOEB_E, A->y1, A->y3, 0,
                                &err_));
    else if (!A->w2)
        MK(mk_cuda_probe_wgmma_fp4(ctx, W1, S1, W3, S3, A->I, A->d, A->xq, A->sa, 1, pl, MOEB_K, MOEB_E, A->y1, A->y3,
                                   &err_));
    else if (!A->wg)
        MK(mk_cuda_moe_gemv_fp4(ctx, W2, S2, NULL, NULL, A->d, A->I, A->aq, A->saa, 0, pl, 1, MOEB_K, MOEB_E, A->y2, NULL,
                                0, &err_));
    else
        MK(mk_cuda_probe_wgmma_fp4(ctx, W2, S2, NULL, NULL, A->d, A->I, A->aq, A->saa, 0, pl, MOEB_K, MOEB_E, A->y2,
                                   NULL, &err_));
}
__global__ void k_fill_f32(float *p, size_t n, float v) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}
static void bench_moe_wgmma(void) {
    if (mk_cuda_ctx_caps(ctx)->cc_major != 9) return;
    const int d = 4096, I = 2048;
    mk_wmat *W = (mk_wmat *)calloc(3 * MOEB_E, sizeof(mk_wmat));
    const void *tw[3 * MOEB_E];
    const uint8_t *ts[3 * MOEB_E];
    for (int i = 0; i < 3 * MOEB_E; i++) {
        W[i] = i < 2 * MOEB_E ? make_w(MK_W_FP4, I, d) : make_w(MK_W_FP4, d, I);
        tw[i] = W[i].w, ts[i] = W[i].scale;
    }
    moeb_arg A;
    memset(&A, 0, sizeof A);
    A.d = d, A.I = I;
    A.tw = (const void **)dalloc(sizeof tw), A.ts = (const uint8_t **)dalloc(sizeof ts);
    CU(cudaMemcpy((void *)A.tw, tw, sizeof tw, cudaMemcpyHostToDevice));
    CU(cudaMemcpy((void *)A.ts, ts, sizeof ts, cudaMemcpyHostToDevice));
    int32_t *didx = (int32_t *)dalloc(sizeof(int32_t) * MOEB_K);
    float *dgw = (float *)dalloc(sizeof(float) * MOEB_K), *dsw = (float *)dalloc(sizeof(float) * MOEB_K);
    const float gw[MOEB_K] = {0.3f, 0.2f, 0.2f, 0.1f, 0.1f, 0.1f};
    CU(cudaMemcpy(dgw, gw, sizeof gw, cudaMemcpyHostToDevice));
    for (int p = 0; p < MOEB_P; p++) {
        int32_t idx[MOEB_K];
        for (int j = 0; j < MOEB_K; j++) idx[j] = (p * MOEB_K + j) % MOEB_E;
        CU(cudaMemcpy(didx, idx, sizeof idx, cudaMemcpyHostToDevice));
        A.plan[p] = (int32_t *)dalloc(sizeof(int32_t) * mk_cuda_moe_plan_ints(1, MOEB_K, MOEB_E));
        MK(mk_cuda_moe_plan(ctx, didx, dgw, 1, MOEB_K, MOEB_E, A.plan[p], dsw, &err_));
    }
    A.xq = (uint8_t *)dalloc((size_t)d), A.aq = (uint8_t *)dalloc((size_t)MOEB_K * I);
    fill_bytes(A.xq, (size_t)d, 0), fill_bytes(A.aq, (size_t)MOEB_K * I, 0);
    A.sa = (float *)dalloc(sizeof(float) * (d / 128)), A.saa = (float *)dalloc(sizeof(float) * (MOEB_K * I / 128));
    k_fill_f32<<<8, 256, 0, stream>>>(A.sa, d / 128, 1.0f / 64);
    k_fill_f32<<<8, 256, 0, stream>>>(A.saa, MOEB_K * I / 128, 1.0f / 64);
    CU(cudaGetLastError());
    A.y1 = (float *)dalloc(sizeof(float) * MOEB_K * I), A.y3 = (float *)dalloc(sizeof(float) * MOEB_K * I);
    A.y2 = (float *)dalloc(sizeof(float) * MOEB_K * d);
    out("## Decode experts: the expert GEMV (mma.sync) against the wgmma design probe\n\n");
    out("6 picks of 64 experts of 2048 x 4096 FP4 (V4-Flash), a new set each call (10 plans); CUDA-graph replay of 50 calls\n\n");
    out("| matrices | MB / call | expert GEMV (mma.sync) us | GB/s (of copy) | wgmma probe us | GB/s (of copy) |\n| --- | --- | --- | --- | --- | --- |\n");
    for (int w2 = 0; w2 <= 1; w2++) {
        const double mb = (double)MOEB_K * (w2 ? 1 : 2) * ((double)I * d / 2 + (double)I * d / 32);
        A.w2 = w2, A.wg = 0;
        const double t0 = time_graph(w_moeb, &A, 50, 9);
        A.wg = 1;
        const double t1 = time_graph(w_moeb, &A, 50, 9);
        out("| %s | %.1f | %.2f | %.0f (%.0f%%) | %.2f | %.0f (%.0f%%) |\n", w2 ? "w2" : "w1 + w3", mb / 1e6, t0 * 1e6,
            mb / t0 / 1e9, 100.0 * mb / t0 / 1e9 / bw_copy_rw, t1 * 1e6, mb / t1 / 1e9, 100.0 * mb / t1 / 1e9 / bw_copy_rw);
    }
    out("\n");
    for (int i = 0; i < 3 * MOEB_E; i++) free_w(&W[i]);
    free(W);
    for (int p = 0; p < MOEB_P; p++) cudaFree(A.plan[p]);
    void *dv[] = {(void *)A.tw, (void *)A.ts, didx, dgw, dsw, A.xq, A.aq, A.sa, A.saa, A.y1, A.y3, A.y2};
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++) cudaFree(dv[i]);
}

/* ---- 2c. the expert GEMV's read pattern alone ------------------------------------------------ */

/* k_pat<MODE>: the decode expert GEMV's loads (k_moe_gemv_fp4<1, 2, 3>: grid (64, 6, 2) of 256 threads,
 * 3 blocks an SM, a block 32 rows = 2 slabs of 16 of one expert's 2048 x 4096 FP4 matrix, warp w the
 * 128-blocks [4 w, 4 w + 4) of k, one 128-block an iteration: two 16-byte weight loads per slab and a
 * thread, and the 4-byte scale words) without the arithmetic: the loaded words are XORed, so what is
 * timed is how fast that pattern of addresses streams. MODE 0: the expert layout (row-major rows, a
 * thread's 16 bytes at t 16 + kb 64 of rows g and g + 8: every 64-byte piece of a row comes from another
 * warp or iteration); 1: the same loads from a tiled layout (a block's 64 KB contiguous, a warp's
 * iteration one 2 KB run: [kb][slab][half][lane] x 16 bytes, its scales [kb][slab][half][g] x 4 bytes);
 * 2: the expert layout with the warps' 128-blocks interleaved (warp w: kb = w + 8 i, so one iteration of
 * the 8 warps covers 512 contiguous bytes of each row); 3: the expert layout, two 128-blocks an iteration
 * (128 contiguous bytes of a row, k_moe_gemv_fp4<2, 2>'s loads). Modes 0-3 keep the iterations a rolled
 * loop, as the expert GEMV's k loop is (its PTX: the next iteration's loads wait for this one's MMAs);
 * 4 and 5 are 0 and 1 with the 4 iterations' loads all issued first (what a software pipeline of the
 * k loop could reach at most). */
#define PAT_E 64
#define PAT_ROWS 2048
#define PAT_ROWB 2048 /* bytes of a row: 4096 FP4 */
#define PAT_SROWB 128 /* scale bytes of a row: 4096 / 32 */
template <int MODE>
__global__ void __launch_bounds__(256, 3) k_pat(const uint8_t *__restrict__ buf, const int32_t *__restrict__ ex,
                                                uint32_t *sink) {
    extern __shared__ uint32_t pad_smem[]; /* dynamic shared memory only to hold occupancy at 3 */
    const size_t matb = (size_t)PAT_ROWS * PAT_ROWB, scb = (size_t)PAT_ROWS * PAT_SROWB;
    const int e = ex[blockIdx.y], z = blockIdx.z;
    const uint8_t *W = buf + (size_t)(e * 2 + z) * (matb + scb), *S = W + matb;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const bool tiled = MODE == 1 || MODE == 5, all_first = MODE >= 4;
    const int U = MODE == 3 ? 2 : all_first ? 4 : 1;
    /* a load's address: 128-block kb, slab q, half h (rows g / g + 8 of the slab) */
    const uint8_t *Wb = W + (size_t)blockIdx.x * 32 * PAT_ROWB, *Sb = S + (size_t)blockIdx.x * 32 * PAT_SROWB;
    uint32_t acc = 0;
#pragma unroll 1
    for (int i = 0; i < 4; i += U) {
        uint4 a[4][2][2];
        uint32_t sw[4][2][2];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int kb = MODE == 2 ? warp + 8 * (i + u) : warp * 4 + i + u;
#pragma unroll
            for (int q = 0; q < 2; q++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int row = q * 16 + h * 8 + g; /* the row in the block's 32 */
                    const uint8_t *wp = tiled ? Wb + (size_t)kb * 2048 + (q * 2 + h) * 512 + lane * 16
                                              : Wb + (size_t)row * PAT_ROWB + t * 16 + (size_t)kb * 64;
                    const uint8_t *sp = tiled ? Sb + kb * 128 + (q * 2 + h) * 32 + g * 4
                                              : Sb + (size_t)row * PAT_SROWB + 4 * kb;
                    a[u][q][h] = mk_d_ld_stream(wp);
                    sw[u][q][h] = *(const uint32_t *)sp;
                }
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int q = 0; q < 2; q++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    acc ^= a[u][q][h].x ^ a[u][q][h].y ^ a[u][q][h].z ^ a[u][q][h].w ^ sw[u][q][h];
    }
    if (acc == 0x12345678u) sink[0] = acc + pad_smem[0]; /* keeps the loads; practically never taken */
}

typedef struct {
    const uint8_t *buf;
    int32_t *ex[MOEB_P];
    uint32_t *sink;
    int mode;
} pat_arg;
#define PAT_SMEM (64 << 10)
static void w_pat(void *arg, int i) {
    pat_arg *A = (pat_arg *)arg;
    const dim3 grid(64, MOEB_K, 2);
    const int32_t *ex = A->ex[i % MOEB_P];
    switch (A->mode) {
    case 0: k_pat<0><<<grid, 256, PAT_SMEM, stream>>>(A->buf, ex, A->sink); break;
    case 1: k_pat<1><<<grid, 256, PAT_SMEM, stream>>>(A->buf, ex, A->sink); break;
    case 2: k_pat<2><<<grid, 256, PAT_SMEM, stream>>>(A->buf, ex, A->sink); break;
    case 3: k_pat<3><<<grid, 256, PAT_SMEM, stream>>>(A->buf, ex, A->sink); break;
    case 4: k_pat<4><<<grid, 256, PAT_SMEM, stream>>>(A->buf, ex, A->sink); break;
    default: k_pat<5><<<grid, 256, PAT_SMEM, stream>>>(A->buf, ex, A->sink); break;
    }
    CU(cudaGetLastError());
}
/* ---- 2c. the head's GEMV in rows and in slab tiles (mk_cuda_bf16_tiles, tuning head_tiles) ------- */

/* The head (bf16 129280 x 4096, 1.06 GB) at 1 and 8 rows, its weights in rows and in slab tiles, two
 * copies of each so every call reads HBM; the two layouts alternate (rows, tiles, rows, tiles) so a
 * drift of the clocks shows. The GEMV alone (the bf16 activations reused). */
static void bench_head(void) {
    out("## The head's GEMV: rows against slab tiles (bf16 129280 x 4096; GEMV alone, activations reused)\n\n");
    out("| layout | m | kernel | us / call | GB/s | of copy | of read-only |\n| --- | --- | --- | --- | --- | --- | --- |\n");
    lin_arg R, T;
    lin_setup(&R, MK_W_BF16, 129280, 4096, 8, (size_t)1 << 30);
    lin_setup(&T, MK_W_BF16, 129280, 4096, 8, (size_t)1 << 30);
    for (int i = 0; i < T.ncopies; i++) MK(mk_cuda_bf16_tiles(ctx, &T.W[i], &err_));
    const size_t bytes = w_bytes(&R.W[0]);
    static const int ms[] = {1, 8};
    for (int rep = 0; rep < 2; rep++)
        for (int mi = 0; mi < 2; mi++)
            for (int lay = 0; lay < 2; lay++) {
                lin_arg *L = lay ? &T : &R;
                L->m = ms[mi];
                L->kern = MK_CUDA_K_AUTO;
                L->flags = MK_CUDA_LIN_ROW_INVARIANT;
                w_linear(L, 0); /* the activations prepared once */
                L->flags = MK_CUDA_LIN_ROW_INVARIANT | MK_CUDA_LIN_REUSE_X;
                const double t = time_graph(w_linear, L, 8, 9), gbs = bytes / t / 1e9;
                out("| %s | %d | %s | %.2f | %.0f | %.1f%% | %.1f%% |\n", lay ? "slab tiles" : "rows", ms[mi],
                    mk_cuda_linear_kernel_name(ctx, MK_CUDA_K_AUTO, &L->W[0], ms[mi]), t * 1e6, gbs,
                    100.0 * gbs / bw_copy_rw, 100.0 * gbs / bw_read);
            }
    out("\n");
    for (int i = 0; i < T.ncopies; i++) mk_cuda_bf16_tiles_forget(ctx, T.W[i].w);
    lin_free(&R);
    lin_free(&T);
}

static void bench_pattern(void) {
    const size_t per = (size_t)PAT_ROWS * (PAT_ROWB + PAT_SROWB), bytes = per * 2 * PAT_E;
    pat_arg A;
    memset(&A, 0, sizeof A);
    A.buf = (const uint8_t *)dalloc(bytes);
    fill_bytes((void *)A.buf, bytes, 0);
    A.sink = (uint32_t *)dalloc(64);
    for (int p = 0; p < MOEB_P; p++) {
        int32_t idx[MOEB_K];
        for (int j = 0; j < MOEB_K; j++) idx[j] = (p * MOEB_K + j) % PAT_E;
        A.ex[p] = (int32_t *)dalloc(sizeof idx);
        CU(cudaMemcpy(A.ex[p], idx, sizeof idx, cudaMemcpyHostToDevice));
    }
    CU(cudaFuncSetAttribute(k_pat<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, PAT_SMEM));
    CU(cudaFuncSetAttribute(k_pat<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, PAT_SMEM));
    CU(cudaFuncSetAttribute(k_pat<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, PAT_SMEM));
    CU(cudaFuncSetAttribute(k_pat<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, PAT_SMEM));
    CU(cudaFuncSetAttribute(k_pat<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, PAT_SMEM));
    CU(cudaFuncSetAttribute(k_pat<5>, cudaFuncAttributeMaxDynamicSharedMemorySize, PAT_SMEM));
    const double mb = (double)MOEB_K * 2 * per;
    static const char *what[6] = {
        "0: the expert layout (as now): a thread's 16 bytes at t 16 + kb 64 of rows g, g + 8; warp w kb 4 w .. 4 w + 3",
        "1: tiled: a block's 64 KB contiguous, a warp's iteration one 2 KB run",
        "2: the expert layout, warps' 128-blocks interleaved (kb = w + 8 i)",
        "3: the expert layout, two 128-blocks an iteration (128 contiguous bytes a row)",
        "4: the expert layout, the 4 iterations' loads all first",
        "5: tiled, the 4 iterations' loads all first"};
    out("## The expert GEMV's read pattern alone (loads XORed, no arithmetic)\n\n");
    out("w1 + w3 of 6 picks of 64 experts of 2048 x 4096 FP4 with their scales, %.1f MB a call, a new set each call (10 "
        "sets); grid (64, 6, 2) x 256 threads held at 3 blocks an SM; CUDA-graph replay of 50 calls\n\n", mb / 1e6);
    out("| pattern | us | GB/s (of copy) |\n| --- | --- | --- |\n");
    for (int rep = 0; rep < 2; rep++)
        for (int m = 0; m < 6; m++) {
            A.mode = m;
            const double t = time_graph(w_pat, &A, 50, 9);
            out("| %s | %.2f | %.0f (%.0f%%) |\n", what[m], t * 1e6, mb / t / 1e9, 100.0 * mb / t / 1e9 / bw_copy_rw);
        }
    out("\n");
    cudaFree((void *)A.buf);
    cudaFree(A.sink);
    for (int p = 0; p < MOEB_P; p++) cudaFree(A.ex[p]);
}

/* ---- 3. GEMM -------------------------------------------------------------------------------- */

static void bench_gemm(void) {
    static const shape shapes[] = {
        {"square", MK_W_FP8, 4096, 4096},
        {"attn.wq_b", MK_W_FP8, 32768, 1024},
        {"attn.wo_b", MK_W_FP8, 4096, 8192},
        {"shared_experts.w1/w3", MK_W_FP8, 2048, 4096},
    };
    static const int ms[] = {64, 256};
    out("## GEMM (prefill / batched decode): FP8 block-scaled mma.sync kernel vs cuBLAS bf16\n\n");
#if MK_HAVE_CUBLAS
    double tp = time_cublas(8192, 8192, 8192, NULL);
    out("cuBLAS bf16 8192x8192x8192 (matrix-rate reference): %.0f TFLOP/s\n\n", 2.0 * 8192.0 * 8192 * 8192 / tp / 1e12);
#endif
    out("| weight | shape [n, k] | m | minke fp8 kernel | us | TFLOP/s | cuBLAS bf16 us | cuBLAS bf16 TFLOP/s | minke / cuBLAS |\n");
    out("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (size_t j = 0; j < sizeof ms / sizeof ms[0]; j++) {
            const shape *S = &shapes[i];
            int m = ms[j];
            lin_arg L;
            lin_setup(&L, S->kind, S->n, S->k, m, (size_t)1 << 30);
            L.m = m;
            double t = time_graph(w_linear, &L, 30, 9);
            double flop = 2.0 * m * S->n * S->k;
            double tc = 0;
#if MK_HAVE_CUBLAS
            tc = time_cublas(m, S->n, S->k, NULL);
#endif
            if (tc > 0)
                out("| %s | %dx%d | %d | %s | %.1f | %.0f | %.1f | %.0f | %.2f |\n", S->name, S->n, S->k, m,
                    mk_cuda_linear_kernel_name(ctx, MK_CUDA_K_AUTO, &L.W[0], m), t * 1e6, flop / t / 1e12,
                    tc * 1e6, flop / tc / 1e12, tc / t);
            else
                out("| %s | %dx%d | %d | %s | %.1f | %.0f | - | - | - |\n", S->name, S->n, S->k, m,
                    mk_cuda_linear_kernel_name(ctx, MK_CUDA_K_AUTO, &L.W[0], m), t * 1e6, flop / t / 1e12);
            lin_free(&L);
        }
    /* FP4 experts at m = 64: no FP4 GEMM yet, the GEMV runs in chunks of 8 */
    {
        static const shape ex = {"experts.E.w1/w3", MK_W_FP4, 2048, 4096};
        lin_arg L;
        lin_setup(&L, ex.kind, ex.n, ex.k, 64, (size_t)1 << 30);
        L.m = 64;
        double t = time_graph(w_linear, &L, 30, 9);
        double flop = 2.0 * 64 * ex.n * ex.k;
        out("| %s (fp4) | %dx%d | 64 | %s | %.1f | %.0f | - | - | - |\n", ex.name, ex.n, ex.k,
            mk_cuda_linear_kernel_name(ctx, MK_CUDA_K_AUTO, &L.W[0], 64), t * 1e6, flop / t / 1e12);
        lin_free(&L);
    }
    out("\n");
}

/* ---- 4. the GPU draw ------------------------------------------------------------------------ */

typedef struct {
    const float *logits;
    const mk_sample_draw *draws;
    float *ws;
    int32_t *out;
    int rows, V;
} smp_arg;
static void w_sample(void *arg, int i) {
    (void)i;
    smp_arg *A = (smp_arg *)arg;
    MK(mk_cuda_sample_rows(ctx, A->logits, A->rows, A->V, A->draws, A->ws, A->out, &err_));
}

static void bench_sample(void) {
    enum { V = 129280, RMAX = 64 };
    static const struct { const char *name; float T; int k; float top_p; } set[] = {
        {"T 0.8, top_p 0.95", 0.8f, 0, 0.95f}, {"T 1, top_k 50, top_p 0.9", 1.0f, 50, 0.9f}, {"T 1 (no cut)", 1.0f, 0, 1.0f}};
    float *x = (float *)malloc(sizeof(float) * (size_t)RMAX * V);
    mk_sample_draw *dr = (mk_sample_draw *)malloc(sizeof(mk_sample_draw) * RMAX);
    float *dx = (float *)dalloc(sizeof(float) * (size_t)RMAX * V), *dws = (float *)dalloc(sizeof(float) * (size_t)RMAX * V);
    mk_sample_draw *ddr = (mk_sample_draw *)dalloc(sizeof(mk_sample_draw) * RMAX);
    int32_t *dout = (int32_t *)dalloc(sizeof(int32_t) * RMAX);
    mk_cuda_tuning def, tu;
    mk_cuda_ctx_get_tuning(ctx, &def);
    out("## GPU draw (mk_cuda_sample_rows), vocabulary %d: us per call (CUDA-graph replay)\n\n", V);
    out("tunings: agg = sample_agg, cl = sample_cluster, bins = sample_bins; logits: normal (sd 2.5, a peaked "
        "model-like row) or near-uniform (1 + 0.05 u: every cut's weight bin too full to gather)\n\n");
    out("(sample_agg, slower everywhere in session 19, is left out; default: the context's tunings, with "
        "sample_cluster_rows %d)\n\n", def.sample_cluster_rows);
    out("| logits | setting | rows | plain | cl | bins | cl+bins | default |\n");
    out("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    uint64_t st = 0x9e3779b97f4a7c15ull;
    for (int kind = 0; kind < 2; kind++) {
        for (size_t i = 0; i < (size_t)RMAX * V; i++) {
            st ^= st << 13, st ^= st >> 7, st ^= st << 17;
            const double u1 = ((st >> 11) + 0.5) / 9007199254740992.0;
            st ^= st << 13, st ^= st >> 7, st ^= st << 17;
            const double u2 = ((st >> 11) + 0.5) / 9007199254740992.0;
            x[i] = kind ? (float)(1.0 + 0.05 * u1) : (float)(2.5 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
        }
        CU(cudaMemcpy(dx, x, sizeof(float) * (size_t)RMAX * V, cudaMemcpyHostToDevice));
        for (size_t c = 0; c < sizeof set / sizeof set[0]; c++) {
            for (int r = 0; r < RMAX; r++) {
                memset(&dr[r], 0, sizeof dr[r]);
                dr[r].inv_t = 1.0f / set[c].T, dr[r].top_p = set[c].top_p, dr[r].top_k = set[c].k, dr[r].rep = 1.0f;
                dr[r].u53 = (uint64_t)(r + 1) * 0x123456789abull % (1ull << 53);
            }
            CU(cudaMemcpy(ddr, dr, sizeof(mk_sample_draw) * RMAX, cudaMemcpyHostToDevice));
            static const int row_counts[] = {1, 4, 8, 16, 24, 32, 64};
            for (size_t ri = 0; ri < sizeof row_counts / sizeof row_counts[0]; ri++) {
                const int rows = row_counts[ri];
                smp_arg A = {dx, ddr, dws, dout, rows, V};
                char line[512];
                int n = snprintf(line, sizeof line, "| %s | %s | %d |", kind ? "near-uniform" : "normal", set[c].name, rows);
                int32_t ref[RMAX], got[RMAX];
                for (int way = 0; way < 5; way++) { /* plain, cl, bins, cl+bins (no row limit), default */
                    tu = def;
                    if (way < 4) {
                        tu.sample_agg = 0, tu.sample_cluster = way & 1, tu.sample_bins = way >> 1;
                        tu.sample_cluster_rows = 0;
                    }
                    mk_cuda_ctx_set_tuning(ctx, &tu);
                    const double t = time_graph(w_sample, &A, 10, 9);
                    CU(cudaMemcpy(way ? got : ref, dout, sizeof(int32_t) * rows, cudaMemcpyDeviceToHost));
                    const int same = !way || !memcmp(got, ref, sizeof(int32_t) * rows);
                    n += snprintf(line + n, sizeof line - n, " %.1f%s |", t * 1e6, same ? "" : " (tokens differ!)");
                }
                mk_cuda_ctx_set_tuning(ctx, &def);
                out("%s\n", line);
            }
        }
    }
    out("\n");
    cudaFree(dx), cudaFree(dws), cudaFree(ddr), cudaFree(dout);
    free(x), free(dr);
}

int main(int argc, char **argv) {
    if (mk_cuda_device_count() == 0) {
        printf("skipped: no CUDA device\n");
        return 0;
    }
    if (argc > 1) {
        md = fopen(argv[1], "w");
        if (!md) {
            perror(argv[1]);
            return 1;
        }
    }
    MK(mk_cuda_ctx_create(0, &ctx, &err_));
    stream = (cudaStream_t)mk_cuda_ctx_stream(ctx);
#if MK_HAVE_CUBLAS
    if (cublasCreate(&cub) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasCreate failed\n");
        return 1;
    }
    cublasSetStream(cub, stream);
#endif
    char desc[1024];
    mk_cuda_ctx_describe(ctx, desc, sizeof desc);
    out("# minke GPU benchmark\n\n%s\n\n", desc);
    /* BENCH_GPU_ONLY: a comma list of the sections after the bandwidth (decode, experts, head, pattern,
     * gemm, sample); all of them without it */
    const char *only = getenv("BENCH_GPU_ONLY");
#define SECTION(name) (!only || strstr(only, name))
    bench_bandwidth();
    if (SECTION("decode")) bench_decode();
    if (SECTION("experts")) bench_moe_wgmma();
    if (SECTION("head")) bench_head();
    if (SECTION("pattern")) bench_pattern();
    if (SECTION("gemm")) bench_gemm();
    if (SECTION("sample")) bench_sample();
#undef SECTION
    MK(mk_cuda_ctx_sync(ctx, &err_));
#if MK_HAVE_CUBLAS
    cublasDestroy(cub);
#endif
    mk_cuda_ctx_free(ctx);
    if (md) fclose(md);
    return 0;
}
