/* lane.cu — the second and third streams of a captured decode step (ops_cuda.h): the L2 lane, on
 * which the step prefetches the weights of its next linears into L2 while the main stream runs
 * latency-bound kernels, and the side branch, on which independent kernels run beside the main
 * stream's (a compressed layer's compressors beside its q / kv path; a layer's shared expert beside
 * the gate, the routing and the routed experts, through its own linear scratch).
 *
 * Why: at batch 1 a layer is a chain of ~20 kernels; the GEMVs stream 2-34 MB each from HBM, and
 * between them norms, RoPE, the sparse attention, the compressors and the routing run for tens of
 * microseconds reading almost nothing. Each GEMV ramps up and drains (~4 us fixed, and the small
 * ones reach 0.5-1.1 TB/s: bench/gpu/results-2026-12-04-launches.md). Bytes requested into L2
 * during those latency-bound stretches are bytes the next GEMV reads from L2.
 *
 * How: mk_cuda_lane_prefetch forks the lane off the main stream (an event recorded there, waited
 * for on the lane: the prefetch starts once everything queued before it has finished, so it does
 * not compete with the GEMV before it) and launches k_lane_prefetch there: a few one-warp blocks
 * whose threads issue cp.async.bulk.prefetch.L2 (the TMA unit's bulk prefetch: one instruction per
 * 16 KiB chunk, nothing waits for it) over the spans in order. capture_end joins the lane back
 * into the main stream. Outside a capture (or with the tuning's l2_lane at 0) nothing happens:
 * eager launches keep their programmatic-dependent-launch chain untouched.
 *
 * The branch (tuning branch) swaps the context's stream for the side stream between branch_begin
 * and branch_end, so every op queued meanwhile goes there unchanged (its first kernel's programmatic
 * edge is to the main stream's last kernel); branch_join is an event wait on the main stream. The
 * kernels are the same either way, so are the bits; only what runs beside what changes.
 */
#include "ops/cuda/cuda_common.cuh"

#define LANE_CHUNK 16384 /* bytes per bulk prefetch (a multiple of 16) */

struct lane_args {
    const char *p[MK_CUDA_LANE_SPANS];
    unsigned long long n[MK_CUDA_LANE_SPANS]; /* multiples of 16 */
    int count;
};

/* The L2 policy of a lane's prefetches: evict_last with hint, else none (normal). */
__device__ __forceinline__ unsigned long long lane_policy(int hint) {
    unsigned long long pol = 0;
    if (hint) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(pol));
    return pol;
}

/* One bulk prefetch of sz bytes (a multiple of 16) at p (16-byte aligned) into L2; nothing waits. */
__device__ __forceinline__ void lane_bulk(const char *p, unsigned sz, int hint, unsigned long long pol) {
    if (hint)
        asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;\n" ::"l"(p), "r"(sz), "l"(pol)
                     : "memory");
    else
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(sz) : "memory");
}

/* Chunk c of the spans' concatenation is issued by thread c mod (threads of the grid), each thread
 * in increasing c: the first chunks are requested first. */
__global__ void k_lane_prefetch(lane_args a, int hint) {
    const unsigned long long pol = lane_policy(hint);
    const unsigned long long nt = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long t = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long base = 0; /* index of the span's first chunk */
    for (int s = 0; s < a.count; s++) {
        const unsigned long long nch = (a.n[s] + LANE_CHUNK - 1) / LANE_CHUNK;
        for (unsigned long long c = base + (t + nt - base % nt) % nt; c < base + nch; c += nt) {
            const unsigned long long off = (c - base) * LANE_CHUNK;
            const unsigned long long left = a.n[s] - off;
            const unsigned sz = (unsigned)(left < LANE_CHUNK ? left : LANE_CHUNK);
            lane_bulk(a.p[s] + off, sz, hint, pol);
        }
        base += nch;
    }
}

/* A second stream with its fork and join events, each handle made on its own where missing: one
 * refused earlier is asked for again, never used as NULL. what_s / what_e: the failures' messages. */
static int stream_pair(cudaStream_t *s, cudaEvent_t *fork, cudaEvent_t *join, const char *what_s,
                       const char *what_e, mk_err *err) {
    if (!*s) MK_CU_TRY(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking), err, what_s);
    if (!*fork) MK_CU_TRY(cudaEventCreateWithFlags(fork, cudaEventDisableTiming), err, what_e);
    if (!*join) MK_CU_TRY(cudaEventCreateWithFlags(join, cudaEventDisableTiming), err, what_e);
    return MK_OK;
}

/* The lane's and the branch's streams and events, made before a capture starts (nothing is created
 * inside one). */
int mk_cuda_lane_ready(mk_cuda_ctx *ctx, mk_err *err) {
    int st;
    if (ctx->tune.l2_lane > 0 &&
        (st = stream_pair(&ctx->lane, &ctx->lane_fork, &ctx->lane_join, "cuda: lane: stream", "cuda: lane: event", err)))
        return st;
    if (ctx->tune.branch && (st = stream_pair(&ctx->side, &ctx->side_fork, &ctx->side_done, "cuda: branch: stream",
                                              "cuda: branch: event", err)))
        return st;
    return MK_OK;
}

/* The main stream waits for the lane's and the branch's work (before a capture ends): 0, or the
 * first error. A branch left open (an error inside it) is closed first. */
int mk_cuda_lane_join(mk_cuda_ctx *ctx, mk_err *err) {
    int st = MK_OK;
    if (ctx->in_branch) st = mk_cuda_branch_end(ctx, err);
    if (!st) st = mk_cuda_branch_join(ctx, err);
    if (st) return st;
    if (!ctx->lane_pending) return MK_OK;
    ctx->lane_pending = 0;
    MK_CU_TRY(cudaEventRecord(ctx->lane_join, ctx->lane), err, "cuda: lane: join record");
    MK_CU_TRY(cudaStreamWaitEvent(ctx->stream, ctx->lane_join, 0), err, "cuda: lane: join wait");
    return MK_OK;
}

void mk_cuda_lane_free(mk_cuda_ctx *ctx) {
    if (ctx->in_branch) ctx->stream = ctx->main, ctx->in_branch = 0;
    if (ctx->lane_fork) cudaEventDestroy(ctx->lane_fork);
    if (ctx->lane_join) cudaEventDestroy(ctx->lane_join);
    if (ctx->lane) cudaStreamDestroy(ctx->lane);
    if (ctx->side_fork) cudaEventDestroy(ctx->side_fork);
    if (ctx->side_done) cudaEventDestroy(ctx->side_done);
    if (ctx->side) cudaStreamDestroy(ctx->side);
    ctx->lane = ctx->side = NULL;
    ctx->lane_fork = ctx->lane_join = ctx->side_fork = ctx->side_done = NULL;
}

extern "C" int mk_cuda_branch_begin(mk_cuda_ctx *ctx, mk_err *err) {
    /* split-K GEMVs share the context's arrival counters: never on two streams at once */
    if (!ctx->tune.branch || !ctx->capturing || !ctx->side || ctx->in_branch || ctx->branch_pending ||
        ctx->tune.gemv_max_splits > 1)
        return 0;
    MK_CU_TRY(cudaEventRecord(ctx->side_fork, ctx->stream), err, "cuda: branch: fork record");
    MK_CU_TRY(cudaStreamWaitEvent(ctx->side, ctx->side_fork, 0), err, "cuda: branch: fork wait");
    ctx->main = ctx->stream;
    ctx->stream = ctx->side;
    ctx->in_branch = 1;
    return 1;
}

extern "C" int mk_cuda_branch_end(mk_cuda_ctx *ctx, mk_err *err) {
    if (!ctx->in_branch) return MK_OK;
    ctx->stream = ctx->main;
    ctx->in_branch = 0;
    ctx->branch_pending = 1;
    MK_CU_TRY(cudaEventRecord(ctx->side_done, ctx->side), err, "cuda: branch: end record");
    return MK_OK;
}

extern "C" int mk_cuda_branch_join(mk_cuda_ctx *ctx, mk_err *err) {
    if (!ctx->branch_pending) return MK_OK;
    ctx->branch_pending = 0;
    MK_CU_TRY(cudaStreamWaitEvent(ctx->stream, ctx->side_done, 0), err, "cuda: branch: join wait");
    return MK_OK;
}

/* The lane's next work after everything queued on the main stream so far; the lane is in the
 * capture from here on (capture_end joins it). */
static int lane_fork(mk_cuda_ctx *ctx, mk_err *err) {
    MK_CU_TRY(cudaEventRecord(ctx->lane_fork, ctx->stream), err, "cuda: lane: fork record");
    MK_CU_TRY(cudaStreamWaitEvent(ctx->lane, ctx->lane_fork, 0), err, "cuda: lane: fork wait");
    ctx->lane_pending = 1;
    return MK_OK;
}
extern "C" long mk_cuda_lane_count(const mk_cuda_ctx *ctx) { return ctx->lane_count; }

extern "C" int mk_cuda_lane_prefetch(mk_cuda_ctx *ctx, const mk_cuda_span *spans, int n, mk_err *err) {
    if (ctx->tune.l2_lane <= 0 || !ctx->capturing || !ctx->lane || n <= 0) return MK_OK;
    if (!spans || n > MK_CUDA_LANE_SPANS)
        return mk_fail(err, MK_EINVAL, "cuda: lane: %d spans (at most %d)", n, MK_CUDA_LANE_SPANS);
    lane_args a = {};
    unsigned long long budget = (unsigned long long)ctx->tune.l2_lane << 20;
    for (int i = 0; i < n && budget >= 16; i++) {
        if (!spans[i].p) continue;
        const uintptr_t b = ((uintptr_t)spans[i].p + 15) & ~(uintptr_t)15;
        const uintptr_t e = ((uintptr_t)spans[i].p + spans[i].bytes) & ~(uintptr_t)15;
        if (e <= b) continue;
        unsigned long long len = (unsigned long long)(e - b);
        if (len > budget) len = budget & ~15ull;
        a.p[a.count] = (const char *)b;
        a.n[a.count++] = len;
        budget -= len;
    }
    if (!a.count) return MK_OK;
    const int st = lane_fork(ctx, err);
    if (st) return st;
    const int blocks = ctx->tune.l2_lane_blocks > 0 ? ctx->tune.l2_lane_blocks : 32;
    k_lane_prefetch<<<blocks, 32, 0, ctx->lane>>>(a, ctx->tune.l2_lane_hint);
    MK_CU_LAUNCHED(err, "cuda: lane prefetch launch");
    ctx->lane_count++;
    return MK_OK;
}

/* The routed experts' matrices: for each of the n picks in ids (device, values in [0, E); negative:
 * none), tab[ids[i]] (a device table of device pointers) over `bytes` bytes. Block b takes pick
 * b mod n, its threads the pick's chunks in order. */
__global__ void k_lane_experts(const int32_t *__restrict__ ids, int n, int E, const void *const *__restrict__ tab,
                               unsigned long long bytes, int hint) {
    const unsigned long long pol = lane_policy(hint);
    const int per = gridDim.x / n; /* blocks per pick (the launch is a multiple of n) */
    const int pick = blockIdx.x % n, part = blockIdx.x / n;
    const int e = ids[pick];
    if (e < 0 || e >= E || part >= per) return;
    const char *p = (const char *)tab[e];
    if (!p || ((uintptr_t)p & 15)) return;
    const unsigned long long nch = (bytes + LANE_CHUNK - 1) / LANE_CHUNK;
    for (unsigned long long c = (unsigned long long)part * blockDim.x + threadIdx.x; c < nch;
         c += (unsigned long long)per * blockDim.x) {
        const unsigned long long off = c * LANE_CHUNK, left = bytes - off;
        const unsigned sz = (unsigned)(left < LANE_CHUNK ? left : LANE_CHUNK);
        lane_bulk(p + off, sz, hint, pol);
    }
}

extern "C" int mk_cuda_lane_prefetch_experts(mk_cuda_ctx *ctx, const int32_t *ids, int n, int E,
                                             const void *const *tab, size_t bytes, mk_err *err) {
    if (ctx->tune.l2_lane <= 0 || !ctx->capturing || !ctx->lane || n <= 0 || bytes < 16) return MK_OK;
    if (!ids || !tab || E <= 0) return mk_fail(err, MK_EINVAL, "cuda: lane: experts: bad arguments");
    unsigned long long b = (unsigned long long)bytes & ~15ull;
    const unsigned long long cap = ((unsigned long long)ctx->tune.l2_lane << 20) / (unsigned long long)n;
    if (b > cap) b = cap & ~15ull; /* the budget shared by the picks */
    if (b < 16) return MK_OK;
    const int st = lane_fork(ctx, err);
    if (st) return st;
    int blocks = ctx->tune.l2_lane_blocks > 0 ? ctx->tune.l2_lane_blocks : 32;
    blocks = (blocks + n - 1) / n * n; /* as many blocks for every pick (k_lane_experts' parts) */
    k_lane_experts<<<blocks, 32, 0, ctx->lane>>>(ids, n, E, tab, b, ctx->tune.l2_lane_hint);
    MK_CU_LAUNCHED(err, "cuda: lane experts launch");
    ctx->lane_count++;
    return MK_OK;
}

