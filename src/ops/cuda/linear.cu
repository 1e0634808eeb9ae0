/* linear.cu — mk_cuda_linear: picks the kernel for a weight kind and activation count, prepares
 * the activations (FP8 quantization per 128-block, natural or permuted layout; bf16 conversion)
 * in the caller's scratch, and launches (gemv.cu, gemm.cu).
 *
 * Scratch layout (each part 256-byte aligned): xq e4m3 [m, k] | sa f32 [m, ceil(k/128)] |
 * xb bf16 [m, k] | split-K partials f32 (FP8 GEMM: [splits, m, n]; GEMV: [splits, min(m, 8), n]).
 * It is sized by mk_cuda_linear_scratch from the same split rules the launchers use.
 *
 * Choices (logged once per context when a slower path is taken):
 *   FP8  m <= 8: GEMV;  m > 8: GEMM (n, k multiples of 128) — else GEMV in chunks of 8, else simple
 *   FP4  GEMV (chunks of 8 rows when m > 8; k multiple of 128) — else simple
 *   BF16 m <= 8: GEMV;  m > 8: cuBLAS — else GEMV chunks, else simple
 *   FP8_DQ GEMV (f16 tensor cores; chunks of 8 rows when m > 8) — else simple
 *   F32: simple
 *   MK_CUDA_LIN_ROW_INVARIANT: the GEMV for every m where the shape allows it, else simple: both
 *   compute a row the same way whatever m and whatever the other rows are (the GEMV's launch plan
 *   depends on W only; each output is one MMA column's sum in k order). For m > 8 the GEMV runs as
 *   its row-invariant GEMM where that fills the GPU (FP8, FP8_DQ, bf16: the same bits; gemv.cu),
 *   else in chunks of 8 rows in one launch.
 * Scratch parts by path: xq/sa for FP8/FP4; xb for bf16; xb (as f16) and sa (as the f16 scales)
 * for FP8_DQ.
 */
#include "ops/cuda/cuda_common.cuh"

enum { NOTE_FP4_CHUNKS = 0, NOTE_SIMPLE_F32, NOTE_SIMPLE_DQ, NOTE_SIMPLE_SHAPE, NOTE_CHUNKS };

static size_t align256(size_t v) { return (v + 255) & ~(size_t)255; }

static int gemv_ok(const mk_wmat *W) {
    switch (W->kind) {
    case MK_W_FP8: return W->n % 16 == 0 && W->k % 128 == 0;
    case MK_W_FP4: return W->n % 16 == 0 && W->k % 128 == 0;
    case MK_W_BF16: return W->n % 16 == 0 && W->k % 32 == 0;
    case MK_W_FP8_DQ: return W->n % 16 == 0 && W->k % 128 == 0;
    default: return 0;
    }
}

typedef struct {
    size_t xq, sa, xb, ws, total;
} scratch_layout;

static scratch_layout layout_for(const mk_cuda_ctx *ctx, const mk_wmat *W, int m) {
    scratch_layout L;
    size_t mk = (size_t)m * W->k, nb = (size_t)(W->k + 127) / 128;
    L.xq = 0;
    L.sa = align256(mk);
    L.xb = L.sa + align256((size_t)m * nb * 4);
    L.ws = L.xb + align256(mk * 2);
    L.total = L.ws;
    size_t ws = 0; /* split-K partials: the larger of the GEMM's and the GEMV's */
    if (W->kind == MK_W_FP8 && W->n % 128 == 0 && W->k % 128 == 0) { /* any m: GEMM may be forced */
        int s = mk_cuda_gemm_fp8_splits(ctx, m, W->n, W->k);
        if (s > 1) ws = (size_t)s * m * W->n * 4;
    }
    if (gemv_ok(W)) {
        int s = mk_cuda_gemv_splits(ctx, W);
        size_t g = s > 1 ? (size_t)s * (m < 8 ? m : 8) * W->n * 4 : 0;
        if (g > ws) ws = g;
    }
    L.total += align256(ws);
    L.total += 256;
    return L;
}

extern "C" size_t mk_cuda_linear_scratch(const mk_cuda_ctx *ctx, const mk_wmat *W, int m) {
    return layout_for(ctx, W, m < 1 ? 1 : m).total;
}

extern "C" int mk_cuda_linear_xq(const mk_cuda_ctx *ctx, const mk_wmat *W, int m, void *scratch, size_t scratch_bytes,
                                 uint8_t **xq, float **sa, int *perm, mk_err *err) {
    if (W->kind != MK_W_FP8 && W->kind != MK_W_FP4)
        return mk_fail(err, MK_ENOTSUP, "cuda: linear: kind %d takes no quantized activations", (int)W->kind);
    scratch_layout L = layout_for(ctx, W, m < 1 ? 1 : m);
    if (scratch_bytes < L.total || !scratch)
        return mk_fail(err, MK_EINVAL, "cuda: linear: scratch of %zu bytes, %zu needed", scratch_bytes, L.total);
    uint8_t *base = (uint8_t *)(((uintptr_t)scratch + 255) & ~(uintptr_t)255);
    *xq = base + L.xq;
    *sa = (float *)(base + L.sa);
    *perm = W->kind == MK_W_FP4;
    return MK_OK;
}

static int gemm_ok(const mk_cuda_ctx *ctx, const mk_wmat *W) {
    if (W->kind == MK_W_FP8) return W->n % 128 == 0 && W->k % 128 == 0;
    if (W->kind == MK_W_BF16) return ctx->cublas != NULL && !mk_cuda_bf16_tiled(ctx, W); /* cuBLAS reads rows */
    return 0;
}

static mk_cuda_kernel resolve(const mk_cuda_ctx *ctx, mk_cuda_kernel kern, const mk_wmat *W, int m,
                              int flags) {
    if (kern != MK_CUDA_K_AUTO) return kern;
    if (flags & MK_CUDA_LIN_ROW_INVARIANT) return gemv_ok(W) ? MK_CUDA_K_GEMV : MK_CUDA_K_SIMPLE;
    switch (W->kind) {
    case MK_W_FP8:
    case MK_W_BF16:
        if (m <= 8 && gemv_ok(W)) return MK_CUDA_K_GEMV;
        if (m > 8 && gemm_ok(ctx, W)) return MK_CUDA_K_GEMM;
        return gemv_ok(W) ? MK_CUDA_K_GEMV : MK_CUDA_K_SIMPLE;
    case MK_W_FP4:
    case MK_W_FP8_DQ: return gemv_ok(W) ? MK_CUDA_K_GEMV : MK_CUDA_K_SIMPLE;
    default: return MK_CUDA_K_SIMPLE;
    }
}

extern "C" const char *mk_cuda_linear_kernel_name(const mk_cuda_ctx *ctx, mk_cuda_kernel kern,
                                                  const mk_wmat *W, int m) {
    switch (resolve(ctx, kern, W, m, 0)) {
    case MK_CUDA_K_SIMPLE: return "simple (warp per row, FMA)";
    case MK_CUDA_K_GEMV:
        if (W->kind == MK_W_FP8) return m > 8 ? "fp8 mma gemv (chunks of 8)" : "fp8 mma gemv";
        if (W->kind == MK_W_FP4) return m > 8 ? "fp4 mma gemv (chunks of 8)" : "fp4 mma gemv";
        if (W->kind == MK_W_BF16 && mk_cuda_bf16_tiled(ctx, W))
            return m > 8 ? "bf16 mma gemm (slab tiles)" : "bf16 mma gemv (slab tiles)";
        if (W->kind == MK_W_BF16) return m > 8 ? "bf16 mma gemv (chunks of 8)" : "bf16 mma gemv";
        if (W->kind == MK_W_FP8_DQ) return m > 8 ? "fp8_dq f16 mma gemv (chunks of 8)" : "fp8_dq f16 mma gemv";
        return "?";
    case MK_CUDA_K_GEMM: return W->kind == MK_W_FP8 ? "fp8 mma gemm" : "cublas bf16 gemm";
    default: return "?";
    }
}

extern "C" int mk_cuda_linear_ex(mk_cuda_ctx *ctx, mk_cuda_kernel kern, int flags,
                                 const mk_wmat *W, const float *x, int m, float *y, int round_bf16,
                                 void *scratch, size_t scratch_bytes, mk_err *err) {
    if (m < 0 || !W || !W->w) return mk_fail(err, MK_EINVAL, "cuda: linear: bad arguments");
    if (m == 0) return MK_OK;
    if ((W->kind == MK_W_FP8 || W->kind == MK_W_FP8_DQ || W->kind == MK_W_FP4) && !W->scale)
        return mk_fail(err, MK_EINVAL, "cuda: linear: quantized weights without scales");
    scratch_layout L = layout_for(ctx, W, m);
    if (scratch_bytes < L.total || !scratch)
        return mk_fail(err, MK_EINVAL, "cuda: linear: scratch of %zu bytes, %zu needed (m %d, n %d, k %d)",
                       scratch_bytes, L.total, m, W->n, W->k);
    uint8_t *base = (uint8_t *)(((uintptr_t)scratch + 255) & ~(uintptr_t)255);
    uint8_t *xq = base + L.xq;
    float *sa = (float *)(base + L.sa);
    uint16_t *xb = (uint16_t *)(base + L.xb);
    float *ws = (float *)(base + L.ws);
    const int n = W->n, k = W->k, nb = (k + 127) / 128;
    const int reuse = flags & MK_CUDA_LIN_REUSE_X;
    const int quantized = W->kind == MK_W_FP8 || W->kind == MK_W_FP4;
    int st;

    mk_cuda_kernel kk = resolve(ctx, kern, W, m, flags);
    switch (kk) {
    case MK_CUDA_K_SIMPLE:
        if (mk_cuda_bf16_tiled(ctx, W))
            return mk_fail(err, MK_ENOTSUP, "cuda: linear: the simple kernel reads rows; this bf16 matrix is in slab tiles");
        if (W->kind == MK_W_F32) mk_cuda_note(ctx, NOTE_SIMPLE_F32, "f32 weights use the simple FMA kernel");
        else if (W->kind == MK_W_FP8_DQ) mk_cuda_note(ctx, NOTE_SIMPLE_DQ, "fp8_dq weights (wo_a) use the simple FMA kernel");
        else if (kern == MK_CUDA_K_AUTO)
            mk_cuda_note(ctx, NOTE_SIMPLE_SHAPE, "a weight shape outside the tensor-core kernels' "
                         "constraints uses the simple FMA kernel (slow)");
        if (quantized && !reuse) {
            st = mk_cuda_quant_launch(ctx, x, m, k, 0, xq, sa, err);
            if (st) return st;
        }
        return mk_cuda_gemv_simple(ctx, W, x, xq, sa, m, y, round_bf16, err);
    case MK_CUDA_K_GEMV:
        if (!gemv_ok(W))
            return mk_fail(err, MK_ENOTSUP, "cuda: linear: no tensor-core gemv for kind %d shape [%d, %d]",
                           (int)W->kind, n, k);
        if (m > 8) {
            if (W->kind == MK_W_FP4)
                mk_cuda_note(ctx, NOTE_FP4_CHUNKS, "fp4 weights with more than 8 rows run the gemv in "
                             "chunks of 8 (no fp4 gemm kernel yet)");
            else if (kern == MK_CUDA_K_AUTO)
                mk_cuda_note(ctx, NOTE_CHUNKS, "a linear with more than 8 rows runs the gemv in chunks of 8");
        }
        if (!reuse) {
            if (quantized) st = mk_cuda_quant_launch(ctx, x, m, k, W->kind == MK_W_FP4, xq, sa, err);
            else if (W->kind == MK_W_FP8_DQ) st = mk_cuda_f16_prep_launch(ctx, x, m, k, xb, sa, err);
            else st = mk_cuda_to_bf16_launch(ctx, x, (size_t)m * k, xb, err);
            if (st) return st;
        }
        /* one launch for every chunk of 8 rows, unless split-K (then one launch per chunk) */
        for (int r0 = 0, step = mk_cuda_gemv_splits(ctx, W) > 1 ? 8 : m; r0 < m; r0 += step) {
            int mm = m - r0 < step ? m - r0 : step;
            float *yr = y + (size_t)r0 * n;
            if (W->kind == MK_W_FP8)
                st = mk_cuda_gemv_fp8(ctx, W, xq + (size_t)r0 * k, sa + (size_t)r0 * nb, mm, yr, round_bf16, ws, err);
            else if (W->kind == MK_W_FP4)
                st = mk_cuda_gemv_fp4(ctx, W, xq + (size_t)r0 * k, sa + (size_t)r0 * nb, mm, yr, round_bf16, ws, err);
            else if (W->kind == MK_W_FP8_DQ)
                st = mk_cuda_gemv_dq(ctx, W, 1, xb + (size_t)r0 * k, sa + (size_t)r0 * nb, mm, yr, round_bf16, ws, err);
            else
                st = mk_cuda_gemv_bf16(ctx, W, xb + (size_t)r0 * k, mm, yr, round_bf16, ws, err);
            if (st) return st;
        }
        return MK_OK;
    case MK_CUDA_K_GEMM:
        if (!gemm_ok(ctx, W))
            return mk_fail(err, MK_ENOTSUP, "cuda: linear: no gemm for kind %d shape [%d, %d]",
                           (int)W->kind, n, k);
        if (W->kind == MK_W_FP8) {
            if (!reuse) {
                st = mk_cuda_quant_launch(ctx, x, m, k, 0, xq, sa, err);
                if (st) return st;
            }
            return mk_cuda_gemm_fp8(ctx, W, xq, sa, m, y, round_bf16, ws, err);
        }
        if (!reuse) {
            st = mk_cuda_to_bf16_launch(ctx, x, (size_t)m * k, xb, err);
            if (st) return st;
        }
        return mk_cuda_gemm_bf16_cublas(ctx, W, xb, m, y, round_bf16, err);
    default: return mk_fail(err, MK_EINVAL, "cuda: linear: unknown kernel %d", (int)kern);
    }
}

extern "C" int mk_cuda_linear_argmax(mk_cuda_ctx *ctx, int flags, const mk_wmat *W, const float *x, int m, float *y,
                                     int round_bf16, int32_t *am, void *scratch, size_t scratch_bytes, mk_err *err) {
    if (m < 0 || !W || !W->w || !am) return mk_fail(err, MK_EINVAL, "cuda: linear with argmax: bad arguments");
    if (m == 0) return MK_OK;
    if (ctx->tune.head_argmax && resolve(ctx, MK_CUDA_K_AUTO, W, m, flags) == MK_CUDA_K_GEMV &&
        mk_cuda_gemv_bf16_am_ok(ctx, W, m)) {
        scratch_layout L = layout_for(ctx, W, m);
        if (scratch_bytes < L.total || !scratch)
            return mk_fail(err, MK_EINVAL, "cuda: linear: scratch of %zu bytes, %zu needed (m %d, n %d, k %d)",
                           scratch_bytes, L.total, m, W->n, W->k);
        uint16_t *xb = (uint16_t *)((((uintptr_t)scratch + 255) & ~(uintptr_t)255) + L.xb);
        if (!(flags & MK_CUDA_LIN_REUSE_X)) {
            int st = mk_cuda_to_bf16_launch(ctx, x, (size_t)m * W->k, xb, err);
            if (st) return st;
        }
        return mk_cuda_gemv_bf16_am(ctx, W, xb, m, y, round_bf16, am, err);
    }
    int st = mk_cuda_linear_ex(ctx, MK_CUDA_K_AUTO, flags, W, x, m, y, round_bf16, scratch, scratch_bytes, err);
    if (st) return st;
    return mk_cuda_argmax_rows(ctx, y, m, W->n, am, err);
}

extern "C" int mk_cuda_linear(mk_cuda_ctx *ctx, const mk_wmat *W, const float *x, int m, float *y,
                              int round_bf16, void *scratch, size_t scratch_bytes, mk_err *err) {
    return mk_cuda_linear_ex(ctx, MK_CUDA_K_AUTO, 0, W, x, m, y, round_bf16, scratch, scratch_bytes,
                             err);
}

/* ---- two linears over one input in one launch (wq_a + wkv, sh1 + sh3) ------------------------------ */

/* The pair's split-K partials: splits of W1's plan, at most 8 rows, both outputs. */
static size_t pair_ws(const mk_cuda_ctx *ctx, const mk_wmat *W1, const mk_wmat *W2, int m) {
    int s = mk_cuda_gemv_splits(ctx, W1);
    return s > 1 ? (size_t)s * (m < 8 ? m : 8) * (W1->n + W2->n) * 4 : 0;
}

extern "C" size_t mk_cuda_linear_pair_scratch(const mk_cuda_ctx *ctx, const mk_wmat *W1, const mk_wmat *W2, int m) {
    m = m < 1 ? 1 : m;
    scratch_layout L1 = layout_for(ctx, W1, m), L2 = layout_for(ctx, W2, m);
    size_t b = L1.total > L2.total ? L1.total : L2.total;
    size_t p = L1.ws + align256(pair_ws(ctx, W1, W2, m)) + 256;
    return b > p ? b : p;
}

extern "C" int mk_cuda_linear_pair_one_launch(const mk_cuda_ctx *ctx, int flags, const mk_wmat *W1, const mk_wmat *W2,
                                              int m) {
    return mk_cuda_gemv_fp8_pair_ok(ctx, W1, W2) && W1->scale && W2->scale &&
           resolve(ctx, MK_CUDA_K_AUTO, W1, m, flags) == MK_CUDA_K_GEMV &&
           resolve(ctx, MK_CUDA_K_AUTO, W2, m, flags) == MK_CUDA_K_GEMV;
}

extern "C" int mk_cuda_linear_pair(mk_cuda_ctx *ctx, int flags, const mk_wmat *W1, const mk_wmat *W2, const float *x,
                                   int m, float *y1, float *y2, int round_bf16, void *scratch, size_t scratch_bytes,
                                   mk_err *err) {
    if (m < 0 || !W1 || !W2 || !W1->w || !W2->w) return mk_fail(err, MK_EINVAL, "cuda: linear pair: bad arguments");
    if (m == 0) return MK_OK;
    const int same_x = W1->kind == W2->kind && W1->k == W2->k &&
                       (W1->kind == MK_W_FP8 || W1->kind == MK_W_FP4 || W1->kind == MK_W_BF16);
    const int one = mk_cuda_linear_pair_one_launch(ctx, flags, W1, W2, m);
    if (!one) { /* two launches; the second reuses the first's prepared input where it can */
        int st = mk_cuda_linear_ex(ctx, MK_CUDA_K_AUTO, flags, W1, x, m, y1, round_bf16, scratch, scratch_bytes, err);
        if (st) return st;
        return mk_cuda_linear_ex(ctx, MK_CUDA_K_AUTO, flags | (same_x ? MK_CUDA_LIN_REUSE_X : 0), W2, x, m, y2,
                                 round_bf16, scratch, scratch_bytes, err);
    }
    scratch_layout L = layout_for(ctx, W1, m);
    if (!scratch || scratch_bytes < mk_cuda_linear_pair_scratch(ctx, W1, W2, m))
        return mk_fail(err, MK_EINVAL, "cuda: linear pair: scratch of %zu bytes, %zu needed", scratch_bytes,
                       mk_cuda_linear_pair_scratch(ctx, W1, W2, m));
    uint8_t *base = (uint8_t *)(((uintptr_t)scratch + 255) & ~(uintptr_t)255);
    uint8_t *xq = base + L.xq;
    float *sa = (float *)(base + L.sa), *ws = (float *)(base + L.ws);
    const int k = W1->k, nb = (k + 127) / 128;
    if (!(flags & MK_CUDA_LIN_REUSE_X)) {
        int st = mk_cuda_quant_launch(ctx, x, m, k, 0, xq, sa, err);
        if (st) return st;
    }
    for (int r0 = 0, step = mk_cuda_gemv_splits(ctx, W1) > 1 ? 8 : m; r0 < m; r0 += step) {
        int mm = m - r0 < step ? m - r0 : step;
        int st = mk_cuda_gemv_fp8_pair(ctx, W1, W2, xq + (size_t)r0 * k, sa + (size_t)r0 * nb, mm,
                                       y1 + (size_t)r0 * W1->n, y2 + (size_t)r0 * W2->n, round_bf16, ws, err);
        if (st) return st;
    }
    return MK_OK;
}

/* ---- several linears over one input (the compressors' and the indexer's bf16 projections of x) --- */

extern "C" size_t mk_cuda_linear_multi_scratch(const mk_cuda_ctx *ctx, int count, const mk_wmat *const *W, int m) {
    size_t b = 0;
    for (int i = 0; i < count; i++) {
        size_t t = layout_for(ctx, W[i], m < 1 ? 1 : m).total;
        if (t > b) b = t;
    }
    return b;
}

extern "C" int mk_cuda_linear_multi(mk_cuda_ctx *ctx, int flags, int count, const mk_wmat *const *W, const float *x,
                                    int m, float *const *y, const int *round, void *scratch, size_t scratch_bytes,
                                    mk_err *err) {
    if (m < 0 || count < 1 || count > MK_CUDA_MULTI) return mk_fail(err, MK_EINVAL, "cuda: linear multi: bad arguments");
    for (int i = 0; i < count; i++)
        if (!W[i] || !W[i]->w) return mk_fail(err, MK_EINVAL, "cuda: linear multi: matrix %d missing", i);
    if (m == 0) return MK_OK;
    int one = ctx->tune.linear_multi && mk_cuda_gemv_bf16_multi_ok(ctx, count, W);
    for (int i = 0; one && i < count; i++) one = resolve(ctx, MK_CUDA_K_AUTO, W[i], m, flags) == MK_CUDA_K_GEMV;
    if (!one) { /* one call each; the later ones reuse the first's prepared input where they can */
        const mk_wmat *W0 = W[0];
        for (int i = 0; i < count; i++) {
            const int same_x = i > 0 && W[i]->kind == W0->kind && W[i]->k == W0->k &&
                               (W0->kind == MK_W_FP8 || W0->kind == MK_W_FP4 || W0->kind == MK_W_BF16);
            int st = mk_cuda_linear_ex(ctx, MK_CUDA_K_AUTO, flags | (same_x ? MK_CUDA_LIN_REUSE_X : 0), W[i], x, m,
                                       y[i], round[i], scratch, scratch_bytes, err);
            if (st) return st;
        }
        return MK_OK;
    }
    scratch_layout L = layout_for(ctx, W[0], m);
    if (!scratch || scratch_bytes < L.total)
        return mk_fail(err, MK_EINVAL, "cuda: linear multi: scratch of %zu bytes, %zu needed", scratch_bytes, L.total);
    uint8_t *base = (uint8_t *)(((uintptr_t)scratch + 255) & ~(uintptr_t)255);
    uint16_t *xb = (uint16_t *)(base + L.xb);
    if (!(flags & MK_CUDA_LIN_REUSE_X)) {
        int st = mk_cuda_to_bf16_launch(ctx, x, (size_t)m * W[0]->k, xb, err);
        if (st) return st;
    }
    return mk_cuda_gemv_bf16_multi(ctx, count, W, xb, m, y, round, err);
}

/* ---- grouped (block-diagonal) FP8_DQ linear: wo_a ------------------------------------------------ */

extern "C" size_t mk_cuda_linear_grouped_scratch(const mk_cuda_ctx *ctx, const mk_wmat *W, int G, int m) {
    mk_wmat V = *W;
    V.k = W->k * (G < 1 ? 1 : G);
    return layout_for(ctx, &V, m < 1 ? 1 : m).total;
}

/* prep: 1 the input preparation and the GEMV, 0 the GEMV alone (the input already in scratch), -1 neither
 * (*xh / *sx: where the input goes). */
static int linear_grouped(mk_cuda_ctx *ctx, const mk_wmat *W, int G, float *x, const mk_cuda_rope_at_desc *ro, int m,
                          float *y, int round_bf16, void *scratch, size_t scratch_bytes, int prep, uint16_t **pxh,
                          float **psx, mk_err *err) {
    if (m < 0 || !W || !W->w || G < 1) return mk_fail(err, MK_EINVAL, "cuda: grouped linear: bad arguments");
    if (m == 0) return MK_OK;
    if (W->kind != MK_W_FP8_DQ || !W->scale || W->n % G || (W->n / G) % 16 || W->k % 128)
        return mk_fail(err, MK_ENOTSUP, "cuda: grouped linear: needs fp8_dq weights with n / G %% 16 == 0 and k %% 128 == 0 "
                       "(kind %d, n %d, k %d, G %d)", (int)W->kind, W->n, W->k, G);
    mk_wmat V = *W;
    V.k = W->k * G;
    scratch_layout L = layout_for(ctx, &V, m);
    if (scratch_bytes < L.total || !scratch)
        return mk_fail(err, MK_EINVAL, "cuda: grouped linear: scratch of %zu bytes, %zu needed", scratch_bytes, L.total);
    mk_wmat Wg = *W;
    Wg.n = W->n / G;
    if (mk_cuda_gemv_splits(ctx, &Wg) > 1)
        return mk_fail(err, MK_ENOTSUP, "cuda: grouped linear: not with split-K GEMVs (tuning)");
    uint8_t *base = (uint8_t *)(((uintptr_t)scratch + 255) & ~(uintptr_t)255);
    float *sa = (float *)(base + L.sa);
    uint16_t *xb = (uint16_t *)(base + L.xb);
    if (prep < 0) {
        *pxh = xb, *psx = sa;
        return MK_OK;
    }
    if (prep == 0) return mk_cuda_gemv_dq(ctx, W, G, xb, sa, m, y, round_bf16, NULL, err);
    /* the rotation inside the preparation where its lanes hold whole pairs and the tuning allows,
     * else mk_cuda_rope_at first */
    if (ro && (ro->D <= 0 || V.k % ro->D))
        return mk_fail(err, MK_EINVAL, "cuda: grouped linear: rope heads of %d over rows of %d", ro->D, V.k);
    if (ro && (!ctx->tune.rope_fuse || ro->D % 4 || ro->rd % 4)) {
        int st = mk_cuda_rope_at(ctx, x + (ro->D - ro->rd), m * (V.k / ro->D), ro->D, ro->rd, ro->table, ro->pos,
                                 V.k / ro->D, ro->inverse, err);
        if (st) return st;
        ro = NULL;
    }
    /* the per-128-block f16 preparation of the whole row is that of each group's columns */
    int st = ro ? mk_cuda_f16_prep_rope_launch(ctx, x, m, V.k, ro, xb, sa, err)
                : mk_cuda_f16_prep_launch(ctx, x, m, V.k, xb, sa, err);
    if (st) return st;
    return mk_cuda_gemv_dq(ctx, W, G, xb, sa, m, y, round_bf16, NULL, err);
}

extern "C" int mk_cuda_linear_grouped(mk_cuda_ctx *ctx, const mk_wmat *W, int G, const float *x, int m, float *y,
                                      int round_bf16, void *scratch, size_t scratch_bytes, mk_err *err) {
    return linear_grouped(ctx, W, G, (float *)x, NULL, m, y, round_bf16, scratch, scratch_bytes, 1, NULL, NULL, err);
}

extern "C" int mk_cuda_linear_grouped_input(mk_cuda_ctx *ctx, const mk_wmat *W, int G, int m, void *scratch,
                                            size_t scratch_bytes, uint16_t **xh, float **sx, mk_err *err) {
    *xh = NULL, *sx = NULL;
    return linear_grouped(ctx, W, G, NULL, NULL, m, NULL, 0, scratch, scratch_bytes, -1, xh, sx, err);
}

extern "C" int mk_cuda_linear_grouped_prepared(mk_cuda_ctx *ctx, const mk_wmat *W, int G, int m, float *y,
                                               int round_bf16, void *scratch, size_t scratch_bytes, mk_err *err) {
    return linear_grouped(ctx, W, G, NULL, NULL, m, y, round_bf16, scratch, scratch_bytes, 0, NULL, NULL, err);
}

extern "C" int mk_cuda_linear_grouped_rope(mk_cuda_ctx *ctx, const mk_wmat *W, int G, float *x,
                                           const mk_cuda_rope_at_desc *ro, int m, float *y, int round_bf16,
                                           void *scratch, size_t scratch_bytes, mk_err *err) {
    return linear_grouped(ctx, W, G, x, ro, m, y, round_bf16, scratch, scratch_bytes, 1, NULL, NULL, err);
}
