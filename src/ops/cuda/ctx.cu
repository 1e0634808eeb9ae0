/* ctx.cu — the CUDA device context: device selection, the stream all ops run on, capabilities
 * (read once from the device and logged with the kernel choices), the cuBLAS handle, device
 * memory and weight upload, and the mapping of CUDA errors to mk_status.
 *
 * One context per device and thread of control; the ops are not thread-safe on one context
 * (they share its stream and its one-time notes). Weight upload copies each tensor as stored in
 * the checkpoint, so the device holds exactly the FP8/FP4 bytes and E8M0 scales the file has.
 */
#include "ops/cuda/cuda_common.cuh"

#include <time.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef MK_HAVE_CUBLAS
#define MK_HAVE_CUBLAS 1
#endif
#if MK_HAVE_CUBLAS
#include <cublas_v2.h>
#endif

int mk_cuda_fail(mk_err *err, cudaError_t e, const char *what) {
    int st;
    switch (e) {
    case cudaErrorMemoryAllocation: st = MK_ENOMEM; break;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion: st = MK_ENOTSUP; break;
    case cudaErrorInvalidValue: st = MK_EINVAL; break;
    default: st = MK_EINTERNAL; break;
    }
    return mk_fail(err, st, "%s: CUDA error %d (%s): %s", what, (int)e, cudaGetErrorName(e),
                   cudaGetErrorString(e));
}

void mk_cuda_note(mk_cuda_ctx *ctx, unsigned bit, const char *msg) {
    if (ctx->logged & (1u << bit)) return;
    ctx->logged |= 1u << bit;
    mk_log(MK_LOG_INFO, "cuda: %s", msg);
}

int mk_cuda_smem_optin(mk_cuda_ctx *ctx, unsigned bit, const void *func, size_t bytes, mk_err *err) {
    if (bytes <= 48 * 1024 || (ctx->optin & (1u << bit))) return MK_OK;
    if (bytes > ctx->caps.smem_optin)
        return mk_fail(err, MK_ENOTSUP, "cuda: a kernel needs %zu bytes of shared memory, the device "
                       "allows %zu", bytes, ctx->caps.smem_optin);
    cudaError_t e = cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* not left for the next launch's check */
        return mk_cuda_fail(err, e, "cudaFuncSetAttribute(max dynamic shared memory)");
    }
    ctx->optin |= 1u << bit;
    return MK_OK;
}

extern "C" int mk_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky "no device / no driver" error */
        return 0;
    }
    return n;
}

static int read_caps(int dev, mk_cuda_caps *c, mk_err *err) {
    memset(c, 0, sizeof *c);
    c->device = dev;
    cudaDeviceProp p;
    MK_CU_TRY(cudaGetDeviceProperties(&p, dev), err, "cudaGetDeviceProperties");
    snprintf(c->name, sizeof c->name, "%s", p.name);
    c->cc_major = p.major;
    c->cc_minor = p.minor;
    c->mem_bytes = p.totalGlobalMem;
    int v = 0;
    MK_CU_TRY(cudaDeviceGetAttribute(&c->sm_count, cudaDevAttrMultiProcessorCount, dev), err,
              "cudaDeviceGetAttribute(sm count)");
    MK_CU_TRY(cudaDeviceGetAttribute(&c->clock_khz, cudaDevAttrClockRate, dev), err,
              "cudaDeviceGetAttribute(clock)");
    MK_CU_TRY(cudaDeviceGetAttribute(&c->mem_clock_khz, cudaDevAttrMemoryClockRate, dev), err,
              "cudaDeviceGetAttribute(memory clock)");
    MK_CU_TRY(cudaDeviceGetAttribute(&c->mem_bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev), err,
              "cudaDeviceGetAttribute(bus width)");
    MK_CU_TRY(cudaDeviceGetAttribute(&v, cudaDevAttrL2CacheSize, dev), err,
              "cudaDeviceGetAttribute(L2 size)");
    c->l2_bytes = (size_t)v;
    MK_CU_TRY(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), err,
              "cudaDeviceGetAttribute(shared memory opt-in)");
    c->smem_optin = (size_t)v;
    c->dram_peak_gbs = 2.0 * (double)c->mem_clock_khz * 1e3 * (double)c->mem_bus_bits / 8.0 / 1e9;
    MK_CU_TRY(cudaRuntimeGetVersion(&c->runtime_version), err, "cudaRuntimeGetVersion");
    MK_CU_TRY(cudaDriverGetVersion(&c->driver_version), err, "cudaDriverGetVersion");
    return MK_OK;
}

extern "C" void mk_cuda_ctx_describe(const mk_cuda_ctx *ctx, char *buf, size_t len) {
    const mk_cuda_caps *c = &ctx->caps;
    snprintf(buf, len,
             "device %d: %s, compute capability %d.%d, %d SMs at %.0f MHz, %.1f GiB at %.0f MHz x "
             "%d bit (datasheet-style peak %.0f GB/s), L2 %.0f MiB, shared memory per block %zu KiB "
             "(opt-in); runtime %d, driver %d; cuBLAS %s\n"
             "kernels: FP8 m<=8 mma.sync m16n8k32 e4m3 GEMV; FP8 m>8 mma.sync GEMM {64,128}x128x128 "
             "(cp.async x3, ldmatrix, split-K); FP4 mma.sync GEMV (e2m1->e4m3 in registers, "
             "m>8 in chunks of 8: no FP4 GEMM yet); BF16 m<=8 mma.sync m16n8k16 GEMV, m>8 %s; "
             "FP8_DQ mma.sync m16n8k16 f16 GEMV; F32 warp-per-row FMA; GEMVs with programmatic "
             "dependent launch",
             c->device, c->name, c->cc_major, c->cc_minor, c->sm_count, c->clock_khz / 1e3,
             (double)c->mem_bytes / (1u << 30), c->mem_clock_khz / 1e3, c->mem_bus_bits,
             c->dram_peak_gbs, (double)c->l2_bytes / (1u << 20), c->smem_optin / 1024,
             c->runtime_version, c->driver_version, c->have_cublas ? "yes" : "no",
             c->have_cublas ? "cuBLAS GemmEx (bf16 in, fp32 accumulate)" : "GEMV chunks of 8");
}

/* A tuning switch from the environment: name unset -> def, else its integer != 0. */
static int env_switch(const char *name, int def) {
    const char *v = getenv(name);
    return v ? atoi(v) != 0 : def;
}

extern "C" int mk_cuda_ctx_create(int device, mk_cuda_ctx **out, mk_err *err) {
    *out = NULL;
    int n = mk_cuda_device_count();
    if (device < 0 || device >= n)
        return mk_fail(err, MK_ENOTSUP, "cuda: device %d requested, %d device(s) present", device, n);
    mk_cuda_ctx *ctx = (mk_cuda_ctx *)calloc(1, sizeof *ctx);
    if (!ctx) return mk_fail(err, MK_ENOMEM, "cuda: context allocation failed");
    ctx->device = device;
    ctx->tune.gemv_warps_per_sm = 16;
    ctx->tune.gemv_max_splits = 1;
    /* on / off switches: the default, or the environment's 0 / 1 (benchmarks' A/B runs) */
    ctx->tune.gemv_pdl = env_switch("MINKE_CUDA_PDL", 1);
    ctx->tune.moe_slabs = 2; /* H200: 1.610 vs 1.683 ms per decode step (bench/gpu/results-2026-12-03-perf.md) */
    if (getenv("MINKE_CUDA_MOE_SLABS")) ctx->tune.moe_slabs = atoi(getenv("MINKE_CUDA_MOE_SLABS"));
    /* 0: with the row-invariant GEMM taking groups of many slots, the unstaged kernel was faster for the
     * few slots per group of batched decodes (H200, batch 64: 5829 vs 5347 tokens/s; 256: 10936 vs
     * 10409; bench/gpu/results-2026-12-04-prefill.md) */
    ctx->tune.moe_staged = env_switch("MINKE_CUDA_MOE_STAGED", 0);
    ctx->tune.linear_multi = env_switch("MINKE_CUDA_LINEAR_MULTI", 1);
    ctx->tune.moe_route_plan = env_switch("MINKE_CUDA_ROUTE_PLAN", 1);
    ctx->tune.rope_fuse = env_switch("MINKE_CUDA_ROPE_FUSE", 1);
    ctx->tune.norm_quant = env_switch("MINKE_CUDA_NORM_QUANT", 1);
    ctx->tune.moe_with_fp8 = env_switch("MINKE_CUDA_MOE_WITH_FP8", 1);
    ctx->tune.cmp_step = env_switch("MINKE_CUDA_CMP_STEP", 1);
    ctx->tune.graphs = env_switch("MINKE_CUDA_GRAPHS", 1);
    ctx->tune.gemv_tiles = getenv("MINKE_CUDA_GEMV_TILES") ? atoi(getenv("MINKE_CUDA_GEMV_TILES")) : 8;
    ctx->tune.ri_min_blocks = getenv("MINKE_CUDA_RI_MIN_BLOCKS") ? atoi(getenv("MINKE_CUDA_RI_MIN_BLOCKS")) : 0;
    ctx->tune.moe_ri = getenv("MINKE_CUDA_MOE_RI") ? atoi(getenv("MINKE_CUDA_MOE_RI")) : 16;
    ctx->tune.hc_ri = getenv("MINKE_CUDA_HC_RI") ? atoi(getenv("MINKE_CUDA_HC_RI")) : 16;
    ctx->tune.attn16 = env_switch("MINKE_CUDA_ATTN16", 1);
    ctx->tune.gemv_pipe = env_switch("MINKE_CUDA_GEMV_PIPE", 1);
    /* 1: H200, 1.163 / 1.146 / 1.178 vs 1.169 / 1.182 / 1.168 ms per step in A/B pairs (the same page) */
    ctx->tune.hc_moe_sum = env_switch("MINKE_CUDA_HC_MOE_SUM", 1);
    /* the next five: H200, session 16 (results-2026-12-05-merges.md): batch-1 step 1.149 (fast step) / 1.123 (fin
     * split) / 1.140 (the four launch merges) / 1.111-1.143 (all) vs 1.160-1.167 ms with none, same call */
    ctx->tune.moe_fast_step = env_switch("MINKE_CUDA_MOE_FAST_STEP", 1);
    /* H100, session 35: greedy step 0.995-0.998 ms against 1.005-1.010 in rows, same calls (the same tokens) */
    ctx->tune.fp4_tiles = env_switch("MINKE_CUDA_FP4_TILES", 1);
    /* H100, session 39: greedy step through the engine 0.931-0.941 ms against 0.949-0.956 in rows, same call */
    ctx->tune.head_tiles = env_switch("MINKE_CUDA_HEAD_TILES", 1);
    /* H100, session 40: the engine's greedy step 0.929-0.939 ms against 0.932-0.941 without, same call (the same tokens) */
    ctx->tune.head_argmax = env_switch("MINKE_CUDA_HEAD_ARGMAX", 1);
    ctx->tune.moe_occ = getenv("MINKE_CUDA_MOE_OCC") && atoi(getenv("MINKE_CUDA_MOE_OCC")) == 2 ? 2 : 3;
    ctx->tune.moe_pf = env_switch("MINKE_CUDA_MOE_PF", 0);
    ctx->tune.bf16_pipe = env_switch("MINKE_CUDA_BF16_PIPE", 1);
    ctx->tune.moe_b_occ = getenv("MINKE_CUDA_MOE_B_OCC") && atoi(getenv("MINKE_CUDA_MOE_B_OCC")) == 2 ? 2 : 3;
    ctx->tune.moe_b_pf = env_switch("MINKE_CUDA_MOE_B_PF", 0);
    ctx->tune.moe_b_sl = getenv("MINKE_CUDA_MOE_B_SL") && atoi(getenv("MINKE_CUDA_MOE_B_SL")) == 1 ? 1 : 2;
    ctx->tune.hc_fin_split = env_switch("MINKE_CUDA_HC_FIN_SPLIT", 1);
    ctx->tune.ri_wdepth = getenv("MINKE_CUDA_RI_WDEPTH") ? atoi(getenv("MINKE_CUDA_RI_WDEPTH")) : 1; /* not yet run */
    ctx->tune.ri_wdepth = ctx->tune.ri_wdepth >= 2 ? 2 : 1;
    ctx->tune.ri_l2_pf = getenv("MINKE_CUDA_RI_L2_PF") ? atoi(getenv("MINKE_CUDA_RI_L2_PF")) : 0; /* not yet run */
    if (ctx->tune.ri_l2_pf < 0) ctx->tune.ri_l2_pf = 0;
    ctx->tune.attn_prep = env_switch("MINKE_CUDA_ATTN_PREP", 1);
    ctx->tune.rows_ring = env_switch("MINKE_CUDA_ROWS_RING", 1);
    /* the row lists of a decode by a whole block: same lists; H100, session 20, batch-1 step A/B/A/B in
     * one call: 1.266 / 1.290 ms against 1.311 / 1.331 without (greedy path 1.278 / 1.285 against
     * 1.296 / 1.304) */
    ctx->tune.rows_wide = env_switch("MINKE_CUDA_ROWS_WIDE", 1);
    ctx->tune.swiglu_pair = env_switch("MINKE_CUDA_SWIGLU_PAIR", 1);
    ctx->tune.index_fuse = env_switch("MINKE_CUDA_INDEX_FUSE", 1);
    ctx->tune.sample_agg = env_switch("MINKE_CUDA_SAMPLE_AGG", 0); /* slower on the H200 (session 19): off */
    /* the cluster draw with weight bins: faster than one block per row on every row of bench_gpu's
     * draw table (H200, session 19: 1 row 560.8 -> 85.4 us, 64 rows 730.6 -> 424.1 us at T 0.8,
     * top_p 0.95), the host sampler's tokens in every op and engine test */
    ctx->tune.sample_cluster = env_switch("MINKE_CUDA_SAMPLE_CLUSTER", 1);
    ctx->tune.sample_bins = env_switch("MINKE_CUDA_SAMPLE_BINS", 1);
    /* the cluster up to 32 rows, one block per row beyond (H100, session 20, bench_gpu's draw table,
     * model-like rows with bins: the cluster 87.8-253.6 us at 1-32 rows against one block's
     * 239.4-253.0, at 64 rows 437.4 against 317.9; top_k 50 + top_p 0.9 at 64 rows 573.6 against
     * 359.4. Near-uniform rows, the generated checkpoint's kind, favour the cluster at 64 rows too:
     * 946.3 against 1223.1 there; real models' rows are peaked) */
    ctx->tune.sample_cluster_rows =
        getenv("MINKE_CUDA_SAMPLE_CLUSTER_ROWS") ? atoi(getenv("MINKE_CUDA_SAMPLE_CLUSTER_ROWS")) : 32;
    if (ctx->tune.sample_cluster_rows < 0) ctx->tune.sample_cluster_rows = 0;
    /* the L2 lane (lane.cu): MiB per prefetch; off (slower on the H200, session 19) */
    ctx->tune.l2_lane = getenv("MINKE_CUDA_L2_LANE") ? atoi(getenv("MINKE_CUDA_L2_LANE")) : 0;
    ctx->tune.l2_lane_blocks = getenv("MINKE_CUDA_L2_LANE_BLOCKS") ? atoi(getenv("MINKE_CUDA_L2_LANE_BLOCKS")) : 32;
    ctx->tune.l2_lane_hint = env_switch("MINKE_CUDA_L2_LANE_HINT", 0);
    ctx->tune.branch = env_switch("MINKE_CUDA_BRANCH", 1); /* H100, session 27: ~1.2% less per greedy step */
    ctx->tune.route_warp = env_switch("MINKE_CUDA_ROUTE_WARP", 1);
    /* H100, session 30: greedy step 1.001-1.006 ms against 1.011-1.022 without, same calls (the gate no
     * longer waits behind the side branch's shared expert for SMs) */
    ctx->tune.prio = env_switch("MINKE_CUDA_PRIO", 1);
    /* H100, session 32: greedy step 1.018-1.023 ms against 1.026-1.032 without, same calls (the same bits) */
    ctx->tune.hc_rs = env_switch("MINKE_CUDA_HC_RS", 1);
    /* H100, session 33: greedy step 1.016-1.017 ms against 1.019-1.028 without (call 3; call 2 1.022-1.026 against
     * 1.027-1.030), same calls (the same bits) */
    ctx->tune.hc_post_loads = env_switch("MINKE_CUDA_HC_POST_LOADS", 1);
    /* H100, session 35: greedy step 1.012-1.013 ms against 1.014-1.015 with 0, same calls (the same tokens) */
    ctx->tune.hc_fin = env_switch("MINKE_CUDA_HC_FIN", 1);
    ctx->tune.hc_probe = env_switch("MINKE_CUDA_HC_PROBE", 0);
    /* H100, session 36: greedy step 0.992-0.993 ms against 0.995-0.997 with 0, same call (the same bits) */
    ctx->tune.attn_f16 = env_switch("MINKE_CUDA_ATTN_F16", 1);
    ctx->tune.attn_mlp = env_switch("MINKE_CUDA_ATTN_MLP", 1);
    ctx->tune.attn_cluster = env_switch("MINKE_CUDA_ATTN_CLUSTER", 1);
    ctx->tune.index_topk = env_switch("MINKE_CUDA_INDEX_TOPK", 1);
    ctx->tune.attn_cluster_hg = getenv("MINKE_CUDA_ATTN_CLUSTER_HG") ? atoi(getenv("MINKE_CUDA_ATTN_CLUSTER_HG")) : 0;
    /* one SM scanning a 129280-entry row took 16 us of a batch-1 step (H100, session 23's ncu) */
    ctx->tune.argmax_cluster = getenv("MINKE_CUDA_ARGMAX_CLUSTER") ? atoi(getenv("MINKE_CUDA_ARGMAX_CLUSTER")) : 16;
    if (ctx->tune.argmax_cluster < 0) ctx->tune.argmax_cluster = 0;
    if (getenv("MINKE_CUDA_GEMV_WPS")) { /* benchmarks: the GEMV plan's resident warps per SM */
        int v = atoi(getenv("MINKE_CUDA_GEMV_WPS"));
        ctx->tune.gemv_warps_per_sm = v < 1 ? 1 : v > 64 ? 64 : v;
    }
    ctx->tune.moe_slabs = ctx->tune.moe_slabs == 2 ? 2 : 1;
    if (ctx->tune.l2_lane < 0) ctx->tune.l2_lane = 0;
    if (ctx->tune.l2_lane_blocks < 1 || ctx->tune.l2_lane_blocks > 1024) ctx->tune.l2_lane_blocks = 32;
    int st = MK_OK;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) {
        st = mk_cuda_fail(err, e, "cudaSetDevice");
        goto fail;
    }
    st = read_caps(device, &ctx->caps, err);
    if (st) goto fail;
    if (ctx->caps.cc_major < 9) {
        st = mk_fail(err, MK_ENOTSUP,
                     "cuda: %s has compute capability %d.%d; this build targets sm_90a (Hopper) and "
                     "sm_100a (Blackwell)",
                     ctx->caps.name, ctx->caps.cc_major, ctx->caps.cc_minor);
        goto fail;
    }
    if (cudaDeviceGetStreamPriorityRange(&ctx->prio_lo, &ctx->prio_hi) != cudaSuccess) {
        cudaGetLastError(); /* no priorities: every kernel at 0 (tuning prio then changes nothing) */
        ctx->prio_lo = ctx->prio_hi = 0;
    }
    e = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        st = mk_cuda_fail(err, e, "cudaStreamCreate");
        goto fail;
    }
    e = cudaMalloc((void **)&ctx->counters, sizeof(unsigned) * MK_CUDA_COUNTERS);
    if (e == cudaSuccess) e = cudaMemset(ctx->counters, 0, sizeof(unsigned) * MK_CUDA_COUNTERS);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&ctx->hc_partial, sizeof(double) * MK_CUDA_HC_SPLIT_TOK * MK_CUDA_HC_SPLIT * 32);
    ctx->am_blocks = 2 * (ctx->caps.sm_count > 0 ? ctx->caps.sm_count : 1); /* k_gemv_bf16_wpipe's one wave */
    if (e == cudaSuccess) e = cudaMalloc((void **)&ctx->am_v, sizeof(float) * MK_CUDA_AM_ROWS * ctx->am_blocks);
    if (e == cudaSuccess) e = cudaMalloc((void **)&ctx->am_i, sizeof(int) * MK_CUDA_AM_ROWS * ctx->am_blocks);
    if (e == cudaSuccess) e = cudaMalloc((void **)&ctx->am_n, sizeof(unsigned));
    if (e == cudaSuccess) e = cudaMemset(ctx->am_n, 0, sizeof(unsigned));
    if (e != cudaSuccess) {
        st = mk_cuda_fail(err, e, "cuda: split-K counters and argmax buffers");
        goto fail;
    }
#if MK_HAVE_CUBLAS
    {
        cublasHandle_t h;
        cublasStatus_t bs = cublasCreate(&h);
        if (bs != CUBLAS_STATUS_SUCCESS) {
            st = mk_fail(err, MK_EINTERNAL, "cuda: cublasCreate failed (status %d)", (int)bs);
            goto fail;
        }
        cublasSetStream(h, ctx->stream);
        ctx->cublas = h;
        ctx->caps.have_cublas = 1;
    }
#endif
    {
        char desc[1024];
        mk_cuda_ctx_describe(ctx, desc, sizeof desc);
        mk_log(MK_LOG_INFO, "cuda: %s", desc);
    }
    *out = ctx;
    return MK_OK;
fail:
    mk_cuda_ctx_free(ctx);
    return st;
}

extern "C" void mk_cuda_ctx_free(mk_cuda_ctx *ctx) {
    if (!ctx) return;
#if MK_HAVE_CUBLAS
    if (ctx->cublas) cublasDestroy((cublasHandle_t)ctx->cublas);
#endif
    if (ctx->counters) cudaFree(ctx->counters);
    if (ctx->hc_partial) cudaFree(ctx->hc_partial);
    if (ctx->am_v) cudaFree(ctx->am_v);
    if (ctx->am_i) cudaFree(ctx->am_i);
    if (ctx->am_n) cudaFree(ctx->am_n);
    mk_cuda_lane_free(ctx); /* first: it gives the main stream back where a branch was left open */
    if (ctx->stream) cudaStreamDestroy(ctx->stream);
    for (int i = 0; i < 2; i++)
        if (ctx->io[i]) cudaStreamDestroy(ctx->io[i]);
    for (int i = 0; i < ctx->trace_cap; i++) cudaEventDestroy(ctx->trace_ev[i]);
    free(ctx->trace_ev);
    free(ctx->trace_name);
    free(ctx->trace_host);
    free(ctx);
}

/* ---- kernel trace ---------------------------------------------------------------------------- */

#define MK_CUDA_TRACE_CAP 16384

extern "C" int mk_cuda_trace_active(const mk_cuda_ctx *ctx) { return ctx->trace_on; }

void mk_cuda_trace_mark(mk_cuda_ctx *ctx, const char *what) {
    if (ctx->trace_n >= ctx->trace_cap) return;
    if (cudaEventRecord(ctx->trace_ev[ctx->trace_n], ctx->stream) == cudaSuccess) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ctx->trace_host[ctx->trace_n] = ts.tv_sec + ts.tv_nsec * 1e-9;
        ctx->trace_name[ctx->trace_n++] = what;
    }
}

extern "C" int mk_cuda_trace_start(mk_cuda_ctx *ctx, mk_err *err) {
    if (!ctx->trace_ev) {
        ctx->trace_ev = (cudaEvent_t *)calloc(MK_CUDA_TRACE_CAP, sizeof(cudaEvent_t));
        ctx->trace_name = (const char **)calloc(MK_CUDA_TRACE_CAP, sizeof(const char *));
        ctx->trace_host = (double *)calloc(MK_CUDA_TRACE_CAP, sizeof(double));
        if (!ctx->trace_ev || !ctx->trace_name || !ctx->trace_host) return mk_fail(err, MK_ENOMEM, "cuda: trace: allocation failed");
        for (; ctx->trace_cap < MK_CUDA_TRACE_CAP; ctx->trace_cap++)
            MK_CU_TRY(cudaEventCreate(&ctx->trace_ev[ctx->trace_cap]), err, "cuda: trace: cudaEventCreate");
    }
    ctx->trace_n = 0;
    ctx->trace_on = 1;
    mk_cuda_trace_mark(ctx, "trace start");
    return MK_OK;
}

extern "C" int mk_cuda_trace_stop(mk_cuda_ctx *ctx, int cap, const char **names, float *us, float *queued_us,
                                  float *done_us, mk_err *err) {
    ctx->trace_on = 0;
    MK_CU_TRY(cudaStreamSynchronize(ctx->stream), err, "cuda: trace: synchronize");
    int n = 0;
    for (int i = 1; i < ctx->trace_n && n < cap; i++, n++) {
        float ms = 0.0f, ms0 = 0.0f;
        MK_CU_TRY(cudaEventElapsedTime(&ms, ctx->trace_ev[i - 1], ctx->trace_ev[i]), err, "cuda: trace: elapsed");
        MK_CU_TRY(cudaEventElapsedTime(&ms0, ctx->trace_ev[0], ctx->trace_ev[i]), err, "cuda: trace: elapsed");
        names[n] = ctx->trace_name[i];
        us[n] = ms * 1000.0f;
        queued_us[n] = (float)((ctx->trace_host[i] - ctx->trace_host[0]) * 1e6);
        done_us[n] = ms0 * 1000.0f;
    }
    return n;
}

extern "C" void mk_cuda_ctx_get_tuning(const mk_cuda_ctx *ctx, mk_cuda_tuning *t) { *t = ctx->tune; }

extern "C" void mk_cuda_ctx_set_tuning(mk_cuda_ctx *ctx, const mk_cuda_tuning *t) {
    ctx->tune = *t;
    if (ctx->tune.gemv_warps_per_sm < 1) ctx->tune.gemv_warps_per_sm = 1;
    if (ctx->tune.gemv_warps_per_sm > 64) ctx->tune.gemv_warps_per_sm = 64;
    if (ctx->tune.gemv_max_splits < 1) ctx->tune.gemv_max_splits = 1;
    if (ctx->tune.gemv_tiles < 1) ctx->tune.gemv_tiles = 1;
    if (ctx->tune.gemv_tiles > 8) ctx->tune.gemv_tiles = 8;
    if (ctx->tune.ri_min_blocks < 0) ctx->tune.ri_min_blocks = 0;
    if (ctx->tune.moe_ri < 0) ctx->tune.moe_ri = 0;
    if (ctx->tune.hc_ri < 0) ctx->tune.hc_ri = 0;
    if (ctx->tune.argmax_cluster < 0) ctx->tune.argmax_cluster = 0;
    if (ctx->tune.gemv_max_splits > 16) ctx->tune.gemv_max_splits = 16;
    ctx->tune.gemv_pdl = ctx->tune.gemv_pdl != 0;
    ctx->tune.moe_slabs = ctx->tune.moe_slabs == 2 ? 2 : 1;
    ctx->tune.moe_staged = ctx->tune.moe_staged != 0;
    if (ctx->tune.index_block_pairs < 0) ctx->tune.index_block_pairs = 0;
    ctx->tune.gemv_pipe = ctx->tune.gemv_pipe != 0;
    ctx->tune.hc_moe_sum = ctx->tune.hc_moe_sum != 0;
    ctx->tune.moe_fast_step = ctx->tune.moe_fast_step != 0;
    ctx->tune.moe_occ = ctx->tune.moe_occ == 2 ? 2 : 3;
    ctx->tune.moe_pf = ctx->tune.moe_pf != 0;
    ctx->tune.bf16_pipe = ctx->tune.bf16_pipe != 0;
    ctx->tune.moe_b_occ = ctx->tune.moe_b_occ == 2 ? 2 : 3;
    ctx->tune.moe_b_pf = ctx->tune.moe_b_pf != 0;
    ctx->tune.moe_b_sl = ctx->tune.moe_b_sl == 1 ? 1 : 2;
    ctx->tune.route_warp = ctx->tune.route_warp != 0;
    ctx->tune.attn_mlp = ctx->tune.attn_mlp != 0;
    ctx->tune.attn_cluster = ctx->tune.attn_cluster != 0;
    ctx->tune.index_topk = ctx->tune.index_topk != 0;
    ctx->tune.hc_fin_split = ctx->tune.hc_fin_split != 0;
    ctx->tune.attn_prep = ctx->tune.attn_prep != 0;
    ctx->tune.rows_ring = ctx->tune.rows_ring != 0;
    ctx->tune.rows_wide = ctx->tune.rows_wide != 0;
    ctx->tune.swiglu_pair = ctx->tune.swiglu_pair != 0;
    ctx->tune.index_fuse = ctx->tune.index_fuse != 0;
    ctx->tune.sample_agg = ctx->tune.sample_agg != 0;
    ctx->tune.sample_cluster = ctx->tune.sample_cluster != 0;
    ctx->tune.sample_bins = ctx->tune.sample_bins != 0;
    if (ctx->tune.sample_cluster_rows < 0) ctx->tune.sample_cluster_rows = 0;
    ctx->tune.ri_wdepth = ctx->tune.ri_wdepth >= 2 ? 2 : 1;
    if (ctx->tune.ri_l2_pf < 0) ctx->tune.ri_l2_pf = 0;
    if (ctx->tune.gemv_pipe_grid < 0) ctx->tune.gemv_pipe_grid = 0;
    if (ctx->tune.l2_lane < 0) ctx->tune.l2_lane = 0;
    if (ctx->tune.l2_lane_blocks < 1 || ctx->tune.l2_lane_blocks > 1024) ctx->tune.l2_lane_blocks = 32;
    ctx->tune.l2_lane_hint = ctx->tune.l2_lane_hint != 0;
    ctx->tune.branch = ctx->tune.branch != 0;
    ctx->tune.prio = ctx->tune.prio != 0;
    ctx->tune.hc_rs = ctx->tune.hc_rs != 0;
    ctx->tune.hc_post_loads = ctx->tune.hc_post_loads != 0;
    ctx->tune.hc_fin = ctx->tune.hc_fin != 0;
    ctx->tune.hc_probe = ctx->tune.hc_probe != 0;
    ctx->tune.fp4_tiles = ctx->tune.fp4_tiles != 0;
    ctx->tune.head_tiles = ctx->tune.head_tiles != 0;
    ctx->tune.head_argmax = ctx->tune.head_argmax != 0;
    ctx->tune.attn_f16 = ctx->tune.attn_f16 != 0;
}

extern "C" const mk_cuda_caps *mk_cuda_ctx_caps(const mk_cuda_ctx *ctx) { return &ctx->caps; }

extern "C" void *mk_cuda_ctx_stream(mk_cuda_ctx *ctx) { return (void *)ctx->stream; }

extern "C" int mk_cuda_ctx_sync(mk_cuda_ctx *ctx, mk_err *err) {
    for (int i = 0; i < 2; i++)
        if (ctx->io[i]) MK_CU_TRY(cudaStreamSynchronize(ctx->io[i]), err, "cuda: I/O stream synchronize");
    MK_CU_TRY(cudaStreamSynchronize(ctx->stream), err, "cuda: stream synchronize");
    MK_CU_TRY(cudaGetLastError(), err, "cuda: after synchronize");
    return MK_OK;
}

extern "C" int mk_cuda_alloc(mk_cuda_ctx *ctx, size_t bytes, void **dptr, mk_err *err) {
    (void)ctx;
    *dptr = NULL;
    if (bytes == 0) bytes = 1;
    cudaError_t e = cudaMalloc(dptr, bytes);
    if (e != cudaSuccess) {
        *dptr = NULL;
        char what[96];
        snprintf(what, sizeof what, "cudaMalloc(%zu bytes)", bytes);
        return mk_cuda_fail(err, e, what);
    }
    return MK_OK;
}

extern "C" void mk_cuda_free(mk_cuda_ctx *ctx, void *dptr) {
    (void)ctx;
    if (dptr) cudaFree(dptr);
}

extern "C" int mk_cuda_upload(mk_cuda_ctx *ctx, void *dst, const void *src, size_t bytes,
                              mk_err *err) {
    /* On the context's stream, not the legacy default stream: a pageable-memory cudaMemcpy may
     * return before its DMA lands, and a non-blocking stream does not wait for the default one. */
    MK_CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx->stream), err, "cuda: upload");
    MK_CU_TRY(cudaStreamSynchronize(ctx->stream), err, "cuda: upload: stream synchronize");
    return MK_OK;
}

extern "C" int mk_cuda_upload_async(mk_cuda_ctx *ctx, void *dst, const void *src, size_t bytes, mk_err *err) {
    MK_CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ctx->stream), err, "cuda: upload");
    return MK_OK;
}

extern "C" int mk_cuda_download(mk_cuda_ctx *ctx, void *dst, const void *src, size_t bytes,
                                mk_err *err) {
    MK_CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx->stream), err, "cuda: download");
    MK_CU_TRY(cudaStreamSynchronize(ctx->stream), err, "cuda: download: stream synchronize");
    return MK_OK;
}

extern "C" int mk_cuda_download_async(mk_cuda_ctx *ctx, void *dst, const void *src, size_t bytes, mk_err *err) {
    MK_CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ctx->stream), err, "cuda: download");
    return MK_OK;
}

/* The stream of sid (MK_CUDA_S_*), an I/O stream made at its first use (never inside a capture:
 * the step I/O runs between calls). */
static int sid_stream(mk_cuda_ctx *ctx, int sid, cudaStream_t *s, mk_err *err) {
    if (sid == MK_CUDA_S_MAIN) {
        *s = ctx->stream;
        return MK_OK;
    }
    if (sid != MK_CUDA_S_UP && sid != MK_CUDA_S_DOWN) return mk_fail(err, MK_EINVAL, "cuda: stream id %d", sid);
    cudaStream_t *io = &ctx->io[sid - MK_CUDA_S_UP];
    if (!*io) MK_CU_TRY(cudaStreamCreateWithFlags(io, cudaStreamNonBlocking), err, "cuda: I/O stream");
    *s = *io;
    return MK_OK;
}

extern "C" int mk_cuda_copy_on(mk_cuda_ctx *ctx, int sid, void *dst, const void *src, size_t bytes, mk_err *err) {
    cudaStream_t s = NULL;
    int st = sid_stream(ctx, sid, &s, err);
    if (st) return st;
    MK_CU_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), err, "cuda: copy on an I/O stream");
    return MK_OK;
}

extern "C" int mk_cuda_event_record_on(mk_cuda_ctx *ctx, int sid, mk_cuda_event *ev, mk_err *err) {
    cudaStream_t s = NULL;
    int st = sid_stream(ctx, sid, &s, err);
    if (st) return st;
    MK_CU_TRY(cudaEventRecord((cudaEvent_t)ev, s), err, "cuda: event record");
    return MK_OK;
}

extern "C" int mk_cuda_stream_wait_on(mk_cuda_ctx *ctx, int sid, mk_cuda_event *ev, mk_err *err) {
    cudaStream_t s = NULL;
    int st = sid_stream(ctx, sid, &s, err);
    if (st) return st;
    MK_CU_TRY(cudaStreamWaitEvent(s, (cudaEvent_t)ev, 0), err, "cuda: stream wait");
    return MK_OK;
}

/* An event is a cudaEvent_t (a pointer) behind the opaque type. Timing is off: a record and a wait
 * then cost what the ordering needs. */
extern "C" int mk_cuda_event_create(mk_cuda_event **ev, mk_err *err) {
    cudaEvent_t e = NULL;
    *ev = NULL;
    MK_CU_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), err, "cuda: event create");
    *ev = (mk_cuda_event *)e;
    return MK_OK;
}

extern "C" void mk_cuda_event_free(mk_cuda_event *ev) {
    if (ev) cudaEventDestroy((cudaEvent_t)ev);
}

extern "C" int mk_cuda_event_record(mk_cuda_ctx *ctx, mk_cuda_event *ev, mk_err *err) {
    MK_CU_TRY(cudaEventRecord((cudaEvent_t)ev, ctx->stream), err, "cuda: event record");
    return MK_OK;
}

extern "C" int mk_cuda_event_wait(mk_cuda_event *ev, mk_err *err) {
    MK_CU_TRY(cudaEventSynchronize((cudaEvent_t)ev), err, "cuda: event synchronize");
    MK_CU_TRY(cudaGetLastError(), err, "cuda: after an event");
    return MK_OK;
}

extern "C" int mk_cuda_host_alloc(size_t bytes, void **ptr, mk_err *err) {
    *ptr = NULL;
    MK_CU_TRY(cudaMallocHost(ptr, bytes ? bytes : 1), err, "cuda: page-locked host allocation");
    return MK_OK;
}

extern "C" void mk_cuda_host_free(void *ptr) {
    if (ptr) cudaFreeHost(ptr);
}

extern "C" int mk_cuda_memset(mk_cuda_ctx *ctx, void *dst, int value, size_t bytes, mk_err *err) {
    MK_CU_TRY(cudaMemsetAsync(dst, value, bytes, ctx->stream), err, "cuda: memset");
    return MK_OK;
}

/* ---- weights ---------------------------------------------------------------------------- */

extern "C" size_t mk_cuda_wmat_data_bytes(const mk_wmat *W) {
    size_t nk = (size_t)W->n * (size_t)W->k;
    switch (W->kind) {
    case MK_W_BF16: return nk * 2;
    case MK_W_F32: return nk * 4;
    case MK_W_FP8:
    case MK_W_FP8_DQ: return nk;
    case MK_W_FP4: return nk / 2;
    }
    return 0;
}

static size_t wmat_scale_bytes(const mk_wmat *W) {
    switch (W->kind) {
    case MK_W_FP8:
    case MK_W_FP8_DQ: return (size_t)((W->n + 127) / 128) * (size_t)((W->k + 127) / 128);
    case MK_W_FP4: return (size_t)W->n * (size_t)(W->k / 32);
    default: return 0;
    }
}

extern "C" int mk_cuda_wmat_upload(mk_cuda_ctx *ctx, const mk_wmat *host, mk_wmat *dev,
                                   mk_err *err) {
    memset(dev, 0, sizeof *dev);
    if (host->n <= 0 || host->k <= 0 || (host->kind == MK_W_FP4 && host->k % 32))
        return mk_fail(err, MK_EINVAL, "cuda: weight upload: bad shape [%d, %d] for kind %d",
                       host->n, host->k, (int)host->kind);
    size_t db = mk_cuda_wmat_data_bytes(host), sb = wmat_scale_bytes(host);
    if (db == 0) return mk_fail(err, MK_EINVAL, "cuda: weight upload: unknown kind %d", (int)host->kind);
    void *w = NULL, *s = NULL;
    int st = mk_cuda_alloc(ctx, db, &w, err);
    if (st) return st;
    st = mk_cuda_upload(ctx, w, host->w, db, err);
    if (!st && sb) {
        st = mk_cuda_alloc(ctx, sb, &s, err);
        if (!st) st = mk_cuda_upload(ctx, s, host->scale, sb, err);
    }
    if (st) {
        mk_cuda_free(ctx, w);
        mk_cuda_free(ctx, s);
        return st;
    }
    *dev = *host;
    dev->w = w;
    dev->scale = (const uint8_t *)s;
    return MK_OK;
}

extern "C" void mk_cuda_wmat_free(mk_cuda_ctx *ctx, mk_wmat *dev) {
    mk_cuda_free(ctx, (void *)dev->w);
    mk_cuda_free(ctx, (void *)dev->scale);
    dev->w = NULL;
    dev->scale = NULL;
}

/* ---- CUDA graphs ----------------------------------------------------------------------------- */

struct mk_cuda_graph {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    size_t nodes;
};

extern "C" int mk_cuda_capture_begin(mk_cuda_ctx *ctx, mk_err *err) {
    { /* the lane's and the branch's streams exist before the capture (lane.cu) */
        int st = mk_cuda_lane_ready(ctx, err);
        if (st) return st;
    }
    /* a branch an error left open or unjoined in an earlier capture is gone with that capture */
    if (ctx->in_branch) ctx->stream = ctx->main, ctx->in_branch = 0;
    ctx->branch_pending = 0;
    ctx->lane_pending = 0;
    MK_CU_TRY(cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal), err, "cuda: begin capture");
    ctx->capturing = 1;
    return MK_OK;
}

/* The kernel nodes of a captured graph by priority: at the device's greatest (*hi), at its least (*lo),
 * any other (*other). */
static int graph_prios(cudaGraph_t graph, const mk_cuda_ctx *ctx, int *hi, int *lo, int *other) {
    *hi = *lo = *other = 0;
    size_t n = 0;
    if (cudaGraphGetNodes(graph, NULL, &n) != cudaSuccess) return cudaGetLastError(), -1;
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)calloc(n ? n : 1, sizeof *nodes);
    if (!nodes) return -1;
    int st = cudaGraphGetNodes(graph, nodes, &n) == cudaSuccess ? 0 : -1;
    for (size_t i = 0; i < n && !st; i++) {
        cudaGraphNodeType ty;
        if (cudaGraphNodeGetType(nodes[i], &ty) != cudaSuccess) st = -1;
        if (st || ty != cudaGraphNodeTypeKernel) continue;
        cudaKernelNodeAttrValue v;
        if (cudaGraphKernelNodeGetAttribute(nodes[i], cudaKernelNodeAttributePriority, &v) != cudaSuccess) st = -1;
        else if (v.priority == ctx->prio_hi) ++*hi;
        else if (v.priority == ctx->prio_lo) ++*lo;
        else ++*other;
    }
    if (st) cudaGetLastError();
    free(nodes);
    return st;
}

extern "C" int mk_cuda_capture_end(mk_cuda_ctx *ctx, mk_cuda_graph **out, mk_err *err) {
    *out = NULL;
    cudaGraph_t graph = NULL;
    mk_err ej;
    memset(&ej, 0, sizeof ej);
    const int jst = mk_cuda_lane_join(ctx, &ej); /* on error the capture still ends (unjoined: it fails) */
    ctx->capturing = 0;
    cudaError_t e = cudaStreamEndCapture(ctx->stream, &graph);
    if (jst && e == cudaSuccess) {
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        if (err) *err = ej;
        return jst;
    }
    if (e != cudaSuccess) {
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError(); /* the capture's error is reported here, not left for the next call */
        return mk_cuda_fail(err, e, "cuda: end capture");
    }
    mk_cuda_graph *g = (mk_cuda_graph *)calloc(1, sizeof *g);
    if (!g) {
        cudaGraphDestroy(graph);
        return mk_fail(err, MK_ENOMEM, "cuda: graph: out of memory");
    }
    g->graph = graph;
    if (getenv("MINKE_CUDA_GRAPH_DOT")) { /* benchmarks: the graph's nodes and edges as DOT, one file a capture */
        static int n_dot = 0;
        char path[512];
        snprintf(path, sizeof path, "%s.%d.dot", getenv("MINKE_CUDA_GRAPH_DOT"), n_dot++);
        if (cudaGraphDebugDotPrint(graph, path, cudaGraphDebugDotFlagsVerbose) != cudaSuccess) cudaGetLastError();
    }
    e = cudaGraphGetNodes(graph, NULL, &g->nodes);
    if (e == cudaSuccess)
        e = cudaGraphInstantiate(&g->exec, graph, ctx->tune.prio ? cudaGraphInstantiateFlagUseNodePriority : 0);
    if (e == cudaSuccess && ctx->tune.prio && getenv("MINKE_CUDA_PRIO_LOG")) { /* benchmarks */
        int hi, lo, other;
        if (!graph_prios(graph, ctx, &hi, &lo, &other))
            fprintf(stderr, "cuda: graph of %zu nodes: kernels at priority %d: %d, at %d: %d, other: %d\n", g->nodes,
                    ctx->prio_hi, hi, ctx->prio_lo, lo, other);
    }
    if (e != cudaSuccess) {
        mk_cuda_graph_free(g);
        return mk_cuda_fail(err, e, "cuda: graph instantiate");
    }
    *out = g;
    return MK_OK;
}

extern "C" int mk_cuda_graph_launch(mk_cuda_ctx *ctx, mk_cuda_graph *g, mk_err *err) {
    MK_CU_TRY(cudaGraphLaunch(g->exec, ctx->stream), err, "cuda: graph launch");
    return MK_OK;
}

extern "C" size_t mk_cuda_graph_nodes(const mk_cuda_graph *g) { return g ? g->nodes : 0; }

extern "C" int mk_cuda_graph_prios(const mk_cuda_ctx *ctx, const mk_cuda_graph *g, int *hi, int *lo, int *other) {
    if (!g) return *hi = *lo = *other = 0, -1;
    return graph_prios(g->graph, ctx, hi, lo, other);
}

extern "C" void mk_cuda_graph_free(mk_cuda_graph *g) {
    if (!g) return;
    if (g->exec) cudaGraphExecDestroy(g->exec);
    if (g->graph) cudaGraphDestroy(g->graph);
    free(g);
}
