/* bench_ggml.c — GEMV throughput of the ggml block formats (src/num/ggml_quant.c) against this
 * machine's read bandwidth.
 *
 *   bench_ggml [--quick]
 *
 * Batch-1 decode is one GEMV per weight matrix per token, so its limit is the rate at which the
 * weight bytes stream from DRAM. For each supported type a 4096-wide matrix of about 128 MiB
 * (4x a 32 MiB LLC, so every pass comes from DRAM) of random blocks is multiplied by one random
 * activation row with mk_ggml_matmul (activation quantization included), best of several passes,
 * at 1 and 2 threads; GB/s counts the weight bytes. The read-only AVX2 sum over a 1 GiB buffer
 * is the reference. A second table runs the matrix set of one SmolLM2-135M token (30 layers of
 * q/k/v/o/gate/up/down at 576 / 192 / 1536 wide, plus the 49152 x 576 output head), where the
 * matrices are small and the pool wake-ups count, in the types of its Q4_1, Q8_0 and F16 GGUFs
 * (Q5_0 is what its Q4_K_M file mostly holds: llama.cpp's fallback for 576-wide tensors).
 * --quick shrinks everything (a smoke test; numbers not meaningful).
 */
#include "base/threads.h"
#include "num/formats.h"
#include "num/ggml_quant.h"

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
static float rnds(void) { return (float)(rnd() >> 40) * 0x1p-23f - 1.0f; } /* [-1, 1) */

/* ---- read bandwidth ------------------------------------------------------------------- */

typedef struct {
    const char *src;
    size_t n; /* bytes per task */
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
    J->sums[i & 63] += sum_avx2(J->src + (size_t)i * J->n, J->n);
}

static double read_bw(mk_pool *pool, const char *src, size_t bytes, int reps) {
    int nt = mk_pool_size(pool);
    bw_job J = {src, bytes / (size_t)nt, {0}};
    double best = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        mk_pool_run(pool, nt, bw_task, &J);
        double gbs = (double)(J.n * (size_t)nt) / (now() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    if (J.sums[0] == 12345.678) printf("(unlikely)\n"); /* keep the sums alive */
    return best;
}

/* ---- weights --------------------------------------------------------------------------- */

/* n rows of k random values in `type`: random quant bytes, sane half scales. */
static uint8_t *make_w(uint32_t type, int n, int k) {
    size_t rb = mk_ggml_row_bytes(type, k), bytes = rb * (size_t)n;
    uint8_t *w = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!w) { fprintf(stderr, "bench_ggml: out of memory\n"); exit(1); }
    for (size_t i = 0; i < bytes; i += 8) {
        uint64_t r = rnd();
        memcpy(w + i, &r, bytes - i < 8 ? bytes - i : 8);
    }
    size_t bb = mk_ggml_block_bytes(type), nblk = bytes / bb;
    for (size_t b = 0; b < nblk; b++) {
        uint8_t *p = w + b * bb;
        uint16_t h[2] = {0x2000 | (uint16_t)(rnd() & 0x3ff), 0xa000 | (uint16_t)(rnd() & 0x3ff)};
        switch (type) {
        case MK_GGML_F32: {
            float f = rnds();
            memcpy(p, &f, 4);
            break;
        }
        case MK_GGML_F16: h[0] = (uint16_t)(0x3800 | (rnd() & 0x83ff)); memcpy(p, h, 2); break;
        case MK_GGML_BF16: h[0] = (uint16_t)(0x3f00 | (rnd() & 0x807f)); memcpy(p, h, 2); break;
        case MK_GGML_Q4_0:
        case MK_GGML_Q5_0:
        case MK_GGML_Q8_0: memcpy(p, h, 2); break;
        case MK_GGML_Q4_1:
        case MK_GGML_Q5_1:
        case MK_GGML_Q4_K:
        case MK_GGML_Q5_K: memcpy(p, h, 4); break;
        case MK_GGML_Q6_K: memcpy(p + 208, h, 2); break;
        }
    }
    return w;
}

typedef struct {
    uint32_t type;
    int n, k;
    uint8_t *w;
} mat;

/* best-of-reps seconds for one GEMV (m = 1) over every matrix of the set */
static double time_set(mk_pool *pool, const mat *ms, int count, const float *x, float *y,
                       void *scratch, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int i = 0; i < count; i++) mk_ggml_matmul(pool, ms[i].type, ms[i].w, ms[i].n, ms[i].k, x, 1, y, scratch);
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

static size_t set_bytes(const mat *ms, int count) {
    size_t s = 0;
    for (int i = 0; i < count; i++) s += mk_ggml_row_bytes(ms[i].type, ms[i].k) * (size_t)ms[i].n;
    return s;
}

int main(int argc, char **argv) {
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    mk_pool *pool1 = mk_pool_create(1), *pool2 = mk_pool_create(2);
    if (!pool1 || !pool2) { fprintf(stderr, "bench_ggml: no thread pool\n"); return 1; }
    mk_pool *pools[2] = {pool1, pool2};

    size_t bytes = quick ? (size_t)64 << 20 : (size_t)1 << 30;
    int reps = quick ? 2 : 6;
    char *buf = aligned_alloc(64, bytes);
    if (!buf) { fprintf(stderr, "bench_ggml: out of memory\n"); return 1; }
    memset(buf, 1, bytes);
    double rd[2];
    for (int t = 0; t < 2; t++) rd[t] = read_bw(pools[t], buf, bytes, reps);
    free(buf);
    printf("minke bench_ggml%s\n", quick ? " (quick: numbers not meaningful)" : "");
    printf("read-only AVX2 sum, %zu MiB, best of %d: %.2f GB/s (1 thread), %.2f GB/s (2 threads)\n",
           bytes >> 20, reps, rd[0], rd[1]);

    /* ---- one large matrix per type ---- */
    const uint32_t types[] = {MK_GGML_F32,  MK_GGML_F16,  MK_GGML_BF16, MK_GGML_Q8_0,
                              MK_GGML_Q4_0, MK_GGML_Q4_1, MK_GGML_Q5_0, MK_GGML_Q5_1,
                              MK_GGML_Q4_K, MK_GGML_Q5_K, MK_GGML_Q6_K};
    const int k = 4096;
    const size_t target = quick ? (size_t)16 << 20 : (size_t)128 << 20;
    float *x = malloc(sizeof(float) * (size_t)k);
    for (int i = 0; i < k; i++) x[i] = rnds();
    printf("\nGEMV y = W x (m = 1, k = %d, activation quantization included), %zu MiB matrix\n", k,
           target >> 20);
    printf("  %-6s %6s %7s | %9s %8s %6s | %9s %8s %6s\n", "type", "bits/w", "rows", "1T ms", "GB/s",
           "/read", "2T ms", "GB/s", "/read");
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        uint32_t type = types[ti];
        size_t rb = mk_ggml_row_bytes(type, k);
        int n = (int)(target / rb) / 64 * 64;
        mat m = {type, n, k, make_w(type, n, k)};
        float *y = malloc(sizeof(float) * (size_t)n);
        void *scratch = malloc(mk_ggml_matmul_scratch(type, 1, k));
        double ms[2], gbs[2];
        for (int t = 0; t < 2; t++) {
            time_set(pools[t], &m, 1, x, y, scratch, 1); /* warm: page faults, TLB */
            double dt = time_set(pools[t], &m, 1, x, y, scratch, quick ? 2 : 8);
            ms[t] = dt * 1e3;
            gbs[t] = (double)rb * n / dt / 1e9;
        }
        printf("  %-6s %6.2f %7d | %9.2f %8.2f %5.0f%% | %9.2f %8.2f %5.0f%%\n", mk_ggml_type_name(type),
               8.0 * (double)mk_ggml_block_bytes(type) / mk_ggml_block_elems(type), n, ms[0], gbs[0],
               100 * gbs[0] / rd[0], ms[1], gbs[1], 100 * gbs[1] / rd[1]);
        free(m.w);
        free(y);
        free(scratch);
    }
    free(x);

    /* ---- a SmolLM2-135M token's matrices ---- */
    printf("\nSmolLM2-135M token: 30 x (q, o 576x576; k, v 192x576; gate, up 1536x576; down 576x1536)"
           " + head 49152x576\n");
    printf("  %-24s %8s | %9s %8s | %9s %8s\n", "weights", "MiB", "1T ms", "GB/s", "2T ms", "GB/s");
    const struct {
        const char *name;
        uint32_t layers, head;
    } cfgs[] = {
        {"q4_1 layers, q8_0 head", MK_GGML_Q4_1, MK_GGML_Q8_0},
        {"q5_0 layers, q8_0 head", MK_GGML_Q5_0, MK_GGML_Q8_0},
        {"q8_0 layers, q8_0 head", MK_GGML_Q8_0, MK_GGML_Q8_0},
        {"f16 layers, f16 head", MK_GGML_F16, MK_GGML_F16},
    };
    const int shapes[7][2] = {{576, 576}, {192, 576}, {192, 576}, {576, 576}, {1536, 576}, {1536, 576}, {576, 1536}};
    int layers = quick ? 2 : 30;
    float *xs = malloc(sizeof(float) * 1536), *ys = malloc(sizeof(float) * 49152);
    for (int i = 0; i < 1536; i++) xs[i] = rnds();
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
        int count = layers * 7 + 1;
        mat *ms = calloc((size_t)count, sizeof *ms);
        size_t sc = 0;
        for (int l = 0; l < layers; l++)
            for (int s = 0; s < 7; s++) {
                mat *m = &ms[l * 7 + s];
                m->type = cfgs[ci].layers;
                m->n = shapes[s][0];
                m->k = shapes[s][1];
                m->w = make_w(m->type, m->n, m->k);
            }
        ms[count - 1] = (mat){cfgs[ci].head, quick ? 4096 : 49152, 576, NULL};
        ms[count - 1].w = make_w(cfgs[ci].head, ms[count - 1].n, 576);
        for (int i = 0; i < count; i++) {
            size_t s = mk_ggml_matmul_scratch(ms[i].type, 1, ms[i].k);
            sc = s > sc ? s : sc;
        }
        void *scratch = malloc(sc);
        size_t set = set_bytes(ms, count);
        double t1[2];
        for (int t = 0; t < 2; t++) {
            time_set(pools[t], ms, count, xs, ys, scratch, 1);
            t1[t] = time_set(pools[t], ms, count, xs, ys, scratch, quick ? 2 : 10);
        }
        printf("  %-24s %8.1f | %9.2f %8.2f | %9.2f %8.2f\n", cfgs[ci].name, (double)set / 1048576.0,
               t1[0] * 1e3, (double)set / t1[0] / 1e9, t1[1] * 1e3, (double)set / t1[1] / 1e9);
        for (int i = 0; i < count; i++) free(ms[i].w);
        free(ms);
        free(scratch);
    }
    free(xs);
    free(ys);
    mk_pool_free(pool1);
    mk_pool_free(pool2);
    return 0;
}
