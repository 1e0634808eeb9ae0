/* ops_cuda.h — the CUDA backend of ops.h (Hopper sm_90a; Blackwell sm_100a compiles), as a C API.
 *
 * Every op of ops.h has a twin here with the same numerics contract; the CPU op is the reference
 * and tests/ops/test_ops_cuda.c checks each twin against it on random inputs with a stated
 * tolerance. The conventions are those of ops.h: activations are fp32 arrays (holding bf16 values
 * where the DeepSeek reference keeps bf16), shapes row-major and contiguous, outputs rounded to
 * bf16 where the CPU op rounds. All pointers passed to the ops are DEVICE pointers (allocate them
 * with mk_cuda_alloc); the ops are queued on the context's stream and return as soon as the
 * kernels are launched, so an error in a running kernel surfaces at the next mk_cuda_ctx_sync
 * (or copy). Every function returns MK_OK or a negative mk_status with a message in err; CUDA
 * errors are mapped to a status and their text is kept. Nothing here exits or aborts.
 *
 * Weights are uploaded once from the mmapped checkpoint exactly as stored (FP8 E4M3 bytes with
 * E8M0 128x128 block scales, packed FP4 E2M1 with E8M0 per-32 scales, bf16, f32): the GEMV/GEMM
 * kernels read the quantized bytes directly, there is no dequantized copy.
 *
 * Kernels of mk_cuda_linear (the context logs which ones it uses at creation):
 *   FP8,  m <= 8   tensor-core GEMV (mma.sync m16n8k32 e4m3, weights as the A operand, the batch
 *                  as the 8 columns), per-128 partial sums promoted to fp32 with both scales;
 *   FP8,  m > 8    tensor-core GEMM (cp.async 3-stage pipeline, ldmatrix, mma.sync m16n8k32,
 *                  {64,128}x128x128 tiles, split-K when the grid would leave SMs idle);
 *   FP4,  any m    tensor-core GEMV: E2M1 nibbles widened to E4M3 in registers (exact), the
 *                  per-32 scales applied per block through a block-diagonal activation operand;
 *                  m > 8 runs in chunks of 8 rows (logged: there is no FP4 GEMM kernel yet);
 *   BF16, m <= 8   tensor-core GEMV (mma.sync m16n8k16 bf16); m > 8: cuBLAS (bf16 in, fp32 out);
 *   FP8_DQ         tensor-core GEMV (mma.sync m16n8k16 f16): e4m3 weights widened exactly to f16,
 *                  activations as f16 times a power-of-two scale per 128-block; m > 8 in chunks;
 *   F32            a plain warp-per-row FMA kernel ("simple"), any m (logged).
 * The GEMVs are launched with programmatic dependent launch: a GEMV starts streaming its weights
 * while the kernel before it finishes, and waits for it only before reading activations.
 * The "simple" kernel exists for every kind and serves as a second, independent implementation
 * in the tests and benchmarks.
 */
#ifndef MK_OPS_CUDA_OPS_CUDA_H
#define MK_OPS_CUDA_OPS_CUDA_H

#include "minke.h"
#include "num/sample_math.h"
#include "ops/ops.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- device and context ------------------------------------------------------------------- */

typedef struct mk_cuda_ctx mk_cuda_ctx;

typedef struct {
    int device;
    char name[256];
    int cc_major, cc_minor;
    int sm_count;
    int clock_khz;            /* peak SM clock */
    int mem_clock_khz;        /* peak memory clock */
    int mem_bus_bits;
    size_t mem_bytes;         /* total device memory */
    size_t l2_bytes;
    size_t smem_optin;        /* max shared memory per block after opt-in */
    double dram_peak_gbs;     /* 2 * mem_clock * bus_width / 8: the datasheet-style figure */
    int runtime_version, driver_version;
    int have_cublas;
} mk_cuda_caps;

/* Number of usable CUDA devices; 0 when there is no device or no driver (never an error). */
int mk_cuda_device_count(void);
/* Creates a context on `device`: selects it, makes a non-blocking stream, reads capabilities,
 * creates the cuBLAS handle. Logs the capabilities and kernel choices at info level. */
int mk_cuda_ctx_create(int device, mk_cuda_ctx **out, mk_err *err);
void mk_cuda_ctx_free(mk_cuda_ctx *ctx);
const mk_cuda_caps *mk_cuda_ctx_caps(const mk_cuda_ctx *ctx);
/* The context's stream (a cudaStream_t) for callers that add their own work or capture graphs. */
void *mk_cuda_ctx_stream(mk_cuda_ctx *ctx);
/* Waits for all queued work; returns the first asynchronous error, if any. */
int mk_cuda_ctx_sync(mk_cuda_ctx *ctx, mk_err *err);
/* Writes a human-readable description (device, capabilities, kernel choices) into buf. */
void mk_cuda_ctx_describe(const mk_cuda_ctx *ctx, char *buf, size_t len);

/* Kernel tuning knobs (benchmarks sweep them; the defaults are what was measured best). Changing
 * them changes mk_cuda_linear_scratch: size scratch after setting them. */
typedef struct {
    int gemv_warps_per_sm; /* resident warps the GEMV launch plan aims at per SM (default 16;
                            * MINKE_CUDA_GEMV_WPS overrides it at context creation) */
    int gemv_max_splits;   /* blocks per 16-row slab along k, 1..16 (default 1: measured best) */
    int gemv_pdl;          /* 1: launch the GEMVs and the decode path's small kernels with
                            * programmatic dependent launch (default 1; MINKE_CUDA_PDL=0 turns it
                            * off at context creation) */
    int moe_slabs;         /* 16-row slabs per block of the decode FP4 expert GEMV, 1 or 2 (default 2;
                            * MINKE_CUDA_MOE_SLABS overrides it at context creation) */
    int moe_staged;        /* 1: FP4 experts with several slots per call run k_moe_fp4_staged (weights
                            * loaded once per block, activations staged in shared memory; same bits
                            * as the unstaged kernel); default 0 (measured slower than the unstaged
                            * kernel once k_moe_fp4_ri takes the groups of many slots),
                            * MINKE_CUDA_MOE_STAGED=1 turns it on */
    int linear_multi;      /* 1: mk_cuda_linear_multi runs bf16 GEMVs of one input in one launch (same
                            * bits); default 1, MINKE_CUDA_LINEAR_MULTI=0 turns it off */
    int norm_quant;        /* 1: mk_cuda_rmsnorm_quant and mk_cuda_idx_q_prep in one launch each (same
                            * bits); default 1, MINKE_CUDA_NORM_QUANT=0 */
    int rope_fuse;         /* 1: mk_cuda_linear_grouped_rope rotates in the input preparation (wo_a's:
                            * the attention output's inverse RoPE; same bits); default 1, MINKE_CUDA_ROPE_FUSE=0 */
    int moe_with_fp8;      /* 1: the shared expert's FP8 GEMVs ride along in the routed experts' decode
                            * launches (mk_cuda_moe_gemv_fp4_with; same bits); default 1,
                            * MINKE_CUDA_MOE_WITH_FP8=0 */
    int moe_route_plan;    /* 1: a one-token step's routing, weights and plan in one launch
                            * (mk_cuda_moe_route_plan; same bits); default 1, MINKE_CUDA_ROUTE_PLAN=0 */
    int cmp_step;          /* 1: a compressor's decode step, its entry included, in one launch
                            * (mk_cuda_cmp_step_multi; same bits); default 1, MINKE_CUDA_CMP_STEP=0 */
    int graphs;            /* 1: the model replays its decode steps as CUDA graphs (dsv4_cuda.c);
                            * default 1, MINKE_CUDA_GRAPHS=0 */
    int gemv_tiles;        /* tiles of 8 activation rows per block of the row-invariant GEMMs (the
                            * GEMVs' bits for m > 8, gemv.cu): 8 or 4 for the FP8 and expert ones (FP8_DQ
                            * always takes 4, bf16 8); 1 = none of them, the GEMVs in chunks of 8 only
                            * (default 8; MINKE_CUDA_GEMV_TILES overrides it at context creation) */
    int ri_min_blocks;     /* the row-invariant GEMM is used when it has at least this many blocks
                            * (0: the SM count), else the GEMV's chunks of 8 (weight-bound batches);
                            * MINKE_CUDA_RI_MIN_BLOCKS */
    int moe_ri;            /* FP4 experts run the row-invariant GEMM (k_moe_fp4_ri, same bits) when the
                            * call has at least this many slots per expert group on average (default
                            * 16: prefill; 0 = never); MINKE_CUDA_MOE_RI overrides it */
    int hc_ri;             /* hc_pre / hc_head of at least this many tokens sum their chunks with
                            * k_hc_mix_ri (same bits; 0 = never; default 16); MINKE_CUDA_HC_RI */
    int attn16;            /* 1: the sparse attention serves 16 heads per block when the grid still fills
                            * the GPU (prefill, large batches: each row read half as often; a head's bits
                            * do not depend on its group); default 1, MINKE_CUDA_ATTN16=0 */
    int index_block_pairs; /* the indexer's scores use a block per (row, entry) below this many
                            * pairs, a warp per pair from it on (0: 32 per SM; same bits either way) */
    int gemv_pipe;         /* 1: decode FP8 GEMVs (at most 8 rows, no split) run k_gemv_fp8_pipe, one
                            * wave of blocks each walking several slabs with the next item's weights in
                            * flight (same bits); default 1, MINKE_CUDA_GEMV_PIPE=0 */
    int gemv_pipe_grid;    /* blocks of the pipelined GEMV's grid (0: one wave; tests force fewer) */
    int bf16_pipe;         /* 1: bf16 GEMVs whose plan gives each slab one warp (the head) run
                            * k_gemv_bf16_wpipe: one wave of independent warps, each walking its slabs
                            * with two items of weights in flight (same bits); default 1 (H100: the head
                            * 351.8 us in the greedy graph against 358.9, session 26); MINKE_CUDA_BF16_PIPE */
    int hc_moe_sum;        /* 1: a block's last hc_post (fused with the next hc_pre / the head's collapse)
                            * computes the MoE combine where it reads the MoE output (mk_cuda_moe_sum:
                            * no combine launch; same bits); default 1 (H200: ~0.9% less per decode step
                            * over three A/B pairs), MINKE_CUDA_HC_MOE_SUM=0 */
    int moe_b_occ, moe_b_pf, moe_b_sl; /* the expert GEMV of batches too small for the row-invariant GEMM
                            * (k_moe_gemv_fp4 in chunks of 8 slots): 3 (default) or 2 blocks an SM, the L2
                            * prefetch before the PDL wait (default 0), 2 (default) or 1 16-row slabs a block;
                            * the same bits each way. H100, batch 64: 7.87 ms a step at 3 / 0 / 2 against
                            * 10.00 at 2 / 1 / 1, batch 256 17.11 against 20.47 (session 26; 4 slabs a block
                            * was no faster); MINKE_CUDA_MOE_B_OCC, _B_PF, _B_SL */
    int moe_occ, moe_pf;   /* the decode expert GEMVs (k_moe_fp4_with_fp8 with the shared expert, and
                            * k_moe_gemv_fp4 of one token without it: the shared expert on the branch):
                            * moe_occ 3 (default) or 2 blocks an SM (3: one 128-block of weights in flight
                            * per slab and warp step instead of two, 80 registers); moe_pf 1: each block first requests
                            * its weight rows into L2, before its PDL wait (default 0). The same bits each
                            * way. H100: experts 192.7 us a greedy step in the graph at 3 / 0 against 264.9
                            * at 2 / 1 (session 26); MINKE_CUDA_MOE_OCC, MINKE_CUDA_MOE_PF */
    int head_tiles;        /* 1: the model uploads its bf16 head in slab tiles (mk_cuda_bf16_tiles; the same
                            * bits); default 1 (H100, session 39: the head's GEMV 339 us against 352 alone, the
                            * engine's greedy step 0.931-0.941 ms against 0.949-0.956); MINKE_CUDA_HEAD_TILES */
    int head_argmax;       /* 1: mk_cuda_linear_argmax takes the argmax inside the head's GEMV where it can
                            * (mk_cuda_gemv_bf16_am; the same logits and picks); default 1 (H100, session 40:
                            * the engine's greedy step 0.929-0.939 ms against 0.932-0.941, same call);
                            * MINKE_CUDA_HEAD_ARGMAX=0: the argmax kernel after the head */
    int fp4_tiles;         /* 1: the routed experts' FP4 weights and scales are uploaded in slab tiles
                            * (mk_cuda_fp4_expert_layout: a slab's 16 rows one 1 KB run per 128-block)
                            * and every expert kernel reads them there; the same bits. Default 1. H100,
                            * session 35: greedy step 0.995-0.998 ms against 1.005-1.010 in rows (the
                            * experts 151.6 us a step in the graph against 160.7); bench_gpu's read pattern
                            * probe: the decode GEMV's loads alone stream at 97% of copy from tiles, 81% from
                            * rows. MINKE_CUDA_FP4_TILES=0: rows. Set before the weights are uploaded. */
    int moe_fast_step;     /* 1: the FP4 expert GEMVs of decode and small batches (k_moe_gemv_fp4 and the
                            * decode kernels) step a 32-block with fp4l_step_fast: 64 * e8m0 by a shift
                            * unless a scale byte is >= 249, and for a chunk of one slot (a decode's)
                            * only the column it stores (the kernels are issue-bound; same bits);
                            * default 1 (H200: ~1% less per batch-1 step), MINKE_CUDA_MOE_FAST_STEP=0 */
    int hc_fin_split;      /* 1: hc_pre's finishing kernel gives a token two blocks: pre / post and the
                            * collapse (what the next kernel waits for) in one, the Sinkhorn's comb
                            * (read only by the hc_post after the sub-layer) in the other, beside it
                            * instead of before it (same bits); default 1 (H200: ~3% less per batch-1
                            * step), MINKE_CUDA_HC_FIN_SPLIT=0 */
    int ri_wdepth;         /* 1 or 2: how many 128-blocks of weights a warp of the row-invariant FP8 and
                            * expert GEMMs (prefill, large batches; 8 tiles) has in flight while it
                            * computes one; ri_l2_pf (0: none): how many 128-blocks ahead its rows are
                            * requested into L2 (those two and the FP8_DQ one). Only when loads are issued changes: same bits. Default
                            * 1 and 0 until run on a GPU (written in a session without one),
                            * MINKE_CUDA_RI_WDEPTH, MINKE_CUDA_RI_L2_PF */
    int ri_l2_pf;
    int rows_ring;         /* 1: a step of one-row pieces (a decode) writes the window rings in the
                            * attention's row-list launch (mk_cuda_attn_rows_multi's ring_put): no
                            * ring_put launch; default 1, MINKE_CUDA_ROWS_RING=0 */
    int rows_wide;         /* 1: the row lists of a call of at most 4 rows (a decode step of few sequences)
                            * built by a block of 1024 threads sharing each row (k_attn_rows_wide; the same
                            * lists), not a warp per row; default 1 (H100: a batch-1 step 1.6-4.9% shorter),
                            * MINKE_CUDA_ROWS_WIDE=0 */
    int swiglu_pair;       /* 1: the routed and the shared expert's SwiGLU + quantization of a decode step
                            * in one launch (mk_cuda_swiglu_quant2; same bits); default 1,
                            * MINKE_CUDA_SWIGLU_PAIR=0 */
    int sample_agg;        /* 1: the GPU draw's radix passes add once per group of a warp's lanes with the
                            * same bin (mk_cuda_sample_rows; same tokens); default 0 (slower on the
                            * H200), MINKE_CUDA_SAMPLE_AGG=1 */
    int sample_cluster;    /* 1: the GPU draw runs on a cluster of 8 blocks per row, each holding a slice of
                            * the row in shared memory (mk_cuda_sample_rows; same tokens); default 1,
                            * MINKE_CUDA_SAMPLE_CLUSTER=0 */
    int sample_cluster_rows; /* with sample_cluster: the cluster draw only for launches of at most this many
                              * rows, one block per row for more (mk_cuda_sample_uses_cluster); 0: any
                              * number; default 32 (H100: the cluster's 8 blocks a row fill the SMs by
                              * then), MINKE_CUDA_SAMPLE_CLUSTER_ROWS */
    int sample_bins;       /* 1: the GPU draw's top_k and top_p first find the weight bin where their cut
                            * falls and, where its candidates fit (MK_SAMPLE_GATHER), run their radix
                            * passes over those only, gathered in shared memory (mk_cuda_sample_rows; same
                            * tokens); default 1, MINKE_CUDA_SAMPLE_BINS=0 */
    int index_fuse;        /* 1: the indexer's top-k runs in its scores' launch when that has a block per
                            * (row, entry) (a decode; mk_cuda_index_multi's cnt); same picks; default 1,
                            * MINKE_CUDA_INDEX_FUSE=0 */
    int attn_prep;         /* 1: the attention's q / kv / indexer-query preparation in one launch
                            * (mk_cuda_attn_prep), and the indexer's head weights scaled where its scores
                            * read them (mk_cuda_index_multi's iw_scale: no scale_bf16 launch); same
                            * bits; default 1, MINKE_CUDA_ATTN_PREP=0 (the four merges together: H200,
                            * ~2% less per batch-1 step) */
    int l2_lane;           /* MiB (0: off): a captured decode step prefetches the weights of its next
                            * linears into L2, at most this much per fork, on a second stream while the
                            * main one runs latency-bound kernels (mk_cuda_lane_prefetch; no value
                            * changes); default 0 (slower on the H200: 1.149-1.175 vs 1.113 ms per
                            * batch-1 step), MINKE_CUDA_L2_LANE */
    int l2_lane_blocks;    /* blocks of one warp of a lane prefetch (default 32; MINKE_CUDA_L2_LANE_BLOCKS) */
    int l2_lane_hint;      /* 1: the lane's prefetches mark their lines evict_last (default 0: normal;
                            * MINKE_CUDA_L2_LANE_HINT) */
    int branch;            /* 1: a captured decode step runs the compressors (their projections and
                            * steps) of a compressed layer on a side branch, beside the q / kv path,
                            * and every layer's shared expert beside the gate, the routing and the
                            * routed experts (mk_cuda_branch_begin; same kernels, same bits); default 1
                            * since the routed experts alone run at moe_occ's blocks an SM (H100, session
                            * 27: greedy step 1.016 / 1.013 ms against 1.029 / 1.026 / 1.025 without,
                            * same call; no gain at 2 blocks an SM), MINKE_CUDA_BRANCH=0 */
    int hc_rs;             /* 1: the hc split path's chunk sums (k_hc_mix_part, k_hc_post_part) add each
                            * warp's 25 columns as one reduce-scatter of shuffles (31 doubles a warp)
                            * instead of 25 butterflies (125): the same trees, the same bits; default 1
                            * (H100, session 32: greedy step 1.018-1.023 ms against 1.026-1.032 without,
                            * same calls), MINKE_CUDA_HC_RS=0 */
    int hc_post_loads;     /* 1: k_hc_post_part issues every load of its element (the sub-layer value or
                            * the MoE combine's rows, post, comb, res) before its first arithmetic: one
                            * memory round trip after the programmatic wait instead of up to three (the
                            * same operations: the same bits); default 1 (H100, session 33: greedy step
                            * ~6 us shorter, two calls), MINKE_CUDA_HC_POST_LOADS=0 */
    int hc_fin;            /* 1: hc_pre's finishing kernel adds the RMSNorm's 32 warp partials (in order)
                            * in one thread and broadcasts the scale (one barrier more), and quantizes the
                            * row with one redux.sync per warp maximum and v * (1 / s) for v / s (s a power
                            * of two); 0: the older form (mk_d_rms_scale: every thread adds the 32
                            * partials itself; shuffle maxima and v / s). The same bits each way; default 1
                            * (H100, session 35: ~2-3 us less per greedy step), MINKE_CUDA_HC_FIN=0 */
    int hc_probe;          /* 1 (a measurement tool): hc_pre's finishing kernel prints its phases' clocks
                            * (thread 0 of token 0's blocks) at each launch; MINKE_CUDA_HC_PROBE */
    int prio;              /* 1: in a captured step, kernels launched on the main stream get the device's
                            * greatest priority and the side branch's the least (node priorities, the
                            * graph instantiated to use them): where both are ready, the block scheduler
                            * places the critical path's blocks first. No value changes; default 1 (H100,
                            * session 30: greedy step ~1.2% shorter); MINKE_CUDA_PRIO=0 */
    int route_warp;        /* 1: a one-token routing's weights and plan (mk_cuda_moe_route_plan, K <= 32) by
                            * the 32 lanes of a warp instead of one thread's loops over global memory (the
                            * same outputs); MINKE_CUDA_ROUTE_WARP */
    int attn_mlp;          /* 1: the sparse attention with at most 4 heads per block (a decode's) loads its
                            * score and PV operands several steps ahead (k_sparse_attn's MLP; the same fmaf
                            * chains: same bits); MINKE_CUDA_ATTN_MLP */
    int argmax_cluster;    /* mk_cuda_argmax_rows of at most this many rows (of >= 32768 values) runs a
                            * cluster of 8 blocks per row, each scanning a slice (the same winner: the
                            * greedy rule is a total order); more rows, or 0, one block per row; default
                            * 16, MINKE_CUDA_ARGMAX_CLUSTER */
    int attn_cluster;      /* 1: the sparse attention with at most 4 heads per block and D <= 512 (a decode's)
                            * runs on a cluster of 4 blocks per head group, each scoring a quarter of the
                            * rows and computing a quarter of the outputs (k_sparse_attn_cl; the same
                            * arithmetic: same bits); default 1, MINKE_CUDA_ATTN_CLUSTER=0 */
    int index_topk;        /* the indexer's top-k (the same picks each way): 1 (default) a radix select and a
                            * bitonic sort of the picks (index_topk_radix; at most 2048 picks, else the
                            * scan); 0 a scan per entry that stops once its rank reaches k (O(entries^2):
                            * 250 us of an H100 step after a 4096-token prompt, against 49 us);
                            * MINKE_CUDA_INDEX_TOPK */
    int attn_cluster_hg;   /* heads per block of the cluster attention: 0 = the fewest whose clusters fit in one
                            * wave (default), 1, 2 or 4 (same bits); MINKE_CUDA_ATTN_CLUSTER_HG */
    int attn_f16;          /* 1: a decode step's sparse attention (the cluster kernel, D 512) also writes wo_a's
                            * prepared input (the inverse RoPE, f16 per 128-block: mk_cuda_sparse_attn_f16) in
                            * its epilogue: no k_f16_prep launch before wo_a; the same bits. Default 1 (H100,
                            * session 36: greedy step 0.992-0.993 ms against 0.995-0.997), MINKE_CUDA_ATTN_F16=0 */
} mk_cuda_tuning;
void mk_cuda_ctx_get_tuning(const mk_cuda_ctx *ctx, mk_cuda_tuning *t);
void mk_cuda_ctx_set_tuning(mk_cuda_ctx *ctx, const mk_cuda_tuning *t);

/* Kernel trace, for benchmarks: between start and stop, an event is recorded in the stream after
 * every kernel launch and device copy (and the host clock read). Stop waits for the stream and
 * returns the number of launches written (at most cap): names[i] is launch i (a static string),
 * us[i] the GPU time from the previous launch's end to its end (the kernel plus any gap before
 * it), queued_us[i] when the host queued it and done_us[i] when the GPU finished it, both from
 * the start. done_us close to queued_us means the GPU was waiting for the host. */
int mk_cuda_trace_start(mk_cuda_ctx *ctx, mk_err *err);
/* Whether a trace is recording (a traced call must run as launches, not as a replayed graph). */
int mk_cuda_trace_active(const mk_cuda_ctx *ctx);
int mk_cuda_trace_stop(mk_cuda_ctx *ctx, int cap, const char **names, float *us, float *queued_us,
                       float *done_us, mk_err *err);

/* CUDA graphs: the context's stream captured into a graph (between capture_begin and capture_end
 * nothing runs: launches are recorded, including programmatic dependent launch edges), then
 * replayed with one launch. capture_end instantiates it; on any error it ends the capture (the
 * stream is usable again) and returns the error. A graph replays the recorded kernel arguments:
 * whatever changes between replays must live in device memory. */
typedef struct mk_cuda_graph mk_cuda_graph;
int mk_cuda_capture_begin(mk_cuda_ctx *ctx, mk_err *err);
int mk_cuda_capture_end(mk_cuda_ctx *ctx, mk_cuda_graph **out, mk_err *err);
int mk_cuda_graph_launch(mk_cuda_ctx *ctx, mk_cuda_graph *g, mk_err *err);
size_t mk_cuda_graph_nodes(const mk_cuda_graph *g);
/* g's kernel nodes by priority: at the device's greatest (*hi), at its least (*lo), any other (*other)
 * (the tuning's prio); 0, or -1 where the graph could not be read. */
int mk_cuda_graph_prios(const mk_cuda_ctx *ctx, const mk_cuda_graph *g, int *hi, int *lo, int *other);
void mk_cuda_graph_free(mk_cuda_graph *g);

/* The L2 lane: while a decode step's main stream runs latency-bound kernels (norms, RoPE, the
 * attention, the routing), a second stream brings the weights of the step's next linears into L2,
 * so that those read them from L2 instead of HBM. Prefetches are hints: no value changes, and a
 * line evicted before its read is read from HBM as before. Only while the context's stream is
 * being captured (a replayed decode step) and the tuning's l2_lane is on; otherwise nothing.
 *   mk_cuda_lane_prefetch: the spans (device memory; 16-byte aligned starts, sizes rounded down to
 *     16), at most l2_lane MiB of them in order, requested after everything queued on the main
 *     stream so far has finished (the lane forks there; its prefetches run one after another);
 *   capture_end joins the lane back into the main stream before the capture ends. */
#define MK_CUDA_LANE_SPANS 8
typedef struct {
    const void *p;
    size_t bytes;
} mk_cuda_span;
int mk_cuda_lane_prefetch(mk_cuda_ctx *ctx, const mk_cuda_span *spans, int n, mk_err *err);
/* A side branch of a captured step: the kernels queued between branch_begin and branch_end run on a
 * third stream, after everything queued on the main stream before branch_begin and beside what the
 * main stream queues meanwhile; branch_join makes the main stream wait for them (capture_end joins
 * a branch left unjoined). The caller keeps the two sides apart: no buffer one side writes may be
 * read or written by the other before the join (scratch included). Active only while capturing with
 * the tuning's branch on: branch_begin returns 1 then, 0 when the kernels simply stay on the main
 * stream in order (branch_end and branch_join then do nothing), or an error. No nesting. */
int mk_cuda_branch_begin(mk_cuda_ctx *ctx, mk_err *err);
int mk_cuda_branch_end(mk_cuda_ctx *ctx, mk_err *err);
int mk_cuda_branch_join(mk_cuda_ctx *ctx, mk_err *err);

/* The same for the routed experts a step picked, known on the device only: for each of the n picks
 * ids[i] (device; a negative id: none) in [0, E), `bytes` of tab[ids[i]] (a device table of E device
 * pointers, 16-byte aligned), the budget shared by the picks; after everything queued so far (the
 * routing that wrote ids). */
int mk_cuda_lane_prefetch_experts(mk_cuda_ctx *ctx, const int32_t *ids, int n, int E, const void *const *tab,
                                  size_t bytes, mk_err *err);
/* Lane prefetches queued since the context was made (tests: capture_end joined each capture's). */
long mk_cuda_lane_count(const mk_cuda_ctx *ctx);

/* ---- memory ------------------------------------------------------------------------------- */

int mk_cuda_alloc(mk_cuda_ctx *ctx, size_t bytes, void **dptr, mk_err *err);
void mk_cuda_free(mk_cuda_ctx *ctx, void *dptr);
/* Copies ordered on the context's stream, waited for before returning (so they see queued
 * results, and kernels queued afterwards see the uploaded data). */
int mk_cuda_upload(mk_cuda_ctx *ctx, void *dst, const void *src, size_t bytes, mk_err *err);
/* Queued only: kernels queued afterwards see the data. src must stay unchanged until the copy
 * ran (page-locked memory, mk_cuda_host_alloc, makes it a real DMA without a staging copy). */
int mk_cuda_upload_async(mk_cuda_ctx *ctx, void *dst, const void *src, size_t bytes, mk_err *err);
int mk_cuda_download(mk_cuda_ctx *ctx, void *dst, const void *src, size_t bytes, mk_err *err);
/* Queued only (mk_cuda_ctx_sync waits): fast into page-locked memory (mk_cuda_host_alloc). */
int mk_cuda_download_async(mk_cuda_ctx *ctx, void *dst, const void *src, size_t bytes, mk_err *err);
/* Events on the context's stream: record marks everything queued so far; wait blocks the host
 * until that has run (and reports a device error). Lets the host wait for one step while the next
 * one is already queued behind it (mk_cuda_ctx_sync would wait for both). */
typedef struct mk_cuda_event mk_cuda_event;
int mk_cuda_event_create(mk_cuda_event **ev, mk_err *err);
void mk_cuda_event_free(mk_cuda_event *ev);
int mk_cuda_event_record(mk_cuda_ctx *ctx, mk_cuda_event *ev, mk_err *err);
int mk_cuda_event_wait(mk_cuda_event *ev, mk_err *err);
/* Step I/O beside the context's stream (MK_CUDA_S_MAIN): an upload stream and a download stream,
 * so that a call's inputs go up while the previous call still runs and its results come down while
 * the next one starts. copy_on queues a copy (either way: the pointers tell) on stream sid;
 * event_record_on marks what sid has queued; stream_wait_on makes sid wait for an event. Outside a
 * capture only; mk_cuda_ctx_sync waits for all three streams. */
enum { MK_CUDA_S_MAIN = 0, MK_CUDA_S_UP = 1, MK_CUDA_S_DOWN = 2 };
int mk_cuda_copy_on(mk_cuda_ctx *ctx, int sid, void *dst, const void *src, size_t bytes, mk_err *err);
int mk_cuda_event_record_on(mk_cuda_ctx *ctx, int sid, mk_cuda_event *ev, mk_err *err);
int mk_cuda_stream_wait_on(mk_cuda_ctx *ctx, int sid, mk_cuda_event *ev, mk_err *err);
/* Page-locked host memory (copies to and from it run at the bus's speed, without staging). */
int mk_cuda_host_alloc(size_t bytes, void **ptr, mk_err *err);
void mk_cuda_host_free(void *ptr);
/* Asynchronous memset on the stream. */
int mk_cuda_memset(mk_cuda_ctx *ctx, void *dst, int value, size_t bytes, mk_err *err);

/* ---- weights ------------------------------------------------------------------------------ */

/* Copies W's data (and scales) as stored to new device memory; dev gets the same kind and shape
 * with device pointers. Free with mk_cuda_wmat_free. */
int mk_cuda_wmat_upload(mk_cuda_ctx *ctx, const mk_wmat *host, mk_wmat *dev, mk_err *err);
void mk_cuda_wmat_free(mk_cuda_ctx *ctx, mk_wmat *dev);
/* The bytes of W's data as stored (its scales not included). */
size_t mk_cuda_wmat_data_bytes(const mk_wmat *W);

/* ---- linear ------------------------------------------------------------------------------- */

typedef enum {
    MK_CUDA_K_AUTO = 0, /* what mk_cuda_linear picks (see the header comment) */
    MK_CUDA_K_SIMPLE,   /* warp-per-row FMA kernel, any kind and shape */
    MK_CUDA_K_GEMV,     /* tensor-core GEMV (FP8, FP4, BF16); m > 8 in chunks of 8 */
    MK_CUDA_K_GEMM,     /* tensor-core GEMM (FP8); cuBLAS (BF16) */
} mk_cuda_kernel;

enum {
    /* The scratch already holds the quantized (FP8/FP4) or bf16-converted activations of this
     * very x from the previous call with the same W kind, m and k: skip that step (the model
     * quantizes one input once for several projections). */
    MK_CUDA_LIN_REUSE_X = 1,
    /* Every row computed as it would be alone, whatever m (the engine's batches): the
     * tensor-core GEMV (in chunks of 8 rows) where the shape allows it, else the simple kernel;
     * never the GEMM paths, whose split-K and tiling depend on m. */
    MK_CUDA_LIN_ROW_INVARIANT = 2,
};

/* y1 = x W1^T and y2 = x W2^T (the same x, the same flags): one launch where both are FP8 GEMVs
 * with the same k and launch plan, else two (the second reusing the prepared input where the
 * kinds and k agree); each output exactly as mk_cuda_linear_ex would give it. Scratch:
 * mk_cuda_linear_pair_scratch bytes. */
size_t mk_cuda_linear_pair_scratch(const mk_cuda_ctx *ctx, const mk_wmat *W1, const mk_wmat *W2, int m);
int mk_cuda_linear_pair_one_launch(const mk_cuda_ctx *ctx, int flags, const mk_wmat *W1, const mk_wmat *W2, int m);
int mk_cuda_linear_pair(mk_cuda_ctx *ctx, int flags, const mk_wmat *W1, const mk_wmat *W2, const float *x, int m,
                        float *y1, float *y2, int round_bf16, void *scratch, size_t scratch_bytes, mk_err *err);
/* y[i] = x W[i]^T for up to MK_CUDA_MULTI linears over the same x (the same flags; round[i]: bf16
 * outputs): one conversion and one launch where all are bf16 GEMVs with the same k and launch plan,
 * else one call each (each reusing the first's prepared input where the kinds and k agree); every
 * output exactly as mk_cuda_linear_ex would give it. Scratch: mk_cuda_linear_multi_scratch bytes. */
#define MK_CUDA_MULTI 6
size_t mk_cuda_linear_multi_scratch(const mk_cuda_ctx *ctx, int count, const mk_wmat *const *W, int m);
int mk_cuda_linear_multi(mk_cuda_ctx *ctx, int flags, int count, const mk_wmat *const *W, const float *x, int m,
                         float *const *y, const int *round, void *scratch, size_t scratch_bytes, mk_err *err);
/* Where a linear of W over m rows keeps its quantized activations in scratch (FP8 / FP4 only;
 * perm: the FP4 kernels' permuted layout): a kernel that writes them there (act_quant's format)
 * lets the linear run with MK_CUDA_LIN_REUSE_X. */
int mk_cuda_linear_xq(const mk_cuda_ctx *ctx, const mk_wmat *W, int m, void *scratch, size_t scratch_bytes,
                      uint8_t **xq, float **sa, int *perm, mk_err *err);
/* act_quant (perm: FP4 layout) of the SwiGLU of g and u [m, k]: mk_cuda_swiglu then
 * mk_cuda_act_quant, or with sw (one weight per row) mk_cuda_moe_swiglu then mk_cuda_act_quant,
 * bit for bit, in one kernel; out (optional) receives the SwiGLU values. */
int mk_cuda_swiglu_quant(mk_cuda_ctx *ctx, const float *g, const float *u, const float *sw, int m, int k, float lim,
                         int perm, float *out, uint8_t *q, float *sa, mk_err *err);
/* One mk_cuda_swiglu_quant call's operands (m rows of k). */
typedef struct {
    const float *g, *u, *sw;
    int m, k, perm;
    float *out;
    uint8_t *q;
    float *sa;
} mk_cuda_swiglu_job;
/* mk_cuda_swiglu_quant of j0, then of j1 (disjoint outputs): one launch with the tuning's
 * swiglu_pair (the routed and the shared expert's SwiGLU of a decode step), the same bits. */
int mk_cuda_swiglu_quant2(mk_cuda_ctx *ctx, const mk_cuda_swiglu_job *j0, const mk_cuda_swiglu_job *j1, float lim,
                          mk_err *err);
/* Bytes of scratch mk_cuda_linear needs for W and m rows (quantized activations, scales, bf16
 * copy, split-K partials). */
size_t mk_cuda_linear_scratch(const mk_cuda_ctx *ctx, const mk_wmat *W, int m);
/* Block-diagonal linear (wo_a): W [G gn, k] FP8_DQ, y[m, G gn] where group i's outputs read x
 * columns [i k, (i + 1) k) of x [m, G k]; one launch, each group's rows bit-identical to
 * mk_cuda_linear of its [gn, k] slice (row-invariant GEMV). MK_ENOTSUP for other kinds / shapes. */
size_t mk_cuda_linear_grouped_scratch(const mk_cuda_ctx *ctx, const mk_wmat *W, int G, int m);
int mk_cuda_linear_grouped(mk_cuda_ctx *ctx, const mk_wmat *W, int G, const float *x, int m, float *y,
                           int round_bf16, void *scratch, size_t scratch_bytes, mk_err *err);
/* mk_cuda_rope_at(x, m * (k / D) vectors of stride D, rd, table, pos, D-wide heads per position,
 * inverse) as the first step of an op that reads x [m, k]. */
typedef struct {
    const mk_rope_table *table;
    const int32_t *pos; /* device, [m] */
    int D, rd, inverse;
} mk_cuda_rope_at_desc;
/* mk_cuda_rope_at (described by ro, in place on x) then mk_cuda_linear_grouped, the rotation done
 * by the grouped linear's input preparation where D and rd are multiples of 4 (one launch fewer;
 * the same bits; the tuning's rope_fuse), else by mk_cuda_rope_at first. MK_ENOTSUP where
 * mk_cuda_linear_grouped is; then x is untouched. */
int mk_cuda_linear_grouped_rope(mk_cuda_ctx *ctx, const mk_wmat *W, int G, float *x, const mk_cuda_rope_at_desc *ro,
                                int m, float *y, int round_bf16, void *scratch, size_t scratch_bytes, mk_err *err);
/* The grouped linear's prepared input in scratch (f16 values xh [m, G k] and their per-128-block scales
 * sx), for an op that writes it the way the grouped linear's own preparation does
 * (mk_cuda_sparse_attn_f16), and the grouped linear from there (_prepared: the GEMV alone). MK_ENOTSUP
 * where mk_cuda_linear_grouped is. */
int mk_cuda_linear_grouped_input(mk_cuda_ctx *ctx, const mk_wmat *W, int G, int m, void *scratch, size_t scratch_bytes,
                                 uint16_t **xh, float **sx, mk_err *err);
int mk_cuda_linear_grouped_prepared(mk_cuda_ctx *ctx, const mk_wmat *W, int G, int m, float *y, int round_bf16,
                                    void *scratch, size_t scratch_bytes, mk_err *err);
/* y[m, n] = x[m, k] @ W^T with the numerics of mk_linear (ops.h); W holds device pointers
 * (mk_cuda_wmat_upload), x and y are device arrays, scratch a device buffer of at least
 * mk_cuda_linear_scratch bytes. For BF16 weights the tensor-core path rounds x to bf16 first
 * (the reference's activations are bf16 there, so this is exact for real inputs). */
int mk_cuda_linear(mk_cuda_ctx *ctx, const mk_wmat *W, const float *x, int m, float *y,
                   int round_bf16, void *scratch, size_t scratch_bytes, mk_err *err);
int mk_cuda_linear_ex(mk_cuda_ctx *ctx, mk_cuda_kernel kern, int flags, const mk_wmat *W,
                      const float *x, int m, float *y, int round_bf16, void *scratch,
                      size_t scratch_bytes, mk_err *err);
/* mk_cuda_linear_ex (MK_CUDA_K_AUTO) then mk_cuda_argmax_rows of y's m rows into am: the same y and am.
 * With the tuning head_argmax, where mk_cuda_gemv_bf16_am applies (bf16 weights on the warp-pipelined
 * GEMV or in slab tiles, m <= 8), in one launch: no argmax kernel after the GEMV. */
int mk_cuda_linear_argmax(mk_cuda_ctx *ctx, int flags, const mk_wmat *W, const float *x, int m, float *y,
                          int round_bf16, int32_t *am, void *scratch, size_t scratch_bytes, mk_err *err);
/* Whether that one launch applies to W at m rows under the current tuning's plans (not head_argmax). */
int mk_cuda_gemv_bf16_am_ok(const mk_cuda_ctx *ctx, const mk_wmat *W, int m);
/* Name of the kernel `kern` resolves to for W and m (for logs and benchmarks). */
const char *mk_cuda_linear_kernel_name(const mk_cuda_ctx *ctx, mk_cuda_kernel kern,
                                       const mk_wmat *W, int m);

/* The activation quantizer of the FP8/FP4 paths, exposed for tests: x [m, k] -> q e4m3 bytes
 * [m, k] and sa [m, ceil(k/128)] (power-of-two scales), exactly mk_act_quant_block per 128-block.
 * perm = 1 stores each 8-element chunk in the order 0,2,4,6,1,3,5,7 (the FP4 kernel's layout). */
int mk_cuda_act_quant(mk_cuda_ctx *ctx, const float *x, int m, int k, int perm, uint8_t *q,
                      float *sa, mk_err *err);

/* ---- norms, rope, hadamard ---------------------------------------------------------------- */

/* out[r] = the argmax of row r of x [rows, n] with the sampler's greedy rule (NaN as -inf, +inf as
 * FLT_MAX, the lowest index among equal maxima; -1 when every value is -inf or NaN). */
int mk_cuda_argmax_rows(mk_cuda_ctx *ctx, const float *x, int rows, int n, int32_t *out, mk_err *err);
/* The adjusted tokens of each row of logits [rows, V] (in place): for draws[r] (device) with n_adj
 * entries at adj + adj_off (device; mk_sampler_model_step's, ids unique per row), logit = the
 * sampler's adjustment of the sanitized logit (sample_math.h: mk_sample_adjust). Before the argmax
 * or the draw of a step handed to the model with adjustments. src/ops/cuda/sample.cu. */
int mk_cuda_adjust_rows(mk_cuda_ctx *ctx, float *logits, int rows, int V, const mk_sample_draw *draws,
                        const mk_sample_adj *adj, mk_err *err);
/* out[r] = the token the host sampler draws from row r of logits [rows, V] with draws[r] (a device
 * array of src/num/sample_math.h's mk_sample_draw), or -1 when every logit is -inf / NaN (the
 * sampler's MK_ERANGE); rows whose draw has inv_t 0 are left alone (out[r] untouched). ws: device
 * scratch of rows * V floats. src/ops/cuda/sample.cu. */
int mk_cuda_sample_rows(mk_cuda_ctx *ctx, const float *logits, int rows, int V, const mk_sample_draw *draws, float *ws,
                        int32_t *out, mk_err *err);
/* 1 when mk_cuda_sample_rows would draw rows of V values on a cluster of blocks per row (tunings
 * sample_cluster and sample_cluster_rows, V at least the cluster's size and its slices within the
 * device's shared memory), 0 for one block per row. Where the device then refuses the cluster's
 * shared memory at launch, mk_cuda_sample_rows draws with one block per row after all (noted once). */
int mk_cuda_sample_uses_cluster(const mk_cuda_ctx *ctx, int rows, int V);
/* mk_rmsnorm over rows [rows, d]; w bf16 [d] (device) or NULL. y may alias x. */
int mk_cuda_rmsnorm(mk_cuda_ctx *ctx, const float *x, int rows, int d, const uint16_t *w,
                    float eps, float *y, mk_err *err);

/* Copies a host RoPE table (mk_rope_table_init) to the device: dev->cs becomes a device pointer. */
int mk_cuda_rope_table_upload(mk_cuda_ctx *ctx, const mk_rope_table *host, mk_rope_table *dev,
                              mk_err *err);
void mk_cuda_rope_table_free(mk_cuda_ctx *ctx, mk_rope_table *dev);
/* mk_rope on n_vec vectors: vector v starts at x + v * stride (x points at the rotated dims of
 * the first vector) and is rotated by position pos0 + v / vecs_per_pos. E.g. q [T, H, D] with the
 * rope dims last: x = q + D - rd, stride = D, vecs_per_pos = H. t is a device table. */
int mk_cuda_rope(mk_cuda_ctx *ctx, float *x, int n_vec, int stride, int rd,
                 const mk_rope_table *t, int pos0, int vecs_per_pos, int inverse, mk_err *err);
/* The same with each group of vecs_per_pos vectors at its own position pos[v / vecs_per_pos]
 * (device array; the rows of several sequences in one launch). Positions outside the table are
 * the caller's error: those vectors are left as they are. */
int mk_cuda_rope_at(mk_cuda_ctx *ctx, float *x, int n_vec, int stride, int rd, const mk_rope_table *t,
                    const int32_t *pos, int vecs_per_pos, int inverse, mk_err *err);

/* mk_hadamard on each of `rows` rows of n values (n a power of two, <= 8192), in place. */
int mk_cuda_hadamard(mk_cuda_ctx *ctx, float *x, int rows, int n, float scale, mk_err *err);
/* The indexer's queries x [n_vec, n] in place: mk_cuda_rope_at(x + n - rd, n_vec, n, rd, t, pos,
 * vecs_per_pos, forward), mk_cuda_hadamard(scale), mk_cuda_quant_sim(block 32, FP4) — one launch
 * (n a power of two up to 1024; the tuning's norm_quant), the same bits. */
int mk_cuda_idx_q_prep(mk_cuda_ctx *ctx, float *x, int n_vec, int n, int rd, const mk_rope_table *t,
                       const int32_t *pos, int vecs_per_pos, float scale, mk_err *err);

/* ---- hyper-connections (mk_hc_pre / mk_hc_post / mk_hc_head; hc <= 4) --------------------- */

int mk_cuda_hc_pre(mk_cuda_ctx *ctx, const float *h, int s, int hc, int d, const float *fn,
                   const float *scale, const float *base, int iters, float hc_eps, float norm_eps,
                   float *x, float *post, float *comb, mk_err *err);
int mk_cuda_hc_post(mk_cuda_ctx *ctx, const float *x, const float *res, const float *post,
                    const float *comb, int s, int hc, int d, float *out, mk_err *err);
int mk_cuda_hc_head(mk_cuda_ctx *ctx, const float *h, int s, int hc, int d, const float *fn,
                    const float *scale, const float *base, float hc_eps, float norm_eps, float *y,
                    mk_err *err);
/* The activation quantization of a normalized row for the next linear: mk_cuda_act_quant's output
 * (e4m3 bytes q [s, d], block scales sa [s, d / 128], perm: the FP4 kernels' permuted layout). */
typedef struct {
    uint8_t *q;
    float *sa;
    int perm;
} mk_cuda_actq;
/* mk_cuda_rmsnorm then mk_cuda_act_quant of its output into aq, the same bits, in one launch where
 * the norm's threads cover 128-blocks (d % 128 == 0, d <= 4096), else two. y may alias x. */
int mk_cuda_rmsnorm_quant(mk_cuda_ctx *ctx, const float *x, int rows, int d, const uint16_t *w, float eps, float *y,
                          const mk_cuda_actq *aq, mk_err *err);
/* hc_pre / hc_head followed by mk_cuda_rmsnorm(x, nw, neps) of their output, in place: the same
 * bits, in one kernel fewer where the finishing kernel can run the norm itself (d = 4096). With
 * aq (or NULL), hc_pre_norm also writes mk_cuda_act_quant(x) there, the same bits, in the same
 * kernel where it runs the norm (d % 128 == 0), else one more launch. */
int mk_cuda_hc_pre_norm(mk_cuda_ctx *ctx, const float *h, int s, int hc, int d, const float *fn,
                        const float *scale, const float *base, int iters, float hc_eps, float norm_eps,
                        const uint16_t *nw, float neps, float *x, float *post, float *comb, const mk_cuda_actq *aq,
                        mk_err *err);
int mk_cuda_hc_head_norm(mk_cuda_ctx *ctx, const float *h, int s, int hc, int d, const float *fn,
                         const float *scale, const float *base, float hc_eps, float norm_eps,
                         const uint16_t *nw, float neps, float *y, mk_err *err);
/* A token's MoE output as mk_cuda_moe_combine computes it (its operands: eo [slots, d], idx [T, K],
 * plan, T, K, E, shared [T, d]), for the fused hc_post ops below to take instead of their x: they
 * compute each value where they read it (the same bits) and write out [T, d] only where they
 * cannot (a call that takes the many-token path: the combine then runs first, into out). */
typedef struct {
    const float *eo;
    const int32_t *idx, *plan;
    int T, K, E;
    const float *shared;
    float *out;
} mk_cuda_moe_sum;
/* mk_cuda_hc_post(x, res, post, comb -> out) followed by mk_cuda_hc_pre_norm / mk_cuda_hc_head_norm
 * of out: the same bits in all outputs (out, xo / post_o / comb_o, y), one kernel fewer (the
 * hc_post kernel also reduces the split path's chunks of the row it writes). post_o / comb_o may
 * be post / comb (each token's are read before they are overwritten); out may not alias res or x.
 * ms (or NULL): x is ms's MoE combine instead (x unused). */
int mk_cuda_hc_post_pre_norm(mk_cuda_ctx *ctx, const float *x, const float *res, const float *post,
                             const float *comb, int s, int hc, int d, float *out, const float *fn,
                             const float *scale, const float *base, int iters, float hc_eps, float norm_eps,
                             const uint16_t *nw, float neps, float *xo, float *post_o, float *comb_o,
                             const mk_cuda_actq *aq, const mk_cuda_moe_sum *ms, mk_err *err);
int mk_cuda_hc_post_head_norm(mk_cuda_ctx *ctx, const float *x, const float *res, const float *post,
                              const float *comb, int s, int hc, int d, float *out, const float *fn,
                              const float *scale, const float *base, float hc_eps, float norm_eps,
                              const uint16_t *nw, float neps, float *y, const mk_cuda_moe_sum *ms,
                              mk_err *err);

/* ---- attention ---------------------------------------------------------------------------- */

/* mk_sparse_attn for T query tokens at once: query t attends over the KV rows
 * rows[row_start[t] .. row_start[t+1]) (a device array of device pointers to D-float rows; K = V),
 * q [T, H, D], sink [H], o [T, H, D]. D <= 1024. */
int mk_cuda_sparse_attn(mk_cuda_ctx *ctx, const float *q, int T, int H, int D,
                        const float *const *rows, const int32_t *row_start, const float *sink,
                        float scale, float *o, mk_err *err);
/* mk_cuda_sparse_attn, then (xh, sx) = wo_a's input preparation of o with the inverse RoPE rd (as
 * mk_cuda_linear_grouped_rope's, in the same bits; o left rotated as it leaves it) in the attention's own
 * launch: only with the tuning's attn_f16, where the cluster kernel runs (a decode step) and D is 512;
 * else MK_ENOTSUP before anything is launched. */
int mk_cuda_sparse_attn_f16(mk_cuda_ctx *ctx, const float *q, int T, int H, int D, const float *const *rows,
                            const int32_t *row_start, const float *sink, float scale, float *o, uint16_t *xh,
                            float *sx, const mk_cuda_rope_at_desc *rd, mk_err *err);

/* ---- DeepSeek-V4 model kernels (dsv4k.cu, topk.cu, moe.cu; used by src/models/dsv4_cuda.c) -- */

/* h [T, hc, d] = embed[tok[t]] (bf16 -> f32) repeated over the hc streams; tok a device array. */
int mk_cuda_embed_hc(mk_cuda_ctx *ctx, const uint16_t *embed, int vocab, const int32_t *tok, int T,
                     int hc, int d, float *h, mk_err *err);
/* The same where a row may be fed (asynchronous scheduling): fsrc [T] (device; NULL: none) >= 0 makes
 * row t's token am[fsrc[t]] (the previous step's pick, on the device; outside the vocabulary read
 * as 0), also written into tok[t] for the kernels after it; -1 keeps tok[t]. */
int mk_cuda_embed_hc_fed(mk_cuda_ctx *ctx, const uint16_t *embed, int vocab, int32_t *tok, const int32_t *fsrc,
                         const int32_t *am, int T, int hc, int d, float *h, mk_err *err);
/* mk_act_quant_sim (fp4 = 0) / mk_fp4_quant_sim (fp4 = 1) of the first n values of each of `rows`
 * rows (row r at x + r * stride) in blocks of `block` (<= 128), written to y (may alias x). */
int mk_cuda_quant_sim(mk_cuda_ctx *ctx, const float *x, int rows, int stride, int n, int block,
                      int fp4, float *y, mk_err *err);
/* Per-vector RMS normalisation without weight in bf16 arithmetic (the reference's q path). */
int mk_cuda_head_rms_bf16(mk_cuda_ctx *ctx, float *q, int n_vec, int D, float eps, mk_err *err);
/* mk_cuda_head_rms_bf16 then mk_cuda_rope_at(q + D - rd, n_vec, D, rd, t, pos, vecs_per_pos, 0):
 * the same bits, one kernel. */
int mk_cuda_head_rms_rope(mk_cuda_ctx *ctx, float *q, int n_vec, int D, float eps, int rd, const mk_rope_table *t,
                          const int32_t *pos, int vecs_per_pos, mk_err *err);
/* The attention's kv rows [rows, D]: mk_cuda_rmsnorm(w, eps), mk_cuda_rope_at of the last rd at pos
 * (one vector a row), mk_cuda_quant_sim of the first D - rd in FP8 blocks of 64; the same bits,
 * one kernel. */
int mk_cuda_kv_norm_rope_q(mk_cuda_ctx *ctx, float *kv, int rows, int D, const uint16_t *w, float eps, int rd,
                           const mk_rope_table *t, const int32_t *pos, mk_err *err);
/* The attention's row preparation: mk_cuda_head_rms_rope(q, R * H, D, eps, rd, t, pos, H),
 * mk_cuda_kv_norm_rope_q(kv, R, D, kv_w, eps, rd, t, pos) and, where iq is given,
 * mk_cuda_idx_q_prep(iq, R * IH, ID, rd, t, pos, IH, iscale): one launch (the tuning's attn_prep,
 * ID a power of two up to 1024), the same bits. */
int mk_cuda_attn_prep(mk_cuda_ctx *ctx, int R, float *q, int H, int D, float eps, float *kv, const uint16_t *kv_w,
                      int rd, const mk_rope_table *t, const int32_t *pos, float *iq, int IH, int ID, float iscale,
                      mk_err *err);
/* mk_rope of vector v (at x + v * stride) at position pos0 + v * step. */
int mk_cuda_rope_step(mk_cuda_ctx *ctx, float *x, int n_vec, int stride, int rd,
                      const mk_rope_table *t, int pos0, int step, int inverse, mk_err *err);
/* x = bf16(x * s). */
int mk_cuda_scale_bf16(mk_cuda_ctx *ctx, float *x, size_t n, float s, mk_err *err);
/* x[t, :] += ape[(pos0 + t) % r, :], rows of w. */
int mk_cuda_add_ape(mk_cuda_ctx *ctx, float *x, int T, int w, const float *ape, int r, int pos0,
                    mk_err *err);
/* out = bf16(silu(min(g, lim)) * clamp(u, -lim, lim)) (lim <= 0: no clamp); out may alias g. */
int mk_cuda_swiglu(mk_cuda_ctx *ctx, const float *g, const float *u, size_t n, float lim, float *out,
                   mk_err *err);
/* out [rows, d] = bf16(a + b[row / rep]) (b [rows / rep, d]). */
int mk_cuda_add_bcast_bf16(mk_cuda_ctx *ctx, const float *a, const float *b, int rows, int rep,
                           int d, float *out, mk_err *err);
/* Compressor pooling (dsv4.c compressor()): n_ent entries of D channels, each a softmax-weighted
 * sum over its slots of kv / sc rows (row width W2), rounded to bf16. prefill (rows of a call):
 * entry e pools rows (e-1)*r.. at column 0 (ov; for e = 0 the r rows before kv, which the caller
 * provides: the previous group, or a fresh state's -inf scores) and rows e*r.. at column
 * ov ? D : 0; else (one entry from the state) rows 0..r-1 at column 0 (ov) and rows
 * (ov ? r : 0).. at column ov ? D : 0. */
int mk_cuda_cmp_pool(mk_cuda_ctx *ctx, const float *kv, const float *sc, int W2, int D, int r,
                     int ov, int prefill, int n_ent, float *out, mk_err *err);
/* Compressed entries in the paged KV: entry j of a sequence (rows of D floats) lives in block
 * tbl[j / epb] at base + block * block_bytes + off + (j % epb) * D * 4 (dsv4_kv_layout). */
typedef struct {
    const uint8_t *base;
    const int32_t *tbl;
    size_t block_bytes, off;
    int epb;
} mk_cuda_paged;
/* Row lists of the sparse attention for the query rows of several sequences' pieces in one
 * launch: pieces [np] (device, piece i at pieces[i * stride], row0 ascending). Row t of a piece
 * (position start + t) lists its window (the call's own rows of kv_call for positions >= start,
 * the piece's ring for earlier ones), then its compressed rows (ratio 4: the valid entries of its
 * sel row at sel + row0 * sel_cap + t * k_sel, k_sel <= sel_cap; other ratios: every visible entry of ckv, with the
 * piece's block table; ckv.tbl is ignored); rows / row_start over all R rows (R <= 12000).
 * ring_put_multi: ring slot q % win <- the call's row of position q, for the last min(T, win)
 * positions of each piece. attn_rows_multi with ring_put (every piece one row: R == np) does
 * ring_put_multi's writes too, in the same launch (the slot written is in no row's list). */
typedef struct {
    const float *ring;    /* the piece's window ring [win, D] of this layer */
    const int32_t *tbl;   /* its block table */
    int row0, T, start;   /* its rows in the call, its first position */
    int n_ckv, k_sel;     /* compressed entries visible to the call's last row; indexer picks per row */
    int pad;
    float *cst[2][2];     /* compressor states of this layer: [attention, indexer][kv, score] */
} mk_cuda_apiece;
int mk_cuda_attn_rows_multi(mk_cuda_ctx *ctx, const mk_cuda_apiece *pieces, int np, int stride, int R, int win, int D,
                            const float *kv_call, mk_cuda_paged ckv, int ratio, const int32_t *sel, int sel_cap,
                            const float **rows, int32_t *row_start, int ring_put, mk_err *err);
int mk_cuda_ring_put_multi(mk_cuda_ctx *ctx, const mk_cuda_apiece *pieces, int np, int stride, int R,
                           const float *kv_call, int win, int D, mk_err *err);
/* mk_cuda_cmp_put_multi, then for every one-token piece whose position completes a group of r
 * (the device decides: (start + 1) % r == 0) the entry the host-launched chain would make, in the
 * same launch and with the same bits: mk_cuda_cmp_pool (decode rule) of the piece's state, the
 * overlap slots [r, 2r) moved to [0, r) (ov), mk_cuda_rmsnorm (weight nw, eps), mk_cuda_rope_step
 * of the last rd values at position start + 1 - r, then the indexer's mk_cuda_hadamard(hscale) and
 * mk_cuda_quant_sim(32, FP4) (is_idx) or the attention's mk_cuda_quant_sim(64, FP8) of the first
 * D - rd values; the row goes to entry (start + 1) / r - 1 of dst (the piece's block table; dst.tbl
 * is ignored). W2 = (ov ? 2 : 1) D. A position past the rope table is the caller's to refuse.
 * MK_ENOTSUP (nothing launched) when tuning's cmp_step is off or the shape is not covered: the
 * caller then runs the chain. */
int mk_cuda_cmp_step_multi(mk_cuda_ctx *ctx, const mk_cuda_apiece *pieces, int np, int stride, int which,
                           const float *kvp, const float *scp, int W2, int D, const float *ape, int r, int ov,
                           const uint16_t *nw, float eps, int rd, const mk_rope_table *rope, int is_idx,
                           float hscale, mk_cuda_paged dst, mk_err *err);
/* The decode rule of a compressor (which: 0 attention, 1 indexer) for every one-token piece: its
 * projected row kvp / scp (row0, width W2) goes to state slot (ov ? r : 0) + start % r, the score
 * row plus ape[start % r] (mk_cuda_add_ape's addition). Pieces of more tokens are left alone. */
int mk_cuda_cmp_put_multi(mk_cuda_ctx *ctx, const mk_cuda_apiece *pieces, int np, int stride, int which,
                          const float *kvp, const float *scp, int W2, const float *ape, int r, int ov, mk_err *err);
/* Snapshot of the ring after position e (>= win - 1) into dst bf16 [win, D] (slot q % win): rows
 * of positions >= start from kv_call, earlier ones from the ring (not yet updated by the call). */
int mk_cuda_snap_ring(mk_cuda_ctx *ctx, uint16_t *dst, const float *ring, const float *kv_call, int start,
                      int e, int win, int D, mk_err *err);
/* y [n] = float(x [n] bf16). */
int mk_cuda_bf16_to_f32(mk_cuda_ctx *ctx, const uint16_t *x, size_t n, float *y, mk_err *err);
/* Asynchronous device-to-device copies and fill on the stream. */
int mk_cuda_copy(mk_cuda_ctx *ctx, void *dst, const void *src, size_t bytes, mk_err *err);
int mk_cuda_copy2d(mk_cuda_ctx *ctx, void *dst, size_t dpitch, const void *src, size_t spitch,
                   size_t width, size_t rows, mk_err *err);
int mk_cuda_fill(mk_cuda_ctx *ctx, float *x, size_t n, float v, mk_err *err);
/* HBM reference: device-to-device cudaMemcpyAsync of `bytes`, iters times after two warm-ups;
 * gbs = (bytes read + written) / time. */
int mk_cuda_copy_bandwidth(mk_cuda_ctx *ctx, size_t bytes, int iters, double *gbs, mk_err *err);

/* Lightning indexer: clamp: forced selections past the entries visible to row t ((start + t + 1)
 * / 4) become -1. */
int mk_cuda_index_clamp(mk_cuda_ctx *ctx, int32_t *sel, int T, int n_all, int start, int k,
                        mk_err *err);
/* Scores and top-k of every row of several pieces (mk_cuda_apiece, as for mk_cuda_attn_rows_multi;
 * piece P has (P.start + P.T) / 4 entries in its blocks (keys: the paged indexer entries ikv,
 * D = ID, ikv.tbl ignored) and picks P.k_sel): sc [R, n_cap] (n_cap >= every piece's entry count;
 * -inf past the entries visible to the row) and the top-k per row (descending, ties to the lower
 * index, -1 padded) at row0 * sel_cap + t * k_sel. iw_scale: 0, the head weights iw as they are;
 * else each is read as bf16(iw * iw_scale) (the bits of mk_cuda_scale_bf16 before the call).
 * cnt: NULL, or R counters that are zero (and are left zero): with the tuning's index_fuse, a call
 * of few (row, entry) pairs runs the top-k in the scores' launch (its last block per row). */
int mk_cuda_index_multi(mk_cuda_ctx *ctx, const mk_cuda_apiece *pieces, int np, int stride, const float *iq,
                        const float *iw, float iw_scale, mk_cuda_paged ikv, int R, int IH, int ID, int n_cap,
                        float *sc, int32_t *cnt, int sel_cap, int32_t *sel, mk_err *err);

/* Rearranges uploaded FP4 weights (n % 16 == 0, k % 128 == 0) in place into the expert layout that
 * mk_cuda_moe_gemv_fp4 reads. Lane order always: in each row's 64-byte 128-block the 4 x 4 matrix of
 * 4-byte words [32-block][word] is transposed. With the tuning fp4_tiles also slab tiles: the 64-byte
 * 128-block kb of row r moves to ((r / 16) * (k / 128) + kb) * 1024 + (r % 16) * 64 and its 4 scale
 * bytes to ((r / 16) * (k / 128) + kb) * 64 + (r % 16) * 4, so the 16 rows of a slab are one 1 KB run
 * of weights and one 64-byte run of scales per 128-block (mk_d_fp4_w / mk_d_fp4_s give the places; every
 * byte stays inside its slab's range). The expert kernels must run under the same fp4_tiles as the
 * upload. Only for the routed experts' matrices: every other FP4 consumer reads the natural order. */
int mk_cuda_fp4_expert_layout(mk_cuda_ctx *ctx, mk_wmat *dev, mk_err *err);

/* Rearranges an uploaded bf16 matrix (n % 16 == 0, k % 128 == 0) in place into slab tiles: the 64-byte
 * 32-k step st of row r moves to ((r / 16) * (k / 32) + st) * 1024 + (r % 16) * 64, so a slab's 16 rows
 * are one 1 KB run per step and a warp's loads of an item one contiguous run (every byte stays in its
 * slab's range). The context records the matrix (by W->w; at most MK_CUDA_TILED_MAX): from then on its
 * bf16 GEMVs read the tiles and compute each slab as one MMA chain over the whole k (k_gemv_bf16_wpipe
 * up to 8 rows, the row-invariant GEMM beyond): the bits of the rows under a one-warp-per-slab plan
 * (the head's). cuBLAS and the simple kernel refuse such a matrix. An error midway leaves the matrix
 * partly rearranged (a load-time failure: free it). mk_cuda_bf16_tiles_forget before freeing the
 * weights; mk_cuda_bf16_tiled says whether W is recorded. */
#define MK_CUDA_TILED_MAX 8
int mk_cuda_bf16_tiles(mk_cuda_ctx *ctx, const mk_wmat *dev, mk_err *err);
int mk_cuda_bf16_tiled(const mk_cuda_ctx *ctx, const mk_wmat *W);
void mk_cuda_bf16_tiles_forget(mk_cuda_ctx *ctx, const void *w);

/* MoE (moe.cu). route: scores [T, E] gate logits -> sqrt(softplus); idx [T, K] the top-k of
 * scores + bias (margin [T] k-th minus (k+1)-th) or, with bias NULL, tid2eid[tok[t]] (margin inf).
 * weights: idx clamped to [0, E), w [T, K] = score / sum * route_scale. plan: groups the slots by
 * expert (plan: mk_cuda_moe_plan_ints ints, sw: T*K floats). gemv: grouped expert GEMV over the
 * planned groups; W1/S1 (and W3/S3 for the fused w1/w3 + SwiGLU pass; NULL for w2) are device
 * tables [E] of weight and scale pointers of one kind; xd the (dequantized FP8-simulated for
 * FP8/FP4, plain for BF16) inputs, rows by token (by_token) or by slot; out [T*K, n] by slot.
 * combine: out [T, d] = bf16(sum of t's expert outputs in ascending expert order + shared). */
int mk_cuda_moe_route(mk_cuda_ctx *ctx, float *scores, int T, int E, int K, const float *bias,
                      const int64_t *tid2eid, const int32_t *tok, int vocab, int32_t *idx,
                      float *margin, mk_err *err);
/* mk_cuda_moe_route then mk_cuda_moe_weights(route_scale, w) in one kernel, the same bits. */
int mk_cuda_moe_route_weights(mk_cuda_ctx *ctx, float *scores, int T, int E, int K, const float *bias,
                              const int64_t *tid2eid, const int32_t *tok, int vocab, float route_scale, int32_t *idx,
                              float *margin, float *w, mk_err *err);
/* mk_cuda_moe_route_weights then mk_cuda_moe_plan: for one token in one kernel (the same bits). */
int mk_cuda_moe_route_plan(mk_cuda_ctx *ctx, float *scores, int T, int E, int K, const float *bias,
                           const int64_t *tid2eid, const int32_t *tok, int vocab, float route_scale, int32_t *idx,
                           float *margin, float *w, int32_t *plan, float *sw, mk_err *err);
int mk_cuda_moe_weights(mk_cuda_ctx *ctx, const float *scores, int T, int E, int K,
                        float route_scale, int32_t *idx, float *w, mk_err *err);
size_t mk_cuda_moe_plan_ints(int T, int K, int E);
int mk_cuda_moe_plan(mk_cuda_ctx *ctx, const int32_t *idx, const float *w, int T, int K, int E,
                     int32_t *plan, float *sw, mk_err *err);
int mk_cuda_moe_gemv(mk_cuda_ctx *ctx, int kind, const void *const *W1, const uint8_t *const *S1,
                     const void *const *W3, const uint8_t *const *S3, int n, int k, const float *xd,
                     int by_token, const int32_t *plan, const float *sw, int T, int K, int E,
                     float lim, float *out, mk_err *err);
/* Tensor-core path for FP4 experts: gemv_fp4 y [slot, n] (fp32, or bf16-rounded with round) = the
 * slot's row of xq (e4m3 [rows, k] in the FP4 kernel's permuted layout, scales sa [rows, k / 128],
 * from mk_cuda_act_quant with perm = 1; rows by token with by_token, else by slot) times its
 * expert's W^T (tables W / S [E]; W and S in the experts' layout, mk_cuda_fp4_expert_layout). One MMA per 32-block
 * for 8 slots; a slot's result does not depend on the other slots of its expert (gemv.cu). swiglu: out [slot, n] from
 * the w1 and w3 results and the slot weights sw, as mk_cuda_moe_gemv's fused pass computes it. */
/* W3 / S3 / y3 (or all NULL): a second matrix of the same shape on the same activations in the same
 * launch (w3 next to w1). The plan must have been written before the kernel that precedes this
 * one started (the kernel reads it before waiting on its predecessor). */
int mk_cuda_moe_gemv_fp4(mk_cuda_ctx *ctx, const void *const *W, const uint8_t *const *S, const void *const *W3,
                         const uint8_t *const *S3, int n, int k, const uint8_t *xq, const float *sa, int by_token,
                         const int32_t *plan, int T, int K, int E, float *y, float *y3, int round, mk_err *err);
/* An FP8 GEMV (W, or the pair W + W2 of one k) over quantized rows xq / sa (mk_cuda_linear_xq's
 * layout) that may ride along in an expert GEMV's launch: mk_cuda_moe_gemv_fp4_with. */
typedef struct {
    const mk_wmat *W, *W2;
    const uint8_t *xq;
    const float *sa;
    int m;
    float *y, *y2;
    int round;
} mk_cuda_fp8_job;
/* mk_cuda_moe_gemv_fp4 and f's GEMV(s) (as mk_cuda_linear_pair / mk_cuda_linear_ex with
 * MK_CUDA_LIN_REUSE_X run them, m <= 8) in one launch, each output with its own kernel's bits. Only
 * for decode launches that fit (one token, the two-slab or the warp-per-slab decode kernel, an FP8
 * plan of 8 warps without split-K, the tuning's moe_with_fp8); otherwise MK_ENOTSUP and nothing is
 * launched. */
int mk_cuda_moe_gemv_fp4_with(mk_cuda_ctx *ctx, const void *const *W, const uint8_t *const *S, const void *const *W3,
                              const uint8_t *const *S3, int n, int k, const uint8_t *xq, const float *sa, int by_token,
                              const int32_t *plan, int T, int K, int E, float *y, float *y3, int round,
                              const mk_cuda_fp8_job *f, mk_err *err);
int mk_cuda_moe_swiglu(mk_cuda_ctx *ctx, const float *v1, const float *v3, const float *sw, int slots, int n,
                       float lim, float *out, mk_err *err);
int mk_cuda_moe_combine(mk_cuda_ctx *ctx, const float *eo, const int32_t *idx, const int32_t *plan,
                        int T, int K, int E, int d, const float *shared, float *out, mk_err *err);

/* ---- probes ------------------------------------------------------------------------------- */

/* Whether a wgmma GEMM could give the engine's bits (gemm.cu): the 64 x 8 product over k = 128 of
 * e4m3 A [64][128] and B [8][128] (host arrays, row-major, B's rows the 8 columns) as four chained
 * wgmma.m64n8k32 into yw and as four chained mma.sync m16n8k32 per 16 rows into ym (host [64][8]
 * each). MK_ENOTSUP off sm_90 (wgmma is sm_90a's). */
int mk_cuda_probe_wgmma_e4m3(mk_cuda_ctx *ctx, const uint8_t *A, const uint8_t *B, float *yw, float *ym, mk_err *err);

/* Whether f16 MMAs could give the e4m3 MMA's bits (gemm.cu). On sm_90 an m16n8k32 e4m3 mma.sync runs
 * as 12 e4m3 -> f16 conversions, two m16n8k16 f16 MMAs and an fp32 add of C. Way 7 matches it; an
 * explicit f16 expert path built on that (session 22) saved nothing in the SASS (ptxas already shares
 * the activations' conversions) and was removed. The findings are sm_90's: on sm_100 the e4m3 MMA
 * is native (the probe runs, and tells whether the same split holds there). For nt tiles (A e4m3 [16][32], B e4m3 [8][32], B's
 * rows the 8 columns, C fp32 [16][8], all row-major host arrays back to back), out[tile][0] = one
 * mma.sync e4m3 from C and out[tile][v] (v = 1..MK_CUDA_PROBE_F16_WAYS) = two chained f16 MMAs from C
 * over the same products split into two k halves: v 1 / 2 k 0-15 then 16-31 / the reverse; v 3 / 4
 * the k with (k >> 1) & 1 == 0 then the rest / the reverse; v 5 / 6 even k then odd / the reverse; v 7
 * way 3 from zero, then C added in fp32 (what sm_90's SASS does for a chained e4m3 MMA: two HMMAs from
 * RZ, then an FADD per accumulator). out is host [nt][1 + ways][16][8]. */
#define MK_CUDA_PROBE_F16_WAYS 7
int mk_cuda_probe_mma_f16(mk_cuda_ctx *ctx, int nt, const uint8_t *A, const uint8_t *B, const float *C, float *out,
                          mk_err *err);

/* Whether a wgmma path's bits would depend on the call's shape (gemm.cu): the 64 x 8 product over
 * k = 128 of e4m3 A [64][128] and the first 8 rows of B [64][128] (host arrays, row-major, B's rows
 * the columns) as four chained m64n8k32 (A, B in shared memory), m64n64k32 (B's 64 rows) and m64n8k32
 * with A from registers; out host [6][64][64]: slots 0 / 1 n8 after the first / fourth step (columns
 * 0..7), 2 / 3 n64 (all 64 columns), 4 / 5 n8 with A in registers. MK_ENOTSUP off sm_90. */
int mk_cuda_probe_wgmma_shapes(mk_cuda_ctx *ctx, const uint8_t *A, const uint8_t *B, float *out, mk_err *err);
/* A design probe (not used by the model): the one-token expert GEMV of mk_cuda_moe_gemv_fp4 (T = 1,
 * the same operands: lane-ordered FP4 weights, the plan of K picks, the permuted e4m3 row and its
 * block scales; n % 64 == 0) with sm_90a's wgmma (m64n8k32, the widened weights from registers)
 * instead of mma.sync: the same products, another accumulation (within a tolerance of the expert
 * GEMV, not its bits). For bench_gpu's speed comparison; sm_90a only (MK_ENOTSUP elsewhere). */
int mk_cuda_probe_wgmma_fp4(mk_cuda_ctx *ctx, const void *const *W, const uint8_t *const *S, const void *const *W3,
                            const uint8_t *const *S3, int n, int k, const uint8_t *xq, const float *sa, int by_token,
                            const int32_t *plan, int K, int E, float *y, float *y3, mk_err *err);

#ifdef __cplusplus
}
#endif

#endif
