/* bench_gemm.c — memory bandwidth of this machine and mk_linear GEMV (m = 1, decode) throughput
 * per weight kind, as effective weight bytes per second and as a fraction of that bandwidth.
 *
 *   bench_gemm [--quick]
 *
 * Decode is one GEMV per weight matrix per token, so its speed limit is the rate at which the
 * weights stream from DRAM. The bandwidth side: memcpy of a 1 GiB buffer (read + write bytes
 * counted, as STREAM's copy does) and a read-only AVX2 sum over the same buffer, best of several
 * runs, at 1 and 2 threads. The GEMV side: V4-Flash-shaped matrices (FP8 4096 x 4096 and
 * 32768 x 1024, FP4 2048 x 4096 experts, the BF16 129280 x 4096 output head), each set several
 * times larger than the last-level cache so every pass comes from DRAM, timed best-of-N passes at
 * 1 and 2 threads. Bytes counted are mk_wmat_bytes (weights + scales); the activations are small.
 * --quick shrinks buffers and repetitions (a smoke test, numbers not meaningful).
 */
#include "base/threads.h"
#include "num/formats.h"
#include "ops/ops.h"

#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng = 0x243f6a8885a308d3ull;
static uint64_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* ---- bandwidth ------------------------------------------------------------------------- */

typedef struct {
    char *src, *dst;
    size_t n; /* bytes per task */
    int mode; /* 0 copy, 1 read */
    double sums[64];
} bw_job;

__attribute__((target("avx2"))) static double sum_avx2(const char *p, size_t n) {
    const __m256d *v = (const __m256d *)p;
    __m256d a = _mm256_setzero_pd(), b = a, c = a, d = a;
    for (size_t i = 0; i + 4 <= n / 32; i += 4) {
        a = _mm256_add_pd(a, _mm256_load_pd((const double *)(v + i)));
        b = _mm256_add_pd(b, _mm256_load_pd((const double *)(v + i + 1)));
        c = _mm256_add_pd(c, _mm256_load_pd((const double *)(v + i + 2)));
        d = _mm256_add_pd(d, _mm256_load_pd((const double *)(v + i + 3)));
    }
    double t[4];
    _mm256_storeu_pd(t, _mm256_add_pd(_mm256_add_pd(a, b), _mm256_add_pd(c, d)));
    return t[0] + t[1] + t[2] + t[3];
}

static void bw_task(void *ctx, int i, int tid) {
    (void)tid;
    bw_job *J = ctx;
    size_t off = (size_t)i * J->n;
    if (J->mode == 0) memcpy(J->dst + off, J->src + off, J->n);
    else J->sums[i & 63] += sum_avx2(J->src + off, J->n);
}

/* Best-of-reps GB/s over `bytes` with the pool's threads (one contiguous slice each). */
static double bandwidth(mk_pool *pool, char *src, char *dst, size_t bytes, int mode, int reps) {
    int nt = mk_pool_size(pool);
    bw_job J = {src, dst, bytes / (size_t)nt, mode, {0}};
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        mk_pool_run(pool, nt, bw_task, &J);
        double dt = now() - t0;
        double gbs = (mode == 0 ? 2.0 : 1.0) * (double)(J.n * (size_t)nt) / dt / 1e9;
        if (gbs > best) best = gbs;
    }
    if (J.sums[0] == 12345.678) printf("(unlikely)\n"); /* keep the sums alive */
    return best;
}

/* ---- GEMV ------------------------------------------------------------------------------- */

typedef struct {
    const char *name;
    mk_wkind kind;
    int n, k;
    int copies; /* distinct matrices cycled through, so the set exceeds the caches */
    int fp4;    /* FP4 decode (mk_linear_fp4_decode): both are timed, since which is faster
                 * depends on the CPU's subnormal handling */
} gemv_case;

static void fill_bytes(uint8_t *p, size_t n, int fp8) {
    for (size_t i = 0; i < n; i += 8) {
        uint64_t r = rnd();
        for (size_t b = 0; b < 8 && i + b < n; b++) {
            uint8_t c = (uint8_t)(r >> (8 * b));
            if (fp8 && (c & 0x7f) == 0x7f) c = 0x3f; /* no NaN codes */
            /* nor subnormal ones: 1 in 16 random bytes, but 1.5e-4 of the golden checkpoint's FP8
             * weights, and each costs the f32-bit decode a microcode assist on Intel cores */
            if (fp8 && (c & 0x78) == 0 && (c & 7)) c |= 0x08;
            p[i + b] = c;
        }
    }
}

static void fill_w(mk_wmat *W, mk_wkind kind, int n, int k) {
    size_t nk = (size_t)n * k;
    W->kind = kind;
    W->n = n;
    W->k = k;
    W->scale = NULL;
    size_t bytes = 0, sbytes = 0;
    switch (kind) {
    case MK_W_BF16: bytes = nk * 2; break;
    case MK_W_F32: bytes = nk * 4; break;
    case MK_W_FP8:
    case MK_W_FP8_DQ:
        bytes = nk;
        sbytes = (size_t)((n + 127) / 128) * (size_t)((k + 127) / 128);
        break;
    case MK_W_FP4:
        bytes = nk / 2;
        sbytes = (size_t)n * (size_t)(k / 32);
        break;
    }
    uint8_t *w = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!w) { fprintf(stderr, "bench_gemm: out of memory\n"); exit(1); }
    if (kind == MK_W_BF16) { /* finite bf16 values in [-2, 2] */
        uint16_t *h = (uint16_t *)w;
        for (size_t i = 0; i < nk; i++) h[i] = (uint16_t)(0x3c00 + (rnd() & 0x3ff)) | (uint16_t)((i & 1) << 15);
    } else {
        fill_bytes(w, bytes, kind == MK_W_FP8 || kind == MK_W_FP8_DQ);
    }
    W->w = w;
    if (sbytes) {
        uint8_t *s = malloc(sbytes);
        for (size_t i = 0; i < sbytes; i++) s[i] = (uint8_t)(118 + rnd() % 8);
        W->scale = s;
    }
}

/* Best-of-reps seconds for one pass over all copies (one mk_linear each, m = 1). */
static double time_pass(mk_pool *pool, mk_wmat *Ws, int copies, const float *x, float *y,
                        float *scratch, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int c = 0; c < copies; c++) mk_linear(pool, &Ws[c], x, 1, y, 1, scratch);
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

int main(int argc, char **argv) {
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    mk_num_init();
    mk_pool *pool2 = mk_pool_create(2);
    if (!pool2) { fprintf(stderr, "bench_gemm: no thread pool\n"); return 1; }
    mk_pool *pools[2] = {NULL, pool2};

    /* bandwidth */
    size_t bytes = quick ? (size_t)64 << 20 : (size_t)1 << 30;
    int bw_reps = quick ? 2 : 6;
    char *src = aligned_alloc(64, bytes), *dst = aligned_alloc(64, bytes);
    if (!src || !dst) { fprintf(stderr, "bench_gemm: out of memory\n"); return 1; }
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    double copy[2], rd[2];
    for (int t = 0; t < 2; t++) {
        copy[t] = bandwidth(pools[t], src, dst, bytes, 0, bw_reps);
        rd[t] = bandwidth(pools[t], src, dst, bytes, 1, bw_reps);
    }
    free(src);
    free(dst);
    printf("minke bench_gemm%s\n", quick ? " (quick: numbers not meaningful)" : "");
    printf("memory bandwidth (%zu MiB buffer, best of %d)\n", bytes >> 20, bw_reps);
    printf("  %-34s %8s %8s\n", "", "1 thr", "2 thr");
    printf("  %-34s %8.2f %8.2f GB/s\n", "memcpy (read+write bytes, STREAM)", copy[0], copy[1]);
    printf("  %-34s %8.2f %8.2f GB/s\n", "read-only sum (AVX2)", rd[0], rd[1]);

    /* GEMV */
    const gemv_case cases[] = {
        {"fp8  4096 x 4096 (wq_b-like)", MK_W_FP8, 4096, 4096, 16, MK_FP4_AUTO},
        {"fp8  32768 x 1024", MK_W_FP8, 32768, 1024, 8, MK_FP4_AUTO},
        {"fp4  2048 x 4096 (experts, f16)", MK_W_FP4, 2048, 4096, 64, MK_FP4_F16},
        {"fp4  2048 x 4096 (experts, bits)", MK_W_FP4, 2048, 4096, 64, MK_FP4_BITS},
        {"bf16 129280 x 4096 (head)", MK_W_BF16, 129280, 4096, 1, MK_FP4_AUTO},
    };
    int reps = quick ? 2 : 5;
    printf("\nmk_linear GEMV (m = 1, bf16 output), weights cycled through a set larger than LLC\n");
    printf("  %-33s %9s %4s %9s %8s %8s %8s\n", "matrix", "set MiB", "thr", "ms/pass", "GB/s",
           "/copy", "/read");
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        gemv_case c = cases[ci];
        mk_linear_fp4_decode(c.fp4);
        if (quick) {
            c.copies = c.copies > 2 ? 2 : c.copies;
            if (c.n > 8192) c.n = 8192;
        }
        mk_wmat *Ws = calloc((size_t)c.copies, sizeof *Ws);
        for (int i = 0; i < c.copies; i++) fill_w(&Ws[i], c.kind, c.n, c.k);
        size_t set = 0;
        for (int i = 0; i < c.copies; i++) set += mk_wmat_bytes(&Ws[i]);
        float *x = malloc(sizeof(float) * (size_t)c.k), *y = malloc(sizeof(float) * (size_t)c.n);
        float *scratch = malloc(sizeof(float) * mk_linear_scratch(1, c.k));
        for (int i = 0; i < c.k; i++) x[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
        for (int t = 0; t < 2; t++) {
            time_pass(pools[t], Ws, c.copies, x, y, scratch, 1); /* warm: page faults, TLB */
            double dt = time_pass(pools[t], Ws, c.copies, x, y, scratch, reps);
            double gbs = (double)set / dt / 1e9;
            printf("  %-33s %9.0f %4d %9.2f %8.2f %7.0f%% %7.0f%%\n", c.name, (double)set / 1048576.0,
                   t + 1, dt * 1e3, gbs, 100.0 * gbs / copy[t], 100.0 * gbs / rd[t]);
        }
        for (int i = 0; i < c.copies; i++) {
            free((void *)Ws[i].w);
            free((void *)Ws[i].scale);
        }
        free(Ws);
        free(x);
        free(y);
        free(scratch);
    }
    mk_linear_fp4_decode(MK_FP4_AUTO);
    printf("  (/copy and /read: against the bandwidth at the same thread count; fp4 f16 / bits: the two\n"
           "   FP4 decodes, same bits; mk_linear picks f16 on Intel, bits elsewhere, MINKE_CPU_FP4 overrides)\n");
    mk_pool_free(pool2);
    return 0;
}
